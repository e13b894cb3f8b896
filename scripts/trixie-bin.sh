#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A directory of `qemu-storage-daemon` and `qemu-img` wrappers that run QEMU
# 11.1 (the images' version) from the Debian 13 root of scripts/trixie-root.sh
# through that root's loader, for running tests on it by hand:
#   PATH="$(scripts/trixie-bin.sh):$PATH" ctest --test-dir build -R ...
# The plugin and the tests find both programs in PATH.  Block modules (rbd,
# curl...) and librbd's libceph-common load from the root (QEMU_MODULE_DIR,
# the loader's library path), not from the host.
# Idempotent; as root (trixie-root.sh needs it when the root is missing).
# usage: scripts/trixie-bin.sh [DIR [ROOT]]
#   (defaults /var/cache/qsd-csi/trixie-bin, /var/cache/qsd-csi/trixie-root)
# Prints DIR as its last line.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
DIR=${1:-/var/cache/qsd-csi/trixie-bin}
ROOT=${2:-/var/cache/qsd-csi/trixie-root}

"$here/trixie-root.sh" "$ROOT" >/dev/null
mkdir -p "$DIR"
for b in qemu-storage-daemon qemu-img; do
    tmp=$(mktemp "$DIR/.$b.XXXXXX")
    cat >"$tmp" <<EOF
#!/bin/sh
# $b of QEMU 11.1 from $ROOT (scripts/trixie-bin.sh), through its loader.
QEMU_MODULE_DIR=$ROOT/usr/lib/x86_64-linux-gnu/qemu exec $ROOT/lib64/ld-linux-x86-64.so.2 --library-path $ROOT/usr/lib/x86_64-linux-gnu:$ROOT/lib/x86_64-linux-gnu:$ROOT/usr/lib/x86_64-linux-gnu/ceph $ROOT/usr/bin/$b "\$@"
EOF
    chmod 755 "$tmp"
    mv -f "$tmp" "$DIR/$b"
done
"$DIR/qemu-storage-daemon" --version | head -1 >&2
"$DIR/qemu-img" --version | head -1 >&2
echo "$DIR"
