#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""csi-sanity's GroupController specs (VolumeGroupSnapshot: capabilities,
create, get, delete with their refusals) against the real plugin on the
host, then its Controller and Identity specs (the Node specs need a
kubelet's pod directories: tests/k8s/sanity.sh runs them in the cluster).
Every spec run must pass and the group specs must run (none skipped), so
a plugin that stops advertising GROUP_CONTROLLER_SERVICE fails here.

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


def sanity(binary, env, *args):
    r = subprocess.run([binary, "--csi.endpoint=unix://" + env.sock,
                        "--csi.mountdir=" + os.path.join(env.kubelet, "sanity-mnt"),
                        "--csi.stagingdir=" + os.path.join(env.kubelet, "sanity-stg"),
                        "--ginkgo.no-color", *args],
                       capture_output=True, text=True, timeout=600, cwd=env.root)
    m = re.search(r"(\d+) Passed \| (\d+) Failed \| (\d+) Pending \| (\d+) Skipped", r.stdout)
    assert m, "no csi-sanity summary: rc %d\n%s" % (r.returncode, r.stdout[-3000:])
    passed, failed = int(m.group(1)), int(m.group(2))
    assert r.returncode == 0 and failed == 0, "csi-sanity %s: %s\n%s" % (
        args, m.group(0), r.stdout[-6000:])
    return passed, m.group(0)


def main():
    binary = csilib.csi_sanity()
    env = csilib.Env(sys.argv[1], sys.argv[2], prefix="qsd-sanity-")
    try:
        env.start()
        passed, line = sanity(binary, env, "--ginkgo.focus=GroupController")
        assert passed == GROUP_SPECS, "%d group specs ran, expected %d: %s" % (
            passed, GROUP_SPECS, line)
        print("ok csi-sanity GroupController:", line)
        passed, line = sanity(binary, env, "--ginkgo.skip=Node Service")
        print("ok csi-sanity without the Node specs:", line)
        assert env.stop() == 0
    finally:
        env.cleanup()


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
