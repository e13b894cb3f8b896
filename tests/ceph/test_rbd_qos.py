#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Live limits of RBD volumes (docs/rbd.md, "Limits"), against a real
single-node Ceph (cephlib.py): a node plugin (node-1, with its
node-operations socket), the TLS gates and a stand-in API server
(gatelib.Relay), and a controller plugin (--role controller --node-dial),
all real programs on this machine.

Asserted:
  - CreateVolume through the controller with mutable_parameters: the image
    metadata qsd-csi.qos holds them (the JSON a local record holds); a bad
    key: INVALID_ARGUMENT naming it, no image;
  - ControllerModifyVolume of an image staged nowhere: OK, the metadata
    merged; a bad value, a burst below its base (merged over the image's):
    INVALID_ARGUMENT naming the key, the metadata unchanged;
  - NodeStageVolume: the QSD starts with the image's limits (its throttle
    group, read through QMP), the image names node-1 (qsd-csi.node); a
    client writes, so the QSD holds the image's exclusive lock for what
    follows;
  - a modify through the controller reaches the live QSD (same pid) and the
    node's record; a bad value changes nothing; the node plugin's own
    ControllerModifyVolume (the volume staged there) sets it too;
  - a controller without --node-dial: the limits recorded, UNAVAILABLE
    naming node-1 and --node-dial; the retry through the dialling
    controller sets them live;
  - the controller killed (-9) after recording, while its call to the node
    hangs (the node's gate SIGSTOPped): the metadata has the new limits,
    the QSD the old ones; the retry through a new controller sets them;
  - the node plugin killed (-9) with a forwarded modify in it (stopped):
    UNAVAILABLE, the QSD (same pid) keeps the old limits, the restarted
    plugin adopts it and the retry sets them; killed between its record and
    the qom-set (the QSD set behind its back): the restart sets the
    record's limits;
  - hostile metadata planted with the rbd CLI (not JSON, too long, an
    unknown key): NodeStageVolume FAILED_PRECONDITION naming qsd-csi.qos,
    no QSD and no record left; a modify replaces the value, and the stage
    then starts the QSD with it.

usage: test_rbd_qos.py PLUGIN_BINARY PROTO_DIR QSDCTL GATE
~15 s (of which ~10 s Ceph start)."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "csi"))
import cephlib  # noqa: E402
import csilib  # noqa: E402
import gatelib  # noqa: E402
from csilib import expect_code, mount_cap  # noqa: E402

import grpc  # noqa: E402

MiB = 1 << 20
T = 30
C = grpc.StatusCode
GID = UID = 64126
QOS = "qsd-csi.qos"


def wait_until(cond, what, timeout=10):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def children(pid):
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def gone(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ")[1][0] in "ZX"
    except FileNotFoundError:
        return True


def main():
    plugin, proto, qsdctl, gate = sys.argv[1:5]
    why = cephlib.have_ceph()
    qsd = shutil.which("qemu-storage-daemon")
    if not qsd:
        csilib.skip("no qemu-storage-daemon in PATH")
    if why:
        csilib.skip("Ceph " + why + " (scripts/setup.sh installs it)")
    env = csilib.Env(plugin, proto, prefix="qsd-rbd-qos-")
    ceph = cephlib.Cluster()
    relay = None
    try:
        ceph.start()
        clusters = ceph.write_clusters(env.root)
        ops = os.path.join(env.root, "ops", "node-ops.sock")
        # The QSDs start through a wrapper that, when the port of gate
        # listens, waits until the test closes its connection (at most
        # 9 s: the plugin gives a QSD 10 s to start; the modify made in
        # that window takes 0.05-0.3 s here): a stage held
        # between its read of the image's limits and its QSD's start.  (A
        # QSD's file system is read-only and partly hidden, its network the
        # host's.)
        gate_sock = socket.socket()
        gate_sock.bind(("127.0.0.1", 0))  # bound, not listening: refused
        wrapper = os.path.join(env.root, "qsd-wrapper")
        with open(wrapper, "w") as f:
            f.write('#!/bin/bash\nif exec 3<>/dev/tcp/127.0.0.1/%d; then read -t 9 -u 3 x; '
                    'exec 3<&-; fi 2>/dev/null\nexec %s "$@"\n'
                    % (gate_sock.getsockname()[1], qsd))
        os.chmod(wrapper, 0o755)
        node_args = ["--rbd-clusters", clusters, "--node-ops-endpoint", "unix://" + ops,
                     "--node-ops-group", str(GID), "--qsd-binary", wrapper]
        c = env.start(extra=node_args)
        pb = env.pb
        relay = gatelib.Relay(env.root, gate, ops,
                              {env.node: [{"type": "InternalIP", "address": "127.0.0.1"}]},
                              UID, GID)
        ctl_sock = os.path.join(env.root, "ctl", "csi.sock")

        def controller(dial=True, log="controller.log"):
            extra = ["--rbd-clusters", clusters]
            if dial:
                p = relay.controller(plugin, ctl_sock, env.driver, extra=extra)
            else:
                sock = os.path.join(env.root, "ctl2", "csi.sock")
                p = gatelib.Proc([plugin, "--role", "controller", "--endpoint", "unix://" + sock,
                                  "--driver-name", env.driver, *extra],
                                 os.path.join(env.root, log), lambda: gatelib.accepting(sock))
                p.sock = sock
                relay.procs.append(p)  # stopped with the relay
            return p

        ctl = controller()
        cc = csilib.Client(pb, ctl_sock)
        secrets = ceph.secrets
        params = {"backend": "rbd", "clusterID": "c1", "pool": ceph.pool,
                  "radosNamespace": ceph.namespace}
        spec = "%s/%s/" % (ceph.pool, ceph.namespace)
        cap = mount_cap(pb)

        def meta(img, key=QOS):
            r = ceph.run("rbd", "image-meta", "get", spec + img, key, check=False)
            return r.strip() or None

        def qos(img):
            m = meta(img)
            return json.loads(m) if m else None

        def create(name, mp):
            return pb.CreateVolumeRequest(
                name=name, capacity_range=pb.CapacityRange(required_bytes=32 * MiB),
                volume_capabilities=[cap], parameters=params, secrets=secrets,
                mutable_parameters=mp)

        def modify(client, vid, mp):
            return client.ControllerModifyVolume(pb.ControllerModifyVolumeRequest(
                volume_id=vid, mutable_parameters=mp, secrets=secrets), timeout=T)

        # --- CreateVolume records mutable_parameters in the image
        m = expect_code(cc.CreateVolume, create("pvc-bad", {"readIopz": "5"}),
                        C.INVALID_ARGUMENT, "an unknown mutable parameter")
        assert "readIopz" in m, m
        assert "pvc-bad" not in ceph.rbd("ls", spec.rstrip("/")).split()
        vid = cc.CreateVolume(create("pvc-q", {"readIops": "300", "writeBps": str(4 * MiB)}),
                              timeout=T).volume.volume_id
        assert qos("pvc-q") == {"readIops": "300", "writeBps": str(4 * MiB)}, meta("pvc-q")
        print("ok CreateVolume: image metadata %s = %s; a bad key INVALID_ARGUMENT: %s"
              % (QOS, meta("pvc-q"), m))

        # --- staged nowhere: the metadata only
        modify(cc, vid, {"readIops": "400", "readIopsBurst": "800"})
        want = {"readIops": "400", "readIopsBurst": "800", "writeBps": str(4 * MiB)}
        assert qos("pvc-q") == want, meta("pvc-q")
        m = expect_code(lambda r, timeout: modify(cc, vid, {"writeIops": "fast"}), None,
                        C.INVALID_ARGUMENT, "a bad value")
        assert "writeIops" in m, m
        m2 = expect_code(lambda r, timeout: modify(cc, vid, {"readIopsBurst": "100"}), None,
                         C.INVALID_ARGUMENT, "a burst below the image's base")
        assert "readIopsBurst" in m2 and "below readIops 400" in m2, m2
        assert qos("pvc-q") == want, meta("pvc-q")
        print("ok modify of a volume staged nowhere: metadata merged; refused unchanged: %s | %s"
              % (m, m2))

        # --- stage: the QSD starts with the image's limits
        stg = os.path.join(env.kubelet, "staging", "pvc-q")
        os.makedirs(stg)

        def stage():
            c.NodeStageVolume(pb.NodeStageVolumeRequest(
                volume_id=vid, staging_target_path=stg, volume_capability=cap, secrets=secrets),
                timeout=T)

        tgt = os.path.join(env.kubelet, "pods", "p1", "mount")
        os.makedirs(os.path.dirname(tgt))
        published = []

        def unstage():
            if published:
                c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=vid,
                                                                    target_path=tgt), timeout=T)
                published.clear()
            c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id=vid,
                                                            staging_target_path=stg), timeout=T)

        rec = vid.replace(":", "_")
        stage()
        lim = csilib.qsd_limits(qsdctl, env, rec)
        assert lim["iops-read"] == 400 and lim["iops-read-max"] == 800 and \
            lim["bps-write"] == 4 * MiB, lim
        assert meta("pvc-q", "qsd-csi.node") == env.node, meta("pvc-q", "qsd-csi.node")
        pid = env.qsd_pids()[rec]
        # a client writes: the QSD takes the image's exclusive lock, so the
        # metadata writes below are librbd's requests to the lock owner
        c.NodePublishVolume(pb.NodePublishVolumeRequest(
            volume_id=vid, staging_target_path=stg, target_path=tgt, volume_capability=cap),
            timeout=T)
        published.append(tgt)
        r = subprocess.run([qsdctl, "verify", "--write", "--seed", "3", "--chunks", "8",
                            "--chunk-size", "65536", "--timeout-ms", "20000", "./vhost.sock"],
                           cwd=tgt, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "auto" in ceph.rbd("lock", "ls", spec + "pvc-q"), "the QSD holds no lock"
        print("ok staged: the QSD's throttle group has the image's limits; the image names %s; "
              "a client wrote (the QSD holds the image's lock)" % env.node)

        # --- live through the controller
        t0 = time.monotonic()
        modify(cc, vid, {"readIops": "900", "readIopsBurst": "0", "writeIops": "50"})
        took = time.monotonic() - t0
        lim = csilib.qsd_limits(qsdctl, env, rec)
        assert lim["iops-read"] == 900 and lim["iops-write"] == 50 and \
            lim["bps-write"] == 4 * MiB and not lim["iops-read-max"], lim
        assert env.qsd_pids()[rec] == pid, "the QSD was restarted"
        with open(os.path.join(env.state, "volumes", rec + ".json")) as f:
            assert json.dumps(json.load(f)).count('"900"'), "the node's record lacks them"
        assert qos("pvc-q")["readIops"] == "900", meta("pvc-q")
        m = expect_code(lambda r, timeout: modify(cc, vid, {"readIops": "-1"}), None,
                        C.INVALID_ARGUMENT, "a bad value, staged")
        assert "readIops" in m, m
        assert csilib.qsd_limits(qsdctl, env, rec) == lim and qos("pvc-q")["readIops"] == "900"
        modify(c, vid, {"writeIops": "60"})  # the node plugin's own
        assert csilib.qsd_limits(qsdctl, env, rec)["iops-write"] == 60
        print("ok modify through the controller: live QSD changed in %.2f s, same pid %d, node "
              "record and metadata; a bad value INVALID_ARGUMENT changed nothing; the node "
              "plugin's own modify sets it too" % (took, pid))

        # --- a controller that cannot reach nodes
        plain = controller(dial=False, log="controller-plain.log")
        pc = csilib.Client(pb, plain.sock)
        m = expect_code(lambda r, timeout: modify(pc, vid, {"readIops": "950"}), None,
                        C.UNAVAILABLE, "no --node-dial")
        assert env.node in m and "--node-dial" in m, m
        assert qos("pvc-q")["readIops"] == "950", meta("pvc-q")
        assert csilib.qsd_limits(qsdctl, env, rec)["iops-read"] == 900
        modify(cc, vid, {"readIops": "950"})
        assert csilib.qsd_limits(qsdctl, env, rec)["iops-read"] == 950
        pc.close()
        print("ok without --node-dial: recorded, UNAVAILABLE (%s); the retry through the "
              "dialling controller set it live" % m)

        # --- controller killed (-9) between recording and the live set
        os.kill(relay.serve.p.pid, signal.SIGSTOP)
        try:
            fut = cc.ControllerModifyVolume.future(pb.ControllerModifyVolumeRequest(
                volume_id=vid, mutable_parameters={"readIops": "1234"}, secrets=secrets),
                timeout=T)
            wait_until(lambda: qos("pvc-q")["readIops"] == "1234", "never recorded", 20)
            workers = children(ctl.p.pid)
            assert not fut.done(), "the modify ended with the node's gate stopped"
            relay.kill(ctl)
            wait_until(lambda: all(map(gone, workers)), "the dead controller's workers live on")
        finally:
            os.kill(relay.serve.p.pid, signal.SIGCONT)
        assert fut.exception() is not None and fut.code() == C.UNAVAILABLE, fut
        assert csilib.qsd_limits(qsdctl, env, rec)["iops-read"] == 950
        cc.close()
        ctl = controller()
        cc = csilib.Client(pb, ctl_sock)
        modify(cc, vid, {"readIops": "1234"})
        assert csilib.qsd_limits(qsdctl, env, rec)["iops-read"] == 1234
        assert env.qsd_pids()[rec] == pid
        print("ok the controller killed (-9) after recording: metadata new, QSD old; the retry "
              "through a new controller set it live")

        # --- the node plugin killed (-9) with a forwarded modify in it (the
        # plugin SIGSTOPped: the request reached its socket, not its
        # handler): the caller gets UNAVAILABLE, the metadata has the new
        # limits, the QSD (outliving its plugin) the old ones; the restarted
        # plugin adopts it, and the retry sets them
        os.kill(env.proc.pid, signal.SIGSTOP)
        try:
            fut = cc.ControllerModifyVolume.future(pb.ControllerModifyVolumeRequest(
                volume_id=vid, mutable_parameters={"readIops": "1500"}, secrets=secrets),
                timeout=T)
            wait_until(lambda: qos("pvc-q")["readIops"] == "1500", "never recorded", 20)
            time.sleep(0.5)  # the relay's request reaches the stopped node's socket
            assert not fut.done(), "the modify ended with the node plugin stopped"
        finally:
            env.stop(signal.SIGKILL)  # a stopped process dies of SIGKILL too
        assert fut.exception() is not None and fut.code() == C.UNAVAILABLE, fut
        assert env.qsd_pids()[rec] == pid, "the QSD did not outlive its plugin"
        assert csilib.qsd_limits(qsdctl, env, rec)["iops-read"] == 1234
        c = env.start(extra=node_args)
        assert env.qsd_pids()[rec] == pid, "the restarted plugin replaced the QSD"
        assert csilib.qsd_limits(qsdctl, env, rec)["iops-read"] == 1234
        modify(cc, vid, {"readIops": "1500"})
        assert csilib.qsd_limits(qsdctl, env, rec)["iops-read"] == 1500
        # killed (-9) after its record, before the QSD's qom-set (made by
        # setting the QSD behind the dead plugin's back): the restart sets
        # the record's limits on the adopted QSD
        env.stop(signal.SIGKILL)
        r = subprocess.run([qsdctl, "--run-dir", env.run, "qmp", rec, "qom-set",
                            '{"path": "tg0", "property": "limits", "value": {"iops-read": 77}}'],
                           capture_output=True, text=True, timeout=20)
        assert r.returncode == 0, r.stderr
        assert csilib.qsd_limits(qsdctl, env, rec)["iops-read"] == 77
        c = env.start(extra=node_args)
        lim = csilib.qsd_limits(qsdctl, env, rec)
        assert lim["iops-read"] == 1500 and lim["iops-write"] == 60, lim
        assert env.qsd_pids()[rec] == pid
        print("ok the node plugin killed (-9) with a forwarded modify in it: UNAVAILABLE, the "
              "QSD (same pid) kept the old limits, the retry set them; killed between its record "
              "and the qom-set: the restart set the record's")

        # --- hostile metadata: staging refuses, naming the key
        unstage()
        for bad, what in (("not json", "not JSON"), ('{"readIops": "%s"}' % ("9" * 1200), "long"),
                          ('{"rm -rf": "1"}', "an unknown key"),
                          ('{"readIops": 5}', "a number, not a string")):
            ceph.rbd("image-meta", "set", spec + "pvc-q", QOS, bad)
            m = expect_code(lambda r, timeout: stage(), None, C.FAILED_PRECONDITION,
                            "hostile metadata: " + what)
            assert QOS in m and "pvc-q" in m, m
            assert rec not in env.qsd_pids() and \
                not os.path.exists(os.path.join(env.state, "volumes", rec + ".json")), what
        print("ok hostile %s (not JSON, 1.2 kB, unknown key, number): NodeStage "
              "FAILED_PRECONDITION, no QSD, no record: %s" % (QOS, m))
        modify(cc, vid, {"readIops": "700"})
        assert qos("pvc-q") == {"readIops": "700"}, meta("pvc-q")
        stage()
        assert csilib.qsd_limits(qsdctl, env, rec)["iops-read"] == 700
        print("ok a modify replaced the hostile value; the stage starts the QSD with it")

        # --- a modify while a stage is between its read and its QSD's start:
        # it sees no client (OK, metadata only); the check once the QSD runs
        # finds the new limits and sets them before the stage is answered
        unstage()
        gate_sock.listen(1)
        gate_sock.settimeout(20)
        held = None
        try:
            fut = c.NodeStageVolume.future(pb.NodeStageVolumeRequest(
                volume_id=vid, staging_target_path=stg, volume_capability=cap, secrets=secrets),
                timeout=T)
            held, _ = gate_sock.accept()  # the stage's QSD is starting, held
            modify(cc, vid, {"readIops": "321"})
            assert not fut.done(), "the stage ended while its QSD was held"
        finally:
            if held:
                held.close()
            gate_sock.close()
        fut.result()
        assert csilib.qsd_limits(qsdctl, env, rec)["iops-read"] == 321
        print("ok a modify between a stage's read and its QSD's start: OK, and the stage set "
              "it live before answering")

        unstage()
        cc.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vid, secrets=secrets), timeout=T)
        relay.stop(check=True)
        assert env.stop() == 0, "the node plugin did not exit 0"
        print("ok every process exits 0 on SIGTERM")
    except Exception:
        gatelib.Relay.tails(env.root, "plugin.log", "controller-plain.log")
        raise
    finally:
        if relay:
            relay.stop()
        env.cleanup()  # the QSDs before the cluster
        ceph.stop()


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
