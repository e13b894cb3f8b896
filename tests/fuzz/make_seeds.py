#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Write the seed corpora of the fuzzers (run from anywhere; rewrites
corpus/*/seed-*).  HTTP/2 frames are built by hand: HPACK literals without
indexing, so no Huffman or dynamic table is needed."""
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def frame(ftype, flags, stream, payload):
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, ftype, flags, stream) + payload


def hpack_literal(name, value):
    out = b"\x00"
    for s in (name, value):
        s = s.encode()
        assert len(s) < 127
        out += bytes([len(s)]) + s
    return out


def headers(stream, path, end_stream=False, extra=()):
    block = b"".join(hpack_literal(k, v) for k, v in [
        (":method", "POST"), (":scheme", "http"), (":path", path),
        (":authority", "localhost"), ("content-type", "application/grpc"),
        ("te", "trailers")] + list(extra))
    return frame(1, 0x4 | (0x1 if end_stream else 0), stream, block)


def grpc_msg(payload, flag=0):
    return bytes([flag]) + struct.pack(">I", len(payload)) + payload


def data(stream, payload, end_stream=True):
    return frame(0, 0x1 if end_stream else 0, stream, payload)


SETTINGS = frame(4, 0, 0, b"")


def write(name, i, blob):
    d = os.path.join(HERE, "corpus", name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-%02d" % i), "wb") as f:
        f.write(blob)


def main():
    # Session seeds: first byte 0 = "prepend the preface, feed in 1-byte chunks";
    # 0xfc = preface, 64-byte chunks.
    seeds = [
        SETTINGS + headers(1, "/f.F/Echo") + data(1, grpc_msg(b"hello")),
        SETTINGS + headers(1, "/f.F/Later", extra=[("grpc-timeout", "100m")])
        + data(1, grpc_msg(b"x")) + headers(3, "/f.F/Fail") + data(3, grpc_msg(b"y")),
        SETTINGS + headers(1, "/no.Such/Method", end_stream=True),
        SETTINGS + headers(1, "/f.F/Echo") + data(1, grpc_msg(b"a" * 100), end_stream=False)
        + frame(3, 0, 1, struct.pack(">I", 8)),  # RST_STREAM CANCEL
        SETTINGS + frame(6, 0, 0, b"12345678") + frame(7, 0, 0, struct.pack(">II", 0, 0)),
        SETTINGS + frame(8, 0, 0, struct.pack(">I", 1000)) + headers(1, "/f.F/Echo")
        + data(1, grpc_msg(b"z" * 5000)),
    ]
    for i, s in enumerate(seeds):
        write("fuzz_grpc_session", 2 * i, b"\x00" + s)
        write("fuzz_grpc_session", 2 * i + 1, b"\xfe" + s)

    # Decode seeds: type byte + a serialized request (built with protoc's
    # python output when available, else a few hand-encoded ones).
    hand = [
        (3, b"\x0a\x04pvc1\x12\x04\x08\x80\x80\x04\x1a\x06\x0a\x00\x1a\x02\x08\x01"
            b"\x22\x0c\x0a\x04type\x12\x04raw"),  # CreateVolumeRequest
        (16, b"\x0a\x04pvc1\x1a\x09/var/stag\x22\x04\x0a\x00\x1a\x00"),  # NodeStageVolume
        (18, b"\x0a\x04pvc1\x1a\x02/s\x22\x02/t\x2a\x02\x0a\x00\x30\x01"),  # NodePublish
        (14, b"\x0a\x04pvc1\x12\x04\x08\x80\x80\x08"),  # ControllerExpandVolume
        (13, b"\x08\x0a\x12\x02t1\x1a\x04pvc1"),  # ListSnapshots
        (0, b""),
    ]
    for i, (t, blob) in enumerate(hand):
        write("fuzz_csi_decode", i, bytes([t]) + blob)


if __name__ == "__main__":
    main()
