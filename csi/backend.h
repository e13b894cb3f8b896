/* SPDX-License-Identifier: Apache-2.0 */
/* backend.h: the storage backends of a volume, and the one choice among them.
 *
 * Owns: struct backend, the table of what differs between a volume that is
 * an image in the node's pool (local.c) and one that is an image in a Ceph
 * RBD pool (rbd_backend.c, over rbd.c, rbd_snap.c and rbd_guard.c), and
 * backend_of, the one dispatch: from the StorageClass parameters, a volume
 * or snapshot id, or the node's record, the backend that claims it (local
 * the rest).  The RPC handlers (controller.c, node.c, service.c,
 * ctlrole.c, group.c, and the capacity figures) choose the backend once and call
 * it; none tests what backend a volume is.  This header includes no other
 * csi/ module's: the backends depend on it, not it on them. */
#pragma once

#include "csi.pb-c.h"
#include "grpc.h"
#include "verdict.h"

#include <stdbool.h>
#include <stddef.h>

struct csi;
struct vol;
struct qsd_opts;
struct op;
struct backend_key;
struct rbd_req;

/* NodeStageVolume of volume v, not staged yet, at path (node.c): checks,
 * records the staging, starts its QSD, answers call.  rbd (taken over, or
 * NULL): an RBD volume's request, checked again once its QSD runs
 * (stage_confirm).  What a backend's stage_prepare goes on with. */
typedef void (*stage_new_fn)(struct csi *c, struct grpc_call *call, struct vol *v,
                             const char *path, int gid, bool ro, struct rbd_req *rbd);

/* A SnapshotMetadata request (snapmeta.c checked its fields): the blocks
 * allocated in target (base NULL: GetMetadataAllocated), or changed from
 * base to target (GetMetadataDelta).  Ids as the request has them; field
 * names for the errors. */
struct snapmeta_req {
    const char *base_id, *base_field;
    const char *target_id, *target_field;
    int64_t starting_offset;
    int32_t max_results;
};

struct backend {
    const char *name; /* "local", "rbd" (logs) */
    /* Whether key names one of its volumes or snapshots (backend_of asks
     * every backend but the local one, which has the rest). */
    bool (*claims)(const struct backend_key *k);
    /* Its volumes are images in the node's pool: ListVolumes lists their
     * records, the capacity policy counts their sizes (capacity.h). */
    bool in_pool;
    /* Its controller RPCs are the plugin's wherever it runs (the controller
     * role serves them: ctlrole.c), not only the volume's node's. */
    bool central;
    /* A staged volume's QSD is restarted by qsd.c's supervisor; when false,
     * by restart() below. */
    bool supervised;
    /* The node's record of a volume lives only while it is staged
     * (NodeUnstageVolume removes it, after unstaged()). */
    bool record_staged_only;

    /* Controller RPCs (the request's backend decided by backend_of). */
    void (*create_volume)(struct csi *c, struct grpc_call *call, Csi__V1__CreateVolumeRequest *in);
    void (*delete_volume)(struct csi *c, struct grpc_call *call, Csi__V1__DeleteVolumeRequest *in);
    void (*expand_volume)(struct csi *c, struct grpc_call *call,
                          Csi__V1__ControllerExpandVolumeRequest *in);
    void (*get_capacity)(struct csi *c, struct grpc_call *call, Csi__V1__GetCapacityRequest *in);
    void (*create_snapshot)(struct csi *c, struct grpc_call *call,
                            Csi__V1__CreateSnapshotRequest *in);
    void (*delete_snapshot)(struct csi *c, struct grpc_call *call,
                            Csi__V1__DeleteSnapshotRequest *in);
    void (*list_snapshots)(struct csi *c, struct grpc_call *call, Csi__V1__ListSnapshotsRequest *in);
    /* GetSnapshot (snapshot_id present: controller.c checked); NULL: not
     * served for this backend's snapshots (UNIMPLEMENTED). */
    void (*get_snapshot)(struct csi *c, struct grpc_call *call, Csi__V1__GetSnapshotRequest *in);
    void (*modify_volume)(struct csi *c, struct grpc_call *call,
                          Csi__V1__ControllerModifyVolumeRequest *in);
    /* SnapshotMetadata (the backend of target_id decides): streams the
     * answer on call, or fails it. */
    void (*snapshot_metadata)(struct csi *c, struct grpc_call *call, const struct snapmeta_req *r);
    /* GroupController RPCs (group.c: the backend of the first source
     * volume, or of the group id).  Requests are checked for what is the
     * same for every backend (names present, no duplicate, no other
     * node's volume) before. */
    void (*create_group_snapshot)(struct csi *c, struct grpc_call *call,
                                  Csi__V1__CreateVolumeGroupSnapshotRequest *in);
    void (*delete_group_snapshot)(struct csi *c, struct grpc_call *call,
                                  Csi__V1__DeleteVolumeGroupSnapshotRequest *in);
    void (*get_group_snapshot)(struct csi *c, struct grpc_call *call,
                               Csi__V1__GetVolumeGroupSnapshotRequest *in);

    /* An id of a request (volume_id, source_volume_id...) -> the name of
     * the node's record, in place; false when it is not valid here (v
     * says why: INVALID_ARGUMENT, or NOT_FOUND naming the node holding
     * it).  csi_id_check's work. */
    bool (*record_name)(struct csi *c, struct verdict *v, const char *field, char *id);
    /* record_name reversed: the volume id the CO has for record v (the
     * volume handle of its PV), malloc'd.  The metrics' volume_handle. */
    char *(*volume_handle)(const struct csi *c, const struct vol *v);
    /* NodeStageVolume of a volume the node has no record of yet (or an
     * unstaged, idle one): prepare and make the record, then go on with
     * then.  NULL: the record must exist (NOT_FOUND). */
    void (*stage_prepare)(struct csi *c, struct grpc_call *call,
                          Csi__V1__NodeStageVolumeRequest *in, int gid, bool ro,
                          stage_new_fn then);
    /* The QSD of a NodeStageVolume (op->vol) started: true when the
     * backend checks it before the call is answered (and answers it).
     * *rbd: the request its stage_prepare handed on (stage_new_fn), or
     * NULL; taken (*rbd = NULL) when the backend checks, and the op's
     * context is then the backend's. */
    bool (*stage_confirm)(struct op *op, struct rbd_req **rbd);
    /* The options of the QSD that serves record v. */
    int (*export_opts)(struct csi *c, const struct vol *v, struct qsd_opts *ret, char **ret_msg);
    /* Not supervised (above): start the QSD of staged v again, after the
     * backend's checks (its death, not found at plugin start, a
     * NodeStageVolume finding it gone). */
    void (*restart)(struct csi *c, struct vol *v);
    /* The QSD of staged v was adopted at plugin start. */
    void (*adopted)(struct csi *c, struct vol *v);
    /* Why staged v is not served (a refused restart), or NULL. */
    const char *(*refused)(const struct vol *v);
    /* The plugin lets go of v: unstaged (its QSD gone, the record about to
     * be dropped when record_staged_only, else saved) or shutting down. */
    void (*forget)(struct vol *v);
};

extern const struct backend backend_local; /* local.c */
extern const struct backend backend_rbd;   /* rbd.c */

/* What a request or record says about its backend; fields not set are
 * NULL.  A record, when given, decides; else any key naming RBD does
 * (StorageClass parameter backend: rbd, an "rbd:" volume id, an
 * "rbdsnap:" snapshot id, a record name made from an RBD id). */
struct backend_key {
    size_t n_params;
    Csi__V1__CreateVolumeRequest__ParametersEntry **params;
    const char *volume_id;
    const char *snapshot_id;
    const char *record_name;
    const struct vol *record;
};

/* The backend: the one dispatch. */
const struct backend *backend_of(const struct backend_key *k);
#define BACKEND_OF(...) backend_of(&(struct backend_key){__VA_ARGS__})
