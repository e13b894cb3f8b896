#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Conformance test of qsd-csi-plugin with a gRPC client that is not ours.

Uses Debian's python3-grpcio and python3-protobuf.  csi.proto is compiled
with `protoc --python_out` into a temp dir at test time; calls go through
channel.unary_unary with the message serializers (no generated stubs).

usage: test_identity.py PLUGIN_BINARY PROTO_DIR
Exit 0 on success, 1 on failure, 77 when grpcio/protoc is missing.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

try:
    import grpc
except ImportError:
    print("SKIP: python3-grpcio not installed")
    sys.exit(77)

START_TIMEOUT = 10.0
CALL_TIMEOUT = 10.0
EXIT_TIMEOUT = 20.0


def compile_proto(proto_dir, out_dir):
    protoc = shutil.which("protoc")
    if not protoc:
        print("SKIP: protoc not installed")
        sys.exit(77)
    subprocess.run([protoc, "-I", proto_dir, "-I", "/usr/include",
                    "--python_out", out_dir, os.path.join(proto_dir, "csi.proto")],
                   check=True, timeout=60)
    sys.path.insert(0, out_dir)
    import csi_pb2  # noqa: E402
    return csi_pb2


def h2_preface_and_open_stream(path):
    """Client preface, empty SETTINGS, and a HEADERS frame (END_HEADERS, no
    END_STREAM) on stream 1, HPACK literals without indexing."""
    import struct

    def frame(ftype, flags, stream, payload):
        n = len(payload)
        return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, ftype, flags, stream) + payload

    block = b""
    for k, v in ((":method", "POST"), (":scheme", "http"), (":path", path),
                 (":authority", "x"), ("content-type", "application/grpc")):
        block += b"\x00" + bytes([len(k)]) + k.encode() + bytes([len(v)]) + v.encode()
    return (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b"")
            + frame(1, 0x4, 1, block))


def h2_ping_until_ack(s, timeout=10.0):
    """Send a PING on s and read frames until its ACK: a server handles a
    connection's frames in order, so everything sent before the PING has
    been handled by then (e.g. a stream opened)."""
    import struct
    s.sendall(struct.pack(">BHBBI", 0, 8, 6, 0, 0) + b"qsdcsi01")
    deadline, buf = time.monotonic() + timeout, b""
    while True:
        while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
            n, ftype, flags = int.from_bytes(buf[:3], "big"), buf[3], buf[4]
            if ftype == 6 and flags & 1 and buf[9:9 + n] == b"qsdcsi01":
                s.settimeout(None)
                return
            buf = buf[9 + n:]
        left = deadline - time.monotonic()
        assert left > 0, "no PING ACK within %.0f s" % timeout
        s.settimeout(left)
        data = s.recv(65536)
        assert data, "connection closed before the PING ACK"
        buf += data


def wait_for_socket(path, proc):
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("plugin exited early with %d" % proc.returncode)
        if os.path.exists(path):
            return
        time.sleep(0.02)
    raise RuntimeError("socket %s did not appear within %.0fs" % (path, START_TIMEOUT))


def method(channel, path, req_cls, resp_cls):
    return channel.unary_unary(path, request_serializer=req_cls.SerializeToString,
                               response_deserializer=resp_cls.FromString)


def expect_code(fn, req, code, **kw):
    try:
        fn(req, timeout=CALL_TIMEOUT, **kw)
    except grpc.RpcError as e:
        if e.code() != code:
            raise AssertionError("expected %s, got %s (%s)" % (code, e.code(), e.details()))
        return e
    raise AssertionError("expected %s, call succeeded" % code)


def main():
    plugin, proto_dir = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="qsd-csi-test-")
    proc = None
    try:
        pb = compile_proto(proto_dir, tmp)
        state = os.path.join(tmp, "state")
        pool = os.path.join(tmp, "pool")
        os.mkdir(state)
        os.mkdir(pool)
        sock = os.path.join(tmp, "run", "csi.sock")
        os.mkdir(os.path.join(tmp, "run"))
        # A stale socket file from a "previous run" must be replaced.
        import socket as pysock
        stale = pysock.socket(pysock.AF_UNIX, pysock.SOCK_STREAM)
        stale.bind(sock)
        stale.close()

        log = open(os.path.join(tmp, "plugin.log"), "w+")
        proc = subprocess.Popen([plugin, "--endpoint", "unix://" + sock, "--nodeid", "node-1",
                                 "--driver-name", "test.qsd-csi.dev", "--state-dir", state,
                                 "--pool", pool, "--run-dir", os.path.join(tmp, "run"),
                                 "--qsd-binary", "/bin/true", "--log-level", "debug"],
                                stdout=log, stderr=log)
        wait_for_socket(sock, proc)
        # Wait until it accepts (the file appears at bind, before listen).
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            s = pysock.socket(pysock.AF_UNIX, pysock.SOCK_STREAM)
            try:
                s.connect(sock)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
            finally:
                s.close()

        mode = os.stat(sock).st_mode & 0o777
        assert mode == 0o660, "socket mode is %o, want 660" % mode

        target = "unix://" + sock
        ch = grpc.insecure_channel(target)
        info = method(ch, "/csi.v1.Identity/GetPluginInfo", pb.GetPluginInfoRequest,
                      pb.GetPluginInfoResponse)(pb.GetPluginInfoRequest(), timeout=CALL_TIMEOUT)
        assert info.name == "test.qsd-csi.dev", info
        assert info.vendor_version, info
        print("ok GetPluginInfo", info.name, info.vendor_version)

        caps = method(ch, "/csi.v1.Identity/GetPluginCapabilities",
                      pb.GetPluginCapabilitiesRequest, pb.GetPluginCapabilitiesResponse)(
                          pb.GetPluginCapabilitiesRequest(), timeout=CALL_TIMEOUT)
        svc = {c.service.type for c in caps.capabilities if c.HasField("service")}
        exp = {c.volume_expansion.type for c in caps.capabilities
               if c.HasField("volume_expansion")}
        assert svc == {pb.PluginCapability.Service.CONTROLLER_SERVICE,
                       pb.PluginCapability.Service.VOLUME_ACCESSIBILITY_CONSTRAINTS,
                       pb.PluginCapability.Service.SNAPSHOT_METADATA_SERVICE,
                       pb.PluginCapability.Service.GROUP_CONTROLLER_SERVICE}, caps
        assert exp == {pb.PluginCapability.VolumeExpansion.ONLINE}, caps
        print("ok GetPluginCapabilities")

        probe = method(ch, "/csi.v1.Identity/Probe", pb.ProbeRequest, pb.ProbeResponse)
        r = probe(pb.ProbeRequest(), timeout=CALL_TIMEOUT)
        assert r.HasField("ready") and r.ready.value is True, r
        os.chmod(pool, 0o500) if os.geteuid() != 0 else os.rename(pool, pool + ".gone")
        r = probe(pb.ProbeRequest(), timeout=CALL_TIMEOUT)
        assert r.HasField("ready") and r.ready.value is False, r
        os.chmod(pool, 0o700) if os.geteuid() != 0 else os.rename(pool + ".gone", pool)
        r = probe(pb.ProbeRequest(), timeout=CALL_TIMEOUT)
        assert r.ready.value is True, r
        print("ok Probe (ready, not ready, ready)")

        for path in ("/csi.v1.Controller/ControllerPublishVolume",
                     "/csi.v1.Controller/ControllerGetVolume", "/no.such.Service/Method"):
            expect_code(method(ch, path, pb.ProbeRequest, pb.ProbeResponse), pb.ProbeRequest(),
                        grpc.StatusCode.UNIMPLEMENTED)
        print("ok UNIMPLEMENTED")

        # Garbage that is not a GetPluginInfoRequest.
        raw = ch.unary_unary("/csi.v1.Identity/GetPluginInfo")
        expect_code(raw, b"\xff\xff\xff", grpc.StatusCode.INVALID_ARGUMENT)
        print("ok INVALID_ARGUMENT on undecodable request")

        # 5 MiB request (the limit is 4 MiB); the client's own send limit is
        # unlimited by default.
        big = ch.unary_unary("/csi.v1.Identity/GetPluginInfo")
        e = expect_code(big, b"\x0a" + b"\x00" * (5 << 20), grpc.StatusCode.RESOURCE_EXHAUSTED)
        print("ok RESOURCE_EXHAUSTED:", e.details())

        # The connection still works after that.
        probe(pb.ProbeRequest(), timeout=CALL_TIMEOUT)

        # 50 concurrent calls over 5 channels.
        chans = [grpc.insecure_channel(target) for _ in range(5)]
        errors = []
        results = []

        def worker(i):
            try:
                fn = method(chans[i % len(chans)], "/csi.v1.Identity/GetPluginInfo",
                            pb.GetPluginInfoRequest, pb.GetPluginInfoResponse)
                results.append(fn(pb.GetPluginInfoRequest(), timeout=CALL_TIMEOUT).name)
            except Exception as ex:  # noqa: BLE001
                errors.append(repr(ex))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(CALL_TIMEOUT + 5)
        assert not errors, errors
        assert results == ["test.qsd-csi.dev"] * 50, results
        print("ok 50 concurrent calls over 5 channels")

        # Also futures on one channel: concurrent streams on one connection.
        fn = method(ch, "/csi.v1.Identity/Probe", pb.ProbeRequest, pb.ProbeResponse)
        futs = [fn.future(pb.ProbeRequest(), timeout=CALL_TIMEOUT) for _ in range(50)]
        assert all(f.result().ready.value for f in futs)
        print("ok 50 concurrent streams on one connection")

        # Graceful shutdown with idle channels open and one stalled request: a
        # raw HTTP/2 client opens a stream and never finishes it.  The plugin
        # must wait for it (grace period, 5 s), then exit 0 anyway.
        stalled = pysock.socket(pysock.AF_UNIX, pysock.SOCK_STREAM)
        stalled.connect(sock)
        stalled.sendall(h2_preface_and_open_stream("/csi.v1.Identity/Probe"))
        # Its stream open in the plugin before the signal (bounded; a fixed
        # pause may end first on a loaded machine, and an idle connection
        # is closed at once: no grace to measure).
        h2_ping_until_ack(stalled)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=EXIT_TIMEOUT)
        took = time.monotonic() - t0
        stalled.close()
        assert rc == 0, "exit code %d" % rc
        assert not os.path.exists(sock), "socket left behind"
        # At least the grace period; the upper bound only catches a hang (an
        # ASan build on a loaded machine spends seconds in its exit checks).
        assert 4.0 <= took <= 15.0, "shutdown took %.2fs, want the 5 s grace" % took
        print("ok SIGTERM -> exit 0 in %.2fs (stalled stream cut at the grace period)" % took)
        proc = None
        for c in chans + [ch]:
            c.close()

        log.seek(0)
        text = log.read()
        # Exactly one log line per RPC: count GetPluginInfo lines.
        n_info = sum(1 for line in text.splitlines()
                     if "msg=rpc" in line and "method=/csi.v1.Identity/GetPluginInfo " in line)
        assert n_info == 1 + 1 + 1 + 50, "GetPluginInfo rpc lines: %d" % n_info
        cut = [line for line in text.splitlines()
               if "msg=rpc" in line and "code=CANCELLED" in line]
        assert len(cut) == 1 and "method=/csi.v1.Identity/Probe " in cut[0], cut
        print("ok one log line per RPC")
        return 0
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        try:
            with open(os.path.join(tmp, "plugin.log")) as f:
                print("---- plugin log (tail)")
                print("".join(f.readlines()[-40:]))
        except OSError:
            pass
        return 1
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=EXIT_TIMEOUT)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
