/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for virtqueue.c: the split ring driven in plain memory, the test
 * playing the device (reading avail, writing used). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "qsd/vhost/virtqueue.h"

struct ring {
    struct virtqueue vq;
    void *mem;
    uint16_t dev_last_avail; /* device side */
    uint16_t dev_used_idx;
};

static struct ring *ring_new(uint16_t num, bool event_idx)
{
    struct ring *r = calloc(1, sizeof(*r));
    assert_non_null(r);
    assert_int_equal(posix_memalign(&r->mem, 4096, vq_ring_size(num)), 0);
    assert_int_equal(vq_init(&r->vq, r->mem, num, event_idx), 0);
    return r;
}

static void ring_free(struct ring *r)
{
    vq_destroy(&r->vq);
    free(r->mem);
    free(r);
}

/* Device: take the next available chain, check it, complete it with len. */
static uint16_t dev_take(struct ring *r, unsigned *ret_n, uint32_t *ret_total)
{
    struct virtqueue *vq = &r->vq;
    assert_true(vq->avail->idx != r->dev_last_avail);
    uint16_t head = vq->avail->ring[r->dev_last_avail++ & (vq->num - 1)];
    unsigned n = 0;
    uint32_t total = 0;
    for (uint16_t d = head;; d = vq->desc[d].next) {
        assert_true(d < vq->num);
        n++;
        total += vq->desc[d].len;
        if (!(vq->desc[d].flags & VRING_DESC_F_NEXT))
            break;
        assert_true(n <= vq->num);
    }
    *ret_n = n;
    *ret_total = total;
    return head;
}

static void dev_complete(struct ring *r, uint16_t head, uint32_t len)
{
    struct virtqueue *vq = &r->vq;
    vq->used->ring[r->dev_used_idx & (vq->num - 1)] = (struct vring_used_elem){head, len};
    r->dev_used_idx++;
    vq->used->idx = r->dev_used_idx;
}

static void test_layout(void **state)
{
    /* desc 16-aligned at 0, avail after num descriptors, used 4-aligned */
    assert_int_equal(vq_avail_offset(128), 128 * 16);
    assert_true(vq_used_offset(128) >= 128 * 16 + 4 + 2 * 128 + 2);
    assert_int_equal(vq_used_offset(128) % 4, 0);
    assert_true(vq_ring_size(128) >= vq_used_offset(128) + 4 + 8 * 128 + 2);
    struct virtqueue vq;
    char mem[64] __attribute__((aligned(16)));
    assert_int_equal(vq_init(&vq, mem, 3, false), -EINVAL);  /* not a power of two */
    assert_int_equal(vq_init(&vq, mem, 0, false), -EINVAL);
    assert_int_equal(vq_init(&vq, mem + 1, 2, false), -EINVAL); /* misaligned */
}

static void test_add_complete_chains(void **state)
{
    struct ring *r = ring_new(8, false);
    struct virtqueue *vq = &r->vq;
    int cookies[4];
    struct vq_buf bufs[3] = {{0x1000, 16, false}, {0x2000, 4096, true}, {0x3000, 1, true}};
    for (int i = 0; i < 2; i++)
        assert_true(vq_add(vq, bufs, 3, &cookies[i]) >= 0);
    assert_int_equal(vq->num_free, 2);
    /* not visible before publish */
    assert_int_equal(vq->avail->idx, 0);
    vq_publish(vq);
    assert_int_equal(vq->avail->idx, 2);
    assert_int_equal(vq_add(vq, bufs, 3, &cookies[2]), -ENOSPC);

    unsigned n;
    uint32_t total;
    uint16_t h0 = dev_take(r, &n, &total);
    assert_int_equal(n, 3);
    assert_int_equal(total, 16 + 4096 + 1);
    assert_int_equal(vq->desc[h0].flags, VRING_DESC_F_NEXT);
    uint16_t d1 = vq->desc[h0].next;
    assert_int_equal(vq->desc[d1].flags, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE);
    assert_int_equal(vq->desc[vq->desc[d1].next].flags, VRING_DESC_F_WRITE);
    uint16_t h1 = dev_take(r, &n, &total);
    /* complete out of order */
    dev_complete(r, h1, 4097);
    dev_complete(r, h0, 1);
    void *c;
    uint32_t len;
    assert_true(vq_get_used(vq, &c, &len));
    assert_ptr_equal(c, &cookies[1]);
    assert_int_equal(len, 4097);
    assert_true(vq_get_used(vq, &c, &len));
    assert_ptr_equal(c, &cookies[0]);
    assert_false(vq_get_used(vq, &c, &len));
    assert_int_equal(vq->num_free, 8);
    ring_free(r);
}

static void test_wraparound_and_free_list(void **state)
{
    /* Many rounds with varying chain lengths: indices wrap past 65535 and
     * the free list never loses or duplicates a descriptor. */
    struct ring *r = ring_new(16, true);
    struct virtqueue *vq = &r->vq;
    struct vq_buf bufs[4] = {{1, 1, false}, {2, 2, false}, {3, 3, true}, {4, 4, true}};
    for (unsigned round = 0; round < 70000; round++) {
        unsigned n = 1 + round % 4;
        uintptr_t cookie = round + 1;
        assert_true(vq_add(vq, bufs + (4 - n), n, (void *)cookie) >= 0);
        vq_publish(vq);
        unsigned got_n;
        uint32_t total;
        uint16_t head = dev_take(r, &got_n, &total);
        assert_int_equal(got_n, n);
        dev_complete(r, head, total);
        void *c;
        uint32_t len;
        assert_true(vq_get_used(vq, &c, &len));
        assert_int_equal((uintptr_t)c, cookie);
        assert_int_equal(len, total);
        assert_int_equal(vq->num_free, 16);
    }
    assert_int_equal(vq->avail_idx, (uint16_t)70000);
    ring_free(r);
}

static void test_readable_after_writable_refused(void **state)
{
    struct ring *r = ring_new(4, false);
    struct vq_buf bad[2] = {{1, 1, true}, {2, 2, false}};
    assert_int_equal(vq_add(&r->vq, bad, 2, NULL), -EINVAL);
    assert_int_equal(vq_add(&r->vq, bad, 0, NULL), -EINVAL);
    assert_int_equal(r->vq.num_free, 4);
    ring_free(r);
}

static void test_need_event(void **state)
{
    /* The spec's rule: notify iff event_idx is in [old, new). */
    assert_true(vring_need_event(0, 1, 0));
    assert_false(vring_need_event(1, 1, 0));
    assert_true(vring_need_event(5, 10, 3));
    assert_false(vring_need_event(10, 10, 3));
    assert_false(vring_need_event(2, 10, 3));
    assert_true(vring_need_event(65535, 2, 65534)); /* across the wrap */
}

static void test_kick_event_idx(void **state)
{
    struct ring *r = ring_new(8, true);
    struct virtqueue *vq = &r->vq;
    struct vq_buf b = {1, 512, false};
    /* device asks to be kicked at avail index 0: the first add kicks */
    *vq_avail_event(vq) = 0;
    vq_add(vq, &b, 1, NULL);
    vq_publish(vq);
    assert_true(vq_kick_needed(vq));
    assert_false(vq_kick_needed(vq)); /* nothing new */
    /* device still busy, asked for index 5: adding #2 and #3 do not kick */
    *vq_avail_event(vq) = 5;
    vq_add(vq, &b, 1, NULL);
    vq_add(vq, &b, 1, NULL);
    vq_publish(vq);
    assert_false(vq_kick_needed(vq));
    vq_add(vq, &b, 1, NULL);
    vq_add(vq, &b, 1, NULL);
    vq_add(vq, &b, 1, NULL); /* avail idx 3 -> 6 crosses 5 */
    vq_publish(vq);
    assert_true(vq_kick_needed(vq));
    ring_free(r);
}

static void test_kick_no_notify_flag(void **state)
{
    struct ring *r = ring_new(8, false);
    struct vq_buf b = {1, 512, false};
    vq_add(&r->vq, &b, 1, NULL);
    vq_publish(&r->vq);
    assert_true(vq_kick_needed(&r->vq));
    r->vq.used->flags = VRING_USED_F_NO_NOTIFY;
    vq_add(&r->vq, &b, 1, NULL);
    vq_publish(&r->vq);
    assert_false(vq_kick_needed(&r->vq));
    ring_free(r);
}

static void test_enable_cb(void **state)
{
    struct ring *r = ring_new(8, true);
    struct virtqueue *vq = &r->vq;
    struct vq_buf b = {1, 512, true};
    vq_add(vq, &b, 1, NULL);
    vq_publish(vq);
    /* nothing used yet: used_event set to our position, no race reported */
    assert_false(vq_enable_cb(vq));
    assert_int_equal(*vq_used_event(vq), 0);
    unsigned n;
    uint32_t t;
    dev_complete(r, dev_take(r, &n, &t), 512);
    /* the device would notify: used idx moved past used_event */
    assert_true(vring_need_event(*vq_used_event(vq), vq->used->idx, 0));
    assert_true(vq_enable_cb(vq)); /* completion arrived meanwhile */
    void *c;
    uint32_t len;
    assert_true(vq_get_used(vq, &c, &len));
    assert_false(vq_enable_cb(vq));
    assert_int_equal(*vq_used_event(vq), 1);

    struct ring *r2 = ring_new(8, false);
    vq_disable_cb(&r2->vq);
    assert_int_equal(r2->vq.avail->flags, VRING_AVAIL_F_NO_INTERRUPT);
    vq_enable_cb(&r2->vq);
    assert_int_equal(r2->vq.avail->flags, 0);
    ring_free(r2);
    ring_free(r);
}

static void test_bogus_used_id(void **state)
{
    struct ring *r = ring_new(4, false);
    struct vq_buf b = {1, 512, true};
    vq_add(&r->vq, &b, 1, NULL);
    vq_publish(&r->vq);
    dev_complete(r, 3, 0); /* never handed out */
    void *c;
    uint32_t len;
    assert_false(vq_get_used(&r->vq, &c, &len));
    assert_int_equal(r->vq.num_free, 3);
    ring_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_add_complete_chains),
        cmocka_unit_test(test_wraparound_and_free_list),
        cmocka_unit_test(test_readable_after_writable_refused),
        cmocka_unit_test(test_need_event),
        cmocka_unit_test(test_kick_event_idx),
        cmocka_unit_test(test_kick_no_notify_flag),
        cmocka_unit_test(test_enable_cb),
        cmocka_unit_test(test_bogus_used_id),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
