#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""kill -9 of the plugin at each step of a live thin snapshot (thin.h: 1 the
top gets a layer name, 2 the overlay is created, 3 the QSD switches to it,
4 the overlay is renamed onto the volume, 5 the snapshot name is linked),
with a vhost-user client writing through the published target all along.
Each crash state is made exactly (the plugin killed, then the steps done by
hand with link, qemu-img and QMP), then the plugin restarts and must finish
or undo it: the volume keeps every write (checked after a kill -9 of its
QSD too, which makes QSD reopen the volume from the pool), no layer is lost
or left over.  Then real kill -9s in the middle of bursts of CreateSnapshot
and clone calls; the graph stays consistent and deleting everything leaves
no layer.

usage: test_csi_thin_crash.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402
import grpc  # noqa: E402
import thinlib  # noqa: E402
from csilib import mount_cap  # noqa: E402

MiB = 1 << 20
SIZE = 64 * MiB
NCHUNKS, CHUNK = 32, 64 * 1024
V = "pvc-c"


def wait(cond, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.05)


def main():
    qsdctl = sys.argv[3]
    env = csilib.Env(sys.argv[1], sys.argv[2], prefix="qsd-thinc-")
    try:
        run(env, qsdctl)
    finally:
        if sys.exc_info()[0] is not None:
            print("---- plugin log (tail)\n" + env.log_tail(60))
        env.cleanup()


def run(env, qsdctl):
    pb = env.pb
    T = csilib.CALL_TIMEOUT
    cap = mount_cap(pb)
    pool = env.pool
    top = os.path.join(pool, "volumes", V + ".qcow2")

    def q(*args):
        r = subprocess.run([qsdctl, "--pool", pool, "--run-dir", env.run, *args],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r.stdout

    def verify(mode, seed):
        r = subprocess.run([qsdctl, "verify", mode, "--seed", str(seed), "--chunks", str(NCHUNKS),
                            "--chunk-size", str(CHUNK), "--timeout-ms", "20000", "./vhost.sock"],
                           cwd=tgt, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (mode, seed, r.stderr)

    def backing(path):
        r = subprocess.run(["qemu-img", "info", "-U", "--output=json", path],
                           capture_output=True, text=True, check=True, timeout=30)
        return json.loads(r.stdout).get("backing-filename")

    def ino(path):
        return os.stat(path).st_ino

    def layers_with(inode):
        return [f for f in thinlib.layer_files(pool)
                if ino(os.path.join(pool, "layers", f)) == inode]

    c = env.start()
    stg, tgt = thinlib.create_published(env, c, V, SIZE, cap, T)
    c.CreateSnapshot(pb.CreateSnapshotRequest(name="snap-0", source_volume_id=V), timeout=T)
    seed = [100]

    def writer():
        w = thinlib.Writer(qsdctl, tgt, seed[0], NCHUNKS, CHUNK, env.root)
        w.wait_rounds(2)
        return w

    def stop_writer(w):
        rounds = w.stop()
        os.unlink(w.stop_file)
        seed[0] = rounds[-1][0] + 1
        return rounds[-1][0]

    def restart():
        c = env.start()
        wait(lambda: env.qsd_pids().get(V) and os.path.exists(os.path.join(tgt, "vhost.sock")),
             "the volume served again")
        return c

    def when_available(call, req):
        """call(req), retried while the plugin answers UNAVAILABLE (a QSD it
        restarts is not ready yet), as the sidecars retry; at most 20 s."""
        end = time.monotonic() + 20
        while True:
            try:
                return call(req, timeout=T)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > end:
                    raise
                time.sleep(0.1)

    def export_node():
        exp = json.loads(q("qmp", V, "query-block-exports"))
        return exp[0]["node-name"]

    def give_like(path, like):
        st = os.stat(like)
        os.chown(path, st.st_uid, st.st_gid)
        os.chmod(path, 0o600)

    def qsd_switch(layer, tmp):
        q("qmp", V, "blockdev-add", json.dumps({
            "driver": "file", "node-name": "f-" + layer, "filename": tmp,
            "cache": {"direct": True, "no-flush": False}, "aio": "native"}))
        q("qmp", V, "blockdev-add", json.dumps({
            "driver": "qcow2", "node-name": "ov-" + layer, "file": "f-" + layer,
            "backing": None, "cache": {"direct": True, "no-flush": False}}))
        q("qmp", V, "blockdev-snapshot", json.dumps({"node": export_node(),
                                                      "overlay": "ov-" + layer}))

    def kill_qsd_and_check(last):
        pid = env.qsd_pids()[V]
        os.kill(pid, signal.SIGKILL)
        wait(lambda: env.qsd_pids().get(V) not in (None, pid) and
             os.path.exists(os.path.join(tgt, "vhost.sock")), "QSD restarted by the plugin")
        time.sleep(0.3)
        verify("--check", last)

    # ---- crash after step 1: the top has a second name in layers/
    w = writer()
    env.stop(signal.SIGKILL)
    la = "L00000000000000a1"
    os.link(top, os.path.join(pool, "layers", la + ".qcow2"))
    c = restart()
    assert la + ".qcow2" not in thinlib.layer_files(pool), thinlib.layer_files(pool)
    last = stop_writer(w)
    verify("--check", last)
    print("ok crash after step 1: the extra layer name is removed, writes go on")

    # ---- crash after step 2: an overlay on the new layer, QSD not switched
    w = writer()
    env.stop(signal.SIGKILL)
    lb = "L00000000000000b2"
    tmp = os.path.join(pool, "volumes", ".%s.qcow2.%s" % (V, lb))
    os.link(top, os.path.join(pool, "layers", lb + ".qcow2"))
    subprocess.run(["qemu-img", "create", "-q", "-u", "-f", "qcow2", "-b",
                    "../layers/%s.qcow2" % lb, "-F", "qcow2", tmp, str(SIZE)], check=True)
    give_like(tmp, top)  # step 2 hands the overlay to the volume's QSD (qsdconf.h)
    c = restart()
    assert not os.path.exists(tmp) and lb + ".qcow2" not in thinlib.layer_files(pool)
    assert "undid an interrupted snapshot" in env.log_tail(200)
    last = stop_writer(w)
    kill_qsd_and_check(last)
    print("ok crash after step 2: undone (overlay and layer name removed); the volume keeps "
          "every write across a QSD restart")

    # ---- crash after step 3: QSD writes into the overlay, not yet renamed
    w = writer()
    env.stop(signal.SIGKILL)
    lc = "L00000000000000c3"
    tmp = os.path.join(pool, "volumes", ".%s.qcow2.%s" % (V, lc))
    old = ino(top)
    os.link(top, os.path.join(pool, "layers", lc + ".qcow2"))
    subprocess.run(["qemu-img", "create", "-q", "-u", "-f", "qcow2", "-b",
                    "../layers/%s.qcow2" % lc, "-F", "qcow2", tmp, str(SIZE)], check=True)
    give_like(tmp, top)  # step 2 hands the overlay to the volume's QSD (qsdconf.h)
    qsd_switch(lc, tmp)
    w.wait_rounds(len(w.rounds) + 3)  # writes land in the overlay
    c = restart()
    assert not os.path.exists(tmp) and backing(top) == "../layers/%s.qcow2" % lc
    assert layers_with(old) == [lc + ".qcow2"] and ino(top) != old
    assert "finished an interrupted snapshot" in env.log_tail(200)
    last = stop_writer(w)
    kill_qsd_and_check(last)
    print("ok crash after step 3 (QSD switched): finished (overlay renamed onto the volume); "
          "the writes made into the overlay survive a QSD restart")

    # ---- crash after step 3 and the QSD dead too
    w = writer()
    env.stop(signal.SIGKILL)
    ld = "L00000000000000d4"
    tmp = os.path.join(pool, "volumes", ".%s.qcow2.%s" % (V, ld))
    os.link(top, os.path.join(pool, "layers", ld + ".qcow2"))
    subprocess.run(["qemu-img", "create", "-q", "-u", "-f", "qcow2", "-b",
                    "../layers/%s.qcow2" % ld, "-F", "qcow2", tmp, str(SIZE)], check=True)
    give_like(tmp, top)  # step 2 hands the overlay to the volume's QSD (qsdconf.h)
    qsd_switch(ld, tmp)
    w.wait_rounds(len(w.rounds) + 3)
    last = stop_writer(w)
    pid = env.qsd_pids()[V]
    os.kill(pid, signal.SIGKILL)
    wait(lambda: not os.path.exists("/proc/%d" % pid) or
         open("/proc/%d/stat" % pid).read().split()[2] == "Z", "QSD death")
    c = restart()
    assert not os.path.exists(tmp) and backing(top) == "../layers/%s.qcow2" % ld
    verify("--check", last)
    print("ok crash after step 3 with the QSD killed too: finished before the QSD restarts; "
          "every write is there")

    # ---- crash after step 5: the snapshot is linked, its record still 'creating'
    when_available(c.CreateSnapshot, pb.CreateSnapshotRequest(name="snap-e", source_volume_id=V))
    env.stop(signal.SIGKILL)
    rec = os.path.join(env.state, "snapshots", "snap-e.json")
    with open(rec) as f:
        j = json.load(f)
    j["phase"] = "creating"
    with open(rec, "w") as f:
        json.dump(j, f)
    c = restart()
    assert not os.path.exists(os.path.join(pool, "snapshots", "snap-e.qcow2"))
    assert [csilib.local_id(e.snapshot.snapshot_id) for e in
            c.ListSnapshots(pb.ListSnapshotsRequest(), timeout=T).entries] == ["snap-0"]
    print("ok crash after step 5 (record not ready): the snapshot is removed, its layer stays "
          "in the volume's chain")

    # ---- real kill -9 in the middle of bursts of snapshots and clones
    w = writer()
    names = []
    for burst in range(3):
        futs = []
        for i in range(4):
            n = "snap-b%d-%d" % (burst, i)
            names.append(n)
            futs.append(c.CreateSnapshot.future(pb.CreateSnapshotRequest(
                name=n, source_volume_id=V), timeout=T))
            time.sleep(0.02 + 0.03 * i)
        time.sleep(0.05 * burst)
        env.stop(signal.SIGKILL)
        for f in futs:
            try:
                f.result()
            except Exception:  # noqa: BLE001
                pass
        c = restart()
    last = stop_writer(w)
    verify("--check", last)
    ready = [csilib.local_id(e.snapshot.snapshot_id) for e in
             c.ListSnapshots(pb.ListSnapshotsRequest(), timeout=T).entries]
    for n in ready:
        seeds = thinlib.image_chunk_seeds(os.path.join(pool, "snapshots", n + ".qcow2"), "qcow2",
                                          SIZE, NCHUNKS, CHUNK, env.root)
        # snap-0 was taken before any write: zeros; the others hold rounds
        assert (set(seeds) == {None}) if n == "snap-0" else (None not in seeds), (n, seeds)
    on_disk = sorted(f[:-6] for f in os.listdir(os.path.join(pool, "snapshots")))
    assert on_disk == sorted(ready), (on_disk, ready)
    print("ok kill -9 during bursts of CreateSnapshot: %d of %d snapshots ready, each readable "
          "and consistent, no snapshot file without a record; the volume has every write" %
          (len(ready), len(names)))

    # ---- nothing leaked
    c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=V, target_path=tgt), timeout=T)
    c.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id=V, staging_target_path=stg),
                        timeout=T)
    c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=V), timeout=T)
    for n in ready:
        c.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=n), timeout=T)
    wait(lambda: not thinlib.layer_files(pool), "every layer removed")
    assert not os.listdir(os.path.join(pool, "volumes")), os.listdir(os.path.join(pool, "volumes"))
    print("ok deleting the volume and its snapshots leaves no layer and no file")
    assert env.stop() == 0


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
