#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The plugin's controller role (--role controller, csi/ctlrole.c) on the
host, without Ceph, in both builds (the ASan build checks its leaks):

  - it needs --rbd-clusters (exit 2 without), --role takes node|controller;
  - it touches no node state: state, pool and run directories stay empty;
  - Probe is ready while the cluster file is readable, not ready without it;
  - GetPluginCapabilities: no VOLUME_ACCESSIBILITY_CONSTRAINTS, no
    GROUP_CONTROLLER_SERVICE (the GroupController is not served: UNIMPLEMENTED);
    ControllerGetCapabilities: create/delete volume, expand, create/delete
    snapshot, clone; no Node service, no ListVolumes, no GetSnapshot and no
    volume health RPCs (UNIMPLEMENTED);
  - local volumes: CreateVolume, DeleteVolume, CreateSnapshot,
    DeleteSnapshot FAILED_PRECONDITION; ControllerExpandVolume OK with node
    expansion required (NAME and NAME@NODE ids), bad ids and missing
    capacity INVALID_ARGUMENT;
  - RBD volumes are handed to the RBD code: missing secrets INVALID_ARGUMENT
    naming userID, an unreachable cluster UNAVAILABLE within its bound (a
    worker process ran);
  - SIGTERM: exit 0.
The RBD calls against a real Ceph, in the container: container/controller-rbd.
usage: test_csi_ctlrole.py PLUGIN_BINARY PROTO_DIR [QSDCTL]   (~12 s)"""
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "ceph"))
import csilib  # noqa: E402
from csilib import expect_code, mount_cap  # noqa: E402
import cephlib  # noqa: E402  (a free port for the unreachable cluster)

import grpc  # noqa: E402

C = grpc.StatusCode
MiB = 1 << 20


def main():
    plugin, proto = sys.argv[1], sys.argv[2]
    r = subprocess.run([plugin, "--role", "controller"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and "--rbd-clusters" in r.stderr, (r.returncode, r.stderr)
    r = subprocess.run([plugin, "--role", "both"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "node or controller" in r.stderr, r.stderr

    env = csilib.Env(plugin, proto)
    try:
        clusters = os.path.join(env.root, "clusters.json")
        with open(clusters, "w") as f:
            json.dump([{"clusterID": "dead",
                        "monitors": ["127.0.0.1:%d" % cephlib._free_port()]}], f)
        c = env.start(extra=["--role", "controller", "--rbd-clusters", clusters])
        pb = env.pb
        assert c.Probe(pb.ProbeRequest(), timeout=10).ready.value
        os.rename(clusters, clusters + ".away")
        assert not c.Probe(pb.ProbeRequest(), timeout=10).ready.value, "ready without the file"
        os.rename(clusters + ".away", clusters)
        assert c.Probe(pb.ProbeRequest(), timeout=10).ready.value

        caps = c.GetPluginCapabilities(pb.GetPluginCapabilitiesRequest(), timeout=10)
        svc = {x.service.type for x in caps.capabilities if x.HasField("service")}
        assert svc == {pb.PluginCapability.Service.CONTROLLER_SERVICE}, caps
        R = pb.ControllerServiceCapability.RPC
        got = {x.rpc.type for x in c.ControllerGetCapabilities(
            pb.ControllerGetCapabilitiesRequest(), timeout=10).capabilities}
        assert got == {R.CREATE_DELETE_VOLUME, R.EXPAND_VOLUME, R.CREATE_DELETE_SNAPSHOT,
                       R.CLONE_VOLUME}, got
        expect_code(c.NodeGetInfo, pb.NodeGetInfoRequest(), C.UNIMPLEMENTED, "NodeGetInfo")
        expect_code(c.ListVolumes, pb.ListVolumesRequest(), C.UNIMPLEMENTED, "ListVolumes")
        # Not advertised here (no local volumes; RBD's are not served):
        # GetSnapshot and the volume health RPCs.
        expect_code(c.GetSnapshot, pb.GetSnapshotRequest(snapshot_id="s@node-7"),
                    C.UNIMPLEMENTED, "GetSnapshot in the controller role")
        expect_code(c.ControllerGetVolumeHealth, pb.ControllerGetVolumeHealthRequest(
            volume_id="pvc-1@node-7"), C.UNIMPLEMENTED, "ControllerGetVolumeHealth")
        expect_code(c.ControllerListVolumeHealth, pb.ControllerListVolumeHealthRequest(),
                    C.UNIMPLEMENTED, "ControllerListVolumeHealth")
        expect_code(c.CreateVolumeGroupSnapshot, pb.CreateVolumeGroupSnapshotRequest(
            name="g", source_volume_ids=["pvc-1@node-7"]), C.UNIMPLEMENTED,
            "CreateVolumeGroupSnapshot in the controller role")
        # ControllerModifyVolume of a node's volume: UNAVAILABLE naming the
        # node (without --node-dial the controller does not reach it).
        m = expect_code(c.ControllerModifyVolume, pb.ControllerModifyVolumeRequest(
            volume_id="pvc-1@node-7", mutable_parameters={"readIops": "100"}),
            C.UNAVAILABLE, "ControllerModifyVolume of node-7's volume")
        assert "node-7" in m and "--node-dial" in m, m

        # --- local volumes
        local = pb.CreateVolumeRequest(
            name="pvc-1", capacity_range=pb.CapacityRange(required_bytes=64 * MiB),
            volume_capabilities=[mount_cap(pb)], parameters={"format": "raw"})
        m = expect_code(c.CreateVolume, local, C.FAILED_PRECONDITION, "local CreateVolume")
        assert "rbd" in m and "node" in m, m
        for vid in ("pvc-1", "pvc-1@node-7"):
            expect_code(c.DeleteVolume, pb.DeleteVolumeRequest(volume_id=vid),
                        C.FAILED_PRECONDITION, "local DeleteVolume " + vid)
            r = c.ControllerExpandVolume(pb.ControllerExpandVolumeRequest(
                volume_id=vid, capacity_range=pb.CapacityRange(required_bytes=80 * MiB)),
                timeout=10)
            assert r.capacity_bytes == 80 * MiB and r.node_expansion_required, r
        r = c.ControllerExpandVolume(pb.ControllerExpandVolumeRequest(
            volume_id="pvc-1", capacity_range=pb.CapacityRange(limit_bytes=90 * MiB)),
            timeout=10)
        assert r.capacity_bytes == 90 * MiB and r.node_expansion_required, r
        m = expect_code(c.ControllerExpandVolume, pb.ControllerExpandVolumeRequest(
            volume_id="pvc-1@no/de", capacity_range=pb.CapacityRange(required_bytes=MiB)),
            C.INVALID_ARGUMENT, "bad node in the id")
        assert "volume_id" in m, m
        m = expect_code(c.ControllerExpandVolume, pb.ControllerExpandVolumeRequest(
            volume_id="pvc-1"), C.INVALID_ARGUMENT, "no capacity")
        assert "capacity_range" in m, m
        expect_code(c.CreateSnapshot, pb.CreateSnapshotRequest(
            name="snap-1", source_volume_id="pvc-1@node-7"), C.FAILED_PRECONDITION,
            "local CreateSnapshot")
        expect_code(c.DeleteSnapshot, pb.DeleteSnapshotRequest(snapshot_id="snap-1@node-7"),
                    C.FAILED_PRECONDITION, "local DeleteSnapshot")

        # --- RBD volumes reach the RBD code
        params = {"backend": "rbd", "clusterID": "dead", "pool": "rbd"}
        req = pb.CreateVolumeRequest(
            name="pvc-2", capacity_range=pb.CapacityRange(required_bytes=64 * MiB),
            volume_capabilities=[mount_cap(pb)], parameters=params)
        m = expect_code(c.CreateVolume, req, C.INVALID_ARGUMENT, "no secrets")
        assert "userID" in m, m
        req.secrets["userID"] = "csi"
        req.secrets["userKey"] = "AQBVc0BnAAAAABAAzW2ah8KzhXoKqaRU4YDK0g=="
        t0 = time.monotonic()
        expect_code(c.CreateVolume, req, C.UNAVAILABLE, "unreachable cluster")
        print("unreachable cluster: UNAVAILABLE after %.1f s" % (time.monotonic() - t0))

        for d in (env.state, env.pool, env.run):
            assert os.listdir(d) == [], "%s: %s" % (d, os.listdir(d))
        rc = env.stop()
        assert rc == 0, "exit %s:\n%s" % (rc, env.log_tail())
        print("PASS")
    finally:
        env.cleanup()


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
