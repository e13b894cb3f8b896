#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Conformance test of the Controller and Node services, written from the CSI
specification (v1.9), with a client that is not ours (python3-grpcio).

Covers every RPC the plugin serves, idempotency, pagination, the status codes
the specification lists per call, bad input (path traversal in ids, paths
outside the kubelet root), and real bind mounts under a temporary kubelet root.

usage: test_csi_conformance.py PLUGIN_BINARY PROTO_DIR
"""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402
from csilib import expect_code, mount_cap, block_cap, is_mount_point  # noqa: E402
import grpc  # noqa: E402

C = grpc.StatusCode
GiB = 1 << 30
MiB = 1 << 20


def process_with(needle, fut, timeout=30):
    """The pid of a process whose command line holds needle (bytes), polled
    until it appears (bounded), while fut (the call that starts it) is not
    done."""
    deadline = time.monotonic() + timeout
    while True:
        for d in os.listdir("/proc"):
            try:
                with open("/proc/%s/cmdline" % d, "rb") as f:
                    if d.isdigit() and needle in f.read():
                        return int(d)
            except OSError:
                pass
        assert not fut.done(), "the call ended before its %s was seen: %s" % (needle, fut)
        assert time.monotonic() < deadline, "no process with %s within %d s" % (needle, timeout)
        time.sleep(0.002)


def main():
    env = csilib.Env(sys.argv[1], sys.argv[2])
    try:
        run(env)
    finally:
        if sys.exc_info()[0] is not None:
            print("---- plugin log (tail)\n" + env.log_tail())
        env.cleanup()


def run(env):
    c = env.start()
    pb = env.pb
    T = csilib.CALL_TIMEOUT
    cap = mount_cap(pb)

    # ---------------------------------------------------- capabilities, info
    caps = c.ControllerGetCapabilities(pb.ControllerGetCapabilitiesRequest(), timeout=T)
    R = pb.ControllerServiceCapability.RPC
    got = {x.rpc.type for x in caps.capabilities}
    # EXPAND_VOLUME always (docs/csi-plugin.md, "Deploying"); GET_SNAPSHOT and
    # the health RPCs: test_csi_health.py.
    assert got == {R.CREATE_DELETE_VOLUME, R.LIST_VOLUMES, R.GET_CAPACITY, R.MODIFY_VOLUME,
                   R.CREATE_DELETE_SNAPSHOT, R.LIST_SNAPSHOTS, R.CLONE_VOLUME,
                   R.SINGLE_NODE_MULTI_WRITER, R.EXPAND_VOLUME, R.GET_SNAPSHOT,
                   R.GET_VOLUME_HEALTH, R.LIST_VOLUME_HEALTH}, got
    ncaps = c.NodeGetCapabilities(pb.NodeGetCapabilitiesRequest(), timeout=T)
    NR = pb.NodeServiceCapability.RPC
    got = {x.rpc.type for x in ncaps.capabilities}
    assert got == {NR.STAGE_UNSTAGE_VOLUME, NR.GET_VOLUME_STATS, NR.EXPAND_VOLUME,
                   NR.VOLUME_CONDITION, NR.VOLUME_MOUNT_GROUP, NR.SINGLE_NODE_MULTI_WRITER,
                   NR.GET_VOLUME_HEALTH, NR.GET_STORAGE_HEALTH}, got
    info = c.NodeGetInfo(pb.NodeGetInfoRequest(), timeout=T)
    assert info.node_id == env.node and info.max_volumes_per_node == 128, info
    topo = dict(info.accessible_topology.segments)
    assert topo == {"topology.test.qsd-csi.dev/node": env.node}, topo
    print("ok capabilities, NodeGetInfo", topo)

    capy = c.GetCapacity(pb.GetCapacityRequest(), timeout=T)
    st = os.statvfs(env.pool)
    # free space less the default reserve (10% of the filesystem); thin
    # volumes without an overcommit limit: any size up to 1 PiB
    reserve = st.f_blocks * st.f_frsize * 10 // 100
    assert abs(capy.available_capacity - (st.f_bavail * st.f_frsize - reserve)) < 256 * MiB, capy
    assert capy.maximum_volume_size.value == 1 << 50, capy
    other = pb.Topology(segments={"topology.test.qsd-csi.dev/node": "elsewhere"})
    assert c.GetCapacity(pb.GetCapacityRequest(accessible_topology=other),
                         timeout=T).available_capacity == 0
    # Block volumes are served to pods (docs/pod-volumes.md): the same pool.
    assert c.GetCapacity(pb.GetCapacityRequest(volume_capabilities=[block_cap(pb)]),
                         timeout=T).available_capacity > 0
    expect_code(c.GetCapacity, pb.GetCapacityRequest(parameters={"bogus": "1"}),
                C.INVALID_ARGUMENT, "GetCapacity bogus parameter")
    print("ok GetCapacity", capy.available_capacity)

    # ------------------------------------------------------- CreateVolume
    def cv(name, size=64 * MiB, limit=0, params=None, src=None, caps=None, topo_req=None):
        return pb.CreateVolumeRequest(
            name=name, capacity_range=pb.CapacityRange(required_bytes=size, limit_bytes=limit),
            volume_capabilities=caps if caps is not None else [cap],
            parameters=params or {}, volume_content_source=src,
            accessibility_requirements=topo_req)

    expect_code(c.CreateVolume, pb.CreateVolumeRequest(volume_capabilities=[cap]),
                C.INVALID_ARGUMENT, "no name")
    expect_code(c.CreateVolume, cv("v-nocaps", caps=[]), C.INVALID_ARGUMENT, "no caps")
    expect_code(c.CreateVolume, cv("v-btrfs", caps=[mount_cap(pb, fs_type="btrfs")]),
                C.INVALID_ARGUMENT, "fsType btrfs")
    multi = mount_cap(pb, pb.VolumeCapability.AccessMode.MULTI_NODE_MULTI_WRITER)
    expect_code(c.CreateVolume, cv("v-multi", caps=[multi]), C.INVALID_ARGUMENT, "multi-node")
    for bad in ("../etc", "a/b", "..", ".hidden", "x" * 129, "a b", ""):
        expect_code(c.CreateVolume, cv(bad), C.INVALID_ARGUMENT, "name %r" % bad)
    expect_code(c.CreateVolume, cv("v-unknown", params={"colour": "blue"}), C.INVALID_ARGUMENT,
                "unknown parameter")
    for k, v in (("format", "vmdk"), ("numQueues", "0"), ("numQueues", "17"),
                 ("logicalBlockSize", "1024"), ("cache", "sometimes"), ("aio", "posix"),
                 ("discard", "maybe"), ("detectZeroes", "always"), ("preallocation", "huge")):
        d = expect_code(c.CreateVolume, cv("v-bad", params={k: v}), C.INVALID_ARGUMENT,
                        "%s=%s" % (k, v))
        assert k in d, d
    expect_code(c.CreateVolume, cv("v-bad", params={"aio": "native", "cache": "writeback"}),
                C.INVALID_ARGUMENT, "aio=native with cache=writeback")
    expect_code(c.CreateVolume, cv("v-range", size=2 * MiB, limit=1 * MiB), C.INVALID_ARGUMENT,
                "limit < required")
    expect_code(c.CreateVolume, cv("v-range", size=-1), C.INVALID_ARGUMENT, "negative")
    expect_code(c.CreateVolume, cv("v-range", size=1000, limit=1000), C.OUT_OF_RANGE,
                "no aligned size within range")
    expect_code(c.CreateVolume, cv("v-range", size=2 << 50), C.OUT_OF_RANGE, "above 1 PiB")
    req = pb.TopologyRequirement(requisite=[other])
    expect_code(c.CreateVolume, cv("v-topo", topo_req=req), C.RESOURCE_EXHAUSTED, "topology")
    assert not os.listdir(os.path.join(env.pool, "volumes")), "half-created images"
    assert not os.listdir(os.path.join(env.state, "volumes")), "half-created records"
    print("ok CreateVolume argument checks (nothing created)")

    here = pb.TopologyRequirement(requisite=[pb.Topology(segments=topo)],
                                  preferred=[pb.Topology(segments=topo)])
    params = {"format": "qcow2", "numQueues": "2", "cache": "writeback", "aio": "threads",
              "discard": "unmap", "detectZeroes": "unmap", "logicalBlockSize": "4096",
              "preallocation": "metadata", "csi.storage.k8s.io/pvc/name": "claim"}
    r1 = c.CreateVolume(cv("pvc-a", size=100 * MiB + 1, params=params, topo_req=here), timeout=T)
    v = r1.volume
    assert v.volume_id == "pvc-a@" + env.node and v.capacity_bytes == 100 * MiB + 4096, v
    assert [dict(t.segments) for t in v.accessible_topology] == [topo], v
    assert dict(v.volume_context) == {"csi.storage.k8s.io/pvc/name": "claim"}, v
    r2 = c.CreateVolume(cv("pvc-a", size=100 * MiB + 1, params=params), timeout=T)
    assert r2.volume == r1.volume, (r1, r2)
    expect_code(c.CreateVolume, cv("pvc-a", size=200 * MiB, params=params), C.ALREADY_EXISTS,
                "same name, bigger")
    expect_code(c.CreateVolume, cv("pvc-a", size=100 * MiB + 1, params={"format": "raw"}),
                C.ALREADY_EXISTS, "same name, other parameters")
    img = os.path.join(env.pool, "volumes", "pvc-a.qcow2")
    out = os.popen("qemu-img info --output=json -U %s" % img).read()
    assert '"virtual-size": %d' % (100 * MiB + 4096) in out, out
    raw = c.CreateVolume(cv("pvc-raw", size=0, params={"format": "raw"}), timeout=T).volume
    assert raw.capacity_bytes == GiB, raw   # default size when none is asked
    assert os.path.exists(os.path.join(env.pool, "volumes", "pvc-raw.raw"))
    lim = c.CreateVolume(cv("pvc-lim", size=0, limit=10 * MiB), timeout=T).volume
    assert lim.capacity_bytes == 10 * MiB, lim
    print("ok CreateVolume (parameters, alignment, idempotency, ALREADY_EXISTS, defaults)")

    # ABORTED while an operation on the same id is in flight.
    slow = c.CreateVolume.future(cv("pvc-slow", size=768 * MiB,
                                    params={"format": "raw", "preallocation": "full"}),
                                 timeout=T)
    # In flight for sure, and kept so while the concurrent calls are made:
    # its qemu-img (preallocating) is seen, then stopped until they are
    # answered (a fixed pause missed on a loaded machine, where the first
    # call may not have arrived yet, and on a fast one, where it is done).
    img = process_with(b"/.pvc-slow.raw.tmp-", slow)
    os.kill(img, signal.SIGSTOP)
    try:
        expect_code(c.CreateVolume, cv("pvc-slow", size=768 * MiB,
                                       params={"format": "raw", "preallocation": "full"}),
                    C.ABORTED, "concurrent CreateVolume")
        expect_code(c.DeleteVolume, pb.DeleteVolumeRequest(volume_id="pvc-slow"), C.ABORTED,
                    "DeleteVolume during CreateVolume")
        assert not slow.done(), "the first CreateVolume ended while its qemu-img was stopped"
    finally:
        os.kill(img, signal.SIGCONT)
    slow.result()
    c.DeleteVolume(pb.DeleteVolumeRequest(volume_id="pvc-slow"), timeout=T)
    print("ok ABORTED while in flight")

    # ------------------------------------------------ Validate, List, Delete
    expect_code(c.ValidateVolumeCapabilities, pb.ValidateVolumeCapabilitiesRequest(
        volume_capabilities=[cap]), C.INVALID_ARGUMENT, "validate no id")
    expect_code(c.ValidateVolumeCapabilities, pb.ValidateVolumeCapabilitiesRequest(
        volume_id="pvc-a"), C.INVALID_ARGUMENT, "validate no caps")
    expect_code(c.ValidateVolumeCapabilities, pb.ValidateVolumeCapabilitiesRequest(
        volume_id="nope", volume_capabilities=[cap]), C.NOT_FOUND, "validate unknown")
    expect_code(c.ValidateVolumeCapabilities, pb.ValidateVolumeCapabilitiesRequest(
        volume_id="../../x", volume_capabilities=[cap]), C.INVALID_ARGUMENT, "validate traversal")
    ok = c.ValidateVolumeCapabilities(pb.ValidateVolumeCapabilitiesRequest(
        volume_id="pvc-a", volume_capabilities=[cap], volume_context={"a": "b"}), timeout=T)
    assert ok.HasField("confirmed") and list(ok.confirmed.volume_capabilities) == [cap], ok
    assert dict(ok.confirmed.volume_context) == {"a": "b"}, ok
    for mode in (pb.VolumeCapability.AccessMode.SINGLE_NODE_MULTI_WRITER,
                 pb.VolumeCapability.AccessMode.SINGLE_NODE_SINGLE_WRITER,
                 pb.VolumeCapability.AccessMode.SINGLE_NODE_READER_ONLY,
                 pb.VolumeCapability.AccessMode.MULTI_NODE_READER_ONLY):
        r = c.ValidateVolumeCapabilities(pb.ValidateVolumeCapabilitiesRequest(
            volume_id="pvc-a", volume_capabilities=[mount_cap(pb, mode)]), timeout=T)
        assert r.HasField("confirmed"), (mode, r)
    for mode in (pb.VolumeCapability.AccessMode.MULTI_NODE_SINGLE_WRITER,
                 pb.VolumeCapability.AccessMode.MULTI_NODE_MULTI_WRITER):
        r = c.ValidateVolumeCapabilities(pb.ValidateVolumeCapabilitiesRequest(
            volume_id="pvc-a", volume_capabilities=[mount_cap(pb, mode)]), timeout=T)
        assert not r.HasField("confirmed") and r.message, (mode, r)
    no = c.ValidateVolumeCapabilities(pb.ValidateVolumeCapabilitiesRequest(
        volume_id="pvc-a", volume_capabilities=[mount_cap(pb, fs_type="btrfs")]), timeout=T)
    assert not no.HasField("confirmed") and no.message, no
    for capab in (block_cap(pb), mount_cap(pb, fs_type="ext4"), mount_cap(pb, fs_type="xfs")):
        r = c.ValidateVolumeCapabilities(pb.ValidateVolumeCapabilitiesRequest(
            volume_id="pvc-a", volume_capabilities=[capab]), timeout=T)
        assert r.HasField("confirmed"), (capab, r)
    print("ok ValidateVolumeCapabilities")

    names = ["pvc-list-%02d" % i for i in range(7)]
    for n in names:
        c.CreateVolume(cv(n, size=MiB), timeout=T)
    allv = [csilib.local_id(e.volume.volume_id) for e in c.ListVolumes(pb.ListVolumesRequest(), timeout=T).entries]
    assert allv == sorted(allv) and set(names) <= set(allv), allv
    seen, tok, pages = [], "", 0
    while True:
        r = c.ListVolumes(pb.ListVolumesRequest(max_entries=3, starting_token=tok), timeout=T)
        assert len(r.entries) <= 3
        seen += [csilib.local_id(e.volume.volume_id) for e in r.entries]
        pages += 1
        tok = r.next_token
        if not tok:
            break
        if pages == 1:
            # The last volume of the page goes away: the token still works.
            c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=seen[-1]), timeout=T)
    assert pages == 4 and len(seen) == len(allv) and len(set(seen)) == len(seen), (pages, seen)
    expect_code(c.ListVolumes, pb.ListVolumesRequest(starting_token="invalid-token"), C.ABORTED,
                "bad token")
    expect_code(c.ListVolumes, pb.ListVolumesRequest(max_entries=-1), C.INVALID_ARGUMENT,
                "negative max_entries")
    print("ok ListVolumes pagination (%d volumes, %d pages)" % (len(seen), pages))

    expect_code(c.DeleteVolume, pb.DeleteVolumeRequest(), C.INVALID_ARGUMENT, "delete no id")
    expect_code(c.DeleteVolume, pb.DeleteVolumeRequest(volume_id="../pool"), C.INVALID_ARGUMENT,
                "delete traversal")
    c.DeleteVolume(pb.DeleteVolumeRequest(volume_id="never-existed"), timeout=T)
    for n in names[1:]:
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=n), timeout=T)
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=n), timeout=T)   # idempotent
    assert not [f for f in os.listdir(os.path.join(env.pool, "volumes")) if "list" in f]
    print("ok DeleteVolume (idempotent, unknown is OK)")

    # ---------------------------------------------------------- snapshots
    def cs(name, src):
        return pb.CreateSnapshotRequest(name=name, source_volume_id=src)
    expect_code(c.CreateSnapshot, pb.CreateSnapshotRequest(source_volume_id="pvc-a"),
                C.INVALID_ARGUMENT, "snapshot no name")
    expect_code(c.CreateSnapshot, pb.CreateSnapshotRequest(name="s"), C.INVALID_ARGUMENT,
                "snapshot no source")
    expect_code(c.CreateSnapshot, cs("s/../x", "pvc-a"), C.INVALID_ARGUMENT, "snapshot traversal")
    expect_code(c.CreateSnapshot, cs("snap-x", "nope"), C.NOT_FOUND, "snapshot of unknown")
    expect_code(c.CreateSnapshot, pb.CreateSnapshotRequest(name="snap-p", source_volume_id="pvc-a",
                                                           parameters={"x": "y"}),
                C.INVALID_ARGUMENT, "snapshot parameter")
    s1 = c.CreateSnapshot(cs("snap-a", "pvc-a"), timeout=T).snapshot
    assert s1.snapshot_id == "snap-a@" + env.node and s1.source_volume_id == "pvc-a@" + env.node and s1.ready_to_use, s1
    assert s1.size_bytes == 100 * MiB + 4096 and s1.creation_time.seconds > 0, s1
    assert c.CreateSnapshot(cs("snap-a", "pvc-a"), timeout=T).snapshot == s1
    expect_code(c.CreateSnapshot, cs("snap-a", "pvc-raw"), C.ALREADY_EXISTS, "other source")
    for i in range(4):
        c.CreateSnapshot(cs("snap-r%d" % i, "pvc-raw"), timeout=T)
    ls = c.ListSnapshots(pb.ListSnapshotsRequest(), timeout=T)
    assert [csilib.local_id(e.snapshot.snapshot_id) for e in ls.entries] == \
        ["snap-a", "snap-r0", "snap-r1", "snap-r2", "snap-r3"], ls
    one = c.ListSnapshots(pb.ListSnapshotsRequest(snapshot_id="snap-r2"), timeout=T)
    assert [csilib.local_id(e.snapshot.snapshot_id) for e in one.entries] == ["snap-r2"], one
    assert not c.ListSnapshots(pb.ListSnapshotsRequest(snapshot_id="none-exist-id"),
                               timeout=T).entries
    bysrc = c.ListSnapshots(pb.ListSnapshotsRequest(source_volume_id="pvc-raw"), timeout=T)
    assert len(bysrc.entries) == 4, bysrc
    assert not c.ListSnapshots(pb.ListSnapshotsRequest(source_volume_id="nope"), timeout=T).entries
    p1 = c.ListSnapshots(pb.ListSnapshotsRequest(max_entries=2), timeout=T)
    assert len(p1.entries) == 2 and p1.next_token, p1
    p2 = c.ListSnapshots(pb.ListSnapshotsRequest(starting_token=p1.next_token), timeout=T)
    assert len(p2.entries) == 3 and not p2.next_token, p2
    expect_code(c.ListSnapshots, pb.ListSnapshotsRequest(starting_token="garbage"), C.ABORTED,
                "bad snapshot token")
    print("ok CreateSnapshot/ListSnapshots (idempotent, filters, pagination)")

    # Restore, clone, snapshot outliving its source.
    src = pb.VolumeContentSource(snapshot=pb.VolumeContentSource.SnapshotSource(snapshot_id="snap-r0"))
    rv = c.CreateVolume(cv("pvc-restored", size=0, src=src), timeout=T).volume
    assert rv.capacity_bytes == GiB and csilib.local_id(rv.content_source.snapshot.snapshot_id) == "snap-r0", rv
    big = c.CreateVolume(cv("pvc-restored-big", size=2 * GiB, src=src), timeout=T).volume
    assert big.capacity_bytes == 2 * GiB, big
    expect_code(c.CreateVolume, cv("pvc-restored-small", size=MiB, limit=MiB, src=src),
                C.OUT_OF_RANGE, "restore smaller than snapshot")
    bad = pb.VolumeContentSource(snapshot=pb.VolumeContentSource.SnapshotSource(snapshot_id="nope"))
    expect_code(c.CreateVolume, cv("pvc-r2", src=bad), C.NOT_FOUND, "unknown snapshot source")
    vsrc = pb.VolumeContentSource(volume=pb.VolumeContentSource.VolumeSource(volume_id="pvc-a"))
    cl = c.CreateVolume(cv("pvc-clone", size=0, src=vsrc, params=params), timeout=T).volume
    assert cl.capacity_bytes == 100 * MiB + 4096 and csilib.local_id(cl.content_source.volume.volume_id) == "pvc-a"
    bad = pb.VolumeContentSource(volume=pb.VolumeContentSource.VolumeSource(volume_id="nope"))
    expect_code(c.CreateVolume, cv("pvc-c2", src=bad), C.NOT_FOUND, "unknown volume source")
    # A copy that fails half-way (the snapshot file is garbage) leaves nothing.
    # (A thin snapshot is a second name of a layer pvc-lim still reads:
    # replace the name by a garbage file rather than writing into it.)
    c.CreateSnapshot(cs("snap-bad", "pvc-lim"), timeout=T)
    bad_path = os.path.join(env.pool, "snapshots", "snap-bad.qcow2")
    os.unlink(bad_path)
    with open(bad_path, "wb") as f:
        f.write(b"\0" * 4096)
    bsrc = pb.VolumeContentSource(snapshot=pb.VolumeContentSource.SnapshotSource(
        snapshot_id="snap-bad"))
    d = expect_code(c.CreateVolume, cv("pvc-from-bad", size=0, src=bsrc), C.INTERNAL,
                    "restore from a corrupt snapshot")
    assert not [f for f in os.listdir(os.path.join(env.pool, "volumes")) if "from-bad" in f], d
    assert not os.path.exists(os.path.join(env.state, "volumes", "pvc-from-bad.json"))
    c.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id="snap-bad"), timeout=T)
    print("ok failed copy leaves no image and no record:", d)
    c.DeleteVolume(pb.DeleteVolumeRequest(volume_id="pvc-raw"), timeout=T)
    assert len(c.ListSnapshots(pb.ListSnapshotsRequest(source_volume_id="pvc-raw"),
                               timeout=T).entries) == 4, "snapshots must outlive their source"
    c.CreateVolume(cv("pvc-after", size=0, src=src), timeout=T)
    expect_code(c.DeleteSnapshot, pb.DeleteSnapshotRequest(), C.INVALID_ARGUMENT, "no snap id")
    c.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id="reallyfakesnapshotid"), timeout=T)
    for i in range(4):
        c.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id="snap-r%d" % i), timeout=T)
    assert sorted(os.listdir(os.path.join(env.pool, "snapshots"))) == ["snap-a.qcow2"]
    print("ok restore from snapshot, clone, snapshot outlives its source, DeleteSnapshot")

    # ------------------------------------------------- ControllerExpand
    expect_code(c.ControllerExpandVolume, pb.ControllerExpandVolumeRequest(
        capacity_range=pb.CapacityRange(required_bytes=GiB)), C.INVALID_ARGUMENT, "expand no id")
    expect_code(c.ControllerExpandVolume, pb.ControllerExpandVolumeRequest(volume_id="pvc-lim"),
                C.INVALID_ARGUMENT, "expand no range")
    expect_code(c.ControllerExpandVolume, pb.ControllerExpandVolumeRequest(
        volume_id="nope", capacity_range=pb.CapacityRange(required_bytes=GiB)), C.NOT_FOUND,
        "expand unknown")
    e = c.ControllerExpandVolume(pb.ControllerExpandVolumeRequest(
        volume_id="pvc-lim", capacity_range=pb.CapacityRange(required_bytes=20 * MiB)), timeout=T)
    assert e.capacity_bytes == 20 * MiB and not e.node_expansion_required, e
    e = c.ControllerExpandVolume(pb.ControllerExpandVolumeRequest(
        volume_id="pvc-lim", capacity_range=pb.CapacityRange(required_bytes=5 * MiB)), timeout=T)
    assert e.capacity_bytes == 20 * MiB, e   # never shrinks
    out = os.popen("qemu-img info --output=json %s" %
                   os.path.join(env.pool, "volumes", "pvc-lim.qcow2")).read()
    assert '"virtual-size": %d' % (20 * MiB) in out, out
    print("ok ControllerExpandVolume (offline)")

    # ------------------------------------------------------------ Node
    k = env.kubelet
    stg = os.path.join(k, "plugins", "kubernetes.io", "csi", "pv", "pvc-a", "globalmount")
    tgt = os.path.join(k, "pods", "uid-1", "volumes", "kubernetes.io~csi", "pvc-a", "mount")
    os.makedirs(stg)
    os.makedirs(os.path.dirname(tgt))
    gcap = mount_cap(pb, group="108")

    def stage_req(vid="pvc-a", path=stg, capab=mount_cap(pb, group="107")):
        return pb.NodeStageVolumeRequest(volume_id=vid, staging_target_path=path,
                                         volume_capability=capab)

    def pub_req(vid="pvc-a", target=tgt, ro=False, capab=gcap, staging=stg):
        return pb.NodePublishVolumeRequest(volume_id=vid, staging_target_path=staging,
                                           target_path=target, volume_capability=capab,
                                           readonly=ro)

    expect_code(c.NodeStageVolume, stage_req(vid=""), C.INVALID_ARGUMENT, "stage no id")
    expect_code(c.NodeStageVolume, stage_req(path=""), C.INVALID_ARGUMENT, "stage no path")
    expect_code(c.NodeStageVolume, pb.NodeStageVolumeRequest(volume_id="pvc-a",
                                                              staging_target_path=stg),
                C.INVALID_ARGUMENT, "stage no cap")
    expect_code(c.NodeStageVolume, stage_req(capab=mount_cap(pb, fs_type="btrfs")),
                C.INVALID_ARGUMENT, "stage fsType btrfs")
    expect_code(c.NodeStageVolume, stage_req(capab=mount_cap(pb, group="wheel")),
                C.INVALID_ARGUMENT, "non-numeric group")
    for bad in ("/etc", k + "/../etc", k + "/a/../../etc", k + "//x", "relative/path", k,
                k + "/./x", k + "/x/"):
        expect_code(c.NodeStageVolume, stage_req(path=bad), C.INVALID_ARGUMENT,
                    "stage path %r" % bad)
    os.symlink("/tmp", os.path.join(k, "escape"))
    expect_code(c.NodeStageVolume, stage_req(path=os.path.join(k, "escape", "x")),
                C.INVALID_ARGUMENT, "stage path through a symlink")
    expect_code(c.NodeStageVolume, stage_req(vid="../../etc/passwd"), C.INVALID_ARGUMENT,
                "stage traversal id")
    expect_code(c.NodeStageVolume, stage_req(vid="nope"), C.NOT_FOUND, "stage unknown")
    c.NodeStageVolume(stage_req(), timeout=T)
    c.NodeStageVolume(stage_req(), timeout=T)  # idempotent
    expdir = os.path.join(env.run, "exports", "pvc-a")
    sock = os.path.join(expdir, "vhost.sock")
    stt = os.stat(sock)
    assert stt.st_gid == 107 and stt.st_mode & 0o777 == 0o660, oct(stt.st_mode)
    assert os.stat(expdir).st_gid == 107 and os.stat(expdir).st_mode & 0o777 == 0o750
    import json
    meta = json.load(open(os.path.join(expdir, "volume.json")))
    assert meta["volume"] == "pvc-a" and meta["num_queues"] == 2 and \
        meta["logical_block_size"] == 4096 and meta["size"] == 100 * MiB + 4096, meta
    expect_code(c.NodeStageVolume, stage_req(capab=mount_cap(
        pb, pb.VolumeCapability.AccessMode.SINGLE_NODE_READER_ONLY, group="107")),
        C.ALREADY_EXISTS, "stage again, read-only")
    # A later volume_mount_group (kubelet passes the pod's fsGroup) moves the
    # socket to that group while nothing is published.
    c.NodeStageVolume(stage_req(capab=gcap), timeout=T)
    assert os.stat(sock).st_gid == 108 and os.stat(expdir).st_gid == 108
    assert os.stat(os.path.join(expdir, "volume.json")).st_gid == 108
    other_stg = os.path.join(k, "other-staging")
    os.mkdir(other_stg)
    expect_code(c.NodeStageVolume, stage_req(path=other_stg), C.FAILED_PRECONDITION,
                "stage at a second path")
    print("ok NodeStageVolume (QSD serving, socket root:107 0660, regrouped to 108)")

    expect_code(c.NodePublishVolume, pub_req(vid=""), C.INVALID_ARGUMENT, "pub no id")
    expect_code(c.NodePublishVolume, pub_req(target=""), C.INVALID_ARGUMENT, "pub no target")
    expect_code(c.NodePublishVolume, pb.NodePublishVolumeRequest(
        volume_id="pvc-a", target_path=tgt, staging_target_path=stg), C.INVALID_ARGUMENT,
        "pub no cap")
    expect_code(c.NodePublishVolume, pub_req(staging=""), C.INVALID_ARGUMENT, "pub no staging")
    expect_code(c.NodePublishVolume, pub_req(target="/mnt/x"), C.INVALID_ARGUMENT,
                "pub outside kubelet root")
    expect_code(c.NodePublishVolume, pub_req(target=k + "/pods/../../../etc"),
                C.INVALID_ARGUMENT, "pub dot-dot")
    expect_code(c.NodePublishVolume, pub_req(target=os.path.join(k, "escape")),
                C.INVALID_ARGUMENT, "pub onto a symlink")
    expect_code(c.NodePublishVolume, pub_req(vid="nope"), C.NOT_FOUND, "pub unknown")
    expect_code(c.NodePublishVolume, pub_req(vid="pvc-lim"), C.FAILED_PRECONDITION,
                "pub not staged")
    c.NodePublishVolume(pub_req(), timeout=T)
    c.NodePublishVolume(pub_req(), timeout=T)  # idempotent
    assert is_mount_point(tgt), "target not mounted"
    assert sorted(os.listdir(tgt)) == ["vhost.sock", "volume.json"], os.listdir(tgt)
    expect_code(c.NodePublishVolume, pub_req(ro=True), C.ALREADY_EXISTS, "pub again read-only")
    tgt2 = os.path.join(k, "pods", "uid-2", "mount")
    os.makedirs(os.path.dirname(tgt2))
    expect_code(c.NodePublishVolume, pub_req(target=tgt2), C.FAILED_PRECONDITION,
                "second writer")
    expect_code(c.NodePublishVolume, pub_req(target=tgt2, ro=True,
                                             capab=mount_cap(pb, group="109")),
                C.FAILED_PRECONDITION, "publish for another group while published")
    expect_code(c.NodeStageVolume, stage_req(capab=mount_cap(pb, group="109")),
                C.FAILED_PRECONDITION, "regroup while published")
    c.NodePublishVolume(pub_req(target=tgt2, ro=True), timeout=T)
    assert is_mount_point(tgt2)
    try:
        open(os.path.join(tgt2, "x"), "w")
        raise AssertionError("read-only publish is writable")
    except OSError as ex:
        assert ex.errno == 30, ex  # EROFS
    print("ok NodePublishVolume (bind mount, read-only, idempotent, conflicts)")

    # Stats and online expansion.
    expect_code(c.NodeGetVolumeStats, pb.NodeGetVolumeStatsRequest(volume_path=tgt),
                C.INVALID_ARGUMENT, "stats no id")
    expect_code(c.NodeGetVolumeStats, pb.NodeGetVolumeStatsRequest(volume_id="pvc-a"),
                C.INVALID_ARGUMENT, "stats no path")
    expect_code(c.NodeGetVolumeStats, pb.NodeGetVolumeStatsRequest(volume_id="nope",
                                                                   volume_path="some/path"),
                C.NOT_FOUND, "stats unknown")
    expect_code(c.NodeGetVolumeStats, pb.NodeGetVolumeStatsRequest(volume_id="pvc-a",
                                                                   volume_path="some/path"),
                C.NOT_FOUND, "stats wrong path")
    s = c.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(volume_id="pvc-a", volume_path=tgt),
                             timeout=T)
    u = s.usage[0]
    assert u.unit == pb.VolumeUsage.BYTES and u.total == 100 * MiB + 4096 and 0 < u.used, s
    assert u.available == u.total - u.used and not s.volume_condition.abnormal, s
    e = c.ControllerExpandVolume(pb.ControllerExpandVolumeRequest(
        volume_id="pvc-a", capacity_range=pb.CapacityRange(required_bytes=200 * MiB)), timeout=T)
    assert e.capacity_bytes == 200 * MiB and e.node_expansion_required, e
    expect_code(c.NodeExpandVolume, pb.NodeExpandVolumeRequest(volume_path=tgt),
                C.INVALID_ARGUMENT, "node expand no id")
    expect_code(c.NodeExpandVolume, pb.NodeExpandVolumeRequest(volume_id="pvc-a"),
                C.INVALID_ARGUMENT, "node expand no path")
    expect_code(c.NodeExpandVolume, pb.NodeExpandVolumeRequest(volume_id="nope",
                                                               volume_path="some/path"),
                C.NOT_FOUND, "node expand unknown")
    ne = c.NodeExpandVolume(pb.NodeExpandVolumeRequest(
        volume_id="pvc-a", volume_path=tgt, capacity_range=pb.CapacityRange(
            required_bytes=200 * MiB)), timeout=T)
    assert ne.capacity_bytes == 200 * MiB, ne
    meta = json.load(open(os.path.join(tgt, "volume.json")))
    assert meta["size"] == 200 * MiB, meta
    s = c.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(volume_id="pvc-a", volume_path=tgt),
                             timeout=T)
    assert s.usage[0].total == 200 * MiB, s
    print("ok NodeGetVolumeStats, online expansion (QSD block_resize, volume.json)")

    # Live snapshot and clone of a staged volume go through its QSD.
    ls = c.CreateSnapshot(cs("snap-live", "pvc-a"), timeout=T).snapshot
    assert ls.size_bytes == 200 * MiB, ls
    lc = c.CreateVolume(cv("pvc-live-clone", size=0, src=vsrc, params=params), timeout=T).volume
    assert lc.capacity_bytes == 200 * MiB, lc
    assert '"live=yes"' in env.log_tail(400) or "live=yes" in env.log_tail(400)
    print("ok live snapshot and clone through the QSD")

    # Abnormal condition while the QSD is down, then supervised restart.
    pid = env.qsd_pids()["pvc-a"]
    os.kill(pid, 9)
    abnormal = False
    for _ in range(200):
        s = c.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(volume_id="pvc-a", volume_path=tgt),
                                 timeout=T)
        if s.volume_condition.abnormal:
            abnormal = True
        if env.qsd_pids().get("pvc-a") not in (None, pid) and not s.volume_condition.abnormal:
            break
        time.sleep(0.005)
    assert env.qsd_pids()["pvc-a"] != pid, "QSD not restarted"
    assert os.stat(os.path.join(tgt, "vhost.sock")).st_gid == 108, "group lost on restart"
    print("ok QSD restarted after kill -9 (abnormal seen in between: %s)" % abnormal)

    # Teardown in kubelet's order, with the state checks.
    expect_code(c.NodeUnstageVolume, pb.NodeUnstageVolumeRequest(volume_id="pvc-a",
                                                                 staging_target_path=stg),
                C.FAILED_PRECONDITION, "unstage while published")
    expect_code(c.DeleteVolume, pb.DeleteVolumeRequest(volume_id="pvc-a"),
                C.FAILED_PRECONDITION, "delete while published")
    expect_code(c.NodeUnpublishVolume, pb.NodeUnpublishVolumeRequest(target_path=tgt),
                C.INVALID_ARGUMENT, "unpub no id")
    expect_code(c.NodeUnpublishVolume, pb.NodeUnpublishVolumeRequest(volume_id="pvc-a"),
                C.INVALID_ARGUMENT, "unpub no target")
    expect_code(c.NodeUnpublishVolume, pb.NodeUnpublishVolumeRequest(volume_id="pvc-a",
                                                                     target_path="/etc"),
                C.INVALID_ARGUMENT, "unpub outside root")
    expect_code(c.NodeUnpublishVolume, pb.NodeUnpublishVolumeRequest(volume_id="nope",
                                                                     target_path=tgt),
                C.NOT_FOUND, "unpub unknown")
    for t in (tgt, tgt2):
        c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id="pvc-a", target_path=t),
                              timeout=T)
        c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id="pvc-a", target_path=t),
                              timeout=T)
        assert not os.path.exists(t) and not is_mount_point(t), t
    expect_code(c.NodeUnstageVolume, pb.NodeUnstageVolumeRequest(staging_target_path=stg),
                C.INVALID_ARGUMENT, "unstage no id")
    expect_code(c.NodeUnstageVolume, pb.NodeUnstageVolumeRequest(volume_id="pvc-a"),
                C.INVALID_ARGUMENT, "unstage no path")
    expect_code(c.NodeUnstageVolume, pb.NodeUnstageVolumeRequest(volume_id="nope",
                                                                 staging_target_path=stg),
                C.NOT_FOUND, "unstage unknown")
    qpid = env.qsd_pids()["pvc-a"]
    c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id="pvc-a", staging_target_path=stg),
                        timeout=T)
    c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id="pvc-a", staging_target_path=stg),
                        timeout=T)
    assert not os.path.exists(expdir) and not os.path.exists("/proc/%d" % qpid) or \
        open("/proc/%d/stat" % qpid).read().split()[2] == "Z", "QSD still running"
    # An expansion recorded while staged but never done on the node: the next
    # NodeStageVolume grows the image offline before starting the QSD.
    lstg = os.path.join(k, "staging-lim")
    os.mkdir(lstg)
    c.NodeStageVolume(stage_req(vid="pvc-lim", path=lstg, capab=cap), timeout=T)
    e = c.ControllerExpandVolume(pb.ControllerExpandVolumeRequest(
        volume_id="pvc-lim", capacity_range=pb.CapacityRange(required_bytes=40 * MiB)), timeout=T)
    assert e.capacity_bytes == 40 * MiB and e.node_expansion_required, e
    c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id="pvc-lim",
                                                    staging_target_path=lstg), timeout=T)
    c.NodeStageVolume(stage_req(vid="pvc-lim", path=lstg, capab=cap), timeout=T)
    meta = json.load(open(os.path.join(env.run, "exports", "pvc-lim", "volume.json")))
    assert meta["size"] == 40 * MiB, meta
    s = c.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(volume_id="pvc-lim", volume_path=lstg),
                             timeout=T)
    assert s.usage[0].total == 40 * MiB, s
    c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id="pvc-lim",
                                                    staging_target_path=lstg), timeout=T)
    print("ok pending expansion applied offline at the next NodeStageVolume")

    # A staged volume is not deleted (a guest may hold it: NodeUnstage waits
    # for the guest, DeleteVolume would not); after NodeUnstage it is.
    c.NodeStageVolume(stage_req(vid="pvc-clone", capab=cap), timeout=T)
    expect_code(c.DeleteVolume, pb.DeleteVolumeRequest(volume_id="pvc-clone"),
                C.FAILED_PRECONDITION, "delete a staged volume")
    assert os.path.exists(os.path.join(env.run, "exports", "pvc-clone", "vhost.sock"))
    c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id="pvc-clone",
                                                    staging_target_path=stg), timeout=T)
    c.DeleteVolume(pb.DeleteVolumeRequest(volume_id="pvc-clone"), timeout=T)
    assert not os.path.exists(os.path.join(env.run, "exports", "pvc-clone"))
    print("ok DeleteVolume of a staged volume is FAILED_PRECONDITION, after unstage OK")
    for vid in ("pvc-a", "pvc-lim", "pvc-restored", "pvc-restored-big", "pvc-after",
                "pvc-live-clone"):
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vid), timeout=T)
    for sid in ("snap-a", "snap-live"):
        c.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=sid), timeout=T)
    assert not os.listdir(os.path.join(env.pool, "volumes")), os.listdir(env.pool + "/volumes")
    assert not os.listdir(os.path.join(env.pool, "snapshots"))
    assert not os.listdir(os.path.join(env.state, "volumes"))
    assert not os.listdir(os.path.join(env.state, "snapshots"))
    print("ok teardown: unpublish, unstage, delete (nothing left behind)")

    # UNIMPLEMENTED for what is not advertised.
    expect_code(c.ControllerPublishVolume, pb.ControllerPublishVolumeRequest(volume_id="x"),
                C.UNIMPLEMENTED, "ControllerPublishVolume")
    rc = env.stop()
    assert rc == 0, "plugin exit code %s" % rc
    print("ok plugin exits 0 on SIGTERM")


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
