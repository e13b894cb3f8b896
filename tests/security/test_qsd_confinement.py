#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 21: a compromised QSD is worth one volume, never the node.

Two volumes staged through the plugin (started with --qsd-cgroup).  Checked
from /proc for each live QSD: a uid and gid that are not 0 and differ
between the volumes, every capability set empty (effective, permitted,
inheritable, bounding, ambient), NoNewPrivs 1, Seccomp 2 (filter), a cgroup
of its own (<group>/vol-<volume>) and a mount namespace that is not the
plugin's.  Then from inside volume A's QSD context (qsd-confine-probe: A's
mount namespace, uid, gid and seccomp profile): A's own top image opens
read-write (the control), while B's top image, B's control directory, its
state file and QMP socket, the plugin's state records, a snapshot of B and
the layer directory's listing, /etc/shadow, and writing /etc are all
refused; userfaultfd is refused (EPERM), ptrace and mount kill the caller.

Also measured (qsdctl, the same machine, interleaved): QSD start to the
export accepting, confined vs unconfined (QSDCTL_QSD_UID_COUNT=0), with the
CPU pressure of /proc/pressure/cpu around it; the confined start must stay
within 250 ms of the unconfined one (median).

usage: test_qsd_confinement.py PLUGIN_BINARY PROTO_DIR QSDCTL  (env
QSD_CONFINE_PROBE: the probe binary)
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seclib  # noqa: E402
from seclib import csilib  # noqa: E402
from seclib import MiB  # noqa: E402

GROUP = "/qsd-csi-sec-%d" % os.getpid()
A, B = "pvc-conf-a", "pvc-conf-b"
ZERO_CAPS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


def status(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def probe(pid, checks):
    exe = os.environ.get("QSD_CONFINE_PROBE")
    args = [exe, str(pid)]
    for c in checks:
        args += list(c)
    r = subprocess.run(args, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, (r.returncode, r.stderr)
    res = {}
    for line in r.stdout.splitlines():
        f = line.split(" ", 3)
        if f[0] == "identity":
            res["identity"] = line
        elif len(f) >= 3:
            res[(f[0], f[1])] = (f[2], f[3] if len(f) > 3 else "")
    return res


def start_cost(qsdctl, rounds=6):
    """Median ms from spawn to the export accepting, confined and not."""
    root = tempfile.mkdtemp(prefix="qsd-sec-cost-")
    env = dict(os.environ, QSDCTL_RUN_DIR=os.path.join(root, "run"),
               QSDCTL_POOL=os.path.join(root, "pool"), QSDCTL_STATE_DIR=os.path.join(root, "st"))
    times = {"confined": [], "unconfined": []}
    with open("/proc/pressure/cpu") as f:
        before = f.readline().strip()
    try:
        subprocess.run([qsdctl, "create", "v", "--size", "16M"], env=env, check=True,
                       capture_output=True, timeout=60)
        for i in range(rounds):
            for kind in (("confined", "unconfined") if i % 2 == 0 else ("unconfined", "confined")):
                e = dict(env)
                if kind == "unconfined":
                    e["QSDCTL_QSD_UID_COUNT"] = "0"
                r = subprocess.run([qsdctl, "--json", "export", "v"], env=e, capture_output=True,
                                   text=True, timeout=60)
                assert r.returncode == 0, r.stderr
                times[kind].append(json.loads(r.stdout)["ready_ms"])
                subprocess.run([qsdctl, "unexport", "v"], env=e, check=True, capture_output=True,
                               timeout=60)
    finally:
        subprocess.run([qsdctl, "unexport", "v"], env=env, capture_output=True, timeout=60)
        subprocess.run(["rm", "-rf", root], check=False)
    with open("/proc/pressure/cpu") as f:
        after = f.readline().strip()
    return times, before, after


def run(s):
    pb = s.pb
    for v in (A, B):
        s.create(v, 16 * MiB)
        s.stage(v)
    s.ok("CreateSnapshot", pb.CreateSnapshotRequest(name="snap-conf-b", source_volume_id=B))
    pids = s.env.qsd_pids()
    pa, pbid = pids[A], pids[B]
    ids = {}
    # The QSD itself, and the vhost-user filter's head in front of it (the
    # recorded pid): the same identity, capabilities, no_new_privs, cgroup
    # and mount namespace.  Seccomp is checked on the QSD: the head installs
    # its own FILTER profile except in sanitizer builds (LeakSanitizer needs
    # ptrace), which CI runs too.
    procs = []
    for v, unit in ((A, pa), (B, pbid)):
        qsd = csilib.qsd_process(unit)
        procs.append((v, qsd, True))
        if qsd != unit:
            procs.append((v, unit, False))
    for v, pid, is_qsd in procs:
        st = status(pid)
        uids, gids = st["Uid"].split(), st["Gid"].split()
        s.check(len(set(uids)) == 1 and uids[0] != "0",
                "%s: the QSD runs as uid %s (real, effective, saved, fs)" % (v, st["Uid"]))
        s.check(len(set(gids)) == 1 and gids[0] != "0", "%s: the QSD's gid is %s" % (v, st["Gid"]))
        s.check(st.get("Groups", "") == "", "%s: supplementary groups %r" % (v, st.get("Groups")))
        for cap in ZERO_CAPS:
            s.check(int(st[cap], 16) == 0, "%s: %s is %s, not 0" % (v, cap, st[cap]))
        s.check(st["NoNewPrivs"] == "1", "%s: NoNewPrivs %s" % (v, st["NoNewPrivs"]))
        s.check(not is_qsd or st["Seccomp"] == "2",
                "%s: Seccomp mode %s, not 2 (filter)" % (v, st["Seccomp"]))
        own = GROUP + "/vol-" + v
        s.check(csilib.cgroup_of(pid) == own, "%s: the QSD is in cgroup %s, not %s" % (
            v, csilib.cgroup_of(pid), own))
        s.check(os.readlink("/proc/%d/ns/mnt" % pid) != os.readlink("/proc/%d/ns/mnt" % s.pid),
                "%s: the QSD shares the plugin's mount namespace" % v)
        s.check(ids.setdefault(v, uids[0]) == uids[0],
                "%s: the QSD and its filter head run as different uids" % v)
        print("ok %s: %s pid %d uid/gid %s/%s, no capabilities, NoNewPrivs, %scgroup %s, own "
              "mount namespace" % (v, "QSD" if is_qsd else "filter head", pid, uids[0], gids[0],
                                   "seccomp filter, " if is_qsd else "", own))
    s.check(ids[A] != ids[B], "two volumes' QSDs share uid %s" % ids[A])

    pool, run_dir = s.env.pool, s.run
    top = lambda v: os.path.join(pool, "volumes", v + ".qcow2")  # noqa: E731
    state_file = None
    for dirpath, _, files in os.walk(s.env.state):
        if files:
            state_file = os.path.join(dirpath, files[0])
            break
    snaps = os.listdir(os.path.join(pool, "snapshots"))
    assert state_file and snaps, (state_file, snaps)
    ctl_b = os.path.join(run_dir, "ctl", B)
    refused = [("openrw", top(B)), ("open", top(B)), ("list", ctl_b),
               ("open", os.path.join(ctl_b, "qsd.json")),
               ("connect", os.path.join(ctl_b, "qmp.sock")), ("open", state_file),
               ("open", os.path.join(pool, "snapshots", snaps[0])),
               ("list", os.path.join(pool, "layers")), ("open", "/etc/shadow"),
               ("openrw", "/etc/hostname"), ("call", "userfaultfd"), ("call", "ptrace"),
               ("call", "mount"), ("call", "unshare")]
    res = probe(pa, [("openrw", top(A))] + refused)
    print("probe in %s's QSD context: %s" % (A, res.get("identity")))
    s.check(res.get(("openrw", top(A)), ("?",))[0] == "ok",
            "the control failed: A's own top image does not open read-write in its QSD's "
            "context: %s" % (res.get(("openrw", top(A))),))
    for what, target in refused:
        got = res.get((what, target), ("missing", ""))
        s.check(got[0] == "refused", "from A's QSD context, %s %s: %s %s" % (
            what, target, got[0], got[1]))
        print("ok refused from A's QSD: %-8s %s (%s)" % (what, target, got[1]))
    s.check("killed" in res.get(("call", "ptrace"), ("", ""))[1], "ptrace is not killed")
    s.check("Operation not permitted" in res.get(("call", "userfaultfd"), ("", ""))[1],
            "userfaultfd is not refused with EPERM")

    times, before, after = start_cost(s.qsdctl)
    mc, mu = statistics.median(times["confined"]), statistics.median(times["unconfined"])
    print("cost: QSD start to accepting, median of %d: confined %.1f ms, unconfined %.1f ms "
          "(all: %s / %s); /proc/pressure/cpu before: %s; after: %s" % (
              len(times["confined"]), mc, mu, times["confined"], times["unconfined"], before,
              after))
    s.check(mc <= mu + 250, "a confined QSD starts %.0f ms later than an unconfined one" % (
        mc - mu))
    for v in (A, B):
        s.unstage(v)
    s.ok("DeleteSnapshot", pb.DeleteSnapshotRequest(snapshot_id="snap-conf-b"))


if __name__ == "__main__":
    if not os.environ.get("QSD_CONFINE_PROBE"):
        print("QSD_CONFINE_PROBE not set")
        sys.exit(2)
    try:
        rc = seclib.run_test(run, "qsd-sec-conf-", extra=("--qsd-cgroup", GROUP))
    finally:
        csilib.remove_cgroup(GROUP)
    sys.exit(rc)
