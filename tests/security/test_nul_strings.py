#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 9, attacks D: NUL bytes in every string a caller sends.

proto3 strings may hold "\\0" (python protobuf serializes them); a C string
conversion would silently truncate at it, so `DeleteVolume("pvc-victim\\0/../x")`
would delete pvc-victim.  Every field is sent with an embedded NUL: ids,
names, paths, StorageClass parameters (key and value), volume_context,
secrets, snapshot ids and names.  Each call must fail with INVALID_ARGUMENT
whose message names the field, and nothing may happen to the volume, the
snapshot or the publication the truncated string would name.

usage: test_nul_strings.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seclib  # noqa: E402
from seclib import MiB, mount_cap  # noqa: E402

VICTIM = "pvc-victim"
LIVE = "pvc-live"
SNAP = "snap-victim"


def names_field(msg, field):
    m = msg.lower()
    alts = set()
    for f in (field if isinstance(field, tuple) else (field,)):
        alts |= {f, f.replace("_", " ")}
        if f.endswith("s"):
            alts |= {a[:-1] for a in list(alts)}
    return any(a in m for a in alts)


def run(s):
    pb = s.pb
    cap = mount_cap(pb, group="107")
    s.create(VICTIM, 16 * MiB)
    s.create(LIVE, 16 * MiB)
    s.ok("CreateSnapshot", pb.CreateSnapshotRequest(name=SNAP, source_volume_id=VICTIM))
    stg = s.stage(LIVE)
    tgt = s.publish(LIVE, "pod-live")
    k = s.kubelet
    evil_tgt = os.path.join(k, "pods/pod-x/volumes/kubernetes.io~csi/x/mount\0/../../../../decoy")
    evil_stg = os.path.join(k, "plugins/x/globalmount\0/../../../decoy")
    ctx_ok = {"csi.storage.k8s.io/pod.uid": "uid-1", "csi.storage.k8s.io/pod.namespace": "ns",
              "csi.storage.k8s.io/pod.name": "p", "csi.storage.k8s.io/ephemeral": "false"}

    def ctx(**kw):
        d = dict(ctx_ok)
        d.update(kw)
        return d
    bad_ctx_key = dict(ctx_ok)
    bad_ctx_key["csi.storage.k8s.io/pod.uid\0x"] = bad_ctx_key.pop("csi.storage.k8s.io/pod.uid")
    other_tgt = s.target("pod-y", LIVE)

    cases = [
        # (what, method, request, field)
        ("DeleteVolume volume_id=pvc-victim\\0/../x", "DeleteVolume",
         pb.DeleteVolumeRequest(volume_id=VICTIM + "\0/../x"), "volume_id"),
        ("CreateVolume name=pvc-new\\0evil", "CreateVolume",
         pb.CreateVolumeRequest(name="pvc-new\0evil", volume_capabilities=[cap],
                                capacity_range=pb.CapacityRange(required_bytes=MiB)), "name"),
        ("CreateVolume parameters key format\\0x", "CreateVolume",
         pb.CreateVolumeRequest(name="pvc-p1", volume_capabilities=[cap],
                                capacity_range=pb.CapacityRange(required_bytes=MiB),
                                parameters={"format\0x": "raw"}), "parameters"),
        ("CreateVolume parameters value format=raw\\0x", "CreateVolume",
         pb.CreateVolumeRequest(name="pvc-p2", volume_capabilities=[cap],
                                capacity_range=pb.CapacityRange(required_bytes=MiB),
                                parameters={"format": "raw\0x"}), "parameters"),
        ("CreateVolume parameters csi.storage.k8s.io/pvc/name=a\\0b", "CreateVolume",
         pb.CreateVolumeRequest(name="pvc-p3", volume_capabilities=[cap],
                                capacity_range=pb.CapacityRange(required_bytes=MiB),
                                parameters={"csi.storage.k8s.io/pvc/name": "a\0b"}),
         "parameters"),
        ("CreateVolume secrets value with \\0", "CreateVolume",
         pb.CreateVolumeRequest(name="pvc-p4", volume_capabilities=[cap],
                                capacity_range=pb.CapacityRange(required_bytes=MiB),
                                secrets={"token": "a\0b"}), "secrets"),
        ("CreateVolume source snapshot_id=snap-victim\\0x", "CreateVolume",
         pb.CreateVolumeRequest(name="pvc-p5", volume_capabilities=[cap],
                                capacity_range=pb.CapacityRange(required_bytes=MiB),
                                volume_content_source=pb.VolumeContentSource(
                                    snapshot=pb.VolumeContentSource.SnapshotSource(
                                        snapshot_id=SNAP + "\0x"))), "snapshot_id"),
        ("CreateVolume source volume_id=pvc-victim\\0x", "CreateVolume",
         pb.CreateVolumeRequest(name="pvc-p6", volume_capabilities=[cap],
                                capacity_range=pb.CapacityRange(required_bytes=MiB),
                                volume_content_source=pb.VolumeContentSource(
                                    volume=pb.VolumeContentSource.VolumeSource(
                                        volume_id=VICTIM + "\0x"))), "volume_id"),
        ("GetCapacity parameters key format\\0x", "GetCapacity",
         pb.GetCapacityRequest(volume_capabilities=[cap], parameters={"format\0x": "raw"}),
         "parameters"),
        ("ValidateVolumeCapabilities volume_id=pvc-victim\\0x", "ValidateVolumeCapabilities",
         pb.ValidateVolumeCapabilitiesRequest(volume_id=VICTIM + "\0x",
                                              volume_capabilities=[cap]), "volume_id"),
        ("ControllerExpandVolume volume_id=pvc-victim\\0x", "ControllerExpandVolume",
         pb.ControllerExpandVolumeRequest(volume_id=VICTIM + "\0x",
                                          capacity_range=pb.CapacityRange(
                                              required_bytes=32 * MiB)), "volume_id"),
        ("CreateSnapshot name=snap-new\\0x", "CreateSnapshot",
         pb.CreateSnapshotRequest(name="snap-new\0x", source_volume_id=VICTIM), "name"),
        ("CreateSnapshot source_volume_id=pvc-victim\\0x", "CreateSnapshot",
         pb.CreateSnapshotRequest(name="snap-new2", source_volume_id=VICTIM + "\0x"),
         "source_volume_id"),
        ("DeleteSnapshot snapshot_id=snap-victim\\0/../x", "DeleteSnapshot",
         pb.DeleteSnapshotRequest(snapshot_id=SNAP + "\0/../x"), "snapshot_id"),
        ("NodeStageVolume volume_id=pvc-live\\0x", "NodeStageVolume",
         pb.NodeStageVolumeRequest(volume_id=LIVE + "\0x", staging_target_path=stg,
                                   volume_capability=cap), "volume_id"),
        ("NodeStageVolume staging_target_path with \\0/../", "NodeStageVolume",
         pb.NodeStageVolumeRequest(volume_id=VICTIM, staging_target_path=evil_stg,
                                   volume_capability=cap), "staging_target_path"),
        ("NodeStageVolume volume_context value with \\0", "NodeStageVolume",
         pb.NodeStageVolumeRequest(volume_id=LIVE, staging_target_path=stg,
                                   volume_capability=cap,
                                   volume_context={"csi.storage.k8s.io/pvc/name": "a\0b"}),
         "volume_context"),
        ("NodeStageVolume secrets key with \\0", "NodeStageVolume",
         pb.NodeStageVolumeRequest(volume_id=LIVE, staging_target_path=stg,
                                   volume_capability=cap, secrets={"k\0x": "v"}), "secrets"),
        ("NodePublishVolume target_path with \\0/../", "NodePublishVolume",
         s.publish_req(LIVE, evil_tgt, ro=True), "target_path"),
        ("NodePublishVolume staging_target_path with \\0", "NodePublishVolume",
         s.publish_req(LIVE, other_tgt, ro=True, staging=stg + "\0/../x"),
         "staging_target_path"),
        ("NodePublishVolume volume_id=pvc-live\\0x", "NodePublishVolume",
         pb.NodePublishVolumeRequest(volume_id=LIVE + "\0x", staging_target_path=stg,
                                     target_path=other_tgt, volume_capability=cap,
                                     readonly=True), "volume_id"),
        ("NodePublishVolume volume_context pod.uid=uid\\0x", "NodePublishVolume",
         s.publish_req(LIVE, other_tgt, ro=True,
                       ctx=ctx(**{"csi.storage.k8s.io/pod.uid": "uid-1\0x"})),
         "volume_context"),
        ("NodePublishVolume volume_context key with \\0", "NodePublishVolume",
         s.publish_req(LIVE, other_tgt, ro=True, ctx=bad_ctx_key), "volume_context"),
        ("NodePublishVolume secrets value with \\0", "NodePublishVolume",
         pb.NodePublishVolumeRequest(volume_id=LIVE, staging_target_path=stg,
                                     target_path=other_tgt, volume_capability=cap,
                                     readonly=True, secrets={"k": "v\0x"}), "secrets"),
        ("NodePublishVolume ephemeral bridge=true\\0x", "NodePublishVolume",
         pb.NodePublishVolumeRequest(
             volume_id="csi-eph-1", target_path=s.target("pod-z", "inline"),
             volume_capability=cap,
             volume_context=ctx(**{"bridge": "true\0x", "csi.storage.k8s.io/ephemeral": "true"})),
         "volume_context"),
        ("NodePublishVolume ephemeral hotplugInto=vm\\0x", "NodePublishVolume",
         pb.NodePublishVolumeRequest(
             volume_id="csi-eph-2", target_path=s.target("pod-z", "inline2"),
             volume_capability=cap,
             volume_context=ctx(**{"hotplugInto": "vm\0x",
                                   "csi.storage.k8s.io/ephemeral": "true"})),
         "volume_context"),
        ("NodeGetVolumeStats volume_path=<target>\\0x", "NodeGetVolumeStats",
         pb.NodeGetVolumeStatsRequest(volume_id=LIVE, volume_path=tgt + "\0x"), "volume_path"),
        ("NodeExpandVolume volume_path=<target>\\0x", "NodeExpandVolume",
         pb.NodeExpandVolumeRequest(volume_id=LIVE, volume_path=tgt + "\0x",
                                    capacity_range=pb.CapacityRange(required_bytes=16 * MiB)),
         "volume_path"),
        ("NodeUnpublishVolume target_path=<target>\\0/x", "NodeUnpublishVolume",
         pb.NodeUnpublishVolumeRequest(volume_id=LIVE, target_path=tgt + "\0/x"), "target_path"),
        ("NodeUnpublishVolume volume_id=pvc-live\\0x", "NodeUnpublishVolume",
         pb.NodeUnpublishVolumeRequest(volume_id=LIVE + "\0x", target_path=tgt), "volume_id"),
        ("NodeUnstageVolume volume_id=pvc-live\\0x", "NodeUnstageVolume",
         pb.NodeUnstageVolumeRequest(volume_id=LIVE + "\0x", staging_target_path=stg),
         "volume_id"),
        ("NodeUnstageVolume staging_target_path with \\0", "NodeUnstageVolume",
         pb.NodeUnstageVolumeRequest(volume_id=LIVE, staging_target_path=stg + "\0/x"),
         "staging_target_path"),
    ]

    def mcap(group="107", fs_type="", flags=()):
        return pb.VolumeCapability(
            mount=pb.VolumeCapability.MountVolume(fs_type=fs_type, volume_mount_group=group,
                                                  mount_flags=list(flags)),
            access_mode=pb.VolumeCapability.AccessMode(
                mode=pb.VolumeCapability.AccessMode.SINGLE_NODE_WRITER))
    topo_key = "topology.%s/node" % seclib.DRIVER
    cases += [
        ("NodeStageVolume volume_mount_group=107\\0x", "NodeStageVolume",
         pb.NodeStageVolumeRequest(volume_id=LIVE, staging_target_path=stg,
                                   volume_capability=mcap("107\0x")), "volume_mount_group"),
        ("NodePublishVolume fs_type=ext4\\0x", "NodePublishVolume",
         pb.NodePublishVolumeRequest(volume_id=LIVE, staging_target_path=stg,
                                     target_path=other_tgt, readonly=True,
                                     volume_capability=mcap(fs_type="ext4\0x")), "fs_type"),
        ("NodePublishVolume mount_flags=[ro\\0x]", "NodePublishVolume",
         pb.NodePublishVolumeRequest(volume_id=LIVE, staging_target_path=stg,
                                     target_path=other_tgt, readonly=True,
                                     volume_capability=mcap(flags=["ro\0x"])), "mount_flags"),
        ("NodePublishVolume volume_mount_group=107\\0x", "NodePublishVolume",
         pb.NodePublishVolumeRequest(volume_id=LIVE, staging_target_path=stg,
                                     target_path=other_tgt, readonly=True,
                                     volume_capability=mcap("107\0x")), "volume_mount_group"),
        ("NodeStageVolume publish_context value with \\0", "NodeStageVolume",
         pb.NodeStageVolumeRequest(volume_id=LIVE, staging_target_path=stg, volume_capability=cap,
                                   publish_context={"k": "v\0x"}), "publish_context"),
        ("CreateVolume volume_mount_group=107\\0x", "CreateVolume",
         pb.CreateVolumeRequest(name="pvc-p7", volume_capabilities=[mcap("107\0x")],
                                capacity_range=pb.CapacityRange(required_bytes=MiB)),
         "volume_mount_group"),
        ("CreateVolume topology segment value with \\0", "CreateVolume",
         pb.CreateVolumeRequest(name="pvc-p8", volume_capabilities=[cap],
                                capacity_range=pb.CapacityRange(required_bytes=MiB),
                                accessibility_requirements=pb.TopologyRequirement(
                                    requisite=[pb.Topology(segments={topo_key: "node-1\0x"})])),
         ("segments", "accessibility_requirements")),
        ("GetCapacity accessible_topology key with \\0", "GetCapacity",
         pb.GetCapacityRequest(volume_capabilities=[cap], accessible_topology=pb.Topology(
             segments={topo_key + "\0x": "node-1"})), ("segments", "accessible_topology")),
        ("ValidateVolumeCapabilities volume_context with \\0", "ValidateVolumeCapabilities",
         pb.ValidateVolumeCapabilitiesRequest(volume_id=VICTIM, volume_capabilities=[cap],
                                              volume_context={"a": "b\0c"}), "volume_context"),
        ("ListVolumes starting_token with \\0", "ListVolumes",
         pb.ListVolumesRequest(starting_token="v1:pvc-live\0x"), "starting_token"),
        ("ListSnapshots snapshot_id=snap-victim\\0x", "ListSnapshots",
         pb.ListSnapshotsRequest(snapshot_id=SNAP + "\0x"), "snapshot_id"),
        ("ListSnapshots source_volume_id=pvc-victim\\0x", "ListSnapshots",
         pb.ListSnapshotsRequest(source_volume_id=VICTIM + "\0x"), "source_volume_id"),
        ("ControllerExpandVolume secrets with \\0", "ControllerExpandVolume",
         pb.ControllerExpandVolumeRequest(volume_id=VICTIM, secrets={"k": "v\0x"},
                                          capacity_range=pb.CapacityRange(
                                              required_bytes=16 * MiB)), "secrets"),
        ("DeleteVolume secrets with \\0 (volume pvc-victim)", "DeleteVolume",
         pb.DeleteVolumeRequest(volume_id=VICTIM, secrets={"k\0x": "v"}), "secrets"),
        ("DeleteSnapshot secrets with \\0 (snapshot snap-victim)", "DeleteSnapshot",
         pb.DeleteSnapshotRequest(snapshot_id=SNAP, secrets={"k": "v\0x"}), "secrets"),
        ("NodeGetVolumeStats staging_target_path with \\0", "NodeGetVolumeStats",
         pb.NodeGetVolumeStatsRequest(volume_id=LIVE, volume_path=tgt,
                                      staging_target_path=stg + "\0x"), "staging_target_path"),
        ("NodeExpandVolume staging_target_path with \\0", "NodeExpandVolume",
         pb.NodeExpandVolumeRequest(volume_id=LIVE, volume_path=tgt,
                                    staging_target_path=stg + "\0x",
                                    capacity_range=pb.CapacityRange(required_bytes=16 * MiB)),
         "staging_target_path"),
    ]

    for what, method, req, field in cases:
        code, msg, _ = s.call(what, method, req)
        if s.check(code == "INVALID_ARGUMENT", "%s: expected INVALID_ARGUMENT, got %s" % (
                what, seclib.fmt(code, msg))):
            s.check(names_field(msg, field), "%s: message does not name %s: %r" % (
                what, field, msg))
        s.after(what)
        # Whatever was answered, nothing of the truncated name may have changed.
        vols = {seclib.csilib.local_id(e.volume.volume_id) for e in s.c.ListVolumes(pb.ListVolumesRequest(),
                                                            timeout=seclib.BOUND).entries}
        if not s.check(VICTIM in vols and LIVE in vols,
                       "%s: volumes now %s (pvc-victim or pvc-live gone)" % (what, sorted(vols))):
            if VICTIM not in vols:
                s.create(VICTIM, 16 * MiB)
        extra = vols - {VICTIM, LIVE}
        if not s.check(not extra, "%s: a volume was created: %s" % (what, sorted(extra))):
            for v in extra:
                s.c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=v), timeout=seclib.BOUND)
        snaps = {seclib.csilib.local_id(e.snapshot.snapshot_id) for e in
                 s.c.ListSnapshots(pb.ListSnapshotsRequest(), timeout=seclib.BOUND).entries}
        if not s.check(snaps == {SNAP}, "%s: snapshots now %s" % (what, sorted(snaps))):
            for x in snaps - {SNAP}:
                s.c.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=x), timeout=seclib.BOUND)
            if SNAP not in snaps:
                s.ok("CreateSnapshot", pb.CreateSnapshotRequest(name=SNAP,
                                                                source_volume_id=VICTIM))
        if not s.check(seclib.mounts_at(tgt), "%s: %s no longer mounted" % (what, tgt)):
            s.publish(LIVE, "pod-live")
        s.works(what, LIVE, tgt)
        # What the truncated strings name: must not be mounted or staged; undone
        # at once if it was, so that each case is judged on its own.
        for vid, path in ((LIVE, other_tgt), (LIVE, evil_tgt.split("\0")[0]),
                          ("csi-eph-1", s.target("pod-z", "inline")),
                          ("csi-eph-2", s.target("pod-z", "inline2"))):
            if not s.check(not seclib.mounts_at(path), "%s: %s got mounted" % (what, path)):
                s.call("(undo)", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
                    volume_id=vid, target_path=path), quiet=True)
        code, msg, _ = s.call("(undo)", "NodeUnstageVolume", pb.NodeUnstageVolumeRequest(
            volume_id=VICTIM, staging_target_path=evil_stg.split("\0")[0]), quiet=True)
    s.works("D: after all NUL attacks", LIVE, tgt)
    # teardown (best effort: a failure above may have left more behind)
    s.call("teardown", "NodeUnpublishVolume",
           pb.NodeUnpublishVolumeRequest(volume_id=LIVE, target_path=tgt), quiet=True)
    s.call("teardown", "NodeUnstageVolume",
           pb.NodeUnstageVolumeRequest(volume_id=LIVE, staging_target_path=stg), quiet=True)
    s.call("teardown", "DeleteSnapshot", pb.DeleteSnapshotRequest(snapshot_id=SNAP), quiet=True)
    for v in (VICTIM, LIVE):
        s.call("teardown", "DeleteVolume", pb.DeleteVolumeRequest(volume_id=v), quiet=True)


if __name__ == "__main__":
    sys.exit(seclib.run_test(run, "qsd-sec-nul-"))
