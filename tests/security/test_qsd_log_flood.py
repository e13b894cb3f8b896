#!/usr/bin/python3
"""Issue 9, G: filling the host's /run without writing a file.

A tenant may connect to its own vhost-user socket (through its read-only
target) as often as it likes.  Each connection that sends a malformed
vhost-user message makes the QSD print an error line (55-120 bytes: "vu_panic:
Unhandled request", "too big message request ...") to its stderr, which the
plugin keeps under the run directory (tmpfs /run on a node).  At a few
hundred KiB/s from one process, a tenant fills /run, and then every other
volume's staging fails with ENOSPC: the very outcome issue 9 names.

Expected: while the tenant does this for up to 12 s (and until the bytes its
QSD would have logged pass 4 MiB), the run directory grows by at most 2 MiB
(the documented 1 MiB log cap, plus slack); Probe answers within 1 s; the
volume still works for its rightful user.

usage: test_qsd_log_flood.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import os
import stat
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seclib  # noqa: E402
from seclib import MiB  # noqa: E402

VID = "pvc-noisy"
SECONDS = 12
ALLOWED = 2 * MiB
STOP_AT = 3 * MiB

ATTACKER = r"""
import os, socket, struct, sys, time
end = time.monotonic() + float(sys.argv[1])
msgs = [struct.pack("<III", 9999, 1, 0), struct.pack("<III", 1, 1, 0xffffffff),
        b"\xff" * 12]
n = 0
while time.monotonic() < end:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect("./vhost.sock")
        s.send(msgs[n % len(msgs)])
    except OSError:
        pass
    s.close()
    n += 1
print(n)
"""


def run_usage(d):
    total = 0
    for dirpath, dirnames, filenames in os.walk(d):
        for n in filenames:
            try:
                st = os.lstat(os.path.join(dirpath, n))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_blocks * 512
    return total


def run(s):
    s.create(VID, 16 * MiB)
    s.stage(VID)
    tgt = s.publish(VID, "noisy-pod")
    assert s.works("setup", VID, tgt)
    before = run_usage(s.run)
    att = subprocess.Popen([sys.executable, "-c", ATTACKER, str(SECONDS)], cwd=tgt,
                           stdout=subprocess.PIPE, text=True)
    s.helpers.append(att)
    t0 = time.monotonic()
    grew = 0
    while att.poll() is None:
        time.sleep(0.25)
        grew = run_usage(s.run) - before
        if grew > STOP_AT:
            att.kill()
            break
    out = att.communicate(timeout=10)[0].strip()
    grew = run_usage(s.run) - before
    print("attack %-58s -> %s connections in %.1f s; the run dir grew by %d KiB" % (
        "G: malformed vhost-user messages through the target", out or "(killed)",
        time.monotonic() - t0, grew // 1024))
    s.check(grew <= ALLOWED, "G: a tenant's vhost-user client grew the run directory by %d KiB "
            "in %.0f s (allowed %d KiB): the QSD's log is not bounded while it runs" % (
                grew // 1024, time.monotonic() - t0, ALLOWED // 1024))
    s.after("G: QSD log flood")
    s.works("G: after the log flood", VID, tgt)
    s.unpublish(VID, tgt)
    s.unstage(VID)


if __name__ == "__main__":
    sys.exit(seclib.run_test(run, "qsd-sec-log-"))
