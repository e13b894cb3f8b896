#!/usr/bin/python3
"""tests/strays.py, the ctest/strays fixture, on a planted leak: a process
carrying its own tag, a tmpfs mounted under a registered root.  The fixture
must kill the process, unmount, remove the root and fail; run again, it must
find nothing and pass.  A process with another tag must survive."""
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STRAYS = os.path.join(HERE, "..", "strays.py")


def alive(p):
    return p.poll() is None


def main():
    if os.geteuid() != 0:
        print("skip: needs root (mounts a tmpfs)")
        return 77
    tag = "selftest%d" % os.getpid()
    root = tempfile.mkdtemp(prefix="qsd-strays-test-", dir="/tmp")
    roots = os.path.join(root + ".roots")
    with open(roots, "w") as f:
        f.write(root + "\n/etc\n../tmp\n")  # the last two must be ignored
    env = dict(os.environ, QSD_CSI_CTEST=tag)
    other = dict(os.environ, QSD_CSI_CTEST=tag + "x")
    leak = subprocess.Popen(["sleep", "600"], env=env)
    keep = subprocess.Popen(["sleep", "600"], env=other)
    mnt = os.path.join(root, "kubelet", "mnt")
    os.makedirs(mnt)
    subprocess.run(["mount", "-t", "tmpfs", "none", mnt], check=True)
    try:
        r = subprocess.run([sys.executable, STRAYS, "cleanup", tag, roots],
                           capture_output=True, text=True, timeout=120)
        print(r.stdout, end="")
        assert r.returncode == 1, "a leak must fail the fixture (rc %d)" % r.returncode
        deadline = time.monotonic() + 10
        while alive(leak) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(leak), "tagged process still running"
        assert alive(keep), "a process of another tag was killed"
        with open("/proc/self/mountinfo") as f:
            assert mnt not in f.read(), "mount left"
        assert not os.path.exists(root), "root not removed"
        assert os.path.isdir("/etc"), "a root outside /tmp was acted on"
        assert not os.path.exists(roots), "roots file not consumed"
        r = subprocess.run([sys.executable, STRAYS, "cleanup", tag, roots],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "nothing left behind" in r.stdout, r.stdout
        print("ok: leak found, killed, unmounted, removed; clean run passes")
        return 0
    finally:
        for p in (leak, keep):
            if alive(p):
                p.kill()
            p.wait()
        subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL)
        subprocess.run(["rm", "-rf", root, roots])


if __name__ == "__main__":
    sys.exit(main())
