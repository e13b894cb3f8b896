#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Bounded waits of the plugin, with real QSDs:

- a QSD frozen with SIGSTOP during NodeUnstageVolume: QMP quit is not
  answered, SIGKILL follows after the stop bound, the call answers OK within
  it; meanwhile Probe and another volume's NodeGetVolumeStats answer at once;
- a QSD that dies at once on every start: after a few quick restarts the
  volume is in a crash loop (volume condition abnormal, with the QSD's last
  words), retried every 30 s, not in a busy loop.

usage: test_csi_bounds.py PLUGIN PROTO_DIR [QSDCTL]
"""
import os
import shutil
import signal
import stat
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402
from csilib import mount_cap  # noqa: E402

MiB = 1 << 20
T = csilib.CALL_TIMEOUT


def main():
    env = csilib.Env(sys.argv[1], sys.argv[2], prefix="qsd-csi-bounds-")
    pb = env.pb
    cap = mount_cap(pb)
    # A qemu-storage-daemon that fails at once while $FAIL exists, and counts
    # its starts: lets the test break a running volume's QSD on purpose.
    real = shutil.which("qemu-storage-daemon")
    fail = os.path.join(env.root, "fail")
    starts = os.path.join(env.root, "starts")
    wrapper = os.path.join(env.root, "qsd-wrapper")
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\necho x >> %s\n"
                "if [ -e %s ]; then echo 'qsd-wrapper: failing on purpose' >&2; exit 1; fi\n"
                "exec %s \"$@\"\n" % (starts, fail, real))
    os.chmod(wrapper, stat.S_IRWXU)

    def stg(vid):
        p = os.path.join(env.kubelet, "plugins", "staging", vid)
        os.makedirs(p, exist_ok=True)
        return p

    try:
        # Unconfined QSDs (--qsd-uid-count 0): the wrapper counts starts and
        # looks for $FAIL in this test's root, which a confined QSD can
        # neither see (its mount namespace hides /tmp) nor execute (0700).
        # Confinement has tests of its own (security/qsd_confinement).
        c = env.start(["--qsd-binary", wrapper, "--qsd-uid-count", "0"])
        for vid in ("pvc-stop", "pvc-other", "pvc-loop"):
            c.CreateVolume(pb.CreateVolumeRequest(
                name=vid, capacity_range=pb.CapacityRange(required_bytes=32 * MiB),
                volume_capabilities=[cap]), timeout=T)
            c.NodeStageVolume(pb.NodeStageVolumeRequest(
                volume_id=vid, staging_target_path=stg(vid), volume_capability=cap), timeout=T)
        pids = env.qsd_pids()

        # 1. SIGSTOP during unstage.
        os.kill(pids["pvc-stop"], signal.SIGSTOP)
        slow = []
        stop = threading.Event()

        def others():
            while not stop.is_set():
                t0 = time.monotonic()
                c.Probe(pb.ProbeRequest(), timeout=5)
                c.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(
                    volume_id="pvc-other", volume_path=stg("pvc-other")), timeout=5)
                slow.append(time.monotonic() - t0)
                time.sleep(0.05)
        th = threading.Thread(target=others)
        th.start()
        t0 = time.monotonic()
        try:
            c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(
                volume_id="pvc-stop", staging_target_path=stg("pvc-stop")), timeout=30)
        finally:
            took = time.monotonic() - t0
            stop.set()
            th.join()
        assert not os.path.exists("/proc/%d" % pids["pvc-stop"]) or \
            open("/proc/%d/stat" % pids["pvc-stop"]).read().rsplit(")", 1)[1].split()[0] == "Z", \
            "the frozen QSD is still alive"
        assert took < 20, "unstage of a frozen QSD took %.1f s" % took
        assert len(slow) > 10 and max(slow) < 1.0, \
            "other calls during the frozen unstage: %d, slowest %.2f s" % (len(slow), max(slow))
        print("ok NodeUnstage of a SIGSTOPped QSD: OK in %.1f s (quit unanswered, SIGKILL); "
              "%d Probe+stats calls meanwhile, slowest %.0f ms" % (took, len(slow),
                                                                   1000 * max(slow)))

        # 2. Crash loop.
        open(fail, "w").close()
        n0 = len(open(starts).readlines())
        os.kill(pids["pvc-loop"], signal.SIGKILL)
        deadline = time.monotonic() + 20
        cond = None
        while time.monotonic() < deadline:
            s = c.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(
                volume_id="pvc-loop", volume_path=stg("pvc-loop")), timeout=T)
            cond = s.volume_condition
            if "crash loop" in cond.message:
                break
            time.sleep(0.2)
        assert cond and cond.abnormal and "crash loop" in cond.message and \
            "failing on purpose" in cond.message, "no crash-loop condition: %s" % cond
        n1 = len(open(starts).readlines())
        time.sleep(5)
        n2 = len(open(starts).readlines())
        assert n2 == n1, "still restarting in a loop: %d starts in 5 s" % (n2 - n1)
        assert n1 - n0 <= 6, "%d starts before the crash loop" % (n1 - n0)
        log = env.log_tail(400)
        assert "crash loop" in log, "no crash-loop line in the plugin's log"
        print("ok a QSD dying at every start: crash loop after %d starts (condition: %s), "
              "none in the next 5 s" % (n1 - n0, cond.message[:120]))
        os.unlink(fail)
        c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(
            volume_id="pvc-loop", staging_target_path=stg("pvc-loop")), timeout=T)
        c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(
            volume_id="pvc-other", staging_target_path=stg("pvc-other")), timeout=T)
        assert not env.running_qsds(), env.running_qsds()
        print("PASS")
    except Exception:
        print("---- plugin log (tail)\n" + env.log_tail(80))
        raise
    finally:
        for pid in env.running_qsds():
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        env.cleanup()


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
