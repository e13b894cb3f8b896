#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The controller reaching a volume's node (docs/node-operations.md), end
to end on one machine: a ControllerModifyVolume sent to the controller
plugin (--role controller --node-dial) travels

    controller plugin -> qsd-node-gate --dial (API route: the node's
    InternalIP from the API server) -> qsd-node-gate --dial (CONNECT, mutual
    TLS) -> qsd-node-gate (serve) -> the node plugin's --node-ops-endpoint

and changes the live QSD's throttle group.  Every part is the real
program; the API server is a stand-in (Python's http.server over ssl, with
its own CA, answering GET /api/v1/nodes/NAME as the real one does, and
checking the bearer token), since this test runs without a cluster.

Asserted:
  - the controller advertises MODIFY_VOLUME and the GroupController with
    --node-dial;
  - a modify through the controller lands on the node's live QSD (qom-get of
    the throttle group) and its record; the API server saw the token, the
    serve gate logged the relayed connection; the controller's `forwarded`
    line has ms, lookup_ms, dial_ms and call_ms, the three within the whole
    and the whole within what the caller waited;
  - the node's refusal comes back as it is (INVALID_ARGUMENT naming the key,
    the node named), and changes nothing;
  - a node the API server does not know: NOT_FOUND naming it; a token the
    API server refuses: UNAVAILABLE with its 401 message; a node whose
    InternalIP has no gate listening: UNAVAILABLE; a volume id whose node
    part is not a node's name: NOT_FOUND; nothing changed by any of these;
  - SnapshotMetadata through the controller (GetMetadataAllocated and
    GetMetadataDelta, one extent per message): the same messages and
    extents as asked of the node directly; a delta of 16384 messages read
    slowly arrives whole and in order; a delta across nodes
    INVALID_ARGUMENT, an unknown node NOT_FOUND; 20 streams cancelled after
    their first message leave no worker process and the next stream whole;
  - group snapshots through the controller: created on the node (a live
    volume and another), got, deleted (the node's snapshots gone); volumes
    of two nodes INVALID_ARGUMENT, an unknown node NOT_FOUND;
  - the controller killed (-9) in the middle of a relayed stream: its
    worker dies with it, the node's stream ends, the serve gate
    closes, the caller gets UNAVAILABLE; killed while a modify waits in the
    TLS handshake (the serve gate SIGSTOPped): the node unchanged; a new
    controller relays the next stream whole and applies the retried modify;
  - snapshots through the controller (CREATE_DELETE_SNAPSHOT and
    LIST_SNAPSHOTS advertised): CreateSnapshot of a live volume made on the
    node (its file in the pool; the same request again, the same id),
    ListSnapshots by snapshot_id and by source_volume_id answered by the
    node, unfiltered FAILED_PRECONDITION; bad ids INVALID_ARGUMENT naming
    the field (an empty one, a bad name, a bad node part), an id without a
    node FAILED_PRECONDITION, a node without a gate UNAVAILABLE naming it
    (create, delete, list), an unknown node NOT_FOUND, none of them
    leaving a snapshot; DeleteSnapshot removes the node's snapshot and
    file, and a second one is OK;
  - --node-ops-group gives the node-operations socket its group (0660), so
    the serve gate, confined to that gid, reaches it;
  - bad flag combinations exit 2 naming the flag.

usage: test_csi_nodecall.py PLUGIN_BINARY PROTO_DIR QSDCTL GATE
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402
import gatelib  # noqa: E402
from csilib import expect_code, mount_cap  # noqa: E402

import grpc  # noqa: E402

MiB = 1 << 20
T = 30
GID = UID = 64125
TOKEN = gatelib.TOKEN


def refused(plugin, args, want):
    r = subprocess.run([plugin, "--nodeid", "n1", *args], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and want in r.stderr, (args, r.returncode, r.stderr)


def main():
    plugin, proto, qsdctl, gate = sys.argv[1:5]
    refused(plugin, ["--node-dial", "unix:///tmp/d.sock"], "controller role")
    refused(plugin, ["--role", "controller", "--rbd-clusters", "/dev/null", "--node-dial",
                     "relative.sock"], "--node-dial")
    refused(plugin, ["--node-ops-group", "5"], "--node-ops-endpoint")
    refused(plugin, ["--role", "controller", "--rbd-clusters", "/dev/null", "--api-token-file",
                     "token"], "--api-token-file")
    print("ok bad flag combinations: exit 2 naming the flag")

    env = csilib.Env(plugin, proto, prefix="qsd-nodecall-")
    relay = None
    try:
        ops = os.path.join(env.root, "ops", "node-ops.sock")
        c = env.start(extra=["--node-ops-endpoint", "unix://" + ops, "--node-ops-group", str(GID)])
        pb = env.pb
        st = os.stat(ops)
        assert st.st_gid == GID and st.st_mode & 0o777 == 0o660, (st.st_gid, oct(st.st_mode))
        print("ok the node-operations socket: group %d, mode 0660" % GID)

        nodes = {env.node: [{"type": "Hostname", "address": env.node},
                            {"type": "ExternalIP", "address": "192.0.2.7"},
                            {"type": "InternalIP", "address": "127.0.0.1"}],
                 # a node whose address has no gate
                 "node-dark": [{"type": "InternalIP", "address": "127.0.0.3"}],
                 "node-noip": [{"type": "Hostname", "address": "node-noip"}]}
        # the node's serve gate (confined to the socket's group), the API
        # server, the controller's dial gate
        relay = gatelib.Relay(env.root, gate, ops, nodes, UID, GID)
        api, serve, token = relay.api, relay.serve, relay.token
        ctl_sock = os.path.join(env.root, "ctl", "csi.sock")
        ctl = relay.controller(plugin, ctl_sock, env.driver)
        cc = csilib.Client(pb, ctl_sock)

        caps = [x.rpc.type for x in cc.ControllerGetCapabilities(
            pb.ControllerGetCapabilitiesRequest(), timeout=T).capabilities]
        assert pb.ControllerServiceCapability.RPC.MODIFY_VOLUME in caps, caps
        print("ok the controller advertises MODIFY_VOLUME with --node-dial")  # (GroupController: below)

        cap = mount_cap(pb)
        vid = c.CreateVolume(pb.CreateVolumeRequest(
            name="pvc-far", capacity_range=pb.CapacityRange(required_bytes=64 * MiB),
            volume_capabilities=[cap], mutable_parameters={"readIops": "500"}),
            timeout=T).volume.volume_id
        stg = os.path.join(env.kubelet, "staging", "pvc-far")
        tgt = os.path.join(env.kubelet, "pods", "p1", "mount")
        os.makedirs(stg)
        os.makedirs(os.path.dirname(tgt))
        c.NodeStageVolume(pb.NodeStageVolumeRequest(volume_id=vid, staging_target_path=stg,
                                                    volume_capability=cap), timeout=T)
        c.NodePublishVolume(pb.NodePublishVolumeRequest(
            volume_id=vid, staging_target_path=stg, target_path=tgt, volume_capability=cap),
            timeout=T)
        assert csilib.qsd_limits(qsdctl, env, "pvc-far")["iops-read"] == 500

        def modify(mp, vol=vid):
            return cc.ControllerModifyVolume(pb.ControllerModifyVolumeRequest(
                volume_id=vol, mutable_parameters=mp), timeout=T)

        t0 = time.monotonic()
        modify({"readIops": "1500", "writeBps": str(8 * MiB)})
        took = time.monotonic() - t0
        lim = csilib.qsd_limits(qsdctl, env, "pvc-far")
        assert lim["iops-read"] == 1500 and lim["bps-write"] == 8 * MiB, lim
        rec = json.load(open(os.path.join(env.state, "volumes", "pvc-far.json")))
        assert json.dumps(rec).count("1500"), rec
        assert api.seen and api.seen[-1] == ("/api/v1/nodes/" + env.node, "Bearer " + TOKEN), \
            api.seen
        deadline = time.monotonic() + 10  # the gate logs the close once it sees it
        while not re.search(r"msg=closed .*to_forward=[1-9]", serve.log()):
            assert time.monotonic() < deadline, serve.log()[-1500:]
            time.sleep(0.05)
        print("ok a modify through the controller set the node's live QSD (iops-read 1500, "
              "bps-write 8 MiB) in %.2f s: the API server asked with the token, the serve gate "
              "relayed it" % took)
        # The controller's line says where the time went: the steps within
        # the whole, the whole within what the caller waited.
        with open(os.path.join(env.root, "controller.log")) as f:
            fw = [ln for ln in f if "msg=forwarded" in ln and "ControllerModifyVolume" in ln]
        assert fw, "no forwarded line in controller.log"
        ms = {k: int(v) for k, v in re.findall(r" (ms|lookup_ms|dial_ms|call_ms)=(\d+)", fw[-1])}
        assert sorted(ms) == ["call_ms", "dial_ms", "lookup_ms", "ms"], fw[-1]
        assert ms["lookup_ms"] + ms["dial_ms"] + ms["call_ms"] <= ms["ms"] <= took * 1000 + 1, \
            (ms, took)
        print("ok the controller logged the forward's times: %s" % ms)

        msg = expect_code(lambda r, timeout: modify({"readIops": "fast"}), None,
                          grpc.StatusCode.INVALID_ARGUMENT, "a bad value")
        assert "readIops" in msg and env.node in msg, msg
        assert csilib.qsd_limits(qsdctl, env, "pvc-far") == lim
        print("ok the node's refusal comes back: INVALID_ARGUMENT: %s" % msg)

        # group snapshots through the controller: the whole call to the node
        pcaps = [x.service.type for x in cc.GetPluginCapabilities(
            pb.GetPluginCapabilitiesRequest(), timeout=T).capabilities]
        assert pb.PluginCapability.Service.GROUP_CONTROLLER_SERVICE in pcaps, pcaps
        vid2 = c.CreateVolume(pb.CreateVolumeRequest(
            name="pvc-far2", capacity_range=pb.CapacityRange(required_bytes=16 * MiB),
            volume_capabilities=[cap]), timeout=T).volume.volume_id
        g = cc.CreateVolumeGroupSnapshot(pb.CreateVolumeGroupSnapshotRequest(
            name="grp-far", source_volume_ids=[vid, vid2]), timeout=T).group_snapshot
        assert g.ready_to_use and sorted(s.source_volume_id for s in g.snapshots) == \
            sorted([vid, vid2]) and g.group_snapshot_id.endswith("@" + env.node), g
        got = cc.GetVolumeGroupSnapshot(pb.GetVolumeGroupSnapshotRequest(
            group_snapshot_id=g.group_snapshot_id), timeout=T).group_snapshot
        assert got.group_snapshot_id == g.group_snapshot_id and len(got.snapshots) == 2, got
        listed = [e.snapshot.snapshot_id for e in c.ListSnapshots(
            pb.ListSnapshotsRequest(), timeout=T).entries]
        assert all(s.snapshot_id in listed for s in g.snapshots), (listed, g)
        msg = expect_code(cc.CreateVolumeGroupSnapshot, pb.CreateVolumeGroupSnapshotRequest(
            name="grp-mixed", source_volume_ids=[vid, "pvc-x@node-dark"]),
            grpc.StatusCode.INVALID_ARGUMENT, "volumes of two nodes")
        assert "source_volume_ids[1]" in msg and env.node in msg, msg
        msg = expect_code(cc.CreateVolumeGroupSnapshot, pb.CreateVolumeGroupSnapshotRequest(
            name="grp-gone", source_volume_ids=["pvc-x@node-gone"]),
            grpc.StatusCode.NOT_FOUND, "a group of an unknown node")
        assert "node-gone" in msg, msg
        cc.DeleteVolumeGroupSnapshot(pb.DeleteVolumeGroupSnapshotRequest(
            group_snapshot_id=g.group_snapshot_id, snapshot_ids=[s.snapshot_id for s in g.snapshots]),
            timeout=T)
        listed = [e.snapshot.snapshot_id for e in c.ListSnapshots(
            pb.ListSnapshotsRequest(), timeout=T).entries]
        assert not listed, listed
        expect_code(cc.GetVolumeGroupSnapshot, pb.GetVolumeGroupSnapshotRequest(
            group_snapshot_id=g.group_snapshot_id), grpc.StatusCode.NOT_FOUND, "a deleted group")
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vid2), timeout=T)
        print("ok group snapshots through the controller: created (%s, 2 members, live volume "
              "included), got, deleted on the node; two nodes' volumes INVALID_ARGUMENT, an "
              "unknown node NOT_FOUND" % g.group_snapshot_id)

        # snapshots of local volumes through the controller (the central
        # csi-snapshotter's calls): the whole call to the node of the id
        R = pb.ControllerServiceCapability.RPC
        assert R.CREATE_DELETE_SNAPSHOT in caps and R.LIST_SNAPSHOTS in caps, caps
        sreq = pb.CreateSnapshotRequest(name="snap-fwd", source_volume_id=vid)
        sf = cc.CreateSnapshot(sreq, timeout=T).snapshot
        sfile = os.path.join(env.pool, "snapshots", "snap-fwd.qcow2")
        assert sf.ready_to_use and sf.source_volume_id == vid and \
            sf.snapshot_id == "snap-fwd@" + env.node and os.path.exists(sfile), sf
        assert cc.CreateSnapshot(sreq, timeout=T).snapshot.snapshot_id == sf.snapshot_id
        by_id = cc.ListSnapshots(pb.ListSnapshotsRequest(snapshot_id=sf.snapshot_id),
                                 timeout=T).entries
        assert [e.snapshot.snapshot_id for e in by_id] == [sf.snapshot_id] and \
            by_id[0].snapshot.ready_to_use and by_id[0].snapshot.source_volume_id == vid, by_id
        by_src = cc.ListSnapshots(pb.ListSnapshotsRequest(source_volume_id=vid), timeout=T).entries
        assert sf.snapshot_id in [e.snapshot.snapshot_id for e in by_src], by_src
        assert not cc.ListSnapshots(pb.ListSnapshotsRequest(
            snapshot_id="snap-none@" + env.node), timeout=T).entries
        msg = expect_code(cc.ListSnapshots, pb.ListSnapshotsRequest(),
                          grpc.StatusCode.FAILED_PRECONDITION, "an unfiltered list")
        assert "snapshot_id" in msg and "source_volume_id" in msg, msg
        print("ok snapshots through the controller: CreateSnapshot on the node (%s, its file in "
              "the pool, the same id again), ListSnapshots by snapshot_id and by "
              "source_volume_id answered by the node; unfiltered FAILED_PRECONDITION"
              % sf.snapshot_id)
        for call, req, code, words in (
                (cc.CreateSnapshot, pb.CreateSnapshotRequest(name="snap-b", source_volume_id=""),
                 grpc.StatusCode.INVALID_ARGUMENT, ["source_volume_id"]),
                (cc.CreateSnapshot, pb.CreateSnapshotRequest(
                    name="snap-b", source_volume_id="pvc-far@no/de"),
                 grpc.StatusCode.INVALID_ARGUMENT, ["source_volume_id's node"]),
                (cc.CreateSnapshot, pb.CreateSnapshotRequest(
                    name="snap-b", source_volume_id="pvc far@" + env.node),
                 grpc.StatusCode.INVALID_ARGUMENT, ["source_volume_id"]),
                (cc.CreateSnapshot, pb.CreateSnapshotRequest(
                    name="snap-b", source_volume_id="pvc-far"),
                 grpc.StatusCode.FAILED_PRECONDITION, ["source_volume_id", "no node"]),
                (cc.DeleteSnapshot, pb.DeleteSnapshotRequest(snapshot_id=""),
                 grpc.StatusCode.INVALID_ARGUMENT, ["snapshot_id"]),
                (cc.DeleteSnapshot, pb.DeleteSnapshotRequest(snapshot_id="snap-b@no de"),
                 grpc.StatusCode.INVALID_ARGUMENT, ["snapshot_id's node"]),
                (cc.ListSnapshots, pb.ListSnapshotsRequest(snapshot_id="snap-b@no/de"),
                 grpc.StatusCode.INVALID_ARGUMENT, ["snapshot_id's node"]),
                (cc.ListSnapshots, pb.ListSnapshotsRequest(source_volume_id="pvc far@n"),
                 grpc.StatusCode.INVALID_ARGUMENT, ["source_volume_id"]),
                (cc.CreateSnapshot, pb.CreateSnapshotRequest(
                    name="snap-b", source_volume_id="pvc-x@node-dark"),
                 grpc.StatusCode.UNAVAILABLE, ["node-dark", "127.0.0.3"]),
                (cc.DeleteSnapshot, pb.DeleteSnapshotRequest(snapshot_id="snap-b@node-dark"),
                 grpc.StatusCode.UNAVAILABLE, ["node-dark", "127.0.0.3"]),
                (cc.ListSnapshots, pb.ListSnapshotsRequest(snapshot_id="snap-b@node-dark"),
                 grpc.StatusCode.UNAVAILABLE, ["node-dark", "127.0.0.3"]),
                (cc.DeleteSnapshot, pb.DeleteSnapshotRequest(snapshot_id="snap-b@node-gone"),
                 grpc.StatusCode.NOT_FOUND, ["node-gone"])):
            msg = expect_code(call, req, code, str(req).replace("\n", " "))
            assert all(w in msg for w in words), (req, msg)
            print("ok %s: %s %s" % (str(req).replace("\n", " ").strip(), code.name, msg))
        assert [e.snapshot.snapshot_id for e in c.ListSnapshots(
            pb.ListSnapshotsRequest(), timeout=T).entries] == [sf.snapshot_id], \
            "a refused call left a snapshot on the node"
        cc.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=sf.snapshot_id), timeout=T)
        assert not os.path.exists(sfile) and not c.ListSnapshots(
            pb.ListSnapshotsRequest(), timeout=T).entries
        cc.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=sf.snapshot_id), timeout=T)
        print("ok DeleteSnapshot through the controller: the node's snapshot and file gone, "
              "a second delete OK")

        # SnapshotMetadata through the controller: the node's stream relayed
        assert pb.PluginCapability.Service.SNAPSHOT_METADATA_SERVICE in pcaps, pcaps
        s1 = c.CreateSnapshot(pb.CreateSnapshotRequest(name="snap-far1", source_volume_id=vid),
                              timeout=T).snapshot.snapshot_id
        r = subprocess.run([qsdctl, "verify", "--write", "--seed", "5", "--chunks", "40",
                            "--chunk-size", "65536", "--timeout-ms", "20000", "./vhost.sock"],
                           cwd=tgt, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        s2 = c.CreateSnapshot(pb.CreateSnapshotRequest(name="snap-far2", source_volume_id=vid),
                              timeout=T).snapshot.snapshot_id

        def stream(channel, method, req_type, resp_type, **kw):
            call = channel.unary_stream("/csi.v1.SnapshotMetadata/" + method,
                                        request_serializer=req_type.SerializeToString,
                                        response_deserializer=resp_type.FromString)
            return call(req_type(**kw), timeout=T)

        def blocks(channel, method, **kw):
            req, resp = ((pb.GetMetadataAllocatedRequest, pb.GetMetadataAllocatedResponse)
                         if method == "GetMetadataAllocated" else
                         (pb.GetMetadataDeltaRequest, pb.GetMetadataDeltaResponse))
            msgs = list(stream(channel, method, req, resp, **kw))
            return len(msgs), [(b.byte_offset, b.size_bytes) for m in msgs
                               for b in m.block_metadata]

        for method, kw in (("GetMetadataAllocated", {"snapshot_id": s2}),
                           ("GetMetadataDelta", {"base_snapshot_id": s1,
                                                 "target_snapshot_id": s2})):
            direct = blocks(c.channel, method, max_results=1, **kw)
            relayed = blocks(cc.channel, method, max_results=1, **kw)
            assert direct == relayed and direct[0] > 1, (method, direct, relayed)
            print("ok %s through the controller: the node's %d messages, the same extents "
                  "as asked of the node" % (method, relayed[0]))
        msg = expect_code(lambda r, timeout: blocks(
            cc.channel, "GetMetadataDelta", base_snapshot_id=s1,
            target_snapshot_id="snap-x@node-dark"), None, grpc.StatusCode.INVALID_ARGUMENT,
            "a delta across nodes")
        assert "one node" in msg, msg
        msg = expect_code(lambda r, timeout: blocks(
            cc.channel, "GetMetadataAllocated", snapshot_id="snap-x@node-gone"), None,
            grpc.StatusCode.NOT_FOUND, "a snapshot of an unknown node")
        assert "node-gone" in msg, msg
        # a stream longer than every buffer on the way (16384 one-extent
        # messages), read slowly: the relay waits for the caller, nothing lost
        zsize, cl = 4 << 30, 65536
        zv = c.CreateVolume(pb.CreateVolumeRequest(
            name="pvc-many", capacity_range=pb.CapacityRange(required_bytes=zsize),
            volume_capabilities=[cap]), timeout=T).volume.volume_id
        z0 = c.CreateSnapshot(pb.CreateSnapshotRequest(name="snap-z0", source_volume_id=zv),
                              timeout=T).snapshot.snapshot_id
        cmds = []
        for i in range(0, zsize // cl, 4):
            cmds += ["-c", "write -z %d %d" % (i * cl, cl)]
        subprocess.run(["qemu-io", "-t", "unsafe", "-f", "qcow2", *cmds,
                        os.path.join(env.pool, "volumes", csilib.local_id(zv) + ".qcow2")],
                       check=True, stdout=subprocess.DEVNULL, timeout=120)
        z1 = c.CreateSnapshot(pb.CreateSnapshotRequest(name="snap-z1", source_volume_id=zv),
                              timeout=T).snapshot.snapshot_id
        slow = grpc.insecure_channel(cc.channel_target, options=[("grpc.http2.bdp_probe", 0)])
        it = stream(slow, "GetMetadataDelta", pb.GetMetadataDeltaRequest,
                    pb.GetMetadataDeltaResponse, base_snapshot_id=z0, target_snapshot_id=z1,
                    max_results=1)
        first = next(it)
        time.sleep(1)  # the pipe and the queues fill; the relay must wait, not drop
        got = [(b.byte_offset, b.size_bytes) for m in [first, *it] for b in m.block_metadata]
        slow.close()
        assert got == [(i * cl, cl) for i in range(0, zsize // cl, 4)], \
            (len(got), got[:3], got[-3:])
        print("ok a 16384-message delta through the controller, read slowly: every extent, "
              "in order")

        # The controller killed (-9) in the middle of a relay: its worker
        # dies with it (PDEATHSIG), the node's side of the stream ends
        # (cancelled, or done into the buffers), the gates close; a
        # controller started again relays the next stream whole.
        def children(pid):
            return [int(x) for x in open("/proc/%d/task/%d/children" % (pid, pid)).read().split()]

        def gone(pid):
            try:
                return open("/proc/%d/stat" % pid).read().split(") ")[1][0] in "ZX"
            except FileNotFoundError:
                return True

        def wait_until(cond, what, timeout=10):
            deadline = time.monotonic() + timeout
            while not cond():
                assert time.monotonic() < deadline, what
                time.sleep(0.05)

        def start_ctl():
            return relay.controller(plugin, ctl_sock, env.driver)

        def plog():
            with open(os.path.join(env.root, "plugin.log")) as f:
                return f.read()

        node_ends = plog().count("GetMetadataDelta code=")
        serve_closed = serve.log().count("msg=closed")
        stall = grpc.insecure_channel(cc.channel_target, options=[("grpc.http2.bdp_probe", 0)])
        it = stream(stall, "GetMetadataDelta", pb.GetMetadataDeltaRequest,
                    pb.GetMetadataDeltaResponse, base_snapshot_id=z0, target_snapshot_id=z1,
                    max_results=1)
        next(it)
        workers = children(ctl.p.pid)
        assert workers, "no worker relays the stream"
        relay.kill(ctl)
        wait_until(lambda: all(map(gone, workers)), "the dead controller's workers live on")
        # (CANCELLED, or OK when the way's buffers took all of its 400 KB
        # before the kill)
        wait_until(lambda: plog().count("GetMetadataDelta code=") > node_ends,
                   "the node's stream did not end: %s" % plog()[-1500:])
        wait_until(lambda: serve.log().count("msg=closed") > serve_closed,
                   "the serve gate did not close: %s" % serve.log()[-1500:])
        try:
            list(it)
            raise AssertionError("the stream of a killed controller ended well")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e
        stall.close()
        cc.close()
        ctl = start_ctl()
        cc = csilib.Client(pb, ctl_sock)
        assert blocks(cc.channel, "GetMetadataDelta", max_results=4096, base_snapshot_id=z0,
                      target_snapshot_id=z1)[1] == [(i * cl, cl) for i in range(0, zsize // cl, 4)]
        print("ok the controller killed (-9) mid-relay: its worker gone, the node's stream "
              "ended, the serve gate closed; a new controller relays whole")

        # ... and in the middle of a forwarded modify, the serve gate stopped
        # (SIGSTOP) so the call hangs in the TLS handshake: nothing reaches
        # the node; the CO's retry through a new controller applies it.
        lim0 = csilib.qsd_limits(qsdctl, env, "pvc-far")
        os.kill(serve.p.pid, signal.SIGSTOP)
        try:
            fut = cc.ControllerModifyVolume.future(pb.ControllerModifyVolumeRequest(
                volume_id=vid, mutable_parameters={"readIops": "1234"}), timeout=T)
            wait_until(lambda: children(ctl.p.pid), "no worker for the modify")
            workers = children(ctl.p.pid)
            time.sleep(0.3)  # the worker is in the gate's handshake, which cannot end
            assert not fut.done(), "the modify ended with the node's gate stopped"
            relay.kill(ctl)
            wait_until(lambda: all(map(gone, workers)), "the dead controller's workers live on")
        finally:
            os.kill(serve.p.pid, signal.SIGCONT)
        assert fut.exception() is not None and fut.code() == grpc.StatusCode.UNAVAILABLE, fut
        assert csilib.qsd_limits(qsdctl, env, "pvc-far") == lim0, "a killed modify changed limits"
        cc.close()
        ctl = start_ctl()
        cc = csilib.Client(pb, ctl_sock)
        modify({"readIops": "1234", "writeBps": str(8 * MiB)})
        assert csilib.qsd_limits(qsdctl, env, "pvc-far")["iops-read"] == 1234
        modify({"readIops": "1500", "writeBps": str(8 * MiB)})
        assert csilib.qsd_limits(qsdctl, env, "pvc-far") == lim0
        print("ok the controller killed (-9) in a modify's TLS handshake: the node unchanged, "
              "the retry through a new controller applied")
        for sid in (z0, z1):
            c.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=sid), timeout=T)
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=zv), timeout=T)
        # callers that go away: each relay and its worker end (a leaked worker
        # would exhaust the plugin's 16 after 16 of them)
        for _ in range(20):
            it = stream(cc.channel, "GetMetadataDelta", pb.GetMetadataDeltaRequest,
                        pb.GetMetadataDeltaResponse, base_snapshot_id=s1, target_snapshot_id=s2,
                        max_results=1)
            next(it)
            it.cancel()
        assert blocks(cc.channel, "GetMetadataDelta", max_results=1, base_snapshot_id=s1,
                      target_snapshot_id=s2) == direct
        deadline = time.monotonic() + 10
        kids = "/proc/%d/task/%d/children" % (ctl.p.pid, ctl.p.pid)
        while open(kids).read().split():
            assert time.monotonic() < deadline, "controller workers left: %s" % open(kids).read()
            time.sleep(0.05)
        print("ok 20 relayed streams cancelled after their first message: no worker left, "
              "the next stream whole")
        for sid in (s1, s2):
            c.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=sid), timeout=T)

        for vol, code, words in (
                ("pvc-far@node-gone", grpc.StatusCode.NOT_FOUND, ["node-gone", "not found"]),
                ("pvc-far@node-dark", grpc.StatusCode.UNAVAILABLE, ["node-dark", "127.0.0.3"]),
                ("pvc-far@node-noip", grpc.StatusCode.UNAVAILABLE, ["node-noip", "InternalIP"]),
                ("pvc-far@Node_X", grpc.StatusCode.NOT_FOUND, ["Node_X"])):
            msg = expect_code(lambda r, timeout: modify({"readIops": "7"}, vol), None, code, vol)
            assert all(w in msg for w in words), (vol, msg)
            print("ok %s: %s %s" % (vol, code.name, msg))
        with open(token, "w") as f:
            f.write("stolen\n")
        msg = expect_code(lambda r, timeout: modify({"readIops": "7"}), None,
                          grpc.StatusCode.UNAVAILABLE, "a refused token")
        assert "401" in msg and "Unauthorized" in msg, msg
        print("ok a refused token: UNAVAILABLE %s" % msg)
        assert csilib.qsd_limits(qsdctl, env, "pvc-far") == lim, "a refusal changed the limits"

        # the node's gate gone: UNAVAILABLE at once, nothing changed
        with open(token, "w") as f:
            f.write(TOKEN)
        assert serve.stop() == 0
        msg = expect_code(lambda r, timeout: modify({"readIops": "7"}), None,
                          grpc.StatusCode.UNAVAILABLE, "the serve gate stopped")
        assert env.node in msg, msg
        assert csilib.qsd_limits(qsdctl, env, "pvc-far") == lim
        print("ok the node's gate stopped: UNAVAILABLE %s" % msg)

        relay.stop(check=True)  # the controller and the dial gate (the serve gate: above)
        c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=vid, target_path=tgt),
                              timeout=T)
        c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id=vid, staging_target_path=stg),
                            timeout=T)
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vid), timeout=T)
        assert env.stop() == 0, "the node plugin did not exit 0"
        print("ok every process exits 0 on SIGTERM")
    except Exception:
        gatelib.Relay.tails(env.root, "plugin.log")
        raise
    finally:
        if relay:
            relay.stop()
        env.cleanup()


if __name__ == "__main__":
    main()
