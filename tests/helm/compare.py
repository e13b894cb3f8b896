# SPDX-License-Identifier: Apache-2.0
"""compare.py: the objects of a kustomize render and a helm template, compared.

Owns: parsing both renders (PyYAML), normalising them (documents keyed by
kind/namespace/name; metadata.namespace dropped from cluster-scoped kinds
kustomize does not know, which the API server drops too) and printing every
difference, a path and both values per line.

  compare.py KUSTOMIZE.yaml HELM.yaml [MORE-KUSTOMIZE.yaml...]
      exit 0 and "N objects equal" when the objects are the same; 1 otherwise.
  compare.py --absent HELM.yaml
      exit 1 when the render holds a piece rbd/snapshots off must not render.
  compare.py --no-node-endpoint HELM.yaml
      exit 1 when the render holds a piece of the node endpoint
      (nodeEndpoint.enabled=false).

The node endpoint's two Secrets are the chart's own (kustomize installs
get them from scripts/node-certs.sh): taken out of the comparison, and
checked instead: both there, the keys ca.crt, tls.crt and tls.key holding
PEM, one CA.  Likewise changed-block tracking's Secret and
SnapshotMetadataService (scripts/snapshot-metadata-certs.sh for kustomize):
a kubernetes.io/tls Secret of PEMs, the object naming the Service, the
Secret's CA and an audience.
"""
import base64
import binascii
import sys

import yaml

# Cluster-scoped kinds kustomize's namespace transformer does not know.
UNKNOWN_CLUSTER_SCOPED = {"VolumeSnapshotClass"}
# The node endpoint's Secrets: made by the chart, not by kustomize.
GENERATED_SECRETS = ("qsd-csi-node-tls", "qsd-csi-controller-tls")
# Changed-block tracking's (snapshotMetadata.enabled): the chart makes the
# Secret and the SnapshotMetadataService, scripts/snapshot-metadata-certs.sh
# for kustomize.
SNAPMETA_SECRET = "qsd-csi-snapshot-metadata-tls"


def load(path):
    objs = {}
    with open(path) as fh:
        for d in yaml.safe_load_all(fh):
            if not d:
                continue
            md = d.setdefault("metadata", {})
            if d.get("kind") in UNKNOWN_CLUSTER_SCOPED:
                md.pop("namespace", None)
            key = (d.get("kind"), md.get("namespace") or "", md.get("name"))
            if key in objs:
                raise SystemExit("%s: %s defined twice" % (path, "/".join(key)))
            objs[key] = d
    return objs


def diff(a, b, path, out):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a:
                out.append("%s.%s: only in helm: %r" % (path, k, b[k]))
            elif k not in b:
                out.append("%s.%s: only in kustomize: %r" % (path, k, a[k]))
            else:
                diff(a[k], b[k], "%s.%s" % (path, k), out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, "%s[%d]" % (path, i), out)
    elif a != b:
        out.append("%s: kustomize %r, helm %r" % (path, a, b))


def absent(path):
    bad = []
    for (kind, ns, name), d in load(path).items():
        if kind == "VolumeSnapshotClass":
            bad.append("a VolumeSnapshotClass %s" % name)
        if kind == "ClusterRole" and name in ("qsd-csi-controller-secrets",
                                              "qsd-csi-controller-provisioner"):
            bad.append("the ClusterRole %s" % name)
        if kind == "Deployment":
            for c in d["spec"]["template"]["spec"]["containers"]:
                if c["name"] in ("csi-provisioner", "csi-snapshotter-rbd", "csi-resizer-rbd"):
                    bad.append("%s in the Deployment %s" % (c["name"], name))
    if bad:
        print("\n".join(bad))
        return 1
    print("no VolumeSnapshotClass, no RBD provisioner, snapshotter or resizer, no Secrets role")
    return 0


def generated_secrets(h, out):
    """Take the node endpoint's Secrets out of the helm render h; append to
    out what is wrong with them."""
    found = {key[2]: h.pop(key) for key in list(h)
             if key[0] == "Secret" and key[2] in GENERATED_SECRETS}
    if set(found) != set(GENERATED_SECRETS):
        out.append("the node endpoint's Secrets: helm renders %s, expected %s" %
                   (sorted(found), list(GENERATED_SECRETS)))
        return 0
    cas = set()
    for name, d in sorted(found.items()):
        data = d.get("data") or {}
        if d.get("type") != "Opaque" or set(data) != {"ca.crt", "tls.crt", "tls.key"}:
            out.append("Secret %s: type %r, keys %s; expected Opaque with ca.crt, tls.crt, "
                       "tls.key" % (name, d.get("type"), sorted(data)))
            continue
        for k, want in (("ca.crt", b"-----BEGIN CERTIFICATE-----"),
                        ("tls.crt", b"-----BEGIN CERTIFICATE-----"),
                        ("tls.key", b"PRIVATE KEY-----")):
            try:
                pem = base64.b64decode(str(data[k]), validate=True)
            except (binascii.Error, ValueError):
                pem = b""
            if want not in pem:
                out.append("Secret %s: %s is not base64 of a PEM %s" %
                           (name, k, want.decode().strip("-")))
        cas.add(str(data["ca.crt"]))
    if len(cas) != 1:
        out.append("the node endpoint's Secrets hold different CAs")
    return len(found)


def snapmeta_generated(h, out):
    """Take changed-block tracking's Secret and SnapshotMetadataService out
    of the helm render h (kustomize installs get both from
    scripts/snapshot-metadata-certs.sh); append to out what is wrong with
    them.  Returns how many there were (0 or 2)."""
    sec = {key: h.pop(key) for key in list(h)
           if key[0] == "Secret" and key[2] == SNAPMETA_SECRET}
    sms = {key: h.pop(key) for key in list(h) if key[0] == "SnapshotMetadataService"}
    if not sec and not sms:
        return 0
    if len(sec) != 1 or len(sms) != 1:
        out.append("changed-block tracking: helm renders %d Secret(s) %s and %d "
                   "SnapshotMetadataService(s)" % (len(sec), SNAPMETA_SECRET, len(sms)))
        return 0
    (_, ns, _), d = next(iter(sec.items()))
    data = d.get("data") or {}
    if d.get("type") != "kubernetes.io/tls" or set(data) != {"ca.crt", "tls.crt", "tls.key"}:
        out.append("Secret %s: type %r, keys %s; expected kubernetes.io/tls with ca.crt, "
                   "tls.crt, tls.key" % (SNAPMETA_SECRET, d.get("type"), sorted(data)))
        return 0
    for k, want in (("ca.crt", b"-----BEGIN CERTIFICATE-----"),
                    ("tls.crt", b"-----BEGIN CERTIFICATE-----"),
                    ("tls.key", b"PRIVATE KEY-----")):
        try:
            pem = base64.b64decode(str(data[k]), validate=True)
        except (binascii.Error, ValueError):
            pem = b""
        if want not in pem:
            out.append("Secret %s: %s is not base64 of a PEM %s" %
                       (SNAPMETA_SECRET, k, want.decode().strip("-")))
    (_, _, name), o = next(iter(sms.items()))
    spec = o.get("spec") or {}
    if name != "qsd.csi.qsd-csi.dev":
        out.append("SnapshotMetadataService %s: not named after the driver" % name)
    if spec.get("address") != "qsd-csi-snapshot-metadata.%s:9829" % ns:
        out.append("SnapshotMetadataService: address %r, expected the Service "
                   "qsd-csi-snapshot-metadata.%s:9829" % (spec.get("address"), ns))
    if str(spec.get("caCert")) != str(data["ca.crt"]):
        out.append("SnapshotMetadataService: caCert is not the Secret's ca.crt")
    if not spec.get("audience"):
        out.append("SnapshotMetadataService: no audience")
    return 2


def no_node_endpoint(path):
    bad = []
    for (kind, ns, name), d in load(path).items():
        if kind == "Secret" and name in GENERATED_SECRETS:
            bad.append("the Secret %s" % name)
        if kind in ("ClusterRole", "ClusterRoleBinding") and name == "qsd-csi-controller-nodes":
            bad.append("the %s %s" % (kind, name))
        if kind in ("DaemonSet", "Deployment"):
            spec = d["spec"]["template"]["spec"]
            for c in spec["containers"]:
                if "qsd-node-gate" in str(c.get("command")):
                    bad.append("the gate %s in the %s %s" % (c["name"], kind, name))
                for a in c.get("args") or []:
                    if str(a).startswith(("--node-ops-", "--node-dial", "--api-token-file")):
                        bad.append("%s of %s in the %s %s" % (a, c["name"], kind, name))
            for v in spec.get("volumes") or []:
                if v["name"] in ("node-ops-dir", "dial-dir", "node-tls", "controller-tls"):
                    bad.append("the volume %s of the %s %s" % (v["name"], kind, name))
    if bad:
        print("\n".join(bad))
        return 1
    print("no gate, no node-endpoint flag, volume or Secret, no Nodes role")
    return 0


def main(argv):
    if argv[1:2] == ["--absent"]:
        return absent(argv[2])
    if argv[1:2] == ["--no-node-endpoint"]:
        return no_node_endpoint(argv[2])
    k = {}
    for p in [argv[1]] + argv[3:]:
        k.update(load(p))
    h = load(argv[2])
    out = []
    secrets = generated_secrets(h, out)
    snapmeta = snapmeta_generated(h, out)
    for key in sorted(set(k) | set(h)):
        name = "%s %s/%s" % key
        if key not in h:
            out.append("%s: only in kustomize" % name)
        elif key not in k:
            out.append("%s: only in helm" % name)
        else:
            diff(k[key], h[key], name, out)
    if out:
        print("\n".join(out))
        return 1
    print("%d objects equal (%s); the node endpoint's %d Secrets (the chart's own) well formed%s" %
          (len(k), ", ".join(sorted({x[0] for x in k})), secrets,
           "; changed-block tracking's Secret and SnapshotMetadataService (the chart's own) "
           "well formed" if snapmeta else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
