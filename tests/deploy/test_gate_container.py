#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""qsd-node-gate in containers started the way deploy/ starts its two gates.

usage: test_gate_container.py --gate GATE [--root SRC]

The securityContexts of node-gate (30-node-daemonset.yaml) and
node-dial-gate (35-controller-deployment.yaml) are read from the manifests
and given to podman: user and group, capabilities (drop ALL, add the
manifest's), no_new_privs (allowPrivilegeEscalation: false), read-only root,
the runtime's default seccomp profile, the host network (and PID namespace
for node-gate); the Secret mounted read-only with mode 0400, the socket
directories as host directories.  The root filesystem is the built gate
and its libraries (ldd), nothing else (--rootfs: no image to build).

  both gates up and confined: /proc/PID/status of each: uid and gid the
  manifest's --uid/--gid, no supplementary group, every capability set
  empty, NoNewPrivs 1, Seccomp 2 (the runtime's filter and the gate's; 0
  of the gate's in a sanitizer build, QSD_SANITIZED=1)
  the relay: a client as the controller plugin's user and group (the
  manifest's) on the dial socket (0660, group the dial gate's runAsGroup):
  CONNECT, OK, bytes echoed by a unix server behind node-gate whose socket
  has the plugin's --node-ops-group
  minimal: node-gate with each of the manifest's capabilities taken away
  in turn exits "cannot confine itself" (so none is superfluous)

Exit 0: all good; 1: a failure; 77: not root, or podman cannot run a
container here.
"""
import argparse
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml is not installed")
    sys.exit(77)

FAILS = []
NAMES = []
PREFIX = "qsd-gate-ctest-%d" % os.getpid()
SANITIZED = os.environ.get("QSD_SANITIZED") == "1"


def check(cond, msg):
    print("%s %s" % ("ok  " if cond else "FAIL", msg), flush=True)
    if not cond:
        FAILS.append(msg)
    return cond


def run(*args, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 120)
    return subprocess.run(list(args), **kw)


def gate_container(root, rel):
    with open(os.path.join(root, "deploy/kubernetes", rel)) as fh:
        doc = next(d for d in yaml.safe_load_all(fh) if d and d["kind"] in ("DaemonSet",
                                                                             "Deployment"))
    spec = doc["spec"]["template"]["spec"]
    g = next(c for c in spec["containers"] if "qsd-node-gate" in str(c.get("command")))
    plugin = next(c for c in spec["containers"] if c["name"] == "qsd-csi-plugin")
    flags = {}
    for a in g.get("args") or []:
        n, eq, v = str(a)[2:].partition("=")
        flags[n] = v if eq else True
    pflags = {}
    for a in plugin.get("args") or []:
        n, eq, v = str(a)[2:].partition("=")
        pflags[n] = v if eq else True

    def eff(c, k):
        sc = c.get("securityContext") or {}
        return sc[k] if k in sc else (spec.get("securityContext") or {}).get(k)
    sc = g.get("securityContext") or {}
    return {"flags": flags, "plugin_flags": pflags, "caps": list(sc["capabilities"]["add"]),
            "drop": list(sc["capabilities"].get("drop") or []),
            "user": eff(g, "runAsUser") or 0, "group": eff(g, "runAsGroup") or 0,
            "nnp": sc.get("allowPrivilegeEscalation") is False,
            "ro": bool(sc.get("readOnlyRootFilesystem")),
            "host_net": bool(spec.get("hostNetwork")), "host_pid": bool(spec.get("hostPID")),
            "plugin_id": (eff(plugin, "runAsUser") or 0, eff(plugin, "runAsGroup") or 0)}


def rootfs(t, gate):
    r = os.path.join(t, "rootfs")
    os.makedirs(os.path.join(r, "usr/local/bin"))
    shutil.copy(gate, os.path.join(r, "usr/local/bin/qsd-node-gate"))
    for lib in re.findall(r"(/\S+) \(0x", run("ldd", gate).stdout):
        os.makedirs(r + os.path.dirname(lib), exist_ok=True)
        shutil.copy(lib, r + lib)
    for d in ("etc", "tmp", "csi-ops", "dial"):
        os.makedirs(os.path.join(r, d), exist_ok=True)
    return r


def podman_run(name, r, c, mounts, argv, caps=None):
    NAMES.append(name)
    cmd = ["podman", "run", "-d", "--name", name, "--rootfs", "--user",
           "%d:%d" % (c["user"], c["group"])]
    for d in c["drop"]:
        cmd += ["--cap-drop", d]
    for a in (c["caps"] if caps is None else caps):
        cmd += ["--cap-add", a]
    if c["nnp"]:
        cmd += ["--security-opt", "no-new-privileges"]
    if c["ro"]:
        cmd += ["--read-only"]
    if c["host_net"]:
        cmd += ["--network", "host"]
    if c["host_pid"]:
        cmd += ["--pid", "host"]
    for src, dst, ro in mounts:
        cmd += ["-v", "%s:%s%s" % (src, dst, ":ro" if ro else "")]
    p = run(*cmd, r, "/usr/local/bin/qsd-node-gate", *argv)
    return p


def logs(name, pattern, timeout=15):
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        p = run("podman", "logs", name)
        text = p.stdout + p.stderr
        m = re.search(pattern, text)
        if m:
            return m, text
        st = run("podman", "inspect", "-f", "{{.State.Status}}", name).stdout.strip()
        if st in ("exited", "stopped"):
            # The log can trail the state: a gate that exits at once (as
            # one without a capability does) was seen "exited" with its
            # log still empty.  Read it again, bounded.
            for _ in range(30):
                p = run("podman", "logs", name)
                text = p.stdout + p.stderr
                m = re.search(pattern, text)
                if m or time.monotonic() > deadline:
                    return m, text
                time.sleep(0.1)
            return None, text
        time.sleep(0.2)
    return None, text


def status(name):
    pid = run("podman", "inspect", "-f", "{{.State.Pid}}", name).stdout.strip()
    try:
        with open("/proc/%s/status" % pid) as fh:
            return dict(l.split(":\t", 1) for l in fh.read().splitlines() if ":\t" in l)
    except OSError:
        return {}


CLIENT = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(15)
s.connect(sys.argv[1]); s.sendall(b"CONNECT 127.0.0.1\n")
line = b""
while not line.endswith(b"\n") and len(line) < 256:
    d = s.recv(1)
    if not d: break
    line += d
print("LINE", line.decode().strip() or "EOF")
if line == b"OK\n":
    s.sendall(b"through both containers"); s.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        d = s.recv(4096)
        if not d: break
        got += d
    print("GOT", got.decode())
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gate", required=True)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    if os.geteuid() != 0:
        print("SKIP: needs root (rootful podman, users for the client)")
        return 77
    if not shutil.which("podman") or run("podman", "info", timeout=60).returncode:
        print("SKIP: podman cannot run here")
        return 77
    node = gate_container(root, "30-node-daemonset.yaml")
    ctl = gate_container(root, "35-controller-deployment.yaml")
    print("deploy/: node-gate %d:%d caps %s; node-dial-gate %d:%d caps %s" %
          (node["user"], node["group"], node["caps"], ctl["user"], ctl["group"], ctl["caps"]))
    t = tempfile.mkdtemp(prefix="qsd-gate-ctr.")
    os.chmod(t, 0o755)
    srv = None
    try:
        r = rootfs(t, a.gate)
        p = run(os.path.join(root, "scripts/node-certs.sh"), "--out", os.path.join(t, "pki"))
        if not check(p.returncode == 0, "node-certs.sh --out"):
            return 1
        secrets = {}
        for who in ("node", "controller"):
            d = os.path.join(t, "secret-" + who)
            os.makedirs(d)
            for src, dst in (("ca.crt", "ca.crt"), (who + ".crt", "tls.crt"),
                             (who + ".key", "tls.key")):
                shutil.copy(os.path.join(t, "pki", src), os.path.join(d, dst))
                os.chmod(os.path.join(d, dst), 0o400)  # the Secret's defaultMode
            secrets[who] = d
        # The plugin's node-operations socket (an emptyDir: 0777).
        ops = os.path.join(t, "ops")
        os.makedirs(ops)
        os.chmod(ops, 0o777)
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(os.path.join(ops, "node-ops.sock"))
        os.chown(os.path.join(ops, "node-ops.sock"), 0, int(node["plugin_flags"]["node-ops-group"]))
        os.chmod(os.path.join(ops, "node-ops.sock"), 0o660)
        srv.listen(8)

        def echo():
            while True:
                try:
                    c, _ = srv.accept()
                except OSError:
                    return
                with c:
                    while True:
                        d = c.recv(4096)
                        if not d:
                            break
                        c.sendall(d)
        threading.Thread(target=echo, daemon=True).start()
        dial = os.path.join(t, "dial")
        os.makedirs(dial)
        os.chmod(dial, 0o777)

        nf = node["flags"]
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        serve_argv = ["--listen=127.0.0.1:%d" % port, "--forward=" + nf["forward"],
                      "--ca=" + nf["ca"], "--cert=" + nf["cert"], "--key=" + nf["key"],
                      "--peer-name=" + nf["peer-name"], "--uid=" + nf["uid"], "--gid=" + nf["gid"]]
        node_mounts = [(ops, os.path.dirname(nf["forward"]), False),
                       (secrets["node"], os.path.dirname(nf["key"]), True)]
        p = podman_run(PREFIX + "-node", r, node, node_mounts, serve_argv)
        if not check(p.returncode == 0, "podman run node-gate: %s" % p.stderr.strip()[-200:]):
            return 1
        m, text = logs(PREFIX + "-node", r"msg=listening")
        if not check(m is not None, "node-gate listening in its container: %s" %
                     text.strip()[-300:]):
            return 1
        cf = ctl["flags"]
        dial_argv = ["--dial", "--listen-unix=" + cf["listen-unix"], "--port=%d" % port,
                     "--ca=" + cf["ca"], "--cert=" + cf["cert"], "--key=" + cf["key"],
                     "--peer-name=" + cf["peer-name"], "--uid=" + cf["uid"], "--gid=" + cf["gid"]]
        ctl_mounts = [(dial, os.path.dirname(cf["listen-unix"]), False),
                      (secrets["controller"], os.path.dirname(cf["key"]), True)]
        # The controller pod's own network is the host's here (a loopback
        # port to reach node-gate).
        p = podman_run(PREFIX + "-dial", r, dict(ctl, host_net=True), ctl_mounts, dial_argv)
        m, text = logs(PREFIX + "-dial", r"msg=listening mode=dial")
        if not check(p.returncode == 0 and m is not None, "node-dial-gate listening in its "
                     "container: %s" % (p.stderr + text).strip()[-300:]):
            return 1

        for name, f in ((PREFIX + "-node", nf), (PREFIX + "-dial", cf)):
            st = status(name)
            want = {"Uid": "%s\t%s\t%s\t%s" % ((f["uid"],) * 4),
                    "Gid": "%s\t%s\t%s\t%s" % ((f["gid"],) * 4), "Groups": "",
                    "CapInh": "0" * 16, "CapPrm": "0" * 16, "CapEff": "0" * 16,
                    "CapBnd": "0" * 16, "CapAmb": "0" * 16, "NoNewPrivs": "1",
                    "Seccomp": "2"}
            if SANITIZED:
                del want["Seccomp"]  # the runtime's filter only
            bad = {k: st.get(k, "").strip() for k, v in want.items() if st.get(k, "").strip() != v}
            check(st and not bad, "%s confined: uid/gid %s/%s, no group, every capability set "
                  "empty, NoNewPrivs 1, Seccomp 2 (Seccomp_filters %s)%s" %
                  (name[len(PREFIX) + 1:], f["uid"], f["gid"], st.get("Seccomp_filters"),
                   "; differs: %s" % bad if bad else ""))

        dsock = os.path.join(dial, os.path.basename(cf["listen-unix"]))
        s = os.stat(dsock)
        check(stat.S_IMODE(s.st_mode) == 0o660 and s.st_gid == ctl["group"],
              "the dial socket is %o, group %d (the dial gate's runAsGroup %d)" %
              (stat.S_IMODE(s.st_mode), s.st_gid, ctl["group"]))
        puid, pgid = ctl["plugin_id"]
        p = run("/usr/bin/python3", "-c", CLIENT, dsock, user=puid, group=pgid, extra_groups=[],
                cwd="/", timeout=60)
        out = dict(l.split(" ", 1) for l in p.stdout.splitlines() if " " in l)
        check(out.get("LINE") == "OK" and out.get("GOT") == "through both containers",
              "as the controller plugin (%d:%d): %s, echoed %r" %
              (puid, pgid, out.get("LINE"), out.get("GOT")))

        # Every capability the manifest adds is needed.
        for i, cap in enumerate(node["caps"]):
            fewer = [c for c in node["caps"] if c != cap]
            name = "%s-no-%s" % (PREFIX, cap.lower())
            p = podman_run(name, r, node, node_mounts,
                           ["--listen=127.0.0.1:0"] + serve_argv[1:],
                           caps=fewer)
            m, text = logs(name, r"cannot confine itself|msg=listening")
            check(p.returncode == 0 and m is not None and "cannot confine itself" in m.group(0),
                  "node-gate without %s: %s" % (cap, (text.strip().splitlines() or [
                      "no log (podman run exit %d: %s)" % (p.returncode, p.stderr.strip()[-200:])
                  ])[-1]))
    finally:
        for n in NAMES:
            run("podman", "rm", "-f", "-t", "2", n, timeout=60)
        if srv:
            srv.close()
        shutil.rmtree(t, ignore_errors=True)
    print("%d failure(s)" % len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
