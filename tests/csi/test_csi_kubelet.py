#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Replays the order of calls kubelet and the sidecars make for one VM disk
(provisioner CreateVolume; kubelet NodeGetInfo, NodeStageVolume,
NodePublishVolume, NodeGetVolumeStats; resizer ControllerExpandVolume then
kubelet NodeExpandVolume; NodeUnpublishVolume, NodeUnstageVolume; provisioner
DeleteVolume), with real mounts under a temporary kubelet root, and checks
that a vhost-user-blk client connects through the published target path
(`qsdctl vhost-info <target>/vhost.sock --json`) and sees the expansion.
Then the same order for an ext4 filesystem and a block device of ordinary
pods (run_pods): data written through the target, grown, staged again.

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
        csilib.share_kubelet_root(env)
        env.start(["--log-format", "json"])
        run_pods(env)
        env.stop()
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
    # Connected and past the handshake before the expansion (bounded: a
    # client that connects after it reads the new size and waits for a
    # change that never comes; a fixed pause may end first when loaded).
    import select
    import time
    said, deadline = "", time.monotonic() + 30
    while "waiting for a config change" not in said:
        left = deadline - time.monotonic()
        assert left > 0 and waiter.poll() is None, "the waiting client did not connect: %s" % said
        if select.select([waiter.stderr], [], [], left)[0]:
            said += waiter.stderr.readline()
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


def cap_sys_resource():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> 24 & 1)
    return False


def run_pods(env):
    """The same order for the capabilities of ordinary pods
    (docs/pod-volumes.md): an ext4 filesystem (fsGroup 107) and a block
    device, each created, staged, published, written through the target,
    measured, grown, unpublished, unstaged, staged and published again with
    the data there, and deleted; nothing is left."""
    import stat
    c, pb, T, k = env.client, env.pb, csilib.CALL_TIMEOUT, env.kubelet
    info = c.NodeGetInfo(pb.NodeGetInfoRequest(), timeout=T)
    topo = pb.Topology(segments=dict(info.accessible_topology.segments))
    for kind in ("ext4", "block"):
        vid = "pvc-7d0c3f2e-0000-4000-8000-00000000%04d" % (1 if kind == "ext4" else 2)
        if kind == "ext4":
            cap = mount_cap(pb, group="107", fs_type="ext4")
            stg = os.path.join(k, "plugins/kubernetes.io/csi/test.qsd-csi.dev", vid[-6:],
                               "globalmount")
            tgt = os.path.join(k, "pods/0a0b0c0d-%s/volumes/kubernetes.io~csi" % kind, vid, "mount")
            os.makedirs(os.path.dirname(tgt))
        else:
            cap = pb.VolumeCapability(block=pb.VolumeCapability.BlockVolume(),
                                      access_mode=pb.VolumeCapability.AccessMode(
                                          mode=pb.VolumeCapability.AccessMode.SINGLE_NODE_WRITER))
            stg = os.path.join(k, "plugins/kubernetes.io/csi/volumeDevices/staging", vid)
            tgt = os.path.join(k, "plugins/kubernetes.io/csi/volumeDevices/publish", vid,
                               "0a0b0c0d-%s" % kind)
            os.makedirs(os.path.dirname(tgt))
        os.makedirs(stg)
        vol = c.CreateVolume(pb.CreateVolumeRequest(
            name=vid, capacity_range=pb.CapacityRange(required_bytes=64 * MiB),
            volume_capabilities=[cap],
            accessibility_requirements=pb.TopologyRequirement(requisite=[topo], preferred=[topo])),
            timeout=T).volume
        ctx = dict(vol.volume_context)

        def stage_publish():
            c.NodeStageVolume(pb.NodeStageVolumeRequest(
                volume_id=vid, staging_target_path=stg, volume_capability=cap,
                volume_context=ctx), timeout=120)
            c.NodePublishVolume(pb.NodePublishVolumeRequest(
                volume_id=vid, staging_target_path=stg, target_path=tgt, volume_capability=cap,
                volume_context=ctx), timeout=T)

        def unpublish_unstage():
            c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=vid, target_path=tgt),
                                  timeout=T)
            assert not os.path.exists(tgt), tgt
            c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id=vid,
                                                            staging_target_path=stg), timeout=120)

        stage_publish()
        pattern = os.urandom(4096)
        if kind == "ext4":
            st = os.stat(tgt)
            assert st.st_gid == 107 and st.st_mode & 0o2000, oct(st.st_mode)
            with open(os.path.join(tgt, "data"), "wb") as f:
                f.write(pattern)
                f.flush()
                os.fsync(f.fileno())
        else:
            assert stat.S_ISBLK(os.stat(tgt).st_mode), oct(os.stat(tgt).st_mode)
            fd = os.open(tgt, os.O_RDWR)
            os.pwrite(fd, pattern, 8 * MiB)
            os.fsync(fd)
            os.close(fd)
        s = c.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(volume_id=vid, volume_path=tgt),
                                 timeout=T)
        assert s.usage and not s.volume_condition.abnormal, s
        if kind == "block":
            assert s.usage[0].total == 64 * MiB, s
        else:
            sv = os.statvfs(tgt)
            assert s.usage[0].total == sv.f_blocks * sv.f_frsize, s
        print("ok %s: staged, published, written through %s, stats %d bytes" % (
            kind, tgt, s.usage[0].total))

        e = c.ControllerExpandVolume(pb.ControllerExpandVolumeRequest(
            volume_id=vid, capacity_range=pb.CapacityRange(required_bytes=128 * MiB),
            volume_capability=cap), timeout=T)
        assert e.node_expansion_required and e.capacity_bytes == 128 * MiB, e
        req = pb.NodeExpandVolumeRequest(
            volume_id=vid, volume_path=tgt, staging_target_path=stg, volume_capability=cap,
            capacity_range=pb.CapacityRange(required_bytes=128 * MiB))
        if kind == "block" or cap_sys_resource():
            ne = c.NodeExpandVolume(req, timeout=120)
            assert ne.capacity_bytes == 128 * MiB, ne
            grown = "online"
        else:
            # Online ext4 growth needs CAP_SYS_RESOURCE; kubelet retries,
            # the next stage grows it offline (checked below).
            d = csilib.expect_code(c.NodeExpandVolume, req, csilib.grpc.StatusCode.INTERNAL,
                                   "NodeExpandVolume of ext4 without CAP_SYS_RESOURCE")
            assert "CAP_SYS_RESOURCE" in d, d
            grown = "at the next stage"
        unpublish_unstage()
        stage_publish()
        if kind == "ext4":
            assert open(os.path.join(tgt, "data"), "rb").read() == pattern
            sv = os.statvfs(tgt)
            assert sv.f_blocks * sv.f_frsize > 100 * MiB, sv
            if grown != "online":
                ne = c.NodeExpandVolume(req, timeout=120)  # kubelet's retry: nothing left to do
                assert ne.capacity_bytes == 128 * MiB, ne
        else:
            fd = os.open(tgt, os.O_RDONLY)
            assert os.lseek(fd, 0, os.SEEK_END) == 128 * MiB
            assert os.pread(fd, 4096, 8 * MiB) == pattern
            os.close(fd)
        unpublish_unstage()
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vid), timeout=T)
        fuse = os.path.join(env.run, "fuse", vid)
        assert not os.path.exists(fuse) and not is_mount_point(stg), (fuse, stg)
        loops = subprocess.run(["losetup", "-n", "-O", "NAME", "-j", fuse], capture_output=True,
                               text=True, timeout=30).stdout.split()
        assert not loops, loops
        print("ok %s: grown to 128 MiB (%s), staged again with its data, unstaged, deleted: "
              "nothing left" % (kind, grown))


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
