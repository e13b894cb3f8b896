/* SPDX-License-Identifier: Apache-2.0 */
/* rbd_int.h: what rbd.c (volumes) and rbd_snap.c (snapshots, clones) share:
 * the request a worker runs, the pure plans that make it from a controller
 * RPC's request, the worker's connection to the cluster, the image mark and
 * the loop-side start of a request.  Not for other files (but the plans'
 * unit test, tests/unit/test_rbd_plan.c). */
#pragma once

#include "op.h"
#include "rbd.h"
#include "verdict.h"
#include "qsd/base/worker.h"

#include <rados/librados.h>
#include <rbd/librbd.h>

#define RBD_WORKER_MS (60ull * 1000)  /* the whole operation */
#define RBD_META_KEY "qsd-csi.volume" /* image metadata: the volume name (ours) */
#define RBD_FEATURES (RBD_FEATURE_LAYERING | RBD_FEATURE_EXCLUSIVE_LOCK | RBD_FEATURE_OBJECT_MAP | \
                      RBD_FEATURE_FAST_DIFF | RBD_FEATURE_DEEP_FLATTEN)

struct rbd_req {
    struct rbd_loc loc;
    struct rbd_cred cred;
    const char *clusters; /* the cluster file (plugin configuration) */
    int64_t required, limit;
    uint64_t size;        /* CreateVolume: to create; ControllerExpandVolume: to grow to */
    char *name;           /* NodeStage: the record's name, staging path, group, mode;
                             CreateSnapshot: the snapshot's name */
    char *path;
    int gid;
    bool ro;
    struct rbd_loc src;   /* CreateVolume from a source: the source volume or
                             snapshot (image = its name) */
    bool src_snap;        /* the source is a snapshot */
    stage_new_fn then;    /* NodeStage: how it goes on once the record is made */
    const char *node;     /* NodeStage: this node's id (rbd_qos.c's mark) */
    json_t *mparams;      /* CreateVolume: the limits to record (NULL: none);
                             ControllerModifyVolume: the request's entries
                             as they came (key -> value), merged in the worker */
    uint8_t *packed;      /* ControllerModifyVolume: the request, packed again
                             for the node serving the volume */
    size_t packed_len;
};

struct conn {
    rados_t cluster;
    rados_ioctx_t io;
    int saved_stderr; /* librados prints some errors to stderr whatever its
                         settings: the plugin's log is logfmt, so they go to
                         /dev/null while connected (-1: not redirected) */
};

/* Worker side (rbd.c). */
int conn_open(const struct rbd_req *q, struct conn *k, char **ret_msg);
void conn_close(struct conn *k);
int image_ours(rbd_image_t img, const char *name, uint64_t *ret_size);
/* Connect and open the image of q, a volume of ours, and read its size;
 * read-only (ro) adds no watch.  -ENODEV (NOT_FOUND): no such pool or
 * image, or not ours.  On success k and *img are open. */
int open_volume(const struct rbd_req *q, bool ro, struct conn *k, rbd_image_t *img,
                uint64_t *ret_size, char **ret_msg);
/* Remove image name (no other client has it open): its snapshots first;
 * while clones still need them, the image goes to the RBD trash instead,
 * and leaves it with the last of them (rbd_snap.c). */
int rbd_image_remove(rados_ioctx_t io, const char *name, char **ret_msg);

/* The request of op (its context), or NULL for an op of another kind. */
static inline struct rbd_req *rbd_req_of(const struct op *op)
{
    return op_ctx(op, &rbd_req_ctx);
}

/* The pure core of an RBD controller RPC (as local_plan.h's for the local
 * backend): the request's fields checked and parsed into the worker's
 * request, or a refusal (INVALID_ARGUMENT naming the field, OUT_OF_RANGE
 * for a size, ABORTED for a list token not ours).  Nothing is asked of the
 * cluster: that is the worker's, whose errors rbd_code maps. */
struct rbd_plan {
    enum plan_kind kind;    /* PLAN_REFUSE or PLAN_ACT */
    struct verdict refusal;
    struct rbd_req *q;      /* PLAN_ACT: the worker's request (owned until taken) */
    uint64_t size;          /* CreateVolume, ControllerExpandVolume: the size wanted */
};
/* rbd.c */
void rbd_create_plan(Csi__V1__CreateVolumeRequest *in, struct rbd_plan *pl);
void rbd_delete_plan(Csi__V1__DeleteVolumeRequest *in, struct rbd_plan *pl);
void rbd_expand_plan(Csi__V1__ControllerExpandVolumeRequest *in, struct rbd_plan *pl);
void rbd_plan_clear(struct rbd_plan *pl);
/* rbd_snap.c: CreateVolume's content source, parsed into q->src (in q->loc's
 * cluster, pool and namespace); the snapshot RPCs. */
bool rbd_clone_check(const Csi__V1__VolumeContentSource *cs, struct rbd_req *q,
                     struct verdict *v);
void rbd_snapshot_plan(Csi__V1__CreateSnapshotRequest *in, struct rbd_plan *pl);
void rbd_delete_snapshot_plan(Csi__V1__DeleteSnapshotRequest *in, struct rbd_plan *pl);
void rbd_list_plan(Csi__V1__ListSnapshotsRequest *in, struct rbd_plan *pl);

/* Image metadata of the limits (rbd_qos.c, docs/rbd.md "Limits"): worker
 * side.  The image's limits (NULL: none); -EUCLEAN with a message when
 * the value is not one this plugin writes (too long, not JSON, a key or
 * value qos.h refuses): the metadata is anyone's with write access to the
 * pool, so it is read bounded and checked. */
int rbd_qos_read(rbd_image_t img, json_t **ret, char **ret_msg);
/* Record params (NULL or empty: the key removed) as img's limits. */
int rbd_qos_write(rbd_image_t img, json_t *params, char **ret_msg);
/* The refusal of a stage for invalid limits (the message of rbd_qos_read
 * in *msg, completed with the way out): -EUCLEAN. */
int rbd_qos_refusal(const struct rbd_req *q, char **msg);
/* NodeStage, once the check after its QSD's start passed: this node's id
 * recorded in the image (RBD_NODE_META, so that ControllerModifyVolume
 * finds it), then the limits read again into *ret (NULL: none, or invalid:
 * then *ret_warn says why, as for any failure here; the QSD keeps the
 * limits it started with).  0, or < 0 with *ret_warn. */
int rbd_stage_mark(const struct rbd_req *q, json_t **ret, char **ret_warn);

/* Loop side (rbd.c). */
enum grpc_code rbd_code(int status);
/* Run fn in a worker for call, with q (owned, its size set) as the op's
 * context (rbd_req_ctx). */
void rbd_start(struct csi *c, struct grpc_call *call, struct rbd_req *q, uint64_t size,
               worker_fn fn, worker_done done);
/* Act on pl: send its refusal, or run fn with its request (rbd_start);
 * pl is cleared. */
void rbd_plan_run(struct csi *c, struct grpc_call *call, struct rbd_plan *pl, uint64_t size,
                  worker_fn fn, worker_done done);
/* Replies a CreateVolumeRequest from a {"size": N} result. */
void rbd_create_done(int status, const char *msg, json_t *result, void *opaque);
/* CreateVolume with a volume_content_source (rbd_snap.c); q holds the
 * parsed location, credentials, range and source (rbd_create_plan). */
void rbd_clone_volume(struct csi *c, struct grpc_call *call, Csi__V1__CreateVolumeRequest *in,
                      struct rbd_req *q);
