#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""GetSnapshot and the volume health RPCs (CSI 1.13) against the real
plugin and real QSDs (csi/health.h, docs/csi-plugin.md):

- GetSnapshot: the snapshot as ListSnapshots lists it; INVALID_ARGUMENT
  naming snapshot_id for an empty or malformed id; NOT_FOUND for an unknown
  one and for another node's id (the message names that node).
- ControllerGetVolumeHealth, NodeGetVolumeHealth: INVALID_ARGUMENT naming
  volume_id; NOT_FOUND for an unknown volume, and (node) for paths the
  volume is not staged or published at; a healthy staged volume and an
  unstaged one have no health entry, and ControllerListVolumeHealth lists
  neither.
- Abnormal, each seen the same way by both health RPCs, by
  ControllerListVolumeHealth (paginated: max_entries, next_token, a bad
  token ABORTED, a negative max_entries INVALID_ARGUMENT) and by
  NodeGetVolumeStats' volume_condition (one verdict):
  * the vhost-user socket of a staged volume removed: INACCESSIBLE
    SocketMissing;
  * the image of an unstaged volume removed from the pool: DATA_LOSS
    ImageMissing;
  * the image of a staged volume removed: DATA_LOSS ImageMissing, its
    running QSD named; then that QSD killed by PID: it cannot start again
    (the image is gone), and the message no longer says it serves.
- NodeGetStorageHealth: no entry for a healthy pool; STORAGE_UNREACHABLE
  PluginNotReady once the pool directory is gone.

usage: test_csi_health.py PLUGIN_BINARY PROTO_DIR [QSDCTL]
"""
import glob
import os
import shutil
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402
from csilib import expect_code, mount_cap  # noqa: E402

MiB = 1 << 20
BOUND_S = 20.0  # a killed QSD's restart attempt (tens of ms) on a loaded machine


def main():
    env = csilib.Env(sys.argv[1], sys.argv[2], prefix="qs-h-")
    try:
        run(env)
        assert env.stop() == 0
    finally:
        if sys.exc_info()[0] is not None:
            print("---- plugin log (tail)\n" + env.log_tail(80))
        env.cleanup()


def run(env):
    c = env.start()
    pb, T, C = env.pb, csilib.CALL_TIMEOUT, csilib.grpc.StatusCode
    H = pb.VolumeHealthErrorType
    cap = mount_cap(pb)

    def create(name):
        return c.CreateVolume(pb.CreateVolumeRequest(
            name=name, capacity_range=pb.CapacityRange(required_bytes=64 * MiB),
            volume_capabilities=[cap]), timeout=T).volume.volume_id

    def stage(vid):
        stg = os.path.join(env.kubelet, "plugins", "kubernetes.io", "csi", "pv",
                           csilib.local_id(vid), "globalmount")
        os.makedirs(stg)
        c.NodeStageVolume(pb.NodeStageVolumeRequest(volume_id=vid, staging_target_path=stg,
                                                    volume_capability=cap), timeout=T)
        return stg

    def cget(vid):
        return c.ControllerGetVolumeHealth(pb.ControllerGetVolumeHealthRequest(volume_id=vid),
                                           timeout=T).volume_health

    def nget(vid, **paths):
        return c.NodeGetVolumeHealth(pb.NodeGetVolumeHealthRequest(volume_id=vid, **paths),
                                     timeout=T).volume_health

    def listed(max_entries=0):
        out, tok = [], ""
        for _ in range(20):
            r = c.ControllerListVolumeHealth(pb.ControllerListVolumeHealthRequest(
                max_entries=max_entries, starting_token=tok), timeout=T)
            assert max_entries == 0 or len(r.entries) <= max_entries, r
            out += [e.volume_id for e in r.entries]
            tok = r.next_token
            if not tok:
                return out
        raise AssertionError("ControllerListVolumeHealth: no end after 20 pages")

    def one(vh, vid, status, reason):
        assert vh.volume_id == vid, vh
        assert len(vh.health_statuses) == 1, vh
        e = vh.health_statuses[0]
        assert (e.status, e.reason) == (status, reason) and e.message, vh
        return e.message

    def stats(vid, stg):
        r = c.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(volume_id=vid, volume_path=stg),
                                 timeout=T)
        return r.volume_condition.abnormal, r.volume_condition.message

    # ------------------------------------------------------- GetSnapshot
    a = create("pvc-a")
    snap = c.CreateSnapshot(pb.CreateSnapshotRequest(name="snap-a", source_volume_id=a),
                            timeout=T).snapshot
    got = c.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=snap.snapshot_id), timeout=T).snapshot
    lst = c.ListSnapshots(pb.ListSnapshotsRequest(snapshot_id=snap.snapshot_id),
                          timeout=T).entries[0].snapshot
    assert got == lst and got.snapshot_id == snap.snapshot_id and got.ready_to_use, (got, lst)
    assert got.source_volume_id == a and got.size_bytes == 64 * MiB, got
    assert c.GetSnapshot(pb.GetSnapshotRequest(snapshot_id="snap-a"), timeout=T).snapshot == got
    d = expect_code(c.GetSnapshot, pb.GetSnapshotRequest(), C.INVALID_ARGUMENT, "no id")
    assert "snapshot_id" in d, d
    d = expect_code(c.GetSnapshot, pb.GetSnapshotRequest(snapshot_id="../etc"),
                    C.INVALID_ARGUMENT, "bad id")
    assert "snapshot_id" in d, d
    expect_code(c.GetSnapshot, pb.GetSnapshotRequest(snapshot_id="none-exist-id"),
                C.NOT_FOUND, "unknown id")
    d = expect_code(c.GetSnapshot, pb.GetSnapshotRequest(snapshot_id="snap-a@node-9"),
                    C.NOT_FOUND, "another node's id")
    assert "node-9" in d, d
    print("ok GetSnapshot: as ListSnapshots; INVALID_ARGUMENT, NOT_FOUND")

    # ------------------------------------------------ health: refusals
    for fn, req in ((c.ControllerGetVolumeHealth, pb.ControllerGetVolumeHealthRequest),
                    (c.NodeGetVolumeHealth, pb.NodeGetVolumeHealthRequest)):
        d = expect_code(fn, req(), C.INVALID_ARGUMENT, "no volume_id")
        assert "volume_id" in d, d
        d = expect_code(fn, req(volume_id="a/b"), C.INVALID_ARGUMENT, "bad volume_id")
        assert "volume_id" in d, d
        expect_code(fn, req(volume_id="pvc-none"), C.NOT_FOUND, "unknown volume")
        d = expect_code(fn, req(volume_id="pvc-a@node-9"), C.NOT_FOUND, "another node's")
        assert "node-9" in d, d
    expect_code(c.ControllerListVolumeHealth,
                pb.ControllerListVolumeHealthRequest(max_entries=-1), C.INVALID_ARGUMENT,
                "negative max_entries")
    expect_code(c.ControllerListVolumeHealth,
                pb.ControllerListVolumeHealthRequest(starting_token="bogus"), C.ABORTED,
                "bad token")
    print("ok health RPCs' refusals")

    # ------------------------------------------------ healthy volumes
    b, s = create("pvc-b"), create("pvc-s")
    stg_a, stg_s = stage(a), stage(s)
    for vid in (a, b, s):
        assert cget(vid) == pb.VolumeHealth(volume_id=vid), cget(vid)
        assert nget(vid) == pb.VolumeHealth(volume_id=vid), nget(vid)
    assert nget(a, staging_target_path=stg_a).volume_id == a
    expect_code(c.NodeGetVolumeHealth, pb.NodeGetVolumeHealthRequest(
        volume_id=a, staging_target_path=stg_s), C.NOT_FOUND, "not staged there")
    expect_code(c.NodeGetVolumeHealth, pb.NodeGetVolumeHealthRequest(
        volume_id=a, volume_publish_path=os.path.join(env.kubelet, "pods", "x", "mount")),
        C.NOT_FOUND, "not published there")
    assert listed() == [], listed()
    assert stats(a, stg_a)[0] is False, stats(a, stg_a)
    storage = c.NodeGetStorageHealth(pb.NodeGetStorageHealthRequest(), timeout=T)
    assert len(storage.backend_health) == 0, storage
    print("ok healthy: no entries, nothing listed")

    # ------------------------------------------------ abnormal volumes
    sock = os.path.join(env.run, "exports", "pvc-a", "vhost.sock")
    os.unlink(sock)
    m = one(cget(a), a, H.INACCESSIBLE, "SocketMissing")
    assert sock in m, m
    assert one(nget(a), a, H.INACCESSIBLE, "SocketMissing") == m
    assert stats(a, stg_a) == (True, m), stats(a, stg_a)
    print("ok socket removed: INACCESSIBLE SocketMissing:", m)

    for f in glob.glob(os.path.join(env.pool, "volumes", "pvc-b.*")):
        os.unlink(f)
    m = one(cget(b), b, H.DATA_LOSS, "ImageMissing")
    assert "pvc-b" in m and "serves" not in m, m
    assert one(nget(b), b, H.DATA_LOSS, "ImageMissing") == m
    print("ok unstaged volume's image removed: DATA_LOSS ImageMissing:", m)

    for f in glob.glob(os.path.join(env.pool, "volumes", "pvc-s.*")):
        os.unlink(f)
    m = one(cget(s), s, H.DATA_LOSS, "ImageMissing")
    assert "still serves" in m, m
    assert stats(s, stg_s) == (True, m), stats(s, stg_s)
    pid = env.qsd_pids()["pvc-s"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + BOUND_S
    while "still serves" in one(nget(s), s, H.DATA_LOSS, "ImageMissing"):
        assert time.monotonic() < deadline, "QSD of pvc-s still said to serve after %.0f s" % (
            BOUND_S)
        time.sleep(0.1)
    assert pid not in env.running_qsds(), "killed QSD %d still runs" % pid
    print("ok staged volume's image removed, its QSD killed: still DATA_LOSS ImageMissing")

    # Listed: the three abnormal ones, in id order, also one per page.
    assert listed() == [a, b, s], listed()
    assert listed(max_entries=1) == [a, b, s], listed(max_entries=1)
    assert listed(max_entries=2) == [a, b, s], listed(max_entries=2)
    print("ok ControllerListVolumeHealth: the abnormal volumes, paginated")

    # ------------------------------------------------ storage
    moved = env.pool + ".away"
    os.rename(env.pool, moved)
    try:
        storage = c.NodeGetStorageHealth(pb.NodeGetStorageHealthRequest(), timeout=T)
    finally:
        os.rename(moved, env.pool)
    assert len(storage.backend_health) == 1, storage
    e = storage.backend_health[0]
    assert e.status == pb.StorageHealthErrorType.STORAGE_UNREACHABLE, e
    assert e.reason == "PluginNotReady" and "pool" in e.message, e
    print("ok NodeGetStorageHealth: pool gone: STORAGE_UNREACHABLE:", e.message)

    # Clean up what can be: the staged volumes unstaged, everything deleted.
    for vid, stg in ((a, stg_a), (s, stg_s)):
        c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id=vid, staging_target_path=stg),
                            timeout=T)
    c.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=snap.snapshot_id), timeout=T)
    for vid in (a, b, s):
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vid), timeout=T)
    shutil.rmtree(os.path.join(env.kubelet, "plugins"), ignore_errors=True)


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
