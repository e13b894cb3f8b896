#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""qsd-node-gate, the node endpoint's mutual-TLS front end, from outside.

The client is Python's ssl module (OpenSSL underneath, but not our code);
the certificates are made by the openssl CLI in the test's own directory;
the forward target is a unix echo server in this process that counts its
connections and hashes what it receives.

  serve    a good client's bytes reach the unix server and come back (small,
           and 8 MiB each way checked by SHA-256, IPv4 and IPv6; a CN-only
           certificate); the log's byte counts; either side's end closes
           the other; the idle deadline
  refuse   nothing reaches the unix server for: no client certificate,
           another CA, the right CA but another name, an expired
           certificate, a server-only certificate, a TLS 1.2-only client,
           plaintext, random bytes; each refusal logged with its reason
  bounds   a stalled handshake is closed at its deadline while another
           client is served; beyond --max-conns a connection is closed at
           once and the others keep working; a unix server that does not
           read: the client is held back (the gate's buffers and memory
           stay bounded), everything arrives once it reads; the forward
           socket gone: the client is closed, the gate serves again once
           it is back
  confine  /proc/PID/status: CapEff 0, NoNewPrivs 1, Seccomp 2 (0 in the
           sanitizer build, QSD_SANITIZED=1), the uid and gid asked; its
           own mount namespace with /etc and /usr empty; the fd limit; a
           forward socket on a tmpfs beneath a hidden path still reached
  cmdline  bad command lines and unusable files: non-zero exit, a message
           naming the option, nothing listening

The dial mode (--dial, the controller's side: a unix client sends
"CONNECT <ip>\n", the gate dials ip:--port with mutual TLS, answers OK or
ERR, then relays), chained to a serve gate in front of the echo server:

  dial          OK, then small echoes and 8 MiB each way checked by SHA-256
                (IPv4 and IPv6), counted in both gates' close lines; the
                client's half-close reaching the echo server as EOF and the
                answer still coming back; the echo server's close reaching
                the client
  dial_refuse   ERR and nothing connected or relayed for: garbage, HTTP,
                another verb, too long, unterminated, silent (the preamble
                deadline), a DNS name, a host with a port, brackets, an
                unspecified address, bytes before OK (in the preamble's
                write and right after it); a serve gate whose certificate
                names another host, one from another CA (ERR naming the
                verification, nothing reaching its echo server); nothing
                listening (ERR at once); a listener that never speaks TLS
                (ERR at the handshake deadline); still serving afterwards
  dial_confine  the dial gate's /proc status as the serve mode's, its unix
                socket 0660, and it still dials after confinement
  dial_cmdline  each mode's options refused in the other, what --dial
                requires, a stale socket replaced, a live one or a file
                refused; non-zero exit naming the option
  dial_api      the API server route (--api-host): `API`, OK, the bytes
                relayed both ways to a TLS server (Python's ssl, IPv4 and
                IPv6) that sees no client certificate; refused (ERR, nothing
                relayed) for a server certificate of another name or under
                another CA, and without the route; its command line

usage: test_node_gate.py GATE SCENARIO
"""
import hashlib
import os
import re
import select
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "csi"))
import gatelib  # noqa: E402
import pkilib  # noqa: E402
from gatelib import Echo  # noqa: E402

GATE, SCENARIO = sys.argv[1], sys.argv[2]
SANITIZED = os.environ.get("QSD_SANITIZED") == "1"
UID = GID = 64123
PEER = "qsd-csi-controller"
FAILS = []

if os.geteuid() != 0:
    print("SKIP: needs root (the gate makes a mount namespace and drops to a uid)")
    sys.exit(77)
if not shutil.which("openssl"):
    print("SKIP: no openssl CLI")
    sys.exit(77)

T = tempfile.mkdtemp(prefix="qsd-gate.")
SHM = None  # a directory on /dev/shm (confine)
_roots = os.environ.get("QSD_CSI_CTEST_ROOTS")
if _roots:
    with open(_roots, "a") as f:
        f.write(f"{os.getpid()} {T}\n")


def check(cond, msg):
    if not cond:
        FAILS.append(msg)
        print(f"FAIL {msg}", flush=True)
    return cond


# ---- certificates ----------------------------------------------------------

PKI = os.path.join(T, "pki")


def make_pki():
    p = pkilib.Pki(PKI)
    p.ca("ca")
    p.ca("other-ca")
    p.leaf("node", "ca", "qsd-csi-node", "qsd-csi-node", "serverAuth")
    p.leaf("good", "ca", PEER, PEER, "clientAuth")
    p.leaf("cn-only", "ca", PEER, None, "clientAuth")
    p.leaf("other-name", "ca", "intruder", "intruder", "clientAuth")
    p.leaf("foreign", "other-ca", PEER, PEER, "clientAuth")
    p.leaf("expired", "ca", PEER, PEER, "clientAuth", expired=True)
    p.leaf("server-only", "ca", PEER, PEER, "serverAuth")
    # serve gates that the dial gate must refuse
    p.leaf("node-other-host", "ca", "other-node", "other-node", "serverAuth")
    p.leaf("node-foreign", "other-ca", "qsd-csi-node", "qsd-csi-node", "serverAuth")
    # API servers for the dial gate's API route (a CA of their own, as a
    # cluster's is)
    p.ca("api-ca")
    p.leaf("apiserver", "api-ca", "kube-apiserver", API_NAME, "serverAuth")
    p.leaf("apiserver-other-name", "api-ca", "kube-apiserver", "evil.example", "serverAuth")
    p.lock_keys()


def pki(name):
    return os.path.join(PKI, name)


# ---- the forward target ------------------------------------------------------

# ---- the gate -------------------------------------------------------------------

GATES = []


class Gate(gatelib.GateProcess):
    def __init__(self, forward, listen="127.0.0.1:0", extra=(), identity=True, cert="node",
                 argv=None):
        args = argv or [GATE, "--listen", listen, "--ca", pki("ca.pem"), "--cert",
                        pki(f"{cert}.pem"), "--key", pki(f"{cert}.key"), "--peer-name", PEER,
                        "--forward", forward]
        args = [*args, *extra]
        if identity:
            args += ["--uid", str(UID), "--gid", str(GID)]
        super().__init__(args)
        GATES.append(self)

    def stop(self):
        rc = super().stop()
        if self.killed:
            check(False, "the gate did not stop on SIGTERM within 10 s")
        return rc


# ---- clients ---------------------------------------------------------------------

def client_ctx(name="good", tls12=False):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(pki("ca.pem"))
    if name:
        ctx.load_cert_chain(pki(f"{name}.pem"), pki(f"{name}.key"))
    if tls12:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def connect(gate, name="good", host="127.0.0.1", tls12=False, family=socket.AF_INET):
    raw = socket.socket(family, socket.SOCK_STREAM)
    raw.settimeout(10)
    raw.connect((host, gate.port))
    return client_ctx(name, tls12).wrap_socket(raw, server_hostname="qsd-csi-node")


def recv_exact(s, n):
    out = bytearray()
    while len(out) < n:
        d = s.recv(n - len(out))
        if not d:
            break
        out += d
    return bytes(out)


def echo_once(gate, msg=b"ping", **kw):
    s = connect(gate, **kw)
    s.sendall(msg)
    got = recv_exact(s, len(msg))
    s.close()
    return got == msg


def exchange(s, data, got, stall=10.0):
    """Send data and receive as much at once, on one thread (an SSLSocket is
    not for two threads at once; a plain socket works too): non-blocking, select.  Returns the count
    received; stops at EOF or after stall seconds without progress."""
    s.setblocking(False)
    sent = n = 0
    last = time.monotonic()
    while n < len(data):
        want_w = [s] if sent < len(data) else []
        select.select([s], want_w, [], 0.5)
        moved = False
        if sent < len(data):
            try:
                k = s.send(data[sent:sent + 65536])
                sent += k
                moved = k > 0
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                pass
        try:
            while True:
                d = s.recv(1 << 20)
                if not d:
                    return n
                got.update(d)
                n += len(d)
                moved = True
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            pass
        now = time.monotonic()
        if moved:
            last = now
        elif now - last > stall:
            print(f"stalled: sent {sent}, received {n}")
            return n
    return n


def closed_by_peer(s, timeout=5.0):
    """Whether the other side closed s (EOF, reset or a TLS alert) within timeout."""
    s.settimeout(timeout)
    try:
        while True:
            d = s.recv(4096)
            if not d:
                return True
    except (ssl.SSLError, ConnectionError):
        return True
    except (socket.timeout, TimeoutError):
        return False
    except OSError:
        return True


# ---- scenarios ---------------------------------------------------------------------

def scenario_serve():
    fwd = os.path.join(T, "run", "fwd.sock")
    echo = Echo(fwd)
    gate = Gate(fwd, extra=["--idle-timeout-ms", "2000"])
    check(echo_once(gate, b"hello through the gate"), "small echo")
    check(echo.nreceived == len(b"hello through the gate"), "the unix server got the bytes")
    check(echo_once(gate, b"cn only", name="cn-only"), "a certificate naming the peer by CN only")

    # 8 MiB each way, sent and received at once, checked by hash.
    size = 8 << 20
    data = os.urandom(size)
    before = echo.nreceived
    mark = gate.mark()
    s = connect(gate)
    got = hashlib.sha256()
    t0 = time.monotonic()
    n = exchange(s, data, got)
    secs = time.monotonic() - t0
    s.close()
    print(f"8 MiB each way in {secs:.2f} s")
    check(n == size and got.digest() == hashlib.sha256(data).digest(),
          f"8 MiB echoed intact (got {n} bytes)")
    m = gate.wait_line(r"msg=closed .*to_forward=(\d+) from_forward=(\d+)", 5, mark)
    check(m and int(m.group(1)) == size and int(m.group(2)) == size,
          f"the close line counts 8 MiB each way: {m and m.group(0)}")
    check(echo.nreceived - before == size, "the unix server received 8 MiB")

    # The client's end reaches the unix server (EOF), the server's end the
    # client (close_notify, then EOF).
    eofs = echo.eofs
    s = connect(gate)
    s.sendall(b"x")
    recv_exact(s, 1)
    s.close()
    deadline = time.monotonic() + 5
    while echo.eofs == eofs and time.monotonic() < deadline:
        time.sleep(0.05)
    check(echo.eofs > eofs, "the client's close reaches the unix server as EOF")
    echo.stop()
    echo = Echo(fwd, close_after=b"bye")
    s = connect(gate)
    s.sendall(b"bye")
    check(recv_exact(s, 3) == b"bye", "the answer before the server's close")
    check(closed_by_peer(s, 3), "the unix server's close reaches the client")
    s.close()

    # Idle: a connection that moves nothing for 2 s is closed.
    mark = gate.mark()
    s = connect(gate)
    s.sendall(b"idle")
    recv_exact(s, 4)
    t0 = time.monotonic()
    closed = closed_by_peer(s, 8)
    idle = time.monotonic() - t0
    s.close()
    check(closed and 1.5 <= idle <= 5, f"idle connection closed after {idle:.1f} s (2 s asked)")
    check(gate.wait_line(r"msg=closed .*reason=\"idle timeout\"", 3, mark), "idle close logged")

    # IPv6.
    if socket.has_ipv6:
        try:
            probe = socket.socket(socket.AF_INET6)
            probe.bind(("::1", 0))
            probe.close()
            v6 = Gate(fwd, listen="[::1]:0")
            check(echo_once(v6, b"over v6", host="::1", family=socket.AF_INET6), "IPv6 echo")
            check(v6.wait_line(r"msg=connected peer=\[::1\]:\d+", 3), "IPv6 peer logged")
            check(v6.stop() == 0, "the IPv6 gate exits 0 on SIGTERM")
        except OSError as e:
            print(f"no IPv6 loopback here ({e}): IPv6 not checked")
    check(gate.stop() == 0, "the gate exits 0 on SIGTERM")
    check(gate.wait_line(r"msg=exiting accepted=\d+ relayed=\d+", 3), "final counters logged")
    echo.stop()


REFUSALS = [
    # (what, how, the reason the log must give)
    ("no client certificate", dict(name=None), r"peer did not return a certificate"),
    ("another CA", dict(name="foreign"), r"certificate: unable to get local issuer"),
    ("the right CA, another name", dict(name="other-name"), r"certificate: hostname mismatch"),
    ("expired", dict(name="expired"), r"certificate: certificate has expired"),
    ("a server-only certificate", dict(name="server-only"),
     r"certificate: unsuitable certificate purpose"),
    ("a TLS 1.2-only client", dict(tls12=True), r"unsupported protocol"),
]


def refused_tls(gate, echo, what, kw, reason):
    conns = echo.conns
    mark = gate.mark()
    try:
        s = connect(gate, **kw)
        try:
            s.sendall(b"secret request")
        except (ssl.SSLError, OSError):
            pass
        # the gate's refusal (an alert, then the close); a client that
        # reads data here got through
        s.settimeout(5)
        try:
            d = s.recv(100)
            check(not d, f"{what}: got data {d!r}")
        except (ssl.SSLError, ConnectionError, OSError):
            pass
        s.close()
    except (ssl.SSLError, ConnectionError, OSError):
        pass
    m = gate.wait_line(r"msg=refused peer=\S+ reason=\"([^\"]*)\"", 5, mark)
    print(f"refused: {what} -> {m and m.group(1)}")
    check(m and re.search(reason, m.group(1)), f"{what}: logged reason {m and m.group(1)!r}, "
          f"wanted /{reason}/")
    time.sleep(0.1)
    check(echo.conns == conns, f"{what}: reached the unix server")


def refused_raw(gate, echo, what, payload):
    conns = echo.conns
    mark = gate.mark()
    s = socket.create_connection(("127.0.0.1", gate.port), timeout=5)
    try:
        s.sendall(payload)
    except OSError:
        pass
    check(closed_by_peer(s, 5), f"{what}: not closed within 5 s")
    s.close()
    m = gate.wait_line(r"msg=refused peer=\S+ reason=\"([^\"]*)\"", 5, mark)
    print(f"refused: {what} -> {m and m.group(1)}")
    check(m, f"{what}: no refusal logged")
    check(echo.conns == conns, f"{what}: reached the unix server")


def scenario_refuse():
    fwd = os.path.join(T, "run", "fwd.sock")
    echo = Echo(fwd)
    gate = Gate(fwd)
    for what, kw, reason in REFUSALS:
        refused_tls(gate, echo, what, kw, reason)
    refused_raw(gate, echo, "plaintext HTTP", b"GET / HTTP/1.1\r\nHost: node\r\n\r\n")
    refused_raw(gate, echo, "plaintext garbage", b"hello? " * 100 + b"\n")
    refused_raw(gate, echo, "random bytes", os.urandom(4096))
    # a TLS record header announcing a huge ClientHello, then random bytes
    refused_raw(gate, echo, "a forged record", b"\x16\x03\x01\xff\xff" + os.urandom(65535))
    check(gate.alive(), "the gate survived the refusals")
    conns = echo.conns
    check(echo_once(gate, b"still here"), "a good client after the refusals")
    check(echo.conns == conns + 1, "exactly the good client reached the unix server")
    check(gate.stop() == 0, "the gate exits 0 on SIGTERM")
    echo.stop()


def scenario_bounds():
    fwd = os.path.join(T, "run", "fwd.sock")
    echo = Echo(fwd)
    gate = Gate(fwd, extra=["--handshake-timeout-ms", "1500", "--max-conns", "3"])

    # Stalled handshakes: one sends part of a record header, one nothing.
    mark = gate.mark()
    t0 = time.monotonic()
    stalled = [socket.create_connection(("127.0.0.1", gate.port), timeout=5) for _ in range(2)]
    stalled[0].sendall(b"\x16\x03\x01\x02")
    check(echo_once(gate, b"served meanwhile"), "a client served while two handshakes stall")
    served = time.monotonic() - t0
    check(served < 1.4, f"served in {served:.2f} s, before the stalled deadline")
    for i, s in enumerate(stalled):
        check(closed_by_peer(s, 6), f"stalled handshake {i} not closed")
        s.close()
    took = time.monotonic() - t0
    check(1.2 <= took <= 4.5, f"stalled handshakes closed after {took:.1f} s (1.5 s asked)")
    m = gate.wait_line(r"reason=\"handshake timeout\"", 3, mark)
    check(m, "handshake timeout logged")

    # --max-conns 3: three relayed connections; a fourth is closed at once.
    held = []
    for i in range(3):
        s = connect(gate)
        s.sendall(b"hold%d" % i)
        check(recv_exact(s, 5) == b"hold%d" % i, f"held connection {i}")
        held.append(s)
    mark = gate.mark()
    conns = echo.conns
    t0 = time.monotonic()
    extra = socket.create_connection(("127.0.0.1", gate.port), timeout=5)
    check(closed_by_peer(extra, 3), "the connection beyond --max-conns was not closed")
    check(time.monotonic() - t0 < 1.0, "closed at once")
    extra.close()
    check(gate.wait_line(r"msg=refused .*reason=max-conns max_conns=3", 3, mark),
          "max-conns refusal logged")
    for i, s in enumerate(held):
        s.sendall(b"again")
        check(recv_exact(s, 5) == b"again", f"held connection {i} still works")
    check(echo.conns == conns, "the refused connection reached nothing")
    held.pop().close()
    time.sleep(0.3)
    check(echo_once(gate, b"a slot again"), "a new client once a slot is free")
    for s in held:
        s.close()

    backpressure()

    # The forward socket gone: the client is closed, the gate keeps serving.
    echo.stop()
    mark = gate.mark()
    s = connect(gate)
    check(closed_by_peer(s, 5), "a client with no forward socket was not closed")
    s.close()
    check(gate.wait_line(r"msg=\"forward unavailable\" .*error=\"No such file", 3, mark),
          "forward unavailable logged")
    echo = Echo(fwd)
    check(echo_once(gate, b"back"), "served again once the forward socket is back")
    # ... and gone while a connection is open: that client is closed.
    s = connect(gate)
    s.sendall(b"1")
    recv_exact(s, 1)
    echo.stop()
    check(closed_by_peer(s, 5), "a client whose forward connection ended was not closed")
    s.close()
    check(gate.alive() and gate.stop() == 0, "the gate exits 0 on SIGTERM")


def vmrss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def backpressure():
    """A unix server that does not read: the gate stops reading the client
    (its buffers are bounded), then everything arrives once it reads."""
    sink = Echo(os.path.join(T, "run", "sink.sock"), echo=False)
    sink.go.clear()
    gate = Gate(sink.path)
    s = connect(gate)
    s.sendall(b"w")  # the relay is up (the sink's connection is open)
    s.setblocking(False)
    rss0 = vmrss_kib(gate.pid)
    chunk = os.urandom(65536)
    h = hashlib.sha256(b"w")
    sent, last = 1, time.monotonic()
    while time.monotonic() - last < 1.5 and sent < (256 << 20):
        try:
            k = s.send(chunk)
            h.update(chunk[:k])
            sent += k
            last = time.monotonic()
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
            select.select([], [s], [], 0.2)
    rss1 = vmrss_kib(gate.pid)
    print(f"backpressure: the client could send {sent >> 10} KiB to a server not reading; "
          f"gate RSS {rss0} -> {rss1} KiB")
    check(sent < (64 << 20), f"the gate took {sent} bytes the unix server did not read")
    check(rss1 - rss0 < 16 << 10, f"the gate grew by {rss1 - rss0} KiB")
    sink.go.set()
    # The send that blocked may have passed some of its records already:
    # OpenSSL wants it repeated with the same bytes, and counts it whole.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            k = s.send(chunk)
            h.update(chunk[:k])
            sent += k
            break
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
            select.select([], [s], [], 0.2)
    while sink.nreceived < sent and time.monotonic() < deadline:
        time.sleep(0.05)
    check(sink.nreceived == sent and sink.received.digest() == h.digest(),
          f"{sink.nreceived} of {sent} bytes arrived intact once the server read")
    s.close()
    check(gate.stop() == 0, "the backpressure gate exits 0 on SIGTERM")
    sink.stop()


def status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def scenario_confine():
    global SHM
    fwd = os.path.join(T, "run", "fwd.sock")
    echo = Echo(fwd)
    gate = Gate(fwd, extra=["--max-conns", "10"])
    check(echo_once(gate), "serves")
    st = status(gate.pid)
    for k in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb"):
        check(st.get(k) == "0000000000000000", f"{k} {st.get(k)}")
    check(st.get("NoNewPrivs") == "1", f"NoNewPrivs {st.get('NoNewPrivs')}")
    want = "0" if SANITIZED else "2"
    check(st.get("Seccomp") == want, f"Seccomp {st.get('Seccomp')}, wanted {want}"
          + (" (sanitizer build: no filter)" if SANITIZED else ""))
    check(st.get("Uid", "").split() == [str(UID)] * 4, f"Uid {st.get('Uid')}")
    check(st.get("Gid", "").split() == [str(GID)] * 4, f"Gid {st.get('Gid')}")
    check(st.get("Groups", "x") == "", f"Groups {st.get('Groups')}")
    check(os.readlink(f"/proc/{gate.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt"),
          "a mount namespace of its own")
    for d in ("etc", "usr", "tmp", "var", "dev"):
        seen = os.listdir(f"/proc/{gate.pid}/root/{d}")
        check(seen == [], f"/{d} in the gate's namespace holds {seen[:5]}")
    with open(f"/proc/{gate.pid}/limits") as f:
        lim = [line for line in f if line.startswith("Max open files")]
    check(lim and lim[0].split()[3] == "36", f"open files limit {lim}")
    print(f"confined: {st.get('CapEff')} nnp={st.get('NoNewPrivs')} "
          f"seccomp={st.get('Seccomp')} uid={st.get('Uid')}")
    check(echo_once(gate, b"after the checks"), "still serves")
    check(gate.stop() == 0, "the gate exits 0 on SIGTERM")
    echo.stop()

    # The forward socket on a tmpfs mounted beneath a hidden path (/dev/shm):
    # detached in the gate's namespace, still its working directory.
    SHM = tempfile.mkdtemp(prefix="qsd-gate.", dir="/dev/shm")
    if _roots:
        with open(_roots, "a") as f:
            f.write(f"{os.getpid()} {SHM}\n")
    fwd = os.path.join(SHM, "run", "fwd.sock")  # run/: 0755, SHM itself 0700
    echo = Echo(fwd)
    gate = Gate(fwd)
    check(os.listdir(f"/proc/{gate.pid}/root/dev") == [], "/dev hidden")
    check(echo_once(gate, b"via /dev/shm"), "a forward socket beneath a hidden mount")
    check(gate.stop() == 0, "the gate exits 0 on SIGTERM")
    echo.stop()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def scenario_cmdline():
    fwd = os.path.join(T, "run", "fwd.sock")
    os.makedirs(os.path.dirname(fwd))
    with open(pki("empty.pem"), "w"):
        pass
    with open(pki("junk.key"), "w") as f:
        f.write("-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    busy_port = busy.getsockname()[1]
    port = free_port()
    base = {"--listen": f"127.0.0.1:{port}", "--ca": pki("ca.pem"), "--cert": pki("node.pem"),
            "--key": pki("node.key"), "--peer-name": PEER, "--forward": fwd}
    cases = [
        # (what, changes: option -> value (None: left out), the option the message names)
        ("no --ca", {"--ca": None}, "--ca"),
        ("no --listen", {"--listen": None}, "--listen"),
        ("no --forward", {"--forward": None}, "--forward"),
        ("a host name", {"--listen": f"localhost:{port}"}, "--listen"),
        ("no port", {"--listen": "127.0.0.1"}, "--listen"),
        ("port 65536", {"--listen": "127.0.0.1:65536"}, "--listen"),
        ("IPv6 without brackets", {"--listen": f"::1:{port}"}, "--listen"),
        ("a port in use", {"--listen": f"127.0.0.1:{busy_port}"}, "--listen"),
        ("an address not ours", {"--listen": f"192.0.2.1:{port}"}, "--listen"),
        ("a missing CA", {"--ca": pki("missing.pem")}, "--ca"),
        ("an empty CA", {"--ca": pki("empty.pem")}, "--ca"),
        ("a missing cert", {"--cert": pki("missing.pem")}, "--cert"),
        ("a key not a key", {"--key": pki("junk.key")}, "--key"),
        ("a key of another cert", {"--key": pki("good.key")}, "--key"),
        ("a missing directory", {"--forward": "/nonexistent/dir/fwd.sock"}, "--forward"),
        ("a directory, no name", {"--forward": os.path.dirname(fwd) + "/"}, "--forward"),
        ("a name too long", {"--forward": os.path.join(T, "x" * 120)}, "--forward"),
        ("an empty peer name", {"--peer-name": ""}, "--peer-name"),
    ]
    flags = [
        ("--max-conns 0", ["--max-conns", "0"], "--max-conns"),
        ("--max-conns 1025", ["--max-conns", "1025"], "--max-conns"),
        ("--uid alone", ["--uid", "1000"], "--uid"),
        ("--gid not a number", ["--uid", "1", "--gid", "x"], "--gid"),
        ("--handshake-timeout-ms 0", ["--handshake-timeout-ms", "0"], "--handshake-timeout-ms"),
        ("--idle-timeout-ms 1s", ["--idle-timeout-ms", "1s"], "--idle-timeout-ms"),
        ("an unknown option", ["--bogus"], "--bogus"),
        ("a stray argument", ["stray"], "stray"),
        ("--log-level loud", ["--log-level", "loud"], "--log-level"),
        ("a value missing", ["--max-conns"], "--max-conns"),
    ]
    runs = [(w, {**base, **ch}, [], opt) for w, ch, opt in cases]
    runs += [(w, base, fl, opt) for w, fl, opt in flags]
    for what, opts, fl, opt in runs:
        argv = [GATE]
        for k, v in opts.items():
            if v is not None:
                argv += [k, v]
        argv += fl
        r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        first = r.stderr.strip().splitlines()[0] if r.stderr.strip() else ""
        print(f"{what}: rc={r.returncode} {first}")
        check(r.returncode != 0, f"{what}: exit 0")
        check(opt in first, f"{what}: the message does not name {opt}: {first!r}")
        if what != "a port in use":
            try:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
                check(False, f"{what}: something listens on {port}")
            except OSError:
                pass
    busy.close()
    r = subprocess.run([GATE, "--version"], capture_output=True, text=True, timeout=20)
    check(r.returncode == 0 and r.stdout.startswith("qsd-node-gate "), "--version")
    r = subprocess.run([GATE, "--help"], capture_output=True, text=True, timeout=20)
    check(r.returncode == 0 and "--peer-name" in r.stdout, "--help")


# ---- the dial mode -----------------------------------------------------------------

NODE_NAME = "qsd-csi-node"
API_NAME = "kubernetes.default.svc"


def dial_gate(path, port, extra=(), identity=True):
    """A dial gate with the controller's certificate, on unix socket path."""
    argv = [GATE, "--dial", "--listen-unix", path, "--port", str(port), "--ca", pki("ca.pem"),
            "--cert", pki("good.pem"), "--key", pki("good.key"), "--peer-name", NODE_NAME]
    return Gate(None, argv=argv, extra=extra, identity=identity)


def read_line(s, limit=256):
    """One line, a byte at a time (nothing after it is consumed); b"" at EOF."""
    out = b""
    while len(out) < limit:
        try:
            d = s.recv(1)
        except (OSError, socket.timeout):
            break
        if not d:
            break
        out += d
        if d == b"\n":
            break
    return out


def dial(path, host=None, payload=None, timeout=10.0):
    """A unix client of the dial gate: the preamble (or payload), then the
    gate's answer line.  Returns (socket, line)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    s.sendall(payload if payload is not None else f"CONNECT {host}\n".encode())
    return s, read_line(s)


def dial_echo(path, host, msg=b"ping"):
    s, line = dial(path, host)
    if line != b"OK\n":
        s.close()
        print(f"dial {host}: {line!r}")
        return False
    s.sendall(msg)
    got = recv_exact(s, len(msg))
    s.close()
    return got == msg


def shut_closed(s, timeout=5.0):
    """Whether the other side ended s (EOF or reset) within timeout."""
    s.settimeout(timeout)
    try:
        while True:
            if not s.recv(4096):
                return True
    except (socket.timeout, TimeoutError):
        return False
    except OSError:
        return True


def loopback_port():
    """A port free on 127.0.0.1 (the other 127/8 addresses are ours too)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Silent:
    """A TCP listener that accepts and never speaks; counts its connections."""

    def __init__(self, host, port):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(16)
        self.held = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(c)

    def stop(self):
        self.sock.close()
        for c in self.held:
            c.close()


def scenario_dial():
    fwd = os.path.join(T, "run", "fwd.sock")
    echo = Echo(fwd)
    serve = Gate(fwd)
    path = os.path.join(T, "run", "dial.sock")
    gate = dial_gate(path, serve.port)
    check(dial_echo(path, "127.0.0.1", b"hello through both gates"), "small echo")
    check(echo.nreceived == len(b"hello through both gates"), "the echo server got the bytes")
    check(gate.wait_line(rf"msg=connected peer=127\.0\.0\.1:{serve.port} ", 3),
          "the dial gate logs the destination")

    # 8 MiB each way, at once, checked by hash; both gates count them.
    size = 8 << 20
    data = os.urandom(size)
    before = echo.nreceived
    gmark, smark = gate.mark(), serve.mark()
    s, line = dial(path, "127.0.0.1")
    check(line == b"OK\n", f"OK before the relay: {line!r}")
    got = hashlib.sha256()
    t0 = time.monotonic()
    n = exchange(s, data, got)
    secs = time.monotonic() - t0
    s.close()
    print(f"8 MiB each way through dial gate and serve gate in {secs:.2f} s")
    check(n == size and got.digest() == hashlib.sha256(data).digest(),
          f"8 MiB echoed intact (got {n} bytes)")
    m = gate.wait_line(r"msg=closed .*to_server=(\d+) from_server=(\d+)", 5, gmark)
    check(m and int(m.group(1)) == size and int(m.group(2)) == size,
          f"the dial gate's close line counts 8 MiB each way: {m and m.group(0)}")
    m = serve.wait_line(r"msg=closed .*to_forward=(\d+) from_forward=(\d+)", 5, smark)
    check(m and int(m.group(1)) == size and int(m.group(2)) == size,
          f"the serve gate's close line counts 8 MiB each way: {m and m.group(0)}")
    check(echo.nreceived - before == size, "the echo server received 8 MiB")

    # The client's half-close: the echo server sees EOF after the bytes, and
    # the answer still comes back, then the end.
    eofs = echo.eofs
    s, line = dial(path, "127.0.0.1")
    s.sendall(b"half")
    s.shutdown(socket.SHUT_WR)
    check(recv_exact(s, 4) == b"half", "the answer after the client's half-close")
    check(shut_closed(s, 5), "the end after the client's half-close")
    s.close()
    deadline = time.monotonic() + 5
    while echo.eofs == eofs and time.monotonic() < deadline:
        time.sleep(0.05)
    check(echo.eofs > eofs, "the client's half-close reaches the echo server as EOF")

    # The echo server's close reaches the unix client.
    echo.stop()
    echo = Echo(fwd, close_after=b"bye")
    s, line = dial(path, "127.0.0.1")
    s.sendall(b"bye")
    check(recv_exact(s, 3) == b"bye", "the answer before the echo server's close")
    check(shut_closed(s, 3), "the echo server's close reaches the unix client")
    s.close()
    echo.stop()
    echo = Echo(fwd)

    # IPv6: a serve gate on [::1] at the same port.
    try:
        probe = socket.socket(socket.AF_INET6)
        probe.bind(("::1", serve.port))
        probe.close()
        v6 = Gate(fwd, listen=f"[::1]:{serve.port}")
        mark = gate.mark()
        check(dial_echo(path, "::1", b"over v6"), "IPv6 echo")
        check(gate.wait_line(rf"msg=connected peer=\[::1\]:{serve.port} ", 3, mark),
              "IPv6 destination logged")
        s, line = dial(path, "::1")
        got = hashlib.sha256()
        n = exchange(s, data, got)
        s.close()
        check(n == size and got.digest() == hashlib.sha256(data).digest(),
              f"8 MiB each way over IPv6 (got {n} bytes)")
        check(v6.stop() == 0, "the IPv6 serve gate exits 0 on SIGTERM")
    except OSError as e:
        print(f"no IPv6 loopback here ({e}): IPv6 not checked")
    check(gate.stop() == 0, "the dial gate exits 0 on SIGTERM")
    check(gate.wait_line(r"msg=exiting accepted=\d+ relayed=\d+", 3), "final counters logged")
    check(serve.stop() == 0, "the serve gate exits 0 on SIGTERM")
    echo.stop()


DIAL_REFUSALS = [
    # (what, what the client sends, the ERR line's reason)
    ("garbage", b"hello?\n", r"expected CONNECT <ip>"),
    ("HTTP", b"GET / HTTP/1.1\r\nHost: node\r\n\r\n", r"expected CONNECT <ip>"),
    ("another verb", b"BIND 127.0.0.2\n", r"expected CONNECT <ip>"),
    ("lower case", b"connect 127.0.0.2\n", r"expected CONNECT <ip>"),
    ("too long", b"CONNECT " + b"1" * 200, r"preamble too long"),
    ("a DNS name", b"CONNECT localhost\n", r"host is not an IP address"),
    ("a long DNS name", b"CONNECT node-1.cluster.example.com\n", r"host is not an IP address"),
    ("a host with a port", b"CONNECT 127.0.0.2:22\n", r"host is not an IP address"),
    ("IPv6 with a port", b"CONNECT [::1]:22\n", r"host is not an IP address"),
    ("IPv6 in brackets", b"CONNECT [::1]\n", r"host is not an IP address"),
    ("CRLF", b"CONNECT 127.0.0.2\r\n", r"host is not an IP address"),
    ("an unspecified address", b"CONNECT 0.0.0.0\n", r"host is not a unicast address"),
    ("bytes before OK, same write", b"CONNECT 127.0.0.2\nGET / HTTP/1.1\r\n\r\n",
     r"bytes before OK"),
]


def dial_refused(path, what, payload, reason, watched, shut=False, timeout=5.0):
    """ERR with the reason, then the close; no connection reached watched
    (a list of (name, count function))."""
    before = [(name, f()) for name, f in watched]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    t0 = time.monotonic()
    if payload:
        s.sendall(payload)
    if shut:
        s.shutdown(socket.SHUT_WR)
    line = read_line(s)
    took = time.monotonic() - t0
    print(f"dial refused: {what} -> {line!r} in {took:.2f} s")
    check(re.fullmatch(rb"ERR [^\n]+\n", line) and re.search(reason.encode(), line),
          f"{what}: answer {line!r}, wanted ERR /{reason}/")
    check(shut_closed(s, 3), f"{what}: not closed after ERR")
    s.close()
    time.sleep(0.05)
    for (name, n0), (_, f) in zip(before, watched):
        check(f() == n0, f"{what}: {name} changed ({n0} -> {f()})")
    return took


def scenario_dial_refuse():
    port = loopback_port()
    fwd = os.path.join(T, "run", "fwd.sock")
    echo = Echo(fwd)
    good = Gate(fwd, listen=f"127.0.0.1:{port}")
    silent = Silent("127.0.0.2", port)
    echo3 = Echo(os.path.join(T, "run", "fwd3.sock"))
    other_host = Gate(echo3.path, listen=f"127.0.0.3:{port}", cert="node-other-host")
    echo4 = Echo(os.path.join(T, "run", "fwd4.sock"))
    foreign = Gate(echo4.path, listen=f"127.0.0.4:{port}", cert="node-foreign")
    path = os.path.join(T, "run", "dial.sock")
    gate = dial_gate(path, port, extra=["--handshake-timeout-ms", "1500"])
    watched = [("the silent listener's connections", lambda: len(silent.held)),
               ("the good echo server's connections", lambda: echo.conns),
               ("the good echo server's bytes", lambda: echo.nreceived)]
    check(dial_echo(path, "127.0.0.1", b"first"), "a good dial first")
    for what, payload, reason in DIAL_REFUSALS:
        dial_refused(path, what, payload, reason, watched)
    dial_refused(path, "unterminated, then EOF", b"CONNECT 127.0.0.2", r"preamble not terminated",
                 watched, shut=True)
    took = dial_refused(path, "silent (no preamble)", b"", r"preamble timeout", watched)
    check(1.2 <= took <= 4.5, f"the preamble deadline after {took:.2f} s (1.5 s asked)")

    # Bytes right after the preamble, in a write of their own: caught in the
    # preamble's read or before OK; nothing reaches the echo server.  The
    # serve gate is stopped meanwhile, so the dial gate's handshake cannot
    # end (and its check for early bytes come) before they are in the
    # socket: otherwise a loaded machine can delay the second write past
    # that check, and such bytes are relayed as the client's, as designed.
    for i in range(5):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(path)
        n0 = echo.nreceived
        os.kill(good.pid, signal.SIGSTOP)
        try:
            s.sendall(b"CONNECT 127.0.0.1\n")
            s.sendall(b"too early")
            time.sleep(0.1)
        finally:
            os.kill(good.pid, signal.SIGCONT)
        line = read_line(s)
        check(line == b"ERR bytes before OK\n", f"bytes before OK, own write {i}: {line!r}")
        check(shut_closed(s, 3), "closed after ERR")
        s.close()
        time.sleep(0.05)
        check(echo.nreceived == n0, f"bytes before OK reached the echo server ({i})")

    # Destinations the TLS client must refuse: ERR naming the verification,
    # nothing reaching their echo servers.
    for what, host, reason, srv, e in [
            ("a serve gate naming another host", "127.0.0.3", r"tls: certificate: hostname mismatch",
             other_host, echo3),
            ("a serve gate of another CA", "127.0.0.4",
             r"tls: certificate: unable to get local issuer certificate", foreign, echo4)]:
        dial_refused(path, what, f"CONNECT {host}\n".encode(), reason,
                     [("its echo server's connections", lambda e=e: e.conns),
                      ("its echo server's bytes", lambda e=e: e.nreceived)])
        check(srv.wait_line(r"msg=refused", 3), f"{what}: the serve gate saw the handshake end")
    took = dial_refused(path, "nothing listening", b"CONNECT 127.0.0.5\n",
                        r"connect: Connection refused", [])
    check(took < 1.0, f"nothing listening answered in {took:.2f} s")
    n0 = len(silent.held)
    took = dial_refused(path, "a listener that never speaks TLS", b"CONNECT 127.0.0.2\n",
                        r"handshake timeout", [])
    check(len(silent.held) == n0 + 1, "the silent listener got the one connection")
    check(1.2 <= took <= 4.5, f"the handshake deadline after {took:.2f} s (1.5 s asked)")
    # An address nothing answers for (TEST-NET-1): the connect's deadline, or
    # an error at once where there is no route.
    took = dial_refused(path, "an address that does not answer", b"CONNECT 192.0.2.1\n",
                        r"connect", [])
    check(took <= 4.5, f"the unanswered connect ended after {took:.2f} s")

    check(gate.alive(), "the dial gate survived the refusals")
    conns = echo.conns
    check(dial_echo(path, "127.0.0.1", b"still here"), "a good dial after the refusals")
    check(echo.conns == conns + 1, "exactly the good dial reached the echo server")
    check(gate.wait_line(r"msg=refused peer=\S+ reason=\"host is not an IP address\"", 1),
          "refusals logged with their reason")
    check(gate.stop() == 0, "the dial gate exits 0 on SIGTERM")
    silent.stop()

    # A serve gate that refuses the dial gate's certificate (it wants
    # another peer name): TLS 1.3 ends the client's handshake before the
    # server has checked the client's certificate, so the client gets OK,
    # then the close; nothing reaches the echo server.
    echo6 = Echo(os.path.join(T, "run", "fwd6.sock"))
    picky = Gate(echo6.path, listen=f"127.0.0.6:{port}", extra=["--peer-name", "someone-else"])
    gate = dial_gate(path, port)
    s, line = dial(path, "127.0.0.6")
    print(f"a serve gate refusing the controller's certificate -> {line!r}")
    check(line == b"OK\n" or line.startswith(b"ERR tls: "), f"refused by the serve gate: {line!r}")
    try:
        s.sendall(b"request")
    except OSError:
        pass
    check(shut_closed(s, 5), "refused by the serve gate: not closed")
    s.close()
    check(picky.wait_line(r"msg=refused .*reason=\"certificate: hostname mismatch\"", 3),
          "the serve gate logged the controller's certificate refused")
    check(echo6.conns == 0 and echo6.nreceived == 0, "refused by the serve gate: reached its echo")
    m = gate.wait_line(r"msg=(?:closed|refused) peer=127\.0\.0\.6:\d+ reason=\"([^\"]*)\"", 3)
    print(f"the dial gate's reason: {m and m.group(1)}")
    check(m and re.search(r"server: |tls: ", m.group(1)), "the dial gate logged the server's refusal")
    check(gate.stop() == 0, "the second dial gate exits 0 on SIGTERM")

    # --max-conns in dial mode: beyond it, ERR at once.
    gate = dial_gate(path, port, extra=["--max-conns", "2"])
    held = []
    for _ in range(2):
        h = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        h.connect(path)
        held.append(h)
    time.sleep(0.2)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(path)
    t0 = time.monotonic()
    line = read_line(s)
    check(line == b"ERR max-conns\n" and time.monotonic() - t0 < 1.0,
          f"beyond --max-conns 2: {line!r}")
    s.close()
    for h in held:
        h.close()
    time.sleep(0.2)
    check(dial_echo(path, "127.0.0.1", b"a slot again"), "a dial once the slots are free")
    check(gate.stop() == 0, "the third dial gate exits 0 on SIGTERM")
    for g in (good, other_host, foreign, picky):
        check(g.stop() == 0, "a serve gate exits 0 on SIGTERM")
    for e in (echo, echo3, echo4, echo6):
        e.stop()


def scenario_dial_confine():
    fwd = os.path.join(T, "run", "fwd.sock")
    echo = Echo(fwd)
    serve = Gate(fwd)
    path = os.path.join(T, "run", "dial.sock")
    gate = dial_gate(path, serve.port, extra=["--max-conns", "10"])
    st = os.lstat(path)
    check(stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660,
          f"the unix socket is a socket of mode 0660: {oct(st.st_mode)}")
    check(dial_echo(path, "127.0.0.1"), "dials")
    st = status(gate.pid)
    for k in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb"):
        check(st.get(k) == "0000000000000000", f"{k} {st.get(k)}")
    check(st.get("NoNewPrivs") == "1", f"NoNewPrivs {st.get('NoNewPrivs')}")
    want = "0" if SANITIZED else "2"
    check(st.get("Seccomp") == want, f"Seccomp {st.get('Seccomp')}, wanted {want}"
          + (" (sanitizer build: no filter)" if SANITIZED else ""))
    check(st.get("Uid", "").split() == [str(UID)] * 4, f"Uid {st.get('Uid')}")
    check(st.get("Gid", "").split() == [str(GID)] * 4, f"Gid {st.get('Gid')}")
    check(st.get("Groups", "x") == "", f"Groups {st.get('Groups')}")
    check(os.readlink(f"/proc/{gate.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt"),
          "a mount namespace of its own")
    for d in ("etc", "usr", "tmp", "var", "dev"):
        seen = os.listdir(f"/proc/{gate.pid}/root/{d}")
        check(seen == [], f"/{d} in the dial gate's namespace holds {seen[:5]}")
    with open(f"/proc/{gate.pid}/limits") as f:
        lim = [line for line in f if line.startswith("Max open files")]
    check(lim and lim[0].split()[3] == "36", f"open files limit {lim}")
    print(f"dial gate confined: {st.get('CapEff')} nnp={st.get('NoNewPrivs')} "
          f"seccomp={st.get('Seccomp')} uid={st.get('Uid')}")
    # after confinement: a new TCP socket, connect, TLS, relay
    check(dial_echo(path, "127.0.0.1", b"after the checks"), "still dials")
    s, line = dial(path, "127.0.0.5")
    check(line.startswith(b"ERR connect: "), f"a refused connect after confinement: {line!r}")
    s.close()
    check(gate.alive() and gate.stop() == 0, "the dial gate exits 0 on SIGTERM")
    check(serve.stop() == 0, "the serve gate exits 0 on SIGTERM")
    echo.stop()


def scenario_dial_cmdline():
    run = os.path.join(T, "run")
    os.makedirs(run)
    path = os.path.join(run, "dial.sock")
    base = {"--listen-unix": path, "--port": "9830", "--ca": pki("ca.pem"),
            "--cert": pki("good.pem"), "--key": pki("good.key"), "--peer-name": NODE_NAME}
    cases = [
        ("--listen with --dial", {"--listen": "127.0.0.1:0"}, "--listen"),
        ("--forward with --dial", {"--forward": os.path.join(run, "f.sock")}, "--forward"),
        ("no --port", {"--port": None}, "--port"),
        ("--port 0", {"--port": "0"}, "--port"),
        ("--port 65536", {"--port": "65536"}, "--port"),
        ("no --listen-unix", {"--listen-unix": None}, "--listen-unix"),
        ("no --peer-name", {"--peer-name": None}, "--peer-name"),
        ("a missing directory", {"--listen-unix": "/nonexistent/dir/d.sock"}, "--listen-unix"),
        ("a directory, no name", {"--listen-unix": run + "/"}, "--listen-unix"),
        ("a missing CA", {"--ca": pki("missing.pem")}, "--ca"),
        ("a key of another cert", {"--key": pki("node.key")}, "--key"),
    ]
    for what, ch, opt in cases:
        argv = [GATE, "--dial"]
        for k, v in {**base, **ch}.items():
            if v is not None:
                argv += [k, v]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        first = r.stderr.strip().splitlines()[0] if r.stderr.strip() else ""
        print(f"{what}: rc={r.returncode} {first}")
        check(r.returncode != 0, f"{what}: exit 0")
        check(opt in first, f"{what}: the message does not name {opt}: {first!r}")
        check(not os.path.exists(path), f"{what}: left {path}")
    # serve mode refuses the dial mode's options
    for opt, val in (("--listen-unix", path), ("--port", "9830")):
        argv = [GATE, "--listen", "127.0.0.1:0", "--ca", pki("ca.pem"), "--cert",
                pki("node.pem"), "--key", pki("node.key"), "--peer-name", PEER, "--forward",
                os.path.join(run, "f.sock"), opt, val]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        first = r.stderr.strip().splitlines()[0] if r.stderr.strip() else ""
        print(f"serve mode with {opt}: rc={r.returncode} {first}")
        check(r.returncode != 0 and opt in first, f"serve mode with {opt}: {first!r}")

    # A stale socket (nobody listening) is replaced; a live one, or a file
    # that is not a socket, is refused and left alone.
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()
    fwd = os.path.join(run, "fwd.sock")
    echo = Echo(fwd)
    serve = Gate(fwd)
    argv = [GATE, "--dial", *[x for kv in {**base, "--port": str(serve.port)}.items() for x in kv]]
    gate = Gate(None, argv=argv)
    check(dial_echo(path, "127.0.0.1"), "a stale socket was replaced and dials")
    r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    first = r.stderr.strip().splitlines()[0] if r.stderr.strip() else ""
    print(f"a live socket: rc={r.returncode} {first}")
    check(r.returncode != 0 and "--listen-unix" in first and "answers" in first,
          f"a second dial gate on a live socket: {first!r}")
    check(dial_echo(path, "127.0.0.1"), "the first dial gate still serves its socket")
    check(gate.stop() == 0, "the dial gate exits 0 on SIGTERM")
    other = os.path.join(run, "file")
    with open(other, "w") as f:
        f.write("keep me\n")
    r = subprocess.run([*argv, "--listen-unix", other], capture_output=True, text=True,
                       timeout=20)
    first = r.stderr.strip().splitlines()[0] if r.stderr.strip() else ""
    print(f"a file not a socket: rc={r.returncode} {first}")
    check(r.returncode != 0 and "--listen-unix" in first, f"a file not a socket: {first!r}")
    with open(other) as f:
        check(f.read() == "keep me\n", "the file was left alone")
    check(serve.stop() == 0, "the serve gate exits 0 on SIGTERM")
    echo.stop()
    r = subprocess.run([GATE, "--help"], capture_output=True, text=True, timeout=20)
    check(r.returncode == 0 and "--dial" in r.stdout and "CONNECT" in r.stdout, "--help")


class ApiServer:
    """A TLS server standing in for the API server's listener (Python's
    ssl): it records each request's bytes and whether the client offered a
    certificate, and answers one fixed HTTP/1.0 response, then closes."""

    def __init__(self, host, cert, answer):
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(pki(f"{cert}.pem"), pki(f"{cert}.key"))
        self.ctx.load_verify_locations(pki("ca.pem"))  # would see the controller's cert
        self.ctx.verify_mode = ssl.CERT_OPTIONAL
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.sock.bind((host, 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.answer = answer
        self.requests, self.peer_certs, self.versions = [], [], []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        try:
            c.settimeout(10)
            t = self.ctx.wrap_socket(c, server_side=True)
            self.peer_certs.append(t.getpeercert())
            self.versions.append(t.version())
            req = b""
            while b"\r\n\r\n" not in req:
                d = t.recv(4096)
                if not d:
                    break
                req += d
            self.requests.append(req)
            t.sendall(self.answer)
            t.close()
        except (OSError, ssl.SSLError):
            c.close()

    def stop(self):
        self.sock.close()


def api_gate(path, api, extra=()):
    host, port = api
    return dial_gate(path, 9830, extra=("--api-host", host, "--api-port", str(port),
                                        "--api-ca", pki("api-ca.pem"), *extra))


def scenario_dial_api():
    """The dial gate's API route: `API\n`, OK, and the bytes relayed to the
    API server over TLS verified for --api-name, without a certificate of
    ours; refused for a server of another name, and without the route."""
    run = os.path.join(T, "run")
    os.makedirs(run)
    body = b'{"kind":"Node","status":{"addresses":[{"type":"InternalIP","address":"10.1.2.3"}]}}'
    answer = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + body
    for host in ("127.0.0.1", "::1"):
        api = ApiServer(host, "apiserver", answer)
        path = os.path.join(run, f"dial-{len(host)}.sock")
        gate = api_gate(path, (host, api.port))
        check(gate.wait_line(r"msg=listening mode=dial .*api=\S*" + re.escape(str(api.port)), 5),
              f"{host}: the listening line names the API server: {gate.log()}")
        s, line = dial(path, payload=b"API\n")
        check(line == b"OK\n", f"{host}: API answered {line!r}")
        req = b"GET /api/v1/nodes/node-1 HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer t0k\r\n\r\n"
        s.sendall(req)
        got = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            got += d
        s.close()
        check(got == answer, f"{host}: the API server's answer relayed whole: {got!r}")
        check(api.requests == [req], f"{host}: the request reached the API server: {api.requests}")
        check(api.peer_certs == [None], f"{host}: the gate offered a certificate to the API "
              f"server: {api.peer_certs}")
        print(f"ok {host}: API relayed ({api.versions[0] if api.versions else '?'}), "
              f"no client certificate")
        # CONNECT still means a node: nothing listens on the node port here
        s, line = dial(path, "127.0.0.1")
        s.close()
        check(line.startswith(b"ERR connect:"), f"{host}: CONNECT after API: {line!r}")
        check(gate.stop() == 0, "the dial gate exits 0 on SIGTERM")
        api.stop()

    # a server whose certificate names another host: ERR, nothing relayed
    wrong = ApiServer("127.0.0.1", "apiserver-other-name", answer)
    path = os.path.join(run, "dial-wrong.sock")
    gate = api_gate(path, ("127.0.0.1", wrong.port))
    s, line = dial(path, payload=b"API\n")
    s.close()
    check(line == b"ERR tls: certificate: hostname mismatch\n",
          f"an API server of another name: {line!r}")
    check(not wrong.requests, f"bytes reached the wrong API server: {wrong.requests}")
    # ... unless --api-name says that name
    gate.stop()
    gate = api_gate(path, ("127.0.0.1", wrong.port), extra=("--api-name", "evil.example"))
    s, line = dial(path, payload=b"API\n")
    s.close()
    check(line == b"OK\n", f"--api-name evil.example: {line!r}")
    gate.stop()
    # the node CA does not vouch for the API server
    gate = dial_gate(path, 9830, extra=("--api-host", "127.0.0.1", "--api-port", str(wrong.port),
                                        "--api-ca", pki("ca.pem")))
    s, line = dial(path, payload=b"API\n")
    s.close()
    check(line.startswith(b"ERR tls: certificate:"), f"the API server under the node CA: {line!r}")
    gate.stop()
    wrong.stop()
    print("ok refused: an API server of another name, or under another CA")

    # no route: API refused, nothing dialled
    gate = dial_gate(path, 9830)
    s, line = dial(path, payload=b"API\n")
    s.close()
    check(line == b"ERR no API server route (--api-host)\n", f"API without the route: {line!r}")
    for payload in (b"API\nGET", b"API \n", b"api\n"):
        s, line = dial(path, payload=payload)
        s.close()
        check(line.startswith(b"ERR "), f"{payload!r}: {line!r}")
    check(gate.stop() == 0, "the dial gate exits 0 on SIGTERM")
    print("ok refused: API without --api-host, and malformed API lines")

    # the command line: the route's options together, dial mode only
    base = [GATE, "--dial", "--listen-unix", os.path.join(run, "c.sock"), "--port", "9830",
            "--ca", pki("ca.pem"), "--cert", pki("good.pem"), "--key", pki("good.key"),
            "--peer-name", NODE_NAME]
    cases = [
        ("--api-host alone", ["--api-host", "127.0.0.1"], "--api-port"),
        ("no --api-ca", ["--api-host", "127.0.0.1", "--api-port", "443"], "--api-ca"),
        ("--api-name alone", ["--api-name", "x"], "--api-host"),
        ("a host name", ["--api-host", "kubernetes", "--api-port", "443", "--api-ca",
                         pki("api-ca.pem")], "--api-host"),
        ("[v6]", ["--api-host", "[::1]", "--api-port", "443", "--api-ca", pki("api-ca.pem")],
         "--api-host"),
        ("--api-port 0", ["--api-host", "127.0.0.1", "--api-port", "0", "--api-ca",
                          pki("api-ca.pem")], "--api-port"),
        ("a missing --api-ca", ["--api-host", "127.0.0.1", "--api-port", "443", "--api-ca",
                                pki("missing.pem")], "--api-ca"),
    ]
    for what, extra, opt in cases:
        r = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=20)
        first = r.stderr.strip().splitlines()[0] if r.stderr.strip() else ""
        print(f"{what}: rc={r.returncode} {first}")
        check(r.returncode != 0 and opt in first, f"{what}: {first!r}")
    r = subprocess.run([GATE, "--listen", "127.0.0.1:0", "--ca", pki("ca.pem"), "--cert",
                        pki("node.pem"), "--key", pki("node.key"), "--peer-name", PEER,
                        "--forward", os.path.join(run, "f.sock"), "--api-host", "127.0.0.1",
                        "--api-port", "443", "--api-ca", pki("api-ca.pem")],
                       capture_output=True, text=True, timeout=20)
    first = r.stderr.strip().splitlines()[0] if r.stderr.strip() else ""
    check(r.returncode != 0 and "--api-host" in first and "--dial" in first,
          f"serve mode with --api-host: {first!r}")
    print("ok the API route's command line")


def main():
    make_pki()
    {"serve": scenario_serve, "refuse": scenario_refuse, "bounds": scenario_bounds,
     "confine": scenario_confine, "cmdline": scenario_cmdline, "dial": scenario_dial,
     "dial_refuse": scenario_dial_refuse, "dial_confine": scenario_dial_confine,
     "dial_cmdline": scenario_dial_cmdline, "dial_api": scenario_dial_api}[SCENARIO]()


try:
    main()
except SystemExit as e:
    if e.code not in (None, 0):
        FAILS.append(str(e.code))
        print(e.code)
except Exception as e:  # noqa: BLE001 - report, then clean up
    FAILS.append(repr(e))
    print(f"FAIL {e!r}")
    import traceback
    traceback.print_exc()
finally:
    for g in GATES:
        if g.p.poll() is None:
            g.p.kill()
            g.p.wait(10)
    if FAILS:
        for g in GATES:
            print(f"--- gate {g.p.pid} log:\n{g.log()}")
    shutil.rmtree(T, ignore_errors=True)
    if SHM:
        shutil.rmtree(SHM, ignore_errors=True)

if FAILS:
    print(f"{len(FAILS)} failure(s)")
    sys.exit(1)
print("PASS")
