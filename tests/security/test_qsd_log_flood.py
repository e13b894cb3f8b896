#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 9, G: filling the host's /run without writing a file.

A tenant may connect to its own vhost-user socket (through its read-only
target) as often as it likes.  Each connection that sends a malformed
vhost-user message makes the QSD print an error line (55-120 bytes: "vu_panic:
Unhandled request", "too big message request ...") to its stderr, which the
plugin keeps under the run directory (tmpfs /run on a node).  At a few
hundred KiB/s from one process, a tenant fills /run, and then every other
volume's staging fails with ENOSPC: the very outcome issue 9 names.

Expected: while the tenant does this until the bytes its QSD would have
logged pass 3 MiB (at most 30 s), the run directory grows by at most 2 MiB
(the documented 1 MiB log cap, plus slack); Probe answers within 1 s; the
volume still works for its rightful user.  The same flood while the plugin
is down (kill -9; its QSDs live on) may grow the log, but after the plugin
starts again the run dir is back within 2 MiB of where it was (polled, for at
most 30 s: the time it took is printed, a loaded machine may be slow).

usage: test_qsd_log_flood.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seclib  # noqa: E402
from seclib import MiB  # noqa: E402

VID = "pvc-noisy"
ROUND = 6          # seconds per attacker run
LIMIT = 30         # seconds in all, at most
ALLOWED = 2 * MiB  # run dir growth allowed (the documented 1 MiB log cap, plus slack)
ENOUGH = 3 * MiB   # what the QSD would have logged by then, at >= 100 bytes a message
CUT_BOUND = 30     # seconds after a start by which a grown log must be cut (a bound, not a figure)

ATTACKER = r"""
import os, socket, struct, sys, time
end = time.monotonic() + float(sys.argv[1])
msgs = [struct.pack("<III", 1, 1, 0xffffffff), b"\xff" * 12]   # >= 100 bytes of log each
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
print(n, flush=True)
"""


def run(s):
    s.create(VID, 16 * MiB)
    s.stage(VID)
    tgt = s.publish(VID, "noisy-pod")
    assert s.works("setup", VID, tgt)
    before = seclib.run_usage(s.run)
    t0 = time.monotonic()
    conns, grew = 0, 0
    # Rounds until the QSD would have logged ENOUGH (a capped log stays small),
    # the run dir grew past ALLOWED (not capped), or LIMIT (a very slow machine).
    while conns * 100 < ENOUGH and grew <= ALLOWED and time.monotonic() - t0 < LIMIT:
        att = subprocess.Popen([sys.executable, "-c", ATTACKER, str(ROUND)], cwd=tgt,
                               stdout=subprocess.PIPE, text=True)
        s.helpers.append(att)
        while att.poll() is None:
            time.sleep(0.25)
            grew = seclib.run_usage(s.run) - before
            if grew > ALLOWED + MiB:
                att.kill()
        out = att.communicate(timeout=10)[0].strip()
        conns += int(out) if out.isdigit() else 0
        grew = seclib.run_usage(s.run) - before
    dt = time.monotonic() - t0
    print("attack %-58s -> %d connections in %.1f s; the run dir grew by %d KiB" % (
        "G: malformed vhost-user messages through the target", conns, dt, grew // 1024))
    s.check(grew <= ALLOWED, "G: a tenant's vhost-user client grew the run directory by %d KiB "
            "in %.0f s (allowed %d KiB): the QSD's log is not bounded while it runs" % (
                grew // 1024, dt, ALLOWED // 1024))
    if grew <= ALLOWED and conns * 100 < ENOUGH:
        print("       (inconclusive: only %d connections in %.0f s on this machine)" % (
            conns, dt))
    s.after("G: QSD log flood")
    s.works("G: after the log flood", VID, tgt)

    # ---- the same while no plugin runs (killed; its QSDs live on), then a start
    s.env.stop(9)
    before = seclib.run_usage(s.run)
    t0 = time.monotonic()
    grew = 0
    att = subprocess.Popen([sys.executable, "-c", ATTACKER, "20"], cwd=tgt,
                           stdout=subprocess.PIPE, text=True)
    s.helpers.append(att)
    while att.poll() is None and grew < 3 * MiB:
        time.sleep(0.25)
        grew = seclib.run_usage(s.run) - before
    att.kill()
    att.communicate(timeout=10)
    print("attack %-58s -> the run dir grew by %d KiB in %.1f s" % (
        "G: the same while the plugin is down", grew // 1024, time.monotonic() - t0))
    s.start()
    t0 = time.monotonic()
    while True:
        grew = seclib.run_usage(s.run) - before
        if grew <= ALLOWED or time.monotonic() - t0 > CUT_BOUND:
            break
        time.sleep(0.1)
    print("attack %-58s -> %d KiB above the start, %.1f s after the plugin started" % (
        "G: ... then the plugin starts", grew // 1024, time.monotonic() - t0))
    s.check(grew <= ALLOWED, "G: %.0f s after a start the run dir is still %d KiB above what it "
            "was before the flood (allowed %d KiB): a log grown while no plugin ran is not "
            "cut at start" % (CUT_BOUND, grew // 1024, ALLOWED // 1024))
    s.after("G: QSD log flood while the plugin was down")
    s.works("G: after the flood while the plugin was down", VID, tgt)
    s.unpublish(VID, tgt)
    s.unstage(VID)


if __name__ == "__main__":
    sys.exit(seclib.run_test(run, "qsd-sec-log-"))
