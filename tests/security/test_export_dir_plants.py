#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 9, attacks B: defense in depth inside the host-side export directory
RUN/exports/<vol>/.  The test (root) plants there what a tenant would if it
could still write through its publication, then triggers every operation
that touches that directory:

- B1 FIFOs (and a bound socket) at every volume.json temporary name the
  plugin could use (volume.json.tmp.<plugin pid>, .tmp.1, ...), then an
  online resize (ControllerExpandVolume + NodeExpandVolume rewrite
  volume.json);
- B2 volume.json and vhost.sock replaced by symlinks to root:root 0600 decoy
  files outside, then unpublish and re-publish with another
  volume_mount_group (regroup: chown/chmod), an online resize, unstage;
- B3 a 10000-level directory tree, FIFOs, sockets and symlinks, then
  unpublish and unstage (the recursive delete);
  B2 and B3 plant in RUN/exports-ro/<vol>/ (the read-only export) too;
- B4 the same planted before kill -9 + start of the plugin (FIFOs at the
  next few hundred pids' temporary names), then a resize;
- B5 directories (empty, then not empty) at volume.json and vhost.sock in
  both export directories, then resize, unpublish, unstage: the next stage
  must work (an OK resize must have rewritten volume.json).

Expected: each call completes (OK or a clear error) within its bound; Probe
answers within 1 s afterwards; the plugin is the same process (unless the
test restarted it); decoys keep owner, group, mode and content; nothing is
created, removed or mounted outside the kubelet root, run dir and pool; the
volume still works for its rightful user.

usage: test_export_dir_plants.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seclib  # noqa: E402
from seclib import MiB, mount_cap, vhost_info  # noqa: E402

VID = "pvc-victim"
DEPTH = seclib.DEEP


def plant_fifos(ed, names):
    made = []
    for n in names:
        p = os.path.join(ed, n)
        try:
            os.mkfifo(p, 0o666)
            made.append(n)
        except FileExistsError:
            pass
    return made


def clear(ed, names):
    for n in names:
        p = os.path.join(ed, n)
        try:
            if os.path.isdir(p) and not os.path.islink(p):
                seclib.rm_tree(p)
            else:
                os.unlink(p)
        except FileNotFoundError:
            pass


def expand(s, attack, size, path, bound=seclib.BOUND):
    pb = s.pb
    code, msg, _ = s.call(attack + ": ControllerExpandVolume", "ControllerExpandVolume",
                          pb.ControllerExpandVolumeRequest(
                              volume_id=VID, capacity_range=pb.CapacityRange(required_bytes=size),
                              volume_capability=mount_cap(pb, group="107")), bound)
    s.check(code == "OK", "%s: ControllerExpandVolume: %s" % (attack, seclib.fmt(code, msg)))
    return s.call(attack + ": NodeExpandVolume", "NodeExpandVolume", pb.NodeExpandVolumeRequest(
        volume_id=VID, volume_path=path, staging_target_path=s.staging(VID),
        capacity_range=pb.CapacityRange(required_bytes=size),
        volume_capability=mount_cap(pb, group="107")), bound)


def run(s):
    pb = s.pb
    ed = s.export_dir(VID)
    ro_dir = os.path.join(s.run, "exports-ro", VID)
    s.create(VID, 64 * MiB)
    s.stage(VID)
    tgt = s.publish(VID, "pod-1")
    assert vhost_info(s.qsdctl, tgt)[0], "setup: volume does not work"

    # ---- B1: FIFOs at the temporary names, then an online resize
    pid = s.pid
    names = ["volume.json.tmp", "volume.json.tmp.%d" % pid, "volume.json.tmp.1",
             "volume.json.tmp-%d" % pid, ".volume.json.tmp", ".volume.json.tmp.%d" % pid,
             "volume.json.new", "volume.json~", ".tmp"]
    fifos = plant_fifos(ed, names)
    sock = seclib.unix_socket_at(os.path.join(ed, "volume.json.tmp.2"))
    code, msg, _ = expand(s, "B1 FIFOs at volume.json.tmp*", 96 * MiB, tgt)
    s.check(code not in ("DEADLINE_EXCEEDED", "UNAVAILABLE", "CANCELLED"),
            "B1: NodeExpandVolume with FIFOs planted: %s" % seclib.fmt(code, msg))
    s.after("B1 FIFOs + NodeExpandVolume", fifos_dir=ed)
    if code == "OK":
        d, err = vhost_info(s.qsdctl, tgt)
        s.check(d and d["capacity"] == 96 * MiB, "B1: after an OK expansion the client sees %s"
                % (d and d["capacity"] or err))
        try:
            meta = json.load(open(os.path.join(tgt, "volume.json")))
            s.check(meta.get("size") == 96 * MiB, "B1: volume.json says size %s after an OK "
                    "expansion" % meta.get("size"))
        except (OSError, ValueError) as e:
            s.check(False, "B1: volume.json unreadable after the expansion: %s" % e)
    sock.close()
    clear(ed, fifos + ["volume.json.tmp.2"])
    s.works("B1", VID, tgt)

    # ---- B2: symlinks to decoys, then regroup, resize, unstage
    vj, vs = os.path.join(ed, "volume.json"), os.path.join(ed, "vhost.sock")
    os.rename(vs, os.path.join(ed, "tenant-moved.sock"))
    os.symlink(os.path.join(s.decoy, "secret-sock"), vs)
    os.unlink(vj)
    os.symlink(os.path.join(s.decoy, "secret-json"), vj)
    for n, decoy in (("volume.json", "secret-json"), ("vhost.sock", "secret-sock")):
        p = os.path.join(ro_dir, n)
        if os.path.lexists(p):  # the read-only export's files too
            os.rename(p, os.path.join(ro_dir, "tenant-moved-" + n))
            os.symlink(os.path.join(s.decoy, decoy), p)
    code, msg, _ = s.call("B2 symlinks: NodeUnpublishVolume", "NodeUnpublishVolume",
                          pb.NodeUnpublishVolumeRequest(volume_id=VID, target_path=tgt))
    s.check(code == "OK", "B2: NodeUnpublishVolume: %s" % seclib.fmt(code, msg))
    s.after("B2 symlinks + NodeUnpublishVolume")
    tgt2 = s.target("pod-2", VID)
    code, msg, _ = s.call("B2 symlinks: NodePublishVolume group 108 (regroup)",
                          "NodePublishVolume", s.publish_req(VID, tgt2, group="108"))
    s.after("B2 symlinks + regroup to 108")
    if code == "OK":
        expand(s, "B2 symlinks", 128 * MiB, tgt2)
        s.after("B2 symlinks + NodeExpandVolume")
        code, msg, _ = s.call("B2 symlinks: NodeUnpublishVolume", "NodeUnpublishVolume",
                              pb.NodeUnpublishVolumeRequest(volume_id=VID, target_path=tgt2))
        s.after("B2 symlinks + NodeUnpublishVolume of the regrouped publication")
    code, msg, _ = s.call("B2 symlinks: NodeStageVolume group 107 (regroup back)",
                          "NodeStageVolume", pb.NodeStageVolumeRequest(
                              volume_id=VID, staging_target_path=s.staging(VID),
                              volume_capability=mount_cap(pb, group="107")))
    s.after("B2 symlinks + NodeStageVolume regroup")
    code, msg, _ = s.call("B2 symlinks: NodeUnstageVolume", "NodeUnstageVolume",
                          pb.NodeUnstageVolumeRequest(volume_id=VID,
                                                      staging_target_path=s.staging(VID)))
    s.check(code == "OK", "B2: NodeUnstageVolume: %s" % seclib.fmt(code, msg))
    s.after("B2 symlinks + NodeUnstageVolume")
    if code != "OK":
        clear(ed, ["volume.json", "vhost.sock", "tenant-moved.sock"])
    s.works_fresh("B2 (rightful user stages again)", VID)

    # ---- B3: a deep tree (and FIFOs, sockets, symlinks), then unpublish + unstage
    tgt3 = s.publish(VID, "pod-3")
    seclib.make_deep_tree(ed, "deep", DEPTH)
    if os.path.isdir(ro_dir):  # the read-only export's directory (issue 9, F)
        seclib.make_deep_tree(ro_dir, "deep", DEPTH // 3)
        os.symlink(os.path.join(s.decoy, "secret"), os.path.join(ro_dir, "link-file"))
    fifos = plant_fifos(ed, ["fifo", "volume.json.tmp.%d" % s.pid])
    sock = seclib.unix_socket_at(os.path.join(ed, "tenant.sock"))
    os.symlink(s.decoy, os.path.join(ed, "link-dir"))
    os.symlink(os.path.join(s.decoy, "secret"), os.path.join(ed, "link-file"))
    code, msg, _ = s.call("B3 deep tree: NodeUnpublishVolume", "NodeUnpublishVolume",
                          pb.NodeUnpublishVolumeRequest(volume_id=VID, target_path=tgt3))
    s.check(code == "OK", "B3: NodeUnpublishVolume: %s" % seclib.fmt(code, msg))
    s.after("B3 deep tree + NodeUnpublishVolume", fifos_dir=ed)
    code, msg, _ = s.call("B3 deep tree (%d levels): NodeUnstageVolume" % DEPTH,
                          "NodeUnstageVolume", pb.NodeUnstageVolumeRequest(
                              volume_id=VID, staging_target_path=s.staging(VID)), 30)
    s.after("B3 deep tree + NodeUnstageVolume", fifos_dir=ed)
    sock.close()
    if os.path.isdir(ed):
        print("       (export dir after unstage: %s)" % sorted(os.listdir(ed)))
    s.works_fresh("B3 (rightful user stages again)", VID)

    # ---- B4: planted, then kill -9 + start, then a resize
    tgt4 = s.publish(VID, "pod-4")
    for n in ("deep", "fifo", "tenant.sock", "link-dir", "link-file"):
        if os.path.lexists(os.path.join(ed, n)):
            clear(ed, [n])
    pid = s.pid
    fifos = plant_fifos(ed, ["volume.json.tmp.%d" % p for p in range(pid + 1, pid + 301)] +
                        ["volume.json.tmp.1", "volume.json.tmp"])
    seclib.make_deep_tree(ed, "deep", DEPTH // 3)
    os.unlink(vj)
    os.symlink(os.path.join(s.decoy, "secret-json"), vj)
    try:
        s.restart("kill -9 + start with FIFOs, a symlink and a deep tree planted")
        print("attack %-58s -> started, pid %d" % ("B4 restart with plants", s.pid))
    except RuntimeError as e:
        s.check(False, "B4: the plugin did not start with the export dir planted: %s" % e)
        print("attack %-58s -> %s" % ("B4 restart with plants", e))
        s.env.stop(9)
        seclib.drain_fifos(ed)
        s.start()
    s.after("B4 restart", fifos_dir=ed)
    fifos += plant_fifos(ed, ["volume.json.tmp.%d" % s.pid])
    code, msg, _ = expand(s, "B4 after restart, FIFO at the new pid", 160 * MiB, tgt4)
    s.check(code not in ("DEADLINE_EXCEEDED", "UNAVAILABLE", "CANCELLED"),
            "B4: NodeExpandVolume after restart: %s" % seclib.fmt(code, msg))
    s.after("B4 NodeExpandVolume after restart", fifos_dir=ed)
    d, err = vhost_info(s.qsdctl, tgt4)
    s.check(d is not None, "B4: volume no longer connects through its target: %s" % err)
    # The rightful user's cycle (the tenant's pod goes, another comes).
    code, msg, _ = s.call("B4 NodeUnpublishVolume", "NodeUnpublishVolume",
                          pb.NodeUnpublishVolumeRequest(volume_id=VID, target_path=tgt4))
    s.after("B4 NodeUnpublishVolume", fifos_dir=ed)
    code, msg, _ = s.call("B4 NodeUnstageVolume", "NodeUnstageVolume",
                          pb.NodeUnstageVolumeRequest(volume_id=VID,
                                                      staging_target_path=s.staging(VID)), 30)
    s.after("B4 NodeUnstageVolume", fifos_dir=ed)
    s.works_fresh("B4 (rightful user stages again)", VID)
    s.check(s.alive(), "plugin died")

    # ---- B5: directories at the plugin's own names (volume.json, vhost.sock):
    # empty ones (B5a), then ones with something inside (B5b: no recursion
    # may remove them; the next stage must still work, e.g. by moving them
    # aside)
    for case, full in (("B5a empty", False), ("B5b non-empty", True)):
        size = (192 if not full else 224) * MiB
        tgt5 = s.publish(VID, "pod-5" + ("b" if full else "a"))
        for d in (ed, ro_dir):
            for n in ("volume.json", "vhost.sock"):
                p = os.path.join(d, n)
                if os.path.lexists(p):
                    os.rename(p, os.path.join(d, "tenant-moved-%s-%s" % (case[:3], n)))
                os.mkdir(p)
                if full:
                    os.mkdir(os.path.join(p, "sub"))
        what = "%s directories at volume.json/vhost.sock" % case
        code, msg, _ = expand(s, what, size, tgt5)
        s.check(code not in ("DEADLINE_EXCEEDED", "UNAVAILABLE", "CANCELLED"),
                "%s: NodeExpandVolume: %s" % (case, seclib.fmt(code, msg)))
        if code == "OK":  # OK means the launcher's metadata says the new size too
            try:
                got = json.load(open(os.path.join(tgt5, "volume.json"))).get("size")
            except (OSError, ValueError) as e:
                got = "unreadable (%s)" % (e.strerror if isinstance(e, OSError) else e)
            s.check(got == size, "%s: NodeExpandVolume answered OK but volume.json through "
                    "the target says size %s" % (case, got))
        s.after(case + " NodeExpandVolume")
        s.call(case + " NodeUnpublishVolume", "NodeUnpublishVolume",
               pb.NodeUnpublishVolumeRequest(volume_id=VID, target_path=tgt5))
        s.after(case + " NodeUnpublishVolume")
        s.call(case + " NodeUnstageVolume", "NodeUnstageVolume",
               pb.NodeUnstageVolumeRequest(volume_id=VID, staging_target_path=s.staging(VID)),
               30)
        s.after(case + " NodeUnstageVolume")
        if os.path.isdir(ed):
            print("       (export dir after unstage: %s)" % sorted(os.listdir(ed)))
        # The tenant's pod is gone; the next pod of the volume's owner must get it.
        if not s.works_fresh(case + " (rightful user stages again)", VID):
            for d in (ed, ro_dir):  # the operator's repair, so that B5b runs on its own
                for n in ("volume.json", "vhost.sock"):
                    p = os.path.join(d, n)
                    if os.path.isdir(p) and not os.path.islink(p):
                        seclib.rm_tree(p)
            s.works_fresh(case + " (after the operator removed them)", VID)


if __name__ == "__main__":
    sys.exit(seclib.run_test(run, "qsd-sec-exp-"))
