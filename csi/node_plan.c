/* SPDX-License-Identifier: Apache-2.0 */
/* node_plan.c: the pure cores of the Node service's volume RPCs
 * (node_plan.h).  The order of the checks is the order of the status
 * codes a caller sees: the request's own fields (INVALID_ARGUMENT), the
 * path resolved by the act, the record (NOT_FOUND, ABORTED while busy),
 * then where the volume is staged or published (FAILED_PRECONDITION for a
 * conflict, ALREADY_EXISTS for the same path with another mode or group),
 * then whether its QSD runs (UNAVAILABLE). */
#include "node_plan.h"
#include "backend.h"
#include "bridge.h"
#include "capacity.h"
#include "ids.h"
#include "paths.h"
#include "qsd/base/names.h"
#include "qsd/base/util.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <sys/un.h>

static void plan_init(struct node_plan *pl)
{
    *pl = (struct node_plan){.kind = PLAN_REFUSE, .gid = -1, .pub = -1};
}

void node_plan_clear(struct node_plan *pl)
{
    verdict_clear(&pl->refusal);
    plan_init(pl);
}

bool node_path_check(const struct csi *c, struct verdict *v, const char *field, const char *path)
{
    const char *why;
    if (!path || !*path)
        return verdict_fail(v, GRPC_INVALID_ARGUMENT, "%s is missing", field);
    if (path_check_lexical(c->cfg->kubelet_root, path, &why) < 0)
        return verdict_fail(v, GRPC_INVALID_ARGUMENT, "%s %s (kubelet root %s)", field, why,
                            c->cfg->kubelet_root);
    return true;
}

/* The record of id, ready; NOT_FOUND otherwise. */
static struct vol *found(struct csi *c, struct verdict *v, const char *id)
{
    struct vol *vol = store_find_vol(c->store, id);
    if (!vol || vol->phase != PHASE_READY) {
        verdict_fail(v, GRPC_NOT_FOUND, "volume %s does not exist", id);
        return NULL;
    }
    return vol;
}

static bool not_busy(struct verdict *v, const struct vol *vol)
{
    if (vol->busy)
        return verdict_fail(v, GRPC_ABORTED, "an operation on volume %s is in progress",
                            vol->id);
    return true;
}

/* The record of id, staged or published at path; NOT_FOUND otherwise. */
static struct vol *found_at_path(struct csi *c, struct verdict *v, const char *id,
                                 const char *path)
{
    struct vol *vol = found(c, v, id);
    if (vol && !(vol->staging_path && streq(vol->staging_path, path)) &&
        vol_find_pub(vol, path) < 0) {
        verdict_fail(v, GRPC_NOT_FOUND, "volume %s is not staged or published at %s", vol->id,
                     path);
        return NULL;
    }
    return vol;
}

/* volume_mount_group of a later NodeStage/NodePublish: the group that may
 * connect follows it while nothing is published with another group.  0:
 * nothing to change; 1: the socket's group becomes gid; -1: refused. */
static int regroup_check(struct verdict *v, const struct vol *vol, int gid, bool has_qsd)
{
    if (gid < 0 || gid == vol->stage_gid)
        return 0;
    if (vol->n_pubs > 0) {
        verdict_fail(v, GRPC_FAILED_PRECONDITION, "volume %s is published for group %d, not %d",
                     vol->id, vol->stage_gid, gid);
        return -1;
    }
    if (!has_qsd) {
        verdict_fail(v, GRPC_UNAVAILABLE, "the QSD of volume %s is not running", vol->id);
        return -1;
    }
    return 1;
}

static size_t staged_count(const struct csi *c)
{
    size_t n = 0;
    for (size_t i = 0; i < c->store->n_vols; i++)
        n += c->store->vols[i]->staging_path != NULL;
    return n;
}

bool node_stage_new_check(struct csi *c, struct verdict *v, const struct vol *vol,
                          const char *path)
{
    _cleanup_free_ char *other = csi_path_owner(c, path, vol->id);
    if (other)
        return verdict_fail(v, GRPC_FAILED_PRECONDITION,
                            "staging_target_path %s is already used by %s", path, other);
    /* Unix socket addresses hold 107 bytes: a long id under a long
     * --run-dir cannot be served. */
    struct qsd_paths p;
    qsd_paths_init(c->cfg->run_dir, vol->id, &p);
    size_t longest = MAX(strlen(p.socket), strlen(p.qmp));
    qsd_paths_clear(&p);
    if (longest >= sizeof(((struct sockaddr_un *)0)->sun_path))
        return verdict_fail(v, GRPC_INVALID_ARGUMENT,
                            "volume id %s is too long to be served under run directory %s "
                            "(unix socket path of %zu bytes)", vol->id, c->cfg->run_dir, longest);
    if (c->cfg->max_volumes > 0 && staged_count(c) >= (size_t)c->cfg->max_volumes)
        return verdict_fail(v, GRPC_RESOURCE_EXHAUSTED,
                            "this node serves at most %" PRId64 " volumes", c->cfg->max_volumes);
    return true;
}

static void act(struct node_plan *pl, enum stage_step step)
{
    pl->kind = PLAN_ACT;
    pl->step = step;
}

/* A volume staged already: at another path or with another mode, a
 * conflict; else node_stage_served decides. */
/* The consumer a kind serves (messages). */
static const char *consumer(int kind)
{
    return kind == STAGE_KIND_VHOST ? "VM pods (vhost-user)"
           : kind == STAGE_KIND_FS  ? "pods as a filesystem"
                                    : "pods as a block device";
}

static void stage_again(struct node_plan *pl, const char *path)
{
    struct verdict *v = &pl->refusal;
    const struct vol *vol = pl->vol;
    if ((int)vol->stage_kind != pl->use ||
        (pl->fs && vol->stage_fs && !streq(pl->fs, vol->stage_fs)))
        verdict_fail(v, GRPC_FAILED_PRECONDITION,
                     "volume %s is staged for %s%s%s at %s, not for %s%s%s: one kind of consumer "
                     "at a time (unstage it first)", vol->id, consumer(vol->stage_kind),
                     vol->stage_fs ? " " : "", vol->stage_fs ? vol->stage_fs : "",
                     vol->staging_path, consumer(pl->use), pl->fs ? " " : "",
                     pl->fs ? pl->fs : "");
    else if (!streq(vol->staging_path, path))
        verdict_fail(v, GRPC_FAILED_PRECONDITION, "volume %s is already staged at %s", vol->id,
                     vol->staging_path);
    else if (vol->stage_ro != pl->ro)
        verdict_fail(v, GRPC_ALREADY_EXISTS,
                     "volume %s is staged with a different access mode (read-only %s)", vol->id,
                     vol->stage_ro ? "yes" : "no");
    else
        act(pl, STAGE_AGAIN);
}

void node_stage_served(struct node_plan *pl, const struct qsd_state *q)
{
    if (pl->kind != PLAN_ACT || pl->step != STAGE_AGAIN)
        return;
    pl->kind = PLAN_REFUSE;
    struct verdict *v = &pl->refusal;
    const struct vol *vol = pl->vol;
    const struct backend *b = pl->backend;
    if (q->exists && !q->live && !q->idle) {
        verdict_fail(v, GRPC_UNAVAILABLE, "the QSD of volume %s is being (re)started: retry",
                     vol->id);
    } else if (!q->live && !b->supervised) {
        /* Restarted after the backend's check only (rbd_guard.h): the act
         * tries it now, and answers this. */
        const char *refused = b->refused(vol);
        verdict_fail(v, refused ? GRPC_FAILED_PRECONDITION : GRPC_UNAVAILABLE, "volume %s is %s",
                     vol->id, refused ? refused : "being restarted: retry");
        act(pl, STAGE_RESTART);
    } else if (!q->live) {
        /* Staged, not served (its QSD could not be restarted): OK only once
         * its socket accepts again. */
        act(pl, STAGE_REPAIR);
    } else if (vol->stage_kind != STAGE_KIND_VHOST) {
        act(pl, STAGE_ATTACH); /* idempotent: the act checks each piece */
    } else {
        int r = regroup_check(v, vol, pl->gid, q->exists);
        if (r == 0)
            pl->kind = PLAN_DONE;
        else if (r > 0)
            act(pl, STAGE_REGROUP);
    }
}

void node_stage_plan(struct csi *c, Csi__V1__NodeStageVolumeRequest *in, struct node_plan *pl)
{
    plan_init(pl);
    struct verdict *v = &pl->refusal;
    const char *why;
    if (!csi_id_check(c, v, "volume_id", in->volume_id))
        return;
    if (!in->staging_target_path || !*in->staging_target_path) {
        verdict_fail(v, GRPC_INVALID_ARGUMENT, "staging_target_path is missing");
        return;
    }
    if ((why = cap_problem(in->volume_capability))) {
        verdict_fail(v, GRPC_INVALID_ARGUMENT, "%s", why);
        return;
    }
    if (!node_path_check(c, v, "staging_target_path", in->staging_target_path))
        return;
    pl->resolve_field = "staging_target_path";
    pl->resolve_path = in->staging_target_path;
    cap_group(in->volume_capability, &pl->gid);
    pl->ro = cap_read_only(in->volume_capability);
    pl->use = cap_kind(in->volume_capability, &pl->fs);
    struct vol *rv = store_find_vol(c->store, in->volume_id);
    pl->backend = BACKEND_OF(.record = rv, .record_name = in->volume_id);
    if (pl->use != STAGE_KIND_VHOST && !pl->backend->in_pool) {
        verdict_fail(v, GRPC_INVALID_ARGUMENT,
                     "volume %s: filesystem and block volumes for pods are served from the "
                     "node's pool only (backend %s serves VM pods)", in->volume_id,
                     pl->backend->name);
        return;
    }
    if (pl->backend->stage_prepare && (!rv || (!rv->staging_path && !rv->busy))) {
        act(pl, STAGE_PREPARE); /* the record (RBD: and key) */
        return;
    }
    if (!(pl->vol = found(c, v, in->volume_id)) || !not_busy(v, pl->vol))
        return;
    if (pl->vol->staging_path)
        stage_again(pl, in->staging_target_path);
    else if (node_stage_new_check(c, v, pl->vol, in->staging_target_path))
        act(pl, STAGE_NEW);
}

void node_unstage_plan(struct csi *c, Csi__V1__NodeUnstageVolumeRequest *in,
                       struct node_plan *pl)
{
    plan_init(pl);
    struct verdict *v = &pl->refusal;
    if (!csi_id_check(c, v, "volume_id", in->volume_id) ||
        !node_path_check(c, v, "staging_target_path", in->staging_target_path))
        return;
    struct vol *vol = pl->vol = found(c, v, in->volume_id);
    if (!vol || !not_busy(v, vol))
        return;
    if (!vol->staging_path || !streq(vol->staging_path, in->staging_target_path))
        pl->kind = PLAN_DONE;
    else if (vol->n_pubs > 0)
        verdict_fail(v, GRPC_FAILED_PRECONDITION,
                     "volume %s is still published at %s: unpublish it first", vol->id,
                     vol->pubs[0].target);
    else
        pl->kind = PLAN_ACT;
}

static const char *pub_ctx(const Csi__V1__NodePublishVolumeRequest *in, const char *key)
{
    for (size_t i = 0; i < in->n_volume_context; i++)
        if (in->volume_context[i]->key && streq(in->volume_context[i]->key, key))
            return in->volume_context[i]->value;
    return NULL;
}

/* The request's own fields; then target_path is resolved (the act). */
static bool publish_request_ok(struct csi *c, Csi__V1__NodePublishVolumeRequest *in,
                               struct node_plan *pl)
{
    struct verdict *v = &pl->refusal;
    const char *why;
    if (!csi_id_check(c, v, "volume_id", in->volume_id))
        return false;
    if (!in->target_path || !*in->target_path)
        return verdict_fail(v, GRPC_INVALID_ARGUMENT, "target_path is missing");
    if ((why = cap_problem(in->volume_capability)))
        return verdict_fail(v, GRPC_INVALID_ARGUMENT, "%s", why);
    if (!in->staging_target_path || !*in->staging_target_path)
        return verdict_fail(v, GRPC_INVALID_ARGUMENT,
                            "staging_target_path is missing (the plugin has "
                            "STAGE_UNSTAGE_VOLUME)");
    if (!node_path_check(c, v, "target_path", in->target_path))
        return false;
    pl->resolve_field = "target_path";
    pl->resolve_path = in->target_path;
    return node_path_check(c, v, "staging_target_path", in->staging_target_path);
}

void node_publish_plan(struct csi *c, Csi__V1__NodePublishVolumeRequest *in,
                       struct node_plan *pl)
{
    plan_init(pl);
    struct verdict *v = &pl->refusal;
    if (!publish_request_ok(c, in, pl))
        return;
    cap_group(in->volume_capability, &pl->gid);
    const char *fs; /* the staged fs_type is the record's */
    pl->use = cap_kind(in->volume_capability, &fs);
    struct vol *vol = pl->vol = found(c, v, in->volume_id);
    if (!vol || !not_busy(v, vol))
        return;
    if (!vol->staging_path || !streq(vol->staging_path, in->staging_target_path)) {
        verdict_fail(v, GRPC_FAILED_PRECONDITION, "volume %s is not staged at %s", vol->id,
                     in->staging_target_path);
        return;
    }
    if ((int)vol->stage_kind != pl->use) {
        verdict_fail(v, GRPC_FAILED_PRECONDITION,
                     "volume %s is staged for %s, not for %s: one kind of consumer at a time "
                     "(unstage it first)", vol->id, consumer(vol->stage_kind),
                     consumer(pl->use));
        return;
    }
    /* podInfoOnMount: the publishing pod, to match a hot-plug request. */
    pl->pod_uid = pub_ctx(in, "csi.storage.k8s.io/pod.uid");
    pl->pod_ns = pub_ctx(in, "csi.storage.k8s.io/pod.namespace");
    if (pl->pod_uid && (!*pl->pod_uid || name_validate(pl->pod_uid, NULL) < 0 || !pl->pod_ns))
        pl->pod_uid = NULL;
    {
        enum grpc_code code;
        _cleanup_free_ char *msg = NULL;
        if (bridge_pvc_check(c, vol, pl->pod_uid, pl->gid, &code, &msg) < 0) {
            verdict_fail(v, code, "%s", msg);
            return;
        }
    }
    pl->ro = in->readonly || vol->stage_ro || cap_read_only(in->volume_capability);
    if (pl->ro && vol->stage_kind == STAGE_KIND_BLOCK) {
        verdict_fail(v, GRPC_INVALID_ARGUMENT,
                     "volume %s: read-only block publications are not supported (a read-only "
                     "bind does not stop writes to a device node)", vol->id);
        return;
    }
    pl->pub = vol_find_pub(vol, in->target_path);
    if (pl->pub >= 0 && vol->pubs[pl->pub].read_only != pl->ro) {
        verdict_fail(v, GRPC_ALREADY_EXISTS, "volume %s is published at %s with readonly=%s",
                     vol->id, in->target_path, vol->pubs[pl->pub].read_only ? "true" : "false");
        return;
    }
    /* Never onto another volume's (or bridge's) target or staging path:
     * unpublishing it would take this one with it. */
    _cleanup_free_ char *other = csi_path_owner(c, in->target_path, vol->id);
    if (other) {
        verdict_fail(v, GRPC_FAILED_PRECONDITION, "target_path %s is already used by %s",
                     in->target_path, other);
        return;
    }
    pl->kind = PLAN_ACT; /* node_publish_mounted decides */
}

void node_publish_mounted(struct node_plan *pl, const Csi__V1__NodePublishVolumeRequest *in,
                          bool mounted, const struct qsd_state *q)
{
    if (pl->kind != PLAN_ACT)
        return;
    pl->kind = PLAN_REFUSE;
    struct verdict *v = &pl->refusal;
    const struct vol *vol = pl->vol;
    if (mounted && pl->pub < 0) {
        verdict_fail(v, GRPC_FAILED_PRECONDITION,
                     "target_path %s is already a mount that is not a publication of volume %s",
                     in->target_path, vol->id);
        return;
    }
    if (mounted) {
        if (pl->gid >= 0 && pl->gid != vol->stage_gid)
            verdict_fail(v, GRPC_ALREADY_EXISTS, "volume %s is published at %s for group %d",
                         vol->id, in->target_path, vol->stage_gid);
        else
            pl->kind = PLAN_DONE;
        return;
    }
    /* One vhost-user client at a time; a filesystem or block device is
     * shared by the pods of the node like any RWO volume's, but one asked
     * for as SINGLE_NODE_SINGLE_WRITER (ReadWriteOncePod) is published
     * read-write once (CSI). */
    const Csi__V1__VolumeCapability *cap = in->volume_capability;
    bool single = vol->stage_kind == STAGE_KIND_VHOST ||
                  (cap && cap->access_mode &&
                   cap->access_mode->mode ==
                       CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_SINGLE_WRITER);
    if (pl->pub < 0 && !pl->ro && single)
        for (size_t k = 0; k < vol->n_pubs; k++)
            if (!vol->pubs[k].read_only) {
                verdict_fail(v, GRPC_FAILED_PRECONDITION,
                             "volume %s is already published read-write at %s", vol->id,
                             vol->pubs[k].target);
                return;
            }
    int r = vol->stage_kind == STAGE_KIND_VHOST ? regroup_check(v, vol, pl->gid, q->exists) : 0;
    if (r < 0)
        return;
    pl->regroup = r > 0;
    pl->kind = PLAN_ACT;
}

void node_unpublish_plan(struct csi *c, Csi__V1__NodeUnpublishVolumeRequest *in,
                         struct node_plan *pl)
{
    plan_init(pl);
    struct verdict *v = &pl->refusal;
    if (!csi_id_check(c, v, "volume_id", in->volume_id) ||
        !node_path_check(c, v, "target_path", in->target_path))
        return;
    pl->bridge_first = true;
    struct vol *vol = pl->vol = found(c, v, in->volume_id);
    if (!vol || !not_busy(v, vol))
        return;
    pl->pub = vol_find_pub(vol, in->target_path);
    pl->kind = pl->pub < 0 ? PLAN_DONE : PLAN_ACT;
}

void node_stats_plan(struct csi *c, Csi__V1__NodeGetVolumeStatsRequest *in, struct node_plan *pl)
{
    plan_init(pl);
    struct verdict *v = &pl->refusal;
    if (!csi_id_check(c, v, "volume_id", in->volume_id))
        return;
    if (!in->volume_path || !*in->volume_path) {
        verdict_fail(v, GRPC_INVALID_ARGUMENT, "volume_path is missing");
        return;
    }
    pl->bridge_first = true;
    if ((pl->vol = found_at_path(c, v, in->volume_id, in->volume_path)))
        pl->kind = PLAN_ACT;
}

void node_expand_plan(struct csi *c, Csi__V1__NodeExpandVolumeRequest *in, struct node_plan *pl)
{
    plan_init(pl);
    struct verdict *v = &pl->refusal;
    const char *why;
    if (!csi_id_check(c, v, "volume_id", in->volume_id))
        return;
    if (!in->volume_path || !*in->volume_path) {
        verdict_fail(v, GRPC_INVALID_ARGUMENT, "volume_path is missing");
        return;
    }
    if (in->volume_capability && (why = cap_problem(in->volume_capability))) {
        verdict_fail(v, GRPC_INVALID_ARGUMENT, "%s", why);
        return;
    }
    struct vol *vol = pl->vol = found_at_path(c, v, in->volume_id, in->volume_path);
    if (vol && not_busy(v, vol))
        pl->kind = PLAN_ACT; /* node_expand_size decides */
}

void node_expand_size(struct node_plan *pl, const Csi__V1__NodeExpandVolumeRequest *in,
                      unsigned align, bool live)
{
    if (pl->kind != PLAN_ACT)
        return;
    pl->kind = PLAN_REFUSE;
    struct verdict *v = &pl->refusal;
    const struct vol *vol = pl->vol;
    uint64_t size = vol->size;
    if (in->capacity_range) {
        _cleanup_free_ char *msg = NULL;
        uint64_t want;
        int r = capacity_pick(in->capacity_range->required_bytes, in->capacity_range->limit_bytes,
                              0, align, &want, &msg);
        if (r < 0) {
            verdict_fail(v, r == -ERANGE ? GRPC_OUT_OF_RANGE : GRPC_INVALID_ARGUMENT, "%s", msg);
            return;
        }
        size = MAX(size, want);
    }
    if (!live) {
        verdict_fail(v, GRPC_UNAVAILABLE,
                     "the QSD of volume %s is not running (being restarted): retry", vol->id);
        return;
    }
    pl->size = size;
    pl->grow = size > vol->size;
    pl->kind = PLAN_ACT;
}
