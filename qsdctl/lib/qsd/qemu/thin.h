/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/thin.h: thin snapshots, clones and merges on the pool's qcow2 layers.
 *
 * The graph and its rules are layers.h, the pool's layout, lock, chains and
 * garbage collection pool.h; this file does the operations.  Every
 * function here is blocking (qemu-img, QMP over qmp_sync): the CLI calls it
 * directly, the CSI plugin from a worker process.  Functions that change
 * references take the pool lock (flock on the pool directory, bounded wait), so a
 * garbage collection never sees half an operation.
 *
 * Snapshot of volume V (top volumes/V.qcow2), in this order:
 *   1. link volumes/V.qcow2 -> layers/L.qcow2 (the top gets a layer name);
 *   2. qemu-img create volumes/.V.qcow2.L: an empty overlay backed by
 *      ../layers/L.qcow2;
 *   3. live: blockdev-add the overlay's file and qcow2 nodes, then
 *      blockdev-snapshot moves the export onto it (the vhost-user client is
 *      not disturbed: it is the same export);
 *   4. rename the overlay onto volumes/V.qcow2 (what a QSD restart opens);
 *   5. link layers/L.qcow2 -> snapshots/S.qcow2 (if a snapshot is wanted).
 * thin_recover() finishes or undoes a crash at any step: the overlay's name
 * says which layer, and the QSD's export node ("ov-L" or not) says whether
 * step 3 happened. */
#pragma once

#include "qsd/qemu/layers.h"
#include "qsd/qemu/pool.h"
#include "qsd/qemu/qmp.h"
#include "qsd/qemu/qsdopts.h"

/* Freeze the top of qcow2 volume vol into a new layer and continue the
 * volume in an empty overlay on it; link the layer as snapshot snap when not
 * NULL.  s: the QMP monitor of the volume's QSD when it serves the volume
 * read-write (the switch happens inside it), else NULL.  o: the export's
 * options (cache, aio, discard, detect-zeroes of the new nodes).  A chain
 * that would pass LAYER_MAX_DEPTH is merged first (bounded by timeout_ms).
 * Returns the layer's name.  -EOPNOTSUPP for a raw volume, or when the QSD
 * runs its export in an iothread (QEMU 10.0 hangs on graph changes under I/O
 * there, thin.c): the caller falls back to a full copy. */
int thin_snapshot(const struct pool *p, const char *vol, struct qmp_sync *s,
                  const struct qsd_opts *o, const char *snap, uint64_t timeout_ms,
                  char ret_layer[LAYER_NAME_LEN + 1], char **ret_msg);
/* thin_snapshot in its steps, for a group of volumes switched at one
 * instant (csi/local_group.c): the caller holds the pool lock (pool_lock)
 * across all of them.  prepare: the checks, a merge of a full chain, steps 1
 * and 2; attach: step 3's new nodes added to the QSD s (nothing without s);
 * switch: its blockdev-snapshot, the one command of the instant; finish:
 * steps 4 and 5; undo: a step not switched is removed again (a switch of
 * unknown outcome is left to thin_recover).  clear frees the step. */
struct thin_step {
    char *top, *tmp, *lp, *spath;
    char *exp;            /* attached: the export's node */
    struct qmp_sync *s;   /* attached: the QSD (borrowed) */
    char layer[LAYER_NAME_LEN + 1];
    bool prepared, switched, unknown;
};
int thin_step_prepare(const struct pool *p, const char *vol, struct qmp_sync *s, const char *snap,
                      uint64_t timeout_ms, struct thin_step *st, char **ret_msg);
int thin_step_attach(struct thin_step *st, struct qmp_sync *s, const struct qsd_opts *o,
                     char **ret_msg);
int thin_step_switch(struct thin_step *st, char **ret_msg);
int thin_step_finish(const struct pool *p, struct thin_step *st, char **ret_msg);
void thin_step_undo(struct thin_step *st);
void thin_step_clear(struct thin_step *st);

/* The layer snapshot snap is a name of (a standalone snapshot file, made
 * before layers existed or from a raw volume, gets a layer name first). */
int thin_snapshot_layer(const struct pool *p, const char *snap, char ret_layer[LAYER_NAME_LEN + 1],
                        char **ret_msg);
/* New qcow2 volume: an empty overlay on layer of the given size (0: the
 * layer's), published atomically.  Constant time. */
int thin_create(const struct pool *p, const char *vol, const char *layer, uint64_t size,
                char **ret_msg);
/* The same, for a caller that holds the pool lock. */
int thin_create_locked(const struct pool *p, const char *vol, const char *layer, uint64_t size,
                       char **ret_msg);
/* Finish or undo a snapshot of vol interrupted by a crash (see above).
 * s: the monitor of a running read-write QSD of vol, or NULL when no QSD
 * runs it (or a read-only one).  *ret_what (may be NULL) says what was done
 * (static string, NULL when nothing was needed). */
int thin_recover(const struct pool *p, const char *vol, struct qmp_sync *s, const char **ret_what,
                 char **ret_msg);
/* Shorten vol's chain to depth `to` (1: flatten completely) by copying the
 * newest layers' data into the top: block-stream inside the QSD (s), or
 * qemu-img rebase when no QSD has it open.  wait: until done (bounded by
 * timeout_ms); otherwise a live merge is started and left to QSD.
 * Returns 1 when there was nothing to do or a merge already runs. */
int thin_merge(const struct pool *p, const char *vol, struct qmp_sync *s, unsigned to, bool wait,
               uint64_t timeout_ms, char **ret_msg);
/* Is a merge job running in this QSD? 1 yes, 0 no. */
int thin_merge_running(struct qmp_sync *s, char **ret_msg);
