#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 21: a tenant's own vhost-user client on its volume's socket, against
the real plugin and its QSDs (vuattack.py speaks the protocol).

One attack class per run (the ctest name security/vu_<attack>):
  vring_index        SET_VRING_NUM with a queue index past the export's
                     queues (a value written at a tenant-chosen heap offset)
  inflight_queues    SET_INFLIGHT_FD with more queues than the device has
                     (pointers written past the virtqueue array)
  indirect_straddle  an indirect descriptor table straddling two memory
                     regions (a write past a buffer on the QSD's stack)
  postcopy           POSTCOPY_ADVISE, never negotiated (a userfaultfd of
                     the QSD's address space handed to the tenant)
  inflight_alloc     GET_INFLIGHT_FD, never advertised (64 MiB per message
                     made resident in the QSD, the previous one leaked)
  mem_table          SET_MEM_TABLE with 255 and 2^32-1 regions
  leak               fds attached to messages that ignore them, and
                     inflight areas: what stays in the QSD after disconnect
  cross_tenant_oom   an attacker volume makes its QSD allocate in the QSDs'
                     cgroup (--qsd-cgroup, --qsd-memory-max 256M) while a
                     victim volume's QSD must never restart

Expected after every attack ("Done when" of issue 21):
- the attack fails: the tenant's connection is closed or its request
  refused (an ack != 0); nothing it asked for is granted (no fd of the
  QSD's, no allocation made for it);
- no memory corruption: no QSD of this test is killed by a signal the
  kernel reports (segfault, general protection fault, trap) and no glibc or
  stack-protector message ("stack smashing detected", "malloc(): ...",
  "corrupted ...") appears in a QSD's log;
- at worst the attacked volume's QSD restarts: within 15 s an honest
  client (vuattack.serves: set up a queue, read a sector) is served again
  through the tenant's target;
- nothing else on the node changes: the bystander volume's QSD has the same
  pid and restart count and serves; the plugin answers Probe (Sec.after);
- bounded residue: 3 s after the tenant disconnects, the attacked QSD (when
  it is the same process) holds at most 16 more fds and 24 MiB more RSS
  than after an honest client before the attack.

Each check that fails says what the attack got.  Every wait is bounded; a
run takes 10-40 s when things work.

usage: test_vhost_attacks.py PLUGIN_BINARY PROTO_DIR QSDCTL ATTACK
       (QSD_SEC_PLUGIN_ARGS: more plugin flags, e.g. "--vhost-filter PATH")
"""
import os
import re
import shlex
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seclib  # noqa: E402
from seclib import csilib  # noqa: E402
import vuattack as vu  # noqa: E402
from seclib import MiB  # noqa: E402

ATTACKER = "pvc-tenant"
BYSTANDER = "pvc-bystander"
RESTART_BOUND = 15.0     # s: the attacked QSD serves again (restarted or not)
FD_SLACK = 16
RSS_SLACK = 24 * MiB
CORRUPTION = ("stack smashing", "malloc()", "malloc_consolidate", "free()", "corrupted",
              "double free", "Segmentation fault", "Aborted", "Assertion")
KERNEL = ("segfault at", "general protection", "traps:", "trap ")
CGROUP = "/qsd-sec-vu-%d" % os.getpid()
OOM_LIMIT = "256M"


# ------------------------------------------------------------------ helpers
class Vol:
    """A volume staged and published for a pod; its socket reached through
    an O_PATH fd of its target (kubelet paths are longer than a unix socket
    address allows)."""

    def __init__(self, s, vid, pod):
        self.s, self.vid = s, vid
        s.create(vid, 16 * MiB)
        s.stage(vid)
        self.tgt = s.publish(vid, pod)
        self.dfd = os.open(self.tgt, os.O_PATH | os.O_DIRECTORY)
        self.sock = "/proc/self/fd/%d/vhost.sock" % self.dfd

    def pid(self):
        """The volume's QSD process: as recorded (RUN/ctl/<vol>/qsd.json), else
        the live process whose command line names the volume's monitor
        socket; when that is not a QSD (a filter head in front of its QSD
        child), its qemu-storage-daemon child."""
        pid = self.s.env.qsd_pids().get(self.vid)
        if not (pid and vu.proc_alive(pid)):
            found = [p for p, v in self.s.env.running_qsds().items() if v == self.vid]
            pid = found[0] if found else pid
        if pid and not comm(pid).startswith("qemu-storage"):
            kids = [k for k in children(pid) if comm(k).startswith("qemu-storage")]
            pid = kids[0] if kids else pid
        return pid

    def restarts(self):
        """(pid, restarts) as NodeGetVolumeStats reports them, or None."""
        try:
            r = self.s.c.NodeGetVolumeStats(self.s.pb.NodeGetVolumeStatsRequest(
                volume_id=self.vid, volume_path=self.s.staging(self.vid)), timeout=5)
        except Exception:  # noqa: BLE001
            return None
        m = re.search(r"pid (\d+) \(restarts: (\d+)\)", r.volume_condition.message)
        return (int(m.group(1)), int(m.group(2))) if m else None

    def log_size(self):
        try:
            return os.path.getsize(self.log_path())
        except OSError:
            return 0

    def log_path(self):
        return os.path.join(self.s.run, "ctl", self.vid, "qsd.log")

    def log_since(self, off):
        try:
            with open(self.log_path(), "rb") as f:
                f.seek(off if off <= os.path.getsize(self.log_path()) else 0)
                return f.read(1 << 20).decode(errors="replace")
        except OSError:
            return ""


def comm(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return ""


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


def dmesg():
    try:
        return subprocess.run(["dmesg"], capture_output=True, text=True,
                              timeout=10).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return []


def dmesg_stamp(line):
    """The kernel's timestamp of a dmesg line ("[  123.456789] ..."), or 0."""
    m = re.match(r"\[\s*(\d+\.\d+)\]", line)
    return float(m.group(1)) if m else 0.0


def dmesg_now():
    """The timestamp of the newest kernel message (the ring buffer drops old
    lines: counting lines does not mark a place in it)."""
    lines = dmesg()
    return dmesg_stamp(lines[-1]) if lines else 0.0


def dmesg_after(stamp):
    return [ln for ln in dmesg() if dmesg_stamp(ln) > stamp]


class Watch:
    """What an attack did to the node: QSD deaths by signal (the kernel's
    messages naming a QSD pid of this test), corruption messages in the QSDs'
    logs, the bystander's QSD, the attacked QSD's fds and RSS."""

    def __init__(self, s, att, by):
        self.s, self.att, self.by = s, att, by
        ok, why = vu.serves_within(att.sock, 5)
        assert ok, "setup: the tenant's volume does not serve an honest client: %s" % why
        ok, why = vu.serves_within(by.sock, 5)
        assert ok, "setup: the bystander volume does not serve: %s" % why
        time.sleep(0.3)
        self.pids = {v.vid: v.pid() for v in (att, by)}
        for vid, pid in self.pids.items():
            assert pid and vu.proc_alive(pid), "setup: cannot find the QSD of %s (neither " \
                "RUN/ctl/<vol>/qsd.json nor a process naming RUN/ctl/<vol>/): adapt " \
                "Vol.pid() to where the plugin keeps it" % vid
        self.by_stats = by.restarts()
        self.fds = vu.proc_fds(self.pids[att.vid])
        self.rss = vu.proc_rss(self.pids[att.vid])
        self.dmesg0 = dmesg_now()
        self.logs0 = {v.vid: v.log_size() for v in (att, by)}
        self.known = set(self.pids.values())

    def rebase(self):
        """Judge the next attack on its own: kernel and log messages from
        here on."""
        self.dmesg0 = dmesg_now()
        self.logs0 = {v.vid: v.log_size() for v in (self.att, self.by)}

    def track(self):
        """Remember the QSD pids seen now (restarted ones too)."""
        self.known |= set(p for p in self.s.env.qsd_pids().values() if p)
        self.known |= set(p for p in (self.att.pid(), self.by.pid()) if p)

    def kernel_reports(self):
        out = []
        for line in dmesg_after(self.dmesg0):
            if any(k in line for k in KERNEL) and any(
                    "[%d]" % p in line for p in self.known if p):
                out.append(line.split("]", 1)[-1].strip()[:160])
        return out

    def log_reports(self, v):
        return [ln.strip()[:160] for ln in v.log_since(self.logs0[v.vid]).splitlines()
                if any(m in ln for m in CORRUPTION)]

    def finish(self, attack, residue=True, bound=RESTART_BOUND):
        """The checks after an attack whose connections are closed."""
        s, att, by = self.s, self.att, self.by
        self.track()
        ok, why = vu.serves_within(att.sock, bound)
        self.track()
        s.check(ok, "%s: the attacked volume's QSD does not serve an honest client within "
                "%.0f s afterwards: %s" % (attack, bound, why))
        rep = self.kernel_reports()
        s.check(not rep, "%s: memory corruption: the kernel reports a QSD killed by a fault: "
                "%s" % (attack, " | ".join(rep[:3])))
        for v in (att, by):
            rep = self.log_reports(v)
            s.check(not rep, "%s: memory corruption: %s's QSD log says: %s" % (
                attack, v.vid, " | ".join(rep[:3])))
        now = att.pid()
        if now != self.pids[att.vid]:
            print("       (the attacked volume's QSD was restarted: pid %s -> %s)" % (
                self.pids[att.vid], now))
        elif residue:
            time.sleep(3)
            fds, rss = vu.proc_fds(now), vu.proc_rss(now)
            print("       attacked QSD after disconnect: fds %d -> %d, RSS %d -> %d MiB" % (
                self.fds, fds, self.rss >> 20, rss >> 20))
            s.check(fds <= self.fds + FD_SLACK, "%s: the attacked QSD holds %d fds 3 s after "
                    "the tenant disconnected, %d before the attack (allowed +%d)" % (
                        attack, fds, self.fds, FD_SLACK))
            s.check(rss <= self.rss + RSS_SLACK, "%s: the attacked QSD's RSS is %d MiB 3 s "
                    "after the tenant disconnected, %d MiB before (allowed +%d MiB)" % (
                        attack, rss >> 20, self.rss >> 20, RSS_SLACK >> 20))
        self.check_bystander(attack)
        s.after(attack)

    def check_bystander(self, attack):
        s, by = self.s, self.by
        pid = by.pid()
        s.check(pid == self.pids[by.vid], "%s: the bystander volume's QSD changed: pid %s -> "
                "%s" % (attack, self.pids[by.vid], pid))
        st = by.restarts()
        if self.by_stats and st:
            s.check(st[1] == self.by_stats[1], "%s: the bystander volume's QSD was restarted "
                    "%d time(s)" % (attack, st[1] - self.by_stats[1]))
        ok, why = vu.serves_within(by.sock, 5)
        s.check(ok, "%s: the bystander volume no longer serves: %s" % (attack, why))


def report(attack, what):
    print("attack %-58s -> %s" % (attack, what))


def refused(ack):
    """An ack says the request was refused (the connection may stay)."""
    return ack is not None and ack != 0


def ack_of(c, req, payload, fds=()):
    """(ack or None, text): the request sent with NEED_REPLY; None when the
    connection was closed instead (or no answer within the bound)."""
    try:
        rp, _ = c.call(req, payload, fds, ack=True)
        a = struct.unpack("<Q", rp[:8])[0] if len(rp) >= 8 else -1
        return a, "ack %d" % a
    except (vu.Closed, vu.Timeout) as e:
        return None, "%s: %s" % (type(e).__name__, e)


def connect(v):
    c = vu.Conn(v.sock, timeout=3)
    c.negotiate()
    return c


# ------------------------------------------------------------------ attacks
def a_vring_index(s, w):
    att = w.att
    with connect(att) as c:
        nq = c.queue_num()
        for idx in (nq, nq + 3, 0x00ffffff):
            a, how = ack_of(c, vu.SET_VRING_NUM, struct.pack("<II", idx, 0x41414141))
            report("SET_VRING_NUM index %#x (the export has %d queue(s))" % (idx, nq), how)
            if a is None:
                break
            s.check(refused(a), "vring_index: SET_VRING_NUM with queue index %#x (the export "
                    "has %d) was accepted (ack 0): the QSD wrote 0x41414141 at vq[%#x]" % (
                        idx, nq, idx))
    w.finish("vring_index")


def a_inflight_queues(s, w):
    nq, qs = 64, 16
    size = (16 * qs + 2 + 63) // 64 * 64 * nq
    fd = os.memfd_create("inflight", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    try:
        with connect(w.att) as c:
            a, how = ack_of(c, vu.SET_INFLIGHT_FD, struct.pack("<QQHHxxxx", size, 0, nq, qs),
                            [fd])
            report("SET_INFLIGHT_FD num_queues %d (export: %d)" % (nq, c.queue_num()
                                                                  if a is not None else 1),
                   how)
            s.check(not (a == 0), "inflight_queues: SET_INFLIGHT_FD with %d queues was "
                    "accepted (ack 0): the QSD wrote %d pointers past its virtqueue array" % (
                        nq, nq - 1))
    except (vu.Closed, vu.Timeout) as e:
        report("SET_INFLIGHT_FD", "%s: %s" % (type(e).__name__, e))
    finally:
        os.close(fd)
    w.finish("inflight_queues")


def a_indirect_straddle(s, w):
    first, rest = 1024, 256
    what = "an indirect table of %d bytes over two adjacent regions" % (first + rest)
    try:
        with connect(w.att) as c:
            a = vu.Memory(1 << 20, "regionA")
            b = vu.Memory(1 << 20, "regionB")
            ga, gb = 0x100000000, 0x100000000 + (1 << 20)
            regions = [struct.pack("<QQQQ", ga, a.size, a.base, 0),
                       struct.pack("<QQQQ", gb, b.size, b.base, 0)]
            ack, how = ack_of(c, vu.SET_MEM_TABLE, vu.mem_table(regions), [a.fd, b.fd])
            if ack != 0:
                report(what, "SET_MEM_TABLE with adjacent regions: %s" % how)
            else:
                q = vu.Queue(a, 0, 16)
                q.setup(c)
                table = a.size - first
                hdr, data, status = a.alloc(16), a.alloc(512, 512), a.alloc(1)
                a.write(hdr, struct.pack("<IIQ", vu.BLK_T_IN, 0, 0))
                a.write(status, b"\xff")
                chain = [(ga + hdr, 16, vu.DESC_F_NEXT, 1),
                         (ga + data, 512, vu.DESC_F_WRITE | vu.DESC_F_NEXT, 2),
                         (ga + status, 1, vu.DESC_F_WRITE, 0)]
                for i, (ad, n, f, nxt) in enumerate(chain):
                    a.write(table + 16 * i, struct.pack("<QIHH", ad, n, f, nxt))
                b.write(0, b"A" * rest)
                a.write(q.desc, struct.pack("<QIHH", ga + table, first + rest,
                                            vu.DESC_F_INDIRECT, 0))
                q.publish(0)
                done = q.wait_used(3)
                closed = c.closed_within(1)
                report(what, "completion: %s (status %d), connection closed: %s" % (
                    done, a.read(status, 1)[0], closed))
    except (vu.Closed, vu.Timeout) as e:
        report(what, "%s: %s" % (type(e).__name__, e))
    w.finish("indirect_straddle")


def a_postcopy(s, w):
    try:
        with connect(w.att) as c:
            c.send(vu.POSTCOPY_ADVISE, flags=vu.NEED_REPLY)
            _, _, payload, fds = c.recv()
            kinds = []
            for fd in fds:
                try:
                    kinds.append(os.readlink("/proc/self/fd/%d" % fd))
                except OSError:
                    kinds.append("?")
            report("POSTCOPY_ADVISE (PAGEFAULT not negotiated)", "answered: %d byte(s), fds %s" % (
                len(payload), kinds or "none"))
            s.check(not fds, "postcopy: POSTCOPY_ADVISE (never negotiated) handed the tenant "
                    "an fd of the QSD: %s (with it the tenant registers the QSD's memory and "
                    "answers its page faults: repro/repro_postcopy.py)" % ", ".join(kinds))
    except (vu.Closed, vu.Timeout) as e:
        report("POSTCOPY_ADVISE (PAGEFAULT not negotiated)", "%s: %s" % (type(e).__name__, e))
    w.finish("postcopy")


def inflight_get(c, nq=64, qs=65535):
    """One GET_INFLIGHT_FD: (mmap_size, fds) or raises Closed/Timeout."""
    rp, fds = c.call(vu.GET_INFLIGHT_FD, struct.pack("<QQHHxxxx", 0, 0, nq, qs))
    return (struct.unpack("<Q", rp[:8])[0] if len(rp) >= 8 else 0), fds


def a_inflight_alloc(s, w):
    pid = w.pids[w.att.vid]
    got = []
    try:
        with connect(w.att) as c:
            for i in range(3):
                size, fds = inflight_get(c)
                got.append(size)
                for fd in fds:
                    os.close(fd)
                    c.received_fds.remove(fd)
                report("GET_INFLIGHT_FD #%d: 64 queues of 65535 (not advertised)" % (i + 1),
                       "mmap_size %d MiB, %d fd; QSD RSS %d MiB" % (
                           size >> 20, len(fds), vu.proc_rss(pid) >> 20))
                if not size:
                    break
    except (vu.Closed, vu.Timeout) as e:
        report("GET_INFLIGHT_FD", "%s: %s" % (type(e).__name__, e))
    s.check(not any(got), "inflight_alloc: GET_INFLIGHT_FD (never advertised) made the QSD "
            "allocate %s MiB for the tenant" % "+".join(str(g >> 20) for g in got if g))
    w.finish("inflight_alloc")


def a_mem_table(s, w):
    for n in (255, 0xffffffff):
        what = "SET_MEM_TABLE nregions=%d, 1 region and 1 fd sent" % n
        try:
            with connect(w.att) as c:
                m = vu.Memory(1 << 20)
                a, how = ack_of(c, vu.SET_MEM_TABLE, vu.mem_table([m.region()], nregions=n),
                                [m.fd])
                report(what, how)
                s.check(a is None or refused(a), "mem_table: %s was accepted (ack 0)" % what)
        except (vu.Closed, vu.Timeout, OSError) as e:
            report(what, "%s: %s" % (type(e).__name__, e))
        w.finish("mem_table %d" % n, residue=False)
        w.track()
        w.rebase()


def a_leak(s, w):
    n_msgs = 50
    pid = w.pids[w.att.vid]
    sent = 0
    memfds = [os.memfd_create("leak%d" % i, os.MFD_CLOEXEC) for i in range(8)]
    try:
        with connect(w.att) as c:
            for i in range(n_msgs):
                c.send(vu.GET_FEATURES, fds=memfds)
                c.recv()
                sent += len(memfds)
            for i in range(3):
                size, fds = inflight_get(c, 16, 65535)
                for fd in fds:
                    os.close(fd)
                    c.received_fds.remove(fd)
            report("%d GET_FEATURES with 8 fds each, 3 GET_INFLIGHT_FD of 16 MiB" % n_msgs,
                   "QSD fds %d -> %d, RSS %d -> %d MiB while connected" % (
                       w.fds, vu.proc_fds(pid), w.rss >> 20, vu.proc_rss(pid) >> 20))
    except (vu.Closed, vu.Timeout) as e:
        report("fds on messages that ignore them", "%s: %s (after %d fds)" % (
            type(e).__name__, e, sent))
    finally:
        for fd in memfds:
            os.close(fd)
    w.finish("leak")


def a_cross_tenant_oom(s, w):
    """The attacker makes its QSD allocate 16 MiB at a time and keeps the
    inflight fds it receives: the memory stays charged where the QSD made it
    resident, also after that QSD dies.  It reconnects after each closure
    (its QSD killed by the OOM killer and restarted) until it holds (nearly)
    the QSDs' whole limit, then goes on 1 MiB at a time for 8 s.  Meanwhile
    the victim volume serves reads."""
    held = []
    victim_pids = {w.by.pid()}
    t0 = time.monotonic()
    total, conns = 0, 0
    chunk, small_kills = 16, 0   # MiB per message; 16, then 4, then 1 once killed
    try:
        while time.monotonic() - t0 < 20 and small_kills < 2:
            size = 0
            try:
                conns += 1
                with connect(w.att) as c:
                    while time.monotonic() - t0 < 20:
                        size, fds = inflight_get(c, chunk, 65535)
                        if not size or not fds:
                            break
                        total += size
                        held.extend(fds)
                        c.received_fds = [f for f in c.received_fds if f not in fds]
                if not size:
                    break
            except (vu.Closed, vu.Timeout, OSError):
                # its QSD was killed (the cgroup is full): finer steps
                if chunk == 1:
                    small_kills += 1
                chunk = max(1, chunk // 4)
                time.sleep(0.2)
            victim_pids.add(w.by.pid())
            vu.serves(w.by.sock, 2)
            w.track()
        # The cgroup is full of memory the tenant holds.  It goes on asking
        # 1 MiB at a time: each time its restarted QSD is killed, and a
        # starting QSD needs memory too; the OOM killer takes the largest
        # process of the cgroup.  The victim works meanwhile.
        end = time.monotonic() + 8
        restarts = 0
        while time.monotonic() < end:
            try:
                with connect(w.att) as c:
                    while time.monotonic() < end:
                        size, fds = inflight_get(c, 1, 65535)
                        if not size or not fds:
                            break
                        total += size
                        held.extend(fds)
                        c.received_fds = [f for f in c.received_fds if f not in fds]
            except (vu.Closed, vu.Timeout, OSError):
                restarts += 1
            vu.serves(w.by.sock, 2)
            victim_pids.add(w.by.pid())
            w.track()
            time.sleep(0.3)
        victim_pids.discard(None)
        report("GET_INFLIGHT_FD 16 MiB at a time, fds kept (QSDs' limit %s)" % OOM_LIMIT,
               "%d MiB held by the tenant after %d connection(s), then %d more closed, in %.0f "
               "s; victim QSD pids seen %s" % (
                   total >> 20, conns, restarts, time.monotonic() - t0, sorted(victim_pids)))
        s.check(len(victim_pids) <= 1, "cross_tenant_oom: the victim volume's QSD was killed "
                "and replaced while the tenant allocated: pids %s" % sorted(victim_pids))
        w.check_bystander("cross_tenant_oom (while the tenant holds the memory)")
    finally:
        for fd in held:
            os.close(fd)
    # A QSD killed over and over in its own cgroup is retried after the
    # plugin's crash-loop pause (30 s): allowed for the attacker's volume.
    w.finish("cross_tenant_oom", residue=False, bound=40)


ATTACKS = {"vring_index": a_vring_index, "inflight_queues": a_inflight_queues,
           "indirect_straddle": a_indirect_straddle, "postcopy": a_postcopy,
           "inflight_alloc": a_inflight_alloc, "mem_table": a_mem_table, "leak": a_leak,
           "cross_tenant_oom": a_cross_tenant_oom}


def main():
    if len(sys.argv) < 5 or sys.argv[4] not in ATTACKS:
        print("usage: %s PLUGIN_BINARY PROTO_DIR QSDCTL {%s}" % (sys.argv[0],
                                                               ",".join(ATTACKS)))
        return 2
    attack = sys.argv.pop(4)
    extra = ["--qsd-cgroup", CGROUP, "--qsd-memory-max", OOM_LIMIT] \
        if attack == "cross_tenant_oom" else []
    # flags the plugin needs for its tenant boundary (e.g. --vhost-filter PATH)
    extra += shlex.split(os.environ.get("QSD_SEC_PLUGIN_ARGS", ""))

    def body(s):
        t0 = time.monotonic()
        att = Vol(s, ATTACKER, "tenant-pod")
        by = Vol(s, BYSTANDER, "bystander-pod")
        w = Watch(s, att, by)
        ATTACKS[attack](s, w)
        print("       (%s: %.1f s)" % (attack, time.monotonic() - t0))
        for v in (att, by):
            os.close(v.dfd)
            s.unpublish(v.vid, v.tgt)
            s.unstage(v.vid)

    try:
        return seclib.run_test(body, "qsd-sec-vu-", extra)
    finally:
        if attack == "cross_tenant_oom":
            csilib.remove_cgroup(CGROUP)


if __name__ == "__main__":
    sys.exit(main())
