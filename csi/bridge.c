/* SPDX-License-Identifier: Apache-2.0 */
/* bridge.c: NodePublish/NodeUnpublish of the inline ephemeral volumes
 * (bridges and hot-plug requests), their stats, and the hooks the PVC
 * publications call (bridge_pvc_*).  See bridge.h; records in
 * bridge_store.c, mounts and placements in bridge_place.c. */
#include "bridge_int.h"
#include "capacity.h"
#include "qsd/base/names.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"
#include "mounts.h"
#include "paths.h"
#include "ids.h"

#include <sys/stat.h>

/* ------------------------------------------------------------ publish */

static const char *ctx_get(const Csi__V1__NodePublishVolumeRequest *in, const char *key)
{
    for (size_t i = 0; i < in->n_volume_context; i++)
        if (in->volume_context[i]->key && streq(in->volume_context[i]->key, key))
            return in->volume_context[i]->value;
    return NULL;
}

bool bridge_is_ephemeral(const Csi__V1__NodePublishVolumeRequest *in)
{
    return streq_ptr(ctx_get(in, CTX_EPHEMERAL), "true");
}

struct podinfo {
    const char *uid, *ns, *name;
};

static bool get_podinfo(const Csi__V1__NodePublishVolumeRequest *in, struct podinfo *pi)
{
    pi->uid = ctx_get(in, CTX_POD_UID);
    pi->ns = ctx_get(in, CTX_POD_NS);
    pi->name = ctx_get(in, CTX_POD_NAME);
    return uid_ok(pi->uid) && k8s_name_ok(pi->ns, 63, false) && k8s_name_ok(pi->name, 253, true);
}

static void publish_bridge(struct csi *c, struct grpc_call *call,
                           const Csi__V1__NodePublishVolumeRequest *in, const struct podinfo *pi,
                           int gid)
{
    struct bridges *bs = c->bridges;
    struct bridge *b = find_bridge_uid(bs, pi->uid);
    if (b && (!streq(b->volume_id, in->volume_id) || !streq(b->target, in->target_path))) {
        grpc_call_fail(call, GRPC_ALREADY_EXISTS,
                       "pod %s/%s already has a hot-plug bridge (volume %s at %s)", pi->ns,
                       pi->name, b->volume_id, b->target);
        return;
    }
    if (!b && find_bridge_vid(bs, in->volume_id)) {
        grpc_call_fail(call, GRPC_ALREADY_EXISTS, "volume %s is the bridge of another pod",
                       in->volume_id);
        return;
    }
    if (b && gid >= 0 && gid != b->gid) {
        grpc_call_fail(call, GRPC_ALREADY_EXISTS, "the bridge of pod %s/%s has group %d",
                       pi->ns, pi->name, b->gid);
        return;
    }
    bool fresh = !b;
    if (fresh) {
        b = xcalloc(1, sizeof(*b));
        *b = (struct bridge){.volume_id = xstrdup(in->volume_id),
                             .target = xstrdup(in->target_path), .pod_uid = xstrdup(pi->uid),
                             .ns = xstrdup(pi->ns), .pod = xstrdup(pi->name), .gid = gid};
        int r = save_bridge(bs, b);
        if (r < 0) {
            bridge_free(b);
            grpc_call_fail(call, capacity_errno_code(r, GRPC_INTERNAL),
                           "cannot write the bridge record: %s", strerror(-r));
            return;
        }
        add_bridge(bs, b);
    }
    _cleanup_free_ char *msg = NULL;
    int r = bridge_dir_make(bs, b, -1, &msg), code = GRPC_INTERNAL;
    int mounted = r < 0 ? 0 : mounts_is_mounted(c, in->target_path, &msg);
    if (mounted < 0)
        r = mounted;
    else if (r == 0 && !mounted) {
        _cleanup_close_ int bfd = -1;
        if ((r = bridge_dir_open(bs, b, &bfd)) < 0)
            msg = xasprintf("cannot open the bridge directory: %s", strerror(-r));
        else
            r = mounts_bind(c, bfd, in->target_path, &msg);
    }
    if (r < 0) {
        if (msg && (r == -ELOOP || r == -EXDEV || r == -EEXIST))
            code = mounts_grpc_code(r);
        if (fresh) {
            _cleanup_free_ char *m2 = NULL;
            if (r != -ELOOP && r != -EXDEV && r != -EEXIST)
                mounts_unbind(c, in->target_path, &m2);
            remove_bridge_dir(bs, b);
            del_bridge(bs, b);
        }
        grpc_call_fail(call, code, "%s", msg ? msg : strerror(-r));
        return;
    }
    log_info(COMP, "bridge published", "pod=%s/%s pod_uid=%s gid=%d target=%s", b->ns, b->pod,
             b->pod_uid, b->gid, b->target);
    grpc_call_reply(call, "", 0);
}

/* The PVC publications of pod uid (volumes published for the attachment pod). */
static size_t pod_pvcs(struct csi *c, const char *uid, struct vol **out, bool *ro, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < c->store->n_vols; i++) {
        struct vol *v = c->store->vols[i];
        for (size_t k = 0; k < v->n_pubs && n < max; k++)
            if (streq_ptr(v->pubs[k].pod_uid, uid)) {
                ro[n] = v->pubs[k].read_only;
                out[n++] = v;
                break;
            }
    }
    return n;
}

#define MAX_PVCS 64

static void publish_request(struct csi *c, struct grpc_call *call,
                            const Csi__V1__NodePublishVolumeRequest *in, const struct podinfo *pi,
                            int gid, const char *into, const char *disk)
{
    struct bridges *bs = c->bridges;
    const char *why;
    if (!k8s_name_ok(into, 253, true)) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT,
                       "hotplugInto must be the name of a pod (a DNS subdomain name)");
        return;
    }
    if (disk && name_validate(disk, &why) < 0) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "disk %s", why);
        return;
    }
    struct hp_request *q = find_req_vid(bs, in->volume_id);
    if (q && !streq(q->target, in->target_path)) {
        grpc_call_fail(call, GRPC_ALREADY_EXISTS, "volume %s is published at %s", in->volume_id,
                       q->target);
        return;
    }
    struct hp_request *other = find_req_pod(bs, pi->uid);
    if (other && other != q) {
        grpc_call_fail(call, GRPC_FAILED_PRECONDITION,
                       "pod %s/%s already has a hot-plug request (volume %s)", pi->ns, pi->name,
                       other->volume_id);
        return;
    }
    struct bridge *b = NULL;
    if (q)
        b = find_bridge_uid(bs, q->bridge_uid);
    else
        for (size_t i = 0; i < bs->n_b && !b; i++)
            if (streq(bs->b[i]->ns, pi->ns) && streq(bs->b[i]->pod, into))
                b = bs->b[i];
    if (!b) {
        grpc_call_fail(call, GRPC_NOT_FOUND,
                       "no VM pod %s with a hot-plug bridge in namespace %s on this node", into,
                       pi->ns);
        return;
    }
    if (gid != b->gid) {
        grpc_call_fail(call, GRPC_FAILED_PRECONDITION,
                       "the attachment pod's group (fsGroup) %d differs from the VM pod %s/%s's "
                       "group %d", gid, b->ns, b->pod, b->gid);
        return;
    }
    /* PVCs published for this pod before the request: all must fit. */
    struct vol *vols[MAX_PVCS];
    bool ros[MAX_PVCS];
    size_t n = pod_pvcs(c, pi->uid, vols, ros, MAX_PVCS);
    bool skip[MAX_PVCS] = {false};
    if (disk && n > 1) {
        grpc_call_fail(call, GRPC_FAILED_PRECONDITION,
                       "disk %s names one disk but the attachment pod mounts %zu volumes", disk, n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        enum grpc_code code;
        _cleanup_free_ char *msg = NULL;
        const char *dn = disk ? disk : vols[i]->id;
        int r = can_place(c, b, dn, vols[i], pi->uid, -1, &code, &msg);
        if (r < 0) {
            grpc_call_fail(call, code, "%s", msg);
            return;
        }
        skip[i] = r == 1;
    }
    bool fresh = !q;
    if (fresh) {
        q = xcalloc(1, sizeof(*q));
        *q = (struct hp_request){.volume_id = xstrdup(in->volume_id),
                                 .target = xstrdup(in->target_path), .pod_uid = xstrdup(pi->uid),
                                 .ns = xstrdup(pi->ns), .pod = xstrdup(pi->name),
                                 .into = xstrdup(into), .disk = disk ? xstrdup(disk) : NULL,
                                 .bridge_uid = xstrdup(b->pod_uid), .gid = gid};
        int r = save_rec(bs, bs->req_rec_dir, q->volume_id, req_to_json(q));
        if (r < 0) {
            req_free(q);
            grpc_call_fail(call, capacity_errno_code(r, GRPC_INTERNAL),
                           "cannot write the request record: %s", strerror(-r));
            return;
        }
        add_req(bs, q);
    }
    _cleanup_free_ char *msg = NULL;
    int r = mounts_mkdir(c, in->target_path, &msg);
    size_t placed = 0;
    for (size_t i = 0; i < n && r == 0; i++, placed++)
        if (!skip[i])
            r = do_place(c, b, disk ? disk : vols[i]->id, vols[i], pi->uid, ros[i], &msg);
    if (r < 0) {
        /* Undo what this call placed. */
        for (size_t i = 0; i < placed; i++) {
            if (skip[i])
                continue;
            for (size_t k = 0; k < b->n_pl; k++)
                if (streq(b->pl[k].volume, vols[i]->id)) {
                    do_unplace(c, b, k);
                    break;
                }
        }
        if (fresh) {
            _cleanup_free_ char *m2 = NULL;
            if (r != -ELOOP && r != -EXDEV)
                mounts_unbind(c, in->target_path, &m2);
            del_req(bs, q);
        }
        grpc_call_fail(call, mounts_grpc_code(r), "%s", msg);
        return;
    }
    log_info(COMP, "hot-plug request published",
             "pod=%s/%s pod_uid=%s into=%s disk=%s volumes_placed=%zu", q->ns, q->pod, q->pod_uid,
             q->into, q->disk ? q->disk : "-", n);
    grpc_call_reply(call, "", 0);
}

void bridge_publish_ephemeral(struct csi *c, struct grpc_call *call,
                              const Csi__V1__NodePublishVolumeRequest *in)
{
    const char *why;
    if (!id_ok(call, "volume_id", in->volume_id))
        return;
    if (!in->target_path || !*in->target_path) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "target_path is missing");
        return;
    }
    if ((why = cap_problem(in->volume_capability))) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "%s", why);
        return;
    }
    if (path_check_lexical(c->cfg->kubelet_root, in->target_path, &why) < 0) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "target_path %s (kubelet root %s)", why,
                       c->cfg->kubelet_root);
        return;
    }
    {
        _cleanup_free_ char *other = csi_path_owner(c, in->target_path, in->volume_id);
        if (other) {
            grpc_call_fail(call, GRPC_FAILED_PRECONDITION, "target_path %s is already used by %s",
                           in->target_path, other);
            return;
        }
    }
    struct podinfo pi;
    if (!get_podinfo(in, &pi)) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT,
                       "an inline volume of this driver needs the pod's name, namespace and uid "
                       "in the volume context (CSIDriver podInfoOnMount: true)");
        return;
    }
    int gid;
    cap_group(in->volume_capability, &gid);
    const char *bridge = NULL, *into = NULL, *disk = NULL;
    for (size_t i = 0; i < in->n_volume_context; i++) {
        const char *k = in->volume_context[i]->key, *val = in->volume_context[i]->value;
        if (!k || startswith(k, CTX_PREFIX))
            continue;
        if (streq(k, "bridge"))
            bridge = val;
        else if (streq(k, "hotplugInto"))
            into = val;
        else if (streq(k, "disk"))
            disk = val;
        else {
            grpc_call_fail(call, GRPC_INVALID_ARGUMENT,
                           "unknown volumeAttributes key %s for an inline volume (accepted: "
                           "bridge, or hotplugInto and disk)", k);
            return;
        }
    }
    if (bridge && !into && !disk) {
        if (!streq(bridge, "true")) {
            grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "bridge must be \"true\"");
            return;
        }
        publish_bridge(c, call, in, &pi, gid);
        return;
    }
    if (into && !bridge) {
        publish_request(c, call, in, &pi, gid, into, disk && *disk ? disk : NULL);
        return;
    }
    grpc_call_fail(call, GRPC_INVALID_ARGUMENT,
                   "an inline volume of this driver is either a hot-plug bridge "
                   "(volumeAttributes bridge: \"true\") or a hot-plug request (hotplugInto: "
                   "<VM pod name>, optional disk: <name>)");
}

/* ------------------------------------------------------------ unpublish */

static void unplace_pod(struct csi *c, const char *pod_uid, const char *volume)
{
    struct bridges *bs = c->bridges;
    for (size_t i = 0; i < bs->n_b; i++) {
        struct bridge *b = bs->b[i];
        for (size_t k = 0; k < b->n_pl;) {
            if (streq(b->pl[k].pod_uid, pod_uid) && (!volume || streq(b->pl[k].volume, volume)))
                do_unplace(c, b, k);
            else
                k++;
        }
    }
}

bool bridge_unpublish_ephemeral(struct csi *c, struct grpc_call *call, const char *id,
                                const char *target)
{
    struct bridges *bs = c->bridges;
    struct bridge *b = find_bridge_vid(bs, id);
    struct hp_request *q = find_req_vid(bs, id);
    if (!b && !q) {
        /* kubelet's id of an inline volume we no longer know (removed, and
         * kubelet retries): nothing is published there. */
        struct stat st;
        if (startswith(id, "csi-") && lstat(target, &st) < 0 && errno == ENOENT) {
            grpc_call_reply(call, "", 0);
            return true;
        }
        return false;
    }
    if ((b && !streq(b->target, target)) || (q && !streq(q->target, target))) {
        grpc_call_reply(call, "", 0); /* not published there */
        return true;
    }
    _cleanup_free_ char *msg = NULL;
    if (q) {
        unplace_pod(c, q->pod_uid, NULL);
        int r = mounts_unbind(c, target, &msg);
        if (r < 0) {
            grpc_call_fail(call, mounts_grpc_code(r), "%s", msg);
            return true;
        }
        log_info(COMP, "hot-plug request unpublished", "pod=%s/%s into=%s", q->ns, q->pod,
                 q->into);
        del_req(bs, q);
    } else {
        while (b->n_pl)
            do_unplace(c, b, b->n_pl - 1);
        int r = mounts_unbind(c, target, &msg);
        if (r < 0) {
            grpc_call_fail(call, mounts_grpc_code(r), "%s", msg);
            return true;
        }
        remove_bridge_dir(bs, b);
        log_info(COMP, "bridge unpublished", "pod=%s/%s pod_uid=%s", b->ns, b->pod, b->pod_uid);
        del_bridge(bs, b);
    }
    grpc_call_reply(call, "", 0);
    return true;
}

char *bridge_path_owner(struct csi *c, const char *path, const char *except)
{
    struct bridges *bs = c->bridges;
    for (size_t i = 0; i < bs->n_b; i++)
        if (streq(bs->b[i]->target, path) && !streq_ptr(bs->b[i]->volume_id, except))
            return xasprintf("the bridge of pod %s/%s", bs->b[i]->ns, bs->b[i]->pod);
    for (size_t i = 0; i < bs->n_r; i++)
        if (streq(bs->r[i]->target, path) && !streq_ptr(bs->r[i]->volume_id, except))
            return xasprintf("the hot-plug request of pod %s/%s", bs->r[i]->ns, bs->r[i]->pod);
    return NULL;
}

bool bridge_stats(struct csi *c, struct grpc_call *call, const char *id, const char *path)
{
    struct bridges *bs = c->bridges;
    struct bridge *b = find_bridge_vid(bs, id);
    struct hp_request *q = find_req_vid(bs, id);
    if (!b && !q)
        return false;
    if (!streq(b ? b->target : q->target, path)) {
        grpc_call_fail(call, GRPC_NOT_FOUND, "volume %s is not published at %s", id, path);
        return true;
    }
    Csi__V1__VolumeCondition cond = CSI__V1__VOLUME_CONDITION__INIT;
    _cleanup_free_ char *m = b ? xasprintf("hot-plug bridge of pod %s/%s: %zu volume(s) placed",
                                           b->ns, b->pod, b->n_pl)
                               : xasprintf("hot-plug request of pod %s/%s into %s", q->ns,
                                           q->pod, q->into);
    cond.message = m;
    Csi__V1__NodeGetVolumeStatsResponse out = CSI__V1__NODE_GET_VOLUME_STATS_RESPONSE__INIT;
    out.volume_condition = &cond;
    grpc_call_reply_pb(call, &out.base);
    return true;
}

/* ------------------------------------------------------------ PVC side */

int bridge_pvc_check(struct csi *c, const struct vol *v, const char *pod_uid, int gid,
                     enum grpc_code *ret_code, char **ret_msg)
{
    if (!pod_uid)
        return 0;
    struct hp_request *q = find_req_pod(c->bridges, pod_uid);
    if (!q)
        return 0;
    struct bridge *b = find_bridge_uid(c->bridges, q->bridge_uid);
    if (!b) {
        *ret_code = GRPC_NOT_FOUND;
        *ret_msg = xasprintf("the VM pod %s/%s that volume %s should be hot-plugged into is gone",
                             q->ns, q->into, v->id);
        return -ENOENT;
    }
    const char *disk = q->disk ? q->disk : v->id;
    int r = can_place(c, b, disk, v, pod_uid, gid, ret_code, ret_msg);
    return r < 0 ? r : 0;
}

int bridge_pvc_place(struct csi *c, struct vol *v, const char *pod_uid, bool ro, char **ret_msg)
{
    if (!pod_uid)
        return 0;
    struct hp_request *q = find_req_pod(c->bridges, pod_uid);
    struct bridge *b = q ? find_bridge_uid(c->bridges, q->bridge_uid) : NULL;
    if (!b)
        return 0;
    const char *disk = q->disk ? q->disk : v->id;
    enum grpc_code code;
    _cleanup_free_ char *m = NULL;
    int r = can_place(c, b, disk, v, pod_uid, -1, &code, &m);
    if (r == 1)
        return 0;
    if (r < 0) {
        *ret_msg = TAKE_PTR(m);
        return r;
    }
    return do_place(c, b, disk, v, pod_uid, ro, ret_msg);
}

void bridge_pvc_unplace(struct csi *c, struct vol *v, const char *pod_uid)
{
    if (pod_uid)
        unplace_pod(c, pod_uid, v->id);
}

char *csi_path_owner(struct csi *c, const char *path, const char *except)
{
    for (size_t i = 0; i < c->store->n_vols; i++) {
        const struct vol *v = c->store->vols[i];
        if (except && streq(v->id, except))
            continue;
        if (v->staging_path && streq(v->staging_path, path))
            return xasprintf("the staging path of volume %s", v->id);
        if (vol_find_pub(v, path) >= 0)
            return xasprintf("a publication of volume %s", v->id);
    }
    return bridge_path_owner(c, path, except);
}
