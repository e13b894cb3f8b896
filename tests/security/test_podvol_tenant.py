#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 26: what a hostile pod can do through a volume served to ordinary
pods (docs/pod-volumes.md, docs/security.md "Volumes for ordinary pods").

A Block-mode tenant writes any bytes; a later filesystem staging of the same
volume must not hand them to the kernel's filesystem code unchecked, nor
format over them:
- a crafted ext4 (a real superblock, its group descriptors and inode tables
  then overwritten with random bytes) through the block device: the ext4
  staging is FAILED_PRECONDITION (fsck -n fails), nothing is mounted at the
  staging path, and unstage leaves no loop device, FUSE mount or mount;
- random bytes and no signature: FAILED_PRECONDITION, not formatted over
  (the bytes are the same afterwards);
- another signature (swap) where ext4 is asked: FAILED_PRECONDITION naming it.
And through its filesystem a pod gets nosuid,nodev: a setuid-root copy of a
program and a device node it makes there give it nothing (mount flags, and
opening the node fails).

usage: test_podvol_tenant.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import os
import stat
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "csi"))
import csilib  # noqa: E402
import test_csi_podvol as pv  # noqa: E402
from csilib import expect_code, mount_cap, block_cap, is_mount_point  # noqa: E402

MiB = 1 << 20
FAILS = []


def check(cond, what):
    print(("ok " if cond else "FAIL ") + what)
    if not cond:
        FAILS.append(what)


def as_block(env, vid, p, write):
    """Stage vid as a block device, publish it to the tenant, let write(dev)
    do its worst, unpublish, unstage."""
    pv.stage(env, vid, p.stg, block_cap(env.pb))
    blk = pv.Pod(env, vid, block=True)
    tgt = blk.target("tenant")
    pv.publish(env, vid, p.stg, tgt, block_cap(env.pb))
    write(tgt)
    pv.unpublish(env, vid, tgt)
    pv.unstage(env, vid, p.stg)
    pv.assert_nothing_left(env, vid, p.stg)


def refused_fs(env, vid, p, fs, want, what):
    C = csilib.grpc.StatusCode
    d = expect_code(env.client.NodeStageVolume, env.pb.NodeStageVolumeRequest(
        volume_id=vid, staging_target_path=p.stg, volume_capability=mount_cap(env.pb, fs_type=fs)),
        C.FAILED_PRECONDITION, what)
    check(want in d, "%s: refused: %s" % (what, d))
    check(not is_mount_point(p.stg), "%s: nothing mounted at the staging path" % what)
    pv.unstage(env, vid, p.stg)
    pv.assert_nothing_left(env, vid, p.stg)
    check(True, "%s: unstage left no loop device, FUSE mount, mount or QSD" % what)


def crafted_ext4(dev):
    subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard", dev], check=True,
                   capture_output=True)
    fd = os.open(dev, os.O_WRONLY)
    # Keep the superblock (1024..2047: blkid still says ext4), smash the
    # group descriptors and what follows.
    os.pwrite(fd, os.urandom(2 * MiB), 4096)
    os.fsync(fd)
    os.close(fd)


def noise(dev):
    fd = os.open(dev, os.O_WRONLY)
    os.pwrite(fd, bytes(1) + os.urandom(64 * 1024 - 1), 0)  # no known magic at 0
    os.fsync(fd)
    os.close(fd)


def main():
    env = csilib.Env(sys.argv[1], sys.argv[2])
    try:
        env.start()
        pb = env.pb

        vid = pv.create(env, "pvc-tenant-1")
        p = pv.Pod(env, vid)
        as_block(env, vid, p, crafted_ext4)
        refused_fs(env, vid, p, "ext4", "does not pass a read-only check",
                   "crafted ext4 written through a block device, then staged as ext4")

        vid2 = pv.create(env, "pvc-tenant-2")
        p2 = pv.Pod(env, vid2)
        before = {}

        def noise_and_keep(dev):
            noise(dev)
            fd = os.open(dev, os.O_RDONLY)
            before["b"] = os.pread(fd, 64 * 1024, 0)
            os.close(fd)
        as_block(env, vid2, p2, noise_and_keep)
        refused_fs(env, vid2, p2, "ext4", "not formatted over",
                   "random bytes written through a block device, then staged as ext4")
        # The bytes are the tenant's still: read them back as a block device.
        pv.stage(env, vid2, p2.stg, block_cap(pb))
        blk = pv.Pod(env, vid2, block=True)
        tgt = blk.target("owner")
        pv.publish(env, vid2, p2.stg, tgt, block_cap(pb))
        fd = os.open(tgt, os.O_RDONLY)
        check(os.pread(fd, 64 * 1024, 0) == before["b"], "the tenant's bytes were not formatted over")
        os.close(fd)
        # and another signature (swap) where ext4 is asked
        subprocess.run(["mkswap", tgt], check=True, capture_output=True)
        pv.unpublish(env, vid2, tgt)
        pv.unstage(env, vid2, p2.stg)
        refused_fs(env, vid2, p2, "ext4", "TYPE=swap", "a swap signature staged as ext4")

        # nosuid, nodev through a pod's filesystem.
        vid3 = pv.create(env, "pvc-tenant-3")
        p3 = pv.Pod(env, vid3)
        cap = mount_cap(pb, fs_type="ext4")
        pv.stage(env, vid3, p3.stg, cap)
        tgt = p3.target("tenant")
        pv.publish(env, vid3, p3.stg, tgt, cap)
        with open("/proc/self/mountinfo") as f:
            opts = [ln.split()[5] for ln in f if ln.split()[4] == tgt]
        check(opts and "nosuid" in opts[0].split(",") and "nodev" in opts[0].split(","),
              "the pod's filesystem is nosuid,nodev: %s" % opts)
        node = os.path.join(tgt, "mem")
        os.mknod(node, 0o600 | stat.S_IFCHR, os.makedev(1, 1))  # /dev/mem
        try:
            os.close(os.open(node, os.O_RDONLY))
            check(False, "a device node made in the pod's filesystem opens")
        except PermissionError:
            check(True, "a device node made in the pod's filesystem does not open (EACCES)")
        os.unlink(node)
        pv.unpublish(env, vid3, tgt)
        pv.unstage(env, vid3, p3.stg)
        pv.assert_nothing_left(env, vid3, p3.stg)
        if FAILS:
            raise AssertionError("%d failed: %s" % (len(FAILS), FAILS))
    finally:
        if sys.exc_info()[0] is not None:
            print("---- plugin log (tail)\n" + env.log_tail())
        try:
            env.stop(csilib.signal.SIGKILL)
        except Exception:  # noqa: BLE001
            pass
        for line in subprocess.run(["losetup", "-n", "-O", "NAME,BACK-FILE"], capture_output=True,
                                   text=True).stdout.splitlines():
            parts = line.split(None, 1)
            if len(parts) == 2 and parts[1].startswith(env.root + "/"):
                subprocess.run(["umount", "-l", parts[0]], check=False)
                subprocess.run(["losetup", "-d", parts[0]], check=False)
        env.cleanup()


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
