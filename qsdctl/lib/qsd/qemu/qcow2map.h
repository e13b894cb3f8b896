/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/qcow2map.h: which blocks of a qcow2 layer the layer itself
 * answers for, read from its own L1/L2 tables (its backing file is never
 * opened), and the walk that combines the layers of chains into the extent
 * lists of changed-block tracking (docs/changed-blocks.md).
 *
 * Owns: the qcow2 header fields and table entries this needs, read as
 * untrusted input (a layer's metadata is QSD's, its data the tenant's, but a
 * torn or hostile file must yield an error, never a wrong read or an
 * unbounded allocation), and the walk: allocated blocks of a chain (the
 * topmost layer that answers for a block decides whether it holds data) and
 * changed blocks (a block some layer of a set answers for).  Blocking
 * pread()s, bounded per step (qcow2_walk_next), so that an event loop can
 * interleave them with other work. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define QCOW2_MAP_PRESENT 1u /* the layer answers for the block (data or zeros) */
#define QCOW2_MAP_DATA 2u    /* ... with data (not a zero cluster) */
#define QCOW2_L1_MAX_BYTES (32u << 20) /* QEMU's own bound on an L1 table */

struct qcow2_map;
/* Open a layer read-only (O_NOFOLLOW) and read its header and L1 table. */
int qcow2_map_open(const char *path, struct qcow2_map **ret, char **ret_msg);
/* The same on an fd that the map takes (closed by qcow2_map_free). */
int qcow2_map_open_fd(int fd, const char *name, struct qcow2_map **ret, char **ret_msg);
void qcow2_map_free(struct qcow2_map *m);
uint64_t qcow2_map_size(const struct qcow2_map *m);
unsigned qcow2_map_cluster_bits(const struct qcow2_map *m);
/* log2 of the bytes one L2 table maps (2 * cluster_bits - 3). */
unsigned qcow2_map_span_bits(const struct qcow2_map *m);
/* flags[i] (QCOW2_MAP_*) of block i of 2^gbits bytes at off: n blocks, off
 * aligned to 2^gbits, gbits <= the cluster bits, the range within one L2
 * table's span.  Blocks past the layer's size are 0. */
int qcow2_map_read(struct qcow2_map *m, uint64_t off, size_t n, unsigned gbits, uint8_t *flags,
                   char **ret_msg);

struct qcow2_extent {
    uint64_t off, len;
};
enum qcow2_walk_kind {
    QCOW2_WALK_ALLOCATED, /* layers: one chain, top first: blocks that read data */
    QCOW2_WALK_CHANGED,   /* layers: a set: blocks any of them answers for */
};
struct qcow2_walk;
/* A walk over [start, size) (start rounded down to the block size: the
 * first extent may begin before it), blocks of the smallest cluster size
 * among the layers.  The maps stay the caller's and must outlive the walk.
 * -EINVAL: no layers or start >= size. */
int qcow2_walk_new(enum qcow2_walk_kind kind, struct qcow2_map *const *layers, size_t n,
                   uint64_t size, uint64_t start, struct qcow2_walk **ret);
void qcow2_walk_free(struct qcow2_walk *w);
/* Adjacent blocks merged into extents, in order.  Fills out[] with at most
 * max extents, reading at most max_windows L2 spans per layer; *ret_n is how
 * many.  Returns 1 once the walk is over (everything returned), 0 when more
 * may follow (call again: *ret_n may be 0 when the spans read held nothing
 * complete yet), or a negative errno with *ret_msg. */
int qcow2_walk_next(struct qcow2_walk *w, struct qcow2_extent *out, size_t max,
                    unsigned max_windows, size_t *ret_n, char **ret_msg);
uint64_t qcow2_walk_block(const struct qcow2_walk *w); /* block size, bytes */
