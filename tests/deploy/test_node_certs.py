#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""scripts/node-certs.sh and the Helm chart's node-endpoint Secrets, used by
the real qsd-node-gate the way deploy/ runs it.

usage: test_node_certs.py --gate GATE [--root SRC] [--helm HELM]
  (HELM: default $QSD_HELM_DIR/helm, /var/cache/qsd-csi/helm/helm, which
  tests/helm/run.sh builds; without it the helm part is left out, said so)

What the manifests say is read from deploy/kubernetes (the gates' --peer-name,
--uid/--gid, the Secrets and the file names the gates read, the plugin's
--node-ops-group, the controller pod's user and group, the dial gate's
group), so that the certificates are checked against what is deployed:

  out      --out DIR: six PEM files, keys 0600, DIR 0700; `openssl verify
           -purpose sslserver` of the node's certificate and `-purpose
           sslclient` of the controller's pass, the other way round fail;
           subjectAltName the peer name each gate checks; EC P-256, 10
           years; each key the certificate's; run again: refused, nothing
           changed; --rotate: new material; no key printed
  relay    a serve gate with the node pair (forwarding to a unix echo server
           whose socket is 0660 with the plugin's --node-ops-group) and a
           dial gate with the controller pair (started with the dial gate's
           group, as runAsGroup), both confined to the manifests' uid and
           gid, on 127.0.0.1: a client running as the controller plugin's
           user and group connects to the dial socket (0660), CONNECT, OK,
           1 MiB each way checked by SHA-256; a user of another group
           cannot connect; a dial gate holding the node pair as its identity
           gets nothing relayed (the serve gate refuses it); a serve gate
           holding the controller pair is refused by the dial gate (ERR tls)
  helm     with --helm: the same relay with the two Secrets `helm template`
           renders for the chart
  apply    --apply with a fake kubectl (records its arguments and input):
           the Namespace made as 00-namespace.yaml when missing, both
           Secrets created with the keys the gates read, one CA, nothing
           printed of a key; run again: nothing made (exit 0); one Secret
           only: refused; --rotate: both replaced with new material;
           kubectl failing, a bad namespace name: refused, nothing made

Exit 0: all good; 1: a failure; 77: not root (the gates confine
themselves) or no openssl.
"""
import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "csi"))
import gatelib  # noqa: E402
from gatelib import Echo  # noqa: E402

try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml is not installed")
    sys.exit(77)

FAILS = []
PROCS = []
FILES = ["ca.crt", "ca.key", "node.crt", "node.key", "controller.crt", "controller.key"]


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


def openssl(*args):
    return run("openssl", *args)


# ---- what deploy/ says --------------------------------------------------------

def manifests(root):
    def load(rel):
        with open(os.path.join(root, "deploy/kubernetes", rel)) as fh:
            return [d for d in yaml.safe_load_all(fh) if d]

    def flags(c):
        out = {}
        for a in c.get("args") or []:
            name, eq, val = str(a)[2:].partition("=")
            out[name] = val if eq else True
        return out

    def gate(doc):
        spec = doc["spec"]["template"]["spec"]
        g = next(c for c in spec["containers"] if "qsd-node-gate" in str(c.get("command")))
        f = flags(g)
        vols = {v["name"]: v for v in spec["volumes"]}
        files = {}
        for k in ("ca", "cert", "key"):
            path = f[k]
            m = max((m for m in g["volumeMounts"] if path.startswith(m["mountPath"] + "/")),
                    key=lambda m: len(m["mountPath"]))
            files[k] = (vols[m["name"]]["secret"]["secretName"], os.path.basename(path))
        return spec, g, f, files

    ds = next(d for d in load("30-node-daemonset.yaml") if d["kind"] == "DaemonSet")
    dep = next(d for d in load("35-controller-deployment.yaml") if d["kind"] == "Deployment")
    nspec, ngate, nf, nfiles = gate(ds)
    cspec, cgate, cf, cfiles = gate(dep)
    plugin = flags(next(c for c in nspec["containers"] if c["name"] == "qsd-csi-plugin"))
    cplugin = next(c for c in cspec["containers"] if c["name"] == "qsd-csi-plugin")
    psc, csc = cspec.get("securityContext") or {}, cplugin.get("securityContext") or {}
    ns_doc = next(d for d in load("00-namespace.yaml") if d["kind"] == "Namespace")
    return {
        "serve_peer": nf["peer-name"], "dial_peer": cf["peer-name"],
        "serve_id": (int(nf["uid"]), int(nf["gid"])), "dial_id": (int(cf["uid"]), int(cf["gid"])),
        "ops_group": int(plugin["node-ops-group"]),
        "plugin_id": (int(csc.get("runAsUser", psc.get("runAsUser"))),
                      int(csc.get("runAsGroup", psc.get("runAsGroup")))),
        "dial_group": int((cgate.get("securityContext") or {}).get("runAsGroup", 0)),
        "node_files": nfiles, "controller_files": cfiles,
        "ns_labels": ns_doc["metadata"]["labels"],
    }


# ---- gates and an echo server ------------------------------------------------------

class Gate(gatelib.GateProcess):
    def __init__(self, argv, group=None):
        super().__init__(argv, group)
        PROCS.append(self)


# A client of the dial socket in a process of its own (another user):
# CONNECT, then N bytes each way; prints the answer line and the digests.
CLIENT = r"""
import hashlib, os, socket, sys, threading
path, host, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(20)
try:
    s.connect(path)
except OSError as e:
    print("CONNECT-ERROR", e.errno); sys.exit(0)
s.sendall(("CONNECT %s\n" % host).encode())
line = b""
while not line.endswith(b"\n") and len(line) < 256:
    d = s.recv(1)
    if not d:
        break
    line += d
print("LINE", line.decode().strip() or "EOF")
if line != b"OK\n":
    sys.exit(0)
data = os.urandom(n)
def send():
    s.sendall(data); s.shutdown(socket.SHUT_WR)
t = threading.Thread(target=send); t.start()
got = hashlib.sha256(); total = 0
while True:
    try:
        d = s.recv(65536)
    except OSError:
        break
    if not d:
        break
    got.update(d); total += len(d)
t.join()
print("SENT", hashlib.sha256(data).hexdigest(), n)
print("GOT", got.hexdigest(), total)
"""


def dial_client(path, uid, gid, n=1 << 20):
    # /usr/bin/python3: the test's interpreter may be in a directory the
    # client's user cannot read.
    p = run("/usr/bin/python3", "-c", CLIENT, path, "127.0.0.1", str(n), user=uid, group=gid,
            extra_groups=[], timeout=60, cwd="/")
    out = dict(l.split(" ", 1) for l in p.stdout.splitlines() if " " in l)
    return out, p


def relay(t, gate_bin, m, pki, label):
    """pki: dict ca, node_crt, node_key, controller_crt, controller_key -> path."""
    d = tempfile.mkdtemp(prefix="relay.", dir=t)
    os.chmod(d, 0o755)
    echo = Echo(os.path.join(d, "csi-ops", "node-ops.sock"), m["ops_group"])
    os.chmod(os.path.join(d, "csi-ops"), 0o777)  # an emptyDir's mode
    os.makedirs(os.path.join(d, "dial"), mode=0o777)
    os.chmod(os.path.join(d, "dial"), 0o777)
    suid, sgid = m["serve_id"]
    duid, dgid = m["dial_id"]
    puid, pgid = m["plugin_id"]
    gates = []

    def serve(cert, key):
        g = Gate([gate_bin, "--listen", "127.0.0.1:0", "--forward", echo.sock.getsockname(),
                  "--ca", pki["ca"], "--cert", cert, "--key", key,
                  "--peer-name", m["serve_peer"], "--uid", str(suid), "--gid", str(sgid)])
        gates.append(g)
        return g

    def dial(sock, port, cert, key):
        g = Gate([gate_bin, "--dial", "--listen-unix", sock, "--port", str(port),
                  "--ca", pki["ca"], "--cert", cert, "--key", key,
                  "--peer-name", m["dial_peer"], "--uid", str(duid), "--gid", str(dgid)],
                 group=m["dial_group"])
        gates.append(g)
        return g

    try:
        sg = serve(pki["node_crt"], pki["node_key"])
        sock = os.path.join(d, "dial", "dial.sock")
        dial(sock, sg.port, pki["controller_crt"], pki["controller_key"])
        st = os.stat(sock)
        check(stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == m["dial_group"],
              "%s: the dial socket is %o, group %d (0660, the dial gate's runAsGroup %d)" %
              (label, stat.S_IMODE(st.st_mode), st.st_gid, m["dial_group"]))
        out, p = dial_client(sock, puid, pgid)
        sent, got = out.get("SENT", "").split(), out.get("GOT", "").split()
        check(out.get("LINE") == "OK" and sent and sent == got and int(got[1]) == 1 << 20,
              "%s: as the controller plugin (%d:%d): CONNECT 127.0.0.1 answered %s, 1 MiB each "
              "way, SHA-256 equal (%s)" % (label, puid, pgid, out.get("LINE"),
                                           (got or ["nothing"])[0][:16]))
        if p.returncode or "LINE" not in out:
            print(p.stdout, p.stderr)
        check(sg.wait_line(r"msg=connected", 5) is not None, "%s: the serve gate logged the "
              "verified connection" % label)
        other = pgid + 1
        out, _ = dial_client(sock, puid + 1, other, n=16)
        check(out.get("CONNECT-ERROR") == "13", "%s: a user of another group (%d) cannot "
              "connect to the dial socket (errno %s, EACCES 13)" %
              (label, other, out.get("CONNECT-ERROR")))

        # The node's pair as the controller's identity: refused by the serve
        # gate (TLS 1.3: after the dial gate's OK), nothing relayed.
        before = echo.conns
        sock2 = os.path.join(d, "dial", "wrong.sock")
        dial(sock2, sg.port, pki["node_crt"], pki["node_key"])
        out, _ = dial_client(sock2, puid, pgid, n=4096)
        time.sleep(0.3)
        check(echo.conns == before and out.get("GOT", "x 0").split()[1] == "0" and
              sg.wait_line(r"msg=refused.*certificate", 5) is not None,
              "%s: the node's pair as the controller's: refused by the serve gate (%s), "
              "nothing relayed (%d connections reached the socket)" %
              (label, (sg.wait_line(r"msg=refused.*", 1) or [""])[0][:90], echo.conns - before))
        # The controller's pair as a node's: the dial gate refuses the server.
        wrong = serve(pki["controller_crt"], pki["controller_key"])
        sock3 = os.path.join(d, "dial", "wrong-server.sock")
        dial(sock3, wrong.port, pki["controller_crt"], pki["controller_key"])
        out, _ = dial_client(sock3, puid, pgid, n=16)
        check(out.get("LINE", "").startswith("ERR tls:") and echo.conns == before,
              "%s: the controller's pair as a node's: %s" % (label, out.get("LINE")))
    finally:
        for g in gates:
            g.stop()
        echo.stop()


# ---- --out -------------------------------------------------------------------

def digest(d):
    return {f: hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest()
            for f in FILES if os.path.exists(os.path.join(d, f))}


def no_key_printed(label, text, keydir):
    keys = [open(os.path.join(keydir, f)).read() for f in FILES if f.endswith(".key")] \
        if keydir else []
    bodies = [l for k in keys for l in k.splitlines() if l and not l.startswith("-----")]
    leaked = "PRIVATE KEY" in text or any(b in text for b in bodies)
    check(not leaked, "%s: no key in the script's output" % label)


def test_out(t, script, m):
    out = os.path.join(t, "pki")
    p = run(script, "--out", out)
    check(p.returncode == 0, "--out: exit %d %s" % (p.returncode, p.stderr.strip()[-200:]))
    if p.returncode:
        return None
    no_key_printed("--out", p.stdout + p.stderr, out)
    check(sorted(os.listdir(out)) == sorted(FILES), "--out: the files %s" % sorted(os.listdir(out)))
    modes = {f: stat.S_IMODE(os.stat(os.path.join(out, f)).st_mode) for f in FILES}
    check(all(v == (0o600 if f.endswith(".key") else 0o644) for f, v in modes.items()) and
          stat.S_IMODE(os.stat(out).st_mode) == 0o700,
          "--out: keys 0600, certificates 0644, the directory 0700 (%s, %o)" %
          (" ".join("%s=%o" % x for x in sorted(modes.items())), stat.S_IMODE(os.stat(out).st_mode)))
    f = lambda n: os.path.join(out, n)
    for leaf, good, bad in (("node", "sslserver", "sslclient"),
                            ("controller", "sslclient", "sslserver")):
        ok = openssl("verify", "-CAfile", f("ca.crt"), "-purpose", good, f(leaf + ".crt"))
        no = openssl("verify", "-CAfile", f("ca.crt"), "-purpose", bad, f(leaf + ".crt"))
        check(ok.returncode == 0 and no.returncode != 0,
              "%s.crt: openssl verify -purpose %s passes (%s), -purpose %s fails" %
              (leaf, good, ok.stdout.strip().split(": ")[-1], bad))
        san = openssl("x509", "-in", f(leaf + ".crt"), "-noout", "-ext", "subjectAltName").stdout
        peer = m["dial_peer"] if leaf == "node" else m["serve_peer"]
        check(re.findall(r"DNS:([^\s,]+)", san) == [peer],
              "%s.crt: subjectAltName DNS:%s, the peer name the other gate checks (%s)" %
              (leaf, peer, " ".join(san.split()[3:])))
        kp = openssl("pkey", "-in", f(leaf + ".key"), "-pubout").stdout
        cp = openssl("x509", "-in", f(leaf + ".crt"), "-noout", "-pubkey").stdout
        check(kp and kp == cp, "%s.key is the key of %s.crt" % (leaf, leaf))
    text = openssl("x509", "-in", f("ca.crt"), "-noout", "-text").stdout
    long = openssl("x509", "-in", f("ca.crt"), "-noout", "-checkend", str(3649 * 86400))
    check("prime256v1" in text and "CA:TRUE" in text and long.returncode == 0,
          "ca.crt: EC P-256, CA:TRUE, valid for 10 years")
    before = digest(out)
    p = run(script, "--out", out)
    check(p.returncode == 1 and digest(out) == before and "exists" in p.stderr,
          "--out again: refused (exit %d: %s), nothing changed" % (p.returncode, p.stderr.strip()))
    p = run(script, "--out", out, "--rotate")
    after = digest(out)
    check(p.returncode == 0 and all(after[k] != before[k] for k in FILES),
          "--out --rotate: exit %d, every file new" % p.returncode)
    return out


# ---- --apply with a fake kubectl ------------------------------------------------

FAKE_KUBECTL = r"""#!/usr/bin/python3
import json, os, sys, yaml
state, log = os.environ["FAKE_STATE"], os.environ["FAKE_LOG"]
argv = sys.argv[1:]
stdin = sys.stdin.read() if "-f" in argv else ""
with open(log, "a") as fh:
    fh.write(json.dumps({"argv": argv, "stdin": stdin}) + "\n")
if os.environ.get("FAKE_FAIL"):
    print("The connection to the server localhost:8080 was refused", file=sys.stderr)
    sys.exit(1)
def path(kind, name, ns):
    return os.path.join(state, "%s.%s.%s" % (kind.lower(), ns or "-", name))
if argv[0] == "get":
    ns = argv[argv.index("--namespace") + 1] if "--namespace" in argv else None
    if os.path.exists(path(argv[1], argv[2], ns)):
        print("%s/%s" % (argv[1], argv[2]))
    sys.exit(0)
if argv[0] in ("create", "replace", "apply") and argv[1:] == ["-f", "-"]:
    d = yaml.safe_load(stdin)
    p = path(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace"))
    if argv[0] == "create" and os.path.exists(p):
        print("AlreadyExists", file=sys.stderr); sys.exit(1)
    if argv[0] == "replace" and not os.path.exists(p):
        print("NotFound", file=sys.stderr); sys.exit(1)
    with open(p, "w") as fh:
        fh.write(stdin)
    print("%s/%s %sd" % (d["kind"].lower(), d["metadata"]["name"], argv[0].rstrip("e")))
    sys.exit(0)
print("fake kubectl: unexpected %s" % argv, file=sys.stderr)
sys.exit(2)
"""


def test_apply(t, script, m):
    d = os.path.join(t, "apply")
    state, log = os.path.join(d, "state"), os.path.join(d, "kubectl.log")
    os.makedirs(state)
    fake = os.path.join(d, "kubectl")
    with open(fake, "w") as fh:
        fh.write(FAKE_KUBECTL)
    os.chmod(fake, 0o755)
    env = dict(os.environ, KUBECTL=fake, FAKE_STATE=state, FAKE_LOG=log)

    def calls():
        if not os.path.exists(log):
            return []
        with open(log) as fh:
            return [json.loads(l) for l in fh]

    def apply(*args, **extra):
        n = len(calls())
        p = run(script, "--apply", *args, env=dict(env, **extra))
        return p, calls()[n:]

    def secret(name, ns="qsd-csi"):
        with open(os.path.join(state, "secret.%s.%s" % (ns, name))) as fh:
            return yaml.safe_load(fh)

    writes = lambda cs: [c["argv"][0] for c in cs if c["argv"][0] in ("create", "replace", "apply")]
    node_s = m["node_files"]["ca"][0]
    ctl_s = m["controller_files"]["ca"][0]

    p, cs = apply("qsd-csi")
    check(p.returncode == 0 and writes(cs) == ["apply", "create", "create"],
          "--apply qsd-csi (nothing there): exit %d, kubectl %s" %
          (p.returncode, " ".join(writes(cs))))
    no_key_printed("--apply", p.stdout + p.stderr, None)
    ns = yaml.safe_load(next((c["stdin"] for c in cs if c["argv"][0] == "apply"), "{}")) or {}
    check(ns.get("kind") == "Namespace" and ns["metadata"].get("labels") == m["ns_labels"],
          "--apply: the Namespace made with 00-namespace.yaml's labels (%s)" %
          ns.get("metadata", {}).get("labels"))
    try:
        sn, sc = secret(node_s), secret(ctl_s)
    except OSError as e:
        check(False, "--apply: the Secrets %s, %s: %s" % (node_s, ctl_s, e))
        return
    keys_node = {f for _, f in m["node_files"].values()}
    keys_ctl = {f for _, f in m["controller_files"].values()}
    check(set(sn["data"]) == keys_node and set(sc["data"]) == keys_ctl and
          sn["data"]["ca.crt"] == sc["data"]["ca.crt"],
          "--apply: %s has %s, %s has %s (the files the gates read), one CA" %
          (node_s, sorted(sn["data"]), ctl_s, sorted(sc["data"])))
    for s in (sn, sc):
        key = base64.b64decode(s["data"]["tls.key"]).decode()
        body = "".join(l for l in key.splitlines() if not l.startswith("-----"))
        if body and body[:40] in p.stdout + p.stderr:
            check(False, "--apply printed the key of %s" % s["metadata"]["name"])
    pki = os.path.join(d, "from-secrets")
    os.makedirs(pki)
    for s, who in ((sn, "node"), (sc, "controller")):
        for k, f in (("ca.crt", "ca.crt"), ("tls.crt", who + ".crt"), ("tls.key", who + ".key")):
            with open(os.path.join(pki, f), "wb") as fh:
                fh.write(base64.b64decode(s["data"][k]))
    v = openssl("verify", "-CAfile", os.path.join(pki, "ca.crt"), "-purpose", "sslserver",
                os.path.join(pki, "node.crt"))
    check(v.returncode == 0, "--apply: the node Secret's certificate verifies against its CA")
    first_ca = sn["data"]["ca.crt"]

    p, cs = apply("qsd-csi")
    check(p.returncode == 0 and not writes(cs) and "kept" in p.stdout,
          "--apply again: exit %d, nothing written (%s)" % (p.returncode, p.stdout.strip()[:90]))
    os.rename(os.path.join(state, "secret.qsd-csi.%s" % ctl_s), os.path.join(d, "aside"))
    p, cs = apply("qsd-csi")
    check(p.returncode == 1 and not writes(cs) and secret(node_s)["data"]["ca.crt"] == first_ca,
          "--apply with only %s there: refused (exit %d: %s), nothing written" %
          (node_s, p.returncode, p.stderr.strip()))
    os.rename(os.path.join(d, "aside"), os.path.join(state, "secret.qsd-csi.%s" % ctl_s))
    p, cs = apply("qsd-csi", "--rotate")
    check(p.returncode == 0 and writes(cs) == ["replace", "replace"] and
          secret(node_s)["data"]["ca.crt"] != first_ca and
          secret(node_s)["data"]["ca.crt"] == secret(ctl_s)["data"]["ca.crt"],
          "--apply --rotate: exit %d, kubectl %s, a new CA in both" %
          (p.returncode, " ".join(writes(cs))))
    p, cs = apply("other-ns", FAKE_FAIL="1")
    check(p.returncode == 1 and not writes(cs) and "failed" in p.stderr,
          "--apply, kubectl failing: refused (exit %d: %s), nothing written" %
          (p.returncode, p.stderr.strip()[:100]))
    p, cs = apply("Not_A_Namespace")
    check(p.returncode == 1 and not cs, "--apply Not_A_Namespace: refused (exit %d), kubectl "
          "not run" % p.returncode)
    open(os.path.join(state, "namespace.-.present"), "w").close()
    p, cs = apply("present")
    check(p.returncode == 0 and writes(cs) == ["create", "create"],
          "--apply to an existing namespace: exit %d, kubectl %s (no Namespace written)" %
          (p.returncode, " ".join(writes(cs))))


def helm_pki(t, helm, root):
    p = run(helm, "template", "qsd-csi", os.path.join(root, "deploy/helm/qsd-csi"),
            env=dict(os.environ, HELM_CACHE_HOME=t + "/h", HELM_CONFIG_HOME=t + "/h",
                     HELM_DATA_HOME=t + "/h"))
    if not check(p.returncode == 0, "helm template: exit %d" % p.returncode):
        print(p.stderr)
        return None
    sec = {d["metadata"]["name"]: d for d in yaml.safe_load_all(p.stdout)
           if d and d.get("kind") == "Secret"}
    d = os.path.join(t, "helm-pki")
    os.makedirs(d, mode=0o700)
    out = {}
    for name, who in (("qsd-csi-node-tls", "node"), ("qsd-csi-controller-tls", "controller")):
        for k, f in (("ca.crt", "ca"), ("tls.crt", who + "_crt"), ("tls.key", who + "_key")):
            path = os.path.join(d, "%s-%s" % (who, k))
            with open(path, "wb") as fh:
                fh.write(base64.b64decode(sec[name]["data"][k]))
            os.chmod(path, 0o600)
            out[f] = path
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gate", required=True)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    ap.add_argument("--helm", default=os.path.join(
        os.environ.get("QSD_HELM_DIR", "/var/cache/qsd-csi/helm"), "helm"))
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    if os.geteuid() != 0:
        print("SKIP: needs root (the gates make a mount namespace and drop to a uid)")
        return 77
    if not shutil.which("openssl"):
        print("SKIP: no openssl CLI")
        return 77
    script = os.path.join(root, "scripts", "node-certs.sh")
    m = manifests(root)
    print("deploy/: serve gate checks %s as %d:%d, forwards to a socket of group %d; dial gate "
          "checks %s as %d:%d, started with group %d; the controller plugin is %d:%d" %
          (m["serve_peer"], *m["serve_id"], m["ops_group"], m["dial_peer"], *m["dial_id"],
           m["dial_group"], *m["plugin_id"]))
    t = tempfile.mkdtemp(prefix="qsd-node-certs.")
    os.chmod(t, 0o755)  # the confined gates reach their sockets beneath it
    try:
        out = test_out(t, script, m)
        if out:
            relay(t, a.gate, m, {"ca": os.path.join(out, "ca.crt"),
                                 **{"%s_%s" % (w, x): os.path.join(out, "%s.%s" % (w, e))
                                    for w in ("node", "controller")
                                    for x, e in (("crt", "crt"), ("key", "key"))}},
                  "node-certs.sh pairs")
        if a.helm and os.path.exists(a.helm):
            pki = helm_pki(t, a.helm, root)
            if pki:
                relay(t, a.gate, m, pki, "helm pairs")
        else:
            print("note: no helm (%s): the chart's Secrets not run through the gates" % a.helm)
        test_apply(t, script, m)
    finally:
        for g in PROCS:
            g.stop()
        shutil.rmtree(t, ignore_errors=True)
    print("%d failure(s)" % len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
