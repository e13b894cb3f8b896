#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""VolumeGroupSnapshot on the plugin's own node (issue 25, deliverable 2):
the GroupController service with the real plugin and real QSDs.

Asserted:
  - GROUP_CONTROLLER_SERVICE advertised, CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT;
  - refusals with their codes and nothing changed (no record, no snapshot
    file): no name, a bad name, no volume, an empty id, a repeated volume,
    an unknown volume (NOT_FOUND), another node's volume (UNAVAILABLE
    naming it), an unknown parameter; Get of an unknown group NOT_FOUND,
    Delete of one OK;
  - a writer (`qsdctl seqwrite`: write k to disk k mod 2, each acknowledged
    before the next; in a network namespace of its own, as a VM pod's QEMU)
    runs through the two volumes' published sockets while groups are taken
    (each stops exactly that one consumer): every group's member images hold exactly a prefix
    0..K of the sequence (a write on B acknowledged after a write on A is
    never there without it), K grows from group to group; the pause (the
    writer stopped, from the plugin's log) is reported (target: under 100
    ms) and bounded;
  - a consumer found stopped (by someone else) is left stopped; one that
    cannot stop (frozen) fails the group with UNAVAILABLE naming the
    volume, within the bound, leaving nothing;
  - GetMetadataDelta between two groups' members covers the writes between;
  - idempotency (same name and sources: the same group; other sources:
    ALREADY_EXISTS); Get; Delete with wrong snapshot_ids INVALID_ARGUMENT;
    DeleteSnapshot of a member FAILED_PRECONDITION; a member restores
    (CreateVolume from it holds the same data);
  - a writer left stopped with its journal by a killed plugin is continued
    at start (a state made by hand, then real kills the moment the journal
    appears, inotify); kill -9 at many instants of CreateVolumeGroupSnapshot and of
    DeleteVolumeGroupSnapshot: after the restart no process is stopped,
    every snapshot file has a record and every member record a file, a
    group is either whole and ready or gone, a retry succeeds and holds a
    prefix;
  - everything deleted leaves no layer.

usage: test_csi_group.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import ctypes
import json
import os
import re
import select
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402
from csilib import expect_code, mount_cap  # noqa: E402

import grpc  # noqa: E402

MiB = 1 << 20
SIZE = 256 * MiB
BLOCK = 4096
MAGIC = b"QSDSEQ01"
VOLS = ("pvc-ga", "pvc-gb")
C = grpc.StatusCode


def wait(cond, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.02)


def proc_state(pid):
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def starttime(pid):
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def seq_numbers(image, tmp):
    """The write numbers an image holds, and the disk index check."""
    raw = os.path.join(tmp, "seq.raw")
    subprocess.run(["qemu-img", "convert", "-U", "-O", "raw", image, raw], check=True, timeout=120)
    ks = []
    with open(raw, "rb") as f:
        data = f.read()
    os.unlink(raw)
    pos = data.find(MAGIC)
    while pos >= 0:
        assert pos % BLOCK == 0, "%s: magic at %d, not a block start" % (image, pos)
        k = int.from_bytes(data[pos + 8:pos + 16], "little")
        ks.append((pos // BLOCK, k))
        pos = data.find(MAGIC, pos + BLOCK)
    return ks


WRITERS = []


class Writer:
    def __init__(self, qsdctl, socks, start, netns=False):
        """netns: in a network namespace of its own (unshare execs it: the
        same pid), as a VM pod's QEMU is: the connections it makes are
        then listed in that namespace's unix socket table, not the
        plugin's."""
        WRITERS.append(self)
        self.p = subprocess.Popen([*(["unshare", "--net"] if netns else []), qsdctl, "seqwrite",
                                   "--interval-us", "150", "--start",
                                   str(start), *socks], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        self.pid = self.p.pid

    def running(self):
        return self.p.poll() is None and proc_state(self.pid) not in ("T", "t")

    def requests(self):
        """The writes submitted so far: each is one write(2), to its kick
        eventfd (vublk_request_sync), made once the one before was
        acknowledged; so n + 2 seen means a write acknowledged after n."""
        with open("/proc/%d/io" % self.pid) as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("syscw:"))

    def wait_progress(self, what):
        """Bounded: a write acknowledged from now on (a fixed pause is not
        enough on a loaded machine, where the writer may not have run)."""
        n = self.requests()
        wait(lambda: self.requests() >= n + 2, "a write of the writer acknowledged " + what, 30)

    def stop(self):
        if self.p.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.p.send_signal(signal.SIGTERM)
        out, err = self.p.communicate(timeout=30)
        assert self.p.returncode == 0, "seqwrite: rc %d %s" % (self.p.returncode, err[-400:])
        return json.loads(out)["next"]


def run(env, qsdctl):
    pb = env.pb
    T = csilib.CALL_TIMEOUT
    cap = mount_cap(pb)
    c = env.start()
    pool = env.pool
    snapdir = os.path.join(pool, "snapshots")
    groupdir = os.path.join(env.state, "groups")

    caps = c.GetPluginCapabilities(pb.GetPluginCapabilitiesRequest(), timeout=T)
    svc = [x.service.type for x in caps.capabilities if x.HasField("service")]
    assert pb.PluginCapability.Service.GROUP_CONTROLLER_SERVICE in svc, caps
    gc = c.GroupControllerGetCapabilities(pb.GroupControllerGetCapabilitiesRequest(), timeout=T)
    assert [x.rpc.type for x in gc.capabilities] == [
        pb.GroupControllerServiceCapability.RPC.CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT], gc

    socks = []
    for i, v in enumerate(VOLS):
        c.CreateVolume(pb.CreateVolumeRequest(
            name=v, capacity_range=pb.CapacityRange(required_bytes=SIZE),
            volume_capabilities=[cap], parameters={"format": "qcow2"}), timeout=T)
        stg = os.path.join(env.kubelet, "staging", v)
        tgt = os.path.join(env.kubelet, "pods", "p1", v, "mount")
        os.makedirs(stg)
        os.makedirs(os.path.dirname(tgt))
        c.NodeStageVolume(pb.NodeStageVolumeRequest(volume_id=v, staging_target_path=stg,
                                                    volume_capability=cap), timeout=T)
        c.NodePublishVolume(pb.NodePublishVolumeRequest(
            volume_id=v, staging_target_path=stg, target_path=tgt, volume_capability=cap),
            timeout=T)
        socks.append(os.path.join(tgt, "vhost.sock"))
    vid = [csilib.local_id(v) + "@" + env.node for v in VOLS]

    def create(name, ids=None, params=None):
        return c.CreateVolumeGroupSnapshot(pb.CreateVolumeGroupSnapshotRequest(
            name=name, source_volume_ids=vid if ids is None else ids,
            parameters=params or {}), timeout=60).group_snapshot

    # ---- refusals change nothing
    def refused(code, what, **kw):
        msg = expect_code(lambda r, timeout: create(**kw), None, code, what)
        assert not os.listdir(snapdir), "%s left %s" % (what, os.listdir(snapdir))
        assert not [e for e in c.ListSnapshots(pb.ListSnapshotsRequest(), timeout=T).entries]
        assert not os.path.isdir(groupdir) or not os.listdir(groupdir), os.listdir(groupdir)
        return msg
    refused(C.INVALID_ARGUMENT, "no name", name="")
    refused(C.INVALID_ARGUMENT, "bad name", name="a/b")
    refused(C.INVALID_ARGUMENT, "no volume", name="g", ids=[])
    refused(C.INVALID_ARGUMENT, "empty id", name="g", ids=[vid[0], ""])
    refused(C.INVALID_ARGUMENT, "repeated volume", name="g", ids=[vid[0], vid[1], vid[0]])
    refused(C.INVALID_ARGUMENT, "repeated volume, other spelling", name="g",
            ids=[vid[0], VOLS[0]])
    refused(C.NOT_FOUND, "unknown volume", name="g", ids=[vid[0], "pvc-none@" + env.node])
    m = refused(C.UNAVAILABLE, "another node's volume", name="g", ids=[vid[0], "pvc-x@node-7"])
    assert "node-7" in m, m
    refused(C.INVALID_ARGUMENT, "unknown parameter", name="g", params={"freeze": "yes"})
    expect_code(c.GetVolumeGroupSnapshot, pb.GetVolumeGroupSnapshotRequest(
        group_snapshot_id="nope@" + env.node), C.NOT_FOUND, "get unknown")
    expect_code(c.GetVolumeGroupSnapshot, pb.GetVolumeGroupSnapshotRequest(), C.INVALID_ARGUMENT,
                "get without id")
    expect_code(c.DeleteVolumeGroupSnapshot, pb.DeleteVolumeGroupSnapshotRequest(),
                C.INVALID_ARGUMENT, "delete without id")
    c.DeleteVolumeGroupSnapshot(pb.DeleteVolumeGroupSnapshotRequest(
        group_snapshot_id="nope@" + env.node), timeout=T)
    print("ok refusals: codes as the spec says, nothing created")

    # ---- groups under a writer: each one a prefix of the sequence
    groups = {}

    def check_group(name, g=None):
        g = g or c.GetVolumeGroupSnapshot(pb.GetVolumeGroupSnapshotRequest(
            group_snapshot_id=name + "@" + env.node), timeout=T).group_snapshot
        assert g.ready_to_use and len(g.snapshots) == 2, g
        present = set()
        for i, s in enumerate(g.snapshots):
            assert s.source_volume_id == vid[i] and s.ready_to_use, s
            assert csilib.local_id(s.group_snapshot_id) == name, s
            for blk, k in seq_numbers(os.path.join(snapdir, csilib.local_id(s.snapshot_id) +
                                                   ".qcow2"), env.root):
                assert k % 2 == i and k // 2 == blk, "%s: write %d at disk %d block %d" % (
                    name, k, i, blk)
                present.add(k)
        top = max(present) if present else -1
        missing = sorted(set(range(top + 1)) - present)
        assert not missing, "%s: holds write %d but not %s: not a prefix" % (name, top,
                                                                            missing[:10])
        groups[name] = top
        return top

    # The writer in a network namespace of its own, as a VM pod's QEMU
    # (the cluster's first run found no consumer: the plugin looked in its
    # own namespace only); the later writer is in the plugin's.
    w = Writer(qsdctl, socks, 0, netns=True)
    time.sleep(0.5)
    assert w.running(), "the writer did not start"
    last = -1
    for i in range(6):
        w.wait_progress("before grp-%d" % i)
        g = create("grp-%d" % i)
        assert w.running(), "the writer is left stopped"
        top = check_group("grp-%d" % i, g)
        assert top > last, "grp-%d holds up to write %d, the one before %d" % (i, top, last)
        last = top
        time.sleep(0.3)
    pauses = [int(x) for x in re.findall(r"group snapshot created.*?pause_us=(\d+)",
                                         env.log_tail(100000))]
    consumers = re.findall(r"group snapshot created.*?consumers=(\d+)", env.log_tail(100000))
    assert len(pauses) == 6 and set(consumers) == {"1"}, (pauses, consumers)
    # The pause is a figure, reported (target: under 100 ms, docs/node-operations.md),
    # not a timed assertion: a loaded machine stretches it.  What must hold
    # whatever the machine: the writer was let go within the barrier's own
    # bounds (stop 2 s, then the snapshots), not left stopped.
    assert max(pauses) < 10 * 1000000, "the writer was stopped for %s us" % pauses
    print("ok 6 groups under the writer, each a prefix (last write held: %s); writer paused "
          "%s us (max %.1f ms)" % ([groups["grp-%d" % i] for i in range(6)], pauses,
                                   max(pauses) / 1000))

    # ---- members serve changed-block tracking as any snapshot: the delta
    # between two groups' members of disk 0 covers every write between them
    def member(name, i):
        return c.GetVolumeGroupSnapshot(pb.GetVolumeGroupSnapshotRequest(
            group_snapshot_id=name + "@" + env.node), timeout=T).group_snapshot.snapshots[i]
    delta = c.channel.unary_stream(
        "/csi.v1.SnapshotMetadata/GetMetadataDelta",
        request_serializer=pb.GetMetadataDeltaRequest.SerializeToString,
        response_deserializer=pb.GetMetadataDeltaResponse.FromString)
    ext = [(b.byte_offset, b.size_bytes)
           for msg in delta(pb.GetMetadataDeltaRequest(
               base_snapshot_id=member("grp-4", 0).snapshot_id,
               target_snapshot_id=member("grp-5", 0).snapshot_id), timeout=T)
           for b in msg.block_metadata]
    need = [k // 2 * BLOCK for k in range(groups["grp-4"] + 1, groups["grp-5"] + 1) if k % 2 == 0]
    missing = [o for o in need if not any(b <= o < b + n for b, n in ext)]
    assert need and not missing, "delta(grp-4, grp-5) misses blocks %s" % missing[:5]
    print("ok GetMetadataDelta between two groups' members: %d extents cover the %d blocks "
          "written between them" % (len(ext), len(need)))

    # ---- a consumer stopped by someone else is left stopped
    os.kill(w.pid, signal.SIGSTOP)
    wait(lambda: proc_state(w.pid) == "T", "the writer stopped by the test")
    top = check_group("grp-held", create("grp-held"))
    assert proc_state(w.pid) == "T", "a consumer stopped by someone else was continued"
    assert top >= last, (top, last)
    os.kill(w.pid, signal.SIGCONT)
    wait(w.running, "the writer continued by the test")
    print("ok a consumer found stopped is snapshotted and left stopped")

    # ---- a consumer that cannot stop (frozen by the v1 freezer: never
    # reaches the stopped state): the group fails naming the volume within
    # the bound, nothing is left, the writer runs on once thawed
    frz = "/sys/fs/cgroup/freezer/qsd-group-test-%d" % os.getpid()
    if os.path.isdir("/sys/fs/cgroup/freezer"):
        os.mkdir(frz)
        try:
            with open(frz + "/cgroup.procs", "w") as f:
                f.write(str(w.pid))
            with open(frz + "/freezer.state", "w") as f:
                f.write("FROZEN")
            wait(lambda: open(frz + "/freezer.state").read().strip() == "FROZEN", "frozen")
            t0 = time.monotonic()
            m = expect_code(lambda r, timeout: create("grp-frozen"), None, C.UNAVAILABLE,
                            "a consumer that cannot stop")
            took = time.monotonic() - t0
            assert "did not stop" in m and (VOLS[0] in m or VOLS[1] in m), m
            assert took < 10, "the refusal took %.1f s" % took
            assert not [f for f in os.listdir(snapdir) if f.startswith("grp-frozen")]
            assert not os.path.exists(os.path.join(groupdir, "grp-frozen.json"))
            assert not os.listdir(os.path.join(env.state, "barriers"))
        finally:
            with open(frz + "/freezer.state", "w") as f:
                f.write("THAWED")
            with open("/sys/fs/cgroup/freezer/cgroup.procs", "w") as f:
                f.write(str(w.pid))
            os.rmdir(frz)
        wait(w.running, "the writer running once thawed", 5)
        expect_code(c.GetVolumeGroupSnapshot, pb.GetVolumeGroupSnapshotRequest(
            group_snapshot_id="grp-frozen@" + env.node), C.NOT_FOUND, "the failed group")
        print("ok a consumer that cannot stop: UNAVAILABLE naming the volume after %.1f s, "
              "nothing left, the writer runs on" % took)

    # ---- idempotency, Get, Delete's checks, restore
    again = create("grp-0")
    assert [s.snapshot_id for s in again.snapshots] == [
        s.snapshot_id for s in c.GetVolumeGroupSnapshot(pb.GetVolumeGroupSnapshotRequest(
            group_snapshot_id="grp-0@" + env.node), timeout=T).group_snapshot.snapshots]
    expect_code(lambda r, timeout: create("grp-0", [vid[0]]), None, C.ALREADY_EXISTS,
                "same name, other sources")
    g5 = c.GetVolumeGroupSnapshot(pb.GetVolumeGroupSnapshotRequest(
        group_snapshot_id="grp-5@" + env.node), timeout=T).group_snapshot
    ids = [s.snapshot_id for s in g5.snapshots]
    c.GetVolumeGroupSnapshot(pb.GetVolumeGroupSnapshotRequest(
        group_snapshot_id=g5.group_snapshot_id, snapshot_ids=ids[::-1]), timeout=T)
    expect_code(c.GetVolumeGroupSnapshot, pb.GetVolumeGroupSnapshotRequest(
        group_snapshot_id=g5.group_snapshot_id, snapshot_ids=ids[:1]), C.INVALID_ARGUMENT,
        "get with a member missing")
    expect_code(c.DeleteVolumeGroupSnapshot, pb.DeleteVolumeGroupSnapshotRequest(
        group_snapshot_id=g5.group_snapshot_id, snapshot_ids=[ids[0], "grp-4-1@" + env.node]),
        C.INVALID_ARGUMENT, "delete with a wrong member")
    expect_code(c.DeleteSnapshot, pb.DeleteSnapshotRequest(snapshot_id=ids[0]),
                C.FAILED_PRECONDITION, "DeleteSnapshot of a member")
    check_group("grp-5")
    src = pb.VolumeContentSource(snapshot=pb.VolumeContentSource.SnapshotSource(
        snapshot_id=ids[1]))
    c.CreateVolume(pb.CreateVolumeRequest(
        name="pvc-restored", capacity_range=pb.CapacityRange(required_bytes=SIZE),
        volume_capabilities=[cap], volume_content_source=src), timeout=T)
    r = subprocess.run(["qemu-img", "compare", "-U",
                        os.path.join(pool, "volumes", "pvc-restored.qcow2"),
                        os.path.join(snapdir, csilib.local_id(ids[1]) + ".qcow2")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, "restored volume differs from its member snapshot: " + r.stdout
    c.DeleteVolume(pb.DeleteVolumeRequest(volume_id="pvc-restored"), timeout=T)
    print("ok idempotent by name, ALREADY_EXISTS on other sources, member checks, a member "
          "restores")
    nxt = w.stop()

    # ---- a plugin killed while a consumer is stopped: continued at start
    w = Writer(qsdctl, socks, nxt)
    w.wait_progress("before it is stopped")  # connected: a consumer of both volumes
    os.kill(w.pid, signal.SIGSTOP)
    wait(lambda: proc_state(w.pid) == "T", "the writer stopped")
    env.stop(signal.SIGKILL)
    bdir = os.path.join(env.state, "barriers")
    os.makedirs(bdir, exist_ok=True)
    with open(os.path.join(bdir, "grp-x.json"), "w") as f:
        json.dump({"version": 1, "stopped": [{"pid": w.pid, "starttime": starttime(w.pid)}]}, f)
    # what a kill -9 inside a record write leaves: its temporary file
    planted = [os.path.join(env.state, sub, ".tmp-%016x" % (0xdead0 + i))
               for i, sub in enumerate(("volumes", "snapshots", "groups", "barriers"))]
    for p in planted:
        with open(p, "w") as f:
            f.write('{"version": 1')
    c = env.start()
    wait(lambda: proc_state(w.pid) not in ("T", "t"), "the journalled writer continued", 5)
    assert not os.listdir(bdir), os.listdir(bdir)
    assert not [p for p in planted if os.path.exists(p)], "temporary files kept at start"
    print("ok a journalled stopped consumer is continued at start; a killed write's temporary "
          "files are removed")

    # ---- kill -9 at many instants of create and delete
    def consistent(what):
        recs = sorted(csilib.local_id(e.snapshot.snapshot_id) for e in
                      c.ListSnapshots(pb.ListSnapshotsRequest(), timeout=T).entries)
        files = sorted(f[:-6] for f in os.listdir(snapdir) if f.endswith(".qcow2"))
        assert recs == files, "%s: records %s, files %s" % (what, recs, files)
        for sub in ("volumes", "snapshots", "groups", "barriers"):
            d = os.path.join(env.state, sub)
            left = [f for f in os.listdir(d) if f.startswith(".tmp-")] if os.path.isdir(d) else []
            assert not left, "%s: a killed write's temporary files in %s: %s" % (what, d, left)
        gfiles = sorted(f[:-5] for f in os.listdir(groupdir))
        members = [r for r in recs if re.match(r"grp-", r)]
        for gname in gfiles:
            g = c.GetVolumeGroupSnapshot(pb.GetVolumeGroupSnapshotRequest(
                group_snapshot_id=gname + "@" + env.node), timeout=T).group_snapshot
            assert g.ready_to_use, (what, g)
        assert sorted(m.rsplit("-", 1)[0] for m in members) == sorted(gfiles * 2), (
            what, members, gfiles)

    # kill -9 inside the pause, seen from outside: the journal appears, then
    # the writer stops (the worker dies with the plugin, the writer stays
    # stopped until the restart)
    libc = ctypes.CDLL(None, use_errno=True)
    ino = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert ino >= 0 and libc.inotify_add_watch(ino, bdir.encode(), 0x100 | 0x80) >= 0  # CREATE, MOVED_TO
    caught = rounds = 0
    try:
        while rounds < 5 or (caught < 2 and rounds < 12):  # a loaded machine may be late
            n = rounds
            rounds += 1
            name = "grp-s%d" % n
            fut = c.CreateVolumeGroupSnapshot.future(pb.CreateVolumeGroupSnapshotRequest(
                name=name, source_volume_ids=vid), timeout=60)
            deadline, hit = time.monotonic() + 20, False
            while not hit and time.monotonic() < deadline:
                select.select([ino], [], [], 1)
                try:
                    buf = os.read(ino, 4096)
                except BlockingIOError:
                    continue
                hit = (name + ".json").encode() in buf
            assert hit, "no journal for %s" % name
            # The journal is written before the writer is stopped: on a fast
            # machine a kill at once lands before the SIGSTOP. Wait (bounded)
            # until the writer is seen stopped or the journal is gone again
            # (the pause is over), then kill: microseconds into a pause of ms.
            jpath = os.path.join(bdir, name + ".json")
            spin_until = time.monotonic() + 5
            while (proc_state(w.pid) != "T" and os.path.exists(jpath)
                   and time.monotonic() < spin_until):
                pass
            os.kill(env.proc.pid, signal.SIGKILL)
            time.sleep(0.05)
            caught += proc_state(w.pid) == "T"
            env.stop(signal.SIGKILL)
            try:
                fut.result()
            except grpc.RpcError:
                pass
            c = env.start()
            wait(lambda: proc_state(w.pid) not in ("T", "t"),
                 "the writer continued after a kill in the pause", 5)
            consistent("kill -9 in the pause of " + name)
            check_group(name, create(name))
    finally:
        os.close(ino)
    assert caught >= 1, "no kill landed while the writer was stopped"
    print("ok kill -9 once the writer was seen stopped in the pause, %d times (left stopped "
          "by %d of them): continued at restart, records and files agree, retries whole and "
          "a prefix" % (rounds, caught))

    delays = [0, 2, 5, 10, 15, 20, 30, 45, 60, 90, 130, 200]
    stopped_seen = 0
    for n, d in enumerate(delays):
        name = "grp-k%d" % n
        fut = c.CreateVolumeGroupSnapshot.future(pb.CreateVolumeGroupSnapshotRequest(
            name=name, source_volume_ids=vid), timeout=60)
        time.sleep(d / 1000.0)
        env.stop(signal.SIGKILL)
        try:
            fut.result()
        except grpc.RpcError:
            pass
        stopped_seen += proc_state(w.pid) == "T"
        c = env.start()
        wait(lambda: proc_state(w.pid) not in ("T", "t"), "the writer continued after kill %d" % n,
             5)
        consistent("kill -9 after %d ms of create" % d)
        check_group(name, create(name))  # the retry: whole, and a prefix
    print("ok kill -9 at %d instants of CreateVolumeGroupSnapshot (the writer was stopped at %d "
          "of them): restarted with no stopped writer, records and files agree, each retry "
          "whole and a prefix" % (len(delays), stopped_seen))
    for n, d in enumerate([0, 1, 3, 6]):
        name = "grp-k%d" % n
        fut = c.DeleteVolumeGroupSnapshot.future(pb.DeleteVolumeGroupSnapshotRequest(
            group_snapshot_id=name + "@" + env.node), timeout=60)
        time.sleep(d / 1000.0)
        env.stop(signal.SIGKILL)
        try:
            fut.result()
        except grpc.RpcError:
            pass
        c = env.start()
        consistent("kill -9 after %d ms of delete" % d)
        c.DeleteVolumeGroupSnapshot(pb.DeleteVolumeGroupSnapshotRequest(
            group_snapshot_id=name + "@" + env.node), timeout=T)
        expect_code(c.GetVolumeGroupSnapshot, pb.GetVolumeGroupSnapshotRequest(
            group_snapshot_id=name + "@" + env.node), C.NOT_FOUND, "deleted " + name)
        consistent("after the delete of " + name)
    print("ok kill -9 during DeleteVolumeGroupSnapshot: records and files agree, a retry "
          "deletes")
    w.stop()

    # ---- nothing left
    for gname in sorted(f[:-5] for f in os.listdir(groupdir)):
        c.DeleteVolumeGroupSnapshot(pb.DeleteVolumeGroupSnapshotRequest(
            group_snapshot_id=gname + "@" + env.node), timeout=T)
    assert not os.listdir(snapdir) and not os.listdir(groupdir)
    for i, v in enumerate(VOLS):
        tgt = os.path.dirname(socks[i])
        c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=v, target_path=tgt),
                              timeout=T)
        c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(
            volume_id=v, staging_target_path=os.path.join(env.kubelet, "staging", v)), timeout=T)
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=v), timeout=T)
    wait(lambda: not os.listdir(os.path.join(pool, "layers")), "every layer removed")
    print("PASS: group snapshots at one instant under a writer, refusals, idempotency, kill -9 "
          "in create and delete")
    assert env.stop() == 0


def main():
    qsdctl = sys.argv[3]
    env = csilib.Env(sys.argv[1], sys.argv[2], prefix="qsd-group-")
    try:
        run(env, qsdctl)
    finally:
        for w in WRITERS:
            if w.p.poll() is None:
                w.p.kill()
                w.p.wait()
        if sys.exc_info()[0] is not None:
            print("---- plugin log (tail)\n" + env.log_tail(80))
        env.cleanup()


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
