/* SPDX-License-Identifier: Apache-2.0 */
/* snapmeta.c: the SnapshotMetadata service (snapmeta.h).
 *
 * The handlers check the request's fields (each error names its field),
 * refuse another node's snapshot with UNAVAILABLE naming that node, and
 * hand the request to the backend of the target snapshot (backend.h).  The
 * local backend's answer: the snapshot records list the layers of their
 * chains (frozen layers never change), so
 *   allocated(S)  = blocks whose topmost layer in chain(S) holds data;
 *   changed(A, B) = blocks any layer of chain(A) xor chain(B) answers for
 * (docs/changed-blocks.md says why the second is never missing a change),
 * read from the layers' own L1/L2 tables (qcow2map.h), never from qemu-img
 * output.  The layers are opened when the call starts (a snapshot deleted
 * meanwhile keeps them readable) and walked lazily: a message is built
 * only while the call's queue is short (grpc_call_writable), and a step
 * reads at most STEP_WINDOWS L2 tables per layer before the event loop
 * runs again; at most MAX_STREAMS calls at once (RESOURCE_EXHAUSTED
 * beyond).  VARIABLE_LENGTH extents: adjacent clusters merged (a 64 KiB
 * cluster each would be 16 times as many messages for 1 MiB writes). */
#include "snapmeta.h"
#include "ids.h"
#include "service.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"
#include "qsd/qemu/layers.h"
#include "qsd/qemu/qcow2map.h"

#define DEFAULT_RESULTS 1024 /* extents per message when max_results is 0 */
#define MAX_RESULTS 16384    /* and at most (about 400 KiB per message) */
#define STEP_WINDOWS 8       /* L2 tables per layer per step: 4 GiB of 64 KiB clusters */
#define MAX_LAYERS (2 * LAYER_MAX_DEPTH + 2)
#define MAX_STREAMS 8        /* in flight at once (each holds its layers open) */

static unsigned g_streams; /* streams in flight (the plugin's one loop) */

struct smeta {
    struct csi *csi;
    struct grpc_call *call;
    bool delta;
    struct qcow2_map *maps[MAX_LAYERS];
    size_t n;
    struct qcow2_walk *walk;
    uint64_t capacity;
    size_t max;
    struct qcow2_extent *ext;
    size_t fill;
    struct loop_timer *timer;
    uint64_t messages, extents;
};

static void smeta_free(struct smeta *x)
{
    g_streams--;
    if (x->timer)
        loop_timer_cancel(x->timer);
    qcow2_walk_free(x->walk);
    for (size_t i = 0; i < x->n; i++)
        qcow2_map_free(x->maps[i]);
    free(x->ext);
    free(x);
}

/* The call ends (status sent, or the stream gone). */
static void smeta_end(struct smeta *x, enum grpc_code code, const char *msg)
{
    if (code == GRPC_OK)
        log_debug("snapmeta", "stream done", "method=%s messages=%llu extents=%llu",
                  grpc_call_method(x->call), (unsigned long long)x->messages,
                  (unsigned long long)x->extents);
    grpc_call_end(x->call, code, "%s", msg ? msg : "");
    smeta_free(x);
}

static int smeta_send(struct smeta *x)
{
    _cleanup_free_ Csi__V1__BlockMetadata *bm = xcalloc(x->fill + 1, sizeof(*bm));
    _cleanup_free_ Csi__V1__BlockMetadata **list = xcalloc(x->fill + 1, sizeof(*list));
    for (size_t i = 0; i < x->fill; i++) {
        bm[i] = (Csi__V1__BlockMetadata)CSI__V1__BLOCK_METADATA__INIT;
        bm[i].byte_offset = (int64_t)x->ext[i].off;
        bm[i].size_bytes = (int64_t)x->ext[i].len;
        list[i] = &bm[i];
    }
    /* The two responses are the same message on the wire (fields 1-3). */
    Csi__V1__GetMetadataDeltaResponse d = CSI__V1__GET_METADATA_DELTA_RESPONSE__INIT;
    Csi__V1__GetMetadataAllocatedResponse a = CSI__V1__GET_METADATA_ALLOCATED_RESPONSE__INIT;
    d.block_metadata_type = a.block_metadata_type = CSI__V1__BLOCK_METADATA_TYPE__VARIABLE_LENGTH;
    d.volume_capacity_bytes = a.volume_capacity_bytes = (int64_t)x->capacity;
    d.n_block_metadata = a.n_block_metadata = x->fill;
    d.block_metadata = a.block_metadata = list;
    int r = grpc_call_send_pb(x->call, x->delta ? &d.base : &a.base);
    if (r == 0) {
        x->messages++;
        x->extents += x->fill;
        x->fill = 0;
    }
    return r;
}

static void smeta_step(struct loop *l, void *opaque);

/* Build and send messages while the queue is short; a bounded amount of
 * reading per call, then the loop again (a timer) or the peer's reading
 * (grpc_call_on_writable). */
static void smeta_produce(struct smeta *x)
{
    for (int steps = 0; steps < 4; steps++) {
        if (!grpc_call_writable(x->call))
            return; /* smeta_writable goes on */
        size_t got;
        _cleanup_free_ char *msg = NULL;
        int r = qcow2_walk_next(x->walk, x->ext + x->fill, x->max - x->fill, STEP_WINDOWS, &got,
                                &msg);
        if (r < 0) {
            _cleanup_free_ char *q = log_quote(msg);
            log_warn("snapmeta", "cannot read a layer's map", "error=%s", q);
            smeta_end(x, GRPC_INTERNAL, msg);
            return;
        }
        x->fill += got;
        /* the last message may be empty: a stream has one at least (the
         * block type and the capacity) */
        if ((x->fill == x->max || (r == 1 && (x->fill > 0 || x->messages == 0))) &&
            smeta_send(x) < 0) {
            smeta_end(x, GRPC_INTERNAL, "cannot queue a response message");
            return;
        }
        if (r == 1) {
            smeta_end(x, GRPC_OK, NULL);
            return;
        }
    }
    x->timer = loop_timer_add(x->csi->loop, 0, smeta_step, x);
}

static void smeta_step(struct loop *l, void *opaque)
{
    struct smeta *x = opaque;
    x->timer = NULL;
    smeta_produce(x);
}

static void smeta_writable(struct grpc_call *call, void *opaque)
{
    struct smeta *x = opaque;
    if (!x->timer)
        smeta_produce(x);
}

static void smeta_cancelled(struct grpc_call *call, void *opaque)
{
    smeta_end(opaque, GRPC_CANCELLED, "cancelled");
}

/* ------------------------------------------------------------ requests */

/* The ready snapshot record an id names, or NULL with the call failed. */
static struct snap *find_snap(struct csi *c, struct grpc_call *call, const char *field,
                              const char *id)
{
    _cleanup_free_ char *name = xstrdup(id);
    if (!csi_id_ok(c, call, field, name))
        return NULL;
    struct snap *sn = store_find_snap(c->store, name);
    if (!sn || sn->phase != PHASE_READY) {
        grpc_call_fail(call, GRPC_NOT_FOUND, "%s: snapshot %s does not exist", field, id);
        return NULL;
    }
    return sn;
}

static bool in_list(json_t *a, const char *name)
{
    size_t i;
    json_t *e;
    json_array_foreach(a, i, e)
        if (streq(json_string_value(e), name))
            return true;
    return false;
}

/* Open the layers of a (the ones not in b when b is given).  A layer
 * whose header claims more than x->capacity (the target snapshot's size:
 * volumes only grow, so no layer of either chain is larger) is refused:
 * the header is the QSD's writing, and its size decides how much of the
 * L1 table the plugin reads and keeps. */
static int open_layers(struct csi *c, struct smeta *x, json_t *a, json_t *b, char **ret_msg)
{
    size_t i;
    json_t *e;
    json_array_foreach(a, i, e) {
        const char *name = json_string_value(e);
        if (!name || !layer_name_valid(name)) {
            *ret_msg = xstrdup("a snapshot record names an invalid layer");
            return -EINVAL;
        }
        if (b && in_list(b, name))
            continue;
        if (x->n == MAX_LAYERS) {
            *ret_msg = xstrdup("too many layers");
            return -E2BIG;
        }
        _cleanup_free_ char *path = pool_layer_path(&c->pool, name);
        int r = qcow2_map_open(path, &x->maps[x->n], ret_msg);
        if (r < 0)
            return r;
        x->n++;
        if (qcow2_map_size(x->maps[x->n - 1]) > x->capacity) {
            *ret_msg = xasprintf("layer %s claims %llu bytes, more than the snapshot's %llu",
                                 name, (unsigned long long)qcow2_map_size(x->maps[x->n - 1]),
                                 (unsigned long long)x->capacity);
            return -EINVAL;
        }
    }
    return 0;
}

/* The layers both chains share must be a common suffix (each chain is a
 * path in the tree of layers: docs/changed-blocks.md). */
static bool common_suffix(json_t *a, json_t *b)
{
    size_t na = json_array_size(a), nb = json_array_size(b), k = 0;
    while (k < na && k < nb &&
           streq(json_string_value(json_array_get(a, na - 1 - k)),
                 json_string_value(json_array_get(b, nb - 1 - k))))
        k++;
    for (size_t i = 0; i < na - k; i++)
        if (in_list(b, json_string_value(json_array_get(a, i))))
            return false;
    return true;
}

static bool created_after(const struct snap *a, const struct snap *b)
{
    return a->created_sec > b->created_sec ||
           (a->created_sec == b->created_sec && a->created_nsec > b->created_nsec);
}

/* The delta's refusals, or its layers opened (none: nothing changed). */
static bool delta_layers(struct csi *c, struct grpc_call *call, const struct snapmeta_req *r,
                         struct snap *base, struct snap *target, struct smeta *x)
{
    if (!streq(base->source, target->source)) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT,
                       "%s %s and %s %s are snapshots of different volumes (%s, %s)",
                       r->base_field, r->base_id, r->target_field, r->target_id, base->source,
                       target->source);
        return false;
    }
    if (created_after(base, target)) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "%s %s was taken after %s %s",
                       r->base_field, r->base_id, r->target_field, r->target_id);
        return false;
    }
    if (!base->layers || !target->layers || !common_suffix(base->layers, target->layers)) {
        grpc_call_fail(call, GRPC_FAILED_PRECONDITION,
                       "changed-block tracking needs thin snapshots of one chain of layers; "
                       "%s or %s is a full copy (a raw volume's): back it up whole",
                       r->base_id, r->target_id);
        return false;
    }
    _cleanup_free_ char *msg = NULL;
    int e = open_layers(c, x, target->layers, base->layers, &msg);
    if (e == 0)
        e = open_layers(c, x, base->layers, target->layers, &msg);
    if (e < 0) {
        grpc_call_fail(call, GRPC_INTERNAL, "cannot read the layers: %s", msg);
        return false;
    }
    return true;
}

void snapmeta_local(struct csi *c, struct grpc_call *call, const struct snapmeta_req *r)
{
    struct snap *target = find_snap(c, call, r->target_field, r->target_id);
    if (!target)
        return;
    struct snap *base = NULL;
    if (r->base_id && !(base = find_snap(c, call, r->base_field, r->base_id)))
        return;
    if ((uint64_t)r->starting_offset >= target->size) {
        grpc_call_fail(call, GRPC_OUT_OF_RANGE,
                       "starting_offset %lld is not below the snapshot's size %llu",
                       (long long)r->starting_offset, (unsigned long long)target->size);
        return;
    }
    if (g_streams >= MAX_STREAMS) {
        grpc_call_fail(call, GRPC_RESOURCE_EXHAUSTED,
                       "%u SnapshotMetadata streams are in flight already; retry", g_streams);
        return;
    }
    struct smeta *x = xcalloc(1, sizeof(*x));
    g_streams++;
    x->csi = c;
    x->delta = base != NULL;
    x->capacity = target->size;
    x->max = r->max_results ? MIN((size_t)r->max_results, (size_t)MAX_RESULTS) : DEFAULT_RESULTS;
    _cleanup_free_ char *msg = NULL;
    if (base) {
        if (!delta_layers(c, call, r, base, target, x)) {
            smeta_free(x);
            return;
        }
    } else {
        int e;
        if (target->layers) {
            e = open_layers(c, x, target->layers, NULL, &msg);
        } else { /* a full copy: one standalone file */
            _cleanup_free_ char *path = pool_snapshot_path(&c->pool, target->id);
            if ((e = qcow2_map_open(path, &x->maps[0], &msg)) == 0) {
                x->n = 1;
                if (qcow2_map_size(x->maps[0]) > x->capacity) {
                    msg = xasprintf("snapshot file %s claims more than the snapshot's %llu bytes",
                                    target->id, (unsigned long long)x->capacity);
                    e = -EINVAL;
                }
            }
        }
        if (e < 0) {
            grpc_call_fail(call, GRPC_INTERNAL, "cannot read the layers: %s", msg);
            smeta_free(x);
            return;
        }
    }
    x->call = call;
    if (x->n == 0) { /* the same chain: nothing changed (one empty message) */
        int e = smeta_send(x);
        smeta_end(x, e < 0 ? GRPC_INTERNAL : GRPC_OK, e < 0 ? "cannot queue a message" : NULL);
        return;
    }
    if (qcow2_walk_new(base ? QCOW2_WALK_CHANGED : QCOW2_WALK_ALLOCATED, x->maps, x->n,
                       target->size, (uint64_t)r->starting_offset, &x->walk) < 0) {
        smeta_end(x, GRPC_INTERNAL, "cannot walk the layers");
        return;
    }
    x->ext = xcalloc(x->max, sizeof(*x->ext));
    grpc_call_on_cancel(call, smeta_cancelled, x);
    grpc_call_on_writable(call, smeta_writable, x);
    smeta_produce(x);
}

/* Checks common to both RPCs, then the backend of the target. */
static void dispatch(struct csi *c, struct grpc_call *call, const struct snapmeta_req *r)
{
    const char *ids[2][2] = {{r->target_field, r->target_id}, {r->base_field, r->base_id}};
    for (int i = 0; i < 2; i++) {
        if (!ids[i][0])
            continue;
        if (!ids[i][1] || !*ids[i][1]) {
            grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "%s is required", ids[i][0]);
            return;
        }
    }
    if (r->max_results < 0) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "max_results %d is negative",
                       (int)r->max_results);
        return;
    }
    if (r->starting_offset < 0) {
        grpc_call_fail(call, GRPC_OUT_OF_RANGE, "starting_offset %lld is negative",
                       (long long)r->starting_offset);
        return;
    }
    for (int i = 0; i < 2; i++) {
        const char *node = ids[i][0] ? csi_id_node(c, ids[i][1]) : NULL;
        if (node) {
            grpc_call_fail(call, GRPC_UNAVAILABLE,
                           "%s %s lives on node %s: SnapshotMetadata reaches only the snapshots "
                           "of this plugin's node (%s); a controller plugin with --node-dial "
                           "relays it from the snapshot's node (docs/node-operations.md)",
                           ids[i][0], ids[i][1], node, c->cfg->node_id);
            return;
        }
    }
    BACKEND_OF(.snapshot_id = r->target_id)->snapshot_metadata(c, call, r);
}

static void get_allocated(struct csi *c, struct grpc_call *call,
                          Csi__V1__GetMetadataAllocatedRequest *in)
{
    struct snapmeta_req r = {
        .target_id = in->snapshot_id, .target_field = "snapshot_id",
        .starting_offset = in->starting_offset, .max_results = in->max_results,
    };
    dispatch(c, call, &r);
}

static void get_delta(struct csi *c, struct grpc_call *call, Csi__V1__GetMetadataDeltaRequest *in)
{
    struct snapmeta_req r = {
        .base_id = in->base_snapshot_id, .base_field = "base_snapshot_id",
        .target_id = in->target_snapshot_id, .target_field = "target_snapshot_id",
        .starting_offset = in->starting_offset, .max_results = in->max_results,
    };
    dispatch(c, call, &r);
}

CSI_HANDLER(h_allocated, get_allocated, Csi__V1__GetMetadataAllocatedRequest,
            csi__v1__get_metadata_allocated_request)
CSI_HANDLER(h_delta, get_delta, Csi__V1__GetMetadataDeltaRequest,
            csi__v1__get_metadata_delta_request)

static struct grpc_method g_methods[2];

const struct grpc_method *snapmeta_methods(struct csi *c, size_t *ret_n)
{
    g_methods[0] = (struct grpc_method){"/csi.v1.SnapshotMetadata/GetMetadataAllocated",
                                        h_allocated, c, LOG_INFO};
    g_methods[1] = (struct grpc_method){"/csi.v1.SnapshotMetadata/GetMetadataDelta", h_delta,
                                        c, LOG_INFO};
    *ret_n = ARRAY_SIZE(g_methods);
    return g_methods;
}
