#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""integration/grpc_client: the plugin's gRPC client (csi/grpc_client.h)
against servers that are not ours, on unix sockets.

- python3-grpcio: a unary CSI call both ways in protobuf (CreateVolume), an
  error status whose message has non-ASCII and '%', 10000 streamed
  messages, 3 MiB streamed messages (beyond every HTTP/2 window), a stream
  stopped by the client's callback (the server sees the cancel, the
  connection is used again), a reply over the client's limit, a server that
  never answers (DEADLINE_EXCEEDED, and the grpc-timeout it received), a
  server process that dies mid-stream (UNAVAILABLE);
- a gate in Python that reads the preamble line and answers OK (then
  relays to grpcio) or ERR, or nothing, or a line too long;
- raw HTTP/2 servers in Python (plain sockets) that send garbage, a
  truncated frame, a huge message length, trailers without grpc-status, a
  non-200 :status, a non-gRPC content type, a RST_STREAM, a GOAWAY, a
  compressed message, a malformed grpc-status, a SETTINGS frame of a bad
  length, a frame over the maximum size, nothing at all, or a message a byte at a
  time (the deadline still ends the call).

Each call is one run of grpc_client_call (tests/csi/grpc_client_call.c),
which prints the outcome; a run that crashes, leaks (ASan) or outlives its
bound fails the test.

Usage: test_grpc_client.py GRPC_CLIENT_CALL PROTO_DIR"""
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402  (skips without python3-grpcio)
import grpc  # noqa: E402

CLI = None
FAIL_MSG = "ünïcode 100% done %41 ✓ 50%"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def run(sock, *args, bound=20):
    """One run of the client; returns its outcome lines as dicts."""
    t0 = time.monotonic()
    r = subprocess.run([CLI, sock] + [str(a) for a in args], capture_output=True, timeout=bound)
    took = time.monotonic() - t0
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 0 and "Sanitizer" not in err and "runtime error" not in err, \
        "grpc_client_call %s: rc=%d\n%s" % (args, r.returncode, err[-4000:])
    out = []
    for line in r.stdout.decode().splitlines():
        head, _, msg = line.partition(" msg=")
        d = dict(kv.split("=", 1) for kv in head.split())
        d["msg"] = msg
        for k in ("code", "count", "bytes", "bad", "elapsed_ms", "usable"):
            d[k] = int(d[k])
        out.append(d)
    assert out, "no outcome printed for %s" % (args,)
    print("  %s -> %s (%.2fs)" % (" ".join(str(a) for a in args)[:80],
                                  [(o["name"], o["count"], o["msg"][:60]) for o in out], took))
    return out


def expect(o, name, msg_part=None):
    assert o["name"] == name, "expected %s, got %s: %s" % (name, o["name"], o["msg"])
    if msg_part is not None:
        assert msg_part in o["msg"], "message %r lacks %r" % (o["msg"], msg_part)


# ------------------------------------------------------------ grpcio server

def stream_msgs(n, size):
    for i in range(n):
        yield struct.pack(">I", i & 0xffffffff) + bytes([i & 0xff]) * (size - 4)


class Servicer:
    def __init__(self, pb):
        self.pb = pb
        self.lock = threading.Lock()
        self.events = []
        self.release = threading.Event()

    def note(self, what):
        with self.lock:
            self.events.append(what)

    def create(self, req, ctx):
        v = self.pb.Volume(volume_id=req.name + "@node-1",
                           capacity_bytes=req.capacity_range.required_bytes)
        return self.pb.CreateVolumeResponse(volume=v)

    def echo(self, req, ctx):
        return req

    def fail(self, req, ctx):
        ctx.abort(grpc.StatusCode.FAILED_PRECONDITION, FAIL_MSG)

    def big(self, req, ctx):
        return b"x" * int(req)

    def hang(self, req, ctx):
        self.note("hang remaining=%.3f" % ctx.time_remaining())
        self.release.wait(30)
        return b""

    def stream(self, req, ctx):
        n, size = (int(x) for x in req.split())
        done = {"all": False}
        ctx.add_callback(lambda: self.note("stream ended all=%s" % done["all"]))
        for m in stream_msgs(n, size):
            yield m
        done["all"] = True


def grpcio_server(pb, path, die=False):
    from concurrent import futures
    s = Servicer(pb)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    raw = grpc.unary_unary_rpc_method_handler
    handlers = {
        "Echo": raw(s.echo), "Fail": raw(s.fail), "Big": raw(s.big), "Hang": raw(s.hang),
        "Stream": grpc.unary_stream_rpc_method_handler(s.stream),
    }
    if die:
        def die_stream(req, ctx):
            yield from stream_msgs(3, 100)
            time.sleep(0.3)
            os._exit(3)
        handlers = {"Die": grpc.unary_stream_rpc_method_handler(die_stream)}
    server.add_generic_rpc_handlers([
        grpc.method_handlers_generic_handler("test.T", handlers),
        grpc.method_handlers_generic_handler("csi.v1.Controller", {
            "CreateVolume": raw(s.create,
                                request_deserializer=pb.CreateVolumeRequest.FromString,
                                response_serializer=pb.CreateVolumeResponse.SerializeToString)}),
    ])
    server.add_insecure_port("unix:" + path)
    server.start()
    return server, s


def test_grpcio(sock, srv):
    print("grpcio server")
    o = run(sock, "create", "vol-ü", 1 << 30)[0]
    expect(o, "OK")
    assert o["id"] == "vol-ü@node-1" and int(o["cap"]) == 1 << 30, o

    o = run(sock, "unary", "/test.T/Echo", "hello")[0]
    expect(o, "OK")
    assert o["count"] == 1 and o["bytes"] == 5, o
    o = run(sock, "unary", "/test.T/Nope", "x")[0]
    expect(o, "UNIMPLEMENTED")

    o = run(sock, "unary", "/test.T/Fail", "x")[0]
    expect(o, "FAILED_PRECONDITION")
    assert o["msg"] == FAIL_MSG, "message %r, want %r" % (o["msg"], FAIL_MSG)

    o = run(sock, "stream", "/test.T/Stream", "10000 100", "--timeout-ms", 60000, bound=90)[0]
    expect(o, "OK")
    assert (o["count"], o["bytes"], o["bad"]) == (10000, 1000000, 0), o
    size = 3 << 20
    o = run(sock, "stream", "/test.T/Stream", "8 %d" % size, "--timeout-ms", 60000, bound=90)[0]
    expect(o, "OK")
    assert (o["count"], o["bytes"], o["bad"]) == (8, 8 * size, 0), o
    # Over the client's limit (4 MiB by default; here 1 MiB): refused.
    o = run(sock, "stream", "/test.T/Stream", "3 %d" % (2 << 20), "--max", 1 << 20)[0]
    expect(o, "RESOURCE_EXHAUSTED", "over the limit of 1048576 bytes")
    assert o["count"] == 0, o
    o = run(sock, "unary", "/test.T/Big", str(5 << 20))[0]
    expect(o, "RESOURCE_EXHAUSTED", "5242880 bytes")
    o = run(sock, "unary", "/test.T/Big", str(2 << 20))[0]
    expect(o, "OK")
    assert o["bytes"] == 2 << 20

    # Stopped by the callback, twice on one connection: the server hears
    # the cancel each time (its stream ends without having sent everything).
    with srv.lock:
        srv.events.clear()
    outs = run(sock, "stream", "/test.T/Stream", "1000 65536", "--stop", 5, "--calls", 2)
    for o in outs:
        expect(o, "CANCELLED", "stopped by the caller")
        assert o["count"] == 5 and o["bad"] == 0 and o["usable"] == 1, o
    t_end = time.monotonic() + 10
    while time.monotonic() < t_end:
        with srv.lock:
            ended = [e for e in srv.events if e.startswith("stream ended")]
        if len(ended) == 2:
            break
        time.sleep(0.05)
    assert ended == ["stream ended all=False"] * 2, srv.events

    # A server that never answers: the deadline ends the call, and the
    # server was told it (grpc-timeout).
    o = run(sock, "unary", "/test.T/Hang", "x", "--timeout-ms", 1000)[0]
    expect(o, "DEADLINE_EXCEEDED")
    assert 900 <= o["elapsed_ms"] <= 3000, o
    with srv.lock:
        rem = [float(e.split("=")[1]) for e in srv.events if e.startswith("hang")]
    assert rem and 0 < rem[-1] <= 1.0, srv.events


def test_server_dies(pb, tmp):
    print("grpcio server that dies mid-stream")
    sock = os.path.join(tmp, "die.sock")
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve-die", sock,
                          sys.argv[2], tmp])
    try:
        t_end = time.monotonic() + 20
        while not os.path.exists(sock):
            assert time.monotonic() < t_end and p.poll() is None, "the dying server did not start"
            time.sleep(0.05)
        outs = run(sock, "stream", "/test.T/Die", "x", "--calls", 2)
        expect(outs[0], "UNAVAILABLE", "closed the connection")
        assert outs[0]["count"] <= 3 and outs[0]["bad"] == 0 and outs[0]["usable"] == 0, outs
        expect(outs[1], "UNAVAILABLE")
        assert outs[1]["elapsed_ms"] < 100, outs
        assert p.wait(timeout=10) == 3
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def serve_die(sock, proto_dir, tmp):
    pb = csilib.compile_proto(proto_dir, tempfile.mkdtemp(dir=tmp))
    grpcio_server(pb, sock, die=True)
    time.sleep(60)
    os._exit(1)


# ------------------------------------------------------------ plain-socket servers

def listen(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(4)
    s.settimeout(20)
    return s


def serve_once(path, handler):
    """A thread that accepts one connection and runs handler(conn)."""
    ls = listen(path)
    result = {}

    def main():
        try:
            conn, _ = ls.accept()
            conn.settimeout(20)
            with conn:
                handler(conn, result)
        except Exception as e:  # reported by the main thread
            result["error"] = repr(e)
        finally:
            ls.close()
    t = threading.Thread(target=main, daemon=True)
    t.start()
    return t, result


def recv_exact(conn, n):
    b = b""
    while len(b) < n:
        chunk = conn.recv(n - len(b))
        if not chunk:
            raise EOFError("peer closed after %d of %d bytes" % (len(b), n))
        b += chunk
    return b


def read_line(conn, limit=256):
    b = b""
    while not b.endswith(b"\n") and len(b) < limit:
        c = conn.recv(1)
        if not c:
            break
        b += c
    return b


def drain(conn):
    """Read until the client closes (bounded by the socket timeout)."""
    try:
        while conn.recv(65536):
            pass
    except OSError:
        pass


def frame(ftype, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + \
        struct.pack(">I", sid) + payload


def hpack(headers):
    """Literal header fields without indexing, new names, no Huffman."""
    out = b""
    for n, v in headers:
        n, v = n.encode(), v.encode()
        assert len(n) < 127 and len(v) < 127
        out += b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v
    return out


def headers_frame(sid, headers, end_stream):
    return frame(1, 0x4 | (0x1 if end_stream else 0), sid, hpack(headers))


def h2_accept(conn):
    """Read the client's preface and frames up to its request's HEADERS;
    send our SETTINGS and the ACK of its own.  Returns the stream id."""
    assert recv_exact(conn, len(PREFACE)) == PREFACE
    conn.sendall(frame(4, 0, 0) + frame(4, 1, 0))
    while True:
        hd = recv_exact(conn, 9)
        length = struct.unpack(">I", b"\0" + hd[:3])[0]
        recv_exact(conn, length)
        if hd[3] == 1:
            return struct.unpack(">I", hd[5:9])[0] & 0x7fffffff


RESP = [(":status", "200"), ("content-type", "application/grpc")]


def grpc_msg(body, flags=0):
    return bytes([flags]) + struct.pack(">I", len(body)) + body


def hostile(mode):
    """The handler of one raw server mode."""
    def h(conn, result):
        if mode == "garbage":
            recv_exact(conn, len(PREFACE))
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            drain(conn)
            return
        sid = h2_accept(conn)
        out = {
            "truncated": headers_frame(sid, RESP, False) +
            frame(0, 0, sid, grpc_msg(b"y" * 95))[:9 + 10],
            "huge-prefix": headers_frame(sid, RESP, False) +
            frame(0, 0, sid, b"\0\xff\xff\xff\xf0" + b"z" * 20),
            "no-status": headers_frame(sid, RESP, False) + frame(0, 0, sid, grpc_msg(b"abc")) +
            headers_frame(sid, [("x-note", "no status here")], True),
            "data-end": headers_frame(sid, RESP, False) + frame(0, 1, sid, grpc_msg(b"abc")),
            "http-503": headers_frame(sid, [(":status", "503")], True),
            "not-grpc": headers_frame(sid, [(":status", "200"), ("content-type", "text/html")],
                                      False) + frame(0, 1, sid, b"<html></html>"),
            "rst": headers_frame(sid, RESP, False) + frame(3, 0, sid, struct.pack(">I", 2)),
            "goaway": frame(7, 0, 0, struct.pack(">II", 0, 0) + b"bye"),
            "compressed": headers_frame(sid, RESP, False) +
            frame(0, 0, sid, grpc_msg(b"abc", flags=1)),
            "bad-status": headers_frame(sid, RESP + [("grpc-status", "abc")], True),
            "trailers-only-ok": headers_frame(sid, RESP + [("grpc-status", "0")], True),
            "two-messages": headers_frame(sid, RESP, False) +
            frame(0, 0, sid, grpc_msg(b"one") + grpc_msg(b"two")) +
            headers_frame(sid, [("grpc-status", "0")], True),
            "cut-message": headers_frame(sid, RESP, False) +
            frame(0, 0, sid, grpc_msg(b"four")[:6]) + headers_frame(sid, [("grpc-status", "0")],
                                                                   True),
            "bad-settings": frame(4, 0, 0, b"\0\0\0"),
            "oversized-frame": headers_frame(sid, RESP, False) +
            struct.pack(">I", 1 << 24)[1:] + bytes([0, 0]) + struct.pack(">I", sid) + b"x" * 64,
            "silent": b"",
            "trickle": b"",
        }[mode]
        conn.sendall(out)
        if mode == "trickle":  # one byte of a message every 20 ms, until the client goes
            conn.sendall(headers_frame(sid, RESP, False) + frame(0, 0, sid, b"\0\0\0\0\x80"))
            try:
                while True:
                    time.sleep(0.02)
                    conn.sendall(frame(0, 0, sid, b"t"))
            except OSError:
                return
        if mode != "truncated":
            drain(conn)
    return h


HOSTILE = [
    # mode, expected code, part of the message, timeout ms
    ("garbage", "INTERNAL", "HTTP/2", 5000),
    ("truncated", "UNAVAILABLE", "closed the connection", 5000),
    ("huge-prefix", "RESOURCE_EXHAUSTED", "4294967280 bytes", 5000),
    ("no-status", "INTERNAL", "without grpc-status", 5000),
    ("data-end", "INTERNAL", "without grpc-status", 5000),
    ("http-503", "UNAVAILABLE", "HTTP status 503", 5000),
    ("not-grpc", "INTERNAL", "content-type", 5000),
    ("rst", "INTERNAL", "reset the stream", 5000),
    ("goaway", "UNAVAILABLE", "GOAWAY", 5000),
    ("compressed", "INTERNAL", "compressed", 5000),
    ("bad-status", "UNKNOWN", "grpc-status \"abc\"", 5000),
    ("trailers-only-ok", "INTERNAL", "0 messages", 5000),
    ("two-messages", "INTERNAL", "more than one message", 5000),
    ("cut-message", "INTERNAL", "inside a message", 5000),
    ("bad-settings", "INTERNAL", "FRAME_SIZE_ERROR", 5000),
    ("oversized-frame", "INTERNAL", "FRAME_SIZE_ERROR", 5000),
    ("silent", "DEADLINE_EXCEEDED", None, 700),
    ("trickle", "DEADLINE_EXCEEDED", None, 700),
]


def test_hostile(tmp):
    print("raw HTTP/2 servers")
    for mode, code, part, timeout_ms in HOSTILE:
        path = os.path.join(tmp, "raw-%s.sock" % mode)
        t, result = serve_once(path, hostile(mode))
        o = run(path, "unary", "/test.T/Echo", "hi", "--timeout-ms", timeout_ms)[0]
        expect(o, code, part)
        if code == "DEADLINE_EXCEEDED":
            assert timeout_ms - 50 <= o["elapsed_ms"] <= timeout_ms + 1500, o
        else:
            assert o["elapsed_ms"] < 2000, o
        t.join(30)
        assert not t.is_alive() and "error" not in result, (mode, result)


# ------------------------------------------------------------ the gate

def relay(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def gate(upstream):
    """A gate: reads one line; "CONNECT good:1" is answered OK and
    "CONNECT ready:1" READY, each then relayed to upstream (the answer in one
    segment with the server's first bytes); silent:1 gets nothing, long:1 a
    line of 400 bytes, anything else ERR (with a control character)."""
    def h(conn, result):
        line = read_line(conn, 300)
        result["line"] = line
        answers = {b"CONNECT good:1\n": b"OK\n", b"CONNECT ready:1\n": b"READY\n"}
        if line in answers:
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            up.connect(upstream)
            up.settimeout(5)
            first = up.recv(65536)  # the server's SETTINGS, sent at once
            conn.sendall(answers[line] + first)
            conn.settimeout(5)
            try:
                result["preface"] = recv_exact(conn, len(PREFACE))
            except EOFError:  # the client refused the answer
                up.close()
                return
            up.sendall(result["preface"])
            up.settimeout(None)
            conn.settimeout(None)
            t = threading.Thread(target=relay, args=(up, conn), daemon=True)
            t.start()
            relay(conn, up)
            t.join(10)
            up.close()
        elif line == b"CONNECT silent:1\n":
            drain(conn)
        elif line == b"CONNECT long:1\n":
            conn.sendall(b"E" * 400 + b"\n")
            drain(conn)
        else:
            conn.sendall(b"ERR no route to " + line[8:].strip() + b"\x01\n")
            drain(conn)
    return h


def test_gate(tmp, upstream):
    print("preamble and gate")
    path = os.path.join(tmp, "gate.sock")
    for dest, exp, code, part, timeout_ms in [
            ("good:1", None, "OK", None, 5000),
            ("ready:1", "READY", "OK", None, 5000),
            ("ready:1", None, "UNAVAILABLE", '"READY"', 5000),
            ("bad:1", None, "UNAVAILABLE", '"ERR no route to bad:1?"', 5000),
            ("silent:1", None, "DEADLINE_EXCEEDED", "preamble", 700),
            ("long:1", None, "UNAVAILABLE", "over 256 bytes", 5000)]:
        t, result = serve_once(path, gate(upstream))
        args = ["create", "vol-g", 4096, "--preamble", "CONNECT %s\\n" % dest,
                "--timeout-ms", timeout_ms]
        if exp:
            args += ["--expect", exp]
        o = run(path, *args)[0]
        expect(o, code, part)
        if code == "OK":
            assert o["id"] == "vol-g@node-1", o
            assert result.get("preface") == PREFACE, result
        elif code == "DEADLINE_EXCEEDED":
            assert timeout_ms - 50 <= o["elapsed_ms"] <= timeout_ms + 1500, o
        t.join(30)
        assert not t.is_alive() and "error" not in result, result
        assert result["line"] == ("CONNECT %s\n" % dest).encode(), result
        os.unlink(path)


def main():
    global CLI
    if len(sys.argv) >= 2 and sys.argv[1] == "--serve-die":
        serve_die(*sys.argv[2:5])
        return
    CLI, proto_dir = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="qsd-grpc-client-")
    csilib.ctest_register_root(tmp)
    server = None
    try:
        pb = csilib.compile_proto(proto_dir, tmp)
        sock = os.path.join(tmp, "grpcio.sock")
        server, srv = grpcio_server(pb, sock)
        test_grpcio(sock, srv)
        test_gate(tmp, sock)
        test_hostile(tmp)
        test_server_dies(pb, tmp)
        srv.release.set()
    finally:
        if server:
            server.stop(grace=None)
        shutil.rmtree(tmp, ignore_errors=True)
    print("PASS")


if __name__ == "__main__":
    main()
