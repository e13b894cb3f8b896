/* rbd_lock.c: see rbd_lock.h.
 *
 * Why watches: librbd's exclusive lock is cooperative.  A second client
 * that writes asks the holder for the lock and the holder hands it over,
 * so two QSDs serving one image both write, in turns (seen with Ceph
 * 16.2: two QSDs, alternate writes all succeed).  The lock alone therefore
 * cannot keep two nodes apart; a client's watch on the image header can:
 * every client that opens the image read-write (a QSD, also one exported
 * read-only) keeps one while it lives, and the OSD drops it
 * osd_client_watch_timeout (30 s by default) after the client stopped
 * answering.  A lock holder without a watch is dead or cut off; breaking
 * its lock with rbd_break_lock blocklists its address first
 * (rbd_blocklist_on_break_lock, set by conn_open), so a holder that comes
 * back gets errors (ESHUTDOWN) instead of writing.
 *
 * Two nodes staging at once: each QSD registers its watch when it opens
 * the image, before the second check lists the watchers; whichever node
 * checks last sees the other's QSD and gives up (both may: kubelet
 * retries).  No QSD gets a client before its node's check passed (the
 * socket is published after NodeStageVolume answered), so none writes. */
#include "rbd_lock.h"
#include "rbd.h"
#include "service.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"

#include <inttypes.h>

#define WATCHERS_MAX 16
#define LOCKERS_BUF 4096
#define CONFIRM_MS (60ull * 1000) /* as every RBD worker (rbd.c) */

/* Whether the lock holder client ("client.N") at addr still has a watch:
 * the same client id, or the same address (a client that lost its watch
 * and registered a new one keeps both). */
static bool holder_alive(const rbd_image_watcher_t *w, size_t nw, const char *client,
                         const char *addr)
{
    for (size_t i = 0; i < nw; i++) {
        char id[32];
        snprintf(id, sizeof(id), "client.%" PRId64, w[i].id);
        if (streq(id, client) || streq_ptr(w[i].addr, addr))
            return true;
    }
    return false;
}

/* Drop the watchers at address dead (our QSD, reaped: its watch outlives
 * it until Ceph expires it) from w; how many are left. */
static size_t drop_dead(rbd_image_watcher_t *w, size_t nw, const char *dead)
{
    size_t n = 0;
    for (size_t i = 0; i < nw; i++) {
        rbd_image_watcher_t t = w[n];
        w[n] = w[i];
        w[i] = t;
        if (!dead || !streq_ptr(w[n].addr, dead))
            n++;
    }
    return n;
}

int rbd_lock_claim(rbd_image_t img, const char *name, size_t own, const char *dead,
                   json_t **ret_fenced, char **ret_own, bool *ret_held, char **ret_msg)
{
    rbd_image_watcher_t w[WATCHERS_MAX];
    size_t all = WATCHERS_MAX, nw;
    int r = rbd_watchers_list(img, w, &all);
    nw = r == 0 ? drop_dead(w, all, dead) : 0;
    if (r == -ERANGE) {
        *ret_msg = xasprintf("volume %s is in use: image %s has more than %d clients", name,
                             name, WATCHERS_MAX);
        return -EBUSY;
    }
    if (r < 0) {
        *ret_msg = xasprintf("cannot list the clients of image %s: %s", name, strerror(-r));
        return r;
    }
    int excl = 0;
    char tag[256], clients[LOCKERS_BUF], cookies[LOCKERS_BUF], addrs[LOCKERS_BUF];
    size_t tl = sizeof(tag), cl = sizeof(clients), kl = sizeof(cookies), al = sizeof(addrs);
    ssize_t n = rbd_list_lockers(img, &excl, tag, &tl, clients, &cl, cookies, &kl, addrs, &al);
    if (n < 0) {
        *ret_msg = xasprintf("cannot read the lock of image %s: %s", name, strerror((int)-n));
        rbd_watchers_list_cleanup(w, all);
        return (int)n;
    }
    json_t *fenced = json_array();
    const char *cli = clients, *ck = cookies, *ad = addrs;
    for (ssize_t i = 0; i < n && r == 0; i++) {
        if (holder_alive(w, nw, cli, ad)) {
            *ret_msg = xasprintf("volume %s is in use: %s at %s holds the image's lock and is "
                                 "alive (it watches the image); unstage the volume on its node, "
                                 "or stop that node: Ceph drops a dead client's watch after "
                                 "osd_client_watch_timeout (docs/rbd.md, node loss)", name, cli,
                                 ad);
            *ret_held = true;
            r = -EBUSY;
        } else if ((r = rbd_break_lock(img, cli, ck)) < 0 && r != -ENOENT) {
            *ret_msg = xasprintf("cannot fence %s at %s, the dead holder of image %s's lock "
                                 "(blocklist, then break the lock): %s", cli, ad, name,
                                 strerror(-r));
        } else {
            r = 0;
            json_array_append_new(fenced, json_pack("{s:s, s:s}", "client", cli, "addr", ad));
        }
        cli += strlen(cli) + 1;
        ck += strlen(ck) + 1;
        ad += strlen(ad) + 1;
    }
    if (r == 0 && nw > own) {
        *ret_msg = xasprintf("volume %s is in use: %zu other client(s) have image %s open (%s%s); "
                             "unstage it on the node serving it (a client that died keeps its "
                             "watch until osd_client_watch_timeout)", name, nw - own, name,
                             w[0].addr, nw - own > 1 ? ", ..." : "");
        r = -EBUSY;
    }
    if (r == 0 && own == 1 && nw == 1 && ret_own)
        *ret_own = xstrdup(w[0].addr);
    rbd_watchers_list_cleanup(w, all);
    if (r == 0 && json_array_size(fenced) > 0)
        *ret_fenced = json_incref(fenced);
    json_decref(fenced);
    return r;
}

/* ------------------------------------------------------------ loop side */

void rbd_log_fenced(const char *volume, json_t *fenced)
{
    size_t i;
    json_t *f;
    json_array_foreach(fenced, i, f)
        log_warn("rbd", "dead client fenced: blocklisted, its lock broken",
                 "volume=%s client=%s addr=%s", volume,
                 json_string_value(json_object_get(f, "client")),
                 json_string_value(json_object_get(f, "addr")));
}

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

static void confirm_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    struct vol *v = op->vol;
    op->worker = NULL;
    rbd_log_fenced(v->id, json_object_get(result, "fenced"));
    if (status == 0) {
        record_addr(op->csi, v, result);
        log_info("node", "volume staged", "volume=%s pid=%d", v->id, (int)qsd_get_pid(v->qsd));
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

/* Check in a worker (own: 1 for a running QSD of ours, dead: our reaped
 * QSD's address); v is busy meanwhile. */
static void check(struct rbd_guard *g, struct vol *v, size_t own, const char *dead)
{
    g->check = rbd_check_new(g->c, v, own, dead);
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
    /* still busy; the reaped QSD's watch may still be there */
    check(g, v, 1, json_string_value(json_object_get(v->parameters, "addr")));
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
    if (vol_qsd_start(c, v, guard_started, g, &m) < 0) {
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
    check(g, v, 0, json_string_value(json_object_get(v->parameters, "addr")));
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
    check(guard_of(c, v), v, 1, NULL);
}
