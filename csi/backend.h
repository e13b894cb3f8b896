/* backend.h: the storage backends of a volume, and the one choice among them.
 *
 * Owns: struct backend, the table of what differs between a volume that is
 * an image in the node's pool (local.c) and one that is an image in a Ceph
 * RBD pool (rbd.c, rbd_snap.c, rbd_lock.c), and backend_of, the only place
 * that tells them apart: from the StorageClass parameters, a volume or
 * snapshot id, or the node's record.  The RPC handlers (controller.c,
 * node.c, service.c, ctlrole.c) validate what every backend shares, choose
 * the backend once and call it. */
#pragma once

#include "csi.pb-c.h"
#include "grpc.h"

#include <stdbool.h>
#include <stddef.h>

struct csi;
struct vol;
struct qsd_opts;
struct op;

struct backend {
    const char *name; /* "local", "rbd" (logs) */
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

    /* An id of a request (volume_id, source_volume_id...) -> the name of
     * the node's record, in place; false when it is not valid here (the
     * call failed: INVALID_ARGUMENT, or NOT_FOUND naming the node holding
     * it).  csi_id_ok's work. */
    bool (*record_name)(struct csi *c, struct grpc_call *call, const char *field, char *id);
    /* NodeStageVolume of a volume the node has no record of yet (or an
     * unstaged, idle one): prepare and make the record, then go on as
     * node_stage_new.  NULL: the record must exist (NOT_FOUND). */
    void (*stage_prepare)(struct csi *c, struct grpc_call *call,
                          Csi__V1__NodeStageVolumeRequest *in, int gid, bool ro);
    /* The QSD of a NodeStageVolume (op->vol) started: true when the
     * backend checks it before the call is answered (and answers it). */
    bool (*stage_confirm)(struct op *op);
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
    /* v was unstaged: its QSD is gone, the record about to be dropped
     * (record_staged_only) or saved. */
    void (*unstaged)(struct vol *v);
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
