#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""unit/kubectl_qsd: the VM CLI's objects and refusals, without a cluster.

kubectl is a stand-in here (a script that logs its arguments and answers
`get` from canned objects, and listens for `port-forward`): what is tested
is what kubectl-qsd asks of it.  The real cluster runs the verbs in
tests/k8s/e2e.sh (step `cli`).

Usage: kubectl_qsd.py PATH-TO-kubectl-qsd REPO-ROOT
"""
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

import yaml

CLI, ROOT = sys.argv[1], sys.argv[2]
del sys.argv[1:]


def load():
    loader = importlib.machinery.SourceFileLoader("kubectl_qsd", CLI)
    spec = importlib.util.spec_from_loader("kubectl_qsd", loader)
    m = importlib.util.module_from_spec(spec)
    loader.exec_module(m)
    return m


Q = load()

FAKE = r'''#!/usr/bin/python3
import json, os, socket, sys, time
a = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(a) + "\n")
while a and a[0] in ("-n", "--context"):
    a = a[2:]
objs = json.load(open(os.environ["FAKE_OBJS"]))
if a[:1] == ["get"]:
    key = "/".join(a[1:3]) if len(a) > 2 and not a[2].startswith("-") else a[1]
    if "-l" in a:
        key = a[1] + "?" + a[a.index("-l") + 1]
    if key not in objs:
        sys.stderr.write("Error from server (NotFound): %s not found\n" % key)
        sys.exit(1)
    print(json.dumps(objs[key]))
elif a[:1] == ["apply"]:
    items = json.load(sys.stdin)["items"]
    with open(os.environ["FAKE_LOG"] + ".applied", "a") as f:
        f.write(json.dumps(items) + "\n")
    for o in items:
        print("%s/%s created" % (o["kind"].lower(), o["metadata"]["name"]))
elif a[:1] == ["port-forward"]:
    if os.environ.get("FAKE_PF") == "fail":
        sys.stderr.write("error: unable to listen on any of the requested ports\n")
        sys.exit(1)
    if os.environ.get("FAKE_PF") == "deaf":
        time.sleep(60)
    local = int(a[2].split(":")[0])
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", local)); s.listen(4)
    time.sleep(60)
elif a[:1] == ["delete"]:
    print("deleted")
else:
    sys.stderr.write("fake kubectl: unexpected %r\n" % a); sys.exit(3)
'''


def put(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def create_args(*extra):
    return Q.parser().parse_args(["create", "vm1", "--disk", "root:20Gi:qsd-vm", "--disk", "data"] + list(extra))



def listen_port():
    """A local port free now and below the kernel's ephemeral range
    (ip_local_port_range starts at 32768 by default), so that no outgoing
    connection of another process can take it before the fake port-forward
    binds it (a fixed port in that range failed once: EADDRINUSE)."""
    import random
    import socket
    for _ in range(200):
        port = random.randint(20000, 32000)
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
        finally:
            s.close()
    raise RuntimeError("no free port in 20000-32000")

class Objects(unittest.TestCase):
    def test_create_objects(self):
        objs = Q.vm_objects(create_args())
        kinds = [(o["kind"], o["metadata"]["name"]) for o in objs]
        # only the sized disk gets a claim; "data" is an existing claim
        self.assertEqual(kinds, [("PersistentVolumeClaim", "root"), ("ConfigMap", "vm1"), ("Pod", "vm1")])
        pvc = objs[0]
        self.assertEqual(pvc["spec"]["storageClassName"], "qsd-vm")
        self.assertEqual(pvc["spec"]["accessModes"], ["ReadWriteOncePod"])
        self.assertEqual(pvc["spec"]["resources"]["requests"]["storage"], "20Gi")
        vm = json.loads(objs[1]["data"]["vm.json"])
        self.assertEqual(vm["boot"], {"volume": "root"})
        self.assertEqual([d["volume"] for d in vm["disks"]], ["root", "data"])
        self.assertEqual(vm["disks"][0]["boot_order"], 1)
        self.assertEqual(vm["network"]["port_forwards"], [{"port": 2222, "guest_port": 22}])
        for o in objs:
            self.assertEqual(o["metadata"]["labels"][Q.LABEL], "vm1")

    def test_pod_matches_the_example(self):
        """The pod keeps what deploy/examples/cloud-vm.yaml's VM pod has:
        security context, the launcher's arguments, the mounts."""
        with open(os.path.join(ROOT, "deploy/examples/cloud-vm.yaml")) as f:
            ex = [d for d in yaml.safe_load_all(f) if d and d["kind"] == "Pod"][0]
        key = "/tmp/k.pub"
        with open(key, "w") as f:
            f.write("ssh-ed25519 AAAAC3Nza you@example\n")
        try:
            pod = Q.vm_objects(create_args("--ssh-key", key))[-1]
        finally:
            os.unlink(key)
        c, e = pod["spec"]["containers"][0], ex["spec"]["containers"][0]
        self.assertEqual(pod["spec"]["securityContext"], ex["spec"]["securityContext"])
        self.assertEqual(c["securityContext"], e["securityContext"])
        self.assertEqual(c["args"], e["args"])
        self.assertEqual(c["command"], e["command"])
        self.assertEqual(c["ports"], e["ports"])
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        for m in e["volumeMounts"]:
            if m["name"] == "root-disk":
                continue
            self.assertEqual({k: v for k, v in mounts[m["mountPath"]].items() if k != "name"},
                             {k: v for k, v in m.items() if k != "name"}, m["mountPath"])
        self.assertTrue(mounts["/run/qsd-vm/volumes/root"]["readOnly"])
        self.assertTrue(mounts["/run/qsd-vm/volumes/data"]["readOnly"])
        self.assertNotIn("privileged", [k for k, v in c["securityContext"].items() if v is True])

    def test_attach_pod_lands_beside_the_vm(self):
        vm_pod = Q.vm_objects(create_args())[-1]
        ap = Q.attach_pod("vm1", None, "extra", "extra")
        sel = ap["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        for k, v in sel["labelSelector"]["matchLabels"].items():
            self.assertEqual(vm_pod["metadata"]["labels"][k], v)
        # the attachment pod itself does not match its own selector
        self.assertNotEqual(ap["metadata"]["labels"]["app.kubernetes.io/name"], "vm1")
        self.assertEqual(ap["spec"]["securityContext"]["fsGroup"], vm_pod["spec"]["securityContext"]["fsGroup"])
        csi = [v["csi"] for v in ap["spec"]["volumes"] if "csi" in v][0]
        self.assertEqual(csi["volumeAttributes"], {"hotplugInto": "vm1", "disk": "extra"})

    def test_snapshots(self):
        s = Q.snapshot_objs("vm1", "ns", ["root", "data"], "qsd-vm-snapshot", "s1")
        self.assertEqual([(o["metadata"]["name"], o["spec"]["source"]["persistentVolumeClaimName"]) for o in s],
                         [("root-s1", "root"), ("data-s1", "data")])
        self.assertEqual(s[0]["spec"]["volumeSnapshotClassName"], "qsd-vm-snapshot")


class Refusals(unittest.TestCase):
    """Bad input: exit 2, a message naming the flag, and kubectl never called."""

    def setUp(self):
        self.d = tempfile.mkdtemp()
        self.log = os.path.join(self.d, "log")
        self.objs = os.path.join(self.d, "objs.json")
        put(self.objs, {})
        fake = os.path.join(self.d, "kubectl")
        with open(fake, "w") as f:
            f.write(FAKE)
        os.chmod(fake, 0o755)
        self.env = dict(os.environ, KUBECTL=fake, FAKE_LOG=self.log, FAKE_OBJS=self.objs)

    def tearDown(self):
        subprocess.run(["rm", "-rf", self.d])

    def run_cli(self, *args, timeout=30):
        return subprocess.run(["/usr/bin/python3", CLI] + list(args), env=self.env, capture_output=True,
                              text=True, timeout=timeout)

    def calls(self):
        if not os.path.exists(self.log):
            return []
        with open(self.log) as f:
            return [json.loads(l) for l in f]

    def refused(self, want, *args):
        p = self.run_cli(*args)
        self.assertEqual(p.returncode, 2, (args, p.stdout, p.stderr))
        self.assertIn(want, p.stderr, args)
        self.assertEqual(self.calls(), [], "kubectl called for refused %r" % (args,))

    def test_bad_input(self):
        self.refused("VM name", "create", "VM1", "--disk", "r:1Gi")
        self.refused("VM name", "create", "../x", "--disk", "r:1Gi")
        self.refused("VM name", "create", "a\x01b", "--disk", "r:1Gi")
        self.refused("at least one --disk", "create", "vm1")
        self.refused("size '10GB'", "create", "vm1", "--disk", "r:10GB")
        self.refused("--disk claim", "create", "vm1", "--disk", "Root:1Gi")
        self.refused("given twice", "create", "vm1", "--disk", "r:1Gi", "--disk", "r")
        self.refused("--kernel needs --host-dir", "create", "vm1", "--disk", "r:1Gi", "--kernel",
                     "/guest/k", "--initrd", "/guest/i")
        self.refused("under /guest/", "create", "vm1", "--disk", "r:1Gi", "--kernel", "/etc/k",
                     "--initrd", "/guest/i", "--host-dir", "/srv")
        self.refused("--memory", "create", "vm1", "--disk", "r:1Gi", "--memory", "1")
        self.refused("claim", "attach", "vm1", "Bad_Claim")
        self.refused("longer than 63", "detach", "v" * 40, "c" * 30)

    def test_not_a_vm(self):
        put(self.objs, {"pod/web": {"metadata": {"name": "web", "labels": {}}, "spec": {}}})
        p = self.run_cli("snapshot", "web")
        self.assertEqual(p.returncode, 2)
        self.assertIn("not a VM of kubectl-qsd", p.stderr)
        self.assertFalse(os.path.exists(self.log + ".applied"))

    def test_create_applies_and_keeps_existing_claims(self):
        put(self.objs, {"pvc/root": {"kind": "PersistentVolumeClaim"}})
        p = self.run_cli("-n", "vms", "create", "vm1", "--disk", "root:1Gi", "--disk", "new:2Gi")
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(self.log + ".applied") as f:
            applied = json.loads(f.readline())
        self.assertEqual([(o["kind"], o["metadata"]["name"]) for o in applied],
                         [("PersistentVolumeClaim", "new"), ("ConfigMap", "vm1"), ("Pod", "vm1")])
        self.assertTrue(all(o["metadata"]["namespace"] == "vms" for o in applied))
        self.assertTrue(all(c[:2] == ["-n", "vms"] for c in self.calls()))

    def vm_with_ssh(self):
        """A VM pod vm1 with an ssh port, and a fake ssh that writes its
        arguments to the first path returned."""
        pod = {"metadata": {"name": "vm1", "labels": {Q.LABEL: "vm1"}},
               "spec": {"containers": [{"ports": [{"name": "ssh", "containerPort": 2222}]}], "volumes": []}}
        put(self.objs, {"pod/vm1": pod})
        out = os.path.join(self.d, "ssh.out")
        fake_ssh = os.path.join(self.d, "ssh")
        with open(fake_ssh, "w") as f:
            f.write("#!/bin/sh\necho \"$@\" > %s\n" % out)
        os.chmod(fake_ssh, 0o755)
        return out, fake_ssh

    def test_ssh_through_the_port_forward(self):
        out, fake_ssh = self.vm_with_ssh()
        port = str(listen_port())
        p = self.run_cli("--timeout", "20", "ssh", "vm1", "--user", "u1", "--local-port", port,
                         "--ssh-command", fake_ssh, "--", "uptime")
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(out) as f:
            args = f.read().split()
        self.assertEqual(args[:2], ["-p", port])
        self.assertIn("u1@127.0.0.1", args)
        self.assertEqual(args[-1], "uptime")
        pf = [c for c in self.calls() if "port-forward" in c]
        self.assertEqual(pf, [["port-forward", "pod/vm1", port + ":2222"]])

    def test_ssh_when_the_port_forward_fails(self):
        """kubectl port-forward exits (the port taken, the pod gone) or never
        listens: the CLI says so, bounded by --timeout, and runs no ssh."""
        out, fake_ssh = self.vm_with_ssh()
        for mode, timeout, said in (("fail", "20", "kubectl port-forward ended: error: unable to listen"),
                                    ("deaf", "2", "not listening within 2 s")):
            self.env["FAKE_PF"] = mode
            t0 = time.monotonic()
            p = self.run_cli("--timeout", timeout, "ssh", "vm1", "--local-port", str(listen_port()),
                             "--ssh-command", fake_ssh)
            self.assertNotEqual(p.returncode, 0, mode)
            self.assertIn(said, p.stderr, mode)
            self.assertLess(time.monotonic() - t0, 15, mode)
            self.assertFalse(os.path.exists(out), "ssh ran although the port forward %s" % mode)


if __name__ == "__main__":
    unittest.main(verbosity=2)
