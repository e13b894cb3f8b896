# SPDX-License-Identifier: Apache-2.0
"""Test scaffolding shared by the tests of qsd-node-gate (security/node_gate_*,
deploy/node_certs) and of the controller reaching a node (csi_nodecall,
rbd_qos): a unix echo server standing in for the plugin's node-operations
socket, a gate process whose stderr log lines are collected so a test can
wait for one, and Relay: the whole path from a controller plugin
(--node-dial) to a node plugin's node-operations socket (dial gate, a
stand-in API server, serve gate).  Processes are stopped by PID (SIGTERM,
then SIGKILL after 10 or 15 s).  accepting() is the tests' one probe of a
unix socket (csi_crash uses it too)."""
import hashlib
import http.server
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import threading
import time

import pkilib

TOKEN = "eyJhbGciOiJSUzI1NiJ9.test-token.sig"


class Echo:
    """A unix echo server: counts connections and the connections' EOFs,
    hashes what it receives.  group: the socket's group (mode 0660), else
    mode 0666.  close_after: a connection ends after data ending with these
    bytes.  echo=False: a sink.  go: cleared, connections are not read."""

    def __init__(self, path, group=None, close_after=None, echo=True):
        self.path, self.close_after, self.echo = path, close_after, echo
        self.go = threading.Event()
        self.go.set()
        self.conns = 0
        self.received = hashlib.sha256()
        self.nreceived = 0
        self.eofs = 0
        self.lock = threading.Lock()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        if group is None:
            os.chmod(path, 0o666)
        else:
            os.chown(path, 0, group)
            os.chmod(path, 0o660)
        self.sock.listen(64)
        self.stopped = False
        self.open = set()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.conns += 1
                self.open.add(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        try:
            self._echo(c)
        finally:
            with self.lock:
                self.open.discard(c)
            c.close()

    def _echo(self, c):
        while True:
            self.go.wait(60)
            try:
                d = c.recv(65536)
            except OSError:
                return
            if not d:
                with self.lock:
                    self.eofs += 1
                return
            with self.lock:
                self.received.update(d)
                self.nreceived += len(d)
            try:
                if self.echo:
                    c.sendall(d)
            except OSError:
                return
            if self.close_after and d.endswith(self.close_after):
                return

    def stop(self):
        """The listener and every open connection."""
        self.stopped = True
        self.sock.close()
        with self.lock:
            for c in self.open:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class GateProcess:
    """qsd-node-gate started with argv; waits (15 s) for its "listening"
    line.  port: the TCP port it listens on (None for a dial gate)."""

    def __init__(self, argv, group=None):
        self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True,
                                  **({"group": group} if group is not None else {}))
        self.pid = self.p.pid
        self.killed = False
        self.lines = []
        self.cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        m = self.wait_line(r"msg=listening (?:addr=(\S+)|mode=dial)", 15)
        if not m:
            self.stop()
            raise SystemExit(f"FAIL: the gate did not listen: {self.log()}")
        self.port = int(m.group(1).rsplit(":", 1)[1]) if m.group(1) else None

    def _read(self):
        for line in self.p.stderr:
            with self.cv:
                self.lines.append(line.rstrip("\n"))
                self.cv.notify_all()

    def wait_line(self, pattern, timeout=5.0, start=0):
        """The first match of pattern in the log lines from start on, waiting
        up to timeout seconds (less once the gate has exited); or None."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                for line in self.lines[start:]:
                    m = re.search(pattern, line)
                    if m:
                        return m
                left = deadline - time.monotonic()
                if left <= 0 or (self.p.poll() is not None and not self.cv.wait(0.2)):
                    return None
                self.cv.wait(min(left, 0.2))

    def mark(self):
        with self.cv:
            return len(self.lines)

    def log(self):
        with self.cv:
            return "\n".join(self.lines)

    def alive(self):
        return self.p.poll() is None

    def stop(self):
        """SIGTERM; SIGKILL after 10 s (then killed is True).  The exit
        status."""
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.killed = True
                self.p.kill()
                self.p.wait(10)
        return self.p.returncode


def make_pki(pki):
    """The driver's CA with the node's and the controller's pairs, and the
    cluster's CA with the API server's."""
    p = pkilib.Pki(pki)
    for ca in ("ca", "api-ca"):
        p.ca(ca, days=2)
    for name, ca, dns, eku in (("node", "ca", "qsd-csi-node", "serverAuth"),
                               ("controller", "ca", "qsd-csi-controller", "clientAuth"),
                               ("apiserver", "api-ca", "kubernetes.default.svc", "serverAuth")):
        p.leaf(name, ca, dns, dns, eku, days=2)
    p.lock_keys()


class ApiServer:
    """GET /api/v1/nodes/NAME as the API server answers it: the Node, or a
    Status with 404; 401 without the right bearer token."""

    def __init__(self, pki, nodes, token=None):
        token = token or TOKEN
        self.seen = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.seen.append((self.path, self.headers.get("Authorization")))
                m = re.fullmatch(r"/api/v1/nodes/([a-z0-9.-]+)", self.path)
                if self.headers.get("Authorization") != "Bearer " + token:
                    code, body = 401, {"kind": "Status", "message": "Unauthorized", "code": 401}
                elif not m or m.group(1) not in nodes:
                    name = m.group(1) if m else self.path
                    code, body = 404, {"kind": "Status", "code": 404,
                                       "message": 'nodes "%s" not found' % name}
                else:
                    code, body = 200, {"kind": "Node", "metadata": {"name": m.group(1)},
                                       "status": {"addresses": nodes[m.group(1)]}}
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.path.join(pki, "apiserver.pem"), os.path.join(pki, "apiserver.key"))
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class Proc:
    """A program of ours in the background, its log in a file."""

    def __init__(self, argv, log, ready):
        self.logpath = log
        self.f = open(log, "a")
        self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.f, stderr=self.f)
        deadline = time.monotonic() + 15
        while not ready():
            assert self.p.poll() is None, "%s exited %s: %s" % (argv[0], self.p.returncode,
                                                                self.log()[-2000:])
            assert time.monotonic() < deadline, "%s not ready: %s" % (argv[0], self.log()[-2000:])
            time.sleep(0.05)

    def log(self):
        with open(self.logpath) as f:
            return f.read()

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(15)
        self.f.close()
        return self.p.returncode


def accepting(path):
    """Whether the unix socket path accepts a connection (within 2 s: a
    listener whose backlog is full would hold connect() forever)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(2)
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class Relay:
    """A controller's way to a node plugin, as deployed: the node's serve
    gate in front of ops (the node plugin's --node-ops-endpoint socket,
    confined to gid), an API server answering nodes (name -> addresses),
    the controller's dial gate, and the token file; controller() starts a
    controller plugin using them.  procs: what stop() stops (the gates, the
    controllers, and whatever else a test appends)."""

    LOGS = ("controller.log", "dial-gate.log", "serve-gate.log")  # in root

    def __init__(self, root, gate, ops, nodes, uid, gid):
        self.root, self.procs, self.api = root, [], None
        pki = os.path.join(root, "pki")
        make_pki(pki)
        P = lambda n: os.path.join(pki, n)  # noqa: E731
        try:
            log = os.path.join(root, "serve-gate.log")
            self.serve = Proc([gate, "--listen", "127.0.0.1:0", "--forward", ops, "--ca",
                               P("ca.pem"), "--cert", P("node.pem"), "--key", P("node.key"),
                               "--peer-name", "qsd-csi-controller", "--uid", str(uid), "--gid",
                               str(gid)], log, lambda: "msg=listening" in open(log).read())
            self.procs.append(self.serve)
            port = int(re.search(r"msg=listening addr=127\.0\.0\.1:(\d+)",
                                 self.serve.log()).group(1))
            self.api = ApiServer(pki, nodes)
            self.dial = os.path.join(root, "dial", "dial.sock")
            os.makedirs(os.path.dirname(self.dial))
            log = os.path.join(root, "dial-gate.log")
            self.dialer = Proc([gate, "--dial", "--listen-unix", self.dial, "--port", str(port),
                                "--ca", P("ca.pem"), "--cert", P("controller.pem"), "--key",
                                P("controller.key"), "--peer-name", "qsd-csi-node", "--api-host",
                                "127.0.0.1", "--api-port", str(self.api.port), "--api-ca",
                                P("api-ca.pem"), "--uid", str(uid), "--gid", str(gid)],
                               log, lambda: "msg=listening" in open(log).read())
            self.procs.append(self.dialer)
            self.token = os.path.join(root, "token")
            with open(self.token, "w") as f:
                f.write(TOKEN + "\n")
        except BaseException:
            self.stop()
            raise

    def controller(self, plugin, sock, driver, extra=(), log="controller.log"):
        """A controller plugin (--role controller --node-dial) serving sock,
        ready; in procs (kill() takes one out)."""
        # Ready when this instance says so and accepts: for a few
        # milliseconds after a plugin on io_uring was killed (-9), its
        # listening socket still accepts (the ring's teardown, which holds
        # the socket, runs after the exit), so a connect alone may reach
        # the dead one.
        logp = os.path.join(self.root, log)
        before = open(logp).read().count("msg=serving") if os.path.exists(logp) else 0
        p = Proc([plugin, "--role", "controller", "--endpoint", "unix://" + sock,
                  "--driver-name", driver, "--node-dial", "unix://" + self.dial,
                  "--api-token-file", self.token, "--log-level", "debug",
                  *(extra or ["--rbd-clusters", "/dev/null"])], logp,
                 lambda: open(logp).read().count("msg=serving") > before and accepting(sock))
        self.procs.append(p)
        return p

    def kill(self, p):
        """SIGKILL p (one of procs, e.g. a controller), reap it (at most
        10 s) and take it out of procs."""
        p.p.kill()
        p.p.wait(10)
        self.procs.remove(p)
        p.f.close()

    def stop(self, check=False):
        """Stop procs, the newest first (the controllers before the gates
        they use), then the API server.  check: then assert that each
        exited 0 (SIGTERM's clean exit; one stopped before counts with its
        status).  Stopped ones leave procs, so a second stop() (a test's
        finally) has nothing left to do."""
        bad = []
        while self.procs:
            p = self.procs.pop()
            if p.stop() != 0:
                bad.append("%s exited %s" % (p.p.args[0], p.p.returncode))
        if self.api:
            self.api.stop()
            self.api = None
        assert not check or not bad, "; ".join(bad)

    @classmethod
    def tails(cls, root, *more, n=25):
        """Print the last n lines of each log in root named in more (e.g.
        the node plugin's), then of the relay's (LOGS), those that exist:
        what a failed test shows.  A class method: a test may fail before
        its Relay exists."""
        for name in (*more, *cls.LOGS):
            path = os.path.join(root, name)
            if os.path.exists(path):
                print("---- %s (tail)" % name)
                with open(path) as f:
                    print("".join(f.readlines()[-n:]))
