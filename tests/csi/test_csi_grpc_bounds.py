#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The CSI socket's bounds, played by a hostile peer speaking raw HTTP/2
(frames written by hand: no library between the test and the wire), against
the real plugin:

- lockout: more idle connections than the server takes (64): the
  longest-idle ones make room, a real gRPC client still gets through;
- memory: partial requests held open on many streams of many connections
  (flow control honoured, so the server really buffers them): beyond the
  global budget (64 MiB) new ones get RESOURCE_EXHAUSTED, and the plugin's
  peak RSS stays under budget + a margin;
- half-close: a client that sends its request and shuts its write side down
  still gets the answer.

usage: test_csi_grpc_bounds.py PLUGIN PROTO_DIR [QSDCTL]
"""
import os
import select
import socket
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST, SETTINGS, PING, GOAWAY, WINDOW = 0, 1, 3, 4, 6, 7, 8
END_STREAM, END_HEADERS, ACK = 1, 4, 1
MiB = 1 << 20


def frame(typ, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([typ, flags]) + struct.pack(">I", sid) + \
        payload


def hpack_str(s):
    b = s.encode()
    assert len(b) < 127
    return bytes([len(b)]) + b


def headers(sid, path, end_stream=False):
    block = b""
    for k, v in ((":method", "POST"), (":scheme", "http"), (":path", path),
                 (":authority", "localhost"), ("content-type", "application/grpc"),
                 ("te", "trailers")):
        block += b"\x00" + hpack_str(k) + hpack_str(v)  # literal, not indexed
    return frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), sid, block)


class Conn:
    """One raw HTTP/2 connection; tracks the peer's flow-control windows."""

    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(5)
        self.s.connect(path)
        self.s.sendall(PREFACE + frame(SETTINGS, 0, 0))
        self.buf = b""
        self.conn_window = 65535
        self.windows = {}
        self.frames = []
        self.closed = False

    def pump(self, timeout=0.0):
        """Read what is there; answer SETTINGS and PING; track windows."""
        while not self.closed:
            r, _, _ = select.select([self.s], [], [], timeout)
            if not r:
                return
            try:
                d = self.s.recv(65536)
            except OSError:
                d = b""
            if not d:
                self.closed = True
                return
            self.buf += d
            while len(self.buf) >= 9:
                n = struct.unpack(">I", b"\0" + self.buf[:3])[0]
                if len(self.buf) < 9 + n:
                    break
                typ, flags = self.buf[3], self.buf[4]
                sid = struct.unpack(">I", self.buf[5:9])[0] & 0x7fffffff
                payload = self.buf[9:9 + n]
                self.buf = self.buf[9 + n:]
                self.frames.append((typ, flags, sid, payload))
                if typ == SETTINGS and not flags & ACK:
                    self.s.sendall(frame(SETTINGS, ACK, 0))
                elif typ == PING and not flags & ACK:
                    self.s.sendall(frame(PING, ACK, 0, payload))
                elif typ == WINDOW:
                    inc = struct.unpack(">I", payload)[0] & 0x7fffffff
                    if sid == 0:
                        self.conn_window += inc
                    else:
                        self.windows[sid] = self.windows.get(sid, 65535) + inc
            timeout = 0.0

    def send_data(self, sid, data, deadline):
        """Send as much of data as the windows allow before the deadline."""
        sent = 0
        while sent < len(data) and time.monotonic() < deadline and not self.closed:
            room = min(self.conn_window, self.windows.get(sid, 65535), 16384, len(data) - sent)
            if room <= 0:
                self.pump(0.05)
                continue
            self.s.sendall(frame(DATA, 0, sid, data[sent:sent + room]))
            sent += room
            self.conn_window -= room
            self.windows[sid] = self.windows.get(sid, 65535) - room
            self.pump(0.0)
        return sent

    def answered(self, sid):
        return any(t in (HEADERS, RST) and s == sid and (f & END_STREAM or t == RST)
                   for t, f, s, _ in self.frames)

    def close(self):
        self.s.close()


def rss_kib(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def main():
    env = csilib.Env(sys.argv[1], sys.argv[2], prefix="qsd-csi-grpcb-")
    pb = env.pb
    conns = []
    try:
        c = env.start()
        pid = env.proc.pid

        # 1. lockout
        for _ in range(70):
            cn = Conn(env.sock)
            cn.pump(0.2)
            conns.append(cn)
        t0 = time.monotonic()
        c.Probe(pb.ProbeRequest(), timeout=5)
        took = time.monotonic() - t0
        for cn in conns:
            cn.pump(0.0)
        closed = sum(cn.closed for cn in conns)
        assert closed >= 6, "only %d idle connections were closed" % closed
        print("ok 70 idle connections: %d closed to make room, a gRPC client got through in "
              "%.0f ms" % (closed, took * 1000))
        for cn in conns:
            cn.close()
        conns = []
        time.sleep(0.3)

        # 2. memory budget: partial 3.9 MiB requests, 8 streams per connection
        base = rss_kib(pid, "VmRSS")
        body = struct.pack(">BI", 0, 4 * MiB - 100 * 1024) + b"x" * (4 * MiB)
        refused = buffered = 0
        deadline = time.monotonic() + 60
        for i in range(40):
            cn = Conn(env.sock)
            conns.append(cn)
            cn.pump(0.1)
            for k in range(8):
                sid = 2 * k + 1
                cn.s.sendall(headers(sid, "/csi.v1.Node/NodeGetInfo"))
                buffered += cn.send_data(sid, body[:1 * MiB], deadline)
            cn.pump(0.1)
            refused += sum(cn.answered(2 * k + 1) for k in range(8))
        for cn in conns:
            cn.pump(0.2)
        refused = sum(cn.answered(2 * k + 1) for cn in conns for k in range(8))
        peak = rss_kib(pid, "VmHWM")
        assert refused > 0, "no stream was refused with %d MiB sent" % (buffered // MiB)
        # The RSS bound holds for the build that ships; AddressSanitizer
        # keeps freed memory in quarantine (256 MiB), so there it is reported only.
        asan = b"libasan" in subprocess.run(["ldd", env.plugin], capture_output=True).stdout
        assert asan or (peak - base) < 64 * 1024 + 48 * 1024, \
            "plugin grew by %d MiB (budget 64 MiB)" % ((peak - base) // 1024)
        log = env.log_tail(4000)
        assert "request buffers are full" in log, "no RESOURCE_EXHAUSTED for the budget"
        c.Probe(pb.ProbeRequest(), timeout=5)
        print("ok %d MiB of partial requests on %d streams: %d refused (RESOURCE_EXHAUSTED, "
              "buffers full), plugin RSS %d -> peak %d MiB" %
              (buffered // MiB, 40 * 8, refused, base // 1024, peak // 1024))
        for cn in conns:
            cn.close()
        conns = []

        # 3. half-close: the answer still comes
        cn = Conn(env.sock)
        conns.append(cn)
        cn.pump(0.1)
        cn.s.sendall(headers(1, "/csi.v1.Identity/Probe") +
                     frame(DATA, END_STREAM, 1, b"\0\0\0\0\0"))
        cn.s.shutdown(socket.SHUT_WR)
        end = time.monotonic() + 5
        while not cn.closed and time.monotonic() < end:
            cn.pump(0.1)
        assert cn.answered(1), "a half-closed client got no answer: %s" % cn.frames
        print("ok a client that half-closes after its request gets its answer")
        print("PASS")
    except Exception:
        print("---- plugin log (tail)\n" + env.log_tail(40))
        raise
    finally:
        for cn in conns:
            cn.close()
        env.cleanup()


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
