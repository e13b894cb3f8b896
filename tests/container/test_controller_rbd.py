#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The plugin image in its controller role, run with podman the way the
controller Deployment (deploy/kubernetes/35-controller-deployment.yaml)
runs it, against a real single-node Ceph (tests/ceph/cephlib.py, cephx on,
the container on the host network to reach it):

  - the container is unprivileged: user 65532, no capabilities (CapEff 0),
    no_new_privs, read-only root filesystem without tmpfs, no device of the
    host (no block device in its /dev), only the socket directory and the
    cluster file mounted, podman's default seccomp profile (as the
    manifest's RuntimeDefault; it refuses io_uring, so the plugin's event
    loop runs on epoll, which its log must say); it becomes ready (Probe)
    like that;
  - Identity: no VOLUME_ACCESSIBILITY_CONSTRAINTS, CONTROLLER_SERVICE and
    online expansion; ControllerGetCapabilities: create/delete volume,
    expand, create/delete snapshot, clone; the Node service is not served;
  - through its socket (python3-grpcio): CreateVolume of an RBD volume (the
    image exists with that size; the answer has no accessible_topology),
    ControllerExpandVolume (the image grows, node expansion required),
    CreateSnapshot (an "rbdsnap:" id, ready), CreateVolume from it,
    DeleteVolume and DeleteSnapshot (no image left in the namespace; again:
    OK);
  - local volumes, which the central sidecars see too: CreateVolume,
    DeleteVolume and CreateSnapshot refused with FAILED_PRECONDITION,
    ControllerExpandVolume answered "node expansion required";
  - the cephx key appears nowhere in the container's logs, its command
    line, environment or configuration (podman inspect), nor in the command
    line of any process in it;
  - the image has what librbd needs at run time: ldd of the plugin finds
    every library (librbd, librados among them), and the calls above went
    through librados/librbd in the container.

The container, the Ceph daemons and the temporary directory are removed
also after a failure.
usage: test_controller_rbd.py --images IMAGES_ENV --proto DIR
~20 s (of which ~10 s Ceph start).  Exit 77 (skip) only when podman or
Ceph cannot run here; the reason is printed."""
import argparse
import json
import os
import shutil
import stat
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "ceph"))
import ctrlib  # noqa: E402  (exits 77 without python3-grpcio)
from ctrlib import Failure, log, podman  # noqa: E402
import cephlib  # noqa: E402
import csilib  # noqa: E402
from csilib import expect_code, mount_cap  # noqa: E402

import grpc  # noqa: E402

DEPLOYMENT = os.path.join(HERE, "..", "..", "deploy", "kubernetes",
                          "35-controller-deployment.yaml")
UID = 65532
MiB = 1 << 20
C = grpc.StatusCode


def deployment_plugin():
    """The plugin container of the controller Deployment: its arguments, and
    a check that it still has the shape this test reproduces."""
    import yaml
    with open(DEPLOYMENT) as f:
        dep = [d for d in yaml.safe_load_all(f) if d and d.get("kind") == "Deployment"][0]
    spec = dep["spec"]["template"]["spec"]
    ctr = [c for c in spec["containers"] if c["name"] == "qsd-csi-plugin"][0]
    mounts = {m["mountPath"] for m in ctr["volumeMounts"]}
    sc = ctr.get("securityContext") or {}
    problems = []
    if mounts != {"/csi", "/dial", "/etc/qsd-csi/rbd"}:
        problems.append("mounts %s, the test reproduces /csi, /dial and /etc/qsd-csi/rbd" %
                        sorted(mounts))
    if spec.get("securityContext", {}).get("runAsUser") != UID:
        problems.append("runAsUser is not %d" % UID)
    if sc.get("privileged") or not sc.get("readOnlyRootFilesystem") or \
            sc.get("capabilities", {}).get("drop") != ["ALL"] or \
            sc.get("seccompProfile", {}).get("type") not in (None, "RuntimeDefault"):
        problems.append("securityContext %r" % sc)
    if problems:
        raise Failure("%s changed shape, update this test: %s" % (DEPLOYMENT,
                                                                "; ".join(problems)))
    return list(ctr.get("command", [])[1:]) + list(ctr["args"])


def container_pids(name):
    """Host pids of every process in the container (its main process and
    descendants)."""
    main = int(podman("inspect", "-f", "{{.State.Pid}}", name).stdout.strip())
    children = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % p) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(p))
    out, todo = [], [main]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def check_unprivileged(name):
    info = json.loads(podman("inspect", name).stdout)[0]
    hc = info["HostConfig"]
    assert not hc.get("Privileged"), "privileged container"
    assert not hc.get("Devices"), "devices given: %r" % hc.get("Devices")
    assert hc.get("ReadonlyRootfs"), "root filesystem writable"
    pid = int(info["State"]["Pid"])
    with open("/proc/%d/status" % pid) as f:
        status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    assert status["CapEff"].strip() == "0000000000000000", status["CapEff"]
    assert status["CapPrm"].strip() == "0000000000000000", status["CapPrm"]
    assert status["NoNewPrivs"].strip() == "1", status["NoNewPrivs"]
    assert status["Uid"].split()[:2] == [str(UID)] * 2, status["Uid"]
    devdir = "/proc/%d/root/dev" % pid
    blocks = [n for n in os.listdir(devdir)
              if stat.S_ISBLK(os.lstat(os.path.join(devdir, n)).st_mode)]
    assert not blocks, "block devices in the container's /dev: %s" % blocks
    assert not os.path.exists(os.path.join(devdir, "vhost-net")), "host devices in /dev"
    with open("/proc/%d/mounts" % pid) as f:
        mounts = [line.split()[1] for line in f]
    for m in mounts:
        assert not m.startswith(("/var/lib/kubelet", "/run/qsd-csi", "/sys/fs/cgroup/qsd")), m
    log("unprivileged: uid %d, CapEff 0, no_new_privs, read-only root, /dev: %s" %
        (UID, " ".join(sorted(os.listdir(devdir)))))


def check_libraries(image):
    r = podman("run", "--rm", "--network=none", "--entrypoint", "/usr/bin/ldd", image,
               "/usr/local/bin/qsd-csi-plugin", check=False, timeout=120)
    out = r.stdout + r.stderr
    if r.returncode != 0 or "not found" in out:
        raise Failure("ldd of the plugin in the image:\n" + out)
    for lib in ("librbd.so.1", "librados.so.2"):
        assert lib in out, "%s not linked:\n%s" % (lib, out)
    log("image libraries: every one found (librbd.so.1, librados.so.2 among them)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", required=True)
    ap.add_argument("--proto", required=True)
    a = ap.parse_args()
    why = ctrlib.podman_usable()
    if why:
        ctrlib.skip(why)
    why = cephlib.have_ceph()
    if why:
        ctrlib.skip("Ceph " + why + " (scripts/setup.sh installs it)")
    if not os.path.exists(a.images):
        raise SystemExit("FAIL: %s missing: the container/images test (fixture) did not run "
                         "or failed" % a.images)
    image = ctrlib.read_images(a.images)["PLUGIN_IMAGE"]
    args = deployment_plugin()
    name = "qsd-csi-test-ctl-%d" % os.getpid()
    root = tempfile.mkdtemp(prefix="qsd-ctl-%d-" % os.getpid())
    ceph = cephlib.Cluster()
    created = False
    try:
        os.chmod(root, 0o755)
        pb = csilib.compile_proto(a.proto, root)
        sockdir = os.path.join(root, "csi")
        rbddir = os.path.join(root, "rbd")
        dialdir = os.path.join(root, "dial")  # the dial gate's (not run here)
        os.makedirs(sockdir)
        os.makedirs(rbddir)
        os.makedirs(dialdir)
        os.chown(sockdir, UID, UID)
        check_libraries(image)
        ceph.start()
        log("ceph up in %.1f s" % ceph.start_seconds)
        ceph.write_clusters(rbddir, "ceph-a")
        # The manifest's arguments; its metrics port taken from the loopback
        # (the container shares the host's network to reach Ceph).
        port = ctrlib.free_port()
        args = ["--http-endpoint=127.0.0.1:%d" % port if x.startswith("--http-endpoint=")
                else x for x in args]
        created = True
        podman("run", "-d", "--name", name, "--user", "%d:%d" % (UID, UID),
               "--read-only", "--read-only-tmpfs=false", "--cap-drop=ALL",
               "--security-opt", "no-new-privileges", "--network=host",
               # RuntimeDefault: podman's default profile, which refuses
               # io_uring (the plugin's loop runs on epoll).
               *ctrlib.sanitizer_env(),
               "-v", "%s:/csi" % sockdir, "-v", "%s:/etc/qsd-csi/rbd:ro" % rbddir,
               "-v", "%s:/dial" % dialdir, image, *args)
        sock = os.path.join(sockdir, "csi.sock")
        deadline = time.monotonic() + 60
        c = None
        while c is None:
            state = podman("inspect", "-f", "{{.State.Status}}", name).stdout.strip()
            if state in ("exited", "stopped"):
                raise Failure("controller container exited:\n" +
                              podman("logs", name, check=False).stderr)
            if os.path.exists(sock):
                cl = csilib.Client(pb, sock)
                try:
                    if cl.Probe(pb.ProbeRequest(), timeout=5).ready.value:
                        c = cl
                        break
                except grpc.RpcError:
                    pass
                cl.close()
            if time.monotonic() > deadline:
                raise Failure("controller not ready within 60 s:\n" +
                              podman("logs", name, check=False).stderr)
            time.sleep(0.1)
        log("controller ready")
        check_unprivileged(name)

        # --- Identity and capabilities
        caps = c.GetPluginCapabilities(pb.GetPluginCapabilitiesRequest(), timeout=10)
        svc = {x.service.type for x in caps.capabilities if x.HasField("service")}
        PC = pb.PluginCapability.Service
        assert PC.CONTROLLER_SERVICE in svc, caps
        assert PC.VOLUME_ACCESSIBILITY_CONSTRAINTS not in svc, caps
        assert any(x.HasField("volume_expansion") and
                   x.volume_expansion.type == pb.PluginCapability.VolumeExpansion.ONLINE
                   for x in caps.capabilities), caps
        cc = c.ControllerGetCapabilities(pb.ControllerGetCapabilitiesRequest(), timeout=10)
        R = pb.ControllerServiceCapability.RPC
        got = {x.rpc.type for x in cc.capabilities}
        # MODIFY_VOLUME and LIST_SNAPSHOTS: the manifest's --node-dial (local
        # volumes' limits and snapshots go to their node), as the
        # GroupController and SnapshotMetadata services
        assert got == {R.CREATE_DELETE_VOLUME, R.EXPAND_VOLUME, R.CREATE_DELETE_SNAPSHOT,
                       R.CLONE_VOLUME, R.MODIFY_VOLUME, R.LIST_SNAPSHOTS}, got
        assert {PC.GROUP_CONTROLLER_SERVICE, PC.SNAPSHOT_METADATA_SERVICE} <= svc, caps
        expect_code(c.NodeGetInfo, pb.NodeGetInfoRequest(), C.UNIMPLEMENTED, "Node service")

        # --- an RBD volume: create, expand, delete
        secrets = ceph.secrets
        params = {"backend": "rbd", "clusterID": "ceph-a", "pool": ceph.pool,
                  "radosNamespace": ceph.namespace}
        img = "%s/%s/pvc-ctl" % (ceph.pool, ceph.namespace)
        req = pb.CreateVolumeRequest(
            name="pvc-ctl", capacity_range=pb.CapacityRange(required_bytes=64 * MiB),
            volume_capabilities=[mount_cap(pb)], parameters=params, secrets=secrets)
        vol = c.CreateVolume(req, timeout=csilib.CALL_TIMEOUT).volume
        vid = "rbd:ceph-a:%s:%s:pvc-ctl" % (ceph.pool, ceph.namespace)
        assert vol.volume_id == vid and vol.capacity_bytes == 64 * MiB, vol
        assert len(vol.accessible_topology) == 0, vol.accessible_topology
        assert json.loads(ceph.rbd("info", "--format", "json", img))["size"] == 64 * MiB
        r = c.ControllerExpandVolume(pb.ControllerExpandVolumeRequest(
            volume_id=vid, capacity_range=pb.CapacityRange(required_bytes=96 * MiB),
            secrets=secrets), timeout=csilib.CALL_TIMEOUT)
        assert r.capacity_bytes == 96 * MiB and r.node_expansion_required, r
        assert json.loads(ceph.rbd("info", "--format", "json", img))["size"] == 96 * MiB
        log("RBD volume created (64 MiB, no topology) and expanded (96 MiB) in the image")

        # --- local volumes: the node's sidecars' business
        local = pb.CreateVolumeRequest(
            name="pvc-local", capacity_range=pb.CapacityRange(required_bytes=64 * MiB),
            volume_capabilities=[mount_cap(pb)], parameters={"format": "qcow2"})
        m = expect_code(c.CreateVolume, local, C.FAILED_PRECONDITION, "local CreateVolume")
        assert "node" in m and "rbd" in m, m
        expect_code(c.DeleteVolume, pb.DeleteVolumeRequest(volume_id="pvc-local@node-1"),
                    C.FAILED_PRECONDITION, "local DeleteVolume (never OK: the file would stay)")
        # a local snapshot goes to its node (--node-dial); this container
        # has no API server or token: UNAVAILABLE naming what is missing,
        # never NOT_FOUND (a CO may take that for "gone")
        m = expect_code(c.CreateSnapshot, pb.CreateSnapshotRequest(
            name="snap-1", source_volume_id="pvc-local@node-1"), C.UNAVAILABLE,
            "local CreateSnapshot")
        assert "node-1" in m and "token" in m, m
        m = expect_code(c.DeleteSnapshot, pb.DeleteSnapshotRequest(
            snapshot_id="snap-1@node-1"), C.UNAVAILABLE, "local DeleteSnapshot")
        assert "node-1" in m and "token" in m, m
        r = c.ControllerExpandVolume(pb.ControllerExpandVolumeRequest(
            volume_id="pvc-local@node-1",
            capacity_range=pb.CapacityRange(required_bytes=128 * MiB)), timeout=10)
        assert r.capacity_bytes == 128 * MiB and r.node_expansion_required, r
        log("local volumes: create/delete refused, snapshots sent to the node (UNAVAILABLE "
            "without a token), expansion left to the node")

        # --- RBD snapshot and restore (rbd_snap.c behind the controller role)
        snap = c.CreateSnapshot(pb.CreateSnapshotRequest(
            name="snap-ctl", source_volume_id=vid, secrets=secrets),
            timeout=csilib.CALL_TIMEOUT).snapshot
        assert snap.snapshot_id.startswith("rbdsnap:") and snap.ready_to_use, snap
        restore = pb.CreateVolumeRequest(
            name="pvc-ctl-restore", capacity_range=pb.CapacityRange(required_bytes=96 * MiB),
            volume_capabilities=[mount_cap(pb)], parameters=params, secrets=secrets,
            volume_content_source=pb.VolumeContentSource(
                snapshot=pb.VolumeContentSource.SnapshotSource(snapshot_id=snap.snapshot_id)))
        rvol = c.CreateVolume(restore, timeout=csilib.CALL_TIMEOUT).volume
        assert rvol.volume_id.endswith(":pvc-ctl-restore") and not rvol.accessible_topology, rvol
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=rvol.volume_id, secrets=secrets),
                       timeout=csilib.CALL_TIMEOUT)
        c.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=snap.snapshot_id, secrets=secrets),
                         timeout=csilib.CALL_TIMEOUT)
        log("RBD snapshot %s taken, restored into a volume, both deleted" % snap.snapshot_id)

        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vid, secrets=secrets),
                       timeout=csilib.CALL_TIMEOUT)
        names = ceph.rbd("ls", "%s/%s" % (ceph.pool, ceph.namespace)).split()
        assert names == [], names
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vid, secrets=secrets),
                       timeout=csilib.CALL_TIMEOUT)
        log("RBD volume deleted (and again: OK)")
        c.close()

        # --- the key: in no log line, command line, environment, config
        logs = podman("logs", name, check=False)
        text = logs.stdout + logs.stderr
        assert "role=controller" in text or '"role":"controller"' in text, text[-2000:]
        # podman's default profile refuses io_uring: the loop said it runs on epoll
        assert '"backend":"epoll"' in text or "backend=epoll" in text, text[-2000:]
        log("the plugin runs under podman's default seccomp profile, its loop on epoll")
        assert ceph.key not in text, "the key is in the container's log"
        assert ceph.key not in podman("inspect", name).stdout, "the key is in podman inspect"
        pids = container_pids(name)
        for pid in pids:
            for f in ("cmdline", "environ"):
                try:
                    with open("/proc/%d/%s" % (pid, f), "rb") as fh:
                        assert ceph.key.encode() not in fh.read(), "key in %s of %d" % (f, pid)
                except FileNotFoundError:
                    pass
        log("the key is in no log line (%d bytes of log), not in podman inspect, not in the "
            "command line or environment of the container's %d process(es)" %
            (len(text), len(pids)))
        print("PASS")
        return 0
    except Failure as e:
        print("FAIL: %s" % e)
        return 1
    finally:
        if created:
            r = podman("logs", "--tail", "30", name, check=False)
            tail = (r.stdout + r.stderr)[-4000:]
            print("---- controller log (tail)\n" + (tail.replace(ceph.key, "<KEY>")
                                                   if ceph.key else tail))
            podman("rm", "-f", "-t", "5", name, check=False, timeout=120)
        ceph.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
