/* SPDX-License-Identifier: Apache-2.0 */
/* controller.c: the CSI Controller service.
 *
 * The RPCs that change or list a backend's volumes and snapshots choose the
 * backend once (backend.h: from the StorageClass parameters or the id) and
 * hand the request over: local.c for images in the node's pool, rbd.c and
 * rbd_snap.c for RBD images.  What is the same for every backend is here:
 * ValidateVolumeCapabilities, ListVolumes (the records of the backends
 * whose volumes are in the node's pool), GetSnapshot's check and dispatch,
 * ControllerGetCapabilities, the
 * check of CreateSnapshot's parameters, and the Volume messages and list
 * tokens the backends answer with (controller.h).  The volume health RPCs
 * are health.c's (health.h), registered in this service's table. */
#include "backend.h"
#include "controller.h"
#include "qsd/base/log.h"
#include "qsd/base/names.h"
#include "service.h"
#include "qsd/base/util.h"
#include "ids.h"
#include "health.h"
#include "modify.h" /* modify_params_of */

#define LIST_TOKEN_VOL "v1:"

struct controller {
    struct csi *csi;
    struct grpc_method methods[17];
};

/* ------------------------------------------------------------ helpers */

json_t *params_json_k(size_t n, Csi__V1__CreateVolumeRequest__ParametersEntry **p, bool k8s)
{
    json_t *j = json_object();
    for (size_t i = 0; i < n; i++)
        if (startswith(p[i]->key, K8S_PREFIX) == k8s && (!k8s || json_object_size(j) < 8))
            json_object_set_new(j, p[i]->key, json_string(p[i]->value));
    return j;
}

json_t *params_json(size_t n, Csi__V1__CreateVolumeRequest__ParametersEntry **p)
{
    return params_json_k(n, p, false);
}

void topomsg_fill(const struct csi *c, struct topomsg *t)
{
    *t = (struct topomsg){
        .topo = CSI__V1__TOPOLOGY__INIT,
        .seg = CSI__V1__TOPOLOGY__SEGMENTS_ENTRY__INIT,
    };
    t->seg.key = c->topo_key;
    t->seg.value = (char *)c->cfg->node_id;
    t->segs[0] = &t->seg;
    t->topo.n_segments = 1;
    t->topo.segments = t->segs;
    t->topos[0] = &t->topo;
}

void volmsg_fill(struct csi *c, const struct vol *v, struct volmsg *m)
{
    *m = (struct volmsg){
        .vol = CSI__V1__VOLUME__INIT,
        .src = CSI__V1__VOLUME_CONTENT_SOURCE__INIT,
        .ssrc = CSI__V1__VOLUME_CONTENT_SOURCE__SNAPSHOT_SOURCE__INIT,
        .vsrc = CSI__V1__VOLUME_CONTENT_SOURCE__VOLUME_SOURCE__INIT,
    };
    topomsg_fill(c, &m->topo);
    m->vol.capacity_bytes = (int64_t)v->size;
    m->vol.volume_id = (char *)csi_id_out(c, v->id, m->id);
    m->vol.n_accessible_topology = 1;
    m->vol.accessible_topology = m->topo.topos;
    const char *k;
    json_t *val;
    size_t n = 0;
    json_object_foreach(v->context, k, val)
    {
        if (n == ARRAY_SIZE(m->ctx) || !json_is_string(val))
            break;
        m->ctx[n] = (Csi__V1__Volume__VolumeContextEntry)CSI__V1__VOLUME__VOLUME_CONTEXT_ENTRY__INIT;
        m->ctx[n].key = (char *)k;
        m->ctx[n].value = (char *)json_string_value(val);
        m->ctxp[n] = &m->ctx[n];
        n++;
    }
    m->vol.n_volume_context = n;
    m->vol.volume_context = m->ctxp;
    if (v->src_type && streq(v->src_type, "snapshot")) {
        m->ssrc.snapshot_id = (char *)csi_id_out(c, v->src_id, m->src_id);
        m->src.type_case = CSI__V1__VOLUME_CONTENT_SOURCE__TYPE_SNAPSHOT;
        m->src.snapshot = &m->ssrc;
        m->vol.content_source = &m->src;
    } else if (v->src_type) {
        m->vsrc.volume_id = (char *)csi_id_out(c, v->src_id, m->src_id);
        m->src.type_case = CSI__V1__VOLUME_CONTENT_SOURCE__TYPE_VOLUME;
        m->src.volume = &m->vsrc;
        m->vol.content_source = &m->src;
    }
}

/* ------------------------------------------ ValidateVolumeCapabilities */

static void validate_caps(struct csi *c, struct grpc_call *call,
                          Csi__V1__ValidateVolumeCapabilitiesRequest *in)
{
    if (!csi_id_ok(c, call, "volume_id", in->volume_id))
        return;
    if (in->n_volume_capabilities == 0) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "volume_capabilities is missing");
        return;
    }
    struct vol *v = store_find_vol(c->store, in->volume_id);
    if (!v || v->phase != PHASE_READY) {
        grpc_call_fail(call, GRPC_NOT_FOUND, "volume %s does not exist", in->volume_id);
        return;
    }
    Csi__V1__ValidateVolumeCapabilitiesResponse out =
        CSI__V1__VALIDATE_VOLUME_CAPABILITIES_RESPONSE__INIT;
    Csi__V1__ValidateVolumeCapabilitiesResponse__Confirmed conf =
        CSI__V1__VALIDATE_VOLUME_CAPABILITIES_RESPONSE__CONFIRMED__INIT;
    _cleanup_free_ char *msg = NULL;
    for (size_t i = 0; i < in->n_volume_capabilities && !msg; i++) {
        const char *why = cap_problem(in->volume_capabilities[i]);
        if (why)
            msg = xasprintf("volume_capabilities[%zu]: %s", i, why);
    }
    if (!msg && in->n_parameters) {
        json_t *params = params_json(in->n_parameters,
                                     (Csi__V1__CreateVolumeRequest__ParametersEntry **)in->parameters);
        if (!json_equal(params, v->parameters))
            msg = xstrdup("parameters differ from the ones the volume was created with");
        json_decref(params);
    }
    if (msg) {
        out.message = msg;
    } else {
        conf.n_volume_context = in->n_volume_context;
        conf.volume_context = (Csi__V1__ValidateVolumeCapabilitiesResponse__Confirmed__VolumeContextEntry **)
                                  in->volume_context;
        conf.n_volume_capabilities = in->n_volume_capabilities;
        conf.volume_capabilities = in->volume_capabilities;
        conf.n_parameters = in->n_parameters;
        conf.parameters = (Csi__V1__ValidateVolumeCapabilitiesResponse__Confirmed__ParametersEntry **)
                              in->parameters;
        out.confirmed = &conf;
    }
    grpc_call_reply_pb(call, &out.base);
}

/* --------------------------------------------------------- ListVolumes */

static void list_volumes(struct csi *c, struct grpc_call *call, Csi__V1__ListVolumesRequest *in)
{
    const char *after;
    if (!list_start_ok(call, in->max_entries, in->starting_token, LIST_TOKEN_VOL, &after))
        return;
    store_sort(c->store);
    size_t cap = c->store->n_vols, n = 0;
    struct volmsg *msgs = xcalloc(cap + 1, sizeof(*msgs));
    Csi__V1__ListVolumesResponse__Entry *ents = xcalloc(cap + 1, sizeof(*ents));
    Csi__V1__ListVolumesResponse__Entry **list = xcalloc(cap + 1, sizeof(*list));
    _cleanup_free_ char *next = NULL;
    const char *last = NULL;
    for (size_t i = 0; i < cap; i++) {
        struct vol *v = c->store->vols[i];
        if (v->phase != PHASE_READY || (after && strcmp(v->id, after) <= 0) ||
            !BACKEND_OF(.record = v)->in_pool)
            continue;
        if (in->max_entries > 0 && n == (size_t)in->max_entries) {
            next = xasprintf("%s%s", LIST_TOKEN_VOL, last);
            break;
        }
        volmsg_fill(c, v, &msgs[n]);
        last = v->id;
        ents[n] = (Csi__V1__ListVolumesResponse__Entry)CSI__V1__LIST_VOLUMES_RESPONSE__ENTRY__INIT;
        ents[n].volume = &msgs[n].vol;
        list[n] = &ents[n];
        n++;
    }
    Csi__V1__ListVolumesResponse out = CSI__V1__LIST_VOLUMES_RESPONSE__INIT;
    out.n_entries = n;
    out.entries = list;
    out.next_token = next ? next : (char *)"";
    grpc_call_reply_pb(call, &out.base);
    free(list);
    free(ents);
    free(msgs);
}

/* ------------------------------------------- ControllerGetCapabilities */

static void get_capabilities(struct csi *c, struct grpc_call *call,
                             Csi__V1__ControllerGetCapabilitiesRequest *in)
{
    /* EXPAND_VOLUME: ControllerExpandVolume grows an unstaged volume and
     * records a staged one's size (node_expansion_required).  No resizer
     * calls the node plugin in the deployment: the central one talks to the
     * controller role, which answers node_expansion_required for local
     * volumes (docs/csi-plugin.md "Deploying").  GET_VOLUME_HEALTH and
     * LIST_VOLUME_HEALTH: health.h; GET_SNAPSHOT: local snapshots. */
    static const Csi__V1__ControllerServiceCapability__RPC__Type types[] = {
        CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__CREATE_DELETE_VOLUME,
        CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__LIST_VOLUMES,
        CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__GET_CAPACITY,
        CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__CREATE_DELETE_SNAPSHOT,
        CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__LIST_SNAPSHOTS,
        CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__CLONE_VOLUME,
        CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__SINGLE_NODE_MULTI_WRITER,
        CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__MODIFY_VOLUME,
        CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__EXPAND_VOLUME,
        CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__GET_SNAPSHOT,
        CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__GET_VOLUME_HEALTH,
        CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__LIST_VOLUME_HEALTH,
    };
    (void)c;
    reply_controller_caps(call, types, ARRAY_SIZE(types));
}

/* ---------------------------------------- the backends' RPCs (backend.h) */

static void create_volume(struct csi *c, struct grpc_call *call, Csi__V1__CreateVolumeRequest *in)
{
    json_t *mp = NULL;
    _cleanup_free_ char *msg = NULL;
    if (modify_params_of(in->n_mutable_parameters, in->mutable_parameters, &mp, &msg) < 0) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "mutable_parameters: %s", msg);
        return;
    }
    json_decref(mp); /* the backend records them (modify_params_of again) */
    BACKEND_OF(.n_params = in->n_parameters, .params = in->parameters)
        ->create_volume(c, call, in);
}

static void delete_volume(struct csi *c, struct grpc_call *call, Csi__V1__DeleteVolumeRequest *in)
{
    BACKEND_OF(.volume_id = in->volume_id)->delete_volume(c, call, in);
}

static void expand_volume(struct csi *c, struct grpc_call *call,
                          Csi__V1__ControllerExpandVolumeRequest *in)
{
    BACKEND_OF(.volume_id = in->volume_id)->expand_volume(c, call, in);
}

static void get_capacity(struct csi *c, struct grpc_call *call, Csi__V1__GetCapacityRequest *in)
{
    /* Same entry layout as CreateVolume's parameters (key, value). */
    BACKEND_OF(.n_params = in->n_parameters,
               .params = (Csi__V1__CreateVolumeRequest__ParametersEntry **)in->parameters)
        ->get_capacity(c, call, in);
}

static void create_snapshot(struct csi *c, struct grpc_call *call,
                            Csi__V1__CreateSnapshotRequest *in)
{
    for (size_t i = 0; i < in->n_parameters; i++)
        if (!startswith(in->parameters[i]->key, K8S_PREFIX)) {
            grpc_call_fail(call, GRPC_INVALID_ARGUMENT,
                           "unknown parameter '%s' (snapshots take no parameters)",
                           in->parameters[i]->key);
            return;
        }
    BACKEND_OF(.volume_id = in->source_volume_id)->create_snapshot(c, call, in);
}

static void delete_snapshot(struct csi *c, struct grpc_call *call,
                            Csi__V1__DeleteSnapshotRequest *in)
{
    BACKEND_OF(.snapshot_id = in->snapshot_id)->delete_snapshot(c, call, in);
}

static void modify_volume(struct csi *c, struct grpc_call *call,
                          Csi__V1__ControllerModifyVolumeRequest *in)
{
    if (!in->volume_id || !*in->volume_id) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "volume_id is required");
        return;
    }
    BACKEND_OF(.volume_id = in->volume_id)->modify_volume(c, call, in);
}

/* Filtered by an RBD id, RBD's (it needs the secrets); unfiltered lists
 * are the node's local snapshots. */
static void list_snapshots(struct csi *c, struct grpc_call *call, Csi__V1__ListSnapshotsRequest *in)
{
    BACKEND_OF(.snapshot_id = in->snapshot_id, .volume_id = in->source_volume_id)
        ->list_snapshots(c, call, in);
}

/* The snapshot as ListSnapshots would list it (backend.h get_snapshot). */
static void get_snapshot(struct csi *c, struct grpc_call *call, Csi__V1__GetSnapshotRequest *in)
{
    if (!in->snapshot_id || !*in->snapshot_id) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "snapshot_id is missing");
        return;
    }
    const struct backend *b = BACKEND_OF(.snapshot_id = in->snapshot_id);
    if (!b->get_snapshot) {
        grpc_call_fail(call, GRPC_UNIMPLEMENTED,
                       "GetSnapshot of %s snapshots is not served: ListSnapshots with "
                       "snapshot_id answers it", b->name);
        return;
    }
    b->get_snapshot(c, call, in);
}

/* ------------------------------------------------------------ dispatch */

CSI_HANDLER(h_create_volume, create_volume, Csi__V1__CreateVolumeRequest, csi__v1__create_volume_request)
CSI_HANDLER(h_delete_volume, delete_volume, Csi__V1__DeleteVolumeRequest, csi__v1__delete_volume_request)
CSI_HANDLER(h_validate, validate_caps, Csi__V1__ValidateVolumeCapabilitiesRequest,
        csi__v1__validate_volume_capabilities_request)
CSI_HANDLER(h_list_volumes, list_volumes, Csi__V1__ListVolumesRequest, csi__v1__list_volumes_request)
CSI_HANDLER(h_get_capacity, get_capacity, Csi__V1__GetCapacityRequest, csi__v1__get_capacity_request)
CSI_HANDLER(h_get_caps, get_capabilities, Csi__V1__ControllerGetCapabilitiesRequest,
        csi__v1__controller_get_capabilities_request)
CSI_HANDLER(h_create_snapshot, create_snapshot, Csi__V1__CreateSnapshotRequest,
        csi__v1__create_snapshot_request)
CSI_HANDLER(h_delete_snapshot, delete_snapshot, Csi__V1__DeleteSnapshotRequest,
        csi__v1__delete_snapshot_request)
CSI_HANDLER(h_list_snapshots, list_snapshots, Csi__V1__ListSnapshotsRequest,
        csi__v1__list_snapshots_request)
CSI_HANDLER(h_modify, modify_volume, Csi__V1__ControllerModifyVolumeRequest,
        csi__v1__controller_modify_volume_request)
CSI_HANDLER(h_get_snapshot, get_snapshot, Csi__V1__GetSnapshotRequest,
        csi__v1__get_snapshot_request)
CSI_HANDLER(h_expand, expand_volume, Csi__V1__ControllerExpandVolumeRequest,
        csi__v1__controller_expand_volume_request)

static struct controller g_ctl;

const struct grpc_method *controller_methods(struct csi *c, size_t *ret_n)
{
    struct controller *ctl = &g_ctl;
    ctl->csi = c;
    size_t n = 0;
#define M(path, fn) ctl->methods[n++] = (struct grpc_method){"/csi.v1.Controller/" path, fn, c, LOG_INFO}
    M("CreateVolume", h_create_volume);
    M("DeleteVolume", h_delete_volume);
    M("ValidateVolumeCapabilities", h_validate);
    M("ListVolumes", h_list_volumes);
    M("GetCapacity", h_get_capacity);
    M("ControllerGetCapabilities", h_get_caps);
    M("CreateSnapshot", h_create_snapshot);
    M("DeleteSnapshot", h_delete_snapshot);
    M("ListSnapshots", h_list_snapshots);
    M("ControllerExpandVolume", h_expand);
    M("ControllerModifyVolume", h_modify);
    M("GetSnapshot", h_get_snapshot);
    M("ControllerGetVolumeHealth", health_controller_get);
    M("ControllerListVolumeHealth", health_controller_list);
#undef M
    *ret_n = n;
    return ctl->methods;
}
