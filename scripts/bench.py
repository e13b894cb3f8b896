#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""bench.py: the data path's benchmark (run by scripts/bench.sh).

Measures the QSD exports the plugin ships, each alternative considered,
QEMU's block layer in one process (`qemu-img bench`) and the io_uring
O_DIRECT limit, on the same fully written files, interleaved: in every
round each configuration runs each test right after the limit, and a ratio
is the median over rounds of (configuration / the limit run just before it).
The limit is the best of the limit tools run back to back (`qsdctl bench` on
the file, and fio when installed; order alternating): the most IOPS, the
lowest depth-1 latency.  Then 1, 2 and 4 volumes at once (one QSD each, one
client each) against as many limit runs at once.

The machine is shared: before every run the bench sleeps QUIET_GAP_MS with
nothing of its own running and measures the CPU pressure of that gap (PSI
"some", the other tenants' share); above --max-pressure it waits (bounded)
for a quiet gap, and a run that never got one is marked.  The report gives
the gap pressure with every figure and refuses to write its tables when
more than a quarter of the runs are marked (--allow-busy writes them,
headed as not usable).

The fuse-* configurations are pod volumes (docs/pod-volumes.md): the
shipped command line plus the plugin's FUSE export, fio on the buffered loop
device over the FUSE file (or on the file), with QSD's CPU, the machine's
and the bytes QSD moved per I/O.

--compare-qsd BINARY runs every configuration a second time, in the same
rounds, with that QSD (named NAME@VERSION): the side-by-side of two QEMU
versions on the same files in the same minutes.

The shipped command line is not copied here: it is printed by the plugin
itself (`qsd-csi-plugin --print-qsd-command IMAGE PARAMETERS`, the code that
starts every QSD at NodeStage); alternatives are that command line with one
change each (the `patch` column below).

Writes OUT/results.json (every run), OUT/results.md (tables, machine, noise)
and OUT/bench.png (gnuplot).
"""
import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

TESTS = ["randread-4k-qd1", "randread-4k-qd32", "randwrite-4k-qd1", "randwrite-4k-qd32"]
SHORT = dict(zip(TESTS, ["rr4k qd1", "rr4k qd32", "rw4k qd1", "rw4k qd32"]))
MULTI_TESTS = ["randread-4k-qd32", "randwrite-4k-qd32"]
med = statistics.median
QUIET_GAP_MS = 300


def add_iothread(argv, **props):
    """The export in an iothread (not shipped: QEMU 10.0.2 hangs on drains)."""
    obj = {"qom-type": "iothread", "id": "iot0", **props}
    out = []
    for i, a in enumerate(argv):
        if i > 0 and argv[i - 1] == "--export":
            e = json.loads(a)
            e["iothread"] = "iot0"
            a = json.dumps(e)
        if a == "--export" and "--object" not in out:
            out += ["--object", json.dumps(obj)]
        out.append(a)
    return out


def writeback(argv):
    """qcow2 exported write-back (not shipped: a QSD kill -9 loses acked writes)."""
    out = []
    for i, a in enumerate(argv):
        if i > 0 and argv[i - 1] == "--export":
            e = json.loads(a)
            e["writethrough"] = False
            a = json.dumps(e)
        out.append(a)
    return out


def noflush(argv):
    """qcow2 write-through with the file's flushes dropped (not shippable: a
    guest's flush would not reach the disk): what the flush itself costs."""
    out = []
    for i, a in enumerate(argv):
        if i > 0 and argv[i - 1] == "--blockdev":
            b = json.loads(a)
            if "cache" in b:
                b["cache"]["no-flush"] = True
            a = json.dumps(b)
        out.append(a)
    return out


def pinned(cpus):
    """The QSD on CPUS only (taskset execs it: same pid; its io_uring and
    AIO helper threads inherit the mask)."""
    return lambda argv: ["taskset", "-c", cpus] + argv


def main_loop(argv, **props):
    return argv[:1] + ["--object", json.dumps({"qom-type": "main-loop", "id": "ml0", **props})] + argv[1:]


# name, image format, StorageClass parameters, client queues, patch of the
# shipped argv, CPUs of the client (None: unpinned, like the limit)
CONFIGS = [
    ("shipped-qcow2", "qcow2", {}, 1, None, None),
    ("qcow2-io_uring", "qcow2", {"aio": "io_uring"}, 1, None, None),
    ("shipped-raw", "raw", {}, 1, None, None),
    ("raw-io_uring", "raw", {"aio": "io_uring"}, 1, None, None),
    ("raw-2q", "raw", {"numQueues": "2"}, 2, None, None),
    ("raw-batch32", "raw", {}, 1, lambda a: main_loop(a, **{"aio-max-batch": 32}), None),
    ("raw-iothread", "raw", {}, 1, lambda a: add_iothread(a), None),
    ("raw-iothread-nopoll", "raw", {}, 1, lambda a: add_iothread(a, **{"poll-max-ns": 0}), None),
    ("qcow2-writeback", "qcow2", {}, 1, writeback, None),
    ("qcow2-noflush", "qcow2", {}, 1, noflush, None),
    # CPU placement of the QSD relative to its client (the VM): both on one
    # CPU, on different CPUs, the QSD alone pinned; unpinned is shipped-raw.
    ("raw-pin-same", "raw", {}, 1, pinned("0"), "0"),
    ("raw-pin-other", "raw", {}, 1, pinned("0"), "1"),
    ("raw-pin-qsd", "raw", {}, 1, pinned("0"), None),
    # Pod volumes (docs/pod-volumes.md): the shipped command line plus the
    # FUSE export the plugin adds for a pod, measured with fio (io_uring,
    # O_DIRECT) on the buffered loop device over the FUSE file (what a
    # Block-mode pod, and below its filesystem an ext4, gets), and on the
    # FUSE file itself (the loop device's share).
    ("fuse-loop-raw", "raw", {}, 1, None, None),
    ("fuse-loop-qcow2", "qcow2", {}, 1, None, None),
    ("fuse-file-raw", "raw", {}, 1, None, None),
]
MULTI_CONFIGS = ["shipped-raw", "shipped-qcow2"]
FUSE_CONFIGS = {"fuse-loop-raw": "loop", "fuse-loop-qcow2": "loop", "fuse-file-raw": "file"}


def with_fuse(argv, mountpoint):
    """The FUSE export the plugin adds for a pod volume (qsdopts.c), on the
    node its vhost-user exports serve; here QSD (root, not confined) mounts
    it itself, where the plugin mounts /dev/fuse and hands the descriptor."""
    node = next(json.loads(a)["node-name"] for i, a in enumerate(argv)
                if i > 0 and argv[i - 1] == "--export")
    return argv + ["--export", json.dumps({"type": "fuse", "id": "fuse0", "node-name": node,
                                           "mountpoint": mountpoint, "writable": True,
                                           "allow-other": "off"})]


def task_cpu_ns(pid):
    """CPU time of every thread of pid so far (schedstat), ns."""
    total = 0
    for t in os.listdir("/proc/%d/task" % pid):
        try:
            total += int(open("/proc/%d/task/%s/schedstat" % (pid, t)).read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def machine_cpu_ns():
    """Busy CPU time of the whole machine so far (/proc/stat, all tenants), ns."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    idle = f[3] + (f[4] if len(f) > 4 else 0)
    return (sum(f[:8]) - idle) * 1e9 / os.sysconf("SC_CLK_TCK")


def proc_io(pid):
    v = {}
    for line in open("/proc/%d/io" % pid):
        k, x = line.split(":")
        v[k] = int(x)
    return v


class Bench:
    def __init__(self, a):
        self.a = a
        self.work = os.path.abspath(a.workdir)
        os.makedirs(self.work, exist_ok=True)
        self.run = tempfile.mkdtemp(prefix="run.", dir=self.work)
        self.qsds = {}  # name -> Popen
        self.rows = []  # every measurement
        self.psi = []
        want = a.configs.split(",") if a.configs else [c[0] for c in CONFIGS]
        unknown = set(want) - {c[0] for c in CONFIGS}
        if unknown:
            sys.exit("bench: unknown configuration(s): %s" % ", ".join(sorted(unknown)))
        # (name, ...CONFIGS fields..., the QSD binary)
        self.configs = [c + (a.qsd,) for c in CONFIGS if c[0] in want]
        if a.compare_qsd:
            ver = qsd_version(a.compare_qsd)
            self.configs += [("%s@%s" % (c[0], ver),) + c[1:] + (a.compare_qsd,)
                             for c in CONFIGS if c[0] in want]
        self.names = [c[0] for c in self.configs]
        self.multi_configs = [c for c in self.configs
                              if c[0].split("@")[0] in MULTI_CONFIGS]

    # ---------------------------------------------------------------- QSDs
    def shipped_argv(self, image, params, name, qsd):
        """The plugin's own command line for IMAGE (renamed NAME for its
        sockets), with QSD as the binary."""
        link = os.path.join(self.run, "img", name + os.path.splitext(image)[1])
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if not os.path.exists(link):
            os.symlink(image, link)
        out = subprocess.run([self.a.plugin, "--run-dir", self.run, "--qsd-binary", qsd,
                              "--print-qsd-command", link, json.dumps(params)],
                             check=True, capture_output=True, text=True).stdout
        return json.loads(out)

    def start_qsd(self, name, image, params, patch, qsd):
        argv = self.shipped_argv(image, params, name, qsd)
        if patch:
            argv = patch(argv)
        for d in ("exports", "exports-ro", "ctl"):
            os.makedirs(os.path.join(self.run, d, name), exist_ok=True)
        sock = os.path.join(self.run, "exports", name, "vhost.sock")
        if os.path.exists(sock):
            os.unlink(sock)
        log = open(os.path.join(self.run, "ctl", name, "qsd.log"), "w")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.qsds[name] = p
        for _ in range(200):
            if p.poll() is not None:
                sys.exit("bench: QSD %s exited: %s" % (name, open(log.name).read()))
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect(sock)
                s.close()
                return sock, p.pid, argv
            except OSError:
                time.sleep(0.05)
        sys.exit("bench: QSD %s: socket did not appear" % name)

    def stop_qsd(self, name):
        p = self.qsds.pop(name)
        p.terminate()
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def stop_all(self):
        for n in list(self.qsds):
            self.stop_qsd(n)

    # ------------------------------------------------------------ clients
    def psi_sample(self):
        """The other tenants' CPU and I/O pressure, measured over a gap with
        nothing of ours running (PSI "some" totals over QUIET_GAP_MS);
        above --max-pressure, wait for a quiet gap (at most --quiet-wait-s)
        and mark the run busy if none came."""
        def totals():
            v = {}
            for k in ("cpu", "io"):
                try:
                    t = open("/proc/pressure/" + k).read()
                    v[k] = int(re.search(r"some avg10=[\d.]+ avg60=[\d.]+ avg300=[\d.]+ total=(\d+)",
                                         t).group(1))
                except (OSError, AttributeError):
                    v[k] = None
            return v
        start = time.monotonic()
        while True:
            t0, m0 = totals(), time.monotonic()
            time.sleep(QUIET_GAP_MS / 1000.0)
            t1, m1 = totals(), time.monotonic()
            v = {k: None if t0[k] is None else 100.0 * (t1[k] - t0[k]) / ((m1 - m0) * 1e6)
                 for k in t0}
            waited = time.monotonic() - start
            v["busy"] = v["cpu"] is not None and v["cpu"] > self.a.max_pressure
            if not v["busy"] or waited >= self.a.quiet_wait_s:
                break
        v["waited_s"] = round(waited, 1)
        self.psi.append(v)

    def qsdctl_cmd(self, target, test, queues=1, qsd_pid=None, cpus=None):
        c = (["taskset", "-c", cpus] if cpus else []) + [
            self.a.qsdctl, "bench", "--json", "--runtime-ms", str(self.a.runtime_ms), "--ramp-ms",
            str(self.a.ramp_ms), "--tests", test, "--queues", str(queues)]
        if qsd_pid:
            c += ["--qsd-pid", str(qsd_pid)]
        return c + [target]

    def run_many(self, cmds, count_pid=None, parse=None):
        """Run the clients at once; their parsed JSON results.  With
        count_pid (and perf installed): that process's io_uring_enter calls
        (or io_submit) calls per I/O, counted over most of the measured window."""
        self.psi_sample()
        ps = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for c in cmds]
        enters = None
        if count_pid and shutil.which("perf"):
            time.sleep(self.a.ramp_ms / 1000.0 + 0.05)
            window = self.a.runtime_ms * 0.8 / 1000.0
            st = subprocess.run(["perf", "stat", "-x,", "-e", "syscalls:sys_enter_io_uring_enter",
                                 "-e", "syscalls:sys_enter_io_submit", "-p", str(count_pid), "--",
                                 "sleep", "%.3f" % window], capture_output=True, text=True)
            n = [int(m.group(1)) for m in re.finditer(r"^(\d+),", st.stderr, re.M)]
            enters = sum(n) / window if len(n) == 2 else None
        out = []
        for p, c in zip(ps, cmds):
            o, e = p.communicate(timeout=600)
            if p.returncode != 0:
                self.stop_all()
                sys.exit("bench: %s failed: %s" % (" ".join(c), e))
            out.append(parse(o) if parse else json.loads(o)["results"][0])
        if enters is not None:
            out[0]["submits_per_io"] = enters / max(out[0]["iops"], 1)
        return out

    def record(self, section, label, rnd, test, n, res):
        self.rows.append({"section": section, "label": label, "round": rnd, "test": test, "n": n,
                          "results": res, "psi": self.psi[-1] if self.psi else None})

    def fio_cmd(self, image, test):
        rw = "randread" if "read" in test else "randwrite"
        depth = int(test.split("qd")[1])
        return ["fio", "--name=limit", "--filename=" + image, "--direct=1", "--ioengine=io_uring",
                "--rw=" + rw, "--bs=4k", "--iodepth=%d" % depth, "--time_based",
                "--runtime=%dms" % self.a.runtime_ms, "--ramp_time=%dms" % self.a.ramp_ms,
                "--output-format=json"]

    @staticmethod
    def fio_parse(out):
        job = json.loads(out)["jobs"][0]
        d = job["read"] if job["read"]["total_ios"] else job["write"]
        ios = max(d["total_ios"], 1)
        runtime_s = job["job_runtime"] / 1000.0
        cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100.0 * runtime_s
        return {"iops": d["iops"], "mean_us": d["lat_ns"]["mean"] / 1000.0,
                "client_cpu_us_per_io": cpu * 1e6 / ios, "qsd_cpu_us_per_io": None}

    def limit(self, files, test):
        """The limit on FILES (one client each, at once): every limit tool
        in turn, alternating which goes first; the best by aggregate IOPS
        (at depth 1 that is also the lowest latency), and each tool's."""
        tools = [("qsdctl", [self.qsdctl_cmd(f, test) for f in files], None)]
        if shutil.which("fio"):
            tools.append(("fio", [self.fio_cmd(f, test) for f in files], self.fio_parse))
        self.limit_turn = getattr(self, "limit_turn", 0) + 1
        if self.limit_turn % 2 == 0:
            tools.reverse()
        each = {}
        for name, cmds, parse in tools:
            each[name] = self.run_many(cmds, parse=parse)
            for r in each[name]:
                r["tool"] = name
        best = max(each.values(), key=lambda rs: sum(r["iops"] for r in rs))
        return best, each

    def record_limit(self, section, label, rnd, test, n, files):
        best, each = self.limit(files, test)
        self.record(section, "limit@" + label, rnd, test, n, best)
        for tool, rs in each.items():
            self.record(section, "limit-%s@%s" % (tool, label), rnd, test, n, rs)

    def qemu_img(self, image, test):
        """QEMU's block layer in one process.  qemu-img bench is sequential:
        a prime stride (offsets wrap at the end) scatters the requests."""
        depth = int(test.split("qd")[1])
        count = 30000 if depth == 1 else 120000
        c = ["qemu-img", "bench", "-f", "raw", "-t", "none", "-i", "io_uring", "-c", str(count),
             "-d", str(depth), "-s", "4096", "-S", str(4096 * 7919)]
        if "write" in test:
            c.append("-w")
        c.append(image)
        self.psi_sample()
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        o = subprocess.run(c, check=True, capture_output=True, text=True, timeout=600).stdout
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        secs = float(re.search(r"Run completed in ([\d.]+) seconds", o).group(1))
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        return {"iops": count / secs, "mean_us": secs * 1e6 * depth / count,
                "client_cpu_us_per_io": cpu * 1e6 / count, "qsd_cpu_us_per_io": None}

    # ------------------------------------------------------------ phases
    def prepare(self):
        n = 4
        self.raw = [os.path.join(self.work, "data%d.raw" % i) for i in range(n)]
        self.qcow2 = [os.path.join(self.work, "data%d.qcow2" % i) for i in range(n)]
        mib = self.a.size_mib
        for r, q in zip(self.raw, self.qcow2):
            print("bench: writing %d MiB of random data to %s (every block written)" % (mib, r),
                  file=sys.stderr)
            subprocess.run(["dd", "if=/dev/urandom", "of=" + r, "bs=1M", "count=%d" % mib,
                            "oflag=direct", "conv=fsync", "status=none"], check=True)
            subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", "-t", "none", "-T",
                            "none", r, q], check=True)
        os.sync()

    def fuse_target(self, name, image, qsd):
        """A QSD with the FUSE export (started like start_qsd), and the
        target fio runs on: a buffered loop device on the FUSE file, or
        the file."""
        fuse = os.path.join(self.run, "fuse-" + name)
        open(fuse, "w").close()
        base = name.split("@")[0]
        sock, pid, argv = self.start_qsd(name, image, {}, lambda a: with_fuse(a, fuse), qsd)
        for _ in range(100):
            if os.stat(fuse).st_size > 0:
                break
            time.sleep(0.05)
        if FUSE_CONFIGS[base] == "file":
            return fuse, pid, argv, None
        dev = subprocess.run(["losetup", "--find", "--show", "--direct-io=off", fuse], check=True,
                             capture_output=True, text=True, timeout=60).stdout.strip()
        return dev, pid, argv, dev

    def fuse_stop(self, name, loop):
        if loop:
            subprocess.run(["losetup", "-d", loop], check=False, timeout=60)
        self.stop_qsd(name)
        fuse = os.path.join(self.run, "fuse-" + name)
        for _ in range(50):  # QSD unmounts it at exit
            if subprocess.run(["mountpoint", "-q", fuse]).returncode != 0:
                break
            time.sleep(0.1)
        else:
            subprocess.run(["umount", "-l", fuse], check=False)

    def fuse_run(self, target, pid, test):
        """fio on target; QSD's CPU (all threads), the machine's (all
        tenants, the loop device's kernel workers among them) and the bytes
        QSD read or wrote, per I/O."""
        c0, m0, io0 = task_cpu_ns(pid), machine_cpu_ns(), proc_io(pid)
        self.psi_sample()
        o = subprocess.run(self.fio_cmd(target, test), check=True, capture_output=True,
                           text=True, timeout=600).stdout
        c1, m1, io1 = task_cpu_ns(pid), machine_cpu_ns(), proc_io(pid)
        r = self.fio_parse(o)
        job = json.loads(o)["jobs"][0]
        d = job["read"] if job["read"]["total_ios"] else job["write"]
        # ramp included in the CPU windows: scale by all I/Os, ramp's too
        ios = max(d["total_ios"], 1) * (1 + self.a.ramp_ms / max(self.a.runtime_ms, 1))
        r["qsd_cpu_us_per_io"] = (c1 - c0) / 1e3 / ios
        r["machine_cpu_us_per_io"] = (m1 - m0) / 1e3 / ios
        key = "read_bytes" if "read" in test else "write_bytes"
        r["qsd_bytes_per_io"] = (io1[key] - io0[key]) / ios
        r["qsd_syscalls_per_io"] = ((io1["syscr"] - io0["syscr"]) + (io1["syscw"] - io0["syscw"])) / ios
        return r

    def single_fuse(self, rnd, name, image, qsd):
        target, pid, argv, loop = self.fuse_target(name, image, qsd)
        self.argvs[name] = argv
        print("bench: round %d: %s (%s)" % (rnd, name, target), file=sys.stderr)
        try:
            for t in TESTS:
                self.record_limit("single", name, rnd, t, 1, self.raw[:1])
                self.record("single", name, rnd, t, 1, [self.fuse_run(target, pid, t)])
        finally:
            self.fuse_stop(name, loop)

    def single(self, rnd):
        for name, fmt, params, queues, patch, cpus, qsd in self.configs:
            image = self.raw[0] if fmt == "raw" else self.qcow2[0]
            if name.split("@")[0] in FUSE_CONFIGS:
                self.single_fuse(rnd, name, image, qsd)
                continue
            sock, pid, argv = self.start_qsd(name, image, params, patch, qsd)
            self.argvs[name] = argv
            print("bench: round %d: %s" % (rnd, name), file=sys.stderr)
            for t in TESTS:
                self.record_limit("single", name, rnd, t, 1, self.raw[:1])
                res = self.run_many([self.qsdctl_cmd(sock, t, queues, pid, cpus)],
                                    count_pid=pid if t.endswith("qd32") else None)[0]
                self.record("single", name, rnd, t, 1, [res])
            self.stop_qsd(name)
        for t in TESTS:
            self.record_limit("single", "qemu-img", rnd, t, 1, self.raw[:1])
            self.record("single", "qemu-img", rnd, t, 1, [self.qemu_img(self.raw[0], t)])

    def multi(self, rnd):
        for name, fmt, params, queues, patch, _, qsd in self.multi_configs:
            for n in (1, 2, 4):
                print("bench: round %d: %d x %s" % (rnd, n, name), file=sys.stderr)
                imgs = (self.raw if fmt == "raw" else self.qcow2)[:n]
                started = [self.start_qsd("%s-%d" % (name, i), img, params, patch, qsd)
                           for i, img in enumerate(imgs)]
                for t in MULTI_TESTS:
                    self.record_limit("multi", name, rnd, t, n, self.raw[:n])
                    res = self.run_many([self.qsdctl_cmd(s, t, queues, pid) for s, pid, _ in started])
                    self.record("multi", name, rnd, t, n, res)
                for i in range(n):
                    self.stop_qsd("%s-%d" % (name, i))

    def go(self):
        self.argvs = {}
        self.prepare()
        start = machine_now()
        for rnd in range(1, self.a.rounds + 1):
            self.single(rnd)
            if not self.a.single_only:
                self.multi(rnd)
            # every run so far, before any report can fail on it
            json.dump({"runs": self.rows, "psi": self.psi},
                      open(os.path.join(self.a.out, "runs-partial.json"), "w"))
        self.machine = machine(self.a, start)
        report(self)

    def cleanup(self):
        self.stop_all()
        shutil.rmtree(self.run, ignore_errors=True)
        for f in getattr(self, "raw", []) + getattr(self, "qcow2", []):
            if os.path.exists(f):
                os.unlink(f)


def qsd_version(binary):
    """'11.1.3' from BINARY --version."""
    o = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"version (\d+\.\d+\.\d+)", o)
    if not m:
        sys.exit("bench: %s --version: no version in %r" % (binary, o[:200]))
    return m.group(1)


def machine_now():
    return {"load": open("/proc/loadavg").read().split()[:3], "time": time.time()}


def machine(a, start):
    def sh(c):
        return subprocess.run(c, shell=True, capture_output=True, text=True).stdout.strip()
    return [
        "date: " + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "kernel: " + os.uname().release,
        "cpu: %s x %d" % (sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'"),
                          os.cpu_count()),
        "memory: %s MiB" % sh("free -m | awk '/Mem:/ {print $2}'"),
        "disk: %s (%s)" % (sh("df --output=source %s | tail -1" % a.workdir),
                           sh("findmnt -no FSTYPE -T %s" % a.workdir)),
        "qemu: " + sh(a.qsd + " --version | head -1") + (
            "; compared with: " + sh(a.compare_qsd + " --version | head -1") if a.compare_qsd else ""),
        "fio: " + (sh("fio --version") or "not installed"),
        "files: %d MiB each, random data, fully written; qcow2 converted from them" % a.size_mib,
        "runtime: %d ms per test after %d ms ramp, %d rounds" % (a.runtime_ms, a.ramp_ms, a.rounds),
        "load at start: %s; at end: %s" % (" ".join(start["load"]),
                                            " ".join(open("/proc/loadavg").read().split()[:3])),
        "wall time: %.0f s" % (time.time() - start["time"]),
        "git: " + (sh("git rev-parse --short HEAD") or "?"),
    ]


def report(b):
    rows = b.rows
    out = b.a.out

    def runs(section, label, test, n=1):
        return {r["round"]: r for r in rows if r["section"] == section and r["label"] == label
                and r["test"] == test and r["n"] == n}

    def agg(r, key="iops"):
        return sum(x[key] for x in r["results"])

    def ratio(section, label, test, n=1):
        mine, lim = runs(section, label, test, n), runs(section, "limit@" + label, test, n)
        v = [agg(mine[k]) / agg(lim[k]) for k in mine if k in lim and agg(lim[k]) > 0]
        return (med(v), min(v), max(v)) if v else None

    def delta(label, test):
        mine, lim = runs("single", label, test), runs("single", "limit@" + label, test)
        v = [mine[k]["results"][0]["mean_us"] - lim[k]["results"][0]["mean_us"] for k in mine if k in lim]
        return med(v) if v else None

    def m(section, label, test, key, n=1):
        v = [x[key] for r in runs(section, label, test, n).values() for x in r["results"]
             if x.get(key) is not None]
        return med(v) if v else None

    labels = [c[0] for c in b.configs] + ["qemu-img"]
    summary = {}
    for c in labels:
        summary[c] = {"ratio": {t: ratio("single", c, t) for t in TESTS},
                      "qd1_mean_delta_us": {t: delta(c, t) for t in ("randread-4k-qd1", "randwrite-4k-qd1")},
                      "qsd_cpu_us_per_io": {t: m("single", c, t, "qsd_cpu_us_per_io") for t in TESTS},
                      "client_cpu_us_per_io": {t: m("single", c, t, "client_cpu_us_per_io") for t in TESTS},
                      "submits_per_io": {t: m("single", c, t, "submits_per_io") for t in TESTS}}
    multi_configs = [] if b.a.single_only else [c[0] for c in b.multi_configs]
    multi = {c: {t: {n: ratio("multi", c, t, n) for n in (1, 2, 4)} for t in MULTI_TESTS}
             for c in multi_configs}
    psi_cpu = [p["cpu"] for p in b.psi if p.get("cpu") is not None]
    psi_io = [p["io"] for p in b.psi if p.get("io") is not None]
    busy = sum(1 for p in b.psi if p.get("busy"))
    usable = busy * 4 <= len(b.psi)

    def gap(label):
        """Median and max gap CPU pressure over a configuration's runs and its limits."""
        mine = {label, "limit@" + label, "limit-qsdctl@" + label, "limit-fio@" + label}
        v = [r["psi"]["cpu"] for r in rows if r["label"] in mine and r["psi"]
             and r["psi"].get("cpu") is not None]
        return (med(v), max(v)) if v else None

    # which limit tool won, and by how much (fio / qsdctl), per test
    tools = {}
    for t in TESTS:
        won, q = {}, []
        for r in rows:
            if r["label"].startswith("limit@") and r["test"] == t and r["section"] == "single":
                won[r["results"][0]["tool"]] = won.get(r["results"][0]["tool"], 0) + 1
        for r in rows:
            if r["label"].startswith("limit-fio@") and r["test"] == t and r["section"] == "single":
                o = [x for x in rows if x["label"] == "limit-qsdctl@" + r["label"].split("@", 1)[1]
                     and x["test"] == t and x["round"] == r["round"] and x["section"] == "single"]
                if o and agg(o[0]) > 0:
                    q.append(agg(r) / agg(o[0]))
        tools[t] = {"won": won, "fio_over_qsdctl": med(q) if q else None}
    json.dump({"machine": b.machine, "argv": b.argvs, "summary": summary, "multi": {
        c: {t: {str(n): v for n, v in d.items()} for t, d in x.items()} for c, x in multi.items()},
        "psi": b.psi, "busy_runs": busy, "usable": usable, "limit_tools": tools, "runs": rows}, open(os.path.join(out, "results.json"), "w"), indent=1)

    def f(x, fmt="%.2f"):
        return "-" if x is None else fmt % x

    def fr(x):
        return "-" if x is None else "%.2f (%.2f-%.2f)" % x

    L = ["# Data-path benchmark: shipped QSD exports against the io_uring O_DIRECT limit", "",
         "Generated by `scripts/bench.sh`; every number from one run on this machine:", ""]
    L += ["    " + x for x in b.machine]
    L += ["    other tenants' cpu pressure (PSI some over a %d ms gap before every run): "
          "median %.1f%%, max %.1f%%" % (QUIET_GAP_MS, med(psi_cpu), max(psi_cpu))
          if psi_cpu else "    cpu pressure: not available",
          "    io pressure over the same gaps: median %.1f%%, max %.1f%%" % (med(psi_io), max(psi_io))
          if psi_io else "    io pressure: not available",
          "    runs without a quiet gap (cpu pressure > %g%% for %g s): %d of %d"
          % (b.a.max_pressure, b.a.quiet_wait_s, busy, len(b.psi)), ""]
    if not usable:
        L += ["**NOT USABLE: the machine was busy during more than a quarter of the runs "
              "(--allow-busy wrote this anyway).**", ""]
    L += ["## One volume", "",
          "IOPS / limit: median over rounds (min-max) of each run divided by the limit "
          "run just before it (the best of `qsdctl bench` and fio on the raw file: io_uring, "
          "O_DIRECT). "
          "`+us`: depth-1 mean latency above the limit. CPU per I/O at depth 32 "
          "(QSD: all its threads; client: `qsdctl bench`, or the limit's/fio's/qemu-img's own); "
          "QSD's io_uring_enter + io_submit calls per I/O at depth 32 (perf stat; the limit makes ~0.07); "
          "cpu pressure: the other tenants' over the gaps before this configuration's runs and "
          "their limits, median (max). "
          "Targets: rr4k qd32 >= 0.9, rw4k qd32 >= 0.9 (raw) and >= 0.7 (qcow2), "
          "depth-1 mean <= limit + 15 us.", ""]
    L.append("| configuration | " + " | ".join(SHORT[t] for t in TESTS) +
             " | rr qd1 +us | rw qd1 +us | QSD CPU us/IO rr/rw qd32 | client CPU us/IO rr/rw qd32 |"
             " QSD submit syscalls/IO rr/rw qd32 | cpu pressure |")
    L.append("|" + "---|" * (len(TESTS) + 7))
    for c in labels:
        s = summary[c]
        g = gap(c)
        L.append("| %s | %s | %s | %s | %s / %s | %s / %s | %s / %s | %s |" % (
            c, " | ".join(fr(s["ratio"][t]) for t in TESTS),
            f(s["qd1_mean_delta_us"]["randread-4k-qd1"], "%+.0f"),
            f(s["qd1_mean_delta_us"]["randwrite-4k-qd1"], "%+.0f"),
            f(s["qsd_cpu_us_per_io"]["randread-4k-qd32"], "%.1f"),
            f(s["qsd_cpu_us_per_io"]["randwrite-4k-qd32"], "%.1f"),
            f(s["client_cpu_us_per_io"]["randread-4k-qd32"], "%.1f"),
            f(s["client_cpu_us_per_io"]["randwrite-4k-qd32"], "%.1f"),
            f(s["submits_per_io"]["randread-4k-qd32"]), f(s["submits_per_io"]["randwrite-4k-qd32"]),
            "-" if g is None else "%.0f%% (%.0f%%)" % g))
    L += ["", "Limit, CPU per I/O of the limit itself at depth 32 (rr/rw): %s / %s us." % (
        f(m("single", "limit@shipped-raw", "randread-4k-qd32", "client_cpu_us_per_io"), "%.1f"),
        f(m("single", "limit@shipped-raw", "randwrite-4k-qd32", "client_cpu_us_per_io"), "%.1f")), ""]
    L += ["The limit's tools (every limit run is both, back to back, order alternating): fio / "
          "`qsdctl bench` IOPS, median; which gave the limit.", "",
          "| test | fio / qsdctl | limit from |", "|---|---|---|"]
    for t in TESTS:
        L.append("| %s | %s | %s |" % (SHORT[t], f(tools[t]["fio_over_qsdctl"]), ", ".join(
            "%s %d" % kv for kv in sorted(tools[t]["won"].items())) or "-"))
    L += ["", "Medians of absolute numbers (IOPS / mean us):", ""]
    L.append("| run | " + " | ".join(SHORT[t] for t in TESTS) + " |")
    L.append("|" + "---|" * (len(TESTS) + 1))
    for c in labels:
        for l in ("limit@" + c, c):
            L.append("| %s | %s |" % (l, " | ".join(
                "%s / %s" % (f(m("single", l, t, "iops"), "%.0f"), f(m("single", l, t, "mean_us"), "%.0f"))
                for t in TESTS)))
    fuse = [c for c in labels if c.split("@")[0] in FUSE_CONFIGS]
    if fuse:
        L += ["", "## Pod volumes: the FUSE export", "",
              "fio (io_uring, O_DIRECT) on the loop device over the FUSE file (`fuse-loop-*`, "
              "buffered as the plugin sets it up) or on the FUSE file (`fuse-file-raw`); the "
              "vhost-user path is `shipped-raw` / `shipped-qcow2` above. Per I/O at depth 32 "
              "(rr / rw), medians: QSD's CPU (all its threads), fio's, the whole machine's "
              "(every tenant's too: the loop device's kernel workers are counted only here), "
              "the bytes QSD read or wrote, QSD's read/write syscalls.", "",
              "| configuration | IOPS rr/rw qd32 | mean us rr/rw qd1 | QSD CPU us | fio CPU us | "
              "machine CPU us | QSD bytes | QSD syscalls |", "|---|---|---|---|---|---|---|---|"]
        for c in fuse:
            def two(key, test_a, test_b, fmt):
                return "%s / %s" % (f(m("single", c, test_a, key), fmt), f(m("single", c, test_b, key), fmt))
            q = ("randread-4k-qd32", "randwrite-4k-qd32")
            L.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                c, two("iops", *q, "%.0f"), two("mean_us", "randread-4k-qd1", "randwrite-4k-qd1", "%.0f"),
                two("qsd_cpu_us_per_io", *q, "%.1f"), two("client_cpu_us_per_io", *q, "%.1f"),
                two("machine_cpu_us_per_io", *q, "%.1f"), two("qsd_bytes_per_io", *q, "%.0f"),
                two("qsd_syscalls_per_io", *q, "%.2f")))
    L += ["", "## Several volumes at once", "",
          "N QSDs (one per volume, each on its own file) and N clients at once; aggregate IOPS "
          "divided by N limit runs at once on the same N files, run just before. "
          "Target: 4 volumes >= 0.9.", ""]
    L.append("| configuration | test | 1 | 2 | 4 | aggregate IOPS 1 / 2 / 4 | limit 1 / 2 / 4 |")
    L.append("|---|---|---|---|---|---|---|")
    for c in multi_configs:
        for t in MULTI_TESTS:
            def aggs(label):
                return " / ".join(f(med([agg(r) for r in runs("multi", label, t, n).values()] or [0]), "%.0f")
                                  for n in (1, 2, 4))
            L.append("| %s | %s | %s | %s | %s |" % (c, SHORT[t], " | ".join(fr(multi[c][t][n]) for n in (1, 2, 4)),
                                                    aggs(c), aggs("limit@" + c)))
    L += ["", "## Command lines (as printed by `qsd-csi-plugin --print-qsd-command`, patched for the "
          "alternatives)", ""]
    for c, argv in b.argvs.items():
        line = " ".join(argv[1:]).replace(os.path.join(b.run, "img"), "IMAGES").replace(b.run, "RUN")
        L.append("- %s: `%s`" % (c, line))
    print("\n".join(L))
    if not usable and not b.a.allow_busy:
        sys.exit("bench: %d of %d runs had no quiet gap (cpu pressure > %g%%): results not "
                 "written (--allow-busy to write them, marked)" % (busy, len(b.psi), b.a.max_pressure))
    open(os.path.join(out, "results.md"), "w").write("\n".join(L) + "\n")
    if os.path.exists(os.path.join(out, "runs-partial.json")):
        os.unlink(os.path.join(out, "runs-partial.json"))

    with open(os.path.join(b.run, "ratio.dat"), "w") as fh:
        fh.write("config " + " ".join('"%s"' % SHORT[t] for t in TESTS) + "\n")
        for c in labels:
            fh.write(c + " " + " ".join("%.3f" % (summary[c]["ratio"][t] or (0,))[0] for t in TESTS) + "\n")
    with open(os.path.join(b.run, "multi.dat"), "w") as fh:
        cols = [(c, t) for c in multi_configs for t in MULTI_TESTS]
        fh.write("n " + " ".join('"%s %s"' % (c, SHORT[t]) for c, t in cols) + "\n")
        for n in (1, 2, 4):
            fh.write("%d %s\n" % (n, " ".join("%.3f" % (multi[c][t][n] or (0,))[0] for c, t in cols)))
    if shutil.which("gnuplot"):
        gp = """
set terminal png size 1800,700 font ",10" noenhanced
set output "{out}/bench.png"
set multiplot layout 1,2 title "Shipped QSD exports vs the io_uring O_DIRECT limit (same files, interleaved, median of {r} rounds)"
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set key top left
set xtics rotate by -30
set grid ytics
set title "One volume: IOPS / limit"
set yrange [0:1.6]
set arrow 1 from graph 0, first 0.9 to graph 1, first 0.9 nohead dt 2 lc rgb "red"
plot for [i=2:5] "{run}/ratio.dat" using i:xtic(1) title columnheader(i)
{multi}unset multiplot
""".format(out=out, run=b.run, r=b.a.rounds, multi="" if not multi_configs else """\
set title "N volumes at once: aggregate IOPS / N limit runs at once"
set arrow 1 from graph 0, first 0.9 to graph 1, first 0.9 nohead dt 2 lc rgb "red"
set xtics norotate
plot for [i=2:{mc}] "{run}/multi.dat" using i:xtic(1) title columnheader(i)
""".format(run=b.run, mc=1 + 2 * len(multi_configs)))
        subprocess.run(["gnuplot"], input=gp, text=True, check=True)
        print("bench: wrote %s/results.md, results.json, bench.png" % out, file=sys.stderr)
    else:
        print("bench: gnuplot not installed (Debian: gnuplot-nox): no plot", file=sys.stderr)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--runtime-ms", type=int, default=1000)
    p.add_argument("--ramp-ms", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--configs", help="comma list of configurations (default: all)")
    p.add_argument("--out", default="docs/bench")
    p.add_argument("--workdir", default="build/bench")
    p.add_argument("--plugin", default="build/csi/qsd-csi-plugin")
    p.add_argument("--qsdctl", default="build/qsdctl/qsdctl")
    p.add_argument("--qsd", default=shutil.which("qemu-storage-daemon") or "/usr/bin/qemu-storage-daemon")
    p.add_argument("--compare-qsd", help="run every configuration again with this QSD binary")
    p.add_argument("--max-pressure", type=float, default=20.0,
                   help="other tenants' CPU pressure (%%) above which a run waits for a quiet gap")
    p.add_argument("--quiet-wait-s", type=float, default=20.0,
                   help="how long a run waits for a quiet gap before it runs marked busy")
    p.add_argument("--single-only", action="store_true",
                   help="one volume only (no several-volumes-at-once phase)")
    p.add_argument("--allow-busy", action="store_true",
                   help="write the results even when more than a quarter of the runs were busy")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    b = Bench(a)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        b.go()
    finally:
        b.cleanup()


if __name__ == "__main__":
    main()
