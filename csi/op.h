/* SPDX-License-Identifier: Apache-2.0 */
/* op.h: operations in flight.  One struct op per asynchronous RPC: it
 * holds the call and the busy flags of the records it works on until
 * op_end; its worker makes every pending record change durable before it
 * touches an image; no answer leaves before the records it follows are
 * durable (csi_hold_answers).  Also the removal of unused layers, in a
 * worker of its own (csi_gc). */
#pragma once

#include "grpc.h"
#include "qsd/base/worker.h"

#include <stdbool.h>
#include <stdint.h>

struct csi;
struct vol;
struct snap;
struct qmp;
struct rbd_req;

/* One asynchronous RPC.  Records named here are busy (snap_read: read) until
 * op_end(). */
struct op {
    struct csi *csi;
    struct grpc_call *call;
    struct worker *worker;
    worker_fn fn;          /* what the worker runs, after records_flush_pending */
    struct qmp *qmp;
    struct vol *vol, *vol2;
    struct snap *snap;
    struct snap *snap_read; /* read by the operation: its readers count */
    /* per-operation data */
    uint64_t size;
    bool live;             /* the source is read through its QSD (snapshot, clone) */
    bool repair;           /* a stage that restarts the QSD of a staged volume */
    bool qmp_failed;       /* its monitor connection failed (NodeExpandVolume) */
    char *image;           /* image class: digest of the base it needs (imageclass.h) */
    char *image_refusal;   /* a remembered checksum refusal of it: the error to give
                            * instead of downloading (imageclass.c, imagememo.h) */
    char *vol_id;          /* a volume looked up again when done, not held busy (stats) */
    struct rbd_req *rbd;   /* RBD backend: the request, credentials included (rbd.h) */
    void (*rbd_free)(struct rbd_req *); /* frees rbd (rbd_req_free; op_end) */
    bool image_lead;       /* its worker may download the base; others wait for it */
    struct op *next;
};

/* srv answers no RPC before the record changes made until then are durable
 * (grpc_server_set_barrier on the record store).  Once per endpoint, at most
 * two. */
void csi_hold_answers(struct csi *c, struct grpc_server *srv);
struct op *op_begin(struct csi *c, struct grpc_call *call);
/* Release busy flags, unlink and free.  The call must have been completed. */
void op_end(struct op *op);
/* Run fn in a worker; done runs on the loop.  The child first makes every
 * record change made so far durable (records_flush_pending), so a record is
 * on disk before the image it describes is touched.  At most CSI_MAX_WORKERS at a
 * time (RESOURCE_EXHAUSTED beyond).  On failure, the call is failed and the
 * op ended (returns < 0). */
#define CSI_MAX_WORKERS 16
int op_worker(struct op *op, worker_fn fn, uint64_t timeout_ms, worker_done done);

/* Remove the pool's layers nothing references any more (thin.h pool_gc),
 * in a worker; runs again once if asked while running.  After every
 * deletion and at start. */
void csi_gc(struct csi *c);
