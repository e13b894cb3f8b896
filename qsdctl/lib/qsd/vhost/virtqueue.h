/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/vhost/virtqueue.h: the driver side of a virtio split virtqueue (virtio 1.x,
 * section 2.7), with VIRTIO_F_RING_EVENT_IDX.
 *
 * Owns: the layout of descriptor table, available and used rings inside a
 * caller-provided memory area, descriptor allocation (free list), publishing
 * chains to the device, collecting used entries, and the notification
 * decisions in both directions (when to kick, what used_event to ask for).
 * No I/O and no system calls: the caller kicks and waits, so the ring logic is
 * unit-tested in plain memory with the test acting as the device.
 *
 * All ring fields are little-endian (VIRTIO_F_VERSION_1); this file assumes a
 * little-endian host (checked at compile time). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Constants from the virtio specification (and linux virtio_ring.h). */
#define VRING_DESC_F_NEXT 1
#define VRING_DESC_F_WRITE 2
#define VRING_DESC_F_INDIRECT 4
#define VRING_USED_F_NO_NOTIFY 1
#define VRING_AVAIL_F_NO_INTERRUPT 1

struct vring_desc {
    uint64_t addr;
    uint32_t len;
    uint16_t flags;
    uint16_t next;
};

struct vring_avail {
    uint16_t flags;
    uint16_t idx;
    uint16_t ring[]; /* num entries, then used_event */
};

struct vring_used_elem {
    uint32_t id;
    uint32_t len;
};

struct vring_used {
    uint16_t flags;
    uint16_t idx;
    struct vring_used_elem ring[]; /* num entries, then avail_event */
};

/* One buffer of a chain: address as the device sees it, length, and whether
 * the device writes it (device-writable buffers must follow readable ones). */
struct vq_buf {
    uint64_t addr;
    uint32_t len;
    bool device_writes;
};

struct virtqueue {
    uint16_t num;         /* ring size, a power of two */
    bool event_idx;       /* VIRTIO_F_RING_EVENT_IDX negotiated */
    struct vring_desc *desc;
    struct vring_avail *avail;
    struct vring_used *used;
    uint16_t free_head;   /* first free descriptor */
    uint16_t num_free;
    uint16_t avail_idx;   /* our shadow of avail->idx */
    uint16_t kicked_idx;  /* avail_idx at the last kick decision */
    uint16_t last_used;   /* next used entry to consume */
    void **cookies;       /* per head descriptor: caller's pointer */
    uint16_t *chain_len;  /* per head descriptor: descriptors in its chain */
};

/* Bytes needed for a ring of num entries, laid out desc | avail | used with
 * the spec's alignments (16, 2, 4); we start the used ring on a 64-byte
 * boundary so the driver-written and device-written parts share no cache line. */
size_t vq_ring_size(uint16_t num);
/* Offsets of avail and used inside the area (for SET_VRING_ADDR). */
size_t vq_avail_offset(uint16_t num);
size_t vq_used_offset(uint16_t num);

/* Lay out a ring of num entries (power of two, 1..32768) in mem, which must be
 * vq_ring_size(num) bytes, 16-byte aligned; zeroes it.  Returns 0 or -EINVAL. */
int vq_init(struct virtqueue *vq, void *mem, uint16_t num, bool event_idx);
void vq_destroy(struct virtqueue *vq);

/* Put a chain of n buffers on the ring (not yet visible to the device until
 * vq_publish).  Returns the head descriptor or -ENOSPC / -EINVAL. */
int vq_add(struct virtqueue *vq, const struct vq_buf *bufs, unsigned n, void *cookie);
/* Make added chains visible (store avail->idx with a release barrier). */
void vq_publish(struct virtqueue *vq);
/* After vq_publish: does the device want a notification (kick)?  Honours
 * avail_event (EVENT_IDX) or VRING_USED_F_NO_NOTIFY.  Resets the decision
 * window, so call it once per publish batch. */
bool vq_kick_needed(struct virtqueue *vq);

/* Take one used chain: returns true and sets *cookie / *len, false if none.
 * The chain's descriptors are freed. */
bool vq_get_used(struct virtqueue *vq, void **cookie, uint32_t *len);
/* Is there a used entry not consumed yet? */
bool vq_has_used(const struct virtqueue *vq);
/* Ask to be notified (call eventfd) when the next used entry arrives:
 * writes used_event = last_used (EVENT_IDX) or clears NO_INTERRUPT.  Returns
 * true if used entries arrived meanwhile (caller must not sleep then). */
bool vq_enable_cb(struct virtqueue *vq);
/* Tell the device we do not need interrupts (we are polling). */
void vq_disable_cb(struct virtqueue *vq);

/* Helpers shared with tests: the EVENT_IDX rule from the spec. */
static inline bool vring_need_event(uint16_t event_idx, uint16_t new_idx, uint16_t old)
{
    return (uint16_t)(new_idx - event_idx - 1) < (uint16_t)(new_idx - old);
}
static inline uint16_t *vq_used_event(struct virtqueue *vq)
{
    return &vq->avail->ring[vq->num];
}
static inline uint16_t *vq_avail_event(struct virtqueue *vq)
{
    return (uint16_t *)&vq->used->ring[vq->num];
}
