/* service.h: what the Controller and Node services share.
 *
 * Owns: struct csi (configuration, loop, record store and state, pool, the
 * QSD of every staged volume), the in-flight operations (struct op: one per
 * asynchronous RPC, holding the call and the busy flags of the records it
 * works on; its worker fsyncs pending records first), holding every answer
 * until the records are durable (csi_hold_answers), the
 * decoding of every request (CSI_HANDLER: NUL and size checks first), the
 * ids the CO sees (csi_id_*: "<name>@<node>"), the volume-capability
 * rules, a staged volume's QSD (export options, start, events), and
 * start-up recovery (finish or undo half-done records, adopt or restart
 * the QSDs of staged volumes, stop the QSDs of unstaged ones).  Made and
 * unmade by startup.h. */
#pragma once

#include "csi.pb-c.h"
#include "grpc.h"
#include "qsd/base/cgroup.h"
#include "qsd/qemu/image.h"
#include "plugin.h"
#include "qsd/qemu/qsd.h"
#include "qsd/state/state.h"
#include "verdict.h"
#include "qsd/base/worker.h"

#include <stdbool.h>
#include <stdint.h>

struct op;
struct bridges;
struct rbd_req;
struct csi {
    const struct plugin_config *cfg;
    struct loop *loop;
    struct records *records; /* the record store's writer (records.h) */
    struct store *store;
    struct pool pool;
    struct qsd_config qcfg;
    char *topo_key;        /* "<driver-name>/node" */
    struct op *ops;        /* in flight */
    struct bridges *bridges; /* hot-plug bridges and requests (bridge.h) */
    struct worker *gc;     /* removal of unused layers in flight (csi_gc) */
    bool gc_again;         /* another removal asked for meanwhile */
    int kubelet_fd;        /* O_PATH of the kubelet root (mounts.h) */
    struct tracked *tracked; /* mounts made since start (mounts.c) */
    size_t n_tracked;
    struct qsd_cgroup cgroup; /* where QSDs run (--qsd-cgroup), joined at spawn */
    const char *qsd_hidden[3]; /* paths hidden from QSDs (qsd_config.hidden) */
    struct loop_timer *log_timer; /* bounds the QSDs' logs (qsd_log_trim) */
    struct volstats *vstats; /* health and I/O figures, cached (volstats.h; set by main) */
};

/* One asynchronous RPC.  Records named here are busy (snap_read: read) until
 * op_end(). */
struct op {
    struct csi *csi;
    struct grpc_call *call;
    struct worker *worker;
    worker_fn fn;          /* what the worker runs, after records_flush_pending */
    struct qmp *qmp;
    struct vol *vol, *vol2;
    struct snap *snap;
    struct snap *snap_read; /* read by the operation: its readers count */
    /* per-operation data */
    uint64_t size;
    bool live;             /* the source is read through its QSD (snapshot, clone) */
    bool repair;           /* a stage that restarts the QSD of a staged volume */
    bool qmp_failed;       /* its monitor connection failed (NodeExpandVolume) */
    char *node;            /* the QSD's exported node (NodeExpandVolume) */
    char *image;           /* image class: sha256 of the base it needs (imageclass.h) */
    char *vol_id;          /* a volume looked up again when done, not held busy (stats) */
    struct rbd_req *rbd;   /* RBD backend: the request, credentials included (rbd.h) */
    void (*rbd_free)(struct rbd_req *); /* frees rbd (rbd_req_free; op_end) */
    bool image_lead;       /* its worker may download the base; others wait for it */
    struct op *next;
};

/* srv answers no RPC before the record changes made until then are durable
 * (grpc_server_set_barrier on the record store). */
void csi_hold_answers(struct csi *c, struct grpc_server *srv);
/* Start-up recovery (csi_new, startup.h): finish or undo half-done
 * records, adopt or restart the QSDs of staged volumes, stop the QSDs of
 * unstaged ones. */
void csi_recover(struct csi *c);

struct op *op_begin(struct csi *c, struct grpc_call *call);
/* Release busy flags, unlink and free.  The call must have been completed. */
void op_end(struct op *op);
/* Run fn in a worker; done runs on the loop.  The child first makes every
 * record change made so far durable (records_flush_pending), so a record is
 * on disk before the image it describes is touched.  At most CSI_MAX_WORKERS at a
 * time (RESOURCE_EXHAUSTED beyond).  On failure, the call is failed and the
 * op ended (returns < 0). */
#define CSI_MAX_WORKERS 16
int op_worker(struct op *op, worker_fn fn, uint64_t timeout_ms, worker_done done);

/* Remove the pool's layers nothing references any more (thin.h pool_gc),
 * in a worker; runs again once if asked while running.  After every
 * deletion and at start. */
void csi_gc(struct csi *c);
/* Remove a volume's export and control directories (qsd_remove_runtime),
 * logging a failure. */
void csi_remove_runtime(struct csi *c, const char *id);

/* Decode a request.  Undecodable bytes, or a string field with a NUL byte
 * (pbcheck.h), fail the call with INVALID_ARGUMENT naming the field, and
 * NULL is returned. */
ProtobufCMessage *csi_request_unpack(struct grpc_call *call, const ProtobufCMessageDescriptor *d,
                                     const uint8_t *req, size_t len);

/* The gRPC handler of one RPC: decode, impl(c, call, in), free.  The
 * method's opaque is the struct csi. */
#define CSI_HANDLER(fname, impl, Type, type)                                                   \
    static void fname(struct grpc_call *call, const uint8_t *req, size_t len, void *opaque)  \
    {                                                                                       \
        Type *in = (Type *)csi_request_unpack(call, &type##__descriptor, req, len);          \
        if (!in)                                                                            \
            return;                                                                         \
        impl(opaque, call, in);                                                             \
        protobuf_c_message_free_unpacked(&in->base, NULL);                                  \
    }

/* Validate an id field: non-empty and valid per names.h.  On failure the
 * call is failed (id_ok) or v filled (id_check) with INVALID_ARGUMENT and
 * false returned.  The *_check forms below decide the same way without a
 * call (verdict.h). */
bool id_ok(struct grpc_call *call, const char *field, const char *id);
bool id_check(struct verdict *v, const char *field, const char *id);

/* Volume and snapshot ids as the CO sees them carry the node that holds
 * them ("<name>@<node id>": both are node-local, so a node handed another
 * node's id can say where it lives); plain names, as issued before, and ids
 * that would pass CSI's 128 bytes are this node's.  csi_id_out gives the
 * CO's form of a record's name (in buf); csi_id_node the node an id names
 * when it is another one (pointer into id), else NULL; csi_id_ok validates
 * like id_ok and cuts this node's suffix off in place (id is then the
 * record's name), failing another node's id with NOT_FOUND naming it. */
#define CSI_ID_MAX 128
const char *csi_id_out(const struct csi *c, const char *name, char buf[CSI_ID_MAX + 1]);
const char *csi_id_node(const struct csi *c, const char *id);
bool csi_id_ok(struct csi *c, struct grpc_call *call, const char *field, char *id);
bool csi_id_check(struct csi *c, struct verdict *v, const char *field, char *id);

/* NULL when the capability is supported, else why (INVALID_ARGUMENT). */
const char *cap_problem(const Csi__V1__VolumeCapability *cap);
/* CreateVolume's volume_capabilities: present and each supported; else
 * the call is failed with INVALID_ARGUMENT naming the entry. */
bool caps_ok(struct grpc_call *call, size_t n, Csi__V1__VolumeCapability **caps);
bool caps_check(struct verdict *v, size_t n, Csi__V1__VolumeCapability **caps);
bool cap_read_only(const Csi__V1__VolumeCapability *cap);
/* volume_mount_group -> gid (-1 when empty); -EINVAL if not a number. */
int cap_group(const Csi__V1__VolumeCapability *cap, int *ret_gid);

/* Export options for a volume from its StorageClass parameters (a JSON
 * object of strings), image and format (both taken over, freed on error),
 * and staging flags: what every QSD the plugin starts runs with. */
int export_opts_from(json_t *parameters, char *image, char *format, bool read_only, int gid,
                     struct qsd_opts *ret, char **ret_msg);
/* Export options for a volume (its parameters, image, staging flags). */
int vol_export_opts(struct csi *c, const struct vol *v, struct qsd_opts *ret, char **ret_msg);
/* Parse StorageClass parameters kept as a JSON object of strings (params.h). */
struct vol_params;
int vol_params_from_json(json_t *params, struct vol_params *ret, char **ret_msg);
/* Start the QSD of a staged volume; done(status, msg) on the loop. */
typedef void (*vol_started_fn)(struct csi *c, struct vol *v, int status, const char *msg,
                               void *opaque);
int vol_qsd_start(struct csi *c, struct vol *v, vol_started_fn done, void *opaque, char **ret_msg);
bool vol_live(const struct vol *v);


/* Answer ControllerGetCapabilities with these RPC capabilities (at most 16). */
void reply_controller_caps(struct grpc_call *call,
                           const Csi__V1__ControllerServiceCapability__RPC__Type *types, size_t n);
const struct grpc_method *controller_methods(struct csi *c, size_t *ret_n);
const struct grpc_method *node_methods(struct csi *c, size_t *ret_n);
