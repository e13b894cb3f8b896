#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""tests/strays.py, the ctest/strays fixture, on a planted leak.

Planted: an orphaned process carrying the tag (what a test killed at its
timeout leaves), a tmpfs mounted under a root registered by a process that
is gone.  The fixture must kill the process, unmount, remove the root and
fail; run again, it must find nothing and pass.  Left alone: a process of
another tag, a tagged process that still has a ctest ancestor (another run's
test), a root whose registering process is alive (another run's test), and
roots outside /tmp."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STRAYS = os.path.join(HERE, "..", "strays.py")


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def orphan(cmd, env):
    """Start cmd detached (its parent exits at once): the PID of the orphan."""
    out = subprocess.run(["sh", "-c", '"$@" >/dev/null 2>&1 & echo $!', "sh", *cmd], env=env,
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return int(out.strip())


def children(pid):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
                kids = [int(k) for k in f.read().split()]
            if kids:
                return kids
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError("no child of %d" % pid)


def run(tag, roots):
    r = subprocess.run([sys.executable, STRAYS, "cleanup", tag, roots],
                       capture_output=True, text=True, timeout=120)
    print(r.stdout, end="")
    return r


def main():
    if os.geteuid() != 0:
        print("skip: needs root (mounts a tmpfs)")
        return 77
    tag = "selftest%d" % os.getpid()
    gone_root = tempfile.mkdtemp(prefix="qsd-strays-gone-", dir="/tmp")
    live_root = tempfile.mkdtemp(prefix="qsd-strays-live-", dir="/tmp")
    roots = gone_root + ".roots"
    # A process that has exited: its PID, to register gone_root under.
    dead = subprocess.Popen(["true"])
    dead.wait()
    with open(roots, "w") as f:
        f.write("%d %s\n%d %s\n%d /etc\n%d ../tmp\nnonsense\n"
                % (dead.pid, gone_root, os.getpid(), live_root, dead.pid, dead.pid))
    env = dict(os.environ, QSD_CSI_CTEST=tag)
    fake_ctest = os.path.join(live_root, "ctest")
    shutil.copy("/bin/sh", fake_ctest)
    pids = []
    try:
        leak = orphan(["sleep", "600"], env)
        other = orphan(["sleep", "600"], dict(os.environ, QSD_CSI_CTEST=tag + "x"))
        # ctest itself carries no tag; the tests it runs do.
        ctest = orphan([fake_ctest, "-c", "QSD_CSI_CTEST=%s sleep 600 & wait" % tag],
                       dict(os.environ))
        pids.append(ctest)
        busy = children(ctest)[0]
        pids.append(busy)
        mnt = os.path.join(gone_root, "kubelet", "mnt")
        os.makedirs(mnt)
        subprocess.run(["mount", "-t", "tmpfs", "none", mnt], check=True)

        r = run(tag, roots)
        assert r.returncode == 1, "a leak must fail the fixture (rc %d)" % r.returncode
        deadline = time.monotonic() + 10
        while alive(leak) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(leak), "tagged orphan still running"
        assert alive(other), "a process of another tag was killed"
        assert alive(busy), "a tagged process under a ctest was killed"
        with open("/proc/self/mountinfo") as f:
            assert mnt not in f.read(), "mount left"
        assert not os.path.exists(gone_root), "root of a gone test not removed"
        assert os.path.isdir(live_root), "root of a running test removed"
        assert os.path.isdir("/etc"), "a root outside /tmp was acted on"
        with open(roots) as f:
            kept = f.read()
        assert kept == "%d %s\n" % (os.getpid(), live_root), "roots file: %r" % kept

        r = run(tag, roots)
        assert r.returncode == 0 and "nothing left behind" in r.stdout, r.stdout
        assert alive(busy) and os.path.isdir(live_root)
        print("ok: leak found, killed, unmounted, removed; another run's process and root "
              "left alone; a clean run passes")
        return 0
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.run(["umount", "-R", "-l", gone_root], stderr=subprocess.DEVNULL)
        subprocess.run(["rm", "-rf", gone_root, live_root, roots])


if __name__ == "__main__":
    sys.exit(main())
