#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Two plugins with different node ids (node-a, node-b), each with its own
pool: volume and snapshot ids name their node ("<name>@<node>"); a restore
or clone whose source lives on the other node fails at once with
RESOURCE_EXHAUSTED naming the node to schedule on and the nodeSelector to
use; other calls with the other node's ids are NOT_FOUND naming it and
change nothing; plain ids (as issued before) keep working on their node;
ids that would pass 128 bytes stay plain.

usage: test_csi_nodes.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402
from csilib import mount_cap, expect_code  # noqa: E402

MiB = 1 << 20
T = 60
KEY = "topology.test.qsd-csi.dev/node"


def main():
    plugin, proto = sys.argv[1], sys.argv[2]
    a = csilib.Env(plugin, proto, prefix="qsd-csi-na-")
    b = csilib.Env(plugin, proto, prefix="qsd-csi-nb-")
    try:
        a.node, b.node = "node-a", "node-b"
        run(a, b)
    finally:
        b.cleanup()
        a.cleanup()


def run(a, b):
    pb = a.pb
    C = csilib.grpc.StatusCode
    cap = mount_cap(pb)
    ca, cb = a.start(), b.start()

    v = ca.CreateVolume(pb.CreateVolumeRequest(
        name="pvc-src", capacity_range=pb.CapacityRange(required_bytes=16 * MiB),
        volume_capabilities=[cap]), timeout=T).volume
    assert v.volume_id == "pvc-src@node-a", v
    s = ca.CreateSnapshot(pb.CreateSnapshotRequest(name="snap-1", source_volume_id=v.volume_id),
                          timeout=T).snapshot
    assert s.snapshot_id == "snap-1@node-a" and s.source_volume_id == v.volume_id, s
    print("ok ids carry the node:", v.volume_id, s.snapshot_id)

    # Restore and clone on the wrong node: at once, naming the node.
    want = pb.TopologyRequirement(requisite=[pb.Topology(segments={KEY: "node-b"})],
                                  preferred=[pb.Topology(segments={KEY: "node-b"})])
    for src, what in ((pb.VolumeContentSource(snapshot=pb.VolumeContentSource.SnapshotSource(
            snapshot_id=s.snapshot_id)), "snapshot snap-1"),
                      (pb.VolumeContentSource(volume=pb.VolumeContentSource.VolumeSource(
                          volume_id=v.volume_id)), "volume pvc-src")):
        msg = expect_code(cb.CreateVolume, pb.CreateVolumeRequest(
            name="pvc-restore", volume_capabilities=[cap], volume_content_source=src,
            accessibility_requirements=want), C.RESOURCE_EXHAUSTED, "restore on node-b")
        assert ("source %s lives on node node-a" % what) in msg, msg
        assert ("nodeSelector %s: node-a" % KEY) in msg and "this is node node-b" in msg, msg
        print("ok cross-node %s refused: %s" % (what, msg))
    assert not os.listdir(os.path.join(b.pool, "volumes")) and not os.listdir(b.state + "/volumes")

    # Other calls with node-a's ids on node-b: NOT_FOUND naming node-a.
    stg = os.path.join(b.kubelet, "staging")
    os.makedirs(stg)
    for name, fn, req in (
            ("NodeStageVolume", cb.NodeStageVolume, pb.NodeStageVolumeRequest(
                volume_id=v.volume_id, staging_target_path=stg, volume_capability=cap)),
            ("DeleteSnapshot", cb.DeleteSnapshot, pb.DeleteSnapshotRequest(
                snapshot_id=s.snapshot_id)),
            ("DeleteVolume", cb.DeleteVolume, pb.DeleteVolumeRequest(volume_id=v.volume_id)),
            ("CreateSnapshot", cb.CreateSnapshot, pb.CreateSnapshotRequest(
                name="snap-x", source_volume_id=v.volume_id))):
        msg = expect_code(fn, req, C.NOT_FOUND, name + " on node-b")
        assert "lives on node node-a" in msg, msg
    assert not cb.ListSnapshots(pb.ListSnapshotsRequest(snapshot_id=s.snapshot_id),
                                timeout=T).entries
    expect_code(cb.CreateVolume, pb.CreateVolumeRequest(
        name="pvc-bad", volume_capabilities=[cap], volume_content_source=pb.VolumeContentSource(
            snapshot=pb.VolumeContentSource.SnapshotSource(snapshot_id="snap-1@a/b"))),
        C.INVALID_ARGUMENT, "bad node in an id")
    print("ok node-a's ids on node-b: NOT_FOUND naming node-a; nothing changed")

    # On node-a: the restore works with the new id and with the plain one.
    for name, sid in (("pvc-r1", s.snapshot_id), ("pvc-r2", "snap-1")):
        r = ca.CreateVolume(pb.CreateVolumeRequest(
            name=name, volume_capabilities=[cap], volume_content_source=pb.VolumeContentSource(
                snapshot=pb.VolumeContentSource.SnapshotSource(snapshot_id=sid))),
            timeout=T).volume
        assert r.content_source.snapshot.snapshot_id == "snap-1@node-a", r
    one = ca.ListSnapshots(pb.ListSnapshotsRequest(snapshot_id=s.snapshot_id), timeout=T)
    assert [e.snapshot.snapshot_id for e in one.entries] == [s.snapshot_id], one
    os.makedirs(os.path.join(a.kubelet, "stg"))
    ca.NodeStageVolume(pb.NodeStageVolumeRequest(
        volume_id="pvc-r2", staging_target_path=os.path.join(a.kubelet, "stg"),
        volume_capability=cap), timeout=T)
    ca.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(
        volume_id="pvc-r2@node-a", staging_target_path=os.path.join(a.kubelet, "stg")),
        timeout=T)
    print("ok restores on node-a, by new and by plain id")

    long = "pvc-" + "x" * 120
    lv = ca.CreateVolume(pb.CreateVolumeRequest(name=long, volume_capabilities=[cap]),
                         timeout=T).volume
    assert lv.volume_id == long, lv
    for vid in ("pvc-r1@node-a", "pvc-r2", long, "pvc-src@node-a"):
        ca.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vid), timeout=T)
    ca.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=s.snapshot_id), timeout=T)
    assert not ca.ListVolumes(pb.ListVolumesRequest(), timeout=T).entries
    assert not ca.ListSnapshots(pb.ListSnapshotsRequest(), timeout=T).entries
    print("ok a 128-byte-long id stays plain; everything deleted by either form")


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
