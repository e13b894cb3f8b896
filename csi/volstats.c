/* SPDX-License-Identifier: Apache-2.0 */
/* volstats.c: background collection of the volumes' health and I/O figures.
 * See volstats.h.
 *
 * One entry per volume id seen staged or ready, pruned when the volume goes.
 * A round starts on a timer: QMP probes go out at once (each its own short
 * connection: a QSD monitor serves one client at a time, so none is kept
 * open), and one worker reads /proc and the pool.  A round is not started
 * while the previous worker runs, and a volume is not probed while its
 * previous probe is in flight: the work per round is bounded. */
#include "volstats.h"
#include "qsd/base/log.h"
#include "qsd/base/proc.h"
#include "qsd/base/util.h"
#include "qsd/qemu/thin.h"
#include "qsd/qemu/qmpcmd.h"
#include "backend.h"
#include "service.h"
#include "volqsd.h"
#include "op.h"

#include <inttypes.h>
#include <sys/statvfs.h>

/* Below this much free space, a pool that cannot hold a volume's
 * unallocated capacity makes the volume's condition abnormal. */
#define POOL_LOW_BYTES (1ull << 30)
#define COLLECT_TIMEOUT_MS 30000

static const double probe_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                      0.1,    0.25,  0.5,    1,     2.5};

struct entry {
    struct volstats *vs;
    char *id;
    struct volstat st;
    struct qmp *qmp;        /* probe in flight */
    uint64_t probe_start_us;
    bool hung;
    char *hung_reason;
    unsigned fails;         /* probes in a row that found it hung */
    bool seen;              /* still a volume of the store (pruning) */
    struct entry *next;
};

struct volstats {
    struct csi *csi;
    uint64_t interval_ms;
    struct entry *entries;
    struct loop_timer *timer;
    struct worker *worker;
    struct pool_stat pool;
};

const char *vol_state_name(enum vol_state s)
{
    switch (s) {
    case VS_RUNNING: return "running";
    case VS_RESTARTING: return "restarting";
    case VS_CRASH_LOOP: return "crash-loop";
    case VS_HUNG: return "hung";
    case VS_REFUSED: return "refused";
    default: return "none";
    }
}

static struct entry *entry_find(struct volstats *vs, const char *id)
{
    for (struct entry *e = vs->entries; e; e = e->next)
        if (streq(e->id, id))
            return e;
    return NULL;
}

static struct entry *entry_get(struct volstats *vs, const char *id)
{
    struct entry *e = entry_find(vs, id);
    if (e)
        return e;
    e = xcalloc(1, sizeof(*e));
    e->vs = vs;
    e->id = xstrdup(id);
    histogram_init(&e->st.probe, probe_bounds, ARRAY_SIZE(probe_bounds));
    e->next = vs->entries;
    vs->entries = e;
    return e;
}

static void entry_free(struct entry *e)
{
    qmp_close(e->qmp);
    histogram_clear(&e->st.probe);
    free(e->hung_reason);
    free(e->id);
    free(e);
}

/* ------------------------------------------------------------ QMP probe */

/* Past VOLSTATS_HUNG_KILL_AFTER hung probes in a row, the QSD is killed
 * (qsd_kill_hung) and restarted like a dead one: by its supervision, or for
 * an RBD volume by the plugin after the lock check (rbd_lock.h). */
static void kill_hung(struct entry *e)
{
    struct vol *v = store_find_vol(e->vs->csi->store, e->id);
    if (!v || !vol_live(v) || v->busy)
        return;
    _cleanup_free_ char *why = xasprintf("%s, %u probes in a row", e->hung_reason, e->fails);
    pid_t pid = qsd_get_pid(v->qsd);
    int r = qsd_kill_hung(v->qsd, why);
    if (r < 0) {
        if (r != -EALREADY)
            log_warn("qsd", "cannot kill a hung QSD", "volume=%s pid=%d error=\"%s\"", e->id,
                     (int)pid, strerror(-r));
        return;
    }
    _cleanup_free_ char *q = log_quote(why);
    log_error("qsd", "QSD hung: killed, to be restarted", "volume=%s pid=%d reason=%s", e->id,
              (int)pid, q);
    e->hung = false; /* the restart says what it is now */
    e->fails = 0;
}

static void set_hung(struct entry *e, const char *what)
{
    free(e->hung_reason);
    e->hung_reason = streq(what, "accepted no connection")
                         ? xstrdup("its QMP monitor accepts no connection (its backlog is full)")
                         : xasprintf("its QMP monitor %s within %u ms", what,
                                     VOLSTATS_PROBE_TIMEOUT_MS);
    if (!e->hung)
        log_warn("qsd", "QSD does not answer on its monitor (hung)", "volume=%s reason=\"%s\"",
                 e->id, e->hung_reason);
    e->hung = true;
    if (++e->fails >= VOLSTATS_HUNG_KILL_AFTER)
        kill_hung(e);
}

static void probe_end(struct entry *e)
{
    qmp_close(e->qmp);
    e->qmp = NULL;
}

/* The discard figures of the file driver (qmpcmd.h: the only I/O
 * accounting QSD 10.0 has for an exported node). */
static void on_probe_reply(int status, const struct qmpc_discard *st, void *opaque)
{
    struct entry *e = opaque;
    if (status == -ETIMEDOUT) {
        e->st.probes_failed++;
        set_hung(e, "did not answer query-blockstats");
    } else if (status == 0) {
        histogram_observe(&e->st.probe, (double)(now_us() - e->probe_start_us) / 1e6);
        e->st.have_discard = true;
        e->st.discard_ops = st->ops;
        e->st.discard_bytes = st->bytes;
        if (e->hung)
            log_info("qsd", "QSD answers on its monitor again", "volume=%s", e->id);
        e->hung = false;
        e->fails = 0;
    } else {
        e->st.probes_failed++;
    }
    probe_end(e);
}

static void on_probe_state(struct qmp *q, int status, const struct qmp_error *err, void *opaque)
{
    struct entry *e = opaque;
    if (status == 0) {
        int r = qmpc_discard_stats(q, VOLSTATS_PROBE_TIMEOUT_MS, on_probe_reply, e);
        if (r < 0) {
            e->st.probes_failed++;
            probe_end(e);
        }
        return;
    }
    e->st.probes_failed++;
    if (status == -ETIMEDOUT)
        set_hung(e, "did not greet");
    /* Otherwise the connection broke: the QSD is dying or restarting, which
     * its supervision reports. */
    probe_end(e);
}

static void probe(struct entry *e, struct vol *v)
{
    if (e->qmp)
        return;
    e->probe_start_us = now_us();
    int r = qmp_connect(e->vs->csi->loop, qsd_get_paths(v->qsd)->qmp, VOLSTATS_PROBE_TIMEOUT_MS,
                        on_probe_state, e, &e->qmp);
    if (r < 0) {
        e->qmp = NULL;
        e->st.probes_failed++;
        /* A full backlog: the monitor stopped accepting (our earlier probe
         * still waits in it). */
        if (r == -EAGAIN)
            set_hung(e, "accepted no connection");
    }
}

/* ------------------------------------------------------------ worker */

int vol_allocated(struct csi *c, const char *id, uint64_t *ret)
{
    _cleanup_free_ char *image = NULL, *fmt = NULL, *msg = NULL;
    struct chain ch;
    int r = pool_find_volume(&c->pool, id, &image, &fmt);
    if (r < 0)
        return r;
    if ((r = pool_chain(&c->pool, image, fmt, &ch, &msg)) < 0)
        return r;
    uint64_t used = 0;
    for (size_t k = 0; k < ch.n; k++)
        used += ch.l[k].alloc;
    chain_clear(&ch);
    *ret = used;
    return 0;
}

/* In the worker (a child with a copy of the plugin's memory). */
static int collect_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct csi *c = arg;
    json_t *res = json_object(), *vols = json_object();
    json_object_set_new(res, "volumes", vols);
    for (size_t i = 0; i < c->store->n_vols; i++) {
        struct vol *v = c->store->vols[i];
        if (v->phase != PHASE_READY)
            continue;
        json_t *o = json_object();
        uint64_t alloc;
        if (vol_allocated(c, v->id, &alloc) == 0)
            json_object_set_new(o, "allocated", json_integer((json_int_t)alloc));
        struct proc_io io;
        if (vol_live(v) && proc_io(qsd_get_qsd_pid(v->qsd), &io) == 0)
            json_object_set_new(o, "io",
                                json_pack("{s:I, s:I, s:I, s:I, s:f}", "read_bytes",
                                          (json_int_t)io.read_bytes, "write_bytes",
                                          (json_int_t)io.write_bytes, "syscr",
                                          (json_int_t)io.syscr, "syscw", (json_int_t)io.syscw,
                                          "cpu", io.cpu_seconds));
        json_object_set_new(vols, v->id, o);
    }
    struct statvfs sv;
    if (statvfs(c->pool.volumes, &sv) == 0)
        json_object_set_new(res, "pool",
                            json_pack("{s:I, s:I}", "capacity",
                                      (json_int_t)((uint64_t)sv.f_blocks * sv.f_frsize), "free",
                                      (json_int_t)((uint64_t)sv.f_bavail * sv.f_frsize)));
    *ret_result = res;
    return 0;
}

static uint64_t jget(json_t *o, const char *k) { return (uint64_t)json_integer_value(json_object_get(o, k)); }

static void collect_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct volstats *vs = opaque;
    vs->worker = NULL;
    if (status < 0) {
        log_warn("metrics", "statistics collection failed", "error=\"%s\"",
                 msg ? msg : strerror(-status));
        return;
    }
    json_t *pool = json_object_get(result, "pool");
    vs->pool.valid = pool != NULL;
    if (pool) {
        vs->pool.capacity = jget(pool, "capacity");
        vs->pool.free = jget(pool, "free");
    }
    const char *id;
    json_t *o;
    json_object_foreach(json_object_get(result, "volumes"), id, o)
    {
        struct entry *e = entry_find(vs, id);
        if (!e)
            continue; /* gone meanwhile */
        json_t *a = json_object_get(o, "allocated"), *io = json_object_get(o, "io");
        e->st.have_alloc = a != NULL;
        e->st.allocated = a ? (uint64_t)json_integer_value(a) : 0;
        e->st.have_io = io != NULL;
        if (io) {
            e->st.read_bytes = jget(io, "read_bytes");
            e->st.write_bytes = jget(io, "write_bytes");
            e->st.read_syscalls = jget(io, "syscr");
            e->st.write_syscalls = jget(io, "syscw");
            e->st.cpu_seconds = json_real_value(json_object_get(io, "cpu"));
        }
    }
}

/* ------------------------------------------------------------ rounds */

static void round_start(struct loop *l, void *opaque)
{
    struct volstats *vs = opaque;
    struct store *s = vs->csi->store;
    vs->timer = loop_timer_add(l, vs->interval_ms, round_start, vs);

    for (struct entry *e = vs->entries; e; e = e->next)
        e->seen = false;
    for (size_t i = 0; i < s->n_vols; i++) {
        struct vol *v = s->vols[i];
        if (v->phase != PHASE_READY)
            continue;
        struct entry *e = entry_get(vs, v->id);
        e->seen = true;
        if (!vol_live(v)) {
            e->hung = false; /* not running: its supervision says what it is */
            e->fails = 0;
            continue;
        }
        /* An operation in flight may hold the monitor (one client at a
         * time): its own bounds apply, the last verdict stands. */
        if (!v->busy)
            probe(e, v);
    }
    for (struct entry **pp = &vs->entries; *pp;) {
        struct entry *e = *pp;
        if (!e->seen) {
            *pp = e->next;
            entry_free(e);
        } else {
            pp = &e->next;
        }
    }
    if (!vs->worker) {
        int r = worker_start(l, collect_fn, vs->csi, COLLECT_TIMEOUT_MS, collect_done, vs,
                             &vs->worker);
        if (r < 0) {
            vs->worker = NULL;
            log_warn("metrics", "cannot start the statistics worker", "error=\"%s\"",
                     strerror(-r));
        }
    }
}

int volstats_new(struct csi *c, uint64_t interval_ms, struct volstats **ret)
{
    struct volstats *vs = xcalloc(1, sizeof(*vs));
    vs->csi = c;
    vs->interval_ms = interval_ms;
    vs->timer = loop_timer_add(c->loop, 0, round_start, vs);
    *ret = vs;
    return 0;
}

void volstats_free(struct volstats *vs)
{
    if (!vs)
        return;
    loop_timer_cancel(vs->timer);
    worker_cancel(vs->worker);
    while (vs->entries) {
        struct entry *e = vs->entries;
        vs->entries = e->next;
        entry_free(e);
    }
    free(vs);
}

/* ------------------------------------------------------------ readers */

enum vol_state volstats_state(struct volstats *vs, const struct vol *v)
{
    if (!v->staging_path)
        return VS_NONE;
    if (!vol_live(v) && BACKEND_OF(.record = v)->refused(v))
        return VS_REFUSED;
    if (v->qsd && qsd_crash_looping(v->qsd))
        return VS_CRASH_LOOP;
    if (!vol_live(v))
        return VS_RESTARTING;
    struct entry *e = vs ? entry_find(vs, v->id) : NULL;
    return e && e->hung ? VS_HUNG : VS_RUNNING;
}

const char *volstats_hung_reason(struct volstats *vs, const struct vol *v)
{
    struct entry *e = vs ? entry_find(vs, v->id) : NULL;
    return e && e->hung ? e->hung_reason : NULL;
}

const struct volstat *volstats_get(struct volstats *vs, const char *id)
{
    struct entry *e = entry_find(vs, id);
    return e ? &e->st : NULL;
}

struct pool_stat volstats_pool(struct volstats *vs)
{
    return vs ? vs->pool : (struct pool_stat){0};
}

char *volstats_pool_low(struct volstats *vs)
{
    struct pool_stat p = volstats_pool(vs);
    if (!p.valid || p.free >= POOL_LOW_BYTES)
        return NULL;
    char b1[32], b2[32];
    return xasprintf("the pool is nearly full: %s free of %s (writes that need new space may "
                     "fail with ENOSPC)", format_size(p.free, b1, sizeof(b1)),
                     format_size(p.capacity, b2, sizeof(b2)));
}

char *volstats_pool_problem(struct volstats *vs, const struct vol *v, uint64_t allocated)
{
    struct pool_stat p = volstats_pool(vs);
    if (!p.valid || v->image_size <= allocated)
        return NULL;
    uint64_t may_write = v->image_size - allocated;
    if (p.free >= may_write || p.free >= POOL_LOW_BYTES)
        return NULL;
    char b1[32], b2[32];
    return xasprintf("the pool is nearly full: %s free, while volume %s may still allocate %s "
                     "(writes that need new space fail with ENOSPC)",
                     format_size(p.free, b1, sizeof(b1)), v->id,
                     format_size(may_write, b2, sizeof(b2)));
}
