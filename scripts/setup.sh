#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Install everything the project needs on Debian 12 (bookworm), as root.
# Non-interactive and idempotent: running it twice changes nothing the second time.
# QEMU 10 and libvirt 11 come from bookworm-backports (see docs/:
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
    protobuf-compiler python3-grpcio python3-protobuf python3-yaml python3-prometheus-client
    busybox-static cpio util-linux iproute2 procps psmisc kmod strace
    podman runc debootstrap
    # tests/k8s/ (the one-node Kubernetes cluster): the CNI plugins (bridge,
    # host-local); runc above; containerd 2.x is built by tests/k8s/build.sh.
    containernetworking-plugins
    clang llvm libclang-rt-14-dev gnuplot-nox graphviz
    # scripts/bench.sh: fio (a second limit measurement), perf (QSD's
    # submission syscalls per I/O); both optional there.
    fio linux-perf
    # The launcher: passt (user-mode networking, started by libvirt),
    # dosfstools + mtools (the cloud-init cidata image), ovmf (UEFI guests),
    # systemd-boot-efi (its EFI stub: launcher/e2e-rbd boots a unified
    # kernel image from an RBD volume).
    passt dosfstools mtools ovmf systemd-boot-efi
    # The plugin downloads the images of image classes with curl.
    curl ca-certificates
    # The plugin's RBD backend links librbd/librados (docs/rbd.md).
    librbd-dev
    # Volumes for ordinary pods (docs/pod-volumes.md): /dev/fuse's tools,
    # mkfs, fsck and online growth of ext4 and xfs.
    fuse3 e2fsprogs xfsprogs
    # qsd-node-gate, the node endpoint's mutual-TLS front end
    # (docs/node-operations.md): OpenSSL 3 (TLS 1.3, client certificates);
    # its tests make certificates with the openssl CLI.
    libssl-dev openssl
)
# A throwaway single-node Ceph for the RBD tests (tests/ceph/cephlib.py);
# without recommends (no mgr dashboards, no systemd units pulled in).
CEPH_PKGS=(ceph-mon ceph-osd ceph-common)
# Virtualisation stack from bookworm-backports.
BPO_PKGS=(
    qemu-system-x86 qemu-system-common qemu-utils qemu-block-extra
    libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients libvirt-dev
)

need=()
for p in "${BASE_PKGS[@]}" "${BPO_PKGS[@]}" "${CEPH_PKGS[@]}"; do
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
    apt-get install "${APT_OPTS[@]}" --no-install-recommends "${CEPH_PKGS[@]}"
fi

# Container engine (scripts/build-images.sh, tests/container/): podman with runc.
# On these machines (cgroup v1/v2 hybrid, root without CAP_SYS_RESOURCE, no
# systemd): crun 1.8 refuses the hybrid layout (runc does not), podman's default
# ulimits (nofile=1048576) cannot be set, and there is no systemd for cgroups or
# journald events.  This file says so; an existing file of someone else's is
# left alone (a note is printed), ours is rewritten only when it differs.
CONTAINERS_CONF_FILE=/etc/containers/containers.conf
CONTAINERS_CONF_BODY='# Written by qsd-csi scripts/setup.sh (rewritten when it differs; remove this
# line to keep your own edits).
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"'
mkdir -p /etc/containers
if [[ ! -e $CONTAINERS_CONF_FILE ]] || head -1 "$CONTAINERS_CONF_FILE" | grep -q '^# Written by qsd-csi scripts/setup.sh'; then
    if [[ "$(cat "$CONTAINERS_CONF_FILE" 2>/dev/null)" != "$CONTAINERS_CONF_BODY" ]]; then
        printf '%s\n' "$CONTAINERS_CONF_BODY" >"$CONTAINERS_CONF_FILE.tmp"
        mv "$CONTAINERS_CONF_FILE.tmp" "$CONTAINERS_CONF_FILE"
        echo "setup.sh: wrote $CONTAINERS_CONF_FILE (runc, cgroupfs, ulimits, file events)"
    fi
else
    echo "setup.sh: $CONTAINERS_CONF_FILE exists and is not ours: check it sets runtime = \"runc\"," \
         "cgroup_manager = \"cgroupfs\", events_logger = \"file\" and default_ulimits (deploy/README.md)" >&2
fi
podman info >/dev/null 2>&1 || echo "setup.sh: warning: 'podman info' fails (container tests will skip)" >&2

# Schema validation of deploy/ (tests/deploy/test_schemas.py): the node packages
# pinned by tests/deploy/schema/package-lock.json, installed there.  npm's cache
# (~/.npm) keeps their tarballs, so a reinstall works offline; an install whose
# lockfile has not changed is kept.
command -v node >/dev/null && command -v npm >/dev/null || apt-get install "${APT_OPTS[@]}" nodejs npm
SCHEMA_DIR=$(cd "$(dirname "$0")/.." && pwd)/tests/deploy/schema
SCHEMA_STAMP=$SCHEMA_DIR/node_modules/.qsd-csi-lock.sha256
if [[ "$(cat "$SCHEMA_STAMP" 2>/dev/null)" != "$(sha256sum <"$SCHEMA_DIR/package-lock.json")" ]]; then
    npm ci --prefix "$SCHEMA_DIR" --prefer-offline --no-audit --no-fund --loglevel=error
    sha256sum <"$SCHEMA_DIR/package-lock.json" >"$SCHEMA_STAMP"
    echo "setup.sh: installed the schema validator's node packages in $SCHEMA_DIR"
fi
# kubectl renders deploy/kubernetes (its built-in kustomize) for tests/deploy.  The
# machine images have it; no registry reachable here ships it.
command -v kubectl >/dev/null || echo "setup.sh: warning: no kubectl: tests/deploy will skip" >&2

qsd_ok || { echo "setup.sh: qemu-storage-daemon >= 8 is required (have: $(qemu-storage-daemon --version | head -1))" >&2; exit 1; }
echo "setup.sh: $(qemu-storage-daemon --version | head -1); libvirt $(pkg-config --modversion libvirt)"
# The QEMU that ships (11.1.3 from Debian 13's trixie-backports, as in the
# images) in a cached Debian 13 root, with wrappers the tests and the demo
# put first in PATH (scripts/trixie-root.sh, scripts/trixie-bin.sh).
QEMU_SHIPS=$("$(dirname "$0")/trixie-bin.sh" | tail -1)
echo "setup.sh: the QEMU that ships: $("$QEMU_SHIPS/qemu-storage-daemon" --version | head -1) ($QEMU_SHIPS)"
