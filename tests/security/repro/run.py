#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Run the reproducers of tests/security/repro/ against a bare
qemu-storage-daemon (no plugin): for each, a fresh QSD serving a 16 MiB raw
file over vhost-user-blk, the reproducer run against its socket, then what
happened to the QSD: still running or dead (exit code / signal), the new
lines of its stderr, the kernel's messages about it (segfaults), whether an
honest client is served afterwards, and its fds and RSS before and after.

usage: run.py [--qsd 'COMMAND ...'] [--filter FILTER] [--keep] [NAME ...]
  --qsd: the QSD command (default qemu-storage-daemon); for QEMU 11.1.3 from
         scripts/trixie-root.sh:  --qsd "$(scripts/trixie-root.sh | tail -1)"
  --filter: put this qsd-vhost-filter between the reproducer and the QSD
         (the reproducer connects to the filter; the QSD's own socket is
         private), to see which attacks it stops
  NAME:  reproducers to run (vring_index inflight_queues ...); default all.
Exit 0 when every reproducer ran (whatever it found); it prints one block
per reproducer and a summary table.  Every wait is bounded."""
import argparse
import glob
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import vuattack as vu  # noqa: E402

MARKERS = ("stack smashing", "malloc", "free(", "corrupted", "double free", "Segmentation",
           "Aborted", "assert", "vu_panic", "Error", "error")


def dmesg_lines():
    try:
        return subprocess.run(["dmesg"], capture_output=True, text=True,
                              timeout=10).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return []


def stamp(line):
    m = re.match(r"\[\s*(\d+\.\d+)\]", line)
    return float(m.group(1)) if m else 0.0


def start_filter(filt, d, upstream):
    sock = os.path.join(d, "tenant.sock")
    log = open(os.path.join(d, "filter.log"), "w")
    p = subprocess.Popen([os.path.abspath(filt), "--export", "%s=%s" % (sock, upstream), "--queues", "1"],
                         stdout=log, stderr=subprocess.STDOUT, cwd=d)
    end = time.monotonic() + 10
    while not os.path.exists(sock):
        if p.poll() is not None or time.monotonic() > end:
            raise RuntimeError("filter did not start: %s" % open(log.name).read())
        time.sleep(0.02)
    return p, sock


def start_qsd(qsd, d):
    img = os.path.join(d, "disk.raw")
    with open(img, "wb") as f:
        f.truncate(16 << 20)
    sock = os.path.join(d, "vhost.sock")
    log = open(os.path.join(d, "qsd.log"), "w")
    cmd = shlex.split(qsd) + [
        "--blockdev", "driver=file,filename=%s,node-name=file0" % img,
        "--export", "type=vhost-user-blk,id=exp0,node-name=file0,writable=on,"
        "addr.type=unix,addr.path=%s" % sock]
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=d)
    end = time.monotonic() + 10
    while not os.path.exists(sock):
        if p.poll() is not None or time.monotonic() > end:
            raise RuntimeError("QSD did not start: %s" % open(log.name).read())
        time.sleep(0.02)
    return p, sock, cmd


def one(name, qsd, keep, filt=None):
    d = tempfile.mkdtemp(prefix="qsd-repro-%s-" % name)
    p = fp = None
    res = {"name": name}
    try:
        p, sock, cmd = start_qsd(qsd, d)
        if filt:
            fp, sock = start_filter(filt, d, sock)
        ok, why = vu.serves(sock, 3)
        base_fds, base_rss = vu.proc_fds(p.pid), vu.proc_rss(p.pid)
        print("== %s  (QSD pid %d: %s)" % (name, p.pid, why))
        print("   $ " + " ".join(shlex.quote(x) for x in cmd))
        print("   $ %s %s %d" % (os.path.join(HERE, "repro_%s.py" % name), sock, p.pid))
        dm = dmesg_lines()
        dm0 = stamp(dm[-1]) if dm else 0.0
        try:
            r = subprocess.run([sys.executable, os.path.join(HERE, "repro_%s.py" % name), sock,
                                str(p.pid)], capture_output=True, text=True, timeout=60)
            out = r.stdout + r.stderr
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode() + "\n(reproducer timed out after 60 s)"
        for line in out.strip().splitlines():
            print("   | " + line)
        time.sleep(0.5)
        served = vu.serves_within(sock, 3, 2) if p.poll() is None else (False, "QSD is gone")
        time.sleep(0.3)
        rc = p.poll()
        if rc is None:
            state = "alive"
        elif rc < 0:
            state = "killed by %s" % signal.Signals(-rc).name
        else:
            state = "exited %d" % rc
        res.update(state=state, served=served[0],
                   fds="%d->%d" % (base_fds, vu.proc_fds(p.pid)) if rc is None else "-",
                   rss="%d->%d MiB" % (base_rss >> 20, vu.proc_rss(p.pid) >> 20)
                   if rc is None else "-")
        print("   QSD: %s; honest client afterwards: %s" % (state, served[1]))
        if rc is None:
            print("   QSD fds %s, RSS %s" % (res["fds"], res["rss"]))
        log = open(os.path.join(d, "qsd.log"), errors="replace").read().strip().splitlines()
        for line in log[-12:]:
            print("   stderr: " + line[:200])
        if fp:
            flog = open(os.path.join(d, "filter.log"), errors="replace").read().strip()
            for line in flog.splitlines()[-6:]:
                print("   filter: " + line[:200])
            res["filter"] = "alive" if fp.poll() is None else "exit %s" % fp.poll()
        res["stderr"] = next((ln for ln in log if any(m in ln for m in MARKERS[:6])),
                             log[-1] if log else "")
        for line in (ln for ln in dmesg_lines() if stamp(ln) > dm0):
            if "qemu-storage" in line or "traps:" in line:
                print("   kernel: " + line[:200])
                res.setdefault("kernel", line.split("]", 1)[-1].strip()[:80])
    finally:
        for proc in (fp, p):
            if proc and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        if keep:
            print("   (kept %s)" % d)
        else:
            shutil.rmtree(d, ignore_errors=True)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qsd", default="qemu-storage-daemon")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--filter", help="a qsd-vhost-filter binary to put in front of the QSD")
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    names = a.names or sorted(os.path.basename(f)[6:-3]
                              for f in glob.glob(os.path.join(HERE, "repro_*.py")))
    ver = subprocess.run(shlex.split(a.qsd) + ["--version"], capture_output=True,
                         text=True, timeout=10).stdout.splitlines()[0]
    print("QSD: %s\n" % ver)
    if a.filter:
        print("through the filter %s\n" % a.filter)
    results = [one(n, a.qsd, a.keep, a.filter) for n in names]
    print("\nsummary (%s):" % ver)
    for r in results:
        print("  %-18s QSD %-22s served after: %-3s %s" % (
            r["name"], r.get("state", "?"), "yes" if r.get("served") else "no",
            r.get("kernel") or r.get("stderr", "")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
