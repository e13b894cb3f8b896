#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""What a ctest run leaves behind: find it, stop it, fail if there was any.

Every test of a build tree runs with QSD_CSI_CTEST=<tag> in its environment
(tests/CMakeLists.txt, qsd_contain_tests()); the plugin, qsdctl and the QSDs
they start inherit it.  Tests also append their temporary roots to the file
named by QSD_CSI_CTEST_ROOTS (csilib.Env, tests/integration/lib.sh,
vhost_lib.sh, tests/launcher/e2e-lib.sh), so
that what does not inherit the environment (a QEMU started by libvirt) and
what is not a process (mounts, loop devices, directories) is found too.

Another ctest run in the same build tree may be running meanwhile: a
process that still has a ctest ancestor, and a root whose registering test
process is alive, belong to it and are left alone.

A test that passes cleans up after itself; one that ctest killed at its
timeout cannot, and the QSDs its plugin started outlive it by design.  This
runs as the cleanup fixture after all of a run's tests (and as the setup
fixture before them, for what an interrupted run left): it kills those
processes by PID, unmounts, detaches loop devices, removes the roots, and
exits 1 naming every process and mount it found, so a leak is a failure.

    strays.py setup|cleanup TAG ROOTS_FILE
"""
import os
import signal
import subprocess
import sys
import time


def pid_alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def read_roots(path):
    """(roots of tests that are gone, lines of tests still running).  Lines
    are "PID ROOT": the test process that made ROOT."""
    gone, live = set(), []
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return [], []
    for line in lines:
        pid, _, root = line.strip().partition(" ")
        if not pid.isdigit():
            continue
        if pid_alive(int(pid)):
            live.append(line)
        else:
            gone.add(root)
    # Only directories a test made under /tmp: never act on anything else,
    # whatever the file says.
    return sorted(r for r in gone
                  if r.startswith("/tmp/") and "/.." not in r and len(r) > len("/tmp/")), live


def parent_and_comm(pid):
    with open("/proc/%d/stat" % pid) as f:
        head, tail = f.read().rsplit(")", 1)
    return int(tail.split()[1]), head.split("(", 1)[1]


def ancestors():
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = parent_and_comm(pid)[0]
        except (OSError, ValueError, IndexError):
            break
    return pids


def under_ctest(pid):
    """Whether a ctest process is an ancestor of pid (a running test's)."""
    try:
        anc, _ = parent_and_comm(pid)
        while anc > 1:
            parent, comm = parent_and_comm(anc)
            if comm == "ctest":
                return True
            anc = parent
    except (OSError, ValueError, IndexError):
        pass
    return False


def matching_processes(tag, roots):
    marker = ("QSD_CSI_CTEST=%s" % tag).encode()
    needles = [r.encode() + b"/" for r in roots]
    mine = ancestors()
    found = {}
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) in mine:
            continue
        pid = int(d)
        try:
            with open("/proc/%d/stat" % pid) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmd = f.read()
            with open("/proc/%d/environ" % pid, "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, IndexError):
            continue
        if (marker in env or any(n in cmd for n in needles)) and not under_ctest(pid):
            found[pid] = cmd.replace(b"\0", b" ").decode(errors="replace")[:200]
    return found


def stop_processes(tag, roots):
    found = {}
    deadline = time.monotonic() + 15
    while True:
        now = matching_processes(tag, roots)
        if not now:
            return found
        found.update(now)
        if time.monotonic() > deadline:
            for pid, cmd in now.items():
                print("strays: pid %d did not die: %s" % (pid, cmd))
            return found
        for pid in now:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


def unescape(field):
    # mountinfo escapes space, tab, newline and backslash as \ooo
    out, i = "", 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out += chr(int(field[i + 1:i + 4], 8))
            i += 4
        else:
            out += field[i]
            i += 1
    return out


def mounts_under(roots):
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = unescape(line.split()[4])
            if any(mp == r or mp.startswith(r + "/") for r in roots):
                points.append(mp)
    return points


def unmount(roots):
    found = []
    for _ in range(50):
        points = mounts_under(roots)
        if not points:
            break
        found.extend(p for p in points if p not in found)
        for mp in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "-l", mp], stderr=subprocess.DEVNULL, timeout=30)
    return found


def detach_loops(roots):
    found = []
    try:
        names = os.listdir("/sys/block")
    except OSError:
        return found
    for n in names:
        if not n.startswith("loop"):
            continue
        try:
            with open("/sys/block/%s/loop/backing_file" % n) as f:
                backing = f.read().strip()
        except OSError:
            continue
        if any(backing.startswith(r + "/") for r in roots):
            found.append("/dev/%s (%s)" % (n, backing))
            subprocess.run(["losetup", "-d", "/dev/" + n], stderr=subprocess.DEVNULL, timeout=30)
    return found


def remove(roots):
    for r in roots:
        if os.path.lexists(r) and not mounts_under([r]):
            subprocess.run(["rm", "-rf", "--one-file-system", r], timeout=120)


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("setup", "cleanup"):
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    what, tag, roots_file = sys.argv[1:]
    roots, live = read_roots(roots_file)
    procs = stop_processes(tag, roots)
    mounts = unmount(roots)
    loops = detach_loops(roots)
    remove(roots)
    if live:
        with open(roots_file + ".new", "w") as f:
            f.write("".join(line + "\n" for line in live))
        os.rename(roots_file + ".new", roots_file)
    else:
        try:
            os.unlink(roots_file)
        except FileNotFoundError:
            pass
    for pid, cmd in sorted(procs.items()):
        print("strays: killed pid %d: %s" % (pid, cmd))
    for m in mounts:
        print("strays: unmounted %s" % m)
    for lo in loops:
        print("strays: detached %s" % lo)
    if not (procs or mounts or loops):
        print("strays: %s: nothing left behind (%d root(s) checked)" % (what, len(roots)))
        return 0
    print("strays: %s: %d process(es), %d mount(s), %d loop device(s) were left behind%s"
          % (what, len(procs), len(mounts), len(loops),
             "" if what == "cleanup" else " by an earlier, interrupted run"))
    return 1 if what == "cleanup" else 0

if __name__ == "__main__":
    sys.exit(main())
