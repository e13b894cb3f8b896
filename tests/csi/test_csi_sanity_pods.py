#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""csi-sanity against the plugin with the capabilities of ordinary pods
(docs/pod-volumes.md), on this machine: the plugin under a temporary root,
real FUSE exports, loop devices and mounts beneath a temporary kubelet root
(a shared mount, as kubelet's), csi-sanity's staging and target paths of
kubelet's shape there.

- block: `--csi.testvolumeaccesstype=block` (csi-sanity's own flag);
- ext4: csi-sanity has no flag for a mount capability's fsType (it always
  sends an empty one, which is the VM capability here), so it talks to a
  proxy that forwards every call and sets `fs_type: ext4` in the mount
  capability of NodeStageVolume, NodePublishVolume and NodeExpandVolume
  (what kubelet sends for a StorageClass with csi.storage.k8s.io/fstype).

Without CAP_SYS_RESOURCE the ext4 run skips csi-sanity's NodeExpandVolume
spec (online ext4 growth needs it: docs/pod-volumes.md), and says so.
Every run asserts csi-sanity's exit status and its summary (passed > 0,
0 failed), that no spec was skipped but those csilib.SANITY_SKIPS_ALLOWED
names (--ginkgo.v reports each skip's reason; the ext4 run's
--ginkgo.skip above leaves that spec out without a report), then that
nothing is left: no loop device on the run directory's FUSE files, no
mount beneath the kubelet root.

csi-sanity: csilib.csi_sanity() ($QSD_CSI_SANITY, else the release
tests/k8s/sidecars.txt pins, built once from the Go module proxy); skipped
(77) only when there is no Go to build it.

usage: test_csi_sanity_pods.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import concurrent.futures
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402

REWRITE = ("NodeStageVolume", "NodePublishVolume", "NodeExpandVolume")


def with_fs(req, fs):
    caps = []
    if req.HasField("volume_capability"):
        caps.append(req.volume_capability)
    for cap in caps:
        if cap.HasField("mount") and not cap.mount.fs_type:
            cap.mount.fs_type = fs
    return req


def proxy(env, sock, fs):
    """A gRPC server on sock forwarding every CSI call to the plugin, the
    mount capability of REWRITE's requests given fs."""
    grpc, pb = csilib.grpc, env.pb
    handlers = []
    for svc, methods in csilib.SERVICES.items():
        table = {}
        for m in methods:
            def fwd(req, ctx, m=m):
                if m in REWRITE:
                    req = with_fs(req, fs)
                try:
                    return getattr(env.client, m)(req, timeout=300)
                except grpc.RpcError as e:
                    ctx.abort(e.code(), e.details())
            table[m] = grpc.unary_unary_rpc_method_handler(
                fwd, request_deserializer=getattr(pb, m + "Request").FromString,
                response_serializer=getattr(pb, m + "Response").SerializeToString)
        handlers.append(grpc.method_handlers_generic_handler("csi.v1." + svc, table))
    srv = grpc.server(concurrent.futures.ThreadPoolExecutor(4), handlers=handlers)
    srv.add_insecure_port("unix://" + sock)
    srv.start()
    return srv


def leftovers(env):
    out = [ln for ln in subprocess.run(["losetup", "-n", "-O", "NAME,BACK-FILE"],
                                       capture_output=True, text=True).stdout.splitlines()
           if env.run in ln]
    with open("/proc/self/mountinfo") as f:
        out += [ln.split()[4] for ln in f if ln.split()[4].startswith(env.kubelet + "/")]
    return out


def sanity(env, binary, name, endpoint, extra=()):
    k = env.kubelet
    pod = os.path.join(k, "pods", "sanity-" + name, "volumes/kubernetes.io~csi/sanity")
    stg = os.path.join(k, "plugins/kubernetes.io/csi/test.qsd-csi.dev/sanity-" + name)
    os.makedirs(pod)
    os.makedirs(stg)
    log = os.path.join(env.root, "sanity-%s.log" % name)
    with open(log, "w") as f:
        rc = subprocess.run([binary, "--csi.endpoint=unix://" + endpoint,
                             "--csi.mountdir=" + os.path.join(pod, "mount"),
                             "--csi.stagingdir=" + os.path.join(stg, "globalmount"),
                             "--csi.testvolumesize=67108864",
                             "--csi.testvolumeexpandsize=134217728",
                             "--ginkgo.timeout=15m", "--ginkgo.no-color", "--ginkgo.v", *extra],
                            stdout=f, stderr=subprocess.STDOUT, timeout=1200).returncode
    text = open(log, errors="replace").read()
    m = re.search(r"Ran (\d+) of (\d+) Specs.*\n(?:.*\n)?.*?(SUCCESS|FAIL)! -- (\d+) Passed \| "
                  r"(\d+) Failed \| (\d+) Pending \| (\d+) Skipped", text)
    if rc != 0 or not m or int(m.group(5)) != 0 or int(m.group(4)) == 0:
        fails = re.findall(r"\[FAIL\].*", text)
        raise AssertionError("csi-sanity %s: exit %d, %s\n%s\n---- tail\n%s" % (
            name, rc, m.group(0) if m else "no summary", "\n".join(fails[:20]), text[-3000:]))
    bad = csilib.sanity_unexpected_skips(text)
    assert not bad, "csi-sanity %s skipped specs it should run:\n%s" % (
        name, "\n".join("%s: %s" % x for x in bad))
    left = leftovers(env)
    assert not left, "csi-sanity %s left: %s" % (name, left)
    print("ok csi-sanity %s: %s Passed, %s Failed, %s Pending, %s Skipped; nothing left" % (
        name, m.group(4), m.group(5), m.group(6), m.group(7)))


def has_cap(n):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> n & 1)
    return False


def main():
    binary = csilib.csi_sanity()
    # A short root: csi-sanity's volume names are long, and a volume's
    # socket path beneath the run directory must fit a unix address.
    env = csilib.Env(sys.argv[1], sys.argv[2], prefix="qs-")
    srv = None
    try:
        csilib.share_kubelet_root(env)
        env.start()
        sanity(env, binary, "block", env.sock, ["--csi.testvolumeaccesstype=block"])
        psock = os.path.join(env.root, "ext4.sock")
        srv = proxy(env, psock, "ext4")
        skip = []
        if not has_cap(24):  # CAP_SYS_RESOURCE
            skip = ["--ginkgo.skip=NodeExpandVolume.*should work"]
            print("note: no CAP_SYS_RESOURCE: csi-sanity's online NodeExpandVolume spec "
                  "skipped for ext4 (integration/csi_podvol covers the offline growth)")
        sanity(env, binary, "ext4", psock, skip)
    finally:
        if srv:
            srv.stop(0)
        if sys.exc_info()[0] is not None:
            print("---- plugin log (tail)\n" + env.log_tail())
        try:
            env.stop()
        except Exception:  # noqa: BLE001
            pass
        csilib.detach_loops_under(env.root)
        env.cleanup()


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
