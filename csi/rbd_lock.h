/* SPDX-License-Identifier: Apache-2.0 */
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
 * it runs with its own watch (rbd_stage_confirm, rbd_guard.h), which closes the window
 * in which two nodes staging at once would both pass the first check;
 * and to every restart of its QSD (rbd_restart): a restarted QSD is a new
 * client, which another node's QSD would hand the lock to. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <rbd/librbd.h>

/* In a worker: img is the volume name's image, opened read-only (which
 * adds no watch); own is how many of its watchers are ours (0 before our
 * QSD runs, 1 after); a watch at address dead (our QSD, reaped: provably
 * dead) is not counted, a lock it holds is broken.  fresh (with own 1):
 * our QSD was started just before this check, a new client, so the
 * image's only watcher is it, and a lock held by that watcher is ours
 * (a restarted QSD's guest may have written already); not for a QSD of
 * unknown age (adopted: it may have been fenced, its watch gone, and the
 * only watcher another node's).  0: this node may serve it; *ret_fenced
 * (a new reference, or NULL) lists the dead holders whose lock was broken;
 * with own 1, *ret_own (malloc'd) is our QSD's address; *ret_held is set
 * when the refusal is for a live lock holder.
 * -EBUSY (FAILED_PRECONDITION) with *ret_msg naming the live client. */
int rbd_lock_claim(rbd_image_t img, const char *name, size_t own, bool fresh, const char *dead,
                   json_t **ret_fenced, char **ret_own, bool *ret_held, char **ret_msg);

/* Log the holders rbd_lock_claim fenced (its *ret_fenced; may be NULL). */
void rbd_log_fenced(const char *volume, json_t *fenced);
