#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Image classes: a StorageClass whose parameters image and imageSha256 (or
imageSha512) name
the volumes' content, served here by an HTTP server on 127.0.0.1 that counts
requests.  Through CSI, real plugin, real qemu-img:

- the first CreateVolume of an image downloads it (one GET), the next ones
  do not and are thin overlays on the same base layer; the volumes' content
  is the image's (qemu-img compare, raw and qcow2 images), and a guest's
  view of one, staged and published, is too (qsdctl verify --check through
  its vhost-user socket of an image qsdctl verify --write made);
- concurrent CreateVolumes of one image download it once;
- imageSha512 instead of imageSha256 (exactly one of them): a base named by
  the SHA-512, downloaded once;
- a wrong checksum is remembered: the retry fails the same way, with the
  time left, without a GET (csi/imagememo.h); the error names the expected
  digest only, the log both;
- refusals with the right code, naming the parameter, leaving nothing
  behind (no volume, record, layer, image name or temporary): malformed
  parameters (a malformed SHA-512, both digests given), wrong checksum, 404, unreachable server, a qcow2 with a backing
  file (a path and a json: one) or an external data file, another format,
  a corrupt qcow2, a qcow2 whose dirty bitmaps need more memory than the
  confined qemu-img may take, an image above --image-max-size (with and without
  Content-Length), a server that stalls (--image-timeout),
  an image larger than the requested size; a server failing once is retried;
- a download logs its progress; kill -9 of the plugin in the middle of it
  leaves no process and,
  after the restart, no temporary; the next attempt succeeds;
- an unused base stays while recently used, and goes once it is not.

usage: test_csi_imageclass.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import hashlib
import json
import http.server
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402
import thinlib  # noqa: E402
from csilib import mount_cap  # noqa: E402

import grpc  # noqa: E402

MiB = 1 << 20
# The test servers are on loopback, which downloads may not reach without it.
ALLOW = ["--image-download-allow-cidr", "127.0.0.0/8"]
TIMEOUT = 60


class Server:
    """HTTP/1.1 on 127.0.0.1: GET of the files in self.files, GETs counted
    per path; /flaky fails once with 503; paths in self.slow send their
    first 64 KiB, then wait for self.release (self.hold for self.stall);
    paths in self.delay answer after half a second; self.chunked ones are
    sent without Content-Length, 1 MiB every 0.3 s."""

    def __init__(self):
        self.files, self.gets, self.slow, self.delay = {}, {}, set(), set()
        self.release, self.hold = threading.Event(), threading.Event()
        self.stall, self.chunked = set(), set()
        self.lock = threading.Lock()
        srv = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                with srv.lock:
                    n = srv.gets[self.path] = srv.gets.get(self.path, 0) + 1
                data = srv.files.get(self.path)
                if self.path in srv.delay:
                    time.sleep(0.5)
                if data is None or (self.path.startswith("/flaky") and n == 1):
                    self.send_response(404 if data is None else 503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                if self.path in srv.chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for i in range(0, len(data), MiB):
                        part = data[i:i + MiB]
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                        self.wfile.flush()
                        time.sleep(0.3)
                    self.wfile.write(b"0\r\n\r\n")
                    return
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.path in srv.stall:
                    self.wfile.write(data[:64 * 1024])
                    self.wfile.flush()
                    srv.hold.wait(30)
                    return
                if self.path in srv.slow:
                    self.wfile.write(data[:64 * 1024])
                    self.wfile.flush()
                    srv.release.wait(30)
                    return
                self.wfile.write(data)

        class Quiet(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # a client that hangs up (curl stopped at a bound)

        self.httpd = Quiet(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def count(self, path):
        with self.lock:
            return self.gets.get(path, 0)

    def stop(self):
        self.release.set()
        self.hold.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def sha(data):
    return hashlib.sha256(data).hexdigest()


def qcow2_of(raw, tmp, name, *extra):
    """The qcow2 form of raw bytes (qemu-img convert), as bytes."""
    src, dst = os.path.join(tmp, name + ".raw"), os.path.join(tmp, name + ".qcow2")
    with open(src, "wb") as f:
        f.write(raw)
    subprocess.run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", *extra, src, dst],
                   check=True)
    with open(dst, "rb") as f:
        return f.read()


def with_backing(tmp, name, backing):
    """A qcow2 whose header names backing as its backing file (not opened:
    -u), as bytes."""
    path = os.path.join(tmp, name)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-u", "-b", backing, "-F", "raw",
                    path, "4M"], check=True)
    with open(path, "rb") as f:
        return f.read()


def many_bitmaps(tmp, size, n, granularity):
    """A qcow2 of virtual size `size` holding n empty persistent dirty
    bitmaps (made through a QSD's monitor: block-dirty-bitmap-add), as bytes."""
    path, sock = os.path.join(tmp, "bitmaps.qcow2"), os.path.join(tmp, "bitmaps.qmp")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", path, str(size)], check=True)
    node = {"driver": "qcow2", "node-name": "n", "file": {"driver": "file", "filename": path}}
    p = subprocess.Popen(["qemu-storage-daemon", "--blockdev", json.dumps(node), "--chardev",
                          "socket,id=m,path=%s,server=on,wait=off" % sock, "--monitor",
                          "chardev=m"])
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(sock):
            assert time.monotonic() < deadline, "the QSD making the bitmaps did not start"
            time.sleep(0.05)
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(30)
        s.connect(sock)
        f = s.makefile("rw")
        f.readline()

        def cmd(c, a=None):
            f.write(json.dumps({"execute": c, "arguments": a or {}}) + "\n")
            f.flush()
            while True:
                r = json.loads(f.readline())
                if "return" in r or "error" in r:
                    return r
        cmd("qmp_capabilities")
        for i in range(n):
            r = cmd("block-dirty-bitmap-add", {"node": "n", "name": "b%d" % i,
                                               "granularity": granularity, "persistent": True})
            assert "return" in r, r
        cmd("quit")
        p.wait(timeout=60)
        s.close()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    with open(path, "rb") as f:
        return f.read()


def pattern_image(qsdctl, tmp, size, seed):
    """A raw image holding qsdctl verify's pattern (written through a QSD
    export of a scratch pool), as bytes."""
    g = ["--pool", os.path.join(tmp, "pool"), "--run-dir", os.path.join(tmp, "run")]
    subprocess.run([qsdctl, *g, "create", "pat", "--size", str(size), "--format", "raw"],
                   check=True, capture_output=True)
    subprocess.run([qsdctl, *g, "export", "pat", "--no-iothread"], check=True,
                   capture_output=True)
    sock = os.path.join(tmp, "run", "exports", "pat", "vhost.sock")
    try:
        subprocess.run([qsdctl, "verify", "--write", "--seed", str(seed), "--size", str(size),
                        "--timeout-ms", "20000", sock], check=True, capture_output=True)
    finally:
        subprocess.run([qsdctl, *g, "unexport", "pat"], check=True, capture_output=True)
    with open(os.path.join(tmp, "pool", "volumes", "pat.raw"), "rb") as f:
        return f.read()


def pool_state(env):
    """What the pool and the state hold: (volumes, layers, images/ entries,
    volume records)."""
    ls = lambda d: sorted(os.listdir(os.path.join(env.pool, d)))  # noqa: E731
    recs = sorted(os.listdir(os.path.join(env.state, "volumes")))
    return ls("volumes"), ls("layers"), ls("images"), recs


def main():
    env = csilib.Env(sys.argv[1], sys.argv[2], prefix="qsd-imgcls-")
    srv = Server()
    try:
        run(env, srv, os.path.abspath(sys.argv[3]))
    finally:
        if sys.exc_info()[0] is not None:
            print("---- plugin log (tail)\n" + env.log_tail(80))
        srv.stop()
        env.cleanup()


def run(env, srv, qsdctl):
    pb = env.pb
    tmp = os.path.join(env.root, "files")
    os.mkdir(tmp)
    rnd = random.Random(14)
    raw = bytes(rnd.getrandbits(8) for _ in range(256 * 1024)) * 16  # 4 MiB, not all zero
    raw2 = raw[::-1]
    srv.files["/disk.raw"] = raw
    srv.files["/disk.qcow2"] = qcow2_of(raw, tmp, "disk")
    srv.files["/disk2.raw"] = raw2
    srv.files["/flaky.raw"] = raw[:MiB] * 2
    srv.files["/slow.raw"] = raw[:2 * MiB] * 3
    srv.slow.add("/slow.raw")
    evil = {
        "/evil-path.qcow2": with_backing(tmp, "e1", "/etc/shadow"),
        "/evil-json.qcow2": with_backing(
            tmp, "e2", 'json:{"driver":"raw","file":{"driver":"file","filename":"/etc/shadow"}}'),
    }
    df = bytearray(srv.files["/disk.qcow2"])
    df[72 + 7] |= 1 << 2  # incompatible feature "external data file"
    evil["/evil-datafile.qcow2"] = bytes(df)
    evil["/disk.vmdk"] = b"KDMV" + raw[4:MiB]
    bad = bytearray(srv.files["/disk.qcow2"])
    bad[40:48] = b"\x7f" + b"\xff" * 7  # L1 table offset far beyond the file
    evil["/corrupt.qcow2"] = bytes(bad)
    srv.files.update(evil)

    c = env.start(ALLOW)
    cap = mount_cap(pb)

    def create(name, path, size=8 * MiB, digest=None, algo="sha256", **params):
        data = srv.files.get(path, b"")
        key = "imageSha512" if algo == "sha512" else "imageSha256"
        p = {"image": srv.url(path), key: digest or hashlib.new(algo, data).hexdigest()}
        p.update(params)
        return c.CreateVolume(pb.CreateVolumeRequest(
            name=name, capacity_range=pb.CapacityRange(required_bytes=size),
            volume_capabilities=[cap], parameters=p), timeout=TIMEOUT)

    def fails(code, words, name, path, size=8 * MiB, **kw):
        before = pool_state(env)
        t0 = time.monotonic()
        try:
            create(name, path, size, **kw)
        except grpc.RpcError as e:
            dt = time.monotonic() - t0
            assert e.code() == code, "%s: expected %s, got %s (%s)" % (path, code, e.code(),
                                                                       e.details())
            for w in words:  # "!w": w must not be there
                if w.startswith("!"):
                    assert w[1:] not in e.details(), "%s: %r in %r" % (path, w, e.details())
                else:
                    assert w in e.details(), "%s: %r not in %r" % (path, w, e.details())
            after = pool_state(env)
            assert after == before, "%s: left behind: %s -> %s" % (path, before, after)
            print("refused %-22s %-20s %.2fs: %s" % (path, code.name, dt, e.details()))
            return
        raise AssertionError("%s: CreateVolume succeeded" % path)

    # -- the first volume downloads, the next ones do not
    times = []
    for i in range(3):
        t0 = time.monotonic()
        v = create("raw-%d" % i, "/disk.raw").volume
        times.append(time.monotonic() - t0)
        assert v.capacity_bytes == 8 * MiB, v
        assert srv.count("/disk.raw") == 1, "GETs of /disk.raw after %d: %d" % (
            i + 1, srv.count("/disk.raw"))
    print("raw image: CreateVolume 1 (download) %.3fs, 2: %.3fs, 3: %.3fs; GETs: %d" % (
        times[0], times[1], times[2], srv.count("/disk.raw")))
    vols, layers, images, _ = pool_state(env)
    assert images == [sha(raw)], images
    assert len(layers) == 1, layers
    img = os.path.join(tmp, "disk.raw")
    for i in range(3):
        top = os.path.join(env.pool, "volumes", "raw-%d.qcow2" % i)
        out = subprocess.run(["qemu-img", "info", "-U", "--output=json", top],
                             capture_output=True, text=True, check=True).stdout
        assert '"backing-filename": "../layers/%s"' % layers[0] in out, out
        subprocess.run(["qemu-img", "compare", "-U", "-q", "-f", "qcow2", "-F", "raw", top, img],
                       check=True)
    print("raw-0..2: content equals the image (qemu-img compare), one shared base layer")

    # -- a qcow2 image
    t0 = time.monotonic()
    create("q-0", "/disk.qcow2")
    t1 = time.monotonic()
    create("q-1", "/disk.qcow2")
    t2 = time.monotonic()
    assert srv.count("/disk.qcow2") == 1
    for n in ("q-0", "q-1"):
        subprocess.run(["qemu-img", "compare", "-U", "-q", "-f", "qcow2", "-F", "raw",
                        os.path.join(env.pool, "volumes", n + ".qcow2"), img], check=True)
    print("qcow2 image: CreateVolume 1 (download) %.3fs, 2: %.3fs; content equals the image"
          % (t1 - t0, t2 - t1))
    # idempotent retry: same answer, no download
    create("q-1", "/disk.qcow2")
    assert srv.count("/disk.qcow2") == 1

    # -- what a guest reads: the pattern through the published socket
    srv.files["/pattern.raw"] = pattern_image(qsdctl, tmp, 4 * MiB, 77)
    stg, tgt = thinlib.create_published(env, c, "guest", 4 * MiB, cap, TIMEOUT, params={
        "image": srv.url("/pattern.raw"), "imageSha256": sha(srv.files["/pattern.raw"])})
    r = subprocess.run([qsdctl, "verify", "--check", "--seed", "77", "--size", str(4 * MiB),
                        "--timeout-ms", "20000", "./vhost.sock"],
                       cwd=tgt, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, "qsdctl verify --check: %s%s" % (r.stdout, r.stderr)
    c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id="guest", target_path=tgt),
                          timeout=TIMEOUT)
    c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id="guest", staging_target_path=stg),
                        timeout=TIMEOUT)
    c.DeleteVolume(pb.DeleteVolumeRequest(volume_id="guest"), timeout=TIMEOUT)
    print("a staged and published volume of an image: the guest reads the image "
          "(qsdctl verify --check through vhost-user)")

    # -- concurrent CreateVolumes of one image: one download
    srv.delay.add("/disk2.raw")  # the others arrive while the first downloads
    results, threads = {}, []

    def one(n):
        try:
            results[n] = create(n, "/disk2.raw").volume.capacity_bytes
        except grpc.RpcError as e:
            results[n] = e
    t0 = time.monotonic()
    for i in range(4):
        threads.append(threading.Thread(target=one, args=("con-%d" % i,)))
        threads[-1].start()
    for t in threads:
        t.join(TIMEOUT)
    assert all(r == 8 * MiB for r in results.values()) and len(results) == 4, results
    assert srv.count("/disk2.raw") == 1, srv.count("/disk2.raw")
    waits = env.log_tail(400).count("waiting for the image download")
    assert waits == 3, "%d CreateVolumes waited for the download, not 3" % waits
    print("4 concurrent CreateVolumes of a new image: %.3fs, GETs: %d" % (
        time.monotonic() - t0, srv.count("/disk2.raw")))

    # -- a server failing once (503) is retried
    create("flaky", "/flaky.raw")
    assert srv.count("/flaky.raw") == 2, srv.count("/flaky.raw")
    print("a 503 then 200: created after %d GETs" % srv.count("/flaky.raw"))

    # -- refusals
    IA, FP = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION
    fails(IA, ["image", "http"], "bad-url", "/disk.raw", image="ftp://127.0.0.1/disk.raw")
    fails(IA, ["image", "space"], "bad-url2", "/disk.raw", image=srv.url("/a b"))
    fails(IA, ["imageSha256"], "bad-sha", "/disk.raw", digest="abc")
    fails(IA, ["imageSha256"], "bad-sha2", "/disk.raw", digest=sha(raw).upper())
    fails(IA, ["format qcow2"], "bad-fmt", "/disk.raw", format="raw")
    try:
        c.CreateVolume(pb.CreateVolumeRequest(
            name="no-sha", volume_capabilities=[cap], parameters={"image": srv.url("/disk.raw")}),
            timeout=TIMEOUT)
        raise AssertionError("image without imageSha256 accepted")
    except grpc.RpcError as e:
        assert e.code() == IA and "imageSha256" in e.details(), e
    # The error names the expected sum, never the content's (a hash of what
    # was fetched is content: the operator's log has it).  The refusal is
    # remembered (csi/imagememo.h): a retry within 10 minutes gets the same
    # error and the time left, without a GET; the log names both sums.
    gets = srv.count("/disk.raw")
    fails(FP, ["imageSha256", "does not have sha256 " + sha(b"other"), "!" + sha(raw)],
          "wrong-sha", "/disk.raw", digest=sha(b"other"))
    assert srv.count("/disk.raw") == gets + 1, (gets, srv.count("/disk.raw"))
    fails(FP, ["imageSha256", sha(b"other"), "!" + sha(raw), "not downloaded again for"],
          "wrong-sha", "/disk.raw", digest=sha(b"other"))
    assert "checksum refusal remembered" in env.log_tail(50) and sha(raw) in env.log_tail(50)
    assert srv.count("/disk.raw") == gets + 1, "a remembered refusal downloaded again"
    # -- imageSha512 (Debian publishes SHA512SUMS only): exactly one of the two
    s512 = hashlib.sha512(raw2).hexdigest()
    srv.files["/disk512.raw"] = raw2
    fails(IA, ["imageSha512", "128"], "bad-sha512", "/disk512.raw", algo="sha512",
          digest=sha(raw2))
    fails(IA, ["imageSha512", "lowercase"], "bad-sha512b", "/disk512.raw", algo="sha512",
          digest=s512.upper())
    fails(IA, ["imageSha256 and imageSha512", "not both"], "both-sha", "/disk512.raw",
          algo="sha512", imageSha256=sha(raw2))
    assert srv.count("/disk512.raw") == 0
    # the digest of another image (raw): wrong for /disk512.raw (raw2)
    wrong512 = hashlib.sha512(raw).hexdigest()
    fails(FP, ["imageSha512", "does not have sha512 " + wrong512, "!" + s512],
          "wrong-512", "/disk512.raw", algo="sha512", digest=wrong512)
    assert srv.count("/disk512.raw") == 1
    t0 = time.monotonic()
    fails(FP, ["imageSha512", wrong512, "!" + s512, "not downloaded again for"],
          "wrong-512b", "/disk512.raw", algo="sha512", digest=wrong512)
    assert srv.count("/disk512.raw") == 1, "a remembered refusal downloaded again"
    assert time.monotonic() - t0 < 5, "the remembered refusal took %.1f s" % (
        time.monotonic() - t0)
    # once the pool has a base of that digest (another class brought it),
    # the remembered refusal no longer stops the volume: no GET either
    srv.files["/other512.raw"] = raw
    create("other-512", "/other512.raw", algo="sha512")
    assert srv.count("/other512.raw") == 1
    create("wrong-512c", "/disk512.raw", algo="sha512", digest=wrong512)
    assert srv.count("/disk512.raw") == 1, "downloaded although the base was there"
    for n in ("other-512", "wrong-512c"):
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=n), timeout=TIMEOUT)
    # the right SHA-512: downloaded (the refusal is keyed by the digest), and
    # the volume's content is the image's
    v = create("good-512", "/disk512.raw", algo="sha512").volume
    assert srv.count("/disk512.raw") == 2, srv.count("/disk512.raw")
    assert v.capacity_bytes == 8 * MiB, v.capacity_bytes
    base = [n for n in os.listdir(os.path.join(env.pool, "images")) if n == s512]
    assert base, "no base named by the SHA-512 in images/: %s" % os.listdir(
        os.path.join(env.pool, "images"))
    create("good-512b", "/disk512.raw", algo="sha512")
    assert srv.count("/disk512.raw") == 2, "the SHA-512 base was downloaded again"
    for n in ("good-512", "good-512b"):
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=n), timeout=TIMEOUT)
    print("imageSha512: refused (bad, both, wrong; the retry without a GET), then "
          "created from one download")
    # a qcow2 whose 600 dirty bitmaps (8 GiB at 512-byte granularity: 2 MiB
    # each) make qemu-img allocate 1.2 GB: refused at the confined qemu-img's
    # 1 GiB bound (docs/security.md), quickly, naming the limits
    srv.files["/bitmaps.qcow2"] = many_bitmaps(tmp, 8 << 30, 600, 512)
    t0 = time.monotonic()
    fails(FP, ["cannot be converted", "limits"], "bitmaps", "/bitmaps.qcow2", size=8 << 30)
    assert time.monotonic() - t0 < 60, "the bitmap image took %.0f s to refuse" % (
        time.monotonic() - t0)
    fails(grpc.StatusCode.NOT_FOUND, ["image", "404"], "missing", "/missing.raw",
          digest=sha(b"x"))
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    closed = s.getsockname()[1]
    s.close()
    fails(grpc.StatusCode.UNAVAILABLE, ["image", "127.0.0.1:%d" % closed], "unreachable",
          "/disk.raw", digest=sha(b"unreachable"),
          image="http://127.0.0.1:%d/disk.raw" % closed)
    fails(FP, ["image", "backing file"], "evil-path", "/evil-path.qcow2")
    fails(FP, ["image", "backing file"], "evil-json", "/evil-json.qcow2")
    fails(FP, ["image", "external data file"], "evil-df", "/evil-datafile.qcow2")
    fails(FP, ["image", "vmdk"], "vmdk", "/disk.vmdk")
    fails(FP, ["image", "cannot be converted"], "corrupt", "/corrupt.qcow2")
    for p in evil:
        assert srv.count(p) == 1, (p, srv.count(p))
    # the base is found by its sha256: a class naming the same image at a
    # URL that does not answer uses it without asking
    create("same-sha", "/disk.raw", image="http://127.0.0.1:%d/disk.raw" % closed)
    c.DeleteVolume(pb.DeleteVolumeRequest(volume_id="same-sha"), timeout=TIMEOUT)
    # larger than requested: the base is kept (cached), the volume is not made
    fails(grpc.StatusCode.OUT_OF_RANGE, ["capacity_range", "larger"], "small", "/disk.raw",
          size=2 * MiB)

    # -- kill -9 in the middle of a download
    done = {}

    def slow():
        try:
            create("slow", "/slow.raw")
            done["r"] = "created"
        except grpc.RpcError as e:
            done["r"] = e.code()
    th = threading.Thread(target=slow)
    th.start()
    part = os.path.join(env.pool, "images", ".%s.part" % sha(srv.files["/slow.raw"]))
    deadline = time.monotonic() + 20
    while not (os.path.exists(part) and os.path.getsize(part) > 0):
        assert time.monotonic() < deadline, "the download did not start"
        time.sleep(0.05)
    while "msg=\"download progress\" url=%s" % srv.url("/slow.raw") not in env.log_tail(50):
        assert time.monotonic() < deadline, "no progress logged: " + env.log_tail(8)
        time.sleep(0.1)
    url = srv.url("/slow.raw").encode()
    curls = [p for p in os.listdir("/proc") if p.isdigit() and url in _cmdline(p)]
    assert curls, "no curl process downloads %s" % url
    env.stop(signal.SIGKILL)
    th.join(TIMEOUT)
    deadline = time.monotonic() + 10
    while [p for p in curls if _alive(p)]:
        assert time.monotonic() < deadline, "curl survived the plugin: %s" % curls
        time.sleep(0.05)
    srv.release.set()
    srv.slow.clear()
    c = env.start(["--image-max-size", "7M", "--image-timeout", "4", *ALLOW])
    deadline = time.monotonic() + 10
    while os.path.exists(part):  # the garbage collection at start
        assert time.monotonic() < deadline, "%s left after the restart" % part
        time.sleep(0.05)
    assert not any(n.startswith(".") for n in os.listdir(os.path.join(env.pool, "images")))
    create("slow", "/slow.raw")
    print("kill -9 during a download (%s): curl gone, temporaries removed at restart, "
          "the next CreateVolume succeeded" % done.get("r"))

    # -- the bounds (--image-max-size 7M, --image-timeout 4)
    big = raw * 2
    srv.files["/big.raw"] = big
    srv.files["/chunked.raw"] = big[::-1]
    srv.chunked.add("/chunked.raw")
    srv.files["/stall.raw"] = raw2[:3 * MiB]
    srv.stall.add("/stall.raw")
    fails(FP, ["image", "larger than 7340032 bytes"], "big", "/big.raw")
    fails(FP, ["image", "larger than 7340032 bytes"], "chunked", "/chunked.raw")
    t0 = time.monotonic()
    fails(grpc.StatusCode.UNAVAILABLE, ["image", "stall.raw"], "stall", "/stall.raw")
    assert time.monotonic() - t0 < 15, "a stalled download was not stopped at its bound"
    srv.hold.set()

    # -- garbage collection of bases
    def delete(n):
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=n), timeout=TIMEOUT)
    for i in range(3):
        delete("raw-%d" % i)
    gets = srv.count("/disk.raw")
    time.sleep(0.5)
    name = os.path.join(env.pool, "images", sha(raw))
    assert os.path.islink(name), "a base used within the hour was removed"
    create("raw-again", "/disk.raw")
    assert srv.count("/disk.raw") == gets, "a kept base was downloaded again"
    delete("raw-again")
    old = time.time() - 2 * 3600
    os.utime(name, (old, old), follow_symlinks=False)
    delete("flaky")  # any deletion runs the garbage collection
    deadline = time.monotonic() + 10
    while os.path.lexists(name):
        assert time.monotonic() < deadline, "an unused base older than an hour stayed"
        time.sleep(0.05)
    create("raw-later", "/disk.raw")
    assert srv.count("/disk.raw") == gets + 1
    print("bases: kept while used or used within the hour, removed after; re-downloaded then")

    for n in ["raw-later", "q-0", "q-1", "slow"] + ["con-%d" % i for i in range(4)]:
        delete(n)
    deadline = time.monotonic() + 10
    while True:
        vols, layers, images, recs = pool_state(env)
        if not vols and not recs and not [i for i in images if i.startswith(".")]:
            break
        assert time.monotonic() < deadline, pool_state(env)
        time.sleep(0.05)
    env.stop()
    print("OK")


def _cmdline(pid):
    try:
        with open("/proc/%s/cmdline" % pid, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _alive(pid):
    try:
        with open("/proc/%s/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
