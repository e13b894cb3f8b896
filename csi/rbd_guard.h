/* SPDX-License-Identifier: Apache-2.0 */
/* rbd_guard.h: the rule of rbd_lock.h applied on the plugin's loop.
 *
 * Owns: the second check of a first NodeStageVolume once its QSD runs
 * (rbd_stage_confirm), and the restarts of a staged RBD volume's QSD
 * (struct rbd_guard, v->rbd_guard: check, start, check again, retried
 * after a refusal), each check a worker (rbd_check_fn, rbd_confirm_fn:
 * rbd.c). */
#pragma once

struct op;
struct csi;
struct vol;

/* On the loop, when the QSD of a first NodeStageVolume of an RBD volume
 * (op->vol; its request the op's context, rbd_req_ctx) has started: check
 * again in a worker (rbd_confirm_fn) that its QSD is the image's only
 * client; answer the call, or stop that QSD, drop the record and fail it. */
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
