#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 9, the hostile tenant through kubelet: an inline volume's
volumeAttributes come from the pod spec and kubelet forwards them verbatim
as NodePublishVolume's volume_context.  A pod spec may be about 1.5 MiB, so
a tenant can send tens of thousands of attributes, the same key thousands
of times (a protobuf map sent as repeated entries: the last one wins for a
conforming decoder), or a megabyte-long value.

Expected: each call is answered (the plugin's own rules: unknown attributes
and bad names are INVALID_ARGUMENT; a request limit may answer
RESOURCE_EXHAUSTED) within 5 s; Probe answers within 1 s
afterwards; the plugin is the same process; a rightful bridge and hot-plug
still work.

usage: test_context_flood.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seclib  # noqa: E402
from seclib import MiB, mount_cap  # noqa: E402

FLOOD_BOUND = 5.0
N = 60000
VM_UID = "0d4b5a4e-1111-4000-8000-00000000c0de"
NS = "tenant"


def pod_ctx(uid, name):
    return {"csi.storage.k8s.io/pod.uid": uid, "csi.storage.k8s.io/pod.namespace": NS,
            "csi.storage.k8s.io/pod.name": name,
            "csi.storage.k8s.io/serviceAccount.name": "default",
            "csi.storage.k8s.io/ephemeral": "true"}


def flood(s, raw_call, cap, tgt, uid, n):
    pb = s.pb
    # ---- many distinct attributes on a hot-plug request
    ctx = pod_ctx(uid, "attach")
    ctx["hotplugInto"] = "vm"
    for i in range(n):
        ctx["attr%05d" % i] = "v" * 16
    req = pb.NodePublishVolumeRequest(volume_id="csi-flood-1", target_path=tgt,
                                      volume_capability=cap, volume_context=ctx)
    code, msg, _ = s.call("%d distinct volumeAttributes" % n, "NodePublishVolume", req,
                          bound=FLOOD_BOUND)
    s.check(code in ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"),
            "%d attributes: expected INVALID_ARGUMENT or RESOURCE_EXHAUSTED, got %s" % (
                n, seclib.fmt(code, msg)))
    s.after("distinct attributes flood")

    # ---- one key repeated n times (concatenated map entries)
    base = pb.NodePublishVolumeRequest(volume_id="csi-flood-2", target_path=tgt,
                                       volume_capability=cap,
                                       volume_context=pod_ctx(uid, "attach")).SerializeToString()
    one = pb.NodePublishVolumeRequest(volume_context={"hotplugInto": "vm"}).SerializeToString()
    code = raw_call("'hotplugInto' repeated %d times" % n, base + one * n)
    s.after("repeated key flood")
    if code == "OK":
        s.call("(undo)", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
            volume_id="csi-flood-2", target_path=tgt), quiet=True)
    one = pb.NodePublishVolumeRequest(
        volume_context={"csi.storage.k8s.io/pod.uid": uid}).SerializeToString()
    raw_call("pod.uid repeated %d times" % n, base + one * n)
    s.after("repeated pod.uid flood")

    # ---- the bridge: "bridge: true" repeated
    btgt = s.target(VM_UID, "inline-bridge")
    bbase = pb.NodePublishVolumeRequest(volume_id="csi-bridge", target_path=btgt,
                                        volume_capability=cap,
                                        volume_context=pod_ctx(VM_UID, "vm")).SerializeToString()
    one = pb.NodePublishVolumeRequest(volume_context={"bridge": "true"}).SerializeToString()
    code = raw_call("'bridge: true' repeated %d times" % n, bbase + one * n)
    s.after("bridge flood")
    if code == "OK":
        s.call("(undo)", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
            volume_id="csi-bridge", target_path=btgt), quiet=True)


def run(s):
    pb = s.pb
    cap = mount_cap(pb, group="107")
    raw = s.env.client.channel.unary_unary(
        "/csi.v1.Node/NodePublishVolume", request_serializer=lambda b: b,
        response_deserializer=pb.NodePublishVolumeResponse.FromString)

    def raw_call(what, data):
        import grpc
        import time
        t0 = time.monotonic()
        try:
            raw(data, timeout=FLOOD_BOUND)
            code, msg = "OK", ""
        except grpc.RpcError as e:
            code, msg = e.code().name, e.details() or ""
        dt = time.monotonic() - t0
        print("attack %-58s -> %s (%.0f ms, %d KiB)" % (what, seclib.fmt(code, msg[:160]),
                                                        dt * 1000, len(data) // 1024))
        s.check(code != "DEADLINE_EXCEEDED", "%s: not answered within %.0f s" % (
            what, FLOOD_BOUND))
        return code

    uid = "a1a1a1a1-0000-4000-8000-00000000f100"
    tgt = s.target(uid, "inline-flood")

    for n in (15000, N):  # below a request's field limit (the handlers see it), above it
        flood(s, raw_call, cap, tgt, uid, n)

    # ---- a megabyte-long value
    ctx = pod_ctx(uid, "attach")
    ctx["hotplugInto"] = "a" * MiB
    code, msg, _ = s.call("hotplugInto of 1 MiB", "NodePublishVolume",
                          pb.NodePublishVolumeRequest(volume_id="csi-flood-3", target_path=tgt,
                                                      volume_capability=cap, volume_context=ctx),
                          bound=FLOOD_BOUND)
    s.check(code == "INVALID_ARGUMENT", "1 MiB hotplugInto: expected INVALID_ARGUMENT, got %s" %
            seclib.fmt(code, msg))
    ctx = pod_ctx(uid, "attach")
    ctx["hotplugInto"] = "vm"
    ctx["disk"] = "d" * MiB
    code, msg, _ = s.call("disk of 1 MiB", "NodePublishVolume",
                          pb.NodePublishVolumeRequest(volume_id="csi-flood-4", target_path=tgt,
                                                      volume_capability=cap, volume_context=ctx),
                          bound=FLOOD_BOUND)
    s.check(code == "INVALID_ARGUMENT", "1 MiB disk: expected INVALID_ARGUMENT, got %s" %
            seclib.fmt(code, msg))
    s.after("1 MiB values")

    btgt = s.target(VM_UID, "inline-bridge")

    # ---- the rightful users
    ctx = pod_ctx(VM_UID, "vm")
    ctx["bridge"] = "true"
    s.ok("NodePublishVolume", pb.NodePublishVolumeRequest(
        volume_id="csi-bridge", target_path=btgt, volume_capability=cap, volume_context=ctx),
        "rightful bridge")
    s.create("pvc-hot", 16 * MiB)
    s.stage("pvc-hot")
    uid2 = "a2a2a2a2-0000-4000-8000-00000000f200"
    rctx = pod_ctx(uid2, "attach-2")
    rctx.update({"hotplugInto": "vm", "disk": "data"})
    rtgt = s.target(uid2, "inline-hotplug")
    s.ok("NodePublishVolume", pb.NodePublishVolumeRequest(
        volume_id="csi-req-2", target_path=rtgt, volume_capability=cap, volume_context=rctx),
        "rightful request")
    pctx = pod_ctx(uid2, "attach-2")
    pctx["csi.storage.k8s.io/ephemeral"] = "false"
    ptgt = s.publish("pvc-hot", uid2, ctx=pctx)
    s.works("rightful hot-plug after the floods", "pvc-hot", os.path.join(btgt, "data"))
    s.unpublish("pvc-hot", ptgt)
    s.unpublish("csi-req-2", rtgt)
    s.unpublish("csi-bridge", btgt)
    s.unstage("pvc-hot")
    s.after("teardown")


if __name__ == "__main__":
    sys.exit(seclib.run_test(run, "qsd-sec-flood-"))
