#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Thin snapshots, restores and clones: time and pool growth against the data
a live volume holds, before (full copies: the plugin built from --before-rev)
and after (this tree's plugin), in one run; plus read performance at the
maximum chain depth against depth 1.

    scripts/bench-thin.py BUILD_DIR [--sizes 0.25,1,4] [--before-rev REV]
                          [--out docs/bench/thin] [--no-before]

For each plugin and each size S (GiB): CreateVolume (qcow2, S + 64 MiB),
S GiB written into the image (qemu-io, offline, then staged: a live volume
with S GiB of data), a verify pattern written through the published
vhost-user socket, then through CSI: CreateSnapshot (live), CreateVolume
from the snapshot (restore), CreateVolume from the volume (clone, live);
each timed (client round trip) and the pool's growth measured (allocated
bytes, every inode once); the restore and the clone are staged and the
pattern checked through their sockets (contents verified).  Then the chain
depth: a 1 GiB volume whose data is spread over LAYER_MAX_DEPTH layers
against the same data in one layer, `qsdctl bench` random reads through
QSD (no iothread, as the plugin runs it).

Writes results.json, results.md and thin.png (gnuplot) into --out.
Processes it starts are stopped by PID; its temporary root is removed.
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "csi"))
import csilib  # noqa: E402
import thinlib  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20
VCHUNKS, VCHUNK = 64, 1 << 20


def sh(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw).stdout


def build_before(rev, tmp):
    """Build the plugin at rev in a temporary worktree (the 'before')."""
    src = os.path.join(tmp, "before-src")
    sh("git", "-C", ROOT, "worktree", "add", "--detach", src, rev)
    try:
        b = os.path.join(src, "build")
        sh("cmake", "-S", src, "-B", b, "-DCMAKE_BUILD_TYPE=Release")
        sh("cmake", "--build", b, "-j2", "--target", "qsd-csi-plugin", timeout=900)
        out = os.path.join(tmp, "qsd-csi-plugin.before")
        shutil.copy(os.path.join(b, "csi", "qsd-csi-plugin"), out)
        return out, sh("git", "-C", src, "rev-parse", "--short", "HEAD").strip()
    finally:
        sh("git", "-C", ROOT, "worktree", "remove", "--force", src)


def run_plugin(plugin, proto, qsdctl, sizes, label):
    env = csilib.Env(plugin, proto, prefix="qsd-bench-thin-")
    rows = []
    try:
        c = env.start()
        pb = env.pb
        cap = csilib.mount_cap(pb)
        T = 3600

        def up(v):
            stg = os.path.join(env.kubelet, "staging", v)
            tgt = os.path.join(env.kubelet, "pods", v, "mount")
            os.makedirs(stg, exist_ok=True)
            os.makedirs(os.path.dirname(tgt), exist_ok=True)
            c.NodeStageVolume(pb.NodeStageVolumeRequest(volume_id=v, staging_target_path=stg,
                                                        volume_capability=cap), timeout=T)
            c.NodePublishVolume(pb.NodePublishVolumeRequest(
                volume_id=v, staging_target_path=stg, target_path=tgt, volume_capability=cap),
                timeout=T)
            return tgt

        def down(v):
            c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(
                volume_id=v, target_path=os.path.join(env.kubelet, "pods", v, "mount")), timeout=T)
            c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(
                volume_id=v, staging_target_path=os.path.join(env.kubelet, "staging", v)),
                timeout=T)

        def verify(tgt, mode, size):
            sh(qsdctl, "verify", mode, "--seed", "7", "--chunks", str(VCHUNKS), "--chunk-size",
               str(VCHUNK), "--size", str(size), "--timeout-ms", "60000", "./vhost.sock", cwd=tgt,
               timeout=300)

        def timed(fn, req):
            u0 = thinlib.pool_usage(env.pool)
            t0 = time.monotonic()
            fn(req, timeout=T)
            ms = (time.monotonic() - t0) * 1000
            return ms, thinlib.pool_usage(env.pool) - u0

        for s in sizes:
            data = int(s * GiB) // MiB * MiB
            vsize = data + 64 * MiB
            v = "vol-%s" % str(s).replace(".", "_")
            c.CreateVolume(pb.CreateVolumeRequest(
                name=v, capacity_range=pb.CapacityRange(required_bytes=vsize),
                volume_capabilities=[cap]), timeout=T)
            img = os.path.join(env.pool, "volumes", v + ".qcow2")
            t0 = time.monotonic()
            cmds = []
            for off in range(0, data, GiB):  # qemu-io writes at most 2 GiB at once
                cmds += ["-c", "write -P 0x5a %d %d" % (off, min(GiB, data - off))]
            sh("qemu-io", "-f", "qcow2", *cmds, img, timeout=1800)
            wr = time.monotonic() - t0
            tgt = up(v)
            verify(tgt, "--write", vsize)
            alloc = thinlib.pool_usage(env.pool)
            snap_ms, snap_grow = timed(c.CreateSnapshot, pb.CreateSnapshotRequest(
                name="snap-" + v, source_volume_id=v))
            rest_ms, rest_grow = timed(c.CreateVolume, pb.CreateVolumeRequest(
                name="rest-" + v, capacity_range=pb.CapacityRange(required_bytes=vsize),
                volume_capabilities=[cap], volume_content_source=pb.VolumeContentSource(
                    snapshot=pb.VolumeContentSource.SnapshotSource(snapshot_id="snap-" + v))))
            clone_ms, clone_grow = timed(c.CreateVolume, pb.CreateVolumeRequest(
                name="clone-" + v, capacity_range=pb.CapacityRange(required_bytes=vsize),
                volume_capabilities=[cap], volume_content_source=pb.VolumeContentSource(
                    volume=pb.VolumeContentSource.VolumeSource(volume_id=v))))
            for w in ("rest-" + v, "clone-" + v):
                verify(up(w), "--check", vsize)
                down(w)
            verify(tgt, "--check", vsize)
            down(v)
            row = {"plugin": label, "gib": s, "data_bytes": data, "pool_bytes": alloc,
                   "write_s": round(wr, 1),
                   "snapshot_ms": round(snap_ms, 1), "snapshot_growth": snap_grow,
                   "restore_ms": round(rest_ms, 1), "restore_growth": rest_grow,
                   "clone_ms": round(clone_ms, 1), "clone_growth": clone_grow,
                   "verified": True}
            print(json.dumps(row), flush=True)
            rows.append(row)
            for w in ("rest-" + v, "clone-" + v, v):
                c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=w), timeout=T)
            c.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id="snap-" + v), timeout=T)
        env.stop()
    finally:
        env.cleanup()
    return rows


def depth_ratio(qsdctl, tmp):
    """Random reads at LAYER_MAX_DEPTH (16) against depth 1, same data."""
    pool, run = os.path.join(tmp, "dpool"), os.path.join(tmp, "drun")
    q = [qsdctl, "--pool", pool, "--run-dir", run]
    size = GiB
    sh(*q, "create", "deep", "--size", str(size))
    img = os.path.join(pool, "volumes", "deep.qcow2")
    slice_ = size // 16
    for i in range(16):
        # every layer holds 1/16 of the disk (a different byte per layer)
        sh("qemu-io", "-f", "qcow2", "-c", "write -P %d %d %d" % (i + 1, i * slice_, slice_), img)
        if i < 15:
            sh(*q, "snapshot", "deep", "d%02d" % i)
    depth = json.loads(sh(*q, "--json", "status", "deep"))["chain"]
    flat = os.path.join(pool, "volumes", "flat.qcow2")
    sh("qemu-img", "convert", "-f", "qcow2", "-O", "qcow2", img, flat)
    out = {"depth_deep": len(depth), "depth_flat": 1}
    for v in ("deep", "flat"):
        sh(*q, "export", v, "--no-iothread")
        try:
            r = json.loads(sh(qsdctl, "bench", "--json", "--runtime-ms", "4000", "--ramp-ms", "500",
                              "--tests", "randread-4k-qd1,randread-4k-qd32",
                              os.path.join(run, "exports", v, "vhost.sock"), timeout=300))
            out[v] = r
        finally:
            sh(*q, "unexport", v)
    return out


def iops(bench, test):
    for t in bench.get("results", bench.get("tests", [])):
        if t.get("test") == test or t.get("name") == test:
            return t.get("iops")
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--sizes", default="0.25,1,4")
    ap.add_argument("--before-rev", default="main")
    ap.add_argument("--no-before", action="store_true")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "bench", "thin"))
    a = ap.parse_args()
    sizes = [float(x) for x in a.sizes.split(",")]
    a.build = os.path.abspath(a.build)
    plugin = os.path.join(a.build, "csi", "qsd-csi-plugin")
    qsdctl = os.path.join(a.build, "qsdctl", "qsdctl")
    proto = os.path.join(ROOT, "proto")
    tmp = tempfile.mkdtemp(prefix="bench-thin-")
    try:
        meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "kernel": platform.release(),
                "qemu": sh("qemu-storage-daemon", "--version").splitlines()[0],
                "git": sh("git", "-C", ROOT, "rev-parse", "--short", "HEAD").strip(),
                "load_start": open("/proc/loadavg").read().split()[:3]}
        rows = []
        if not a.no_before:
            before, rev = build_before(a.before_rev, tmp)
            meta["before"] = "%s (%s): full copies" % (a.before_rev, rev)
            rows += run_plugin(before, proto, qsdctl, sizes, "before")
        rows += run_plugin(plugin, proto, qsdctl, sizes, "after")
        d = depth_ratio(qsdctl, tmp)
        meta["load_end"] = open("/proc/loadavg").read().split()[:3]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "depth": d}, f, indent=1)
    write_md(a.out, meta, rows, d)
    plot(a.out, rows)


def fmt_b(b):
    return "%.1f MiB" % (b / MiB) if abs(b) < GiB else "%.2f GiB" % (b / GiB)


def write_md(out, meta, rows, d):
    L = ["# Thin snapshots, restores and clones: measured", "",
         "Generated by `scripts/bench-thin.py` (one run, this machine, shared and loaded: "
         "quote ratios).", ""]
    L += ["    %s: %s" % (k, v) for k, v in meta.items()]
    L += ["", "Through CSI on a live (staged, published) qcow2 volume holding the data; times "
          "are the gRPC round trip; growth = the pool's allocated bytes after minus before "
          "(each inode once); every restore and clone was staged and its pattern checked "
          "through its vhost-user socket.", "",
          "| plugin | data | CreateSnapshot | growth | restore | growth | clone | growth |",
          "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        L.append("| %s | %g GiB | %.0f ms | %s (%.3f%%) | %.0f ms | %s (%.3f%%) | %.0f ms | %s (%.3f%%) |" % (
            r["plugin"], r["gib"], r["snapshot_ms"], fmt_b(r["snapshot_growth"]),
            100.0 * r["snapshot_growth"] / r["data_bytes"], r["restore_ms"],
            fmt_b(r["restore_growth"]), 100.0 * r["restore_growth"] / r["data_bytes"],
            r["clone_ms"], fmt_b(r["clone_growth"]), 100.0 * r["clone_growth"] / r["data_bytes"]))
    L += ["", "Chain depth: `qsdctl bench` random 4k reads through QSD (main loop), 1 GiB of "
          "data spread over %d layers (a different sixteenth in each) against the same data "
          "in one layer:" % d["depth_deep"], "",
          "| test | depth 1 IOPS | depth %d IOPS | ratio |" % d["depth_deep"], "|---|---|---|---|"]
    for t in ("randread-4k-qd1", "randread-4k-qd32"):
        a, b = iops(d["flat"], t), iops(d["deep"], t)
        if a and b:
            L.append("| %s | %.0f | %.0f | %.2f |" % (t, a, b, b / a))
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(L) + "\n")


def plot(out, rows):
    if not shutil.which("gnuplot"):
        print("gnuplot missing: no plot")
        return
    dat = os.path.join(out, "thin.dat")
    with open(dat, "w") as f:
        f.write("# gib before_snap after_snap before_restore after_restore before_clone "
                "after_clone before_growth after_growth (MiB, snapshot+restore+clone)\n")
        for s in sorted({r["gib"] for r in rows}):
            b = next((r for r in rows if r["gib"] == s and r["plugin"] == "before"), None)
            a = next(r for r in rows if r["gib"] == s and r["plugin"] == "after")
            z = {"snapshot_ms": float("nan"), "restore_ms": float("nan"), "clone_ms": float("nan"),
                 "snapshot_growth": 0, "restore_growth": 0, "clone_growth": 0}
            b = b or z
            g = lambda r: (r["snapshot_growth"] + r["restore_growth"] + r["clone_growth"]) / MiB
            f.write("%g %f %f %f %f %f %f %f %f\n" % (
                s, b["snapshot_ms"], a["snapshot_ms"], b["restore_ms"], a["restore_ms"],
                b["clone_ms"], a["clone_ms"], g(b) if b is not z else float("nan"), g(a)))
    gp = """set terminal pngcairo size 1100,450 font ",10"
set output '%s'
set multiplot layout 1,2
set logscale y
set grid
set key top left
set xlabel 'GiB written in the live volume'
set ylabel 'ms (CSI round trip, log)'
set title 'CreateSnapshot, restore, clone: before (full copy) and after (thin)'
plot '%s' u 1:2 w lp t 'snapshot before', '' u 1:3 w lp t 'snapshot after', \\
     '' u 1:4 w lp t 'restore before', '' u 1:5 w lp t 'restore after', \\
     '' u 1:6 w lp t 'clone before', '' u 1:7 w lp t 'clone after'
set ylabel 'MiB (pool growth, log)'
set title 'Pool growth: snapshot + restore + clone'
plot '%s' u 1:8 w lp t 'before', '' u 1:($9 > 0 ? $9 : 0.01) w lp t 'after'
unset multiplot
""" % (os.path.join(out, "thin.png"), dat, dat)
    subprocess.run(["gnuplot"], input=gp, text=True, check=True)
    os.unlink(dat)


if __name__ == "__main__":
    main()
