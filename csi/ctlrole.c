/* SPDX-License-Identifier: Apache-2.0 */
/* ctlrole.c: see ctlrole.h.
 *
 * Each handler decodes the request, decides whether it concerns an RBD
 * volume (by the StorageClass parameters or the "rbd:" id) and then hands
 * the same bytes to controller.c's handler, which dispatches to rbd.c (and
 * to the RBD snapshot code) exactly as in the node role.  Local volumes are
 * node-local: their CreateVolume and DeleteVolume belong to the
 * csi-provisioner of the volume's node (--node-deployment), which the
 * central sidecars cannot be told to leave alone, so:
 *
 *   CreateVolume, DeleteVolume of a local volume: FAILED_PRECONDITION.  A
 *   final code: the central provisioner neither retries it as "in
 *   progress" (UNAVAILABLE, ABORTED, ...) nor reschedules
 *   (RESOURCE_EXHAUSTED with topology; the controller role reports no
 *   topology), and DeleteVolume never answers OK for a volume it did not
 *   delete (the PV would go, the file would stay).
 *   CreateSnapshot, DeleteSnapshot of a local volume: with --node-dial,
 *   forwarded as they came to the node the id names (source_volume_id's,
 *   snapshot_id's: NAME@NODE; a bad id INVALID_ARGUMENT naming the field,
 *   an id without a node FAILED_PRECONDITION, nothing sent), so one
 *   central csi-snapshotter (with its group-snapshot controller) serves
 *   every local snapshot; without, FAILED_PRECONDITION as above.
 *   ListSnapshots, with --node-dial only (LIST_SNAPSHOTS advertised then):
 *   filtered by a local id, the node of that id (snapshot_id's first)
 *   answers; by an RBD id, controller.c's; unfiltered, FAILED_PRECONDITION
 *   (no list of every node's snapshots is kept here).
 *   ControllerExpandVolume of a local volume: OK with
 *   node_expansion_required and the requested size, nothing done: the
 *   resizer then leaves the growth to NodeExpandVolume on the volume's node,
 *   as it does when the node plugin advertises no EXPAND_VOLUME.  So one
 *   resizer, in the controller Deployment, serves both backends.
 *   ControllerModifyVolume of a local volume: with --node-dial, forwarded
 *   as it came to the volume's node (nodecall.h: the API server gives the
 *   node's address, the TLS gates carry the call to its node-operations
 *   socket), and MODIFY_VOLUME is advertised; without, controller.c's
 *   (modify.c), which answers UNAVAILABLE naming the volume's node, and
 *   MODIFY_VOLUME is not advertised, so the central resizer does not retry
 *   that forever.  An RBD volume's: controller.c's, as in the node role
 *   (rbd_qos.c: the limits in the image's metadata, then the call
 *   forwarded to the node the image names as serving it).
 *   The GroupController, with --node-dial only: a group's volumes are one
 *   node's (INVALID_ARGUMENT otherwise), so CreateVolumeGroupSnapshot goes
 *   to the node of its volumes, Delete and Get to the node of the group's
 *   id, each call whole; an id naming no other node gets group.c's answer.
 *   SnapshotMetadata, with --node-dial only: the stream of the snapshots'
 *   node relayed as it comes (a delta's two snapshots must be one node's). */
#include "ctlrole.h"
#include "csi.pb-c.h"
#include "qsd/base/log.h"
#include "backend.h"
#include "service.h"
#include "qsd/base/util.h"
#include "group.h"
#include "ids.h"
#include "nodecall.h"
#include "snapmeta.h"

#include <inttypes.h>

#define LOCAL_REFUSED                                                                         \
    "local volumes are created and deleted by the csi-provisioner of their node (node "     \
    "plugin, --role node), and snapshotted through this controller only with --node-dial; " \
    "this is the controller role, which serves backend rbd only"

struct ctlrole {
    struct csi *csi;
    const struct grpc_method *inner; /* controller.c's table */
    size_t n_inner;
    const struct grpc_method *group; /* group.c's table */
    size_t n_group;
    const struct grpc_method *smeta; /* snapmeta.c's table */
    size_t n_smeta;
    struct grpc_method methods[14];
};

static struct ctlrole g_role;

struct csi *ctlrole_csi_new(const struct plugin_config *cfg, struct loop *loop)
{
    struct csi *c = xcalloc(1, sizeof(*c));
    c->cfg = cfg;
    c->loop = loop;
    c->kubelet_fd = -1;
    c->topo_key = xasprintf("topology.%s/node", cfg->driver_name);
    /* Empty: lookups of local records find nothing. */
    c->store = xcalloc(1, sizeof(*c->store));
    return c;
}

#define CTL "/csi.v1.Controller/"

/* controller.c's handler of path. */
static void forward(struct grpc_call *call, const char *path, const uint8_t *req, size_t len)
{
    for (size_t i = 0; i < g_role.n_inner; i++)
        if (streq(g_role.inner[i].path, path)) {
            g_role.inner[i].handler(call, req, len, g_role.inner[i].opaque);
            return;
        }
    grpc_call_fail(call, GRPC_INTERNAL, "no handler for %s", path);
}

/* Decode into a message of type d; NULL (call failed) when it does not. */
#define DECODE(Type, type) (Type *)csi_request_unpack(call, &type##__descriptor, req, len)

/* CreateVolume, DeleteVolume, CreateSnapshot, DeleteSnapshot: passed on for
 * a central backend's volumes (RBD); for the others (local), the snapshot
 * calls go to the node their id names with --node-dial, the rest (and
 * those without) are refused. */
struct route {
    const char *path;
    const ProtobufCMessageDescriptor *desc;
    const struct backend *(*backend)(const ProtobufCMessage *m);
    const char *refusal; /* what is not a central backend's */
    const char *field;   /* the id naming the node (NAME@NODE); NULL: none goes there */
    const char *(*id)(const ProtobufCMessage *m);
};

static const struct backend *create_backend(const ProtobufCMessage *m)
{
    const Csi__V1__CreateVolumeRequest *r = (const Csi__V1__CreateVolumeRequest *)m;
    return BACKEND_OF(.n_params = r->n_parameters, .params = r->parameters);
}

static const struct backend *delete_backend(const ProtobufCMessage *m)
{
    return BACKEND_OF(.volume_id = ((const Csi__V1__DeleteVolumeRequest *)m)->volume_id);
}

static const struct backend *snapshot_backend(const ProtobufCMessage *m)
{
    return BACKEND_OF(.volume_id = ((const Csi__V1__CreateSnapshotRequest *)m)->source_volume_id);
}

static const struct backend *delete_snapshot_backend(const ProtobufCMessage *m)
{
    return BACKEND_OF(.snapshot_id = ((const Csi__V1__DeleteSnapshotRequest *)m)->snapshot_id);
}

static const char *snapshot_source(const ProtobufCMessage *m)
{
    return ((const Csi__V1__CreateSnapshotRequest *)m)->source_volume_id;
}

static const char *snapshot_id(const ProtobufCMessage *m)
{
    return ((const Csi__V1__DeleteSnapshotRequest *)m)->snapshot_id;
}

static const struct route routes[] = {
    {CTL "CreateVolume", &csi__v1__create_volume_request__descriptor, create_backend,
     "parameters: no backend rbd", NULL, NULL},
    {CTL "DeleteVolume", &csi__v1__delete_volume_request__descriptor, delete_backend,
     "volume_id is no RBD volume", NULL, NULL},
    {CTL "CreateSnapshot", &csi__v1__create_snapshot_request__descriptor, snapshot_backend,
     "source_volume_id is no RBD volume", "source_volume_id", snapshot_source},
    {CTL "DeleteSnapshot", &csi__v1__delete_snapshot_request__descriptor, delete_snapshot_backend,
     "snapshot_id is no RBD snapshot", "snapshot_id", snapshot_id},
};

/* A local volume's or snapshot's id: NAME or NAME@NODE (service.h
 * csi_id_out), whichever node; INVALID_ARGUMENT naming field otherwise. */
static bool local_id_ok(struct grpc_call *call, const char *field, const char *id)
{
    _cleanup_free_ char *name = xstrdup(id ? id : "");
    _cleanup_free_ char *of_node = xasprintf("%s's node", field);
    char *at = strchr(name, '@');
    if (at)
        *at++ = '\0';
    return id_ok(call, field, name) && (!at || id_ok(call, of_node, at));
}

/* With --node-dial: the whole call, as it came, to the node the local id
 * names (which checks the rest and does the work).  An id without a node
 * (or naming the controller's own name) cannot be placed:
 * FAILED_PRECONDITION, nothing sent. */
static void to_node(struct grpc_call *call, const char *path, const char *field,
                    const char *id, const uint8_t *req, size_t len)
{
    if (!local_id_ok(call, field, id))
        return;
    const char *node = csi_id_node(g_role.csi, id);
    if (!node) {
        grpc_call_fail(call, GRPC_FAILED_PRECONDITION,
                       "%s %s names no node (NAME@NODE): the controller cannot tell which "
                       "node holds it", field, id);
        return;
    }
    nodecall_forward(g_role.csi, call, node, path, req, len);
}

static void routed(struct grpc_call *call, const uint8_t *req, size_t len, void *opaque)
{
    const struct route *rt = opaque;
    ProtobufCMessage *in = csi_request_unpack(call, rt->desc, req, len);
    if (!in)
        return;
    if (rt->backend(in)->central)
        forward(call, rt->path, req, len);
    else if (rt->field && g_role.csi->cfg->node_dial)
        to_node(call, rt->path, rt->field, rt->id(in), req, len);
    else
        grpc_call_fail(call, GRPC_FAILED_PRECONDITION, "%s: " LOCAL_REFUSED, rt->refusal);
    protobuf_c_message_free_unpacked(in, NULL);
}

/* ListSnapshots (with --node-dial; csi-snapshotter asks it, by snapshot_id,
 * for a pre-provisioned snapshot's state): filtered by a local id, the
 * node that id names answers (snapshot_id's, else source_volume_id's; the
 * node applies both filters); by an RBD id, controller.c (rbd_snap.c).
 * Unfiltered: FAILED_PRECONDITION, as the controller has no list of every
 * node's snapshots (each node plugin lists its own on its socket). */
static void list_snapshots(struct grpc_call *call, const uint8_t *req, size_t len, void *opaque)
{
    (void)opaque;
    Csi__V1__ListSnapshotsRequest *in =
        DECODE(Csi__V1__ListSnapshotsRequest, csi__v1__list_snapshots_request);
    if (!in)
        return;
    const char *sid = in->snapshot_id && *in->snapshot_id ? in->snapshot_id : NULL;
    const char *vid = in->source_volume_id && *in->source_volume_id ? in->source_volume_id : NULL;
    if (!sid && !vid)
        grpc_call_fail(call, GRPC_FAILED_PRECONDITION,
                       "the controller role lists one node's snapshots: give snapshot_id or "
                       "source_volume_id (NAME@NODE); each node plugin lists its own");
    else if (BACKEND_OF(.snapshot_id = sid, .volume_id = vid)->central)
        forward(call, CTL "ListSnapshots", req, len);
    else if (sid)
        to_node(call, CTL "ListSnapshots", "snapshot_id", sid, req, len);
    else
        to_node(call, CTL "ListSnapshots", "source_volume_id", vid, req, len);
    protobuf_c_message_free_unpacked(&in->base, NULL);
}

static void expand_volume(struct grpc_call *call, const uint8_t *req, size_t len, void *opaque)
{
    (void)opaque;
    Csi__V1__ControllerExpandVolumeRequest *in =
        DECODE(Csi__V1__ControllerExpandVolumeRequest, csi__v1__controller_expand_volume_request);
    if (!in)
        return;
    if (BACKEND_OF(.volume_id = in->volume_id)->central) {
        protobuf_c_message_free_unpacked(&in->base, NULL);
        forward(call, CTL "ControllerExpandVolume", req, len);
        return;
    }
    /* A local volume: the node grows it (NodeExpandVolume). */
    int64_t size = in->capacity_range ? in->capacity_range->required_bytes : 0;
    if (size <= 0 && in->capacity_range)
        size = in->capacity_range->limit_bytes;
    if (local_id_ok(call, "volume_id", in->volume_id)) {
        if (size <= 0) {
            grpc_call_fail(call, GRPC_INVALID_ARGUMENT,
                           "capacity_range: required_bytes or limit_bytes must be positive");
        } else {
            log_info("controller", "local volume: expansion left to its node",
                     "volume=%s size=%" PRId64, in->volume_id, size);
            Csi__V1__ControllerExpandVolumeResponse out =
                CSI__V1__CONTROLLER_EXPAND_VOLUME_RESPONSE__INIT;
            out.capacity_bytes = size;
            out.node_expansion_required = true;
            grpc_call_reply_pb(call, &out.base);
        }
    }
    protobuf_c_message_free_unpacked(&in->base, NULL);
}

/* A local volume's limits are its node's business (nodecall.h); an RBD
 * volume's, controller.c's. */
static void modify_volume(struct grpc_call *call, const uint8_t *req, size_t len, void *opaque)
{
    struct csi *c = opaque;
    Csi__V1__ControllerModifyVolumeRequest *in =
        DECODE(Csi__V1__ControllerModifyVolumeRequest, csi__v1__controller_modify_volume_request);
    if (!in)
        return;
    const char *node = in->volume_id ? csi_id_node(c, in->volume_id) : NULL;
    if (c->cfg->node_dial && node && !BACKEND_OF(.volume_id = in->volume_id)->central) {
        _cleanup_free_ char *n = xstrdup(node);
        protobuf_c_message_free_unpacked(&in->base, NULL);
        nodecall_forward(c, call, n, CTL "ControllerModifyVolume", req, len);
        return;
    }
    protobuf_c_message_free_unpacked(&in->base, NULL);
    forward(call, CTL "ControllerModifyVolume", req, len);
}

/* ---- group snapshots (with --node-dial): one node's volumes, so the
 * whole call goes to that node, which does every check and the work.  An
 * id that names no other node (an RBD one, or none) gets group.c's answer. */

#define GRP "/csi.v1.GroupController/"

static void group_inner(struct grpc_call *call, const char *path, const uint8_t *req,
                        size_t len)
{
    for (size_t i = 0; i < g_role.n_group; i++)
        if (streq(g_role.group[i].path, path)) {
            g_role.group[i].handler(call, req, len, g_role.group[i].opaque);
            return;
        }
    grpc_call_fail(call, GRPC_INTERNAL, "no handler for %s", path);
}

static void group_caps(struct grpc_call *call, const uint8_t *req, size_t len, void *opaque)
{
    (void)opaque;
    group_inner(call, GRP "GroupControllerGetCapabilities", req, len);
}

static void group_create(struct grpc_call *call, const uint8_t *req, size_t len, void *opaque)
{
    struct csi *c = opaque;
    Csi__V1__CreateVolumeGroupSnapshotRequest *in = DECODE(
        Csi__V1__CreateVolumeGroupSnapshotRequest, csi__v1__create_volume_group_snapshot_request);
    if (!in)
        return;
    const char *node = in->n_source_volume_ids && in->source_volume_ids[0]
                           ? csi_id_node(c, in->source_volume_ids[0]) : NULL;
    for (size_t i = 1; node && i < in->n_source_volume_ids; i++) {
        const char *other = in->source_volume_ids[i] ? csi_id_node(c, in->source_volume_ids[i])
                                                     : NULL;
        if (!other || !streq(other, node)) {
            grpc_call_fail(call, GRPC_INVALID_ARGUMENT,
                           "source_volume_ids[%zu] (%s) is not on node %s with "
                           "source_volume_ids[0]: a group's volumes are one node's",
                           i, in->source_volume_ids[i] ? in->source_volume_ids[i] : "",
                           node);
            protobuf_c_message_free_unpacked(&in->base, NULL);
            return;
        }
    }
    _cleanup_free_ char *n = xstrdup_or_null(node);
    protobuf_c_message_free_unpacked(&in->base, NULL);
    if (n)
        nodecall_forward(c, call, n, GRP "CreateVolumeGroupSnapshot", req, len);
    else
        group_inner(call, GRP "CreateVolumeGroupSnapshot", req, len);
}

/* Delete and Get: the group snapshot id names the node. */
static void group_by_id(struct grpc_call *call, const char *method, const char *id,
                        const uint8_t *req, size_t len)
{
    const char *node = id && *id ? csi_id_node(g_role.csi, id) : NULL;
    if (node)
        nodecall_forward(g_role.csi, call, node, method, req, len);
    else
        group_inner(call, method, req, len);
}

static void group_delete(struct grpc_call *call, const uint8_t *req, size_t len, void *opaque)
{
    (void)opaque;
    Csi__V1__DeleteVolumeGroupSnapshotRequest *in = DECODE(
        Csi__V1__DeleteVolumeGroupSnapshotRequest, csi__v1__delete_volume_group_snapshot_request);
    if (!in)
        return;
    group_by_id(call, GRP "DeleteVolumeGroupSnapshot", in->group_snapshot_id, req, len);
    protobuf_c_message_free_unpacked(&in->base, NULL);
}

static void group_get(struct grpc_call *call, const uint8_t *req, size_t len, void *opaque)
{
    (void)opaque;
    Csi__V1__GetVolumeGroupSnapshotRequest *in = DECODE(
        Csi__V1__GetVolumeGroupSnapshotRequest, csi__v1__get_volume_group_snapshot_request);
    if (!in)
        return;
    group_by_id(call, GRP "GetVolumeGroupSnapshot", in->group_snapshot_id, req, len);
    protobuf_c_message_free_unpacked(&in->base, NULL);
}

/* ---- SnapshotMetadata (with --node-dial): the snapshots' node streams the
 * answer, relayed as it comes.  A delta's two snapshots are one node's. */

#define SMD "/csi.v1.SnapshotMetadata/"

static void smeta_inner(struct grpc_call *call, const char *path, const uint8_t *req,
                        size_t len)
{
    for (size_t i = 0; i < g_role.n_smeta; i++)
        if (streq(g_role.smeta[i].path, path)) {
            g_role.smeta[i].handler(call, req, len, g_role.smeta[i].opaque);
            return;
        }
    grpc_call_fail(call, GRPC_INTERNAL, "no handler for %s", path);
}

static void smeta_allocated(struct grpc_call *call, const uint8_t *req, size_t len,
                            void *opaque)
{
    struct csi *c = opaque;
    Csi__V1__GetMetadataAllocatedRequest *in =
        DECODE(Csi__V1__GetMetadataAllocatedRequest, csi__v1__get_metadata_allocated_request);
    if (!in)
        return;
    const char *node = in->snapshot_id && *in->snapshot_id ? csi_id_node(c, in->snapshot_id)
                                                           : NULL;
    _cleanup_free_ char *n = xstrdup_or_null(node);
    protobuf_c_message_free_unpacked(&in->base, NULL);
    if (n)
        nodecall_stream(c, call, n, SMD "GetMetadataAllocated", req, len);
    else
        smeta_inner(call, SMD "GetMetadataAllocated", req, len);
}

static void smeta_delta(struct grpc_call *call, const uint8_t *req, size_t len, void *opaque)
{
    struct csi *c = opaque;
    Csi__V1__GetMetadataDeltaRequest *in =
        DECODE(Csi__V1__GetMetadataDeltaRequest, csi__v1__get_metadata_delta_request);
    if (!in)
        return;
    const char *t = in->target_snapshot_id && *in->target_snapshot_id
                        ? csi_id_node(c, in->target_snapshot_id) : NULL;
    const char *b = in->base_snapshot_id && *in->base_snapshot_id
                        ? csi_id_node(c, in->base_snapshot_id) : NULL;
    if ((t || b) && !(t && b && streq(t, b))) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT,
                       "base_snapshot_id %s and target_snapshot_id %s are not snapshots of "
                       "one node", in->base_snapshot_id ? in->base_snapshot_id : "",
                       in->target_snapshot_id ? in->target_snapshot_id : "");
        protobuf_c_message_free_unpacked(&in->base, NULL);
        return;
    }
    _cleanup_free_ char *n = xstrdup_or_null(t);
    protobuf_c_message_free_unpacked(&in->base, NULL);
    if (n)
        nodecall_stream(c, call, n, SMD "GetMetadataDelta", req, len);
    else
        smeta_inner(call, SMD "GetMetadataDelta", req, len);
}

/* CREATE_DELETE_SNAPSHOT: csi-snapshotter does not start without it;
 * CLONE_VOLUME: csi-provisioner refuses a claim cloned from a claim without
 * it (RBD clones, rbd_snap.c); MODIFY_VOLUME and LIST_SNAPSHOTS when local
 * volumes' nodes can be reached (--node-dial).  Not GET_SNAPSHOT,
 * GET_VOLUME_HEALTH or LIST_VOLUME_HEALTH: the role serves no local volume
 * itself, and an RBD volume's or snapshot's are not served (their methods
 * are not in the table: UNIMPLEMENTED). */
static void get_capabilities(struct grpc_call *call, const uint8_t *req, size_t len, void *opaque)
{
    struct csi *c = opaque;
    Csi__V1__ControllerGetCapabilitiesRequest *in = DECODE(
        Csi__V1__ControllerGetCapabilitiesRequest, csi__v1__controller_get_capabilities_request);
    if (!in)
        return;
    protobuf_c_message_free_unpacked(&in->base, NULL);
    static const Csi__V1__ControllerServiceCapability__RPC__Type types[] = {
        CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__CREATE_DELETE_VOLUME,
        CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__EXPAND_VOLUME,
        CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__CREATE_DELETE_SNAPSHOT,
        CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__CLONE_VOLUME,
        CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__MODIFY_VOLUME,
        CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__LIST_SNAPSHOTS,
    };
    reply_controller_caps(call, types, ARRAY_SIZE(types) - (c->cfg->node_dial ? 0 : 2));
}

const struct grpc_method *ctlrole_methods(struct csi *c, size_t *ret_n)
{
    struct ctlrole *r = &g_role;
    r->csi = c;
    r->inner = controller_methods(c, &r->n_inner);
    size_t n = 0;
#define M(path, fn, o) r->methods[n++] = (struct grpc_method){CTL path, fn, o, LOG_INFO}
    M("ControllerExpandVolume", expand_volume, c);
    M("ControllerGetCapabilities", get_capabilities, c);
    M("ControllerModifyVolume", modify_volume, c);
    if (c->cfg->node_dial) {
        r->group = group_methods(c, &r->n_group);
        r->methods[n++] = (struct grpc_method){GRP "GroupControllerGetCapabilities", group_caps,
                                               c, LOG_INFO};
        r->methods[n++] = (struct grpc_method){GRP "CreateVolumeGroupSnapshot", group_create, c,
                                               LOG_INFO};
        r->methods[n++] = (struct grpc_method){GRP "DeleteVolumeGroupSnapshot", group_delete, c,
                                               LOG_INFO};
        r->methods[n++] = (struct grpc_method){GRP "GetVolumeGroupSnapshot", group_get, c,
                                               LOG_INFO};
        M("ListSnapshots", list_snapshots, c);
        r->smeta = snapmeta_methods(c, &r->n_smeta);
        r->methods[n++] = (struct grpc_method){SMD "GetMetadataAllocated", smeta_allocated, c,
                                               LOG_INFO};
        r->methods[n++] = (struct grpc_method){SMD "GetMetadataDelta", smeta_delta, c,
                                               LOG_INFO};
    }
    for (size_t i = 0; i < ARRAY_SIZE(routes); i++)
        r->methods[n++] = (struct grpc_method){routes[i].path, routed, (void *)&routes[i],
                                               LOG_INFO};
#undef M
    *ret_n = n;
    return r->methods;
}
