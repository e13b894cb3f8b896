#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 9, attacks A and G: what a VM pod (root in its container) can do to
the directories the plugin publishes to it.

- A PVC's target (the bind of RUN/exports/<vol>/, published read-write as a
  VM pod's disk is): a bind mount with ro,nosuid,nodev,noexec; creating,
  renaming, removing, chmod-ing anything there fails with EROFS; a vhost-user
  client still connects to vhost.sock through it.
- A hot-plug bridge's target (the bind of RUN/bridges/<pod-uid>/) and every
  placement inside it, seen through the VM pod's target: the same.
- G, filling: since the tenant can create nothing in its published
  directories nor in its bridge, it cannot fill the run directory (tmpfs
  /run on a node) through them.  What remains bounded by the plugin, not by
  the tenant: per staged volume one volume.json (< 4 KiB) and one socket in
  RUN/exports/<vol>/, one QMP socket, qsd.json and qsd.log in RUN/ctl/<vol>/
  (the QSD's stderr; a tenant cannot make QSD log without limit through a
  vhost-user socket), per bridge one directory and one empty directory per
  placement; the number of staged volumes is bounded by --max-volumes, of
  bridges and placements by the pods kubelet runs on the node.

usage: test_readonly_mounts.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seclib  # noqa: E402
from seclib import MiB, mounts_at  # noqa: E402

VM_UID = "0d4b5a4e-1111-4000-8000-00000000c0de"
ATT_UID = "a2a2a2a2-0000-4000-8000-000000000002"
NS = "tenant"


def pod_ctx(uid, name, ephemeral):
    return {"csi.storage.k8s.io/pod.uid": uid, "csi.storage.k8s.io/pod.namespace": NS,
            "csi.storage.k8s.io/pod.name": name,
            "csi.storage.k8s.io/serviceAccount.name": "default",
            "csi.storage.k8s.io/ephemeral": "true" if ephemeral else "false"}


def run(s):
    pb = s.pb
    vid = "pvc-ro-mounts"
    s.create(vid, 16 * MiB)
    s.stage(vid)
    tgt = s.publish(vid, VM_UID, ctx=pod_ctx(VM_UID, "vm", False))

    # ---- A: the PVC's target, published read-write (a VM pod's disk)
    s.check_ro_mount("a read-write PVC publication", tgt)
    s.try_write("the PVC target", tgt)
    s.after("A: writes in the PVC target")
    s.works("A: after writes in the PVC target", vid, tgt)
    # a second pod's read-only publication (readOnly: true) of the same volume
    tgt_ro = s.publish(vid, "ro-pod", ro=True, ctx=pod_ctx("ro-pod", "reader", False))
    s.check_ro_mount("a readonly=true publication", tgt_ro)
    s.try_write("the readonly=true target", tgt_ro)
    s.after("A: writes in the readonly=true target")
    s.works("A: after writes in the readonly=true target", vid, tgt_ro)
    s.unpublish(vid, tgt_ro)
    print("-- A: PVC target done")

    # ---- A: the bridge's target and a placement inside it
    bvid = "csi-bridge-" + VM_UID[:8]
    btgt = s.target(VM_UID, "inline-bridge")
    ctx = {"bridge": "true"}
    ctx.update(pod_ctx(VM_UID, "vm", True))
    s.ok("NodePublishVolume", pb.NodePublishVolumeRequest(
        volume_id=bvid, target_path=btgt, volume_capability=seclib.mount_cap(pb, group="107"),
        volume_context=ctx), "bridge publish")
    s.check_ro_mount("the bridge's target", btgt)
    s.try_write("the bridge target", btgt)
    s.after("A: writes in the bridge target")

    hvid = "pvc-hotplugged"
    s.create(hvid, 16 * MiB)
    s.stage(hvid)
    rtgt = s.target(ATT_UID, "inline-hotplug")
    rctx = {"hotplugInto": "vm", "disk": "data"}
    rctx.update(pod_ctx(ATT_UID, "attach", True))
    s.ok("NodePublishVolume", pb.NodePublishVolumeRequest(
        volume_id="csi-req-" + ATT_UID[:8], target_path=rtgt,
        volume_capability=seclib.mount_cap(pb, group="107"), volume_context=rctx),
        "hot-plug request")
    ptgt = s.publish(hvid, ATT_UID, ctx=pod_ctx(ATT_UID, "attach", False))
    seen = os.path.join(btgt, "data")
    if s.check(mounts_at(seen), "placement %s not visible through the bridge target" % seen):
        s.check_ro_mount("a placement seen through the bridge target", seen)
        s.try_write("a placement in the bridge", seen)
        s.after("A: writes in a placement")
        s.works("A: after writes in a placement", hvid, seen)
    # The attachment pod's own PVC target is a publication like any other.
    s.check_ro_mount("the attachment pod's PVC target", ptgt)

    # ---- G: filling what the tenant can reach
    print("attack %-58s -> every tenant-visible directory refused writes above (EROFS)" %
          "G: fill the run dir through published dirs")
    before = seclib.run_usage(s.run)
    for d in (tgt, btgt, seen):
        try:
            fd = os.open(os.path.join(d, "fill"), os.O_CREAT | os.O_WRONLY, 0o600)
        except OSError:
            continue
        try:
            for _ in range(4):
                os.write(fd, b"\xff" * MiB)
        except OSError:
            pass
        finally:
            os.close(fd)
            os.unlink(os.path.join(d, "fill"))
        s.check(False, "G: the tenant wrote 4 MiB into %s" % d)
    grew = seclib.run_usage(s.run) - before
    s.check(grew <= 64 * 1024, "G: the run dir grew by %d KiB" % (grew // 1024))
    s.after("G: filling")

    # the rightful users still fine, then everything down like kubelet
    s.works("after all", vid, tgt)
    s.unpublish(hvid, ptgt)
    s.unpublish(vid, tgt)
    s.unpublish(bvid, btgt)
    s.unstage(hvid)
    s.unstage(vid)
    s.after("teardown")


if __name__ == "__main__":
    sys.exit(seclib.run_test(run, "qsd-sec-ro-"))
