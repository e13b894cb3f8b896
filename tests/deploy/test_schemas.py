#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Validates every object deploy/ installs against the Kubernetes API's schemas.

Usage: test_schemas.py [--root SRC]

Objects: `kubectl kustomize deploy/kubernetes` with every component (what `kubectl apply -k`
sends), `kubectl kustomize deploy/monitoring`, every document of
deploy/examples/ (the snapshot-controller needs nothing of ours: the
driver's csi-snapshotter is central, docs/node-operations.md).

Validation: schema/validate.mjs (node; packages of schema/package.json,
installed by scripts/setup.sh): the JSON schemas of kubernetes-models
(built-in kinds), @kubernetes-models/prometheus-operator (PodMonitor,
PrometheusRule) and
schema/volumesnapshotclass-v1.json and volumegroupsnapshotclass-v1.json (the
snapshot CRDs), plus no field that
the API does not have (the field lists of @kubernetes/client-node).  0
problems required.

Before that it checks itself: broken copies of rendered objects (a
misspelt field, a wrong type, a value outside an enum, a snapshot class
with an unknown deletionPolicy, a PodMonitor with a wrong type, a
PrometheusRule with a misspelt field) must each
be rejected with the expected message.

Exit 0: all valid; 1: problems (listed); 77: cannot run (no PyYAML, or no
kubectl: no registry reachable here ships it, the machine images have it).
"""
import argparse
import copy
import json
import os
import subprocess
import sys

try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml is not installed")
    sys.exit(77)

import render

HERE = os.path.dirname(os.path.abspath(__file__))
VALIDATOR = os.path.join(HERE, "schema", "validate.mjs")

class Problems(list):
    def add(self, where, msg):
        self.append("%s: %s" % (where, msg))


def where_of(src, d):
    md = d.get("metadata") or {}
    return "%s %s %s" % (src, d.get("kind"), "/".join(x for x in (md.get("namespace"),
                                                                     md.get("name")) if x))


def load_examples(root, problems):
    out = []
    edir = os.path.join(root, "deploy", "examples")
    for n in sorted(os.listdir(edir)):
        if n.endswith((".yaml", ".yml")):
            rel = "deploy/examples/" + n
            try:
                with open(os.path.join(edir, n)) as fh:
                    out += [(rel, d) for d in yaml.safe_load_all(fh) if d is not None]
            except yaml.YAMLError as e:
                problems.add(rel, "YAML does not parse: %s" % " ".join(str(e).split()))
    return out


def validate(objects):
    """[(where, object)] -> list of problem lines from validate.mjs."""
    if not os.path.isdir(os.path.join(HERE, "schema", "node_modules")):
        raise RuntimeError("tests/deploy/schema/node_modules is missing: run scripts/setup.sh "
                           "(npm ci there)")
    p = subprocess.run(["node", VALIDATOR], capture_output=True, text=True, timeout=120,
                       input=json.dumps([{"where": w, "object": o} for w, o in objects]))
    if p.returncode not in (0, 1):
        raise RuntimeError("validate.mjs failed (exit %d): %s" % (p.returncode,
                                                                  p.stderr.strip()[-800:]))
    return [l for l in p.stdout.splitlines() if l.strip()]


def broken_copies(objects):
    """(label, expected message, object) for the self-check."""
    def first(kind):
        return copy.deepcopy(next(o for _, o in objects if o.get("kind") == kind))
    cases = []
    ds = first("DaemonSet")
    ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][1]["mountPropogation"] = \
        "Bidirectional"
    cases.append(("misspelt field", "mountPropogation is not a field of VolumeMount", ds))
    ds = first("DaemonSet")
    ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "9808"
    cases.append(("wrong type", "containerPort must be integer", ds))
    ds = first("DaemonSet")
    ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][1]["mountPropagation"] = \
        "Shared"
    cases.append(("value outside an enum", "mountPropagation must be equal to one of", ds))
    ds = first("DaemonSet")
    del ds["spec"]["selector"]
    cases.append(("missing required field", "must have required property selector", ds))
    vsc = first("VolumeSnapshotClass")
    vsc["deletionPolicy"] = "Keep"
    cases.append(("snapshot class, CRD enum", "deletionPolicy must be equal to one of", vsc))
    vsc = first("VolumeSnapshotClass")
    vsc["driverName"] = vsc.pop("driver")
    cases.append(("snapshot class, unknown field", "additional properties: driverName", vsc))
    pm = first("PodMonitor")
    pm["spec"]["podMetricsEndpoints"][0]["port"] = 9810
    cases.append(("PodMonitor, wrong type", "port must be string", pm))
    pr = first("PrometheusRule")
    pr["spec"]["groups"][0]["rules"][0]["for"] = 120
    cases.append(("PrometheusRule, wrong type", "for must be string", pr))
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(HERE, "..", ".."))
    root = os.path.abspath(ap.parse_args().root)
    problems = Problems()
    try:
        objects = [("deploy/kubernetes (kustomize)", d)
                   for d in render.kustomize_all(os.path.join(root, "deploy", "kubernetes"))]
        objects += [("deploy/monitoring (kustomize)", d)
                    for d in render.kustomize(os.path.join(root, "deploy", "monitoring"))]
        objects += load_examples(root, problems)
    except render.KubectlMissing as e:
        print("SKIP: %s" % e)
        return 77
    except render.RenderError as e:
        print("FAIL %s" % e)
        return 1
    try:
        cases = broken_copies(objects)
        found = validate([("selfcheck-%d" % i, o) for i, (_, _, o) in enumerate(cases)] +
                         [(where_of(src, d), d) for src, d in objects])
    except (RuntimeError, OSError, subprocess.TimeoutExpired, StopIteration) as e:
        print("FAIL %s" % (e or "an object kind the self-check breaks is missing"))
        return 1
    ok = True
    for i, (label, expect, _) in enumerate(cases):
        mine = [l for l in found if l.startswith("selfcheck-%d: " % i)]
        if any(expect in l for l in mine):
            print("ok   self-check: %s rejected (%s)" %
                  (label, next(l for l in mine if expect in l).split(": ", 1)[1]))
        else:
            print("FAIL self-check (%s): not rejected with %r; got %s" % (label, expect, mine))
            ok = False
    found = [l for l in found if not l.startswith("selfcheck-")]
    for p in problems + found:
        print("FAIL %s" % p)
    kinds = sorted({o.get("kind") for _, o in objects})
    print("validated %d objects (%s): %d problems" % (len(objects), ", ".join(kinds),
                                                      len(problems) + len(found)))
    return 0 if ok and not problems and not found else 1


if __name__ == "__main__":
    sys.exit(main())
