/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for qsd/vhost/vufilter.c: every rule of the vhost-user filter,
 * accepted and refused, fed with the bytes a front-end or a QSD would send. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "qsd/vhost/vhost_user.h"
#include "qsd/vhost/vufilter.h"

#define T VUF_FROM_TENANT
#define Q VUF_FROM_QSD
#define REPLY (VHOST_USER_VERSION | VHOST_USER_REPLY_MASK)
#define V VHOST_USER_VERSION
#define UVA 0x7f0000000000ull
#define MIB (1ull << 20)

struct msg {
    uint8_t b[VUF_MSG_MAX + 64];
    size_t len;
};

static struct msg mk(uint32_t req, uint32_t flags, const void *p, uint32_t size)
{
    struct msg m = {.len = VUF_HDR_SIZE + size};
    memcpy(m.b, &req, 4);
    memcpy(m.b + 4, &flags, 4);
    memcpy(m.b + 8, &size, 4);
    if (size)
        memcpy(m.b + VUF_HDR_SIZE, p, size);
    return m;
}

static enum vuf_verdict feed(struct vufilter *f, enum vuf_chan ch, enum vuf_side side,
                             uint32_t req, uint32_t flags, const void *p, uint32_t size,
                             unsigned nfds)
{
    struct msg m = mk(req, flags, p, size);
    return vufilter_feed(f, ch, side, m.b, m.len, nfds);
}

static enum vuf_verdict req(struct vufilter *f, uint32_t r, const void *p, uint32_t size,
                            unsigned nfds)
{
    return feed(f, VUF_MAIN, T, r, V, p, size, nfds);
}

static enum vuf_verdict req_u64(struct vufilter *f, uint32_t r, uint64_t v, unsigned nfds)
{
    return req(f, r, &v, 8, nfds);
}

static enum vuf_verdict req_state(struct vufilter *f, uint32_t r, uint32_t index, uint32_t num)
{
    uint32_t s[2] = {index, num};
    return req(f, r, s, 8, 0);
}

/* The QSD's u64 reply; *out gets what the filter lets through. */
static enum vuf_verdict reply_u64(struct vufilter *f, uint32_t r, uint64_t v, uint64_t *out)
{
    struct msg m = mk(r, REPLY, &v, 8);
    enum vuf_verdict x = vufilter_feed(f, VUF_MAIN, Q, m.b, m.len, 0);
    if (out)
        memcpy(out, m.b + VUF_HDR_SIZE, 8);
    return x;
}

static void refused(struct vufilter *f, enum vuf_verdict v, const char *needle)
{
    assert_int_equal(v, VUF_REFUSE);
    if (!strstr(f->reason, needle))
        fail_msg("reason \"%s\" does not say \"%s\"", f->reason, needle);
}

/* Everything but the rings: QSD 10.0.2's offer negotiated in full. */
#define QSD_FEATURES 0x175007e46ull
#define QSD_PROTOCOL 0x8f2bull

static void negotiate(struct vufilter *f, unsigned nq)
{
    assert_int_equal(vufilter_init(f, nq, false), 0);
    uint64_t out;
    assert_int_equal(req(f, VHOST_USER_GET_FEATURES, NULL, 0, 0), VUF_PASS);
    assert_int_equal(reply_u64(f, VHOST_USER_GET_FEATURES, QSD_FEATURES, &out), VUF_MODIFIED);
    assert_int_equal(req(f, VHOST_USER_GET_PROTOCOL_FEATURES, NULL, 0, 0), VUF_PASS);
    assert_int_equal(reply_u64(f, VHOST_USER_GET_PROTOCOL_FEATURES, QSD_PROTOCOL, &out),
                     VUF_MODIFIED);
    assert_int_equal(req_u64(f, VHOST_USER_SET_PROTOCOL_FEATURES, out, 0), VUF_PASS);
    assert_int_equal(req(f, VUF_REQ_GET_MAX_MEM_SLOTS, NULL, 0, 0), VUF_PASS);
    assert_int_equal(reply_u64(f, VUF_REQ_GET_MAX_MEM_SLOTS, 32, NULL), VUF_PASS);
    assert_int_equal(req(f, VHOST_USER_SET_OWNER, NULL, 0, 0), VUF_PASS);
}

static struct vhost_user_mem_region rg(uint64_t gpa, uint64_t size, uint64_t uva)
{
    return (struct vhost_user_mem_region){gpa, size, uva, 0};
}

static enum vuf_verdict table(struct vufilter *f, uint32_t n, const struct vhost_user_mem_region *r,
                              unsigned nr, unsigned nfds)
{
    struct vhost_user_mem_table t = {.nregions = n};
    memcpy(t.regions, r, nr * sizeof(*r));
    return req(f, VHOST_USER_SET_MEM_TABLE, &t, 8 + 32 * nr, nfds);
}

static enum vuf_verdict memreg(struct vufilter *f, uint32_t r, struct vhost_user_mem_region g,
                               unsigned nfds)
{
    struct {
        uint64_t pad;
        struct vhost_user_mem_region g;
    } __attribute__((packed)) p = {0, g};
    return req(f, r, &p, sizeof(p), nfds);
}

static enum vuf_verdict ring_addr(struct vufilter *f, uint32_t q, uint32_t flags, uint64_t desc,
                                  uint64_t used, uint64_t avail)
{
    struct vhost_vring_addr a = {q, flags, desc, used, avail, 0};
    return req(f, VHOST_USER_SET_VRING_ADDR, &a, sizeof(a), 0);
}

/* ---- tests ------------------------------------------------------------------ */

/* What QEMU 10's vhost-user-blk device sends (hw/virtio/vhost-user.c), with
 * QSD's answers: everything passes, the offer is masked. */
static void test_qemu_session(void **state)
{
    struct vufilter f;
    assert_int_equal(vufilter_init(&f, 2, false), 0);
    uint64_t out;
    assert_int_equal(req(&f, VHOST_USER_GET_FEATURES, NULL, 0, 0), VUF_PASS);
    assert_int_equal(reply_u64(&f, VHOST_USER_GET_FEATURES, QSD_FEATURES, &out), VUF_MODIFIED);
    assert_int_equal(out, QSD_FEATURES & ~(1ull << 26)); /* LOG_ALL gone */
    assert_int_equal(req(&f, VHOST_USER_GET_PROTOCOL_FEATURES, NULL, 0, 0), VUF_PASS);
    assert_int_equal(reply_u64(&f, VHOST_USER_GET_PROTOCOL_FEATURES, QSD_PROTOCOL, &out),
                     VUF_MODIFIED);
    /* MQ REPLY_ACK BACKEND_REQ CONFIG CONFIGURE_MEM_SLOTS; not LOG_SHMFD (1),
     * PAGEFAULT (8), BACKEND_SEND_FD (10), HOST_NOTIFIER (11) */
    assert_int_equal(out, 0x8229);
    assert_int_equal(feed(&f, VUF_MAIN, T, VHOST_USER_SET_PROTOCOL_FEATURES,
                          V | VHOST_USER_NEED_REPLY_MASK, &out, 8, 0), VUF_PASS);
    assert_int_equal(reply_u64(&f, VHOST_USER_SET_PROTOCOL_FEATURES, 0, NULL), VUF_PASS);
    assert_int_equal(req(&f, VHOST_USER_GET_QUEUE_NUM, NULL, 0, 0), VUF_PASS);
    assert_int_equal(reply_u64(&f, VHOST_USER_GET_QUEUE_NUM, 2, NULL), VUF_PASS);
    assert_int_equal(req(&f, VUF_REQ_GET_MAX_MEM_SLOTS, NULL, 0, 0), VUF_PASS);
    assert_int_equal(reply_u64(&f, VUF_REQ_GET_MAX_MEM_SLOTS, 32, NULL), VUF_PASS);
    assert_int_equal(feed(&f, VUF_MAIN, T, VHOST_USER_SET_BACKEND_REQ_FD,
                          V | VHOST_USER_NEED_REPLY_MASK, NULL, 0, 1), VUF_PASS);
    assert_int_equal(reply_u64(&f, VHOST_USER_SET_BACKEND_REQ_FD, 0, NULL), VUF_PASS);
    assert_int_equal(req(&f, VHOST_USER_SET_OWNER, NULL, 0, 0), VUF_PASS);
    assert_int_equal(req(&f, VHOST_USER_GET_FEATURES, NULL, 0, 0), VUF_PASS);
    assert_int_equal(reply_u64(&f, VHOST_USER_GET_FEATURES, QSD_FEATURES, NULL), VUF_MODIFIED);
    for (uint32_t q = 0; q < 2; q++)
        assert_int_equal(req_u64(&f, VHOST_USER_SET_VRING_CALL, q, 1), VUF_PASS);
    uint8_t cfg[12 + 60] = {0};
    uint32_t ch[3] = {0, 60, 0};
    memcpy(cfg, ch, 12);
    assert_int_equal(req(&f, VHOST_USER_GET_CONFIG, cfg, sizeof(cfg), 0), VUF_PASS);
    struct msg m = mk(VHOST_USER_GET_CONFIG, REPLY, cfg, sizeof(cfg));
    assert_int_equal(vufilter_feed(&f, VUF_MAIN, Q, m.b, m.len, 0), VUF_PASS);
    /* start: features, memory (two regions below and above 4 GiB), rings */
    assert_int_equal(req_u64(&f, VHOST_USER_SET_FEATURES, 0x171000e46ull, 0), VUF_PASS);
    assert_int_equal(memreg(&f, VUF_REQ_ADD_MEM_REG, rg(0, 0xa0000, UVA), 1), VUF_PASS);
    assert_int_equal(memreg(&f, VUF_REQ_ADD_MEM_REG, rg(0xc0000, 0x7ff40000, UVA + 0xc0000), 1),
                     VUF_PASS);
    assert_int_equal(memreg(&f, VUF_REQ_ADD_MEM_REG, rg(1ull << 32, 1ull << 30, UVA + (2ull << 30)),
                            1), VUF_PASS);
    for (uint32_t q = 0; q < 2; q++) {
        uint64_t base = UVA + 0x100000 + q * 0x10000;
        assert_int_equal(req_state(&f, VHOST_USER_SET_VRING_NUM, q, 256), VUF_PASS);
        assert_int_equal(req_state(&f, VHOST_USER_SET_VRING_BASE, q, 0), VUF_PASS);
        assert_int_equal(ring_addr(&f, q, 0, base, base + 0x2000, base + 0x1000), VUF_PASS);
        assert_int_equal(req_u64(&f, VHOST_USER_SET_VRING_KICK, q, 1), VUF_PASS);
        assert_int_equal(req_u64(&f, VHOST_USER_SET_VRING_CALL, q, 1), VUF_PASS);
        assert_int_equal(req_u64(&f, VHOST_USER_SET_VRING_ERR, q, 1), VUF_PASS);
        assert_int_equal(req_state(&f, VHOST_USER_SET_VRING_ENABLE, q, 1), VUF_PASS);
    }
    /* the guest turns the write cache on; a resize; stop */
    uint8_t wce[13] = {VUF_BLK_CONFIG_WCE, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1};
    assert_int_equal(req(&f, VHOST_USER_SET_CONFIG, wce, sizeof(wce), 0), VUF_PASS);
    assert_int_equal(feed(&f, VUF_BACKEND, Q, VHOST_USER_BACKEND_CONFIG_CHANGE_MSG, V, NULL, 0, 0),
                     VUF_PASS);
    for (uint32_t q = 0; q < 2; q++) {
        assert_int_equal(req_state(&f, VHOST_USER_GET_VRING_BASE, q, 0), VUF_PASS);
        uint32_t st[2] = {q, 17};
        m = mk(VHOST_USER_GET_VRING_BASE, REPLY, st, 8);
        assert_int_equal(vufilter_feed(&f, VUF_MAIN, Q, m.b, m.len, 0), VUF_PASS);
    }
    assert_int_equal(memreg(&f, VUF_REQ_REM_MEM_REG, rg(1ull << 32, 1ull << 30, UVA + (2ull << 30)),
                            0), VUF_PASS);
    assert_int_equal(f.nregions, 2);
    assert_int_equal(req(&f, VHOST_USER_RESET_OWNER, NULL, 0, 0), VUF_PASS);
    assert_false(f.dead);
}

static void test_forbidden_requests(void **state)
{
    static const uint32_t bad[] = {0, 6, 7, 19, 20, 22, 23, 26, 27, 28, 29, 30, 31, 32, 33,
                                   34, 35, 39, 40, 41, 42, 43, 44, 99, 0xffffffffu};
    for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct vufilter f;
        negotiate(&f, 2);
        uint8_t p[40] = {0};
        refused(&f, req(&f, bad[i], p, bad[i] == 28 || bad[i] == 29 || bad[i] == 30 ? 0 : 8, 0),
                "is not allowed");
        /* dead: even a good message is refused now */
        assert_int_equal(req(&f, VHOST_USER_SET_OWNER, NULL, 0, 0), VUF_REFUSE);
    }
    char buf[32];
    assert_string_equal(vufilter_request_name(28, buf, sizeof(buf)), "POSTCOPY_ADVISE");
    assert_string_equal(vufilter_request_name(1000, buf, sizeof(buf)), "request 1000");
}

static void test_headers(void **state)
{
    struct vufilter f;
    vufilter_init(&f, 1, false);
    refused(&f, feed(&f, VUF_MAIN, T, VHOST_USER_SET_OWNER, 0, NULL, 0, 0), "version 0");
    vufilter_init(&f, 1, false);
    refused(&f, feed(&f, VUF_MAIN, T, VHOST_USER_SET_OWNER, 2, NULL, 0, 0), "version 2");
    vufilter_init(&f, 1, false);
    refused(&f, feed(&f, VUF_MAIN, T, VHOST_USER_SET_OWNER, V | 0x10, NULL, 0, 0),
            "unknown flags");
    vufilter_init(&f, 1, false);
    refused(&f, feed(&f, VUF_MAIN, T, VHOST_USER_SET_OWNER, REPLY, NULL, 0, 0),
            "a reply from the front-end");
    /* a size too large is refused from the header alone */
    vufilter_init(&f, 1, false);
    struct msg m = mk(VHOST_USER_SET_MEM_TABLE, V, NULL, 0);
    uint32_t big = VUF_PAYLOAD_MAX + 1;
    memcpy(m.b + 8, &big, 4);
    refused(&f, vufilter_check_header(&f, VUF_MAIN, T, m.b), "at most");
    vufilter_init(&f, 1, false);
    big = 0xffffffffu;
    memcpy(m.b + 8, &big, 4);
    refused(&f, vufilter_check_header(&f, VUF_BACKEND, Q, m.b), "back-end channel");
    /* the length must match the header */
    vufilter_init(&f, 1, false);
    m = mk(VHOST_USER_SET_OWNER, V, NULL, 0);
    refused(&f, vufilter_feed(&f, VUF_MAIN, T, m.b, 20, 0), "does not match");
    vufilter_init(&f, 1, false);
    refused(&f, vufilter_feed(&f, VUF_MAIN, T, m.b, 4, 0), "does not match");
    assert_int_equal(vufilter_init(&f, 0, false), -EINVAL);
    assert_int_equal(vufilter_init(&f, VUF_MAX_QUEUES + 1, false), -EINVAL);
}

static void test_sizes_and_fds(void **state)
{
    struct vufilter f;
    negotiate(&f, 2);
    uint64_t z = 0;
    refused(&f, req(&f, VHOST_USER_SET_OWNER, &z, 8, 0), "payload of 8 bytes, want 0");
    negotiate(&f, 2);
    refused(&f, req(&f, VHOST_USER_GET_FEATURES, &z, 8, 0), "want 0");
    negotiate(&f, 2);
    refused(&f, req(&f, VHOST_USER_SET_VRING_NUM, &z, 4, 0), "want 8");
    negotiate(&f, 2);
    refused(&f, req(&f, VHOST_USER_SET_OWNER, NULL, 0, 1), "1 descriptors");
    negotiate(&f, 2);
    refused(&f, req_state(&f, VHOST_USER_SET_VRING_NUM, 0, 256) == VUF_PASS
                    ? req(&f, VHOST_USER_GET_QUEUE_NUM, NULL, 0, 3)
                    : VUF_REFUSE,
            "3 descriptors");
    negotiate(&f, 2);
    refused(&f, req(&f, VHOST_USER_SET_BACKEND_REQ_FD, NULL, 0, 0), "0 descriptors");
    negotiate(&f, 2);
    refused(&f, feed(&f, VUF_MAIN, T, VHOST_USER_SET_OWNER, V, NULL, 0, 9), "9 descriptors");
    /* kick/call/err: one fd, or none with the no-fd bit */
    negotiate(&f, 2);
    assert_int_equal(req_u64(&f, VHOST_USER_SET_VRING_KICK, 1 | VHOST_USER_VRING_NOFD_MASK, 0),
                     VUF_PASS);
    refused(&f, req_u64(&f, VHOST_USER_SET_VRING_KICK, 1 | VHOST_USER_VRING_NOFD_MASK, 1),
            "1 descriptors, want 0");
    negotiate(&f, 2);
    refused(&f, req_u64(&f, VHOST_USER_SET_VRING_CALL, 0, 0), "0 descriptors, want 1");
    negotiate(&f, 2);
    refused(&f, req_u64(&f, VHOST_USER_SET_VRING_ERR, 0x10000, 1), "unknown bits");
}

static void test_queue_index(void **state)
{
    static const uint32_t reqs[] = {VHOST_USER_SET_VRING_NUM, VHOST_USER_SET_VRING_BASE,
                                    VHOST_USER_GET_VRING_BASE, VHOST_USER_SET_VRING_ENABLE};
    for (unsigned i = 0; i < 4; i++) {
        struct vufilter f;
        negotiate(&f, 2);
        assert_int_equal(req_state(&f, reqs[i], 1, 1), VUF_PASS);
        refused(&f, req_state(&f, reqs[i], 2, 1), "queue index 2, the export has 2");
        negotiate(&f, 2);
        refused(&f, req_state(&f, reqs[i], 0xffffffffu, 1), "queue index");
    }
    static const uint32_t files[] = {VHOST_USER_SET_VRING_KICK, VHOST_USER_SET_VRING_CALL,
                                     VHOST_USER_SET_VRING_ERR};
    for (unsigned i = 0; i < 3; i++) {
        struct vufilter f;
        negotiate(&f, 2);
        assert_int_equal(req_u64(&f, files[i], 1, 1), VUF_PASS);
        refused(&f, req_u64(&f, files[i], 2, 1), "queue index 2");
        negotiate(&f, 2);
        refused(&f, req_u64(&f, files[i], 255, 1), "queue index 255");
    }
    struct vufilter f;
    negotiate(&f, 2);
    refused(&f, ring_addr(&f, 2, 0, UVA, UVA, UVA), "queue index 2");
    /* GET_QUEUE_NUM lowers the bound, and caps what the tenant is told */
    negotiate(&f, 4);
    uint64_t out;
    assert_int_equal(req(&f, VHOST_USER_GET_QUEUE_NUM, NULL, 0, 0), VUF_PASS);
    assert_int_equal(reply_u64(&f, VHOST_USER_GET_QUEUE_NUM, 1, &out), VUF_PASS);
    assert_int_equal(out, 1);
    refused(&f, req_state(&f, VHOST_USER_SET_VRING_NUM, 1, 128), "the export has 1");
    negotiate(&f, 2);
    assert_int_equal(req(&f, VHOST_USER_GET_QUEUE_NUM, NULL, 0, 0), VUF_PASS);
    assert_int_equal(reply_u64(&f, VHOST_USER_GET_QUEUE_NUM, 16, &out), VUF_MODIFIED);
    assert_int_equal(out, 2);
    negotiate(&f, 2);
    assert_int_equal(req(&f, VHOST_USER_GET_QUEUE_NUM, NULL, 0, 0), VUF_PASS);
    refused(&f, reply_u64(&f, VHOST_USER_GET_QUEUE_NUM, 0, NULL), "0 queues");
}

static void test_vring_values(void **state)
{
    static const uint32_t ok[] = {1, 2, 128, 256, 1024};
    static const uint32_t bad[] = {0, 3, 100, 2048, 0x80000000u, 0xffffffffu};
    for (unsigned i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        struct vufilter f;
        negotiate(&f, 1);
        assert_int_equal(req_state(&f, VHOST_USER_SET_VRING_NUM, 0, ok[i]), VUF_PASS);
    }
    for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct vufilter f;
        negotiate(&f, 1);
        refused(&f, req_state(&f, VHOST_USER_SET_VRING_NUM, 0, bad[i]), "a power of two");
    }
    struct vufilter f;
    negotiate(&f, 1);
    assert_int_equal(req_state(&f, VHOST_USER_SET_VRING_BASE, 0, 0xffff), VUF_PASS);
    refused(&f, req_state(&f, VHOST_USER_SET_VRING_BASE, 0, 0x10000), "16-bit");
    negotiate(&f, 1);
    refused(&f, req_state(&f, VHOST_USER_SET_VRING_ENABLE, 0, 2), "enable is 2");
}

static void test_mem_table(void **state)
{
    struct vufilter f;
    struct vhost_user_mem_region r[8];
    for (unsigned i = 0; i < 8; i++)
        r[i] = rg(i * 2 * MIB, MIB, UVA + i * 4 * MIB);
    negotiate(&f, 1);
    assert_int_equal(table(&f, 8, r, 8, 8), VUF_PASS);
    assert_int_equal(f.nregions, 8);
    static const uint32_t counts[] = {0, 9, 255, 0xffffffffu};
    for (unsigned i = 0; i < 4; i++) {
        negotiate(&f, 1);
        refused(&f, table(&f, counts[i], r, 1, 1), "regions (1 to 8 allowed)");
    }
    negotiate(&f, 1);
    refused(&f, table(&f, 2, r, 1, 1), "payload of 40 bytes for 2 regions");
    negotiate(&f, 1);
    refused(&f, table(&f, 2, r, 2, 1), "1 descriptors for 2 regions");
    negotiate(&f, 1);
    refused(&f, req(&f, VHOST_USER_SET_MEM_TABLE, r, 4, 1), "payload of 4 bytes");
    struct {
        struct vhost_user_mem_region g;
        const char *why;
    } bad[] = {
        {rg(0, 0, UVA), "size 0"},
        {rg(0, MIB, UVA + 1), "not aligned"},
        {(struct vhost_user_mem_region){0, MIB, UVA, 0x800}, "not aligned"},
        {rg(0xfffffffffff00000ull, MIB * 2, UVA), "overflows"},
        {rg(0, MIB * 2, 0xfffffffffff00000ull), "overflows"},
        {(struct vhost_user_mem_region){0, MIB * 2, UVA, 0xfffffffffff00000ull}, "overflows"},
    };
    for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        negotiate(&f, 1);
        refused(&f, table(&f, 1, &bad[i].g, 1, 1), bad[i].why);
    }
    /* overlapping and adjacent in guest-physical space */
    struct vhost_user_mem_region two[2] = {rg(0, 2 * MIB, UVA), rg(MIB, MIB, UVA + 8 * MIB)};
    negotiate(&f, 1);
    refused(&f, table(&f, 2, two, 2, 2), "overlap");
    two[1].guest_phys_addr = 2 * MIB;
    negotiate(&f, 1);
    refused(&f, table(&f, 2, two, 2, 2), "adjacent");
    two[0].guest_phys_addr = 3 * MIB; /* the other side */
    negotiate(&f, 1);
    refused(&f, table(&f, 2, two, 2, 2), "adjacent");
    /* allowed on request (--allow-adjacent-regions) */
    vufilter_init(&f, 1, true);
    two[0].guest_phys_addr = 0;
    assert_int_equal(table(&f, 2, two, 2, 2), VUF_PASS);
    two[1].guest_phys_addr = MIB;
    vufilter_init(&f, 1, true);
    refused(&f, table(&f, 2, two, 2, 2), "overlap");
}

static void test_mem_slots(void **state)
{
    struct vufilter f;
    vufilter_init(&f, 1, false);
    refused(&f, memreg(&f, VUF_REQ_ADD_MEM_REG, rg(0, MIB, UVA), 1), "without CONFIGURE_MEM_SLOTS");
    /* the back-end announces 2 slots */
    vufilter_init(&f, 1, false);
    uint64_t out;
    req(&f, VHOST_USER_GET_PROTOCOL_FEATURES, NULL, 0, 0);
    reply_u64(&f, VHOST_USER_GET_PROTOCOL_FEATURES, QSD_PROTOCOL, &out);
    req_u64(&f, VHOST_USER_SET_PROTOCOL_FEATURES, out, 0);
    refused(&f, memreg(&f, VUF_REQ_ADD_MEM_REG, rg(0, MIB, UVA), 1), "announced 0 slots");
    f.dead = false;
    req(&f, VUF_REQ_GET_MAX_MEM_SLOTS, NULL, 0, 0);
    assert_int_equal(reply_u64(&f, VUF_REQ_GET_MAX_MEM_SLOTS, 2, NULL), VUF_PASS);
    assert_int_equal(memreg(&f, VUF_REQ_ADD_MEM_REG, rg(0, MIB, UVA), 1), VUF_PASS);
    refused(&f, memreg(&f, VUF_REQ_ADD_MEM_REG, rg(0, MIB, UVA), 0), "0 descriptors");
    f.dead = false;
    refused(&f, memreg(&f, VUF_REQ_ADD_MEM_REG, rg(MIB, MIB, UVA + 4 * MIB), 1), "adjacent");
    f.dead = false;
    refused(&f, memreg(&f, VUF_REQ_ADD_MEM_REG, rg(0, 0, UVA), 1), "size 0");
    f.dead = false;
    assert_int_equal(memreg(&f, VUF_REQ_ADD_MEM_REG, rg(4 * MIB, MIB, UVA + 4 * MIB), 1),
                     VUF_PASS);
    refused(&f, memreg(&f, VUF_REQ_ADD_MEM_REG, rg(8 * MIB, MIB, UVA + 8 * MIB), 1),
            "announced 2 slots");
    f.dead = false;
    refused(&f, memreg(&f, VUF_REQ_REM_MEM_REG, rg(8 * MIB, MIB, UVA + 8 * MIB), 0),
            "no such region");
    f.dead = false;
    assert_int_equal(memreg(&f, VUF_REQ_REM_MEM_REG, rg(0, MIB, UVA), 0), VUF_PASS);
    assert_int_equal(memreg(&f, VUF_REQ_ADD_MEM_REG, rg(8 * MIB, MIB, UVA + 8 * MIB), 1),
                     VUF_PASS);
    /* a back-end announcing more than libvhost-user's 32 slots is capped */
    vufilter_init(&f, 1, false);
    req(&f, VUF_REQ_GET_MAX_MEM_SLOTS, NULL, 0, 0);
    assert_int_equal(reply_u64(&f, VUF_REQ_GET_MAX_MEM_SLOTS, 509, &out), VUF_MODIFIED);
    assert_int_equal(out, VUF_MAX_REGIONS);
}

static void test_rings(void **state)
{
    struct vufilter f;
    struct vhost_user_mem_region one = rg(0, MIB, UVA);
    uint64_t end = UVA + MIB;
    negotiate(&f, 1);
    table(&f, 1, &one, 1, 1);
    req_state(&f, VHOST_USER_SET_VRING_NUM, 0, 1024);
    /* 1024 descriptors are 16 KiB: at end - 16 KiB they fit, one byte later not */
    assert_int_equal(ring_addr(&f, 0, 0, end - 16384, end - 8192 - 6, end - 2048 - 6),
                     VUF_PASS);
    refused(&f, ring_addr(&f, 0, 0, end - 16384 + 16, end - 8192 - 6, end - 2048 - 6),
            "descriptor table (1024 entries) runs past");
    negotiate(&f, 1);
    table(&f, 1, &one, 1, 1);
    req_state(&f, VHOST_USER_SET_VRING_NUM, 0, 1024);
    refused(&f, ring_addr(&f, 0, 0, UVA, end - 8192, UVA + 16384), "used ring");
    negotiate(&f, 1);
    table(&f, 1, &one, 1, 1);
    req_state(&f, VHOST_USER_SET_VRING_NUM, 0, 1024);
    refused(&f, ring_addr(&f, 0, 0, UVA, UVA + 65536, end - 2048), "available ring");
    negotiate(&f, 1);
    table(&f, 1, &one, 1, 1);
    refused(&f, ring_addr(&f, 0, 0, end, UVA, UVA), "in no memory region");
    negotiate(&f, 1);
    table(&f, 1, &one, 1, 1);
    refused(&f, ring_addr(&f, 0, 1, UVA, UVA + 65536, UVA + 32768), "no dirty logging");
    /* a bigger ring later, with the old addresses: refused */
    negotiate(&f, 1);
    table(&f, 1, &one, 1, 1);
    req_state(&f, VHOST_USER_SET_VRING_NUM, 0, 64);
    assert_int_equal(ring_addr(&f, 0, 0, end - 1024, UVA, UVA + 4096), VUF_PASS);
    refused(&f, req_state(&f, VHOST_USER_SET_VRING_NUM, 0, 128), "runs past");
    /* a new table under the old addresses: cut short is refused, gone is not */
    negotiate(&f, 1);
    table(&f, 1, &one, 1, 1);
    req_state(&f, VHOST_USER_SET_VRING_NUM, 0, 64);
    assert_int_equal(ring_addr(&f, 0, 0, UVA + 65536, UVA, UVA + 4096), VUF_PASS);
    struct vhost_user_mem_region other = rg(0, MIB, UVA + 16 * MIB);
    assert_int_equal(table(&f, 1, &other, 1, 1), VUF_PASS); /* gone: QSD fails cleanly */
    struct vhost_user_mem_region cut = rg(0, 65536 + 4096, UVA);
    assert_int_equal(table(&f, 1, &cut, 1, 1), VUF_PASS); /* 64 descriptors fit */
    assert_int_equal(table(&f, 1, &one, 1, 1), VUF_PASS);
    assert_int_equal(req_state(&f, VHOST_USER_SET_VRING_NUM, 0, 512), VUF_PASS);
    refused(&f, table(&f, 1, &cut, 1, 1), "runs past");
}

static void test_features(void **state)
{
    struct vufilter f;
    vufilter_init(&f, 1, false);
    refused(&f, req_u64(&f, VHOST_USER_SET_FEATURES, 1ull << 32, 0), "before GET_FEATURES");
    vufilter_init(&f, 1, false);
    refused(&f, req_u64(&f, VHOST_USER_SET_PROTOCOL_FEATURES, 1, 0),
            "before GET_PROTOCOL_FEATURES");
    negotiate(&f, 1);
    assert_int_equal(req_u64(&f, VHOST_USER_SET_FEATURES, 1ull << 32 | 1ull << 30, 0), VUF_PASS);
    refused(&f, req_u64(&f, VHOST_USER_SET_FEATURES, 1ull << 32 | 1ull << 26, 0),
            "not a subset");
    negotiate(&f, 1);
    refused(&f, req_u64(&f, VHOST_USER_SET_PROTOCOL_FEATURES, 1ull << 8, 0), "not a subset");
    negotiate(&f, 1);
    refused(&f, req_u64(&f, VHOST_USER_SET_PROTOCOL_FEATURES, 1ull << 12, 0), "not a subset");
    /* every unsafe bit a back-end could offer is removed */
    vufilter_init(&f, 1, false);
    uint64_t out;
    req(&f, VHOST_USER_GET_FEATURES, NULL, 0, 0);
    assert_int_equal(reply_u64(&f, VHOST_USER_GET_FEATURES, ~0ull, &out), VUF_MODIFIED);
    assert_int_equal(out, vufilter_safe_features);
    assert_false(out & (1ull << 26 | 1ull << 33 | 1ull << 34));
    req(&f, VHOST_USER_GET_PROTOCOL_FEATURES, NULL, 0, 0);
    assert_int_equal(reply_u64(&f, VHOST_USER_GET_PROTOCOL_FEATURES, ~0ull, &out), VUF_MODIFIED);
    assert_int_equal(out, 0x8229);
    /* an offer already safe passes untouched */
    req(&f, VHOST_USER_GET_FEATURES, NULL, 0, 0);
    assert_int_equal(reply_u64(&f, VHOST_USER_GET_FEATURES, 1ull << 32, NULL), VUF_PASS);
}

static void test_config(void **state)
{
    struct vufilter f;
    uint8_t p[12 + 100] = {0};
    struct {
        uint32_t off, len, flags, size;
        const char *why;
    } bad[] = {
        {0, 97, 0, 12 + 97, "outside virtio_blk_config"},
        {90, 7, 0, 12 + 7, "outside"},
        {0xffffffffu, 2, 0, 14, "outside"},
        {8, 0xfffffffcu, 0, 12, "outside"},
        {0, 0, 0, 12, "outside"},
        {0, 60, 0, 12 + 59, "payload of 71 bytes for 60"},
        {0, 8, 1, 20, "flags 0x1"},
    };
    for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        negotiate(&f, 1);
        uint32_t h[3] = {bad[i].off, bad[i].len, bad[i].flags};
        memcpy(p, h, 12);
        refused(&f, req(&f, VHOST_USER_GET_CONFIG, p, bad[i].size, 0), bad[i].why);
    }
    negotiate(&f, 1);
    uint32_t h[3] = {0, 96, 0};
    memcpy(p, h, 12);
    assert_int_equal(req(&f, VHOST_USER_GET_CONFIG, p, 12 + 96, 0), VUF_PASS);
    refused(&f, feed(&f, VUF_MAIN, Q, VHOST_USER_GET_CONFIG, REPLY, p, 12 + 8, 0), "want 108");
    negotiate(&f, 1);
    assert_int_equal(req(&f, VHOST_USER_GET_CONFIG, p, 12 + 96, 0), VUF_PASS);
    /* libvhost-user answers a failed GET_CONFIG with size 0 */
    assert_int_equal(feed(&f, VUF_MAIN, Q, VHOST_USER_GET_CONFIG, REPLY, NULL, 0, 0), VUF_PASS);
    /* SET_CONFIG: only the wce byte, 0 or 1 */
    uint8_t s[13] = {VUF_BLK_CONFIG_WCE, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0};
    assert_int_equal(req(&f, VHOST_USER_SET_CONFIG, s, 13, 0), VUF_PASS);
    s[12] = 2;
    refused(&f, req(&f, VHOST_USER_SET_CONFIG, s, 13, 0), "wce=2");
    negotiate(&f, 1);
    s[0] = 0;
    s[12] = 1;
    refused(&f, req(&f, VHOST_USER_SET_CONFIG, s, 13, 0), "only wce");
    negotiate(&f, 1);
    uint8_t cap[20] = {0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0xff};
    refused(&f, req(&f, VHOST_USER_SET_CONFIG, cap, 20, 0), "want 13");
}

static void test_replies(void **state)
{
    struct vufilter f;
    negotiate(&f, 1);
    refused(&f, reply_u64(&f, VHOST_USER_GET_FEATURES, 1, NULL), "to nothing");
    negotiate(&f, 1);
    req(&f, VHOST_USER_GET_FEATURES, NULL, 0, 0);
    refused(&f, reply_u64(&f, VHOST_USER_GET_PROTOCOL_FEATURES, 1, NULL),
            "replied GET_PROTOCOL_FEATURES to GET_FEATURES");
    negotiate(&f, 1);
    req(&f, VHOST_USER_GET_FEATURES, NULL, 0, 0);
    uint64_t v = 0;
    refused(&f, feed(&f, VUF_MAIN, Q, VHOST_USER_GET_FEATURES, REPLY, &v, 8, 1), "descriptors");
    negotiate(&f, 1);
    req(&f, VHOST_USER_GET_FEATURES, NULL, 0, 0);
    refused(&f, feed(&f, VUF_MAIN, Q, VHOST_USER_GET_FEATURES, V, &v, 8, 0), "not a reply");
    negotiate(&f, 1);
    req(&f, VHOST_USER_GET_FEATURES, NULL, 0, 0);
    refused(&f, feed(&f, VUF_MAIN, Q, VHOST_USER_GET_FEATURES, REPLY, &v, 4, 0), "4 bytes");
    /* NEED_REPLY: one u64 acknowledgement, in order */
    negotiate(&f, 1);
    uint32_t st[2] = {0, 128};
    assert_int_equal(feed(&f, VUF_MAIN, T, VHOST_USER_SET_VRING_NUM,
                          V | VHOST_USER_NEED_REPLY_MASK, st, 8, 0), VUF_PASS);
    assert_int_equal(req(&f, VHOST_USER_GET_QUEUE_NUM, NULL, 0, 0), VUF_PASS);
    assert_int_equal(reply_u64(&f, VHOST_USER_SET_VRING_NUM, 0, NULL), VUF_PASS);
    assert_int_equal(reply_u64(&f, VHOST_USER_GET_QUEUE_NUM, 1, NULL), VUF_PASS);
    /* bounded: no more than VUF_MAX_PENDING requests awaiting replies */
    negotiate(&f, 1);
    for (unsigned i = 0; i < VUF_MAX_PENDING; i++)
        assert_int_equal(req(&f, VHOST_USER_GET_FEATURES, NULL, 0, 0), VUF_PASS);
    refused(&f, req(&f, VHOST_USER_GET_FEATURES, NULL, 0, 0), "awaiting replies");
}

static void test_backend_channel(void **state)
{
    struct vufilter f;
    vufilter_init(&f, 1, false);
    refused(&f, req(&f, VHOST_USER_SET_BACKEND_REQ_FD, NULL, 0, 1), "without BACKEND_REQ");
    negotiate(&f, 1);
    assert_int_equal(req(&f, VHOST_USER_SET_BACKEND_REQ_FD, NULL, 0, 1), VUF_PASS);
    refused(&f, req(&f, VHOST_USER_SET_BACKEND_REQ_FD, NULL, 0, 1), "a second time");
    /* the QSD announces a resize, with or without asking for a reply */
    negotiate(&f, 1);
    assert_int_equal(feed(&f, VUF_BACKEND, Q, VHOST_USER_BACKEND_CONFIG_CHANGE_MSG, V, NULL, 0, 0),
                     VUF_PASS);
    assert_int_equal(feed(&f, VUF_BACKEND, Q, VHOST_USER_BACKEND_CONFIG_CHANGE_MSG,
                          V | VHOST_USER_NEED_REPLY_MASK, NULL, 0, 0), VUF_PASS);
    uint64_t ok = 0;
    assert_int_equal(feed(&f, VUF_BACKEND, T, VHOST_USER_BACKEND_CONFIG_CHANGE_MSG, REPLY, &ok, 8,
                          0), VUF_PASS);
    refused(&f, feed(&f, VUF_BACKEND, T, VHOST_USER_BACKEND_CONFIG_CHANGE_MSG, REPLY, &ok, 8, 0),
            "replied to nothing");
    negotiate(&f, 1);
    refused(&f, feed(&f, VUF_BACKEND, T, VHOST_USER_BACKEND_CONFIG_CHANGE_MSG, V, NULL, 0, 0),
            "front-end sent request");
    negotiate(&f, 1);
    feed(&f, VUF_BACKEND, Q, VHOST_USER_BACKEND_CONFIG_CHANGE_MSG, V | VHOST_USER_NEED_REPLY_MASK,
         NULL, 0, 0);
    refused(&f, feed(&f, VUF_BACKEND, T, VHOST_USER_BACKEND_CONFIG_CHANGE_MSG, REPLY, &ok, 4, 0),
            "reply 2 of 4 bytes");
    negotiate(&f, 1);
    refused(&f, feed(&f, VUF_BACKEND, T, VHOST_USER_BACKEND_CONFIG_CHANGE_MSG, REPLY, &ok, 8, 1),
            "descriptors");
    static const uint32_t bad[] = {VHOST_USER_BACKEND_IOTLB_MSG,
                                   VHOST_USER_BACKEND_VRING_HOST_NOTIFIER_MSG, 4, 6, 99};
    for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        negotiate(&f, 1);
        refused(&f, feed(&f, VUF_BACKEND, Q, bad[i], V, NULL, 0, 0), "is not allowed");
    }
    negotiate(&f, 1);
    refused(&f, feed(&f, VUF_BACKEND, Q, VHOST_USER_BACKEND_CONFIG_CHANGE_MSG, V, &ok, 8, 0),
            "of 8 bytes");
    negotiate(&f, 1);
    refused(&f, feed(&f, VUF_BACKEND, Q, VHOST_USER_BACKEND_CONFIG_CHANGE_MSG, REPLY, NULL, 0, 0),
            "a reply from the back-end");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qemu_session),   cmocka_unit_test(test_forbidden_requests),
        cmocka_unit_test(test_headers),        cmocka_unit_test(test_sizes_and_fds),
        cmocka_unit_test(test_queue_index),    cmocka_unit_test(test_vring_values),
        cmocka_unit_test(test_mem_table),      cmocka_unit_test(test_mem_slots),
        cmocka_unit_test(test_rings),          cmocka_unit_test(test_features),
        cmocka_unit_test(test_config),         cmocka_unit_test(test_replies),
        cmocka_unit_test(test_backend_channel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
