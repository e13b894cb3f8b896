#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Re-test the project's QEMU 10.0.2 workarounds against a given QSD.

An investigation tool, not part of the test suite: it starts bare QSDs (no
plugin, no filter) on files in a temporary directory, drives them with
qsdctl's vhost-user client (bench, verify, vhost-info) and QMP, prints one
line per check and stops every process it started.  Results for QEMU 10.0.2
and 11.1.3 are in docs/qemu-11.md.

  scripts/qemu-retest.py --qsd "$(scripts/trixie-root.sh)" drain resize-noclient ...
  scripts/qemu-retest.py drain            # the host's QSD (PATH)

Checks: drain resize-noclient wce kill9 serial aio aio-iops blockstats close.
"""
import argparse
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time

A = None
TMP = None


def psi():
    with open("/proc/pressure/cpu") as f:
        return f.readline().split()[1]


def out(check, msg):
    print("%-16s %s  (cpu %s)" % (check, msg, psi()), flush=True)


class Qmp:
    def __init__(self, path, timeout=5.0):
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.s = socket.socket(socket.AF_UNIX)
                self.s.settimeout(timeout)
                self.s.connect(path)
                break
            except OSError:
                self.s.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.buf = b""
        self.read()
        self.cmd("qmp_capabilities")

    def read(self):
        while b"\n" not in self.buf:
            d = self.s.recv(65536)
            if not d:
                raise EOFError("QMP closed")
            self.buf += d
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def cmd(self, name, timeout=5.0, **args):
        self.s.settimeout(timeout)
        self.s.sendall(json.dumps({"execute": name, "arguments": args}).encode() + b"\n")
        while True:
            r = self.read()
            if "return" in r or "error" in r:
                return r

    def close(self):
        self.s.close()


class Qsd:
    """One QSD: file node, format node 'disk', optional iothread, QMP, export."""

    def __init__(self, name, image, fmt="raw", aio="io_uring", iothread=False,
                 writethrough=False, strace=None):
        self.dir = os.path.join(TMP, name)
        os.makedirs(self.dir, exist_ok=True)
        self.sock = os.path.join(self.dir, "vhost.sock")
        self.qmp_path = os.path.join(self.dir, "qmp.sock")
        for p in (self.sock, self.qmp_path):
            if os.path.exists(p):
                os.unlink(p)
        argv = shlex.split(A.qsd) + [
            "--blockdev", json.dumps({"driver": "file", "node-name": "file0", "filename": image,
                                      "cache": {"direct": True}, "aio": aio}),
            "--blockdev", json.dumps({"driver": fmt, "node-name": "disk", "file": "file0"})]
        if iothread:
            argv += ["--object", "iothread,id=iot0"]
        exp = {"type": "vhost-user-blk", "id": "exp0", "node-name": "disk",
               "addr": {"type": "unix", "path": self.sock}, "writable": True,
               "writethrough": writethrough}
        if iothread:
            exp["iothread"] = "iot0"
        argv += ["--chardev", "socket,id=qmp0,path=%s,server=on,wait=off" % self.qmp_path,
                 "--monitor", "chardev=qmp0", "--export", json.dumps(exp)]
        if strace:
            argv = ["strace", "-f", "-o", os.path.join(self.dir, "strace.txt")] + strace + argv
        self.log = open(os.path.join(self.dir, "qsd.log"), "w")
        self.p = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while not os.path.exists(self.sock):
            if self.p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("QSD did not start: " + open(self.log.name).read())
            time.sleep(0.05)
        self.qmp = Qmp(self.qmp_path)

    def pid(self):
        """The QSD's own PID (under strace: strace's child)."""
        if self.p.args[0] != "strace":
            return self.p.pid
        with open("/proc/%d/task/%d/children" % (self.p.pid, self.p.pid)) as f:
            kids = f.read().split()
        return int(kids[0]) if kids else self.p.pid

    def alive(self):
        return self.p.poll() is None

    def stop(self):
        try:
            self.qmp.close()
        except Exception:
            pass
        if self.p.poll() is None:
            # under strace, the QSD itself: strace leaves its tracee running
            os.kill(self.pid(), signal.SIGTERM)
            try:
                self.p.wait(5)
            except subprocess.TimeoutExpired:
                os.kill(self.pid(), signal.SIGKILL)
                self.p.kill()
                self.p.wait()
        self.log.close()
        return self.p.returncode


def img(name, fmt="raw", size="256M"):
    path = os.path.join(TMP, name)
    subprocess.run(shlex.split(A.qemu_img) + ["create", "-q", "-f", fmt, path, size], check=True)
    return path


def qsdctl(*args, **kw):
    return subprocess.Popen([A.qsdctl, "--vhost-filter", "none"] + list(args),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def stop_proc(p, sig=signal.SIGTERM):
    if p.poll() is None:
        p.send_signal(sig)
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# --- 1. drain under I/O with the export in an iothread ---------------------

def drain_once(op, iothread):
    base = img("drain-%s.raw" % op)
    q = Qsd("drain-%s-%d" % (op, iothread), base, iothread=iothread)
    b = qsdctl("bench", "--tests", "randwrite-4k-qd32", "--ramp-ms", "0", "--runtime-ms", "6000",
               "--size", str(64 << 20), q.sock)
    time.sleep(1.5)
    res = "ok"
    t0 = time.monotonic()
    try:
        if op == "block_resize":
            r = q.qmp.cmd("block_resize", **{"node-name": "disk"}, size=512 << 20)
            res = "ok" if "return" in r else "error " + json.dumps(r["error"])
        else:
            ov = img("drain-%s-ov.qcow2" % op, "qcow2", "256M")
            r = q.qmp.cmd("blockdev-add", driver="qcow2", **{"node-name": "ov"},
                          file={"driver": "file", "filename": ov}, backing=None)
            if "error" in r:
                raise RuntimeError(json.dumps(r))
            r = q.qmp.cmd("blockdev-snapshot", node="disk", overlay="ov")
            if "error" in r:
                raise RuntimeError(json.dumps(r))
            if op == "block-stream":
                r = q.qmp.cmd("block-stream", **{"job-id": "j1"}, device="ov")
                if "error" in r:
                    raise RuntimeError(json.dumps(r))
                deadline = time.monotonic() + 15
                while True:
                    jobs = q.qmp.cmd("query-jobs")["return"]
                    if not jobs:
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError("job still running: " + json.dumps(jobs))
                    time.sleep(0.2)
                # the chain is one node again: ov without backing
                r = q.qmp.cmd("query-named-block-nodes", flat=True)["return"]
                depth = [n["backing_file_depth"] for n in r if n["node-name"] == "ov"]
                if depth != [0]:
                    res = "error: the overlay still has a backing chain %s" % depth
    except (socket.timeout, TimeoutError) as e:
        res = "HANG (QMP no answer in 5 s: %s)" % e
    except (EOFError, ConnectionError) as e:
        res = "QSD DIED (%s)" % e
    except RuntimeError as e:
        res = "error %s" % e
    took = time.monotonic() - t0
    try:
        b.wait(15)
        bench = "bench rc=%d" % b.returncode
        m = re.search(r"randwrite-4k-qd32\s+(\d+)", b.stdout.read())
        if m:
            bench += " iops=%s" % m.group(1)
    except subprocess.TimeoutExpired:
        bench = "bench HUNG (killed)"
        stop_proc(b, signal.SIGKILL)
    alive = q.alive()
    rc = q.stop()
    tail = ""
    if not alive or rc not in (0, None):
        with open(q.log.name) as f:
            tail = " qsd rc=%s log: %s" % (rc, f.read().strip()[-200:])
    out("drain", "%s iothread=%s: %s in %.1f s; %s%s" % (op, iothread, res, took, bench, tail))


def check_drain():
    for rep in range(A.reps):
        for op in ("block_resize", "blockdev-snapshot", "block-stream"):
            drain_once(op, True)
    for op in ("block_resize", "blockdev-snapshot", "block-stream"):
        drain_once(op, False)


# --- 2. block_resize before any client ---------------------------------------

def check_resize_noclient():
    q = Qsd("resize-noclient", img("rnc.raw"))
    try:
        r = q.qmp.cmd("block_resize", **{"node-name": "disk"}, size=512 << 20)
        res = "return" if "return" in r else json.dumps(r)
    except (EOFError, ConnectionError, socket.timeout) as e:
        res = "no answer (%s)" % e
    time.sleep(0.5)
    alive = q.alive()
    info = ""
    if alive:
        v = qsdctl("vhost-info", "--json", q.sock)
        o, _ = v.communicate(timeout=10)
        info = " capacity after=%s" % json.loads(o)["capacity"] if v.returncode == 0 else " vhost-info rc=%d" % v.returncode
    rc = q.stop()
    out("resize-noclient", "block_resize: %s; QSD %s%s" % (
        res, "alive" if alive else "DIED rc=%s" % rc, info))


# --- 3. write cache: what the export tells the guest, what a kill -9 loses ---

def config_wce(strace_txt):
    """wce from the VHOST_USER_GET_CONFIG reply (request 24) in an strace -xx
    log: QSD sends the 12-byte header with sendmsg, then the payload with
    write on the same descriptor."""
    hexbytes = lambda t: bytes(int(h, 16) for h in re.findall(r"\\x([0-9a-f]{2})", t))
    want = None
    for line in open(strace_txt):
        m = re.search(r'sendmsg\((\d+), \{msg_name=NULL, msg_namelen=0, msg_iov=\[\{iov_base="([^"]*)"', line)
        if m:
            h = hexbytes(m.group(2))
            if len(h) == 12 and int.from_bytes(h[0:4], "little") == 24:
                want = m.group(1)
            continue
        m = re.search(r'write\((\d+), "([^"]*)"', line)
        if m and want == m.group(1):
            payload = hexbytes(m.group(2))
            # struct VhostUserConfig: offset, size, flags (u32 each), then
            # struct virtio_blk_config: wce at byte 32
            return payload[12 + 32]
    return None


def check_wce():
    for wt in (False, True):
        q = Qsd("wce-%d" % wt, img("wce-%d.qcow2" % wt, "qcow2"), fmt="qcow2", writethrough=wt,
                strace=["-e", "trace=sendmsg,write", "-xx", "-s", "256"])
        v = qsdctl("vhost-info", "--json", q.sock)
        v.communicate(timeout=10)
        q.stop()
        out("wce", "qcow2 export writethrough=%s: config wce=%s (vhost-info rc=%d)" % (
            wt, config_wce(os.path.join(q.dir, "strace.txt")), v.returncode))


def allocated(path):
    r = subprocess.run(shlex.split(A.qemu_img) + ["map", "--output=json", "-U", path],
                       capture_output=True, text=True, check=True)
    return sum(e["length"] for e in json.loads(r.stdout) if e["data"])


def check_kill9():
    """Unflushed writes to new clusters of a qcow2 image, then kill -9: what a
    guest that believes the export is write-through (wce=0: it never
    flushes) would lose.  bench's writes are acknowledged, never flushed."""
    for wt in (False, True):
        path = img("k9-%d.qcow2" % wt, "qcow2", "64M")
        q = Qsd("k9-%d" % wt, path, fmt="qcow2", writethrough=wt)
        b = qsdctl("bench", "--tests", "seqread-128k-qd8,randwrite-4k-qd32", "--ramp-ms", "0",
                   "--runtime-ms", "1500", q.sock)
        b.communicate(timeout=30)
        before = q.qmp.cmd("query-blockstats")["return"]
        os.kill(q.pid(), signal.SIGKILL)
        q.p.wait(5)
        q.stop()
        chk = subprocess.run(shlex.split(A.qemu_img) + ["check", path], capture_output=True, text=True)
        leaks = re.search(r"(\d+) leaked clusters", chk.stdout)
        out("kill9", "qcow2 writethrough=%s: bench rc=%d; after kill -9 allocated %d KiB of 64 MiB "
            "randomly written; qemu-img check rc=%d%s" % (
                wt, b.returncode, allocated(path) >> 10, chk.returncode,
                ", %s leaked clusters" % leaks.group(1) if leaks else ""))


# --- 4. serial ---------------------------------------------------------------

def check_serial():
    q = Qsd("serial", img("serial.raw"))
    schema = q.qmp.cmd("query-qmp-schema")["return"]
    q.stop()
    for t in schema:
        names = {m.get("name") for m in t.get("members", []) if isinstance(m, dict)} - {None}
        if {"logical-block-size", "num-queues", "addr"} <= names:
            out("serial", "vhost-user-blk export members: %s; serial %s" % (
                ",".join(sorted(names)), "PRESENT" if "serial" in names else "absent"))


# --- 5. aio: submission syscalls per I/O -------------------------------------

def check_aio():
    """Submission syscalls per I/O and IOPS (under strace: no benchmark) of
    aio=native and aio=io_uring on a written raw file, reads and writes."""
    path = img("aio.raw", "raw", "1G")
    subprocess.run(["dd", "if=/dev/zero", "of=" + path, "bs=1M", "count=1024", "conv=notrunc",
                    "status=none"], check=True)
    for test in ("randread-4k-qd32", "randwrite-4k-qd32", "randwrite-4k-qd1"):
        for aio in ("native", "io_uring"):
            q = Qsd("aio-%s-%s" % (aio, test), path, aio=aio)
            st_out = os.path.join(q.dir, "strace-c.txt")
            st = subprocess.Popen(["strace", "-c", "-f", "-e", "trace=io_uring_enter,io_submit",
                                   "-o", st_out, "-p", str(q.p.pid)])
            time.sleep(1)
            b = qsdctl("bench", "--json", "--tests", test, "--ramp-ms", "0",
                       "--runtime-ms", "3000", q.sock)
            o, e = b.communicate(timeout=60)
            stop_proc(st, signal.SIGINT)
            q.stop()
            res = json.loads(o)
            t = res["results"][0] if "results" in res else res
            ios = t.get("ios") or int(t["iops"] * 3.0)
            calls = {}
            for line in open(st_out):
                f = line.split()
                if len(f) >= 5 and f[-1] in ("io_uring_enter", "io_submit"):
                    calls[f[-1]] = int(f[3])
            out("aio", "raw aio=%s %s: iops %d, %s over ~%d I/Os = %.2f per I/O" % (
                aio, test, t["iops"], calls, ios, sum(calls.values()) / max(ios, 1)))


def check_aio_iops():
    """aio=native against aio=io_uring without strace, interleaved rounds on
    one written raw file, each QSD fresh: IOPS and mean latency (a shared
    machine: the CPU pressure of each line says how much to trust it)."""
    path = img("aio-iops.raw", "raw", "1G")
    subprocess.run(["dd", "if=/dev/zero", "of=" + path, "bs=1M", "count=1024", "conv=notrunc",
                    "status=none"], check=True)
    tests = "randread-4k-qd32,randwrite-4k-qd32,randwrite-4k-qd1,randread-4k-qd1"
    for rnd in range(A.reps):
        for aio in ("native", "io_uring") if rnd % 2 == 0 else ("io_uring", "native"):
            q = Qsd("aio-iops-%s-%d" % (aio, rnd), path, aio=aio)
            b = qsdctl("bench", "--json", "--tests", tests, "--ramp-ms", "300",
                       "--runtime-ms", "2000", q.sock)
            o, e = b.communicate(timeout=120)
            q.stop()
            res = json.loads(o)
            for t in res.get("results", [res]):
                cpu = t.get("qsd_cpu_us_per_io")
                out("aio-iops", "round %d raw aio=%-8s %-17s iops %6d mean %6.1f us, QSD CPU %s us/I/O" % (
                    rnd, aio, t["test"], t["iops"], t["mean_us"],
                    "?" if cpu is None else "%.1f" % cpu))


# --- 6. blockstats ----------------------------------------------------------

def check_blockstats():
    q = Qsd("stats", img("stats.raw"))
    b = qsdctl("bench", "--tests", "randread-4k-qd1", "--ramp-ms", "0", "--runtime-ms", "1000", q.sock)
    b.communicate(timeout=30)
    r = q.qmp.cmd("query-blockstats", **{"query-nodes": True})["return"]
    r2 = q.qmp.cmd("query-blockstats")["return"]
    q.stop()
    rd = {s.get("node-name") or s.get("device") or s.get("qdev"): s["stats"]["rd_operations"] for s in r}
    out("blockstats", "after bench rc=%d: query-nodes rd_operations %s; by device %d entries %s" % (
        b.returncode, rd, len(r2), [s["stats"]["rd_operations"] for s in r2]))


# --- 7. the double close on a client's hang-up ------------------------------

def check_close():
    q = Qsd("close", img("close.raw"), strace=["-e", "trace=close,accept4"])
    for _ in range(3):
        v = qsdctl("vhost-info", q.sock)
        v.communicate(timeout=10)
        time.sleep(0.3)
    q.stop()
    lines = open(os.path.join(q.dir, "strace.txt")).read().splitlines()
    conns = []  # [fd, [close results]] per accepted connection
    for l in lines:
        m = re.search(r"accept4\(.*\) = (\d+)$", l)
        if m:
            conns.append([m.group(1), []])
            continue
        m = re.search(r"close\((\d+)\)\s+= (.*)$", l)
        if m:
            for c in reversed(conns):
                if c[0] == m.group(1):
                    c[1].append(m.group(2))
                    break
    desc = ["fd %s: close x%d (%s)" % (fd, len(cl), ", ".join(cl)) for fd, cl in conns]
    out("close", "%d connections accepted: %s" % (len(conns), "; ".join(desc)))


CHECKS = {"drain": check_drain, "resize-noclient": check_resize_noclient, "wce": check_wce,
          "kill9": check_kill9, "serial": check_serial, "aio": check_aio, "aio-iops": check_aio_iops,
          "blockstats": check_blockstats, "close": check_close}


def main():
    global A, TMP
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--qsd", default="qemu-storage-daemon", help="QSD command (may be a loader command)")
    p.add_argument("--qemu-img", default="qemu-img")
    p.add_argument("--qsdctl", default="build/qsdctl/qsdctl")
    p.add_argument("--reps", type=int, default=1,
                   help="repetitions of the iothread drain checks; rounds of aio-iops")
    p.add_argument("checks", nargs="*", default=list(CHECKS))
    A = p.parse_args()
    ver = subprocess.run(shlex.split(A.qsd) + ["--version"], capture_output=True, text=True).stdout
    print("# " + ver.splitlines()[0], flush=True)
    with tempfile.TemporaryDirectory(prefix="qemu-retest.") as TMP:
        for c in A.checks:
            CHECKS[c]()


if __name__ == "__main__":
    main()
