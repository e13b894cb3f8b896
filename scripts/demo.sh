#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job (see README): build, then run the whole path on this machine,
# no cluster: the CSI plugin driven as kubelet and the sidecars would, a VM pod's
# launcher booting a small TCG guest, hot-plug, expansion, snapshot/restore,
# unplug, clean-up.  Needs root (mounts, QSD sockets).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "Building (cmake, build/) ..."
cmake -S . -B build >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
# The QEMU that ships (11.1.3, the images' Debian 13) serves the demo's
# volumes: its qemu-storage-daemon and qemu-img first in PATH.
PATH=$(scripts/trixie-bin.sh | tail -1):$PATH
export PATH
echo "QSD: $(qemu-storage-daemon --version | head -1)"
exec /usr/bin/python3 scripts/demo/demo.py build
