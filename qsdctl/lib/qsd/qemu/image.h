/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/image.h: image operations on the volume pool (pool.h).
 *
 * Offline operations run qemu-img with a bound (qemuimg.h); online ones go through the
 * volume's QSD over QMP (qmp_sync).  Formats are recorded by the file
 * extension and always passed explicitly: an image's format is never probed
 * (a raw image a guest wrote a qcow2 header into must stay raw).
 * Every function returns 0 or a negative errno and, on failure, a message a
 * person understands in *ret_msg (malloc'd). */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "qsd/qemu/pool.h"
#include "qsd/qemu/qmp.h"

#define IMAGE_MAX_SIZE (1ull << 50)     /* 1 PiB */
#define IMAGE_SIZE_ALIGN 512u

/* Check a requested size: non-zero, aligned to align, not above the maximum. */
int image_check_size(uint64_t size, unsigned align, char **ret_msg);
int image_check_prealloc(const char *format, const char *prealloc, char **ret_msg);

/* Create pool/volumes/<name>.<format> atomically (temp file + rename without
 * replace).  From a snapshot: a qcow2 volume without preallocation is a thin
 * overlay on the snapshot's layer (thin.h, constant time); otherwise a full,
 * independent copy of its data, then grown to size if larger. */
int image_create(const struct pool *p, const char *name, const char *format, uint64_t size,
                 const char *prealloc, const char *from_snapshot, char **ret_msg);
int image_delete(const struct pool *p, const char *name, char **ret_msg);
/* Grow an image that no QSD has open.  Shrinking is refused. */
int image_resize_offline(const char *path, const char *format, uint64_t size, char **ret_msg);
/* Virtual size and host allocation (qemu-img info, shared lock so it also
 * works while a QSD has the image open). */
int image_info(const char *path, const char *format, uint64_t *ret_size, uint64_t *ret_alloc,
               char **ret_msg);

/* Snapshot of an image no QSD has open: standalone qcow2 in the pool. */
int snapshot_create_offline(const struct pool *p, const char *src, const char *src_format,
                            const char *snap, char **ret_msg);
int snapshot_delete(const struct pool *p, const char *snap, char **ret_msg);

/* ---- online (through the volume's QSD, qmpcmd.h) ---- */
/* Point-in-time copy of the live node into a standalone qcow2 snapshot
 * (blockdev-backup sync=full; the guest keeps running).  Bounded by timeout_ms. */
int live_snapshot(struct qmp_sync *s, const struct pool *p, const char *snap,
                  uint64_t timeout_ms, char **ret_msg);
