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
A Block-mode pod holds its loop device's node, read-write, and may detach the
device and bind it to a file of its own (LOOP_CLR_FD, LOOP_SET_FD: the
kernel asks no capability).  Its file, at RUN/fuse/VICTIM inside its own
mount namespace, reads in /sys exactly like the victim volume's FUSE file:
the victim's next staging must make its own loop device, not mount the
tenant's filesystem (a planted file must not show), and publish nothing of
the tenant's.

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


REBIND = r"""
import fcntl, os, sys, time
LOOP_SET_FD, LOOP_CLR_FD = 0x4C00, 0x4C01
dev, own = sys.argv[1], sys.argv[2]
fd = os.open(dev, os.O_RDWR)
fcntl.ioctl(fd, LOOP_CLR_FD, 0)
os.close(fd)
for _ in range(50):  # the detach completes at the last close
    fd = os.open(dev, os.O_RDWR)
    f = os.open(own, os.O_RDWR)
    try:
        fcntl.ioctl(fd, LOOP_SET_FD, f)
        print("rebound")
        break
    except OSError:
        time.sleep(0.1)
    finally:
        os.close(f)
        os.close(fd)
"""


def rebound_loop(env):
    """The tenant's loop device rebound to a file named like the victim's."""
    pb = env.pb
    victim = pv.create(env, "pvc-victim-5")
    vp = pv.Pod(env, victim)
    vp.stg = os.path.join(os.path.dirname(os.path.dirname(vp.stg)), "victim", "globalmount")
    os.makedirs(vp.stg)  # the Pod helper's staging path is per node, not per volume
    tenant = pv.create(env, "pvc-tenant-5")
    tp = pv.Pod(env, tenant)
    pv.stage(env, tenant, tp.stg, block_cap(pb))
    tgt = pv.Pod(env, tenant, block=True).target("tenant")
    pv.publish(env, tenant, tp.stg, tgt, block_cap(pb))
    rogue = "/dev/loop%d" % os.minor(os.stat(tgt).st_rdev)
    fake = pv.fuse_file(env, victim)
    seed = os.path.join(env.root, "seed")
    os.makedirs(seed, exist_ok=True)
    with open(os.path.join(seed, "planted"), "w") as f:
        f.write("the tenant's\n")
    # In a mount namespace of its own (a container's): a tmpfs whose tree
    # mirrors RUN/fuse/VICTIM, holding an ext4 of the victim's size with the
    # planted file; then, as root without any capability, the rebinding.
    script = ('set -e; m=$(mktemp -d); mount -t tmpfs none "$m"; mkdir -p "$m$(dirname "$1")"; '
              'truncate -s %d "$m$1"; mkfs.ext4 -q -F -E nodiscard -d "$2" "$m$1"; '
              'exec setpriv --inh-caps=-all --bounding-set=-all /usr/bin/python3 -c "$3" "$4" "$m$1"'
              % (64 * MiB))
    r = subprocess.run(["unshare", "-m", "--propagation", "slave", "sh", "-c", script, "sh",
                        fake, seed, REBIND, tgt], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and "rebound" in r.stdout,
          "the tenant (root, no capability) rebound its loop device %s to its own file: %s%s"
          % (rogue, r.stdout.strip(), r.stderr.strip()))
    with open("/sys/block/%s/loop/backing_file" % rogue[5:]) as f:
        shown = f.read().strip()
    check(shown == fake, "the rebound device reads in /sys as the victim's FUSE file: %s" % shown)
    # The tenant's own next publication does not get the rebound device
    # either: the stage recorded the device's disk sequence number, which
    # the rebinding changed.
    C = csilib.grpc.StatusCode
    t2 = pv.Pod(env, tenant, block=True).target("tenant-2")
    d = expect_code(env.client.NodePublishVolume, pb.NodePublishVolumeRequest(
        volume_id=tenant, staging_target_path=tp.stg, target_path=t2,
        volume_capability=block_cap(pb)), C.FAILED_PRECONDITION,
        "a publication of the tenant's volume after the rebinding")
    check("stage it again" in d and not os.path.exists(t2),
          "the rebound device is not published again: %s" % d)

    cap = mount_cap(pb, fs_type="ext4")
    pv.stage(env, victim, vp.stg, cap)
    st = os.stat(vp.stg)
    check(st.st_dev != os.stat(rogue).st_rdev,
          "the victim's filesystem is not on the tenant's device %s" % rogue)
    check(not os.path.exists(os.path.join(vp.stg, "planted")),
          "the tenant's planted file is not in the victim's filesystem")
    vt = vp.target("victim-pod")
    pv.publish(env, victim, vp.stg, vt, cap)
    check(not os.path.exists(os.path.join(vt, "planted")),
          "nor in the victim pod's mount")
    pv.unpublish(env, victim, vt)
    pv.unstage(env, victim, vp.stg)
    # The victim as a Block volume: its own device is bound, not the rogue.
    pv.stage(env, victim, vp.stg, block_cap(pb))
    bt = pv.Pod(env, victim, block=True).target("victim-blk")
    pv.publish(env, victim, vp.stg, bt, block_cap(pb))
    check(os.stat(bt).st_rdev != os.stat(rogue).st_rdev,
          "a Block publication of the victim binds its own device, not %s" % rogue)
    pv.unpublish(env, victim, bt)
    pv.unstage(env, victim, vp.stg)
    check("not backed by it" in env.log_tail(200),
          "the plugin logged the device it ignored")
    # The rogue device is the tenant's doing (and its own file): detached
    # here, as an operator would, before the leftovers are checked.
    subprocess.run(["losetup", "-d", rogue], check=False)
    pv.assert_nothing_left(env, victim, vp.stg)
    pv.unpublish(env, tenant, tgt)
    pv.unstage(env, tenant, tp.stg)
    pv.assert_nothing_left(env, tenant, tp.stg)
    check(True, "unstage left no loop device, FUSE mount, mount or QSD of either volume")


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

        rebound_loop(env)
        if FAILS:
            raise AssertionError("%d failed: %s" % (len(FAILS), FAILS))
    finally:
        if sys.exc_info()[0] is not None:
            print("---- plugin log (tail)\n" + env.log_tail())
        try:
            env.stop(csilib.signal.SIGKILL)
        except Exception:  # noqa: BLE001
            pass
        csilib.detach_loops_under(env.root)
        env.cleanup()


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
