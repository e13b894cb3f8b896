# SPDX-License-Identifier: Apache-2.0
"""A hostile vhost-user front-end: raw messages on a vhost-user socket, as a
tenant holding its volume's socket could send them (issue 21).

Owns: the message layout (QEMU docs/interop/vhost-user.rst: a 12-byte header
u32 request, u32 flags (version 1, bit 2 reply, bit 3 need-reply), u32
payload size; then the payload; fds as SCM_RIGHTS on the header), guest
memory (a memfd mapped here and handed over by SET_MEM_TABLE), one split
virtqueue with enough code to submit a virtio-blk request (direct or through
an indirect descriptor table) and wait for its completion, and the checks a
test needs around an attack: did the server close the connection, does it
still serve an honest client, what a process holds (fds, RSS).

Every wait is bounded (timeouts in seconds on the socket and the eventfds).
Nothing here knows the plugin: the tests (test_vhost_attacks.py) and the
standalone reproducers (repro/) build on it."""
import ctypes
import errno
import mmap
import os
import select
import socket
import struct
import time

# ------------------------------------------------------------------ protocol
GET_FEATURES = 1
SET_FEATURES = 2
SET_OWNER = 3
RESET_OWNER = 4
SET_MEM_TABLE = 5
SET_LOG_BASE = 6
SET_LOG_FD = 7
SET_VRING_NUM = 8
SET_VRING_ADDR = 9
SET_VRING_BASE = 10
GET_VRING_BASE = 11
SET_VRING_KICK = 12
SET_VRING_CALL = 13
SET_VRING_ERR = 14
GET_PROTOCOL_FEATURES = 15
SET_PROTOCOL_FEATURES = 16
GET_QUEUE_NUM = 17
SET_VRING_ENABLE = 18
SET_BACKEND_REQ_FD = 21
GET_CONFIG = 24
SET_CONFIG = 25
POSTCOPY_ADVISE = 28
POSTCOPY_LISTEN = 29
POSTCOPY_END = 30
GET_INFLIGHT_FD = 31
SET_INFLIGHT_FD = 32
GET_MAX_MEM_SLOTS = 36
ADD_MEM_REG = 37

NAMES = {v: k for k, v in globals().items() if k.isupper() and isinstance(v, int)}

VERSION = 0x1
REPLY = 1 << 2
NEED_REPLY = 1 << 3
HDR = struct.Struct("<III")

# virtio / vhost-user feature bits
F_INDIRECT_DESC = 28
F_EVENT_IDX = 29
F_PROTOCOL_FEATURES = 30
F_VERSION_1 = 32
PF_MQ = 0
PF_REPLY_ACK = 3
PF_CONFIG = 9
PF_PAGEFAULT = 8
PF_INFLIGHT_SHMFD = 12

# virtio-blk
BLK_T_IN = 0
BLK_T_OUT = 1
BLK_T_GET_ID = 8
DESC_F_NEXT = 1
DESC_F_WRITE = 2
DESC_F_INDIRECT = 4

PAGE = 4096
MiB = 1 << 20


class Closed(Exception):
    """The back-end closed the connection (what an attack should get)."""


class Timeout(Exception):
    """The back-end did not answer within the bound."""


def feature_names(bits):
    return ",".join(str(b) for b in range(64) if bits >> b & 1)


class Conn:
    """One vhost-user connection.  send()/call() raise Closed when the peer
    closed it and Timeout after `timeout` seconds without an answer."""

    def __init__(self, path, timeout=5.0):
        self.path = path
        self.timeout = timeout
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        # relative names let a caller chdir into a directory whose path is
        # longer than a unix socket address
        self.sock.connect(path)
        self.features = 0
        self.protocol = 0
        self.received_fds = []

    def close(self):
        for fd in self.received_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.received_fds = []
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def peer_pid(self):
        cred = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                    struct.calcsize("3i"))
        return struct.unpack("3i", cred)[0]

    # ---------------------------------------------------------- raw I/O
    def send(self, req, payload=b"", fds=(), flags=0, size=None):
        """One message; size overrides the header's size field (a lie)."""
        hdr = HDR.pack(req, VERSION | flags, len(payload) if size is None else size)
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("%di" % len(fds), *fds))] \
            if fds else []
        try:
            self.sock.sendmsg([hdr + payload], anc)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise Closed("send %s: %s" % (NAMES.get(req, req), e))
        except socket.timeout:
            raise Timeout("send %s: socket full for %.0f s" % (NAMES.get(req, req),
                                                               self.timeout))

    def _recv_exact(self, n, fds):
        buf = b""
        deadline = time.monotonic() + self.timeout
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout("no reply within %.0f s" % self.timeout)
            self.sock.settimeout(left)
            try:
                data, anc, _, _ = self.sock.recvmsg(n - len(buf), socket.CMSG_SPACE(8 * 4))
            except socket.timeout:
                raise Timeout("no reply within %.0f s" % self.timeout)
            except ConnectionResetError as e:
                raise Closed(str(e))
            for level, typ, d in anc:
                if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                    got = list(struct.unpack("%di" % (len(d) // 4), d[:len(d) - len(d) % 4]))
                    fds.extend(got)
                    self.received_fds.extend(got)
            if not data:
                raise Closed("connection closed by the back-end")
            buf += data
        self.sock.settimeout(self.timeout)
        return buf

    def recv(self):
        """(request, flags, payload, fds) of the next message."""
        fds = []
        req, flags, size = HDR.unpack(self._recv_exact(HDR.size, fds))
        payload = self._recv_exact(size, fds) if size else b""
        return req, flags, payload, fds

    def call(self, req, payload=b"", fds=(), ack=False):
        """Send, then receive the reply (for requests that have one, or with
        ack=True, REPLY_ACK's u64).  Returns (payload, fds)."""
        self.send(req, payload, fds, NEED_REPLY if ack else 0)
        rreq, rflags, rp, rfds = self.recv()
        if rreq != req or not rflags & REPLY:
            raise Closed("reply to %s is request %d flags %#x" % (NAMES.get(req, req), rreq,
                                                                 rflags))
        return rp, rfds

    def u64(self, req):
        p, _ = self.call(req)
        return struct.unpack("<Q", p[:8])[0]

    def set_u64(self, req, v, fds=(), ack=None):
        """A u64 request; with REPLY_ACK negotiated the ack is checked (non-
        zero: the back-end refused)."""
        if ack is None:
            ack = bool(self.protocol >> PF_REPLY_ACK & 1)
        if not ack:
            self.send(req, struct.pack("<Q", v), fds)
            return 0
        p, _ = self.call(req, struct.pack("<Q", v), fds, ack=True)
        return struct.unpack("<Q", p[:8])[0] if len(p) >= 8 else -1

    def set_state(self, req, index, num, ack=None):
        if ack is None:
            ack = bool(self.protocol >> PF_REPLY_ACK & 1)
        p = struct.pack("<II", index, num)
        if not ack:
            self.send(req, p)
            return 0
        rp, _ = self.call(req, p, ack=True)
        return struct.unpack("<Q", rp[:8])[0] if len(rp) >= 8 else -1

    def sync(self):
        """A round trip (GET_FEATURES): every message sent before has been
        handled.  Raises Closed/Timeout."""
        return self.u64(GET_FEATURES)

    def closed_within(self, seconds):
        """True when the back-end closes the connection within `seconds`
        (a message it sends meanwhile is read and dropped)."""
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return False
            r, _, _ = select.select([self.sock], [], [], left)
            if not r:
                return False
            try:
                data = self.sock.recv(4096)
            except (ConnectionResetError, OSError):
                return True
            if not data:
                return True

    # ---------------------------------------------------------- handshake
    def negotiate(self, features=None, protocol=None):
        """GET_FEATURES, GET/SET_PROTOCOL_FEATURES, SET_OWNER, SET_FEATURES:
        what QEMU's front-end sends first.  features/protocol: the bits to
        take from what is offered (default: version 1 + protocol features +
        indirect descriptors; REPLY_ACK + CONFIG + MQ)."""
        offered = self.u64(GET_FEATURES)
        want = features if features is not None else \
            (1 << F_VERSION_1 | 1 << F_PROTOCOL_FEATURES | 1 << F_INDIRECT_DESC)
        self.features = offered & want
        self.offered = offered
        if self.features >> F_PROTOCOL_FEATURES & 1:
            self.offered_protocol = self.u64(GET_PROTOCOL_FEATURES)
            pwant = protocol if protocol is not None else \
                (1 << PF_REPLY_ACK | 1 << PF_CONFIG | 1 << PF_MQ)
            self.protocol = self.offered_protocol & pwant
            self.set_u64(SET_PROTOCOL_FEATURES, self.protocol, ack=False)
        self._plain(SET_OWNER)
        self.set_u64(SET_FEATURES, self.features)
        return self

    def _plain(self, req):
        if self.protocol >> PF_REPLY_ACK & 1:
            rp, _ = self.call(req, ack=True)
            return struct.unpack("<Q", rp[:8])[0] if len(rp) >= 8 else -1
        self.send(req)
        return 0

    def queue_num(self):
        return self.u64(GET_QUEUE_NUM)

    def config(self, size=60):
        p, _ = self.call(GET_CONFIG, struct.pack("<III", 0, size, 0) + b"\0" * size)
        return p[12:]

    def capacity(self):
        return struct.unpack("<Q", self.config()[:8])[0]


# ------------------------------------------------------------------ memory
class Memory:
    """Guest memory: a memfd of `size` bytes mapped here.  Addresses handed
    to the back-end are this process's virtual addresses, used both as guest
    physical and as front-end (QEMU) virtual addresses, as qsdctl does."""

    def __init__(self, size, name="vuattack"):
        self.size = size
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.used = 0

    def alloc(self, n, align=16):
        off = (self.used + align - 1) // align * align
        if off + n > self.size:
            raise MemoryError("guest memory of %d bytes is full" % self.size)
        self.used = off + n
        return off

    def addr(self, off):
        return self.base + off

    def write(self, off, data):
        self.map[off:off + len(data)] = data

    def read(self, off, n):
        return bytes(self.map[off:off + n])

    def region(self, gpa=None, offset=0, size=None):
        """A VhostUserMemoryRegion: gpa, size, uaddr, mmap_offset."""
        size = self.size - offset if size is None else size
        g = self.base + offset if gpa is None else gpa
        return struct.pack("<QQQQ", g, size, self.base + offset, offset)

    def close(self):
        # ctypes' from_buffer holds an export of the map: drop the address
        # only; the mapping goes with the process.
        try:
            os.close(self.fd)
        except OSError:
            pass


def mem_table(regions, nregions=None):
    """SET_MEM_TABLE payload: u32 nregions, u32 padding, regions."""
    n = len(regions) if nregions is None else nregions
    return struct.pack("<II", n, 0) + b"".join(regions)


# ------------------------------------------------------------------ virtqueue
class Queue:
    """A split virtqueue of `num` entries in guest memory, its kick and call
    eventfds."""

    def __init__(self, mem, index=0, num=16):
        self.mem, self.index, self.num = mem, index, num
        self.desc = mem.alloc(16 * num, PAGE)
        self.avail = mem.alloc(6 + 2 * num, 2)
        self.used = mem.alloc(6 + 8 * num, PAGE)
        self.kick = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self.call = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self.next_desc = 0
        self.avail_idx = 0
        self.used_seen = 0

    def setup(self, c, enable=True):
        """SET_VRING_NUM/BASE/ADDR/KICK/CALL(/ENABLE) for this queue."""
        c.set_state(SET_VRING_NUM, self.index, self.num)
        c.set_state(SET_VRING_BASE, self.index, 0)
        addr = struct.pack("<IIQQQQ", self.index, 0, self.mem.addr(self.desc),
                           self.mem.addr(self.used), self.mem.addr(self.avail), 0)
        if c.protocol >> PF_REPLY_ACK & 1:
            c.call(SET_VRING_ADDR, addr, ack=True)
        else:
            c.send(SET_VRING_ADDR, addr)
        c.set_u64(SET_VRING_KICK, self.index, [self.kick])
        c.set_u64(SET_VRING_CALL, self.index, [self.call])
        if enable and c.features >> F_PROTOCOL_FEATURES & 1:
            c.set_state(SET_VRING_ENABLE, self.index, 1)

    def put_desc(self, addr, length, flags, nxt=0, table=None, i=None):
        """Write one descriptor (into the ring's table, or into an indirect
        table at guest offset `table`)."""
        if table is None:
            i = self.next_desc % self.num
            self.next_desc += 1
            off = self.desc + 16 * i
        else:
            off = table + 16 * i
        self.mem.write(off, struct.pack("<QIHH", addr, length, flags, nxt))
        return i

    def publish(self, head):
        self.mem.write(self.avail + 4 + 2 * (self.avail_idx % self.num),
                       struct.pack("<H", head))
        self.avail_idx = (self.avail_idx + 1) & 0xffff
        self.mem.write(self.avail + 2, struct.pack("<H", self.avail_idx))
        os.eventfd_write(self.kick, 1)

    def used_idx(self):
        return struct.unpack("<H", self.mem.read(self.used + 2, 2))[0]

    def wait_used(self, timeout):
        """True when the used index moved past what we saw, within timeout."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.used_idx() != self.used_seen:
                self.used_seen = self.used_idx()
                return True
            select.select([self.call], [], [], min(0.05, max(0, end - time.monotonic())))
            try:
                os.eventfd_read(self.call)
            except BlockingIOError:
                pass
        return False

    def close(self):
        for fd in (self.kick, self.call):
            try:
                os.close(fd)
            except OSError:
                pass


def blk_request(q, btype=BLK_T_IN, sector=0, length=512, indirect=False, table_off=None,
                data_off=None):
    """Submit one virtio-blk request: header (out), data (in for a read or
    GET_ID, out for a write), status (in).  indirect: the three descriptors
    go in an indirect table at guest offset table_off (allocated when None).
    Returns (data offset, status offset) in guest memory."""
    mem = q.mem
    hdr = mem.alloc(16)
    mem.write(hdr, struct.pack("<IIQ", btype, 0, sector))
    data = mem.alloc(length, 512) if data_off is None else data_off
    status = mem.alloc(1)
    mem.write(status, b"\xff")
    dflag = 0 if btype == BLK_T_OUT else DESC_F_WRITE
    chain = [(mem.addr(hdr), 16, 0), (mem.addr(data), length, dflag),
             (mem.addr(status), 1, DESC_F_WRITE)]
    if indirect:
        table = mem.alloc(16 * 3) if table_off is None else table_off
        for i, (a, n, f) in enumerate(chain):
            last = i == len(chain) - 1
            q.put_desc(a, n, f | (0 if last else DESC_F_NEXT), 0 if last else i + 1,
                       table=table, i=i)
        head = q.put_desc(mem.addr(table), 16 * 3, DESC_F_INDIRECT)
    else:
        ids = [(q.next_desc + k) % q.num for k in range(3)]
        head = ids[0]
        for k, (a, n, f) in enumerate(chain):
            last = k == len(chain) - 1
            q.put_desc(a, n, f | (0 if last else DESC_F_NEXT), 0 if last else ids[k + 1])
    q.publish(head)
    return data, status


def setup_device(c, mem_size=4 * MiB, qnum=16):
    """negotiate + one region of guest memory + queue 0: an honest front-end
    up to the point where it can submit requests.  Returns (mem, queue)."""
    c.negotiate()
    mem = Memory(mem_size)
    q = Queue(mem, 0, qnum)
    payload = mem_table([mem.region()])
    if c.protocol >> PF_REPLY_ACK & 1:
        c.call(SET_MEM_TABLE, payload, [mem.fd], ack=True)
    else:
        c.send(SET_MEM_TABLE, payload, [mem.fd])
    q.setup(c)
    return mem, q


def serves(path, timeout=5.0, sector=0):
    """An honest client: connect, set up, read one sector.  Returns (ok,
    text)."""
    try:
        with Conn(path, timeout) as c:
            mem, q = setup_device(c)
            try:
                data, status = blk_request(q, BLK_T_IN, sector, 512)
                if not q.wait_used(timeout):
                    return False, "a 512-byte read got no completion within %.0f s" % timeout
                st = mem.read(status, 1)[0]
                if st != 0:
                    return False, "a 512-byte read completed with status %d" % st
                return True, "read 512 bytes (pid %d)" % c.peer_pid()
            finally:
                q.close()
                mem.close()
    except (Closed, Timeout, OSError) as e:
        return False, "%s: %s" % (type(e).__name__, e)


def serves_within(path, seconds, timeout=3.0):
    """serves(), retried until it works or `seconds` pass (a restarting
    back-end, a previous client still being torn down)."""
    end = time.monotonic() + seconds
    while True:
        ok, why = serves(path, timeout)
        if ok or time.monotonic() >= end:
            return ok, why
        time.sleep(0.2)


# ------------------------------------------------------------------ process facts
def proc_fds(pid):
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return -1


def proc_rss(pid):
    """Resident set + its shmem (memfd pages mapped) in bytes, or -1."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return -1


def proc_alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def err_name(e):
    return errno.errorcode.get(e, str(e))


__all__ = ["Conn", "Memory", "Queue", "Closed", "Timeout", "mem_table", "blk_request",
           "setup_device", "serves", "serves_within", "proc_fds", "proc_rss", "proc_alive"]
