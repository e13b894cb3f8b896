#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""csi-sanity against the real plugin on the host, twice:

- its GroupController specs alone (VolumeGroupSnapshot: capabilities,
  create, get, delete with their refusals): all 6 must run and pass, so a
  plugin that stops advertising GROUP_CONTROLLER_SERVICE fails here;
- every spec (Identity, Controller, Node, GroupController) with the VM
  capability (a mount capability with no fsType: the socket's directory
  bind-mounted), target and staging paths of kubelet's shape beneath a
  shared temporary kubelet root: every spec run must pass, and no spec may
  be skipped but those csilib.SANITY_SKIPS_ALLOWED names (the
  ControllerPublish ones, and snapshot accessibility), each reported by
  --ginkgo.v with its reason.  tests/k8s/sanity.sh makes the same check in
  the cluster; the block and ext4 capabilities: test_csi_sanity_pods.py.

csi-sanity: csilib.csi_sanity() ($QSD_CSI_SANITY, else the release
tests/k8s/sidecars.txt pins, built once from the Go module proxy); skipped
(77) only when there is no Go to build it.

usage: test_csi_sanity_group.py PLUGIN_BINARY PROTO_DIR
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402

GROUP_SPECS = 6


def sanity(binary, env, name, *args):
    k = env.kubelet
    pod = os.path.join(k, "pods", "sanity-" + name, "volumes/kubernetes.io~csi/sanity")
    stg = os.path.join(k, "plugins/kubernetes.io/csi/test.qsd-csi.dev/sanity-" + name)
    os.makedirs(pod)
    os.makedirs(stg)
    r = subprocess.run([binary, "--csi.endpoint=unix://" + env.sock,
                        "--csi.mountdir=" + os.path.join(pod, "mount"),
                        "--csi.stagingdir=" + os.path.join(stg, "globalmount"),
                        "--csi.testvolumesize=67108864",
                        "--csi.testvolumeexpandsize=134217728",
                        "--ginkgo.no-color", "--ginkgo.v", "--ginkgo.timeout=8m", *args],
                       capture_output=True, text=True, timeout=600, cwd=env.root)
    m = re.search(r"(\d+) Passed \| (\d+) Failed \| (\d+) Pending \| (\d+) Skipped", r.stdout)
    assert m, "no csi-sanity summary: rc %d\n%s" % (r.returncode, r.stdout[-3000:])
    passed, failed = int(m.group(1)), int(m.group(2))
    if r.returncode != 0 or failed != 0:
        fails = re.findall(r"\[FAIL\].*", r.stdout)
        raise AssertionError("csi-sanity %s: %s\n%s\n---- tail\n%s" % (
            name, m.group(0), "\n".join(fails[:20]), r.stdout[-4000:]))
    bad = csilib.sanity_unexpected_skips(r.stdout)
    assert not bad, "csi-sanity %s skipped specs it should run:\n%s" % (
        name, "\n".join("%s: %s" % x for x in bad))
    return passed, m.group(0), r.stdout


def main():
    binary = csilib.csi_sanity()
    # A short root: csi-sanity's volume names are long, and a volume's
    # socket path beneath the run directory must fit a unix address.
    env = csilib.Env(sys.argv[1], sys.argv[2], prefix="qs-")
    try:
        csilib.share_kubelet_root(env)
        env.start()
        passed, line, _ = sanity(binary, env, "group", "--ginkgo.focus=GroupController")
        assert passed == GROUP_SPECS, "%d group specs ran, expected %d: %s" % (
            passed, GROUP_SPECS, line)
        print("ok csi-sanity GroupController:", line)
        passed, line, log = sanity(binary, env, "all")
        skipped = csilib.sanity_skips(log)
        assert int(line.split("|")[3].split()[0]) == len(skipped), (line, skipped)
        print("ok csi-sanity, every spec (VM capability):", line)
        for spec, why in skipped:
            print("   skipped, allowed: %s (%s)" % (spec, why))
        assert env.stop() == 0
    finally:
        env.cleanup()


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
