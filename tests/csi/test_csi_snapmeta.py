#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""SnapshotMetadata (changed-block tracking, issue 25 deliverable 3) on the
real plugin and QSD, called by a client that is not ours: tests/cbt, the
CSI specification's Go bindings over grpc-go (built by tests/cbt/build.sh,
or QSD_CBT_CLIENT).  Blocks are written through the published vhost-user
socket with `qsdctl verify --write` (64 KiB chunks spread over the disk),
so the clusters each round touched are known.

Asserted:
  - round 1, snapshot s1, round 2, snapshot s2: GetMetadataAllocated(s1) is
    exactly round 1's clusters, (s2) rounds 1+2's; GetMetadataDelta(s1, s2)
    exactly round 2's; VARIABLE_LENGTH, capacity the volume's size;
  - paging: max_results 1 gives one extent per message and the same list; a
    starting_offset inside the list gives the suffix from the extent that
    contains it; 8 streams stalled by a grpcio client that reads one
    message each (a 9th is RESOURCE_EXHAUSTED), then cancelled;
  - round 3, snapshot s3, the live volume flattened (qsdctl merge --depth
    1: every layer streamed into its top), round 4, snapshot s4: the deltas
    s3->s4 and s1->s4 cover every changed cluster (a superset is allowed);
    DeleteSnapshot of the middle s2: s1->s3 still exactly rounds 2+3;
  - a volume restored from s1, written (round 5), snapshotted twice around
    round 6: its delta is exactly round 6, its allocated rounds 1+5;
  - refusals with their codes and the field named: empty ids
    (INVALID_ARGUMENT), unknown snapshot (NOT_FOUND), starting_offset at the
    size or negative (OUT_OF_RANGE), max_results negative
    (INVALID_ARGUMENT), base of another volume or newer than the target
    (INVALID_ARGUMENT), another node's snapshot (UNAVAILABLE naming it), an
    RBD snapshot (UNIMPLEMENTED, from the RBD backend's table), a
    raw volume's full-copy snapshots (FAILED_PRECONDITION for a delta;
    GetMetadataAllocated still answers), a layer whose qcow2 header says
    corrupt (INTERNAL saying so);
  - the plugin exits 0 on SIGTERM (the ASan build: nothing leaked).

usage: test_csi_snapmeta.py PLUGIN_BINARY PROTO_DIR QSDCTL
"""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import csilib  # noqa: E402
import thinlib  # noqa: E402
from csilib import mount_cap  # noqa: E402

MiB = 1 << 20
SIZE = 64 * MiB
CHUNK = CLUSTER = 64 * 1024
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cbt_client():
    """The Go client: QSD_CBT_CLIENT, else built (once) by tests/cbt/build.sh.
    Missing Go is a failure, not a skip."""
    path = os.environ.get("QSD_CBT_CLIENT")
    if path:
        assert os.access(path, os.X_OK), "QSD_CBT_CLIENT %s is not executable" % path
        return path
    r = subprocess.run(["/bin/bash", os.path.join(ROOT, "tests/cbt/build.sh")],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, "tests/cbt/build.sh failed: %s" % r.stderr[-2000:]
    return r.stdout.strip().splitlines()[-1]


def short(out):
    """An answer for an assertion message: at most 20 blocks."""
    b = out.get("blocks", [])
    return dict(out, blocks=b[:20] + (["... %d blocks" % len(b)] if len(b) > 20 else []))


class Cbt:
    def __init__(self, client, sock):
        self.client, self.sock = client, sock

    def call(self, target, base=None, offset=0, max_results=0, ok=True, capacity=SIZE):
        argv = [self.client, "-endpoint", "unix://" + self.sock, "-snapshot", target,
                "-offset", str(offset), "-max", str(max_results), "-timeout", "60s"]
        if base is not None:
            argv += ["-base", base]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=90)
        assert r.returncode in (0, 2), "cbt-client: rc %d: %s" % (r.returncode, r.stderr)
        out = json.loads(r.stdout)
        if ok:
            assert r.returncode == 0 and out["ok"], "%s: %s" % (argv[3:], short(out))
            # one message at least, even with no blocks: the type and capacity
            assert out["messages"] >= 1 and out["type"] == "VARIABLE_LENGTH" and \
                out["capacity"] == capacity, short(out)
        return out

    def refused(self, code, word, target, **kw):
        out = self.call(target, ok=False, **kw)
        go = "".join(w.capitalize() for w in code.split("_"))  # grpc-go's names
        assert not out["ok"] and out["code"] == go and word in out["message"], \
            "expected %s naming %r, got %s" % (code, word, short(out))
        print("ok refused %s: %s" % (code, out["message"]))


def clusters(nchunks):
    """Clusters qsdctl verify's chunks touch."""
    s = set()
    for off in thinlib.chunk_offsets(SIZE, nchunks, CHUNK):
        s.update(range(off // CLUSTER, (off + CHUNK - 1) // CLUSTER + 1))
    return s


def extents(cl):
    """Sorted clusters -> merged [offset, size] byte extents."""
    out = []
    for c in sorted(cl):
        if out and out[-1][0] + out[-1][1] == c * CLUSTER:
            out[-1][1] += CLUSTER
        else:
            out.append([c * CLUSTER, CLUSTER])
    return out


def covered(blocks):
    s = set()
    for off, size in blocks:
        s.update(range(off // CLUSTER, (off + size - 1) // CLUSTER + 1))
    return s


class Node:
    def __init__(self, env, c):
        self.env, self.c, self.pb = env, c, env.pb
        self.cap = mount_cap(env.pb)

    def up(self, v):
        k = self.env.kubelet
        stg, tgt = os.path.join(k, "staging", v), os.path.join(k, "pods", v, "mount")
        os.makedirs(stg, exist_ok=True)
        os.makedirs(os.path.dirname(tgt), exist_ok=True)
        self.c.NodeStageVolume(self.pb.NodeStageVolumeRequest(
            volume_id=v, staging_target_path=stg, volume_capability=self.cap), timeout=60)
        self.c.NodePublishVolume(self.pb.NodePublishVolumeRequest(
            volume_id=v, staging_target_path=stg, target_path=tgt,
            volume_capability=self.cap), timeout=60)
        return tgt


def write(qsdctl, tgt, seed, nchunks):
    r = subprocess.run([qsdctl, "verify", "--write", "--seed", str(seed), "--chunks",
                        str(nchunks), "--chunk-size", str(CHUNK), "--timeout-ms", "20000",
                        "./vhost.sock"], cwd=tgt, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, "verify --write seed %d: %s %s" % (seed, r.stdout, r.stderr)
    return clusters(nchunks)


def run(env, qsdctl, client):
    c = env.start()
    pb = env.pb
    T = csilib.CALL_TIMEOUT
    node = Node(env, c)
    cbt = Cbt(client, env.sock)
    caps = c.GetPluginCapabilities(pb.GetPluginCapabilitiesRequest(), timeout=T)
    assert pb.PluginCapability.Service.SNAPSHOT_METADATA_SERVICE in \
        [x.service.type for x in caps.capabilities if x.HasField("service")], caps

    def create(name, src=None, params=None, size=SIZE):
        return c.CreateVolume(pb.CreateVolumeRequest(
            name=name, capacity_range=pb.CapacityRange(required_bytes=size),
            volume_capabilities=[node.cap], parameters=params or {},
            volume_content_source=src), timeout=T).volume.volume_id

    def snap(name, vol):
        return c.CreateSnapshot(pb.CreateSnapshotRequest(name=name, source_volume_id=vol),
                                timeout=T).snapshot.snapshot_id

    vol = create("pvc-a")
    tgt = node.up(vol)
    r1 = write(qsdctl, tgt, 1, 8)
    s1 = snap("s1", vol)
    r2 = write(qsdctl, tgt, 2, 5)
    s2 = snap("s2", vol)
    assert r2 - r1, "round 2 must touch clusters round 1 did not"

    a1, a2, d12 = cbt.call(s1), cbt.call(s2), cbt.call(s2, base=s1)
    assert a1["blocks"] == extents(r1), (a1, extents(r1))
    assert a2["blocks"] == extents(r1 | r2), (a2, extents(r1 | r2))
    assert d12["blocks"] == extents(r2), (d12, extents(r2))
    print("ok exact: allocated(s1) %d extents, allocated(s2) %d, delta(s1,s2) %d" %
          (len(a1["blocks"]), len(a2["blocks"]), len(d12["blocks"])))

    # paging
    p = cbt.call(s2, max_results=1)
    assert p["blocks"] == a2["blocks"] and p["max_per_message"] == 1 and \
        p["messages"] == len(a2["blocks"]), p
    full = a2["blocks"]
    k = len(full) // 2
    off = full[k][0] + full[k][1] - 1  # inside extent k
    p = cbt.call(s2, offset=off, max_results=2)
    assert p["max_per_message"] <= 2, p
    first = p["blocks"][0]
    assert first[0] <= off < first[0] + first[1] and first[0] + first[1] == full[k][0] + full[k][1], p
    assert p["blocks"][1:] == full[k + 1:], (p, full)
    gap = d12["blocks"][-2][0] + d12["blocks"][-2][1]  # after the last but one extent
    assert gap < d12["blocks"][-1][0]
    p = cbt.call(s2, base=s1, offset=gap)
    assert p["blocks"] == d12["blocks"][-1:], (p, d12)
    print("ok paging: one extent per message, starting_offset inside extent %d" % k)

    # a client that goes away mid-stream: 16384 one-extent messages (every
    # 4th cluster of 4 GiB zeroed by qemu-io into an unstaged volume's top
    # between z0 and z1) are more than HTTP/2's window and the plugin's
    # queue hold, so the walk is still running when grpcio cancels after the
    # first message
    zsize = 4 << 30
    zv = create("pvc-z", size=zsize)
    z0 = snap("z0", zv)
    cmds = []
    for i in range(0, zsize // CLUSTER, 4):
        cmds += ["-c", "write -z %d %d" % (i * CLUSTER, CLUSTER)]
    subprocess.run(["qemu-io", "-t", "unsafe", "-f", "qcow2", *cmds,
                    os.path.join(env.pool, "volumes", csilib.local_id(zv) + ".qcow2")],
                   check=True, stdout=subprocess.DEVNULL, timeout=120)
    z1 = snap("z1", zv)
    # its own channel without BDP probing: grpcio otherwise grows its
    # receive window with the bandwidth it measures, and on a fast machine
    # it took in two whole 16384-message streams (about 600 KB each) before
    # the cancel; at the fixed 64 KiB window a stalled stream cannot end
    # by itself
    stall_channel = csilib.grpc.insecure_channel(env.client.channel_target,
                                                 options=[("grpc.http2.bdp_probe", 0)])
    stream = stall_channel.unary_stream(
        "/csi.v1.SnapshotMetadata/GetMetadataDelta",
        request_serializer=pb.GetMetadataDeltaRequest.SerializeToString,
        response_deserializer=pb.GetMetadataDeltaResponse.FromString)
    # the same snapshot as base and target: one message, no blocks
    msgs = list(stream(pb.GetMetadataDeltaRequest(base_snapshot_id=z1, target_snapshot_id=z1),
                       timeout=T))
    assert len(msgs) == 1 and not msgs[0].block_metadata and \
        msgs[0].volume_capacity_bytes == zsize, msgs
    its = []
    for _ in range(8):  # the plugin's bound on streams in flight
        it = stream(pb.GetMetadataDeltaRequest(base_snapshot_id=z0, target_snapshot_id=z1,
                                               max_results=1), timeout=T)
        first = next(it)
        assert first.block_metadata_type == pb.VARIABLE_LENGTH and \
            [first.block_metadata[0].byte_offset, first.block_metadata[0].size_bytes] == \
            [0, CLUSTER], first
        its.append(it)
    cbt.refused("RESOURCE_EXHAUSTED", "in flight", z1, base=z0)
    for it in its:
        it.cancel()
    deadline = time.monotonic() + 10
    while True:
        tail = env.log_tail(400)
        cancelled = tail.count("GetMetadataDelta code=CANCELLED")
        whole = tail.count("GetMetadataDelta messages=16384")
        if cancelled + whole >= 8:
            break
        assert time.monotonic() < deadline, env.log_tail(40)
        time.sleep(0.1)
    assert whole == 0, "%d stalled stream(s) ran to their end before the cancel: " \
        "the client's window held them, so this did not test a cancel mid-stream" % whole
    stall_channel.close()
    dz = cbt.call(z1, base=z0, capacity=zsize)
    assert dz["blocks"] == [[i * CLUSTER, CLUSTER] for i in range(0, zsize // CLUSTER, 4)] \
        and dz["messages"] == 16, short(dz)
    # zero clusters are changes, not data: the delta lists them,
    # GetMetadataAllocated does not
    assert cbt.call(z1, capacity=zsize)["blocks"] == []
    # a layer whose header says corrupt: refused, the plugin serves on
    with open(os.path.join(env.pool, "snapshots", csilib.local_id(z1) + ".qcow2"), "r+b") as f:
        f.seek(79)
        b = f.read(1)[0]
        f.seek(79)
        f.write(bytes([b | 2]))
    cbt.refused("INTERNAL", "marked corrupt", z1)
    assert cbt.call(z0, capacity=zsize)["blocks"] == []
    # a header claiming more than the snapshot's size (the plugin would
    # read and keep that much L1 table): refused
    zf = os.path.join(env.pool, "snapshots", csilib.local_id(z0) + ".qcow2")
    real_len = os.path.getsize(zf)
    with open(zf, "r+b") as f:
        f.truncate(real_len + 65536)  # zeros where the longer L1 table ends
        real = f.read(40)
        f.seek(24)
        f.write((zsize * 4).to_bytes(8, "big"))
        f.seek(36)  # an L1 table said to cover it (the rest of its cluster is zeros)
        f.write((64).to_bytes(4, "big"))
    cbt.refused("INTERNAL", "claims", z0)
    with open(zf, "r+b") as f:
        f.write(real)
        f.truncate(real_len)
    assert cbt.call(z0, capacity=zsize)["blocks"] == []
    print("ok a client cancelling mid-stream; the next call answers")

    # merges: the live volume flattened between s3 and s4
    r3 = write(qsdctl, tgt, 3, 3)
    s3 = snap("s3", vol)
    r = subprocess.run([qsdctl, "--pool", env.pool, "--run-dir", env.run, "merge",
                        csilib.local_id(vol), "--depth", "1", "--timeout", "60"],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    r4 = write(qsdctl, tgt, 4, 7)
    s4 = snap("s4", vol)
    d34, d14 = cbt.call(s4, base=s3), cbt.call(s4, base=s1)
    assert r4 <= covered(d34["blocks"]), ("missing", sorted(r4 - covered(d34["blocks"])))
    assert r2 | r3 | r4 <= covered(d14["blocks"]), d14
    a4 = cbt.call(s4)
    assert a4["blocks"] == extents(r1 | r2 | r3 | r4), a4
    print("ok after a flatten: delta(s3,s4) covers round 4 (%d clusters for %d written), "
          "delta(s1,s4) covers rounds 2-4 (%d for %d)" %
          (len(covered(d34["blocks"])), len(r4), len(covered(d14["blocks"])), len(r2 | r3 | r4)))

    c.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=s2), timeout=T)
    d13 = cbt.call(s3, base=s1)
    assert d13["blocks"] == extents(r2 | r3), (d13, extents(r2 | r3))
    cbt.refused("NOT_FOUND", "s2", s3, base=s2)
    print("ok the middle snapshot deleted: delta(s1,s3) exactly rounds 2+3")

    # restores
    rv = create("pvc-r", src=pb.VolumeContentSource(
        snapshot=pb.VolumeContentSource.SnapshotSource(snapshot_id=s1)))
    rtgt = node.up(rv)
    r5 = write(qsdctl, rtgt, 5, 6)
    q1 = snap("q1", rv)
    r6 = write(qsdctl, rtgt, 6, 4)
    q2 = snap("q2", rv)
    assert cbt.call(q2, base=q1)["blocks"] == extents(r6)
    assert cbt.call(q1)["blocks"] == extents(r1 | r5)
    print("ok restored volume: delta exactly round 6, allocated rounds 1+5")

    # refusals
    cbt.refused("INVALID_ARGUMENT", "snapshot_id", "")
    cbt.refused("INVALID_ARGUMENT", "base_snapshot_id", s1, base="")
    cbt.refused("NOT_FOUND", "snapshot_id", "nosuch")
    cbt.refused("NOT_FOUND", "base_snapshot_id", s3, base="nosuch")
    cbt.refused("OUT_OF_RANGE", "starting_offset", s1, offset=SIZE)
    cbt.refused("OUT_OF_RANGE", "starting_offset", s1, offset=-1)
    cbt.refused("INVALID_ARGUMENT", "max_results", s1, max_results=-1)
    cbt.refused("INVALID_ARGUMENT", "different volumes", q2, base=s1)
    cbt.refused("INVALID_ARGUMENT", "taken after", s1, base=s3)
    cbt.refused("UNAVAILABLE", "node-9", "s1@node-9")
    cbt.refused("UNAVAILABLE", "node-9", s3, base="s1@node-9")
    cbt.refused("UNIMPLEMENTED", "RBD", "rbdsnap:c1:pool:ns:img-1", base="rbdsnap:c1:pool:ns:img-0")
    create("pvc-raw", params={"format": "raw"})
    w1, w2 = snap("w1", "pvc-raw"), snap("w2", "pvc-raw")
    cbt.refused("FAILED_PRECONDITION", "full copy", w2, base=w1)
    assert cbt.call(w1)["blocks"] == []
    # the same snapshot twice: nothing changed
    assert cbt.call(s3, base=s3)["blocks"] == []
    print("ok refusals and a raw volume's snapshots")
    log = env.log_tail(2000)
    assert "GetMetadataDelta code=OK" in log, log[-2000:]
    # exit 0 on SIGTERM: in the ASan build, no leak of the cancelled stream
    rc = env.stop()
    assert rc == 0, "plugin exit code %s" % rc
    print("ok plugin exits 0 on SIGTERM")


def main():
    qsdctl = sys.argv[3]
    client = cbt_client()
    env = csilib.Env(sys.argv[1], sys.argv[2], prefix="qsd-snapmeta-")
    try:
        run(env, qsdctl, client)
    finally:
        if sys.exc_info()[0] is not None:
            print("---- plugin log (tail)\n" + env.log_tail(80))
        env.cleanup()


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
