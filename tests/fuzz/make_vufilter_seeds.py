#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Write the seed corpus of fuzz_vufilter (rewrites corpus/fuzz_vufilter/seed-*):
a QEMU-like session with the QSD's replies, a back-end channel exchange, and
a few attacks.  Record format: see fuzz_vufilter.c."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
T, Q, TB, QB = 0, 1, 2, 3  # tenant/QSD on the main and back-end channels
UVA = 0x7F0000000000


def rec(who, req, payload=b"", flags=1, nfds=0):
    return bytes([who, nfds]) + struct.pack("<III", req, flags, len(payload)) + payload


def u64(v):
    return struct.pack("<Q", v)


def region(gpa, size, uva):
    return struct.pack("<QQQQ", gpa, size, uva, 0)


def session():
    s = [rec(T, 1), rec(Q, 1, u64(0x175007E46), 5),
         rec(T, 15), rec(Q, 15, u64(0x8F2B), 5),
         rec(T, 16, u64(0x8229), 9), rec(Q, 16, u64(0), 5),
         rec(T, 17), rec(Q, 17, u64(2), 5),
         rec(T, 36), rec(Q, 36, u64(32), 5),
         rec(T, 21, b"", 9, 1), rec(Q, 21, u64(0), 5),
         rec(T, 3), rec(T, 2, u64(0x171000E46)),
         rec(T, 24, struct.pack("<III", 0, 60, 0) + bytes(60)),
         rec(Q, 24, struct.pack("<III", 0, 60, 0) + bytes(60), 5),
         rec(T, 37, u64(0) + region(0, 0xA0000, UVA), nfds=1),
         rec(T, 37, u64(0) + region(0xC0000, 0x7FF40000, UVA + 0xC0000), nfds=1)]
    for q in range(2):
        base = UVA + 0x100000 + q * 0x10000
        s += [rec(T, 8, struct.pack("<II", q, 256)), rec(T, 10, struct.pack("<II", q, 0)),
              rec(T, 9, struct.pack("<IIQQQQ", q, 0, base, base + 0x2000, base + 0x1000, 0)),
              rec(T, 12, u64(q), nfds=1), rec(T, 13, u64(q), nfds=1),
              rec(T, 18, struct.pack("<II", q, 1))]
    s += [rec(T, 25, struct.pack("<III", 32, 1, 0) + b"\x01"),
          rec(QB, 2, b"", 9), rec(TB, 2, u64(0), 5),
          rec(T, 11, struct.pack("<II", 0, 0)), rec(Q, 11, struct.pack("<II", 0, 7), 5)]
    return b"".join(s)


def main():
    d = os.path.join(HERE, "corpus", "fuzz_vufilter")
    os.makedirs(d, exist_ok=True)
    seeds = [
        b"\x01" + session(),
        b"\x81" + session(),
        b"\x01" + rec(T, 5, struct.pack("<II", 2, 0) + region(0, 1 << 20, UVA)
                      + region(1 << 20, 1 << 20, UVA + (1 << 24)), nfds=2),
        b"\x00" + rec(T, 8, struct.pack("<II", 5, 128)) + rec(T, 28) + rec(T, 32, bytes(24), nfds=1),
        b"\x01" + rec(T, 5, struct.pack("<II", 1, 0) + region(0, 1 << 20, UVA), nfds=1)
        + rec(T, 8, struct.pack("<II", 0, 1024))
        + rec(T, 9, struct.pack("<IIQQQQ", 0, 0, UVA + (1 << 20) - 4096, UVA, UVA + 4096, 0)),
    ]
    for i, blob in enumerate(seeds):
        with open(os.path.join(d, f"seed-{i}"), "wb") as f:
            f.write(blob)


if __name__ == "__main__":
    main()
