#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Operator safety: qsdctl refuses to change what the CSI plugin manages
(unexport, export, delete, resize, snapshot, merge, snapshot-delete of a
volume or snapshot with a record in the plugin's state directory), saying
why, unless --force; `qsdctl plugin-status [--json]` shows the plugin's view
(volumes with their QSD state and pid, publications, snapshots, bridges).
Real plugin, real QSDs, real mounts under a temporary kubelet root.

usage: test_csi_operator.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import json
import os
import subprocess
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402
from csilib import mount_cap  # noqa: E402
import thinlib  # noqa: E402

MiB = 1 << 20
T = 60


def main():
    plugin, proto, qsdctl = sys.argv[1], sys.argv[2], sys.argv[3]
    env = csilib.Env(plugin, proto, prefix="qsd-csi-op-")
    try:
        run(env, qsdctl)
    finally:
        env.cleanup()


def run(env, qsdctl):
    pb = env.pb
    c = env.start()
    cap = mount_cap(pb, group="107")

    def q(*args):
        return subprocess.run([qsdctl, "--state-dir", env.state, "--run-dir", env.run, "--pool",
                               env.pool, *args], capture_output=True, text=True, timeout=60)

    stg, tgt = thinlib.create_published(env, c, "pvc-op", 32 * MiB, cap, T)
    c.CreateSnapshot(pb.CreateSnapshotRequest(name="snap-op", source_volume_id="pvc-op"),
                     timeout=T)
    uid = str(uuid.uuid4())
    btgt = os.path.join(env.kubelet, "pods", uid, "volumes/kubernetes.io~csi/bridge/mount")
    os.makedirs(os.path.dirname(btgt))
    c.NodePublishVolume(pb.NodePublishVolumeRequest(
        volume_id="csi-bridge-op", target_path=btgt, volume_capability=cap,
        volume_context={"bridge": "true", "csi.storage.k8s.io/pod.uid": uid,
                        "csi.storage.k8s.io/pod.namespace": "vms",
                        "csi.storage.k8s.io/pod.name": "vm-op",
                        "csi.storage.k8s.io/ephemeral": "true"}), timeout=T)
    pid = env.qsd_pids()["pvc-op"]
    image = os.path.join(env.pool, "volumes", "pvc-op.qcow2")
    before = os.stat(image)

    # Refused without --force, saying why; nothing changes.
    for args, action in ((["unexport", "pvc-op"], "unexport"),
                         (["export", "pvc-op"], "export"),
                         (["delete", "pvc-op"], "delete"),
                         (["resize", "pvc-op", "--size", "64M"], "resize"),
                         (["snapshot", "pvc-op", "snap-x"], "snapshot"),
                         (["merge", "pvc-op"], "merge"),
                         (["snapshot-delete", "snap-op"], "snapshot-delete")):
        r = q(*args)
        assert r.returncode == 4, (args, r.returncode, r.stderr)
        kind = "snapshot snap-op" if action == "snapshot-delete" else "volume pvc-op"
        assert ("%s is managed by the CSI plugin" % kind) in r.stderr, r.stderr
        assert ("refusing to %s it" % action) in r.stderr and "--force" in r.stderr, r.stderr
        print("ok refused:", " ".join(args))
    assert "staged at %s, 1 publication(s)" % stg in q("unexport", "pvc-op").stderr
    assert env.qsd_pids()["pvc-op"] == pid and os.path.exists("/proc/%d" % pid)
    after = os.stat(image)
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size)
    assert os.path.exists(os.path.join(env.pool, "snapshots", "snap-op.qcow2"))
    assert not os.path.exists(os.path.join(env.pool, "snapshots", "snap-x.qcow2"))

    # A volume the plugin does not know is qsdctl's to change.
    r = q("create", "own-vol", "--size", "8M")
    assert r.returncode == 0, r.stderr
    r = q("delete", "own-vol")
    assert r.returncode == 0, r.stderr
    print("ok a volume outside the plugin is not guarded")

    # The plugin's view.
    r = q("plugin-status", "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    (v,) = st["volumes"]
    assert v["id"] == "pvc-op" and v["qsd"] == {"state": "running", "pid": pid}, v
    assert v["staged"]["path"] == stg and [p["target"] for p in v["published"]] == [tgt], v
    assert [(s["id"], s["source_volume"]) for s in st["snapshots"]] == [("snap-op", "pvc-op")], \
        st["snapshots"]
    (b,) = st["bridges"]
    assert b["pod_uid"] == uid and b["pod"] == "vm-op" and b["target"] == btgt, b
    text = q("plugin-status").stdout
    assert "pvc-op" in text and "running" in text and str(pid) in text and tgt in text, text
    assert "pod vms/vm-op" in text and any(
        ln.split()[:1] == ["snap-op"] and ln.split()[-1] == "pvc-op" for ln in text.splitlines()), text
    print("ok plugin-status:\n" + text)

    # --force: done anyway, with a warning; the view shows it.
    r = q("--force", "unexport", "pvc-op")
    assert r.returncode == 0 and "warning: volume pvc-op is managed by the CSI plugin" in \
        r.stderr, (r.returncode, r.stderr)
    st = json.loads(q("plugin-status", "--json").stdout)
    assert st["volumes"][0]["qsd"]["state"] != "running", st["volumes"][0]
    print("ok --force unexport; plugin-status now says", st["volumes"][0]["qsd"])

    # Records the plugin would skip are skipped here too (the same reader):
    # another id inside, a duplicate key, not an object.
    vdir = os.path.join(env.state, "volumes")
    for name, text in (("pvc-other", '{"id": "pvc-op"}'),
                       ("pvc-dup", '{"id": "pvc-dup", "id": "pvc-dup"}'),
                       ("pvc-list", '["pvc-list"]')):
        with open(os.path.join(vdir, name + ".json"), "w") as f:
            f.write(text)
    r = q("plugin-status", "--json")
    st = json.loads(r.stdout)
    assert [v["id"] for v in st["volumes"]] == ["pvc-op"], st["volumes"]
    for name in ("pvc-other", "pvc-dup", "pvc-list"):
        os.unlink(os.path.join(vdir, name + ".json"))
    print("ok plugin-status skips the records the plugin skips")

    bad = q("--state-dir", "/nonexistent-qsd-state", "plugin-status")
    assert bad.returncode == 3 and "not a CSI plugin state directory" in bad.stderr, bad.stderr
    c.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id="csi-bridge-op",
                                                        target_path=btgt), timeout=T)


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
