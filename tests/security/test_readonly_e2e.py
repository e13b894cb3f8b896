#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 9, attacks F: read-only means read-only end to end.

A volume staged read-write (SINGLE_NODE_WRITER) and published with
readonly=true (a pod's `readOnly: true`): the VM behind that publication
must get a disk it cannot write, whatever its launcher does (the tenant
controls the launcher).  Checked only through the read-only target, with the
vhost-user client a VM would use:

- F1 beside a read-write publication: `qsdctl vhost-info` through the
  read-only target reports read_only, volume.json there says "read_only":
  true, a write through it (`qsdctl verify --write`) fails, and the pattern
  the writer put there is intact; the writer still has a writable disk;
- F2 the read-only publication alone (the writer gone): still read-only;
- F3 a read-only PVC publication hot-plugged into a VM pod's bridge: the
  placement seen through the VM pod's target is read-only too.

usage: test_readonly_e2e.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seclib  # noqa: E402
from seclib import MiB, mount_cap, vhost_info, qsdctl_verify  # noqa: E402

VID = "pvc-shared"
HVID = "pvc-hot-ro"
SIZE = 32 * MiB
VM_UID = "0d4b5a4e-1111-4000-8000-00000000c0de"
ATT_UID = "a2a2a2a2-0000-4000-8000-000000000002"
NS = "tenant"
PAT = ["--chunks", "4", "--chunk-size", "65536", "--size", str(SIZE)]


def pod_ctx(uid, name, ephemeral):
    return {"csi.storage.k8s.io/pod.uid": uid, "csi.storage.k8s.io/pod.namespace": NS,
            "csi.storage.k8s.io/pod.name": name,
            "csi.storage.k8s.io/serviceAccount.name": "default",
            "csi.storage.k8s.io/ephemeral": "true" if ephemeral else "false"}


def meta_ro(path):
    try:
        return json.load(open(os.path.join(path, "volume.json"))).get("read_only")
    except (OSError, ValueError) as e:
        return "unreadable: %s" % e


CORRUPTED = set()


def check_ro(s, attack, tgt, tgt_vol, writer=None):
    d, err = vhost_info(s.qsdctl, tgt)
    print("attack %-58s -> vhost-info %s" % (attack + ": client through the RO target",
                                             d if d else err))
    if s.check(d is not None, "%s: no vhost-user connection through %s: %s" % (attack, tgt, err)):
        s.check(d.get("read_only") is True, "%s: the disk through the read-only target is "
                "writable (vhost-info read_only=%s)" % (attack, d.get("read_only")))
    m = meta_ro(tgt)
    print("attack %-58s -> read_only=%s" % (attack + ": volume.json through the RO target", m))
    s.check(m is True, "%s: volume.json through the read-only target says read_only=%s" % (
        attack, m))
    rc, out = qsdctl_verify(s.qsdctl, tgt, "--write", "--seed", "666", *PAT)
    print("attack %-58s -> exit %d: %s" % (attack + ": qsdctl verify --write through it", rc,
                                           out.splitlines()[-1] if out else ""))
    wrote = not s.check(rc != 0, "%s: a write through the read-only target succeeded" % attack)
    if wrote:
        CORRUPTED.add(tgt_vol)
    if writer:
        if tgt_vol not in CORRUPTED:
            rc, out = qsdctl_verify(s.qsdctl, writer, "--check", "--seed", "1", *PAT)
            s.check(rc == 0, "%s: the writer's pattern changed (exit %d: %s)" % (attack, rc, out))
        dw, err = vhost_info(s.qsdctl, writer)
        s.check(dw is not None and dw.get("read_only") is False,
                "%s: the read-write publication is not writable: %s" % (attack, dw or err))
        s.check(meta_ro(writer) is False, "%s: volume.json of the writer says read_only=%s" % (
            attack, meta_ro(writer)))
    if d and d.get("read_only") is True:
        # the client says read-only: the server must refuse a write it tries anyway
        rc, out = qsdctl_verify(s.qsdctl, tgt, *PAT)
        print("attack %-58s -> exit %d: %s" % (attack + ": a write tried anyway (qsdctl verify)",
                                               rc, out.splitlines()[0] if out else ""))
        s.check(rc == 0 and "write refused" in out, "%s: the read-only export did not refuse "
                "a write (exit %d: %s)" % (attack, rc, out))
    if tgt_vol not in CORRUPTED:  # (once overwritten, the pattern proves nothing more)
        rc, out = qsdctl_verify(s.qsdctl, tgt, "--check", "--seed", "1", *PAT)
        s.check(rc == 0, "%s: the reader cannot read the pattern (exit %d: %s)" % (
            attack, rc, out))


def run(s):
    pb = s.pb
    s.create(VID, SIZE)
    s.stage(VID)   # SINGLE_NODE_WRITER
    tgt_w = s.publish(VID, "writer", ctx=pod_ctx("writer", "writer", False))
    rc, out = qsdctl_verify(s.qsdctl, tgt_w, "--write", "--seed", "1", *PAT)
    assert rc == 0, "setup: the writer cannot write: %s" % out

    # ---- F1
    tgt_r = s.publish(VID, "reader", ro=True, ctx=pod_ctx("reader", "reader", False))
    check_ro(s, "F1 RO publication beside a RW one", tgt_r, VID, tgt_w)
    s.after("F1")

    # ---- F2
    s.unpublish(VID, tgt_w)
    check_ro(s, "F2 RO publication alone", tgt_r, VID)
    s.after("F2")
    s.unpublish(VID, tgt_r)
    tgt_r2 = s.publish(VID, "reader-2", ro=True)
    check_ro(s, "F2 a fresh RO publication, no RW one", tgt_r2, VID)
    s.unpublish(VID, tgt_r2)
    s.after("F2 fresh")

    # ---- F3 read-only hot-plug
    bvid = "csi-bridge-vm"
    btgt = s.target(VM_UID, "inline-bridge")
    ctx = {"bridge": "true"}
    ctx.update(pod_ctx(VM_UID, "vm", True))
    s.ok("NodePublishVolume", pb.NodePublishVolumeRequest(
        volume_id=bvid, target_path=btgt, volume_capability=mount_cap(pb, group="107"),
        volume_context=ctx), "bridge publish")
    s.create(HVID, SIZE)
    s.stage(HVID)
    w = s.publish(HVID, "hot-writer")
    rc, out = qsdctl_verify(s.qsdctl, w, "--write", "--seed", "1", *PAT)
    assert rc == 0, "setup: cannot write the hot-plugged volume: %s" % out
    s.unpublish(HVID, w)
    rctx = {"hotplugInto": "vm", "disk": "data"}
    rctx.update(pod_ctx(ATT_UID, "attach", True))
    rtgt = s.target(ATT_UID, "inline-hotplug")
    s.ok("NodePublishVolume", pb.NodePublishVolumeRequest(
        volume_id="csi-req-att", target_path=rtgt, volume_capability=mount_cap(pb, group="107"),
        volume_context=rctx), "hot-plug request")
    ptgt = s.publish(HVID, ATT_UID, ro=True, ctx=pod_ctx(ATT_UID, "attach", False))
    seen = os.path.join(btgt, "data")
    if s.check(seclib.mounts_at(seen), "F3: no placement at %s" % seen):
        check_ro(s, "F3 RO hot-plug seen through the VM pod's bridge", seen, HVID)
    s.after("F3")
    s.unpublish(HVID, ptgt)
    s.unpublish("csi-req-att", rtgt)
    s.unpublish(bvid, btgt)
    s.unstage(HVID)
    s.unstage(VID)
    s.after("teardown")


if __name__ == "__main__":
    sys.exit(seclib.run_test(run, "qsd-sec-rox-"))
