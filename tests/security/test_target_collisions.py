#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 9, attacks E: one target, two volumes.

- E1 NodePublishVolume of volume B onto volume A's mounted target: refused
  (FAILED_PRECONDITION or ALREADY_EXISTS), A's mount untouched (still one
  mount there, still A's export); NodeUnpublishVolume of A afterwards removes
  only A's publication, and B is mounted nowhere;
- E2 B onto a path inside A's target (inside A's export directory): refused,
  nothing created in RUN/exports/A/;
- E3 B onto a bridge's target, and a bridge onto A's target: refused, the
  bridge (or A) untouched;
- E4 NodeStageVolume of C with a staging path equal to A's target: refused
  (FAILED_PRECONDITION or ALREADY_EXISTS), A untouched;
- E5 NodePublishVolume of B with A's staging path as target: refused the
  same way, nothing mounted there;
- E6 B onto a hot-plug request's target, and onto a target that is already
  a mount the plugin did not make (a tmpfs): refused; NodeUnpublishVolume of
  B there leaves that mount alone;
- E7 NodeUnpublishVolume naming another volume (or the bridge's id, or an
  unknown one) at a live target: the publication there stays.

usage: test_target_collisions.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seclib  # noqa: E402
from seclib import MiB, mount_cap  # noqa: E402

A, B, C = "pvc-a", "pvc-b", "pvc-c"
REFUSED = ("FAILED_PRECONDITION", "ALREADY_EXISTS")
VM_UID = "0d4b5a4e-1111-4000-8000-00000000c0de"


def exports_mounted(s, vid):
    """Mounts of vid's export under this test's root (other tests may run at once)."""
    return [m[0] for m in seclib.mountinfo()
            if m[1].endswith("/exports/" + vid) and seclib.under(m[0], s.root)]


def check_a(s, attack, tgt):
    ms = seclib.mounts_at(tgt)
    if s.check(len(ms) == 1, "%s: %d mounts at A's target (expected 1): %s" % (
            attack, len(ms), [m[1] for m in ms])):
        s.check(ms[0][1].endswith("/exports/" + A), "%s: A's target now shows %s" % (
            attack, ms[0][1]))
    s.works(attack, A, tgt)


def run(s):
    pb = s.pb
    for v in (A, B, C):
        s.create(v, 16 * MiB)
    s.stage(A)
    s.stage(B)
    tgt_a = s.publish(A, "pod-a")

    # ---- E1: B onto A's target
    code, msg, _ = s.call("E1 publish B onto A's mounted target", "NodePublishVolume",
                          s.publish_req(B, tgt_a))
    s.check(code in REFUSED, "E1: expected FAILED_PRECONDITION or ALREADY_EXISTS, got %s" %
            seclib.fmt(code, msg))
    s.after("E1")
    check_a(s, "E1", tgt_a)
    code, msg, _ = s.call("E1 then NodeUnpublishVolume of A", "NodeUnpublishVolume",
                          pb.NodeUnpublishVolumeRequest(volume_id=A, target_path=tgt_a))
    s.check(code == "OK", "E1: NodeUnpublishVolume of A: %s" % seclib.fmt(code, msg))
    s.check(not seclib.mounts_at(tgt_a), "E1: A's target still mounted after its unpublish")
    s.check(not exports_mounted(s, B), "E1: B is mounted at %s" % exports_mounted(s, B))
    s.check(not exports_mounted(s, A), "E1: A is still mounted at %s" % exports_mounted(s, A))
    # B's record must not claim A's target either: unpublishing it is a no-op
    code, msg, _ = s.call("E1 NodeUnpublishVolume of B at A's target", "NodeUnpublishVolume",
                          pb.NodeUnpublishVolumeRequest(volume_id=B, target_path=tgt_a))
    s.after("E1 unpublish")
    s.works_fresh("E1 (B's rightful user)", B)
    tgt_a = s.publish(A, "pod-a")

    # ---- E2: B inside A's target
    before = sorted(os.listdir(s.export_dir(A)))
    inner = os.path.join(tgt_a, "inner")
    code, msg, _ = s.call("E2 publish B inside A's target", "NodePublishVolume",
                          s.publish_req(B, inner))
    s.check(code != "OK", "E2: publishing B inside A's target was accepted")
    if code == "OK":
        s.call("E2 (undo)", "NodeUnpublishVolume",
               pb.NodeUnpublishVolumeRequest(volume_id=B, target_path=inner), quiet=True)
    s.check(sorted(os.listdir(s.export_dir(A))) == before, "E2: A's export dir changed: %s" %
            sorted(os.listdir(s.export_dir(A))))
    s.after("E2")
    check_a(s, "E2", tgt_a)

    # ---- E3: the bridge's target
    btgt = s.target(VM_UID, "inline-bridge")
    bctx = {"bridge": "true", "csi.storage.k8s.io/pod.uid": VM_UID,
            "csi.storage.k8s.io/pod.namespace": "ns", "csi.storage.k8s.io/pod.name": "vm",
            "csi.storage.k8s.io/ephemeral": "true"}
    bvid = "csi-bridge-vm"
    s.ok("NodePublishVolume", pb.NodePublishVolumeRequest(
        volume_id=bvid, target_path=btgt, volume_capability=mount_cap(pb, group="107"),
        volume_context=bctx), "bridge publish")
    code, msg, _ = s.call("E3 publish B onto a bridge's target", "NodePublishVolume",
                          s.publish_req(B, btgt))
    s.check(code in REFUSED, "E3: expected FAILED_PRECONDITION or ALREADY_EXISTS, got %s" %
            seclib.fmt(code, msg))
    ms = seclib.mounts_at(btgt)
    s.check(len(ms) == 1 and ms[0][1].endswith("/bridges/" + VM_UID),
            "E3: the bridge's target now holds %s" % [m[1] for m in ms])
    s.after("E3 B onto the bridge")
    if code == "OK":
        s.call("E3 (undo)", "NodeUnpublishVolume",
               pb.NodeUnpublishVolumeRequest(volume_id=B, target_path=btgt), quiet=True)
    # a second VM pod's bridge onto A's target
    ctx2 = dict(bctx)
    ctx2["csi.storage.k8s.io/pod.uid"] = "1d4b5a4e-1111-4000-8000-00000000c0de"
    ctx2["csi.storage.k8s.io/pod.name"] = "vm2"
    code, msg, _ = s.call("E3 publish a bridge onto A's target", "NodePublishVolume",
                          pb.NodePublishVolumeRequest(
                              volume_id="csi-bridge-vm2", target_path=tgt_a,
                              volume_capability=mount_cap(pb, group="107"), volume_context=ctx2))
    s.check(code in REFUSED, "E3: bridge onto A's target: expected FAILED_PRECONDITION or "
            "ALREADY_EXISTS, got %s" % seclib.fmt(code, msg))
    s.after("E3 bridge onto A")
    check_a(s, "E3 bridge onto A", tgt_a)
    if code == "OK":
        s.call("E3 (undo)", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
            volume_id="csi-bridge-vm2", target_path=tgt_a), quiet=True)
    code, msg, _ = s.call("E3 NodeUnpublishVolume of the bridge", "NodeUnpublishVolume",
                          pb.NodeUnpublishVolumeRequest(volume_id=bvid, target_path=btgt))
    s.check(code == "OK" and not seclib.mounts_at(btgt),
            "E3: bridge unpublish: %s, mounts left %s" % (seclib.fmt(code, msg),
                                                          seclib.mounts_at(btgt)))
    s.check(not exports_mounted(s, B), "E3: B is mounted at %s" % exports_mounted(s, B))

    # ---- E4: C's staging path is A's target
    if len(seclib.mounts_at(tgt_a)) != 1:  # an accepted E3 took A down: publish it again
        s.call("(repair)", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
            volume_id=A, target_path=tgt_a), quiet=True)
        tgt_a = s.publish(A, "pod-a")
    code, msg, _ = s.call("E4 stage C at A's target", "NodeStageVolume",
                          pb.NodeStageVolumeRequest(volume_id=C, staging_target_path=tgt_a,
                                                    volume_capability=mount_cap(pb, group="107")))
    s.check(code in REFUSED, "E4: expected FAILED_PRECONDITION or ALREADY_EXISTS, got %s" %
            seclib.fmt(code, msg))
    s.after("E4")
    check_a(s, "E4", tgt_a)
    code, msg, _ = s.call("E4 NodeUnstageVolume of C at A's target", "NodeUnstageVolume",
                          pb.NodeUnstageVolumeRequest(volume_id=C, staging_target_path=tgt_a))
    s.after("E4 unstage")
    check_a(s, "E4 unstage", tgt_a)
    s.works_fresh("E4 (C's rightful user)", C)

    # ---- E5: B's target is A's staging path
    stg_a = s.staging(A)
    code, msg, _ = s.call("E5 publish B at A's staging path", "NodePublishVolume",
                          s.publish_req(B, stg_a))
    s.check(code in REFUSED, "E5: expected FAILED_PRECONDITION or ALREADY_EXISTS, got %s" %
            seclib.fmt(code, msg))
    s.check(not seclib.mounts_at(stg_a), "E5: something is mounted at A's staging path")
    if code == "OK":
        s.call("E5 (undo)", "NodeUnpublishVolume",
               pb.NodeUnpublishVolumeRequest(volume_id=B, target_path=stg_a), quiet=True)
    s.after("E5")
    check_a(s, "E5", tgt_a)

    # ---- E6: a hot-plug request's target, and a target that is already a mount
    uid = "a6a6a6a6-0000-4000-8000-000000000006"
    rtgt = s.target(uid, "inline-hotplug")
    rctx = {"hotplugInto": "vm", "csi.storage.k8s.io/pod.uid": uid,
            "csi.storage.k8s.io/pod.namespace": "ns", "csi.storage.k8s.io/pod.name": "att",
            "csi.storage.k8s.io/ephemeral": "true"}
    s.ok("NodePublishVolume", pb.NodePublishVolumeRequest(
        volume_id=bvid, target_path=btgt, volume_capability=mount_cap(pb, group="107"),
        volume_context=bctx), "bridge publish")
    code, msg, _ = s.call("E6 hot-plug request (setup)", "NodePublishVolume",
                          pb.NodePublishVolumeRequest(volume_id="csi-req-e6", target_path=rtgt,
                                                      volume_capability=mount_cap(pb, group="107"),
                                                      volume_context=rctx))
    if code == "OK":
        code, msg, _ = s.call("E6 publish B onto a hot-plug request's target",
                              "NodePublishVolume", s.publish_req(B, rtgt))
        s.check(code in REFUSED, "E6: B onto a request's target: expected FAILED_PRECONDITION or "
                "ALREADY_EXISTS, got %s" % seclib.fmt(code, msg))
        s.check(not exports_mounted(s, B), "E6: B is mounted at %s" % exports_mounted(s, B))
        if code == "OK":
            s.call("E6 (undo)", "NodeUnpublishVolume",
                   pb.NodeUnpublishVolumeRequest(volume_id=B, target_path=rtgt), quiet=True)
        s.call("E6 request unpublish", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
            volume_id="csi-req-e6", target_path=rtgt), quiet=True)
    s.call("E6 bridge unpublish", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
        volume_id=bvid, target_path=btgt), quiet=True)
    s.after("E6 request target")
    foreign = s.target("pod-foreign", B)
    os.makedirs(foreign, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "foreign", foreign],
                   check=True)
    with open(os.path.join(foreign, "theirs"), "w") as f:
        f.write("someone else's mount\n")
    code, msg, _ = s.call("E6 publish B onto a foreign mount", "NodePublishVolume",
                          s.publish_req(B, foreign))
    s.check(code in REFUSED, "E6: B onto a foreign mount: expected FAILED_PRECONDITION or "
            "ALREADY_EXISTS, got %s" % seclib.fmt(code, msg))
    ms = seclib.mounts_at(foreign)
    s.check(len(ms) == 1 and os.path.exists(os.path.join(foreign, "theirs")),
            "E6: the foreign mount was covered or changed: %s" % [m[1] for m in ms])
    if code == "OK":
        s.call("E6 (undo)", "NodeUnpublishVolume",
               pb.NodeUnpublishVolumeRequest(volume_id=B, target_path=foreign), quiet=True)
    code, msg, _ = s.call("E6 unpublish B at the foreign mount", "NodeUnpublishVolume",
                          pb.NodeUnpublishVolumeRequest(volume_id=B, target_path=foreign))
    s.check(seclib.mounts_at(foreign) and os.path.exists(os.path.join(foreign, "theirs")),
            "E6: NodeUnpublishVolume of B removed a mount that was never B's")
    subprocess.run(["umount", "-l", foreign], check=False)
    s.after("E6 foreign mount")

    # ---- E7: NodeUnpublishVolume naming the wrong volume at a live target
    s.ok("NodePublishVolume", pb.NodePublishVolumeRequest(
        volume_id=bvid, target_path=btgt, volume_capability=mount_cap(pb, group="107"),
        volume_context=bctx), "bridge publish")
    for what, vid, t in (("B at A's target", B, tgt_a), ("the bridge's id at A's target", bvid,
                                                         tgt_a),
                         ("A at the bridge's target", A, btgt),
                         ("an unknown inline id at the bridge's target", "csi-0123456789", btgt),
                         ("an unknown volume at A's target", "pvc-nobody", tgt_a)):
        code, msg, _ = s.call("E7 NodeUnpublishVolume of %s" % what, "NodeUnpublishVolume",
                              pb.NodeUnpublishVolumeRequest(volume_id=vid, target_path=t))
        s.after("E7 " + what)
        ms = seclib.mounts_at(t)
        want = "/exports/" + A if t == tgt_a else "/bridges/" + VM_UID
        s.check(len(ms) == 1 and ms[0][1].endswith(want),
                "E7 %s: the publication there was removed or changed: %s" % (
                    what, [m[1] for m in ms]))
    check_a(s, "E7", tgt_a)
    s.call("E7 bridge unpublish", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
        volume_id=bvid, target_path=btgt), quiet=True)

    s.unpublish(A, tgt_a)
    for v in (A, B, C):
        s.call("teardown", "NodeUnstageVolume", pb.NodeUnstageVolumeRequest(
            volume_id=v, staging_target_path=s.staging(v)), quiet=True)


if __name__ == "__main__":
    sys.exit(seclib.run_test(run, "qsd-sec-coll-"))
