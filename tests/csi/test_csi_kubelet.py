#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Replays the order of calls kubelet and the sidecars make for one VM disk
(provisioner CreateVolume; kubelet NodeGetInfo, NodeStageVolume,
NodePublishVolume, NodeGetVolumeStats; resizer ControllerExpandVolume then
kubelet NodeExpandVolume; NodeUnpublishVolume, NodeUnstageVolume; provisioner
DeleteVolume), with real mounts under a temporary kubelet root, and checks
that a vhost-user-blk client connects through the published target path
(`qsdctl vhost-info <target>/vhost.sock --json`) and sees the expansion.

usage: test_csi_kubelet.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402
from csilib import mount_cap, is_mount_point  # noqa: E402

MiB = 1 << 20


def vhost_info(qsdctl, sock, extra=()):
    # Kubelet's target paths are longer than a unix socket address allows
    # (108 bytes); connect relative to the target directory, as a VM pod whose
    # mount point is short would connect by its own path.
    r = subprocess.run([qsdctl, "vhost-info", "--json", "--timeout-ms", "5000", *extra,
                        "./" + os.path.basename(sock)], cwd=os.path.dirname(sock),
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise AssertionError("vhost-info %s failed (%d): %s" % (sock, r.returncode, r.stderr))
    return json.loads(r.stdout)


def verify(qsdctl, tgt, size, extra=()):
    """The fast data-path check through the published target: patterns written,
    flushed and read back, write-zeroes, discard, capacity."""
    r = subprocess.run([qsdctl, "verify", "--timeout-ms", "20000", "--size", str(size), *extra,
                        "./vhost.sock"], cwd=tgt, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise AssertionError("qsdctl verify through %s failed (%d): %s%s" % (
            tgt, r.returncode, r.stdout, r.stderr))
    return r.stdout


def main():
    qsdctl = sys.argv[3]
    r = subprocess.run([qsdctl, "vhost-info", "--help"], capture_output=True)
    if r.returncode != 0:
        csilib.skip("qsdctl has no vhost-info")
    env = csilib.Env(sys.argv[1], sys.argv[2])
    try:
        run(env, qsdctl)
    finally:
        if sys.exc_info()[0] is not None:
            print("---- plugin log (tail)\n" + env.log_tail())
        env.cleanup()


def run(env, qsdctl):
    c = env.start(["--log-format", "json"])  # the JSON log is checked at cleanup
    pb = env.pb
    T = csilib.CALL_TIMEOUT
    k = env.kubelet
    vid = "pvc-0b7e5a1c-9a43-4d4e-8f3c-2a9a1e0c7d11"
    stg = os.path.join(k, "plugins/kubernetes.io/csi/test.qsd-csi.dev", "a1b2c3", "globalmount")
    tgt = os.path.join(k, "pods/6f1e7c2a-1111-2222-3333-444455556666/volumes/kubernetes.io~csi",
                       vid, "mount")
    os.makedirs(stg)
    os.makedirs(os.path.dirname(tgt))
    cap = mount_cap(pb, group="107")

    info = c.NodeGetInfo(pb.NodeGetInfoRequest(), timeout=T)
    topo = pb.Topology(segments=dict(info.accessible_topology.segments))
    vol = c.CreateVolume(pb.CreateVolumeRequest(
        name=vid, capacity_range=pb.CapacityRange(required_bytes=64 * MiB),
        volume_capabilities=[cap], parameters={"numQueues": "2"},
        accessibility_requirements=pb.TopologyRequirement(requisite=[topo], preferred=[topo])),
        timeout=T).volume
    print("ok CreateVolume", vol.volume_id, vol.capacity_bytes)

    c.NodeStageVolume(pb.NodeStageVolumeRequest(volume_id=vid, staging_target_path=stg,
                                                volume_capability=cap,
                                                volume_context=dict(vol.volume_context)), timeout=T)
    c.NodePublishVolume(pb.NodePublishVolumeRequest(volume_id=vid, staging_target_path=stg,
                                                    target_path=tgt, volume_capability=cap,
                                                    volume_context=dict(vol.volume_context)),
                        timeout=T)
    assert is_mount_point(tgt)
    d = vhost_info(qsdctl, os.path.join(tgt, "vhost.sock"))
    print("ok vhost-user client through the target path:", d)
    assert d.get("capacity") == 64 * MiB or d.get("capacity_bytes") == 64 * MiB, d
    meta = json.load(open(os.path.join(tgt, "volume.json")))
    assert meta["volume"] == vid and meta["size"] == 64 * MiB and meta["num_queues"] == 2, meta

    verify(qsdctl, tgt, 64 * MiB)
    print("ok qsdctl verify through the target path (64 MiB)")

    s = c.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(volume_id=vid, volume_path=tgt),
                             timeout=T)
    assert s.usage[0].total == 64 * MiB and not s.volume_condition.abnormal, s
    print("ok NodeGetVolumeStats", s.usage[0].used, s.volume_condition.message)

    # A client connected during the expansion is told by QSD (config change).
    waiter = subprocess.Popen([qsdctl, "vhost-info", "--json", "--timeout-ms", "5000",
                               "--wait-config-change-ms", "15000", "./vhost.sock"], cwd=tgt,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    import time
    time.sleep(0.5)
    e = c.ControllerExpandVolume(pb.ControllerExpandVolumeRequest(
        volume_id=vid, capacity_range=pb.CapacityRange(required_bytes=96 * MiB),
        volume_capability=cap), timeout=T)
    assert e.node_expansion_required and e.capacity_bytes == 96 * MiB, e
    ne = c.NodeExpandVolume(pb.NodeExpandVolumeRequest(
        volume_id=vid, volume_path=tgt, staging_target_path=stg,
        capacity_range=pb.CapacityRange(required_bytes=96 * MiB), volume_capability=cap),
        timeout=T)
    assert ne.capacity_bytes == 96 * MiB, ne
    out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 0, err
    d = json.loads(out)
    assert d["capacity"] == 96 * MiB and d["config_changes"] >= 1, d
    print("ok connected client got the config change:", d["capacity"], d["config_changes"])
    d = vhost_info(qsdctl, os.path.join(tgt, "vhost.sock"))
    assert d.get("capacity") == 96 * MiB or d.get("capacity_bytes") == 96 * MiB, d
    print("ok online expansion seen by a vhost-user client:", d)
    verify(qsdctl, tgt, 96 * MiB)
    print("ok qsdctl verify after the expansion (96 MiB, last chunk at the new end)")

    # A read-only publication is connectable too (the launcher marks the disk read-only).
    tgt_ro = os.path.join(k, "pods/ro-pod/volumes/kubernetes.io~csi", vid, "mount")
    os.makedirs(os.path.dirname(tgt_ro))
    c.NodePublishVolume(pb.NodePublishVolumeRequest(volume_id=vid, staging_target_path=stg,
                                                    target_path=tgt_ro, volume_capability=cap,
                                                    readonly=True), timeout=T)
    vhost_info(qsdctl, os.path.join(tgt_ro, "vhost.sock"))
    c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=vid, target_path=tgt_ro),
                          timeout=T)
    print("ok read-only publication connectable")

    c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=vid, target_path=tgt), timeout=T)
    assert not os.path.exists(tgt)

    # ReadOnlyMany / a read-only access mode: the QSD itself exports read-only.
    rov = "pvc-readonly-many"
    romode = pb.VolumeCapability.AccessMode.MULTI_NODE_READER_ONLY
    rocap = mount_cap(pb, romode, group="107")
    c.CreateVolume(pb.CreateVolumeRequest(name=rov, volume_capabilities=[rocap],
                                          capacity_range=pb.CapacityRange(required_bytes=MiB)),
                   timeout=T)
    rstg = os.path.join(k, "ro-staging")
    rtgt = os.path.join(k, "pods/ro-many/mount")
    os.makedirs(rstg)
    os.makedirs(os.path.dirname(rtgt))
    c.NodeStageVolume(pb.NodeStageVolumeRequest(volume_id=rov, staging_target_path=rstg,
                                                volume_capability=rocap), timeout=T)
    c.NodePublishVolume(pb.NodePublishVolumeRequest(volume_id=rov, staging_target_path=rstg,
                                                    target_path=rtgt, volume_capability=rocap,
                                                    readonly=True), timeout=T)
    d = vhost_info(qsdctl, os.path.join(rtgt, "vhost.sock"))
    assert d["read_only"] is True, d
    assert json.load(open(os.path.join(rtgt, "volume.json")))["read_only"] is True
    c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=rov, target_path=rtgt),
                          timeout=T)
    c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id=rov, staging_target_path=rstg),
                        timeout=T)
    c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=rov), timeout=T)
    print("ok read-only access mode: the vhost-user client sees a read-only disk")
    c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id=vid, staging_target_path=stg),
                        timeout=T)
    assert not os.path.exists(os.path.join(env.run, "exports", vid))
    c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vid), timeout=T)
    assert not os.listdir(os.path.join(env.pool, "volumes"))
    assert env.stop() == 0
    print("ok NodeUnpublish, NodeUnstage, DeleteVolume")


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
