/* SPDX-License-Identifier: Apache-2.0 */
/* op.c: operations in flight (op.h): begin and end with the records'
 * busy flags, workers that make pending records durable first, the
 * barrier that holds answers until records are durable, each operation's
 * context (op_set_ctx), and the removal of unused layers in a worker. */
#include <assert.h>
#include "op.h"
#include "service.h"
#include "qsd/base/log.h"
#include "qsd/qemu/thin.h"
#include "qsd/state/records.h"
#include "qsd/base/util.h"

struct op *op_begin(struct csi *c, struct grpc_call *call)
{
    struct op *op = xcalloc(1, sizeof(*op));
    op->csi = c;
    op->call = call;
    op->next = c->ops;
    c->ops = op;
    return op;
}

void op_end(struct op *op)
{
    struct csi *c = op->csi;
    for (struct op **pp = &c->ops; *pp; pp = &(*pp)->next)
        if (*pp == op) {
            *pp = op->next;
            break;
        }
    if (op->vol)
        op->vol->busy = false;
    if (op->vol2)
        op->vol2->busy = false;
    if (op->snap)
        op->snap->busy = false;
    if (op->snap_read)
        op->snap_read->readers--;
    qmp_close(op->qmp);
    op_set_ctx(op, NULL, NULL);
    free(op);
}

void *op_set_ctx(struct op *op, const struct op_ctx_type *t, void *ctx)
{
    if (op->ctx && op->ctx_type->free)
        op->ctx_type->free(op->ctx);
    op->ctx_type = t;
    op->ctx = ctx;
    return ctx;
}

void *op_ctx(const struct op *op, const struct op_ctx_type *t)
{
    return op->ctx_type == t ? op->ctx : NULL;
}

void *op_take_ctx(struct op *op, const struct op_ctx_type *t)
{
    void *ctx = op_ctx(op, t);
    if (ctx)
        op->ctx_type = NULL, op->ctx = NULL;
    return ctx;
}

/* In the worker child: the records first, then the operation. */
static int op_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    int r = records_flush_pending(op->csi->records);
    if (r < 0) {
        *ret_msg = xasprintf("the plugin's records could not be written to disk: %s",
                             strerror(-r));
        return r;
    }
    return op->fn(arg, ret_msg, ret_result);
}

static uint64_t records_seq(void *opaque) { return records_queued(opaque); }

static void records_durable(uint64_t seq, int err, void *opaque)
{
    struct csi *c = opaque;
    for (size_t i = 0; i < c->n_held; i++)
        grpc_server_durable(c->held[i], seq, err);
}

void csi_hold_answers(struct csi *c, struct grpc_server *srv)
{
    assert(c->n_held < ARRAY_SIZE(c->held));
    c->held[c->n_held++] = srv;
    grpc_server_set_barrier(srv, records_seq, c->records);
    records_on_durable(c->records, records_durable, c);
}

int op_worker(struct op *op, worker_fn fn, uint64_t timeout_ms, worker_done done)
{
    size_t n = 0;
    for (struct op *o = op->csi->ops; o; o = o->next)
        n += o->worker != NULL;
    if (n >= CSI_MAX_WORKERS) {
        grpc_call_fail(op->call, GRPC_RESOURCE_EXHAUSTED,
                       "%zu operations are running in worker processes already; retry", n);
        op_end(op);
        return -EBUSY;
    }
    op->fn = fn;
    int r = worker_start(op->csi->loop, op_fn, op, timeout_ms, done, op, &op->worker);
    if (r < 0) {
        grpc_call_fail(op->call, GRPC_INTERNAL, "cannot start a worker process: %s", strerror(-r));
        op_end(op);
    }
    return r;
}

/* ---------------------------------------------------- layer removal */

static int gc_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct csi *c = arg;
    unsigned n = 0;
    uint64_t freed = 0;
    int r = pool_gc(&c->pool, &n, &freed, ret_msg);
    if (r == 0)
        *ret_result = json_pack("{s:I, s:I}", "removed", (json_int_t)n, "freed", (json_int_t)freed);
    return r;
}

static void gc_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct csi *c = opaque;
    c->gc = NULL;
    json_int_t n = 0, freed = 0;
    if (status < 0) {
        _cleanup_free_ char *q = log_quote(msg ? msg : strerror(-status));
        log_warn("plugin", "removal of unused layers failed", "error=%s", q);
    } else if (json_unpack(result, "{s:I, s:I}", "removed", &n, "freed", &freed) == 0 && n > 0) {
        log_info("plugin", "removed unused layers", "layers=%lld freed_bytes=%lld", (long long)n,
                 (long long)freed);
    }
    if (c->gc_again) {
        c->gc_again = false;
        csi_gc(c);
    }
}

void csi_gc(struct csi *c)
{
    if (c->gc) {
        c->gc_again = true;
        return;
    }
    int r = worker_start(c->loop, gc_fn, c, 2ull * 60 * 1000, gc_done, c, &c->gc);
    if (r < 0) {
        c->gc = NULL;
        log_warn("plugin", "cannot start the removal of unused layers", "error=\"%s\"",
                 strerror(-r));
    }
}
