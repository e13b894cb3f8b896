/* SPDX-License-Identifier: Apache-2.0 */
/* node.c: the CSI Node service.
 *
 * NodeStageVolume starts the volume's qemu-storage-daemon (one per volume,
 * supervised on the plugin's loop: restarted on the same socket path if it
 * dies; an RBD volume's only after the check of rbd_lock.h); NodePublishVolume bind-mounts the volume's export directory (the
 * socket's directory, never the socket file: a restarted QSD re-creates the
 * socket) onto the target path.  Staging and publications are recorded in
 * the volume's record before acting, so a restarted plugin knows them.
 * A volume staged for ordinary pods (a filesystem or a block device,
 * docs/pod-volumes.md) also gets a FUSE export of its QSD, a loop device and
 * a filesystem (podvol.h, in workers), and its publications bind those.
 * What each volume RPC does is decided first by its pure plan
 * (node_plan.h); the acts here touch the mounts, paths, processes and
 * records.  A volume's condition (NodeGetVolumeStats) and the node's health
 * RPCs are health.h's. */
#include "backend.h"
#include "capacity.h"
#include "bridge.h"
#include "clients.h"
#include "health.h"
#include "qsd/base/log.h"
#include "mounts.h"
#include "qsd/qemu/qmpcmd.h"
#include "params.h"
#include "rbd.h"
#include "service.h"
#include "qsd/qemu/thin.h"
#include "qsd/base/fsat.h"
#include "qsd/base/util.h"
#include "volstats.h"
#include "volqsd.h"
#include "node_plan.h"
#include "op.h"
#include "podvol.h"

#include <fcntl.h>
#include <inttypes.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#define QMP_OP_TIMEOUT_MS 10000
/* A pod volume's loop device, mkfs and mount (podvol.h). */
#define ATTACH_TIMEOUT_MS (6 * 60 * 1000)

struct node {
    struct csi *csi;
    struct grpc_method methods[10];
};

/* Every empty response message (NodeStageVolumeResponse...) encodes to
 * zero bytes. */
static void reply_empty(struct grpc_call *call)
{
    grpc_call_reply(call, "", 0);
}

/* The steps a plan leaves to the act before its outcome (node_plan.h),
 * then a refusal sent: true when the plan's outcome is to be carried out,
 * false when the call was answered.  bridge: the bridges' answer to an
 * ephemeral volume's id (bridge_first). */
static bool plan_holds(struct csi *c, struct grpc_call *call, struct node_plan *pl,
                       bool (*bridge)(struct csi *, struct grpc_call *, const char *, const char *),
                       const char *id, const char *path)
{
    if (pl->resolve_path) {
        _cleanup_free_ char *msg = NULL;
        if (mounts_check(c, pl->resolve_path, &msg) < 0) {
            grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "%s: %s", pl->resolve_field, msg);
            return false;
        }
    }
    if (pl->bridge_first && bridge && bridge(c, call, id, path))
        return false;
    if (pl->kind == PLAN_REFUSE) {
        verdict_send(&pl->refusal, call);
        return false;
    }
    return true;
}

/* What the loop knows of v's QSD, for the plans' second steps. */
static struct qsd_state qsd_state_of(const struct vol *v)
{
    return (struct qsd_state){v->qsd != NULL, vol_live(v), v->qsd && qsd_idle(v->qsd)};
}

static struct vol *find_or_fail(struct csi *c, struct grpc_call *call, const char *id)
{
    struct vol *v = store_find_vol(c->store, id);
    if (!v || v->phase != PHASE_READY) {
        grpc_call_fail(call, GRPC_NOT_FOUND, "volume %s does not exist", id);
        return NULL;
    }
    return v;
}

/* --------------------------------------------------------- info, caps */

static void get_info(struct csi *c, struct grpc_call *call, Csi__V1__NodeGetInfoRequest *in)
{
    Csi__V1__Topology__SegmentsEntry seg = CSI__V1__TOPOLOGY__SEGMENTS_ENTRY__INIT;
    Csi__V1__Topology__SegmentsEntry *segs[1] = {&seg};
    Csi__V1__Topology topo = CSI__V1__TOPOLOGY__INIT;
    seg.key = c->topo_key;
    seg.value = (char *)c->cfg->node_id;
    topo.n_segments = 1;
    topo.segments = segs;
    Csi__V1__NodeGetInfoResponse out = CSI__V1__NODE_GET_INFO_RESPONSE__INIT;
    out.node_id = (char *)c->cfg->node_id;
    out.max_volumes_per_node = c->cfg->max_volumes;
    out.accessible_topology = &topo;
    grpc_call_reply_pb(call, &out.base);
}

static void get_caps(struct csi *c, struct grpc_call *call, Csi__V1__NodeGetCapabilitiesRequest *in)
{
    static const Csi__V1__NodeServiceCapability__RPC__Type types[] = {
        CSI__V1__NODE_SERVICE_CAPABILITY__RPC__TYPE__STAGE_UNSTAGE_VOLUME,
        CSI__V1__NODE_SERVICE_CAPABILITY__RPC__TYPE__GET_VOLUME_STATS,
        CSI__V1__NODE_SERVICE_CAPABILITY__RPC__TYPE__EXPAND_VOLUME,
        CSI__V1__NODE_SERVICE_CAPABILITY__RPC__TYPE__VOLUME_CONDITION,
        CSI__V1__NODE_SERVICE_CAPABILITY__RPC__TYPE__VOLUME_MOUNT_GROUP,
        /* With it, Kubernetes maps ReadWriteOncePod to SINGLE_NODE_SINGLE_WRITER
         * (one pod: what a vhost-user socket allows) and ReadWriteOnce to
         * SINGLE_NODE_MULTI_WRITER, still one read-write publication here. */
        CSI__V1__NODE_SERVICE_CAPABILITY__RPC__TYPE__SINGLE_NODE_MULTI_WRITER,
        /* CSI 1.13's health RPCs (health.h); VOLUME_CONDITION above is the
         * volume_condition of NodeGetVolumeStats, for older COs. */
        CSI__V1__NODE_SERVICE_CAPABILITY__RPC__TYPE__GET_VOLUME_HEALTH,
        CSI__V1__NODE_SERVICE_CAPABILITY__RPC__TYPE__GET_STORAGE_HEALTH,
    };
    Csi__V1__NodeServiceCapability__RPC rpc[ARRAY_SIZE(types)];
    Csi__V1__NodeServiceCapability caps[ARRAY_SIZE(types)], *list[ARRAY_SIZE(types)];
    for (size_t i = 0; i < ARRAY_SIZE(types); i++) {
        rpc[i] = (Csi__V1__NodeServiceCapability__RPC)CSI__V1__NODE_SERVICE_CAPABILITY__RPC__INIT;
        rpc[i].type = types[i];
        caps[i] = (Csi__V1__NodeServiceCapability)CSI__V1__NODE_SERVICE_CAPABILITY__INIT;
        caps[i].type_case = CSI__V1__NODE_SERVICE_CAPABILITY__TYPE_RPC;
        caps[i].rpc = &rpc[i];
        list[i] = &caps[i];
    }
    Csi__V1__NodeGetCapabilitiesResponse out = CSI__V1__NODE_GET_CAPABILITIES_RESPONSE__INIT;
    out.n_capabilities = ARRAY_SIZE(types);
    out.capabilities = list;
    grpc_call_reply_pb(call, &out.base);
}

/* ------------------------------------------------------------- stage */

/* A NodeStageVolume's context (op.h). */
struct stage_ctx {
    bool repair;         /* restarts the QSD of a staged volume */
    uint64_t size;       /* an expansion recorded while not served: grown to first */
    struct rbd_req *rbd; /* the backend's request, for stage_confirm (backend.h) */
};

static void stage_ctx_free(void *p)
{
    struct stage_ctx *x = p;
    rbd_req_free(x->rbd);
    free(x);
}

static const struct op_ctx_type stage_ctx_type = {"NodeStageVolume", stage_ctx_free};

static struct op *stage_op(struct csi *c, struct grpc_call *call, struct vol *v, bool repair,
                           struct rbd_req *rbd)
{
    struct op *op = op_begin(c, call);
    struct stage_ctx *x = op_set_ctx(op, &stage_ctx_type, xcalloc(1, sizeof(*x)));
    x->repair = repair;
    x->rbd = rbd;
    op->vol = v;
    v->busy = true;
    return op;
}

/* A start that failed: a first stage is undone (kubelet retries it from
 * scratch); a repair leaves the volume staged, not served. */
static void stage_failed(struct op *op, int status, const char *msg)
{
    struct csi *c = op->csi;
    struct vol *v = op->vol;
    const struct stage_ctx *x = op_ctx(op, &stage_ctx_type);
    qsd_free(v->qsd);
    v->qsd = NULL;
    if (!x->repair) {
        if (v->stage_kind != STAGE_KIND_VHOST)
            podvol_fuse_unmount(c, v->id);
        csi_remove_runtime(c, v->id);
        vol_clear_staging(v);
        store_save_vol(c->store, v);
    }
    grpc_call_fail(op->call, capacity_errno_code(status, GRPC_INTERNAL), "%s", msg);
    op_end(op);
}

/* In the worker: a pod volume's loop device and filesystem (podvol.h). */
static int attach_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    struct podvol_loop loop;
    int r = podvol_attach(op->csi, op->vol, &loop, ret_msg);
    if (r == 0 && loop.name[0])
        *ret_result = json_pack("{s:s, s:I}", "loop", loop.name, "diskseq",
                                (json_int_t)loop.diskseq);
    return r;
}

static void attach_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    struct vol *v = op->vol;
    op->worker = NULL;
    if (status < 0) {
        /* Left staged (its QSD serves): kubelet's retry attaches again,
         * NodeUnstageVolume takes it all down. */
        grpc_call_fail(op->call, status == -EUCLEAN  ? GRPC_FAILED_PRECONDITION
                                 : status == -EAGAIN ? GRPC_UNAVAILABLE
                                                     : GRPC_INTERNAL,
                       "%s", msg ? msg : strerror(-status));
    } else {
        const char *loop = json_string_value(json_object_get(result, "loop"));
        json_int_t seq = json_integer_value(json_object_get(result, "diskseq"));
        bool save = !streq_ptr(loop, v->stage_loop) || (uint64_t)seq != v->stage_loop_diskseq;
        if (save) { /* for the publications (podvol_loop_open) */
            free(v->stage_loop);
            v->stage_loop = loop ? xstrdup(loop) : NULL;
            v->stage_loop_diskseq = loop ? (uint64_t)seq : 0;
        }
        if (v->stage_kind == STAGE_KIND_FS && !v->fs_made)
            save = v->fs_made = true; /* never formatted again (podvol.h) */
        if (save)
            store_save_vol(op->csi->store, v);
        log_info("node", "pod volume staged", "volume=%s kind=%s fs=%s pid=%d", v->id,
                 stage_kind_name(v->stage_kind), v->stage_fs ? v->stage_fs : "-",
                 (int)qsd_get_pid(v->qsd));
        reply_empty(op->call);
    }
    op_end(op);
}

static void attach_start(struct op *op)
{
    op_worker(op, attach_fn, ATTACH_TIMEOUT_MS, attach_done);
}

static void stage_started(struct csi *c, struct vol *v, int status, const char *msg, void *opaque)
{
    struct op *op = opaque;
    struct stage_ctx *x = op_ctx(op, &stage_ctx_type);
    if (status == 0 && BACKEND_OF(.record = v)->stage_confirm(op, &x->rbd))
        return; /* it answers, or stops the QSD */
    if (status == 0 && v->stage_kind != STAGE_KIND_VHOST) {
        attach_start(op);
        return;
    }
    if (status == 0) {
        log_info("node", x->repair ? "staged volume repaired: its QSD serves again"
                                    : "volume staged", "volume=%s pid=%d", v->id,
                 (int)qsd_get_pid(v->qsd));
        reply_empty(op->call);
        op_end(op);
        return;
    }
    stage_failed(op, status, msg ? msg : strerror(-status));
}

static void stage_start(struct op *op)
{
    struct csi *c = op->csi;
    struct vol *v = op->vol;
    _cleanup_free_ char *msg = NULL;
    int fuse = -1, r = 0;
    /* A pod volume: its FUSE file mounted here, the descriptor for the QSD
     * (it runs confined and cannot mount: docs/pod-volumes.md). */
    if (v->stage_kind != STAGE_KIND_VHOST)
        r = podvol_fuse_mount(c, v->id, &fuse, &msg);
    if (r == 0)
        r = vol_qsd_start(c, v, fuse, stage_started, op, &msg);
    if (r < 0)
        stage_failed(op, r, msg);
}

/* A staged pod volume whose FUSE export does not serve (its QSD was
 * restarted, or the plugin died between the steps of a stage): everything
 * taken down (podvol_detach), then started again with a FUSE export. */
static int detach_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    return podvol_detach(op->csi, op->vol, ret_msg);
}

static void restage_detached(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    op->worker = NULL;
    if (status < 0) {
        grpc_call_fail(op->call, GRPC_INTERNAL, "%s", msg ? msg : strerror(-status));
        op_end(op);
        return;
    }
    stage_start(op);
}

static void restage_stopped(struct qsd *q, int status, const char *msg, void *opaque)
{
    struct op *op = opaque;
    struct vol *v = op->vol;
    if (status < 0) {
        grpc_call_fail(op->call, GRPC_UNAVAILABLE, "%s", msg ? msg : strerror(-status));
        op_end(op);
        return;
    }
    qsd_free(v->qsd);
    v->qsd = NULL;
    op_worker(op, detach_fn, ATTACH_TIMEOUT_MS, restage_detached);
}

/* The target of a publication of v that is still mounted (a pod holds the
 * filesystem or device of the old data path), or NULL: publications of a
 * record that a reboot left are not. */
static const char *held_by_pod(struct csi *c, const struct vol *v)
{
    for (size_t k = 0; k < v->n_pubs; k++) {
        _cleanup_free_ char *msg = NULL;
        if (mounts_is_mounted(c, v->pubs[k].target, &msg) == 1)
            return v->pubs[k].target;
    }
    return NULL;
}

static void restage(struct op *op)
{
    struct vol *v = op->vol;
    /* Its loop device cannot be taken from under a pod's mount, nor given
     * a new backing file (LOOP_CHANGE_FD is for read-only devices only):
     * nothing is torn down while a pod holds the old data path
     * (docs/pod-volumes.md "When the QSD dies"). */
    const char *held = held_by_pod(op->csi, v);
    if (held) {
        grpc_call_fail(op->call, GRPC_FAILED_PRECONDITION,
                       "the FUSE export of volume %s is gone (its QSD died) and a pod still "
                       "uses the old data path at %s (it gets I/O errors): delete the pods "
                       "using the volume on this node, then it is staged again",
                       v->id, held);
        op_end(op);
        return;
    }
    log_info("node", "pod volume: its FUSE export does not serve, starting it again",
             "volume=%s", v->id);
    if (!v->qsd) {
        op_worker(op, detach_fn, ATTACH_TIMEOUT_MS, restage_detached);
        return;
    }
    int r = qsd_stop(v->qsd, restage_stopped, op);
    if (r < 0) {
        grpc_call_fail(op->call, GRPC_INTERNAL, "cannot stop the QSD: %s", strerror(-r));
        op_end(op);
    }
}

static int grow_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    _cleanup_free_ char *path = NULL, *fmt = NULL;
    if (pool_find_volume(&op->csi->pool, op->vol->id, &path, &fmt) < 0) {
        *ret_msg = xasprintf("the image of volume %s is missing", op->vol->id);
        return -EIO;
    }
    const struct stage_ctx *x = op_ctx(op, &stage_ctx_type);
    return image_resize_offline(path, fmt, x->size, ret_msg);
}

static void grow_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    struct vol *v = op->vol;
    op->worker = NULL;
    if (status < 0) {
        vol_clear_staging(v);
        store_save_vol(op->csi->store, v);
        grpc_call_fail(op->call, capacity_errno_code(status, GRPC_INTERNAL),
                       "growing the image to the expanded size: %s", msg ? msg : strerror(-status));
        op_end(op);
        return;
    }
    const struct stage_ctx *x = op_ctx(op, &stage_ctx_type);
    v->image_size = x->size;
    store_save_vol(op->csi->store, v);
    stage_start(op);
}

/* The socket's group of staged v becomes gid (regroup of node_plan.h). */
static int regroup(struct csi *c, struct grpc_call *call, struct vol *v, int gid)
{
    int r = qsd_set_socket_group(v->qsd, gid);
    if (r == 0) {
        int old = v->stage_gid;
        v->stage_gid = gid;
        if ((r = store_save_vol(c->store, v)) < 0)
            v->stage_gid = old;
    }
    if (r < 0) {
        grpc_call_fail(call, GRPC_INTERNAL, "cannot give volume %s to group %d: %s", v->id, gid,
                       strerror(-r));
        return r;
    }
    log_info("node", "socket group changed", "volume=%s gid=%d", v->id, gid);
    return 0;
}

/* Record the staging of v at path (its checks passed), then start its QSD,
 * after growing its image to an expansion recorded while it was not
 * served. */
static void stage_new_act(struct csi *c, struct grpc_call *call, struct vol *v, const char *path,
                          int gid, bool ro, struct rbd_req *rbd)
{
    v->staging_path = xstrdup(path);
    v->stage_gid = gid;
    v->stage_ro = ro;
    int r = store_save_vol(c->store, v);
    if (r < 0) {
        vol_clear_staging(v);
        grpc_call_fail(call, capacity_errno_code(r, GRPC_INTERNAL),
                       "cannot write the volume record: %s", strerror(-r));
        rbd_req_free(rbd);
        return;
    }
    struct op *op = stage_op(c, call, v, false, rbd);
    if (v->image_size < v->size) {
        struct stage_ctx *x = op_ctx(op, &stage_ctx_type);
        x->size = v->size;
        op_worker(op, grow_fn, 2 * 60 * 1000, grow_done);
        return;
    }
    stage_start(op);
}

/* A stage_new_fn (backend.h): a volume its backend prepared. */
static void node_stage_new(struct csi *c, struct grpc_call *call, struct vol *v, const char *path,
                           int gid, bool ro, struct rbd_req *rbd)
{
    struct verdict no = {0};
    if (!node_stage_new_check(c, &no, v, path)) {
        verdict_send(&no, call);
        rbd_req_free(rbd);
        return;
    }
    stage_new_act(c, call, v, path, gid, ro, rbd);
}

static void stage(struct csi *c, struct grpc_call *call, Csi__V1__NodeStageVolumeRequest *in)
{
    struct node_plan pl;
    node_stage_plan(c, in, &pl);
    if (pl.kind == PLAN_ACT && pl.step == STAGE_AGAIN) {
        struct qsd_state q = qsd_state_of(pl.vol);
        node_stage_served(&pl, &q);
    }
    if (plan_holds(c, call, &pl, NULL, NULL, NULL)) {
        struct vol *v = pl.vol;
        if (pl.kind == PLAN_DONE)
            reply_empty(call);
        else if (pl.step == STAGE_PREPARE) /* the record (RBD: and key) */
            pl.backend->stage_prepare(c, call, in, pl.gid, pl.ro, node_stage_new);
        else if (pl.step == STAGE_NEW) {
            v->stage_kind = (enum stage_kind)pl.use;
            v->stage_fs = pl.fs ? xstrdup(pl.fs) : NULL;
            /* A VM's disk or a pod's block device: a tenant writes raw bytes. */
            v->raw_exposed |= pl.use != STAGE_KIND_FS;
            stage_new_act(c, call, v, in->staging_target_path, pl.gid, pl.ro, NULL);
        } else if (pl.step == STAGE_REPAIR && v->stage_kind != STAGE_KIND_VHOST)
            restage(stage_op(c, call, v, true, NULL));
        else if (pl.step == STAGE_REPAIR)
            stage_start(stage_op(c, call, v, true, NULL));
        else if (pl.step == STAGE_ATTACH && podvol_served(c, v))
            attach_start(stage_op(c, call, v, true, NULL));
        else if (pl.step == STAGE_ATTACH)
            restage(stage_op(c, call, v, true, NULL));
        else if (pl.step == STAGE_RESTART) {
            verdict_send(&pl.refusal, call);
            pl.backend->restart(c, v);
        } else if (pl.step == STAGE_REGROUP && regroup(c, call, v, pl.gid) == 0)
            reply_empty(call);
    }
    node_plan_clear(&pl);
}

static void unstage_stopped(struct qsd *q, int status, const char *msg, void *opaque)
{
    struct op *op = opaque;
    struct csi *c = op->csi;
    struct vol *v = op->vol;
    if (status < 0) {
        /* Still running (stuck after SIGKILL): nothing is undone, kubelet
         * retries. */
        grpc_call_fail(op->call, GRPC_UNAVAILABLE, "%s", msg ? msg : strerror(-status));
        op_end(op);
        return;
    }
    qsd_free(v->qsd);
    v->qsd = NULL;
    csi_remove_runtime(c, v->id);
    vol_clear_staging(v);
    const struct backend *b = BACKEND_OF(.record = v);
    b->forget(v);
    if (b->record_staged_only) {
        log_info("node", "volume unstaged", "volume=%s", v->id);
        op->vol = NULL;
        store_remove_vol(c->store, v);
        reply_empty(op->call);
        op_end(op);
        return;
    }
    int r = store_save_vol(c->store, v);
    if (r < 0)
        grpc_call_fail(op->call, capacity_errno_code(r, GRPC_INTERNAL),
                       "cannot write the volume record: %s", strerror(-r));
    else {
        log_info("node", "volume unstaged", "volume=%s", v->id);
        reply_empty(op->call);
    }
    op_end(op);
}

/* Stop the QSD of v, staged and published nowhere, and drop the staging:
 * once no guest holds the disk, or the unplug bound has passed. */
/* NodeUnstageVolume's stop of the QSD (its pod volume's data path down
 * first). */
static void unstage_stop(struct op *op)
{
    struct vol *v = op->vol;
    if (!v->qsd) {
        unstage_stopped(NULL, 0, NULL, op);
        return;
    }
    int r = qsd_stop(v->qsd, unstage_stopped, op);
    if (r < 0) {
        grpc_call_fail(op->call, GRPC_INTERNAL, "cannot stop the QSD: %s", strerror(-r));
        op_end(op);
    }
}

static void unstage_detached(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    op->worker = NULL;
    if (status < 0) {
        /* Nothing stopped: kubelet retries. */
        grpc_call_fail(op->call, GRPC_INTERNAL, "%s", msg ? msg : strerror(-status));
        op_end(op);
        return;
    }
    unstage_stop(op);
}

static void unstage_act(struct csi *c, struct grpc_call *call, struct vol *v)
{
    if (v->stage_kind != STAGE_KIND_VHOST) {
        /* No VM holds it: the filesystem, loop device and FUSE file go,
         * then the QSD. */
        struct op *op = op_begin(c, call);
        op->vol = v;
        v->busy = true;
        op_worker(op, detach_fn, ATTACH_TIMEOUT_MS, unstage_detached);
        return;
    }
    if (vol_live(v)) {
        /* The guest may still hold the disk (hot-unplug in progress): stop
         * the QSD only when no client is connected, or once the bound since
         * the volume left its last pod or bridge has passed. */
        struct qsd_paths p;
        qsd_paths_init(c->cfg->run_dir, v->id, &p);
        int n = export_clients(qsd_get_pid(v->qsd), p.socket);
        qsd_paths_clear(&p);
        if (n < 0)
            log_warn("node", "cannot count the clients of an export", "volume=%s error=\"%s\"",
                     v->id, strerror(-n));
        if (n > 0) {
            int64_t now = realtime_ms();
            if (!v->released_ms || v->released_ms > now) {
                v->released_ms = now;
                store_save_vol(c->store, v);
            }
            int64_t waited = now - v->released_ms;
            if (waited < c->cfg->unplug_timeout_ms) {
                log_info("node", "unstage waits for the guest to release the disk",
                         "volume=%s clients=%d waited_ms=%lld timeout_ms=%lld", v->id, n,
                         (long long)waited, (long long)c->cfg->unplug_timeout_ms);
                grpc_call_fail(call, GRPC_FAILED_PRECONDITION,
                               "volume %s is still in use by a vhost-user client (the guest has "
                               "not released the disk yet); retry (the QSD is stopped anyway "
                               "%lld s after the volume left its last pod or bridge, %lld s "
                               "to go)", v->id, (long long)c->cfg->unplug_timeout_ms / 1000,
                               (long long)(c->cfg->unplug_timeout_ms - waited + 999) / 1000);
                return;
            }
            log_error("node", "unplug timeout: stopping the QSD under a connected client",
                      "volume=%s clients=%d waited_ms=%lld", v->id, n, (long long)waited);
        }
    }
    struct op *op = op_begin(c, call);
    op->vol = v;
    v->busy = true;
    unstage_stop(op);
}

static void unstage(struct csi *c, struct grpc_call *call, Csi__V1__NodeUnstageVolumeRequest *in)
{
    struct node_plan pl;
    node_unstage_plan(c, in, &pl);
    if (plan_holds(c, call, &pl, NULL, NULL, NULL)) {
        if (pl.kind == PLAN_DONE)
            reply_empty(call);
        else
            unstage_act(c, call, pl.vol);
    }
    node_plan_clear(&pl);
}

/* ----------------------------------------------------------- publish */

/* Success of a PVC publication: place it in a bridge when its pod asked for
 * that (bridge.h); a placement that fails undoes the publication. */
static void publish_done(struct csi *c, struct grpc_call *call, struct vol *v, const char *target,
                         const char *pod_uid, bool ro, bool fresh)
{
    _cleanup_free_ char *msg = NULL;
    int r = bridge_pvc_place(c, v, pod_uid, ro, &msg);
    if (r < 0) {
        if (fresh) {
            _cleanup_free_ char *m2 = NULL;
            mounts_unbind(c, target, &m2);
            ssize_t k = vol_find_pub(v, target);
            if (k >= 0)
                vol_del_pub(v, (size_t)k);
            store_save_vol(c->store, v);
        }
        grpc_call_fail(call, r == -ENOENT || r == -EEXIST || r == -EBUSY || r == -EPERM
                                 ? GRPC_FAILED_PRECONDITION : GRPC_INTERNAL,
                       "%s", msg);
        return;
    }
    reply_empty(call);
}

/* What a pod volume's publication binds: the filesystem mounted at the
 * staging path, or the loop device's node. */
static int pod_source(struct csi *c, const struct vol *v, int *ret_fd, char **ret_msg)
{
    if (v->stage_kind == STAGE_KIND_FS) {
        _cleanup_close_ int fd = -1;
        int r = mounts_open_target(c, v->staging_path, &fd);
        if (r == 0 && fsat_is_mount_root(fd) != 1)
            r = -ENOENT;
        if (r < 0) {
            *ret_msg = xasprintf("the filesystem of volume %s is not mounted at %s: stage it "
                                 "again", v->id, v->staging_path);
            return r == -ENOENT ? -ENOTCONN : r;
        }
        *ret_fd = TAKE_FD(fd);
        return 0;
    }
    int r = podvol_loop_open(c, v, ret_fd);
    if (r < 0)
        *ret_msg = xasprintf("volume %s has no loop device: stage it again", v->id);
    return r == -ENOENT ? -ENOTCONN : r;
}

/* Publish v at target_path as pl decided: the socket's group first, the
 * record, then the bind mount of the export directory. */
static void publish_act(struct csi *c, struct grpc_call *call,
                        const Csi__V1__NodePublishVolumeRequest *in, const struct node_plan *pl)
{
    struct vol *v = pl->vol;
    bool ro = pl->ro;
    if (pl->regroup && regroup(c, call, v, pl->gid) < 0)
        return;
    if (pl->pub < 0) {
        vol_add_pub(v, in->target_path, ro);
        vol_pub_set_pod(v, v->n_pubs - 1, pl->pod_uid, pl->pod_ns);
        int r = store_save_vol(c->store, v);
        if (r < 0) {
            vol_del_pub(v, v->n_pubs - 1);
            grpc_call_fail(call, capacity_errno_code(r, GRPC_INTERNAL),
                           "cannot write the volume record: %s", strerror(-r));
            return;
        }
    }
    _cleanup_free_ char *msg = NULL;
    _cleanup_close_ int src = -1;
    int r;
    if (v->stage_kind != STAGE_KIND_VHOST) {
        r = pod_source(c, v, &src, &msg);
        if (r == 0)
            r = mounts_bind_pod(c, src, in->target_path, v->stage_kind == STAGE_KIND_BLOCK, ro,
                                &msg);
    } else {
        /* A read-only publication of a read-write volume gets the read-only
         * export: the guest's disk is read-only whatever the pod does. */
        r = qsd_export_dir_open(c->cfg->run_dir, v->id, ro && !v->stage_ro, &src);
        if (r < 0)
            msg = xasprintf("cannot open the export directory of volume %s: %s", v->id,
                            strerror(-r));
        else
            r = mounts_bind(c, src, in->target_path, &msg);
    }
    if (r < 0) {
        if (r != -EEXIST && r != -ELOOP && r != -EXDEV) {
            _cleanup_free_ char *m2 = NULL;
            mounts_unbind(c, in->target_path, &m2); /* the directory it made */
        }
        ssize_t k = vol_find_pub(v, in->target_path);
        if (k >= 0)
            vol_del_pub(v, (size_t)k);
        store_save_vol(c->store, v);
        grpc_call_fail(call, r == -ENOTCONN ? GRPC_FAILED_PRECONDITION : mounts_grpc_code(r),
                       "%s", msg);
        return;
    }
    log_info("node", "volume published", "volume=%s target=%s readonly=%s pod_uid=%s kind=%s",
             v->id, in->target_path, ro ? "true" : "false", pl->pod_uid ? pl->pod_uid : "-",
             stage_kind_name(v->stage_kind));
    if (v->stage_kind != STAGE_KIND_VHOST) {
        reply_empty(call);
        return;
    }
    publish_done(c, call, v, in->target_path, pl->pod_uid, ro, true);
}

static void publish(struct csi *c, struct grpc_call *call, Csi__V1__NodePublishVolumeRequest *in)
{
    if (bridge_is_ephemeral(in)) {
        bridge_publish_ephemeral(c, call, in);
        return;
    }
    struct node_plan pl;
    node_publish_plan(c, in, &pl);
    _cleanup_free_ char *msg = NULL;
    int mounted = 0;
    if (!plan_holds(c, call, &pl, NULL, NULL, NULL)) {
    } else if ((mounted = mounts_is_mounted(c, in->target_path, &msg)) < 0) {
        grpc_call_fail(call, mounts_grpc_code(mounted), "target_path: %s", msg);
    } else {
        struct qsd_state q = qsd_state_of(pl.vol);
        node_publish_mounted(&pl, in, mounted > 0, &q);
        if (pl.kind == PLAN_REFUSE)
            verdict_send(&pl.refusal, call);
        else if (pl.kind == PLAN_DONE)
            publish_done(c, call, pl.vol, in->target_path, pl.pod_uid, pl.ro, false);
        else
            publish_act(c, call, in, &pl);
    }
    node_plan_clear(&pl);
}

/* Unmount publication i of v (at target), out of its bridge first. */
static void unpublish_act(struct csi *c, struct grpc_call *call, struct vol *v, size_t i,
                          const char *target)
{
    /* Out of the VM pod's bridge first; returns at once: the launcher
     * detaches the disk, NodeUnstageVolume waits for the guest. */
    bridge_pvc_unplace(c, v, v->pubs[i].pod_uid);
    _cleanup_free_ char *msg = NULL;
    int r = mounts_unbind(c, target, &msg);
    if (r < 0) {
        grpc_call_fail(call, mounts_grpc_code(r), "%s", msg);
        return;
    }
    vol_del_pub(v, (size_t)i);
    v->released_ms = realtime_ms();
    if ((r = store_save_vol(c->store, v)) < 0) {
        grpc_call_fail(call, capacity_errno_code(r, GRPC_INTERNAL),
                       "cannot write the volume record: %s", strerror(-r));
        return;
    }
    log_info("node", "volume unpublished", "volume=%s target=%s", v->id, target);
    reply_empty(call);
}

static void unpublish(struct csi *c, struct grpc_call *call, Csi__V1__NodeUnpublishVolumeRequest *in)
{
    struct node_plan pl;
    node_unpublish_plan(c, in, &pl);
    if (!plan_holds(c, call, &pl, bridge_unpublish_ephemeral, in->volume_id, in->target_path)) {
    } else if (pl.kind == PLAN_DONE) {
        reply_empty(call);
    } else {
        unpublish_act(c, call, pl.vol, (size_t)pl.pub, in->target_path);
    }
    node_plan_clear(&pl);
}

/* ------------------------------------------------------- stats, expand */

/* NodeGetVolumeStats reads the volume's chain of layers (file sizes, qcow2
 * headers) in a worker: a hung pool disk must not stall the loop. */
#define STATS_TIMEOUT_MS 10000 /* health.c's ALLOC_TIMEOUT_S */

/* A NodeGetVolumeStats's context (op.h): the volume's id (malloc'd), looked
 * up again when done, the volume not held busy. */
static const struct op_ctx_type stats_ctx_type = {"NodeGetVolumeStats", free};

static void stats_reply(struct csi *c, struct grpc_call *call, struct vol *v, bool have_used,
                        uint64_t used, json_t *fs)
{
    uint64_t total = v->image_size;
    used = MIN(used, total);
    Csi__V1__VolumeUsage u = CSI__V1__VOLUME_USAGE__INIT, in = CSI__V1__VOLUME_USAGE__INIT,
                         *ul[2] = {&u, &in};
    u.unit = CSI__V1__VOLUME_USAGE__UNIT__BYTES;
    u.total = (int64_t)total;
    u.used = (int64_t)used;
    u.available = (int64_t)(total > used ? total - used : 0);
    if (fs) {
        /* A mounted filesystem: its own figures, bytes and inodes. */
        json_int_t t = 0, a = 0, f = 0, n = 0, nf = 0;
        json_unpack(fs, "{s:I, s:I, s:I, s:I, s:I}", "total", &t, "avail", &a, "free", &f,
                    "inodes", &n, "ifree", &nf);
        u.total = t;
        u.available = a;
        u.used = t - f;
        in.unit = CSI__V1__VOLUME_USAGE__UNIT__INODES;
        in.total = n;
        in.available = nf;
        in.used = n - nf;
    }
    Csi__V1__VolumeCondition cond = CSI__V1__VOLUME_CONDITION__INIT;
    struct vol_health h;
    health_of(c, v, have_used ? HEALTH_USED_KNOWN : HEALTH_USED_TIMED_OUT, used, &h);
    cond.abnormal = h.status != 0;
    cond.message = h.message;
    Csi__V1__NodeGetVolumeStatsResponse out = CSI__V1__NODE_GET_VOLUME_STATS_RESPONSE__INIT;
    out.n_usage = fs ? 2 : 1;
    out.usage = ul;
    out.volume_condition = &cond;
    grpc_call_reply_pb(call, &out.base);
    vol_health_clear(&h);
}

/* In the worker: the data the volume sees, its whole chain of layers,
 * shared ones included (they are its data too). */
static int stats_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    (void)ret_msg;
    struct op *op = arg;
    uint64_t used = 0;
    int r = vol_allocated(op->csi, op_ctx(op, &stats_ctx_type), &used);
    *ret_result = json_pack("{s:b, s:I}", "known", r == 0, "allocated", (json_int_t)used);
    /* A pod's filesystem: what df says of it. */
    const struct vol *v = store_find_vol(op->csi->store, op_ctx(op, &stats_ctx_type));
    _cleanup_close_ int fd = -1;
    struct statvfs sv;
    if (v && v->stage_kind == STAGE_KIND_FS && v->staging_path &&
        mounts_open_target(op->csi, v->staging_path, &fd) == 0 && fsat_is_mount_root(fd) == 1) {
        _cleanup_close_ int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0 && fstatvfs(dfd, &sv) == 0)
            json_object_set_new(*ret_result, "fs",
                                json_pack("{s:I, s:I, s:I, s:I, s:I}", "total",
                                          (json_int_t)(sv.f_blocks * sv.f_frsize), "avail",
                                          (json_int_t)(sv.f_bavail * sv.f_frsize), "free",
                                          (json_int_t)(sv.f_bfree * sv.f_frsize), "inodes",
                                          (json_int_t)sv.f_files, "ifree",
                                          (json_int_t)sv.f_ffree));
    }
    return 0;
}

static void stats_done(int status, const char *msg, json_t *result, void *opaque)
{
    (void)msg;
    struct op *op = opaque;
    struct vol *v = find_or_fail(op->csi, op->call, op_ctx(op, &stats_ctx_type));
    if (v) {
        /* A failed read of the chain (a layer gone meanwhile) counts 0 used,
         * as before; a worker that did not finish makes the volume abnormal. */
        json_t *a = json_object_get(result, "allocated");
        stats_reply(op->csi, op->call, v, status == 0,
                    a ? (uint64_t)json_integer_value(a) : 0, json_object_get(result, "fs"));
    }
    op_end(op);
}

static void stats(struct csi *c, struct grpc_call *call, Csi__V1__NodeGetVolumeStatsRequest *in)
{
    struct node_plan pl;
    node_stats_plan(c, in, &pl);
    if (plan_holds(c, call, &pl, bridge_stats, in->volume_id, in->volume_path)) {
        struct op *op = op_begin(c, call);
        /* not busy: stats run beside any operation */
        op_set_ctx(op, &stats_ctx_type, xstrdup(pl.vol->id));
        op_worker(op, stats_fn, STATS_TIMEOUT_MS, stats_done);
    }
    node_plan_clear(&pl);
}

/* A NodeExpandVolume's context (op.h). */
struct expand_ctx {
    uint64_t size;   /* to grow to; the node's size once grown */
    bool qmp_failed; /* its monitor connection failed */
};

static const struct op_ctx_type expand_ctx_type = {"NodeExpandVolume", free};

static void expand_finish(struct op *op, int status, const char *msg)
{
    struct vol *v = op->vol;
    const struct expand_ctx *x = op_ctx(op, &expand_ctx_type);
    if (status == 0) {
        if (x->size > v->size)
            v->size = x->size;
        v->image_size = x->size;
        int r = qsd_write_meta(v->qsd, x->size), rm = r;
        if (r == 0)
            r = store_save_vol(op->csi->store, v);
        if (rm < 0) {
            grpc_call_fail(op->call, capacity_errno_code(rm, GRPC_INTERNAL),
                           "volume %s grew to %" PRIu64 " bytes, but its volume.json could not "
                           "be rewritten: %s", v->id, x->size, strerror(-rm));
        } else if (r < 0) {
            grpc_call_fail(op->call, capacity_errno_code(r, GRPC_INTERNAL),
                           "cannot write the volume record: %s", strerror(-r));
        } else {
            log_info("node", "volume expanded online", "volume=%s size=%" PRIu64, v->id, x->size);
            Csi__V1__NodeExpandVolumeResponse out = CSI__V1__NODE_EXPAND_VOLUME_RESPONSE__INIT;
            out.capacity_bytes = (int64_t)x->size;
            grpc_call_reply_pb(op->call, &out.base);
        }
    } else {
        grpc_call_fail(op->call, status == -ECONNRESET || status == -ETIMEDOUT
                                     ? GRPC_UNAVAILABLE
                                     : capacity_errno_code(status, GRPC_INTERNAL),
                       "%s", msg);
    }
    op_end(op);
}

/* The resize sequence (qmpcmd.h): never shrinks, the context's size
 * becomes the node's size afterwards. */
/* In the worker: a pod volume's loop device and filesystem grown. */
static int pod_grow_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    const struct expand_ctx *x = op_ctx(op, &expand_ctx_type);
    return podvol_grow(op->csi, op->vol, x->size, ret_msg);
}

static void pod_grown(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    op->worker = NULL;
    _cleanup_free_ char *m = status < 0 ? xasprintf("volume %s grew, but not its %s: %s",
                                                    op->vol->id, op->vol->stage_kind ==
                                                    STAGE_KIND_FS ? "filesystem" : "loop device",
                                                    msg ? msg : strerror(-status))
                                        : NULL;
    expand_finish(op, status, m);
}

static void on_grown(int status, uint64_t size, const char *msg, void *opaque)
{
    struct op *op = opaque;
    struct expand_ctx *x = op_ctx(op, &expand_ctx_type);
    if (status == 0)
        x->size = size;
    if (status == 0 && op->vol->stage_kind != STAGE_KIND_VHOST) {
        op_worker(op, pod_grow_fn, ATTACH_TIMEOUT_MS, pod_grown);
        return;
    }
    expand_finish(op, status, msg);
}

static void on_qmp_state(struct qmp *q, int status, const struct qmp_error *err, void *opaque)
{
    struct op *op = opaque;
    struct expand_ctx *x = op_ctx(op, &expand_ctx_type);
    if (status == 0) {
        int r = qmpc_grow(q, x->size, false, QMP_OP_TIMEOUT_MS, on_grown, op);
        if (r < 0)
            expand_finish(op, r, "cannot send query-block-exports");
        return;
    }
    /* Connection failed or closed: only an op still waiting cares. */
    if (op->qmp == q && !x->qmp_failed) {
        x->qmp_failed = true;
        _cleanup_free_ char *m = xasprintf("cannot talk to the QSD of volume %s: %s", op->vol->id,
                                           err && err->desc ? err->desc : strerror(-status));
        op->qmp = NULL;
        qmp_close(q);
        expand_finish(op, -ECONNRESET, m);
    }
}

/* The volume's block size: its sizes are multiples of it. */
static unsigned block_size(struct csi *c, const struct vol *v)
{
    _cleanup_free_ char *msg = NULL;
    struct qsd_opts o;
    unsigned align = IMAGE_SIZE_ALIGN;
    if (vol_export_opts(c, v, &o, &msg) == 0) {
        align = o.logical_block_size;
        qsd_opts_clear(&o);
    }
    return align;
}

/* Grow v's QSD to size, after the capacity policy when it grows. */
static void expand_act(struct csi *c, struct grpc_call *call, struct vol *v, uint64_t size,
                       bool grow)
{
    if (grow) {
        _cleanup_free_ char *what = xasprintf("expansion of volume %s from %" PRIu64 " to %" PRIu64
                                              " bytes", v->id, v->size, size);
        if (!capacity_admit(c, call, what, size - v->size, 0))
            return;
    }
    struct op *op = op_begin(c, call);
    struct expand_ctx *x = op_set_ctx(op, &expand_ctx_type, xcalloc(1, sizeof(*x)));
    op->vol = v;
    v->busy = true;
    x->size = size;
    int r = qmp_connect(c->loop, qsd_get_paths(v->qsd)->qmp, QMP_OP_TIMEOUT_MS, on_qmp_state, op,
                        &op->qmp);
    if (r < 0) {
        op->qmp = NULL;
        grpc_call_fail(call, GRPC_UNAVAILABLE, "cannot connect to the QSD monitor: %s",
                       strerror(-r));
        op_end(op);
    }
}

static void expand(struct csi *c, struct grpc_call *call, Csi__V1__NodeExpandVolumeRequest *in)
{
    struct node_plan pl;
    node_expand_plan(c, in, &pl);
    if (pl.kind == PLAN_ACT) /* without a range, the size is the record's */
        node_expand_size(&pl, in, in->capacity_range ? block_size(c, pl.vol) : IMAGE_SIZE_ALIGN,
                         vol_live(pl.vol));
    if (plan_holds(c, call, &pl, NULL, NULL, NULL))
        expand_act(c, call, pl.vol, pl.size, pl.grow);
    node_plan_clear(&pl);
}

/* ------------------------------------------------------------ dispatch */

CSI_HANDLER(h_info, get_info, Csi__V1__NodeGetInfoRequest, csi__v1__node_get_info_request)
CSI_HANDLER(h_caps, get_caps, Csi__V1__NodeGetCapabilitiesRequest, csi__v1__node_get_capabilities_request)
CSI_HANDLER(h_stage, stage, Csi__V1__NodeStageVolumeRequest, csi__v1__node_stage_volume_request)
CSI_HANDLER(h_unstage, unstage, Csi__V1__NodeUnstageVolumeRequest, csi__v1__node_unstage_volume_request)
CSI_HANDLER(h_publish, publish, Csi__V1__NodePublishVolumeRequest, csi__v1__node_publish_volume_request)
CSI_HANDLER(h_unpublish, unpublish, Csi__V1__NodeUnpublishVolumeRequest,
        csi__v1__node_unpublish_volume_request)
CSI_HANDLER(h_stats, stats, Csi__V1__NodeGetVolumeStatsRequest, csi__v1__node_get_volume_stats_request)
CSI_HANDLER(h_expand, expand, Csi__V1__NodeExpandVolumeRequest, csi__v1__node_expand_volume_request)

static struct node g_node;

const struct grpc_method *node_methods(struct csi *c, size_t *ret_n)
{
    struct node *n = &g_node;
    n->csi = c;
    size_t k = 0;
#define M(path, fn, lvl) n->methods[k++] = (struct grpc_method){"/csi.v1.Node/" path, fn, c, lvl}
    M("NodeGetInfo", h_info, LOG_INFO);
    M("NodeGetCapabilities", h_caps, LOG_INFO);
    M("NodeStageVolume", h_stage, LOG_INFO);
    M("NodeUnstageVolume", h_unstage, LOG_INFO);
    M("NodePublishVolume", h_publish, LOG_INFO);
    M("NodeUnpublishVolume", h_unpublish, LOG_INFO);
    M("NodeGetVolumeStats", h_stats, LOG_DEBUG);
    M("NodeExpandVolume", h_expand, LOG_INFO);
    M("NodeGetVolumeHealth", health_node_get, LOG_DEBUG);
    M("NodeGetStorageHealth", health_node_storage, LOG_DEBUG);
#undef M
    *ret_n = k;
    return n->methods;
}
