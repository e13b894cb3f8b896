/* SPDX-License-Identifier: Apache-2.0 */
/* rbd_backend.c: the RBD backend's table (backend.h): what it claims (the
 * StorageClass parameter backend: rbd, "rbd:" and "rbdsnap:" ids, the
 * records of staged RBD volumes), its RPCs (rbd.c, rbd_snap.c, rbd_qos.c), the node's
 * record name of an id and the id of a record, and the restarts of its QSDs after the rule
 * (rbd_guard.h). */
#include "backend.h"
#include "rbd.h"
#include "rbd_guard.h"
#include "service.h"
#include "qsd/base/util.h"
#include "op.h"

/* The record, when given, decides; else any key naming RBD. */
static bool claims(const struct backend_key *k)
{
    if (k->record)
        return rbd_record(k->record);
    return (k->params && rbd_selected(k->n_params, k->params)) || rbd_is_id(k->volume_id) ||
           rbd_is_snap_id(k->snapshot_id) || rbd_is_name(k->record_name);
}

/* An RBD volume id: the node's record of it has a name made from the id. */
static bool record_name(struct csi *c, struct verdict *v, const char *field, char *id)
{
    (void)c;
    struct rbd_loc l;
    _cleanup_free_ char *m = NULL;
    if (rbd_id_parse(id, field, &l, &m) < 0)
        return verdict_fail(v, GRPC_INVALID_ARGUMENT, "%s", m);
    rbd_loc_clear(&l);
    rbd_id_to_name(id);
    return true;
}

/* The id of a record: rbd_id_to_name reversed (the parts of an id never
 * contain '_'). */
static char *volume_handle(const struct csi *c, const struct vol *v)
{
    (void)c;
    char *id = xstrdup(v->id);
    for (char *p = id; *p; p++)
        if (*p == '_')
            *p = ':';
    return id;
}

/* The first NodeStageVolume of a volume (its request in *rbd): checked
 * again now that its QSD runs with a watch of its own (rbd_guard.h); the
 * request becomes the op's context. */
static bool stage_confirm(struct op *op, struct rbd_req **rbd)
{
    if (!*rbd)
        return false;
    op_set_ctx(op, &rbd_req_ctx, TAKE_PTR(*rbd));
    rbd_stage_confirm(op);
    return true;
}

/* Changed-block tracking of RBD snapshots (rbd diff) is not built. */
static void snapshot_metadata(struct csi *c, struct grpc_call *call, const struct snapmeta_req *r)
{
    (void)c;
    grpc_call_fail(call, GRPC_UNIMPLEMENTED,
                   "SnapshotMetadata is not built for RBD snapshots yet (%s %s)", r->target_field,
                   r->target_id);
}

/* The restart guard of v (rbd_lock.h) goes. */
static void forget(struct vol *v)
{
    rbd_guard_free(v);
}

/* Group snapshots of RBD volumes are not built: the GroupController
 * service is the node plugin's, for its node's volumes (group.c). */
static void group_unimplemented(struct grpc_call *call)
{
    grpc_call_fail(call, GRPC_UNIMPLEMENTED,
                   "group snapshots are built for local volumes only, not for RBD volumes");
}

static void create_group(struct csi *c, struct grpc_call *call,
                         Csi__V1__CreateVolumeGroupSnapshotRequest *in)
{
    (void)c, (void)in;
    group_unimplemented(call);
}

static void delete_group(struct csi *c, struct grpc_call *call,
                         Csi__V1__DeleteVolumeGroupSnapshotRequest *in)
{
    (void)c, (void)in;
    group_unimplemented(call);
}

static void get_group(struct csi *c, struct grpc_call *call, Csi__V1__GetVolumeGroupSnapshotRequest *in)
{
    (void)c, (void)in;
    group_unimplemented(call);
}

const struct backend backend_rbd = {
    .name = "rbd",
    .claims = claims,
    .in_pool = false,
    .central = true,
    .supervised = false, /* rbd_restart, after the check (rbd_guard.h) */
    .record_staged_only = true,
    .create_volume = rbd_create_volume,
    .delete_volume = rbd_delete_volume,
    .expand_volume = rbd_expand_volume,
    .get_capacity = rbd_get_capacity,
    .create_snapshot = rbd_create_snapshot,
    .delete_snapshot = rbd_delete_snapshot,
    .list_snapshots = rbd_list_snapshots,
    .get_snapshot = NULL, /* ListSnapshots with snapshot_id answers it */
    .modify_volume = rbd_modify_volume,
    .snapshot_metadata = snapshot_metadata,
    .create_group_snapshot = create_group,
    .delete_group_snapshot = delete_group,
    .get_group_snapshot = get_group,
    .record_name = record_name,
    .volume_handle = volume_handle,
    .stage_prepare = rbd_stage,
    .stage_confirm = stage_confirm,
    .export_opts = rbd_export_opts,
    .restart = rbd_restart,
    .adopted = rbd_adopted,
    .refused = rbd_guard_refused,
    .forget = forget,
};
