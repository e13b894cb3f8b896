#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""scripts/snapshot-metadata-certs.sh: the csi-snapshot-metadata sidecar's
TLS pair and the SnapshotMetadataService object (changed-block tracking,
deploy/README.md "Changed-block tracking"), with a fake kubectl that
records its arguments and input and plays the cluster's Secrets.

usage: test_snapmeta_certs.py [--root SRC]

  make     no Secret yet: the Namespace made as 00-namespace.yaml, the Secret
           qsd-csi-snapshot-metadata-tls created (type kubernetes.io/tls,
           ca.crt, tls.crt, tls.key; `create`, not `apply`), the object
           applied: named after the driver, the address the component's
           Service and port (read from deploy/kubernetes/components/
           snapshot-metadata), caCert the Secret's CA, the audience; no key
           printed
  tls      a TLS server with that pair on 127.0.0.1: a client trusting only
           the object's caCert (as upstream's client does) completes the
           handshake for the Service's name, with and without the
           namespace and .svc; the name in another namespace, and a CA of
           another run, are refused
  again    the Secret there: kept (nothing created or replaced) and the
           object applied with the Secret's ca.crt; --rotate: replaced
           with a new CA, the object following
  refuse   a bad namespace name, a bad audience, no arguments (usage, 2),
           kubectl failing: refused, nothing made

Exit 0: all good; 1: a failure; 77: no openssl.
"""
import argparse
import base64
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading

import yaml

FAKE = r'''#!/bin/sh
# Fake kubectl: logs its arguments; "get secret": the Secret file if
# present, "get namespace": there with the Secret; create/apply/replace:
# the input saved; FAIL set: exit 1.
d=$(dirname "$0")
echo "$*" >>"$d/calls"
[ -z "$FAIL" ] || { echo "kubectl: refused" >&2; exit 1; }
case $1 in
get)
    if [ "$2" = namespace ] && [ -f "$d/secret.yaml" ]; then echo "namespace/$3"; fi
    if [ "$2" = secret ] && [ -f "$d/secret.yaml" ]; then
        case "$*" in
        *jsonpath*) sed -n 's/^  ca.crt: //p' "$d/secret.yaml" ;;
        *) echo "secret/$3" ;;
        esac
    fi
    exit 0 ;;
create|apply|replace)
    n=$(ls "$d" | grep -c '^obj-')
    cat >"$d/obj-$n-$1.yaml" ;;
esac
'''

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)
    return cond


class Fake:
    def __init__(self, tmp):
        self.dir = os.path.join(tmp, "kubectl")
        os.makedirs(self.dir)
        self.path = os.path.join(self.dir, "kubectl")
        with open(self.path, "w") as fh:
            fh.write(FAKE)
        os.chmod(self.path, 0o755)

    def reset(self):
        for n in os.listdir(self.dir):
            if n.startswith("obj-") or n == "calls":
                os.unlink(os.path.join(self.dir, n))

    def objects(self):
        out = []
        names = [n for n in os.listdir(self.dir) if n.startswith("obj-")]
        for n in sorted(names, key=lambda n: int(n.split("-")[1])):
            if True:
                verb = n.rsplit("-", 1)[1][:-5]
                with open(os.path.join(self.dir, n)) as fh:
                    out.append((verb, yaml.safe_load(fh)))
        return out

    def calls(self):
        try:
            return open(os.path.join(self.dir, "calls")).read().splitlines()
        except FileNotFoundError:
            return []

    def keep_secret(self, obj):
        """Make the cluster hold this Secret (for the next run)."""
        with open(os.path.join(self.dir, "secret.yaml"), "w") as fh:
            fh.write("  ca.crt: %s\n" % obj["data"]["ca.crt"])


def run(script, fake, *args, env=None):
    e = dict(os.environ, KUBECTL=fake.path, **(env or {}))
    return subprocess.run(["bash", script, *args], capture_output=True, text=True, env=e,
                          timeout=60)


def component(root):
    """The Service name and port, and the sidecar's port, of the component."""
    d = os.path.join(root, "deploy/kubernetes/components/snapshot-metadata")
    svc = yaml.safe_load(open(os.path.join(d, "service.yaml")))
    patch = yaml.safe_load(open(os.path.join(d, "sidecar.yaml")))
    c = [op["value"] for op in patch if op["op"] == "add" and "args" in op["value"]][0]
    port = [a.split("=", 1)[1] for a in c["args"] if a.startswith("--port=")][0]
    return svc["metadata"]["name"], svc["spec"]["ports"][0]["port"], int(port)


def handshake(tmp, crt, key, ca_pem, name):
    """A TLS server with crt/key; a client trusting ca_pem only, checking
    name.  Returns None on success, else the client's error."""
    sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    sctx.load_cert_chain(crt, key)
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    lsock.settimeout(10)

    def serve():
        try:
            conn, _ = lsock.accept()
            conn.settimeout(10)
            with sctx.wrap_socket(conn, server_side=True) as s:
                s.recv(1)
        except (OSError, ssl.SSLError):
            pass
    t = threading.Thread(target=serve)
    t.start()
    cctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    cctx.load_verify_locations(cadata=ca_pem.decode())
    err = None
    try:
        with socket.create_connection(lsock.getsockname(), timeout=10) as raw:
            with cctx.wrap_socket(raw, server_hostname=name) as s:
                s.sendall(b"x")
    except (OSError, ssl.SSLError) as e:
        err = str(e)
    t.join(15)
    lsock.close()
    return err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    a = ap.parse_args()
    if not shutil.which("openssl"):
        print("skip: no openssl CLI")
        return 77
    root = os.path.abspath(a.root)
    script = os.path.join(root, "scripts", "snapshot-metadata-certs.sh")
    svc, svc_port, port = component(root)
    check(svc_port == port, "component: the Service's port %d is the sidecar's --port %d "
          "(the object's address names both)" % (svc_port, port))
    tmp = tempfile.mkdtemp(prefix="qsd-snapmeta-certs.")
    try:
        fake = Fake(tmp)
        # make
        r = run(script, fake, "--apply", "qsd-csi")
        check(r.returncode == 0, "make: exit 0 (%s)" % r.stderr.strip()[-200:])
        check("PRIVATE KEY" not in r.stdout + r.stderr, "make: no key printed")
        objs = fake.objects()
        kinds = [(v, o["kind"]) for v, o in objs]
        check(kinds == [("apply", "Namespace"), ("create", "Secret"),
                        ("apply", "SnapshotMetadataService")],
              "make: Namespace applied, Secret created, object applied: %s" % kinds)
        ns = objs[0][1]
        check(ns["metadata"]["name"] == "qsd-csi" and
              ns["metadata"]["labels"].get("pod-security.kubernetes.io/enforce") == "privileged",
              "make: the Namespace labelled as 00-namespace.yaml")
        sec, sms = objs[1][1], objs[2][1]
        check(sec["metadata"]["name"] == "qsd-csi-snapshot-metadata-tls" and
              sec["metadata"]["namespace"] == "qsd-csi" and
              sec["type"] == "kubernetes.io/tls" and
              set(sec["data"]) == {"ca.crt", "tls.crt", "tls.key"},
              "make: Secret qsd-csi-snapshot-metadata-tls, kubernetes.io/tls, ca.crt tls.crt tls.key")
        pem = {k: base64.b64decode(v) for k, v in sec["data"].items()}
        spec = sms["spec"]
        check(sms["apiVersion"] == "cbt.storage.k8s.io/v1beta1" and
              sms["metadata"]["name"] == "qsd.csi.qsd-csi.dev" and
              "namespace" not in sms["metadata"],
              "make: SnapshotMetadataService cbt.storage.k8s.io/v1beta1 qsd.csi.qsd-csi.dev, cluster-scoped")
        check(spec["address"] == "%s.qsd-csi:%d" % (svc, svc_port),
              "make: address %s is the component's Service" % spec["address"])
        check(base64.b64decode(spec["caCert"]) == pem["ca.crt"], "make: caCert is the Secret's CA")
        check(spec["audience"] == "qsd-csi-snapshot-metadata", "make: audience %s" % spec["audience"])
        # tls
        for k in ("tls.crt", "tls.key"):
            with open(os.path.join(tmp, k), "wb") as fh:
                fh.write(pem[k])
        crt, key = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
        for name in (svc + ".qsd-csi", svc + ".qsd-csi.svc", svc,
                     svc + ".qsd-csi.svc.cluster.local"):
            err = handshake(tmp, crt, key, base64.b64decode(spec["caCert"]), name)
            check(err is None, "tls: a client trusting caCert accepts the sidecar as %s (%s)" %
                  (name, err or "handshake done"))
        err = handshake(tmp, crt, key, base64.b64decode(spec["caCert"]), svc + ".other")
        check(err is not None and ("mismatch" in err.lower() or "hostname" in err.lower()),
              "tls: the name in another namespace refused (%s)" % err)
        # again: the Secret kept
        fake.keep_secret(sec)
        fake.reset()
        r = run(script, fake, "--apply", "qsd-csi")
        objs = fake.objects()
        check(r.returncode == 0 and [(v, o["kind"]) for v, o in objs] ==
              [("apply", "SnapshotMetadataService")],
              "again: the Secret kept, only the object applied (%s)" %
              [(v, o["kind"]) for v, o in objs])
        check(objs and objs[0][1]["spec"]["caCert"] == sec["data"]["ca.crt"],
              "again: the object carries the kept Secret's CA")
        # --rotate
        fake.reset()
        r = run(script, fake, "--apply", "qsd-csi", "--rotate", "--audience", "backup.example")
        objs = fake.objects()
        kinds = [(v, o["kind"]) for v, o in objs]
        check(r.returncode == 0 and kinds == [("replace", "Secret"),
                                              ("apply", "SnapshotMetadataService")],
              "rotate: Secret replaced, object applied (%s)" % kinds)
        if len(objs) == 2:
            new = objs[0][1]["data"]["ca.crt"]
            check(new != sec["data"]["ca.crt"] and objs[1][1]["spec"]["caCert"] == new and
                  objs[1][1]["spec"]["audience"] == "backup.example",
                  "rotate: a new CA, the object following it, --audience taken")
            err = handshake(tmp, crt, key, base64.b64decode(new), svc + ".qsd-csi")
            check(err is not None, "tls: the old pair refused by a client trusting the new CA (%s)" % err)
        # refuse
        for args, code, what in ((["--apply", "Bad_NS"], 1, "a bad namespace name"),
                                 (["--apply", "qsd-csi", "--audience", "a b"], 1, "a bad audience"),
                                 ([], 2, "no arguments")):
            fake.reset()
            r = run(script, fake, *args)
            check(r.returncode == code and not fake.objects(),
                  "refuse: %s: exit %d, nothing made (%s)" % (what, r.returncode,
                                                              r.stderr.strip().splitlines()[-1:]))
        os.unlink(os.path.join(fake.dir, "secret.yaml"))
        fake.reset()
        r = run(script, fake, "--apply", "qsd-csi", env={"FAIL": "1"})
        check(r.returncode == 1 and not fake.objects() and "no cluster access" in r.stderr,
              "refuse: kubectl failing: exit %d, nothing made" % r.returncode)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
