#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build (or reuse) a tiny test guest: Debian's kernel + a busybox initramfs.
#
#   build-guest.sh CACHE_DIR         -> CACHE_DIR/vmlinuz, CACHE_DIR/initramfs.img
#   build-guest.sh CACHE_DIR SCRIPT OUT
#                                    -> also OUT: initramfs + SCRIPT as /test.sh
#
# The kernel package is fetched with `apt-get download` (Debian's archive only)
# and cached in CACHE_DIR, so only the first run downloads anything.  The
# guest's /init (tests/guest/init) loads the virtio modules, then runs /test.sh
# when present, else the commands in guest.cmd=... on the kernel command line,
# and powers off.  Results go to the serial console (ttyS0): point the domain's
# console at a file and parse it.  Exits 77 when something needed is missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${1:?usage: build-guest.sh CACHE_DIR [SCRIPT OUT]}
script=${2:-}
out=${3:-}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)

for tool in busybox cpio dpkg-deb apt-get gzip; do
    command -v "$tool" >/dev/null || { echo "build-guest: $tool missing" >&2; exit 77; }
done
busybox_bin=/bin/busybox
[[ -x $busybox_bin ]] && file_is_static=$(ldd "$busybox_bin" 2>&1 | grep -c 'not a dynamic' || true)
if [[ ${file_is_static:-0} -eq 0 ]]; then
    echo "build-guest: $busybox_bin is not static (install busybox-static)" >&2
    exit 77
fi

lock="$cache/.lock"
exec 9>"$lock"
flock -w 600 9 || { echo "build-guest: cache lock timeout" >&2; exit 1; }

if [[ ! -s $cache/vmlinuz || ! -d $cache/modules ]]; then
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
    [[ -n $pkg ]] || { echo "build-guest: cannot resolve linux-image-amd64 (apt-get update?)" >&2; exit 77; }
    tmp=$(mktemp -d "$cache/dl.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    (cd "$tmp" && timeout 300 apt-get download -q "$pkg" >/dev/null 2>&1) ||
        { echo "build-guest: apt-get download $pkg failed" >&2; exit 77; }
    dpkg-deb -x "$tmp"/*.deb "$tmp/x"
    kver=$(ls "$tmp/x/lib/modules" | head -1)
    rm -rf "$cache/modules"
    mkdir -p "$cache/modules"
    for m in virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_blk; do
        f=$(find "$tmp/x/lib/modules/$kver" -name "$m.ko*" | head -1)
        [[ -n $f ]] || { echo "build-guest: module $m not found" >&2; exit 1; }
        case $f in
            *.ko) cp "$f" "$cache/modules/$m.ko" ;;
            *.ko.xz) xz -dc "$f" > "$cache/modules/$m.ko" ;;
            *.ko.zst) zstd -dcq "$f" > "$cache/modules/$m.ko" ;;
        esac
    done
    cp "$tmp/x/boot/vmlinuz-$kver" "$cache/vmlinuz.tmp"
    mv "$cache/vmlinuz.tmp" "$cache/vmlinuz"
    echo "$pkg" > "$cache/kernel-package"
    rm -rf "$tmp"
    trap - EXIT
fi

if [[ ! -s $cache/initramfs.img || $here/init -nt $cache/initramfs.img ]]; then
    root=$(mktemp -d "$cache/root.XXXXXX")
    mkdir -p "$root"/{bin,sbin,proc,sys,dev,tmp,modules,mnt}
    cp /bin/busybox "$root/bin/busybox"
    for a in sh; do ln -s busybox "$root/bin/$a"; done
    cp "$cache"/modules/*.ko "$root/modules/"
    cp "$here/init" "$root/init"
    chmod 755 "$root/init"
    (cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$cache/initramfs.img.tmp"
    mv "$cache/initramfs.img.tmp" "$cache/initramfs.img"
    rm -rf "$root"
fi

if [[ -n $script ]]; then
    [[ -n $out ]] || { echo "build-guest: SCRIPT needs OUT" >&2; exit 1; }
    extra=$(mktemp -d)
    cp "$script" "$extra/test.sh"
    chmod 755 "$extra/test.sh"
    # Concatenated cpio archives are merged by the kernel.
    { cat "$cache/initramfs.img"; (cd "$extra" && echo test.sh | cpio -o -H newc --quiet | gzip -1); } > "$out"
    rm -rf "$extra"
fi
echo "build-guest: kernel $(cat "$cache/kernel-package") ready in $cache"
