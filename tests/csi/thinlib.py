# SPDX-License-Identifier: Apache-2.0
"""Helpers for the thin-layer tests: a vhost-user client writing rounds of
qsdctl verify's pattern in the background, and a reader of an image's
content (qemu-img convert, then every sector checked against the pattern in
Python: header, place and pseudo-random body) so that a snapshot's content
can be compared with the rounds that finished before it was taken."""
import os
import struct
import subprocess
import threading
import time

MAGIC = 0x7173642d76726679  # qsdctl verify's sector header ("qsd-vrfy")
M64 = (1 << 64) - 1
SECTOR = 512


def create_published(env, c, vid, size, cap, timeout, params=None):
    """CreateVolume (with StorageClass parameters params), NodeStageVolume and
    NodePublishVolume of vid, as kubelet would; returns (staging path, target
    path)."""
    pb = env.pb
    c.CreateVolume(pb.CreateVolumeRequest(
        name=vid, capacity_range=pb.CapacityRange(required_bytes=size),
        volume_capabilities=[cap], parameters=params or {}), timeout=timeout)
    stg = os.path.join(env.kubelet, "staging", vid)
    tgt = os.path.join(env.kubelet, "pods", vid, "mount")
    os.makedirs(stg)
    os.makedirs(os.path.dirname(tgt))
    c.NodeStageVolume(pb.NodeStageVolumeRequest(volume_id=vid, staging_target_path=stg,
                                                volume_capability=cap), timeout=timeout)
    c.NodePublishVolume(pb.NodePublishVolumeRequest(volume_id=vid, staging_target_path=stg,
                                                    target_path=tgt, volume_capability=cap),
                        timeout=timeout)
    return stg, tgt


def chunk_offsets(size, nchunks, chunk):
    """Where qsdctl verify puts its chunks (vhost_cmds.c)."""
    last = size - chunk
    if nchunks == 1:
        return [0]
    return [(last * i // (nchunks - 1)) // 4096 * 4096 for i in range(nchunks)]


def sector_seed(buf, off, sector):
    """The verify seed the sector at buf[off:] holds, None for zeros; raises
    on foreign, misplaced or corrupt data."""
    magic, seed, sec = struct.unpack_from("<QQQ", buf, off)
    if magic != MAGIC:
        if buf[off:off + SECTOR] == bytes(SECTOR):
            return None
        raise AssertionError("sector %d: foreign data" % sector)
    if sec != sector:
        raise AssertionError("sector %d holds sector %d's pattern" % (sector, sec))
    x = ((seed * 0x9e3779b97f4a7c15) & M64) ^ (((sector + 1) * 0xbf58476d1ce4e5b9) & M64)
    words = struct.unpack_from("<61Q", buf, off + 24)
    for w in words:
        x ^= (x << 13) & M64
        x ^= x >> 7
        x ^= (x << 17) & M64
        if w != x:
            raise AssertionError("sector %d: corrupt body (seed %d)" % (sector, seed))
    return seed


def image_chunk_seeds(image, fmt, size, nchunks, chunk, tmpdir):
    """Seed of each chunk of an image (the whole chunk must agree)."""
    raw = os.path.join(tmpdir, "read.raw")
    subprocess.run(["qemu-img", "convert", "-U", "-f", fmt, "-O", "raw", image, raw],
                   check=True, timeout=120)
    seeds = []
    try:
        with open(raw, "rb") as f:
            for off in chunk_offsets(size, nchunks, chunk):
                f.seek(off)
                buf = f.read(chunk)
                got = {sector_seed(buf, i, off // SECTOR + i // SECTOR)
                       for i in range(0, chunk, SECTOR)}
                if len(got) != 1:
                    raise AssertionError("chunk at %d mixes %s: a torn write" % (off, got))
                seeds.append(got.pop())
    finally:
        os.unlink(raw)
    return seeds


class Writer:
    """A vhost-user client that stays connected and writes rounds of the
    pattern (seeds first, first+1, ...) until stopped, as a guest would:
    `qsdctl verify --write --rounds`.  Each round: (seed, start, end) on
    CLOCK_MONOTONIC, like time.monotonic()."""

    def __init__(self, qsdctl, sock_dir, first, nchunks, chunk, tmpdir):
        self.stop_file = os.path.join(tmpdir, "writer.stop")
        self.proc = subprocess.Popen(
            [qsdctl, "verify", "--write", "--rounds", "1000000", "--stop-file", self.stop_file,
             "--seed", str(first), "--chunks", str(nchunks), "--chunk-size", str(chunk),
             "--timeout-ms", "20000", "./vhost.sock"], cwd=sock_dir, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        self.rounds = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            f = line.split()
            if len(f) == 4 and f[0] == "round":
                self.rounds.append((int(f[1]), int(f[2]) / 1e6, int(f[3]) / 1e6, 0, ""))

    def wait_rounds(self, n, timeout=30):
        deadline = time.monotonic() + timeout
        while len(self.rounds) < n:
            assert self.proc.poll() is None, "writer died: %s" % self.proc.stderr.read()
            assert time.monotonic() < deadline, "writer too slow"
            time.sleep(0.02)

    def stop(self):
        open(self.stop_file, "w").close()
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait(timeout=10)
        self.reader.join(timeout=10)
        err = self.proc.stderr.read()
        self.proc.stderr.close()
        assert rc == 0, "writes failed during the operations (rc %d): %s" % (rc, err)
        return self.rounds


def allowed_seeds(rounds, t0, t1, initial):
    """A snapshot taken by a call running from t0 to t1 holds, per chunk, the
    last round that finished before t0 or a round that started before t1."""
    done = [s for s, a, b, rc, _ in rounds if b < t0]
    base = max(done) if done else initial
    return {base} | {s for s, a, b, rc, _ in rounds if a < t1 and s > base}


def pool_usage(pool):
    """Bytes allocated by the pool's files (each inode once)."""
    seen, total = set(), 0
    for d, _, files in os.walk(pool):
        for f in files:
            st = os.lstat(os.path.join(d, f))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def layer_files(pool):
    d = os.path.join(pool, "layers")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []
