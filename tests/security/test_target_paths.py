#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 9, attacks C: target and staging paths whose parents are symlinks
out of the kubelet root.

- C1 a parent component of target_path (or of staging_target_path) is a
  symlink to a decoy directory outside the kubelet root: the call fails with
  INVALID_ARGUMENT or FAILED_PRECONDITION, the message names the field, and
  nothing is created or mounted in the decoy;
- C2 the same swapped in a race: a separate process exchanges the parent
  directory and a symlink to the decoy (renameat2 RENAME_EXCHANGE) as fast
  as it can while NodePublishVolume/NodeUnpublishVolume (300 times, at most
  30 s) and NodeStageVolume/NodeUnstageVolume (100 times, at most 10 s) are called:
  afterwards the decoy is empty and no mount exists outside the kubelet
  root; the same with the target itself flipping, and NodeUnpublishVolume
  racing a parent that flips to a symlink to a directory holding a foreign
  mount outside the kubelet root (that mount must survive), and with the
  target directory (then its parent) renamed out of the kubelet root and
  back (a descriptor follows the directory: the bind must still not land
  outside);
- C4 the target is a FIFO, a file, a socket or a symlink (to a directory in
  the kubelet root), the staging path a FIFO: refused (or at least never
  hanging), nothing created through the symlink;
- C3 recorded targets at restart: publish, kill -9 the plugin, unmount the
  target by hand, replace a parent of the target by a symlink to the decoy,
  start the plugin: nothing is mounted or created in the decoy.

After each: Probe within 1 s, decoys unchanged, the volume works for its
rightful user.

usage: test_target_paths.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seclib  # noqa: E402
from seclib import MiB, mount_cap, under  # noqa: E402

VID = "pvc-paths"
VID2 = "pvc-paths-2"
REFUSED = ("INVALID_ARGUMENT", "FAILED_PRECONDITION")
TRIES = 300
RACE_SECONDS = 20




def rename_race(s, base, moved, label):
    """NodePublish/NodeUnpublish of base/.../mount while a separate process
    renames base/<moved> to ROOT/outside/m and back as fast as it can.

    When <moved> is the target itself, a bind made on it while it was outside
    stays there (a mount point cannot be renamed back): checked after every
    round.  When it is a parent, every mount beneath it travels with it
    whoever made it (the racer moves published mounts too, and no plugin can
    prevent that): checked only once the racer stopped and the directory is
    back, when nothing may be left outside."""
    sample = moved == "mount"
    pb = s.pb
    outside = os.path.join(s.root, "outside")
    os.mkdir(outside)
    s.top_base.add("outside")
    os.makedirs(base)
    tgt = os.path.join(base, "mount") if moved == "mount" else os.path.join(base, moved, "mount")
    src = os.path.join(base, moved)
    os.makedirs(src, exist_ok=True)
    mover = subprocess.Popen([sys.executable, "-c", seclib.MOVER, src, os.path.join(outside, "m"),
                              str(RACE_SECONDS)])
    s.helpers.append(mover)
    counts, first_bad, n = {}, None, 0
    t0 = time.monotonic()
    try:
        while n < TRIES and time.monotonic() - t0 < RACE_SECONDS / 3:
            n += 1
            for method, req in (("NodePublishVolume", s.publish_req(VID, tgt)),
                                ("NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
                                    volume_id=VID, target_path=tgt))):
                code, msg, _ = s.call("C2 race " + method, method, req, bound=10, quiet=True)
                counts[(method, code)] = counts.get((method, code), 0) + 1
            bad = [m[0] for m in seclib.mountinfo() if under(m[0], outside)]
            if sample and bad and not first_bad:
                first_bad = (n, bad)
    finally:
        mover.kill()
        mover.wait(timeout=10)
    if not os.path.isdir(src) and os.path.isdir(os.path.join(outside, "m")):
        try:
            os.rename(os.path.join(outside, "m"), src)
        except OSError as e:
            print("       (cannot move %s back: %s)" % (src, e))
    bad = [m[0] for m in seclib.mountinfo() if under(m[0], outside)]
    if bad and not first_bad:
        first_bad = ("end", bad)
    what = "C2 race: %s renamed out of the kubelet root" % label
    print("attack %-58s -> %d rounds in %.1f s: %s" % (
        what, n, time.monotonic() - t0,
        ", ".join("%s %s x%d" % (m[4:], c, k) for (m, c), k in sorted(counts.items()))))
    s.check(not first_bad, "%s: a bind mount landed outside the kubelet root (round %s: %s)"
            % ((what,) + first_bad) if first_bad else "")
    for _ in range(16):
        left = sorted({m[0] for m in seclib.mountinfo() if under(m[0], outside)},
                      key=len, reverse=True)
        if not left:
            break
        for mp in left:
            subprocess.run(["umount", "-l", mp], check=False)
    if not os.path.isdir(src) and os.path.isdir(os.path.join(outside, "m")):
        os.rename(os.path.join(outside, "m"), src)
    for _ in range(5):
        code, msg, _ = s.call("C2 final NodeUnpublishVolume", "NodeUnpublishVolume",
                              pb.NodeUnpublishVolumeRequest(volume_id=VID, target_path=tgt),
                              quiet=True)
        if code == "OK":
            break
    s.check(code == "OK", "%s: final NodeUnpublishVolume: %s" % (what, seclib.fmt(code, msg)))
    seclib.rm_tree(outside)
    s.top_base.discard("outside")
    s.after(what)
    s.works_fresh(what, VID)


def refused(s, attack, code, msg, field):
    s.check(code in REFUSED, "%s: expected INVALID_ARGUMENT or FAILED_PRECONDITION, got %s"
            % (attack, seclib.fmt(code, msg)))
    s.check(code == "OK" or field in msg, "%s: the message does not name %s: %r" % (
        attack, field, msg))


def decoy_touched(s, name):
    d = os.path.join(s.decoy, name)
    return os.listdir(d) or [m[0] for m in seclib.mountinfo() if under(m[0], s.decoy)]


def run(s):
    pb = s.pb
    csi = os.path.join(s.kubelet, "pods/%s/volumes/kubernetes.io~csi")
    s.create(VID, 16 * MiB)
    s.create(VID2, 16 * MiB)
    s.stage(VID)

    # ---- C1: a parent of target_path is a symlink out of the kubelet root
    base = csi % "c1"
    os.makedirs(base)
    os.symlink(os.path.join(s.decoy, "dir"), os.path.join(base, VID))
    tgt = os.path.join(base, VID, "mount")
    code, msg, _ = s.call("C1 target parent -> symlink out", "NodePublishVolume",
                          s.publish_req(VID, tgt))
    refused(s, "C1 target parent symlink", code, msg, "target_path")
    if code == "OK":
        s.call("C1 (undo)", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
            volume_id=VID, target_path=tgt), quiet=True)
    s.after("C1 target parent symlink")

    # several missing components below the symlink
    os.symlink(os.path.join(s.decoy, "dir"), os.path.join(s.kubelet, "pods", "c1b"))
    tgt = os.path.join(s.kubelet, "pods/c1b/volumes/kubernetes.io~csi", VID, "mount")
    code, msg, _ = s.call("C1 pods/<uid> -> symlink out, rest missing", "NodePublishVolume",
                          s.publish_req(VID, tgt))
    refused(s, "C1 pod dir symlink", code, msg, "target_path")
    if code == "OK":
        s.call("C1 (undo)", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
            volume_id=VID, target_path=tgt), quiet=True)
    s.after("C1 pod dir symlink")

    # the staging path's parent
    sdir = os.path.dirname(os.path.dirname(s.staging(VID2)))
    os.makedirs(sdir, exist_ok=True)
    os.symlink(os.path.join(s.decoy, "dir-stage"), os.path.join(sdir, VID2))
    code, msg, _ = s.call("C1 staging parent -> symlink out", "NodeStageVolume",
                          pb.NodeStageVolumeRequest(volume_id=VID2,
                                                    staging_target_path=s.staging(VID2),
                                                    volume_capability=mount_cap(pb, group="107")))
    refused(s, "C1 staging parent symlink", code, msg, "staging_target_path")
    if code == "OK":
        s.call("C1 (undo)", "NodeUnstageVolume", pb.NodeUnstageVolumeRequest(
            volume_id=VID2, staging_target_path=s.staging(VID2)), quiet=True)
    os.unlink(os.path.join(sdir, VID2))
    s.after("C1 staging parent symlink")
    s.works_fresh("C1", VID)

    # ---- C4: the target or staging path is not a directory
    base = csi % "c4"
    os.makedirs(base)
    socks = []
    for kind in ("fifo", "file", "socket", "symlink-in"):
        p = os.path.join(base, kind)
        os.makedirs(p)
        t = os.path.join(p, "mount")
        if kind == "fifo":
            os.mkfifo(t)
        elif kind == "file":
            open(t, "w").close()
        elif kind == "socket":
            socks.append(seclib.unix_socket_at(t))
        else:  # a symlink to a directory inside the kubelet root
            os.makedirs(os.path.join(s.kubelet, "elsewhere"), exist_ok=True)
            os.symlink(os.path.join(s.kubelet, "elsewhere"), t)
        code, msg, _ = s.call("C4 target is a %s" % kind, "NodePublishVolume",
                              s.publish_req(VID, t), bound=10)
        s.check(code not in ("OK", "DEADLINE_EXCEEDED"), "C4 target is a %s: %s" % (
            kind, seclib.fmt(code, msg)))
        if code == "OK":
            s.call("C4 (undo)", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
                volume_id=VID, target_path=t), quiet=True)
        s.after("C4 target is a %s" % kind)
    s.check(not os.listdir(os.path.join(s.kubelet, "elsewhere")),
            "C4: something was created through the target symlink")
    fifo_stg = os.path.join(s.kubelet, "fifo-staging")
    os.mkfifo(fifo_stg)
    code, msg, _ = s.call("C4 staging path is a FIFO", "NodeStageVolume",
                          pb.NodeStageVolumeRequest(volume_id=VID2, staging_target_path=fifo_stg,
                                                    volume_capability=mount_cap(pb, group="107")),
                          bound=10)
    s.check(code != "DEADLINE_EXCEEDED", "C4 staging FIFO: the call hung")
    if code == "OK":
        s.call("C4 (undo)", "NodeUnstageVolume", pb.NodeUnstageVolumeRequest(
            volume_id=VID2, staging_target_path=fifo_stg), quiet=True)
    s.after("C4 staging path is a FIFO", fifos_dir=s.kubelet)
    for x in socks:
        x.close()
    s.works_fresh("C4", VID)

    # ---- C2: the parent flips between a directory and a symlink out
    base = csi % "race"
    os.makedirs(base)
    real = os.path.join(base, VID)
    alt = os.path.join(base, VID + ".alt")
    os.mkdir(real)
    os.symlink(os.path.join(s.decoy, "dir-race"), alt)
    tgt = os.path.join(real, "mount")
    flip = seclib.Flipper(s, real, alt, RACE_SECONDS + 10)
    counts, first_bad = {}, None
    t0 = time.monotonic()
    n = 0
    try:
        while n < TRIES and time.monotonic() - t0 < RACE_SECONDS:
            n += 1
            for method, req in (("NodePublishVolume", s.publish_req(VID, tgt)),
                                ("NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
                                    volume_id=VID, target_path=tgt))):
                code, msg, _ = s.call("C2 race " + method, method, req, bound=10, quiet=True)
                counts[(method, code)] = counts.get((method, code), 0) + 1
            bad = decoy_touched(s, "dir-race")
            if bad and not first_bad:
                first_bad = (n, bad)
    finally:
        flip.stop()
    print("attack %-58s -> %d rounds in %.1f s: %s" % (
        "C2 race: target parent <-> symlink out", n, time.monotonic() - t0,
        ", ".join("%s %s x%d" % (m[4:], c, k) for (m, c), k in sorted(counts.items()))))
    s.check(not first_bad, "C2 race: the plugin created or mounted in the decoy (round %s: %s)"
            % first_bad if first_bad else "")
    # kubelet would retry the unpublish until OK
    for _ in range(5):
        code, msg, _ = s.call("C2 final NodeUnpublishVolume", "NodeUnpublishVolume",
                              pb.NodeUnpublishVolumeRequest(volume_id=VID, target_path=tgt),
                              quiet=True)
        if code == "OK":
            break
    s.check(code == "OK", "C2: final NodeUnpublishVolume: %s" % seclib.fmt(code, msg))
    s.check(not seclib.mounts_at(tgt), "C2: %s still mounted after unpublish" % tgt)
    s.after("C2 publish/unpublish race")
    s.works_fresh("C2", VID)

    # the target itself flips between the plugin's directory and a symlink out
    base = csi % "race-final"
    os.makedirs(base)
    tgt = os.path.join(base, "mount")
    alt = os.path.join(base, "mount.alt")
    os.symlink(os.path.join(s.decoy, "dir-race"), alt)
    os.mkdir(tgt)
    flip = seclib.Flipper(s, tgt, alt, RACE_SECONDS)
    counts, first_bad, n = {}, None, 0
    t0 = time.monotonic()
    try:
        while n < TRIES // 2 and time.monotonic() - t0 < RACE_SECONDS / 3:
            n += 1
            for method, req in (("NodePublishVolume", s.publish_req(VID, tgt)),
                                ("NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
                                    volume_id=VID, target_path=tgt))):
                code, msg, _ = s.call("C2 race " + method, method, req, bound=10, quiet=True)
                counts[(method, code)] = counts.get((method, code), 0) + 1
            bad = decoy_touched(s, "dir-race")
            if bad and not first_bad:
                first_bad = (n, bad)
    finally:
        flip.proc.kill()
        flip.proc.wait(timeout=10)
        stranded = [m[0] for m in seclib.mountinfo() if under(m[0], base) and m[0] != tgt]
        if stranded:
            # The plugin mounted on the directory it had opened, which the racer
            # had renamed meanwhile: the bind is inside the kubelet root (allowed),
            # but not at the target it recorded.  Noted, and undone by hand.
            print("       (note: bind left at %s, not at the recorded target)" % stranded)
            for mp in stranded:
                subprocess.run(["umount", "-l", mp], check=False)
        if os.path.islink(tgt):
            seclib.renameat2_exchange(tgt, alt)
    print("attack %-58s -> %d rounds in %.1f s: %s" % (
        "C2 race: the target itself <-> symlink out", n, time.monotonic() - t0,
        ", ".join("%s %s x%d" % (m[4:], c, k) for (m, c), k in sorted(counts.items()))))
    s.check(not first_bad, "C2 target race: the plugin created or mounted in the decoy "
            "(round %s: %s)" % first_bad if first_bad else "")
    for _ in range(5):
        code, msg, _ = s.call("C2 final NodeUnpublishVolume", "NodeUnpublishVolume",
                              pb.NodeUnpublishVolumeRequest(volume_id=VID, target_path=tgt),
                              quiet=True)
        if code == "OK":
            break
    s.check(code == "OK", "C2: final NodeUnpublishVolume: %s" % seclib.fmt(code, msg))
    if os.path.islink(alt):
        os.unlink(alt)
    s.after("C2 target race")
    s.works_fresh("C2 target race", VID)

    # the target directory itself, then its parent, renamed out of the kubelet
    # root and back (same filesystem): a descriptor opened beneath the kubelet
    # root follows the directory wherever it goes
    rename_race(s, csi % "race-rename", "mount", "target dir")
    rename_race(s, csi % "race-rename-parent", VID, "target's parent dir")

    # unpublish while the parent flips to a symlink whose other side holds a
    # mount that is not the plugin's (outside the kubelet root): it must stay
    fdir = os.path.join(s.decoy, "dir-foreign")
    fm = os.path.join(fdir, "mount")
    os.makedirs(fm)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "foreign", fm],
                   check=True)
    with open(os.path.join(fm, "precious"), "w") as f:
        f.write("not the plugin's\n")
    s.allowed_mounts.add(fm)
    s.decoy_base = s.decoy_state()
    base = csi % "race-umount"
    os.makedirs(base)
    real = os.path.join(base, VID)
    alt = os.path.join(base, VID + ".alt")
    os.mkdir(real)
    os.symlink(fdir, alt)
    tgt = os.path.join(real, "mount")
    flip = None
    counts, first_bad, n = {}, None, 0
    t0 = time.monotonic()
    try:
        s.ok("NodePublishVolume", s.publish_req(VID, tgt), "C2 umount race setup")
        flip = seclib.Flipper(s, real, alt, RACE_SECONDS)
        while n < TRIES and time.monotonic() - t0 < RACE_SECONDS / 2:
            n += 1
            for method, req in (("NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
                                    volume_id=VID, target_path=tgt)),
                                ("NodePublishVolume", s.publish_req(VID, tgt))):
                code, msg, _ = s.call("C2 race " + method, method, req, bound=10, quiet=True)
                counts[(method, code)] = counts.get((method, code), 0) + 1
            if not (seclib.mounts_at(fm) and os.path.exists(os.path.join(fm, "precious"))) \
                    and not first_bad:
                first_bad = n
    finally:
        if flip:
            flip.stop()
    print("attack %-58s -> %d rounds in %.1f s: %s" % (
        "C2 race: unpublish, parent <-> symlink to a foreign mount", n, time.monotonic() - t0,
        ", ".join("%s %s x%d" % (m[4:], c, k) for (m, c), k in sorted(counts.items()))))
    s.check(not first_bad, "C2 umount race: the foreign mount outside the kubelet root was "
            "unmounted or changed (round %s)" % first_bad)
    for _ in range(5):
        code, msg, _ = s.call("C2 final NodeUnpublishVolume", "NodeUnpublishVolume",
                              pb.NodeUnpublishVolumeRequest(volume_id=VID, target_path=tgt),
                              quiet=True)
        if code == "OK":
            break
    s.check(code == "OK", "C2: final NodeUnpublishVolume: %s" % seclib.fmt(code, msg))
    s.after("C2 unpublish race against a foreign mount")
    for _ in range(16):  # the foreign mount, and anything stacked on it
        if not [m for m in seclib.mountinfo() if under(m[0], fdir)]:
            break
        for mp in sorted({m[0] for m in seclib.mountinfo() if under(m[0], fdir)},
                         key=len, reverse=True):
            subprocess.run(["umount", "-l", mp], check=False)
    s.allowed_mounts.discard(fm)
    seclib.rm_tree(fdir)
    s.decoy_base = s.decoy_state()
    s.works_fresh("C2 (after the races)", VID)

    # the staging path's parent flips during stage/unstage
    sbase = os.path.dirname(os.path.dirname(s.staging(VID2)))
    sreal = os.path.join(sbase, VID2)
    salt = os.path.join(sbase, VID2 + ".alt")
    os.makedirs(sreal, exist_ok=True)
    os.symlink(os.path.join(s.decoy, "dir-stage"), salt)
    flip = seclib.Flipper(s, sreal, salt, RACE_SECONDS)
    counts, first_bad, n = {}, None, 0
    t0 = time.monotonic()
    try:
        while n < TRIES // 3 and time.monotonic() - t0 < RACE_SECONDS / 3:
            n += 1
            for method, req in (
                    ("NodeStageVolume", pb.NodeStageVolumeRequest(
                        volume_id=VID2, staging_target_path=s.staging(VID2),
                        volume_capability=mount_cap(pb, group="107"))),
                    ("NodeUnstageVolume", pb.NodeUnstageVolumeRequest(
                        volume_id=VID2, staging_target_path=s.staging(VID2)))):
                code, msg, _ = s.call("C2 race " + method, method, req, bound=10, quiet=True)
                counts[(method, code)] = counts.get((method, code), 0) + 1
            bad = decoy_touched(s, "dir-stage")
            if bad and not first_bad:
                first_bad = (n, bad)
    finally:
        flip.stop()
    print("attack %-58s -> %d rounds in %.1f s: %s" % (
        "C2 race: staging parent <-> symlink out", n, time.monotonic() - t0,
        ", ".join("%s %s x%d" % (m[4:], c, k) for (m, c), k in sorted(counts.items()))))
    s.check(not first_bad, "C2 staging race: the plugin created or mounted in the decoy "
            "(round %s: %s)" % first_bad if first_bad else "")
    code, msg, _ = s.call("C2 final NodeUnstageVolume", "NodeUnstageVolume",
                          pb.NodeUnstageVolumeRequest(volume_id=VID2,
                                                      staging_target_path=s.staging(VID2)),
                          quiet=True)
    s.check(code == "OK", "C2: final NodeUnstageVolume: %s" % seclib.fmt(code, msg))
    s.after("C2 stage/unstage race")
    s.works_fresh("C2 stage/unstage race (the other volume)", VID2)
    s.call("C2 unstage", "NodeUnstageVolume", pb.NodeUnstageVolumeRequest(
        volume_id=VID2, staging_target_path=s.staging(VID2)), quiet=True)

    # ---- C3: a recorded target's parent becomes a symlink while the plugin is down
    tgt = s.publish(VID, "c3")
    parent = os.path.dirname(tgt)
    s.env.stop(9)
    subprocess.run(["umount", tgt], check=True)
    os.rename(parent, parent + ".real")
    os.symlink(os.path.join(s.decoy, "dir-restart"), parent)
    try:
        s.start()
        print("attack %-58s -> started, pid %d" % ("C3 restart, recorded target's parent -> "
                                                   "symlink out", s.pid))
    except RuntimeError as e:
        s.check(False, "C3: plugin did not start: %s" % e)
        s.env.stop(9)
        os.unlink(parent)
        os.rename(parent + ".real", parent)
        s.start()
    time.sleep(1.0)  # anything done at start has been done by now
    log = [ln for ln in s.env.log_tail(400).splitlines() if tgt in ln or parent in ln]
    print("       (plugin log about the recorded target: %s)" % (
        log[-1].strip()[:300] if log else "nothing"))
    s.after("C3 restart with a recorded target's parent swapped")
    if os.path.islink(parent):
        os.unlink(parent)
        os.rename(parent + ".real", parent)
    code, msg, _ = s.call("C3 NodeUnpublishVolume of the recorded target", "NodeUnpublishVolume",
                          pb.NodeUnpublishVolumeRequest(volume_id=VID, target_path=tgt))
    s.check(code == "OK", "C3: NodeUnpublishVolume: %s" % seclib.fmt(code, msg))
    s.after("C3 unpublish")
    s.works_fresh("C3", VID)
    s.unstage(VID)


if __name__ == "__main__":
    sys.exit(seclib.run_test(run, "qsd-sec-path-"))
