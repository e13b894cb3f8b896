# SPDX-License-Identifier: Apache-2.0
"""A throwaway single-node Ceph for tests: one mon and one memstore OSD on
127.0.0.1 (msgr v2, a free port), cephx on, no mgr, no systemd, everything
under one temporary directory.  Cluster(addr=IP) binds them to another
local address instead (tests/k8s: pods reach the host's address, not its
loopback).

    with Cluster() as ceph:          # up within START_TIMEOUT, or an exception
                                     # (watch_timeout=S: the OSD drops a dead
                                     # client's watch after S s, default 30)
        ceph.monitors                # "127.0.0.1:PORT"
        ceph.user, ceph.key          # restricted client: profile rbd on POOL/NAMESPACE
        ceph.rbd("create", ...)      # rbd/ceph CLI as client.admin, bounded

Owns the cluster's processes and its directory: stop() (also on an exception
inside the with block, and from an atexit hook) kills the daemons it started
by PID, waits for them, and removes the directory.  Needs the Debian
packages ceph-mon, ceph-osd and ceph-common (scripts/setup.sh); without them
the caller skips (have_ceph)."""
import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid

POOL = "rbd"
NAMESPACE = "ns1"
USER = "csi"                 # client.csi
START_TIMEOUT = 60.0
CMD_TIMEOUT = 30.0
BINARIES = ("ceph-mon", "ceph-osd", "ceph", "ceph-authtool", "monmaptool", "rbd")


def have_ceph():
    """None when every binary is installed, else what is missing."""
    missing = [b for b in BINARIES if not shutil.which(b)]
    return "not installed: " + " ".join(missing) if missing else None


def _free_port(addr="127.0.0.1"):
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


CONF = """[global]
fsid = {fsid}
mon host = [v2:{addr}:{port}]
mon initial members = a
public network = {network}
ms bind msgr1 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = {d}/keyring
run dir = {d}/run
admin socket = {d}/run/$name.asok
pid file = {d}/run/$name.pid
log file = {d}/log/$name.log
mon data = {d}/$name
osd data = {d}/$name
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon data avail warn = 2
mon data avail crit = 1
auth allow insecure global id reclaim = false
[client]
admin socket = {d}/run/$name.$pid.asok
log file = {d}/log/$name.$pid.log
[mon]
mon cluster log file = {d}/log/cluster.log
[osd]
keyring = {d}/$name/keyring
osd objectstore = memstore
memstore device bytes = 2147483648
osd op num shards = 1
osd op num threads per shard = 2
osd client watch timeout = {watch_timeout}
"""


class Cluster:
    def __init__(self, prefix="qsd-ceph-test-", watch_timeout=30, addr="127.0.0.1"):
        why = have_ceph()
        if why:
            raise RuntimeError("Ceph " + why)
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.procs = []          # daemons we started (Popen), stopped by PID
        self.addr = addr
        self.port = None
        self.key = None
        self.user = USER
        self.pool = POOL
        self.namespace = NAMESPACE
        self.watch_timeout = watch_timeout  # osd_client_watch_timeout: a dead client's watch
        self.start_seconds = None
        self.stop_seconds = None
        self.env = dict(os.environ, CEPH_CONF=os.path.join(self.dir, "ceph.conf"))
        atexit.register(self.stop)

    @property
    def monitors(self):
        return "%s:%d" % (self.addr, self.port)

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    # ------------------------------------------------------------ commands
    def run(self, *argv, input=None, check=True, timeout=CMD_TIMEOUT):
        """Run a Ceph CLI (ceph, rbd, ...) as client.admin; stdout."""
        r = subprocess.run(list(argv), env=self.env, input=input, capture_output=True,
                           text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError("%s failed (%d): %s" % (" ".join(argv[:3]), r.returncode,
                                                       r.stderr.strip()[-500:]))
        return r.stdout

    def ceph(self, *args, **kw):
        return self.run("ceph", "--connect-timeout", "10", *args, **kw)

    def rbd(self, *args, **kw):
        return self.run("rbd", *args, **kw)

    def _daemon(self, name, argv):
        log = open(os.path.join(self.dir, "log", name + ".out"), "wb")
        p = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
        log.close()
        self.procs.append(p)
        return p

    def _wait(self, what, pred, deadline):
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError("%s exited (%d) while waiting for %s:\n%s" %
                                       (p.args[0], p.returncode, what, self.log_tail()))
            if pred():
                return
            time.sleep(0.2)
        raise RuntimeError("timeout waiting for %s:\n%s" % (what, self.log_tail()))

    def write_clusters(self, directory, cluster_id="c1", extra=()):
        """The plugin's --rbd-clusters file in directory, naming this cluster
        cluster_id (and the extra entries): its path."""
        path = os.path.join(directory, "clusters.json")
        with open(path, "w") as f:
            json.dump([{"clusterID": cluster_id, "monitors": [self.monitors]}, *extra], f)
        return path

    @property
    def secrets(self):
        """The CSI secrets of the test user (userID, userKey)."""
        return {"userID": self.user, "userKey": self.key}

    def log_tail(self, n=20):
        out = []
        for name in sorted(os.listdir(os.path.join(self.dir, "log"))):
            try:
                with open(os.path.join(self.dir, "log", name), errors="replace") as f:
                    out.append("== %s\n%s" % (name, "".join(f.readlines()[-n:])))
            except OSError:
                pass
        return "\n".join(out)

    # --------------------------------------------------------------- start
    def start(self, timeout=START_TIMEOUT):
        t0 = time.monotonic()
        deadline = t0 + timeout
        d = self.dir
        for sub in ("run", "log", "mon.a", "osd.0"):
            os.mkdir(os.path.join(d, sub))
        self.port = _free_port(self.addr)
        fsid = str(uuid.uuid4())
        with open(os.path.join(d, "ceph.conf"), "w") as f:
            network = "127.0.0.0/8" if self.addr == "127.0.0.1" else self.addr + "/32"
            f.write(CONF.format(fsid=fsid, addr=self.addr, port=self.port, network=network, d=d,
                                watch_timeout=self.watch_timeout))
        kr = os.path.join(d, "keyring")
        self.run("ceph-authtool", "--create-keyring", kr, "--gen-key", "-n", "mon.",
                 "--cap", "mon", "allow *")
        self.run("ceph-authtool", kr, "--gen-key", "-n", "client.admin", "--cap", "mon",
                 "allow *", "--cap", "osd", "allow *", "--cap", "mgr", "allow *")
        monmap = os.path.join(d, "monmap")
        self.run("monmaptool", "--create", "--clobber", "--fsid", fsid, "--addv", "a",
                 "[v2:%s:%d]" % (self.addr, self.port), monmap)
        self.run("ceph-mon", "--mkfs", "-i", "a", "--monmap", monmap, "--keyring", kr)
        self._daemon("mon.a", ["ceph-mon", "-f", "-i", "a"])
        self._wait("the monitor", lambda: self.ceph("-s", check=False, timeout=15) != "",
                   deadline)
        osd_uuid = str(uuid.uuid4())
        osd_key = self.run("ceph-authtool", "--gen-print-key").strip()
        osd_id = self.ceph("osd", "new", osd_uuid, "-i", "-",
                           input='{"cephx_secret": "%s"}' % osd_key).strip()
        self.run("ceph-authtool", "--create-keyring", os.path.join(d, "osd.0", "keyring"),
                 "--name", "osd." + osd_id, "--add-key", osd_key)
        self.run("ceph-osd", "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid, timeout=60)
        self._daemon("osd." + osd_id, ["ceph-osd", "-f", "-i", osd_id])
        self._wait("the OSD", lambda: '"num_up_osds":1' in
                   self.ceph("osd", "stat", "-f", "json", check=False).replace(" ", ""),
                   deadline)
        self.ceph("osd", "pool", "create", POOL, "8", "8")
        self.rbd("pool", "init", POOL)
        self.rbd("namespace", "create", "%s/%s" % (POOL, NAMESPACE))
        # The plugin's user: RBD on one pool's namespace, nothing else.
        self.key = self.ceph("auth", "get-or-create-key", "client." + USER,
                             "mon", "profile rbd",
                             "osd", "profile rbd pool=%s namespace=%s" % (POOL, NAMESPACE)).strip()
        self.start_seconds = time.monotonic() - t0

    # ---------------------------------------------------------------- stop
    def stop(self):
        """Kill our daemons by PID (a throwaway cluster: no clean shutdown),
        reap them, remove the directory.  Idempotent."""
        t0 = time.monotonic()
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        alive = [p.pid for p in self.procs if p.poll() is None]
        self.procs = []
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        if self.stop_seconds is None:
            self.stop_seconds = time.monotonic() - t0
        if alive:
            raise RuntimeError("Ceph daemons still running after SIGKILL: %s" % alive)


def assert_key_hidden(key, log_text):
    """The cephx key is in no log text and on no process's command line."""
    assert key not in log_text, "the key is in the plugin's log"
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    assert key.encode() not in f.read(), "key on a command line"
            except OSError:
                pass
