#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""A QSD that stops serving is killed and restarted (issue 21 item 3).

Two staged and published volumes, the plugin probing every second
(--metrics-interval 1).  pvc-hung's QSD is stopped with SIGSTOP (what a
tenant's SET_MEM_TABLE with 2^32-1 regions does to QSD 10.0.2: alive, serving
nothing); pvc-busy's QSD meanwhile serves a vhost-user client writing and
reading at full speed.  Asserted:
  - pvc-hung's QSD is killed (the stopped pid is gone) and a new one serves
    within BOUND_S, through the published socket;
  - the kill is counted (qsd_csi_volume_qsd_hung_kills_total 1, restarts 1)
    and the reason is in the volume's condition and the plugin log;
  - pvc-busy's QSD, loaded but healthy, is never killed (same pid, no kill
    counted) and its client finished without error.

The bound: a probe waits 3 s (VOLSTATS_PROBE_TIMEOUT_MS), one per round
(1 s here), 3 unanswered in a row kill: at most 3 x (3 + 1) = 12 s from the
stop to the kill, plus the restart (tens of ms); 25 s leaves room for a
loaded machine.  A healthy QSD answers a probe in milliseconds, also under
full load (qsd_csi_volume_qmp_probe_seconds), 3 s is far above that.

usage: test_csi_hung.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402
from csilib import mount_cap  # noqa: E402

MiB = 1 << 20
BOUND_S = 25.0


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def metric(port, name, vol):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as r:
        text = r.read().decode()
    # volume_id first, then the volume's other labels (docs/observability.md).
    want = re.compile(r'%s\{volume_id="%s"(,[^}]*)?\} (\S+)$' % (re.escape(name), re.escape(vol)))
    for line in text.splitlines():
        m = want.match(line)
        if m:
            return float(m.group(2))
    raise AssertionError("no %s for %s in /metrics" % (name, vol))


def connects(qsdctl, target):
    r = subprocess.run([qsdctl, "vhost-info", "--json", "--timeout-ms", "5000", "./vhost.sock"],
                       cwd=target, capture_output=True, text=True, timeout=30)
    return r.returncode == 0


def state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def main():
    qsdctl = sys.argv[3]
    env = csilib.Env(sys.argv[1], sys.argv[2])
    stopped = []
    try:
        run(env, qsdctl, stopped)
    finally:
        for pid in stopped:  # never leave a stopped QSD behind (cleanup kills it)
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        if sys.exc_info()[0] is not None:
            print("---- plugin log (tail)\n" + env.log_tail(80))
        env.cleanup()


def stats_message(env, c, vol, stg):
    r = c.NodeGetVolumeStats(env.pb.NodeGetVolumeStatsRequest(volume_id=vol, volume_path=stg),
                             timeout=csilib.CALL_TIMEOUT)
    return r.volume_condition.abnormal, r.volume_condition.message


def run(env, qsdctl, stopped):
    port = free_port()
    c = env.start(["--http-endpoint", "127.0.0.1:%d" % port, "--metrics-interval", "1"])
    pb = env.pb
    T = csilib.CALL_TIMEOUT
    cap = mount_cap(pb)
    stg, tgt = {}, {}
    for v in ("pvc-hung", "pvc-busy"):
        c.CreateVolume(pb.CreateVolumeRequest(
            name=v, capacity_range=pb.CapacityRange(required_bytes=64 * MiB),
            volume_capabilities=[cap], parameters={"format": "raw"}), timeout=T)
        stg[v] = os.path.join(env.kubelet, "staging", v)
        os.makedirs(stg[v])
        c.NodeStageVolume(pb.NodeStageVolumeRequest(volume_id=v, staging_target_path=stg[v],
                                                    volume_capability=cap), timeout=T)
        tgt[v] = os.path.join(env.kubelet, "pods", v, "mount")
        os.makedirs(os.path.dirname(tgt[v]))
        c.NodePublishVolume(pb.NodePublishVolumeRequest(
            volume_id=v, staging_target_path=stg[v], target_path=tgt[v],
            volume_capability=cap), timeout=T)
    pids = env.qsd_pids()
    victim, busy = pids["pvc-hung"], pids["pvc-busy"]

    # Load on pvc-busy for longer than the whole hang scenario.
    load = subprocess.Popen(
        [qsdctl, "bench", "--json", "--runtime-ms", str(int(BOUND_S * 1000)),
         "--ramp-ms", "0", "--tests", "randwrite-4k-qd32",
         os.path.join(tgt["pvc-busy"], "vhost.sock")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3)  # a few healthy probes of both under load
        assert load.poll() is None, "the load ended early: " + load.stderr.read()[-500:]

        frozen = csilib.qsd_process(victim)
        os.kill(frozen, signal.SIGSTOP)
        stopped.append(frozen)
        t0 = time.monotonic()
        while True:
            new = env.qsd_pids().get("pvc-hung")
            if state(victim) is None and new and new != victim and state(new) in ("S", "R"):
                break
            assert time.monotonic() - t0 < BOUND_S, \
                "hung QSD %d not killed and restarted within %.0f s (state %s)" % (
                    victim, BOUND_S, state(victim))
            time.sleep(0.1)
        took = time.monotonic() - t0
        stopped.remove(frozen)
        print("hung QSD killed and restarted after %.1f s" % took)
        assert took >= 3.0, "killed after %.1f s: before a single probe could time out" % took

        # It serves again through the published socket.
        deadline = time.monotonic() + 15
        while not connects(qsdctl, tgt["pvc-hung"]):
            assert time.monotonic() < deadline, "restarted QSD does not serve the target"
            time.sleep(0.2)
        deadline = time.monotonic() + 10
        while True:
            abnormal, msg = stats_message(env, c, "pvc-hung", stg["pvc-hung"])
            if not abnormal and "killed as hung 1 times" in msg:
                break
            assert time.monotonic() < deadline, "condition: %s %s" % (abnormal, msg)
            time.sleep(0.2)
        assert "did not" in msg or "accepts no connection" in msg, msg
        print("condition:", msg)
        assert metric(port, "qsd_csi_volume_qsd_hung_kills_total", "pvc-hung") == 1
        assert metric(port, "qsd_csi_volume_qsd_restarts_total", "pvc-hung") == 1

        out, err = load.communicate(timeout=BOUND_S + 60)
        assert load.returncode == 0, "load failed: " + err[-800:]
    finally:
        if load.poll() is None:
            load.kill()
            load.wait()
    # The loaded QSD was never taken for hung.
    assert env.qsd_pids()["pvc-busy"] == busy and state(busy) in ("S", "R"), "busy QSD restarted"
    assert metric(port, "qsd_csi_volume_qsd_hung_kills_total", "pvc-busy") == 0
    assert metric(port, "qsd_csi_volume_qsd_restarts_total", "pvc-busy") == 0
    with open(os.path.join(env.root, "plugin.log")) as f:
        log = f.read()
    assert log.count("QSD hung: killed") == 1, "expected one kill in the log"
    assert "killed by the plugin, hung" in log
    assert env.stop() == 0, "the plugin did not exit cleanly (a sanitizer report?)"
    print("OK")


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
