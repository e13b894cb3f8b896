#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Crash windows: kill -9 of the plugin at many points (2 ms apart) through
NodeStageVolume, NodeUnstageVolume, a live CreateSnapshot and a live clone
(CreateVolume from the staged volume), restart, retry the call as kubelet or
the sidecars would, then check: exactly one QSD for a staged volume, in its own
group vol-<volume> under the QSD cgroup (--qsd-cgroup, a group of this test's
own, removed at the end) and not the
plugin's, and its socket accepts a connection through the published target;
none for an unstaged one.  At the end, after unstage and DeleteVolume, the
pool holds nothing and no QSD of ours runs.

usage: test_csi_crash.py PLUGIN PROTO_DIR [QSDCTL]
"""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402
import gatelib  # noqa: E402
from csilib import mount_cap  # noqa: E402
import grpc  # noqa: E402

MiB = 1 << 20
VOL = "pvc-crash"
POINTS_MS = list(range(0, 40, 2))
RETRY_S = 30


def retry(fn, req, what):
    """Call as kubelet does: again and again while the answer is a
    temporary refusal, at most RETRY_S."""
    deadline = time.monotonic() + RETRY_S
    while True:
        try:
            return fn(req, timeout=10)
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED,
                                grpc.StatusCode.FAILED_PRECONDITION,
                                grpc.StatusCode.DEADLINE_EXCEEDED) or \
                    time.monotonic() > deadline:
                raise AssertionError("%s: %s %s" % (what, e.code(), e.details()))
            time.sleep(0.05)


def main():
    env = csilib.Env(sys.argv[1], sys.argv[2], prefix="qsd-csi-crash-")
    group = "/qsd-csi-test-%d" % os.getpid()
    pb = env.pb
    cap = mount_cap(pb)
    stg = os.path.join(env.kubelet, "plugins", "staging", VOL)
    tgt = os.path.join(env.kubelet, "pods", "p1", "volumes", "kubernetes.io~csi", VOL, "mount")
    os.makedirs(stg)
    os.makedirs(os.path.dirname(tgt))
    stage = pb.NodeStageVolumeRequest(volume_id=VOL, staging_target_path=stg,
                                      volume_capability=cap)
    unstage = pb.NodeUnstageVolumeRequest(volume_id=VOL, staging_target_path=stg)
    pub = pb.NodePublishVolumeRequest(volume_id=VOL, staging_target_path=stg, target_path=tgt,
                                      volume_capability=cap)
    unpub = pb.NodeUnpublishVolumeRequest(volume_id=VOL, target_path=tgt)
    start = env.start

    def start_plugin():
        return start(["--qsd-cgroup", group, "--log-format", "json"])
    env.start = start_plugin
    try:
        c = env.start()
        c.CreateVolume(pb.CreateVolumeRequest(
            name=VOL, capacity_range=pb.CapacityRange(required_bytes=64 * MiB),
            volume_capabilities=[cap]), timeout=30)

        def crash_during(call, req, delay_ms):
            nonlocal c
            fut = call.future(req, timeout=10)
            time.sleep(delay_ms / 1000.0)
            env.proc.send_signal(signal.SIGKILL)
            env.stop(signal.SIGKILL)
            try:
                fut.result()
            except grpc.RpcError:
                pass
            c = env.start()

        def check(staged, what):
            qsds = [p for p, v in env.running_qsds().items() if v == VOL]
            if staged:
                assert len(qsds) == 1, "%s: %d QSDs for a staged volume: %s" % (what, len(qsds),
                                                                              qsds)
                own = group + "/vol-" + VOL  # a group of its own under the QSDs' group
                assert csilib.cgroup_of(qsds[0]) == own, "%s: QSD in cgroup %s, not %s" % (
                    what, csilib.cgroup_of(qsds[0]), own)
                retry(c.NodePublishVolume, pub, what + ": publish")
                assert gatelib.accepting(os.path.join(tgt, "vhost.sock")), \
                    "%s: the socket does not accept through the target" % what
                retry(c.NodeUnpublishVolume, unpub, what + ": unpublish")
            else:
                # a QSD being stopped may need its stop bound to go
                deadline = time.monotonic() + 10
                while qsds and time.monotonic() < deadline:
                    time.sleep(0.05)
                    qsds = [p for p, v in env.running_qsds().items() if v == VOL]
                assert not qsds, "%s: QSDs left for an unstaged volume: %s" % (what, qsds)

        kills = 0
        for ms in POINTS_MS:
            crash_during(c.NodeStageVolume, stage, ms)
            retry(c.NodeStageVolume, stage, "stage after a kill at %d ms" % ms)
            check(True, "kill at %d ms into NodeStage" % ms)
            crash_during(c.NodeUnstageVolume, unstage, ms)
            retry(c.NodeUnstageVolume, unstage, "unstage after a kill at %d ms" % ms)
            check(False, "kill at %d ms into NodeUnstage" % ms)
            kills += 2
        print("ok %d kill points (%s ms into NodeStage and NodeUnstage): one QSD per staged "
              "volume, in its own cgroup, accepting through the target; none once unstaged" %
              (kills, ",".join(str(m) for m in POINTS_MS)))

        # Live CreateSnapshot and a live clone of the staged volume (thin
        # layers switched inside its QSD), killed at each point, retried.
        retry(c.NodeStageVolume, stage, "stage for snapshots")
        for ms in POINTS_MS:
            snap = "snap-crash-%d" % ms
            req = pb.CreateSnapshotRequest(source_volume_id=VOL, name=snap)
            crash_during(c.CreateSnapshot, req, ms)
            sid = retry(c.CreateSnapshot, req, "snapshot after a kill at %d ms" % ms).snapshot
            assert sid.ready_to_use, sid
            check(True, "kill at %d ms into a live CreateSnapshot" % ms)
            retry(c.DeleteSnapshot, pb.DeleteSnapshotRequest(snapshot_id=sid.snapshot_id),
                  "delete snapshot")
            clone = "pvc-clone-%d" % ms
            creq = pb.CreateVolumeRequest(
                name=clone, capacity_range=pb.CapacityRange(required_bytes=64 * MiB),
                volume_capabilities=[cap], volume_content_source=pb.VolumeContentSource(
                    volume=pb.VolumeContentSource.VolumeSource(volume_id=VOL)))
            crash_during(c.CreateVolume, creq, ms)
            retry(c.CreateVolume, creq, "clone after a kill at %d ms" % ms)
            check(True, "kill at %d ms into a live clone" % ms)
            retry(c.DeleteVolume, pb.DeleteVolumeRequest(volume_id=clone), "delete clone")
            kills += 2
        snaps = c.ListSnapshots(pb.ListSnapshotsRequest(), timeout=30).entries
        assert not snaps, "snapshots left: %s" % [e.snapshot.snapshot_id for e in snaps]
        vols = [csilib.local_id(e.volume.volume_id) for e in c.ListVolumes(pb.ListVolumesRequest(),
                                                            timeout=30).entries]
        assert vols == [VOL], "volumes: %s" % vols
        print("ok %d kill points into a live CreateSnapshot and a live clone: one QSD, serving; "
              "every retried call answered; nothing left after their deletion" %
              (2 * len(POINTS_MS)))
        retry(c.NodeUnstageVolume, unstage, "unstage")

        retry(c.DeleteVolume, pb.DeleteVolumeRequest(volume_id=VOL), "delete")
        # Unused layers go in a worker after a deletion: give it a moment.
        deadline = time.monotonic() + 20
        while True:
            left = [os.path.join(dp, f) for dp, _, fs in os.walk(env.pool) for f in fs]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert not left, "pool not empty after delete: %s" % left
        assert not env.running_qsds(), "QSDs left: %s" % env.running_qsds()
        print("ok pool empty and no QSD left after unstage and delete")
        print("PASS")
    except Exception:
        print("---- plugin log (tail)\n" + env.log_tail(80))
        raise
    finally:
        env.cleanup()
        csilib.remove_cgroup(group)


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
