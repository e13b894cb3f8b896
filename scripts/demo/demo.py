#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The main job: one node, no cluster.  Starts qsd-csi-plugin with a local
pool, drives it the way kubelet and the CSI sidecars do (real mounts under a
temporary kubelet root), starts qsd-vm-launcher the way a VM pod would (in its
own mount namespace, like a container), and narrates:

  the VM boots and sees its disk; a second volume is hot-plugged into the
  running VM through the pod's bridge; the first volume is expanded and the
  guest sees the new size; a live snapshot is restored into a new volume whose
  content matches; the hot-plugged disk is unplugged (its QSD stops only after
  the guest released it); everything is cleaned up.

usage: demo.py BUILD_DIR   (run by scripts/demo.sh)
"""
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "tests", "csi"))
import csilib  # noqa: E402
from csilib import mount_cap  # noqa: E402

import grpc  # noqa: E402

MiB = 1 << 20
T0 = time.monotonic()
DRIVER = "qsd.csi.qsd-csi.dev"
NS = "vm-demo"
TIMINGS = []


def say(msg):
    print("[%6.1fs] %s" % (time.monotonic() - T0, msg), flush=True)


def step(title):
    print("\n\033[1m== %s\033[0m" % title, flush=True)


class Console:
    """Follows the guest's serial console file and prints its DEMO lines."""

    def __init__(self, path):
        self.path = path
        self.lines = []
        self.stop = False
        self.thread = threading.Thread(target=self.follow, daemon=True)
        self.thread.start()

    def follow(self):
        pos, partial = 0, b""
        while not self.stop:
            try:
                with open(self.path, "rb") as f:
                    f.seek(pos)
                    data = f.read()
                    pos += len(data)
                # Only whole lines: the guest may be half-way through one.
                data = partial + data
                cut = data.rfind(b"\n") + 1
                data, partial = data[:cut], data[cut:]
                for raw in data.decode(errors="replace").replace("\r", "").splitlines():
                    if raw.startswith("DEMO "):
                        self.lines.append((time.monotonic(), raw[5:]))
                        say("guest: " + raw[5:])
            except OSError:
                pass
            time.sleep(0.05)

    def wait(self, text, timeout, since=0.0):
        """Seconds from `since` until a console line containing text appeared."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, line in self.lines:
                if t >= since and text in line:
                    return t - since if since else t
            time.sleep(0.05)
        raise RuntimeError("the guest did not report '%s' within %ds" % (text, timeout))


def pod_info(name, uid):
    return {"csi.storage.k8s.io/pod.name": name, "csi.storage.k8s.io/pod.namespace": NS,
            "csi.storage.k8s.io/pod.uid": uid, "csi.storage.k8s.io/serviceAccount.name": "default"}


def run(env, build):
    pb, k = env.pb, env.kubelet
    T = csilib.CALL_TIMEOUT
    qsdctl = os.path.join(build, "qsdctl", "qsdctl")
    launcher = os.path.join(build, "launcher", "qsd-vm-launcher")
    cache = os.path.join(build, "tests", "launcher", "cache")

    step("Preparing a test VM (Debian kernel + busybox, cached in the build tree)")
    work = os.path.join(env.root, "vm")
    os.makedirs(work)
    subprocess.run(["bash", os.path.join(SRC, "tests", "guest", "build-guest.sh"),
                    os.path.join(cache, "guest"), os.path.join(HERE, "guest.sh"),
                    os.path.join(work, "initrd.img")], check=True, stdout=subprocess.DEVNULL,
                   timeout=600)
    subprocess.run(["cp", os.path.join(cache, "guest", "vmlinuz"), work], check=True)
    lroot = os.path.join(env.root, "lroot")
    if os.path.isdir(os.path.join(cache, "embed-cache", "qemu")):
        os.makedirs(os.path.join(lroot, "cache"))
        subprocess.run(["cp", "-a", os.path.join(cache, "embed-cache", "qemu"),
                        os.path.join(lroot, "cache", "qemu")], check=True)
    say("kernel and initramfs ready")

    step("1. The CSI plugin, as kubelet's node-driver-registrar sees it")
    c = env.start()
    info = c.GetPluginInfo(pb.GetPluginInfoRequest(), timeout=T)
    node = c.NodeGetInfo(pb.NodeGetInfoRequest(), timeout=T)
    probe = c.Probe(pb.ProbeRequest(), timeout=T)
    say("plugin %s %s on node %s, ready=%s, topology %s" % (
        info.name, info.vendor_version, node.node_id, probe.ready.value,
        dict(node.accessible_topology.segments)))

    def create(name, size, params=None, source=None):
        req = pb.CreateVolumeRequest(
            name=name, capacity_range=pb.CapacityRange(required_bytes=size),
            volume_capabilities=[mount_cap(pb)], parameters=params or {})
        if source:
            req.volume_content_source.CopyFrom(source)
        t = time.monotonic()
        v = c.CreateVolume(req, timeout=T).volume
        say("CreateVolume %s: %d MiB (%.0f ms)" % (v.volume_id, v.capacity_bytes // MiB,
                                                    (time.monotonic() - t) * 1000))
        return v

    def stage_publish(vid, pod_uid, pod_name, extra_ctx=None):
        stg = os.path.join(k, "plugins/kubernetes.io/csi", DRIVER, vid.split("@")[0][-12:], "globalmount")
        tgt = os.path.join(k, "pods", pod_uid, "volumes/kubernetes.io~csi", vid, "mount")
        os.makedirs(stg, exist_ok=True)
        os.makedirs(os.path.dirname(tgt), exist_ok=True)
        t = time.monotonic()
        c.NodeStageVolume(pb.NodeStageVolumeRequest(
            volume_id=vid, staging_target_path=stg, volume_capability=mount_cap(pb)), timeout=T)
        ctx = pod_info(pod_name, pod_uid)
        ctx.update(extra_ctx or {})
        c.NodePublishVolume(pb.NodePublishVolumeRequest(
            volume_id=vid, staging_target_path=stg, target_path=tgt,
            volume_capability=mount_cap(pb), volume_context=ctx), timeout=T)
        say("NodeStageVolume + NodePublishVolume %s for pod %s (%.0f ms): QSD started, "
            "socket directory bind-mounted at .../%s" % (
                vid, pod_name, (time.monotonic() - t) * 1000, os.path.relpath(tgt, k)))
        return stg, tgt

    def publish_inline(name, pod_uid, pod_name, attrs):
        tgt = os.path.join(k, "pods", pod_uid, "volumes/kubernetes.io~csi", name, "mount")
        os.makedirs(os.path.dirname(tgt), exist_ok=True)
        ctx = pod_info(pod_name, pod_uid)
        ctx["csi.storage.k8s.io/ephemeral"] = "true"
        ctx.update(attrs)
        vid = "csi-" + pod_uid + "-" + name
        c.NodePublishVolume(pb.NodePublishVolumeRequest(
            volume_id=vid, target_path=tgt, volume_capability=mount_cap(pb),
            volume_context=ctx), timeout=T)
        return vid, tgt

    step("2. The VM pod's volumes: its disk, and its hot-plug bridge")
    vm_uid = "vm-pod-1"
    root = create("pvc-demo-root", 64 * MiB, {"format": "qcow2", "numQueues": "2"})
    root_stg, root_tgt = stage_publish(root.volume_id, vm_uid, "demo-vm")
    bridge_id, bridge = publish_inline("volumes", vm_uid, "demo-vm", {"bridge": "true"})
    say("bridge volume published for pod %s/demo-vm (inline ephemeral volume)" % NS)

    step("3. The launcher starts the VM, as the VM pod's container would")
    # The container's view (short paths): the bridge at b (/run/qsd-vm/bridge in
    # the example pod) and the PVC beside it at v/root (/run/qsd-vm/volumes/root):
    # the runtime's mount point for the PVC is in the container, not in the bridge.
    vbridge = os.path.join(env.root, "b")
    vvols = os.path.join(env.root, "v")
    os.makedirs(vbridge)
    os.makedirs(os.path.join(vvols, "root"))
    console_log = os.path.join(work, "console.log")
    with open(os.path.join(work, "vm.json"), "w") as f:
        f.write('{"name": "demo-vm", "memory_mib": 256, "accel": "tcg",\n'
                ' "boot": {"kernel": "%s/vmlinuz", "initrd": "%s/initrd.img",\n'
                '          "cmdline": "console=ttyS0 panic=-1 quiet"},\n'
                ' "disks": [{"volume": "root"}], "console_log": "%s", "hotplug_slots": 4}\n'
                % (work, work, console_log))
    # Like a container: a private mount namespace that still receives mounts made
    # later in the bridge (slave propagation).  Both directories are bound there
    # read-only, nosuid, nodev, noexec, as the VM pod gets them; the launcher
    # is given both (--volumes-dir twice) and never writes into either.
    ro = "remount,bind,ro,nosuid,nodev,noexec"
    script = ('mount --bind "$1" "$2" && mount -o %s "$2" && '
              'mount --bind "$3" "$4/root" && mount -o %s "$4/root" && '
              'shift 4 && exec "$@"' % (ro, ro))
    llog = open(os.path.join(env.root, "launcher.log"), "w")
    lproc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "slave", "sh", "-c", script, "sh",
         bridge, vbridge, root_tgt, vvols, launcher, "--spec", os.path.join(work, "vm.json"),
         "--volumes-dir", vbridge, "--volumes-dir", vvols, "--root", lroot,
         "--shutdown-timeout", "5", "--detach-timeout", "60"], stdout=llog, stderr=llog)
    env.demo_launcher = lproc
    console = Console(console_log)
    t_start = time.monotonic()
    console.wait("booted", 180)
    TIMINGS.append(("launcher start -> guest sees its disk", time.monotonic() - t_start))
    if os.listdir(bridge):
        raise RuntimeError("the bridge holds %s before any hot-plug" % os.listdir(bridge))
    say("launcher reads two read-only directories: the bridge (empty until a hot-plug) "
        "and the pod's PVC mounts beside it (root)")
    console.wait("wrote 4 MiB", 60)

    step("4. Hot-plug: a new volume reaches the running VM, the pod is unchanged")
    data = create("pvc-demo-data", 32 * MiB, {"format": "raw"})
    att_uid = "attach-pod-1"
    data_stg, data_tgt = stage_publish(data.volume_id, att_uid, "demo-vm-hotplug-data")
    t = time.monotonic()
    req_id, req_tgt = publish_inline("hotplug", att_uid, "demo-vm-hotplug-data",
                                     {"hotplugInto": "demo-vm", "disk": "data"})
    say("attachment pod asks: hotplugInto=demo-vm disk=data")
    dt = console.wait("vdb appeared", 120, since=t)
    TIMINGS.append(("hot-plug: request -> disk visible in the guest", dt))

    step("5. Expansion: ControllerExpandVolume + NodeExpandVolume, online")
    t = time.monotonic()
    r = c.ControllerExpandVolume(pb.ControllerExpandVolumeRequest(
        volume_id=root.volume_id, capacity_range=pb.CapacityRange(required_bytes=128 * MiB),
        volume_capability=mount_cap(pb)), timeout=T)
    say("ControllerExpandVolume: %d MiB, node expansion required: %s" % (
        r.capacity_bytes // MiB, r.node_expansion_required))
    r = c.NodeExpandVolume(pb.NodeExpandVolumeRequest(
        volume_id=root.volume_id, volume_path=root_tgt, staging_target_path=root_stg,
        capacity_range=pb.CapacityRange(required_bytes=128 * MiB),
        volume_capability=mount_cap(pb)), timeout=T)
    say("NodeExpandVolume: %d MiB (block_resize inside the volume's QSD)" % (
        r.capacity_bytes // MiB))
    dt = console.wait("vda is now 128 MiB", 60, since=t)
    TIMINGS.append(("expansion: ControllerExpand -> new size in the guest", dt))
    stats = c.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(
        volume_id=root.volume_id, volume_path=root_tgt), timeout=T)
    u = stats.usage[0]
    say("NodeGetVolumeStats: capacity %d MiB, used %.1f MiB, abnormal=%s (%s)" % (
        u.total // MiB, u.used / MiB, stats.volume_condition.abnormal,
        stats.volume_condition.message or "-"))

    step("6. Snapshot the live disk and restore it into a new volume")
    t = time.monotonic()
    snap = c.CreateSnapshot(pb.CreateSnapshotRequest(
        source_volume_id=root.volume_id, name="snap-demo-1"), timeout=T).snapshot
    say("CreateSnapshot %s of %s: ready=%s, %d MiB (%.0f ms, through the live QSD)" % (
        snap.snapshot_id, snap.source_volume_id, snap.ready_to_use, snap.size_bytes // MiB,
        (time.monotonic() - t) * 1000))
    src = pb.VolumeContentSource(snapshot=pb.VolumeContentSource.SnapshotSource(
        snapshot_id=snap.snapshot_id))
    restored = create("pvc-demo-restored", 128 * MiB, {"format": "qcow2"}, src)
    img = os.path.join(env.pool, "volumes", restored.volume_id.split("@")[0] + ".qcow2")
    sfile = os.path.join(env.pool, "snapshots", snap.snapshot_id.split("@")[0] + ".qcow2")
    cmp = subprocess.run(["qemu-img", "compare", "-f", "qcow2", "-F", "qcow2", sfile, img],
                         capture_output=True, text=True, timeout=120)
    chk = subprocess.run(["qemu-io", "-r", "-f", "qcow2", "-c", "read -P 0x5a 0 4M", img],
                         capture_output=True, text=True, timeout=120)
    ok = cmp.returncode == 0 and "Pattern verification failed" not in chk.stdout \
        and chk.returncode == 0
    say("restored volume vs snapshot: %s; the guest's 4 MiB of 0x5a: %s" % (
        cmp.stdout.strip(), "present" if ok else "MISSING"))
    if not ok:
        raise RuntimeError("restored content does not match: %s %s" % (cmp.stdout, chk.stdout))

    step("7. Unplug: the disk leaves the guest before its QSD stops")
    t = time.monotonic()
    c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(
        volume_id=req_id, target_path=req_tgt), timeout=T)
    c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(
        volume_id=data.volume_id, target_path=data_tgt), timeout=T)
    say("attachment pod gone: NodeUnpublishVolume (request and volume)")
    waited = 0
    deadline = time.monotonic() + 90
    while True:
        try:
            c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(
                volume_id=data.volume_id, staging_target_path=data_stg), timeout=T)
            break
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.FAILED_PRECONDITION or time.monotonic() > deadline:
                raise
            if not waited:
                say("NodeUnstageVolume -> FAILED_PRECONDITION: %s" % e.details())
            waited += 1
            time.sleep(0.5)
    dt = console.wait("vdb disappeared", 30, since=t)
    TIMINGS.append(("unplug: unpublish -> disk gone from the guest", dt))
    say("NodeUnstageVolume done after the guest released the disk: QSD stopped")
    c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=data.volume_id), timeout=T)

    step("8. The VM powers off; everything is cleaned up")
    try:
        rc = lproc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        lproc.terminate()
        rc = lproc.wait(timeout=30)
    say("launcher exited with status %d (%s)" % (
        rc, {0: "the VM powered off", 3: "destroyed after the shutdown timeout"}.get(rc, "?")))
    console.stop = True
    c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(
        volume_id=bridge_id, target_path=bridge), timeout=T)
    c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(
        volume_id=root.volume_id, target_path=root_tgt), timeout=T)
    c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(
        volume_id=root.volume_id, staging_target_path=root_stg), timeout=T)
    for v in (root, restored):
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=v.volume_id), timeout=T)
    c.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=snap.snapshot_id), timeout=T)
    left = c.ListVolumes(pb.ListVolumesRequest(), timeout=T)
    say("volumes left: %d; QSDs left: %d" % (len(left.entries), len(env.qsd_pids())))
    if rc != 0:
        raise RuntimeError("the VM did not end cleanly (launcher status %d)" % rc)


def main():
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
    # Every QSD runs behind the vhost-user filter (docs/security.md); in the
    # build tree it is beside qsdctl, not beside the plugin.
    os.environ.setdefault("QSD_VHOST_FILTER", os.path.join(build, "qsdctl", "qsd-vhost-filter"))
    env = csilib.Env(os.path.join(build, "csi", "qsd-csi-plugin"), os.path.join(SRC, "proto"),
                     prefix="qd-", driver=DRIVER)
    # passt (the guest's network, started by libvirt) runs as nobody and
    # must reach its directory inside the launcher's root (docs/launcher.md).
    os.chmod(env.root, 0o755)
    env.demo_launcher = None
    ok = False
    try:
        run(env, build)
        ok = True
    except Exception as e:  # noqa: BLE001
        print("\nDEMO FAILED: %s" % e)
        print("---- plugin log (tail)\n" + env.log_tail(30))
        try:
            with open(os.path.join(env.root, "launcher.log")) as f:
                print("---- launcher log (tail)\n" + "".join(f.readlines()[-30:]))
        except OSError:
            pass
    finally:
        lp = env.demo_launcher
        if lp and lp.poll() is None:
            lp.terminate()
            try:
                lp.wait(timeout=30)
            except subprocess.TimeoutExpired:
                lp.kill()
                lp.wait(timeout=30)
        env.cleanup()
    step("Summary")
    for what, secs in TIMINGS:
        print("  %-55s %6.2f s" % (what, secs))
    print("  %-55s %6.1f s" % ("whole demo", time.monotonic() - T0))
    print("  result: %s" % ("everything worked and was cleaned up" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
