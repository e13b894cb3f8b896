/* SPDX-License-Identifier: Apache-2.0 */
/* local.c: the local backend (backend.h): volumes that are qcow2 or raw
 * images in the node's pool, snapshots that are thin layers of them or
 * copies (image.h, thin.h), all recorded in the node's record store.
 *
 * Owns the Controller RPCs of such volumes: CreateVolume (empty, from a
 * snapshot, a clone, or an image class), DeleteVolume, CreateSnapshot,
 * DeleteSnapshot, ListSnapshots and GetSnapshot of the node's snapshots,
 * ControllerExpandVolume, GetCapacity for local parameters; and the node
 * side of a local record (its export options; its QSD supervised by
 * qsd.c).  Every handler validates first (INVALID_ARGUMENT), then looks
 * records up (NOT_FOUND), then takes the records' busy flags (a second
 * operation on a busy id is ABORTED), then checks the capacity policy
 * (capacity.h: RESOURCE_EXHAUSTED), then acts.  Long work (image creation,
 * copies, offline resize, snapshots) runs in a worker process (worker.h)
 * so the loop never blocks; records are written with phase "creating"
 * before and "ready" after, so a crash leaves nothing half-created
 * (service.c).  What CreateVolume, CreateSnapshot, DeleteVolume,
 * DeleteSnapshot and ControllerExpandVolume do is decided first by their
 * pure plans (local_plan.h); the acts here do what needs the node. */
#include "backend.h"
#include "capacity.h"
#include "local.h"
#include "controller.h"
#include "local_plan.h"
#include "qsd/base/log.h"
#include "qsd/base/names.h"
#include "imageclass.h"
#include "params.h"
#include "service.h"
#include "qsd/qemu/qmpcmd.h"
#include "modify.h"
#include "snapmeta.h"
#include "qsd/qemu/thin.h"
#include "qsd/base/util.h"
#include "volqsd.h"
#include "ids.h"
#include "op.h"

#include <inttypes.h>
#include <sys/stat.h>
#include <time.h>

#define COPY_TIMEOUT_MS (60ull * 60 * 1000)  /* creation (preallocation), copies, live snapshots */
#define QUICK_TIMEOUT_MS (2ull * 60 * 1000)   /* offline resize */
#define LIST_TOKEN_SNAP "s1:"

/* ------------------------------------------------------------ helpers */

/* Fill a Volume message for v; everything points into v or into *tmp. */
static void reply_volume(struct csi *c, struct grpc_call *call, const struct vol *v)
{
    struct volmsg m;
    volmsg_fill(c, v, &m);
    Csi__V1__CreateVolumeResponse out = CSI__V1__CREATE_VOLUME_RESPONSE__INIT;
    out.volume = &m.vol;
    grpc_call_reply_pb(call, &out.base);
}

void local_snapmsg_fill(struct csi *c, const struct snap *sn, struct snapmsg *m)
{
    Csi__V1__Snapshot *s = &m->snap;
    m->ts = (Google__Protobuf__Timestamp)GOOGLE__PROTOBUF__TIMESTAMP__INIT;
    m->ts.seconds = sn->created_sec;
    m->ts.nanos = sn->created_nsec;
    *s = (Csi__V1__Snapshot)CSI__V1__SNAPSHOT__INIT;
    s->size_bytes = (int64_t)sn->size;
    s->snapshot_id = (char *)csi_id_out(c, sn->id, m->ids[0]);
    s->source_volume_id = (char *)csi_id_out(c, sn->source, m->ids[1]);
    s->creation_time = &m->ts;
    s->ready_to_use = true;
    if (sn->group)
        s->group_snapshot_id = (char *)csi_id_out(c, sn->group, m->ids[2]);
}

/* ------------------------------------------------ thin layers (worker) */

/* Connect to the QSD of a staged volume (worker side). */
static int connect_vol(struct csi *c, const struct vol *v, struct qmp_sync **ret, char **ret_msg)
{
    int r = qmpc_connect_volume(c->cfg->run_dir, v->id, QMP_DEFAULT_TIMEOUT_MS, ret, ret_msg);
    return r < 0 ? -ECONNREFUSED : 0;
}

/* A point-in-time copy of volume v into the snapshot file name: through its
 * QSD when live (a backup job), with qemu-img when not (worker side). */
static int copy_volume(struct csi *c, const struct vol *v, bool live, const char *name,
                       char **ret_msg)
{
    int r;
    if (live) {
        struct qmp_sync *s;
        if ((r = connect_vol(c, v, &s, ret_msg)) < 0)
            return r;
        r = live_snapshot(s, &c->pool, name, COPY_TIMEOUT_MS, ret_msg);
        qmp_sync_close(s);
        return r;
    }
    _cleanup_free_ char *path = NULL, *fmt = NULL;
    if ((r = pool_find_volume(&c->pool, v->id, &path, &fmt)) < 0) {
        *ret_msg = xasprintf("the image of volume %s is missing", v->id);
        return r;
    }
    return snapshot_create_offline(&c->pool, path, fmt, name, ret_msg);
}

/* Freeze the top of qcow2 volume v into a new layer (linked as snapshot
 * snap when not NULL), switching inside its QSD when live (thin.h); then,
 * past LAYER_MERGE_AT, start a background merge in that QSD.  Worker side. */
static int thin_freeze(struct csi *c, const struct vol *v, bool live, const char *snap,
                       char layer[LAYER_NAME_LEN + 1], bool *ret_merging, char **ret_msg)
{
    struct qsd_opts o;
    int r = vol_export_opts(c, v, &o, ret_msg);
    if (r < 0)
        return r;
    struct qmp_sync *s = NULL;
    if (live && !v->stage_ro && (r = connect_vol(c, v, &s, ret_msg)) < 0) {
        qsd_opts_clear(&o);
        return r;
    }
    r = thin_snapshot(&c->pool, v->id, s, &o, snap, COPY_TIMEOUT_MS, layer, ret_msg);
    *ret_merging = false;
    if (r == 0 && s) {
        struct chain ch;
        _cleanup_free_ char *m = NULL;
        if (pool_chain(&c->pool, o.image, "qcow2", &ch, &m) == 0) {
            if (layers_merge_count((unsigned)ch.n, LAYER_MERGE_AT, LAYER_MERGE_TO) > 0)
                *ret_merging = thin_merge(&c->pool, v->id, s, LAYER_MERGE_TO, false, 0, &m) == 0;
            chain_clear(&ch);
        }
    }
    qmp_sync_close(s);
    qsd_opts_clear(&o);
    return r;
}

/* ------------------------------------------------------- CreateVolume */

static int create_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    const struct create_ctx *x = op_ctx(op, &create_ctx_type);
    struct csi *c = op->csi;
    struct vol *v = op->vol;
    int r;
    bool merging = false;
    _cleanup_free_ char *src_fmt = NULL;
    if (v->src_type && streq(v->src_type, "volume") &&
        pool_find_volume(&c->pool, op->vol2->id, NULL, &src_fmt) == 0 &&
        streq(src_fmt, "qcow2") && streq(v->format, "qcow2") && streq(v->preallocation, "off")) {
        /* Thin clone: the source's top becomes a shared layer (the source
         * goes on in a new overlay, inside its QSD when live) and the new
         * volume is an empty overlay on it.  Constant time. */
        char layer[LAYER_NAME_LEN + 1];
        r = thin_freeze(c, op->vol2, x->live, NULL, layer, &merging, ret_msg);
        if (r == 0)
            r = thin_create(&c->pool, v->id, layer, x->size, ret_msg);
        if (r < 0 && r != -EOPNOTSUPP)
            return r == -ENOENT ? -EIO : r;
    } else {
        r = -EOPNOTSUPP;
    }
    if (r == 0) {
    } else if (v->src_type && streq(v->src_type, "volume")) {
        free(*ret_msg);
        *ret_msg = NULL;
        /* Clone of or into raw, or preallocated: a point-in-time copy of the
         * source (live through its QSD when staged), then an independent
         * volume from it. */
        struct vol *src = op->vol2;
        _cleanup_free_ char *tmp = xasprintf(".clone-%s", v->id);
        _cleanup_free_ char *m = NULL;
        snapshot_delete(&c->pool, tmp, &m);
        r = copy_volume(c, src, x->live, tmp, ret_msg);
        if (r < 0)
            return r == -ENOENT ? -EIO : r;
        r = image_create(&c->pool, v->id, v->format, x->size, v->preallocation, tmp, ret_msg);
        _cleanup_free_ char *m2 = NULL;
        snapshot_delete(&c->pool, tmp, &m2);
    } else {
        /* From a snapshot: thin for qcow2 without preallocation (image.h). */
        r = image_create(&c->pool, v->id, v->format, x->size, v->preallocation,
                         v->src_type ? v->src_id : NULL, ret_msg);
    }
    if (r < 0)
        return r == -EEXIST ? -EIO : r; /* EEXIST was checked before: a race */
    _cleanup_free_ char *path = NULL, *fmt = NULL;
    uint64_t size = 0;
    if ((r = pool_find_volume(&c->pool, v->id, &path, &fmt)) < 0 ||
        (r = image_info(path, fmt, &size, NULL, ret_msg)) < 0)
        return r;
    *ret_result = json_pack("{s:I, s:b}", "size", (json_int_t)size, "merging", merging);
    return 0;
}

/* The gRPC code of a failed creation (worker status). */
static enum grpc_code create_code(const struct op *op, int status)
{
    enum grpc_code code;
    const struct create_ctx *x = op_ctx(op, &create_ctx_type);
    if (x->image && imageclass_code(status, &code))
        return code;
    return status == -ENOENT ? GRPC_NOT_FOUND
           : status == -ECONNREFUSED ? GRPC_UNAVAILABLE
           : status == -ERANGE ? GRPC_OUT_OF_RANGE
                               : capacity_errno_code(status, GRPC_INTERNAL); /* out of space */
}

/* A worker's result: its "size" (a worker that succeeded without one is
 * a failure: *status and *msg say so). */
static json_int_t worker_size(int *status, const char **msg, json_t *result)
{
    json_int_t size = 0;
    if (*status == 0 && json_unpack(result, "{s:I}", "size", &size) < 0)
        *status = -EBADMSG, *msg = "worker returned no size";
    return size;
}

static void create_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    struct csi *c = op->csi;
    struct vol *v = op->vol;
    op->worker = NULL;
    json_int_t size = worker_size(&status, &msg, result);
    if (status == 0) {
        v->phase = PHASE_READY;
        v->size = v->image_size = (uint64_t)size;
        int r = store_save_vol(c->store, v);
        if (r == 0) {
            log_info("controller", "volume created", "volume=%s size=%" PRIu64 " format=%s",
                     v->id, v->size, v->format);
            reply_volume(c, op->call, v);
            op_end(op);
            return;
        }
        status = r;
        msg = "cannot write the volume record";
    }
    _cleanup_free_ char *m = NULL;
    image_delete(&c->pool, v->id, &m);
    op->vol = NULL;
    store_remove_vol(c->store, v);
    csi_gc(c);
    grpc_call_fail(op->call, create_code(op, status), "%s", msg ? msg : strerror(-status));
    op_end(op);
}

/* What only the node can say (a foreign image of that name in the pool,
 * the pool's room), then the record (phase creating) and the worker. */
static void create_act(struct csi *c, struct grpc_call *call, Csi__V1__CreateVolumeRequest *in,
                       struct create_plan *pl)
{
    const char *name = in->name;
    if (pool_find_volume(&c->pool, name, NULL, NULL) == 0) {
        grpc_call_fail(call, GRPC_ALREADY_EXISTS,
                       "an image named %s exists in the pool but is not a volume of this plugin",
                       name);
        return;
    }
    bool prealloc = !streq(pl->p.preallocation, "off") && !streq(pl->p.preallocation, "metadata");
    char *what = xasprintf("volume %s of %" PRIu64 " bytes (preallocation=%s)", name, pl->size,
                           pl->p.preallocation);
    bool admitted = capacity_admit(c, call, what, pl->size, prealloc ? pl->size : 0);
    free(what);
    if (!admitted)
        return;
    struct vol *v = vol_new(name);
    v->phase = PHASE_CREATING;
    free(v->format);
    v->format = xstrdup(pl->p.format);
    free(v->preallocation);
    v->preallocation = xstrdup(pl->p.preallocation);
    json_decref(v->parameters);
    v->parameters = json_incref(pl->params);
    json_decref(v->context);
    v->context = params_json_k(in->n_parameters, in->parameters, true);
    _cleanup_free_ char *mmsg = NULL; /* validated by the controller already */
    modify_params_of(in->n_mutable_parameters, in->mutable_parameters, &v->mutable_params, &mmsg);
    v->size = pl->size;
    v->src_type = pl->src_type ? xstrdup(pl->src_type) : NULL;
    v->src_id = pl->src_id ? xstrdup(pl->src_id) : NULL;
    v->created = (int64_t)time(NULL);
    v->busy = true;
    store_add_vol(c->store, v);
    int r = store_save_vol(c->store, v);
    if (r < 0) {
        store_remove_vol(c->store, v);
        grpc_call_fail(call, capacity_errno_code(r, GRPC_INTERNAL),
                       "cannot write the volume record: %s", strerror(-r));
        return;
    }
    struct op *op = op_begin(c, call);
    struct create_ctx *x = op_set_ctx(op, &create_ctx_type, xcalloc(1, sizeof(*x)));
    op->vol = v;
    x->size = pl->size;
    if (pl->src) {
        pl->src->busy = true;
        op->vol2 = pl->src;
        x->live = vol_live(pl->src);
    }
    if (pl->ssrc) {
        pl->ssrc->readers++;
        op->snap_read = pl->ssrc;
    }
    if (pl->p.image)
        imageclass_create(op, pl->p.image_digest, create_done);
    else if (op_worker(op, create_fn, COPY_TIMEOUT_MS, create_done) < 0) {
        /* op_worker failed the call and released the busy flags. */
        store_remove_vol(c->store, v);
    }
}

static void create_volume(struct csi *c, struct grpc_call *call, Csi__V1__CreateVolumeRequest *in)
{
    struct create_plan pl;
    create_plan_make(c, in, &pl);
    switch (pl.kind) {
    case PLAN_REFUSE:
        verdict_send(&pl.refusal, call);
        break;
    case PLAN_DONE:
        reply_volume(c, call, pl.existing);
        break;
    case PLAN_ACT:
        create_act(c, call, in, &pl);
        break;
    }
    create_plan_clear(&pl);
}

/* ------------------------------------------------------- DeleteVolume */

static void delete_finish(struct csi *c, struct vol *v)
{
    _cleanup_free_ char *msg = NULL;
    csi_remove_runtime(c, v->id);
    qsd_free(v->qsd);
    v->qsd = NULL;
    int r = image_delete(&c->pool, v->id, &msg);
    if (r < 0 && r != -ENOENT)
        log_warn("controller", "image not deleted", "volume=%s error=\"%s\"", v->id, msg);
    log_info("controller", "volume deleted", "volume=%s", v->id);
    store_remove_vol(c->store, v);
    csi_gc(c); /* its layers, unless snapshots or other volumes use them */
}

static void delete_volume(struct csi *c, struct grpc_call *call, Csi__V1__DeleteVolumeRequest *in)
{
    Csi__V1__DeleteVolumeResponse out = CSI__V1__DELETE_VOLUME_RESPONSE__INIT;
    struct delete_plan pl;
    delete_volume_plan(c, in, &pl);
    if (pl.kind == PLAN_REFUSE) {
        verdict_send(&pl.refusal, call);
        return;
    }
    struct vol *v = pl.vol;
    delete_plan_clear(&pl);
    if (v) {
        v->phase = PHASE_DELETING;
        int r = store_save_vol(c->store, v);
        if (r < 0) {
            v->phase = PHASE_READY;
            grpc_call_fail(call, capacity_errno_code(r, GRPC_INTERNAL),
                           "cannot write the volume record: %s", strerror(-r));
            return;
        }
        delete_finish(c, v);
    }
    grpc_call_reply_pb(call, &out.base);
}

/* A ListSnapshots filter: NULL for none, the record name for an id of
 * this node (suffix cut in place), NOTHING for another node's id. */
static const char NOTHING[] = "";
static const char *list_filter(struct csi *c, char *id)
{
    if (!id || !*id)
        return NULL;
    if (csi_id_node(c, id))
        return NOTHING;
    char *at = strchr(id, '@');
    if (at)
        *at = '\0';
    return id;
}

/* --------------------------------------------------------- GetCapacity */

static void get_capacity(struct csi *c, struct grpc_call *call, Csi__V1__GetCapacityRequest *in)
{
    /* Same entry layout as CreateVolume's parameters (key, value). */
    json_t *params = params_json(in->n_parameters,
                                 (Csi__V1__CreateVolumeRequest__ParametersEntry **)in->parameters);
    struct vol_params p;
    _cleanup_free_ char *msg = NULL;
    int r = vol_params_from_json(params, &p, &msg);
    json_decref(params);
    if (r < 0) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "%s", msg);
        return;
    }
    unsigned align = p.opts.logical_block_size;
    bool prealloc = !streq(p.preallocation, "off") && !streq(p.preallocation, "metadata");
    vol_params_clear(&p);
    uint64_t avail = 0, max = 0;
    bool usable = true;
    for (size_t i = 0; i < in->n_volume_capabilities; i++)
        if (cap_problem(in->volume_capabilities[i]))
            usable = false;
    if (in->accessible_topology) {
        bool match = false;
        for (size_t k = 0; k < in->accessible_topology->n_segments; k++)
            if (streq(in->accessible_topology->segments[k]->key, c->topo_key) &&
                streq(in->accessible_topology->segments[k]->value, c->cfg->node_id))
                match = true;
        usable = usable && match;
    }
    if (usable) {
        /* The policy's view (capacity.h): free space less the reserve, or
         * what the overcommit limit leaves; CreateVolume admits exactly
         * the sizes up to maximum_volume_size. */
        struct pool_figures f;
        if ((r = capacity_figures(c, &f, &msg)) < 0) {
            grpc_call_fail(call, GRPC_INTERNAL, "%s", msg);
            return;
        }
        capacity_available(&f, prealloc, align, IMAGE_MAX_SIZE, &avail, &max);
    }
    Google__Protobuf__Int64Value maxv = GOOGLE__PROTOBUF__INT64_VALUE__INIT,
                                 minv = GOOGLE__PROTOBUF__INT64_VALUE__INIT;
    maxv.value = (int64_t)max;
    minv.value = (int64_t)align;
    Csi__V1__GetCapacityResponse out = CSI__V1__GET_CAPACITY_RESPONSE__INIT;
    out.available_capacity = (int64_t)MIN(avail, (uint64_t)INT64_MAX);
    out.maximum_volume_size = &maxv;
    out.minimum_volume_size = &minv;
    grpc_call_reply_pb(call, &out.base);
}

/* ------------------------------------------------------ CreateSnapshot */

/* A CreateSnapshot's context (op.h). */
struct snapshot_ctx {
    bool live; /* the volume is read through its QSD */
};

static const struct op_ctx_type snapshot_ctx_type = {"CreateSnapshot", free};

static int snapshot_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    const struct snapshot_ctx *x = op_ctx(op, &snapshot_ctx_type);
    struct csi *c = op->csi;
    struct vol *src = op->vol;
    struct snap *sn = op->snap;
    int r;
    _cleanup_free_ char *m = NULL;
    snapshot_delete(&c->pool, sn->id, &m); /* a leftover of an earlier failed attempt */
    _cleanup_free_ char *path = NULL, *fmt = NULL;
    if ((r = pool_find_volume(&c->pool, src->id, &path, &fmt)) < 0) {
        *ret_msg = xasprintf("the image of volume %s is missing", src->id);
        return -EIO;
    }
    bool merging = false, copy = !streq(fmt, "qcow2");
    if (!copy) {
        /* Thin: the volume's top is frozen and becomes the snapshot. */
        char layer[LAYER_NAME_LEN + 1];
        r = thin_freeze(c, src, x->live, sn->id, layer, &merging, ret_msg);
        if (r == -EOPNOTSUPP) {
            /* a QSD started with an iothread by an older plugin */
            free(*ret_msg);
            *ret_msg = NULL;
            copy = true;
        }
    }
    if (copy) /* raw: a full copy (docs/thin-layers.md) */
        r = copy_volume(c, src, x->live, sn->id, ret_msg);
    if (r < 0)
        return r == -EEXIST || r == -ENOENT ? -EIO : r;
    _cleanup_free_ char *spath = pool_snapshot_path(&c->pool, sn->id);
    struct chain ch;
    if ((r = pool_chain(&c->pool, spath, "qcow2", &ch, ret_msg)) < 0)
        return r;
    json_t *layers = NULL;
    if (ch.n > 0 && *ch.l[0].layer == '\0' && ch.l[0].nlink == 1 && ch.n == 1) {
        /* a standalone copy: no layers */
    } else {
        /* the snapshot's own layer is the name sharing its inode (thin.c) */
        char own[LAYER_NAME_LEN + 1];
        _cleanup_free_ char *m2 = NULL;
        if (thin_snapshot_layer(&c->pool, sn->id, own, &m2) == 0) {
            layers = json_array();
            json_array_append_new(layers, json_string(own));
            for (size_t i = 1; i < ch.n; i++)
                json_array_append_new(layers, json_string(ch.l[i].layer));
        }
    }
    *ret_result = json_pack("{s:I, s:b, s:o*}", "size", (json_int_t)ch.l[0].size, "merging",
                            merging, "layers", layers);
    chain_clear(&ch);
    return 0;
}

static void reply_snapshot(struct csi *c, struct grpc_call *call, const struct snap *sn)
{
    struct snapmsg m;
    local_snapmsg_fill(c, sn, &m);
    Csi__V1__CreateSnapshotResponse out = CSI__V1__CREATE_SNAPSHOT_RESPONSE__INIT;
    out.snapshot = &m.snap;
    grpc_call_reply_pb(call, &out.base);
}

static void snapshot_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    const struct snapshot_ctx *x = op_ctx(op, &snapshot_ctx_type);
    struct csi *c = op->csi;
    struct snap *sn = op->snap;
    op->worker = NULL;
    json_int_t size = worker_size(&status, &msg, result);
    if (status == 0) {
        sn->phase = PHASE_READY;
        sn->size = (uint64_t)size;
        json_decref(sn->layers);
        sn->layers = json_incref(json_object_get(result, "layers"));
        int r = store_save_snap(c->store, sn);
        if (r == 0) {
            log_info("controller", "snapshot created",
                     "snapshot=%s volume=%s live=%s thin=%s depth=%zu merging=%s", sn->id,
                     sn->source, x->live ? "yes" : "no", sn->layers ? "yes" : "no",
                     json_array_size(sn->layers),
                     json_is_true(json_object_get(result, "merging")) ? "yes" : "no");
            reply_snapshot(c, op->call, sn);
            op_end(op);
            return;
        }
        status = r;
        msg = "cannot write the snapshot record";
    }
    _cleanup_free_ char *m = NULL;
    snapshot_delete(&c->pool, sn->id, &m);
    op->snap = NULL;
    store_remove_snap(c->store, sn);
    grpc_call_fail(op->call,
                   status == -ECONNREFUSED ? GRPC_UNAVAILABLE
                                           : capacity_errno_code(status, GRPC_INTERNAL),
                   "%s", msg ? msg : strerror(-status));
    op_end(op);
}

/* What only the node can say (the pool's room, a foreign image of that
 * name), then the record (phase creating) and the worker. */
static void snapshot_act(struct csi *c, struct grpc_call *call, Csi__V1__CreateSnapshotRequest *in,
                         struct vol *v)
{
    /* A snapshot of a qcow2 volume is thin (its data stays where it is);
     * of a raw one, a copy of what the volume has allocated. */
    uint64_t need = 0;
    _cleanup_free_ char *vpath = NULL;
    struct stat vst;
    if (streq(v->format, "raw") && pool_find_volume(&c->pool, v->id, &vpath, NULL) == 0 &&
        stat(vpath, &vst) == 0)
        need = (uint64_t)vst.st_blocks * 512;
    _cleanup_free_ char *what = xasprintf("snapshot %s of volume %s", in->name, v->id);
    if (!capacity_admit(c, call, what, 0, need))
        return;
    _cleanup_free_ char *spath = pool_snapshot_path(&c->pool, in->name);
    if (access(spath, F_OK) == 0) {
        grpc_call_fail(call, GRPC_ALREADY_EXISTS,
                       "a snapshot image named %s exists in the pool but is not a snapshot of "
                       "this plugin", in->name);
        return;
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct snap *sn = snap_new(in->name);
    sn->phase = PHASE_CREATING;
    sn->source = xstrdup(v->id);
    sn->created_sec = now.tv_sec;
    sn->created_nsec = (int32_t)now.tv_nsec;
    sn->busy = true;
    store_add_snap(c->store, sn);
    int r = store_save_snap(c->store, sn);
    if (r < 0) {
        store_remove_snap(c->store, sn);
        grpc_call_fail(call, capacity_errno_code(r, GRPC_INTERNAL),
                       "cannot write the snapshot record: %s", strerror(-r));
        return;
    }
    struct op *op = op_begin(c, call);
    op->snap = sn;
    struct snapshot_ctx *x = op_set_ctx(op, &snapshot_ctx_type, xcalloc(1, sizeof(*x)));
    op->vol = v;
    v->busy = true;
    x->live = vol_live(v);
    if (op_worker(op, snapshot_fn, COPY_TIMEOUT_MS, snapshot_done) < 0)
        store_remove_snap(c->store, sn);
}

static void create_snapshot(struct csi *c, struct grpc_call *call,
                            Csi__V1__CreateSnapshotRequest *in)
{
    struct snapshot_plan pl;
    snapshot_plan_make(c, in, &pl);
    switch (pl.kind) {
    case PLAN_REFUSE:
        verdict_send(&pl.refusal, call);
        break;
    case PLAN_DONE:
        reply_snapshot(c, call, pl.existing);
        break;
    case PLAN_ACT:
        snapshot_act(c, call, in, pl.src);
        break;
    }
    snapshot_plan_clear(&pl);
}

static void delete_snapshot(struct csi *c, struct grpc_call *call,
                            Csi__V1__DeleteSnapshotRequest *in)
{
    Csi__V1__DeleteSnapshotResponse out = CSI__V1__DELETE_SNAPSHOT_RESPONSE__INIT;
    struct delete_plan pl;
    delete_snapshot_plan(c, in, &pl);
    if (pl.kind == PLAN_REFUSE) {
        verdict_send(&pl.refusal, call);
        return;
    }
    struct snap *sn = pl.snap;
    delete_plan_clear(&pl);
    if (!sn) {
        grpc_call_reply_pb(call, &out.base);
        return;
    }
    if (sn->group) {
        grpc_call_fail(call, GRPC_FAILED_PRECONDITION,
                       "snapshot %s is a member of group snapshot %s: "
                       "DeleteVolumeGroupSnapshot deletes it", sn->id, sn->group);
        return;
    }
    sn->phase = PHASE_DELETING;
    int r = store_save_snap(c->store, sn);
    if (r < 0) {
        sn->phase = PHASE_READY;
        grpc_call_fail(call, capacity_errno_code(r, GRPC_INTERNAL),
                       "cannot write the snapshot record: %s", strerror(-r));
        return;
    }
    _cleanup_free_ char *msg = NULL;
    r = snapshot_delete(&c->pool, sn->id, &msg);
    if (r < 0 && r != -ENOENT) {
        sn->phase = PHASE_READY;
        store_save_snap(c->store, sn);
        grpc_call_fail(call, GRPC_INTERNAL, "%s", msg);
        return;
    }
    log_info("controller", "snapshot deleted", "snapshot=%s", sn->id);
    store_remove_snap(c->store, sn);
    csi_gc(c); /* its layer stays while a volume's chain uses it */
    grpc_call_reply_pb(call, &out.base);
}

static void list_snapshots(struct csi *c, struct grpc_call *call, Csi__V1__ListSnapshotsRequest *in)
{
    const char *after;
    if (!list_start_ok(call, in->max_entries, in->starting_token, LIST_TOKEN_SNAP, &after))
        return;
    const char *only = list_filter(c, in->snapshot_id), *from = list_filter(c, in->source_volume_id);
    store_sort(c->store);
    size_t cap = only == NOTHING || from == NOTHING ? 0 : c->store->n_snaps, n = 0;
    struct snapmsg *snaps = xcalloc(cap + 1, sizeof(*snaps));
    Csi__V1__ListSnapshotsResponse__Entry *ents = xcalloc(cap + 1, sizeof(*ents));
    Csi__V1__ListSnapshotsResponse__Entry **list = xcalloc(cap + 1, sizeof(*list));
    _cleanup_free_ char *next = NULL;
    const char *last = NULL;
    for (size_t i = 0; i < cap; i++) {
        struct snap *sn = c->store->snaps[i];
        if (sn->phase != PHASE_READY || (after && strcmp(sn->id, after) <= 0) ||
            (only && !streq(sn->id, only)) || (from && !streq(sn->source, from)))
            continue;
        if (in->max_entries > 0 && n == (size_t)in->max_entries) {
            next = xasprintf("%s%s", LIST_TOKEN_SNAP, last);
            break;
        }
        local_snapmsg_fill(c, sn, &snaps[n]);
        last = sn->id;
        ents[n] = (Csi__V1__ListSnapshotsResponse__Entry)CSI__V1__LIST_SNAPSHOTS_RESPONSE__ENTRY__INIT;
        ents[n].snapshot = &snaps[n].snap;
        list[n] = &ents[n];
        n++;
    }
    Csi__V1__ListSnapshotsResponse out = CSI__V1__LIST_SNAPSHOTS_RESPONSE__INIT;
    out.n_entries = n;
    out.entries = list;
    out.next_token = next ? next : (char *)"";
    grpc_call_reply_pb(call, &out.base);
    free(list);
    free(ents);
    free(snaps);
}

/* GetSnapshot: the snapshot as ListSnapshots lists it (ready ones only). */
static void get_snapshot(struct csi *c, struct grpc_call *call, Csi__V1__GetSnapshotRequest *in)
{
    if (!csi_id_ok(c, call, "snapshot_id", in->snapshot_id))
        return;
    const struct snap *sn = store_find_snap(c->store, in->snapshot_id);
    if (!sn || sn->phase != PHASE_READY) {
        grpc_call_fail(call, GRPC_NOT_FOUND, "snapshot %s does not exist", in->snapshot_id);
        return;
    }
    struct snapmsg m;
    local_snapmsg_fill(c, sn, &m);
    Csi__V1__GetSnapshotResponse out = CSI__V1__GET_SNAPSHOT_RESPONSE__INIT;
    out.snapshot = &m.snap;
    grpc_call_reply_pb(call, &out.base);
}

/* ---------------------------------------------- ControllerExpandVolume */

/* A ControllerExpandVolume's context (op.h). */
struct expand_ctx {
    uint64_t size; /* to grow to */
};

static const struct op_ctx_type expand_ctx_type = {"ControllerExpandVolume", free};

static int expand_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    _cleanup_free_ char *path = NULL, *fmt = NULL;
    int r = pool_find_volume(&op->csi->pool, op->vol->id, &path, &fmt);
    if (r < 0) {
        *ret_msg = xasprintf("the image of volume %s is missing", op->vol->id);
        return -EIO;
    }
    const struct expand_ctx *x = op_ctx(op, &expand_ctx_type);
    return image_resize_offline(path, fmt, x->size, ret_msg);
}

static void reply_expand(struct grpc_call *call, uint64_t size, bool node)
{
    Csi__V1__ControllerExpandVolumeResponse out = CSI__V1__CONTROLLER_EXPAND_VOLUME_RESPONSE__INIT;
    out.capacity_bytes = (int64_t)size;
    out.node_expansion_required = node;
    grpc_call_reply_pb(call, &out.base);
}

static void expand_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    struct vol *v = op->vol;
    op->worker = NULL;
    if (status == 0) {
        const struct expand_ctx *x = op_ctx(op, &expand_ctx_type);
        v->size = v->image_size = x->size;
        int r = store_save_vol(op->csi->store, v);
        if (r < 0) {
            grpc_call_fail(op->call, capacity_errno_code(r, GRPC_INTERNAL),
                           "cannot write the volume record: %s", strerror(-r));
        } else {
            log_info("controller", "volume expanded offline", "volume=%s size=%" PRIu64, v->id,
                     v->size);
            reply_expand(op->call, v->size, false);
        }
    } else {
        grpc_call_fail(op->call, capacity_errno_code(status, GRPC_INTERNAL), "%s",
                       msg ? msg : strerror(-status));
    }
    op_end(op);
}

/* What only the node can say (the pool's room), then the record (staged:
 * the node grows it) or the offline resize in a worker. */
static void expand_act(struct csi *c, struct grpc_call *call, struct vol *v, uint64_t size)
{
    _cleanup_free_ char *what = xasprintf("expansion of volume %s from %" PRIu64 " to %" PRIu64
                                          " bytes", v->id, v->size, size);
    if (!capacity_admit(c, call, what, size - v->size, 0))
        return;
    if (v->staging_path) {
        /* In use: the node grows it through the live QSD (NodeExpandVolume), or
         * NodeStageVolume does it offline before the next start. */
        uint64_t old = v->size;
        v->size = size;
        int r = store_save_vol(c->store, v);
        if (r < 0) {
            v->size = old;
            grpc_call_fail(call, capacity_errno_code(r, GRPC_INTERNAL),
                           "cannot write the volume record: %s", strerror(-r));
            return;
        }
        log_info("controller", "volume expansion recorded, node expansion required",
                 "volume=%s size=%" PRIu64, v->id, size);
        reply_expand(call, size, true);
        return;
    }
    struct op *op = op_begin(c, call);
    struct expand_ctx *x = op_set_ctx(op, &expand_ctx_type, xcalloc(1, sizeof(*x)));
    op->vol = v;
    v->busy = true;
    x->size = size;
    op_worker(op, expand_fn, QUICK_TIMEOUT_MS, expand_done);
}

static void expand_volume(struct csi *c, struct grpc_call *call,
                          Csi__V1__ControllerExpandVolumeRequest *in)
{
    struct expand_plan pl;
    expand_plan_make(c, in, &pl);
    switch (pl.kind) {
    case PLAN_REFUSE:
        verdict_send(&pl.refusal, call);
        break;
    case PLAN_DONE:
        reply_expand(call, pl.size, pl.node);
        break;
    case PLAN_ACT:
        expand_act(c, call, pl.vol, pl.size);
        break;
    }
    expand_plan_clear(&pl);
}

/* ------------------------------------------------------ the node side */

/* NAME or NAME@NODE (csi_id_out): NAME when NODE is this node. */
static bool record_name(struct csi *c, struct verdict *v, const char *field, char *id)
{
    char *at = id ? strchr(id, '@') : NULL;
    if (at) {
        const char *why;
        if (name_validate(at + 1, &why) < 0)
            return verdict_fail(v, GRPC_INVALID_ARGUMENT, "%s: the node after '@' %s", field,
                                why);
        if (!streq(at + 1, c->cfg->node_id))
            return verdict_fail(v, GRPC_NOT_FOUND,
                                "%s %s lives on node %s, not on this node (%s): volumes and "
                                "snapshots are node-local", field, id, at + 1, c->cfg->node_id);
        *at = '\0';
    }
    return id_check(v, field, id);
}

/* NAME@NODE, as CreateVolume answered (csi_id_out). */
static char *volume_handle(const struct csi *c, const struct vol *v)
{
    char buf[CSI_ID_MAX + 1];
    return xstrdup(csi_id_out(c, v->id, buf));
}

static int export_opts(struct csi *c, const struct vol *v, struct qsd_opts *ret, char **ret_msg)
{
    char *image = NULL, *format = NULL;
    int r = pool_find_volume(&c->pool, v->id, &image, &format);
    if (r < 0) {
        *ret_msg = xasprintf("the image of volume %s is missing from the pool", v->id);
        return r;
    }
    return export_opts_from(v->parameters, image, format, v->stage_ro, v->stage_gid, ret, ret_msg);
}

static bool stage_confirm(struct op *op, struct rbd_req **rbd)
{
    (void)op, (void)rbd;
    return false;
}

static void adopted(struct csi *c, struct vol *v)
{
    (void)c;
    (void)v;
}

/* Its QSD is supervised (qsd.c): never refused, never left stopped. */
static const char *refused(const struct vol *v)
{
    (void)v;
    return NULL;
}

static void forget(struct vol *v)
{
    (void)v;
}

const struct backend backend_local = {
    .name = "local",
    .claims = NULL, /* the rest */
    .in_pool = true,
    .central = false,
    .supervised = true,
    .record_staged_only = false,
    .create_volume = create_volume,
    .delete_volume = delete_volume,
    .expand_volume = expand_volume,
    .get_capacity = get_capacity,
    .create_snapshot = create_snapshot,
    .delete_snapshot = delete_snapshot,
    .list_snapshots = list_snapshots,
    .get_snapshot = get_snapshot,
    .modify_volume = modify_volume_local,
    .snapshot_metadata = snapmeta_local, /* snapmeta.c */
    .create_group_snapshot = local_create_group,
    .delete_group_snapshot = local_delete_group,
    .get_group_snapshot = local_get_group,
    .record_name = record_name,
    .volume_handle = volume_handle,
    .stage_prepare = NULL, /* CreateVolume made the record */
    .stage_confirm = stage_confirm,
    .export_opts = export_opts,
    .restart = NULL,       /* supervised */
    .adopted = adopted,
    .refused = refused,
    .forget = forget,
};
