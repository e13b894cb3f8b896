/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/vhost/virtqueue.c: split virtqueue, driver side (see virtqueue.h). */
#include "qsd/vhost/virtqueue.h"

#include <errno.h>
#include <string.h>

#include "qsd/base/util.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "virtqueue.c assumes a little-endian host (virtio 1.x rings are LE)"
#endif

#define ALIGN_UP(x, a) (((x) + (a)-1) & ~((size_t)(a)-1))

size_t vq_avail_offset(uint16_t num)
{
    return (size_t)num * sizeof(struct vring_desc);
}

size_t vq_used_offset(uint16_t num)
{
    /* avail: flags, idx, ring[num], used_event */
    return ALIGN_UP(vq_avail_offset(num) + 4 + 2 * (size_t)num + 2, 64);
}

size_t vq_ring_size(uint16_t num)
{
    /* used: flags, idx, ring[num] (8 bytes each), avail_event */
    return ALIGN_UP(vq_used_offset(num) + 4 + 8 * (size_t)num + 2, 64);
}

int vq_init(struct virtqueue *vq, void *mem, uint16_t num, bool event_idx)
{
    if (num == 0 || num > 32768 || (num & (num - 1)) || ((uintptr_t)mem & 15))
        return -EINVAL;
    memset(mem, 0, vq_ring_size(num));
    *vq = (struct virtqueue){
        .num = num,
        .event_idx = event_idx,
        .desc = mem,
        .avail = (struct vring_avail *)((char *)mem + vq_avail_offset(num)),
        .used = (struct vring_used *)((char *)mem + vq_used_offset(num)),
        .free_head = 0,
        .num_free = num,
        .cookies = xcalloc(num, sizeof(void *)),
        .chain_len = xcalloc(num, sizeof(uint16_t)),
    };
    for (uint16_t i = 0; i < num; i++)
        vq->desc[i].next = (uint16_t)(i + 1 < num ? i + 1 : 0);
    return 0;
}

void vq_destroy(struct virtqueue *vq)
{
    if (!vq)
        return;
    free(vq->cookies);
    free(vq->chain_len);
    vq->cookies = NULL;
    vq->chain_len = NULL;
}

int vq_add(struct virtqueue *vq, const struct vq_buf *bufs, unsigned n, void *cookie)
{
    if (n == 0)
        return -EINVAL;
    if (n > vq->num_free)
        return -ENOSPC;
    /* Device-readable buffers must come before device-writable ones. */
    for (unsigned i = 1; i < n; i++)
        if (bufs[i - 1].device_writes && !bufs[i].device_writes)
            return -EINVAL;

    uint16_t head = vq->free_head, d = head, last = head;
    for (unsigned i = 0; i < n; i++) {
        struct vring_desc *desc = &vq->desc[d];
        desc->addr = bufs[i].addr;
        desc->len = bufs[i].len;
        desc->flags = (uint16_t)((bufs[i].device_writes ? VRING_DESC_F_WRITE : 0) |
                                 (i + 1 < n ? VRING_DESC_F_NEXT : 0));
        last = d;
        d = desc->next; /* free list link doubles as chain link */
    }
    vq->free_head = vq->desc[last].next;
    vq->num_free = (uint16_t)(vq->num_free - n);
    vq->cookies[head] = cookie;
    vq->chain_len[head] = (uint16_t)n;

    vq->avail->ring[vq->avail_idx & (vq->num - 1)] = head;
    vq->avail_idx++;
    return head;
}

void vq_publish(struct virtqueue *vq)
{
    /* Descriptors and ring entries before the index. */
    __atomic_store_n(&vq->avail->idx, vq->avail_idx, __ATOMIC_RELEASE);
}

bool vq_kick_needed(struct virtqueue *vq)
{
    /* The index store must be visible before we read the device's wishes:
     * full barrier (the device does the mirror-image check). */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    uint16_t old = vq->kicked_idx, new_idx = vq->avail_idx;
    vq->kicked_idx = new_idx;
    if (old == new_idx)
        return false;
    if (vq->event_idx)
        return vring_need_event(__atomic_load_n(vq_avail_event(vq), __ATOMIC_RELAXED),
                                new_idx, old);
    return !(__atomic_load_n(&vq->used->flags, __ATOMIC_RELAXED) & VRING_USED_F_NO_NOTIFY);
}

bool vq_has_used(const struct virtqueue *vq)
{
    return __atomic_load_n(&vq->used->idx, __ATOMIC_ACQUIRE) != vq->last_used;
}

bool vq_get_used(struct virtqueue *vq, void **cookie, uint32_t *len)
{
    if (!vq_has_used(vq))
        return false;
    struct vring_used_elem *e = &vq->used->ring[vq->last_used & (vq->num - 1)];
    uint32_t id = e->id, l = e->len;
    if (id >= vq->num || vq->chain_len[id] == 0) {
        /* A device bug; skip the entry rather than corrupt the free list. */
        vq->last_used++;
        return false;
    }
    vq->last_used++;
    /* Return the chain to the free list. */
    uint16_t n = vq->chain_len[id], d = (uint16_t)id;
    for (uint16_t i = 1; i < n; i++)
        d = vq->desc[d].next;
    vq->desc[d].next = vq->free_head;
    vq->free_head = (uint16_t)id;
    vq->num_free = (uint16_t)(vq->num_free + n);
    vq->chain_len[id] = 0;
    *cookie = vq->cookies[id];
    vq->cookies[id] = NULL;
    *len = l;
    return true;
}

bool vq_enable_cb(struct virtqueue *vq)
{
    if (vq->event_idx)
        __atomic_store_n(vq_used_event(vq), vq->last_used, __ATOMIC_RELAXED);
    else
        __atomic_store_n(&vq->avail->flags, 0, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return vq_has_used(vq);
}

void vq_disable_cb(struct virtqueue *vq)
{
    if (!vq->event_idx)
        __atomic_store_n(&vq->avail->flags, VRING_AVAIL_F_NO_INTERRUPT, __ATOMIC_RELAXED);
    /* With EVENT_IDX, simply not advancing used_event suppresses interrupts
     * once the device has passed it. */
}
