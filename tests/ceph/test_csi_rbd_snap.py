#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Snapshots and clones of RBD volumes against a real single-node Ceph
(cephlib.py), through the plugin's gRPC socket (docs/rbd.md "Snapshots and
clones"):

  - CreateSnapshot of a staged volume (its QSD serving a vhost-user client
    that wrote a pattern): id rbdsnap:..., ready_to_use, size, creation
    time; a retry answers the same snapshot; the data written after it is
    not in it;
  - CreateVolume from the snapshot and from the volume: the restored and
    the cloned volume hold the data (qsdctl verify through a staged QSD);
    a bigger size grows the clone, a limit below the source's size is
    OUT_OF_RANGE;
  - DeleteVolume of the source succeeds while its snapshot and clone
    exist (the image goes to the RBD trash), the snapshot still restores,
    and the trash is empty once the last dependent is deleted;
  - codes: missing secrets, malformed ids, cross-backend sources
    (INVALID_ARGUMENT naming the field), snapshot of a missing volume and
    restore of a missing snapshot (NOT_FOUND), a name used for another
    source (ALREADY_EXISTS); DeleteSnapshot idempotent;
  - ListSnapshots by snapshot id and by source volume id (with secrets),
    paginated; GetCapacity for rbd parameters;
  - a clone chain deeper than 4 is flattened in the background:
    CreateVolume answers ABORTED and CreateSnapshot ready_to_use false
    until it is flat; a kill -9 of the plugin and its worker during the
    flatten leaves a correct clone, and the retry on the next plugin
    flattens it;
  - the key is in no log line and on no command line.

usage: test_csi_rbd_snap.py PLUGIN_BINARY PROTO_DIR QSDCTL"""
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "csi"))
import cephlib  # noqa: E402
import csilib  # noqa: E402
from csilib import expect_code, mount_cap  # noqa: E402

import grpc  # noqa: E402

MiB = 1 << 20
C = grpc.StatusCode
T = csilib.CALL_TIMEOUT


def workers(pid):
    """The plugin's worker processes: children running its own binary."""
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            kids = [int(x) for x in f.read().split()]
        exe = os.readlink("/proc/%d/exe" % pid)
    except OSError:
        return []
    out = []
    for k in kids:
        try:
            if os.readlink("/proc/%d/exe" % k) == exe:
                out.append(k)
        except OSError:
            pass
    return out


def main():
    plugin, proto, qsdctl = sys.argv[1], sys.argv[2], sys.argv[3]
    why = cephlib.have_ceph()
    if why:
        csilib.skip("Ceph " + why + " (scripts/setup.sh installs it)")
    env = csilib.Env(plugin, proto)
    ceph = cephlib.Cluster()
    began = time.monotonic()

    def lap(what):
        print("%5.1f s: %s" % (time.monotonic() - began, what), flush=True)
    try:
        ceph.start()
        print("ceph up in %.1f s" % ceph.start_seconds)
        extra = ["--rbd-clusters", ceph.write_clusters(env.root)]
        c = env.start(extra=extra)
        pb = env.pb
        S = ceph.secrets
        params = {"backend": "rbd", "clusterID": "c1", "pool": ceph.pool,
                  "radosNamespace": ceph.namespace}
        place = "c1:%s:%s:" % (ceph.pool, ceph.namespace)
        spec = "%s/%s/" % (ceph.pool, ceph.namespace)

        def vid(name):
            return "rbd:" + place + name

        def sid(name):
            return "rbdsnap:" + place + name

        def create(name, size=64 * MiB, limit=0, snap=None, vol=None, s=S, p=params):
            src = None
            if snap:
                src = pb.VolumeContentSource(
                    snapshot=pb.VolumeContentSource.SnapshotSource(snapshot_id=snap))
            elif vol:
                src = pb.VolumeContentSource(
                    volume=pb.VolumeContentSource.VolumeSource(volume_id=vol))
            return pb.CreateVolumeRequest(
                name=name, capacity_range=pb.CapacityRange(required_bytes=size,
                                                           limit_bytes=limit),
                volume_capabilities=[mount_cap(pb)], parameters=p, secrets=s,
                volume_content_source=src)

        def snapshot(name, source, s=S):
            return pb.CreateSnapshotRequest(name=name, source_volume_id=source, secrets=s)

        def info(image):
            return json.loads(ceph.rbd("info", "--format", "json", spec + image))

        def images():
            return ceph.rbd("ls", spec[:-1]).split()

        def trash():
            return json.loads(ceph.rbd("trash", "ls", "--all", "--format", "json", spec[:-1]))

        cap = mount_cap(pb)
        staged = {}
        count = [0]

        def stage(v):
            count[0] += 1
            n = count[0]
            stg = os.path.join(env.kubelet, "plugins/kubernetes.io/csi/d/s%d/globalmount" % n)
            tgt = os.path.join(env.kubelet, "pods/p%d/volumes/kubernetes.io~csi/v/mount" % n)
            os.makedirs(stg)
            os.makedirs(os.path.dirname(tgt))
            c.NodeStageVolume(pb.NodeStageVolumeRequest(
                volume_id=v, staging_target_path=stg, volume_capability=cap, secrets=S),
                timeout=T)
            c.NodePublishVolume(pb.NodePublishVolumeRequest(
                volume_id=v, staging_target_path=stg, target_path=tgt, volume_capability=cap),
                timeout=T)
            staged[v] = (stg, tgt)
            return os.path.join(tgt, "vhost.sock")

        def unstage(v):
            stg, tgt = staged.pop(v)
            c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=v, target_path=tgt),
                                  timeout=T)
            c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id=v,
                                                            staging_target_path=stg), timeout=T)

        def verify(sock, mode, seed, size=None):
            argv = [qsdctl, "verify", "--timeout-ms", "20000", mode, "--seed", str(seed)]
            if size:
                argv += ["--size", str(size)]
            subprocess.run(argv + [sock], check=True, timeout=120)

        def check_volume(v, seed, size=None):
            sock = stage(v)
            verify(sock, "--check", seed, size)
            unstage(v)

        lap("a volume with data, snapshotted while its QSD serves a client")
        v1 = c.CreateVolume(create("v1"), timeout=T).volume.volume_id
        assert v1 == vid("v1"), v1
        sock = stage(v1)
        verify(sock, "--write", 5, 64 * MiB)
        t0 = time.time()
        snap = c.CreateSnapshot(snapshot("s1", v1), timeout=T).snapshot
        assert snap.snapshot_id == sid("s1") and snap.source_volume_id == v1, snap
        assert snap.ready_to_use and snap.size_bytes == 64 * MiB, snap
        assert abs(snap.creation_time.seconds - t0) < 30, (snap.creation_time, t0)
        again = c.CreateSnapshot(snapshot("s1", v1), timeout=T).snapshot
        assert again == snap, (again, snap)
        verify(sock, "--write", 6)  # after the snapshot: not in it
        c.CreateSnapshot(snapshot("s0", v1), timeout=T)
        unstage(v1)
        assert "csi-snap.s1" in images(), images()
        src_snaps = ceph.rbd("snap", "ls", spec + "v1").split()
        assert src_snaps == [], "the source keeps a user snapshot: %s" % src_snaps

        lap("snapshot codes")
        m = expect_code(c.CreateSnapshot, snapshot("s2", v1, s={}), C.INVALID_ARGUMENT,
                        "snapshot without secrets")
        assert "userID" in m, m
        m = expect_code(c.CreateSnapshot, snapshot("s2", vid("nosuch")), C.NOT_FOUND,
                        "snapshot of a missing volume")
        assert "source_volume_id" in m, m
        c.CreateVolume(create("v2", size=32 * MiB), timeout=T)
        m = expect_code(c.CreateSnapshot, snapshot("s1", vid("v2")), C.ALREADY_EXISTS,
                        "snapshot name used for another source")
        # An image of a snapshot's name the plugin did not make: neither
        # answered as a snapshot nor deleted.
        ceph.rbd("create", "--size", "16M", spec + "csi-snap.foreign")
        expect_code(c.CreateSnapshot, snapshot("foreign", vid("v2")), C.ALREADY_EXISTS,
                    "foreign image of the snapshot's name")
        expect_code(c.DeleteSnapshot, pb.DeleteSnapshotRequest(snapshot_id=sid("foreign"),
                                                               secrets=S),
                    C.FAILED_PRECONDITION, "delete a foreign image")
        ceph.rbd("rm", spec + "csi-snap.foreign")
        m = expect_code(c.CreateSnapshot, snapshot("s_1", v1), C.INVALID_ARGUMENT, "bad name")
        assert "name" in m, m
        m = expect_code(c.CreateSnapshot, pb.CreateSnapshotRequest(
            name="s2", source_volume_id=v1, secrets=S, parameters={"pool": "x"}),
            C.INVALID_ARGUMENT, "snapshot parameter")
        assert "'pool'" in m, m
        m = expect_code(c.DeleteSnapshot, pb.DeleteSnapshotRequest(snapshot_id=sid("s1")),
                        C.INVALID_ARGUMENT, "delete snapshot without secrets")
        assert "userID" in m, m
        m = expect_code(c.DeleteSnapshot, pb.DeleteSnapshotRequest(
            snapshot_id="rbdsnap:c1:x/y::s", secrets=S), C.INVALID_ARGUMENT, "malformed id")
        assert "snapshot_id" in m, m

        lap("restore and clone, sizes, codes")
        r1 = c.CreateVolume(create("r1", snap=sid("s1")), timeout=T).volume
        assert r1.volume_id == vid("r1") and r1.capacity_bytes == 64 * MiB, r1
        again = c.CreateVolume(create("r1", snap=sid("s1")), timeout=T).volume
        assert again.volume_id == r1.volume_id and again.capacity_bytes == 64 * MiB, again
        r2 = c.CreateVolume(create("r2", size=128 * MiB, snap=sid("s1")), timeout=T).volume
        assert r2.capacity_bytes == 128 * MiB and info("r2")["size"] == 128 * MiB, r2
        m = expect_code(c.CreateVolume, create("r3", size=16 * MiB, limit=32 * MiB,
                                               snap=sid("s1")),
                        C.OUT_OF_RANGE, "limit below the snapshot's size")
        assert "limit_bytes" in m, m
        expect_code(c.CreateVolume, create("r1", snap=sid("s1"), size=128 * MiB),
                    C.ALREADY_EXISTS, "same name, other size")
        expect_code(c.CreateVolume, create("v2", snap=sid("s1")), C.ALREADY_EXISTS,
                    "name of a volume made from nothing")
        m = expect_code(c.CreateVolume, create("r3", snap=sid("nosnap")), C.NOT_FOUND,
                        "restore of a missing snapshot")
        assert "volume_content_source.snapshot.snapshot_id" in m, m
        m = expect_code(c.CreateVolume, create("r3", vol=vid("nosuch")), C.NOT_FOUND,
                        "clone of a missing volume")
        m = expect_code(c.CreateVolume, create("r3", snap="s1@node-1"), C.INVALID_ARGUMENT,
                        "local snapshot into an rbd volume")
        assert "volume_content_source.snapshot.snapshot_id" in m, m
        m = expect_code(c.CreateVolume, create("r3", vol="local1"), C.INVALID_ARGUMENT,
                        "local volume into an rbd volume")
        assert "volume_content_source.volume.volume_id" in m, m
        m = expect_code(c.CreateVolume, create("r3", snap=sid("s1"), p={}), C.INVALID_ARGUMENT,
                        "rbd snapshot into a local volume")
        assert "volume_content_source.snapshot.snapshot_id" in m, m
        m = expect_code(c.CreateVolume, create("r3", snap=sid("s1"),
                                               p=dict(params, radosNamespace="ns2")),
                        C.INVALID_ARGUMENT, "restore into another namespace")
        assert "radosNamespace" in m, m
        assert "r3" not in images(), images()
        cl = c.CreateVolume(create("cl", vol=v1), timeout=T).volume
        assert cl.capacity_bytes == 64 * MiB, cl

        lap("the source goes, its snapshot and clone stay usable")
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=v1, secrets=S), timeout=T)
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=v1, secrets=S), timeout=T)
        assert "v1" not in images(), images()
        assert [t["name"] for t in trash()] == ["v1"], trash()
        r4 = c.CreateVolume(create("r4", snap=sid("s1")), timeout=T).volume
        check_volume(r4.volume_id, 5, 64 * MiB)
        # (r2, grown, is not checked: verify's chunks are spread by capacity)
        check_volume(cl.volume_id, 6, 64 * MiB)

        lap("ListSnapshots: by id, by source, paginated; secrets required")
        ls = c.ListSnapshots(pb.ListSnapshotsRequest(snapshot_id=sid("s1"), secrets=S),
                             timeout=T)
        assert [e.snapshot for e in ls.entries] == [snap], ls
        # by source (deleted: its snapshots are still its), a page at a time
        ls = c.ListSnapshots(pb.ListSnapshotsRequest(source_volume_id=v1, secrets=S,
                                                     max_entries=1), timeout=T)
        assert [e.snapshot.snapshot_id for e in ls.entries] == [sid("s0")], ls
        ls = c.ListSnapshots(pb.ListSnapshotsRequest(source_volume_id=v1, secrets=S,
                                                     starting_token=ls.next_token), timeout=T)
        assert [e.snapshot.snapshot_id for e in ls.entries] == [sid("s1")], ls
        assert ls.next_token == "", ls
        ls = c.ListSnapshots(pb.ListSnapshotsRequest(source_volume_id=vid("v2"), secrets=S),
                             timeout=T)
        assert list(ls.entries) == [], ls
        m = expect_code(c.ListSnapshots, pb.ListSnapshotsRequest(snapshot_id=sid("s1")),
                        C.INVALID_ARGUMENT, "list without secrets")
        assert "userID" in m, m
        # GetCapacity: parameters checked, the cluster not asked (no secrets)
        gc = c.GetCapacity(pb.GetCapacityRequest(parameters=params), timeout=T)
        assert gc.available_capacity == 0, gc
        expect_code(c.GetCapacity, pb.GetCapacityRequest(parameters=dict(params, pool="")),
                    C.INVALID_ARGUMENT, "capacity with a bad pool")

        lap("delete everything: the trash empties with the last dependent")
        for s in ("s1", "s0", "s1"):
            c.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=sid(s), secrets=S), timeout=T)
        for v in ("r1", "r2", "r4", "cl", "v2"):
            c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vid(v), secrets=S), timeout=T)
        assert images() == [] and trash() == [], (images(), trash())

        lap("a chain deeper than 4 is flattened in the background")
        size = 128 * MiB
        c.CreateVolume(create("d0", size=size), timeout=T)
        for i in range(1, 5):
            c.CreateVolume(create("d%d" % i, size=size, vol=vid("d%d" % (i - 1))), timeout=T)
        assert "parent" in info("d4"), info("d4")  # depth 4: left as it is

        def until_ok(req, within=60):
            """CreateVolume answers ABORTED while the image is flattened."""
            deadline = time.monotonic() + within
            while True:
                try:
                    return c.CreateVolume(req, timeout=T).volume
                except grpc.RpcError as e:
                    if e.code() != C.ABORTED or time.monotonic() > deadline:
                        raise
                    assert "flatten" in e.details(), e.details()
                time.sleep(0.2)

        expect_code(c.CreateVolume, create("d5", size=size, vol=vid("d4")), C.ABORTED,
                    "depth 5: flattened first")
        assert until_ok(create("d5", size=size, vol=vid("d4"))).capacity_bytes == size
        assert "parent" not in info("d5"), info("d5")
        # A snapshot of d4 (its image at depth 5) is ready once flattened.
        sd = c.CreateSnapshot(snapshot("sd", vid("d4")), timeout=T).snapshot
        assert not sd.ready_to_use, sd
        deadline = time.monotonic() + 60
        while not sd.ready_to_use and time.monotonic() < deadline:
            time.sleep(0.2)
            sd = c.CreateSnapshot(snapshot("sd", vid("d4")), timeout=T).snapshot
        assert sd.ready_to_use and "parent" not in info("csi-snap.sd"), sd
        c.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=sid("sd"), secrets=S), timeout=T)
        # A kill -9 of the plugin and of its workers during a flatten: the
        # image is a correct clone still, and the retry flattens it.
        expect_code(c.CreateVolume, create("d6", size=size, vol=vid("d4")), C.ABORTED,
                    "depth 5 again")
        pid = env.proc.pid
        kids = workers(pid)
        for k in kids:
            os.kill(k, signal.SIGKILL)
        env.stop(signal.SIGKILL)
        cut = "parent" in info("d6")
        print("kill -9 with %d worker(s) running; flatten %s" %
              (len(kids), "cut short" if cut else "already done"))
        c = env.start(extra=extra)
        assert until_ok(create("d6", size=size, vol=vid("d4"))).capacity_bytes == size
        assert "parent" not in info("d6"), info("d6")
        for i in range(6, -1, -1):
            # Known problem (docs/rbd.md): after the kill, a delete of the
            # chain has once waited past 60 s (cause not found); the
            # worker's own bound then answers: say what it said, retry once.
            req = pb.DeleteVolumeRequest(volume_id=vid("d%d" % i), secrets=S)
            try:
                c.DeleteVolume(req, timeout=90)
            except grpc.RpcError as e:
                print("KNOWN PROBLEM: DeleteVolume d%d: %s %s" % (i, e.code(), e.details()))
                print(env.log_tail(20))
                c.DeleteVolume(req, timeout=90)
        assert images() == [] and trash() == [], (images(), trash())

        lap("the key: in no log line, on no command line")
        rc = env.stop()
        with open(os.path.join(env.root, "plugin.log")) as f:
            log = f.read()
        # (the ASan build: LeakSanitizer's report makes the exit status non-zero)
        assert rc == 0, "plugin exit status %s:\n%s" % (rc, log[-3000:])
        assert "snapshot created" in log and "flattened" in log, "no log of the operations"
        cephlib.assert_key_hidden(ceph.key, log)
        print("PASS")
    finally:
        ceph.stop()
        env.cleanup()


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
