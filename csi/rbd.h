/* SPDX-License-Identifier: Apache-2.0 */
/* rbd.h: the RBD backend, controller side (docs/rbd.md).
 *
 * Owns: the StorageClass parameters of an RBD volume (backend: rbd,
 * clusterID, pool, radosNamespace), the RBD volume id
 * ("rbd:<clusterID>:<pool>:<namespace>:<image>": the id alone locates the
 * image, the plugin keeps no record of it), the cluster file mapping
 * cluster ids to monitors (--rbd-clusters), the credentials taken from an
 * RPC's secrets (userID, userKey: kept in memory only, wiped after use,
 * never logged), CreateVolume/DeleteVolume/ControllerExpandVolume of
 * RBD images, GetCapacity for RBD parameters, and the node's record of a
 * staged RBD volume, through librados/librbd's C API in a worker process
 * (worker.h), each bounded.
 * Snapshots and clones: rbd_snap.c (declared here too). */
#pragma once

#include "backend.h"
#include "csi.pb-c.h"
#include "grpc.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#define RBD_ID_PREFIX "rbd:"
#define RBD_USER_KEY "userID"   /* the secrets' keys (ceph-csi's spelling) */
#define RBD_KEY_KEY "userKey"

struct csi;

/* The parts of an RBD volume id (each a name per names.h; ns may be ""). */
struct rbd_loc {
    char *cluster, *pool, *ns, *image;
};
void rbd_loc_clear(struct rbd_loc *l);
/* Parse id; -EINVAL with *ret_msg naming field when it is no RBD id. */
int rbd_id_parse(const char *id, const char *field, struct rbd_loc *ret, char **ret_msg);
/* The id of l (malloc'd); NULL when it would pass CSI's 128 bytes. */
char *rbd_id_format(const struct rbd_loc *l);
/* Whether id is an RBD volume id (by its prefix). */
bool rbd_is_id(const char *id);
/* The node keeps a record of a staged RBD volume under a name made from
 * its id, ':' -> '_' (parts never contain '_'), in place: same length.
 * Local volume names never start with RBD_NAME_PREFIX (CreateVolume). */
#define RBD_NAME_PREFIX "rbd_"
void rbd_id_to_name(char *id);
bool rbd_is_name(const char *name);

/* Whether StorageClass parameters select this backend (backend=rbd). */
bool rbd_selected(size_t n, Csi__V1__CreateVolumeRequest__ParametersEntry **p);
/* The location a CreateVolume of name with these parameters makes;
 * -EINVAL with *ret_msg naming the parameter. */
int rbd_params_parse(size_t n, Csi__V1__CreateVolumeRequest__ParametersEntry **p,
                     const char *name, struct rbd_loc *ret, char **ret_msg);

/* The monitors ("host:port,host:port") of cluster in the cluster file
 * (JSON: [{"clusterID": "...", "monitors": ["host:port", ...]}, ...]);
 * -ENOENT when the file does not name it, with *ret_msg. */
int rbd_cluster_monitors(const char *file, const char *cluster, char **ret, char **ret_msg);

/* Credentials from secrets; -EINVAL with *ret_msg naming the missing or
 * malformed key (never its value). */
struct rbd_cred {
    char *user, *key;
};
int rbd_cred_parse(size_t n, Csi__V1__CreateVolumeRequest__SecretsEntry **s, const char *which,
                   struct rbd_cred *ret, char **ret_msg);
/* The same for the secrets of any request `in` (each request type has its
 * own SecretsEntry type, all with key and value). */
#define RBD_CRED_OF(in, which, ret, ret_msg)                                        \
    ({                                                                              \
        const char *user_ = NULL, *key_ = NULL;                                     \
        for (size_t i_ = 0; i_ < (in)->n_secrets; i_++)                             \
            rbd_secret_pick((in)->secrets[i_]->key, (in)->secrets[i_]->value, &user_, \
                            &key_);                                                 \
        rbd_cred_check(user_, key_, which, ret, ret_msg);                           \
    })
void rbd_secret_pick(const char *name, const char *value, const char **user, const char **key);
int rbd_cred_check(const char *user, const char *key, const char *which, struct rbd_cred *ret,
                   char **ret_msg);
void rbd_cred_clear(struct rbd_cred *c); /* wipes the key */

/* The RPCs for an RBD volume (backend_rbd's operations: backend.h). */
void rbd_create_volume(struct csi *c, struct grpc_call *call, Csi__V1__CreateVolumeRequest *in);
void rbd_delete_volume(struct csi *c, struct grpc_call *call, Csi__V1__DeleteVolumeRequest *in);
void rbd_expand_volume(struct csi *c, struct grpc_call *call,
                       Csi__V1__ControllerExpandVolumeRequest *in);
/* ControllerModifyVolume of an RBD volume (rbd_qos.c): the limits in the
 * image's metadata, then on the QSD of the node serving it. */
void rbd_modify_volume(struct csi *c, struct grpc_call *call,
                       Csi__V1__ControllerModifyVolumeRequest *in);
/* GetCapacity with backend: rbd parameters (no secrets: the cluster is not
 * asked; docs/rbd.md). */
void rbd_get_capacity(struct csi *c, struct grpc_call *call, Csi__V1__GetCapacityRequest *in);

/* Snapshots (rbd_snap.c): ids "rbdsnap:<clusterID>:<pool>:<namespace>:<name>". */
#define RBD_SNAP_ID_PREFIX "rbdsnap:"
bool rbd_is_snap_id(const char *id);
void rbd_create_snapshot(struct csi *c, struct grpc_call *call, Csi__V1__CreateSnapshotRequest *in);
void rbd_delete_snapshot(struct csi *c, struct grpc_call *call, Csi__V1__DeleteSnapshotRequest *in);
/* ListSnapshots filtered by an RBD snapshot id or an RBD source volume id. */
void rbd_list_snapshots(struct csi *c, struct grpc_call *call, Csi__V1__ListSnapshotsRequest *in);

/* NodeStageVolume of an RBD volume (id already a record name) not staged
 * here: in a worker, connect with the node-stage secret and check the image
 * (ours, its size, no other live client: rbd_lock.h), then make the
 * node's record and the private key file, and go on as for any volume
 * (then: node.c's node_stage_new, which checks again once the QSD runs). */
struct Csi__V1__NodeStageVolumeRequest;
void rbd_stage(struct csi *c, struct grpc_call *call, Csi__V1__NodeStageVolumeRequest *in,
               int gid, bool ro, stage_new_fn then);
/* Export options of a staged RBD volume's record (vol_export_opts). */
struct vol;
struct qsd_opts;
bool rbd_record(const struct vol *v);
int rbd_export_opts(struct csi *c, const struct vol *v, struct qsd_opts *ret, char **ret_msg);

/* Worker of rbd_stage_confirm (rbd_guard.h): the image of op's request
 * (rbd_req_ctx) may be served by the QSD this node just started. */
int rbd_confirm_fn(void *arg, char **ret_msg, json_t **ret_result);
/* The check of a staged volume's record for its restarts (rbd_guard.c):
 * own, fresh and dead as rbd_lock_claim's; the key is read from the
 * record's key file in the worker.  NULL if the record's name is no RBD
 * id. */
struct rbd_check;
struct rbd_check *rbd_check_new(struct csi *c, const struct vol *v, size_t own, bool fresh,
                                const char *dead);
void rbd_check_free(struct rbd_check *k);
int rbd_check_fn(void *arg, char **ret_msg, json_t **ret_result);
/* errno of a worker -> gRPC code. */
enum grpc_code rbd_code(int status);

/* A request's data while its worker runs: the context of its op (op.h),
 * of type rbd_req_ctx (op_end frees it with rbd_req_free). */
struct rbd_req;
struct op_ctx_type;
void rbd_req_free(struct rbd_req *r);
extern const struct op_ctx_type rbd_req_ctx;
