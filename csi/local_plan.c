/* SPDX-License-Identifier: Apache-2.0 */
/* local_plan.c: the pure cores of a local CreateVolume, CreateSnapshot,
 * DeleteVolume, DeleteSnapshot and ControllerExpandVolume (local_plan.h).  The order of the checks is the order of the status
 * codes a caller sees (CreateVolume's; CreateSnapshot's is the same
 * without sources and topology):
 * the request's own fields (INVALID_ARGUMENT), where the source lives
 * (RESOURCE_EXHAUSTED: schedule elsewhere), the topology, a record of the
 * same name (an idempotent repeat, ABORTED while busy, ALREADY_EXISTS when
 * different), the source's record (NOT_FOUND, ABORTED, UNAVAILABLE), and
 * the capacity against the source (OUT_OF_RANGE). */
#include "local_plan.h"
#include "volqsd.h"
#include "ids.h"

#include "backend.h"
#include "capacity.h"
#include "controller.h"
#include "params.h"
#include "qsd/base/names.h"
#include "qsd/qemu/image.h"
#include "qsd/base/util.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

/* A restore or clone is made where its source lives: one of another node
 * is refused at once, naming the node to schedule on.  RESOURCE_EXHAUSTED
 * is the specification's "unable to provision in accessible_topology" (the
 * external-provisioner then lets the scheduler pick a node again).  Then
 * the id is validated and made the local name (csi_id_check). */
static bool source_here(struct csi *c, struct verdict *v, const char *type, char *id)
{
    bool snap = streq(type, "snapshot");
    const char *field = snap ? "volume_content_source.snapshot.snapshot_id"
                             : "volume_content_source.volume.volume_id";
    const char *node = csi_id_node(c, id);
    if (node && name_validate(node, NULL) == 0)
        return verdict_fail(v, GRPC_RESOURCE_EXHAUSTED,
                            "source %s %.*s lives on node %s and volumes are node-local: schedule "
                            "the pod that uses this claim on node %s (nodeSelector %s: %s), this "
                            "is node %s", type, (int)(node - 1 - id), id, node, node, c->topo_key,
                            node, c->cfg->node_id);
    return csi_id_check(c, v, field, id);
}

static bool topology_ok(struct csi *c, const Csi__V1__TopologyRequirement *req)
{
    if (!req || req->n_requisite == 0)
        return true;
    for (size_t i = 0; i < req->n_requisite; i++) {
        const Csi__V1__Topology *t = req->requisite[i];
        for (size_t k = 0; k < t->n_segments; k++)
            if (streq(t->segments[k]->key, c->topo_key) &&
                streq(t->segments[k]->value, c->cfg->node_id))
                return true;
    }
    return false;
}

static bool vol_matches(const struct vol *v, int64_t req, int64_t lim, const struct create_plan *pl)
{
    return v->size >= (uint64_t)req && (lim == 0 || v->size <= (uint64_t)lim) &&
           streq(v->format, pl->p.format) && streq(v->preallocation, pl->p.preallocation) &&
           json_equal(v->parameters, pl->params) && streq_ptr(v->src_type, pl->src_type) &&
           streq_ptr(v->src_id, pl->src_id);
}

/* The request's own fields: name, capabilities, parameters, range, source. */
static bool request_ok(struct csi *c, Csi__V1__CreateVolumeRequest *in, struct create_plan *pl,
                       int64_t req, int64_t lim)
{
    struct verdict *v = &pl->refusal;
    const char *why;
    if (!in->name || !*in->name)
        return verdict_fail(v, GRPC_INVALID_ARGUMENT, "name is missing");
    if (name_validate(in->name, &why) < 0)
        return verdict_fail(v, GRPC_INVALID_ARGUMENT,
                            "name %s (the name becomes the volume id: 1-128 bytes of "
                            "[A-Za-z0-9._-])", why);
    if (BACKEND_OF(.record_name = in->name) != &backend_local)
        return verdict_fail(v, GRPC_INVALID_ARGUMENT,
                            "name: names starting with rbd_ are reserved (RBD volumes)");
    if (!caps_check(v, in->n_volume_capabilities, in->volume_capabilities))
        return false;
    pl->params = params_json(in->n_parameters, in->parameters);
    _cleanup_free_ char *msg = NULL;
    if (vol_params_from_json(pl->params, &pl->p, &msg) < 0)
        return verdict_fail(v, GRPC_INVALID_ARGUMENT, "%s", msg);
    /* Malformed ranges first (the source's size is not known yet). */
    uint64_t size;
    if (capacity_pick(req, lim, 0, pl->p.opts.logical_block_size, &size, &msg) == -EINVAL)
        return verdict_fail(v, GRPC_INVALID_ARGUMENT, "%s", msg);
    Csi__V1__VolumeContentSource *cs = in->volume_content_source;
    if (!cs)
        return true;
    char *sid;
    if (cs->type_case == CSI__V1__VOLUME_CONTENT_SOURCE__TYPE_SNAPSHOT && cs->snapshot) {
        pl->src_type = "snapshot";
        sid = cs->snapshot->snapshot_id;
    } else if (cs->type_case == CSI__V1__VOLUME_CONTENT_SOURCE__TYPE_VOLUME && cs->volume) {
        pl->src_type = "volume";
        sid = cs->volume->volume_id;
    } else {
        return verdict_fail(v, GRPC_INVALID_ARGUMENT, "volume_content_source has no type");
    }
    bool snap = streq(pl->src_type, "snapshot");
    if ((snap ? BACKEND_OF(.snapshot_id = sid) : BACKEND_OF(.volume_id = sid)) != &backend_local)
        return verdict_fail(v, GRPC_INVALID_ARGUMENT,
                            "volume_content_source.%s: %s is an RBD %s: it is the source of RBD "
                            "volumes only (StorageClass parameter backend: rbd)",
                            snap ? "snapshot.snapshot_id" : "volume.volume_id", sid,
                            pl->src_type);
    if (!source_here(c, v, pl->src_type, sid))
        return false;
    pl->src_id = sid;
    if (pl->p.image)
        return verdict_fail(v, GRPC_INVALID_ARGUMENT,
                            "parameter image: a volume of an image class has no "
                            "volume_content_source");
    return true;
}

/* The source's record: ready, not busy, and its QSD up when staged. */
static bool source_ok(struct csi *c, struct create_plan *pl, uint64_t *ret_min)
{
    struct verdict *v = &pl->refusal;
    *ret_min = 0;
    if (!pl->src_type)
        return true;
    if (streq(pl->src_type, "snapshot")) {
        pl->ssrc = store_find_snap(c->store, pl->src_id);
        if (!pl->ssrc || pl->ssrc->phase != PHASE_READY)
            return verdict_fail(v, GRPC_NOT_FOUND, "snapshot %s does not exist", pl->src_id);
        *ret_min = pl->ssrc->size;
        return true;
    }
    pl->src = store_find_vol(c->store, pl->src_id);
    if (!pl->src || pl->src->phase != PHASE_READY)
        return verdict_fail(v, GRPC_NOT_FOUND, "source volume %s does not exist", pl->src_id);
    if (pl->src->busy)
        return verdict_fail(v, GRPC_ABORTED, "an operation on source volume %s is in progress",
                            pl->src_id);
    if (pl->src->staging_path && !vol_live(pl->src))
        return verdict_fail(v, GRPC_UNAVAILABLE,
                            "source volume %s is staged but its QSD is not running (restarting)",
                            pl->src_id);
    *ret_min = pl->src->image_size;
    return true;
}

void create_plan_make(struct csi *c, Csi__V1__CreateVolumeRequest *in, struct create_plan *pl)
{
    *pl = (struct create_plan){.kind = PLAN_REFUSE};
    int64_t req = in->capacity_range ? in->capacity_range->required_bytes : 0;
    int64_t lim = in->capacity_range ? in->capacity_range->limit_bytes : 0;
    if (!request_ok(c, in, pl, req, lim))
        return;
    if (!topology_ok(c, in->accessibility_requirements)) {
        verdict_fail(&pl->refusal, GRPC_RESOURCE_EXHAUSTED,
                     "volumes are node-local: accessibility_requirements.requisite does not "
                     "include %s=%s", c->topo_key, c->cfg->node_id);
        return;
    }
    struct vol *v = store_find_vol(c->store, in->name);
    if (v) {
        if (v->busy || v->phase != PHASE_READY)
            verdict_fail(&pl->refusal, GRPC_ABORTED, "an operation on volume %s is in progress",
                         v->id);
        else if (!vol_matches(v, req, lim, pl))
            verdict_fail(&pl->refusal, GRPC_ALREADY_EXISTS,
                         "volume %s exists with a different capacity, parameters or source",
                         v->id);
        else
            pl->kind = PLAN_DONE, pl->existing = v;
        return;
    }
    uint64_t min_size;
    if (!source_ok(c, pl, &min_size))
        return;
    _cleanup_free_ char *msg = NULL;
    int r = capacity_pick(req, lim, min_size, pl->p.opts.logical_block_size, &pl->size, &msg);
    if (r < 0) {
        verdict_fail(&pl->refusal, r == -ERANGE ? GRPC_OUT_OF_RANGE : GRPC_INVALID_ARGUMENT,
                     "%s", msg);
        return;
    }
    pl->kind = PLAN_ACT;
}

void create_plan_clear(struct create_plan *pl)
{
    verdict_clear(&pl->refusal);
    json_decref(pl->params);
    vol_params_clear(&pl->p);
    *pl = (struct create_plan){0};
}

void snapshot_plan_make(struct csi *c, Csi__V1__CreateSnapshotRequest *in,
                        struct snapshot_plan *pl)
{
    *pl = (struct snapshot_plan){.kind = PLAN_REFUSE};
    struct verdict *v = &pl->refusal;
    const char *why;
    if (!in->name || !*in->name) {
        verdict_fail(v, GRPC_INVALID_ARGUMENT, "name is missing");
        return;
    }
    if (name_validate(in->name, &why) < 0) {
        verdict_fail(v, GRPC_INVALID_ARGUMENT,
                     "name %s (the name becomes the snapshot id: 1-128 bytes of [A-Za-z0-9._-])",
                     why);
        return;
    }
    if (!csi_id_check(c, v, "source_volume_id", in->source_volume_id))
        return;
    struct snap *sn = store_find_snap(c->store, in->name);
    if (sn) {
        if (sn->busy || sn->phase != PHASE_READY)
            verdict_fail(v, GRPC_ABORTED, "an operation on snapshot %s is in progress", sn->id);
        else if (!streq(sn->source, in->source_volume_id))
            verdict_fail(v, GRPC_ALREADY_EXISTS,
                         "snapshot %s exists with a different source volume (%s)", sn->id,
                         sn->source);
        else
            pl->kind = PLAN_DONE, pl->existing = sn;
        return;
    }
    struct vol *src = store_find_vol(c->store, in->source_volume_id);
    if (!src || src->phase != PHASE_READY)
        verdict_fail(v, GRPC_NOT_FOUND, "volume %s does not exist", in->source_volume_id);
    else if (src->busy)
        verdict_fail(v, GRPC_ABORTED, "an operation on volume %s is in progress", src->id);
    else if (src->staging_path && !vol_live(src))
        verdict_fail(v, GRPC_UNAVAILABLE,
                     "volume %s is staged but its QSD is not running (restarting)", src->id);
    else
        pl->kind = PLAN_ACT, pl->src = src;
}

void snapshot_plan_clear(struct snapshot_plan *pl)
{
    verdict_clear(&pl->refusal);
    *pl = (struct snapshot_plan){0};
}

void delete_volume_plan(struct csi *c, Csi__V1__DeleteVolumeRequest *in, struct delete_plan *pl)
{
    *pl = (struct delete_plan){.kind = PLAN_REFUSE};
    struct verdict *v = &pl->refusal;
    if (!csi_id_check(c, v, "volume_id", in->volume_id))
        return;
    struct vol *vol = store_find_vol(c->store, in->volume_id);
    if (!vol)
        pl->kind = PLAN_DONE;
    else if (vol->busy)
        verdict_fail(v, GRPC_ABORTED, "an operation on volume %s is in progress", vol->id);
    else if (vol->n_pubs > 0)
        verdict_fail(v, GRPC_FAILED_PRECONDITION, "volume %s is published at %s: unpublish it first",
                     vol->id, vol->pubs[0].target);
    else if (vol->staging_path)
        /* A guest may still hold its disk: NodeUnstageVolume waits for it
         * to let go, DeleteVolume would not. */
        verdict_fail(v, GRPC_FAILED_PRECONDITION, "volume %s is staged at %s: unstage it first",
                     vol->id, vol->staging_path);
    else
        pl->kind = PLAN_ACT, pl->vol = vol;
}

void delete_snapshot_plan(struct csi *c, Csi__V1__DeleteSnapshotRequest *in,
                          struct delete_plan *pl)
{
    *pl = (struct delete_plan){.kind = PLAN_REFUSE};
    if (!csi_id_check(c, &pl->refusal, "snapshot_id", in->snapshot_id))
        return;
    struct snap *sn = store_find_snap(c->store, in->snapshot_id);
    if (!sn)
        pl->kind = PLAN_DONE;
    else if (sn->busy || sn->readers)
        verdict_fail(&pl->refusal, GRPC_ABORTED, "an operation on snapshot %s is in progress",
                     sn->id);
    else
        pl->kind = PLAN_ACT, pl->snap = sn;
}

void delete_plan_clear(struct delete_plan *pl)
{
    verdict_clear(&pl->refusal);
    *pl = (struct delete_plan){0};
}

/* The volume's logical block size (its parameters), for aligning a new size. */
static unsigned vol_align(const struct vol *v)
{
    struct vol_params p;
    _cleanup_free_ char *msg = NULL;
    if (vol_params_from_json(v->parameters, &p, &msg) < 0)
        return IMAGE_SIZE_ALIGN;
    unsigned align = p.opts.logical_block_size;
    vol_params_clear(&p);
    return align;
}

void expand_plan_make(struct csi *c, Csi__V1__ControllerExpandVolumeRequest *in,
                      struct expand_plan *pl)
{
    *pl = (struct expand_plan){.kind = PLAN_REFUSE};
    struct verdict *v = &pl->refusal;
    const char *why;
    if (!csi_id_check(c, v, "volume_id", in->volume_id))
        return;
    const Csi__V1__CapacityRange *cr = in->capacity_range;
    if (!cr) {
        verdict_fail(v, GRPC_INVALID_ARGUMENT, "capacity_range is missing");
        return;
    }
    if (in->volume_capability && (why = cap_problem(in->volume_capability))) {
        verdict_fail(v, GRPC_INVALID_ARGUMENT, "%s", why);
        return;
    }
    struct vol *vol = store_find_vol(c->store, in->volume_id);
    if (!vol || vol->phase != PHASE_READY) {
        verdict_fail(v, GRPC_NOT_FOUND, "volume %s does not exist", in->volume_id);
        return;
    }
    if (vol->busy) {
        verdict_fail(v, GRPC_ABORTED, "an operation on volume %s is in progress", vol->id);
        return;
    }
    _cleanup_free_ char *msg = NULL;
    int r = capacity_pick(cr->required_bytes, cr->limit_bytes, 0, vol_align(vol), &pl->size, &msg);
    if (r < 0) {
        verdict_fail(v, r == -ERANGE ? GRPC_OUT_OF_RANGE : GRPC_INVALID_ARGUMENT, "%s", msg);
        return;
    }
    if (cr->limit_bytes > 0 && vol->size > (uint64_t)cr->limit_bytes) {
        verdict_fail(v, GRPC_OUT_OF_RANGE,
                     "volume %s is already %" PRIu64 " bytes, above limit_bytes (no shrinking)",
                     vol->id, vol->size);
        return;
    }
    pl->vol = vol;
    if (pl->size <= vol->size) {
        pl->kind = PLAN_DONE;
        pl->size = vol->size;
        pl->node = vol->staging_path && vol->image_size < vol->size;
        return;
    }
    pl->kind = PLAN_ACT;
}

void expand_plan_clear(struct expand_plan *pl)
{
    verdict_clear(&pl->refusal);
    *pl = (struct expand_plan){0};
}
