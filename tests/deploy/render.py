# SPDX-License-Identifier: Apache-2.0
"""render.py: the objects a directory of deploy/ installs, as kubectl sends them.

Owns: running `kubectl kustomize` (kubectl's built-in kustomize, offline)
on a kustomization directory and parsing its output; and what to do when
kubectl is missing (KubectlMissing: the tests skip, saying so, since no
registry reachable here ships kubectl; the project's machine images have it).
"""
import shutil
import subprocess

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
