# SPDX-License-Identifier: Apache-2.0
"""Helpers for the CSI tests: an independent client (Debian's python3-grpcio,
messages compiled from proto/csi.proto with protoc at test time, no generated
stubs), a plugin process under a temporary root, and real mounts under a
temporary kubelet root that are always unmounted.

Every test makes its own root with mktemp; the plugin and the QSDs it started
are stopped by PID, never by name."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

try:
    import grpc
except ImportError:
    print("SKIP: python3-grpcio not installed")
    sys.exit(77)

CALL_TIMEOUT = 60.0
START_TIMEOUT = 15.0

SERVICES = {
    "Identity": ["GetPluginInfo", "GetPluginCapabilities", "Probe"],
    "Controller": ["CreateVolume", "DeleteVolume", "ControllerPublishVolume",
                   "ControllerUnpublishVolume", "ValidateVolumeCapabilities", "ListVolumes",
                   "GetCapacity", "ControllerGetCapabilities", "CreateSnapshot",
                   "DeleteSnapshot", "ListSnapshots", "ControllerExpandVolume",
                   "ControllerGetVolume", "ControllerModifyVolume", "GetSnapshot",
                   "ControllerGetVolumeHealth", "ControllerListVolumeHealth"],
    "Node": ["NodeStageVolume", "NodeUnstageVolume", "NodePublishVolume",
             "NodeUnpublishVolume", "NodeGetVolumeStats", "NodeExpandVolume",
             "NodeGetCapabilities", "NodeGetInfo", "NodeGetVolumeHealth",
             "NodeGetStorageHealth"],
    "GroupController": ["GroupControllerGetCapabilities", "CreateVolumeGroupSnapshot",
                        "DeleteVolumeGroupSnapshot", "GetVolumeGroupSnapshot"],
}


# Lines of the plugin's log that are neither valid logfmt nor valid JSON
# (checked at cleanup of every test; run_main fails the test on any).
LOG_ERRORS = []
_LOGFMT = None


def check_log_line(line):
    """None if line is a valid log line of ours, else why not.  logfmt:
    key=value pairs (values bare or double-quoted with backslash escapes),
    starting ts, level, comp, msg.  JSON: an object with those keys whose
    numeric-looking values are numbers, not strings."""
    import json
    import re
    global _LOGFMT
    line = line.rstrip("\n")
    if line.startswith("{"):
        try:
            obj = json.loads(line)
        except ValueError as e:
            return "invalid JSON: %s" % e
        if list(obj)[:4] != ["ts", "level", "comp", "msg"]:
            return "JSON line does not start with ts, level, comp, msg"
        for k, v in obj.items():
            if isinstance(v, str) and re.fullmatch(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", v) and \
                    len(v) < 20:
                return "JSON value %s=%r is a number written as a string" % (k, v)
        return None
    if _LOGFMT is None:
        _LOGFMT = re.compile(r'([^ ="]+)=("(?:\\.|[^"\\])*"|[^ "]*)( |$)')
    pos, keys = 0, []
    while pos < len(line):
        m = _LOGFMT.match(line, pos)
        if not m:
            return "invalid logfmt at column %d" % pos
        keys.append(m.group(1))
        pos = m.end()
    if keys[:4] != ["ts", "level", "comp", "msg"]:
        return "logfmt line does not start with ts, level, comp, msg"
    return None


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


def detach_loops_under(root):
    """A failed test's leftovers: every loop device whose backing file is
    beneath root, its mounts lazily unmounted, then detached."""
    for line in subprocess.run(["losetup", "-n", "-O", "NAME,BACK-FILE"], capture_output=True,
                               text=True, timeout=30).stdout.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[1].startswith(root + "/"):
            subprocess.run(["umount", "-l", parts[0]], check=False, timeout=30)
            subprocess.run(["losetup", "-d", parts[0]], check=False, timeout=30)


def csi_sanity():
    """The csi-sanity binary: $QSD_CSI_SANITY, else the release that
    tests/k8s/sidecars.txt pins, built once from the Go module proxy into
    /var/cache/qsd-csi/csi-sanity by tests/gotool.sh (its lock: tests started
    together build once; scripts/test.sh builds it first, in the
    background).  Skips (77) only when there is no Go to build it."""
    b = os.environ.get("QSD_CSI_SANITY")
    if b:
        return b
    here = os.path.dirname(os.path.abspath(__file__))
    pin = None
    with open(os.path.join(here, "..", "k8s", "sidecars.txt")) as f:
        for line in f:
            w = line.split()
            if len(w) >= 4 and w[0] == "sanity":
                pin = (w[2], w[3])  # module, version
    assert pin, "tests/k8s/sidecars.txt pins no csi-sanity"
    cache = "/var/cache/qsd-csi/csi-sanity"
    r = subprocess.run(["bash", os.path.join(here, "..", "gotool.sh"), cache, pin[1],
                        pin[0] + "/cmd/csi-sanity"], capture_output=True, text=True, timeout=1900)
    if r.returncode == 77:
        skip("no csi-sanity and no Go to build it: " + r.stdout.strip())
    assert r.returncode == 0, "building csi-sanity failed: %s%s" % (r.stdout[-2000:],
                                                                    r.stderr[-2000:])
    return os.path.join(cache, "csi-sanity")


# The csi-sanity specs that may be skipped, by the reason csi-test gives
# (csi-sanity --ginkgo.v prints "[SKIPPED] <reason>" for each): the
# ControllerPublish/Unpublish specs (no PUBLISH_UNPUBLISH_VOLUME: a local
# volume needs no attach step), and the snapshot accessibility spec, which
# csi-test v5.6.0 cannot pass for a driver that reports a snapshot's
# accessible_topology (it compares protobuf messages with reflect.DeepEqual,
# internal size caches included), so the plugin does not advertise
# SNAPSHOT_ACCESSIBILITY_CONSTRAINTS (docs/csi-plugin.md).
# tests/k8s/sanity.sh holds the same list.
SANITY_SKIPS_ALLOWED = (
    "ControllerPublishVolume not supported",
    "ControllerUnpublishVolume not supported",
    "Controller Publish, UnpublishVolume not supported",
    "SNAPSHOT_ACCESSIBILITY_CONSTRAINTS not supported",
)


def sanity_skips(log):
    """(spec, reason) of every spec csi-sanity's --ginkgo.v log reports
    skipped by the spec itself (specs left out by --ginkgo.focus/skip have
    no such report)."""
    out, lines = [], log.splitlines()
    for i, ln in enumerate(lines):
        if not ln.startswith("S [SKIPPED]") or i + 1 >= len(lines):
            continue
        reason = next((x[len("  [SKIPPED] "):] for x in lines[i + 2:i + 12]
                       if x.startswith("  [SKIPPED] ") and not x.startswith("  [SKIPPED] in [")),
                      "?")
        out.append((lines[i + 1].strip(), reason))
    return out


def sanity_unexpected_skips(log, allowed=SANITY_SKIPS_ALLOWED):
    """The skipped specs whose reason is not in allowed."""
    return [(s, r) for s, r in sanity_skips(log) if r not in allowed]


def compile_proto(proto_dir, out_dir):
    protoc = shutil.which("protoc")
    if not protoc:
        skip("protoc not installed")
    subprocess.run([protoc, "-I", proto_dir, "-I", "/usr/include", "--python_out", out_dir,
                    os.path.join(proto_dir, "csi.proto")], check=True, timeout=60)
    sys.path.insert(0, out_dir)
    import csi_pb2  # noqa: E402
    return csi_pb2



def cgroup_of(pid):
    """The memory hierarchy's (v1) or the unified (v2) cgroup of pid."""
    v2 = None
    with open("/proc/%d/cgroup" % pid) as f:
        for line in f:
            _, ctrl, path = line.rstrip("\n").split(":", 2)
            if "memory" in ctrl.split(","):
                return path
            if ctrl == "":
                v2 = path
    return v2


def remove_cgroup(name):
    """Remove the QSDs' group `name` (and its per-volume vol-* groups) from
    every hierarchy; what is still in use stays."""
    root = "/sys/fs/cgroup"
    dirs = [root] if os.path.exists(os.path.join(root, "cgroup.controllers")) else \
        [os.path.join(root, d) for d in os.listdir(root)
         if not os.path.islink(os.path.join(root, d))]
    for d in dirs:
        top = os.path.join(d, name.lstrip("/"))
        for sub in (os.listdir(top) if os.path.isdir(top) else []):
            if sub.startswith("vol-"):
                try:
                    os.rmdir(os.path.join(top, sub))
                except OSError:
                    pass
        try:
            os.rmdir(top)
        except OSError:
            pass


def qsd_limits(qsdctl, env, vol):
    """The live limits of vol's QSD (its throttle group tg0, through qsdctl's
    QMP): QEMU's own view, not the plugin's record."""
    r = subprocess.run([qsdctl, "--run-dir", env.run, "qmp", vol, "qom-get",
                        '{"path": "tg0", "property": "limits"}'],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, "qom-get: %s %s" % (r.stdout, r.stderr)
    out = json.loads(r.stdout)
    return out.get("return", out)


def qsd_process(pid):
    """The qemu-storage-daemon process of the unit whose recorded pid is pid:
    the vhost-user filter's head's only child, or pid itself (no filter).
    Freezing a QSD means freezing this one: a frozen head leaves its QSD
    serving its monitor and its RBD watch."""
    for d in os.listdir("/proc"):
        if d.isdigit() and _ppid(int(d)) == pid:
            return int(d)
    return pid


def _ppid(pid):
    """The parent of pid, or 0 when it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0

class Client:
    """c.CreateVolume(pb.CreateVolumeRequest(...)) for every CSI method."""

    def __init__(self, pb, sock):
        self.pb = pb
        self.channel_target = "unix://" + sock
        self.channel = grpc.insecure_channel(self.channel_target)
        for svc, methods in SERVICES.items():
            for m in methods:
                req = getattr(pb, m + "Request")
                resp = getattr(pb, m + "Response")
                setattr(self, m, self.channel.unary_unary(
                    "/csi.v1.%s/%s" % (svc, m), request_serializer=req.SerializeToString,
                    response_deserializer=resp.FromString))

    def close(self):
        self.channel.close()


def expect_code(fn, req, code, what=""):
    try:
        fn(req, timeout=CALL_TIMEOUT)
    except grpc.RpcError as e:
        if e.code() != code:
            raise AssertionError("%s: expected %s, got %s (%s)" % (what, code, e.code(),
                                                                   e.details()))
        return e.details()
    raise AssertionError("%s: expected %s, call succeeded" % (what, code))


def ctest_register_root(root):
    """Name a temporary root to tests/strays.py (the ctest/strays fixture),
    which removes it, and stops what still runs or is mounted under it,
    should this test be killed before its own cleanup runs."""
    roots = os.environ.get("QSD_CSI_CTEST_ROOTS")
    if roots:
        with open(roots, "a") as f:
            f.write("%d %s\n" % (os.getpid(), root))


# The plugin's start-up line saying it serves, in either log format.
SERVING = re.compile(r'msg=serving |"msg":"serving"')


class Env:
    """A temporary root: state, pool, run dir, kubelet root, the plugin."""

    def __init__(self, plugin, proto_dir, prefix="qsd-csi-test-", driver="test.qsd-csi.dev"):
        if os.geteuid() != 0:
            skip("needs root (mounts, QSD sockets)")
        if not shutil.which("qemu-storage-daemon") or not shutil.which("qemu-img"):
            skip("qemu-storage-daemon or qemu-img missing")
        self.plugin = plugin
        self.root = tempfile.mkdtemp(prefix=prefix)
        ctest_register_root(self.root)
        self.pb = compile_proto(proto_dir, self.root)
        self.state = os.path.join(self.root, "state")
        self.pool = os.path.join(self.root, "pool")
        self.run = os.path.join(self.root, "run")
        self.kubelet = os.path.join(self.root, "kubelet")
        for d in (self.state, self.pool, self.run, self.kubelet):
            os.mkdir(d)
        self.sock = os.path.join(self.root, "csi.sock")
        self.proc = None
        self.client = None
        self.logf = None
        self.node = "node-1"
        self.driver = driver

    def start(self, extra=(), wrapper=()):
        """Start the plugin (under wrapper, e.g. strace, when given: then
        self.proc is the wrapper's process)."""
        logp = os.path.join(self.root, "plugin.log")
        served = len(SERVING.findall(open(logp).read())) if os.path.exists(logp) else 0
        self.logf = open(logp, "a")
        self.proc = subprocess.Popen(
            [*wrapper, self.plugin, "--endpoint", "unix://" + self.sock, "--nodeid", self.node,
             "--driver-name", self.driver, "--state-dir", self.state, "--pool", self.pool,
             "--run-dir", self.run, "--kubelet-root", self.kubelet, "--log-level", "debug",
             *extra],
            stdout=self.logf, stderr=self.logf)
        deadline = time.monotonic() + START_TIMEOUT
        import socket
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("plugin exited early with %d" % self.proc.returncode)
            # Ready when this instance says so and accepts: for a few
            # milliseconds after a plugin on io_uring was killed (-9), its
            # listening socket still accepts (the ring's teardown, which
            # holds the socket, runs after the exit).
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                with open(logp) as f:
                    if len(SERVING.findall(f.read())) <= served:
                        raise OSError("not serving yet")
                s.connect(self.sock)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("plugin socket did not accept within %.0fs" % START_TIMEOUT)
                time.sleep(0.02)
            finally:
                s.close()
        self.client = Client(self.pb, self.sock)
        return self.client

    def stop(self, sig=signal.SIGTERM):
        if self.client:
            self.client.close()
            self.client = None
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                rc = self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait(timeout=15)
        else:
            rc = self.proc.returncode if self.proc else None
        self.proc = None
        if self.logf:
            self.logf.close()
            self.logf = None
        # A killed plugin's io_uring is torn down asynchronously after the
        # process is reaped: its listening socket may accept connections for
        # a moment.  Wait (bounded) until it refuses, so that start() talks
        # to the next plugin, not to the ghost of this one.
        import socket
        deadline = time.monotonic() + 5
        while os.path.exists(self.sock) and time.monotonic() < deadline:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.sock)
            except OSError:
                break
            finally:
                s.close()
            time.sleep(0.02)
        return rc

    def qsd_pids(self):
        """PIDs of QSDs recorded under our run dir (ctl/<vol>/qsd.json)."""
        import json
        pids = {}
        ctl = os.path.join(self.run, "ctl")
        if not os.path.isdir(ctl):
            return pids
        for vol in os.listdir(ctl):
            try:
                with open(os.path.join(ctl, vol, "qsd.json")) as f:
                    st = json.load(f)
                if st.get("pid"):
                    pids[vol] = st["pid"]
            except (OSError, ValueError):
                pass
        return pids

    def running_qsds(self):
        """{pid: volume} of every live QSD started for our run dir, recorded
        or not: processes whose command line names a monitor socket under
        it (our temporary root is unique, so this never matches another's)."""
        found = {}
        needle = ("path=%s/ctl/" % self.run.replace(",", ",,")).encode()
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open("/proc/%s/cmdline" % d, "rb") as f:
                    cmd = f.read()
                with open("/proc/%s/stat" % d) as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        continue
            except (OSError, IndexError):
                continue
            i = cmd.find(needle)
            if i >= 0:
                rest = cmd[i + len(needle):]
                found[int(d)] = rest.split(b"/", 1)[0].decode()
        # A unit is one process: the vhost-user filter's head, whose QSD child
        # names the same monitor, counts once (as the plugin records it).
        return {pid: vol for pid, vol in found.items() if _ppid(pid) not in found}

    def log_tail(self, n=60):
        try:
            with open(os.path.join(self.root, "plugin.log")) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def cleanup(self):
        """Unmount everything under the kubelet root, stop the plugin and our
        QSDs by PID, remove the root.  Runs even after a failure."""
        try:
            self.stop(signal.SIGKILL)
        except Exception:  # noqa: BLE001
            pass
        mounts = []
        try:
            with open("/proc/self/mountinfo") as f:
                for line in f:
                    mp = line.split()[4].encode().decode("unicode_escape")
                    if mp.startswith(self.root + "/"):
                        mounts.append(mp)
        except OSError:
            pass
        for mp in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", mp], check=False)
        try:
            with open(os.path.join(self.root, "plugin.log"), errors="replace") as f:
                for n, line in enumerate(f, 1):
                    why = check_log_line(line) if line.startswith(("ts=", "{")) else \
                        "not a log line"
                    if why and "Sanitizer" not in line:
                        LOG_ERRORS.append("plugin.log:%d: %s: %s" % (n, why, line.strip()[:300]))
        except OSError:
            pass
        for pid in set(self.qsd_pids().values()) | set(self.running_qsds()):
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    if self.run.encode() not in f.read():
                        continue
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.1)
        shutil.rmtree(self.root, ignore_errors=True)


def local_id(i):
    """The record name of a volume or snapshot id ("<name>@<node>", or a
    plain name)."""
    return i.split("@")[0]


def mount_cap(pb, mode=None, group="", fs_type=""):
    mode = pb.VolumeCapability.AccessMode.SINGLE_NODE_WRITER if mode is None else mode
    return pb.VolumeCapability(
        mount=pb.VolumeCapability.MountVolume(fs_type=fs_type, volume_mount_group=group),
        access_mode=pb.VolumeCapability.AccessMode(mode=mode))


def block_cap(pb):
    return pb.VolumeCapability(
        block=pb.VolumeCapability.BlockVolume(),
        access_mode=pb.VolumeCapability.AccessMode(
            mode=pb.VolumeCapability.AccessMode.SINGLE_NODE_WRITER))


def share_kubelet_root(env):
    """Make env's kubelet root a shared mount, as kubelet's is on a node: a
    process that copies the host's mounts into a namespace of its own (a
    QSD started by another test on this machine) then holds slave copies,
    which our unmounts reach; on a private root (these machines') its
    copies would keep a pod volume's filesystem and loop device busy.
    cleanup() unmounts it with everything beneath the root."""
    subprocess.run(["mount", "--bind", env.kubelet, env.kubelet], check=True, timeout=30)
    subprocess.run(["mount", "--make-shared", env.kubelet], check=True, timeout=30)


def is_mount_point(path):
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                if line.split()[4].encode().decode("unicode_escape") == path:
                    return True
    except OSError:
        pass
    return False


def run_main(fn):
    try:
        fn()
        if LOG_ERRORS:
            print("FAIL: the plugin logged %d invalid lines:\n%s" %
                  (len(LOG_ERRORS), "\n".join(LOG_ERRORS[:20])))
            return 1
        return 0
    except SystemExit:
        raise
    except Exception:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        return 1
