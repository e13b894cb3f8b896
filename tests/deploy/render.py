# SPDX-License-Identifier: Apache-2.0
"""render.py: the objects a directory of deploy/ installs, as kubectl sends them.

Owns: running `kubectl kustomize` (kubectl's built-in kustomize, offline)
on a kustomization directory (optionally with every component of its
components/ directory enabled) and parsing its output; and what to do when
kubectl is missing (KubectlMissing: the tests skip, saying so, since no
registry reachable here ships kubectl; the project's machine images have it).
"""
import os
import shutil
import subprocess
import tempfile

import yaml

KUBECTL = "kubectl"


class KubectlMissing(Exception):
    pass


class RenderError(Exception):
    pass


def kubectl(*args, stdin=None):
    """Run kubectl with args (no cluster is contacted by the commands used
    here: kustomize, patch --local).  Returns stdout; RenderError otherwise."""
    if not shutil.which(KUBECTL):
        raise KubectlMissing("kubectl is not installed (it renders the kustomization: "
                             "`kubectl kustomize`)")
    p = subprocess.run([KUBECTL, *args], input=stdin, capture_output=True, text=True,
                       timeout=60)
    if p.returncode != 0:
        raise RenderError("kubectl %s failed (exit %d): %s" %
                          (" ".join(args), p.returncode, " ".join(p.stderr.split())[:600]))
    return p.stdout


def kustomize(directory):
    """The documents `kubectl apply -k directory` would send, in order."""
    out = kubectl("kustomize", directory)
    try:
        return [d for d in yaml.safe_load_all(out) if d is not None]
    except yaml.YAMLError as e:
        raise RenderError("kubectl kustomize %s printed YAML that does not parse: %s" %
                          (directory, e))


def kustomize_all(directory):
    """kustomize(directory) with every optional piece on: a copy of the
    directory whose kustomization.yaml lists each subdirectory of
    components/ (deploy/kubernetes: snapshots, rbd), as a user enables them."""
    comps = sorted(n for n in os.listdir(os.path.join(directory, "components"))
                   if os.path.isfile(os.path.join(directory, "components", n,
                                                  "kustomization.yaml")))
    tmp = tempfile.mkdtemp(prefix="qsd-kustomize-all-")
    try:
        copy = os.path.join(tmp, "k")
        shutil.copytree(directory, copy)
        path = os.path.join(copy, "kustomization.yaml")
        with open(path) as fh:
            k = yaml.safe_load(fh)
        k["components"] = ["components/" + n for n in comps]
        with open(path, "w") as fh:
            yaml.safe_dump(k, fh, sort_keys=False)
        return kustomize(copy)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
