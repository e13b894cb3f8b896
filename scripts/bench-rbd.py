#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""bench-rbd.py: the RBD row of the data-path benchmark (issue 16, item 5).

QSD-served RBD against librbd used directly, on the same throwaway Ceph
(tests/ceph/cephlib.py: one monitor, one memstore OSD, cephx), in one run:

- **qsd**: the volume's QSD exactly as the plugin runs it: the real plugin
  (--rbd-clusters) creates the volume (CreateVolume, backend rbd), stages it
  (its QSD with QEMU's rbd driver, the shipped options) and publishes it;
  `qsdctl bench` (the project's vhost-user client, one thread) on the
  published socket.  The QSD's command line is read from /proc and kept in
  the results.
- **librbd**: `rbd bench` (librbd's C++ API in one process, its cache off
  like the QSD's cache=none export) on a second image of the same size,
  created the same way (CreateVolume), as the same cephx user.

Tests: 4k random read and write at QD1 and QD32.  Both images are fully
written first (an object that does not exist reads as zeros without an OSD
round trip).  Interleaved: in every round each test runs librbd then qsd; a
ratio is the median over rounds of (qsd / the librbd run just before it).
The OSD keeps its objects in memory (memstore): there is no disk, and the
client, QSD, OSD and monitor share the machine's CPUs, so this compares the
CPU cost of the two paths, not a storage system.

    scripts/bench-rbd.py BUILD_DIR [--rounds 5] [--runtime-ms 3000]
                         [--ramp-ms 500] [--size-mib 256] [--out docs/bench/rbd]

Writes OUT/results.json (every run) and OUT/results.md (table, machine,
noise, command lines).  Everything it starts is stopped by PID; the cluster
and the temporary roots are removed, also on failure.
"""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "csi"))
sys.path.insert(0, os.path.join(ROOT, "tests", "ceph"))
import cephlib  # noqa: E402
import csilib  # noqa: E402

MiB = 1 << 20
TESTS = ["randread-4k-qd1", "randread-4k-qd32", "randwrite-4k-qd1", "randwrite-4k-qd32"]
med = statistics.median


def psi():
    out = {}
    for k in ("cpu", "io"):
        try:
            t = open("/proc/pressure/" + k).read()
            out[k] = float(re.search(r"some avg10=([\d.]+)", t).group(1))
        except OSError:
            out[k] = None
    return out


class RbdBench:
    def __init__(self, a):
        self.a = a
        self.rows = []
        self.ceph = cephlib.Cluster(prefix="qsd-bench-rbd-")
        self.env = csilib.Env(os.path.join(a.build, "csi", "qsd-csi-plugin"),
                              os.path.join(ROOT, "proto"), prefix="qsd-bench-rbd-")
        self.qsdctl = os.path.join(a.build, "qsdctl", "qsdctl")
        self.ops = {}          # test -> rbd bench operation count (~runtime)

    # ---------------------------------------------------------------- setup
    def setup(self):
        self.ceph.start()
        print("bench-rbd: ceph up in %.1f s" % self.ceph.start_seconds, file=sys.stderr)
        clusters = self.ceph.write_clusters(self.env.root)
        self.keyring = os.path.join(self.env.root, "keyring")
        with open(os.open(self.keyring, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write("[client.%s]\n\tkey = %s\n" % (self.ceph.user, self.ceph.key))
        c = self.env.start(extra=["--rbd-clusters", clusters])
        pb = self.env.pb
        secrets = {"userID": self.ceph.user, "userKey": self.ceph.key}
        params = {"backend": "rbd", "clusterID": "c1", "pool": self.ceph.pool,
                  "radosNamespace": self.ceph.namespace}
        cap = csilib.mount_cap(pb)
        size = self.a.size_mib * MiB
        vids = {}
        for name in ("qsd", "direct"):
            vids[name] = c.CreateVolume(pb.CreateVolumeRequest(
                name=name, capacity_range=pb.CapacityRange(required_bytes=size),
                volume_capabilities=[cap], parameters=params, secrets=secrets),
                timeout=csilib.CALL_TIMEOUT).volume.volume_id
            print("bench-rbd: filling %s (%d MiB)" % (name, self.a.size_mib), file=sys.stderr)
            self.rbd_bench(name, "write", "seq", "4M", 4, size)
        stg = os.path.join(self.env.kubelet, "plugins/kubernetes.io/csi/d/qsd/globalmount")
        tgt = os.path.join(self.env.kubelet, "pods/p1/volumes/kubernetes.io~csi/qsd/mount")
        os.makedirs(stg)
        os.makedirs(os.path.dirname(tgt))
        c.NodeStageVolume(pb.NodeStageVolumeRequest(
            volume_id=vids["qsd"], staging_target_path=stg, volume_capability=cap,
            secrets=secrets), timeout=csilib.CALL_TIMEOUT)
        c.NodePublishVolume(pb.NodePublishVolumeRequest(
            volume_id=vids["qsd"], staging_target_path=stg, target_path=tgt,
            volume_capability=cap), timeout=csilib.CALL_TIMEOUT)
        self.sock = os.path.join(tgt, "vhost.sock")
        pids = list(self.env.running_qsds())
        if len(pids) != 1:
            sys.exit("bench-rbd: want one QSD, found %s" % pids)
        self.qsd_pid = pids[0]
        with open("/proc/%d/cmdline" % self.qsd_pid, "rb") as f:
            self.qsd_argv = f.read().rstrip(b"\0").decode().split("\0")
        if any(self.ceph.key in x for x in self.qsd_argv):
            sys.exit("bench-rbd: the key is on the QSD's command line")

    # -------------------------------------------------------------- clients
    def rbd_bench(self, image, io_type, pattern, io_size, depth, total):
        """rbd bench as the plugin's cephx user, no configuration file, the
        cache off; (ops/s, CPU seconds of the client)."""
        argv = ["rbd", "-c", "/dev/null", "--mon-host", "v2:" + self.ceph.monitors,
                "--id", self.ceph.user, "--keyring", self.keyring, "--rbd-cache=false",
                "bench", "--io-type", io_type, "--io-pattern", pattern, "--io-size", io_size,
                "--io-threads", str(depth), "--io-total", str(total),
                "%s/%s/%s" % (self.ceph.pool, self.ceph.namespace, image)]
        self.rbd_argv = argv
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if r.returncode != 0:
            raise RuntimeError("rbd bench failed: %s" % r.stderr[-500:])
        m = re.search(r"elapsed:\s*([\d.]+)\s+ops:\s*(\d+)\s+ops/sec:\s*([\d.]+)", r.stdout)
        if not m:
            raise RuntimeError("rbd bench: no summary in %r" % r.stdout[-300:])
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        return float(m.group(3)), cpu, int(m.group(2))

    def librbd(self, test):
        io_type = "read" if "read" in test else "write"
        depth = int(test.split("qd")[1])
        if test not in self.ops:   # calibrate: about --runtime-ms of operations
            iops, _, _ = self.rbd_bench("direct", io_type, "rand", "4K", depth, 2000 * 4096)
            self.ops[test] = max(2000, int(iops * self.a.runtime_ms / 1000.0))
        p = psi()
        iops, cpu, ops = self.rbd_bench("direct", io_type, "rand", "4K", depth,
                                        self.ops[test] * 4096)
        return {"iops": iops, "mean_us": depth * 1e6 / iops,
                "client_cpu_us_per_io": cpu * 1e6 / ops, "qsd_cpu_us_per_io": 0.0}, p

    def qsd(self, test):
        p = psi()
        o = subprocess.run([self.qsdctl, "bench", "--json", "--runtime-ms", str(self.a.runtime_ms),
                            "--ramp-ms", str(self.a.ramp_ms), "--tests", test,
                            "--qsd-pid", str(self.qsd_pid), self.sock],
                           check=True, capture_output=True, text=True, timeout=600).stdout
        return json.loads(o)["results"][0], p

    # ---------------------------------------------------------------- runs
    def go(self):
        self.setup()
        self.start = (time.time(), open("/proc/loadavg").read().split()[:3])
        for rnd in range(1, self.a.rounds + 1):
            for t in TESTS:
                print("bench-rbd: round %d: %s" % (rnd, t), file=sys.stderr)
                for label, fn in (("librbd", self.librbd), ("qsd", self.qsd)):
                    res, p = fn(t)
                    self.rows.append({"label": label, "round": rnd, "test": t, "psi": p,
                                      "results": res})
        self.report()

    def cleanup(self):
        self.env.cleanup()
        self.ceph.stop()

    # -------------------------------------------------------------- report
    def report(self):
        out = self.a.out
        os.makedirs(out, exist_ok=True)

        def sh(c):
            return subprocess.run(c, shell=True, capture_output=True, text=True).stdout.strip()
        mach = [
            "date: " + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "kernel: " + os.uname().release,
            "cpu: %s x %d" % (sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | "
                                 "sed 's/^ *//'"), os.cpu_count()),
            "memory: %s MiB" % sh("free -m | awk '/Mem:/ {print $2}'"),
            "qemu: " + sh("qemu-storage-daemon --version | head -1"),
            "ceph: " + sh("ceph-osd --version"),
            "cluster: 1 monitor, 1 OSD (memstore, in memory), pool size 1, cephx; "
            "everything on this machine",
            "images: %d MiB each, fully written" % self.a.size_mib,
            "runtime: qsd %d ms per test after %d ms ramp; librbd ~the same number of "
            "seconds (operation count calibrated once); %d rounds" %
            (self.a.runtime_ms, self.a.ramp_ms, self.a.rounds),
            "load at start: %s; at end: %s" % (" ".join(self.start[1]),
                                                " ".join(open("/proc/loadavg").read().split()[:3])),
            "wall time: %.0f s" % (time.time() - self.start[0]),
            "git: " + (sh("git -C %s rev-parse --short HEAD" % ROOT) or "?"),
        ]
        by = {}
        for r in self.rows:
            by.setdefault((r["label"], r["test"]), []).append(r)
        L = ["# RBD: QSD-served against librbd directly", "",
             "`scripts/bench-rbd.py` (see its header and docs/bench/README.md).  Same "
             "throwaway cluster, same image size and features, same cephx user; "
             "interleaved rounds.  The OSD is memstore (objects in RAM): client, QSD, OSD "
             "and monitor share the CPUs, so this is a CPU-bound comparison of the two "
             "paths, not a measure of a Ceph cluster.", "",
             "| test | librbd IOPS (median, min-max) | qsd IOPS | qsd / librbd (median, "
             "min-max over rounds) | librbd CPU us/IO | qsd CPU us/IO (QSD + client) |",
             "| --- | --- | --- | --- | --- | --- |"]
        summary = {}
        for t in TESTS:
            lib = [r["results"] for r in by[("librbd", t)]]
            q = [r["results"] for r in by[("qsd", t)]]
            ratios = [b["iops"] / a["iops"] for a, b in zip(lib, q)]
            li, qi = [x["iops"] for x in lib], [x["iops"] for x in q]
            qcpu = [x["qsd_cpu_us_per_io"] + x["client_cpu_us_per_io"] for x in q]
            qsd_only = [x["qsd_cpu_us_per_io"] for x in q]
            summary[t] = {"ratio": med(ratios), "ratio_min": min(ratios),
                          "ratio_max": max(ratios), "librbd_iops": med(li), "qsd_iops": med(qi)}
            L.append("| %s | %.0f (%.0f-%.0f) | %.0f (%.0f-%.0f) | **%.2f** (%.2f-%.2f) | "
                     "%.0f | %.0f (%.0f + %.0f) |" %
                     (t, med(li), min(li), max(li), med(qi), min(qi), max(qi), med(ratios),
                      min(ratios), max(ratios),
                      med([x["client_cpu_us_per_io"] for x in lib]), med(qcpu), med(qsd_only),
                      med(qcpu) - med(qsd_only)))
        psis = [r["psi"]["cpu"] for r in self.rows if r["psi"]["cpu"] is not None]
        L += ["", "CPU pressure (PSI cpu some avg10, before each run): median %.1f, max %.1f "
              "(%% of time some task waited for a CPU)." % (med(psis), max(psis)) if psis else "",
              "", "## Machine", ""] + ["- " + m for m in mach]
        L += ["", "## Command lines", "",
              "QSD, as started by the plugin at NodeStage (read from /proc; the key is in a "
              "private file, `rbd-key0`):", "", "```", " ".join(self.qsd_argv), "```", "",
              "librbd (`rbd bench`, the last run):", "", "```",
              " ".join(self.rbd_argv).replace(self.keyring, "KEYRING"), "```", ""]
        with open(os.path.join(out, "results.md"), "w") as f:
            f.write("\n".join(L))
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump({"machine": mach, "summary": summary, "rows": self.rows,
                       "qsd_argv": self.qsd_argv}, f, indent=1)
        print("\n".join(L))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runtime-ms", type=int, default=3000)
    ap.add_argument("--ramp-ms", type=int, default=500)
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "bench", "rbd"))
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    a.out = os.path.abspath(a.out)
    why = cephlib.have_ceph()
    if why:
        sys.exit("bench-rbd: Ceph " + why + " (scripts/setup.sh)")
    b = RbdBench(a)
    try:
        b.go()
    finally:
        b.cleanup()


if __name__ == "__main__":
    main()
