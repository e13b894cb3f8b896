#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The hot-plug bridge (docs/hotplug-bridge.md), driven like kubelet with real
mounts under a temporary kubelet root:

- a VM pod's inline bridge volume (bridge: "true") becomes a shared bind of
  RUN/bridges/<pod-uid> on its target; its record is in the state dir;
- an attachment pod's PVC + hot-plug request (hotplugInto: <vm pod>) are
  matched by pod uid in either order and the PVC's export directory appears
  in the bridge, seen through the VM pod's target (mount propagation), and a
  vhost-user client connects there;
- refusals leave nothing placed: another namespace (NOT_FOUND), a disk name
  in use or an entry of that name (FAILED_PRECONDITION), a bad disk name or
  unknown attribute (INVALID_ARGUMENT), another group (FAILED_PRECONDITION);
- unplug: NodeUnpublish of the PVC (or of the request) removes the placement
  at once; NodeUnstage answers FAILED_PRECONDITION while a client holds the
  socket and succeeds once it disconnects; after --unplug-timeout it stops
  the QSD anyway;
- kill -9 of the plugin with a live bridge whose mounts were lost: the new
  plugin re-creates them from its records, and hot-plug keeps working.

usage: test_csi_bridge.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import json
import os
import signal
import stat
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402
from csilib import mount_cap, is_mount_point, expect_code  # noqa: E402

import grpc  # noqa: E402

MiB = 1 << 20
GID = "107"
UNPLUG_TIMEOUT = 3
NS = "vm-demo"
VM = "demo-vm"
VM_UID = "0d4b5a4e-1111-4000-8000-00000000c0de"


def vhost_info(qsdctl, d):
    """vhost-user client through directory d (relative: kubelet paths are long)."""
    r = subprocess.run([qsdctl, "vhost-info", "--json", "--timeout-ms", "5000", "./vhost.sock"],
                       cwd=d, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise AssertionError("vhost-info in %s failed (%d): %s" % (d, r.returncode, r.stderr))
    return json.loads(r.stdout)


def hold_client(qsdctl, d):
    """A vhost-user client that stays connected (waits for a config change),
    returned once it says it is connected and past the handshake (bounded:
    a fixed pause may end before it connects on a loaded machine, and the
    unstage expected to wait for it would then succeed)."""
    import tempfile
    err = tempfile.TemporaryFile()
    p = subprocess.Popen([qsdctl, "vhost-info", "--json", "--timeout-ms", "5000",
                          "--wait-config-change-ms", "120000", "./vhost.sock"], cwd=d,
                         stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 30
    while True:
        err.seek(0)
        said = err.read()
        if b"waiting for a config change" in said:
            break
        assert p.poll() is None, "held client exited early: %s" % said[-300:]
        assert time.monotonic() < deadline, "held client not connected within 30 s"
        time.sleep(0.02)
    err.close()
    return p


def drop_client(p):
    if p.poll() is None:
        p.kill()
    p.wait(timeout=10)


class K:
    """What kubelet would send for one node."""

    def __init__(self, env):
        self.env = env
        self.c = env.client
        self.pb = env.pb
        self.cap = mount_cap(env.pb, group=GID)

    def pod_ctx(self, uid, ns, name, ephemeral):
        return {"csi.storage.k8s.io/pod.uid": uid, "csi.storage.k8s.io/pod.namespace": ns,
                "csi.storage.k8s.io/pod.name": name,
                "csi.storage.k8s.io/serviceAccount.name": "default",
                "csi.storage.k8s.io/ephemeral": "true" if ephemeral else "false"}

    def target(self, uid, name):
        t = os.path.join(self.env.kubelet, "pods", uid, "volumes/kubernetes.io~csi", name, "mount")
        os.makedirs(os.path.dirname(t), exist_ok=True)
        return t

    def staging(self, vid):
        return os.path.join(self.env.kubelet, "plugins/kubernetes.io/csi/test.qsd-csi.dev",
                            vid, "globalmount")

    def inline(self, uid, ns, name, attrs, group=GID, vid=None):
        """NodePublish of an inline ephemeral volume; returns (volume id, target)."""
        vid = vid or "csi-" + (uid + "-" + "-".join(sorted(attrs))).replace(".", "")[:60]
        tgt = self.target(uid, "inline-" + "-".join(sorted(attrs)))
        ctx = dict(attrs)
        ctx.update(self.pod_ctx(uid, ns, name, True))
        self.c.NodePublishVolume(self.pb.NodePublishVolumeRequest(
            volume_id=vid, target_path=tgt, volume_capability=mount_cap(self.pb, group=group),
            volume_context=ctx), timeout=csilib.CALL_TIMEOUT)
        return vid, tgt

    def inline_req(self, uid, ns, name, attrs, group=GID):
        vid = "csi-" + (uid + "-" + "-".join(sorted(attrs))).replace(".", "")[:60]
        tgt = self.target(uid, "inline-" + "-".join(sorted(attrs)))
        ctx = dict(attrs)
        ctx.update(self.pod_ctx(uid, ns, name, True))
        return vid, tgt, self.pb.NodePublishVolumeRequest(
            volume_id=vid, target_path=tgt, volume_capability=mount_cap(self.pb, group=group),
            volume_context=ctx)

    def create_stage(self, vid, size):
        self.c.CreateVolume(self.pb.CreateVolumeRequest(
            name=vid, capacity_range=self.pb.CapacityRange(required_bytes=size),
            volume_capabilities=[self.cap]), timeout=csilib.CALL_TIMEOUT)
        stg = self.staging(vid)
        os.makedirs(stg, exist_ok=True)
        self.c.NodeStageVolume(self.pb.NodeStageVolumeRequest(
            volume_id=vid, staging_target_path=stg, volume_capability=self.cap),
            timeout=csilib.CALL_TIMEOUT)

    def pvc_req(self, vid, uid, ns, name, group=GID):
        tgt = self.target(uid, vid)
        return tgt, self.pb.NodePublishVolumeRequest(
            volume_id=vid, staging_target_path=self.staging(vid), target_path=tgt,
            volume_capability=mount_cap(self.pb, group=group),
            volume_context=self.pod_ctx(uid, ns, name, False))

    def pvc(self, vid, uid, ns, name):
        tgt, req = self.pvc_req(vid, uid, ns, name)
        self.c.NodePublishVolume(req, timeout=csilib.CALL_TIMEOUT)
        return tgt

    def unpublish(self, vid, tgt):
        t0 = time.monotonic()
        self.c.NodeUnpublishVolume(self.pb.NodeUnpublishVolumeRequest(volume_id=vid,
                                                                      target_path=tgt),
                                   timeout=csilib.CALL_TIMEOUT)
        return time.monotonic() - t0

    def unstage(self, vid):
        self.c.NodeUnstageVolume(self.pb.NodeUnstageVolumeRequest(
            volume_id=vid, staging_target_path=self.staging(vid)), timeout=csilib.CALL_TIMEOUT)


def main():
    qsdctl = sys.argv[3]
    env = csilib.Env(sys.argv[1], sys.argv[2], prefix="qsd-bridge-")
    try:
        run(env, qsdctl)
    finally:
        if sys.exc_info()[0] is not None:
            print("---- plugin log (tail)\n" + env.log_tail(80))
        env.cleanup()


def placed(env, disk):
    return os.path.isdir(os.path.join(env.run, "bridges", VM_UID, disk))


def run(env, qsdctl):
    env.start(["--unplug-timeout", str(UNPLUG_TIMEOUT)])
    k = K(env)
    pb = env.pb
    T = csilib.CALL_TIMEOUT
    OK_ = grpc.StatusCode

    # ---- the VM pod's bridge
    bvid, btgt = k.inline(VM_UID, NS, VM, {"bridge": "true"})
    bdir = os.path.join(env.run, "bridges", VM_UID)
    assert is_mount_point(btgt) and is_mount_point(bdir), "bridge not mounted"
    st = os.stat(bdir)
    assert stat.S_IMODE(st.st_mode) == 0o750 and st.st_gid == int(GID), oct(st.st_mode)
    rec = json.load(open(os.path.join(env.state, "bridges", VM_UID + ".json")))
    assert rec["namespace"] == NS and rec["pod"] == VM and rec["target"] == btgt, rec
    with open("/proc/self/mountinfo") as f:
        line = [ln for ln in f if ln.split()[4] == bdir][-1]
    assert "shared:" in line, line
    k.inline(VM_UID, NS, VM, {"bridge": "true"}, vid=bvid)  # idempotent
    print("ok bridge published: %s (0750 root:%s, shared) on %s" % (bdir, GID, btgt))

    # Bad inline volumes.
    _, _, r = k.inline_req(VM_UID, NS, VM, {"bridge": "true", "color": "blue"})
    expect_code(k.c.NodePublishVolume, r, OK_.INVALID_ARGUMENT, "unknown attribute")
    _, _, r = k.inline_req("1234", NS, VM, {"size": "1G"})
    expect_code(k.c.NodePublishVolume, r, OK_.INVALID_ARGUMENT, "not a bridge or request")
    _, _, r = k.inline_req("1234", NS, VM, {"bridge": "true"})
    del r.volume_context["csi.storage.k8s.io/pod.uid"]
    expect_code(k.c.NodePublishVolume, r, OK_.INVALID_ARGUMENT, "no pod info")
    print("ok bad inline volumes refused (INVALID_ARGUMENT)")

    for v in ("pvc-a", "pvc-b", "pvc-c", "pvc-d", "pvc-e"):
        k.create_stage(v, 16 * MiB if v != "pvc-b" else 32 * MiB)

    # ---- order 1: request first, then the PVC
    U2 = "a2a2a2a2-0000-4000-8000-000000000002"
    rvid2, rtgt2 = k.inline(U2, NS, "attach-a", {"hotplugInto": VM, "disk": "data"})
    assert not placed(env, "data")
    t0 = time.monotonic()
    ptgt_a = k.pvc("pvc-a", U2, NS, "attach-a")
    assert placed(env, "data") and is_mount_point(os.path.join(bdir, "data"))
    seen = os.path.join(btgt, "data")
    assert is_mount_point(seen), "placement did not propagate to the VM pod's target"
    d = vhost_info(qsdctl, seen)
    assert d["capacity"] == 16 * MiB, d
    assert json.load(open(os.path.join(seen, "volume.json")))["volume"] == "pvc-a"
    print("ok request then PVC: pvc-a placed as 'data' (%.0f ms), client connects through the "
          "VM pod's target" % ((time.monotonic() - t0) * 1000))

    # ---- order 2: PVC first, then the request (disk name = volume id)
    U3 = "a3a3a3a3-0000-4000-8000-000000000003"
    ptgt_b = k.pvc("pvc-b", U3, NS, "attach-b")
    assert not placed(env, "pvc-b")
    rvid3, rtgt3 = k.inline(U3, NS, "attach-b", {"hotplugInto": VM})
    assert is_mount_point(os.path.join(btgt, "pvc-b"))
    assert vhost_info(qsdctl, os.path.join(btgt, "pvc-b"))["capacity"] == 32 * MiB
    k.inline(U3, NS, "attach-b", {"hotplugInto": VM}, vid=rvid3)  # idempotent
    k.pvc("pvc-b", U3, NS, "attach-b")  # idempotent
    print("ok PVC then request: pvc-b placed under its volume id")

    # ---- refusals: nothing placed
    before = sorted(os.listdir(bdir))
    U4 = "a4a4a4a4-0000-4000-8000-000000000004"
    _, rt4, r = k.inline_req(U4, "other-ns", "attach-x", {"hotplugInto": VM})
    msg = expect_code(k.c.NodePublishVolume, r, OK_.NOT_FOUND, "other namespace")
    assert "namespace other-ns" in msg, msg
    k.pvc("pvc-c", U4, "other-ns", "attach-x")  # an ordinary publish
    assert sorted(os.listdir(bdir)) == before
    print("ok another namespace refused (NOT_FOUND: %s)" % msg)

    U5 = "a5a5a5a5-0000-4000-8000-000000000005"
    ptgt_d = k.pvc("pvc-d", U5, NS, "attach-d")
    _, _, r = k.inline_req(U5, NS, "attach-d", {"hotplugInto": VM, "disk": "data"})
    msg = expect_code(k.c.NodePublishVolume, r, OK_.FAILED_PRECONDITION, "name clash")
    os.mkdir(os.path.join(bdir, "root"))  # what a runtime makes for a PVC mounted in the bridge
    _, _, r = k.inline_req(U5, NS, "attach-d", {"hotplugInto": VM, "disk": "root"})
    expect_code(k.c.NodePublishVolume, r, OK_.FAILED_PRECONDITION, "existing entry")
    _, _, r = k.inline_req(U5, NS, "attach-d", {"hotplugInto": VM, "disk": "../etc"})
    expect_code(k.c.NodePublishVolume, r, OK_.INVALID_ARGUMENT, "bad disk name")
    _, _, r = k.inline_req(U5, NS, "attach-d", {"hotplugInto": VM, "disk": "x"}, group="108")
    expect_code(k.c.NodePublishVolume, r, OK_.FAILED_PRECONDITION, "other group")
    _, _, r = k.inline_req(U5, NS, "attach-d", {"hotplugInto": "no-such-vm"})
    expect_code(k.c.NodePublishVolume, r, OK_.NOT_FOUND, "unknown VM pod")
    assert sorted(os.listdir(bdir)) == sorted(before + ["root"]), os.listdir(bdir)
    # The PVC-side refusal (request first, then a PVC whose name clashes).
    U6 = "a6a6a6a6-0000-4000-8000-000000000006"
    k.inline(U6, NS, "attach-e", {"hotplugInto": VM, "disk": "pvc-b"})
    tgt_e, r = k.pvc_req("pvc-e", U6, NS, "attach-e")
    expect_code(k.c.NodePublishVolume, r, OK_.FAILED_PRECONDITION, "clash at PVC publish")
    assert not os.path.exists(tgt_e) and not placed(env, "pvc-e")
    print("ok refused, nothing placed: name in use (%s), existing entry, bad name, other group, "
          "unknown VM pod, clash at PVC publish" % msg)

    # ---- unplug with a connected client: NodeUnstage waits for it
    held = hold_client(qsdctl, seen)
    dt = k.unpublish("pvc-a", ptgt_a)
    assert dt < 2.0, dt
    assert not os.path.exists(os.path.join(bdir, "data")) and not os.path.exists(seen)
    assert not os.path.exists(ptgt_a)
    msg = expect_code(k.c.NodeUnstageVolume, pb.NodeUnstageVolumeRequest(
        volume_id="pvc-a", staging_target_path=k.staging("pvc-a")), OK_.FAILED_PRECONDITION,
        "unstage under a client")
    assert "still in use" in msg, msg
    assert "pvc-a" in env.qsd_pids()
    drop_client(held)
    deadline = time.monotonic() + 10
    while True:
        try:
            k.unstage("pvc-a")
            break
        except grpc.RpcError as e:
            if e.code() != OK_.FAILED_PRECONDITION or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    assert "pvc-a" not in env.qsd_pids()
    k.unpublish(rvid2, rtgt2)
    assert not os.path.exists(rtgt2)
    print("ok unplug: NodeUnpublish returned in %.0f ms; NodeUnstage refused while a client "
          "was connected (%s), done after it left" % (dt * 1000, msg))

    # ---- forced stop after --unplug-timeout (request volume unpublished first)
    held = hold_client(qsdctl, os.path.join(btgt, "pvc-b"))
    qsd_b = env.qsd_pids()["pvc-b"]
    k.unpublish(rvid3, rtgt3)
    assert not placed(env, "pvc-b")
    t_left = time.monotonic()
    k.unpublish("pvc-b", ptgt_b)
    expect_code(k.c.NodeUnstageVolume, pb.NodeUnstageVolumeRequest(
        volume_id="pvc-b", staging_target_path=k.staging("pvc-b")), OK_.FAILED_PRECONDITION,
        "unstage before the timeout")
    while True:
        try:
            k.unstage("pvc-b")
            break
        except grpc.RpcError as e:
            if e.code() != OK_.FAILED_PRECONDITION or time.monotonic() - t_left > 3 * UNPLUG_TIMEOUT:
                raise
            time.sleep(0.25)
    waited = time.monotonic() - t_left
    assert waited >= UNPLUG_TIMEOUT - 0.5, waited
    assert held.wait(timeout=10) is not None  # the client lost its server
    assert not os.path.exists("/proc/%d" % qsd_b) or \
        open("/proc/%d/stat" % qsd_b).read().split()[2] == "Z"
    assert "unplug timeout: stopping the QSD under a connected client" in env.log_tail(200)
    print("ok forced stop %.1f s after the volume left the bridge (timeout %d s), error logged" %
          (waited, UNPLUG_TIMEOUT))

    # ---- restart with a live bridge whose mounts were lost meanwhile
    k.unpublish("pvc-c", k.target(U4, "pvc-c"))
    U7 = "a7a7a7a7-0000-4000-8000-000000000007"
    k.inline(U7, NS, "attach-c", {"hotplugInto": VM, "disk": "late"})
    k.pvc("pvc-c", U7, NS, "attach-c")
    assert is_mount_point(os.path.join(btgt, "late"))
    env.stop(signal.SIGKILL)
    subprocess.run(["umount", os.path.join(bdir, "late")], check=True)
    subprocess.run(["umount", bdir], check=True)
    assert not is_mount_point(os.path.join(btgt, "late")) and not is_mount_point(bdir)
    env.start(["--unplug-timeout", str(UNPLUG_TIMEOUT)])
    k.c = env.client
    assert is_mount_point(bdir) and is_mount_point(os.path.join(bdir, "late"))
    assert is_mount_point(os.path.join(btgt, "late")), "restored placement not in the VM pod"
    assert vhost_info(qsdctl, os.path.join(btgt, "late"))["capacity"] == 16 * MiB
    # Still one peer group: a new placement reaches the VM pod's target.
    k.unpublish("pvc-d", ptgt_d)
    U8 = "a8a8a8a8-0000-4000-8000-000000000008"
    k.pvc("pvc-d", U8, NS, "attach-d2")
    k.inline(U8, NS, "attach-d2", {"hotplugInto": VM, "disk": "after-restart"})
    assert is_mount_point(os.path.join(btgt, "after-restart"))
    assert vhost_info(qsdctl, os.path.join(btgt, "after-restart"))["capacity"] == 16 * MiB
    print("ok plugin kill -9 + lost mounts: bridge and placement restored, new hot-plug works")

    # ---- the VM pod goes: its bridge is removed with every placement
    k.unpublish(bvid, btgt)
    assert not os.path.exists(btgt) and not os.path.exists(bdir)
    k.unpublish(bvid, btgt)  # kubelet retrying: OK, nothing there
    assert not os.path.exists(os.path.join(env.state, "bridges", VM_UID + ".json"))
    with open("/proc/self/mountinfo") as f:
        left = [ln.split()[4] for ln in f if "/bridges/" in ln.split()[4] and env.root in ln]
    assert not left, left
    print("ok bridge unpublished: placements, mounts, directory and record gone")

    # Everything else down, like kubelet would.
    for v, uid in (("pvc-c", U7), ("pvc-d", U8)):
        k.unpublish(v, k.target(uid, v))
    for v in ("pvc-c", "pvc-d", "pvc-e"):
        k.unstage(v)
    reqs = os.listdir(os.path.join(env.state, "hotplug"))
    assert len(reqs) == 3, reqs  # U6, U7, U8 requests are still published (kubelet unpublishes)
    assert env.stop() == 0
    print("ok cleanup")


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
