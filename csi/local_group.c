/* SPDX-License-Identifier: Apache-2.0 */
/* local_group.c: group snapshots of local volumes (local.h): one instant
 * for all of a VM's qcow2 volumes.
 *
 * A group is a record of its own (STATE/groups/<name>.json: phase, and its
 * members: snapshot id and source volume, in the request's order) and one
 * ordinary thin snapshot record per member (its "group" names the group;
 * CreateVolume takes it as any snapshot).  Create writes the group record
 * (creating), then the members' (creating), then in a worker: every
 * member's steps 1-2 and its overlay's nodes (thin.h), the barrier
 * (barrier.h: the consumers of the volumes' vhost-user sockets are
 * journalled and stopped), every member's blockdev-snapshot, the consumers
 * continued, steps 4-5; then the records ready.  A crash anywhere leaves a group not ready, removed with
 * its members at start (local_group_recover), and stopped consumers are
 * continued from the journal.  Delete marks the group deleting, deletes the
 * members, then the group record.  Idempotent by name: the same name and
 * the same source volumes give the same group; other sources ALREADY_EXISTS. */
#include "local.h"
#include "backend.h"
#include "barrier.h"
#include "capacity.h"
#include "op.h"
#include "service.h"
#include "volqsd.h"
#include "qsd/base/log.h"
#include "qsd/base/names.h"
#include "qsd/base/util.h"
#include "qsd/qemu/qmpcmd.h"
#include "qsd/qemu/thin.h"
#include "qsd/state/records.h"

#include <dirent.h>
#include <string.h>
#include <time.h>

#define GROUP_TIMEOUT_MS (10ull * 60 * 1000) /* the whole worker (a full chain merges) */
#define GROUP_STOP_MS 2000u                   /* every consumer stopped, at most */
#define GROUP_MAX 64                          /* volumes in one group */

static const char *const PHASE_NAMES[] = {"creating", "ready", "deleting"};

struct group {
    char *id;
    enum rec_phase phase;
    char **snaps, **sources; /* members, in the request's order */
    size_t n;
    int64_t sec;
    int32_t nsec;
    bool busy;
};

struct groups {
    char *dir, *barrier_dir;
    struct group **g;
    size_t n;
};

static void group_free(struct group *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < g->n; i++) {
        free(g->snaps[i]);
        free(g->sources[i]);
    }
    free(g->snaps);
    free(g->sources);
    free(g->id);
    free(g);
}

static struct group *group_find(struct csi *c, const char *id)
{
    for (size_t i = 0; c->groups && i < c->groups->n; i++)
        if (streq(c->groups->g[i]->id, id))
            return c->groups->g[i];
    return NULL;
}

static int group_save(struct csi *c, const struct group *g)
{
    json_t *m = json_array();
    for (size_t i = 0; i < g->n; i++)
        json_array_append_new(m, json_pack("{s:s, s:s}", "snapshot", g->snaps[i], "source_volume",
                                           g->sources[i]));
    json_t *j = json_pack("{s:i, s:s, s:s, s:I, s:i, s:o}", "version", 1, "id", g->id, "phase",
                          PHASE_NAMES[g->phase], "created_sec", (json_int_t)g->sec,
                          "created_nsec", (int)g->nsec, "members", m);
    return records_save(c->records, c->groups->dir, g->id, j);
}

static void group_drop(struct csi *c, struct group *g)
{
    struct groups *gs = c->groups;
    records_remove(c->records, gs->dir, g->id);
    for (size_t i = 0; i < gs->n; i++)
        if (gs->g[i] == g) {
            gs->g[i] = gs->g[--gs->n];
            break;
        }
    group_free(g);
}

static struct group *group_from_json(json_t *j)
{
    const char *id, *phase;
    json_int_t sec;
    int nsec;
    json_t *m, *e;
    if (json_unpack(j, "{s:s, s:s, s:I, s:i, s:o}", "id", &id, "phase", &phase, "created_sec",
                    &sec, "created_nsec", &nsec, "members", &m) < 0 ||
        name_validate(id, NULL) < 0 || !json_is_array(m) || json_array_size(m) > GROUP_MAX)
        return NULL;
    struct group *g = xcalloc(1, sizeof(*g));
    g->id = xstrdup(id);
    g->phase = streq(phase, "ready") ? PHASE_READY
             : streq(phase, "creating") ? PHASE_CREATING : PHASE_DELETING;
    g->sec = sec;
    g->nsec = nsec;
    g->snaps = xcalloc(json_array_size(m) + 1, sizeof(char *));
    g->sources = xcalloc(json_array_size(m) + 1, sizeof(char *));
    size_t i;
    json_array_foreach(m, i, e) {
        const char *s = json_string_value(json_object_get(e, "snapshot"));
        const char *v = json_string_value(json_object_get(e, "source_volume"));
        if (!s || !v || name_validate(s, NULL) < 0 || name_validate(v, NULL) < 0) {
            group_free(g);
            return NULL;
        }
        g->snaps[g->n] = xstrdup(s);
        g->sources[g->n++] = xstrdup(v);
    }
    return g;
}

static void groups_load(struct csi *c)
{
    struct groups *gs = xcalloc(1, sizeof(*gs));
    gs->dir = xasprintf("%s/groups", c->store->dir);
    gs->barrier_dir = xasprintf("%s/barriers", c->store->dir);
    mkdir_p(gs->dir, 0700);
    c->groups = gs;
    records_sweep(gs->dir);
    DIR *d = opendir(gs->dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l < 6 || strcmp(de->d_name + l - 5, ".json") != 0)
            continue;
        _cleanup_free_ char *p = xasprintf("%s/%s", gs->dir, de->d_name), *text = NULL;
        size_t len;
        json_t *j = read_file(p, 1 << 20, &text, &len) == 0 ? json_loadb(text, len, 0, NULL) : NULL;
        struct group *g = j ? group_from_json(j) : NULL;
        json_decref(j);
        if (!g) {
            log_warn("plugin", "invalid group snapshot record skipped", "path=%s", p);
            continue;
        }
        gs->g = xrealloc(gs->g, (gs->n + 1) * sizeof(*gs->g));
        gs->g[gs->n++] = g;
    }
    if (d)
        closedir(d);
}

void local_group_free(struct csi *c)
{
    struct groups *gs = c->groups;
    if (!gs)
        return;
    for (size_t i = 0; i < gs->n; i++)
        group_free(gs->g[i]);
    free(gs->g);
    free(gs->dir);
    free(gs->barrier_dir);
    free(gs);
    c->groups = NULL;
}

/* Delete the member snapshots of g (images and records) that exist. */
static int delete_members(struct csi *c, const struct group *g, char **ret_msg)
{
    int r = 0;
    for (size_t i = 0; i < g->n; i++) {
        struct snap *sn = store_find_snap(c->store, g->snaps[i]);
        if (sn && !streq_ptr(sn->group, g->id))
            continue; /* not ours (a name taken meanwhile) */
        _cleanup_free_ char *m = NULL;
        int k = snapshot_delete(&c->pool, g->snaps[i], &m);
        if (k < 0 && k != -ENOENT) {
            if (!*ret_msg)
                *ret_msg = TAKE_PTR(m);
            r = k;
            continue;
        }
        if (sn)
            store_remove_snap(c->store, sn);
    }
    return r;
}

void local_group_recover(struct csi *c)
{
    groups_load(c);
    int n = barrier_recover(c->groups->barrier_dir);
    if (n > 0)
        log_info("plugin", "group snapshot barriers cut short: consumers continued", "journals=%d", n);
    struct groups *gs = c->groups;
    for (size_t i = 0; i < gs->n;) {
        struct group *g = gs->g[i];
        if (g->phase == PHASE_READY) {
            i++;
            continue;
        }
        _cleanup_free_ char *msg = NULL;
        delete_members(c, g, &msg);
        log_info("plugin", "removed a group snapshot left half-done", "group=%s phase=%s", g->id,
                 PHASE_NAMES[g->phase]);
        group_drop(c, g);
    }
    for (size_t i = 0; i < c->store->n_snaps;) {
        struct snap *sn = c->store->snaps[i];
        if (!sn->group || group_find(c, sn->group)) {
            i++;
            continue;
        }
        _cleanup_free_ char *msg = NULL;
        snapshot_delete(&c->pool, sn->id, &msg);
        log_info("plugin", "removed a group member without its group", "snapshot=%s group=%s",
                 sn->id, sn->group);
        store_remove_snap(c->store, sn);
    }
}

/* ---------------------------------------------------------- the answer */

static void reply_group(struct csi *c, struct grpc_call *call, const struct group *g, bool create)
{
    size_t n = g->n;
    struct snapmsg *s = xcalloc(n + 1, sizeof(*s));
    Csi__V1__Snapshot **sl = xcalloc(n + 1, sizeof(*sl));
    bool ready = g->phase == PHASE_READY;
    for (size_t i = 0; i < n; i++) {
        struct snap *sn = store_find_snap(c->store, g->snaps[i]);
        if (sn) {
            local_snapmsg_fill(c, sn, &s[i]);
            s[i].snap.ready_to_use = sn->phase == PHASE_READY;
        } else {
            s[i].snap = (Csi__V1__Snapshot)CSI__V1__SNAPSHOT__INIT;
            s[i].snap.snapshot_id = (char *)csi_id_out(c, g->snaps[i], s[i].ids[0]);
            s[i].snap.source_volume_id = (char *)csi_id_out(c, g->sources[i], s[i].ids[1]);
        }
        ready &= s[i].snap.ready_to_use;
        sl[i] = &s[i].snap;
    }
    char gid[CSI_ID_MAX + 1];
    Google__Protobuf__Timestamp gts = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
    gts.seconds = g->sec;
    gts.nanos = g->nsec;
    Csi__V1__VolumeGroupSnapshot vg = CSI__V1__VOLUME_GROUP_SNAPSHOT__INIT;
    vg.group_snapshot_id = (char *)csi_id_out(c, g->id, gid);
    vg.n_snapshots = n;
    vg.snapshots = sl;
    vg.creation_time = &gts;
    vg.ready_to_use = ready;
    if (create) {
        Csi__V1__CreateVolumeGroupSnapshotResponse out =
            CSI__V1__CREATE_VOLUME_GROUP_SNAPSHOT_RESPONSE__INIT;
        out.group_snapshot = &vg;
        grpc_call_reply_pb(call, &out.base);
    } else {
        Csi__V1__GetVolumeGroupSnapshotResponse out = CSI__V1__GET_VOLUME_GROUP_SNAPSHOT_RESPONSE__INIT;
        out.group_snapshot = &vg;
        grpc_call_reply_pb(call, &out.base);
    }
    free(s);
    free(sl);
}

/* ------------------------------------------------- the snapshot (worker) */

/* What a CreateVolumeGroupSnapshot carries (op.h). */
struct group_ctx {
    struct csi *c;
    struct group *g;
    struct vol **vols;
    struct snap **snaps;
    bool *live;
    size_t n;
};

static void group_ctx_free(void *p)
{
    struct group_ctx *x = p;
    free(x->vols);
    free(x->snaps);
    free(x->live);
    free(x);
}

static const struct op_ctx_type group_ctx_type = {"CreateVolumeGroupSnapshot", group_ctx_free};

/* The per-member work of the worker. */
struct member {
    struct qmp_sync *q;
    struct qsd_opts o;
    bool have_o;
    struct thin_step st;
};

static void members_clear(struct member *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        qmp_sync_close(m[i].q);
        if (m[i].have_o)
            qsd_opts_clear(&m[i].o);
        thin_step_clear(&m[i].st);
    }
    free(m);
}

/* Steps 1-2 and 3a of every member (the pool lock held). */
static int prepare_all(const struct group_ctx *x, struct member *m, char **ret_msg)
{
    struct csi *c = x->c;
    for (size_t i = 0; i < x->n; i++) {
        struct vol *v = x->vols[i];
        int r = vol_export_opts(c, v, &m[i].o, ret_msg);
        if (r < 0)
            return r;
        m[i].have_o = true;
        if (x->live[i] && !v->stage_ro &&
            qmpc_connect_volume(c->cfg->run_dir, v->id, QMP_DEFAULT_TIMEOUT_MS, &m[i].q, ret_msg) < 0)
            return -ECONNREFUSED;
        if ((r = thin_step_prepare(&c->pool, v->id, m[i].q, x->snaps[i]->id, GROUP_TIMEOUT_MS,
                                   &m[i].st, ret_msg)) < 0 ||
            (r = thin_step_attach(&m[i].st, m[i].q, &m[i].o, ret_msg)) < 0)
            return r;
    }
    return 0;
}

/* The barrier and the switches: every member's blockdev-snapshot (step
 * 3b) while the volumes' consumers are stopped.  *ret_pause_us: stop to
 * continue. */
static int switch_all(const struct group_ctx *x, struct member *m, uint64_t *ret_pause_us,
                      size_t *ret_consumers, char **ret_msg)
{
    const char **socks = xcalloc(x->n + 1, sizeof(char *));
    for (size_t i = 0; i < x->n; i++)
        socks[i] = x->live[i] && x->vols[i]->qsd ? qsd_get_paths(x->vols[i]->qsd)->socket : NULL;
    struct consumer *cs = NULL;
    size_t ncs = 0, failed = 0;
    int r = barrier_find(socks, x->n, &cs, &ncs, ret_msg);
    free(socks);
    if (r < 0)
        return r;
    *ret_consumers = ncs;
    const char *bdir = x->c->groups->barrier_dir;
    if (ncs && (r = barrier_journal(bdir, x->g->id, cs, ncs, ret_msg)) < 0) {
        free(cs);
        return r;
    }
    uint64_t t0 = now_us();
    if ((r = barrier_stop(cs, ncs, GROUP_STOP_MS, &failed, ret_msg)) < 0) {
        barrier_cont(cs, ncs);
        barrier_journal_remove(bdir, x->g->id);
        char *m2 = xasprintf("volume %s: %s", x->vols[cs[failed].member]->id, *ret_msg);
        free(*ret_msg);
        *ret_msg = m2;
        free(cs);
        return -EAGAIN;
    }
    for (size_t i = 0; i < x->n && r == 0; i++)
        r = thin_step_switch(&m[i].st, ret_msg);
    barrier_cont(cs, ncs);
    *ret_pause_us = now_us() - t0;
    if (ncs)
        barrier_journal_remove(bdir, x->g->id);
    free(cs);
    return r;
}

/* A member's size and layers (as CreateSnapshot records them), and a
 * background merge of a deep chain (the pool lock released). */
static json_t *member_result(struct csi *c, const char *vol, const char *snap, const char *layer,
                             struct qmp_sync *q, char **ret_msg)
{
    _cleanup_free_ char *spath = pool_snapshot_path(&c->pool, snap);
    struct chain ch;
    if (pool_chain(&c->pool, spath, "qcow2", &ch, ret_msg) < 0)
        return NULL;
    json_t *layers = json_array();
    json_array_append_new(layers, json_string(layer));
    for (size_t i = 1; i < ch.n; i++)
        json_array_append_new(layers, json_string(ch.l[i].layer));
    json_t *res = json_pack("{s:I, s:o}", "size", (json_int_t)ch.l[0].size, "layers", layers);
    unsigned depth = (unsigned)ch.n;
    chain_clear(&ch);
    _cleanup_free_ char *m = NULL;
    if (q && layers_merge_count(depth, LAYER_MERGE_AT, LAYER_MERGE_TO) > 0)
        thin_merge(&c->pool, vol, q, LAYER_MERGE_TO, false, 0, &m);
    return res;
}

static int group_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    const struct group_ctx *x = op_ctx(op, &group_ctx_type);
    struct csi *c = op->csi;
    for (size_t i = 0; i < x->n; i++) {
        _cleanup_free_ char *m = NULL;
        snapshot_delete(&c->pool, x->snaps[i]->id, &m); /* an earlier attempt's */
    }
    struct member *m = xcalloc(x->n, sizeof(*m));
    int lock = -1;
    int r = pool_lock(&c->pool, POOL_LOCK_TIMEOUT_MS, &lock, ret_msg);
    uint64_t pause_us = 0;
    size_t ncs = 0;
    if (r == 0 && (r = prepare_all(x, m, ret_msg)) == 0)
        r = switch_all(x, m, &pause_us, &ncs, ret_msg);
    for (size_t i = 0; i < x->n; i++) {
        _cleanup_free_ char *m2 = NULL;
        if (!m[i].st.switched)
            thin_step_undo(&m[i].st);
        else if (thin_step_finish(&c->pool, &m[i].st, r < 0 ? &m2 : ret_msg) < 0 && r == 0)
            r = -EIO;
    }
    if (lock >= 0)
        close(lock);
    json_t *members = json_array();
    for (size_t i = 0; i < x->n && r == 0; i++) {
        json_t *e = member_result(c, x->vols[i]->id, x->snaps[i]->id, m[i].st.layer, m[i].q, ret_msg);
        if (!e)
            r = -EIO;
        else
            json_array_append_new(members, e);
    }
    members_clear(m, x->n);
    if (r < 0) {
        json_decref(members);
        return r == -EEXIST || r == -ENOENT ? -EIO : r;
    }
    *ret_result = json_pack("{s:I, s:I, s:o}", "pause_us", (json_int_t)pause_us, "consumers",
                            (json_int_t)ncs, "members", members);
    return 0;
}

/* ----------------------------------------------------- the RPCs (loop) */

/* Release what the operation holds busy. */
static void group_release(struct group_ctx *x)
{
    for (size_t i = 0; i < x->n; i++) {
        if (x->vols[i])
            x->vols[i]->busy = false;
        if (x->snaps[i])
            x->snaps[i]->busy = false;
    }
    x->g->busy = false;
}

/* Undo a creation: the members' images and records, the group's. */
static void group_undo(struct group_ctx *x)
{
    struct csi *c = x->c;
    group_release(x);
    _cleanup_free_ char *m = NULL;
    delete_members(c, x->g, &m);
    group_drop(c, x->g);
    x->n = 0;
}

static void group_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    struct group_ctx *x = op_ctx(op, &group_ctx_type);
    struct csi *c = op->csi;
    op->worker = NULL;
    json_t *members = json_object_get(result, "members");
    if (status == 0 && json_array_size(members) != x->n)
        status = -EBADMSG, msg = "the worker returned no members";
    int r = 0;
    for (size_t i = 0; status == 0 && i < x->n && r == 0; i++) {
        struct snap *sn = x->snaps[i];
        json_t *e = json_array_get(members, i);
        sn->phase = PHASE_READY;
        sn->size = (uint64_t)json_integer_value(json_object_get(e, "size"));
        json_decref(sn->layers);
        sn->layers = json_incref(json_object_get(e, "layers"));
        r = store_save_snap(c->store, sn);
    }
    if (status == 0 && r == 0) {
        x->g->phase = PHASE_READY;
        r = group_save(c, x->g);
    }
    if (status == 0 && r == 0) {
        json_int_t pause = json_integer_value(json_object_get(result, "pause_us"));
        log_info("controller", "group snapshot created",
                 "group=%s members=%zu consumers=%lld pause_us=%lld", x->g->id, x->n,
                 (long long)json_integer_value(json_object_get(result, "consumers")),
                 (long long)pause);
        group_release(x);
        reply_group(c, op->call, x->g, true);
        op_end(op);
        return;
    }
    if (status == 0)
        status = r, msg = "cannot write the group snapshot records";
    _cleanup_free_ char *q = log_quote(msg ? msg : strerror(-status));
    log_warn("controller", "group snapshot failed", "group=%s error=%s", x->g->id, q);
    enum grpc_code code = status == -ECONNREFUSED || status == -EAGAIN
                              ? GRPC_UNAVAILABLE : capacity_errno_code(status, GRPC_INTERNAL);
    grpc_call_fail(op->call, code, "group snapshot %s: %s", x->g->id,
                   msg ? msg : strerror(-status));
    group_undo(x);
    csi_gc(c); /* the layers of members switched before the failure */
    op_end(op);
}

/* Same members as the request (sources, in any order)? */
static bool same_sources(const struct group *g, char **ids, size_t n)
{
    if (g->n != n)
        return false;
    for (size_t i = 0; i < n; i++) {
        bool found = false;
        for (size_t k = 0; k < g->n && !found; k++)
            found = streq(g->sources[k], ids[i]);
        if (!found)
            return false;
    }
    return true;
}

/* The checks of the sources (ids cut to record names, in place): NULL when
 * they can be taken, else the call is failed. */
static bool sources_ok(struct csi *c, struct grpc_call *call, char **ids, size_t n,
                       struct vol **vols)
{
    if (n > GROUP_MAX) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "%zu source volumes: at most %d", n, GROUP_MAX);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        struct vol *v = store_find_vol(c->store, ids[i]);
        if (!v || v->phase != PHASE_READY) {
            grpc_call_fail(call, GRPC_NOT_FOUND, "volume %s does not exist", ids[i]);
            return false;
        }
        if (!streq(v->format, "qcow2")) {
            grpc_call_fail(call, GRPC_FAILED_PRECONDITION,
                           "volume %s is %s: group snapshots take qcow2 volumes (thin layers)",
                           v->id, v->format);
            return false;
        }
        if (v->busy) {
            grpc_call_fail(call, GRPC_ABORTED, "an operation on volume %s is in progress", v->id);
            return false;
        }
        if (v->staging_path && !vol_live(v)) {
            grpc_call_fail(call, GRPC_UNAVAILABLE,
                           "volume %s is staged but its QSD is not running (restarting)", v->id);
            return false;
        }
        vols[i] = v;
    }
    return true;
}

/* The member snapshot names (NAME-<index>): valid and free, else the call
 * is failed. */
static char **member_names(struct csi *c, struct grpc_call *call, const char *name, size_t n)
{
    char **names = xcalloc(n + 1, sizeof(char *));
    for (size_t i = 0; i < n; i++) {
        names[i] = xasprintf("%s-%zu", name, i);
        _cleanup_free_ char *spath = pool_snapshot_path(&c->pool, names[i]);
        const char *why = NULL;
        if (name_validate(names[i], &why) < 0)
            grpc_call_fail(call, GRPC_INVALID_ARGUMENT,
                           "name: its member snapshot %s is invalid (%s): a shorter name", names[i], why);
        else if (store_find_snap(c->store, names[i]) || access(spath, F_OK) == 0)
            grpc_call_fail(call, GRPC_ALREADY_EXISTS,
                           "a snapshot named %s (the name of member %zu of group %s) exists",
                           names[i], i, name);
        else
            continue;
        for (size_t k = 0; k <= i; k++)
            free(names[k]);
        free(names);
        return NULL;
    }
    return names;
}

static struct group *group_new(struct csi *c, const char *name, char **ids, char **names, size_t n)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct group *g = xcalloc(1, sizeof(*g));
    g->id = xstrdup(name);
    g->phase = PHASE_CREATING;
    g->sec = now.tv_sec;
    g->nsec = (int32_t)now.tv_nsec;
    g->n = n;
    g->snaps = names;
    g->sources = xcalloc(n + 1, sizeof(char *));
    for (size_t i = 0; i < n; i++)
        g->sources[i] = xstrdup(ids[i]);
    g->busy = true;
    struct groups *gs = c->groups;
    gs->g = xrealloc(gs->g, (gs->n + 1) * sizeof(*gs->g));
    gs->g[gs->n++] = g;
    return g;
}

/* The records (group, then members, phase creating) and the worker. */
static void group_act(struct csi *c, struct grpc_call *call, const char *name, char **ids,
                      struct vol **vols, size_t n)
{
    char **names = member_names(c, call, name, n);
    if (!names)
        return;
    struct group *g = group_new(c, name, ids, names, n);
    struct group_ctx *x = xcalloc(1, sizeof(*x));
    *x = (struct group_ctx){.c = c, .g = g, .n = n, .vols = xcalloc(n, sizeof(struct vol *)),
                           .snaps = xcalloc(n, sizeof(struct snap *)), .live = xcalloc(n, sizeof(bool))};
    int r = group_save(c, g);
    for (size_t i = 0; i < n && r == 0; i++) {
        struct snap *sn = snap_new(names[i]);
        sn->phase = PHASE_CREATING;
        sn->source = xstrdup(vols[i]->id);
        sn->group = xstrdup(g->id);
        sn->created_sec = g->sec;
        sn->created_nsec = g->nsec;
        sn->busy = true;
        store_add_snap(c->store, sn);
        x->snaps[i] = sn;
        x->vols[i] = vols[i];
        x->live[i] = vol_live(vols[i]);
        vols[i]->busy = true;
        r = store_save_snap(c->store, sn);
    }
    if (r < 0) {
        grpc_call_fail(call, capacity_errno_code(r, GRPC_INTERNAL),
                       "cannot write the group snapshot records: %s", strerror(-r));
        group_undo(x);
        group_ctx_free(x);
        return;
    }
    /* A failed op_worker ends the op (and frees x): what its undo needs
     * is kept aside until then. */
    struct group_ctx *keep = xcalloc(1, sizeof(*keep));
    *keep = *x;
    keep->vols = xmalloc(n * sizeof(struct vol *));
    keep->snaps = xmalloc(n * sizeof(struct snap *));
    keep->live = xcalloc(n, sizeof(bool));
    memcpy(keep->vols, x->vols, n * sizeof(struct vol *));
    memcpy(keep->snaps, x->snaps, n * sizeof(struct snap *));
    struct op *op = op_begin(c, call);
    op_set_ctx(op, &group_ctx_type, x);
    if (op_worker(op, group_fn, GROUP_TIMEOUT_MS, group_done) < 0)
        group_undo(keep); /* the call is failed and the op ended */
    group_ctx_free(keep);
}

void local_create_group(struct csi *c, struct grpc_call *call,
                        Csi__V1__CreateVolumeGroupSnapshotRequest *in)
{
    const char *why;
    if (name_validate(in->name, &why) < 0) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT,
                       "name %s (the name becomes the group snapshot id: 1-128 bytes of "
                       "[A-Za-z0-9._-])", why);
        return;
    }
    size_t n = in->n_source_volume_ids;
    char **ids = in->source_volume_ids;
    for (size_t i = 0; i < n; i++) {
        _cleanup_free_ char *f = xasprintf("source_volume_ids[%zu]", i);
        if (!csi_id_ok(c, call, f, ids[i]))
            return;
        for (size_t k = 0; k < i; k++)
            if (streq(ids[i], ids[k])) {
                grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "%s repeats volume %s", f, ids[i]);
                return;
            }
    }
    struct group *g = group_find(c, in->name);
    if (g) {
        if (!same_sources(g, ids, n))
            grpc_call_fail(call, GRPC_ALREADY_EXISTS,
                           "group snapshot %s exists with other source volumes", g->id);
        else if (g->busy || g->phase != PHASE_READY)
            grpc_call_fail(call, GRPC_ABORTED, "an operation on group snapshot %s is in progress",
                           g->id);
        else
            reply_group(c, call, g, true);
        return;
    }
    struct vol **vols = xcalloc(n + 1, sizeof(*vols));
    if (sources_ok(c, call, ids, n, vols))
        group_act(c, call, in->name, ids, vols, n);
    free(vols);
}

/* The snapshot_ids of a Delete or Get: empty, or exactly the members
 * (cut to record names in place); else the call is failed. */
static bool members_match(struct csi *c, struct grpc_call *call, const struct group *g,
                          char **ids, size_t n)
{
    if (n == 0)
        return true;
    for (size_t i = 0; i < n; i++)
        if (!csi_id_ok(c, call, "snapshot_ids", ids[i]))
            return false;
    bool ok = n == g->n;
    for (size_t i = 0; ok && i < n; i++) {
        bool found = false;
        for (size_t k = 0; k < g->n && !found; k++)
            found = streq(g->snaps[k], ids[i]);
        ok = found;
    }
    if (!ok)
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT,
                       "snapshot_ids do not match the %zu members of group snapshot %s", g->n, g->id);
    return ok;
}

void local_delete_group(struct csi *c, struct grpc_call *call,
                        Csi__V1__DeleteVolumeGroupSnapshotRequest *in)
{
    Csi__V1__DeleteVolumeGroupSnapshotResponse out = CSI__V1__DELETE_VOLUME_GROUP_SNAPSHOT_RESPONSE__INIT;
    if (!csi_id_ok(c, call, "group_snapshot_id", in->group_snapshot_id))
        return;
    struct group *g = group_find(c, in->group_snapshot_id);
    if (!g) {
        grpc_call_reply_pb(call, &out.base);
        return;
    }
    if (!members_match(c, call, g, in->snapshot_ids, in->n_snapshot_ids))
        return;
    for (size_t i = 0; i < g->n; i++) {
        struct snap *sn = store_find_snap(c->store, g->snaps[i]);
        if (g->busy || (sn && (sn->busy || sn->readers))) {
            grpc_call_fail(call, GRPC_ABORTED, "an operation on group snapshot %s is in progress",
                           g->id);
            return;
        }
    }
    g->phase = PHASE_DELETING;
    int r = group_save(c, g);
    _cleanup_free_ char *msg = NULL;
    if (r == 0 && (r = delete_members(c, g, &msg)) < 0) {
        grpc_call_fail(call, GRPC_INTERNAL, "group snapshot %s: %s", g->id, msg ? msg : strerror(-r));
        return; /* a retry deletes the rest; start-up too */
    }
    if (r < 0) {
        g->phase = PHASE_READY;
        grpc_call_fail(call, capacity_errno_code(r, GRPC_INTERNAL),
                       "cannot write the group snapshot record: %s", strerror(-r));
        return;
    }
    log_info("controller", "group snapshot deleted", "group=%s members=%zu", g->id, g->n);
    group_drop(c, g);
    csi_gc(c);
    grpc_call_reply_pb(call, &out.base);
}

void local_get_group(struct csi *c, struct grpc_call *call, Csi__V1__GetVolumeGroupSnapshotRequest *in)
{
    if (!csi_id_ok(c, call, "group_snapshot_id", in->group_snapshot_id))
        return;
    struct group *g = group_find(c, in->group_snapshot_id);
    if (!g || g->phase == PHASE_DELETING) {
        grpc_call_fail(call, GRPC_NOT_FOUND, "group snapshot %s does not exist", in->group_snapshot_id);
        return;
    }
    if (members_match(c, call, g, in->snapshot_ids, in->n_snapshot_ids))
        reply_group(c, call, g, false);
}
