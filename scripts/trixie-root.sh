#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A Debian 13 (trixie) root file system holding QEMU 11.1.3 from
# trixie-backports (qemu-utils, and qemu-block-extra for the rbd driver:
# QEMU_MODULE_DIR=ROOT/usr/lib/x86_64-linux-gnu/qemu, see
# scripts/trixie-bin.sh), for running its qemu-storage-daemon on this bookworm host
# through the root's own loader (tests/security/repro/run.sh --qsd ...):
#   ROOT/lib64/ld-linux-x86-64.so.2 \
#     --library-path ROOT/usr/lib/x86_64-linux-gnu:ROOT/lib/x86_64-linux-gnu \
#     ROOT/usr/bin/qemu-storage-daemon
# Idempotent: every step checks what is already there.  As root.
# usage: scripts/trixie-root.sh [ROOT]   (default /var/cache/qsd-csi/trixie-root)
# Prints the QSD command line (the loader form above) as its last line.
set -euo pipefail

ROOT=${1:-/var/cache/qsd-csi/trixie-root}
MIRROR=http://deb.debian.org/debian

if [[ $(id -u) -ne 0 ]]; then
    echo "trixie-root.sh: must run as root (debootstrap, chroot)" >&2
    exit 1
fi

if [[ ! -x $ROOT/usr/bin/apt-get ]]; then
    mkdir -p "$(dirname "$ROOT")"
    rm -rf "$ROOT.tmp"
    debootstrap --variant=minbase trixie "$ROOT.tmp" "$MIRROR" >&2
    mv "$ROOT.tmp" "$ROOT"
fi

LIST=$ROOT/etc/apt/sources.list.d/trixie-backports.list
if [[ ! -s $LIST ]]; then
    echo "deb $MIRROR trixie-backports main" > "$LIST"
fi

if [[ ! -x $ROOT/usr/bin/qemu-storage-daemon || ! -e $ROOT/usr/lib/x86_64-linux-gnu/qemu/block-rbd.so ]]; then
    cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
    chroot "$ROOT" apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive chroot "$ROOT" \
        apt-get install -y -q --no-install-recommends -t trixie-backports qemu-utils qemu-block-extra >&2
fi

LD=$ROOT/lib64/ld-linux-x86-64.so.2
LIBS=$ROOT/usr/lib/x86_64-linux-gnu:$ROOT/lib/x86_64-linux-gnu
"$LD" --library-path "$LIBS" "$ROOT/usr/bin/qemu-storage-daemon" --version | head -1 >&2
echo "$LD --library-path $LIBS $ROOT/usr/bin/qemu-storage-daemon"
