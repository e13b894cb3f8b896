#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""End-to-end hot-plug through the bridge: the real plugin (driven like
kubelet, python3-grpcio), the real launcher and a TCG guest.

- The VM pod's layout (deploy/examples/vm-pod.yaml): its bridge (inline
  volume, bridge: "true") is published; its target is bound read-only and
  rslave at a short path, as a container runtime does for a read-only
  HostToContainer mount (/run/qsd-vm/bridge).  The pod's own PVC, pvc-root,
  is published for the VM pod and bound read-only at <volumes>/root, beside
  the bridge, not inside it (/run/qsd-vm/volumes/root).  The launcher gets
  both directories (--volumes-dir twice) and starts the VM with root (vda).
- 5 cycles: another attachment pod (request first on odd cycles, PVC first on
  even ones) places pvc-data as "data" -> the guest sees vdb with the right
  size (latency: first publish -> ADD on the console).  NodeUnpublish of the
  PVC -> NodeUnstage is refused while QEMU still holds the socket -> the
  guest loses vdb -> NodeUnstage succeeds; the volume is staged again for the
  next cycle.
- pvc-root's mount removed from the VM container's view -> the guest powers
  off -> the launcher exits 0; every
  volume unstaged, the bridge unpublished, no mount, QSD or QEMU left (also
  on failure: processes stopped by PID).

usage: e2e-bridge.py PLUGIN PROTO_DIR   (env: LAUNCHER, BUILD_CACHE)
"""
import glob
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "csi"))
if os.environ.get("QSD_E2E", "1") == "0":
    print("SKIP: end-to-end guest tests disabled (QSD_E2E=0)")
    sys.exit(77)
import csilib  # noqa: E402
from csilib import mount_cap, is_mount_point  # noqa: E402
import grpc  # noqa: E402

MiB = 1 << 20
NS, VM, VM_UID = "vm-e2e", "e2e-vm", "5f0c1d2e-0000-4000-8000-0000000e2e01"
GID = "107"
CYCLES = 5
T = csilib.CALL_TIMEOUT


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


class Fail(Exception):
    pass


class E2E:
    def __init__(self, plugin, proto, prefix="qsd-e2e-bridge-"):
        self.launcher_bin = os.environ.get("LAUNCHER")
        self.cache = os.environ.get("BUILD_CACHE")
        if not self.launcher_bin or not self.cache:
            csilib.skip("LAUNCHER and BUILD_CACHE must be set (ctest does)")
        for t in ("qemu-system-x86_64",):
            if not shutil.which(t):
                csilib.skip("%s not installed (scripts/setup.sh)" % t)
        self.env = csilib.Env(plugin, proto, prefix=prefix)
        self.work = self.env.root
        # passt (the guest's network, started by libvirt) runs as nobody and
        # must reach its directory inside the launcher's root (docs/launcher.md).
        os.chmod(self.work, 0o755)
        self.vroot = os.path.join(self.work, "lroot")
        self.bridge = os.path.join(self.work, "b")    # the VM container's view of the bridge
        self.vols = os.path.join(self.work, "v")      # ... and of its PVCs' directory
        self.console = os.path.join(self.work, "console.log")
        self.llog = os.path.join(self.work, "launcher.log")
        self.launcher = None
        self.pb = self.env.pb
        self.cap = mount_cap(self.pb, group=GID)

    # ------------------------------------------------------------ kubelet
    def target(self, uid, name):
        t = os.path.join(self.env.kubelet, "pods", uid, "volumes/kubernetes.io~csi", name, "mount")
        os.makedirs(os.path.dirname(t), exist_ok=True)
        return t

    def staging(self, vid):
        return os.path.join(self.env.kubelet, "plugins/kubernetes.io/csi/d", vid, "globalmount")

    def podctx(self, uid, name, eph):
        return {"csi.storage.k8s.io/pod.uid": uid, "csi.storage.k8s.io/pod.namespace": NS,
                "csi.storage.k8s.io/pod.name": name,
                "csi.storage.k8s.io/ephemeral": "true" if eph else "false"}

    def inline(self, uid, name, attrs):
        vid = "csi-" + uid.replace("-", "")
        tgt = self.target(uid, "inline")
        ctx = dict(attrs)
        ctx.update(self.podctx(uid, name, True))
        self.c.NodePublishVolume(self.pb.NodePublishVolumeRequest(
            volume_id=vid, target_path=tgt, volume_capability=self.cap, volume_context=ctx),
            timeout=T)
        return vid, tgt

    def stage(self, vid):
        os.makedirs(self.staging(vid), exist_ok=True)
        self.c.NodeStageVolume(self.pb.NodeStageVolumeRequest(
            volume_id=vid, staging_target_path=self.staging(vid), volume_capability=self.cap),
            timeout=T)

    def unstage(self, vid):
        self.c.NodeUnstageVolume(self.pb.NodeUnstageVolumeRequest(
            volume_id=vid, staging_target_path=self.staging(vid)), timeout=T)

    def pvc(self, vid, uid, name, readonly=False):
        tgt = self.target(uid, vid)
        self.c.NodePublishVolume(self.pb.NodePublishVolumeRequest(
            volume_id=vid, staging_target_path=self.staging(vid), target_path=tgt,
            volume_capability=self.cap, readonly=readonly,
            volume_context=self.podctx(uid, name, False)), timeout=T)
        return tgt

    def unpublish(self, vid, tgt):
        self.c.NodeUnpublishVolume(self.pb.NodeUnpublishVolumeRequest(volume_id=vid,
                                                                      target_path=tgt), timeout=T)

    def attach_pod(self, k, vid, disk, request_first, readonly=False):
        uid = "a77ac400-0000-4000-8000-%012d" % k
        name = "attach-%d" % k
        if request_first:
            r = self.inline(uid, name, {"hotplugInto": VM, "disk": disk})
            p = self.pvc(vid, uid, name, readonly)
        else:
            p = self.pvc(vid, uid, name, readonly)
            r = self.inline(uid, name, {"hotplugInto": VM, "disk": disk})
        return r, p

    def unplug(self, vid, ptgt, t0):
        """NodeUnpublish, then NodeUnstage until the guest let go; returns
        whether the first NodeUnstage was refused."""
        self.unpublish(vid, ptgt)
        first, refused = True, False
        while True:
            try:
                self.unstage(vid)
                return refused
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
                refused |= first
            first = False
            if time.monotonic() - t0 > 60:
                raise Fail("NodeUnstage still refused after 60 s")
            time.sleep(0.1)

    # ------------------------------------------------------------ guest
    def console_lines(self, prefix):
        try:
            with open(self.console, errors="replace") as f:
                return [ln.strip().replace("\r", "") for ln in f if ln.startswith(prefix)]
        except OSError:
            return []

    def wait_console(self, line, count, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(1 for ln in self.console_lines(line.split()[0]) if ln.startswith(line)) >= count:
                return
            if self.launcher and self.launcher.poll() is not None:
                break
            time.sleep(0.05)
        raise Fail("console: no %r (x%d) within %ds" % (line, count, timeout))

    def wait_log(self, text, count, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.llog, errors="replace") as f:
                if f.read().count(text) >= count:
                    return
            time.sleep(0.05)
        raise Fail("launcher log: no %r (x%d) within %ds" % (text, count, timeout))

    GUEST_SCRIPT = "guest-bridge.sh"

    def build_guest(self):
        """The guest (kernel, initramfs with GUEST_SCRIPT as /test.sh), the
        VM's description (vm_spec()) and the launcher's embedded-driver cache."""
        r = subprocess.run(["bash", os.path.join(HERE, "..", "guest", "build-guest.sh"),
                            os.path.join(self.cache, "guest"), os.path.join(HERE, self.GUEST_SCRIPT),
                            os.path.join(self.work, "initrd.img")], capture_output=True, text=True,
                           timeout=600)
        if r.returncode == 77:
            csilib.skip("cannot build the guest: " + r.stderr.strip())
        if r.returncode != 0:
            raise Fail("guest build failed: " + r.stderr)
        shutil.copy(os.path.join(self.cache, "guest", "vmlinuz"), os.path.join(self.work, "vmlinuz"))
        with open(os.path.join(self.work, "vm.json"), "w") as f:
            json.dump(self.vm_spec(), f)
        seed = os.path.join(self.cache, "embed-cache", "qemu")
        if os.path.isdir(seed):
            os.makedirs(os.path.join(self.vroot, "cache"))
            shutil.copytree(seed, os.path.join(self.vroot, "cache", "qemu"), symlinks=True)

    def vm_spec(self):
        return {"name": "bridge", "memory_mib": 256, "accel": "tcg",
                "boot": {"kernel": os.path.join(self.work, "vmlinuz"),
                         "initrd": os.path.join(self.work, "initrd.img"),
                         "cmdline": "console=ttyS0 panic=-1 quiet"},
                "disks": [{"volume": "root"}], "console_log": self.console,
                "hotplug_slots": 2}

    def start_launcher(self):
        self.lf = open(self.llog, "a")
        self.launcher = subprocess.Popen(
            [self.launcher_bin, "--spec", os.path.join(self.work, "vm.json"),
             "--volumes-dir", self.bridge, "--volumes-dir", self.vols, "--root", self.vroot,
             "--shutdown-timeout", "5", "--ready-timeout", "10", "--detach-timeout", "30"],
            stdout=self.lf, stderr=self.lf)
        log("launcher pid %d" % self.launcher.pid)

    def stop_launcher(self):
        p = self.launcher
        if p and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            time.sleep(0.2)
            p.send_signal(signal.SIGTERM)  # a second signal destroys at once
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        for pf in glob.glob(os.path.join(self.vroot, "run", "qemu", "*.pid")):
            if os.path.basename(pf) == "driver.pid":
                continue
            try:
                pid = int(open(pf).read().strip())
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    if self.vroot.encode() in f.read():
                        os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass
        if getattr(self, "lf", None):
            self.lf.close()
            self.lf = None

    def save_cache(self):
        src = os.path.join(self.vroot, "cache", "qemu")
        dst = os.path.join(self.cache, "embed-cache", "qemu")
        if os.path.isdir(src) and not os.path.isdir(dst):
            tmp = dst + ".tmp.%d" % os.getpid()
            try:
                shutil.copytree(src, tmp, symlinks=True)
                os.rename(tmp, dst)
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)

    def dump(self):
        for what, path, n in (("launcher log", self.llog, 40), ("console", self.console, 30)):
            try:
                with open(path, errors="replace") as f:
                    print("--- %s\n%s" % (what, "".join(f.readlines()[-n:])))
            except OSError:
                pass
        print("--- plugin log\n" + self.env.log_tail(60))

    def cleanup(self, ok):
        """Launcher and QEMU, plugin and QSDs stopped by PID, mounts and the
        root removed; the logs printed when the test failed."""
        self.stop_launcher()
        if not ok:
            self.dump()
        self.save_cache()
        self.env.cleanup()

    # ------------------------------------------------------------ the VM pod
    def vm_pod(self, root_vid):
        """The VM pod's layout: its bridge (inline volume) and its own PVC
        (root_vid, staged) published and bound read-only as its container
        sees them.  Returns what vm_pod_end() takes."""
        bvid, btgt = self.inline(VM_UID, VM, {"bridge": "true"})
        root_pvc = self.pvc(root_vid, VM_UID, VM)
        os.mkdir(self.bridge)
        os.mkdir(self.vols)
        vroot = os.path.join(self.vols, "root")   # the runtime's mount point: not in the bridge
        os.mkdir(vroot)
        for src, dst in ((btgt, self.bridge), (root_pvc, vroot)):
            subprocess.run(["mount", "--bind", src, dst], check=True)
            subprocess.run(["mount", "-o", "remount,bind,ro,nosuid,nodev,noexec", dst], check=True)
        subprocess.run(["mount", "--make-rslave", self.bridge], check=True)
        for d in (self.bridge, vroot):
            try:
                open(os.path.join(d, "written"), "w").close()
                raise Fail("%s is writable" % d)
            except OSError:
                pass
        if not os.path.exists(os.path.join(vroot, "vhost.sock")):
            raise Fail("the root volume not visible in the VM container's volumes directory")
        if os.listdir(self.bridge):
            raise Fail("the bridge is not empty: %s" % os.listdir(self.bridge))
        return bvid, btgt, root_pvc, vroot

    def vm_pod_end(self, root_vid, bvid, btgt, root_pvc, vroot):
        """The root volume's mount leaves the container's view: the guest
        powers off, the launcher exits 0; the VM pod's volumes unpublished,
        the root unstaged; no mount and no QSD left."""
        subprocess.run(["umount", vroot], check=True)
        os.rmdir(vroot)
        self.wait_console("BYE", 1, 60)
        rc = self.launcher.wait(timeout=60)
        if rc != 0:
            raise Fail("launcher exit status %d, want 0" % rc)
        self.unpublish(root_vid, root_pvc)       # the VM pod is gone
        deadline = time.monotonic() + 10
        while True:
            try:
                self.unstage(root_vid)
                break
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.FAILED_PRECONDITION or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        subprocess.run(["umount", self.bridge], check=True)
        self.unpublish(bvid, btgt)
        with open("/proc/self/mountinfo") as f:
            left = [ln.split()[4] for ln in f if self.work in ln.split()[4]]
        if left:
            raise Fail("mounts left: %s" % left)
        if self.env.qsd_pids():
            pids = [p for p in self.env.qsd_pids().values() if os.path.exists("/proc/%d" % p)]
            if pids:
                raise Fail("QSDs left: %s" % pids)

    # ------------------------------------------------------------ the test
    def run(self):
        self.build_guest()
        self.c = self.env.start(["--unplug-timeout", "60"])
        for vid, size in (("pvc-root", 64 * MiB), ("pvc-data", 32 * MiB)):
            self.c.CreateVolume(self.pb.CreateVolumeRequest(
                name=vid, capacity_range=self.pb.CapacityRange(required_bytes=size),
                volume_capabilities=[self.cap]), timeout=T)
            self.stage(vid)
        # The VM pod: its bridge, seen by its container through a read-only
        # rslave bind, and its own PVC, bound read-only beside the bridge.
        pod = self.vm_pod("pvc-root")
        self.start_launcher()
        self.wait_console("DISK name=vda size=%d" % (64 * MiB // 512), 1, 180)
        self.wait_console("MONITOR-START", 1, 60)
        log("guest up with vda (pvc-root, the VM pod's own PVC, beside the bridge)")

        plug, unplug, refused = [], [], 0
        for k in range(1, CYCLES + 1):
            t0 = time.monotonic()
            req, ptgt = self.attach_pod(k, "pvc-data", "data", request_first=(k % 2 == 1))
            self.wait_console("ADD name=vdb size=%d ro=0" % (32 * MiB // 512), k, 60)
            plug.append((time.monotonic() - t0) * 1000)
            self.wait_console("WRITE name=vdb ok", k, 30)
            t0 = time.monotonic()
            # QEMU still holds the socket until the guest lets go: refused.
            refused += self.unplug("pvc-data", ptgt, t0)
            # Allowed only once QEMU let go of the socket: the guest released
            # the disk (its monitor prints DEL within ~100 ms of that).
            self.wait_console("DEL name=vdb", k, 5)
            unplug.append((time.monotonic() - t0) * 1000)
            self.unpublish(*req)
            log("cycle %d (%s first): plug %.0f ms, unplug+unstage %.0f ms" %
                (k, "request" if k % 2 else "PVC", plug[-1], unplug[-1]))
            self.wait_log('msg="disk detached" volume=data', k, 10)
            if k < CYCLES:
                self.stage("pvc-data")
        # How often the first NodeUnstage came while the guest still held
        # the disk depends on timing (a slow NodeUnpublish under a sanitizer
        # gives the guest time to let go): reported, not asserted.  That a
        # held socket refuses NodeUnstage is asserted by integration/csi_bridge;
        # here, every cycle's DEL after the successful unstage shows the QSD
        # was not stopped under the guest.
        log("NodeUnstage refused while the guest held the disk in %d/%d cycles" % (refused, CYCLES))

        # Read-only end to end: the volume is staged read-write, published
        # readonly=true (a pod's readOnly: true): the guest gets a disk it
        # cannot write (the read-only export, enforced by the QSD).
        self.stage("pvc-data")
        req, ptgt = self.attach_pod(CYCLES + 1, "pvc-data", "data", True, readonly=True)
        self.wait_console("ADD name=vdb size=%d ro=1" % (32 * MiB // 512), 1, 60)
        self.wait_console("WRITE name=vdb refused", 1, 30)
        with open(os.path.join(self.bridge, "data", "volume.json")) as f:
            if not json.load(f)["read_only"]:
                raise Fail("volume.json of a read-only placement says read_only false")
        try:
            open(os.path.join(self.bridge, "data", "x"), "w")
            raise Fail("the VM container could create a file in a placement")
        except OSError as e:
            if e.errno != 30:
                raise
        self.unplug("pvc-data", ptgt, time.monotonic())
        self.wait_console("DEL name=vdb", CYCLES + 1, 5)
        self.unpublish(*req)
        log("read-only publication of a read-write volume: the guest saw ro=1 and its write "
            "was refused; the placement is a read-only mount")

        # Last disk goes (its mount leaves the container's view): the guest
        # powers off, the launcher exits 0.
        self.vm_pod_end("pvc-root", *pod)
        # Each disk came from its own directory: root from the PVCs', data
        # from the bridge.
        attached = [ln.strip() for ln in open(self.llog) if 'msg="disk attached"' in ln]
        for name, d, n in (("root", self.vols, 1), ("data", self.bridge, CYCLES + 1)):
            got = [ln for ln in attached if " volume=%s " % name in ln]
            if len(got) != n or not all(ln.endswith(" dir=" + d) for ln in got):
                raise Fail("disk %s: want %d attach(es) from %s, got %s" % (name, n, d, got))
        errors = [ln for ln in open(self.llog) if "level=error" in ln]
        if errors:
            raise Fail("launcher errors: %s" % errors)
        med = statistics.median(plug)
        line = ("FIGURES bridge_hotplug_ms median=%.0f all=%s\n"
                "FIGURES bridge_unplug_unstage_ms median=%.0f all=%s\n" %
                (med, " ".join("%.0f" % x for x in plug), statistics.median(unplug),
                 " ".join("%.0f" % x for x in unplug)))
        print(line, end="")
        with open(os.path.join(self.cache, "figures.txt"), "a") as f:
            f.write("# %s %s (bridge)\n%s" % (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                             self.launcher_bin, line))
        print("PASS")


def main(cls=E2E):
    if len(sys.argv) != 3:
        print(sys.modules[cls.__module__].__doc__)
        return 2
    e = cls(sys.argv[1], sys.argv[2])
    ok = False
    try:
        e.run()
        ok = True
    except SystemExit:
        raise
    except Exception:  # noqa: BLE001
        import traceback
        traceback.print_exc()
    finally:
        e.cleanup(ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
