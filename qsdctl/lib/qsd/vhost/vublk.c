/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/vhost/vublk.c: vhost-user-blk front-end (see vublk.h). */
#include "qsd/vhost/vublk.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "qsd/base/util.h"
#include "qsd/vhost/vhost_user.h"
#include "qsd/vhost/virtqueue.h"

#define PAGE 4096u
#define ALIGN_UP(x, a) (((x) + (a)-1) & ~((size_t)(a)-1))

/* Per-request memory the device reads or writes besides the data. */
struct vublk_slot {
    struct {
        uint32_t type;
        uint32_t ioprio;
        uint64_t sector;
    } hdr;
    struct {
        uint64_t sector;
        uint32_t num_sectors;
        uint32_t flags;
    } seg; /* discard / write-zeroes range */
    uint8_t status;
    uint8_t pad[31];
    /* not shared with the device, but kept here for simplicity */
    void *opaque;
};

struct vublk_queue {
    struct virtqueue vq;
    int kick_fd, call_fd;
    struct vublk_slot *slots;
    uint16_t *free_slots; /* stack */
    uint16_t nfree;
};

struct vublk {
    int sock;
    int backend_fd; /* our end of the back-end request channel, or -1 */
    int timeout_ms;
    int peer_pid;
    uint64_t features, protocol_features;
    struct vublk_config cfg;
    unsigned nq;
    uint16_t qsize;
    int memfd;
    uint8_t *mem;
    size_t mem_size;
    uint8_t *data;
    size_t data_size, data_used;
    struct vublk_queue *q;
    vublk_config_cb config_cb;
    void *config_opaque;
    unsigned config_changes;
    struct vublk_stats stats;
};

/* ---- config space ---------------------------------------------------- */

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t le32(const uint8_t *p) { return (uint32_t)le16(p) | (uint32_t)le16(p + 2) << 16; }
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

int vublk_config_decode(const uint8_t *raw, size_t len, uint64_t features,
                        struct vublk_config *ret)
{
    if (len < VIRTIO_BLK_CONFIG_SIZE)
        return -EINVAL;
#define HAS(b) (features & (1ull << (b)))
    struct vublk_config c = {
        .capacity_sectors = le64(raw + 0),
        .size_max = HAS(VIRTIO_BLK_F_SIZE_MAX) ? le32(raw + 8) : 0,
        .seg_max = HAS(VIRTIO_BLK_F_SEG_MAX) ? le32(raw + 12) : 0,
        .blk_size = HAS(VIRTIO_BLK_F_BLK_SIZE) ? le32(raw + 20) : VIRTIO_BLK_SECTOR,
        .physical_block_exp = HAS(VIRTIO_BLK_F_TOPOLOGY) ? raw[24] : 0,
        .opt_io_size = HAS(VIRTIO_BLK_F_TOPOLOGY) ? le32(raw + 28) : 0,
        .writeback = HAS(VIRTIO_BLK_F_CONFIG_WCE) ? raw[32] : 0,
        .num_queues = HAS(VIRTIO_BLK_F_MQ) ? le16(raw + 34) : 1,
        .max_discard_sectors = HAS(VIRTIO_BLK_F_DISCARD) ? le32(raw + 36) : 0,
        .max_discard_seg = HAS(VIRTIO_BLK_F_DISCARD) ? le32(raw + 40) : 0,
        .max_write_zeroes_sectors = HAS(VIRTIO_BLK_F_WRITE_ZEROES) ? le32(raw + 48) : 0,
        .max_write_zeroes_seg = HAS(VIRTIO_BLK_F_WRITE_ZEROES) ? le32(raw + 52) : 0,
        .write_zeroes_may_unmap = HAS(VIRTIO_BLK_F_WRITE_ZEROES) ? raw[56] : 0,
    };
#undef HAS
    if (c.blk_size < VIRTIO_BLK_SECTOR || (c.blk_size & (c.blk_size - 1)))
        return -EPROTO;
    if (c.num_queues == 0)
        c.num_queues = 1;
    *ret = c;
    return 0;
}

/* ---- protocol exchanges ------------------------------------------------ */

static bool has_proto(const struct vublk *d, unsigned bit)
{
    return d->protocol_features & (1ull << bit);
}

/* Send a request; when want_reply, receive and check the reply into *reply.
 * For requests without a natural reply, ask for REPLY_ACK when negotiated
 * and check it: that way every setup step is confirmed in order. */
static int vu_exchange(struct vublk *d, uint32_t req, const void *payload, uint32_t size,
                       const int *fds, unsigned nfds, struct vhost_user_msg *reply,
                       uint32_t reply_size)
{
    struct vhost_user_msg m;
    bool ack = !reply && has_proto(d, VHOST_USER_PROTOCOL_F_REPLY_ACK);
    int r = vhost_user_msg_init(&m, req, ack ? VHOST_USER_NEED_REPLY_MASK : 0, payload, size);
    if (r < 0)
        return r;
    if (nfds)
        memcpy(m.fds, fds, nfds * sizeof(int));
    m.nfds = nfds;
    r = vhost_user_send(d->sock, &m, d->timeout_ms);
    if (r < 0)
        return r;
    if (!reply && !ack)
        return 0;
    struct vhost_user_msg tmp, *rep = reply ? reply : &tmp;
    r = vhost_user_recv(d->sock, rep, d->timeout_ms);
    if (r < 0)
        return r;
    vhost_user_msg_close_fds(rep); /* none of our replies carry fds */
    r = vhost_user_check_reply(&rep->hdr, req, reply ? reply_size : sizeof(uint64_t));
    if (r < 0)
        return r;
    if (!reply && rep->p.u64 != 0)
        return -EIO;
    return 0;
}

static int vu_get_u64(struct vublk *d, uint32_t req, uint64_t *ret)
{
    struct vhost_user_msg rep;
    int r = vu_exchange(d, req, NULL, 0, NULL, 0, &rep, sizeof(uint64_t));
    if (r < 0)
        return r;
    *ret = rep.p.u64;
    return 0;
}

static int vu_set_u64(struct vublk *d, uint32_t req, uint64_t v, int fd)
{
    return vu_exchange(d, req, &v, sizeof(v), &fd, fd >= 0 ? 1 : 0, NULL, 0);
}

static int vu_set_state(struct vublk *d, uint32_t req, uint32_t index, uint32_t num)
{
    struct vhost_vring_state s = {.index = index, .num = num};
    return vu_exchange(d, req, &s, sizeof(s), NULL, 0, NULL, 0);
}

int vublk_refresh_config(struct vublk *d)
{
    struct {
        struct vhost_user_config_hdr h;
        uint8_t data[VIRTIO_BLK_CONFIG_SIZE];
    } __attribute__((packed)) req = {.h = {.offset = 0, .size = VIRTIO_BLK_CONFIG_SIZE}};
    struct vhost_user_msg rep;
    int r = vu_exchange(d, VHOST_USER_GET_CONFIG, &req, sizeof(req), NULL, 0, &rep, 0);
    if (r < 0)
        return r;
    /* A back-end that fails GET_CONFIG answers with size 0. */
    if (rep.hdr.size != sizeof(req) || rep.p.cfg.size != VIRTIO_BLK_CONFIG_SIZE)
        return -EIO;
    struct vublk_config c;
    r = vublk_config_decode(rep.p.cfg_data, VIRTIO_BLK_CONFIG_SIZE, d->features, &c);
    if (r < 0)
        return r;
    d->cfg = c;
    return 0;
}

/* ---- connect ------------------------------------------------------------ */

void vublk_free(struct vublk *d)
{
    if (!d)
        return;
    if (d->sock >= 0)
        close(d->sock);
    if (d->backend_fd >= 0)
        close(d->backend_fd);
    if (d->q) {
        for (unsigned i = 0; i < d->nq; i++) {
            vq_destroy(&d->q[i].vq);
            free(d->q[i].free_slots);
            if (d->q[i].kick_fd >= 0)
                close(d->q[i].kick_fd);
            if (d->q[i].call_fd >= 0)
                close(d->q[i].call_fd);
        }
        free(d->q);
    }
    if (d->mem)
        munmap(d->mem, d->mem_size);
    if (d->memfd >= 0)
        close(d->memfd);
    free(d);
}

static void vublkp(struct vublk **d) { vublk_free(*d); }

/* The features we can use; everything else offered is declined. */
static const uint64_t wanted_features =
    1ull << VIRTIO_F_VERSION_1 | 1ull << VIRTIO_RING_F_EVENT_IDX |
    1ull << VHOST_USER_F_PROTOCOL_FEATURES | 1ull << VIRTIO_BLK_F_SIZE_MAX |
    1ull << VIRTIO_BLK_F_SEG_MAX | 1ull << VIRTIO_BLK_F_RO | 1ull << VIRTIO_BLK_F_BLK_SIZE |
    1ull << VIRTIO_BLK_F_FLUSH | 1ull << VIRTIO_BLK_F_TOPOLOGY |
    1ull << VIRTIO_BLK_F_CONFIG_WCE | 1ull << VIRTIO_BLK_F_MQ |
    1ull << VIRTIO_BLK_F_DISCARD | 1ull << VIRTIO_BLK_F_WRITE_ZEROES;

static const uint64_t wanted_protocol =
    1ull << VHOST_USER_PROTOCOL_F_MQ | 1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK |
    1ull << VHOST_USER_PROTOCOL_F_BACKEND_REQ | 1ull << VHOST_USER_PROTOCOL_F_CONFIG;

static int setup_memory(struct vublk *d, size_t data_size)
{
    size_t ring = ALIGN_UP(vq_ring_size(d->qsize), PAGE);
    size_t slots = ALIGN_UP(sizeof(struct vublk_slot) * d->qsize, PAGE);
    size_t data_off = (ring + slots) * d->nq;
    d->data_size = ALIGN_UP(data_size, PAGE);
    d->mem_size = data_off + d->data_size;
    d->memfd = memfd_create("qsdctl-vublk", MFD_CLOEXEC);
    if (d->memfd < 0)
        return -errno;
    if (ftruncate(d->memfd, (off_t)d->mem_size) < 0)
        return -errno;
    void *p = mmap(NULL, d->mem_size, PROT_READ | PROT_WRITE, MAP_SHARED, d->memfd, 0);
    if (p == MAP_FAILED)
        return -errno;
    d->mem = p; /* memfd pages read as zero: no uninitialised ring memory */
    d->data = d->mem + data_off;

    d->q = xcalloc(d->nq, sizeof(*d->q));
    for (unsigned i = 0; i < d->nq; i++) {
        d->q[i].kick_fd = d->q[i].call_fd = -1;
    }
    for (unsigned i = 0; i < d->nq; i++) {
        struct vublk_queue *q = &d->q[i];
        uint8_t *base = d->mem + (ring + slots) * i;
        int r = vq_init(&q->vq, base, d->qsize,
                        d->features & (1ull << VIRTIO_RING_F_EVENT_IDX));
        if (r < 0)
            return r;
        q->slots = (struct vublk_slot *)(base + ring);
        q->free_slots = xcalloc(d->qsize, sizeof(uint16_t));
        for (uint16_t s = 0; s < d->qsize; s++)
            q->free_slots[s] = (uint16_t)(d->qsize - 1 - s);
        q->nfree = d->qsize;
        q->kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        q->call_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (q->kick_fd < 0 || q->call_fd < 0)
            return -errno;
    }
    return 0;
}

static int setup_queue(struct vublk *d, unsigned i)
{
    struct vublk_queue *q = &d->q[i];
    int r = vu_set_state(d, VHOST_USER_SET_VRING_NUM, i, d->qsize);
    if (r < 0)
        return r;
    r = vu_set_state(d, VHOST_USER_SET_VRING_BASE, i, 0);
    if (r < 0)
        return r;
    struct vhost_vring_addr a = {
        .index = i,
        .desc_user_addr = (uintptr_t)q->vq.desc,
        .used_user_addr = (uintptr_t)q->vq.used,
        .avail_user_addr = (uintptr_t)q->vq.avail,
    };
    r = vu_exchange(d, VHOST_USER_SET_VRING_ADDR, &a, sizeof(a), NULL, 0, NULL, 0);
    if (r < 0)
        return r;
    r = vu_set_u64(d, VHOST_USER_SET_VRING_KICK, i, q->kick_fd);
    if (r < 0)
        return r;
    r = vu_set_u64(d, VHOST_USER_SET_VRING_CALL, i, q->call_fd);
    if (r < 0)
        return r;
    if (d->features & (1ull << VHOST_USER_F_PROTOCOL_FEATURES))
        r = vu_set_state(d, VHOST_USER_SET_VRING_ENABLE, i, 1);
    return r;
}

int vublk_connect(const char *path, const struct vublk_opts *opts, struct vublk **ret)
{
    struct vublk_opts o = opts ? *opts : (struct vublk_opts){0};
    _cleanup_(vublkp) struct vublk *d = xcalloc(1, sizeof(*d));
    d->sock = d->backend_fd = d->memfd = -1;
    d->peer_pid = -1;
    d->timeout_ms = o.timeout_ms > 0 ? o.timeout_ms : 5000;
    d->qsize = o.queue_size ? o.queue_size : 128;
    if (d->qsize & (d->qsize - 1) || d->qsize > 1024)
        return -EINVAL;

    /* Non-blocking: a unix connect to a dead socket fails at once
     * (ECONNREFUSED), one whose backlog is full fails with EAGAIN instead of
     * blocking; a live server that does not answer (QSD serves one client at
     * a time) is caught by the reply timeouts.  All our I/O on the socket
     * waits with poll() and a bound. */
    int r = unix_connect(path, true, &d->sock);
    if (r == -EAGAIN)
        return -EBUSY;
    if (r < 0)
        return r;
    struct ucred cred;
    socklen_t cl = sizeof(cred);
    if (getsockopt(d->sock, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0)
        d->peer_pid = cred.pid;

    uint64_t offered;
    r = vu_get_u64(d, VHOST_USER_GET_FEATURES, &offered);
    if (r < 0)
        return r;
    if (!(offered & (1ull << VIRTIO_F_VERSION_1)))
        return -ENOTSUP;
    d->features = offered & wanted_features;

    if (d->features & (1ull << VHOST_USER_F_PROTOCOL_FEATURES)) {
        uint64_t pf;
        r = vu_get_u64(d, VHOST_USER_GET_PROTOCOL_FEATURES, &pf);
        if (r < 0)
            return r;
        pf &= wanted_protocol;
        r = vu_set_u64(d, VHOST_USER_SET_PROTOCOL_FEATURES, pf, -1);
        if (r < 0)
            return r;
        d->protocol_features = pf; /* REPLY_ACK applies from here on */
    }
    if (!has_proto(d, VHOST_USER_PROTOCOL_F_CONFIG))
        return -ENOTSUP;

    r = vu_exchange(d, VHOST_USER_SET_OWNER, NULL, 0, NULL, 0, NULL, 0);
    if (r < 0)
        return r;

    if (has_proto(d, VHOST_USER_PROTOCOL_F_BACKEND_REQ)) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
            return -errno;
        d->backend_fd = sv[0];
        r = vu_exchange(d, VHOST_USER_SET_BACKEND_REQ_FD, NULL, 0, &sv[1], 1, NULL, 0);
        close(sv[1]);
        if (r < 0)
            return r;
    }

    r = vu_set_u64(d, VHOST_USER_SET_FEATURES, d->features, -1);
    if (r < 0)
        return r;
    r = vublk_refresh_config(d);
    if (r < 0)
        return r;

    unsigned want = o.num_queues ? o.num_queues : 1;
    d->nq = MIN(want, (unsigned)d->cfg.num_queues);
    r = setup_memory(d, o.data_size ? o.data_size : 8u << 20);
    if (r < 0)
        return r;

    struct vhost_user_mem_table mt = {
        .nregions = 1,
        .regions[0] = {
            .guest_phys_addr = (uintptr_t)d->mem,
            .memory_size = d->mem_size,
            .userspace_addr = (uintptr_t)d->mem,
            .mmap_offset = 0,
        },
    };
    r = vu_exchange(d, VHOST_USER_SET_MEM_TABLE, &mt,
                    (uint32_t)(8 + sizeof(struct vhost_user_mem_region)), &d->memfd, 1, NULL, 0);
    if (r < 0)
        return r;
    for (unsigned i = 0; i < d->nq; i++) {
        r = setup_queue(d, i);
        if (r < 0)
            return r;
    }
    *ret = TAKE_PTR(d);
    return 0;
}

/* ---- accessors ------------------------------------------------------------ */

const struct vublk_config *vublk_config(const struct vublk *d) { return &d->cfg; }
uint64_t vublk_capacity(const struct vublk *d)
{
    return d->cfg.capacity_sectors * VIRTIO_BLK_SECTOR;
}
uint64_t vublk_features(const struct vublk *d) { return d->features; }
bool vublk_has_feature(const struct vublk *d, unsigned bit)
{
    return d->features & (1ull << bit);
}
bool vublk_read_only(const struct vublk *d) { return vublk_has_feature(d, VIRTIO_BLK_F_RO); }
unsigned vublk_num_queues(const struct vublk *d) { return d->nq; }
uint16_t vublk_queue_size(const struct vublk *d) { return d->qsize; }
int vublk_peer_pid(const struct vublk *d) { return d->peer_pid; }
unsigned vublk_config_changes(const struct vublk *d) { return d->config_changes; }
unsigned vublk_inflight(const struct vublk *d, unsigned q)
{
    return (unsigned)(d->qsize - d->q[q].nfree);
}

bool vublk_has_completions(const struct vublk *d, unsigned q)
{
    return vq_has_used(&d->q[q].vq);
}

void vublk_set_config_cb(struct vublk *d, vublk_config_cb cb, void *opaque)
{
    d->config_cb = cb;
    d->config_opaque = opaque;
}

void *vublk_alloc(struct vublk *d, size_t len)
{
    size_t n = ALIGN_UP(len ? len : 1, PAGE);
    if (n > d->data_size - d->data_used)
        return NULL;
    void *p = d->data + d->data_used;
    d->data_used += n;
    return p;
}

void vublk_alloc_reset(struct vublk *d) { d->data_used = 0; }

/* ---- back-end request channel -------------------------------------------- */

static int handle_backend_msg(struct vublk *d, struct vhost_user_msg *m)
{
    int r = 0;
    vhost_user_msg_close_fds(m);
    if (m->hdr.request == VHOST_USER_BACKEND_CONFIG_CHANGE_MSG) {
        d->config_changes++;
        r = vublk_refresh_config(d);
        if (r == 0 && d->config_cb)
            d->config_cb(d, d->config_opaque);
    } else {
        r = -ENOTSUP; /* nothing else was negotiated */
    }
    if (m->hdr.flags & VHOST_USER_NEED_REPLY_MASK) {
        struct vhost_user_msg rep;
        uint64_t v = r < 0 ? 1 : 0;
        vhost_user_msg_init(&rep, m->hdr.request, VHOST_USER_REPLY_MASK, &v, sizeof(v));
        int s = vhost_user_send(d->backend_fd, &rep, d->timeout_ms);
        if (s < 0)
            return s;
    }
    return r == -ENOTSUP ? 0 : r;
}

int vublk_process_backend(struct vublk *d, int timeout_ms)
{
    if (d->backend_fd < 0)
        return 0;
    for (int wait = timeout_ms;; wait = 0) {
        struct pollfd p = {.fd = d->backend_fd, .events = POLLIN};
        int n = poll(&p, 1, wait);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return 0;
        struct vhost_user_msg m;
        int r = vhost_user_recv(d->backend_fd, &m, d->timeout_ms);
        if (r < 0)
            return r;
        r = handle_backend_msg(d, &m);
        if (r < 0)
            return r;
    }
}

/* ---- requests ------------------------------------------------------------- */

int vublk_submit(struct vublk *d, unsigned qi, const struct vublk_io *io)
{
    if (qi >= d->nq)
        return -EINVAL;
    struct vublk_queue *q = &d->q[qi];
    if (q->nfree == 0)
        return -ENOSPC;
    uint16_t s = q->free_slots[q->nfree - 1];
    struct vublk_slot *slot = &q->slots[s];
    slot->hdr.type = io->type;
    slot->hdr.ioprio = 0;
    slot->hdr.sector = io->sector;
    slot->status = 0xff;
    slot->opaque = io->opaque;

    struct vq_buf bufs[3];
    unsigned n = 0;
    bufs[n++] = (struct vq_buf){(uintptr_t)&slot->hdr, sizeof(slot->hdr), false};
    switch (io->type) {
    case VIRTIO_BLK_T_IN:
    case VIRTIO_BLK_T_GET_ID:
        bufs[n++] = (struct vq_buf){(uintptr_t)io->buf, io->len, true};
        break;
    case VIRTIO_BLK_T_OUT:
        bufs[n++] = (struct vq_buf){(uintptr_t)io->buf, io->len, false};
        break;
    case VIRTIO_BLK_T_DISCARD:
    case VIRTIO_BLK_T_WRITE_ZEROES:
        slot->hdr.sector = 0;
        slot->seg.sector = io->sector;
        slot->seg.num_sectors = io->len / VIRTIO_BLK_SECTOR;
        slot->seg.flags = io->flags;
        bufs[n++] = (struct vq_buf){(uintptr_t)&slot->seg, sizeof(slot->seg), false};
        break;
    case VIRTIO_BLK_T_FLUSH:
        slot->hdr.sector = 0;
        break;
    default:
        return -EINVAL;
    }
    bufs[n++] = (struct vq_buf){(uintptr_t)&slot->status, 1, true};
    int r = vq_add(&q->vq, bufs, n, slot);
    if (r < 0)
        return r;
    q->nfree--;
    d->stats.submitted++;
    return 0;
}

int vublk_kick(struct vublk *d, unsigned qi)
{
    struct vublk_queue *q = &d->q[qi];
    vq_publish(&q->vq);
    if (!vq_kick_needed(&q->vq))
        return 0;
    uint64_t one = 1;
    if (write(q->kick_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        return -errno;
    d->stats.kicks++;
    return 0;
}

unsigned vublk_reap(struct vublk *d, unsigned qi, struct vublk_done *out, unsigned max)
{
    struct vublk_queue *q = &d->q[qi];
    unsigned n = 0;
    void *cookie;
    uint32_t len;
    while (n < max && vq_get_used(&q->vq, &cookie, &len)) {
        struct vublk_slot *slot = cookie;
        out[n++] = (struct vublk_done){.opaque = slot->opaque, .status = slot->status, .len = len};
        q->free_slots[q->nfree++] = (uint16_t)(slot - q->slots);
    }
    return n;
}

int vublk_wait(struct vublk *d, unsigned qi, int timeout_ms, unsigned poll_us)
{
    struct vublk_queue *q = &d->q[qi];
    if (vq_has_used(&q->vq))
        return 0;
    if (poll_us) {
        uint64_t end = now_us() + poll_us;
        do {
            if (vq_has_used(&q->vq))
                return 0;
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } while (now_us() < end);
    }
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        if (vq_enable_cb(&q->vq))
            return 0;
        uint64_t now = now_ms();
        if (now >= deadline)
            return -ETIMEDOUT;
        struct pollfd p[2] = {{.fd = q->call_fd, .events = POLLIN},
                              {.fd = d->backend_fd, .events = POLLIN}};
        d->stats.sleeps++;
        int n = poll(p, d->backend_fd >= 0 ? 2 : 1, (int)(deadline - now));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (p[0].revents & POLLIN) {
            uint64_t v;
            if (read(q->call_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                return -errno;
        }
        if (d->backend_fd >= 0 && p[1].revents) {
            int r = vublk_process_backend(d, 0);
            if (r < 0)
                return r;
        }
        if (vq_has_used(&q->vq))
            return 0;
    }
}

int vublk_request_sync(struct vublk *d, unsigned q, const struct vublk_io *io,
                       uint8_t *ret_status)
{
    if (q >= d->nq)
        return -EINVAL;
    if (vublk_inflight(d, q) != 0)
        return -EBUSY;
    int r = vublk_submit(d, q, io);
    if (r < 0)
        return r;
    r = vublk_kick(d, q);
    if (r < 0)
        return r;
    struct vublk_done done;
    uint64_t deadline = now_ms() + (uint64_t)d->timeout_ms;
    while (vublk_reap(d, q, &done, 1) == 0) {
        uint64_t now = now_ms();
        if (now >= deadline)
            return -ETIMEDOUT;
        r = vublk_wait(d, q, (int)(deadline - now), 0);
        if (r < 0)
            return r;
    }
    *ret_status = done.status;
    return 0;
}

int vublk_get_serial(struct vublk *d, char ret_serial[VIRTIO_BLK_ID_BYTES + 1])
{
    size_t mark = d->data_used;
    char *buf = vublk_alloc(d, VIRTIO_BLK_ID_BYTES);
    if (!buf)
        return -ENOMEM;
    memset(buf, 0, VIRTIO_BLK_ID_BYTES);
    struct vublk_io io = {.type = VIRTIO_BLK_T_GET_ID, .buf = buf, .len = VIRTIO_BLK_ID_BYTES};
    uint8_t st;
    int r = vublk_request_sync(d, 0, &io, &st);
    if (r == 0 && st != VIRTIO_BLK_S_OK)
        r = st == VIRTIO_BLK_S_UNSUPP ? -ENOTSUP : -EIO;
    if (r == 0) {
        memcpy(ret_serial, buf, VIRTIO_BLK_ID_BYTES);
        ret_serial[VIRTIO_BLK_ID_BYTES] = 0;
    }
    d->data_used = mark;
    return r;
}

const char *vublk_status_name(uint8_t status)
{
    switch (status) {
    case VIRTIO_BLK_S_OK: return "ok";
    case VIRTIO_BLK_S_IOERR: return "ioerr";
    case VIRTIO_BLK_S_UNSUPP: return "unsupported";
    default: return "invalid";
    }
}

int vublk_wait_any(struct vublk *d, int timeout_ms)
{
    if (d->nq == 1)
        return vublk_wait(d, 0, timeout_ms, 0);
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    struct pollfd p[64 + 1];
    unsigned n = MIN(d->nq, 64u);
    for (;;) {
        bool ready = false;
        for (unsigned i = 0; i < d->nq; i++)
            if (vq_enable_cb(&d->q[i].vq))
                ready = true;
        if (ready)
            return 0;
        uint64_t now = now_ms();
        if (now >= deadline)
            return -ETIMEDOUT;
        for (unsigned i = 0; i < n; i++)
            p[i] = (struct pollfd){.fd = d->q[i].call_fd, .events = POLLIN};
        p[n] = (struct pollfd){.fd = d->backend_fd, .events = POLLIN};
        d->stats.sleeps++;
        int r = poll(p, n + (d->backend_fd >= 0 ? 1 : 0), (int)(deadline - now));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        for (unsigned i = 0; i < n; i++) {
            uint64_t v;
            if ((p[i].revents & POLLIN) && read(p[i].fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                return -errno;
        }
        if (d->backend_fd >= 0 && p[n].revents) {
            r = vublk_process_backend(d, 0);
            if (r < 0)
                return r;
        }
    }
}

void vublk_get_stats(const struct vublk *d, struct vublk_stats *ret)
{
    *ret = d->stats;
}
