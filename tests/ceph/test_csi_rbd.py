#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The RBD backend against a real single-node Ceph (cephlib.py, cephx on,
a user confined to one pool namespace), through the plugin's gRPC socket:

  - CreateVolume with backend rbd: the image exists with the size asked
    for, the id names cluster, pool, namespace and image; a retry answers
    the same volume, another size ALREADY_EXISTS;
  - bad requests fail with the code and a message naming what is wrong:
    secrets missing (INVALID_ARGUMENT, naming the key), parameters missing
    or unknown, unknown clusterID (INVALID_ARGUMENT), wrong key
    (UNAUTHENTICATED), unknown pool (INVALID_ARGUMENT), a namespace the
    user may not write (PERMISSION_DENIED), an unreachable
    cluster (UNAVAILABLE, bounded), and none of them leaves an image;
  - ControllerExpandVolume grows the image (never shrinks; OUT_OF_RANGE
    below its size, NOT_FOUND for a missing one, secrets required);
  - NodeStageVolume starts the volume's QSD with QEMU's rbd driver (key in
    the private control directory, not on its command line), NodePublish
    hands out the socket, a vhost-user client writes and reads back, also
    after a kill -9 of the plugin (its QSD adopted) and after unstage and a
    new stage; ControllerExpandVolume + NodeExpandVolume
    grow it online (the client sees the new capacity); a second plugin (another node) is refused
    staging it while the first one's QSD holds the image's lock; unstage
    leaves no QSD and no key file;
  - DeleteVolume is refused (FAILED_PRECONDITION) while a QSD has the image
    open, succeeds once that QSD is gone, is idempotent, and refuses an
    image the plugin did not create;
  - the key is in no log line and on no command line.

usage: test_csi_rbd.py PLUGIN_BINARY PROTO_DIR [QSDCTL]
~25 s (of which ~10 s Ceph start, 10 s the unreachable cluster's bound)."""
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "csi"))
import cephlib  # noqa: E402
import csilib  # noqa: E402
from csilib import expect_code, mount_cap  # noqa: E402

import grpc  # noqa: E402

MiB = 1 << 20
C = grpc.StatusCode


def main():
    plugin, proto, qsdctl = sys.argv[1], sys.argv[2], sys.argv[3]
    why = cephlib.have_ceph()
    if why:
        csilib.skip("Ceph " + why + " (scripts/setup.sh installs it)")
    env = csilib.Env(plugin, proto)
    ceph = cephlib.Cluster()
    qsd = None
    try:
        ceph.start()
        print("ceph up in %.1f s" % ceph.start_seconds)
        # A cluster file: ours, and one whose monitor port nobody listens on.
        clusters = ceph.write_clusters(env.root, extra=[
            {"clusterID": "dead", "monitors": ["127.0.0.1:%d" % cephlib._free_port()]}])
        # An overcommit limit: GetCapacity of local volumes is what it leaves.
        flags = ["--rbd-clusters", clusters, "--overcommit-ratio", "1"]
        c = env.start(extra=flags)
        pb = env.pb
        secrets = ceph.secrets
        params = {"backend": "rbd", "clusterID": "c1", "pool": ceph.pool,
                  "radosNamespace": ceph.namespace,
                  "csi.storage.k8s.io/pvc/name": "claim"}

        def create(name, size=64 * MiB, p=params, s=secrets):
            return pb.CreateVolumeRequest(
                name=name, capacity_range=pb.CapacityRange(required_bytes=size),
                volume_capabilities=[mount_cap(pb)], parameters=p, secrets=s)

        def images():
            return ceph.rbd("ls", "%s/%s" % (ceph.pool, ceph.namespace)).split()

        # --- refusals, each before or without touching the cluster
        m = expect_code(c.CreateVolume, create("v1", s={}), C.INVALID_ARGUMENT, "no secrets")
        assert "userID" in m, m
        m = expect_code(c.CreateVolume, create("v1", s={"userID": ceph.user}),
                        C.INVALID_ARGUMENT, "no key")
        assert "userKey" in m, m
        m = expect_code(c.CreateVolume, create("v1", p=dict(params, pool="")),
                        C.INVALID_ARGUMENT, "empty pool")
        assert "pool" in m, m
        p = dict(params)
        del p["pool"]
        m = expect_code(c.CreateVolume, create("v1", p=p), C.INVALID_ARGUMENT, "no pool")
        assert "pool" in m, m
        m = expect_code(c.CreateVolume, create("v1", p=dict(params, format="qcow2")),
                        C.INVALID_ARGUMENT, "unknown parameter")
        assert "format" in m, m
        m = expect_code(c.CreateVolume, create("v1", p=dict(params, clusterID="c2")),
                        C.INVALID_ARGUMENT, "unknown cluster")
        assert "clusterID" in m and "c2" in m, m
        wrong = ceph.key[:-6] + ("AAAA==" if not ceph.key.endswith("AAAA==") else "BBBB==")
        m = expect_code(c.CreateVolume, create("v1", s=dict(secrets, userKey=wrong)),
                        C.UNAUTHENTICATED, "wrong key")
        assert "userKey" in m, m
        m = expect_code(c.CreateVolume, create("v1", p=dict(params, pool="nopool")),
                        C.INVALID_ARGUMENT, "unknown pool")
        assert "nopool" in m and "pool" in m, m
        # The user's caps cover one namespace: another one, existing or not, is
        # not its business.
        m = expect_code(c.CreateVolume, create("v1", p=dict(params, radosNamespace="nons")),
                        C.PERMISSION_DENIED, "unknown namespace")
        assert "radosNamespace" in m, m
        p = dict(params)
        del p["radosNamespace"]
        m = expect_code(c.CreateVolume, create("v1", p=p), C.PERMISSION_DENIED,
                        "outside the user's namespace")
        t0 = time.monotonic()
        m = expect_code(c.CreateVolume, create("v1", p=dict(params, clusterID="dead")),
                        C.UNAVAILABLE, "unreachable cluster")
        print("unreachable cluster answered in %.1f s: %s" % (time.monotonic() - t0, m))
        assert images() == [], images()
        assert ceph.rbd("ls", ceph.pool).split() == []

        # --- create, retry, conflict
        vol = c.CreateVolume(create("v1"), timeout=csilib.CALL_TIMEOUT).volume
        vid = "rbd:c1:%s:%s:v1" % (ceph.pool, ceph.namespace)
        assert vol.volume_id == vid and vol.capacity_bytes == 64 * MiB, vol
        info = json.loads(ceph.rbd("info", "--format", "json",
                                   "%s/%s/v1" % (ceph.pool, ceph.namespace)))
        assert info["size"] == 64 * MiB and "exclusive-lock" in info["features"], info
        again = c.CreateVolume(create("v1"), timeout=csilib.CALL_TIMEOUT).volume
        assert again.volume_id == vid and again.capacity_bytes == 64 * MiB, again
        expect_code(c.CreateVolume, create("v1", size=128 * MiB), C.ALREADY_EXISTS,
                    "other size")

        # --- expand: grows the image, never shrinks, needs the secret
        def expand(req, lim=0, s=secrets, vid=vid):
            return pb.ControllerExpandVolumeRequest(
                volume_id=vid, capacity_range=pb.CapacityRange(required_bytes=req,
                                                               limit_bytes=lim), secrets=s)
        m = expect_code(c.ControllerExpandVolume, expand(128 * MiB, s={}), C.INVALID_ARGUMENT,
                        "expand without secrets")
        assert "userID" in m, m
        r = c.ControllerExpandVolume(expand(128 * MiB), timeout=csilib.CALL_TIMEOUT)
        assert r.capacity_bytes == 128 * MiB and r.node_expansion_required, r
        info = json.loads(ceph.rbd("info", "--format", "json",
                                   "%s/%s/v1" % (ceph.pool, ceph.namespace)))
        assert info["size"] == 128 * MiB, info
        r = c.ControllerExpandVolume(expand(64 * MiB), timeout=csilib.CALL_TIMEOUT)
        assert r.capacity_bytes == 128 * MiB, r
        expect_code(c.ControllerExpandVolume, expand(64 * MiB, 96 * MiB), C.OUT_OF_RANGE,
                    "expand with a limit below the size")
        expect_code(c.ControllerExpandVolume, expand(64 * MiB, vid=vid[:-1] + "9"), C.NOT_FOUND,
                    "expand a missing volume")

        # --- node: stage (its QSD with QEMU's rbd driver), publish, a vhost-user
        # client writes and reads back; a second node cannot stage it meanwhile.
        k = env.kubelet
        stg = os.path.join(k, "plugins/kubernetes.io/csi/test.qsd-csi.dev/s1/globalmount")
        tgt = os.path.join(k, "pods/p1/volumes/kubernetes.io~csi/v1/mount")
        os.makedirs(stg)
        os.makedirs(os.path.dirname(tgt))
        cap = mount_cap(pb)
        sreq = pb.NodeStageVolumeRequest(volume_id=vid, staging_target_path=stg,
                                         volume_capability=cap, secrets=secrets)
        m = expect_code(c.NodeStageVolume, pb.NodeStageVolumeRequest(
            volume_id=vid, staging_target_path=stg, volume_capability=cap), C.INVALID_ARGUMENT,
            "stage without secrets")
        assert "userID" in m, m
        def local_capacity():
            return c.GetCapacity(pb.GetCapacityRequest(), timeout=csilib.CALL_TIMEOUT)

        cap_before = local_capacity()
        assert cap_before.available_capacity > 0, cap_before
        c.NodeStageVolume(sreq, timeout=csilib.CALL_TIMEOUT)
        c.NodeStageVolume(sreq, timeout=csilib.CALL_TIMEOUT)  # idempotent
        # The node's record of the staged RBD volume is no local volume:
        # ListVolumes does not list it, the local pool's capacity does not
        # count it (docs/rbd.md).
        listed = [e.volume.volume_id for e in
                  c.ListVolumes(pb.ListVolumesRequest(), timeout=csilib.CALL_TIMEOUT).entries]
        assert not any("rbd" in i for i in listed), listed
        cap_after = local_capacity()
        assert cap_after.available_capacity == cap_before.available_capacity, \
            (cap_before, cap_after)
        c.NodePublishVolume(pb.NodePublishVolumeRequest(
            volume_id=vid, staging_target_path=stg, target_path=tgt, volume_capability=cap),
            timeout=csilib.CALL_TIMEOUT)
        sock = os.path.join(tgt, "vhost.sock")
        subprocess.run([qsdctl, "verify", "--timeout-ms", "20000", "--size", str(128 * MiB),
                        "--write", "--seed", "9", sock], check=True, timeout=120)
        meta = json.load(open(os.path.join(tgt, "volume.json")))
        assert meta["size"] == 128 * MiB, meta
        for pid in env.running_qsds():
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                assert ceph.key.encode() not in f.read(), "key on a QSD's command line"
        m = expect_code(c.DeleteVolume, pb.DeleteVolumeRequest(volume_id=vid, secrets=secrets),
                        C.FAILED_PRECONDITION, "delete while staged")
        # kill -9 of the plugin: the next one adopts the running QSD (no key
        # needed), the client still reads what it wrote.
        qsd_before = set(env.running_qsds())
        env.stop(signal.SIGKILL)
        c = env.start(extra=flags)
        assert set(env.running_qsds()) == qsd_before, (qsd_before, env.running_qsds())
        c.NodeStageVolume(sreq, timeout=csilib.CALL_TIMEOUT)
        subprocess.run([qsdctl, "verify", "--timeout-ms", "20000", "--check", "--seed", "9",
                        sock], check=True, timeout=120)
        # A second node (another plugin, other node id) is refused while the
        # first one's QSD holds the image's lock.
        env2 = csilib.Env(plugin, proto, prefix="qsd-csi-test-node2-")
        try:
            env2.node = "node-2"
            c2 = env2.start(extra=["--rbd-clusters", clusters])
            stg2 = os.path.join(env2.kubelet, "plugins/kubernetes.io/csi/x/s1/globalmount")
            os.makedirs(stg2)
            m = expect_code(c2.NodeStageVolume, pb.NodeStageVolumeRequest(
                volume_id=vid, staging_target_path=stg2, volume_capability=cap,
                secrets=secrets), C.FAILED_PRECONDITION, "stage on a second node")
            assert "in use" in m, m
            assert not env2.running_qsds(), env2.running_qsds()
        finally:
            env2.cleanup()
        c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=vid, target_path=tgt),
                              timeout=csilib.CALL_TIMEOUT)
        c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id=vid, staging_target_path=stg),
                            timeout=csilib.CALL_TIMEOUT)
        assert not env.running_qsds(), env.running_qsds()
        assert not os.path.exists(os.path.join(env.run, "ctl", vid.replace(":", "_"))), \
            "the key file's directory is left"
        # Staged again (a new QSD): the data is in Ceph.
        c.NodeStageVolume(sreq, timeout=csilib.CALL_TIMEOUT)
        c.NodePublishVolume(pb.NodePublishVolumeRequest(
            volume_id=vid, staging_target_path=stg, target_path=tgt, volume_capability=cap),
            timeout=csilib.CALL_TIMEOUT)
        subprocess.run([qsdctl, "verify", "--timeout-ms", "20000", "--check", "--seed", "9",
                        sock], check=True, timeout=120)
        # Online expansion: the controller grows the image, the node's QSD
        # (block_resize) tells the connected client.
        r = c.ControllerExpandVolume(expand(192 * MiB), timeout=csilib.CALL_TIMEOUT)
        assert r.capacity_bytes == 192 * MiB and r.node_expansion_required, r
        ne = c.NodeExpandVolume(pb.NodeExpandVolumeRequest(
            volume_id=vid, volume_path=tgt, staging_target_path=stg,
            capacity_range=pb.CapacityRange(required_bytes=192 * MiB), volume_capability=cap),
            timeout=csilib.CALL_TIMEOUT)
        assert ne.capacity_bytes == 192 * MiB, ne
        info = json.loads(subprocess.run([qsdctl, "vhost-info", "--json", sock], check=True,
                                         capture_output=True, text=True, timeout=30).stdout)
        assert info["capacity"] == 192 * MiB, info
        subprocess.run([qsdctl, "verify", "--timeout-ms", "20000", "--size", str(192 * MiB),
                        sock], check=True, timeout=120)  # the new end is writable
        c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=vid, target_path=tgt),
                              timeout=csilib.CALL_TIMEOUT)
        c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id=vid, staging_target_path=stg),
                            timeout=csilib.CALL_TIMEOUT)

        # --- delete: refused while a QSD holds the image, then done, idempotent
        dreq = pb.DeleteVolumeRequest(volume_id=vid, secrets=secrets)
        expect_code(c.DeleteVolume, pb.DeleteVolumeRequest(volume_id=vid), C.INVALID_ARGUMENT,
                    "delete without secrets")
        qmp = os.path.join(env.root, "probe.qmp")
        qsd = subprocess.Popen(
            ["qemu-storage-daemon", "--blockdev", json.dumps(
                {"driver": "rbd", "node-name": "n", "pool": ceph.pool,
                 "namespace": ceph.namespace, "image": "v1",
                 "conf": os.path.join(ceph.dir, "ceph.conf"), "user": "admin"}),
             "--chardev", "socket,id=m,path=%s,server=on,wait=off" % qmp, "--monitor", "chardev=m"],
            env=ceph.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not os.path.exists(qmp):
            assert qsd.poll() is None and time.monotonic() < deadline, "QSD did not start"
            time.sleep(0.05)
        m = expect_code(c.DeleteVolume, dreq, C.FAILED_PRECONDITION, "delete in use")
        assert "in use" in m, m
        assert "v1" in images()
        qsd.send_signal(signal.SIGTERM)
        try:
            qsd.wait(timeout=10)
        except subprocess.TimeoutExpired:
            qsd.kill()
            qsd.wait(timeout=10)
        qsd = None
        # A dead client's watch lasts until Ceph times it out; a clean exit ends it.
        c.DeleteVolume(dreq, timeout=csilib.CALL_TIMEOUT)
        assert images() == [], images()
        c.DeleteVolume(dreq, timeout=csilib.CALL_TIMEOUT)
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id="rbd:c1:nopool::v1", secrets=secrets),
                       timeout=csilib.CALL_TIMEOUT)
        # An image the plugin did not create is not deleted.
        ceph.rbd("create", "--size", "16M", "%s/%s/foreign" % (ceph.pool, ceph.namespace))
        expect_code(c.DeleteVolume, pb.DeleteVolumeRequest(
            volume_id="rbd:c1:%s:%s:foreign" % (ceph.pool, ceph.namespace), secrets=secrets),
            C.FAILED_PRECONDITION, "foreign image")
        assert "foreign" in images()
        expect_code(c.DeleteVolume, pb.DeleteVolumeRequest(volume_id="rbd:c1:x/y::v", secrets=secrets),
                    C.INVALID_ARGUMENT, "malformed id")

        # --- the key: in no log line, on no command line
        env.stop()
        with open(os.path.join(env.root, "plugin.log")) as f:
            log = f.read()
        assert ceph.key not in log and wrong not in log, "a key is in the plugin's log"
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open("/proc/%s/cmdline" % pid, "rb") as f:
                        assert ceph.key.encode() not in f.read(), "key on a command line"
                except OSError:
                    pass
        print("PASS")
    finally:
        if qsd and qsd.poll() is None:
            qsd.kill()
            qsd.wait(timeout=10)
        ceph.stop()
        env.cleanup()


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
