#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Measure QSD spawn-to-socket-ready time (N exports of a fresh volume) and the
# idle RSS of one QSD, with the qsdctl built in ./build.  Prints median and max.
# Usage: scripts/measure-qsd.sh [N]   (default 20)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-20}
Q=${QSDCTL:-$PWD/build/qsdctl/qsdctl}
T=$(mktemp -d /tmp/qsd-measure-XXXXXX)
export QSDCTL_RUN_DIR=$T/run QSDCTL_POOL=$T/pool
trap '"$Q" unexport m >/dev/null 2>&1 || true; rm -rf "$T"' EXIT
"$Q" create m --size 1G >/dev/null
times=()
for _ in $(seq "$N"); do
    out=$("$Q" --json export m)
    times+=("$(python3 -c 'import json,sys; print(json.load(sys.stdin)["ready_ms"])' <<<"$out")")
    pid=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])' <<<"$out")
    sleep 0.2
    rss=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
    "$Q" unexport m >/dev/null
done
python3 - "$rss" "${times[@]}" <<'PY'
import statistics, sys
rss = int(sys.argv[1]); t = [float(x) for x in sys.argv[2:]]
print(f"spawn-to-socket-ready over {len(t)} exports: median {statistics.median(t):.1f} ms, max {max(t):.1f} ms")
print(f"idle QSD RSS (qcow2, 1 GiB, iothread): {rss/1024:.1f} MiB")
PY
