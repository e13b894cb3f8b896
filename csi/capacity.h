/* SPDX-License-Identifier: Apache-2.0 */
/* capacity.h: the pool's capacity policy.
 *
 * Owns: the reserve kept free on the pool's filesystem (--capacity-reserve
 * SIZE or PERCENT%, of the filesystem's size), the overcommit limit
 * (--overcommit-ratio R: the volumes' virtual sizes together at most R times
 * the filesystem's size less the reserve), the figures they apply to
 * (statvfs of the pool, the sizes in the volume records), the decisions made
 * from them (pure, unit-tested): the size a capacity range gives
 * (capacity_pick), what GetCapacity reports and why a
 * CreateVolume, an expansion or a CreateSnapshot is refused
 * (RESOURCE_EXHAUSTED with the numbers), and the rule that out of space
 * (ENOSPC, EDQUOT) anywhere is RESOURCE_EXHAUSTED (docs/storageclass.md,
 * "Capacity"). */
#pragma once

#include "grpc.h"
#include "plugin.h" /* struct capacity_policy */

#include <stdbool.h>
#include <stdint.h>

/* "10G", "1073741824", "10%" -> reserve; -EINVAL otherwise. */
int capacity_parse_reserve(const char *s, struct capacity_policy *p);
/* "1", "1.5", "2.25" (0.01 to 1000, at most two decimals) -> overcommit_x100. */
int capacity_parse_ratio(const char *s, struct capacity_policy *p);

/* The pool at one moment. */
struct pool_figures {
    uint64_t total;     /* filesystem size */
    uint64_t free;      /* free for unprivileged use (f_bavail) */
    uint64_t reserve;   /* the reserve in bytes */
    uint64_t committed; /* sum of the volumes' virtual sizes */
    uint64_t limit;     /* committed at most this; UINT64_MAX: no limit */
};

/* Pure: fill reserve and limit of f from p (total, free, committed set). */
void capacity_apply(const struct capacity_policy *p, struct pool_figures *f);
/* Pure: why a request that adds grow virtual bytes and needs need bytes of
 * free space now would break the policy (a message naming the numbers, to
 * free), or NULL when it fits.  Nothing may be added while the free space
 * is at or below the reserve. */
char *capacity_refuse(const struct capacity_policy *p, const struct pool_figures *f,
                      uint64_t grow, uint64_t need);
/* Pure: GetCapacity's available_capacity and maximum_volume_size for
 * volumes that need their whole size free at creation (preallocated) or
 * not (thin), aligned down to align; at most max_size. */
void capacity_available(const struct pool_figures *f, bool prealloc, unsigned align,
                        uint64_t max_size, uint64_t *ret_available, uint64_t *ret_max);

/* -ENOSPC and -EDQUOT: RESOURCE_EXHAUSTED; anything else: dflt. */
enum grpc_code capacity_errno_code(int err, enum grpc_code dflt);

struct csi;
/* The pool's figures now (statvfs, records); -errno with a message. */
int capacity_figures(struct csi *c, struct pool_figures *ret, char **ret_msg);
/* For /metrics: the reserve in bytes now (0 if statvfs fails), and the
 * configured overcommit ratio (0: no limit). */
uint64_t capacity_reserved_bytes(struct csi *c);
double capacity_overcommit_ratio(const struct csi *c);
/* Check a request against the policy; on refusal the call is failed with
 * RESOURCE_EXHAUSTED (what + the numbers) and false returned.  what says
 * what was asked ("volume pvc-1 of 1073741824 bytes"). */
bool capacity_admit(struct csi *c, struct grpc_call *call, const char *what, uint64_t grow,
                    uint64_t need);

#define VOLUME_DEFAULT_SIZE (1ull << 30) /* when capacity_range says nothing */

/* The size to provision for capacity_range (required, limit; 0 = unset),
 * at least min_size (a content source's size; 0 if none), rounded up to align.
 * -EINVAL: malformed range (negative, limit < required); -ERANGE: no size in
 * the range can be provided (spec: OUT_OF_RANGE). */
int capacity_pick(int64_t required, int64_t limit, uint64_t min_size, unsigned align,
                  uint64_t *ret, char **ret_msg);
