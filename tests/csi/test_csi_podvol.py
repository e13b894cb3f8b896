#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Volumes for ordinary pods (docs/pod-volumes.md), with the real plugin, a
real QSD, FUSE, loop devices and filesystems under a temporary kubelet root,
driven in kubelet's order through a gRPC client:

- a filesystem volume (mount, fsType ext4): staged (FUSE export, loop device,
  mkfs on first use, mounted at the staging path), published to two pods, a
  file written through one and read through the other, unpublished and
  published again, stats (bytes and inodes), idempotent repeats, grown
  online (NodeExpandVolume: image, loop device, resize2fs; without
  CAP_SYS_RESOURCE offline at the next stage, df checked);
- fsGroup: a new group given to every file (not through symlinks), nothing
  walked when the root is the group's already;
- one kind of consumer at a time: the vhost-user (VM) capability is refused
  while it is staged for pods, and the other way round (FAILED_PRECONDITION);
- unstaged, nothing is left (no loop device on its FUSE file, no FUSE mount,
  no mount at the staging path, no QSD), and staged again the file is there;
  after a VM staging (its bytes a tenant's), staged again after a clean
  read-only fsck;
- a block volume: the loop device bound as a device node at two targets,
  bytes written through one and read through the other, grown online;
- the QSD killed (-9) or stopped (SIGSTOP, then killed by the plugin's
  probes) under a mounted, busy ext4: the pod's I/O fails (EIO, EROFS)
  within a bound, never hangs; a stage while the pod holds the old mount is
  refused; once it is gone, staged again with its data; nothing left;
- kill -9 of the plugin at several instants of NodeStageVolume (and of
  NodeUnstageVolume), a restart, kubelet's retry, then NodeUnstageVolume:
  nothing left.

usage: test_csi_podvol.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402
from csilib import expect_code, mount_cap, block_cap, is_mount_point  # noqa: E402

MiB = 1 << 20


def loops_on(path):
    r = subprocess.run(["losetup", "-n", "-O", "NAME", "-j", path], capture_output=True,
                       text=True, timeout=30)
    return r.stdout.split()


def mounts_under(root):
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].encode().decode("unicode_escape")
            if mp.startswith(root + "/"):
                out.append((mp, line.split(" - ")[1].split()[0]))
    return out


def fs_type_at(path):
    with open("/proc/self/mountinfo") as f:
        for line in f:
            if line.split()[4].encode().decode("unicode_escape") == path:
                return line.split(" - ")[1].split()[0]
    return None


class Pod:
    """The paths kubelet would use for one volume."""

    def __init__(self, env, vid, block=False):
        self.env, self.vid, self.block = env, vid, block
        k = env.kubelet
        self.stg = os.path.join(k, "plugins/kubernetes.io/csi/test.qsd-csi.dev", vid[-6:],
                                "globalmount")
        os.makedirs(self.stg, exist_ok=True)

    def target(self, pod):
        if self.block:
            d = os.path.join(self.env.kubelet, "plugins/kubernetes.io/csi/volumeDevices/publish",
                             self.vid)
            os.makedirs(d, exist_ok=True)
            return os.path.join(d, pod)
        d = os.path.join(self.env.kubelet, "pods", pod, "volumes/kubernetes.io~csi", self.vid)
        os.makedirs(d, exist_ok=True)
        return os.path.join(d, "mount")


def create(env, name, size=64 * MiB):
    pb = env.pb
    info = env.client.NodeGetInfo(pb.NodeGetInfoRequest(), timeout=csilib.CALL_TIMEOUT)
    topo = pb.Topology(segments=dict(info.accessible_topology.segments))
    return env.client.CreateVolume(pb.CreateVolumeRequest(
        name=name, capacity_range=pb.CapacityRange(required_bytes=size),
        volume_capabilities=[mount_cap(pb)],
        accessibility_requirements=pb.TopologyRequirement(requisite=[topo], preferred=[topo])),
        timeout=csilib.CALL_TIMEOUT).volume.volume_id


def stage(env, vid, stg, cap):
    env.client.NodeStageVolume(env.pb.NodeStageVolumeRequest(
        volume_id=vid, staging_target_path=stg, volume_capability=cap), timeout=120)


def unstage(env, vid, stg):
    env.client.NodeUnstageVolume(env.pb.NodeUnstageVolumeRequest(
        volume_id=vid, staging_target_path=stg), timeout=120)


def publish(env, vid, stg, tgt, cap, ro=False):
    env.client.NodePublishVolume(env.pb.NodePublishVolumeRequest(
        volume_id=vid, staging_target_path=stg, target_path=tgt, volume_capability=cap,
        readonly=ro), timeout=csilib.CALL_TIMEOUT)


def unpublish(env, vid, tgt):
    env.client.NodeUnpublishVolume(env.pb.NodeUnpublishVolumeRequest(
        volume_id=vid, target_path=tgt), timeout=csilib.CALL_TIMEOUT)


def expand(env, vid, stg, path, cap, size):
    pb = env.pb
    e = env.client.ControllerExpandVolume(pb.ControllerExpandVolumeRequest(
        volume_id=vid, capacity_range=pb.CapacityRange(required_bytes=size),
        volume_capability=cap), timeout=csilib.CALL_TIMEOUT)
    assert e.node_expansion_required and e.capacity_bytes == size, e
    ne = env.client.NodeExpandVolume(pb.NodeExpandVolumeRequest(
        volume_id=vid, volume_path=path, staging_target_path=stg,
        capacity_range=pb.CapacityRange(required_bytes=size), volume_capability=cap), timeout=120)
    assert ne.capacity_bytes == size, ne


def has_cap(n):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> n & 1)
    return False


def xfs(env):
    """xfs (300 MiB at least): made, written, grown online by xfs_growfs."""
    pb = env.pb
    vid = create(env, "pvc-xfs-1", 320 * MiB)
    p = Pod(env, vid)
    cap = mount_cap(pb, fs_type="xfs")
    stage(env, vid, p.stg, cap)
    assert fs_type_at(p.stg) == "xfs", mounts_under(env.root)
    a = p.target("pod-a")
    publish(env, vid, p.stg, a, cap)
    with open(os.path.join(a, "x"), "w") as f:
        f.write("xfs")
    before = os.statvfs(a).f_blocks * os.statvfs(a).f_frsize
    expand(env, vid, p.stg, a, cap, 448 * MiB)
    after = os.statvfs(a).f_blocks * os.statvfs(a).f_frsize
    assert after > before + 100 * MiB, (before, after)
    unpublish(env, vid, a)
    unstage(env, vid, p.stg)
    assert_nothing_left(env, vid, p.stg)
    stage(env, vid, p.stg, cap)
    assert open(os.path.join(p.stg, "x")).read() == "xfs"
    unstage(env, vid, p.stg)
    assert_nothing_left(env, vid, p.stg)
    print("ok xfs: made, grown online %d -> %d bytes, staged again with its file" % (before,
                                                                                      after))
    env.client.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vid), timeout=csilib.CALL_TIMEOUT)


def fuse_file(env, vid):
    return os.path.join(env.run, "fuse", csilib.local_id(vid))


def assert_nothing_left(env, vid, stg):
    f = fuse_file(env, vid)
    assert not loops_on(f), "loop device left on %s: %s" % (f, loops_on(f))
    assert not is_mount_point(f), "FUSE mount left at " + f
    assert not os.path.exists(f), "FUSE file left: " + f
    assert not is_mount_point(stg), "mount left at " + stg
    left = [v for v in env.running_qsds().values() if v == csilib.local_id(vid)]
    assert not left, "QSD left: %s" % left


def filesystem(env):
    pb, C = env.pb, csilib.grpc.StatusCode
    vid = create(env, "pvc-fs-1")
    p = Pod(env, vid)
    cap = mount_cap(pb, fs_type="ext4", group="107")
    stage(env, vid, p.stg, cap)
    assert fs_type_at(p.stg) == "ext4", mounts_under(env.root)
    assert len(loops_on(fuse_file(env, vid))) == 1
    stage(env, vid, p.stg, cap)  # kubelet's repeat
    assert len(loops_on(fuse_file(env, vid))) == 1, "a repeat made a second loop device"
    st = os.stat(p.stg)
    assert st.st_gid == 107 and st.st_mode & 0o2000, oct(st.st_mode)
    print("ok staged: ext4 at the staging path on", loops_on(fuse_file(env, vid)))

    # One kind of consumer at a time.
    d = expect_code(env.client.NodePublishVolume, pb.NodePublishVolumeRequest(
        volume_id=vid, staging_target_path=p.stg, target_path=p.target("vm-pod"),
        volume_capability=mount_cap(pb)), C.FAILED_PRECONDITION, "VM publication of a pod volume")
    assert "one kind of consumer" in d, d
    d = expect_code(env.client.NodeStageVolume, pb.NodeStageVolumeRequest(
        volume_id=vid, staging_target_path=p.stg, volume_capability=mount_cap(pb)),
        C.FAILED_PRECONDITION, "VM staging of a pod volume")
    assert "pods as a filesystem" in d, d
    expect_code(env.client.NodeStageVolume, pb.NodeStageVolumeRequest(
        volume_id=vid, staging_target_path=p.stg, volume_capability=mount_cap(
            pb, fs_type="btrfs")), C.INVALID_ARGUMENT, "fsType btrfs")
    print("ok the VM capability is refused while staged for pods:", d)

    a, b = p.target("pod-a"), p.target("pod-b")
    publish(env, vid, p.stg, a, cap)
    publish(env, vid, p.stg, a, cap)  # repeat
    publish(env, vid, p.stg, b, cap)
    with open(os.path.join(a, "hello.txt"), "w") as f:
        f.write("written by pod a\n")
        f.flush()
        os.fsync(f.fileno())
    assert open(os.path.join(b, "hello.txt")).read() == "written by pod a\n"
    unpublish(env, vid, a)
    unpublish(env, vid, a)  # repeat
    assert not os.path.exists(a) and not is_mount_point(a)
    publish(env, vid, p.stg, a, cap)
    assert open(os.path.join(a, "hello.txt")).read() == "written by pod a\n"
    print("ok published twice, written through one, read through the other and after "
          "republishing")

    s = env.client.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(volume_id=vid, volume_path=a),
                                      timeout=csilib.CALL_TIMEOUT)
    units = {u.unit: u for u in s.usage}
    by, ino = units[pb.VolumeUsage.BYTES], units[pb.VolumeUsage.INODES]
    sv = os.statvfs(a)
    assert by.total == sv.f_blocks * sv.f_frsize and by.available == sv.f_bavail * sv.f_frsize, s
    assert ino.total == sv.f_files and ino.used >= 12, s
    assert not s.volume_condition.abnormal, s
    print("ok NodeGetVolumeStats: bytes %d/%d inodes %d/%d" % (by.used, by.total, ino.used,
                                                               ino.total))

    # Online growth: the image, the loop device, the filesystem.  ext4's
    # online resize needs CAP_SYS_RESOURCE (EXT4_IOC_RESIZE_FS), which the
    # test machines' root lacks: then the loop device grows and the call
    # says why the filesystem did not.
    before = os.statvfs(a).f_blocks * os.statvfs(a).f_frsize
    if has_cap(24):
        expand(env, vid, p.stg, a, cap, 128 * MiB)
        after = os.statvfs(a).f_blocks * os.statvfs(a).f_frsize
        assert after > before + 48 * MiB, (before, after)
        print("ok NodeExpandVolume grew the mounted ext4 online: %d -> %d bytes" % (before, after))
    else:
        try:
            expand(env, vid, p.stg, a, cap, 128 * MiB)
            raise AssertionError("ext4 grew without CAP_SYS_RESOURCE?")
        except csilib.grpc.RpcError as e:
            assert "CAP_SYS_RESOURCE" in e.details(), e.details()
        dev = loops_on(fuse_file(env, vid))[0]
        with open("/sys/block/%s/size" % os.path.basename(dev)) as f:
            assert int(f.read()) * 512 == 128 * MiB
        assert os.statvfs(a).f_blocks * os.statvfs(a).f_frsize == before
        print("ok NodeExpandVolume without CAP_SYS_RESOURCE: the loop device grew to 128 MiB, "
              "ext4 not (named in the error); online ext4 growth NOT VERIFIED here")
    assert open(os.path.join(b, "hello.txt")).read() == "written by pod a\n"
    grown = 128 * MiB

    d = expect_code(env.client.NodeUnstageVolume, pb.NodeUnstageVolumeRequest(
        volume_id=vid, staging_target_path=p.stg), C.FAILED_PRECONDITION, "unstage while published")
    for t in (a, b):
        unpublish(env, vid, t)
    unstage(env, vid, p.stg)
    unstage(env, vid, p.stg)  # repeat
    assert_nothing_left(env, vid, p.stg)
    print("ok unstaged: no loop device, FUSE mount, mount or QSD left")

    stage(env, vid, p.stg, cap)
    assert open(os.path.join(p.stg, "hello.txt")).read() == "written by pod a\n"
    # Grown at this stage if not online (offline resize2fs before the
    # mount): df shows the new size either way, and a repeat does nothing.
    after = os.statvfs(p.stg).f_blocks * os.statvfs(p.stg).f_frsize
    assert after > before + 48 * MiB and after <= grown, (before, after)
    log = env.log_tail(400)
    stage(env, vid, p.stg, cap)
    print("ok ext4 %s: df %d -> %d bytes, its file kept" % (
        "grown online" if has_cap(24) else "grown offline at the next stage", before, after))
    unstage(env, vid, p.stg)
    stage(env, vid, p.stg, cap)
    assert env.log_tail(400).count("growing a filesystem offline") == log.count(
        "growing a filesystem offline"), "grown again at a stage where nothing was to grow"
    unstage(env, vid, p.stg)
    # Now a VM's: its bytes are a tenant's, then a pod's filesystem again
    # after the read-only check.
    stage(env, vid, p.stg, mount_cap(pb))
    d = expect_code(env.client.NodePublishVolume, pb.NodePublishVolumeRequest(
        volume_id=vid, staging_target_path=p.stg, target_path=a, volume_capability=cap),
        C.FAILED_PRECONDITION, "pod publication of a VM volume")
    unstage(env, vid, p.stg)
    stage(env, vid, p.stg, cap)
    assert open(os.path.join(p.stg, "hello.txt")).read() == "written by pod a\n"
    unstage(env, vid, p.stg)
    assert_nothing_left(env, vid, p.stg)
    print("ok staged again (after a VM's staging: checked first): the file is there")
    env.client.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vid), timeout=csilib.CALL_TIMEOUT)


def block(env):
    pb = env.pb
    vid = create(env, "pvc-blk-1")
    p = Pod(env, vid, block=True)
    cap = block_cap(pb)
    stage(env, vid, p.stg, cap)
    stage(env, vid, p.stg, cap)
    a, b = p.target("pod-a"), p.target("pod-b")
    publish(env, vid, p.stg, a, cap)
    publish(env, vid, p.stg, a, cap)
    publish(env, vid, p.stg, b, cap)
    import stat
    assert stat.S_ISBLK(os.stat(a).st_mode) and os.stat(a).st_rdev == os.stat(b).st_rdev
    pattern = os.urandom(4096)
    fd = os.open(a, os.O_WRONLY)
    os.pwrite(fd, pattern, 1 * MiB)
    os.fsync(fd)
    os.close(fd)
    fd = os.open(b, os.O_RDONLY)
    got = os.pread(fd, 4096, 1 * MiB)
    os.close(fd)
    assert got == pattern
    size = os.open(a, os.O_RDONLY)
    assert os.lseek(size, 0, os.SEEK_END) == 64 * MiB
    os.close(size)
    print("ok block: device node at two targets, bytes written through one read through the "
          "other, 64 MiB")
    expand(env, vid, p.stg, a, cap, 96 * MiB)
    fd = os.open(b, os.O_RDONLY)
    assert os.lseek(fd, 0, os.SEEK_END) == 96 * MiB
    assert os.pread(fd, 4096, 1 * MiB) == pattern
    os.close(fd)
    print("ok block device grown online to 96 MiB")
    # The stage recorded its loop device; a publication checks that one
    # without asking the FUSE export (a hung QSD must not stop the plugin):
    # with the QSD frozen past the kernel's attribute timeout (1 s), a
    # publication and a Probe are answered at once.
    with open(os.path.join(env.state, "volumes", csilib.local_id(vid) + ".json")) as f:
        rec = json.load(f)["staged"]["loop"]
    rdev = os.stat(a).st_rdev
    sysdev = os.path.realpath("/sys/dev/block/%d:%d" % (os.major(rdev), os.minor(rdev)))
    with open(os.path.join(sysdev, "diskseq")) as f:
        assert sysdev.endswith("/" + rec["name"]) and rec["diskseq"] == int(f.read()), rec
    qsd = csilib.qsd_process(env.qsd_pids()[csilib.local_id(vid)])
    c = p.target("pod-c")
    os.kill(qsd, signal.SIGSTOP)
    try:
        time.sleep(1.2)
        t0 = time.monotonic()
        publish(env, vid, p.stg, c, cap)
        env.client.Probe(pb.ProbeRequest(), timeout=csilib.CALL_TIMEOUT)
        took = time.monotonic() - t0
    finally:
        os.kill(qsd, signal.SIGCONT)
    assert os.stat(c).st_rdev == rdev
    print("ok block: the recorded loop device (%s) published while the QSD was frozen, in "
          "%.2f s" % (rec["name"], took))
    for t in (a, b, c):
        unpublish(env, vid, t)
        assert not os.path.exists(t)
    unstage(env, vid, p.stg)
    assert_nothing_left(env, vid, p.stg)
    print("ok block unstaged: nothing left")
    env.client.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vid), timeout=csilib.CALL_TIMEOUT)


def fsgroup(env):
    """fsGroup as kubelet applies it (the driver does, CSIDriver fsGroupPolicy
    File): staged for a new group, every file becomes that group's with
    group read/write (directories search and setgid); never through a
    symlink (a host file a symlink names is untouched); a stage for the
    group the root already has walks nothing (OnRootMismatch)."""
    pb = env.pb
    vid = create(env, "pvc-fsgroup-1")
    p = Pod(env, vid)
    stage(env, vid, p.stg, mount_cap(pb, fs_type="ext4", group="107"))
    host = os.path.join(env.root, "host-secret")
    with open(host, "w") as f:
        f.write("host")
    os.chown(host, 0, 0)
    os.chmod(host, 0o600)
    d, fl = os.path.join(p.stg, "d"), os.path.join(p.stg, "d", "f")
    os.mkdir(d)
    with open(fl, "w") as f:
        f.write("pod data")
    for path, mode in ((d, 0o700), (fl, 0o600)):
        os.chown(path, 0, 0)
        os.chmod(path, mode)
    os.symlink(host, os.path.join(p.stg, "link"))
    os.symlink(host, os.path.join(d, "link2"))
    unstage(env, vid, p.stg)
    cap = mount_cap(pb, fs_type="ext4", group="108")
    stage(env, vid, p.stg, cap)
    st = {n: os.lstat(os.path.join(p.stg, n)) for n in ("", "d", "d/f", "link", "d/link2")}
    assert all(x.st_gid == 108 for x in st.values()), {n: x.st_gid for n, x in st.items()}
    assert st["d"].st_mode & 0o2070 == 0o2070 and st[""].st_mode & 0o2070 == 0o2070, \
        oct(st["d"].st_mode)
    assert st["d/f"].st_mode & 0o7777 == 0o660, oct(st["d/f"].st_mode)
    h = os.stat(host)
    assert h.st_gid == 0 and h.st_mode & 0o7777 == 0o600, (h.st_gid, oct(h.st_mode))
    os.chown(fl, 0, 0)  # the root is 108's: the next stage walks nothing
    unstage(env, vid, p.stg)
    stage(env, vid, p.stg, cap)
    assert os.stat(fl).st_gid == 0, os.stat(fl).st_gid
    unstage(env, vid, p.stg)
    assert_nothing_left(env, vid, p.stg)
    print("ok fsGroup: a new group given to every file (g+rw, directories g+xs), not through "
          "symlinks, nothing walked when the root is the group's already")
    env.client.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vid), timeout=csilib.CALL_TIMEOUT)


class Writer:
    """A pod's writer: 4 KiB O_DIRECT writes, each fsync'd, every 20 ms, into
    a file of its mount; records (start, errno or 0, seconds) per write."""

    def __init__(self, path):
        import mmap
        import threading
        self.path, self.buf, self.log = path, mmap.mmap(-1, 4096), []
        self.stop_at = None
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        i = 0
        while self.stop_at is None or time.monotonic() < self.stop_at:
            t = time.monotonic()
            try:
                fd = os.open(os.path.join(self.path, "w%d" % (i % 4)),
                             os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
                try:
                    os.pwrite(fd, self.buf, 0)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                self.log.append((t, 0, time.monotonic() - t))
            except OSError as e:
                self.log.append((t, e.errno, time.monotonic() - t))
            i += 1
            time.sleep(0.02)

    def finish(self, after):
        self.stop_at = time.monotonic() + after
        self.thread.join(after + 60)
        assert not self.thread.is_alive(), "a write of the pod still hangs %ds later" % (after + 60)


def qsd_death(env, how, bound):
    """The QSD of a mounted, busy ext4 pod volume dies (kill -9, or SIGSTOP
    and killed by the plugin's probes): the pod's I/O fails within bound
    seconds (EIO, then EROFS: errors=remount-ro), never hangs; the volume is
    reported abnormal; a stage while the pod still holds its mount is
    FAILED_PRECONDITION and takes nothing down; once the pod is gone the
    stage builds a new data path (the file written before is there) and
    unstage leaves nothing."""
    import errno
    pb, C = env.pb, csilib.grpc.StatusCode
    vid = create(env, "pvc-die-" + how)
    p = Pod(env, vid)
    cap = mount_cap(pb, fs_type="ext4")
    stage(env, vid, p.stg, cap)
    a = p.target("pod-a")
    publish(env, vid, p.stg, a, cap)
    with open(os.path.join(a, "before"), "w") as f:
        f.write("synced before\n")
        f.flush()
        os.fsync(f.fileno())
    loop = loops_on(fuse_file(env, vid))
    pid = env.qsd_pids()[csilib.local_id(vid)]
    qsd = csilib.qsd_process(pid)
    w = Writer(a)
    # Busy before the QSD dies: a few of the pod's writes done (bounded; on a
    # loaded machine the first ones may take longer than a fixed pause).
    start = time.monotonic()
    while (len([x for x in w.log if x[1] == 0]) < 5 or time.monotonic() < start + 0.5) and \
            time.monotonic() < start + 30:
        time.sleep(0.05)
    t0 = time.monotonic()
    os.kill(qsd, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    deadline = t0 + bound
    while time.monotonic() < deadline and not any(e for _, e, _ in w.log):
        time.sleep(0.05)
    w.finish(1.0)
    if how == "stop":
        try:
            os.kill(qsd, signal.SIGCONT)  # killed by the probes by now: a no-op
        except ProcessLookupError:
            pass  # and reaped
    ok = [x for x in w.log if x[0] < t0 and x[1] == 0]
    failed = [x for x in w.log if x[1]]
    assert ok, "no write succeeded before the %s" % how
    assert failed, "no write failed within %ds of the %s: %s" % (bound, how, w.log[-3:])
    first = failed[0]
    waited = first[0] + first[2] - t0
    assert waited < bound, (how, waited)
    assert max(x[2] for x in w.log) < bound, max(x[2] for x in w.log)
    codes = sorted({errno.errorcode[x[1]] for x in failed})
    assert set(codes) <= {"EIO", "EROFS"}, codes
    assert all(x[1] for x in w.log if x[0] > first[0]), "a write succeeded after a failure"
    print("ok QSD %s under a busy ext4: the pod's first failed write %.2fs after it (%s), the "
          "longest write %.2fs, then %s; %d writes before" % (
              "kill -9" if how == "kill" else "SIGSTOP (killed by the probes)", waited,
              errno.errorcode[first[1]], max(x[2] for x in w.log), "/".join(codes), len(ok)))

    # The plugin restarts the QSD (without a FUSE export: the old one died
    # with its QSD).  Until the new one serves, the volume is "being
    # restarted" and a stage answers UNAVAILABLE (retry); once it serves, the
    # volume reports its FUSE export gone.  Abnormal all along.  Waited for
    # (bounded): the restart takes longer than any fixed pause on a loaded
    # machine.  The new pid is read before the condition, so that a message
    # about the export is the served restart's, not the old QSD's death seen
    # before the plugin noticed it.
    deadline, seen = time.monotonic() + 30, []
    while True:
        new = env.qsd_pids().get(csilib.local_id(vid))
        s = env.client.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(
            volume_id=vid, volume_path=a), timeout=csilib.CALL_TIMEOUT)
        assert s.volume_condition.abnormal, (seen, s)
        if s.volume_condition.message not in seen:
            seen.append(s.volume_condition.message)
        if new and new != pid and "FUSE export" in s.volume_condition.message:
            break
        assert time.monotonic() < deadline, \
            "the QSD was not restarted and serving within 30 s (pid %s -> %s): %s" % (pid, new, seen)
        time.sleep(0.1)
    # The restarted QSD's namespace was made while the filesystem was
    # mounted: it keeps no copy of anything beneath the kubelet root (one
    # would hold the loop device: the unstage below could not detach it).
    for q in {new, csilib.qsd_process(new)}:
        with open("/proc/%d/mountinfo" % q) as f:
            held = [ln.split()[4] for ln in f if ln.split()[4].startswith(env.kubelet + "/")]
        assert not held, "QSD %d keeps mounts beneath the kubelet root: %s" % (q, held)
    # A second pod on the node: kubelet stages again.  The first pod still
    # holds the old mount: refused, nothing taken down.
    d = expect_code(env.client.NodeStageVolume, pb.NodeStageVolumeRequest(
        volume_id=vid, staging_target_path=p.stg, volume_capability=cap),
        C.FAILED_PRECONDITION, "stage while a pod holds the dead data path")
    assert "delete the pods" in d and a in d, d
    assert is_mount_point(p.stg) and is_mount_point(a) and loops_on(fuse_file(env, vid)) == loop
    unpublish(env, vid, a)
    stage(env, vid, p.stg, cap)
    assert fs_type_at(p.stg) == "ext4" and len(loops_on(fuse_file(env, vid))) == 1
    assert open(os.path.join(p.stg, "before")).read() == "synced before\n"
    b = p.target("pod-b")
    publish(env, vid, p.stg, b, cap)
    with open(os.path.join(b, "after"), "w") as f:
        f.write("y")
        f.flush()
        os.fsync(f.fileno())
    s = env.client.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(volume_id=vid, volume_path=b),
                                      timeout=csilib.CALL_TIMEOUT)
    assert not s.volume_condition.abnormal, s
    unpublish(env, vid, b)
    unstage(env, vid, p.stg)
    assert_nothing_left(env, vid, p.stg)
    # The dead data path's loop device is gone too: once its FUSE mount was
    # detached it showed "/" as its backing file, which no path search finds
    # (each QSD death leaked one).  Unbound now, or bound by another test.
    for dev in loop:
        bf = "/sys/block/%s/loop/backing_file" % os.path.basename(dev)
        shown = open(bf).read().strip() if os.path.exists(bf) else None
        assert shown != "/", "the dead data path's loop device %s is still bound" % dev
    print("ok after the QSD's death: abnormal (%s), a stage under the old pod refused (%s); "
          "the pod gone, staged again with its file, unstaged: nothing left, the old loop "
          "device %s let go" % (" / ".join(m[:75] for m in seen), d[:60], loop))
    env.client.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vid), timeout=csilib.CALL_TIMEOUT)


def retry(call, what, bound=60):
    """kubelet's retries of call until OK: UNAVAILABLE and ABORTED (a QSD
    being started or adopted, an operation in flight) are retried for at
    most bound seconds (a restart after a kill takes longer on a loaded
    machine); any other answer, or none OK within the bound, fails."""
    deadline, last = time.monotonic() + bound, None
    while time.monotonic() < deadline:
        try:
            return call()
        except csilib.grpc.RpcError as e:
            if e.code() not in (csilib.grpc.StatusCode.UNAVAILABLE,
                                csilib.grpc.StatusCode.ABORTED):
                raise AssertionError("%s: %s %s" % (what, e.code(), e.details()))
            last = "%s %s" % (e.code(), e.details())
        time.sleep(0.25)
    raise AssertionError("%s: not OK within %d s, last: %s" % (what, bound, last))


def crash(env, delays=(0.0, 0.01, 0.03, 0.08, 0.15, 0.3, 0.6)):
    """kill -9 of the plugin while NodeStageVolume runs, at each delay;
    restart, kubelet's retry, a file written, unstage: nothing left."""
    pb = env.pb
    vid = create(env, "pvc-crash-1")
    p = Pod(env, vid)
    cap = mount_cap(pb, fs_type="ext4")
    pool = concurrent.futures.ThreadPoolExecutor(1)
    for i, delay in enumerate(delays):
        fut = pool.submit(stage, env, vid, p.stg, cap)
        time.sleep(delay)
        env.proc.send_signal(signal.SIGKILL)
        try:
            fut.result(timeout=60)
        except Exception:  # noqa: BLE001 - the call dies with the plugin
            pass
        env.stop()
        env.start()
        retry(lambda: stage(env, vid, p.stg, cap), "retry after kill at %.2fs" % delay)
        assert fs_type_at(p.stg) == "ext4", (delay, mounts_under(env.root))
        assert len(loops_on(fuse_file(env, vid))) == 1, (delay, loops_on(fuse_file(env, vid)))
        with open(os.path.join(p.stg, "n%d" % i), "w") as f:
            f.write("x")
        # kubelet's order: the retried stage answered OK, the pod ran
        assert sorted(os.listdir(p.stg)) == sorted(["lost+found"] + ["n%d" % k for k in
                                                                     range(i + 1)]), (
            delay, sorted(os.listdir(p.stg)))
        unstage(env, vid, p.stg)
        assert_nothing_left(env, vid, p.stg)
    # kill -9 while NodeUnstageVolume runs; restart; kubelet's retry.
    for delay in delays:
        stage(env, vid, p.stg, cap)
        fut = pool.submit(unstage, env, vid, p.stg)
        time.sleep(delay)
        env.proc.send_signal(signal.SIGKILL)
        try:
            fut.result(timeout=60)
        except Exception:  # noqa: BLE001
            pass
        env.stop()
        env.start()
        retry(lambda: unstage(env, vid, p.stg), "unstage retry after kill at %.2fs" % delay)
        assert_nothing_left(env, vid, p.stg)
    pool.shutdown()
    # Killed after a complete stage: the new plugin adopts the QSD, the
    # loop device and the mount stay; unstage takes everything down.
    stage(env, vid, p.stg, cap)
    env.proc.send_signal(signal.SIGKILL)
    env.stop()
    env.start()
    assert fs_type_at(p.stg) == "ext4"
    stage(env, vid, p.stg, cap)
    want = sorted(["lost+found"] + ["n%d" % i for i in range(len(delays))])
    assert sorted(os.listdir(p.stg)) == want, (sorted(os.listdir(p.stg)), want)
    unstage(env, vid, p.stg)
    assert_nothing_left(env, vid, p.stg)
    print("ok kill -9 at %d instants of NodeStageVolume, of NodeUnstageVolume and after a "
          "stage: retried, nothing left after unstage" % len(delays))


def main():
    env = csilib.Env(sys.argv[1], sys.argv[2])
    try:
        csilib.share_kubelet_root(env)
        env.start(("--metrics-interval", "1"))
        filesystem(env)
        fsgroup(env)
        xfs(env)
        block(env)
        qsd_death(env, "kill", 5)
        # 3 probes of 3 s unanswered, one per second: killed within 12 s
        # (test_csi_hung.py), then the same as a kill -9.
        qsd_death(env, "stop", 25)
        crash(env)
    finally:
        if sys.exc_info()[0] is not None:
            print("---- plugin log (tail)\n" + env.log_tail())
        # Loop devices on our FUSE files first: once cleanup() has unmounted
        # those lazily, their backing file no longer shows our root.
        try:
            env.stop(signal.SIGKILL)
        except Exception:  # noqa: BLE001
            pass
        csilib.detach_loops_under(env.root)
        env.cleanup()


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
