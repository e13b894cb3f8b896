#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The plugin's event loop never blocks: the real plugin runs under
`strace -f` through a whole volume lifecycle (create, stage, publish,
expand, snapshot, restore, a hot-plug bridge published and unpublished,
unpublish, unstage, delete) and, on its loop
thread (the thread whose id is the plugin's pid), the trace must hold

  - no disk sync (fsync, fdatasync, sync, syncfs, sync_file_range, msync):
    records are made durable off the loop, and an RPC is answered once they are;
  - no blocking wait for a child (wait4/waitid without WNOHANG);
  - no blocking wait of another kind (poll, select or epoll with a timeout,
    sleep, a connect on a socket that is not non-blocking): the loop waits
    only in its backend's wait, io_uring_enter or (QSD_CSI_LOOP=epoll in the
    environment, as where a seccomp profile refuses io_uring) epoll_wait on
    the epoll fd the loop thread created.

Forked workers and the QSDs are traced too (-f) but not counted: blocking is
their job.  The trace also has to show the loop at work (its backend's waits
on the loop thread and none of the other backend's, a rename of a record),
so an empty trace fails; and the plugin's log names the backend.

usage: test_csi_loop_syscalls.py PLUGIN_BINARY PROTO_DIR [QSDCTL]
"""
import os
import re
import shutil
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402
from csilib import mount_cap  # noqa: E402

MiB = 1 << 20
T = 60

SYNCS = {"fsync", "fdatasync", "sync", "syncfs", "sync_file_range", "msync"}
WAITS = {"wait4", "waitid"}
SLEEPS = {"poll", "ppoll", "select", "pselect6", "epoll_wait", "epoll_pwait", "epoll_pwait2",
          "nanosleep", "clock_nanosleep", "pause", "flock"}
# Calls that create a socket or change its flags: to know which fds block.
SOCKETS = {"socket", "accept4", "accept", "fcntl", "connect"}
EPOLL_WAITS = {"epoll_wait", "epoll_pwait", "epoll_pwait2"}
TRACED = SYNCS | WAITS | SLEEPS | SOCKETS | {"io_uring_enter", "io_uring_setup", "epoll_create1",
                                              "rename", "renameat", "renameat2", "close"}

LINE = re.compile(r"^(\d+) +(\w+)\((.*)$")
RESUMED = re.compile(r"^(\d+) +<\.\.\. \w+ resumed>(.*)$")


def joined(f):
    """strace -f lines with each call's <unfinished ...> and <... resumed>
    halves put back together."""
    pending = {}
    for line in f:
        line = line.rstrip("\n")
        m = RESUMED.match(line)
        if m:
            line = pending.pop(m.group(1), m.group(1) + " ?(") + m.group(2)
        elif line.endswith("<unfinished ...>"):
            pid = line.split(" ", 1)[0]
            pending[pid] = line[:-len("<unfinished ...>")]
            continue
        yield line


def plugin_pid(strace_pid, timeout=15):
    """The plugin is strace's only direct child."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open("/proc/%d/task/%d/children" % (strace_pid, strace_pid)) as f:
                kids = f.read().split()
            if kids:
                return int(kids[0])
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError("strace started no plugin")


def fd_of(arg):
    """The fd number of an argument printed by strace -y ("5</path>")."""
    return int(re.match(r"-?\d+", arg).group(0))


def zero_timeout(name, rest):
    """A poll that only looks (timeout 0) does not wait."""
    args = rest.rsplit(") = ", 1)[0]
    if name == "poll":
        return args.endswith(", 0")
    if name == "ppoll":
        return "{tv_sec=0, tv_nsec=0}" in args
    return False


def analyse(trace, pid):
    """(offending lines on thread pid, its io_uring_enter count, its
    epoll_wait count on its own epoll fds, fsyncs of the state directory's
    files on other threads)."""
    bad, enters, epolls, durable = [], 0, 0, 0
    nonblock = set()   # fds of the loop thread known to be non-blocking
    epfds = set()      # epoll fds the loop thread created: the epoll loop's
    with open(trace, errors="replace") as f:
        for line in joined(f):
            m = LINE.match(line)
            if not m:
                continue
            name, rest = m.group(2), m.group(3)
            if int(m.group(1)) != pid:
                if name in ("fsync", "fdatasync") and "/state/" in rest:
                    durable += 1
                continue
            ret = line.rsplit("= ", 1)[-1].split()[0] if "= " in line else ""
            if name == "io_uring_enter":
                enters += 1
            elif name == "epoll_create1" and ret[:1].isdigit():
                epfds.add(fd_of(ret))
            elif name in EPOLL_WAITS and fd_of(rest) in epfds:
                epolls += 1
            elif name in SYNCS or (name in SLEEPS and not zero_timeout(name, rest)):
                bad.append(line.strip())
            elif name in WAITS and "WNOHANG" not in rest:
                bad.append(line.strip())
            elif name in ("socket", "accept4", "accept") and ret[:1].isdigit():
                fd = fd_of(ret)
                (nonblock.add if "NONBLOCK" in rest else nonblock.discard)(fd)
            elif name == "fcntl" and "F_SETFL" in rest:
                fd = fd_of(rest)
                (nonblock.add if "O_NONBLOCK" in rest else nonblock.discard)(fd)
            elif name == "close":
                nonblock.discard(fd_of(rest))
                epfds.discard(fd_of(rest))
            elif name == "connect" and fd_of(rest) not in nonblock:
                bad.append(line.strip())
    return bad, enters, epolls, durable


def lifecycle(env, c):
    pb = env.pb
    cap = mount_cap(pb)
    c.CreateVolume(pb.CreateVolumeRequest(
        name="pvc-loop", capacity_range=pb.CapacityRange(required_bytes=64 * MiB),
        volume_capabilities=[cap]), timeout=T)
    stg = os.path.join(env.kubelet, "staging", "pvc-loop")
    tgt = os.path.join(env.kubelet, "pods", "pod-1", "mount")
    os.makedirs(stg)
    os.makedirs(os.path.dirname(tgt))
    c.NodeStageVolume(pb.NodeStageVolumeRequest(volume_id="pvc-loop", staging_target_path=stg,
                                                volume_capability=cap), timeout=T)
    c.NodePublishVolume(pb.NodePublishVolumeRequest(
        volume_id="pvc-loop", staging_target_path=stg, target_path=tgt, volume_capability=cap),
        timeout=T)
    e = c.ControllerExpandVolume(pb.ControllerExpandVolumeRequest(
        volume_id="pvc-loop", capacity_range=pb.CapacityRange(required_bytes=128 * MiB)),
        timeout=T)
    assert e.capacity_bytes == 128 * MiB, e
    ne = c.NodeExpandVolume(pb.NodeExpandVolumeRequest(
        volume_id="pvc-loop", volume_path=tgt,
        capacity_range=pb.CapacityRange(required_bytes=128 * MiB)), timeout=T)
    assert ne.capacity_bytes == 128 * MiB, ne
    sn = c.CreateSnapshot(pb.CreateSnapshotRequest(name="snap-loop", source_volume_id="pvc-loop"),
                          timeout=T).snapshot
    assert sn.ready_to_use, sn
    src = pb.VolumeContentSource(snapshot=pb.VolumeContentSource.SnapshotSource(
        snapshot_id="snap-loop"))
    rv = c.CreateVolume(pb.CreateVolumeRequest(
        name="pvc-restored", capacity_range=pb.CapacityRange(required_bytes=128 * MiB),
        volume_capabilities=[cap], volume_content_source=src), timeout=T).volume
    assert csilib.local_id(rv.content_source.snapshot.snapshot_id) == "snap-loop", rv
    # A hot-plug bridge of a VM pod: its record goes through the same store.
    uid = "5f0c2d1e-0000-4000-8000-00000000l00p".replace("l", "1")
    btgt = os.path.join(env.kubelet, "pods", uid, "volumes", "kubernetes.io~csi", "bridge",
                        "mount")
    os.makedirs(os.path.dirname(btgt))
    ctx = {"bridge": "true", "csi.storage.k8s.io/pod.uid": uid,
           "csi.storage.k8s.io/pod.namespace": "default", "csi.storage.k8s.io/pod.name": "vm",
           "csi.storage.k8s.io/ephemeral": "true"}
    c.NodePublishVolume(pb.NodePublishVolumeRequest(
        volume_id="csi-bridge-loop", target_path=btgt, volume_capability=cap,
        volume_context=ctx), timeout=T)
    c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id="csi-bridge-loop",
                                                        target_path=btgt), timeout=T)
    c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id="pvc-loop", target_path=tgt),
                          timeout=T)
    c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id="pvc-loop",
                                                    staging_target_path=stg), timeout=T)
    c.DeleteVolume(pb.DeleteVolumeRequest(volume_id="pvc-restored"), timeout=T)
    c.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id="snap-loop"), timeout=T)
    c.DeleteVolume(pb.DeleteVolumeRequest(volume_id="pvc-loop"), timeout=T)


def main():
    strace = shutil.which("strace")
    if not strace:
        csilib.skip("strace not installed (scripts/setup.sh installs it)")
    env = csilib.Env(sys.argv[1], sys.argv[2])
    backend = os.environ.get("QSD_CSI_LOOP") or "io_uring"
    # LeakSanitizer cannot run under ptrace (ASan build): the other tests
    # check leaks, this one syscalls.
    opts = os.environ.get("ASAN_OPTIONS", "")
    os.environ["ASAN_OPTIONS"] = (opts + ":" if opts else "") + "detect_leaks=0"
    pid = None
    try:
        trace = os.path.join(env.root, "strace.out")
        c = env.start(wrapper=[strace, "-f", "-qq", "-o", trace, "-e",
                               "trace=" + ",".join(sorted(TRACED)), "-y", "--"])
        pid = plugin_pid(env.proc.pid)
        lifecycle(env, c)
        print("ok lifecycle under strace (plugin pid %d)" % pid)
        # Stop the plugin itself; strace then exits with it.
        os.kill(pid, signal.SIGTERM)
        rc = env.stop()
        assert rc == 0, "plugin (under strace) exited with %s:\n%s" % (rc, env.log_tail())
        bad, enters, epolls, durable = analyse(trace, pid)
        log = env.log_tail(1 << 20)
        assert "backend=%s" % backend in log, "the plugin did not log backend=%s:\n%s" % (
            backend, log)
        waits, other = (epolls, enters) if backend == "epoll" else (enters, epolls)
        assert waits > 0, "no %s wait on the loop thread: the trace is empty" % backend
        assert other == 0, "%d waits of the other backend on the loop thread (%s)" % (other,
                                                                                       backend)
        print("loop thread (%s): %d io_uring_enter, %d epoll_wait on its epoll fd, %d sync or "
              "blocking calls; %d fsyncs of state files on other threads"
              % (backend, enters, epolls, len(bad), durable))
        for b in bad[:80]:
            print("  " + b)
        assert not bad, "%d sync or blocking calls on the loop thread" % len(bad)
        assert durable > 0, "the records were never fsync'ed (off the loop either)"
        print("ok no sync or blocking wait on the loop thread")
    finally:
        # env.proc is strace: killing it would leave the plugin running
        # (detached), restarting the QSDs cleanup stops.  The plugin first.
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                if env.root.encode() in f.read():  # still our plugin, not a reused pid
                    os.kill(pid, signal.SIGKILL)
        except (OSError, TypeError):
            pass
        env.cleanup()


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
