/* SPDX-License-Identifier: Apache-2.0 */
/* volstats.h: what the plugin knows about its volumes' health and I/O,
 * collected in the background and cached.
 *
 * Owns: the periodic collection round (every --metrics-interval) and its
 * cache.  Each round
 *  - probes the QMP monitor of every staged volume whose QSD runs (and that
 *    no operation holds): connect, query-blockstats, close, within
 *    VOLSTATS_PROBE_TIMEOUT_MS.  No answer in time, or a monitor that no
 *    longer accepts connections, makes the QSD "hung" until a probe answers;
 *    VOLSTATS_HUNG_KILL_AFTER such probes in a row and it is killed
 *    (qsd_kill_hung) and restarted like a dead QSD;
 *  - runs one worker (a forked child, worker.h) that reads what could block:
 *    each QSD's /proc/PID/io and CPU time, each volume's allocation (its
 *    chain of layers) and the pool filesystem's size and free space.
 * Nothing here waits on the loop: /metrics and NodeGetVolumeStats read the
 * cache.  QEMU 10.0 keeps no per-request statistics for vhost-user-blk
 * exports (their BlockBackend is anonymous and the export does no block
 * accounting), so the I/O figures are the kernel's per-process ones
 * (docs/observability.md). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "exposition.h"

struct csi;
struct vol;

#define VOLSTATS_PROBE_TIMEOUT_MS 3000
/* A healthy QSD answers a probe in milliseconds, also under full I/O load
 * (its exports run in iothreads, the monitor in the main loop): three
 * probes in a row unanswered for 3 s each, one per --metrics-interval
 * (default 10 s, so 23-33 s from the hang to the kill) leave wide margin
 * (docs/observability.md). */
#define VOLSTATS_HUNG_KILL_AFTER 3

/* VS_REFUSED: an RBD volume whose restart the rule refused (rbd_lock.h). */
enum vol_state { VS_NONE, VS_RUNNING, VS_RESTARTING, VS_CRASH_LOOP, VS_HUNG, VS_REFUSED };
const char *vol_state_name(enum vol_state s); /* "running"... */

/* Cached figures of one volume (valid while the loop does not run). */
struct volstat {
    bool have_io;                /* the last round read the QSD's /proc */
    uint64_t read_bytes, write_bytes; /* storage bytes moved by the QSD process */
    uint64_t read_syscalls, write_syscalls;
    double cpu_seconds;
    bool have_alloc;
    uint64_t allocated;          /* bytes allocated by its chain of layers */
    bool have_discard;
    uint64_t discard_ops, discard_bytes; /* from QMP (file nodes) */
    struct histogram probe;      /* QMP probe round trips, seconds */
    uint64_t probes_failed;
};

struct pool_stat {
    bool valid;
    uint64_t capacity, free;     /* the pool filesystem (statvfs), bytes */
};

struct volstats;
int volstats_new(struct csi *c, uint64_t interval_ms, struct volstats **ret);
void volstats_free(struct volstats *vs); /* NULL accepted */

/* State of a volume's QSD: VS_NONE when not staged. */
enum vol_state volstats_state(struct volstats *vs, const struct vol *v);
/* Why the QSD is hung (NULL when it is not). */
const char *volstats_hung_reason(struct volstats *vs, const struct vol *v);
const struct volstat *volstats_get(struct volstats *vs, const char *id); /* or NULL */
struct pool_stat volstats_pool(struct volstats *vs);
/* NULL, or why the pool cannot hold what the volume may still write (its
 * unallocated capacity) while it is nearly full (malloc'd). */
char *volstats_pool_problem(struct volstats *vs, const struct vol *v, uint64_t allocated);
/* NULL, or that the pool is nearly full (less than 1 GiB free; malloc'd). */
char *volstats_pool_low(struct volstats *vs);

/* Bytes allocated by a volume's chain of layers (shared layers included);
 * reads the images' headers: in a worker, or where a stat is acceptable. */
int vol_allocated(struct csi *c, const char *id, uint64_t *ret);
