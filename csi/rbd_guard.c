/* SPDX-License-Identifier: Apache-2.0 */
/* rbd_guard.c: see rbd_guard.h (the rule it applies: rbd_lock.c). */
#include "rbd_guard.h"
#include "modify.h"
#include "qos.h"
#include "rbd.h"
#include "rbd_lock.h"
#include "service.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"
#include "volqsd.h"
#include "op.h"

#include <inttypes.h>

#define CONFIRM_MS (60ull * 1000) /* as every RBD worker (rbd.c) */

/* A refusal, answered once the QSD is stopped. */
struct refusal {
    struct op *op;
    int status;
    char *msg;
};

static void confirm_stopped(struct qsd *q, int status, const char *msg, void *opaque)
{
    struct refusal *f = opaque;
    struct op *op = f->op;
    struct csi *c = op->csi;
    struct vol *v = op->vol;
    (void)q;
    if (status < 0) /* still running: the next plugin start stops it (orphan) */
        log_warn("rbd", "cannot stop the QSD of a refused stage", "volume=%s error=\"%s\"",
                 v->id, msg ? msg : strerror(-status));
    qsd_free(v->qsd);
    v->qsd = NULL;
    rbd_guard_free(v);
    csi_remove_runtime(c, v->id);
    vol_clear_staging(v);
    op->vol = NULL;
    store_remove_vol(c->store, v);
    grpc_call_fail(op->call, rbd_code(f->status), "%s", f->msg);
    op_end(op);
    free(f->msg);
    free(f);
}

/* Our QSD's address, as the check after its start saw it (the only
 * watcher then): a restart does not count that watch (the QSD is reaped). */
static void record_addr(struct csi *c, struct vol *v, json_t *result)
{
    json_t *a = json_object_get(result, "addr");
    if (!json_is_string(a) || json_equal(a, json_object_get(v->parameters, "addr")))
        return;
    json_object_set(v->parameters, "addr", a);
    int r = store_save_vol(c->store, v);
    if (r < 0)
        log_warn("rbd", "cannot record the QSD's address", "volume=%s error=\"%s\"", v->id,
                 strerror(-r));
}

/* The image's limits (qos: valid, JSON null for none, NULL when they could
 * not be read) changed between the
 * stage's read (the QSD started with those: the record's) and this check:
 * a ControllerModifyVolume that saw no client then (rbd_qos.c).  They are
 * recorded and set on the QSD before the call is answered (modify.h: an
 * empty answer, as NodeStageVolume's; UNAVAILABLE when the QSD cannot be
 * told, and the CO's retry finds the volume staged with them recorded). */
static bool limits_changed(struct op *op, struct vol *v, json_t *qos)
{
    if (!qos) /* not read: the QSD keeps what it started with */
        return false;
    json_t *want = json_is_object(qos) ? json_incref(qos) : json_object();
    bool same = v->mutable_params ? json_equal(want, v->mutable_params)
                                  : json_object_size(want) == 0;
    struct qsd_limits l;
    _cleanup_free_ char *m = NULL;
    if (same || qos_limits(want, &l, &m) < 0) {
        json_decref(want);
        return false;
    }
    struct csi *c = op->csi;
    struct grpc_call *call = op->call;
    op_end(op);
    log_info("rbd", "limits changed while staging: set live", "volume=%s", v->id);
    modify_apply(c, call, v, want, &l);
    return true;
}

static void confirm_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    struct vol *v = op->vol;
    op->worker = NULL;
    rbd_log_fenced(v->id, json_object_get(result, "fenced"));
    if (status == 0) {
        record_addr(op->csi, v, result);
        const char *warn = json_string_value(json_object_get(result, "warn"));
        if (warn) {
            _cleanup_free_ char *w = log_quote(warn);
            log_warn("rbd", "volume not marked as served here", "volume=%s error=%s", v->id, w);
        }
        log_info("node", "volume staged", "volume=%s pid=%d", v->id, (int)qsd_get_pid(v->qsd));
        if (limits_changed(op, v, json_object_get(result, "qos")))
            return;
        grpc_call_reply(op->call, "", 0);
        op_end(op);
        return;
    }
    /* Undo: stop the QSD (it has no client yet), drop the record, answer. */
    log_warn("rbd", "stage refused after the QSD started", "volume=%s error=\"%s\"", v->id,
             msg ? msg : strerror(-status));
    struct refusal *f = xmalloc(sizeof(*f));
    *f = (struct refusal){op, status, xstrdup(msg ? msg : strerror(-status))};
    if (qsd_stop(v->qsd, confirm_stopped, f) < 0)
        confirm_stopped(v->qsd, -ESRCH, "qsd_stop failed", f);
}

void rbd_stage_confirm(struct op *op)
{
    op_worker(op, rbd_confirm_fn, CONFIRM_MS, confirm_done);
}

/* ------------------------------------------------------------ restarts */

#define RETRY_MIN_MS 2000ull
#define RETRY_MAX_MS (60ull * 1000)

/* The (re)start of a staged volume's QSD under the rule (v->rbd_guard). */
struct rbd_guard {
    struct csi *c;
    char *id;               /* the volume's record, looked up at every step */
    struct worker *worker;
    struct rbd_check *check;
    bool confirming;        /* the worker checks a running QSD */
    struct loop_timer *timer;
    uint64_t delay_ms;      /* until the next try after a refusal */
    char *refused;          /* why the volume is not served, or NULL */
    bool taken;             /* refused: another live client holds the lock */
};

static struct rbd_guard *guard_of(struct csi *c, struct vol *v)
{
    if (!v->rbd_guard) {
        struct rbd_guard *g = xcalloc(1, sizeof(*g));
        g->c = c;
        g->id = xstrdup(v->id);
        g->delay_ms = RETRY_MIN_MS;
        v->rbd_guard = g;
    }
    return v->rbd_guard;
}

void rbd_guard_free(struct vol *v)
{
    struct rbd_guard *g = v->rbd_guard;
    if (!g)
        return;
    worker_cancel(g->worker);
    rbd_check_free(g->check);
    loop_timer_cancel(g->timer);
    free(g->refused);
    free(g->id);
    free(g);
    v->rbd_guard = NULL;
}

const char *rbd_guard_refused(const struct vol *v)
{
    return v->rbd_guard ? v->rbd_guard->refused : NULL;
}

static void step(struct loop *l, void *opaque);

static void retry(struct rbd_guard *g)
{
    loop_timer_cancel(g->timer);
    g->timer = loop_timer_add(g->c->loop, g->delay_ms, step, g);
    g->delay_ms = MIN(g->delay_ms * 2, RETRY_MAX_MS);
}

static void refuse(struct rbd_guard *g, int status, const char *msg)
{
    free(g->refused);
    if (g->taken) /* its guest's view of the disk is stale: no automatic retry */
        g->refused = xasprintf("not served: another node took it over, its QSD is not "
                               "restarted (unstage the volume here; a NodeStageVolume checks "
                               "again): %s", msg);
    else
        g->refused = xasprintf("not served (its QSD is not restarted; retried within %llu s, or "
                               "unstage the volume): %s",
                               (unsigned long long)g->delay_ms / 1000,
                               msg ? msg : strerror(-status));
    _cleanup_free_ char *q = log_quote(g->refused);
    log_warn("rbd", "restart refused", "volume=%s error=%s", g->id, q);
}

static void check_done(int status, const char *msg, json_t *result, void *opaque);

/* Check in a worker (own: 1 for a running QSD of ours, fresh: started
 * just now, dead: our reaped QSD's address; rbd_lock_claim); v is busy
 * meanwhile. */
static void check(struct rbd_guard *g, struct vol *v, size_t own, bool fresh, const char *dead)
{
    g->check = rbd_check_new(g->c, v, own, fresh, dead);
    g->confirming = own > 0;
    int r = g->check ? worker_start(g->c->loop, rbd_check_fn, g->check, CONFIRM_MS, check_done,
                                    g, &g->worker)
                     : -EINVAL;
    if (r < 0) {
        rbd_check_free(g->check);
        g->check = NULL;
        refuse(g, r, "cannot start the check");
        retry(g);
        return;
    }
    v->busy = true;
}

static void confirm_stopped(struct qsd *q, int status, const char *msg, void *opaque);

static void guard_started(struct csi *c, struct vol *v, int status, const char *msg, void *opaque)
{
    struct rbd_guard *g = opaque;
    (void)c;
    if (status < 0) {
        v->busy = false;
        refuse(g, status, msg);
        retry(g);
        return;
    }
    /* still busy; the reaped QSD's watch may still be there; the new QSD's
     * guest reconnects at once and may already hold the lock */
    check(g, v, 1, true, json_string_value(json_object_get(v->parameters, "addr")));
}

static void guard_stopped(struct qsd *q, int status, const char *msg, void *opaque)
{
    struct rbd_guard *g = opaque;
    struct vol *v = store_find_vol(g->c->store, g->id);
    (void)q;
    if (status < 0)
        log_warn("rbd", "cannot stop the QSD of a refused restart", "volume=%s error=\"%s\"",
                 g->id, msg ? msg : strerror(-status));
    if (v)
        v->busy = false;
    if (!g->taken)
        retry(g);
}

static void check_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct rbd_guard *g = opaque;
    struct csi *c = g->c;
    struct vol *v = store_find_vol(c->store, g->id);
    g->worker = NULL;
    rbd_check_free(g->check);
    g->check = NULL;
    if (!v) /* cannot happen: the record is busy */
        return;
    v->busy = false;
    rbd_log_fenced(v->id, json_object_get(result, "fenced"));
    g->taken = status < 0 && json_is_true(json_object_get(result, "held"));
    if (status < 0) {
        refuse(g, status, msg);
        if (g->confirming && v->qsd && !qsd_idle(v->qsd)) {
            v->busy = true; /* stop the QSD that must not serve, then retry */
            if (qsd_stop(v->qsd, guard_stopped, g) == 0)
                return;
            v->busy = false;
        }
        if (!g->taken)
            retry(g);
        return;
    }
    if (g->confirming) {
        record_addr(c, v, result);
        free(g->refused);
        g->refused = NULL;
        g->delay_ms = RETRY_MIN_MS;
        log_info("rbd", "QSD serves after the check", "volume=%s pid=%d", v->id,
                 v->qsd ? (int)qsd_get_pid(v->qsd) : 0);
        return;
    }
    _cleanup_free_ char *m = NULL;
    v->busy = true;
    if (vol_qsd_start(c, v, -1, guard_started, g, &m) < 0) {
        v->busy = false;
        refuse(g, -EIO, m);
        retry(g);
    }
}

/* The timer of a (re)start: check, start, check again. */
static void step(struct loop *l, void *opaque)
{
    struct rbd_guard *g = opaque;
    (void)l;
    g->timer = NULL;
    struct vol *v = store_find_vol(g->c->store, g->id);
    if (!v || !v->staging_path || (v->qsd && !qsd_idle(v->qsd)))
        return; /* unstaged, or served (adopted, started by a stage) */
    if (v->busy || v->start_ctx || g->worker) {
        retry(g); /* another operation on it: later */
        return;
    }
    check(g, v, 0, false, json_string_value(json_object_get(v->parameters, "addr")));
}

void rbd_restart(struct csi *c, struct vol *v)
{
    struct rbd_guard *g = guard_of(c, v);
    loop_timer_cancel(g->timer);
    g->timer = loop_timer_add(c->loop, 0, step, g);
}

void rbd_adopted(struct csi *c, struct vol *v)
{
    if (json_object_get(v->parameters, "addr"))
        return; /* checked after its start */
    check(guard_of(c, v), v, 1, false, NULL);
}
