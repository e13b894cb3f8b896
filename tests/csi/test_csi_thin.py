#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Thin snapshots, restores and clones on qcow2 layers, through CSI, with a
vhost-user client writing through the published target all along:

- live CreateSnapshot (x10, which passes the merge threshold: the chain is
  merged in the background inside the QSD), a live clone and an explicit
  flatten (qsdctl merge) while rounds of patterned writes run: no write
  fails, and each snapshot and the clone hold, chunk by chunk, the last
  round finished before the call or one running during it (read back and
  checked sector by sector, body included);
- restores through CSI read exactly what their snapshot holds (one through
  a published target with qsdctl verify);
- the layers are shared: snapshots and clones add no data to the pool;
  DeleteSnapshot of a snapshot a restored volume uses succeeds and the
  restored volume keeps its data; deleting everything leaves no layer;
- offline (unstaged) snapshot and clone; raw volumes get full copies;
- NodeGetVolumeStats counts the chain, capped by the capacity.

usage: test_csi_thin.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402
import thinlib  # noqa: E402
from csilib import mount_cap  # noqa: E402

MiB = 1 << 20
SIZE = 64 * MiB
NCHUNKS, CHUNK = 32, 64 * 1024


def main():
    qsdctl = sys.argv[3]
    env = csilib.Env(sys.argv[1], sys.argv[2], prefix="qsd-thin-")
    try:
        run(env, qsdctl)
    finally:
        if sys.exc_info()[0] is not None:
            print("---- plugin log (tail)\n" + env.log_tail(80))
        env.cleanup()


class Node:
    """Stage and publish volumes as kubelet would."""

    def __init__(self, env, c):
        self.env, self.c, self.pb = env, c, env.pb
        self.cap = mount_cap(env.pb)

    def up(self, v):
        k = self.env.kubelet
        stg = os.path.join(k, "staging", v)
        tgt = os.path.join(k, "pods", v, "mount")
        os.makedirs(stg, exist_ok=True)
        os.makedirs(os.path.dirname(tgt), exist_ok=True)
        self.c.NodeStageVolume(self.pb.NodeStageVolumeRequest(
            volume_id=v, staging_target_path=stg, volume_capability=self.cap), timeout=60)
        self.c.NodePublishVolume(self.pb.NodePublishVolumeRequest(
            volume_id=v, staging_target_path=stg, target_path=tgt,
            volume_capability=self.cap), timeout=60)
        return tgt

    def down(self, v):
        k = self.env.kubelet
        self.c.NodeUnpublishVolume(self.pb.NodeUnpublishVolumeRequest(
            volume_id=v, target_path=os.path.join(k, "pods", v, "mount")), timeout=60)
        self.c.NodeUnstageVolume(self.pb.NodeUnstageVolumeRequest(
            volume_id=v, staging_target_path=os.path.join(k, "staging", v)), timeout=60)


def verify(qsdctl, tgt, mode, seed):
    r = subprocess.run([qsdctl, "verify", mode, "--seed", str(seed), "--chunks", str(NCHUNKS),
                        "--chunk-size", str(CHUNK), "--timeout-ms", "20000", "./vhost.sock"],
                       cwd=tgt, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, "verify %s seed %d: %s %s" % (mode, seed, r.stdout, r.stderr)


def depth(env, qsdctl, vol):
    r = subprocess.run([qsdctl, "--pool", env.pool, "--run-dir", env.run, "--json", "list"],
                       capture_output=True, text=True, timeout=30, check=True)
    for v in json.loads(r.stdout)["volumes"]:
        if v["volume"] == vol:
            return v["depth"]
    raise AssertionError("volume %s not listed" % vol)


def seeds_of(env, path, fmt="qcow2"):
    return thinlib.image_chunk_seeds(path, fmt, SIZE, NCHUNKS, CHUNK, env.root)


def run(env, qsdctl):
    c = env.start()
    pb = env.pb
    T = csilib.CALL_TIMEOUT
    node = Node(env, c)
    cap = node.cap

    def cv(name, src=None, params=None):
        return pb.CreateVolumeRequest(
            name=name, capacity_range=pb.CapacityRange(required_bytes=SIZE),
            volume_capabilities=[cap], parameters=params or {}, volume_content_source=src)

    def snap_src(s):
        return pb.VolumeContentSource(snapshot=pb.VolumeContentSource.SnapshotSource(snapshot_id=s))

    def vol_src(v):
        return pb.VolumeContentSource(volume=pb.VolumeContentSource.VolumeSource(volume_id=v))

    c.CreateVolume(cv("pvc-a"), timeout=T)
    tgt = node.up("pvc-a")
    verify(qsdctl, tgt, "--write", 1)
    base_usage = thinlib.pool_usage(env.pool)
    # quiescent: holds exactly round 1
    c.CreateSnapshot(pb.CreateSnapshotRequest(name="snap-q", source_volume_id="pvc-a"), timeout=T)

    # ---- live snapshots, a clone and a flatten while a client writes
    w = thinlib.Writer(qsdctl, tgt, 2, NCHUNKS, CHUNK, env.root)
    w.wait_rounds(2)
    calls = {}
    for i in range(1, 11):
        t0 = time.monotonic()
        s = c.CreateSnapshot(pb.CreateSnapshotRequest(name="snap-%d" % i,
                                                      source_volume_id="pvc-a"), timeout=T)
        calls["snap-%d" % i] = (t0, time.monotonic())
        assert s.snapshot.ready_to_use and s.snapshot.size_bytes == SIZE, s
        time.sleep(0.15)
        if i == 5:
            t0 = time.monotonic()
            c.CreateVolume(cv("pvc-clone", src=vol_src("pvc-a")), timeout=T)
            calls["pvc-clone"] = (t0, time.monotonic())
    assert depth(env, qsdctl, "pvc-a") <= 16
    # the background merge started past depth 8 (plugin log) and, once it has
    # run, the chain is back to at most 8
    deadline = time.monotonic() + 30
    while depth(env, qsdctl, "pvc-a") > 8:
        assert time.monotonic() < deadline, "chain not merged: depth %d" % depth(env, qsdctl, "pvc-a")
        time.sleep(0.2)
    assert "merging=yes" in env.log_tail(400), env.log_tail(40)
    # explicit flatten of the live volume, writes still running
    r = subprocess.run([qsdctl, "--pool", env.pool, "--run-dir", env.run, "merge", "pvc-a",
                        "--depth", "1", "--timeout", "60"], capture_output=True, text=True,
                       timeout=90)
    assert r.returncode == 0, r.stderr
    assert depth(env, qsdctl, "pvc-a") == 1
    time.sleep(0.3)
    rounds = w.stop()
    assert len(rounds) >= 5, rounds
    last = rounds[-1][0]
    verify(qsdctl, tgt, "--check", last)
    print("ok %d write rounds, none failed, during 10 live snapshots, a live clone, the "
          "background merge and a flatten; the volume holds the last round" % len(rounds))
    for name, (t0, t1) in sorted(calls.items()):
        path = os.path.join(env.pool, "snapshots" if name.startswith("snap") else "volumes",
                            name + ".qcow2")
        got = seeds_of(env, path)
        ok = thinlib.allowed_seeds(rounds, t0, t1, 1)
        assert set(got) <= ok, "%s holds rounds %s, allowed %s" % (name, sorted(set(got)), ok)
    print("ok each snapshot and the clone hold, chunk by chunk, a round finished before the "
          "call or one running during it (every sector checked)")
    ms = {n: (t1 - t0) * 1000 for n, (t0, t1) in calls.items()}
    print("ok CreateSnapshot max %.0f ms, live clone %.0f ms" %
          (max(v for n, v in ms.items() if n.startswith("snap")), ms["pvc-clone"]))

    # ---- restores through CSI
    t0 = time.monotonic()
    c.CreateVolume(cv("pvc-r1", src=snap_src("snap-q")), timeout=T)
    restore_ms = (time.monotonic() - t0) * 1000
    c.CreateVolume(cv("pvc-r7", src=snap_src("snap-7")), timeout=T)
    assert seeds_of(env, os.path.join(env.pool, "volumes", "pvc-r7.qcow2")) == \
        seeds_of(env, os.path.join(env.pool, "snapshots", "snap-7.qcow2"))
    tr1 = node.up("pvc-r1")
    s1 = 1
    verify(qsdctl, tr1, "--check", s1)
    print("ok restores read what their snapshot holds (one through a published target); "
          "restore took %.0f ms" % restore_ms)

    # ---- sharing: nothing copied; stats; deletion order
    grown = thinlib.pool_usage(env.pool) - base_usage
    written = len(rounds) * NCHUNKS * CHUNK
    assert grown < 2 * written + 32 * MiB, (grown, written)
    st = c.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(
        volume_id="pvc-r1", volume_path=tr1), timeout=T)
    used = st.usage[0].used
    assert 0 < used <= st.usage[0].total == SIZE, st
    c.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id="snap-q"), timeout=T)
    verify(qsdctl, tr1, "--check", s1)
    print("ok pool grew by %.1f MiB for %.1f MiB written in %d rounds (no copies); "
          "stats used %d; DeleteSnapshot of a restored volume's snapshot succeeds and the "
          "volume keeps its data" % (grown / MiB, written / MiB, len(rounds), used))

    # ---- offline snapshot and clone, raw volumes
    node.down("pvc-a")
    t0 = time.monotonic()
    c.CreateSnapshot(pb.CreateSnapshotRequest(name="snap-off", source_volume_id="pvc-a"),
                     timeout=T)
    c.CreateVolume(cv("pvc-clone-off", src=vol_src("pvc-a")), timeout=T)
    off_ms = (time.monotonic() - t0) * 1000
    for p in ("snapshots/snap-off.qcow2", "volumes/pvc-clone-off.qcow2", "volumes/pvc-a.qcow2"):
        assert set(seeds_of(env, os.path.join(env.pool, p))) == {last}, p
    c.CreateVolume(cv("pvc-raw", src=snap_src("snap-off"), params={"format": "raw"}), timeout=T)
    assert set(seeds_of(env, os.path.join(env.pool, "volumes", "pvc-raw.raw"), "raw")) == {last}
    c.CreateSnapshot(pb.CreateSnapshotRequest(name="snap-raw", source_volume_id="pvc-raw"),
                     timeout=T)
    assert os.stat(os.path.join(env.pool, "snapshots", "snap-raw.qcow2")).st_nlink == 1
    c.CreateVolume(cv("pvc-from-raw", src=snap_src("snap-raw")), timeout=T)
    assert set(seeds_of(env, os.path.join(env.pool, "volumes", "pvc-from-raw.qcow2"))) == {last}
    print("ok offline snapshot + clone in %.0f ms; raw volume from a snapshot (full copy), "
          "its snapshot (full copy), a thin restore of that" % off_ms)

    # ---- delete everything: no layer left
    node.down("pvc-r1")
    for v in [csilib.local_id(e.volume.volume_id) for e in c.ListVolumes(pb.ListVolumesRequest(), timeout=T).entries]:
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=v), timeout=T)
    for s in [csilib.local_id(e.snapshot.snapshot_id) for e in
              c.ListSnapshots(pb.ListSnapshotsRequest(), timeout=T).entries]:
        c.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=s), timeout=T)
    deadline = time.monotonic() + 15
    while thinlib.layer_files(env.pool):
        assert time.monotonic() < deadline, thinlib.layer_files(env.pool)
        time.sleep(0.1)
    assert not os.listdir(os.path.join(env.pool, "volumes"))
    assert not os.listdir(os.path.join(env.pool, "snapshots"))
    print("ok deleting every volume and snapshot leaves no layer")
    assert env.stop() == 0


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
