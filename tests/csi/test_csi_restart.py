#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""kill -9 of the plugin: running QSDs are adopted (same pid), a QSD that died
meanwhile is restarted, published volumes keep serving throughout (a
vhost-user client connects through the target path while the plugin is
down), the state is intact, and a record left half-created is undone.

usage: test_csi_restart.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402
from csilib import mount_cap, is_mount_point  # noqa: E402
import grpc  # noqa: E402

MiB = 1 << 20


def connects(qsdctl, target):
    r = subprocess.run([qsdctl, "vhost-info", "--json", "--timeout-ms", "5000", "./vhost.sock"],
                       cwd=target, capture_output=True, text=True, timeout=30)
    return r.returncode == 0


def wait(cond, what, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.02)


def proc_state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def helper_of(env, needle, fut, timeout=30.0):
    """The pid of the plugin's qemu-img whose command line holds needle,
    polled until it appears (bounded), while fut (the call that starts it)
    is not done."""
    deadline = time.monotonic() + timeout
    while True:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if b"qemu-img" in cmd and needle in cmd and env.pool.encode() in cmd:
                return int(pid)
        assert not fut.done(), "the call ended before its qemu-img was seen: %s" % fut
        assert time.monotonic() < deadline, "no qemu-img with %s within %.0f s" % (needle,
                                                                                timeout)
        time.sleep(0.002)


def main():
    qsdctl = sys.argv[3]
    env = csilib.Env(sys.argv[1], sys.argv[2])
    try:
        run(env, qsdctl)
    finally:
        if sys.exc_info()[0] is not None:
            print("---- plugin log (tail)\n" + env.log_tail(80))
        env.cleanup()


def run(env, qsdctl):
    c = env.start()
    pb = env.pb
    T = csilib.CALL_TIMEOUT
    k = env.kubelet
    cap = mount_cap(pb)
    vols = ["pvc-r1", "pvc-r2", "pvc-r3"]
    tgts = {}
    for v in vols:
        c.CreateVolume(pb.CreateVolumeRequest(
            name=v, capacity_range=pb.CapacityRange(required_bytes=32 * MiB),
            volume_capabilities=[cap]), timeout=T)
        stg = os.path.join(k, "staging", v)
        os.makedirs(stg)
        c.NodeStageVolume(pb.NodeStageVolumeRequest(volume_id=v, staging_target_path=stg,
                                                    volume_capability=cap), timeout=T)
        if v != "pvc-r3":
            tgts[v] = os.path.join(k, "pods", v, "mount")
            os.makedirs(os.path.dirname(tgts[v]))
            c.NodePublishVolume(pb.NodePublishVolumeRequest(
                volume_id=v, staging_target_path=stg, target_path=tgts[v],
                volume_capability=cap), timeout=T)
    c.CreateSnapshot(pb.CreateSnapshotRequest(name="snap-r1", source_volume_id="pvc-r1"),
                     timeout=T)
    before = env.qsd_pids()
    assert set(before) == set(vols), before
    listed = c.ListVolumes(pb.ListVolumesRequest(), timeout=T)

    # kill -9 the plugin in the middle of a long CreateVolume; its QSDs live
    # on; one of them dies meanwhile.
    slow = c.CreateVolume.future(pb.CreateVolumeRequest(
        name="pvc-slow", capacity_range=pb.CapacityRange(required_bytes=1 << 30),
        volume_capabilities=[cap], parameters={"format": "raw", "preallocation": "full"}),
        timeout=T)
    # In the middle for sure: its qemu-img (preallocating) is seen and stopped
    # before the plugin is killed.  A kill as soon as the temporary file
    # appeared raced the copy: a fast machine preallocates 1 GiB in a
    # fraction of a second (half a second here), and a call that ended first
    # leaves pvc-slow behind.  The stopped qemu-img still dies with the
    # plugin (SIGKILL on its parent's death).
    img = helper_of(env, b"/.pvc-slow.raw.tmp-", slow)
    os.kill(img, signal.SIGSTOP)
    wait(lambda: proc_state(img) in ("T", "t"), "the copy's qemu-img stopped")
    assert not slow.done(), "CreateVolume ended while its qemu-img was stopped"
    env.stop(signal.SIGKILL)
    try:
        slow.result()
    except Exception:  # noqa: BLE001
        pass

    def helpers_alive():
        for pid in os.listdir("/proc"):
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if b"qemu-img" in cmd and env.pool.encode() in cmd:
                return True
        return False
    wait(lambda: not helpers_alive(), "qemu-img to die with the plugin")
    for v, t in tgts.items():
        assert connects(qsdctl, t), "published volume %s not served with the plugin down" % v
    os.kill(before["pvc-r2"], signal.SIGKILL)
    wait(lambda: not os.path.exists("/proc/%d" % before["pvc-r2"]) or
         open("/proc/%d/stat" % before["pvc-r2"]).read().split()[2] == "Z", "QSD death")
    # A record left in the middle of a CreateVolume (crash): must be undone.
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2",
                    os.path.join(env.pool, "volumes", "pvc-half.qcow2"), "1M"], check=True)
    # ... and the temporary file of a copy a killed worker was writing.
    open(os.path.join(env.pool, "volumes", ".pvc-half.qcow2.tmp-999999"), "w").close()
    with open(os.path.join(env.state, "volumes", "pvc-half.json"), "w") as f:
        json.dump({"version": 1, "id": "pvc-half", "phase": "creating", "format": "qcow2",
                   "preallocation": "off", "parameters": {}, "size": MiB, "image_size": MiB,
                   "source": None, "created": 0, "staged": None, "published": []}, f)
    print("ok plugin killed mid-CreateVolume (its qemu-img died too); published volumes still "
          "served; QSD of pvc-r2 killed")

    c = env.start(["--controller-expansion"])
    caps = c.ControllerGetCapabilities(pb.ControllerGetCapabilitiesRequest(), timeout=T)
    assert pb.ControllerServiceCapability.RPC.EXPAND_VOLUME in \
        {x.rpc.type for x in caps.capabilities}, caps
    after = {}
    wait(lambda: set(env.qsd_pids()) == set(vols) and
         env.qsd_pids()["pvc-r2"] != before["pvc-r2"], "QSD restart of pvc-r2")
    after = env.qsd_pids()
    assert after["pvc-r1"] == before["pvc-r1"] and after["pvc-r3"] == before["pvc-r3"], \
        (before, after)
    log = env.log_tail(200)
    assert log.count("adopted the QSD of a staged volume") >= 2, log
    for v, t in tgts.items():
        assert is_mount_point(t)
        wait(lambda: connects(qsdctl, t), "%s serving after restart" % v)
    assert c.ListVolumes(pb.ListVolumesRequest(), timeout=T) == listed
    assert not [f for f in os.listdir(os.path.join(env.pool, "volumes")) if "slow" in f], \
        os.listdir(os.path.join(env.pool, "volumes"))
    assert not os.path.exists(os.path.join(env.state, "volumes", "pvc-slow.json"))
    assert not os.path.exists(os.path.join(env.pool, "volumes", "pvc-half.qcow2"))
    assert not os.listdir(os.path.join(env.pool, "volumes")) or \
        not [f for f in os.listdir(os.path.join(env.pool, "volumes")) if "half" in f]
    assert not os.path.exists(os.path.join(env.state, "volumes", "pvc-half.json"))
    assert [csilib.local_id(e.snapshot.snapshot_id) for e in
            c.ListSnapshots(pb.ListSnapshotsRequest(), timeout=T).entries] == ["snap-r1"]
    print("ok restarted plugin: adopted", after["pvc-r1"], after["pvc-r3"], "restarted pvc-r2",
          after["pvc-r2"], "; state intact; half-created volumes undone")

    # Idempotent calls see the recovered state; stats are normal again.
    # A start still in progress answers UNAVAILABLE ("retry"), which kubelet
    # retries: so does this (bounded).
    def stage_ok(v):
        try:
            c.NodeStageVolume(pb.NodeStageVolumeRequest(
                volume_id=v, staging_target_path=os.path.join(k, "staging", v),
                volume_capability=cap), timeout=T)
            return True
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False
    for v in vols:
        wait(lambda: stage_ok(v), "NodeStageVolume of %s after the restart" % v)
    for v, t in tgts.items():
        s = c.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(volume_id=v, volume_path=t),
                                 timeout=T)
        assert not s.volume_condition.abnormal, s
    # The new plugin supervises the adopted QSDs too.
    os.kill(after["pvc-r1"], signal.SIGKILL)
    wait(lambda: env.qsd_pids().get("pvc-r1") not in (None, after["pvc-r1"]),
         "supervised restart of an adopted QSD")
    wait(lambda: connects(qsdctl, tgts["pvc-r1"]), "pvc-r1 serving again")
    print("ok adopted QSD restarted on death by the new plugin")

    for v in vols:
        if v in tgts:
            c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=v, target_path=tgts[v]),
                                  timeout=T)
        c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(
            volume_id=v, staging_target_path=os.path.join(k, "staging", v)), timeout=T)
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=v), timeout=T)
    c.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id="snap-r1"), timeout=T)
    assert env.stop() == 0
    assert not os.listdir(os.path.join(env.pool, "volumes"))
    print("ok teardown")


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
