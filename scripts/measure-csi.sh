#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Closing figures of the CSI plugin (issue 3), with the plugin built in ./build:
#  - NodeStageVolume latency (client side, gRPC round trip included: QSD
#    spawn, socket ready, records written), p50 and p99 over N volumes staged
#    one after the other;
#  - the plugin's RSS with N staged volumes (and, for scale, the QSDs' total).
# Runs under a temporary root (mktemp); everything is stopped by PID at exit.
# Usage: scripts/measure-csi.sh [N]   (default 50)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-50}
PLUGIN=${PLUGIN:-$PWD/build/csi/qsd-csi-plugin}
[ -x "$PLUGIN" ] || { echo "build first: cmake -S . -B build && cmake --build build" >&2; exit 1; }
exec /usr/bin/python3 - "$PLUGIN" "$PWD/proto" "$N" <<'PY'
import os, statistics, sys, time
sys.path.insert(0, os.path.join(os.getcwd(), "tests", "csi"))
import csilib
plugin, proto, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
env = csilib.Env(plugin, proto, prefix="qsd-csi-measure-")
try:
    c = env.start(["--log-level", "warn", "--max-volumes", str(max(n, 128))])
    pb = env.pb
    cap = csilib.mount_cap(pb)
    rss0 = int([l for l in open("/proc/%d/status" % env.proc.pid) if l.startswith("VmRSS")][0].split()[1])
    lat = []
    for i in range(n):
        vid = "pvc-measure-%03d" % i
        c.CreateVolume(pb.CreateVolumeRequest(name=vid, volume_capabilities=[cap],
                       capacity_range=pb.CapacityRange(required_bytes=1 << 30)), timeout=60)
        stg = os.path.join(env.kubelet, "staging", vid)
        os.makedirs(stg)
        req = pb.NodeStageVolumeRequest(volume_id=vid, staging_target_path=stg, volume_capability=cap)
        t0 = time.perf_counter()
        c.NodeStageVolume(req, timeout=60)
        lat.append((time.perf_counter() - t0) * 1000)
    time.sleep(0.5)
    st = {l.split(":")[0]: l.split()[1] for l in open("/proc/%d/status" % env.proc.pid) if len(l.split()) > 1}
    qsd_rss = 0
    for pid in env.qsd_pids().values():
        for l in open("/proc/%d/status" % pid):
            if l.startswith("VmRSS"):
                qsd_rss += int(l.split()[1])
    lat.sort()
    p99 = lat[min(len(lat) - 1, int(round(0.99 * len(lat) + 0.5)) - 1)]
    print("NodeStageVolume latency over %d volumes: p50 %.1f ms, p99 %.1f ms (min %.1f, max %.1f)"
          % (n, statistics.median(lat), p99, lat[0], lat[-1]))
    print("plugin RSS: %.1f MiB idle, %.1f MiB with %d staged volumes (peak %.1f MiB); "
          "QSDs together %.0f MiB" % (rss0 / 1024, int(st["VmRSS"]) / 1024, n,
                                       int(st["VmHWM"]) / 1024, qsd_rss / 1024))
    for i in range(n):
        vid = "pvc-measure-%03d" % i
        c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(
            volume_id=vid, staging_target_path=os.path.join(env.kubelet, "staging", vid)), timeout=60)
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vid), timeout=60)
finally:
    env.cleanup()
PY
