/* rbd_lock.h: which node may serve an RBD volume (docs/rbd.md, "What
 * happens on node loss").
 *
 * Owns: the rule deciding, from the image's watchers and the holders of
 * its exclusive lock, whether this node may start serving an image: refused
 * while another client is alive on it (its watch on the image header is
 * live); the lock of a holder whose watch is gone (dead, or cut off long
 * enough for Ceph to expire the watch) is broken after the holder is
 * blocklisted at the OSDs, so it cannot write if it comes back.  Applied
 * twice by NodeStageVolume: before the volume's QSD starts (rbd.c) and once
 * it runs with its own watch (rbd_stage_confirm), which closes the window
 * in which two nodes staging at once would both pass the first check;
 * and to every restart of its QSD (rbd_restart): a restarted QSD is a new
 * client, which another node's QSD would hand the lock to. */
#pragma once

#include <jansson.h>
#include <stddef.h>
#include <rbd/librbd.h>

struct op;
struct csi;
struct vol;

/* In a worker: img is the volume name's image, opened read-only (which
 * adds no watch); own is how many of its watchers are ours (0 before our
 * QSD runs, 1 after); a watch at address dead (our QSD, reaped: provably
 * dead) is not counted, a lock it holds is broken.  0: this node may serve
 * it; *ret_fenced (a new reference, or NULL) lists the dead holders whose
 * lock was broken; with own 1, *ret_own (malloc'd) is our QSD's address;
 * *ret_held is set when the refusal is for a live lock holder.
 * -EBUSY (FAILED_PRECONDITION) with *ret_msg naming the live client. */
int rbd_lock_claim(rbd_image_t img, const char *name, size_t own, const char *dead,
                   json_t **ret_fenced, char **ret_own, bool *ret_held, char **ret_msg);

/* On the loop, when the QSD of a first NodeStageVolume of an RBD volume
 * (op->vol, op->rbd) has started: check again in a worker (rbd_confirm_fn)
 * that its QSD is the image's only client; answer the call, or stop that
 * QSD, drop the record and fail it. */
void rbd_stage_confirm(struct op *op);
/* Restarts of a staged volume's QSD (the plugin's, not qsd.c's supervisor:
 * an RBD volume's QSD is not supervised).  On its death, at plugin start
 * when it is gone, and at a NodeStageVolume that finds it gone: in a worker,
 * the rule (the dead QSD's own watch, at the address recorded by the last
 * check, not counted; dead holders fenced), then the QSD starts, then the
 * check again with its watch; a refusal leaves the volume staged, not
 * served (rbd_guard_refused: its condition), retried after 2 s doubling to
 * 60 s until it is unstaged, except when another live client holds the
 * image's lock (another node took the volume over: the guest's view of the
 * disk is stale), which only a NodeStageVolume retries.  The record is busy
 * while a step runs. */
void rbd_restart(struct csi *c, struct vol *v);
/* An adopted QSD never checked after its start (a plugin killed before
 * that check): check it now; stopped (and retried as above) if refused. */
void rbd_adopted(struct csi *c, struct vol *v);
/* Why v is not served (a refused restart), or NULL. */
const char *rbd_guard_refused(const struct vol *v);
void rbd_guard_free(struct vol *v);
/* Log the holders rbd_lock_claim fenced (its *ret_fenced; may be NULL). */
void rbd_log_fenced(const char *volume, json_t *fenced);
