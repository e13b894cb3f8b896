#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The cost of GetMetadataDelta on a large volume (docs/changed-blocks.md).

usage: scripts/bench-cbt.py BUILD_DIR [--size-gib N] [--percent P] [--runs R]

Starts the built plugin in a temporary root (tests/csi/csilib.py's Env),
creates a thin volume of N GiB (default 100), snapshots it (s1), writes P %
(default 1) of it as scattered 64 KiB writes of data straight into the
volume's top with qemu-io (the volume is not staged: no QSD holds it),
snapshots it again (s2), then calls GetMetadataDelta(s1, s2) and
GetMetadataAllocated(s2) R times (default 3) with tests/cbt's client
(each delta twice: first with the layers evicted from the page cache)
(built by tests/cbt/build.sh, or QSD_CBT_CLIENT).  Prints one JSON object:
per call the wall time, the plugin's CPU time (utime + stime from
/proc/PID/stat), the client's, the messages and extents, and the machine's
CPU pressure (/proc/pressure/cpu) before and after: these machines are
shared, so a figure is only as quiet as its pressure says.
"""
import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "csi"))
import csilib  # noqa: E402

GiB = 1 << 30
CHUNK = 64 << 10


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def evict(pool):
    """Drop the pool's layer files from the page cache (only them: the
    machine is shared), so that the next call reads its tables from disk."""
    for sub in ("layers", "snapshots"):
        d = os.path.join(pool, sub)
        for name in os.listdir(d):
            fd = os.open(os.path.join(d, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def pressure():
    with open("/proc/pressure/cpu") as f:
        return f.readline().strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--size-gib", type=int, default=100)
    ap.add_argument("--percent", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    client = os.environ.get("QSD_CBT_CLIENT") or subprocess.run(
        ["/bin/bash", os.path.join(ROOT, "tests/cbt/build.sh")], check=True,
        capture_output=True, text=True).stdout.strip().splitlines()[-1]
    os.environ.setdefault("QSD_VHOST_FILTER", os.path.abspath(
        os.path.join(a.build, "qsdctl", "qsd-vhost-filter")))
    env = csilib.Env(os.path.join(a.build, "csi", "qsd-csi-plugin"), os.path.join(ROOT, "proto"),
                     prefix="qsd-bench-cbt-")
    try:
        c = env.start()
        pb = env.pb
        size = a.size_gib * GiB
        c.CreateVolume(pb.CreateVolumeRequest(
            name="big", capacity_range=pb.CapacityRange(required_bytes=size),
            volume_capabilities=[csilib.mount_cap(pb)]), timeout=60)
        s1 = c.CreateSnapshot(pb.CreateSnapshotRequest(name="s1", source_volume_id="big"),
                              timeout=60).snapshot.snapshot_id
        n = int(size * a.percent / 100) // CHUNK
        rnd = random.Random(1)
        offs = sorted(rnd.sample(range(size // CHUNK), n))
        top = os.path.join(env.pool, "volumes", "big.qcow2")
        t0 = time.monotonic()
        cmds = []
        for o in offs:
            cmds += ["-c", "write -P %d %d %d" % (o % 251, o * CHUNK, CHUNK)]
        subprocess.run(["qemu-io", "-t", "unsafe", "-f", "qcow2", *cmds, top], check=True,
                       stdout=subprocess.DEVNULL, timeout=3600)
        write_s = time.monotonic() - t0
        s2 = c.CreateSnapshot(pb.CreateSnapshotRequest(name="s2", source_volume_id="big"),
                              timeout=60).snapshot.snapshot_id
        pid = env.proc.pid
        out = {"size_gib": a.size_gib, "writes": n, "write_bytes": n * CHUNK,
               "qemu_io_s": round(write_s, 1), "pressure_before": pressure(), "calls": []}
        for run in range(a.runs):
            for what, extra in (("delta cold", ["-base", s1]), ("delta", ["-base", s1]),
                                ("allocated", [])):
                if what.endswith("cold"):
                    evict(env.pool)
                cpu0 = cpu_s(pid)
                ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.monotonic()
                r = subprocess.run([client, "-endpoint", "unix://" + env.sock, "-snapshot", s2,
                                    *extra], capture_output=True, text=True, timeout=600)
                wall = time.monotonic() - t0
                ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                res = json.loads(r.stdout)
                assert r.returncode == 0 and res["ok"], r.stdout + r.stderr
                covered = sum(b[1] for b in res["blocks"])
                assert covered == n * CHUNK, (covered, n * CHUNK)  # exact: one layer, no merge
                out["calls"].append({
                    "rpc": what, "wall_s": round(wall, 3),
                    "plugin_cpu_s": round(cpu_s(pid) - cpu0, 3),
                    "client_cpu_s": round((ru1.ru_utime + ru1.ru_stime) -
                                          (ru0.ru_utime + ru0.ru_stime), 3),
                    "messages": res["messages"], "extents": len(res["blocks"]),
                    "bytes_listed": covered})
        out["pressure_after"] = pressure()
        out["cpus"] = os.cpu_count()
        print(json.dumps(out, indent=1))
    finally:
        env.cleanup()


if __name__ == "__main__":
    main()
