/* SPDX-License-Identifier: Apache-2.0 */
/* identity.c: the CSI Identity service (GetPluginInfo, GetPluginCapabilities,
 * Probe).  Synchronous handlers: nothing here waits on anything. */
#include "config.h"
#include "csi.pb-c.h"
#include "qsd/base/log.h"
#include "service.h"
#include "plugin.h"
#include "qsd/base/util.h"

#include <ctype.h>
#include <sys/stat.h>

struct identity {
    const struct plugin_config *cfg;
    struct grpc_method methods[3];
    int last_ready; /* 1 ready, 0 not, -1 unknown: log transitions only */
};

bool driver_name_valid(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > 63 || !isalnum((unsigned char)name[0]) ||
        !isalnum((unsigned char)name[n - 1]))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)name[i]) && name[i] != '.' && name[i] != '-')
            return false;
    return true;
}

static int check_dir(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return -errno;
    if (!S_ISDIR(st.st_mode))
        return -ENOTDIR;
    if (access(path, W_OK | X_OK) < 0)
        return -errno;
    return 0;
}

/* An executable regular file: path as given when it contains a '/', else
 * looked up in PATH like execvp would. */
static int check_executable(const char *bin)
{
    struct stat st;
    if (strchr(bin, '/')) {
        if (stat(bin, &st) < 0)
            return -errno;
        if (!S_ISREG(st.st_mode) || access(bin, X_OK) < 0)
            return -EACCES;
        return 0;
    }
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    _cleanup_free_ char *copy = xstrdup(path);
    char *save = NULL;
    for (char *dir = strtok_r(copy, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
        _cleanup_free_ char *full = xasprintf("%s/%s", *dir ? dir : ".", bin);
        if (stat(full, &st) == 0 && S_ISREG(st.st_mode) && access(full, X_OK) == 0)
            return 0;
    }
    return -ENOENT;
}

int plugin_check_ready(const struct plugin_config *cfg, const char **ret_reason)
{
    int r;
    if (cfg->role == PLUGIN_ROLE_CONTROLLER) {
        if (!cfg->rbd_clusters || access(cfg->rbd_clusters, R_OK) < 0) {
            *ret_reason = "RBD cluster file (--rbd-clusters) missing or not readable";
            return cfg->rbd_clusters ? -errno : -ENOENT;
        }
        return 0;
    }
    if ((r = check_dir(cfg->state_dir)) < 0) {
        *ret_reason = "state directory missing or not writable";
        return r;
    }
    if ((r = check_dir(cfg->pool_dir)) < 0) {
        *ret_reason = "pool directory missing or not writable";
        return r;
    }
    if ((r = check_executable(cfg->qsd_binary)) < 0) {
        *ret_reason = "qemu-storage-daemon binary not found or not executable";
        return r;
    }
    return 0;
}

static void get_plugin_info(struct grpc_call *call, const uint8_t *req, size_t len,
                            void *opaque)
{
    struct identity *id = opaque;
    ProtobufCMessage *in = csi_request_unpack(call, &csi__v1__get_plugin_info_request__descriptor, req, len);
    if (!in)
        return;
    protobuf_c_message_free_unpacked(in, NULL);

    Csi__V1__GetPluginInfoResponse out = CSI__V1__GET_PLUGIN_INFO_RESPONSE__INIT;
    out.name = (char *)id->cfg->driver_name;
    out.vendor_version = (char *)QSD_CSI_VERSION;
    grpc_call_reply_pb(call, &out.base);
}

/* The controller role reports no VOLUME_ACCESSIBILITY_CONSTRAINTS: RBD
 * volumes are reachable from every node, and without it csi-provisioner
 * sends no topology and never reschedules a claim on our errors.
 * GROUP_CONTROLLER_SERVICE and SNAPSHOT_METADATA_SERVICE only with
 * --node-dial, which forwards those calls to their node (ctlrole.c). */
static void get_plugin_capabilities(struct grpc_call *call, const uint8_t *req, size_t len,
                                    void *opaque)
{
    struct identity *id = opaque;
    ProtobufCMessage *in = csi_request_unpack(call, &csi__v1__get_plugin_capabilities_request__descriptor, req, len);
    if (!in)
        return;
    protobuf_c_message_free_unpacked(in, NULL);

    Csi__V1__PluginCapability__Service svc[4] = {
        CSI__V1__PLUGIN_CAPABILITY__SERVICE__INIT,
        CSI__V1__PLUGIN_CAPABILITY__SERVICE__INIT,
        CSI__V1__PLUGIN_CAPABILITY__SERVICE__INIT,
        CSI__V1__PLUGIN_CAPABILITY__SERVICE__INIT,
    };
    svc[0].type = CSI__V1__PLUGIN_CAPABILITY__SERVICE__TYPE__CONTROLLER_SERVICE;
    svc[1].type = CSI__V1__PLUGIN_CAPABILITY__SERVICE__TYPE__VOLUME_ACCESSIBILITY_CONSTRAINTS;
    svc[2].type = CSI__V1__PLUGIN_CAPABILITY__SERVICE__TYPE__SNAPSHOT_METADATA_SERVICE;
    svc[3].type = CSI__V1__PLUGIN_CAPABILITY__SERVICE__TYPE__GROUP_CONTROLLER_SERVICE;
    Csi__V1__PluginCapability__VolumeExpansion exp =
        CSI__V1__PLUGIN_CAPABILITY__VOLUME_EXPANSION__INIT;
    exp.type = CSI__V1__PLUGIN_CAPABILITY__VOLUME_EXPANSION__TYPE__ONLINE;

    Csi__V1__PluginCapability caps[5] = {
        CSI__V1__PLUGIN_CAPABILITY__INIT,
        CSI__V1__PLUGIN_CAPABILITY__INIT,
        CSI__V1__PLUGIN_CAPABILITY__INIT,
        CSI__V1__PLUGIN_CAPABILITY__INIT,
        CSI__V1__PLUGIN_CAPABILITY__INIT,
    };
    caps[0].type_case = CSI__V1__PLUGIN_CAPABILITY__TYPE_SERVICE;
    caps[0].service = &svc[0];
    caps[1].type_case = CSI__V1__PLUGIN_CAPABILITY__TYPE_SERVICE;
    caps[1].service = &svc[1];
    caps[2].type_case = CSI__V1__PLUGIN_CAPABILITY__TYPE_VOLUME_EXPANSION;
    caps[2].volume_expansion = &exp;
    caps[3].type_case = CSI__V1__PLUGIN_CAPABILITY__TYPE_SERVICE;
    caps[3].service = &svc[2];
    caps[4].type_case = CSI__V1__PLUGIN_CAPABILITY__TYPE_SERVICE;
    caps[4].service = &svc[3];
    /* The node role serves SnapshotMetadata (snapmeta.h) and the
     * GroupController (group.h); the controller role no topology, and
     * those two with --node-dial. */
    Csi__V1__PluginCapability *node_list[5] = {&caps[0], &caps[2], &caps[1], &caps[3], &caps[4]};
    Csi__V1__PluginCapability *ctl_list[4] = {&caps[0], &caps[2], &caps[4], &caps[3]};
    bool ctl = id->cfg->role == PLUGIN_ROLE_CONTROLLER;

    Csi__V1__GetPluginCapabilitiesResponse out = CSI__V1__GET_PLUGIN_CAPABILITIES_RESPONSE__INIT;
    out.n_capabilities = ctl ? ARRAY_SIZE(ctl_list) - (id->cfg->node_dial ? 0 : 2)
                             : ARRAY_SIZE(node_list);
    out.capabilities = ctl ? ctl_list : node_list;
    grpc_call_reply_pb(call, &out.base);
}

static void probe(struct grpc_call *call, const uint8_t *req, size_t len, void *opaque)
{
    struct identity *id = opaque;
    ProtobufCMessage *in = csi_request_unpack(call, &csi__v1__probe_request__descriptor, req, len);
    if (!in)
        return;
    protobuf_c_message_free_unpacked(in, NULL);

    const char *reason = NULL;
    int r = plugin_check_ready(id->cfg, &reason);
    int ready = r == 0;
    if (ready != id->last_ready) {
        /* One line per change of readiness, not one per Probe. */
        if (ready)
            log_info("identity", "ready", "driver=%s", id->cfg->driver_name);
        else
            log_warn("identity", "not ready", "reason=\"%s\" error=\"%s\"", reason,
                     strerror(-r));
        id->last_ready = ready;
    }

    Google__Protobuf__BoolValue b = GOOGLE__PROTOBUF__BOOL_VALUE__INIT;
    b.value = ready;
    Csi__V1__ProbeResponse out = CSI__V1__PROBE_RESPONSE__INIT;
    out.ready = &b;
    grpc_call_reply_pb(call, &out.base);
}

int identity_new(const struct plugin_config *cfg, struct identity **ret)
{
    if (!cfg->driver_name || !driver_name_valid(cfg->driver_name))
        return -EINVAL;
    struct identity *id = xcalloc(1, sizeof(*id));
    id->cfg = cfg;
    id->last_ready = -1;
    id->methods[0] = (struct grpc_method){"/csi.v1.Identity/GetPluginInfo", get_plugin_info,
                                          id, LOG_INFO};
    id->methods[1] = (struct grpc_method){"/csi.v1.Identity/GetPluginCapabilities",
                                          get_plugin_capabilities, id, LOG_INFO};
    id->methods[2] = (struct grpc_method){"/csi.v1.Identity/Probe", probe, id, LOG_DEBUG};
    *ret = id;
    return 0;
}

void identity_free(struct identity *id) { free(id); }

const struct grpc_method *identity_methods(struct identity *id, size_t *ret_n)
{
    *ret_n = ARRAY_SIZE(id->methods);
    return id->methods;
}
