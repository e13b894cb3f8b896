#!/usr/bin/env bash
# The main job (see README): build, then run the whole path on this machine,
# no cluster: the CSI plugin driven as kubelet and the sidecars would, a VM pod's
# launcher booting a small TCG guest, hot-plug, expansion, snapshot/restore,
# unplug, clean-up.  Needs root (mounts, QSD sockets).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "Building (cmake, build/) ..."
cmake -S . -B build >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
exec /usr/bin/python3 scripts/demo/demo.py build
