#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 9, B and C for the hot-plug bridge: entries planted in the host-side
bridge directory RUN/bridges/<pod-uid>/ (as if the VM pod could still write
there), placements raced, restart recovery and bridge removal.

- P1 a symlink to a decoy directory (and a FIFO, a socket, a file, an empty
  directory, a symlink to a decoy file) at the disk name a hot-plug request asks for: refused (the entry is not
  the plugin's), nothing mounted or created in the decoy;
- P2 race: a separate process creates and removes a symlink to the decoy at
  the placement's name and exchanges it with the plugin's placement
  directory as fast as it can, while the PVC is published/unpublished
  (placement created and removed) 300 times or 30 s: the decoy stays empty,
  no mount outside the kubelet root and the run dir;
- P3 restart: a placement's mount is lost while the plugin is down and its
  directory replaced by a symlink to the decoy: the new plugin must not
  mount through it;
- P3b restart: the bridge's own target mount lost and its parent replaced by
  a symlink to the decoy: nothing mounted there; restored once the parent is
  a directory again;
- P3c the same raced: restarts (3, and 5) while the target's parent
  flips to a symlink out, or the target itself is renamed out of the kubelet
  root and back: no mount
  outside, decoys unchanged;
- P4 removal of the bridge (NodeUnpublishVolume of the VM pod's inline
  volume) with a 10000-level tree, symlinks and FIFOs planted in it: bounded,
  the plugin stays up, the decoys are untouched.

usage: test_bridge_plants.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seclib  # noqa: E402
from seclib import MiB, mount_cap, under  # noqa: E402

VM_UID = "0d4b5a4e-1111-4000-8000-00000000c0de"
NS = "tenant"
PVC = "pvc-hot"
TRIES = 300
RACE_SECONDS = 30

RACER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
name, alt, target, limit = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
end = time.monotonic() + limit
n = 0
while time.monotonic() < end:
    try:
        os.symlink(target, name)          # the name before the plugin makes it
    except OSError:
        pass
    libc.renameat2(-100, name.encode(), -100, alt.encode(), 2)   # swap a dir for the link
    libc.renameat2(-100, name.encode(), -100, alt.encode(), 2)
    try:
        os.unlink(name)                   # only a symlink goes (a dir: EISDIR)
    except OSError:
        pass
    n += 1
    if n % 64 == 0:
        time.sleep(0.0005)
"""




def pod_ctx(uid, name, ephemeral):
    return {"csi.storage.k8s.io/pod.uid": uid, "csi.storage.k8s.io/pod.namespace": NS,
            "csi.storage.k8s.io/pod.name": name,
            "csi.storage.k8s.io/serviceAccount.name": "default",
            "csi.storage.k8s.io/ephemeral": "true" if ephemeral else "false"}


def decoy_touched(s, name):
    d = os.path.join(s.decoy, name)
    return os.listdir(d) or [m[0] for m in seclib.mountinfo() if under(m[0], s.decoy)]


def run(s):
    pb = s.pb
    cap = mount_cap(pb, group="107")
    bvid = "csi-bridge-vm"
    btgt = s.target(VM_UID, "inline-bridge")
    bctx = {"bridge": "true"}
    bctx.update(pod_ctx(VM_UID, "vm", True))
    s.ok("NodePublishVolume", pb.NodePublishVolumeRequest(
        volume_id=bvid, target_path=btgt, volume_capability=cap, volume_context=bctx),
        "bridge publish")
    bdir = os.path.join(s.run, "bridges", VM_UID)
    assert os.path.isdir(bdir), "setup: no bridge directory %s" % bdir
    s.create(PVC, 16 * MiB)
    s.stage(PVC)
    n_att = [0]

    def attach(disk, attack, quiet=False):
        """An attachment pod: its hot-plug request (disk) and the PVC."""
        n_att[0] += 1
        uid = "a%07d-0000-4000-8000-000000000001" % n_att[0]
        rctx = {"hotplugInto": "vm", "disk": disk}
        rctx.update(pod_ctx(uid, "attach-%d" % n_att[0], True))
        rtgt = s.target(uid, "inline-hotplug")
        rvid = "csi-req-%d" % n_att[0]
        code, msg, _ = s.call(attack + ": hot-plug request disk=" + disk, "NodePublishVolume",
                              pb.NodePublishVolumeRequest(volume_id=rvid, target_path=rtgt,
                                                          volume_capability=cap,
                                                          volume_context=rctx), quiet=quiet)
        ptgt = s.target(uid, PVC)
        pcode, pmsg, _ = s.call(attack + ": PVC publish", "NodePublishVolume",
                                s.publish_req(PVC, ptgt, ctx=pod_ctx(uid, "a", False)),
                                quiet=quiet)
        return (rvid, rtgt, ptgt), (code, msg), (pcode, pmsg)

    def detach(a):
        rvid, rtgt, ptgt = a
        s.call("detach", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
            volume_id=PVC, target_path=ptgt), quiet=True)
        s.call("detach", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
            volume_id=rvid, target_path=rtgt), quiet=True)

    # ---- P1: planted entries at the disk name
    plants = {"evil-dir": lambda p: os.symlink(os.path.join(s.decoy, "dir-bridge"), p),
              "evil-link": lambda p: os.symlink(os.path.join(s.decoy, "secret"), p),
              "evil-fifo": lambda p: os.mkfifo(p),
              "evil-sock": lambda p: socks.append(seclib.unix_socket_at(p)),
              "evil-file": lambda p: open(p, "w").close(),
              "evil-emptydir": lambda p: os.mkdir(p)}
    socks = []
    for disk, plant in plants.items():
        p = os.path.join(bdir, disk)
        plant(p)
        a, (code, msg), (pcode, pmsg) = attach(disk, "P1 %s planted" % disk)
        s.check(code == "FAILED_PRECONDITION" or pcode == "FAILED_PRECONDITION",
                "P1 %s: expected FAILED_PRECONDITION (an entry of that name), got request %s, "
                "PVC %s" % (disk, seclib.fmt(code, msg), seclib.fmt(pcode, pmsg)))
        s.check(not seclib.mounts_at(p) and not seclib.mounts_at(os.path.join(btgt, disk)),
                "P1 %s: something was mounted at the planted name" % disk)
        s.after("P1 %s" % disk)
        detach(a)
        s.after("P1 %s detach" % disk)
        if os.path.isdir(p) and not os.path.islink(p):
            os.rmdir(p)
        elif os.path.lexists(p):
            os.unlink(p)
    for x in socks:
        x.close()
    a, (code, msg), (pcode, pmsg) = attach("fine", "P1 rightful hot-plug")
    s.check(code == "OK" and pcode == "OK", "P1: a rightful hot-plug fails: %s / %s" % (
        seclib.fmt(code, msg), seclib.fmt(pcode, pmsg)))
    s.works("P1 rightful hot-plug", PVC, os.path.join(btgt, "fine"))
    detach(a)

    # ---- P2: race at the placement's name
    name = os.path.join(bdir, "race")
    alt = os.path.join(bdir, ".race-alt")
    os.symlink(os.path.join(s.decoy, "dir-bridge-race"), alt)
    racer = subprocess.Popen([sys.executable, "-c", RACER, name, alt,
                              os.path.join(s.decoy, "dir-bridge-race"), str(RACE_SECONDS + 10)])
    s.helpers.append(racer)
    # one request, the PVC published and unpublished again and again
    n_att[0] += 1
    uid = "b%07d-0000-4000-8000-000000000001" % n_att[0]
    rctx = {"hotplugInto": "vm", "disk": "race"}
    rctx.update(pod_ctx(uid, "attach-race", True))
    rtgt = s.target(uid, "inline-hotplug")
    counts, first_bad, n = {}, None, 0
    t0 = time.monotonic()
    try:
        code, msg, _ = s.call("P2 race: hot-plug request disk=race", "NodePublishVolume",
                              pb.NodePublishVolumeRequest(volume_id="csi-req-race",
                                                          target_path=rtgt, volume_capability=cap,
                                                          volume_context=rctx))
        ptgt = s.target(uid, PVC)
        while n < TRIES and time.monotonic() - t0 < RACE_SECONDS:
            n += 1
            for method, req in (("NodePublishVolume", s.publish_req(
                                    PVC, ptgt, ctx=pod_ctx(uid, "attach-race", False))),
                                ("NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
                                    volume_id=PVC, target_path=ptgt))):
                code, msg, _ = s.call("P2 race " + method, method, req, bound=10, quiet=True)
                counts[(method, code)] = counts.get((method, code), 0) + 1
            bad = decoy_touched(s, "dir-bridge-race")
            if bad and not first_bad:
                first_bad = (n, bad)
    finally:
        racer.kill()
        racer.wait(timeout=10)
    print("attack %-58s -> %d rounds in %.1f s: %s" % (
        "P2 race: placement name <-> symlink out", n, time.monotonic() - t0,
        ", ".join("%s %s x%d" % (m[4:], c, k) for (m, c), k in sorted(counts.items()))))
    s.check(not first_bad, "P2 race: the plugin created or mounted in the decoy (round %s: %s)"
            % first_bad if first_bad else "")
    s.call("P2 final unpublish", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
        volume_id=PVC, target_path=ptgt), quiet=True)
    s.call("P2 final unpublish", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
        volume_id="csi-req-race", target_path=rtgt), quiet=True)
    for p in (name, alt):
        if os.path.islink(p):
            os.unlink(p)
    s.after("P2 placement race")
    a, (code, msg), (pcode, pmsg) = attach("after-race", "P2 rightful hot-plug", quiet=True)
    s.check(code == "OK" and pcode == "OK", "P2: a rightful hot-plug fails: %s / %s" % (
        seclib.fmt(code, msg), seclib.fmt(pcode, pmsg)))
    s.works("P2 rightful hot-plug", PVC, os.path.join(btgt, "after-race"))
    detach(a)

    # ---- P3: restart, a lost placement's directory replaced by a symlink out
    a, (code, msg), (pcode, pmsg) = attach("late", "P3 setup", quiet=True)
    assert code == "OK" and pcode == "OK", "P3 setup: %s / %s" % (msg, pmsg)
    late = os.path.join(bdir, "late")
    s.env.stop(9)
    subprocess.run(["umount", late], check=True)
    os.rmdir(late)
    os.symlink(os.path.join(s.decoy, "dir-bridge-restart"), late)
    try:
        s.start()
        print("attack %-58s -> started, pid %d" % (
            "P3 restart, lost placement dir -> symlink out", s.pid))
    except RuntimeError as e:
        s.check(False, "P3: the plugin did not start: %s" % e)
        s.env.stop(9)
        os.unlink(late)
        s.start()
    time.sleep(1.0)
    s.after("P3 restart with a placement swapped for a symlink")
    if os.path.islink(late):
        os.unlink(late)
    detach(a)
    s.after("P3 detach")

    # ---- P3b: restart, the bridge's own target lost and its parent swapped
    s.env.stop(9)
    subprocess.run(["umount", "-l", btgt], check=True)
    bparent = os.path.dirname(btgt)
    os.rename(bparent, bparent + ".real")
    os.symlink(os.path.join(s.decoy, "dir-bridge-restart"), bparent)
    try:
        s.start()
        print("attack %-58s -> started, pid %d" % (
            "P3b restart, bridge target's parent -> symlink out", s.pid))
    except RuntimeError as e:
        s.check(False, "P3b: the plugin did not start: %s" % e)
        s.env.stop(9)
        os.unlink(bparent)
        os.rename(bparent + ".real", bparent)
        s.start()
    time.sleep(1.0)
    s.after("P3b restart with the bridge target's parent swapped")
    if os.path.islink(bparent):
        os.unlink(bparent)
        os.rename(bparent + ".real", bparent)
    # the VM pod's volume directory is back: the next start restores its bridge
    s.restart("P3b: parent restored")
    time.sleep(0.5)
    s.check(seclib.mounts_at(btgt), "P3b: the bridge's target was not restored once its "
            "parent was a directory again")
    s.after("P3b restored")

    # ---- P3c: the same raced: the bridge target lost, then restarts while its
    # parent flips to a symlink out, or is renamed out of the kubelet root
    outside = os.path.join(s.root, "outside")
    os.mkdir(outside)
    s.top_base.add("outside")
    for how, restarts in (("flip", 3), ("rename", 5)):
        bad = None
        done = 0
        for i in range(restarts):
            if bad:
                break  # found: no need for more restarts
            done += 1
            s.env.stop(9)
            subprocess.run(["umount", "-l", btgt], check=False)
            if how == "flip":
                alt = bparent + ".alt"
                if not os.path.lexists(alt):
                    os.symlink(os.path.join(s.decoy, "dir-bridge-restart"), alt)
                racer = seclib.Flipper(s, bparent, alt, 20)
            else:  # the target itself: a bind made on it outside cannot come back
                racer = subprocess.Popen([sys.executable, "-c", seclib.MOVER, btgt,
                                          os.path.join(outside, "b"), "20"])
                s.helpers.append(racer)
            try:
                s.start()
                time.sleep(0.5)
            except RuntimeError as e:
                s.check(False, "P3c: the plugin did not start: %s" % e)
            finally:
                if how == "flip":
                    racer.stop()
                else:
                    racer.kill()
                    racer.wait(timeout=10)
                    if not os.path.isdir(btgt) and os.path.isdir(os.path.join(outside, "b")):
                        try:
                            os.rename(os.path.join(outside, "b"), btgt)
                        except OSError:
                            pass  # a mount point: it stays outside (checked below)
            out = [m[0] for m in seclib.mountinfo()
                   if under(m[0], outside) or under(m[0], s.decoy)]
            if (out or s.decoy_diff()) and not bad:
                bad = (i + 1, out, s.decoy_diff())
            for mp in sorted(set(out), key=len, reverse=True):
                subprocess.run(["umount", "-l", mp], check=False)
            if how == "rename" and not os.path.isdir(btgt) and \
                    os.path.isdir(os.path.join(outside, "b")):
                os.rename(os.path.join(outside, "b"), btgt)
            if not s.alive():
                s.start()
        print("attack %-58s -> %d restarts: %s" % (
            "P3c restart, bridge target %s" % ("parent <-> symlink out" if how == "flip"
                                               else "renamed out and back"),
            done, "nothing outside" if not bad else "round %d: %s %s" % bad))
        s.check(not bad, "P3c (%s): the restored bridge target landed outside the kubelet root "
                "or changed a decoy (restart %s: %s %s)" % ((how,) + bad) if bad else "")
        if os.path.islink(bparent + ".alt"):
            os.unlink(bparent + ".alt")
        s.restore_decoys()
        s.after("P3c " + how)
    seclib.rm_tree(outside)
    s.top_base.discard("outside")
    s.restart("P3c: restore the bridge")
    time.sleep(0.5)
    s.check(seclib.mounts_at(btgt), "P3c: the bridge's target was not restored afterwards")

    # ---- P4: removal of the bridge with a deep tree and links planted
    a, (code, msg), (pcode, pmsg) = attach("kept", "P4 setup", quiet=True)
    seclib.make_deep_tree(bdir, "deep", seclib.DEEP)
    os.symlink(s.decoy, os.path.join(bdir, "link-dir"))
    os.symlink(os.path.join(s.decoy, "secret"), os.path.join(bdir, "link-file"))
    os.mkfifo(os.path.join(bdir, "fifo"))
    code, msg, _ = s.call("P4 NodeUnpublishVolume of the bridge (planted)",
                          "NodeUnpublishVolume",
                          pb.NodeUnpublishVolumeRequest(volume_id=bvid, target_path=btgt), 30)
    s.check(code != "DEADLINE_EXCEEDED", "P4: bridge removal hung")
    s.check(not seclib.mounts_at(btgt), "P4: the bridge's target is still mounted")
    s.after("P4 bridge removal", fifos_dir=bdir if os.path.isdir(bdir) else None)
    if os.path.isdir(bdir):
        print("       (bridge dir after removal: %s)" % sorted(os.listdir(bdir))[:8])
    detach(a)
    s.works_fresh("P4 (the PVC's rightful user)", PVC)
    s.unstage(PVC)


if __name__ == "__main__":
    sys.exit(seclib.run_test(run, "qsd-sec-brg-"))
