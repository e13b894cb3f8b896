/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/vhost/vufilter.h: the vhost-user message filter's decisions, no I/O.
 *
 * Owns: one connection's view of the vhost-user control protocol between a
 * tenant (an untrusted front-end, QEMU's vhost-user-blk device) and a QSD
 * (libvhost-user's back-end), and the verdict on each message: pass, pass
 * with a modified payload (feature masking, capped counts), or refuse with a
 * short reason.  Only what a virtio-blk front-end needs passes; each message
 * is checked for its size, its number of file descriptors, queue indices,
 * memory regions and ring placement; replies from the QSD must answer the
 * request in front of them.  The back-end request channel
 * (SET_BACKEND_REQ_FD) is judged here too: the QSD may only announce a
 * config change, the tenant may only answer it.
 *
 * The caller (qsdctl/vufilter_io.c) reads one whole message, feeds it here
 * and forwards it (with its fds) only on a pass; a refusal means both
 * connections are closed: the state is then dead.  Everything is bounded by
 * fixed arrays; nothing allocates. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define VUF_HDR_SIZE 12
#define VUF_PAYLOAD_MAX 264  /* SET_MEM_TABLE with 8 regions: 8 + 8 * 32 */
#define VUF_MSG_MAX (VUF_HDR_SIZE + VUF_PAYLOAD_MAX)
#define VUF_MAX_FDS 8        /* no message carries more */
#define VUF_MAX_QUEUES 64
#define VUF_MAX_REGIONS 32   /* libvhost-user's VHOST_USER_MAX_RAM_SLOTS */
#define VUF_TABLE_REGIONS 8  /* SET_MEM_TABLE: VHOST_MEMORY_BASELINE_NREGIONS */
#define VUF_MAX_VRING 1024   /* libvhost-user's VIRTQUEUE_MAX_SIZE */
#define VUF_MAX_PENDING 16   /* requests awaiting a reply, per channel */
#define VUF_BLK_CONFIG_SIZE 96 /* sizeof(struct virtio_blk_config), Linux 6.x */
#define VUF_BLK_CONFIG_WCE 32  /* offsetof(struct virtio_blk_config, wce) */

/* Requests numbers beyond vhost_user.h's (refused, named in reasons). */
enum {
    VUF_REQ_GET_MAX_MEM_SLOTS = 36,
    VUF_REQ_ADD_MEM_REG = 37,
    VUF_REQ_REM_MEM_REG = 38,
};
#define VUF_PROTO_F_CONFIGURE_MEM_SLOTS 15

enum vuf_chan { VUF_MAIN, VUF_BACKEND };
enum vuf_side { VUF_FROM_TENANT, VUF_FROM_QSD };
enum vuf_verdict { VUF_PASS, VUF_MODIFIED, VUF_REFUSE };

struct vuf_region {
    uint64_t gpa, size, uva, offset;
};

struct vuf_ring {
    uint32_t num;
    bool has_addr;
    uint64_t desc, avail, used;
};

struct vuf_pending {
    uint32_t request;
    uint32_t size; /* expected reply payload size */
    bool ack;      /* a REPLY_ACK u64 rather than the request's own reply */
};

struct vufilter {
    unsigned nq;           /* queues of the export (lowered by GET_QUEUE_NUM) */
    bool allow_adjacent;   /* regions touching in guest-physical space */
    bool dead;             /* refused once: everything after is refused */
    bool features_known, proto_known;
    uint64_t features_offered, proto_offered; /* after masking */
    uint64_t features_acked, proto_acked;
    unsigned max_slots;    /* from GET_MAX_MEM_SLOTS, 0 until then */
    bool backend_req_set;
    unsigned nregions;
    struct vuf_region regions[VUF_MAX_REGIONS];
    struct vuf_ring rings[VUF_MAX_QUEUES];
    struct vuf_pending pending[VUF_MAX_PENDING];
    unsigned npending;
    uint32_t backend_pending[VUF_MAX_PENDING];
    unsigned nbackend_pending;
    char reason[160];
};

/* The feature bits that may reach either side (everything else is removed
 * from the QSD's offer): virtio-blk's device features QSD offers, indirect
 * descriptors, event index, VERSION_1 and PROTOCOL_FEATURES.  Not LOG_ALL
 * (26), not ACCESS_PLATFORM (33, IOTLB), not RING_PACKED (34). */
extern const uint64_t vufilter_safe_features;
/* MQ, REPLY_ACK, BACKEND_REQ, CONFIG, CONFIGURE_MEM_SLOTS; not LOG_SHMFD,
 * PAGEFAULT (postcopy), BACKEND_SEND_FD, HOST_NOTIFIER, INFLIGHT_SHMFD,
 * RESET_DEVICE, INBAND_NOTIFICATIONS, STATUS, SHARED_OBJECT, DEVICE_STATE. */
extern const uint64_t vufilter_safe_protocol_features;

/* nq: 1..VUF_MAX_QUEUES.  -EINVAL otherwise. */
int vufilter_init(struct vufilter *f, unsigned nq, bool allow_adjacent);

/* Before reading a payload: is this header acceptable at all (version,
 * flags, payload size <= VUF_PAYLOAD_MAX)?  Lets the caller refuse a huge
 * size without reading it.  VUF_PASS or VUF_REFUSE (reason in f->reason). */
enum vuf_verdict vufilter_check_header(struct vufilter *f, enum vuf_chan ch, enum vuf_side side,
                                       const uint8_t *hdr);

/* One whole message: msg holds header + payload (len bytes, exactly
 * VUF_HDR_SIZE + the header's size), nfds the descriptors that came with
 * it.  On VUF_MODIFIED the payload in msg was rewritten (same length).  On
 * VUF_REFUSE, f->reason says why and the state is dead. */
enum vuf_verdict vufilter_feed(struct vufilter *f, enum vuf_chan ch, enum vuf_side side,
                               uint8_t *msg, size_t len, unsigned nfds);

/* A name for a front-end request number ("GET_FEATURES", "POSTCOPY_ADVISE",
 * "request 99"); buf is used for unknown numbers. */
const char *vufilter_request_name(uint32_t request, char *buf, size_t len);
