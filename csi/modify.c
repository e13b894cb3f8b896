/* SPDX-License-Identifier: Apache-2.0 */
/* modify.c: ControllerModifyVolume (modify.h).  A request's limits are
 * validated (qos.h), merged over the record's, written into the record
 * (what a restarted QSD starts with, and what start-up applies to an
 * adopted one: recover.c), then set on the volume's running QSD by qom-set
 * of its throttle group.  A repeated request sets them again: that is also
 * what finishes one cut short by a crash between the two steps. */
#include "modify.h"
#include "ids.h"
#include "op.h"
#include "qos.h"
#include "service.h"
#include "volqsd.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"
#include "qsd/qemu/qmpcmd.h"

#define MODIFY_QMP_TIMEOUT_MS 10000

static int merge_entries(json_t *cur, size_t n, Csi__V1__CreateVolumeRequest__MutableParametersEntry **e,
                         json_t **ret, struct qsd_limits *ret_l, char **ret_msg)
{
    const char **keys = xcalloc(n + 1, sizeof(char *)), **vals = xcalloc(n + 1, sizeof(char *));
    for (size_t i = 0; i < n; i++) {
        keys[i] = e[i]->key ? e[i]->key : "";
        vals[i] = e[i]->value ? e[i]->value : "";
    }
    int r = qos_merge(cur, n, keys, vals, ret, ret_l, ret_msg);
    free(keys);
    free(vals);
    return r;
}

int modify_params_of(size_t n, Csi__V1__CreateVolumeRequest__MutableParametersEntry **e,
                     json_t **ret, char **ret_msg)
{
    json_t *p = NULL;
    int r = merge_entries(NULL, n, e, &p, NULL, ret_msg);
    if (r < 0)
        return r;
    if (!json_object_size(p)) {
        json_decref(p);
        p = NULL;
    }
    *ret = p;
    return 0;
}

struct modify_ctx {
    struct qsd_limits limits;
    bool answered;
};

static const struct op_ctx_type modify_ctx_type = {"ControllerModifyVolume", free};

static void modify_finish(struct op *op, int status, const char *msg)
{
    struct modify_ctx *x = op_ctx(op, &modify_ctx_type);
    if (x->answered)
        return;
    x->answered = true;
    if (status == 0) {
        log_info("controller", "volume limits set live", "volume=%s", op->vol->id);
        Csi__V1__ControllerModifyVolumeResponse out = CSI__V1__CONTROLLER_MODIFY_VOLUME_RESPONSE__INIT;
        grpc_call_reply_pb(op->call, &out.base);
    } else {
        /* The record holds the new limits: a retry sets them again, a
         * restarted QSD starts with them. */
        grpc_call_fail(op->call, GRPC_UNAVAILABLE,
                       "the limits are recorded but not set on the running QSD of volume %s: %s",
                       op->vol->id, msg ? msg : strerror(-status));
    }
    op_end(op);
}

static void on_set(int status, const char *msg, void *opaque)
{
    modify_finish(opaque, status, msg);
}

static void on_qmp_state(struct qmp *q, int status, const struct qmp_error *err, void *opaque)
{
    struct op *op = opaque;
    struct modify_ctx *x = op_ctx(op, &modify_ctx_type);
    if (status == 0) {
        int r = qmpc_set_limits_async(q, &x->limits, MODIFY_QMP_TIMEOUT_MS, on_set, op);
        if (r < 0)
            modify_finish(op, r, "cannot send qom-set");
        return;
    }
    if (op->qmp == q && !x->answered) {
        _cleanup_free_ char *m = xasprintf("cannot talk to the QSD: %s",
                                           err && err->desc ? err->desc : strerror(-status));
        op->qmp = NULL;
        qmp_close(q);
        modify_finish(op, -ECONNRESET, m);
    }
}

/* The record is updated: set the limits on the running QSD. */
static void modify_live(struct csi *c, struct grpc_call *call, struct vol *v,
                        const struct qsd_limits *l)
{
    struct op *op = op_begin(c, call);
    struct modify_ctx *x = op_set_ctx(op, &modify_ctx_type, xcalloc(1, sizeof(*x)));
    op->vol = v;
    v->busy = true;
    x->limits = *l;
    int r = qmp_connect(c->loop, qsd_get_paths(v->qsd)->qmp, MODIFY_QMP_TIMEOUT_MS, on_qmp_state,
                        op, &op->qmp);
    if (r < 0) {
        op->qmp = NULL;
        modify_finish(op, r, "cannot connect to the QSD monitor");
    }
}

int modify_check(Csi__V1__ControllerModifyVolumeRequest *in, char **ret_msg)
{
    size_t n = in->n_mutable_parameters;
    const char **keys = xcalloc(n + 1, sizeof(char *)), **vals = xcalloc(n + 1, sizeof(char *));
    for (size_t i = 0; i < n; i++) {
        keys[i] = in->mutable_parameters[i]->key ? in->mutable_parameters[i]->key : "";
        vals[i] = in->mutable_parameters[i]->value ? in->mutable_parameters[i]->value : "";
    }
    int r = qos_check(n, keys, vals, ret_msg);
    free(keys);
    free(vals);
    return r;
}

int modify_merge(json_t *current, Csi__V1__ControllerModifyVolumeRequest *in, json_t **ret,
                 struct qsd_limits *ret_limits, char **ret_msg)
{
    return merge_entries(current, in->n_mutable_parameters,
                         (Csi__V1__CreateVolumeRequest__MutableParametersEntry **)in->mutable_parameters,
                         ret, ret_limits, ret_msg);
}

void modify_apply(struct csi *c, struct grpc_call *call, struct vol *v, json_t *np,
                  const struct qsd_limits *l)
{
    if (v->busy) {
        json_decref(np);
        grpc_call_fail(call, GRPC_ABORTED, "an operation on volume %s is in progress", v->id);
        return;
    }
    json_t *old = v->mutable_params;
    v->mutable_params = np;
    int r = store_save_vol(c->store, v);
    if (r < 0) {
        v->mutable_params = old;
        json_decref(np);
        grpc_call_fail(call, GRPC_INTERNAL, "cannot write the volume record: %s", strerror(-r));
        return;
    }
    json_decref(old);
    _cleanup_free_ char *lim = json_dumps(np, JSON_COMPACT | JSON_SORT_KEYS);
    _cleanup_free_ char *q = log_quote(lim ? lim : "{}");
    log_info("controller", "volume limits recorded", "volume=%s limits=%s live=%s", v->id, q,
             vol_live(v) ? "yes" : "no");
    if (!vol_live(v)) {
        Csi__V1__ControllerModifyVolumeResponse out = CSI__V1__CONTROLLER_MODIFY_VOLUME_RESPONSE__INIT;
        grpc_call_reply_pb(call, &out.base);
        return;
    }
    modify_live(c, call, v, l);
}

void modify_volume_local(struct csi *c, struct grpc_call *call,
                         Csi__V1__ControllerModifyVolumeRequest *in)
{
    const char *node = csi_id_node(c, in->volume_id);
    if (node) {
        grpc_call_fail(call, GRPC_UNAVAILABLE,
                       "volume %s lives on node %s: ControllerModifyVolume reaches only the "
                       "volumes of this plugin's node (%s); a controller plugin with "
                       "--node-dial forwards it to the volume's node (docs/node-operations.md)",
                       in->volume_id, node, c->cfg->node_id);
        return;
    }
    _cleanup_free_ char *id = xstrdup(in->volume_id);
    if (!csi_id_ok(c, call, "volume_id", id))
        return;
    struct vol *v = store_find_vol(c->store, id);
    if (!v || v->phase != PHASE_READY) {
        grpc_call_fail(call, GRPC_NOT_FOUND, "volume %s does not exist", in->volume_id);
        return;
    }
    json_t *np = NULL;
    struct qsd_limits l;
    _cleanup_free_ char *msg = NULL;
    if (modify_merge(v->mutable_params, in, &np, &l, &msg) < 0) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "%s", msg);
        return;
    }
    modify_apply(c, call, v, np, &l);
}
