/* SPDX-License-Identifier: Apache-2.0 */
/* group.c: the CSI GroupController service (group.h): VolumeGroupSnapshot
 * of the volumes of this plugin's node.  What is the same for every
 * backend is checked here (a name, a non-empty list of source volumes
 * without duplicates, no volume or group of another node: UNAVAILABLE
 * naming it: the controller plugin with --node-dial is what forwards a
 * call to its node, ctlrole.c); then the backend of the first source volume (or of the
 * group id) does the rest (backend.h: local_group.c, RBD: UNIMPLEMENTED). */
#include "group.h"
#include "backend.h"
#include "ids.h"
#include "params.h"
#include "service.h"
#include "qsd/base/util.h"

/* Another node's id: the call is failed with UNAVAILABLE naming it. */
static bool other_node(struct csi *c, struct grpc_call *call, const char *what, const char *id)
{
    const char *node = csi_id_node(c, id);
    if (!node)
        return false;
    grpc_call_fail(call, GRPC_UNAVAILABLE,
                   "%s %s lives on node %s: group snapshots reach only the volumes of this "
                   "plugin's node (%s); a controller plugin with --node-dial forwards them to "
                   "their node (docs/node-operations.md)", what, id, node, c->cfg->node_id);
    return true;
}

static void get_capabilities(struct csi *c, struct grpc_call *call,
                             Csi__V1__GroupControllerGetCapabilitiesRequest *in)
{
    (void)c, (void)in;
    Csi__V1__GroupControllerServiceCapability__RPC rpc =
        CSI__V1__GROUP_CONTROLLER_SERVICE_CAPABILITY__RPC__INIT;
    rpc.type = CSI__V1__GROUP_CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT;
    Csi__V1__GroupControllerServiceCapability cap = CSI__V1__GROUP_CONTROLLER_SERVICE_CAPABILITY__INIT;
    cap.type_case = CSI__V1__GROUP_CONTROLLER_SERVICE_CAPABILITY__TYPE_RPC;
    cap.rpc = &rpc;
    Csi__V1__GroupControllerServiceCapability *list[1] = {&cap};
    Csi__V1__GroupControllerGetCapabilitiesResponse out =
        CSI__V1__GROUP_CONTROLLER_GET_CAPABILITIES_RESPONSE__INIT;
    out.n_capabilities = 1;
    out.capabilities = list;
    grpc_call_reply_pb(call, &out.base);
}

static void create_group(struct csi *c, struct grpc_call *call,
                         Csi__V1__CreateVolumeGroupSnapshotRequest *in)
{
    if (!in->name || !*in->name) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "name is missing");
        return;
    }
    if (in->n_source_volume_ids == 0) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "source_volume_ids is empty");
        return;
    }
    for (size_t i = 0; i < in->n_parameters; i++)
        if (!startswith(in->parameters[i]->key, K8S_PREFIX)) {
            grpc_call_fail(call, GRPC_INVALID_ARGUMENT,
                           "unknown parameter '%s' (group snapshots take no parameters)",
                           in->parameters[i]->key);
            return;
        }
    for (size_t i = 0; i < in->n_source_volume_ids; i++) {
        const char *id = in->source_volume_ids[i];
        if (!id || !*id) {
            grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "source_volume_ids[%zu] is empty", i);
            return;
        }
        for (size_t k = 0; k < i; k++)
            if (streq(id, in->source_volume_ids[k])) {
                grpc_call_fail(call, GRPC_INVALID_ARGUMENT,
                               "source_volume_ids[%zu] repeats volume %s", i, id);
                return;
            }
        if (other_node(c, call, "volume", id))
            return;
    }
    BACKEND_OF(.volume_id = in->source_volume_ids[0])->create_group_snapshot(c, call, in);
}

static void delete_group(struct csi *c, struct grpc_call *call,
                         Csi__V1__DeleteVolumeGroupSnapshotRequest *in)
{
    if (!in->group_snapshot_id || !*in->group_snapshot_id) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "group_snapshot_id is missing");
        return;
    }
    if (other_node(c, call, "group snapshot", in->group_snapshot_id))
        return;
    BACKEND_OF(.snapshot_id = in->group_snapshot_id)->delete_group_snapshot(c, call, in);
}

static void get_group(struct csi *c, struct grpc_call *call, Csi__V1__GetVolumeGroupSnapshotRequest *in)
{
    if (!in->group_snapshot_id || !*in->group_snapshot_id) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "group_snapshot_id is missing");
        return;
    }
    if (other_node(c, call, "group snapshot", in->group_snapshot_id))
        return;
    BACKEND_OF(.snapshot_id = in->group_snapshot_id)->get_group_snapshot(c, call, in);
}

CSI_HANDLER(h_caps, get_capabilities, Csi__V1__GroupControllerGetCapabilitiesRequest,
            csi__v1__group_controller_get_capabilities_request)
CSI_HANDLER(h_create, create_group, Csi__V1__CreateVolumeGroupSnapshotRequest,
            csi__v1__create_volume_group_snapshot_request)
CSI_HANDLER(h_delete, delete_group, Csi__V1__DeleteVolumeGroupSnapshotRequest,
            csi__v1__delete_volume_group_snapshot_request)
CSI_HANDLER(h_get, get_group, Csi__V1__GetVolumeGroupSnapshotRequest,
            csi__v1__get_volume_group_snapshot_request)

static struct grpc_method g_methods[4];

const struct grpc_method *group_methods(struct csi *c, size_t *ret_n)
{
    size_t n = 0;
#define M(path, fn) g_methods[n++] = (struct grpc_method){"/csi.v1.GroupController/" path, fn, c, LOG_INFO}
    M("GroupControllerGetCapabilities", h_caps);
    M("CreateVolumeGroupSnapshot", h_create);
    M("DeleteVolumeGroupSnapshot", h_delete);
    M("GetVolumeGroupSnapshot", h_get);
#undef M
    *ret_n = n;
    return g_methods;
}
