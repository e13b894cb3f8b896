# SPDX-License-Identifier: Apache-2.0
"""Shared helpers for tests/security/: the hostile tenant and the hostile
caller against the real node plugin (csilib.Env: real QSDs, real mounts under
a temporary kubelet root, everything stopped by PID).

What every test checks after each attack (Sec.after):
- the plugin answers Probe within 1 s, ready, and is still the same process
  (unless the test restarted it on purpose);
- the decoys are unchanged: DECOY (ROOT/decoy, outside the kubelet root, the
  run dir and the pool) holds root:root 0600 files and empty 0700 directories
  that symlinks point at; owner, group, mode, content and the set of entries
  must stay as they were;
- nothing was created or removed at the top of the test root (only state,
  pool, run, kubelet and the test's own files live there);
- no mount point exists under the test root outside the kubelet root and the
  run dir.

Failures are collected (Sec.check) so that one run reports every attack that
still succeeds; Sec.finish() raises with the list.  Each attack prints one
line: what was done and what the plugin answered (code + message)."""
import ctypes
import errno
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "csi"))
import csilib  # noqa: E402
from csilib import mount_cap  # noqa: E402,F401

import grpc  # noqa: E402

# A racer, run as its own process: renames a to b and back as fast as it can
# for `limit` seconds (python3 -c MOVER a b limit).
MOVER = r"""
import os, sys, time
a, b, limit = sys.argv[1], sys.argv[2], float(sys.argv[3])
end = time.monotonic() + limit
n = 0
while time.monotonic() < end:
    for x, y in ((a, b), (b, a)):
        try:
            os.rename(x, y)
        except OSError:
            pass
    n += 1
    if n % 64 == 0:
        time.sleep(0.0005)
"""

MiB = 1 << 20
SC = grpc.StatusCode
# Bound for one RPC under attack: a call that takes longer is "hung".  The
# ASan build on this 2-core machine stages a volume in well under 2 s.
BOUND = 15.0
PROBE_BOUND = 1.0
# "Thousands of levels": deep enough for a recursive delete to run out of
# descriptors or stack in the ASan build, cheap enough to build and remove
# (about 2 s each on this machine).
DEEP = 10000
DRIVER = "test.qsd-csi.dev"

_libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
RENAME_EXCHANGE = 2


def renameat2_exchange(a, b):
    """Atomically swap two names (a directory and a symlink, say)."""
    r = _libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), RENAME_EXCHANGE)
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), a)


def unescape_mount(s):
    # /proc/self/mountinfo escapes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 3 < len(s) and s[i + 1:i + 4].isdigit():
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def mountinfo():
    """[(mount point, root inside its filesystem, per-mount options)]"""
    res = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            p = line.split()
            res.append((unescape_mount(p[4]), unescape_mount(p[3]), p[5].split(",")))
    return res


def mounts_at(path):
    return [m for m in mountinfo() if m[0] == path]


def under(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def rm_tree(path):
    """Remove a tree of any depth without recursion and without any path
    longer than two names: every subdirectory is first renamed up beside
    the tree's root (.rm-<n>), then emptied and removed.  An entry that
    cannot be moved or removed (a mount point) is left."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    parent = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    work = [os.path.basename(path)]
    n = 0
    try:
        while work:
            name = work.pop()
            try:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
            except OSError:
                continue
            try:
                with os.scandir(fd) as it:
                    entries = [e.name for e in it]
                for e in entries:
                    try:
                        est = os.stat(e, dir_fd=fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISDIR(est.st_mode):
                        n += 1
                        new = ".rm-%d-%d" % (os.getpid(), n)
                        try:
                            os.rename(e, new, src_dir_fd=fd, dst_dir_fd=parent)
                            work.append(new)
                        except OSError:
                            pass
                    else:
                        try:
                            os.unlink(e, dir_fd=fd)
                        except OSError:
                            pass
            finally:
                os.close(fd)
            try:
                os.rmdir(name, dir_fd=parent)
            except OSError:
                pass
    finally:
        os.close(parent)


def make_deep_tree(parent, name, depth):
    """parent/name/d/d/d/... depth levels, built relative to directory fds (no
    path ever exceeds one name)."""
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    os.mkdir(name, dir_fd=fd)
    nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
    os.close(fd)
    fd = nfd
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        # something at the bottom too: a file, a fifo, a symlink out
        with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "w") as f:
            f.write("x")
        os.mkfifo("p", dir_fd=fd)
    finally:
        os.close(fd)


def run_usage(d):
    """Bytes allocated to regular files under d (the run dir's usage)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(d):
        dirnames[:] = [x for x in dirnames if not x.startswith("deep")]
        for n in filenames:
            try:
                st = os.lstat(os.path.join(dirpath, n))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_blocks * 512
    return total


def vhost_info(qsdctl, d, timeout_ms=5000):
    """A vhost-user client through directory d (relative: kubelet paths are
    longer than a unix socket address allows).  Returns (dict or None, err)."""
    try:
        r = subprocess.run([qsdctl, "vhost-info", "--json", "--timeout-ms", str(timeout_ms),
                            "./vhost.sock"], cwd=d, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    if r.returncode != 0:
        return None, "exit %d: %s" % (r.returncode, r.stderr.strip())
    return json.loads(r.stdout), ""


def qsdctl_verify(qsdctl, d, *args):
    """qsdctl verify ... ./vhost.sock in d: (exit code, output)."""
    try:
        r = subprocess.run([qsdctl, "verify", "--timeout-ms", "20000", *args, "./vhost.sock"],
                           cwd=d, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return -1, str(e)
    return r.returncode, (r.stdout + r.stderr).strip()


def fmt(code, msg):
    return code if code == "OK" else "%s: %s" % (code, msg)


class Sec:
    """One test's environment: csilib.Env plus decoys, checks and helpers."""

    def __init__(self, argv, prefix, extra=()):
        if len(argv) < 4:
            print("usage: %s PLUGIN_BINARY PROTO_DIR QSDCTL" % argv[0])
            sys.exit(2)
        self.qsdctl = os.path.abspath(argv[3])
        self.extra = list(extra)
        self.env = csilib.Env(argv[1], argv[2], prefix=prefix, driver=DRIVER)
        self.pb = self.env.pb
        self.root = self.env.root
        self.kubelet = self.env.kubelet
        self.run = self.env.run
        self.decoy = os.path.join(self.root, "decoy")
        self.failures = []
        self.c = None
        self.pid = None
        self.helpers = []   # processes this test started (stopped by PID)
        self.allowed_mounts = set()  # the test's own mounts outside (decoy mounts)
        self._make_decoys()

    # ---------------------------------------------------------- lifecycle
    def start(self):
        self.c = self.env.start(self.extra)
        self.pid = self.env.proc.pid
        return self.c

    def restart(self, why="restart"):
        """kill -9 + start: the test's own restarts (and recovery)."""
        self.env.stop(signal.SIGKILL)
        self.start()
        print("       (plugin %s: new pid %d)" % (why, self.pid))

    def cleanup(self):
        for p in self.helpers:
            try:
                if p.poll() is None:
                    p.kill()
                p.wait(timeout=10)
            except Exception:  # noqa: BLE001
                pass
        try:
            self.env.stop(signal.SIGKILL)
        except Exception:  # noqa: BLE001
            pass
        for mp in sorted((m[0] for m in mountinfo() if under(m[0], self.root)),
                         key=len, reverse=True):
            subprocess.run(["umount", "-l", mp], check=False, stderr=subprocess.DEVNULL)
        # Deep trees the test planted: csilib's shutil.rmtree recurses per level.
        try:
            for dirpath, dirnames, _ in os.walk(self.root):
                for d in list(dirnames):
                    if d.startswith("deep"):
                        rm_tree(os.path.join(dirpath, d))
                        dirnames.remove(d)
        except RecursionError:
            pass
        try:
            self.env.cleanup()
        except RecursionError:
            rm_tree(self.root)

    def main(self, body):
        try:
            self.start()
            body(self)
            self.finish()
        finally:
            if sys.exc_info()[0] is not None:
                print("---- plugin log (tail)\n" + self.env.log_tail(60))
            self.cleanup()

    # ---------------------------------------------------------- decoys
    def _make_decoys(self):
        os.mkdir(self.decoy, 0o700)
        for name, text in (("secret", "host secret: must never change\n"),
                           ("secret-json", '{"not": "yours"}\n'),
                           ("secret-sock", "not a socket\n")):
            p = os.path.join(self.decoy, name)
            with open(p, "w") as f:
                f.write(text)
            os.chown(p, 0, 0)
            os.chmod(p, 0o600)
        for name in ("dir", "dir-race", "dir-restart", "dir-stage", "dir-bridge",
                     "dir-bridge-race", "dir-bridge-restart"):
            os.mkdir(os.path.join(self.decoy, name), 0o700)
        self.decoy_base = self.decoy_state()
        self.top_base = set(os.listdir(self.root))

    def decoy_state(self):
        res = {}
        for dirpath, dirnames, filenames in os.walk(self.decoy):
            for n in dirnames + filenames:
                p = os.path.join(dirpath, n)
                st = os.lstat(p)
                content = None
                if stat.S_ISREG(st.st_mode):
                    with open(p, "rb") as f:
                        content = f.read(4096)
                res[os.path.relpath(p, self.decoy)] = (stat.S_IFMT(st.st_mode),
                                                        stat.S_IMODE(st.st_mode), st.st_uid,
                                                        st.st_gid, content)
        st = os.lstat(self.decoy)
        res["."] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
                    None)
        return res

    def decoy_diff(self):
        now = self.decoy_state()
        diff = []
        for k in sorted(set(now) | set(self.decoy_base)):
            a, b = self.decoy_base.get(k), now.get(k)
            if a != b:
                if a is None:
                    diff.append("created decoy/%s" % k)
                elif b is None:
                    diff.append("removed decoy/%s" % k)
                else:
                    diff.append("changed decoy/%s: mode %o->%o uid %d->%d gid %d->%d%s" % (
                        k, a[1], b[1], a[2], b[2], a[3], b[3],
                        " content" if a[4] != b[4] else ""))
        return diff

    def restore_decoys(self):
        """Put the decoys back as they were, so that the next attack is judged
        on its own."""
        for mp in sorted((m[0] for m in mountinfo() if under(m[0], self.decoy) and
                          m[0] not in self.allowed_mounts), key=len, reverse=True):
            subprocess.run(["umount", "-l", mp], check=False, stderr=subprocess.DEVNULL)
        now = self.decoy_state()
        for k in sorted(set(now) - set(self.decoy_base), key=len, reverse=True):
            rm_tree(os.path.join(self.decoy, k))
        for k, (fmt_, mode, uid, gid, content) in sorted(self.decoy_base.items()):
            p = os.path.join(self.decoy, k)
            if not os.path.lexists(p):
                if fmt_ == stat.S_IFDIR:
                    os.mkdir(p)
                else:
                    open(p, "wb").close()
            if content is not None:
                with open(p, "wb") as f:
                    f.write(content)
            os.chown(p, uid, gid, follow_symlinks=False)
            os.chmod(p, mode)
        left = self.decoy_diff()
        assert not left, "cannot restore the decoys: %s" % left

    def outside_mounts(self):
        """Mount points under the test root but outside kubelet root and run dir."""
        return [m[0] for m in mountinfo()
                if under(m[0], self.root) and not under(m[0], self.kubelet) and
                not under(m[0], self.run) and m[0] not in self.allowed_mounts]

    # ---------------------------------------------------------- checks
    def check(self, cond, what):
        if not cond:
            self.failures.append(what)
            print("  FAIL " + what)
        return bool(cond)

    def finish(self):
        if self.failures:
            raise AssertionError("%d check(s) failed:\n  - %s" % (
                len(self.failures), "\n  - ".join(self.failures)))
        print("ok all attacks refused")

    def probe(self):
        """(ok, text): Probe answered ready within PROBE_BOUND."""
        if not self.c:
            return False, "no client"
        t0 = time.monotonic()
        try:
            r = self.c.Probe(self.pb.ProbeRequest(), timeout=PROBE_BOUND)
        except grpc.RpcError as e:
            return False, "%s: %s" % (e.code().name, e.details())
        dt = time.monotonic() - t0
        if r.HasField("ready") and not r.ready.value:
            return False, "not ready (%.0f ms)" % (dt * 1000)
        return True, "%.0f ms" % (dt * 1000)

    def alive(self):
        p = self.env.proc
        return p is not None and p.poll() is None and p.pid == self.pid

    def after(self, attack, fifos_dir=None):
        """The checks after each attack.  If the plugin hangs (blocked on a
        FIFO, say) it is unblocked or restarted so the next attack can run;
        the hang is a failure of this attack."""
        ok, how = self.probe()
        self.check(ok, "%s: Probe did not answer within %.0f s afterwards (%s)" % (
            attack, PROBE_BOUND, how))
        if not self.alive():
            rc = self.env.proc.poll() if self.env.proc else None
            self.check(False, "%s: plugin process %d died (exit %s)" % (attack, self.pid, rc))
        om = self.outside_mounts()
        self.check(not om, "%s: mounts outside the kubelet root / run dir: %s" % (attack, om))
        diff = self.decoy_diff()
        if not self.check(not diff, "%s: decoys changed: %s" % (attack, "; ".join(diff))):
            self.restore_decoys()
        top = set(os.listdir(self.root)) - {"csi_pb2.py", "__pycache__", "csi.sock",
                                            "plugin.log"}
        base = self.top_base - {"csi_pb2.py", "__pycache__", "csi.sock", "plugin.log"}
        self.check(top == base, "%s: test root entries changed: +%s -%s" % (
            attack, sorted(top - base), sorted(base - top)))
        if not ok or not self.alive():
            self.recover(fifos_dir)

    def recover(self, fifos_dir=None):
        if fifos_dir:
            drain_fifos(fifos_dir)
            time.sleep(0.5)
            if self.alive() and self.probe()[0]:
                print("       (plugin unblocked by opening the planted FIFOs)")
                return
        self.restart("recovery after a hang or crash")

    # ---------------------------------------------------------- calls
    def call(self, attack, method, req, bound=BOUND, quiet=False):
        """(code name, message, seconds); prints one line per attack."""
        fn = getattr(self.c, method)
        t0 = time.monotonic()
        try:
            resp = fn(req, timeout=bound)
            code, msg = "OK", ""
            self.last = resp
        except grpc.RpcError as e:
            code, msg = e.code().name, e.details() or ""
            self.last = None
        dt = time.monotonic() - t0
        if not quiet:
            print("attack %-58s -> %s (%.0f ms)" % (attack, fmt(code, msg), dt * 1000))
        if code == "DEADLINE_EXCEEDED":
            self.check(False, "%s: %s did not answer within %.0f s" % (attack, method, bound))
        return code, msg, dt

    def ok(self, method, req, what=None, bound=BOUND):
        """A call of the rightful user that must succeed."""
        fn = getattr(self.c, method)
        try:
            return fn(req, timeout=bound)
        except grpc.RpcError as e:
            raise AssertionError("%s: %s failed: %s: %s" % (what or method, method,
                                                            e.code().name, e.details()))

    # ---------------------------------------------------------- volumes
    def staging(self, vid):
        return os.path.join(self.kubelet, "plugins/kubernetes.io/csi", DRIVER, vid, "globalmount")

    def target(self, pod, vid, make_parent=True):
        t = os.path.join(self.kubelet, "pods", pod, "volumes/kubernetes.io~csi", vid, "mount")
        if make_parent:
            os.makedirs(os.path.dirname(t), exist_ok=True)
        return t

    def export_dir(self, vid):
        return os.path.join(self.run, "exports", vid)

    def create(self, vid, size=16 * MiB, params=None, group="107"):
        self.ok("CreateVolume", self.pb.CreateVolumeRequest(
            name=vid, capacity_range=self.pb.CapacityRange(required_bytes=size),
            volume_capabilities=[mount_cap(self.pb, group=group)], parameters=params or {}))

    def stage(self, vid, group="107", mode=None):
        stg = self.staging(vid)
        os.makedirs(stg, exist_ok=True)
        self.ok("NodeStageVolume", self.pb.NodeStageVolumeRequest(
            volume_id=vid, staging_target_path=stg,
            volume_capability=mount_cap(self.pb, mode, group=group)))
        return stg

    def publish_req(self, vid, tgt, group="107", ro=False, ctx=None, staging=None):
        return self.pb.NodePublishVolumeRequest(
            volume_id=vid, staging_target_path=staging or self.staging(vid), target_path=tgt,
            volume_capability=mount_cap(self.pb, group=group), readonly=ro,
            volume_context=ctx or {})

    def publish(self, vid, pod, group="107", ro=False, ctx=None):
        tgt = self.target(pod, vid)
        self.ok("NodePublishVolume", self.publish_req(vid, tgt, group, ro, ctx))
        return tgt

    def unpublish(self, vid, tgt, what=None):
        self.ok("NodeUnpublishVolume", self.pb.NodeUnpublishVolumeRequest(
            volume_id=vid, target_path=tgt), what)

    def unstage(self, vid, what=None):
        self.ok("NodeUnstageVolume", self.pb.NodeUnstageVolumeRequest(
            volume_id=vid, staging_target_path=self.staging(vid)), what)

    def works(self, attack, vid, tgt):
        """The rightful user: a vhost-user client through the published target
        connects, and volume.json there names the volume."""
        d, err = vhost_info(self.qsdctl, tgt)
        ok = self.check(d is not None, "%s: volume %s no longer works through %s: %s" % (
            attack, vid, tgt, err))
        if ok:
            try:
                meta = json.load(open(os.path.join(tgt, "volume.json")))
                ok = self.check(meta.get("volume") == vid, "%s: volume.json through %s names %r"
                                % (attack, tgt, meta.get("volume")))
            except (OSError, ValueError) as e:
                ok = self.check(False, "%s: volume.json through %s unreadable: %s" % (
                    attack, tgt, e))
        return ok

    def works_fresh(self, attack, vid, group="107", pod=None):
        """The rightful user stages (idempotent) and publishes at a fresh target,
        connects, and unpublishes again."""
        pod = pod or "rightful-%d" % int(time.monotonic() * 1000)
        stg = self.staging(vid)
        os.makedirs(stg, exist_ok=True)
        code, msg, _ = self.call("%s: rightful NodeStageVolume" % attack, "NodeStageVolume",
                                 self.pb.NodeStageVolumeRequest(
                                     volume_id=vid, staging_target_path=stg,
                                     volume_capability=mount_cap(self.pb, group=group)),
                                 quiet=True)
        if not self.check(code == "OK", "%s: rightful NodeStageVolume of %s: %s" % (
                attack, vid, fmt(code, msg))):
            return False
        tgt = self.target(pod, vid)
        code, msg, _ = self.call("%s: rightful NodePublishVolume" % attack, "NodePublishVolume",
                                 self.publish_req(vid, tgt, group), quiet=True)
        if not self.check(code == "OK", "%s: rightful NodePublishVolume of %s: %s" % (
                attack, vid, fmt(code, msg))):
            return False
        ok = self.works(attack, vid, tgt)
        code, msg, _ = self.call("%s: rightful NodeUnpublishVolume" % attack,
                                 "NodeUnpublishVolume", self.pb.NodeUnpublishVolumeRequest(
                                     volume_id=vid, target_path=tgt), quiet=True)
        self.check(code == "OK", "%s: rightful NodeUnpublishVolume of %s: %s" % (
            attack, vid, fmt(code, msg)))
        return ok

    # ---------------------------------------------------------- tenant
    def try_write(self, what, d):
        """Every way a tenant root could change directory d; each must fail
        with EROFS.  Anything that succeeds is undone at once."""
        results = []

        def attempt(name, fn, undo=None):
            try:
                fn()
            except OSError as e:
                results.append((name, errno.errorcode.get(e.errno, str(e.errno))))
                return
            results.append((name, "SUCCEEDED"))
            if undo:
                try:
                    undo()
                except OSError:
                    pass

        p = lambda n: os.path.join(d, n)  # noqa: E731
        attempt("create file", lambda: os.close(os.open(p("tenant-file"),
                                                        os.O_CREAT | os.O_WRONLY, 0o644)),
                lambda: os.unlink(p("tenant-file")))
        attempt("mkdir", lambda: os.mkdir(p("tenant-dir")), lambda: os.rmdir(p("tenant-dir")))
        attempt("mkfifo volume.json.tmp.1", lambda: os.mkfifo(p("volume.json.tmp.1")),
                lambda: os.unlink(p("volume.json.tmp.1")))
        attempt("symlink", lambda: os.symlink("/etc/shadow", p("tenant-link")),
                lambda: os.unlink(p("tenant-link")))
        if os.path.lexists(p("volume.json")):
            data = open(p("volume.json"), "rb").read()
            st = os.lstat(p("volume.json"))

            def restore():
                with open(p("volume.json"), "wb") as f:
                    f.write(data)
                os.chown(p("volume.json"), st.st_uid, st.st_gid)
                os.chmod(p("volume.json"), stat.S_IMODE(st.st_mode))
            attempt("rename volume.json", lambda: os.rename(p("volume.json"), p("v.json")),
                    lambda: os.rename(p("v.json"), p("volume.json")))
            attempt("unlink volume.json", lambda: os.unlink(p("volume.json")), restore)
            attempt("write volume.json", lambda: open(p("volume.json"), "ab").close(), restore)
            attempt("chmod volume.json", lambda: os.chmod(p("volume.json"), 0o666), restore)
        if os.path.lexists(p("vhost.sock")):
            # a link of the socket keeps it reachable if the unlink works
            attempt("rename vhost.sock", lambda: os.rename(p("vhost.sock"), p("s.sock")),
                    lambda: os.rename(p("s.sock"), p("vhost.sock")))
        attempt("chmod the directory", lambda: os.chmod(d, 0o777),
                lambda: os.chmod(d, stat.S_IMODE(os.stat(d).st_mode) & 0o750))
        attempt("fill: write 1 MiB", lambda: _fill(p("tenant-fill")),
                lambda: os.unlink(p("tenant-fill")))
        bad = [(n, r) for n, r in results if r != "EROFS"]
        print("attack %-58s -> %s" % ("tenant writes in %s" % what,
                                      ", ".join("%s: %s" % x for x in results)))
        self.check(not bad, "%s: tenant writes not refused with EROFS: %s" % (what, bad))

    def check_ro_mount(self, what, path):
        ms = mounts_at(path)
        if not self.check(ms, "%s: %s is not a mount point" % (what, path)):
            return
        opts = ms[-1][2]
        missing = [o for o in ("ro", "nosuid", "nodev", "noexec") if o not in opts]
        print("attack %-58s -> mount options %s" % ("mount flags of %s" % what, ",".join(opts)))
        self.check(not missing, "%s: mount at %s lacks %s (options %s)" % (
            what, path, missing, ",".join(opts)))


def _fill(path):
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, b"\0" * MiB)
    finally:
        os.close(fd)


def drain_fifos(d):
    """Open every FIFO under d for reading (unblocks a writer stuck in
    open()), read what comes for a moment, close."""
    fds = []
    try:
        for e in os.scandir(d):
            try:
                if stat.S_ISFIFO(os.lstat(e.path).st_mode):
                    fds.append(os.open(e.path, os.O_RDONLY | os.O_NONBLOCK))
            except OSError:
                pass
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            for fd in fds:
                try:
                    os.read(fd, 65536)
                except OSError:
                    pass
            time.sleep(0.05)
    finally:
        for fd in fds:
            os.close(fd)


class Flipper:
    """Swap path <-> alt (a real directory and a symlink) as fast as possible
    in a separate process, until stopped (by PID) or `limit` seconds pass.
    After stop(), path is the real directory again."""

    CODE = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
a, b, limit = sys.argv[1].encode(), sys.argv[2].encode(), float(sys.argv[3])
end = time.monotonic() + limit
n = 0
while time.monotonic() < end:
    libc.renameat2(-100, a, -100, b, 2)
    n += 1
    if n % 64 == 0:
        time.sleep(0.0005)  # leave the other core to the rest of the machine
"""

    def __init__(self, sec, path, alt, limit):
        self.sec, self.path, self.alt = sec, path, alt
        self.proc = subprocess.Popen([sys.executable, "-c", self.CODE, path, alt, str(limit)])
        sec.helpers.append(self.proc)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        if os.path.islink(self.path):
            renameat2_exchange(self.path, self.alt)
        assert os.path.isdir(self.path) and not os.path.islink(self.path)


def run_test(body, prefix, extra=()):
    """Entry point: sys.exit(run_test(run, "qsd-sec-x-"))."""
    def main():
        Sec(sys.argv, prefix, extra).main(body)
    return csilib.run_main(main)


def unix_socket_at(path):
    """A bound AF_UNIX socket file at path (the tenant's 'sockets at every
    name'); the socket object is returned so it stays open."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    d, n = os.path.split(path)
    cwd = os.open(".", os.O_RDONLY)
    try:
        os.chdir(d)
        s.bind(n)
    finally:
        os.fchdir(cwd)
        os.close(cwd)
    return s


__all__ = ["Sec", "run_test", "MiB", "SC", "BOUND", "Flipper", "mountinfo", "mounts_at",
           "make_deep_tree", "rm_tree", "vhost_info", "qsdctl_verify", "drain_fifos",
           "unix_socket_at", "renameat2_exchange", "under"]
