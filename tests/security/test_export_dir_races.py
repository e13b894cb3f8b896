#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 9, attacks B swapped in races, and the names the plugin creates
planted before it does.

A separate process exchanges (renameat2 RENAME_EXCHANGE) volume.json and
vhost.sock in RUN/exports/<vol>/ and RUN/exports-ro/<vol>/ with symlinks to
root:root 0600 decoy files outside, as fast as it can (re-planting the
symlinks when the plugin removed them), while:

- R1 online resizes (ControllerExpandVolume + NodeExpandVolume: volume.json
  rewritten), up to 100 rounds / 15 s;
- R2 regroups (unpublish, publish with the other volume_mount_group: chown
  and chmod of the export directory's files), up to 100 rounds / 15 s;
- R3 unstage + stage (the export directories removed and made again), up to
  40 rounds / 10 s;
- R4 plugin restarts (kill -9 + start: adoption of the running QSD), 6 times.

R5: before NodeStageVolume, RUN/exports/<vol>, RUN/exports-ro/<vol> and
RUN/ctl/<vol> are symlinks to decoy directories; before a bridge's publish,
RUN/bridges/<pod-uid> is: nothing may be created, changed or mounted in the
decoys (the call may fail); once the symlinks are gone, the rightful user
stages and publishes.

After each round: the decoys are unchanged; after each race: Probe within
1 s, same plugin process, the volume works for its rightful user.

usage: test_export_dir_races.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seclib  # noqa: E402
from seclib import MiB, mount_cap, under  # noqa: E402

VID = "pvc-raced"
VM_UID = "0d4b5a4e-1111-4000-8000-00000000c0de"

FLIP = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
limit = float(sys.argv[1])
triples = [a.split("|") for a in sys.argv[2:]]
end = time.monotonic() + limit
n = 0
while time.monotonic() < end:
    for name, alt, target in triples:
        try:
            os.symlink(target, alt)
        except OSError:
            pass
        libc.renameat2(-100, name.encode(), -100, alt.encode(), 2)
    n += 1
    if n % 32 == 0:
        time.sleep(0.0005)  # leave some CPU to the rest of the machine
"""


class Race:
    def __init__(self, s, limit):
        self.s = s
        self.triples = []
        for d in (s.export_dir(VID), os.path.join(s.run, "exports-ro", VID)):
            for name, decoy in (("volume.json", "secret-json"), ("vhost.sock", "secret-sock")):
                self.triples.append((os.path.join(d, name), os.path.join(d, ".evil-" + name),
                                     os.path.join(s.decoy, decoy)))
        self.proc = subprocess.Popen([sys.executable, "-c", FLIP, str(limit)] +
                                     ["|".join(t) for t in self.triples])
        s.helpers.append(self.proc)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for name, alt, _ in self.triples:
            if os.path.islink(name) and os.path.lexists(alt) and not os.path.islink(alt):
                seclib.renameat2_exchange(name, alt)
            if os.path.islink(name):
                os.unlink(name)
            if os.path.lexists(alt):
                os.unlink(alt)


def rounds(s, what, race, n_max, seconds, body):
    counts, first_bad, n = {}, None, 0
    t0 = time.monotonic()
    try:
        while n < n_max and time.monotonic() - t0 < seconds:
            n += 1
            for label, code in body(n):
                counts[(label, code)] = counts.get((label, code), 0) + 1
            diff = s.decoy_diff()
            if diff and not first_bad:
                first_bad = (n, diff)
                s.restore_decoys()
    finally:
        race.stop()
    print("attack %-58s -> %d rounds in %.1f s: %s" % (
        what, n, time.monotonic() - t0,
        ", ".join("%s %s x%d" % (lb, c, k) for (lb, c), k in sorted(counts.items()))))
    s.check(not first_bad, "%s: decoys changed (round %s: %s)" % (
        what, first_bad[0], "; ".join(first_bad[1])) if first_bad else "")


def rightful_cycle(s, what, tgt=None):
    """The rightful user after a race: unpublish, unstage, stage, publish,
    connect (kubelet retries each until it works)."""
    pb = s.pb
    if tgt:
        s.call(what + ": unpublish", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
            volume_id=VID, target_path=tgt), quiet=True)
    for _ in range(3):
        code, msg, _ = s.call(what + ": unstage", "NodeUnstageVolume",
                              pb.NodeUnstageVolumeRequest(volume_id=VID,
                                                          staging_target_path=s.staging(VID)),
                              quiet=True)
        if code == "OK":
            break
        time.sleep(0.5)
    s.check(code == "OK", "%s: the rightful NodeUnstageVolume: %s" % (what, seclib.fmt(code, msg)))
    return s.works_fresh(what, VID)


def run(s):
    pb = s.pb
    s.create(VID, 16 * MiB)
    s.stage(VID)
    tgt = s.publish(VID, "pod-1")

    # ---- R1 resize
    size = [16 * MiB]

    def r1(n):
        size[0] += MiB
        c1, _, _ = s.call("R1", "ControllerExpandVolume", pb.ControllerExpandVolumeRequest(
            volume_id=VID, capacity_range=pb.CapacityRange(required_bytes=size[0]),
            volume_capability=mount_cap(pb, group="107")), bound=10, quiet=True)
        c2, _, _ = s.call("R1", "NodeExpandVolume", pb.NodeExpandVolumeRequest(
            volume_id=VID, volume_path=tgt, staging_target_path=s.staging(VID),
            capacity_range=pb.CapacityRange(required_bytes=size[0]),
            volume_capability=mount_cap(pb, group="107")), bound=10, quiet=True)
        return [("ControllerExpand", c1), ("NodeExpand", c2)]
    rounds(s, "R1 volume.json/vhost.sock <-> symlinks during resize", Race(s, 25), 100, 15, r1)
    s.after("R1")
    rightful_cycle(s, "R1 (rightful user)", tgt)

    # ---- R2 regroup
    tgt = s.publish(VID, "pod-2")
    cur = {"tgt": tgt, "gid": "107"}

    def r2(n):
        res = []
        if cur["tgt"]:
            c, _, _ = s.call("R2", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
                volume_id=VID, target_path=cur["tgt"]), bound=10, quiet=True)
            res.append(("Unpublish", c))
        gid = "108" if cur["gid"] == "107" else "107"
        t = s.target("pod-r2-%d" % n, VID)
        c, _, _ = s.call("R2", "NodePublishVolume", s.publish_req(VID, t, group=gid), bound=10,
                         quiet=True)
        res.append(("Publish(regroup)", c))
        cur["tgt"] = t if c == "OK" else None
        if c == "OK":
            cur["gid"] = gid
        return res
    rounds(s, "R2 volume.json/vhost.sock <-> symlinks during regroup", Race(s, 25), 100, 15, r2)
    s.after("R2")
    rightful_cycle(s, "R2 (rightful user)", cur["tgt"])

    # ---- R3 unstage/stage
    def r3(n):
        c1, _, _ = s.call("R3", "NodeUnstageVolume", pb.NodeUnstageVolumeRequest(
            volume_id=VID, staging_target_path=s.staging(VID)), bound=10, quiet=True)
        c2, _, _ = s.call("R3", "NodeStageVolume", pb.NodeStageVolumeRequest(
            volume_id=VID, staging_target_path=s.staging(VID),
            volume_capability=mount_cap(pb, group="107")), bound=10, quiet=True)
        return [("Unstage", c1), ("Stage", c2)]
    rounds(s, "R3 volume.json/vhost.sock <-> symlinks during unstage/stage", Race(s, 20), 40,
           10, r3)
    s.after("R3")
    rightful_cycle(s, "R3 (rightful user)")

    # ---- R4 restart recovery
    s.stage(VID)
    tgt = s.publish(VID, "pod-4")
    race = Race(s, 40)
    first_bad = None
    starts = []
    try:
        for i in range(6):
            try:
                s.restart("R4 restart %d under the race" % (i + 1))
                starts.append("OK")
            except RuntimeError as e:
                starts.append("FAILED")
                s.check(False, "R4: the plugin did not start under the race: %s" % e)
                break
            time.sleep(0.3)
            ok, how = s.probe()
            s.check(ok, "R4: Probe after restart %d: %s" % (i + 1, how))
            diff = s.decoy_diff()
            if diff and not first_bad:
                first_bad = (i + 1, diff)
                s.restore_decoys()
    finally:
        race.stop()
    print("attack %-58s -> starts %s" % ("R4 restarts during the race", ",".join(starts)))
    s.check(not first_bad, "R4: decoys changed (restart %s: %s)" % (
        first_bad[0], "; ".join(first_bad[1])) if first_bad else "")
    if not s.alive():
        s.start()
    s.after("R4")
    rightful_cycle(s, "R4 (rightful user)", tgt)
    s.unstage(VID)

    # ---- R5 the plugin's own names planted before it makes them
    planted = []
    for sub, decoy in (("exports", "dir"), ("exports-ro", "dir-stage"), ("ctl", "dir-race")):
        d = os.path.join(s.run, sub)
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, VID)
        if os.path.isdir(p) and not os.path.islink(p):
            seclib.rm_tree(p)
        os.symlink(os.path.join(s.decoy, decoy), p)
        planted.append(p)
    code, msg, _ = s.call("R5 NodeStageVolume, RUN/{exports,exports-ro,ctl}/<vol> -> decoys",
                          "NodeStageVolume", pb.NodeStageVolumeRequest(
                              volume_id=VID, staging_target_path=s.staging(VID),
                              volume_capability=mount_cap(pb, group="107")))
    s.after("R5 stage")
    if code == "OK":
        s.call("R5 NodeUnstageVolume", "NodeUnstageVolume", pb.NodeUnstageVolumeRequest(
            volume_id=VID, staging_target_path=s.staging(VID)))
        s.after("R5 unstage")
    for p in planted:
        if os.path.islink(p):
            os.unlink(p)
    s.works_fresh("R5 (rightful user, symlinks gone)", VID)

    bdir_parent = os.path.join(s.run, "bridges")
    os.makedirs(bdir_parent, exist_ok=True)
    bdir = os.path.join(bdir_parent, VM_UID)
    os.symlink(os.path.join(s.decoy, "dir-bridge"), bdir)
    btgt = s.target(VM_UID, "inline-bridge")
    ctx = {"bridge": "true", "csi.storage.k8s.io/pod.uid": VM_UID,
           "csi.storage.k8s.io/pod.namespace": "ns", "csi.storage.k8s.io/pod.name": "vm",
           "csi.storage.k8s.io/ephemeral": "true"}
    code, msg, _ = s.call("R5 bridge publish, RUN/bridges/<uid> -> decoy", "NodePublishVolume",
                          pb.NodePublishVolumeRequest(volume_id="csi-bridge", target_path=btgt,
                                                      volume_capability=mount_cap(pb, group="107"),
                                                      volume_context=ctx))
    s.check(not [m for m in seclib.mountinfo() if under(m[0], s.decoy)],
            "R5: a mount in the decoy")
    s.after("R5 bridge")
    s.call("R5 bridge unpublish", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
        volume_id="csi-bridge", target_path=btgt))
    s.after("R5 bridge unpublish")
    if os.path.islink(bdir):
        os.unlink(bdir)
    code, msg, _ = s.call("R5 rightful bridge publish", "NodePublishVolume",
                          pb.NodePublishVolumeRequest(volume_id="csi-bridge", target_path=btgt,
                                                      volume_capability=mount_cap(pb, group="107"),
                                                      volume_context=ctx))
    s.check(code == "OK" and seclib.mounts_at(btgt),
            "R5: the rightful bridge publish: %s" % seclib.fmt(code, msg))
    s.call("teardown", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
        volume_id="csi-bridge", target_path=btgt), quiet=True)
    s.after("R5 done")


if __name__ == "__main__":
    sys.exit(seclib.run_test(run, "qsd-sec-race-"))
