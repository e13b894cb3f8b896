#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""qsd-vhost-filter in front of a real qemu-storage-daemon.

- qsdctl's vhost-user-blk client writes and checks a pattern through the
  filter (1 and 2 queues), and the data matches read directly from the QSD;
- a hostile client sending raw vhost-user messages (with SCM_RIGHTS memfds
  and eventfds) is cut off for every attack class of issue 21 (queue index
  past the export's queues, inflight, postcopy, memory tables of 0, 9, 255
  and 2^32-1 regions, adjacent and overlapping regions, rings running past
  their region, extra descriptors, oversized messages, forbidden feature
  bits, log base), while the QSD stays alive and serves the next good client;
- the QSD's feature offer reaches the tenant masked (no LOG_ALL, no
  postcopy, no inflight, no host notifiers);
- refusals are logged at most a few lines per second, the rest counted;
- head mode: the filter runs the QSD as its child; kill -9 of the QSD ends
  the filter with 137 after closing its sockets; SIGTERM to the head stops
  both.
usage: vhost_filter.py FILTER QSDCTL
"""
import os
import re
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time

QSD = os.environ.get("QSD_BIN", "/usr/bin/qemu-storage-daemon")
FILTER, QSDCTL = sys.argv[1], sys.argv[2]
for tool in (QSD, shutil.which("qemu-img") or "/nonexistent"):
    if not os.path.exists(tool):
        print(f"SKIP: {tool} not installed")
        sys.exit(77)

T = tempfile.mkdtemp(prefix="qsd-vf.")
roots = os.environ.get("QSD_CSI_CTEST_ROOTS")
if roots:
    with open(roots, "a") as f:
        f.write(f"{os.getpid()} {T}\n")
PROCS = []

VERSION, REPLY, NEED_REPLY = 1, 4, 8
GET_FEATURES, SET_FEATURES, SET_OWNER, SET_MEM_TABLE = 1, 2, 3, 5
SET_LOG_BASE, SET_VRING_NUM, SET_VRING_ADDR, SET_VRING_BASE = 6, 8, 9, 10
SET_VRING_KICK, SET_VRING_CALL = 12, 13
GET_PROTOCOL_FEATURES, SET_PROTOCOL_FEATURES, GET_QUEUE_NUM = 15, 16, 17
SET_VRING_ENABLE, SET_BACKEND_REQ_FD, GET_CONFIG, SET_CONFIG = 18, 21, 24, 25
POSTCOPY_ADVISE, POSTCOPY_LISTEN, POSTCOPY_END = 28, 29, 30
GET_INFLIGHT_FD, SET_INFLIGHT_FD = 31, 32
GET_MAX_MEM_SLOTS, ADD_MEM_REG = 36, 37


def fail(msg):
    raise SystemExit(f"FAIL: {msg}")


def spawn(args, log):
    p = subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    PROCS.append(p)
    return p


def stop(p, sig=signal.SIGTERM):
    if p.poll() is None:
        p.send_signal(sig)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def listening(path):
    """path is a unix socket someone listens on (/proc/net/unix: the
    __SO_ACCEPTCON flag).  The file exists from bind(), before listen():
    a client connecting in between is refused, which a fast machine hits."""
    try:
        with open("/proc/net/unix") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 8 and parts[7] == path and int(parts[3], 16) & 0x10000:
                    return True
    except OSError:
        pass
    return False


def wait_sock(path, proc):
    for _ in range(200):
        if os.path.exists(path) and (not stat.S_ISSOCK(os.stat(path).st_mode) or listening(path)):
            return
        if proc.poll() is not None:
            fail(f"{proc.args[0]} exited before {path} appeared")
        time.sleep(0.025)
    fail(f"{path} did not appear within 5 s")


def qsd_child(head, log):
    """The head's one child (its QSD), waited for up to 5 s."""
    for _ in range(100):
        kids = open(f"/proc/{head.pid}/task/{head.pid}/children").read().split()
        if len(kids) == 1:
            return int(kids[0])
        if head.poll() is not None:
            break
        time.sleep(0.05)
    fail(f"the head (exit {head.poll()}) has no QSD child: {open(log).read()[-2000:]}")


def qsd_argv(name, queues=2):
    return [QSD,
            "--blockdev", f"driver=file,node-name=f,filename={T}/{name}.raw,cache.direct=on",
            "--blockdev", "driver=raw,node-name=n,file=f",
            "--export", f"type=vhost-user-blk,id=e,node-name=n,addr.type=unix,"
                        f"addr.path={T}/{name}.qsd,num-queues={queues},writable=on"]


def qsdctl(*args, want=0):
    r = subprocess.run([QSDCTL, *args], capture_output=True, text=True, timeout=60)
    if r.returncode != want:
        fail(f"qsdctl {' '.join(args)}: exit {r.returncode}, want {want}: {r.stderr}")
    return r


# ---- the hostile client ------------------------------------------------------

class Client:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(5)
        self.s.connect(path)

    def send(self, req, payload=b"", fds=(), flags=VERSION):
        hdr = struct.pack("<III", req, flags, len(payload))
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))] \
            if fds else []
        try:
            self.s.sendmsg([hdr + payload], anc)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def recv_exact(self, n):
        b = b""
        while len(b) < n:
            c = self.s.recv(n - len(b))
            if not c:
                return None
            b += c
        return b

    def call(self, req, payload=b"", fds=()):
        self.send(req, payload, fds)
        h = self.recv_exact(12)
        if h is None:
            fail(f"request {req}: connection closed")
        r, fl, sz = struct.unpack("<III", h)
        if r != req or not fl & REPLY:
            fail(f"request {req}: odd reply {r} flags {fl}")
        return self.recv_exact(sz)

    def u64(self, req):
        return struct.unpack("<Q", self.call(req))[0]

    def cut_off(self, timeout=3.0):
        """True when the other end closed (the filter refused)."""
        self.s.settimeout(timeout)
        try:
            while True:
                b = self.s.recv(4096)
                if not b:
                    return True
        except socket.timeout:
            return False
        except ConnectionResetError:
            return True

    def close(self):
        self.s.close()


def memfd(size):
    fd = os.memfd_create("guest")
    os.ftruncate(fd, size)
    return fd


def region(gpa, size, uva, off=0):
    return struct.pack("<QQQQ", gpa, size, uva, off)


def mem_table(regions, nregions=None):
    n = len(regions) if nregions is None else nregions
    return struct.pack("<II", n, 0) + b"".join(regions)


def handshake(c):
    """What QEMU's vhost-user-blk sends first; returns (features, protocol)."""
    feat = c.u64(GET_FEATURES)
    proto = c.u64(GET_PROTOCOL_FEATURES)
    c.send(SET_PROTOCOL_FEATURES, struct.pack("<Q", proto))
    c.send(SET_OWNER)
    c.send(SET_FEATURES, struct.pack("<Q", feat))
    return feat, proto


def attack_logged(sock, log, name, steps, why):
    """An attack in a fresh second of the log's rate limit: its refusal
    must be logged with its reason."""
    time.sleep(1.1)
    attack(sock, name, steps)
    for _ in range(20):
        if why in open(log).read():
            return
        time.sleep(0.05)
    fail(f"'{name}': no refusal logged saying '{why}'")


def attack(sock, name, steps, must_cut=True, timeout=3.0):
    c = Client(sock)
    fds = []
    try:
        steps(c, fds)
        cut = c.cut_off(timeout)
    finally:
        c.close()
        for fd in fds:
            os.close(fd)
    if must_cut and not cut:
        fail(f"attack '{name}' was not refused")
    print(f"ok: {name}: refused")


def main():
    subprocess.run(["qemu-img", "create", "-q", "-f", "raw", f"{T}/a.raw", "64M"], check=True)
    qsd = spawn(qsd_argv("a"), f"{T}/qsd.log")
    wait_sock(f"{T}/a.qsd", qsd)
    flt = spawn([FILTER, "--export", f"{T}/a.sock={T}/a.qsd", "--queues", "2"],
                f"{T}/filter.log")
    wait_sock(f"{T}/a.sock", flt)
    sock = f"{T}/a.sock"

    # good clients: write through the filter, check through it and directly
    qsdctl("verify", "--write", "--seed", "7", "--queues", "2", sock)
    qsdctl("verify", "--check", "--seed", "7", "--queues", "1", sock)
    qsdctl("verify", "--check", "--seed", "7", f"{T}/a.qsd")
    print("ok: data written through the filter reads back directly and through it")

    # the offer is masked
    c = Client(sock)
    feat, proto = c.u64(GET_FEATURES), c.u64(GET_PROTOCOL_FEATURES)
    c.close()
    d = Client(f"{T}/a.qsd")
    dfeat, dproto = d.u64(GET_FEATURES), d.u64(GET_PROTOCOL_FEATURES)
    d.close()
    if not dfeat & (1 << 26) or not dproto & (1 << 1):
        fail(f"the QSD itself offers no LOG_ALL/LOG_SHMFD (0x{dfeat:x} 0x{dproto:x})?")
    if feat & (1 << 26) or feat & ~dfeat:
        fail(f"features through the filter 0x{feat:x} (QSD 0x{dfeat:x})")
    for bit in (1, 8, 10, 11, 12, 13, 16, 18, 19):
        if proto & (1 << bit):
            fail(f"protocol feature {bit} passed: 0x{proto:x}")
    if not proto & (1 << 9) or not feat & (1 << 30):
        fail(f"CONFIG / PROTOCOL_FEATURES lost: 0x{feat:x} 0x{proto:x}")
    print(f"ok: offer masked: features 0x{dfeat:x} -> 0x{feat:x}, "
          f"protocol 0x{dproto:x} -> 0x{proto:x}")

    ev = lambda fds: fds.append(os.eventfd(0)) or fds[-1]  # noqa: E731
    mf = lambda fds, size=1 << 20: fds.append(memfd(size)) or fds[-1]  # noqa: E731

    def vring_num(c, fds):
        handshake(c)
        c.send(SET_VRING_NUM, struct.pack("<II", 5, 128))
    attack_logged(sock, f"{T}/filter.log", "SET_VRING_NUM queue 5 of 2", vring_num,
                  "SET_VRING_NUM: queue index 5, the export has 2")

    def vring_base(c, fds):
        c.send(SET_VRING_BASE, struct.pack("<II", 200, 0))
    attack(sock, "SET_VRING_BASE queue 200", vring_base)

    def vring_kick(c, fds):
        c.send(SET_VRING_KICK, struct.pack("<Q", 2), [ev(fds)])
    attack(sock, "SET_VRING_KICK queue 2 of 2", vring_kick)

    def vring_num_big(c, fds):
        c.send(SET_VRING_NUM, struct.pack("<II", 0, 4096))
    attack(sock, "SET_VRING_NUM 4096 entries", vring_num_big)

    def inflight_set(c, fds):
        handshake(c)
        c.send(SET_INFLIGHT_FD, struct.pack("<QQHH", 1 << 20, 0, 64, 1024) + b"\0" * 4,
               [mf(fds)])
    attack(sock, "SET_INFLIGHT_FD with 64 queues", inflight_set)

    def inflight_get(c, fds):
        c.send(GET_INFLIGHT_FD, struct.pack("<QQHH", 0, 0, 0xffff, 0x8000) + b"\0" * 4)
    attack(sock, "GET_INFLIGHT_FD 64 GiB", inflight_get)

    for req, name in ((POSTCOPY_ADVISE, "ADVISE"), (POSTCOPY_LISTEN, "LISTEN"),
                      (POSTCOPY_END, "END")):
        attack(sock, f"POSTCOPY_{name}", lambda c, fds, req=req: c.send(req))

    def log_base(c, fds):
        c.send(SET_LOG_BASE, struct.pack("<QQ", 4096, 0), [mf(fds)])
    attack(sock, "SET_LOG_BASE", log_base)

    for n in (0, 9, 255, 0xffffffff):
        def table(c, fds, n=n):
            c.send(SET_MEM_TABLE, mem_table([region(0, 1 << 20, 0x7f0000000000)], n),
                   [mf(fds)])
        attack(sock, f"SET_MEM_TABLE of {n} regions", table)

    def table_zero(c, fds):
        c.send(SET_MEM_TABLE, mem_table([region(0, 0, 0x7f0000000000)]), [mf(fds)])
    attack(sock, "SET_MEM_TABLE region of size 0", table_zero)

    def table_wrap(c, fds):
        c.send(SET_MEM_TABLE, mem_table([region(0xfffffffffff00000, 1 << 21, 0x1000)]),
               [mf(fds)])
    attack(sock, "SET_MEM_TABLE gpa+size wraps", table_wrap)

    def table_adjacent(c, fds):
        c.send(SET_MEM_TABLE, mem_table([region(0, 1 << 20, 0x7f0000000000),
                                         region(1 << 20, 1 << 20, 0x7f1000000000)]),
               [mf(fds), mf(fds)])
    attack_logged(sock, f"{T}/filter.log", "SET_MEM_TABLE adjacent regions (straddling descriptors)",
                  table_adjacent, "adjacent in guest-physical space")

    def table_overlap(c, fds):
        c.send(SET_MEM_TABLE, mem_table([region(0, 1 << 21, 0x7f0000000000),
                                         region(1 << 20, 1 << 20, 0x7f1000000000)]),
               [mf(fds), mf(fds)])
    attack(sock, "SET_MEM_TABLE overlapping regions", table_overlap)

    def table_fds(c, fds):
        c.send(SET_MEM_TABLE, mem_table([region(0, 1 << 20, 0x7f0000000000)]),
               [mf(fds), mf(fds)])
    attack(sock, "SET_MEM_TABLE 2 descriptors for 1 region", table_fds)

    def table_pipe(c, fds):
        r, w = os.pipe()
        fds += [r, w]
        c.send(SET_MEM_TABLE, mem_table([region(0, 1 << 20, 0x7f0000000000)]), [r])
    attack_logged(sock, f"{T}/filter.log", "SET_MEM_TABLE with a pipe for memory", table_pipe,
                  "memory descriptor 0 is not a regular file")

    def ring_past(c, fds):
        handshake(c)
        c.send(SET_MEM_TABLE, mem_table([region(0, 1 << 20, 0x7f0000000000)]), [mf(fds)])
        c.send(SET_VRING_NUM, struct.pack("<II", 0, 1024))
        end = 0x7f0000000000 + (1 << 20)
        c.send(SET_VRING_ADDR, struct.pack("<IIQQQQ", 0, 0, end - 4096, end - 65536,
                                           end - 8192, 0))
    attack(sock, "SET_VRING_ADDR descriptor table past its region", ring_past)

    def extra_fd(c, fds):
        c.send(SET_OWNER, b"", [ev(fds)])
    attack(sock, "SET_OWNER with a descriptor", extra_fd)

    def too_many_fds(c, fds):
        c.send(SET_MEM_TABLE, mem_table([region(0, 1 << 20, 0x7f0000000000)]),
               [mf(fds) for _ in range(12)])
    attack(sock, "12 descriptors", too_many_fds)

    def huge(c, fds):
        c.s.sendall(struct.pack("<III", SET_MEM_TABLE, VERSION, 1 << 30))
    attack(sock, "a message of 1 GiB", huge)

    def bad_features(c, fds):
        c.u64(GET_FEATURES)
        c.send(SET_FEATURES, struct.pack("<Q", 1 << 26 | 1 << 32))
    attack(sock, "SET_FEATURES with LOG_ALL", bad_features)

    def bad_proto(c, fds):
        c.u64(GET_FEATURES)
        c.u64(GET_PROTOCOL_FEATURES)
        c.send(SET_PROTOCOL_FEATURES, struct.pack("<Q", 1 << 8 | 1 << 12))
    attack(sock, "SET_PROTOCOL_FEATURES with PAGEFAULT and INFLIGHT_SHMFD", bad_proto)

    def set_config(c, fds):
        c.send(SET_CONFIG, struct.pack("<III", 0, 8, 0) + struct.pack("<Q", 1 << 40))
    attack(sock, "SET_CONFIG of the capacity", set_config)

    def get_config(c, fds):
        c.send(GET_CONFIG, struct.pack("<III", 0, 200, 0) + b"\0" * 200)
    attack(sock, "GET_CONFIG past virtio_blk_config", get_config)

    def unknown(c, fds):
        c.send(99, b"\0" * 8)
    attack(sock, "request 99", unknown)

    def slow(c, fds):
        c.s.sendall(struct.pack("<III", GET_CONFIG, VERSION, 20)[:8])
    t0 = time.monotonic()
    attack(sock, "a half message (cut after the 5 s message bound)", slow, timeout=8)
    if time.monotonic() - t0 > 7:
        fail("the half message was not cut within the bound")

    if qsd.poll() is not None:
        fail(f"the QSD died: {qsd.returncode}")
    qsdctl("verify", "--check", "--seed", "7", "--queues", "2", sock)
    print("ok: the QSD is alive and serves the next good client")

    # log flood: 60 refused connections in a burst
    n0 = open(f"{T}/filter.log").read().count("msg=refused")
    t0 = time.monotonic()
    for _ in range(60):
        c = Client(sock)
        c.send(POSTCOPY_ADVISE)
        c.cut_off()
        c.close()
    secs = time.monotonic() - t0
    qsdctl("verify", "--check", "--seed", "7", sock)
    stop(flt)
    log = open(f"{T}/filter.log").read()
    lines = log.count("msg=refused") - n0
    m = re.search(r"msg=exiting .*refused=(\d+) log_suppressed=(\d+)", log)
    if not m:
        fail(f"no final line: {log[-500:]}")
    if lines > 5 * (secs + 2) or int(m.group(2)) == 0:
        fail(f"{lines} refusal lines in {secs:.1f} s, suppressed {m.group(2)}")
    print(f"ok: 60 refusals in {secs:.1f} s logged {lines} lines, counted "
          f"{m.group(1)} refusals, {m.group(2)} lines suppressed")
    if flt.returncode != 0:
        fail(f"filter exit {flt.returncode} on SIGTERM")
    stop(qsd)

    # head mode: the pair lives and dies as one
    head = spawn([FILTER, "--export", f"{T}/h.sock={T}/a.qsd", "--queues", "2", "--",
                  *qsd_argv("a")], f"{T}/head.log")
    wait_sock(f"{T}/a.qsd", head)
    wait_sock(f"{T}/h.sock", head)
    qsdctl("verify", "--check", "--seed", "7", f"{T}/h.sock")
    os.kill(qsd_child(head, f"{T}/head.log"), signal.SIGKILL)
    try:
        rc = head.wait(10)
    except subprocess.TimeoutExpired:
        fail("the head did not exit after its QSD was killed")
    if rc != 137 or os.path.exists(f"{T}/h.sock"):
        fail(f"head exit {rc} (want 137), socket left: {os.path.exists(f'{T}/h.sock')}")
    print("ok: kill -9 of the QSD ends the head with 137")

    head = spawn([FILTER, "--export", f"{T}/h.sock={T}/a.qsd", "--queues", "2", "--",
                  *qsd_argv("a")], f"{T}/head2.log")
    wait_sock(f"{T}/h.sock", head)
    wait_sock(f"{T}/a.qsd", head)
    kid = qsd_child(head, f"{T}/head2.log")
    head.send_signal(signal.SIGTERM)
    try:
        rc = head.wait(15)
    except subprocess.TimeoutExpired:
        fail("the head did not stop on SIGTERM")
    if os.path.exists(f"/proc/{kid}"):
        fail("the QSD outlived its head")
    print(f"ok: SIGTERM to the head stops the QSD too (exit {rc})")

    # a QSD that ignores SIGTERM is killed after the head's 10 s bound; the
    # head's command line is left as given (read by whoever adopts it)
    ign = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
           f"open('{T}/ign.ready', 'w').close(); time.sleep(60)")
    head = spawn([FILTER, "--export", f"{T}/i.sock={T}/none.qsd", "--queues", "1", "--",
                  sys.executable, "-c", ign], f"{T}/head5.log")
    kid = qsd_child(head, f"{T}/head5.log")
    wait_sock(f"{T}/ign.ready", head)
    # its QSD never listens: the pod-facing socket must not appear either
    # (the plugin's readiness probe would take it for a serving unit)
    time.sleep(0.3)
    if os.path.exists(f"{T}/i.sock"):
        fail("the head listens for tenants although its QSD does not")
    print("ok: no pod-facing socket while the QSD's does not listen")
    if f"{T}/i.sock={T}/none.qsd".encode() not in open(f"/proc/{head.pid}/cmdline", "rb").read():
        fail("the head rewrote its command line")
    t0 = time.monotonic()
    head.send_signal(signal.SIGTERM)
    try:
        rc = head.wait(20)
    except subprocess.TimeoutExpired:
        fail("the head did not end its stubborn child within 20 s")
    secs = time.monotonic() - t0
    if rc != 137 or not 9 < secs < 15 or os.path.exists(f"/proc/{kid}"):
        fail(f"stubborn child: head exit {rc} after {secs:.1f} s")
    print(f"ok: a QSD ignoring SIGTERM is killed after {secs:.1f} s (exit {rc})")

    # the plugin's shape: it holds the listening socket (fd:N) across
    # restarts of the head; a tenant connecting while no head runs waits in
    # the backlog and is served by the next head
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(f"{T}/plugin.sock")
    lsock.listen(8)
    fd = lsock.fileno()

    def run_head(log):
        p = subprocess.Popen([FILTER, "--export", f"fd:{fd}={T}/a.qsd", "--queues", "2", "--",
                              *qsd_argv("a")], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                             pass_fds=(fd,))
        PROCS.append(p)
        return p
    head = run_head(f"{T}/head3.log")
    wait_sock(f"{T}/a.qsd", head)
    qsdctl("verify", "--check", "--seed", "7", f"{T}/plugin.sock")
    os.kill(qsd_child(head, f"{T}/head3.log"), signal.SIGKILL)
    if head.wait(10) != 137:
        fail("head with fd:N did not exit 137")
    if not os.path.exists(f"{T}/plugin.sock"):
        fail("the head removed a socket it did not create")
    waiting = subprocess.Popen([QSDCTL, "verify", "--check", "--seed", "7", f"{T}/plugin.sock"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(0.5)
    head = run_head(f"{T}/head4.log")
    out, _ = waiting.communicate(timeout=60)
    if waiting.returncode != 0:
        fail(f"the tenant waiting across the head's restart failed: {out}")
    stop(head)
    lsock.close()
    print("ok: fd:N: a tenant waiting while the head restarts is served by the next head")
    print("PASS")


try:
    main()
finally:
    for p in PROCS:
        stop(p, signal.SIGKILL)
    shutil.rmtree(T, ignore_errors=True)
