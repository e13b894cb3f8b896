#!/usr/bin/env bash
# Install everything the project needs on Debian 12 (bookworm), as root.
# Non-interactive and idempotent: running it twice changes nothing the second time.
# QEMU 10 and libvirt 11 come from bookworm-backports (see docs/ and ../shared/NOTES.md:
# QEMU 7.2's vhost-user-blk export does not propagate block_resize to clients).
set -euo pipefail

if [[ $(id -u) -ne 0 ]]; then
    echo "setup.sh: must run as root (it installs Debian packages)" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
APT_OPTS=(-y -q -o Dpkg::Options::=--force-confold -o Dpkg::Options::=--force-confdef)

BACKPORTS=/etc/apt/sources.list.d/bookworm-backports.list
if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo 'deb http://deb.debian.org/debian bookworm-backports main' > "$BACKPORTS"
fi

# Build tools and libraries from bookworm.
BASE_PKGS=(
    build-essential cmake pkg-config git ca-certificates
    libxml2-dev libxml2-utils libjansson-dev libnghttp2-dev liburing-dev
    libprotobuf-c-dev protobuf-c-compiler libcmocka-dev
    protobuf-compiler python3-grpcio python3-protobuf python3-yaml
    busybox-static cpio util-linux iproute2 procps psmisc kmod
    clang llvm libclang-rt-14-dev gnuplot-nox graphviz
    # The launcher: passt (user-mode networking, started by libvirt),
    # dosfstools + mtools (the cloud-init cidata image), ovmf (UEFI guests).
    passt dosfstools mtools ovmf
)
# Virtualisation stack from bookworm-backports.
BPO_PKGS=(
    qemu-system-x86 qemu-system-common qemu-utils qemu-block-extra
    libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients libvirt-dev
)

need=()
for p in "${BASE_PKGS[@]}" "${BPO_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
qsd_ok() {
    command -v qemu-storage-daemon >/dev/null &&
        qemu-storage-daemon --version | awk 'NR==1 { split($3, v, "."); exit !(v[1] >= 8) }'
}
if ((${#need[@]})) || ! qsd_ok; then
    # Unrelated third-party sources on some images are unreachable; only Debian's matter.
    apt-get update -q || echo "setup.sh: apt-get update reported errors (continuing)" >&2
    apt-get install "${APT_OPTS[@]}" "${BASE_PKGS[@]}"
    apt-get install "${APT_OPTS[@]}" -t bookworm-backports "${BPO_PKGS[@]}"
fi

qsd_ok || { echo "setup.sh: qemu-storage-daemon >= 8 is required (have: $(qemu-storage-daemon --version | head -1))" >&2; exit 1; }
echo "setup.sh: $(qemu-storage-daemon --version | head -1); libvirt $(pkg-config --modversion libvirt)"
