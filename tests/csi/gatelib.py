# SPDX-License-Identifier: Apache-2.0
"""Test scaffolding shared by the tests of qsd-node-gate (security/node_gate_*,
deploy/node_certs): a unix echo server standing in for the plugin's
node-operations socket, and a gate process whose stderr log lines are
collected so a test can wait for one.  Processes are stopped by PID
(SIGTERM, then SIGKILL after 10 s)."""
import hashlib
import os
import re
import signal
import socket
import subprocess
import threading
import time


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
