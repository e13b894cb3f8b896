/* SPDX-License-Identifier: Apache-2.0 */
/* rbd_qos.c: the limits (qos.h) of RBD volumes (docs/rbd.md, "Limits").
 *
 * Owns: the image metadata that makes them durable, as ceph-csi keeps its
 * per-image settings: RBD_QOS_META holds the JSON object a local volume's
 * record holds (written by CreateVolume from mutable_parameters and by
 * ControllerModifyVolume, read by NodeStageVolume for the QSD's start),
 * and RBD_NODE_META the id of the node that staged the image last (written
 * by NodeStageVolume once its QSD runs and passed the check); and
 * ControllerModifyVolume of an RBD volume.
 *
 * ControllerModifyVolume, in a worker: the request's entries merged over
 * the image's limits (qos_merge: INVALID_ARGUMENT naming the key, nothing
 * written), written, then the image's watchers counted and RBD_NODE_META
 * read.  Then, on the loop: the volume staged here (the node plugin, or the
 * call forwarded to it) -> modify_apply (the record and the live QSD's
 * throttle group, as for a local volume); no other client has the image
 * open -> OK (the next stage starts with them); open, and RBD_NODE_META
 * names another node -> the call forwarded to it (nodecall.h, with
 * --node-dial), else UNAVAILABLE naming it.  The order makes a stage that
 * runs at the same time safe: the stage, once its QSD runs, records its
 * node and then reads the limits again (rbd_stage_mark; rbd_guard.c sets
 * them live when they changed), a modify writes the limits before it reads
 * the node, so one of them sees the other's write (both are operations on
 * the image's header object). */
#include "modify.h"
#include "nodecall.h"
#include "qos.h"
#include "rbd_int.h"
#include "service.h"
#include "qsd/base/log.h"
#include "qsd/base/names.h"
#include "qsd/base/util.h"

#include <inttypes.h>

#define RBD_QOS_META "qsd-csi.qos"   /* the limits: {"readIops": "100", ...} */
#define RBD_NODE_META "qsd-csi.node" /* the node that staged the image last */
#define RBD_QOS_MAX 1024             /* bytes of RBD_QOS_META read at most */
#define WATCHERS_MAX 8

/* Image metadata key, at most max bytes: 0 and *ret NULL when absent,
 * -EFBIG when longer. */
static int meta_get(rbd_image_t img, const char *key, size_t max, char **ret)
{
    char *buf = xmalloc(max + 1);
    size_t len = max + 1;
    int r = rbd_metadata_get(img, key, buf, &len);
    if (r == -ENOENT) {
        free(buf);
        *ret = NULL;
        return 0;
    }
    if (r < 0) {
        free(buf);
        return r == -ERANGE ? -EFBIG : r;
    }
    buf[max] = '\0';
    *ret = buf;
    return 0;
}

int rbd_qos_read(rbd_image_t img, json_t **ret, char **ret_msg)
{
    _cleanup_free_ char *s = NULL;
    int r = meta_get(img, RBD_QOS_META, RBD_QOS_MAX, &s);
    if (r == -EFBIG) {
        *ret_msg = xasprintf("image metadata " RBD_QOS_META " is longer than %d bytes: not "
                             "written by this plugin", RBD_QOS_MAX);
        return -EUCLEAN;
    }
    if (r < 0) {
        *ret_msg = xasprintf("cannot read image metadata " RBD_QOS_META ": %s", strerror(-r));
        return r;
    }
    if (!s) {
        *ret = NULL;
        return 0;
    }
    json_error_t je;
    json_t *j = json_loads(s, JSON_REJECT_DUPLICATES, &je);
    _cleanup_free_ char *why = NULL;
    struct qsd_limits l;
    if (!json_is_object(j))
        why = xstrdup("not a JSON object");
    else
        qos_limits(j, &l, &why);
    if (why) {
        json_decref(j);
        *ret_msg = xasprintf("image metadata " RBD_QOS_META " is not valid: %s", why);
        return -EUCLEAN;
    }
    *ret = j;
    return 0;
}

int rbd_qos_write(rbd_image_t img, json_t *params, char **ret_msg)
{
    int r;
    if (!json_object_size(params)) {
        r = rbd_metadata_remove(img, RBD_QOS_META);
        r = r == -ENOENT ? 0 : r;
    } else {
        _cleanup_free_ char *s = json_dumps(params, JSON_COMPACT | JSON_SORT_KEYS);
        r = rbd_metadata_set(img, RBD_QOS_META, s);
    }
    if (r < 0)
        *ret_msg = xasprintf("cannot record the limits in image metadata " RBD_QOS_META ": %s",
                             strerror(-r));
    return r;
}

int rbd_qos_refusal(const struct rbd_req *q, char **msg)
{
    char *m = xasprintf("%s: volume %s not staged; set valid limits with a "
                        "VolumeAttributesClass (ControllerModifyVolume replaces an invalid "
                        "value) or remove it (rbd image-meta remove)", *msg, q->loc.image);
    free(*msg);
    *msg = m;
    return -EUCLEAN;
}

int rbd_stage_mark(const struct rbd_req *q, json_t **ret, char **ret_warn)
{
    struct conn k = {0};
    rbd_image_t img;
    uint64_t size;
    _cleanup_free_ char *msg = NULL;
    *ret = NULL;
    /* A watch of our own for a moment (the check before counted ours). */
    int r = open_volume(q, false, &k, &img, &size, &msg);
    if (r < 0) {
        *ret_warn = xasprintf("cannot open the image to record the node: %s (limits changed "
                              "while it is staged reach its QSD at its next start)", msg);
        return r;
    }
    if (q->node && (r = rbd_metadata_set(img, RBD_NODE_META, q->node)) < 0)
        *ret_warn = xasprintf("cannot record the node in image metadata " RBD_NODE_META ": %s "
                              "(limits changed while it is staged reach its QSD at its next "
                              "start)", strerror(-r));
    else if ((r = rbd_qos_read(img, ret, &msg)) < 0)
        *ret_warn = xasprintf("%s (the QSD keeps the limits it started with)", msg);
    rbd_close(img);
    conn_close(&k);
    return r;
}

/* ---------------------------------------------------- ControllerModifyVolume */

/* Worker: merge, record, and say who serves the image:
 * {params, others, node?, warn?}. */
static int modify_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    const struct rbd_req *q = rbd_req_of(op);
    struct conn k = {0};
    rbd_image_t img;
    uint64_t size;
    int r = open_volume(q, false, &k, &img, &size, ret_msg);
    if (r < 0)
        return r;
    json_t *cur = NULL, *np = NULL;
    _cleanup_free_ char *warn = NULL, *node = NULL;
    if ((r = rbd_qos_read(img, &cur, &warn)) == -EUCLEAN)
        r = 0; /* replaced by the merge over nothing */
    else if (r < 0) {
        *ret_msg = TAKE_PTR(warn);
        goto out;
    }
    size_t n = json_object_size(q->mparams), i = 0;
    const char **keys = xcalloc(n + 1, sizeof(char *)), **vals = xcalloc(n + 1, sizeof(char *));
    const char *key;
    json_t *val;
    json_object_foreach(q->mparams, key, val)
    {
        keys[i] = key;
        vals[i++] = json_string_value(val);
    }
    r = qos_merge(cur, n, keys, vals, &np, NULL, ret_msg);
    free(keys);
    free(vals);
    if (r < 0)
        goto out;
    bool same = cur ? json_equal(np, cur) : json_object_size(np) == 0;
    if ((!same || warn) && (r = rbd_qos_write(img, np, ret_msg)) < 0)
        goto out;
    /* Who has the image open: our own open is one of its watchers. */
    rbd_image_watcher_t w[WATCHERS_MAX];
    size_t nw = WATCHERS_MAX;
    json_int_t others;
    if ((r = rbd_watchers_list(img, w, &nw)) == 0) {
        others = nw > 0 ? (json_int_t)nw - 1 : 0;
        rbd_watchers_list_cleanup(w, nw);
    } else if (r == -ERANGE) {
        others = WATCHERS_MAX;
        r = 0;
    } else {
        *ret_msg = xasprintf("the limits are recorded; cannot list the clients of image %s: %s",
                             q->loc.image, strerror(-r));
        goto out;
    }
    const char *why;
    if (meta_get(img, RBD_NODE_META, NAME_MAX_LEN, &node) == 0 && node &&
        name_validate(node, &why) < 0) {
        free(node);
        node = NULL;
    }
    *ret_result = json_pack("{s:O, s:I, s:s*, s:s*}", "params", np, "others", others, "node",
                            node, "warn", warn);
out:
    json_decref(cur);
    json_decref(np);
    rbd_close(img);
    conn_close(&k);
    return r;
}

static void modify_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    struct csi *c = op->csi;
    struct grpc_call *call = op->call;
    struct rbd_req *q = op_take_ctx(op, &rbd_req_ctx);
    op->worker = NULL;
    op_end(op); /* the call goes on below */
    _cleanup_free_ char *id = rbd_id_format(&q->loc);
    json_t *np = json_object_get(result, "params");
    json_int_t others = 0;
    const char *node = json_string_value(json_object_get(result, "node"));
    const char *warn = json_string_value(json_object_get(result, "warn"));
    if (status == 0 && (!json_is_object(np) ||
                        json_unpack(result, "{s:I}", "others", &others) < 0))
        status = -EBADMSG, msg = "worker returned no limits";
    if (status < 0) {
        grpc_call_fail(call, rbd_code(status), "%s", msg ? msg : strerror(-status));
        rbd_req_free(q);
        return;
    }
    if (warn) {
        _cleanup_free_ char *w = log_quote(warn);
        log_warn("rbd", "invalid limits in image metadata replaced", "volume=%s error=%s", id, w);
    }
    _cleanup_free_ char *lim = json_dumps(np, JSON_COMPACT | JSON_SORT_KEYS);
    _cleanup_free_ char *lq = log_quote(lim ? lim : "{}");
    log_info("rbd", "volume limits recorded in the image", "volume=%s limits=%s clients=%" PRId64
             " node=%s", id, lq, (int64_t)others, node ? node : "-");
    /* Staged here: this node's record and QSD, as for a local volume. */
    _cleanup_free_ char *name = xstrdup(id);
    rbd_id_to_name(name);
    struct vol *v = store_find_vol(c->store, name);
    struct qsd_limits l;
    _cleanup_free_ char *m = NULL;
    if (v && v->staging_path && qos_limits(np, &l, &m) == 0) {
        modify_apply(c, call, v, json_incref(np), &l);
    } else if (others == 0) {
        Csi__V1__ControllerModifyVolumeResponse out = CSI__V1__CONTROLLER_MODIFY_VOLUME_RESPONSE__INIT;
        grpc_call_reply_pb(call, &out.base);
    } else if (node && !streq_ptr(node, c->cfg->node_id) && c->cfg->node_dial) {
        nodecall_forward(c, call, node, "/csi.v1.Controller/ControllerModifyVolume", q->packed,
                         q->packed_len);
    } else if (node && !streq_ptr(node, c->cfg->node_id)) {
        grpc_call_fail(call, GRPC_UNAVAILABLE,
                       "the limits are recorded in image %s, not yet set live: volume %s is "
                       "served by node %s, which this plugin cannot reach (a controller plugin "
                       "with --node-dial forwards the call to it; docs/rbd.md)",
                       q->loc.image, id, node);
    } else {
        grpc_call_fail(call, GRPC_UNAVAILABLE,
                       "the limits are recorded in image %s, not yet set live: %" PRId64
                       " client(s) have it open but %s (a stage in progress, or a client "
                       "other than this plugin's QSDs); a retry sets them once it is staged",
                       q->loc.image, (int64_t)others,
                       node ? "this node does not serve it" : "no node recorded serving it");
    }
    rbd_req_free(q);
}

void rbd_modify_volume(struct csi *c, struct grpc_call *call,
                       Csi__V1__ControllerModifyVolumeRequest *in)
{
    struct rbd_req *q = xcalloc(1, sizeof(*q));
    _cleanup_free_ char *msg = NULL;
    /* The entries alone first: a bad key or value is refused before the
     * cluster is asked (merged over the image's limits in the worker). */
    int r = rbd_id_parse(in->volume_id, "volume_id", &q->loc, &msg);
    if (r == 0 && (r = modify_check(in, &msg)) < 0) {
        char *m = xasprintf("mutable_parameters: %s", msg);
        free(msg);
        msg = m;
    }
    if (r == 0)
        r = RBD_CRED_OF(in, "controller-modify", &q->cred, &msg);
    if (r < 0) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "%s", msg);
        rbd_req_free(q);
        return;
    }
    q->mparams = json_object();
    for (size_t i = 0; i < in->n_mutable_parameters; i++)
        json_object_set_new(q->mparams, in->mutable_parameters[i]->key,
                            json_string(in->mutable_parameters[i]->value));
    q->packed_len = protobuf_c_message_get_packed_size(&in->base);
    q->packed = xmalloc(q->packed_len + 1);
    protobuf_c_message_pack(&in->base, q->packed);
    rbd_start(c, call, q, 0, modify_fn, modify_done);
}
