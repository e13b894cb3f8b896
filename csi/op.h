/* SPDX-License-Identifier: Apache-2.0 */
/* op.h: operations in flight.  One struct op per asynchronous RPC: it
 * holds the call, the busy flags of the records it works on and a context
 * of the RPC's own type (what it carries between its steps) until op_end;
 * its worker makes every pending record change durable before it
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

/* The kind of data one RPC carries between its steps (its context): a name
 * and how to free it.  Each handler family defines its own, statically. */
struct op_ctx_type {
    const char *name;
    void (*free)(void *ctx);
};

/* One asynchronous RPC: its lifecycle only.  Records named here are busy
 * (snap_read: read) until op_end(); what the RPC itself needs lives in its
 * context (op_set_ctx), freed by op_end. */
struct op {
    struct csi *csi;
    struct grpc_call *call;
    struct worker *worker;
    worker_fn fn;          /* what the worker runs, after records_flush_pending */
    struct qmp *qmp;
    struct vol *vol, *vol2;
    struct snap *snap;
    struct snap *snap_read; /* read by the operation: its readers count */
    const struct op_ctx_type *ctx_type;
    void *ctx;
    struct op *next;
};

/* srv answers no RPC before the record changes made until then are durable
 * (grpc_server_set_barrier on the record store).  Once per endpoint, at most
 * two. */
void csi_hold_answers(struct csi *c, struct grpc_server *srv);
struct op *op_begin(struct csi *c, struct grpc_call *call);
/* Release busy flags, unlink and free.  The call must have been completed. */
void op_end(struct op *op);
/* Give op its context ctx of type t (owned: op_end frees it with t->free);
 * one it had is freed first.  Returns ctx. */
void *op_set_ctx(struct op *op, const struct op_ctx_type *t, void *ctx);
/* op's context when it is of type t, else NULL (an op of another RPC). */
void *op_ctx(const struct op *op, const struct op_ctx_type *t);
/* op's context of type t, no longer op's (the caller owns it), or NULL. */
void *op_take_ctx(struct op *op, const struct op_ctx_type *t);
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
