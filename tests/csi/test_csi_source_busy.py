#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Sources of restores and clones stay while they are read, and only then:
a CreateVolume from a snapshot (restore) and one from a volume (clone) are
held inside their worker (the plugin's qemu-img is the real one behind a
gate the test opens), and meanwhile

  - DeleteSnapshot of the restore's source is ABORTED naming the snapshot,
  - DeleteVolume of the clone's source is ABORTED naming the volume,

then, once the gate opens, both CreateVolumes succeed and both deletions
succeed: the busy marks ended with the reads.

usage: test_csi_source_busy.py PLUGIN_BINARY PROTO_DIR [QSDCTL]
"""
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402
from csilib import expect_code, mount_cap  # noqa: E402

import grpc  # noqa: E402

MiB = 1 << 20
T = 60

GATE = """#!/bin/sh
# qemu-img behind a gate: while %(gate)s exists, wait (at most 60 s).
if [ -e '%(gate)s' ]; then
    echo "$$ $*" >> '%(entered)s'
    i=0
    while [ -e '%(gate)s' ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
fi
exec '%(real)s' "$@"
"""


def wait_entered(path, n, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as f:
                if len(f.readlines()) >= n:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, "the workers never reached qemu-img"
        time.sleep(0.02)


def main():
    real = shutil.which("qemu-img")
    env = csilib.Env(sys.argv[1], sys.argv[2])
    gate = os.path.join(env.root, "gate")
    try:
        bindir = os.path.join(env.root, "bin")
        os.mkdir(bindir)
        entered = os.path.join(env.root, "entered")
        with open(os.path.join(bindir, "qemu-img"), "w") as f:
            f.write(GATE % {"gate": gate, "entered": entered, "real": real})
        os.chmod(os.path.join(bindir, "qemu-img"), 0o755)
        os.environ["PATH"] = bindir + ":" + os.environ.get("PATH", "")
        c = env.start()
        pb = env.pb
        C = grpc.StatusCode
        cap = mount_cap(pb)

        def cv(name, src=None):
            return pb.CreateVolumeRequest(
                name=name, capacity_range=pb.CapacityRange(required_bytes=64 * MiB),
                volume_capabilities=[cap], volume_content_source=src)
        c.CreateVolume(cv("pvc-src"), timeout=T)
        c.CreateVolume(cv("pvc-src2"), timeout=T)
        c.CreateSnapshot(pb.CreateSnapshotRequest(name="snap-src", source_volume_id="pvc-src"),
                         timeout=T)

        open(gate, "w").close()
        restore = c.CreateVolume.future(cv("pvc-restore", pb.VolumeContentSource(
            snapshot=pb.VolumeContentSource.SnapshotSource(snapshot_id="snap-src"))), timeout=T)
        wait_entered(entered, 1)
        clone = c.CreateVolume.future(cv("pvc-clone", pb.VolumeContentSource(
            volume=pb.VolumeContentSource.VolumeSource(volume_id="pvc-src2"))), timeout=T)
        wait_entered(entered, 2)
        msg = expect_code(c.DeleteSnapshot, pb.DeleteSnapshotRequest(snapshot_id="snap-src"),
                          C.ABORTED, "DeleteSnapshot of a restore's source")
        assert "snap-src" in msg and "in progress" in msg, msg
        msg = expect_code(c.DeleteVolume, pb.DeleteVolumeRequest(volume_id="pvc-src2"),
                          C.ABORTED, "DeleteVolume of a clone's source")
        assert "pvc-src2" in msg and "in progress" in msg, msg
        assert not restore.done() and not clone.done(), "the gate did not hold the workers"
        print("ok sources of a running restore and clone are busy (ABORTED)")

        os.unlink(gate)
        local = csilib.local_id
        assert local(restore.result().volume.content_source.snapshot.snapshot_id) == "snap-src"
        assert local(clone.result().volume.content_source.volume.volume_id) == "pvc-src2"
        c.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id="snap-src"), timeout=T)
        c.DeleteVolume(pb.DeleteVolumeRequest(volume_id="pvc-src2"), timeout=T)
        for v in ("pvc-restore", "pvc-clone", "pvc-src"):
            c.DeleteVolume(pb.DeleteVolumeRequest(volume_id=v), timeout=T)
        print("ok the busy marks end with the reads (deletions succeed)")
    finally:
        try:
            os.unlink(gate)
        except OSError:
            pass
        env.cleanup()


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
