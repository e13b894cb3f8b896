/* SPDX-License-Identifier: Apache-2.0 */
/* ids.c: request ids, list tokens (and the start every paginated list
 * shares) and volume capabilities (ids.h): pure checks that fill a
 * verdict, and their forms that fail a call. */
#include "ids.h"
#include "service.h"
#include "backend.h"
#include "qsd/base/names.h"
#include "qsd/base/util.h"

#include <errno.h>

bool id_check(struct verdict *v, const char *field, const char *id)
{
    const char *why;
    if (!id || !*id)
        return verdict_fail(v, GRPC_INVALID_ARGUMENT, "%s is missing", field);
    if (name_validate(id, &why) < 0)
        return verdict_fail(v, GRPC_INVALID_ARGUMENT, "%s %s", field, why);
    return true;
}

/* A check's verdict sent on call. */
static bool sent(bool ok, struct verdict *v, struct grpc_call *call)
{
    if (!ok)
        verdict_send(v, call);
    return ok;
}

bool id_ok(struct grpc_call *call, const char *field, const char *id)
{
    struct verdict v = {0};
    return sent(id_check(&v, field, id), &v, call);
}

const char *csi_id_out(const struct csi *c, const char *name, char buf[CSI_ID_MAX + 1])
{
    const char *node = c->cfg->node_id;
    if (name_validate(node, NULL) < 0 || strlen(name) + 1 + strlen(node) > CSI_ID_MAX)
        return name;
    size_t n = strlen(name);
    memcpy(buf, name, n);
    buf[n] = '@';
    strcpy(buf + n + 1, node); /* fits: checked above */
    return buf;
}

const char *csi_id_node(const struct csi *c, const char *id)
{
    const char *at = id ? strchr(id, '@') : NULL;
    return at && !streq(at + 1, c->cfg->node_id) ? at + 1 : NULL;
}

bool csi_id_check(struct csi *c, struct verdict *v, const char *field, char *id)
{
    return BACKEND_OF(.volume_id = id)->record_name(c, v, field, id);
}

bool csi_id_ok(struct csi *c, struct grpc_call *call, const char *field, char *id)
{
    struct verdict v = {0};
    return sent(csi_id_check(c, &v, field, id), &v, call);
}

/* ------------------------------------------------------- list tokens */

int list_token_parse(const char *tok, const char *prefix, const char **ret)
{
    if (!tok || !*tok) {
        *ret = NULL;
        return 0;
    }
    if (!startswith(tok, prefix) || name_validate(tok + strlen(prefix), NULL) < 0)
        return -EINVAL;
    *ret = tok + strlen(prefix);
    return 0;
}

bool list_start_check(struct verdict *v, int32_t max_entries, const char *tok, const char *prefix,
                      const char **ret_after)
{
    if (max_entries < 0)
        return verdict_fail(v, GRPC_INVALID_ARGUMENT, "max_entries must not be negative");
    if (list_token_parse(tok, prefix, ret_after) < 0)
        return verdict_fail(v, GRPC_ABORTED, "starting_token is not a token this plugin issued");
    return true;
}

bool list_start_ok(struct grpc_call *call, int32_t max_entries, const char *tok,
                   const char *prefix, const char **ret_after)
{
    struct verdict v = {0};
    return sent(list_start_check(&v, max_entries, tok, prefix, ret_after), &v, call);
}

/* ------------------------------------------------------ capabilities */

bool caps_check(struct verdict *v, size_t n, Csi__V1__VolumeCapability **caps)
{
    if (n == 0)
        return verdict_fail(v, GRPC_INVALID_ARGUMENT, "volume_capabilities is missing");
    for (size_t i = 0; i < n; i++) {
        const char *why = cap_problem(caps[i]);
        if (why)
            return verdict_fail(v, GRPC_INVALID_ARGUMENT, "volume_capabilities[%zu]: %s", i, why);
    }
    return true;
}

bool caps_ok(struct grpc_call *call, size_t n, Csi__V1__VolumeCapability **caps)
{
    struct verdict v = {0};
    return sent(caps_check(&v, n, caps), &v, call);
}

const char *cap_problem(const Csi__V1__VolumeCapability *cap)
{
    if (!cap)
        return "volume_capability is missing";
    bool block = cap->access_type_case == CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_BLOCK &&
                 cap->block;
    if (!block &&
        (cap->access_type_case != CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_MOUNT || !cap->mount))
        return "volume_capability.access_type is missing";
    const char *fs = block ? NULL : cap->mount->fs_type;
    if (fs && *fs && !streq(fs, "ext4") && !streq(fs, "xfs"))
        return "volume_capability.mount.fs_type must be ext4 or xfs (a filesystem for pods), "
               "or empty (the vhost-user socket of VM pods)";
    if (!cap->access_mode)
        return "volume_capability.access_mode is missing";
    switch (cap->access_mode->mode) {
    case CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_WRITER:
    case CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_READER_ONLY:
    case CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_SINGLE_WRITER:
    case CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_MULTI_WRITER:
    /* Volumes are node-local: "multi-node" read-only is one node here. */
    case CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__MULTI_NODE_READER_ONLY:
        break;
    case CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__UNKNOWN:
        return "volume_capability.access_mode is unknown";
    default:
        return "access mode not supported: a vhost-user-blk export serves one client at a "
               "time, on the volume's node (multi-node writers are impossible)";
    }
    int gid;
    if (cap_group(cap, &gid) < 0)
        return "volume_mount_group must be a numeric group id";
    return NULL;
}

int cap_kind(const Csi__V1__VolumeCapability *cap, const char **ret_fs)
{
    *ret_fs = NULL;
    if (cap && cap->access_type_case == CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_BLOCK)
        return STAGE_KIND_BLOCK;
    if (cap && cap->access_type_case == CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_MOUNT &&
        cap->mount && cap->mount->fs_type && *cap->mount->fs_type) {
        *ret_fs = cap->mount->fs_type;
        return STAGE_KIND_FS;
    }
    return STAGE_KIND_VHOST;
}

bool cap_read_only(const Csi__V1__VolumeCapability *cap)
{
    return cap && cap->access_mode &&
           (cap->access_mode->mode == CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_READER_ONLY ||
            cap->access_mode->mode == CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__MULTI_NODE_READER_ONLY);
}

int cap_group(const Csi__V1__VolumeCapability *cap, int *ret_gid)
{
    const char *g = cap && cap->access_type_case == CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_MOUNT &&
                            cap->mount ? cap->mount->volume_mount_group : NULL;
    if (!g || !*g) {
        *ret_gid = -1;
        return 0;
    }
    uint64_t v;
    if (parse_uint(g, 0, INT32_MAX, &v) < 0)
        return -EINVAL;
    *ret_gid = (int)v;
    return 0;
}
