#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Observability: the plugin's /metrics and /healthz (--http-endpoint), with
a real QSD under I/O (qsdctl verify through the published socket).

Checks: /healthz answers; the page parses (prometheus_client's parser plus
a strict check of our own: HELP and TYPE for every family, cumulative
buckets ending in +Inf == _count, the qsd_csi_ prefix); every per-volume series carries the labels that
join with kube-state-metrics (namespace and persistentvolumeclaim from the
provisioner's --extra-create-metadata parameters, volume_handle NAME@NODE as
the PV has it); the volume's I/O
counters moved with the I/O; the RPC counters and histograms count the
calls made (a failing one under its code); a SIGSTOPped QSD becomes "hung"
and NodeGetVolumeStats abnormal, SIGCONT makes it running and normal again,
and /metrics keeps answering meanwhile; a killed QSD's restart is counted; a pool filled to below what the
volume may still allocate makes the condition abnormal; hostile HTTP (bad
method, oversized head, slowloris, a request body, NUL bytes, malformed
framing: 4xx/5xx) is answered and bounded, and 32 reconnecting slow clients
(from another address or the scraper's own) leave >= 39 of 40 scrapes
answered.

The full-pool part runs a second plugin, listening on every address
(--http-endpoint :PORT, dual-stack: it must answer over 127.0.0.1 and ::1;
the IPv6 half is skipped, saying why, only where ::1 is not configured),
whose pool is a tmpfs of this test's own (so that it can be filled; the kernel keeps no I/O accounting for
tmpfs, so the first part uses a pool on the disk).
Runtime: about 30 s.

usage: test_csi_metrics.py PLUGIN PROTO_DIR QSDCTL
"""
import os
import re
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402
import thinlib  # noqa: E402
from csilib import mount_cap  # noqa: E402
import grpc  # noqa: E402

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    csilib.skip("python3-prometheus-client not installed (scripts/setup.sh installs it)")

MiB = 1 << 20
VOL = "pvc-metrics"
# What csi-provisioner --extra-create-metadata adds to CreateVolume's parameters.
PVC_META = {"csi.storage.k8s.io/pvc/name": "disk-a",
            "csi.storage.k8s.io/pvc/namespace": "vms",
            "csi.storage.k8s.io/pv/name": VOL}
POOL_SIZE = 256 * MiB
WAIT_S = 20  # bound on every wait for a collection round (interval 1 s, probe bound 3 s)


def http(port, raw, timeout=5.0, host="127.0.0.1"):
    """Send raw bytes, return everything the server sends until it closes."""
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        s.sendall(raw)
        out = b""
        while True:
            b = s.recv(65536)
            if not b:
                return out
            out += b
    finally:
        s.close()


def get(port, path, timeout=5.0, host="127.0.0.1"):
    r = http(port, b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode(), timeout, host)
    head, _, body = r.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, head.decode(), body.decode()


def strict_check(text):
    """Our own reading of the 0.0.4 text format, stricter than the parser."""
    helps, types, seen = {}, {}, set()
    for line in text.split("\n")[:-1]:
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            assert name not in helps, "two HELP lines for " + name
            helps[name] = True
        elif line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ")
            assert typ in ("counter", "gauge", "histogram"), line
            assert name in helps, "TYPE before HELP: " + line
            types[name] = typ
        else:
            assert not line.startswith("#"), line
            name = line.split("{", 1)[0].split(" ", 1)[0]
            value = line.rsplit(" ", 1)[1]
            float(value)
            base = name
            for suf in ("_bucket", "_sum", "_count"):
                if name.endswith(suf) and name[:-len(suf)] in types:
                    base = name[:-len(suf)]
            assert base in types, "sample without TYPE: " + line
            assert base.startswith("qsd_csi_"), line
            assert line not in seen, "duplicate sample " + line
            seen.add(line)
    assert text.endswith("\n")


def scrape(port, timeout=5.0):
    status, head, body = get(port, "/metrics", timeout)
    assert status == 200, head
    assert "text/plain; version=0.0.4" in head, head
    strict_check(body)
    samples = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, body


def value(samples, name, **labels):
    """The value of the one sample of name whose labels include labels
    (None when there is none; two are an error)."""
    want = set(labels.items())
    got = [v for (n, ls), v in samples.items() if n == name and want <= set(ls)]
    assert len(got) <= 1, "%d samples of %s with %s" % (len(got), name, labels)
    return got[0] if got else None


def check_volume_labels(samples, node):
    """Every qsd_csi_volume_ sample names its volume the ways Kubernetes
    does."""
    n = 0
    for (name, ls), _ in samples.items():
        if not name.startswith("qsd_csi_volume_"):
            continue
        d = dict(ls)
        assert d.get("volume_id") == VOL, (name, d)
        assert d.get("volume_handle") == VOL + "@" + node, (name, d)
        assert d.get("namespace") == "vms", (name, d)
        assert d.get("persistentvolumeclaim") == "disk-a", (name, d)
        n += 1
    assert n >= 10, "only %d per-volume samples" % n


def check_histograms(body):
    buckets = {}
    counts = {}
    for fam in text_string_to_metric_families(body):
        if fam.type != "histogram":
            continue
        for s in fam.samples:
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            if s.name.endswith("_bucket"):
                buckets.setdefault((fam.name, key), []).append(
                    (float(s.labels["le"]), s.value))
            elif s.name.endswith("_count"):
                counts[(fam.name, key)] = s.value
    assert buckets, "no histogram"
    for k, bs in buckets.items():
        bs.sort()
        assert bs[-1][0] == float("inf"), k
        vals = [v for _, v in bs]
        assert vals == sorted(vals), "buckets not cumulative: %s" % (k,)
        assert vals[-1] == counts[k], "+Inf bucket != count: %s" % (k,)


def wait_for(what, fn):
    deadline = time.monotonic() + WAIT_S
    while True:
        r = fn()
        if r:
            return r
        if time.monotonic() > deadline:
            raise AssertionError("not within %d s: %s" % (WAIT_S, what))
        time.sleep(0.2)


def main():
    qsdctl = sys.argv[3]
    stopped = []
    for phase in (run, full_pool):
        env = csilib.Env(sys.argv[1], sys.argv[2], prefix="qsd-metrics-")
        try:
            phase(env, qsdctl, stopped)
        finally:
            for pid in stopped:
                try:
                    os.kill(pid, signal.SIGCONT)
                except OSError:
                    pass
            if sys.exc_info()[0] is not None:
                print("---- plugin log (tail)\n" + env.log_tail(80))
            env.cleanup()


def ipv6_loopback():
    """None when ::1 can be bound here, else why not."""
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError as e:
        return "no IPv6 in this kernel (%s)" % e
    try:
        s.bind(("::1", 0))
        return None
    except OSError as e:
        return "::1 is not configured on this machine (%s)" % e
    finally:
        s.close()


def free_port():
    """A port free on 127.0.0.1 and (where there is IPv6) on [::]."""
    fam, addr = (socket.AF_INET6, "::") if ipv6_loopback() is None else \
        (socket.AF_INET, "127.0.0.1")
    s = socket.socket(fam, socket.SOCK_STREAM)
    if fam == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind((addr, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def dual_stack(port):
    """--http-endpoint :PORT answers IPv4 and IPv6 clients."""
    assert get(port, "/healthz", host="127.0.0.1")[0] == 200
    why = ipv6_loopback()
    if why:
        print("SKIP the IPv6 half of the dual-stack check: " + why)
        return
    status, _, body = get(port, "/healthz", host="::1")
    assert (status, body) == (200, "ok\n"), (status, body)
    print("dual-stack listener :%d answered over 127.0.0.1 and ::1" % port)


def start(env, extra=(), host="127.0.0.1"):
    port = free_port()
    c = env.start(["--http-endpoint", "%s:%d" % (host, port), "--metrics-interval", "1",
                   *extra])
    _, tgt = thinlib.create_published(env, c, VOL, 64 * MiB, mount_cap(env.pb), 60, PVC_META)
    return c, port, tgt


def full_pool(env, qsdctl, stopped):
    """A pool (a tmpfs of this test's own) filled to below what the volume
    may still allocate: the volume's condition says so, until space is
    freed."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d" % POOL_SIZE, "tmpfs", env.pool],
                   check=True)
    c, port, tgt = start(env, ["--overcommit-ratio", "1.5", "--capacity-reserve", "16M"],
                         host="")
    dual_stack(port)
    smp = wait_for("pool figures with the volume's image in the pool", lambda: (
        lambda m: m if 0 < (value(m, "qsd_csi_pool_free_bytes") or POOL_SIZE) < POOL_SIZE
        else None)(scrape(port)[0]))
    assert value(smp, "qsd_csi_pool_capacity_bytes") == POOL_SIZE
    assert 0 < value(smp, "qsd_csi_pool_free_bytes") < POOL_SIZE
    assert value(smp, "qsd_csi_pool_reserved_bytes") == 16 * MiB
    assert value(smp, "qsd_csi_pool_provisioned_bytes") == 64 * MiB
    assert value(smp, "qsd_csi_pool_overcommit_ratio") == 1.5
    assert value(smp, "qsd_csi_pool_provisioned_limit_bytes") == (POOL_SIZE - 16 * MiB) * 3 // 2
    assert not stats(env, c, tgt).abnormal
    filler = os.path.join(env.pool, "filler")
    with open(filler, "wb") as f:
        f.write(b"\1" * int(value(smp, "qsd_csi_pool_free_bytes") - 8 * MiB))
    wait_for("pool problem in the volume condition", lambda: stats(env, c, tgt).abnormal)
    cond = stats(env, c, tgt)
    assert "pool is nearly full" in cond.message, cond.message
    print("full pool: " + cond.message)
    os.unlink(filler)
    wait_for("condition normal again", lambda: not stats(env, c, tgt).abnormal)
    assert env.stop() == 0, "the plugin did not exit cleanly (a sanitizer report?)"


def stats(env, c, tgt):
    r = c.NodeGetVolumeStats(env.pb.NodeGetVolumeStatsRequest(volume_id=VOL, volume_path=tgt),
                             timeout=30)
    return r.volume_condition


def check_build_info(body):
    """qsd_csi_build_info: one sample, 1, naming the version --version
    prints, a revision, and the QSD's QEMU version as it prints it."""
    fams = [f for f in text_string_to_metric_families(body) if f.name == "qsd_csi_build_info"]
    assert len(fams) == 1 and len(fams[0].samples) == 1, fams
    s = fams[0].samples[0]
    assert s.value == 1, s
    plugin = subprocess.run([sys.argv[1], "--version"], capture_output=True, text=True,
                            timeout=10).stdout.split()
    assert s.labels["version"] == plugin[1], (s.labels, plugin)
    assert s.labels["revision"], s.labels
    out = subprocess.run(["qemu-storage-daemon", "--version"], capture_output=True, text=True,
                         timeout=10).stdout
    qemu = re.search(r" version ([0-9]+\.[0-9.]*[0-9])", out).group(1)
    assert s.labels["qemu_version"] == qemu, (s.labels, out)
    print("build info: %s" % s.labels)


def run(env, qsdctl, stopped):
    c, port, tgt = start(env)
    pb = env.pb
    status, _, body = get(port, "/healthz")
    assert (status, body) == (200, "ok\n"), (status, body)
    csilib.expect_code(c.NodeStageVolume, pb.NodeStageVolumeRequest(volume_id=""),
                       grpc.StatusCode.INVALID_ARGUMENT, "stage without an id")

    def io_seen():
        smp, _ = scrape(port)
        w = value(smp, "qsd_csi_volume_write_bytes_total", volume_id=VOL)
        return smp if w is not None else None
    before = wait_for("I/O counters of the volume", io_seen)
    w0 = value(before, "qsd_csi_volume_write_bytes_total", volume_id=VOL)
    r0 = value(before, "qsd_csi_volume_read_bytes_total", volume_id=VOL)

    r = subprocess.run([qsdctl, "verify", "--chunks", "32", "--chunk-size", str(1 * MiB),
                        "--timeout-ms", "20000", "./vhost.sock"], cwd=tgt,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr

    def moved():
        smp, _ = scrape(port)
        w = value(smp, "qsd_csi_volume_write_bytes_total", volume_id=VOL)
        rd = value(smp, "qsd_csi_volume_read_bytes_total", volume_id=VOL)
        return smp if w >= w0 + 32 * MiB and rd >= r0 + 32 * MiB else None
    smp = wait_for("write and read bytes to grow by the 32 MiB verify wrote and read back", moved)
    smp, body = scrape(port)
    check_histograms(body)
    check_volume_labels(smp, env.node)
    print("sample of /metrics:\n" + "\n".join(
        line for line in body.split("\n")
        if "le=" not in line or 'le="+Inf"' in line)[:6000])

    for m, code, n in (("/csi.v1.Controller/CreateVolume", "OK", 1),
                       ("/csi.v1.Node/NodeStageVolume", "OK", 1),
                       ("/csi.v1.Node/NodePublishVolume", "OK", 1),
                       ("/csi.v1.Node/NodeStageVolume", "INVALID_ARGUMENT", 1)):
        got = value(smp, "qsd_csi_rpc_total", method=m, code=code)
        assert got == n, "%s %s: %s calls counted, %d made" % (m, code, got, n)
        cnt = value(smp, "qsd_csi_rpc_duration_seconds_count", method=m, code=code)
        assert cnt == n, "%s %s: histogram count %s" % (m, code, cnt)
    # The QEMU version comes from a worker the plugin starts at start-up
    # (bounded at 6 s): "unknown" until it answered.
    deadline = time.monotonic() + 10
    while 'qemu_version="unknown"' in body and time.monotonic() < deadline:
        time.sleep(0.2)
        _, body = scrape(port)
    check_build_info(body)
    assert value(smp, "qsd_csi_volume_qsd_state", volume_id=VOL, state="running") == 1
    assert value(smp, "qsd_csi_volume_qsd_state", volume_id=VOL, state="hung") == 0
    assert value(smp, "qsd_csi_volume_qsd_restarts_total", volume_id=VOL) == 0
    assert value(smp, "qsd_csi_volume_allocated_bytes", volume_id=VOL) >= 32 * MiB
    assert value(smp, "qsd_csi_volume_capacity_bytes", volume_id=VOL) == 64 * MiB
    assert value(smp, "qsd_csi_pool_capacity_bytes") > 0
    assert value(smp, "qsd_csi_pool_reserved_bytes") == \
        value(smp, "qsd_csi_pool_capacity_bytes") // 10  # the default reserve, 10%
    assert value(smp, "qsd_csi_pool_overcommit_ratio") is None  # no limit by default
    assert value(smp, "qsd_csi_volume_qmp_probe_seconds_count", volume_id=VOL) >= 1
    cond = stats(env, c, tgt)
    assert not cond.abnormal, cond.message

    # A hung QSD: stopped, its monitor never answers.
    pid = csilib.qsd_process(env.qsd_pids()[VOL])
    os.kill(pid, signal.SIGSTOP)
    stopped.append(pid)
    wait_for("state hung", lambda: value(scrape(port, timeout=2.5)[0],
                                         "qsd_csi_volume_qsd_state", volume_id=VOL,
                                         state="hung") == 1)
    cond = stats(env, c, tgt)
    assert cond.abnormal and "hung" in cond.message, cond
    print("hung: " + cond.message)
    status, _, _ = get(port, "/healthz", timeout=2.5)
    assert status == 200
    os.kill(pid, signal.SIGCONT)
    stopped.remove(pid)
    wait_for("state running again", lambda: value(scrape(port)[0], "qsd_csi_volume_qsd_state",
                                                  volume_id=VOL, state="running") == 1)
    cond = stats(env, c, tgt)
    assert not cond.abnormal, cond.message

    # A QSD that dies is restarted and counted.
    os.kill(pid, signal.SIGKILL)
    wait_for("one restart counted", lambda: value(
        scrape(port)[0], "qsd_csi_volume_qsd_restarts_total", volume_id=VOL) == 1)
    wait_for("state running after the restart", lambda: value(
        scrape(port)[0], "qsd_csi_volume_qsd_state", volume_id=VOL, state="running") == 1)

    hostile(port)
    status, _, _ = get(port, "/metrics")
    assert status == 200
    assert env.stop() == 0, "the plugin did not exit cleanly (a sanitizer report?)"


def hostile(port):
    def status_of(raw, timeout=5.0):
        r = http(port, raw, timeout)
        return int(r.split(b" ", 2)[1]), r

    st, r = status_of(b"POST /metrics HTTP/1.1\r\n\r\n")
    assert st == 405 and b"Allow: GET" in r, r
    assert status_of(b"DELETE / HTTP/1.1\r\n\r\n")[0] == 405
    assert status_of(b"GET /nope HTTP/1.1\r\n\r\n")[0] == 404
    assert status_of(b"GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")[0] == 400
    # Framing: no body, no Transfer-Encoding in any spelling, no ambiguity.
    assert status_of(b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")[0] == 501
    assert status_of(b"GET /metrics HTTP/1.1\r\ntransfer-encoding: x\r\n\r\n")[0] == 501
    for bad in (b"Transfer-Encoding : chunked", b"Transfer-Encoding\t: chunked",
                b" Transfer-Encoding: chunked", b"X: a\nTransfer-Encoding: chunked",
                b"X: a\r\n\tTransfer-Encoding: chunked", b"Content-Length: 0x5",
                b"Content-Length: -1", b"Content-Length: 0, 0", b"Content-Length:",
                b"Content-Length: 0\r\nContent-Length: 0", b"Content-Length: 00001",
                b"Bad Name: x", b"X: a\rb"):
        st, r = status_of(b"GET /metrics HTTP/1.1\r\n" + bad + b"\r\n\r\n")
        assert st == 400, (bad, r[:80])
    for bad in (b"GET  /metrics HTTP/1.1", b"GET /metrics  HTTP/1.1", b"G\x01T /metrics HTTP/1.1",
                b"GET /me\ttrics HTTP/1.1", b"GET /metrics HTTP/1.1 ", b"GET /metrics\x7f HTTP/1.1"):
        st, r = status_of(bad + b"\r\n\r\n")
        assert st == 400, (bad, r[:80])
    assert status_of(b"GET /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")[0] == 200
    assert status_of(b"GET /me\0trics HTTP/1.1\r\n\r\n")[0] == 400
    assert status_of(b"garbage\r\n\r\n")[0] == 400
    assert status_of(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")[0] == 505
    # Oversized head (no end): 431 once the buffer is full, then closed.
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(b"GET /metrics HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 20000)
    except OSError:
        pass  # the server may close while we still send
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except ConnectionResetError:
        pass
    s.close()
    assert out.startswith(b"HTTP/1.1 431 "), out[:100]
    # Slowloris: a head that never ends is answered 408 and closed within
    # the header timeout (2 s), however slowly bytes keep coming.
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    t0 = time.monotonic()
    s.sendall(b"GET /metrics HTTP/1.1\r\n")
    out = b""
    while True:
        if not out:
            try:
                s.sendall(b"X")
            except OSError:
                pass
        try:
            b = s.recv(65536) if select_readable(s, 0.5) else None
        except ConnectionResetError:
            break
        if b == b"":
            break
        if b:
            out += b
        assert time.monotonic() - t0 < 6, "slowloris connection kept past 6 s"
    s.close()
    assert out.startswith(b"HTTP/1.1 408 "), out[:100]
    # Many connections: past 16, a new one closes the oldest connection of
    # the address that holds the most; a scraper from elsewhere is served.
    idle = [slow_connection(port, "127.0.0.2") for _ in range(16)]
    try:
        time.sleep(0.3)
        assert get(port, "/healthz")[0] == 200
        closed = sum(1 for s in idle if select_readable(s, 0.5))
        assert closed >= 1, "no idle connection was closed for the scraper"
    finally:
        for s in idle:
            s.close()
    slow_clients(port, "127.0.0.2")  # another address than the scraper
    slow_clients(port, "127.0.0.1")  # the scraper's own address


def slow_connection(port, source):
    """A connection that has sent part of a head (accepted: TCP_DEFER_ACCEPT
    waits for data)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    s.sendall(b"GET /metrics HTTP/1.1\r\n")
    return s


def slow_clients(port, source, n=32, scrapes=40):
    """n clients that keep a slow head going and reconnect as soon as they
    are closed; meanwhile at least scrapes-1 of scrapes are answered."""
    import threading
    stop = threading.Event()
    conns = [0]

    def client():
        while not stop.is_set():
            try:
                s = slow_connection(port, source)
                conns[0] += 1
            except OSError:
                time.sleep(0.01)
                continue
            try:
                while not stop.is_set():
                    s.sendall(b"X")
                    if select_readable(s, 0.2):
                        break  # answered (408) or closed: reconnect
            except OSError:
                pass
            finally:
                s.close()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    ok = 0
    try:
        time.sleep(1.0)
        for _ in range(scrapes):
            try:
                if get(port, "/metrics", timeout=5.0)[0] == 200:
                    ok += 1
            except (OSError, IndexError, ValueError):
                pass
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    print("%d slow clients from %s (%d connections): %d of %d scrapes answered"
          % (n, source, conns[0], ok, scrapes))
    assert conns[0] >= n, "the slow clients did not connect"
    assert ok >= scrapes - 1, "only %d of %d scrapes answered" % (ok, scrapes)


def select_readable(s, timeout):
    import select
    r, _, _ = select.select([s], [], [], timeout)
    return bool(r)


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
