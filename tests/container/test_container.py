#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The node plugin and a VM pod in real containers (podman + runc), run the way
deploy/ runs them, while a TCG guest writes patterned, fsync'ed blocks to a
volume the plugin serves.  One event per scenario, during the writes:

  kill-plugin     kill -9 of the plugin container's main process (host pid
                  from podman inspect), then podman start (kubelet restarting
                  the container): no QSD may be restarted
  restart-plugin  podman restart of the plugin container: no QSD restarted
  upgrade-plugin  the plugin replaced by a container of a newly built image
                  (another image id): no QSD restarted
  kill-qsd        kill -9 of the guest disk's QSD: the plugin restarts it

Each: the guest reports 0 write errors and 0 mismatches on read-back; its
longest single-write stall is printed in a FIGURES line and appended to the
figures file.  The plugin container runs privileged with the host's PID
namespace and cgroup filesystem (read-write), the temporary kubelet root and
run dir Bidirectional (rshared) at their host paths; the VM pod is an
unprivileged launcher container with the published volume directory
HostToContainer (rslave).  A second volume, staged and published but idle,
checks that its QSD is not restarted either.

usage: test_container.py SCENARIO --images IMAGES_ENV --proto DIR --cache DIR
                         --figures FILE [--build-images SCRIPT] [--sanitize]
Exit 77 (skip) only when podman cannot run here; the reason is printed.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ctrlib  # noqa: E402
from ctrlib import Failure, log  # noqa: E402

SCENARIOS = ("kill-plugin", "restart-plugin", "upgrade-plugin", "kill-qsd")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=SCENARIOS)
    ap.add_argument("--images", required=True)
    ap.add_argument("--proto", required=True)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--figures", required=True)
    ap.add_argument("--build-images", default=None)
    ap.add_argument("--sanitize", action="store_true")
    ap.add_argument("--write-secs", type=int,
                    default=int(os.environ.get("QSD_CTR_WRITE_SECS", "10")))
    a = ap.parse_args()
    why = ctrlib.podman_usable()
    if why:
        ctrlib.skip(why)
    if not os.path.exists(a.images):
        raise SystemExit("FAIL: %s missing: the container/images test (fixture) did not run "
                         "or failed" % a.images)
    images = ctrlib.read_images(a.images)
    st = ctrlib.Stack(a.scenario, images, a.proto, a.cache, a.figures)
    ok = False
    try:
        run(st, a)
        ok = True
    finally:
        if not ok:
            st.dump()
        st.cleanup()
        left = [n for n in st.containers
                if ctrlib.podman("container", "exists", n, check=False).returncode == 0]
        if left:
            print("FAIL: containers left behind: %s" % left)
            ok = False
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def upgrade_image(st, a):
    """A new plugin image: same Containerfile, another revision label, so a
    different image id (the build stage comes from the layer cache)."""
    name, tag = st.images["PLUGIN_IMAGE"].rsplit(":", 1)
    repo = name.rsplit("/", 1)[0]
    if a.sanitize and tag.endswith("-asan"):
        tag = tag[:-len("-asan")]       # build-images.sh --sanitize appends it
    args = ["bash", a.build_images, "--only", "plugin", "--quiet", "--repo", repo,
            "--tag", tag + "-upgrade", "--revision", "upgrade-test"]
    if a.sanitize:
        args.append("--sanitize")
    t = time.monotonic()
    r = subprocess.run(args, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise Failure("building the upgrade image failed: %s" % r.stderr[-3000:])
    line = [x for x in r.stdout.splitlines() if x.startswith("IMAGE plugin ")]
    if not line:
        raise Failure("build-images.sh printed no plugin image: %s" % r.stdout)
    new = line[0].split()[2]
    old_id = ctrlib.podman("image", "inspect", "-f", "{{.Id}}", st.images["PLUGIN_IMAGE"]).stdout
    new_id = ctrlib.podman("image", "inspect", "-f", "{{.Id}}", new).stdout
    if old_id == new_id:
        raise Failure("upgrade image has the same id as the old one")
    log("upgrade image %s (%s) built in %.1f s" % (new, new_id.strip()[:12],
                                                  time.monotonic() - t))
    return new


def run(st, a):
    scen = a.scenario
    new_image = upgrade_image(st, a) if scen == "upgrade-plugin" else None
    st.guest(a.write_secs)
    st.plugin_run()
    ms = st.wait_plugin_ready()
    log("plugin container %s ready in %d ms (host pid %d)" % (st.plugin_ctr, ms, st.plugin_pid()))
    disk = st.csi_setup("pvc-ctr-disk", "0c0ffee0-0000-4000-8000-00000000d15c")
    idle = st.csi_setup("pvc-ctr-idle", "0c0ffee0-0000-4000-8000-0000000001d1")
    before = st.qsd_pids()
    if set(before) != {"pvc-ctr-disk", "pvc-ctr-idle"} or not all(before.values()):
        raise Failure("QSDs after staging: %s" % before)
    log("QSDs: %s" % {k: v[0] for k, v in before.items()})

    st.vm_run(disk["tgt"])
    st.wait_console(r"^DISK size=", 240)
    st.wait_console(r"^W 10$", 120)
    log("guest writing (%s)" % st.wait_console(r"^WRITE-START.*$", 1).group(0))

    # ---------------------------------------------------------------- event
    problems = []
    t_event = time.monotonic()
    qsd_killed = None
    if scen == "kill-plugin":
        pid = st.plugin_pid()
        os.kill(pid, signal.SIGKILL)
        log("kill -9 of the plugin container's main process (host pid %d)" % pid)
        st.wait_container_exit(st.plugin_ctr, 30)
        # podman's cleanup of the dead container (runc delete, which kills
        # what is left in the container's cgroup) runs asynchronously; a
        # kubelet restarts a crashed container after a back-off too.
        time.sleep(2)
        check_qsds_alive(st, before, "2 s after the plugin container died", problems)
        ctrlib.podman("start", st.plugin_ctr)
        log("podman start %s" % st.plugin_ctr)
    elif scen == "restart-plugin":
        ctrlib.podman("restart", "-t", "30", st.plugin_ctr, timeout=120)
        log("podman restart %s done" % st.plugin_ctr)
    elif scen == "upgrade-plugin":
        st.remove_plugin(grace=30)
        log("old plugin container removed (SIGTERM, grace 30 s)")
        check_qsds_alive(st, before, "after the old plugin container was removed", problems)
        st.plugin_run(new_image)
        log("new plugin container %s from %s" % (st.plugin_ctr, new_image))
    elif scen == "kill-qsd":
        qsd_killed = before["pvc-ctr-disk"]
        os.kill(qsd_killed[0], signal.SIGKILL)
        log("kill -9 of the disk's QSD (pid %d)" % qsd_killed[0])
    if scen != "kill-qsd":
        st.wait_plugin_ready(60)
        ready_ms = int((time.monotonic() - t_event) * 1000)
        log("plugin serving again %d ms after the event" % ready_ms)

    # QSDs after the event.
    if scen == "kill-qsd":
        deadline = time.monotonic() + 30
        while True:
            now = st.qsd_pids()
            nd = now.get("pvc-ctr-disk")
            if nd and nd != qsd_killed and ctrlib.alive(nd):
                break
            if time.monotonic() > deadline:
                raise Failure("the killed QSD was not restarted within 30 s: %s" % now)
            time.sleep(0.05)
        qsd_back_ms = int((time.monotonic() - t_event) * 1000)
        log("QSD restarted as pid %d, %d ms after the kill" % (nd[0], qsd_back_ms))
        st.wait_plugin_ready(60)     # the plugin itself was not touched
        ready_ms = int((time.monotonic() - t_event) * 1000)
        if now.get("pvc-ctr-idle") != before["pvc-ctr-idle"]:
            problems.append("the idle volume's QSD changed: %s -> %s" % (before, now))
    else:
        check_qsds_alive(st, before, "after the event", problems)

    # ---------------------------------------------------------------- guest
    m = st.wait_console(r"^SUMMARY .*$", a.write_secs + 300)
    summary = dict(kv.split("=", 1) for kv in m.group(0).split()[1:])
    log("guest: %s" % m.group(0))
    stalls = re.findall(r"^STALL i=(\d+) ms=(\d+)$", st.console(), re.M)
    rc = st.vm_finish(60)
    log("VM pod exited with %s" % rc)

    after = st.qsd_pids()
    qsd_restarted = 0
    if scen != "kill-qsd":
        check_qsds_alive(st, before, "at the end of the guest's writes", problems)
        if after != before:
            qsd_restarted = 1
            problems.append("QSDs restarted: before %s, after %s" % (
                {k: v[0] for k, v in before.items()}, {k: v and v[0] for k, v in after.items()}))

    # The restarted/new plugin manages what its predecessor set up.
    for v in (disk, idle):
        st.csi_teardown(v)
    deadline = time.monotonic() + 10
    while st.all_our_qsds() and time.monotonic() < deadline:
        time.sleep(0.05)
    left = st.all_our_qsds()
    if left:
        problems.append("QSDs still running 10 s after unstage and delete: %s" % [
            (p, ctrlib.describe(p)) for p in left])
    pool = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(st.data, "pool")) for f in fs]
    if pool:
        problems.append("pool not empty after delete: %s" % pool)
    plugin_state = st.plugin_state()
    # Sanitizer reports (images built with --sanitize) in any container's log.
    logs = [l for _, l in st.plugin_logs] + [st.plugin_log_tail(100000)]
    logs.append(ctrlib.podman("logs", st.vm_ctr, check=False).stderr)
    for l in logs:
        for line in l.splitlines():
            if re.search(r"ERROR: (Address|Leak)Sanitizer|runtime error:", line):
                problems.append("sanitizer: " + line.strip()[:300])

    if summary.get("write_errors") != "0" or summary.get("mismatches") != "0":
        problems.append("guest data: %s" % m.group(0))
    if summary.get("ioerr") != "0":
        problems.append("guest kernel logged I/O errors: %s" % summary.get("ioerr"))
    if int(summary.get("writes", "0")) < 20:
        problems.append("guest wrote only %s blocks" % summary.get("writes"))
    if rc != "0":
        problems.append("launcher exit status %s, want 0 (guest powered off)" % rc)
    if plugin_state != "running":
        problems.append("plugin container %s at the end" % plugin_state)
    st.figure("FIGURES container/%s result=%s max_stall_ms=%s writes=%s write_errors=%s mismatches=%s "
              "ioerr=%s stalls_ge_200ms=%d plugin_ready_after_ms=%d qsd_restarted=%d%s" % (
                  scen, "FAIL" if problems else "PASS", summary.get("max_stall_ms"), summary.get("writes"),
                  summary.get("write_errors"), summary.get("mismatches"), summary.get("ioerr"),
                  len(stalls), ready_ms,
                  1 if scen == "kill-qsd" else qsd_restarted,
                  " qsd_back_ms=%d" % qsd_back_ms if scen == "kill-qsd" else ""))
    if problems:
        raise Failure("\n  ".join(problems))


def check_qsds_alive(st, before, when, problems):
    """Every QSD of `before` still the same process (pid and start time)."""
    dead = {v: ident[0] for v, ident in before.items() if not ctrlib.alive(ident)}
    if dead:
        msg = "QSDs gone %s: %s (a QSD must outlive the plugin container)" % (when, dead)
        log(msg)
        problems.append(msg)
    else:
        log("QSDs alive %s: %s" % (when, sorted(v[0] for v in before.values())))


def on_signal(sig, frame):
    raise SystemExit("FAIL: signal %d" % sig)     # the finally blocks clean up


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        sys.exit(main())
    except Failure as e:
        print("FAIL: %s" % e)
        sys.exit(1)
