#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""RBD volumes across nodes (docs/rbd.md, "What happens on node loss"),
against a real single-node Ceph (cephlib.py) whose OSD drops a dead
client's watch after WATCH_TIMEOUT s, with two plugin instances (node-1,
node-2) on this machine as two nodes.

Scenario "loss":
  - node-2 cannot stage a volume node-1 serves: FAILED_PRECONDITION naming
    the lock holder (client.N at ADDR);
  - node loss: plugin 1 is killed (SIGKILL), the QSD of volume a is killed
    too, the QSD of volume b is frozen (SIGSTOP: a node cut off, not dead).
    node-2's NodeStage is refused while their watches live, then (once Ceph
    expired them) succeeds: the old holders are blocklisted, their locks
    broken; the data written on node-1 reads back on node-2 (vhost-user
    client), node-2 writes;
  - the frozen QSD resumed (SIGCONT) cannot write (blocklisted: I/O error),
    and node-2's data is intact;
  - two nodes staging one volume at the same moment: never both succeed
    (the check once each QSD runs), at most one QSD is left serving it.

Scenario "qsd":
  - kill -9 of an RBD volume's QSD: the plugin restarts it, the data reads
    back, and the restarted QSD gets the image's lock (its write waits until
    Ceph expired the dead QSD's watch; librbd then blocklists it); the same
    for a hung QSD (SIGSTOP: killed after 3 unanswered monitor probes, then
    restarted through the lock check; its guest writes at once, before the
    check once the new QSD runs, which must keep it serving), and with
    plugin and QSD killed at once (the next plugin, same node id);
  - a read-only staging and publication: reads back, writes fail;
  - a wrong key in the node-stage secret: UNAUTHENTICATED before any QSD
    starts, bounded.

usage: test_rbd_node.py loss|qsd PLUGIN_BINARY PROTO_DIR QSDCTL
~45 s each (of which ~11 s Ceph start and ~WATCH_TIMEOUT s waiting for it
to expire a dead client's watch)."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "csi"))
import cephlib  # noqa: E402
import csilib  # noqa: E402
import test_csi_metrics as metrics  # noqa: E402
from csilib import expect_code, mount_cap  # noqa: E402

import grpc  # noqa: E402

MiB = 1 << 20
SIZE = 64 * MiB
C = grpc.StatusCode
WATCH_TIMEOUT = 10      # osd_client_watch_timeout of the test cluster (30 s by default)
RETRY_BOUND = 60        # a stage refused for a dead holder succeeds within this
ROUNDS = 2              # concurrent stages of one volume on two nodes


class Node:
    """One plugin instance (a node) with its own root and node id."""

    def __init__(self, plugin, proto, name, clusters):
        self.env = csilib.Env(plugin, proto, prefix="qsd-rbd-%s-" % name)
        self.env.node = name
        self.clusters = clusters
        self.c = None

    def start(self, extra=()):
        self.c = self.env.start(extra=["--rbd-clusters", self.clusters, *extra])
        return self.c

    def paths(self, vol):
        k = self.env.kubelet
        stg = os.path.join(k, "plugins/kubernetes.io/csi/test.qsd-csi.dev/%s/globalmount" % vol)
        tgt = os.path.join(k, "pods/p-%s/volumes/kubernetes.io~csi/%s/mount" % (vol, vol))
        os.makedirs(stg, exist_ok=True)
        os.makedirs(os.path.dirname(tgt), exist_ok=True)
        return stg, tgt

    def stage_req(self, vid, vol, secrets, cap=None):
        pb = self.env.pb
        stg, _ = self.paths(vol)
        return pb.NodeStageVolumeRequest(volume_id=vid, staging_target_path=stg,
                                         volume_capability=cap or mount_cap(pb), secrets=secrets)

    def publish(self, vid, vol, cap=None, ro=False):
        pb = self.env.pb
        stg, tgt = self.paths(vol)
        self.c.NodePublishVolume(pb.NodePublishVolumeRequest(
            volume_id=vid, staging_target_path=stg, target_path=tgt, readonly=ro,
            volume_capability=cap or mount_cap(pb)), timeout=csilib.CALL_TIMEOUT)
        return os.path.join(tgt, "vhost.sock")

    def unstage(self, vid, vol):
        pb = self.env.pb
        stg, tgt = self.paths(vol)
        self.c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=vid, target_path=tgt),
                                   timeout=csilib.CALL_TIMEOUT)
        self.c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id=vid, staging_target_path=stg),
                                 timeout=csilib.CALL_TIMEOUT)

    def log(self):
        with open(os.path.join(self.env.root, "plugin.log")) as f:
            return f.read()


def verify(qsdctl, sock, seed, write=False, check=True, timeout_ms=20000):
    """qsdctl verify: write the pattern of seed (write) or check it."""
    r = subprocess.run([qsdctl, "verify", "--timeout-ms", str(timeout_ms), "--size", str(SIZE),
                        "--write" if write else "--check", "--seed", str(seed), sock],
                       capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError("qsdctl verify %s seed %d on %s: exit %d: %s" % (
            "--write" if write else "--check", seed, sock, r.returncode, r.stderr.strip()))
    return r


def lockers(ceph, image):
    return json.loads(ceph.rbd("lock", "ls", "--format", "json",
                               "%s/%s/%s" % (ceph.pool, ceph.namespace, image)))


def blocklist(ceph):
    return ceph.ceph("osd", "blocklist", "ls")


def stage_until(node, req, what, code=C.FAILED_PRECONDITION):
    """NodeStage, retried while refused with code (or one of a tuple of
    codes; as kubelet retries), bounded: the refusals' messages and the
    time it took."""
    codes = code if isinstance(code, tuple) else (code,)
    t0 = time.monotonic()
    refusals = []
    while True:
        try:
            node.c.NodeStageVolume(req, timeout=csilib.CALL_TIMEOUT)
            return refusals, time.monotonic() - t0
        except grpc.RpcError as e:
            if e.code() not in codes or time.monotonic() - t0 > RETRY_BOUND:
                raise AssertionError("%s: %s %s after %.0f s" % (what, e.code(), e.details(),
                                                                 time.monotonic() - t0))
            refusals.append(e.details())
            time.sleep(1)


def wait_checked(node, n, rec, pid):
    """The check once a restarted QSD runs passed (the n-th "QSD serves
    after the check" of node's log), bounded, and left QSD pid serving:
    never "restart refused" (the guest wrote before that check)."""
    t0 = time.monotonic()
    while True:
        log = node.log()
        assert "restart refused" not in log, log[-4000:]
        if log.count("QSD serves after the check") >= n:
            break
        assert time.monotonic() - t0 < RETRY_BOUND, "no verdict of the check: %s" % log[-3000:]
        time.sleep(0.1)
    assert node.env.qsd_pids().get(rec) == pid, (pid, node.env.qsd_pids(), log[-3000:])


def create(node, ceph, name, secrets):
    pb = node.env.pb
    params = {"backend": "rbd", "clusterID": "c1", "pool": ceph.pool,
              "radosNamespace": ceph.namespace}
    vol = node.c.CreateVolume(pb.CreateVolumeRequest(
        name=name, capacity_range=pb.CapacityRange(required_bytes=SIZE),
        volume_capabilities=[mount_cap(pb)], parameters=params, secrets=secrets),
        timeout=csilib.CALL_TIMEOUT).volume
    return vol.volume_id


def scenario_loss(plugin, proto, qsdctl, ceph, clusters, secrets, nodes):
    n1 = Node(plugin, proto, "node-1", clusters)
    nodes.append(n1)
    n1.start()
    n2 = Node(plugin, proto, "node-2", clusters)
    nodes.append(n2)
    n2.start()
    vids = {v: create(n1, ceph, v, secrets) for v in ("a", "b")}
    socks1 = {}
    for v, vid in vids.items():
        n1.c.NodeStageVolume(n1.stage_req(vid, v, secrets), timeout=csilib.CALL_TIMEOUT)
        socks1[v] = n1.publish(vid, v)
        verify(qsdctl, socks1[v], 1, write=True)
    holders = {v: lockers(ceph, v) for v in vids}
    for v in vids:
        assert len(holders[v]) == 1, holders  # node-1's QSD holds the lock
    # node-2 is refused while node-1 serves, naming the holder.
    m = expect_code(n2.c.NodeStageVolume, n2.stage_req(vids["a"], "a", secrets),
                    C.FAILED_PRECONDITION, "stage on node-2 while node-1 serves")
    assert holders["a"][0]["locker"] in m and holders["a"][0]["address"] in m and "alive" in m, m
    assert not n2.env.running_qsds(), n2.env.running_qsds()

    # Node loss: plugin 1 dies, QSD of a is killed, QSD of b frozen.
    qsds = {vol: pid for pid, vol in n1.env.running_qsds().items()}
    pid_a, pid_b = qsds[vids["a"].replace(":", "_")], qsds[vids["b"].replace(":", "_")]
    n1.env.stop(signal.SIGKILL)
    os.kill(pid_a, signal.SIGKILL)
    qsd_b = csilib.qsd_process(pid_b)  # the QSD, not its filter head: its watch must lapse
    os.kill(qsd_b, signal.SIGSTOP)
    socks2 = {}
    for v, vid in vids.items():
        refusals, took = stage_until(n2, n2.stage_req(vid, v, secrets), "stage %s on node-2" % v)
        print("volume %s staged on node-2 after %.1f s, %d refusals (watch timeout %d s)" %
              (v, took, len(refusals), WATCH_TIMEOUT))
        for m in refusals:
            assert "in use" in m, m
        socks2[v] = n2.publish(vid, v)
        verify(qsdctl, socks2[v], 1)                 # node-1's data
        verify(qsdctl, socks2[v], 2, write=True)     # node-2 writes
        now = lockers(ceph, v)
        assert len(now) == 1 and now[0]["address"] != holders[v][0]["address"], (holders, now)
    # Refused at least once for a (its watch outlived the first try), then
    # the dead holders were fenced: blocklisted, logged.
    bl = blocklist(ceph)
    for v in vids:
        assert holders[v][0]["address"] in bl, (holders[v], bl)
    log2 = n2.log()
    assert log2.count("dead client fenced") >= 2, log2[-3000:]
    # The frozen QSD comes back: it cannot write any more.
    os.kill(qsd_b, signal.SIGCONT)
    r = verify(qsdctl, socks1["b"], 3, write=True, check=False, timeout_ms=10000)
    assert r.returncode != 0, "a fenced QSD wrote: %s" % r.stderr
    print("resumed QSD refused: %s" % r.stderr.strip().splitlines()[-1])
    verify(qsdctl, socks2["b"], 2)                   # node-2's data intact
    os.kill(pid_b, signal.SIGKILL)

    # Plugin 1 comes back (same node id and state) while node-2 serves a and
    # b: their QSDs on node-1 are dead; restarting them would give the old
    # VM a new, unfenced client, to which node-2's QSD would hand the lock.
    # The check refuses: no QSD, the condition names node-2's QSD, the
    # metrics say "refused"; no automatic retry (node-2's QSD holds the lock).
    port = cephlib._free_port()
    n1.start(["--http-endpoint", "127.0.0.1:%d" % port, "--metrics-interval", "1"])
    pb = n1.env.pb
    holders2 = {v: lockers(ceph, v)[0] for v in vids}
    t0 = time.monotonic()
    for v, vid in vids.items():
        _, tgt = n1.paths(v)
        while True:
            st = n1.c.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(
                volume_id=vid, volume_path=tgt), timeout=csilib.CALL_TIMEOUT)
            m = st.volume_condition.message
            if "not served" in m:
                break
            assert time.monotonic() - t0 < RETRY_BOUND, "no refusal on node-1: %s" % m
            time.sleep(0.2)
        print("node-1 after its restart, volume %s: %s" % (v, m))
        assert st.volume_condition.abnormal, st
        assert holders2[v]["locker"] in m and holders2[v]["address"] in m, (holders2[v], m)
        assert "took it over" in m, m  # not retried by itself (its guest's view is stale)
        # A NodeStage retry does not serve it either; it says why.
        try:
            n1.c.NodeStageVolume(n1.stage_req(vid, v, secrets), timeout=csilib.CALL_TIMEOUT)
            raise AssertionError("node-1 staged %s again while node-2 serves it" % v)
        except grpc.RpcError as e:
            assert e.code() in (C.FAILED_PRECONDITION, C.ABORTED), (e.code(), e.details())
            assert "not served" in e.details() or "in progress" in e.details(), e.details()
    assert not n1.env.running_qsds(), n1.env.running_qsds()
    assert n1.log().count("restart refused") >= 2, n1.log()[-3000:]
    samples, _ = metrics.scrape(port)
    for v, vid in vids.items():
        rec = vid.replace(":", "_")  # the node's record of it
        st = {x: metrics.value(samples, "qsd_csi_volume_qsd_state", volume_id=rec, state=x)
              for x in ("running", "restarting", "refused")}
        assert st == {"running": 0, "restarting": 0, "refused": 1}, (vid, st)
        # The PV's handle is the rbd: id; no PVC known on the node (empty).
        assert metrics.value(samples, "qsd_csi_volume_qsd_state", volume_id=rec,
                             volume_handle=vid, namespace="", persistentvolumeclaim="",
                             state="refused") == 1, vid
    for v in vids:
        verify(qsdctl, socks2[v], 2)                 # node-2's data intact
        verify(qsdctl, socks2[v], 4, write=True)     # and node-2 writes
        verify(qsdctl, socks2[v], 4)
        assert lockers(ceph, v) == [holders2[v]], (holders2[v], lockers(ceph, v))
    # kubelet on node-1 unstages them (their pods run on node-2): done
    # (ABORTED while a retry's check runs); a stage is a first one again.
    for v, vid in vids.items():
        t0 = time.monotonic()
        while True:
            try:
                n1.unstage(vid, v)
                break
            except grpc.RpcError as e:
                assert e.code() == C.ABORTED and time.monotonic() - t0 < 30, (e.code(),
                                                                             e.details())
                time.sleep(0.2)
        m = expect_code(n1.c.NodeStageVolume, n1.stage_req(vid, v, secrets),
                        C.FAILED_PRECONDITION, "first stage on node-1 while node-2 serves")
        assert "in use" in m and "not served" not in m, m
    assert not n1.env.running_qsds(), n1.env.running_qsds()

    # Two nodes staging one volume at the same moment: never both.  Each
    # round both plugins stage it at once; whoever wins unstages it again.
    vid = create(n1, ceph, "c", secrets)
    rec = vid.replace(":", "_")
    late = 0  # refusals by the second check, once the QSD ran
    for rnd in range(ROUNDS):
        results = {}

        def go(node):
            try:
                node.c.NodeStageVolume(node.stage_req(vid, "c", secrets),
                                       timeout=csilib.CALL_TIMEOUT)
                results[node] = "OK"
            except grpc.RpcError as e:
                results[node] = "%s %s" % (e.code(), e.details())
        threads = [threading.Thread(target=go, args=(n,)) for n in (n1, n2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        ok = [n for n, r in results.items() if r == "OK"]
        print("round %d: %s" % (rnd, {n.env.node: r[:90] for n, r in results.items()}))
        assert len(results) == 2 and len(ok) <= 1, results
        for r in results.values():
            assert r == "OK" or "FAILED_PRECONDITION" in r, results
        serving = [n for n in (n1, n2) if rec in n.env.running_qsds().values()]
        assert serving == ok, ([n.env.node for n in serving], results)
        for n in ok:
            n.unstage(vid, "c")
    for n in (n1, n2):
        late += n.log().count("stage refused after the QSD started")
    print("concurrent stages refused by the check once their QSD ran: %d of %d rounds" %
          (late, ROUNDS))
    # Both passed the first check (before either QSD ran) in every round
    # seen so far: the window is real, and the second check closed it.
    assert late >= 1, "the second check never decided: %d rounds" % ROUNDS


def scenario_qsd(plugin, proto, qsdctl, ceph, clusters, secrets, nodes):
    n1 = Node(plugin, proto, "node-1", clusters)
    nodes.append(n1)
    n1.start(["--metrics-interval", "1"])  # probes every second (the hung QSD below)
    pb = n1.env.pb
    vid = create(n1, ceph, "q", secrets)
    n1.c.NodeStageVolume(n1.stage_req(vid, "q", secrets), timeout=csilib.CALL_TIMEOUT)
    sock = n1.publish(vid, "q")
    verify(qsdctl, sock, 1, write=True)
    old = lockers(ceph, "q")
    assert len(old) == 1, old
    # kill -9 of the QSD: the plugin restarts it (supervision).
    rec = vid.replace(":", "_")
    pid = n1.env.qsd_pids()[rec]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    _, tgt = n1.paths("q")
    while True:  # restarted and serving again (as test_csi_conformance.py waits)
        st = n1.c.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(volume_id=vid, volume_path=tgt),
                                     timeout=csilib.CALL_TIMEOUT)
        if n1.env.qsd_pids().get(rec) not in (None, pid) and not st.volume_condition.abnormal:
            break
        assert time.monotonic() < deadline, "the QSD was not restarted: %s" % n1.log()[-2000:]
        time.sleep(0.1)
    verify(qsdctl, sock, 1, timeout_ms=30000)        # the data, through the new QSD
    t0 = time.monotonic()
    verify(qsdctl, sock, 2, write=True, timeout_ms=60000)
    print("restarted QSD wrote after %.1f s (watch timeout %d s)" % (time.monotonic() - t0,
                                                                     WATCH_TIMEOUT))
    new = lockers(ceph, "q")
    assert len(new) == 1 and new[0]["address"] != old[0]["address"], (old, new,
                                                                       n1.log()[-4000:])
    assert old[0]["address"] in blocklist(ceph), "the dead QSD was not blocklisted"
    wait_checked(n1, 1, rec, n1.env.qsd_pids()[rec])
    assert lockers(ceph, "q") == new, (new, lockers(ceph, "q"))
    verify(qsdctl, sock, 2)
    # A hung QSD (SIGSTOP: alive, its monitor silent, as after a tenant's
    # SET_MEM_TABLE of 2^32-1 regions) is killed after 3 unanswered probes
    # and restarted through the same checked path as a dead one.  Its guest
    # writes as soon as the new QSD accepts it (a VM's pending I/O), before
    # the check once it runs: that check must take the lock the new QSD got
    # for our QSD's, not another node's (it once stopped it, under load).
    old = lockers(ceph, "q")
    pid = n1.env.qsd_pids()[rec]
    os.kill(csilib.qsd_process(pid), signal.SIGSTOP)
    t0 = time.monotonic()
    tries = 0
    try:
        while True:  # killed, restarted, and the guest's write went through
            new_pid = n1.env.qsd_pids().get(rec)
            if new_pid not in (None, pid) and not os.path.exists("/proc/%d" % pid):
                r = verify(qsdctl, sock, 2, write=True, check=False, timeout_ms=30000)
                tries += 1
                if r.returncode == 0:
                    break
                assert r.returncode == 3, (r.returncode, r.stderr, n1.log()[-3000:])  # not up yet
            assert time.monotonic() - t0 < 40, "the hung QSD was not replaced: %s" % \
                n1.log()[-2000:]
            time.sleep(0.01)
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass
    print("hung RBD QSD killed and restarted, its guest wrote after %.1f s (%d tries)" %
          (time.monotonic() - t0, tries))
    wait_checked(n1, 2, rec, new_pid)
    new = lockers(ceph, "q")
    assert len(new) == 1 and new[0]["address"] != old[0]["address"], (old, new,
                                                                       n1.log()[-4000:])
    st = n1.c.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(volume_id=vid, volume_path=tgt),
                                 timeout=csilib.CALL_TIMEOUT)
    assert not st.volume_condition.abnormal, st
    print("after the check: %s" % st.volume_condition.message)
    log = n1.log()
    assert "QSD hung: killed" in log and "killed by the plugin, hung" in log, log[-2000:]
    assert log.count("QSD hung: killed") == 1, log[-4000:]  # only the frozen one
    verify(qsdctl, sock, 2, timeout_ms=30000)
    # The same node loses plugin and QSD at once (kill -9 of both): the next
    # plugin (same node id) serves the volume again, the data is there and
    # the new QSD gets the lock (the dead one provably gone).
    pid = n1.env.qsd_pids()[rec]
    n1.env.stop(signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)
    n1.start()  # restarts the dead QSD of the staged volume
    # (UNAVAILABLE while it is being restarted, ABORTED while its check runs)
    stage_until(n1, n1.stage_req(vid, "q", secrets), "stage again on node-1",
                (C.UNAVAILABLE, C.ABORTED))
    assert n1.env.qsd_pids().get(rec) not in (None, pid), n1.env.qsd_pids()
    verify(qsdctl, sock, 2, timeout_ms=30000)
    verify(qsdctl, sock, 3, write=True, timeout_ms=60000)
    verify(qsdctl, sock, 3)
    log = n1.log()  # no healthy QSD was killed as hung, loaded or not
    assert log.count("QSD hung: killed") == 1, log[-4000:]
    n1.unstage(vid, "q")
    assert not n1.env.running_qsds()

    # Read-only: stage and publish read-only; reads back, writes fail.
    ro_cap = mount_cap(pb, mode=pb.VolumeCapability.AccessMode.MULTI_NODE_READER_ONLY)
    n1.c.NodeStageVolume(n1.stage_req(vid, "q", secrets, cap=ro_cap), timeout=csilib.CALL_TIMEOUT)
    sock = n1.publish(vid, "q", cap=ro_cap, ro=True)
    verify(qsdctl, sock, 3)
    r = verify(qsdctl, sock, 4, write=True, check=False)
    assert r.returncode != 0, "wrote through a read-only publication"
    verify(qsdctl, sock, 3)
    assert lockers(ceph, "q") == [] or lockers(ceph, "q")[0]["address"] != old[0]["address"]
    n1.unstage(vid, "q")

    # A wrong key: refused before a QSD starts, bounded.
    wrong = ceph.key[:-6] + ("AAAA==" if not ceph.key.endswith("AAAA==") else "BBBB==")
    t0 = time.monotonic()
    m = expect_code(n1.c.NodeStageVolume, n1.stage_req(vid, "q", dict(secrets, userKey=wrong)),
                    C.UNAUTHENTICATED, "stage with a wrong key")
    print("wrong key refused in %.1f s: %s" % (time.monotonic() - t0, m))
    assert "userKey" in m, m
    assert not n1.env.running_qsds()


def main():
    scenario, plugin, proto, qsdctl = sys.argv[1:5]
    why = cephlib.have_ceph()
    if why:
        csilib.skip("Ceph " + why + " (scripts/setup.sh installs it)")
    nodes = []
    ceph = cephlib.Cluster(watch_timeout=WATCH_TIMEOUT)
    probe = csilib.Env(plugin, proto, prefix="qsd-rbd-conf-")  # skips without root / QSD
    try:
        ceph.start()
        print("ceph up in %.1f s" % ceph.start_seconds)
        clusters = ceph.write_clusters(probe.root)
        secrets = ceph.secrets
        {"loss": scenario_loss, "qsd": scenario_qsd}[scenario](
            plugin, proto, qsdctl, ceph, clusters, secrets, nodes)
        for n in nodes:
            n.env.stop()
            assert ceph.key not in n.log(), "the key is in a plugin's log"
        print("PASS")
    finally:
        for n in nodes:
            n.env.cleanup()
        ceph.stop()
        probe.cleanup()


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
