#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""A TCG guest writes fsync'ed patterned 1 MiB blocks to a CSI volume (QEMU's
vhost-user-blk-pci on the published socket) while the test takes live thin
snapshots through CSI, lets the chain pass the merge threshold (background
block-stream) and flattens it (qsdctl merge): the guest sees 0 write errors,
0 I/O errors and reads back every block; each snapshot, and the volumes
restored from some of them, hold a prefix of the writes (blocks 0..k-1
whole, block k possibly torn at sector granularity, nothing after), and k
covers every block the guest had reported durable before the snapshot call.

usage: test_csi_thin_guest.py PLUGIN_BINARY PROTO_DIR QSDCTL
env: BUILD_CACHE (guest kernel cache), QSD_E2E=0 to skip
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))
if os.environ.get("QSD_E2E", "1") == "0":
    print("SKIP: end-to-end guest tests disabled (QSD_E2E=0)")
    sys.exit(77)
import csilib  # noqa: E402
from csilib import mount_cap  # noqa: E402
import thinlib  # noqa: E402

MiB = 1 << 20
SIZE = 96 * MiB
BLOCKS = 40
V = "pvc-g"


def main():
    qsdctl = sys.argv[3]
    cache = os.environ.get("BUILD_CACHE")
    if not cache:
        csilib.skip("BUILD_CACHE not set")
    if not shutil.which("qemu-system-x86_64"):
        csilib.skip("qemu-system-x86_64 missing")
    env = csilib.Env(sys.argv[1], sys.argv[2], prefix="qsd-thing-")
    vm = []
    try:
        run(env, qsdctl, cache, vm)
    finally:
        failed = sys.exc_info()[0] is not None
        for p in vm:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        if failed:
            print("---- guest console (tail)\n" + tail(os.path.join(env.root, "console.log")))
            print("---- plugin log (tail)\n" + env.log_tail(40))
        env.cleanup()


def tail(path, n=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def console(env):
    try:
        with open(os.path.join(env.root, "console.log"), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def durable(text):
    """Highest block the guest reported durable (fsync returned), or -1."""
    w = [int(x) for x in re.findall(r"^W (\d+)\s*$", text, re.M)]
    return max(w) if w else -1


def prefix(path, env):
    """k such that blocks 0..k-1 hold their pattern, block k is zeros, whole
    or torn (each 4 KiB zeros or pattern), and every later block is zeros."""
    raw = os.path.join(env.root, "img.raw")
    subprocess.run(["qemu-img", "convert", "-U", "-f", "qcow2", "-O", "raw", path, raw],
                   check=True, timeout=120)
    try:
        with open(raw, "rb") as f:
            blocks = [f.read(MiB) for _ in range(BLOCKS)]
    finally:
        os.unlink(raw)
    zero = bytes(MiB)
    k = 0
    while k < BLOCKS and blocks[k] == bytes([k % 250 + 1]) * MiB:
        k += 1
    if k < BLOCKS and blocks[k] != zero:
        pat = bytes([k % 250 + 1]) * 4096
        for off in range(0, MiB, 4096):
            assert blocks[k][off:off + 4096] in (pat, bytes(4096)), \
                "%s: block %d holds foreign data at %d" % (path, k, off)
    for j in range(k + 1, BLOCKS):
        assert blocks[j] == zero, "%s: block %d written after a gap at %d: not a prefix" % (
            path, j, k)
    return k


def run(env, qsdctl, cache, vm):
    c = env.start()
    pb = env.pb
    T = csilib.CALL_TIMEOUT
    cap = mount_cap(pb)
    _, tgt = thinlib.create_published(env, c, V, SIZE, cap, T)

    initrd = os.path.join(env.root, "initramfs-thin.img")
    r = subprocess.run(["bash", os.path.join(HERE, "..", "guest", "build-guest.sh"),
                        os.path.join(cache, "guest"), os.path.join(HERE, "guest-thin.sh"), initrd],
                       capture_output=True, text=True, timeout=900)
    if r.returncode == 77:
        csilib.skip("guest: " + r.stderr.strip())
    assert r.returncode == 0, r.stderr
    log = os.path.join(env.root, "console.log")
    vm.append(subprocess.Popen(
        ["qemu-system-x86_64", "-machine", "q35", "-accel", "tcg", "-m", "256", "-smp", "1",
         "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
         "-object", "memory-backend-memfd,id=mem,size=256M,share=on", "-numa", "node,memdev=mem",
         "-chardev", "socket,id=vu0,path=" + os.path.join(tgt, "vhost.sock"),
         "-device", "vhost-user-blk-pci,chardev=vu0,num-queues=1",
         "-kernel", os.path.join(cache, "guest", "vmlinuz"), "-initrd", initrd,
         "-append", "console=ttyS0 panic=-1 quiet thin.blocks=%d" % BLOCKS,
         "-serial", "file:" + log],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(env.root, "qemu.err"), "w")))
    deadline = time.monotonic() + 240
    while "WRITE-START" not in console(env):
        assert vm[0].poll() is None, "guest exited: " + tail(log)
        assert time.monotonic() < deadline, "guest did not start writing"
        time.sleep(0.2)
    print("ok TCG guest up, writing %d fsync'ed 1 MiB blocks" % BLOCKS)

    snaps = []  # (name, blocks durable before the call)
    flattened = False
    while "VERIFY" not in console(env) and len(snaps) < 24:
        n = "snap-%02d" % len(snaps)
        before = durable(console(env))
        c.CreateSnapshot(pb.CreateSnapshotRequest(name=n, source_volume_id=V), timeout=T)
        snaps.append((n, before))
        if len(snaps) == 10 and not flattened:
            r = subprocess.run([qsdctl, "--pool", env.pool, "--run-dir", env.run, "merge", V,
                                "--depth", "1", "--timeout", "120"],
                               capture_output=True, text=True, timeout=180)
            # a background merge may be running (past depth 8): then it is the
            # merge, not the flatten, that runs under the guest's writes
            assert r.returncode == 0, r.stderr
            flattened = "depth now 1" in r.stdout
        time.sleep(0.1)
    deadline = time.monotonic() + 300
    while "VERIFY" not in console(env):
        assert vm[0].poll() is None, "guest exited early: " + tail(log)
        assert time.monotonic() < deadline, "guest did not finish"
        time.sleep(0.2)
    m = re.search(r"VERIFY write_errors=(\d+) mismatches=(\d+) ioerr=(\d+)", console(env))
    assert m and m.groups() == ("0", "0", "0"), m and m.group(0)
    during = [s for s in snaps if s[1] < BLOCKS - 1]
    assert len(during) >= 3, "only %d snapshots while the guest wrote" % len(during)
    vm[0].wait(timeout=120)
    print("ok guest: 0 write errors, 0 I/O errors, every block read back; %d live snapshots "
          "(%d while it wrote), chain flattened%s" % (
              len(snaps), len(during), "" if flattened else " by the background merge"))
    assert "merging=yes" in env.log_tail(500) or flattened

    ks = []
    for n, before in snaps:
        k = prefix(os.path.join(env.pool, "snapshots", n + ".qcow2"), env)
        assert k >= before + 1, "%s holds %d blocks, %d were durable before it" % (n, k, before + 1)
        ks.append(k)
    assert ks == sorted(ks), ks
    assert prefix(os.path.join(env.pool, "volumes", V + ".qcow2"), env) == BLOCKS
    for n, _ in (snaps[1], snaps[len(snaps) // 2]):
        r = "r-" + n
        c.CreateVolume(pb.CreateVolumeRequest(
            name=r, capacity_range=pb.CapacityRange(required_bytes=SIZE),
            volume_capabilities=[cap], volume_content_source=pb.VolumeContentSource(
                snapshot=pb.VolumeContentSource.SnapshotSource(snapshot_id=n))), timeout=T)
        assert prefix(os.path.join(env.pool, "volumes", r + ".qcow2"), env) == \
            ks[[s[0] for s in snaps].index(n)]
    print("ok every snapshot holds a prefix of the writes covering what was durable before it "
          "(blocks: %s); restored volumes hold their snapshot's prefix" % ks)
    assert env.stop() == 0


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
