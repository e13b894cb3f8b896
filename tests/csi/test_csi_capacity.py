#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The capacity policy on a small pool: a 96 MiB ext4 filesystem on a loop
device holds the plugin's state and pool.  GetCapacity reports the reserve
(--capacity-reserve) and the overcommit limit (--overcommit-ratio) exactly;
CreateVolume, ControllerExpandVolume, NodeExpandVolume and CreateSnapshot
that would break them answer RESOURCE_EXHAUSTED naming the numbers.  Then
the filesystem is filled: qemu-img running out of space in a worker
(CreateVolume, CreateSnapshot) and a record write (NodeStageVolume) answer
RESOURCE_EXHAUSTED, and a vhost-user client writing to a thin volume gets
the virtio-blk status IOERR (QSD's export has no werror policy) while the
QSD keeps running; once space is freed the same writes succeed.

usage: test_csi_capacity.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402
from csilib import mount_cap, expect_code  # noqa: E402

MiB = 1 << 20
T = 60
RESERVE = 16 * MiB


def make_small_fs(root):
    """A 96 MiB ext4 (no root reserve) loop-mounted at root/small; env.cleanup
    unmounts it (umount -l; the loop device is freed with the mount)."""
    for tool in ("mkfs.ext4", "mount", "losetup"):
        if not shutil.which(tool):
            csilib.skip(tool + " missing")
    img = os.path.join(root, "small.img")
    mnt = os.path.join(root, "small")
    os.mkdir(mnt)
    with open(img, "wb") as f:
        f.truncate(96 * MiB)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", img], check=True, timeout=60)
    r = subprocess.run(["mount", "-o", "loop", img, mnt], capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        csilib.skip("cannot loop-mount an ext4 image: " + r.stderr.strip())
    return mnt


def figures(pool, ratio_x100):
    st = os.statvfs(pool)
    total = st.f_blocks * st.f_frsize
    limit = (total - RESERVE) * ratio_x100 // 100
    return total, st.f_bavail * st.f_frsize, limit


def fill(mnt, leave):
    """Fill the filesystem so that about `leave` bytes stay free."""
    path = os.path.join(mnt, "filler")
    st = os.statvfs(mnt)
    have = os.path.getsize(path) if os.path.exists(path) else 0
    size = have + st.f_bavail * st.f_frsize - leave
    subprocess.run(["fallocate", "-l", str(max(size, 0)), path], check=False, timeout=30)
    # fallocate refuses to leave nothing: top up block by block
    if leave == 0:
        with open(path, "ab") as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError:
                pass
    return path


def main():
    plugin, proto, qsdctl = sys.argv[1], sys.argv[2], sys.argv[3]
    env = csilib.Env(plugin, proto, prefix="qsd-csi-cap-")
    try:
        mnt = make_small_fs(env.root)
        env.state = os.path.join(mnt, "state")
        env.pool = os.path.join(mnt, "pool")
        os.mkdir(env.state)
        os.mkdir(env.pool)
        run(env, mnt, qsdctl)
    finally:
        env.cleanup()


def run(env, mnt, qsdctl):
    pb = env.pb
    C = csilib.grpc.StatusCode
    cap = mount_cap(pb)
    c = env.start(["--capacity-reserve", "16M", "--overcommit-ratio", "2"])
    total, free, limit = figures(env.pool, 200)

    # GetCapacity: thin volumes are bounded by the overcommit limit, and
    # CreateVolume accepts up to maximum_volume_size; preallocated ones by
    # the free space less the reserve.
    g = c.GetCapacity(pb.GetCapacityRequest(volume_capabilities=[cap]), timeout=T)
    assert g.available_capacity == limit, (g, limit)
    assert g.maximum_volume_size.value == limit - limit % 512, (g, limit)
    gp = c.GetCapacity(pb.GetCapacityRequest(parameters={"preallocation": "full"}), timeout=T)
    assert abs(gp.available_capacity - (free - RESERVE)) < 2 * MiB, (gp, free)
    print("ok GetCapacity thin=%d preallocated=%d (filesystem %d)" % (
        g.available_capacity, gp.available_capacity, total))

    half = (limit // 2) & ~(MiB - 1)
    msg = expect_code(c.CreateVolume, pb.CreateVolumeRequest(
        name="too-big", capacity_range=pb.CapacityRange(required_bytes=limit + MiB),
        volume_capabilities=[cap]), C.RESOURCE_EXHAUSTED, "thin volume above the limit")
    assert "overcommit limit of %d bytes" % limit in msg and "--overcommit-ratio 2.00" in msg, msg
    c.CreateVolume(pb.CreateVolumeRequest(
        name="v1", capacity_range=pb.CapacityRange(required_bytes=half),
        volume_capabilities=[cap]), timeout=T)
    g = c.GetCapacity(pb.GetCapacityRequest(), timeout=T)
    assert g.available_capacity == limit - half, (g, limit, half)
    msg = expect_code(c.CreateVolume, pb.CreateVolumeRequest(
        name="v2", capacity_range=pb.CapacityRange(required_bytes=limit - half + MiB),
        volume_capabilities=[cap]), C.RESOURCE_EXHAUSTED, "second volume above the limit")
    assert "now %d" % half in msg, msg
    msg = expect_code(c.CreateVolume, pb.CreateVolumeRequest(
        name="full", capacity_range=pb.CapacityRange(required_bytes=free - RESERVE + 4 * MiB),
        parameters={"preallocation": "full", "format": "raw"}, volume_capabilities=[cap]),
        C.RESOURCE_EXHAUSTED, "preallocated volume into the reserve")
    assert "reserve of %d bytes" % RESERVE in msg and "needs" in msg, msg
    msg = expect_code(c.ControllerExpandVolume, pb.ControllerExpandVolumeRequest(
        volume_id="v1", capacity_range=pb.CapacityRange(required_bytes=limit + MiB)),
        C.RESOURCE_EXHAUSTED, "ControllerExpandVolume above the limit")
    assert "expansion of volume v1" in msg and "overcommit" in msg, msg
    assert not os.path.exists(os.path.join(env.pool, "volumes", "too-big.qcow2"))
    print("ok overcommit and reserve refusals:", msg)

    stg, tgt = os.path.join(env.kubelet, "staging", "v1"), os.path.join(env.kubelet, "pods", "m")
    os.makedirs(stg)
    c.NodeStageVolume(pb.NodeStageVolumeRequest(volume_id="v1", staging_target_path=stg,
                                                volume_capability=cap), timeout=T)
    os.makedirs(os.path.dirname(tgt))
    c.NodePublishVolume(pb.NodePublishVolumeRequest(
        volume_id="v1", staging_target_path=stg, target_path=tgt, volume_capability=cap),
        timeout=T)
    msg = expect_code(c.NodeExpandVolume, pb.NodeExpandVolumeRequest(
        volume_id="v1", volume_path=tgt, capacity_range=pb.CapacityRange(
            required_bytes=limit + MiB)), C.RESOURCE_EXHAUSTED, "NodeExpandVolume above")
    assert "overcommit" in msg, msg
    print("ok NodeExpandVolume refused")

    # Below the reserve: nothing new, not even a thin snapshot.
    filler = fill(mnt, RESERVE // 2)
    msg = expect_code(c.CreateSnapshot, pb.CreateSnapshotRequest(
        name="s-reserve", source_volume_id="v1"), C.RESOURCE_EXHAUSTED, "snapshot in reserve")
    assert "not more than its reserve of %d bytes" % RESERVE in msg, msg
    g = c.GetCapacity(pb.GetCapacityRequest(), timeout=T)
    assert g.available_capacity == 0 and g.maximum_volume_size.value == 0, g
    print("ok below the reserve:", msg)

    # Out of space where the policy cannot see it coming (reserve 0 now):
    # qemu-img in a worker, a record write.
    env.stop()
    c = env.start(["--capacity-reserve", "0"])
    c.CreateVolume(pb.CreateVolumeRequest(
        name="v4", capacity_range=pb.CapacityRange(required_bytes=8 * MiB),
        volume_capabilities=[cap]), timeout=T)
    fill(mnt, 32 * 1024)
    msg = expect_code(c.CreateVolume, pb.CreateVolumeRequest(
        name="v3", capacity_range=pb.CapacityRange(required_bytes=64 * MiB),
        volume_capabilities=[cap]), C.RESOURCE_EXHAUSTED, "qemu-img create out of space")
    assert "No space left on device" in msg, msg
    print("ok CreateVolume, qemu-img out of space:", msg)
    msg = expect_code(c.CreateSnapshot, pb.CreateSnapshotRequest(
        name="s1", source_volume_id="v1"), C.RESOURCE_EXHAUSTED, "snapshot out of space")
    assert "No space left on device" in msg, msg
    print("ok CreateSnapshot out of space:", msg)

    fill(mnt, 0)
    stg4 = os.path.join(env.kubelet, "staging", "v4")
    os.makedirs(stg4)
    msg = expect_code(c.NodeStageVolume, pb.NodeStageVolumeRequest(
        volume_id="v4", staging_target_path=stg4, volume_capability=cap),
        C.RESOURCE_EXHAUSTED, "record write out of space")
    assert "cannot write the volume record" in msg, msg
    print("ok record write out of space:", msg)

    # The guest's view: a write the thin image cannot grow for fails with
    # the virtio-blk status IOERR; QSD keeps serving.
    pid = env.qsd_pids()["v1"]
    r = subprocess.run([qsdctl, "verify", "--write", "--timeout-ms", "20000", "--chunks", "16",
                        "--chunk-size", str(MiB), "./vhost.sock"], cwd=tgt,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "status ioerr" in r.stderr, (r.returncode, r.stderr)
    assert env.qsd_pids()["v1"] == pid and os.path.exists("/proc/%d" % pid)
    print("ok guest write on a full pool: %s" % r.stderr.strip().splitlines()[-1])

    # Space back: the same client writes and reads everything again.
    os.unlink(filler)
    again = subprocess.run(
        [qsdctl, "verify", "--timeout-ms", "20000", "--chunks", "16", "--chunk-size", str(MiB),
         "./vhost.sock"], cwd=tgt, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id="v1", target_path=tgt),
                          timeout=T)
    c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id="v1", staging_target_path=stg),
                        timeout=T)
    c.DeleteVolume(pb.DeleteVolumeRequest(volume_id="v1"), timeout=T)
    c.DeleteVolume(pb.DeleteVolumeRequest(volume_id="v4"), timeout=T)
    print("ok writes succeed again once space is freed")


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
