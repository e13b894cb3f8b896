#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Two endpoints, two driver names (--rbd-endpoint, --rbd-driver-name):
the same plugin under the local name and under the RBD StorageClasses'
name, so the central provisioner and snapshotter can be given RBD claims
only (docs/rbd.md, "Two driver names").

  - bad flag combinations exit 2 with a message naming the flag: one
    without the other, the same socket twice, the same name twice, an
    invalid name, a relative endpoint;
  - GetPluginInfo answers each endpoint's own name; both sockets 0660;
  - the same state behind both: a volume created on one is listed, staged
    and deleted through the other; an RBD-looking request on the second is
    handed to the RBD code (missing secrets: INVALID_ARGUMENT naming
    userID), as on the first;
  - the controller role takes the flags too (its own name on each);
  - --node-ops-endpoint (node role only, its own socket): the node
    operations the controller forwards (ControllerModifyVolume,
    CreateSnapshot, DeleteSnapshot, ListSnapshots, the GroupController,
    SnapshotMetadata) and Identity, nothing else (CreateVolume,
    DeleteVolume, ControllerExpandVolume, NodeStageVolume,
    NodePublishVolume, NodeGetInfo: UNIMPLEMENTED); a modify through it
    reaches the record, a snapshot made there is listed and deleted there;
  - SIGTERM: exit 0, both sockets removed;
  - a second socket that cannot be made: exit non-zero at once, the path
    and the reason in the log, the first socket removed.
usage: test_csi_endpoints.py PLUGIN_BINARY PROTO_DIR [QSDCTL]   (~5 s)"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import csilib  # noqa: E402
from csilib import expect_code, mount_cap  # noqa: E402

import grpc  # noqa: E402

C = grpc.StatusCode
MiB = 1 << 20
RBD_NAME = "rbd.test.qsd-csi.dev"


def refused(plugin, args, want):
    r = subprocess.run([plugin, "--nodeid", "n1"] + args, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and want in r.stderr, (args, r.returncode, r.stderr)


def wait_accepting(path, proc, timeout=10):
    end = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, "plugin exited with %s" % proc.returncode
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return
        except OSError:
            assert time.monotonic() < end, "%s not accepting within %d s" % (path, timeout)
            time.sleep(0.02)
        finally:
            s.close()


def main():
    plugin, proto = sys.argv[1], sys.argv[2]
    refused(plugin, ["--rbd-endpoint", "unix:///tmp/x.sock"], "go together")
    refused(plugin, ["--rbd-driver-name", RBD_NAME], "go together")
    refused(plugin, ["--endpoint", "unix:///tmp/a.sock", "--rbd-endpoint", "unix:///tmp/a.sock",
                     "--rbd-driver-name", RBD_NAME], "--endpoint's socket")
    refused(plugin, ["--driver-name", RBD_NAME, "--rbd-endpoint", "unix:///tmp/b.sock",
                     "--rbd-driver-name", RBD_NAME], "--rbd-driver-name")
    refused(plugin, ["--rbd-endpoint", "unix:///tmp/b.sock", "--rbd-driver-name", "Not A Name"],
            "--rbd-driver-name")
    refused(plugin, ["--rbd-endpoint", "relative.sock", "--rbd-driver-name", RBD_NAME],
            "--rbd-endpoint")
    refused(plugin, ["--node-ops-endpoint", "relative.sock"], "--node-ops-endpoint")
    refused(plugin, ["--endpoint", "unix:///tmp/a.sock", "--node-ops-endpoint",
                     "unix:///tmp/a.sock"], "another endpoint's socket")
    refused(plugin, ["--role", "controller", "--rbd-clusters", "/dev/null",
                     "--node-ops-endpoint", "unix:///tmp/c.sock"], "node role")
    print("ok bad flag combinations: exit 2 naming the flag")

    env = csilib.Env(plugin, proto)
    c2 = None
    try:
        sock2 = os.path.join(env.root, "rbd", "csi.sock")
        c1 = env.start(extra=["--rbd-endpoint", "unix://" + sock2, "--rbd-driver-name", RBD_NAME])
        wait_accepting(sock2, env.proc)
        pb = env.pb
        c2 = csilib.Client(pb, sock2)
        n1 = c1.GetPluginInfo(pb.GetPluginInfoRequest(), timeout=10).name
        n2 = c2.GetPluginInfo(pb.GetPluginInfoRequest(), timeout=10).name
        assert (n1, n2) == (env.driver, RBD_NAME), (n1, n2)
        for s in (env.sock, sock2):
            assert os.stat(s).st_mode & 0o777 == 0o660, "%s mode %o" % (s, os.stat(s).st_mode & 0o777)
        print("ok GetPluginInfo: %s on the first, %s on the second; both 0660" % (n1, n2))

        cap = mount_cap(pb)
        v = c1.CreateVolume(pb.CreateVolumeRequest(
            name="pvc-ep1", capacity_range=pb.CapacityRange(required_bytes=16 * MiB),
            volume_capabilities=[cap]), timeout=30).volume
        listed = [e.volume.volume_id for e in c2.ListVolumes(pb.ListVolumesRequest(), timeout=10).entries]
        assert v.volume_id in listed, (v.volume_id, listed)
        # Idempotent repeat through the other endpoint: the same volume.
        again = c2.CreateVolume(pb.CreateVolumeRequest(
            name="pvc-ep1", capacity_range=pb.CapacityRange(required_bytes=16 * MiB),
            volume_capabilities=[cap]), timeout=30).volume
        assert again.volume_id == v.volume_id, (again.volume_id, v.volume_id)
        staging = os.path.join(env.kubelet, "plugins", "kubernetes.io", "csi", "ep1", "globalmount")
        os.makedirs(staging)
        c2.NodeStageVolume(pb.NodeStageVolumeRequest(
            volume_id=v.volume_id, staging_target_path=staging, volume_capability=cap,
            volume_context=dict(v.volume_context)), timeout=60)
        assert env.qsd_pids(), "no QSD after NodeStageVolume on the second endpoint"
        c1.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id=v.volume_id,
                                                         staging_target_path=staging), timeout=60)
        c2.DeleteVolume(pb.DeleteVolumeRequest(volume_id=v.volume_id), timeout=30)
        listed = [e.volume.volume_id for e in c1.ListVolumes(pb.ListVolumesRequest(), timeout=10).entries]
        assert v.volume_id not in listed, listed
        print("ok one state: created on the first, listed, staged, deleted through the second")

        for c in (c1, c2):
            d = expect_code(c.CreateVolume, pb.CreateVolumeRequest(
                name="pvc-rbd", capacity_range=pb.CapacityRange(required_bytes=16 * MiB),
                volume_capabilities=[cap], parameters={"backend": "rbd", "clusterID": "x", "pool": "p"}),
                C.INVALID_ARGUMENT, "RBD CreateVolume without secrets")
            assert "userID" in d, d
        print("ok RBD requests handed to the RBD code on both endpoints")
        c2.close()
        c2 = None
        assert env.stop(signal.SIGTERM) == 0

        ops = os.path.join(env.root, "ops", "node-ops.sock")
        c1 = env.start(extra=["--node-ops-endpoint", "unix://" + ops])
        wait_accepting(ops, env.proc)
        c2 = csilib.Client(pb, ops)
        assert c2.GetPluginInfo(pb.GetPluginInfoRequest(), timeout=10).name == env.driver
        v = c1.CreateVolume(pb.CreateVolumeRequest(
            name="pvc-ops", capacity_range=pb.CapacityRange(required_bytes=16 * MiB),
            volume_capabilities=[cap]), timeout=30).volume
        c2.ControllerModifyVolume(pb.ControllerModifyVolumeRequest(
            volume_id=v.volume_id, mutable_parameters={"readIops": "700"}), timeout=30)
        with open(os.path.join(env.state, "volumes", csilib.local_id(v.volume_id) + ".json")) as f:
            rec = json.load(f)
        assert rec.get("mutable_parameters", {}).get("readIops") == "700", rec
        sid = c2.CreateSnapshot(pb.CreateSnapshotRequest(
            name="snap-ops", source_volume_id=v.volume_id), timeout=30).snapshot.snapshot_id
        assert [e.snapshot.snapshot_id for e in c2.ListSnapshots(
            pb.ListSnapshotsRequest(snapshot_id=sid), timeout=10).entries] == [sid]
        c2.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=sid), timeout=30)
        assert not c1.ListSnapshots(pb.ListSnapshotsRequest(), timeout=10).entries
        gcaps = c2.GroupControllerGetCapabilities(pb.GroupControllerGetCapabilitiesRequest(),
                                                  timeout=10)
        assert gcaps.capabilities, gcaps
        staging = os.path.join(env.kubelet, "plugins", "kubernetes.io", "csi", "ops", "globalmount")
        os.makedirs(staging)
        refused_there = [
            (c2.CreateVolume, pb.CreateVolumeRequest(name="pvc-x", volume_capabilities=[cap])),
            (c2.DeleteVolume, pb.DeleteVolumeRequest(volume_id=v.volume_id)),
            (c2.ControllerExpandVolume, pb.ControllerExpandVolumeRequest(
                volume_id=v.volume_id, capacity_range=pb.CapacityRange(required_bytes=32 * MiB))),
            (c2.NodeStageVolume, pb.NodeStageVolumeRequest(
                volume_id=v.volume_id, staging_target_path=staging, volume_capability=cap)),
            (c2.NodePublishVolume, pb.NodePublishVolumeRequest(
                volume_id=v.volume_id, staging_target_path=staging, target_path=staging + "x",
                volume_capability=cap)),
            (c2.NodeGetInfo, pb.NodeGetInfoRequest()),
        ]
        for fn, req in refused_there:
            expect_code(fn, req, C.UNIMPLEMENTED, "%s on the node-operations socket"
                        % type(req).__name__)
        listed = [e.volume.volume_id for e in c1.ListVolumes(pb.ListVolumesRequest(), timeout=10).entries]
        assert listed == [v.volume_id] and not env.qsd_pids(), (listed, env.qsd_pids())
        c1.DeleteVolume(pb.DeleteVolumeRequest(volume_id=v.volume_id), timeout=30)
        print("ok node-operations socket: Identity, ModifyVolume (in the record), snapshots "
              "(made, listed, deleted), the group service; create, delete, expand, stage, "
              "publish, node info UNIMPLEMENTED, nothing changed")

        c2.close()
        c2 = None
        t0 = time.monotonic()
        rc = env.stop(signal.SIGTERM)
        assert rc == 0, "exit %s" % rc
        for s in (env.sock, sock2, ops):
            assert not os.path.exists(s), "%s left behind" % s
        print("ok SIGTERM: exit 0 in %.1f s, every socket removed" % (time.monotonic() - t0))

        clusters = os.path.join(env.root, "clusters.json")
        with open(clusters, "w") as f:
            json.dump([{"clusterID": "dead", "monitors": ["127.0.0.1:9"]}], f)
        c1 = env.start(extra=["--role", "controller", "--rbd-clusters", clusters,
                              "--rbd-endpoint", "unix://" + sock2, "--rbd-driver-name", RBD_NAME])
        wait_accepting(sock2, env.proc)
        c2 = csilib.Client(pb, sock2)
        assert c2.GetPluginInfo(pb.GetPluginInfoRequest(), timeout=10).name == RBD_NAME
        assert c1.GetPluginInfo(pb.GetPluginInfoRequest(), timeout=10).name == env.driver
        caps = c2.ControllerGetCapabilities(pb.ControllerGetCapabilitiesRequest(), timeout=10)
        assert caps.capabilities, caps
        c2.close()
        c2 = None
        assert env.stop(signal.SIGTERM) == 0
        assert not os.path.exists(sock2)
        print("ok controller role: both names, exit 0")

        # The second socket cannot be made (its directory is a file): the
        # plugin names the path and the reason, exits non-zero at once and
        # leaves neither socket behind.
        blocker = os.path.join(env.root, "blocker")
        open(blocker, "w").close()
        bad = os.path.join(blocker, "csi.sock")
        try:
            c1 = env.start(extra=["--rbd-endpoint", "unix://" + bad, "--rbd-driver-name", RBD_NAME])
        except RuntimeError:
            pass  # exited before its first socket accepted
        rc = env.proc.wait(timeout=15)
        assert rc not in (0, None), "exit %s" % rc
        with open(os.path.join(env.root, "plugin.log")) as f:
            log = f.read().splitlines()
        said = [ln for ln in log if "cannot create the socket directory" in ln and bad in ln]
        assert said, "no error naming %s in the log's last lines: %s" % (bad, log[-3:])
        assert not os.path.exists(env.sock), "the first socket was left behind"
        print("ok the second socket impossible: exit %d, %r, no socket left" % (rc, said[-1][-120:]))
    finally:
        if c2:
            c2.close()
        env.cleanup()


if __name__ == "__main__":
    csilib.run_main(main)
