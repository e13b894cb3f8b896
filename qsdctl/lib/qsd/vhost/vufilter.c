/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/vhost/vufilter.c: the vhost-user message filter's decisions (see
 * vufilter.h).  One table says which front-end requests pass and with what
 * size, descriptors and reply; one check function per request does the
 * rest. */
#include "qsd/vhost/vufilter.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "qsd/vhost/vhost_user.h"

#define BIT(n) (1ull << (n))
#define PAGE_MASK 0xfffull

const uint64_t vufilter_safe_features =
    /* virtio-blk: SIZE_MAX SEG_MAX GEOMETRY RO BLK_SIZE FLUSH TOPOLOGY
     * CONFIG_WCE MQ DISCARD WRITE_ZEROES */
    BIT(1) | BIT(2) | BIT(4) | BIT(5) | BIT(6) | BIT(9) | BIT(10) | BIT(11) | BIT(12) |
    BIT(13) | BIT(14) |
    /* NOTIFY_ON_EMPTY, INDIRECT_DESC, EVENT_IDX, PROTOCOL_FEATURES, VERSION_1 */
    BIT(24) | BIT(28) | BIT(29) | BIT(VHOST_USER_F_PROTOCOL_FEATURES) | BIT(32);

const uint64_t vufilter_safe_protocol_features =
    BIT(VHOST_USER_PROTOCOL_F_MQ) | BIT(VHOST_USER_PROTOCOL_F_REPLY_ACK) |
    BIT(VHOST_USER_PROTOCOL_F_BACKEND_REQ) | BIT(VHOST_USER_PROTOCOL_F_CONFIG) |
    BIT(VUF_PROTO_F_CONFIGURE_MEM_SLOTS);

const char *vufilter_request_name(uint32_t request, char *buf, size_t len)
{
    static const char *const more[] = {
        [19] = "SEND_RARP", [20] = "NET_SET_MTU", [22] = "IOTLB_MSG",
        [23] = "SET_VRING_ENDIAN", [26] = "CREATE_CRYPTO_SESSION",
        [27] = "CLOSE_CRYPTO_SESSION", [28] = "POSTCOPY_ADVISE", [29] = "POSTCOPY_LISTEN",
        [30] = "POSTCOPY_END", [31] = "GET_INFLIGHT_FD", [32] = "SET_INFLIGHT_FD",
        [33] = "GPU_SET_SOCKET", [34] = "RESET_DEVICE", [35] = "VRING_KICK",
        [36] = "GET_MAX_MEM_SLOTS", [37] = "ADD_MEM_REG", [38] = "REM_MEM_REG",
        [39] = "SET_STATUS", [40] = "GET_STATUS", [41] = "GET_SHARED_OBJECT",
        [42] = "SET_DEVICE_STATE_FD", [43] = "CHECK_DEVICE_STATE",
    };
    const char *n = vhost_user_request_name(request);
    if (strcmp(n, "UNKNOWN") != 0)
        return n;
    if (request < sizeof(more) / sizeof(more[0]) && more[request])
        return more[request];
    snprintf(buf, len, "request %u", request);
    return buf;
}

static enum vuf_verdict refuse(struct vufilter *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static enum vuf_verdict refuse(struct vufilter *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->reason, sizeof(f->reason), fmt, ap);
    va_end(ap);
    f->dead = true;
    return VUF_REFUSE;
}

int vufilter_init(struct vufilter *f, unsigned nq, bool allow_adjacent)
{
    if (nq < 1 || nq > VUF_MAX_QUEUES)
        return -EINVAL;
    memset(f, 0, sizeof(*f));
    f->nq = nq;
    f->allow_adjacent = allow_adjacent;
    return 0;
}

/* ---- helpers on the payload ----------------------------------------------- */

static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static struct vuf_region region_at(const uint8_t *p)
{
    return (struct vuf_region){
        .gpa = get64(p), .size = get64(p + 8), .uva = get64(p + 16), .offset = get64(p + 24),
    };
}

/* A region by itself: not empty, page-aligned, no address wraps. */
static enum vuf_verdict check_region(struct vufilter *f, const char *what,
                                     const struct vuf_region *r)
{
    uint64_t end;
    if (r->size == 0)
        return refuse(f, "%s: a region of size 0", what);
    if ((r->gpa | r->size | r->uva | r->offset) & PAGE_MASK)
        return refuse(f, "%s: a region not aligned to 4 KiB", what);
    if (__builtin_add_overflow(r->gpa, r->size, &end) ||
        __builtin_add_overflow(r->uva, r->size, &end) ||
        __builtin_add_overflow(r->offset, r->size, &end))
        return refuse(f, "%s: a region whose end overflows 64 bits", what);
    return VUF_PASS;
}

/* Two regions: apart in guest-physical space (an indirect descriptor table
 * that straddles two regions that touch overflows QSD 10's stack), and
 * not overlapping. */
static enum vuf_verdict check_apart(struct vufilter *f, const char *what,
                                    const struct vuf_region *a, const struct vuf_region *b)
{
    if (a->gpa < b->gpa + b->size && b->gpa < a->gpa + a->size)
        return refuse(f, "%s: regions overlap in guest-physical space (0x%llx, 0x%llx)", what,
                      (unsigned long long)a->gpa, (unsigned long long)b->gpa);
    if (!f->allow_adjacent && (a->gpa + a->size == b->gpa || b->gpa + b->size == a->gpa))
        return refuse(f, "%s: regions adjacent in guest-physical space (0x%llx, 0x%llx)",
                      what, (unsigned long long)a->gpa, (unsigned long long)b->gpa);
    return VUF_PASS;
}

/* Each ring whose start lies in a region lies wholly in it: libvhost-user
 * checks only the start address and then reads (and writes the used ring)
 * num entries on.  With require_start, every start must resolve too. */
static enum vuf_verdict check_rings(struct vufilter *f, const char *what, bool require_start)
{
    for (unsigned q = 0; q < f->nq; q++) {
        const struct vuf_ring *g = &f->rings[q];
        if (!g->has_addr)
            continue;
        const struct {
            const char *name;
            uint64_t addr, len;
        } parts[] = {
            {"descriptor table", g->desc, 16ull * g->num},
            {"available ring", g->avail, 6 + 2ull * g->num},
            {"used ring", g->used, 6 + 8ull * g->num},
        };
        for (unsigned i = 0; i < 3; i++) {
            const struct vuf_region *in = NULL;
            for (unsigned k = 0; k < f->nregions && !in; k++) {
                const struct vuf_region *r = &f->regions[k];
                if (parts[i].addr >= r->uva && parts[i].addr - r->uva < r->size)
                    in = r;
            }
            if (!in) {
                if (require_start)
                    return refuse(f, "%s: queue %u's %s is in no memory region", what, q,
                                  parts[i].name);
                continue;
            }
            if (parts[i].len > in->uva + in->size - parts[i].addr)
                return refuse(f, "%s: queue %u's %s (%u entries) runs past its memory region",
                              what, q, parts[i].name, g->num);
        }
    }
    return VUF_PASS;
}

/* ---- front-end requests ----------------------------------------------------- */

struct req_ctx {
    struct vufilter *f;
    uint8_t *p;     /* payload */
    uint32_t size;  /* payload size */
    unsigned nfds;
    const char *name;
};

static enum vuf_verdict queue_index(struct req_ctx *c, uint32_t index)
{
    if (index >= c->f->nq)
        return refuse(c->f, "%s: queue index %u, the export has %u", c->name, index, c->f->nq);
    return VUF_PASS;
}

static enum vuf_verdict chk_set_features(struct req_ctx *c)
{
    uint64_t v = get64(c->p);
    if (!c->f->features_known)
        return refuse(c->f, "%s before GET_FEATURES", c->name);
    if (v & ~c->f->features_offered)
        return refuse(c->f, "%s: 0x%llx is not a subset of the offer 0x%llx", c->name,
                      (unsigned long long)v, (unsigned long long)c->f->features_offered);
    c->f->features_acked = v;
    return VUF_PASS;
}

static enum vuf_verdict chk_set_protocol_features(struct req_ctx *c)
{
    uint64_t v = get64(c->p);
    if (!c->f->proto_known)
        return refuse(c->f, "%s before GET_PROTOCOL_FEATURES", c->name);
    if (v & ~c->f->proto_offered)
        return refuse(c->f, "%s: 0x%llx is not a subset of the offer 0x%llx", c->name,
                      (unsigned long long)v, (unsigned long long)c->f->proto_offered);
    c->f->proto_acked = v;
    return VUF_PASS;
}

static enum vuf_verdict chk_set_mem_table(struct req_ctx *c)
{
    struct vufilter *f = c->f;
    if (c->size < 8)
        return refuse(f, "%s: payload of %u bytes", c->name, c->size);
    uint32_t n = get32(c->p);
    if (n < 1 || n > VUF_TABLE_REGIONS)
        return refuse(f, "%s: %u regions (1 to %u allowed)", c->name, n, VUF_TABLE_REGIONS);
    if (c->size != 8 + 32 * n)
        return refuse(f, "%s: payload of %u bytes for %u regions", c->name, c->size, n);
    if (c->nfds != n)
        return refuse(f, "%s: %u descriptors for %u regions", c->name, c->nfds, n);
    struct vuf_region r[VUF_TABLE_REGIONS];
    for (uint32_t i = 0; i < n; i++) {
        r[i] = region_at(c->p + 8 + 32 * i);
        if (check_region(f, c->name, &r[i]) == VUF_REFUSE)
            return VUF_REFUSE;
        for (uint32_t k = 0; k < i; k++)
            if (check_apart(f, c->name, &r[i], &r[k]) == VUF_REFUSE)
                return VUF_REFUSE;
    }
    memcpy(f->regions, r, n * sizeof(r[0]));
    f->nregions = n;
    return check_rings(f, c->name, false);
}

static enum vuf_verdict chk_add_mem_reg(struct req_ctx *c)
{
    struct vufilter *f = c->f;
    if (!(f->proto_acked & BIT(VUF_PROTO_F_CONFIGURE_MEM_SLOTS)))
        return refuse(f, "%s without CONFIGURE_MEM_SLOTS", c->name);
    if (f->nregions >= f->max_slots)
        return refuse(f, "%s: %u regions already, the back-end announced %u slots", c->name,
                      f->nregions, f->max_slots);
    struct vuf_region r = region_at(c->p + 8);
    if (check_region(f, c->name, &r) == VUF_REFUSE)
        return VUF_REFUSE;
    for (unsigned k = 0; k < f->nregions; k++)
        if (check_apart(f, c->name, &r, &f->regions[k]) == VUF_REFUSE)
            return VUF_REFUSE;
    f->regions[f->nregions++] = r;
    return check_rings(f, c->name, false);
}

static enum vuf_verdict chk_rem_mem_reg(struct req_ctx *c)
{
    struct vufilter *f = c->f;
    if (!(f->proto_acked & BIT(VUF_PROTO_F_CONFIGURE_MEM_SLOTS)))
        return refuse(f, "%s without CONFIGURE_MEM_SLOTS", c->name);
    struct vuf_region r = region_at(c->p + 8);
    /* libvhost-user removes every region with this gpa, uva and size. */
    unsigned kept = 0;
    for (unsigned k = 0; k < f->nregions; k++) {
        const struct vuf_region *o = &f->regions[k];
        if (!(o->gpa == r.gpa && o->uva == r.uva && o->size == r.size))
            f->regions[kept++] = *o;
    }
    if (kept == f->nregions)
        return refuse(f, "%s: no such region (0x%llx)", c->name, (unsigned long long)r.gpa);
    f->nregions = kept;
    return VUF_PASS;
}

static enum vuf_verdict chk_vring_num(struct req_ctx *c)
{
    uint32_t index = get32(c->p), num = get32(c->p + 4);
    if (queue_index(c, index) == VUF_REFUSE)
        return VUF_REFUSE;
    if (num < 1 || num > VUF_MAX_VRING || (num & (num - 1)))
        return refuse(c->f, "%s: %u entries (a power of two up to %u)", c->name, num,
                      VUF_MAX_VRING);
    c->f->rings[index].num = num;
    return check_rings(c->f, c->name, false);
}

static enum vuf_verdict chk_vring_base(struct req_ctx *c)
{
    uint32_t index = get32(c->p), num = get32(c->p + 4);
    if (queue_index(c, index) == VUF_REFUSE)
        return VUF_REFUSE;
    if (num > 0xffff)
        return refuse(c->f, "%s: base %u is not a 16-bit ring index", c->name, num);
    return VUF_PASS;
}

static enum vuf_verdict chk_vring_index(struct req_ctx *c)
{
    return queue_index(c, get32(c->p));
}

static enum vuf_verdict chk_vring_enable(struct req_ctx *c)
{
    if (queue_index(c, get32(c->p)) == VUF_REFUSE)
        return VUF_REFUSE;
    if (get32(c->p + 4) > 1)
        return refuse(c->f, "%s: enable is %u", c->name, get32(c->p + 4));
    return VUF_PASS;
}

static enum vuf_verdict chk_vring_addr(struct req_ctx *c)
{
    uint32_t index = get32(c->p), flags = get32(c->p + 4);
    if (queue_index(c, index) == VUF_REFUSE)
        return VUF_REFUSE;
    if (flags != 0)
        return refuse(c->f, "%s: flags 0x%x (no dirty logging)", c->name, flags);
    struct vuf_ring *g = &c->f->rings[index];
    g->has_addr = true;
    g->desc = get64(c->p + 8);
    g->used = get64(c->p + 16);
    g->avail = get64(c->p + 24);
    return check_rings(c->f, c->name, true);
}

/* SET_VRING_KICK / CALL / ERR: index in bits 0-7, bit 8 "no descriptor". */
static enum vuf_verdict chk_vring_file(struct req_ctx *c)
{
    uint64_t v = get64(c->p);
    if (v & ~(uint64_t)(VHOST_USER_VRING_IDX_MASK | VHOST_USER_VRING_NOFD_MASK))
        return refuse(c->f, "%s: unknown bits in 0x%llx", c->name, (unsigned long long)v);
    if (queue_index(c, (uint32_t)(v & VHOST_USER_VRING_IDX_MASK)) == VUF_REFUSE)
        return VUF_REFUSE;
    unsigned want = (v & VHOST_USER_VRING_NOFD_MASK) ? 0 : 1;
    if (c->nfds != want)
        return refuse(c->f, "%s: %u descriptors, want %u", c->name, c->nfds, want);
    return VUF_PASS;
}

static enum vuf_verdict chk_backend_req_fd(struct req_ctx *c)
{
    if (!(c->f->proto_acked & BIT(VHOST_USER_PROTOCOL_F_BACKEND_REQ)))
        return refuse(c->f, "%s without BACKEND_REQ", c->name);
    if (c->f->backend_req_set)
        return refuse(c->f, "%s a second time", c->name);
    c->f->backend_req_set = true;
    return VUF_PASS;
}

static enum vuf_verdict chk_config_hdr(struct req_ctx *c, uint32_t *ret_off, uint32_t *ret_len)
{
    if (c->size < 12)
        return refuse(c->f, "%s: payload of %u bytes", c->name, c->size);
    uint32_t off = get32(c->p), len = get32(c->p + 4), flags = get32(c->p + 8);
    if (len < 1 || off > VUF_BLK_CONFIG_SIZE || len > VUF_BLK_CONFIG_SIZE - off)
        return refuse(c->f, "%s: bytes %u+%u outside virtio_blk_config", c->name, off, len);
    if (c->size != 12 + len)
        return refuse(c->f, "%s: payload of %u bytes for %u config bytes", c->name, c->size,
                      len);
    if (flags != 0)
        return refuse(c->f, "%s: flags 0x%x", c->name, flags);
    *ret_off = off;
    *ret_len = len;
    return VUF_PASS;
}

static enum vuf_verdict chk_get_config(struct req_ctx *c)
{
    uint32_t off, len;
    return chk_config_hdr(c, &off, &len);
}

/* Only the writeback cache byte is the driver's to write. */
static enum vuf_verdict chk_set_config(struct req_ctx *c)
{
    uint32_t off, len;
    if (chk_config_hdr(c, &off, &len) == VUF_REFUSE)
        return VUF_REFUSE;
    if (off != VUF_BLK_CONFIG_WCE || len != 1)
        return refuse(c->f, "%s: bytes %u+%u (only wce, byte %u, is writable)", c->name, off,
                      len, VUF_BLK_CONFIG_WCE);
    if (c->p[12] > 1)
        return refuse(c->f, "%s: wce=%u", c->name, c->p[12]);
    return VUF_PASS;
}

#define ANY_SIZE UINT32_MAX
#define REPLY_SAME UINT32_MAX /* the reply's size is the request's (or 0) */

static const struct req_rule {
    bool allowed;
    uint32_t size;       /* exact payload size, or ANY_SIZE (the check decides) */
    uint8_t nfds_min, nfds_max; /* checks refine */
    bool reply;          /* answered even without NEED_REPLY */
    uint32_t reply_size; /* when reply */
    enum vuf_verdict (*check)(struct req_ctx *c);
} req_rules[] = {
    [VHOST_USER_GET_FEATURES] = {true, 0, 0, 0, true, 8, NULL},
    [VHOST_USER_SET_FEATURES] = {true, 8, 0, 0, false, 0, chk_set_features},
    [VHOST_USER_SET_OWNER] = {true, 0, 0, 0, false, 0, NULL},
    [VHOST_USER_RESET_OWNER] = {true, 0, 0, 0, false, 0, NULL},
    [VHOST_USER_SET_MEM_TABLE] = {true, ANY_SIZE, 1, VUF_TABLE_REGIONS, false, 0, chk_set_mem_table},
    [VHOST_USER_SET_VRING_NUM] = {true, 8, 0, 0, false, 0, chk_vring_num},
    [VHOST_USER_SET_VRING_ADDR] = {true, 40, 0, 0, false, 0, chk_vring_addr},
    [VHOST_USER_SET_VRING_BASE] = {true, 8, 0, 0, false, 0, chk_vring_base},
    [VHOST_USER_GET_VRING_BASE] = {true, 8, 0, 0, true, 8, chk_vring_index},
    [VHOST_USER_SET_VRING_KICK] = {true, 8, 0, 1, false, 0, chk_vring_file},
    [VHOST_USER_SET_VRING_CALL] = {true, 8, 0, 1, false, 0, chk_vring_file},
    [VHOST_USER_SET_VRING_ERR] = {true, 8, 0, 1, false, 0, chk_vring_file},
    [VHOST_USER_GET_PROTOCOL_FEATURES] = {true, 0, 0, 0, true, 8, NULL},
    [VHOST_USER_SET_PROTOCOL_FEATURES] = {true, 8, 0, 0, false, 0, chk_set_protocol_features},
    [VHOST_USER_GET_QUEUE_NUM] = {true, 0, 0, 0, true, 8, NULL},
    [VHOST_USER_SET_VRING_ENABLE] = {true, 8, 0, 0, false, 0, chk_vring_enable},
    [VHOST_USER_SET_BACKEND_REQ_FD] = {true, 0, 1, 1, false, 0, chk_backend_req_fd},
    [VHOST_USER_GET_CONFIG] = {true, ANY_SIZE, 0, 0, true, REPLY_SAME, chk_get_config},
    [VHOST_USER_SET_CONFIG] = {true, 13, 0, 0, false, 0, chk_set_config},
    [VUF_REQ_GET_MAX_MEM_SLOTS] = {true, 0, 0, 0, true, 8, NULL},
    [VUF_REQ_ADD_MEM_REG] = {true, 40, 1, 1, false, 0, chk_add_mem_reg},
    [VUF_REQ_REM_MEM_REG] = {true, 40, 0, 1, false, 0, chk_rem_mem_reg},
};

static enum vuf_verdict push_pending(struct vufilter *f, uint32_t request, uint32_t size, bool ack)
{
    if (f->npending >= VUF_MAX_PENDING)
        return refuse(f, "more than %u requests awaiting replies", VUF_MAX_PENDING);
    f->pending[f->npending++] = (struct vuf_pending){request, size, ack};
    return VUF_PASS;
}

static enum vuf_verdict tenant_request(struct vufilter *f, uint8_t *msg, unsigned nfds)
{
    uint32_t request = get32(msg), flags = get32(msg + 4), size = get32(msg + 8);
    char buf[32];
    const char *name = vufilter_request_name(request, buf, sizeof(buf));
    if (flags & VHOST_USER_REPLY_MASK)
        return refuse(f, "%s: a reply from the front-end", name);
    const struct req_rule *r =
        request < sizeof(req_rules) / sizeof(req_rules[0]) ? &req_rules[request] : NULL;
    if (!r || !r->allowed)
        return refuse(f, "%s is not allowed", name);
    if (r->size != ANY_SIZE && size != r->size)
        return refuse(f, "%s: payload of %u bytes, want %u", name, size, r->size);
    if (nfds < r->nfds_min || nfds > r->nfds_max)
        return refuse(f, "%s: %u descriptors", name, nfds);
    struct req_ctx c = {.f = f, .p = msg + VUF_HDR_SIZE, .size = size, .nfds = nfds,
                        .name = name};
    if (r->check && r->check(&c) == VUF_REFUSE)
        return VUF_REFUSE;
    if (r->reply)
        return push_pending(f, request, r->reply_size == REPLY_SAME ? size : r->reply_size,
                            false);
    if (flags & VHOST_USER_NEED_REPLY_MASK)
        return push_pending(f, request, 8, true);
    return VUF_PASS;
}

/* ---- the QSD's replies ------------------------------------------------------- */

static enum vuf_verdict qsd_reply(struct vufilter *f, uint8_t *msg, unsigned nfds)
{
    uint32_t request = get32(msg), flags = get32(msg + 4), size = get32(msg + 8);
    char buf[32];
    const char *name = vufilter_request_name(request, buf, sizeof(buf));
    if (!(flags & VHOST_USER_REPLY_MASK) || (flags & VHOST_USER_NEED_REPLY_MASK))
        return refuse(f, "back-end sent %s with flags 0x%x, not a reply", name, flags);
    if (f->npending == 0)
        return refuse(f, "back-end replied %s to nothing", name);
    struct vuf_pending want = f->pending[0];
    memmove(&f->pending[0], &f->pending[1], --f->npending * sizeof(f->pending[0]));
    if (request != want.request)
        return refuse(f, "back-end replied %s to %s", name,
                      vufilter_request_name(want.request, buf, sizeof(buf)));
    if (nfds != 0)
        return refuse(f, "back-end reply %s carries %u descriptors", name, nfds);
    bool config_error = request == VHOST_USER_GET_CONFIG && !want.ack && size == 0;
    if (size != want.size && !config_error)
        return refuse(f, "back-end reply %s: %u bytes, want %u", name, size, want.size);
    if (want.ack)
        return VUF_PASS;

    uint8_t *p = msg + VUF_HDR_SIZE;
    uint64_t v = size == 8 ? get64(p) : 0, nv = v;
    switch (request) {
    case VHOST_USER_GET_FEATURES:
        nv = v & vufilter_safe_features;
        f->features_offered = nv;
        f->features_known = true;
        break;
    case VHOST_USER_GET_PROTOCOL_FEATURES:
        nv = v & vufilter_safe_protocol_features;
        f->proto_offered = nv;
        f->proto_known = true;
        break;
    case VHOST_USER_GET_QUEUE_NUM:
        if (v == 0)
            return refuse(f, "back-end has 0 queues");
        nv = v < f->nq ? v : f->nq;
        f->nq = (unsigned)nv;
        break;
    case VUF_REQ_GET_MAX_MEM_SLOTS:
        nv = v < VUF_MAX_REGIONS ? v : VUF_MAX_REGIONS;
        f->max_slots = (unsigned)nv;
        break;
    default:
        break;
    }
    if (nv == v)
        return VUF_PASS;
    put64(p, nv);
    return VUF_MODIFIED;
}

/* ---- the back-end request channel --------------------------------------------- */

static enum vuf_verdict backend_msg(struct vufilter *f, enum vuf_side side, uint8_t *msg,
                                    unsigned nfds)
{
    uint32_t request = get32(msg), flags = get32(msg + 4), size = get32(msg + 8);
    if (nfds != 0)
        return refuse(f, "back-end channel: message %u carries %u descriptors", request, nfds);
    if (side == VUF_FROM_QSD) {
        if (request != VHOST_USER_BACKEND_CONFIG_CHANGE_MSG)
            return refuse(f, "back-end channel: request %u is not allowed", request);
        if (flags & VHOST_USER_REPLY_MASK)
            return refuse(f, "back-end channel: a reply from the back-end");
        if (size != 0)
            return refuse(f, "back-end channel: CONFIG_CHANGE_MSG of %u bytes", size);
        if (flags & VHOST_USER_NEED_REPLY_MASK) {
            if (f->nbackend_pending >= VUF_MAX_PENDING)
                return refuse(f, "back-end channel: too many requests awaiting replies");
            f->backend_pending[f->nbackend_pending++] = request;
        }
        return VUF_PASS;
    }
    if (!(flags & VHOST_USER_REPLY_MASK) || (flags & VHOST_USER_NEED_REPLY_MASK))
        return refuse(f, "back-end channel: front-end sent request %u", request);
    if (f->nbackend_pending == 0)
        return refuse(f, "back-end channel: front-end replied to nothing");
    uint32_t want = f->backend_pending[0];
    memmove(&f->backend_pending[0], &f->backend_pending[1],
            --f->nbackend_pending * sizeof(f->backend_pending[0]));
    if (request != want || size != 8)
        return refuse(f, "back-end channel: reply %u of %u bytes to request %u", request, size,
                      want);
    return VUF_PASS;
}

/* ---- entry points ------------------------------------------------------------- */

enum vuf_verdict vufilter_check_header(struct vufilter *f, enum vuf_chan ch, enum vuf_side side,
                                       const uint8_t *hdr)
{
    if (f->dead)
        return VUF_REFUSE;
    uint32_t flags = get32(hdr + 4), size = get32(hdr + 8);
    const char *where = ch == VUF_MAIN ? "" : "back-end channel: ";
    const char *who = side == VUF_FROM_TENANT ? "front-end" : "back-end";
    if ((flags & VHOST_USER_VERSION_MASK) != VHOST_USER_VERSION)
        return refuse(f, "%s%s message of version %u", where, who,
                      flags & VHOST_USER_VERSION_MASK);
    if (flags & ~(VHOST_USER_VERSION_MASK | VHOST_USER_REPLY_MASK | VHOST_USER_NEED_REPLY_MASK))
        return refuse(f, "%s%s message with unknown flags 0x%x", where, who, flags);
    if (size > VUF_PAYLOAD_MAX)
        return refuse(f, "%s%s message of %u bytes (at most %u)", where, who, size,
                      VUF_PAYLOAD_MAX);
    return VUF_PASS;
}

enum vuf_verdict vufilter_feed(struct vufilter *f, enum vuf_chan ch, enum vuf_side side,
                               uint8_t *msg, size_t len, unsigned nfds)
{
    if (f->dead)
        return VUF_REFUSE;
    if (len < VUF_HDR_SIZE || len != VUF_HDR_SIZE + (size_t)get32(msg + 8))
        return refuse(f, "message of %zu bytes does not match its header", len);
    if (vufilter_check_header(f, ch, side, msg) == VUF_REFUSE)
        return VUF_REFUSE;
    if (nfds > VUF_MAX_FDS)
        return refuse(f, "message with %u descriptors", nfds);
    if (ch == VUF_BACKEND)
        return backend_msg(f, side, msg, nfds);
    if (side == VUF_FROM_TENANT)
        return tenant_request(f, msg, nfds);
    return qsd_reply(f, msg, nfds);
}
