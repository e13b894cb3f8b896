#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Image class downloads as an attacker who writes StorageClasses (or PVCs of
one) would use them (issue 21 item 4):

- a URL to the node itself or to link-local space (http://127.0.0.1/...,
  http://[::1]/..., http://localhost/..., http://[::ffff:127.0.0.1]/...,
  http://0.0.0.0/..., the metadata address 169.254.169.254) is refused with
  INVALID_ARGUMENT naming the parameter, before any connection;
- a redirect from an allowed server to the plugin's own /metrics is refused
  the same way, and the error carries nothing of the content (no hash);
- user:password@ and a token in the query string appear neither in the
  error (a PVC event) nor in the plugin's log;
- a download larger than the pool's free space minus the reserve, with or
  without Content-Length, is RESOURCE_EXHAUSTED and leaves the pool as it
  was (no partial file, the space back);
- --image-download-allow-cidr (a test-only flag) lets a named range through
  (the download works), and only that range.

The servers run on 127.0.0.2 (allowed in the second part) and the plugin's
/metrics on 127.0.0.1.  The second part's pool is a 96 MiB tmpfs of its own
with a 16 MiB reserve.

usage: test_download_refusals.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import hashlib
import http.server
import os
import re
import socket
import subprocess
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "csi"))
import csilib  # noqa: E402
from csilib import mount_cap  # noqa: E402

import grpc  # noqa: E402

MiB = 1 << 20
TIMEOUT = 60
POOL_SIZE = 96 * MiB
BIG = 90 * MiB
SECRETS = ("s3cret-pw", "t0ken-value", "alice")
IMG = os.urandom(MiB)


def free_port(host="127.0.0.1"):
    s = socket.socket()
    s.bind((host, 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    """HTTP on 127.0.0.2: /img.raw, /missing (404), /big.raw (BIG bytes with
    Content-Length), /big-chunked.raw (BIG bytes, no length: closed at the
    end), /to-metrics (302 to self.metrics_url), /to-img (302 to /img.raw)."""

    def __init__(self):
        self.metrics_url = None
        self.gets = []
        srv = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *a):
                pass

            def do_GET(self):
                srv.gets.append(self.path)
                p = self.path.split("?")[0]
                if p in ("/to-metrics", "/to-img"):
                    self.send_response(302)
                    self.send_header("Location", srv.metrics_url if p == "/to-metrics"
                                     else srv.url("/img.raw"))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if p == "/img.raw":
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(IMG)))
                    self.end_headers()
                    self.wfile.write(IMG)
                    return
                if p in ("/big.raw", "/big-chunked.raw"):
                    self.send_response(200)
                    if p == "/big.raw":
                        self.send_header("Content-Length", str(BIG))
                    self.end_headers()
                    chunk = b"\0" * MiB
                    try:
                        for _ in range(BIG // MiB):
                            self.wfile.write(chunk)
                    except OSError:
                        pass  # curl stopped at a bound
                    return
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

        class Quiet(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass

        self.httpd = Quiet(("127.0.0.2", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, path, host="127.0.0.2"):
        return "http://%s:%d%s" % (host, self.port, path)

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def pool_state(env):
    ls = lambda d: sorted(os.listdir(os.path.join(env.pool, d)))  # noqa: E731
    return ls("volumes"), ls("layers"), ls("images")


def used_bytes(path):
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


FAILS = []


def attempt(env, c, name, url, code, words=(), sha=None, absent=SECRETS):
    """CreateVolume of an image at url; expect code (None: success) and
    words in the error, nothing of absent, the pool unchanged on failure."""
    pb = env.pb
    sha = sha or hashlib.sha256(IMG).hexdigest()
    before = pool_state(env)
    try:
        c.CreateVolume(pb.CreateVolumeRequest(
            name=name, capacity_range=pb.CapacityRange(required_bytes=8 * MiB),
            volume_capabilities=[mount_cap(pb)], parameters={"image": url, "imageSha256": sha}),
            timeout=TIMEOUT)
        got, msg = None, "created"
    except grpc.RpcError as e:
        got, msg = e.code(), e.details()
    print("attempt %-18s -> %s: %s" % (name, got.name if got else "OK", msg))
    problems = []
    if got != code:
        problems.append("expected %s, got %s" % (code.name if code else "OK", got))
    problems += ["%r not in the error" % w for w in words if w not in msg]
    problems += ["%r in the error" % w for w in absent if w in msg]
    hashes = set(re.findall(r"[0-9a-f]{64}", msg)) - {sha}
    if hashes:
        problems.append("a hash other than the expected one in the error: %s" % hashes)
    if code is not None and pool_state(env) != before:
        problems.append("the pool changed: %s -> %s" % (before, pool_state(env)))
    for p in problems:
        FAILS.append("%s: %s" % (name, p))
        print("FAIL %s: %s" % (name, p))
    return msg


def main():
    env = csilib.Env(sys.argv[1], sys.argv[2], prefix="qsd-dl-")
    srv = Server()
    try:
        refused_addresses(env, srv)
    finally:
        if sys.exc_info()[0] is not None:
            print("---- plugin log (tail)\n" + env.log_tail(60))
        env.cleanup()
    env = csilib.Env(sys.argv[1], sys.argv[2], prefix="qsd-dl-")
    try:
        allowed_range(env, srv)
    finally:
        if sys.exc_info()[0] is not None or FAILS:
            print("---- plugin log (tail)\n" + env.log_tail(60))
        subprocess.run(["umount", "-l", env.pool], check=False)
        env.cleanup()
        srv.stop()
    if FAILS:
        raise AssertionError("%d failed expectations:\n%s" % (len(FAILS), "\n".join(FAILS)))
    print("OK")


def refused_addresses(env, srv):
    """Without --image-download-allow-cidr: nothing on the node."""
    c = env.start()
    IA = grpc.StatusCode.INVALID_ARGUMENT
    for name, url, why in (
            ("loopback", srv.url("/img.raw", "127.0.0.1"), "loopback"),
            ("loopback2", srv.url("/img.raw"), "loopback"),
            ("ipv6-loopback", srv.url("/img.raw", "[::1]"), "loopback"),
            ("localhost", srv.url("/img.raw", "localhost"), "loopback"),
            ("mapped", srv.url("/img.raw", "[::ffff:127.0.0.1]"), "loopback"),
            ("unspecified", srv.url("/img.raw", "0.0.0.0"), "unspecified"),
            ("metadata", "http://169.254.169.254/latest/meta-data/", "link-local"),
            ("ipv6-link-local", "http://[fe80::1]/x", "link-local"),
            ("credentials", "http://alice:s3cret-pw@127.0.0.2:%d/img.raw?token=t0ken-value"
             % srv.port, "loopback")):
        msg = attempt(env, c, name, url, IA, ["parameter image", why])
        if name == "credentials" and "***@" not in msg:
            FAILS.append("credentials: the URL is not shown redacted: " + msg)
    assert not srv.gets, "the server was reached: %s" % srv.gets
    check_log(env)
    assert env.stop() == 0, "the plugin did not exit cleanly (a sanitizer report?)"


def allowed_range(env, srv):
    """With --image-download-allow-cidr 127.0.0.2/32, on a small pool."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d" % POOL_SIZE, "tmpfs", env.pool],
                   check=True)
    mport = free_port()
    srv.metrics_url = "http://127.0.0.1:%d/metrics" % mport
    c = env.start(["--image-download-allow-cidr", "127.0.0.2/32", "--capacity-reserve", "16M",
                   "--http-endpoint", "127.0.0.1:%d" % mport])
    IA = grpc.StatusCode.INVALID_ARGUMENT
    RE = grpc.StatusCode.RESOURCE_EXHAUSTED
    # Only the named range: loopback's other addresses stay refused.
    attempt(env, c, "still-refused", srv.url("/img.raw", "127.0.0.1"), IA,
            ["parameter image", "loopback"])
    # A redirect into the node: refused at the hop, nothing of the body.
    attempt(env, c, "redirect-metrics", srv.url("/to-metrics"), IA,
            ["parameter image", "127.0.0.1", "loopback"])
    # Credentials and a token: not in the error, not in the log.
    attempt(env, c, "credentials-404",
            "http://alice:s3cret-pw@127.0.0.2:%d/missing?token=t0ken-value" % srv.port,
            grpc.StatusCode.NOT_FOUND, ["parameter image", "***@", "?***"])
    # Larger than the pool can give above its reserve: refused, nothing left.
    for name, path in (("big-length", "/big.raw"), ("big-chunked", "/big-chunked.raw")):
        used = used_bytes(env.pool)
        attempt(env, c, name, srv.url(path), RE, ["parameter image", "does not fit"])
        after = used_bytes(env.pool)
        if after > used + MiB:
            FAILS.append("%s: the pool holds %d bytes more than before" % (name, after - used))
    # The allowed range works, also through a checked redirect.
    attempt(env, c, "allowed", srv.url("/img.raw"), None)
    attempt(env, c, "allowed-redirect", srv.url("/to-img"), None)
    check_log(env)
    assert env.stop() == 0, "the plugin did not exit cleanly (a sanitizer report?)"


def check_log(env):
    with open(os.path.join(env.root, "plugin.log"), errors="replace") as f:
        log = f.read()
    for s in SECRETS[:2]:
        if s in log:
            FAILS.append("%r in the plugin log" % s)


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
