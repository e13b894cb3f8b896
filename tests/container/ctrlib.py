# SPDX-License-Identifier: Apache-2.0
"""Helpers for the container tests: the node plugin and a VM pod run with
podman the way deploy/ runs them, the CSI calls made from the host as kubelet
makes them (tests/csi/csilib.py's client), and a TCG guest that writes
patterned, fsync'ed blocks.

Everything a test starts is recorded and stopped by the cleanup, also after a
failure: containers by the names this test gave them, QSDs by PID (those
whose command line names this test's temporary root), mounts made under the
temporary root, the root itself.  Images are kept (they are a cache)."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "csi"))
import csilib  # noqa: E402  (exits 77 without python3-grpcio)

DRIVER = "qsd.csi.qsd-csi.dev"
MiB = 1 << 20
T0 = time.monotonic()


def log(msg):
    print("[%7.2f] %s" % (time.monotonic() - T0, msg), flush=True)


def skip(why):
    print("SKIP: " + why, flush=True)
    sys.exit(77)


def podman(*args, check=True, timeout=120, capture=True):
    r = subprocess.run(["podman", *args], capture_output=capture, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError("podman %s failed (%d): %s" % (" ".join(args), r.returncode,
                                                         (r.stderr or "").strip()[-2000:]))
    return r


def podman_usable():
    """None when podman can run containers here, else why not."""
    if os.geteuid() != 0:
        return "needs root (rootful podman, mounts, QSD sockets)"
    if not shutil.which("podman"):
        return "podman not installed (scripts/setup.sh installs it)"
    try:
        r = subprocess.run(["podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"],
                           capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "'podman info' did not answer within 60 s"
    if r.returncode != 0:
        return "'podman info' fails: " + r.stderr.strip()[-500:]
    return None


def read_images(path):
    """images.env written by images.sh: KEY=VALUE lines."""
    out = {}
    with open(path) as f:
        for line in f:
            if "=" in line:
                k, v = line.strip().split("=", 1)
                out[k] = v
    return out


def proc_start(pid):
    """(pid, start time in ticks) or None: tells a process from a reused pid."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return (pid, int(f.read().rsplit(")", 1)[1].split()[19]))
    except (OSError, ValueError, IndexError):
        return None


def alive(ident):
    return ident is not None and proc_start(ident[0]) == ident


def describe(pid):
    """ppid, state and command line of a process, for failure messages."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            f3 = f.read().rsplit(")", 1)[1].split()
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        return "ppid=%s state=%s cmd=%s" % (f3[1], f3[0], cmd[:300])
    except (OSError, IndexError):
        return "gone"


def mountpoints_under(root):
    mps = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].encode().decode("unicode_escape")
            if mp == root or mp.startswith(root + "/"):
                mps.append(mp)
    return mps


class Failure(AssertionError):
    pass


DAEMONSET = os.path.join(HERE, "..", "..", "deploy", "kubernetes", "30-node-daemonset.yaml")
# What the test gives the plugin container for each of the DaemonSet's mounts.
PLUGIN_MOUNTS = {"/csi", "/csi-ops", "/var/lib/kubelet/pods", "/var/lib/kubelet/plugins",
                 "/run/qsd-csi", "/var/lib/qsd-csi/state", "/var/lib/qsd-csi/pool", "/dev",
                 "/sys/fs/cgroup", "/etc/qsd-csi/rbd"}


def daemonset_plugin():
    """The plugin container of deploy/kubernetes/30-node-daemonset.yaml:
    its arguments ($(VAR) of its env values expanded, as kubelet does), and
    a check that the pod still has the shape this test reproduces (hostPID,
    privileged, the same mounts and propagation)."""
    import yaml
    with open(DAEMONSET) as f:
        ds = [d for d in yaml.safe_load_all(f) if d and d.get("kind") == "DaemonSet"][0]
    spec = ds["spec"]["template"]["spec"]
    ctr = [c for c in spec["containers"] if c["name"] == "qsd-csi-plugin"][0]
    mounts = {m["mountPath"]: m.get("mountPropagation") for m in ctr["volumeMounts"]}
    want = {"/var/lib/kubelet/pods": "Bidirectional", "/var/lib/kubelet/plugins": "Bidirectional",
            "/run/qsd-csi": "Bidirectional"}
    problems = []
    if not spec.get("hostPID"):
        problems.append("hostPID is not true")
    if not ctr.get("securityContext", {}).get("privileged"):
        problems.append("the plugin is not privileged")
    if set(mounts) != PLUGIN_MOUNTS:
        problems.append("mounts %s, the test reproduces %s" % (sorted(mounts),
                                                                sorted(PLUGIN_MOUNTS)))
    for k, v in want.items():
        if mounts.get(k) != v:
            problems.append("%s is mounted %s, not %s" % (k, mounts.get(k), v))
    if problems:
        raise Failure("%s changed shape, update tests/container: %s" % (DAEMONSET,
                                                                      "; ".join(problems)))
    env = {e["name"]: e["value"] for e in ctr.get("env", []) if "value" in e}
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)),
                   str(a)) for a in list(ctr.get("command", [])[1:]) + list(ctr["args"])]


def free_port():
    """A TCP port of 127.0.0.1 nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sanitizer_env():
    """ASAN_OPTIONS/UBSAN_OPTIONS of the test's environment (scripts/test.sh
    sets them) for the containers too (images built with --sanitize)."""
    out = []
    for k in ("ASAN_OPTIONS", "UBSAN_OPTIONS"):
        if os.environ.get(k):
            out += ["-e", "%s=%s" % (k, os.environ[k])]
    return out


def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def reap_stale():
    """What an earlier run killed hard (ctest's timeout sends SIGKILL) left:
    containers named qsd-csi-test-*-<pid>-* and roots /tmp/qsd-ctr-<pid>-*
    whose test process <pid> is gone: containers removed, QSDs naming the
    root killed, mounts under it unmounted, the root removed."""
    r = podman("ps", "-a", "--format", "{{.Names}}", check=False)
    for name in (r.stdout or "").split():
        m = re.match(r"^qsd-csi-test-(?:plugin|vm)-[a-z-]+-(\d+)(?:-\d+)?$", name)
        if m and not pid_alive(int(m.group(1))):
            log("removing stale container %s" % name)
            podman("rm", "-f", "-t", "0", name, check=False)
    tmp = tempfile.gettempdir()
    for d in os.listdir(tmp):
        m = re.match(r"^qsd-ctr-(\d+)-", d)
        if not m or pid_alive(int(m.group(1))):
            continue
        root = os.path.join(tmp, d)
        log("removing stale test root %s" % root)
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                with open("/proc/%s/cmdline" % p, "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if os.path.basename(argv[0]) == b"qemu-storage-daemon" and \
                    any(root.encode() + b"/" in a for a in argv[1:]):
                try:
                    os.kill(int(p), signal.SIGKILL)
                except OSError:
                    pass
        for mp in sorted(mountpoints_under(root), key=len, reverse=True):
            subprocess.run(["umount", "-l", mp], check=False, capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


class Stack:
    """One test's world: temporary kubelet root, run dir, state and pool, the
    plugin container, the VM pod, the CSI client."""

    def __init__(self, name, images, proto_dir, cache_dir, figures):
        why = podman_usable()
        if why:
            skip(why)
        for t in ("protoc", "busybox", "cpio"):
            if not shutil.which(t):
                skip(t + " not installed (scripts/setup.sh)")
        self.name = name
        self.images = images
        self.cache = cache_dir
        self.figures = figures
        os.makedirs(cache_dir, exist_ok=True)
        self.uniq = "%s-%d" % (name, os.getpid())
        reap_stale()
        self.root = tempfile.mkdtemp(prefix="qsd-ctr-%d-" % os.getpid())
        os.chmod(self.root, 0o755)
        self.pb = csilib.compile_proto(proto_dir, self.root)
        self.kubelet = os.path.join(self.root, "kubelet")
        self.run = os.path.join(self.root, "run")
        self.data = os.path.join(self.root, "data")
        self.vm = os.path.join(self.root, "vm")
        self.sockdir = os.path.join(self.kubelet, "plugins", DRIVER)
        self.sock = os.path.join(self.sockdir, "csi.sock")
        self.opsdir = os.path.join(self.root, "csi-ops")
        for d in (self.kubelet, self.run, os.path.join(self.data, "state"),
                  os.path.join(self.data, "pool"), self.sockdir, self.opsdir,
                  os.path.join(self.kubelet, "pods"),
                  os.path.join(self.kubelet, "plugins_registry")):
            os.makedirs(d, exist_ok=True)
        for d in ("etc", "volumes", "lroot", "guest", "console"):
            os.makedirs(os.path.join(self.vm, d))
        # The RBD cluster ConfigMap's directory: an empty cluster list.
        self.rbd_dir = os.path.join(self.root, "rbd")
        os.makedirs(self.rbd_dir)
        with open(os.path.join(self.rbd_dir, "clusters.json"), "w") as f:
            f.write("[]\n")
        # kubelet's root is a shared mount (kubelet makes it so); so is the
        # run dir, both given to the plugin as Bidirectional (rshared).  /
        # is private on these machines: bind each onto itself first.
        self.shared = []
        for d in (self.kubelet, self.run):
            subprocess.run(["mount", "--bind", d, d], check=True)
            self.shared.append(d)
            subprocess.run(["mount", "--make-rshared", d], check=True)
        self.containers = []      # names we created (removed by cleanup)
        self.plugin_ctr = None
        self.plugin_image = images["PLUGIN_IMAGE"]
        self.vm_ctr = None
        self.client = None
        self.plugin_logs = []     # logs of removed plugin containers
        self.generation = 0

    # ------------------------------------------------------------ plugin
    def plugin_run(self, image=None):
        """podman run of the plugin container with the DaemonSet's shape:
        privileged, host PID namespace, host cgroup filesystem read-write,
        kubelet root and run dir Bidirectional at their host paths."""
        image = image or self.plugin_image
        self.generation += 1
        name = "qsd-csi-test-plugin-%s-%d" % (self.uniq, self.generation)
        self.containers.append(name)
        args = ["run", "-d", "--name", name, "--privileged", "--pid=host", "--network=host",
                *sanitizer_env(),
                "-v", "%s:/csi" % self.sockdir,
                # the node-operations socket's emptyDir (the node gate's side
                # is not run here)
                "-v", "%s:/csi-ops" % self.opsdir,
                *["-v=%s/%s:%s/%s:rshared" % (self.kubelet, d, self.kubelet, d)
                  for d in ("pods", "plugins")],
                "-v", "%s:%s:rshared" % (self.run, self.run),
                *["-v=%s/%s:%s/%s" % (self.data, d, self.data, d) for d in ("state", "pool")],
                "-v", "/dev:/dev",
                "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
                "-v", "%s:/etc/qsd-csi/rbd:ro" % self.rbd_dir,
                image]
        # The manifest's arguments, its host paths mapped to this test's.
        paths = [("/var/lib/kubelet", self.kubelet), ("/run/qsd-csi", self.run),
                 ("/var/lib/qsd-csi", self.data)]
        for arg in daemonset_plugin():
            arg = arg.replace("$(NODE_NAME)", "node-ctr")
            if arg.startswith("--http-endpoint="):
                # The container shares the host's network: a free port of
                # the loopback instead of the manifest's :9810.
                arg = "--http-endpoint=127.0.0.1:%d" % free_port()
            k, eq, v = arg.partition("=")
            for host, ours in paths:
                if eq and (v == host or v.startswith(host + "/")):
                    v = ours + v[len(host):]
            args.append(k + eq + v)
        podman(*args)
        self.plugin_ctr = name
        self.plugin_image = image
        return name

    def plugin_pid(self):
        r = podman("inspect", "-f", "{{.State.Pid}}", self.plugin_ctr)
        return int(r.stdout.strip())

    def plugin_state(self, name=None):
        r = podman("inspect", "-f", "{{.State.Status}}", name or self.plugin_ctr, check=False)
        return r.stdout.strip()

    def wait_plugin_ready(self, timeout=60):
        """The CSI socket on the host answers Probe with ready=true; returns ms."""
        t = time.monotonic()
        deadline = t + timeout
        if self.client:
            self.client.close()
            self.client = None
        while True:
            if self.plugin_state() in ("exited", "stopped"):
                raise Failure("plugin container %s exited:\n%s" % (self.plugin_ctr,
                                                                   self.plugin_log_tail()))
            ok = False
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.sock)
                ok = True
            except OSError:
                pass
            finally:
                s.close()
            if ok:
                c = csilib.Client(self.pb, self.sock)
                try:
                    r = c.Probe(self.pb.ProbeRequest(), timeout=5)
                    if not r.HasField("ready") or r.ready.value:
                        self.client = c
                        return int((time.monotonic() - t) * 1000)
                except Exception:  # noqa: BLE001  (a dying plugin's socket)
                    pass
                c.close()
            if time.monotonic() > deadline:
                raise Failure("plugin not ready within %d s:\n%s" % (timeout,
                                                                     self.plugin_log_tail()))
            time.sleep(0.05)

    def wait_container_exit(self, name, timeout=30):
        deadline = time.monotonic() + timeout
        while self.plugin_state(name) not in ("exited", "stopped", ""):
            if time.monotonic() > deadline:
                raise Failure("container %s still %s after %d s" % (
                    name, self.plugin_state(name), timeout))
            time.sleep(0.05)

    def plugin_log_tail(self, n=60, name=None):
        r = podman("logs", "--tail", str(n), name or self.plugin_ctr, check=False)
        return (r.stdout or "") + (r.stderr or "")

    def remove_plugin(self, grace=30):
        """kubectl delete pod: SIGTERM, grace period, then removal."""
        name = self.plugin_ctr
        self.plugin_logs.append((name, self.plugin_log_tail(200, name)))
        podman("rm", "-f", "-t", str(grace), name, timeout=grace + 60)
        self.containers.remove(name)
        self.plugin_ctr = None

    # ------------------------------------------------------------ CSI
    def csi_setup(self, vid, pod_uid, size=32 * MiB):
        """CreateVolume, NodeStageVolume, NodePublishVolume with kubelet's
        paths and fsGroup 107; returns the published target (a host path)."""
        pb, c, T = self.pb, self.client, csilib.CALL_TIMEOUT
        cap = csilib.mount_cap(pb, group="107")
        vol = c.CreateVolume(pb.CreateVolumeRequest(
            name=vid, capacity_range=pb.CapacityRange(required_bytes=size),
            volume_capabilities=[cap]), timeout=T).volume
        stg = os.path.join(self.kubelet, "plugins/kubernetes.io/csi", DRIVER,
                           "%08x" % (hash(vid) & 0xffffffff), "globalmount")
        tgt = os.path.join(self.kubelet, "pods", pod_uid, "volumes/kubernetes.io~csi", vid,
                           "mount")
        os.makedirs(stg)
        os.makedirs(os.path.dirname(tgt))
        c.NodeStageVolume(pb.NodeStageVolumeRequest(
            volume_id=vid, staging_target_path=stg, volume_capability=cap,
            volume_context=dict(vol.volume_context)), timeout=T)
        c.NodePublishVolume(pb.NodePublishVolumeRequest(
            volume_id=vid, staging_target_path=stg, target_path=tgt, volume_capability=cap,
            volume_context=dict(vol.volume_context)), timeout=T)
        if not os.path.exists(os.path.join(tgt, "volume.json")):
            raise Failure("published target %s has no volume.json" % tgt)
        return {"vid": vid, "stg": stg, "tgt": tgt}

    def csi_teardown(self, v):
        pb, c, T = self.pb, self.client, csilib.CALL_TIMEOUT
        c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(
            volume_id=v["vid"], target_path=v["tgt"]), timeout=T)
        c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(
            volume_id=v["vid"], staging_target_path=v["stg"]), timeout=T)
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=v["vid"]), timeout=T)

    def qsd_pids(self):
        """{volume: (pid, starttime)} of the QSDs serving our volumes: the
        plugin's records (run/ctl/<vol>/qsd.json), checked against /proc."""
        out = {}
        ctl = os.path.join(self.run, "ctl")
        for vol in sorted(os.listdir(ctl)) if os.path.isdir(ctl) else []:
            try:
                with open(os.path.join(ctl, vol, "qsd.json")) as f:
                    pid = json.load(f).get("pid")
            except (OSError, ValueError):
                continue
            if pid and self.is_our_qsd(pid):
                out[vol] = proc_start(pid)
        return out

    def is_our_qsd(self, pid, units_only=True):
        """A QSD unit whose arguments name this test's root: the vhost-user
        filter's head (its QSD child belongs to it and is not counted), or a
        qemu-storage-daemon started without one."""
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            return False
        if os.path.basename(argv[0]) not in (b"qemu-storage-daemon", b"qsd-vhost-filter") or \
                not any(self.root.encode() in a for a in argv[1:]):
            return False
        if units_only and os.path.basename(argv[0]) == b"qemu-storage-daemon":
            parent = csilib._ppid(pid)
            if parent and self.is_our_qsd(parent, units_only=False):
                return False
        return True

    def all_our_qsds(self):
        pids = []
        for d in os.listdir("/proc"):
            if d.isdigit() and self.is_our_qsd(int(d)):
                pids.append(int(d))
        return pids

    # ------------------------------------------------------------ VM pod
    def guest(self, secs):
        """Kernel + initramfs with guest-writer.sh, from tests/guest's cache."""
        gcache = os.path.join(self.cache, "guest")
        out = os.path.join(self.vm, "guest", "initrd.img")
        r = subprocess.run(["bash", os.path.join(HERE, "..", "guest", "build-guest.sh"), gcache,
                            os.path.join(HERE, "guest-writer.sh"), out],
                           capture_output=True, text=True, timeout=900)
        if r.returncode == 77:
            skip("cannot build the test guest: " + r.stderr.strip())
        if r.returncode != 0:
            raise Failure("guest build failed: " + r.stderr)
        shutil.copy(os.path.join(gcache, "vmlinuz"), os.path.join(self.vm, "guest", "vmlinuz"))
        with open(os.path.join(self.vm, "etc", "vm.json"), "w") as f:
            json.dump({"name": "ctr-" + self.name, "memory_mib": 256, "accel": "tcg",
                       "machine": "q35",
                       "boot": {"kernel": "/guest/vmlinuz", "initrd": "/guest/initrd.img",
                                "cmdline": "console=ttyS0 panic=-1 quiet writer.secs=%d" % secs},
                       "disks": [{"volume": "root"}],
                       "console_log": "/console/console.log", "hotplug_slots": 1,
                       # the VM pod here has no network (podman --network none):
                       # passt would find no interface to use
                       "network": False}, f)

    def embed_cache(self):
        iid = podman("image", "inspect", "-f", "{{.Id}}", self.images["LAUNCHER_IMAGE"]).stdout
        return os.path.join(self.cache, "embed-cache-" + iid.strip()[:12], "qemu")

    def seccomp_profile(self):
        """podman's default seccomp profile (RuntimeDefault) plus io_uring.
        The launcher's event loop uses io_uring, which the default profile
        of containers-common 0.50 (bookworm) refuses with ENOSYS: the
        launcher then exits at once ("setup failed").  Kubernetes: a
        Localhost seccomp profile like this one (deploy/README.md)."""
        src = "/usr/share/containers/seccomp.json"
        if not os.path.exists(src):
            log("no %s: launcher container without seccomp filter" % src)
            return "unconfined"
        with open(src) as f:
            prof = json.load(f)
        prof["syscalls"].append({"names": ["io_uring_setup", "io_uring_enter",
                                           "io_uring_register"],
                                 "action": "SCMP_ACT_ALLOW"})
        out = os.path.join(self.vm, "seccomp-runtime-default-io_uring.json")
        with open(out, "w") as f:
            json.dump(prof, f)
        return out

    def vm_run(self, published):
        """The VM pod: an unprivileged launcher container, uid 0 gid 107 (the
        example's runAsGroup/fsGroup), the published volume directory
        mounted HostToContainer (rslave) inside its volumes directory."""
        ec = self.embed_cache()
        if os.path.isdir(ec):
            shutil.copytree(ec, os.path.join(self.vm, "lroot", "cache", "qemu"), symlinks=True)
        name = "qsd-csi-test-vm-" + self.uniq
        self.containers.append(name)
        # --init: catatonit as PID 1.  Without it the launcher is PID 1 of
        # its PID namespace (as in the example pod, which has no
        # shareProcessNamespace) and does not reap the QEMU processes
        # libvirt daemonizes: they stay zombies, libvirt waits for each to
        # vanish (capability probing then takes ~40 s instead of ~2 s) and
        # the launcher never exits after the guest powers off.  Seen here
        # with podman 4.3 + runc; QSD_CTR_NO_INIT=1 shows it.
        init = [] if os.environ.get("QSD_CTR_NO_INIT") == "1" else ["--init"]
        # deploy/examples/vm-pod.yaml: runAsUser 0, runAsGroup/fsGroup 107,
        # allowPrivilegeEscalation false, not privileged, no host paths
        # but the volumes; the bridge (an empty directory here: no disk is
        # hot-plugged) HostToContainer and read-only; the claim read-only
        # beside it (HostToContainer here too, so that a remount by the
        # plugin would be seen).
        podman("run", "-d", *init, *sanitizer_env(), "--name", name, "--user", "0:107", "--group-add", "107",
               "--security-opt", "no-new-privileges", "--network", "none",
               "--security-opt", "seccomp=" + self.seccomp_profile(),
               "-v", "%s/etc:/etc/qsd-vm:ro" % self.vm,
               "-v", "%s/volumes:/run/qsd-vm/bridge:ro,rslave" % self.vm,
               "-v", "%s:/run/qsd-vm/volumes/root:ro,rslave" % published,
               "-v", "%s/lroot:/var/lib/qsd-vm-launcher" % self.vm,
               "-v", "%s/guest:/guest:ro" % self.vm,
               "-v", "%s/console:/console" % self.vm,
               self.images["LAUNCHER_IMAGE"],
               "--spec=/etc/qsd-vm/vm.json", "--volumes-dir=/run/qsd-vm/bridge",
               "--volumes-dir=/run/qsd-vm/volumes",
               "--root=/var/lib/qsd-vm-launcher", "--shutdown-timeout=10", "--log-level=debug",
               "--wait-volumes=60")
        self.vm_ctr = name

    def console(self):
        try:
            with open(os.path.join(self.vm, "console", "console.log"), "rb") as f:
                return f.read().decode("utf-8", "replace").replace("\r", "")
        except OSError:
            return ""

    def wait_console(self, regex, timeout):
        deadline = time.monotonic() + timeout
        rx = re.compile(regex, re.M)
        while True:
            m = rx.search(self.console())
            if m:
                return m
            if self.plugin_state(self.vm_ctr) in ("exited", "stopped"):
                # the console may have got the line between the search and
                # the exit: look once more before calling it a failure
                m = rx.search(self.console())
                if m:
                    return m
                raise Failure("VM pod exited before '%s'" % regex)
            if time.monotonic() > deadline:
                raise Failure("console: no '%s' within %d s" % (regex, timeout))
            time.sleep(0.1)

    def vm_finish(self, timeout=60):
        """The guest powers off after its summary: the launcher exits 0."""
        try:
            rc = podman("wait", self.vm_ctr, timeout=timeout, check=False).stdout.strip()
        except subprocess.TimeoutExpired:
            rc = "still running after %d s" % timeout
        ec = self.embed_cache()
        src = os.path.join(self.vm, "lroot", "cache", "qemu")
        if not os.path.isdir(ec) and os.path.isdir(src):
            tmp = ec + ".tmp.%d" % os.getpid()
            shutil.copytree(src, tmp, symlinks=True)
            try:
                os.rename(tmp, ec)
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
        return rc

    # ------------------------------------------------------------ cleanup
    def dump(self):
        for name, logs in self.plugin_logs:
            print("---- plugin log of removed %s (tail)\n%s" % (name, logs[-6000:]))
        if self.plugin_ctr:
            print("---- plugin log (tail)\n" + self.plugin_log_tail(80))
        if self.vm_ctr:
            print("---- VM pod processes\n" + podman("top", self.vm_ctr, "hpid", "pid", "ppid",
                                                     "etime", "args", check=False).stdout)
            print("---- launcher log (tail)\n" + podman("logs", "--tail", "40", self.vm_ctr,
                                                      check=False).stderr[-6000:])
        print("---- console (tail)\n" + "\n".join(self.console().splitlines()[-40:]))

    def cleanup(self):
        if self.client:
            try:
                self.client.close()
            except Exception:  # noqa: BLE001
                pass
        for name in reversed(self.containers):
            podman("rm", "-f", "-t", "0", name, check=False, timeout=120)
        # QSDs this test's plugins started (their command lines name our root).
        pids = set(self.all_our_qsds())
        for ident in self.qsd_pids().values():
            if ident:
                pids.add(ident[0])
        for pid in pids:
            if self.is_our_qsd(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        deadline = time.monotonic() + 10
        while any(self.is_our_qsd(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        for mp in sorted(mountpoints_under(self.root), key=len, reverse=True):
            subprocess.run(["umount", "-l", mp], check=False, capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)

    def figure(self, line):
        print(line, flush=True)
        os.makedirs(os.path.dirname(self.figures), exist_ok=True)
        with open(self.figures, "a") as f:
            f.write("# %s plugin=%s launcher=%s\n%s\n" % (
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), self.images["PLUGIN_IMAGE"],
                self.images["LAUNCHER_IMAGE"], line))
