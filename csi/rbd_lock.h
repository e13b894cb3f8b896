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
 * in which two nodes staging at once would both pass the first check. */
#pragma once

#include <jansson.h>
#include <stddef.h>
#include <rbd/librbd.h>

struct op;

/* In a worker: img is the volume name's image, opened read-only (which
 * adds no watch); own is how many of its watchers are ours (0 before our
 * QSD runs, 1 after).  0: this node may serve it; *ret_fenced (a new
 * reference, or NULL) lists the dead holders whose lock was broken.
 * -EBUSY (FAILED_PRECONDITION) with *ret_msg naming the live client. */
int rbd_lock_claim(rbd_image_t img, const char *name, size_t own, json_t **ret_fenced,
                   char **ret_msg);

/* On the loop, when the QSD of a first NodeStageVolume of an RBD volume
 * (op->vol, op->rbd) has started: check again in a worker (rbd_confirm_fn)
 * that its QSD is the image's only client; answer the call, or stop that
 * QSD, drop the record and fail it. */
void rbd_stage_confirm(struct op *op);
/* Log the holders rbd_lock_claim fenced (its *ret_fenced; may be NULL). */
void rbd_log_fenced(const char *volume, json_t *fenced);
