/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/vhost/vublk.h: a vhost-user-blk front-end (client) for checks and benchmarks.
 *
 * Owns: one connection to a vhost-user-blk back-end: feature negotiation,
 * guest memory shared through one memfd (rings, request headers and a data
 * area handed out by vublk_alloc), split virtqueues with EVENT_IDX, virtio-blk
 * requests (read, write, flush, discard, write-zeroes, get-id), and the
 * back-end request channel, on which a configuration change (resize) arrives.
 *
 * Single-threaded, no event loop needed: every wait is bounded by the
 * connection's timeout or the caller's.  Guest "physical" addresses are our
 * own virtual addresses (identity mapping of the one memory region). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* virtio-blk constants (virtio 1.x section 5.2, linux virtio_blk.h). */
#define VIRTIO_F_VERSION_1 32
#define VIRTIO_RING_F_INDIRECT_DESC 28
#define VIRTIO_RING_F_EVENT_IDX 29
#define VIRTIO_BLK_F_SIZE_MAX 1
#define VIRTIO_BLK_F_SEG_MAX 2
#define VIRTIO_BLK_F_GEOMETRY 4
#define VIRTIO_BLK_F_RO 5
#define VIRTIO_BLK_F_BLK_SIZE 6
#define VIRTIO_BLK_F_FLUSH 9
#define VIRTIO_BLK_F_TOPOLOGY 10
#define VIRTIO_BLK_F_CONFIG_WCE 11
#define VIRTIO_BLK_F_MQ 12
#define VIRTIO_BLK_F_DISCARD 13
#define VIRTIO_BLK_F_WRITE_ZEROES 14

#define VIRTIO_BLK_T_IN 0
#define VIRTIO_BLK_T_OUT 1
#define VIRTIO_BLK_T_FLUSH 4
#define VIRTIO_BLK_T_GET_ID 8
#define VIRTIO_BLK_T_DISCARD 11
#define VIRTIO_BLK_T_WRITE_ZEROES 13

#define VIRTIO_BLK_S_OK 0
#define VIRTIO_BLK_S_IOERR 1
#define VIRTIO_BLK_S_UNSUPP 2

#define VIRTIO_BLK_ID_BYTES 20
#define VIRTIO_BLK_SECTOR 512
#define VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP 1u

/* The parts of struct virtio_blk_config we use, decoded. */
struct vublk_config {
    uint64_t capacity_sectors;   /* in 512-byte sectors */
    uint32_t size_max, seg_max;
    uint32_t blk_size;           /* logical block size (512 when not offered) */
    uint8_t physical_block_exp;
    uint32_t opt_io_size;
    uint8_t writeback;
    uint16_t num_queues;         /* 1 when MQ not offered */
    uint32_t max_discard_sectors, max_discard_seg;
    uint32_t max_write_zeroes_sectors, max_write_zeroes_seg;
    uint8_t write_zeroes_may_unmap;
};
#define VIRTIO_BLK_CONFIG_SIZE 60  /* through write_zeroes_may_unmap + padding */

/* Decode the config space bytes (pure; unit-tested).  len >= 60. */
int vublk_config_decode(const uint8_t *raw, size_t len, uint64_t features,
                        struct vublk_config *ret);

struct vublk_opts {
    unsigned num_queues;   /* queues to set up; 0 = 1; capped at the device's */
    uint16_t queue_size;   /* ring size, power of two; 0 = 128 */
    size_t data_size;      /* bytes of shared data area; 0 = 8 MiB */
    int timeout_ms;        /* bound on every protocol exchange; 0 = 5000 */
};

struct vublk;
typedef void (*vublk_config_cb)(struct vublk *d, void *opaque);

/* Connect and bring the device up.  Errors: -ENOENT / -ECONNREFUSED (no
 * server), -EBUSY (listen backlog full), -ETIMEDOUT (server silent, e.g.
 * busy with another client),
 * -EPROTO / -ENOTSUP (back-end lacks what we need). */
int vublk_connect(const char *path, const struct vublk_opts *opts, struct vublk **ret);
void vublk_free(struct vublk *d);

const struct vublk_config *vublk_config(const struct vublk *d);
uint64_t vublk_capacity(const struct vublk *d); /* bytes */
uint64_t vublk_features(const struct vublk *d);  /* negotiated virtio features */
bool vublk_has_feature(const struct vublk *d, unsigned bit);
bool vublk_read_only(const struct vublk *d);
unsigned vublk_num_queues(const struct vublk *d); /* queues set up */
uint16_t vublk_queue_size(const struct vublk *d);
int vublk_peer_pid(const struct vublk *d);      /* SO_PEERCRED of the socket, or -1 */

/* Read the config space again (GET_CONFIG). */
int vublk_refresh_config(struct vublk *d);
/* Called (from vublk_wait / vublk_process_backend) after a config change
 * notification, once the new config has been read. */
void vublk_set_config_cb(struct vublk *d, vublk_config_cb cb, void *opaque);
/* Count of config change notifications seen. */
unsigned vublk_config_changes(const struct vublk *d);
/* Handle what is pending on the back-end request channel, waiting at most
 * timeout_ms for the first message (0: do not wait). */
int vublk_process_backend(struct vublk *d, int timeout_ms);

/* Memory from the shared data area (aligned to 4096; never freed
 * individually; NULL when exhausted).  vublk_alloc_reset releases all. */
void *vublk_alloc(struct vublk *d, size_t len);
void vublk_alloc_reset(struct vublk *d);

/* Asynchronous requests on queue q.  buf must come from vublk_alloc (or be
 * NULL for flush); len a multiple of 512 for read/write; for discard and
 * write-zeroes len is the range in bytes and buf is unused.  Submissions
 * become visible to the back-end on vublk_kick.  -ENOSPC when the ring is full. */
struct vublk_io {
    uint32_t type;
    uint64_t sector;
    void *buf;
    uint32_t len;
    uint32_t flags;  /* write-zeroes: VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP */
    void *opaque;
};
struct vublk_done {
    void *opaque;
    uint8_t status;
    uint32_t len;    /* bytes written by the device */
};
int vublk_submit(struct vublk *d, unsigned q, const struct vublk_io *io);
int vublk_kick(struct vublk *d, unsigned q);
/* Collect up to max completions without waiting. */
unsigned vublk_reap(struct vublk *d, unsigned q, struct vublk_done *out, unsigned max);
/* Wait until queue q has completions (or timeout_ms passes: -ETIMEDOUT),
 * serving the back-end channel meanwhile.  poll_us > 0: spin on the used
 * ring that long before sleeping on the call eventfd. */
int vublk_wait(struct vublk *d, unsigned q, int timeout_ms, unsigned poll_us);
unsigned vublk_inflight(const struct vublk *d, unsigned q);
/* Are completions waiting on queue q?  (No system call: for polling.) */
bool vublk_has_completions(const struct vublk *d, unsigned q);
/* Wait until any queue has completions (bounded), serving the back-end
 * channel meanwhile.  Used by a single thread driving several queues. */
int vublk_wait_any(struct vublk *d, int timeout_ms);

/* One request, submitted and waited for (bounded by the connection timeout).
 * Returns 0 with *ret_status set, or a negative errno. */
int vublk_request_sync(struct vublk *d, unsigned q, const struct vublk_io *io,
                       uint8_t *ret_status);
/* GET_ID: the serial, NUL-terminated (up to 20 bytes). */
int vublk_get_serial(struct vublk *d, char ret_serial[VIRTIO_BLK_ID_BYTES + 1]);

const char *vublk_status_name(uint8_t status);

/* Notification counters since connect, over all queues: where the
 * transport's system calls go. */
struct vublk_stats {
    uint64_t submitted;  /* requests */
    uint64_t kicks;      /* kick eventfd writes */
    uint64_t sleeps;     /* poll() calls waiting for a call eventfd */
};
void vublk_get_stats(const struct vublk *d, struct vublk_stats *ret);
