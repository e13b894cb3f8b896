/* service.c: see service.h. */
#include "service.h"
#include "backend.h"
#include "qsd/base/log.h"
#include "qsd/base/names.h"
#include "params.h"
#include "qsd/state/records.h"
#include "qsd/qemu/qmpcmd.h"
#include "qsd/qemu/thin.h"
#include "pbcheck.h"
#include "qsd/base/util.h"

#include <dirent.h>
#include <inttypes.h>
#include <sys/stat.h>

/* ------------------------------------------------------------- ops */

struct op *op_begin(struct csi *c, struct grpc_call *call)
{
    struct op *op = xcalloc(1, sizeof(*op));
    op->csi = c;
    op->call = call;
    op->next = c->ops;
    c->ops = op;
    return op;
}

void op_end(struct op *op)
{
    struct csi *c = op->csi;
    for (struct op **pp = &c->ops; *pp; pp = &(*pp)->next)
        if (*pp == op) {
            *pp = op->next;
            break;
        }
    if (op->vol)
        op->vol->busy = false;
    if (op->vol2)
        op->vol2->busy = false;
    if (op->snap)
        op->snap->busy = false;
    if (op->snap_read)
        op->snap_read->readers--;
    qmp_close(op->qmp);
    free(op->node);
    free(op->image);
    free(op->vol_id);
    if (op->rbd)
        op->rbd_free(op->rbd);
    free(op);
}

/* In the worker child: the records first, then the operation. */
static int op_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    int r = records_flush_pending(op->csi->records);
    if (r < 0) {
        *ret_msg = xasprintf("the plugin's records could not be written to disk: %s",
                             strerror(-r));
        return r;
    }
    return op->fn(arg, ret_msg, ret_result);
}

static uint64_t records_seq(void *opaque) { return records_queued(opaque); }

static void records_durable(uint64_t seq, int err, void *opaque)
{
    grpc_server_durable(opaque, seq, err);
}

void csi_hold_answers(struct csi *c, struct grpc_server *srv)
{
    grpc_server_set_barrier(srv, records_seq, c->records);
    records_on_durable(c->records, records_durable, srv);
}

int op_worker(struct op *op, worker_fn fn, uint64_t timeout_ms, worker_done done)
{
    size_t n = 0;
    for (struct op *o = op->csi->ops; o; o = o->next)
        n += o->worker != NULL;
    if (n >= CSI_MAX_WORKERS) {
        grpc_call_fail(op->call, GRPC_RESOURCE_EXHAUSTED,
                       "%zu operations are running in worker processes already; retry", n);
        op_end(op);
        return -EBUSY;
    }
    op->fn = fn;
    int r = worker_start(op->csi->loop, op_fn, op, timeout_ms, done, op, &op->worker);
    if (r < 0) {
        grpc_call_fail(op->call, GRPC_INTERNAL, "cannot start a worker process: %s", strerror(-r));
        op_end(op);
    }
    return r;
}

/* ---------------------------------------------------- layer removal */

static int gc_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct csi *c = arg;
    unsigned n = 0;
    uint64_t freed = 0;
    int r = pool_gc(&c->pool, &n, &freed, ret_msg);
    if (r == 0)
        *ret_result = json_pack("{s:I, s:I}", "removed", (json_int_t)n, "freed", (json_int_t)freed);
    return r;
}

static void gc_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct csi *c = opaque;
    c->gc = NULL;
    json_int_t n = 0, freed = 0;
    if (status < 0) {
        _cleanup_free_ char *q = log_quote(msg ? msg : strerror(-status));
        log_warn("plugin", "removal of unused layers failed", "error=%s", q);
    } else if (json_unpack(result, "{s:I, s:I}", "removed", &n, "freed", &freed) == 0 && n > 0) {
        log_info("plugin", "removed unused layers", "layers=%lld freed_bytes=%lld", (long long)n,
                 (long long)freed);
    }
    if (c->gc_again) {
        c->gc_again = false;
        csi_gc(c);
    }
}

void csi_gc(struct csi *c)
{
    if (c->gc) {
        c->gc_again = true;
        return;
    }
    int r = worker_start(c->loop, gc_fn, c, 2ull * 60 * 1000, gc_done, c, &c->gc);
    if (r < 0) {
        c->gc = NULL;
        log_warn("plugin", "cannot start the removal of unused layers", "error=\"%s\"",
                 strerror(-r));
    }
}

ProtobufCMessage *csi_request_unpack(struct grpc_call *call, const ProtobufCMessageDescriptor *d,
                                     const uint8_t *req, size_t len)
{
    _cleanup_free_ char *field = NULL;
    int r = pb_check_strings(d, req, len, &field);
    if (r == -E2BIG) {
        grpc_call_fail(call, GRPC_RESOURCE_EXHAUSTED, "the request has more than %d fields",
                       PBCHECK_MAX_FIELDS);
        return NULL;
    }
    if (r < 0) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "%s contains a NUL byte", field);
        return NULL;
    }
    ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, len, req);
    if (!m)
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "cannot decode the request (%s)", d->name);
    return m;
}

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
    if (cap->access_type_case == CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_BLOCK)
        return "access type block is not supported: the volume is served as a vhost-user "
               "socket in a directory (use access type mount)";
    if (cap->access_type_case != CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_MOUNT || !cap->mount)
        return "volume_capability.access_type is missing";
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

/* ------------------------------------------------------------ volumes */

bool vol_live(const struct vol *v)
{
    return v->qsd && qsd_running(v->qsd);
}

int vol_params_from_json(json_t *params, struct vol_params *ret, char **ret_msg)
{
    size_t n = json_object_size(params), i = 0;
    const char **keys = xcalloc(n + 1, sizeof(char *)), **vals = xcalloc(n + 1, sizeof(char *));
    const char *k;
    json_t *val;
    json_object_foreach(params, k, val)
    {
        keys[i] = k;
        vals[i] = json_string_value(val) ? json_string_value(val) : "";
        i++;
    }
    int r = vol_params_parse(i, keys, vals, ret, ret_msg);
    free(keys);
    free(vals);
    return r;
}

int export_opts_from(json_t *parameters, char *image, char *format, bool read_only, int gid,
                     struct qsd_opts *ret, char **ret_msg)
{
    struct vol_params p;
    int r = vol_params_from_json(parameters, &p, ret_msg);
    if (r < 0) {
        free(image);
        free(format);
        return r;
    }
    struct qsd_opts o = p.opts;
    memset(&p.opts, 0, sizeof(p.opts));
    vol_params_clear(&p);
    o.image = image;
    o.format = format;
    /* No iothread: QEMU 10.0.2 hangs (or aborts) a QSD whose export runs in
     * an iothread on any drain while the client does I/O: the graph changes
     * of thin snapshots and merges, block_resize of online expansion
     * (measured, thin.c).  In the main loop they work; one QSD serves one
     * volume, so its main loop has nothing else to do. */
    o.iothread = false;
    o.read_only = read_only;
    o.socket_gid = gid;
    o.socket_mode = 0660;
    *ret = o;
    return 0;
}

int vol_export_opts(struct csi *c, const struct vol *v, struct qsd_opts *ret, char **ret_msg)
{
    return BACKEND_OF(.record = v)->export_opts(c, v, ret, ret_msg);
}

static void qsd_event(struct qsd *q, enum qsd_event ev, const char *detail, void *opaque)
{
    struct csi *c = opaque;
    struct vol *v = store_find_vol(c->store, qsd_get_volume(q));
    /* A QSD not supervised (an RBD volume's) is restarted by its backend,
     * after its checks (a first start that fails is its starter's). */
    const struct backend *b = v ? BACKEND_OF(.record = v) : NULL;
    if (ev == QSD_EV_DIED && b && !b->supervised && v->staging_path && !v->start_ctx)
        b->restart(c, v);
    static const char *const names[] = {"ready", "died", "restarted", "start failed", "stopped",
                                        "crash loop: retried every 30 s"};
    _cleanup_free_ char *d = detail ? log_quote(detail) : NULL;
    if (ev == QSD_EV_CRASH_LOOP)
        log_error("qsd", names[ev], "volume=%s detail=%s", qsd_get_volume(q), d ? d : "-");
    else if (ev == QSD_EV_DIED || ev == QSD_EV_START_FAILED)
        log_warn("qsd", names[ev], "volume=%s detail=%s", qsd_get_volume(q), d ? d : "-");
    else
        log_info("qsd", names[ev], "volume=%s pid=%d restarts=%u", qsd_get_volume(q),
                 (int)qsd_get_pid(q), qsd_restart_count(q));
}

struct start_ctx {
    struct csi *c;
    struct vol *v;
    vol_started_fn done;
    void *opaque;
};

static void started(struct qsd *q, int status, const char *msg, void *opaque)
{
    struct start_ctx *s = opaque;
    struct csi *c = s->c;
    struct vol *v = s->v;
    vol_started_fn done = s->done;
    void *o = s->opaque;
    v->start_ctx = NULL;
    free(s);
    if (status == 0) {
        int r = qsd_write_meta(q, v->image_size);
        if (r < 0)
            log_warn("qsd", "cannot write volume.json", "volume=%s error=\"%s\"", v->id,
                     strerror(-r));
    }
    done(c, v, status, msg, o);
}

int vol_qsd_start(struct csi *c, struct vol *v, vol_started_fn done, void *opaque, char **ret_msg)
{
    struct qsd_opts o;
    int r = vol_export_opts(c, v, &o, ret_msg);
    if (r < 0)
        return r;
    if (!v->qsd) {
        qsd_new(c->loop, &c->qcfg, v->id, &o, &v->qsd);
        qsd_set_event_handler(v->qsd, qsd_event, c);
        qsd_set_supervised(v->qsd, BACKEND_OF(.record = v)->supervised);
    }
    qsd_opts_clear(&o);
    struct start_ctx *s = xcalloc(1, sizeof(*s));
    *s = (struct start_ctx){c, v, done, opaque};
    r = qsd_start(v->qsd, started, s);
    if (r == 0)
        v->start_ctx = s;
    if (r < 0) {
        free(s);
        *ret_msg = xasprintf("cannot start qemu-storage-daemon: %s", strerror(-r));
    }
    return r;
}

/* ----------------------------------------------------------- recovery */

static void recovery_started(struct csi *c, struct vol *v, int status, const char *msg,
                             void *opaque)
{
    if (status < 0) {
        _cleanup_free_ char *q = log_quote(msg ? msg : strerror(-status));
        log_error("plugin", "restart of a staged volume's QSD failed", "volume=%s error=%s",
                  v->id, q);
    } else {
        log_info("plugin", "restarted the QSD of a staged volume", "volume=%s pid=%d", v->id,
                 (int)qsd_get_pid(v->qsd));
    }
}

void csi_remove_runtime(struct csi *c, const char *id)
{
    int r = qsd_remove_runtime(c->cfg->run_dir, id);
    if (r < 0)
        log_warn("plugin", "cannot remove a volume's runtime directories",
                 "volume=%s error=\"%s\"", id, strerror(-r));
}

/* Remove dir/<prefix><digits>: temporary files image.c names
 * "<final>.tmp-<pid>" that a killed worker left behind. */
static void remove_tmp(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    size_t n = strlen(prefix);
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *rest = de->d_name + n;
        if (strncmp(de->d_name, prefix, n) != 0 || !*rest || strspn(rest, "0123456789") != strlen(rest))
            continue;
        _cleanup_free_ char *path = xasprintf("%s/%s", dir, de->d_name);
        if (unlink(path) == 0)
            log_info("plugin", "removed a temporary file left by a killed worker", "path=%s", path);
    }
    closedir(d);
}

static void remove_tmp_files(struct csi *c, const char *vol, const char *snap)
{
    if (vol) {
        _cleanup_free_ char *q = xasprintf(".%s.qcow2.tmp-", vol);
        _cleanup_free_ char *r = xasprintf(".%s.raw.tmp-", vol);
        _cleanup_free_ char *cl = xasprintf("..clone-%s.tmp-", vol);
        remove_tmp(c->pool.volumes, q);
        remove_tmp(c->pool.volumes, r);
        remove_tmp(c->pool.snapshots, cl);
    }
    if (snap) {
        _cleanup_free_ char *s = xasprintf(".%s.tmp-", snap);
        remove_tmp(c->pool.snapshots, s);
    }
}

/* A thin snapshot of v interrupted by the crash is finished or undone
 * (thin.h), asking its QSD when one runs it read-write.  Start-up only: the
 * loop does not run yet, and every wait here is bounded. */
static void recover_layers(struct csi *c, struct vol *v, bool running)
{
    if (!streq(v->format, "qcow2"))
        return;
    struct qmp_sync *s = NULL;
    _cleanup_free_ char *msg = NULL;
    if (running && !v->stage_ro &&
        qmpc_connect_volume(c->cfg->run_dir, v->id, QMP_DEFAULT_TIMEOUT_MS, &s, &msg) < 0) {
        /* Without its answer nothing can be decided: leave it for the
         * next snapshot of the volume (thin_snapshot recovers first). */
        _cleanup_free_ char *q = log_quote(msg);
        log_error("plugin", "cannot check the layers of a staged volume", "volume=%s error=%s",
                  v->id, q);
        return;
    }
    const char *what = NULL;
    int r = thin_recover(&c->pool, v->id, s, &what, &msg);
    qmp_sync_close(s);
    if (r < 0) {
        _cleanup_free_ char *q = log_quote(msg ? msg : strerror(-r));
        log_error("plugin", "cannot recover the layers of a volume", "volume=%s error=%s", v->id, q);
    } else if (what) {
        log_info("plugin", what, "volume=%s", v->id);
    }
}

/* A QSD found running at start is kept when its volume is staged (it was
 * adopted) or not the plugin's (an operator's qsdctl export). */
static bool keep_qsd(const char *volume, pid_t pid, void *arg)
{
    struct csi *c = arg;
    struct vol *v = store_find_vol(c->store, volume);
    return !v || v->staging_path;
}

void csi_recover(struct csi *c)
{
    struct store *s = c->store;
    for (size_t i = 0; i < s->n_snaps;) {
        struct snap *sn = s->snaps[i];
        if (sn->phase == PHASE_READY) {
            i++;
            continue;
        }
        _cleanup_free_ char *msg = NULL;
        snapshot_delete(&c->pool, sn->id, &msg);
        remove_tmp_files(c, NULL, sn->id);
        log_info("plugin", "removed a snapshot left half-done", "snapshot=%s phase=%s", sn->id,
                 sn->phase == PHASE_CREATING ? "creating" : "deleting");
        store_remove_snap(s, sn);
    }
    for (size_t i = 0; i < s->n_vols;) {
        struct vol *v = s->vols[i];
        if (v->phase != PHASE_READY) {
            if (v->staging_path) {
                _cleanup_free_ char *msg = NULL;
                qsd_stop_sync(&c->qcfg, v->id, &msg);
                csi_remove_runtime(c, v->id);
            }
            _cleanup_free_ char *msg = NULL;
            image_delete(&c->pool, v->id, &msg);
            _cleanup_free_ char *tmp = xasprintf(".clone-%s", v->id);
            _cleanup_free_ char *msg2 = NULL;
            snapshot_delete(&c->pool, tmp, &msg2);
            remove_tmp_files(c, v->id, NULL);
            log_info("plugin", "removed a volume left half-done", "volume=%s phase=%s", v->id,
                     v->phase == PHASE_CREATING ? "creating" : "deleting");
            store_remove_vol(s, v);
            continue;
        }
        i++;
        if (!v->staging_path)
            continue; /* its layers: below, once no QSD runs it */
        _cleanup_free_ char *msg = NULL;
        struct qsd_opts o;
        if (vol_export_opts(c, v, &o, &msg) < 0) {
            _cleanup_free_ char *q = log_quote(msg);
            log_error("plugin", "staged volume cannot be served", "volume=%s error=%s", v->id, q);
            continue;
        }
        qsd_new(c->loop, &c->qcfg, v->id, &o, &v->qsd);
        qsd_opts_clear(&o);
        qsd_set_event_handler(v->qsd, qsd_event, c);
        const struct backend *b = BACKEND_OF(.record = v);
        qsd_set_supervised(v->qsd, b->supervised);
        if (qsd_adopt(v->qsd) == 0) {
            log_info("plugin", "adopted the QSD of a staged volume", "volume=%s pid=%d", v->id,
                     (int)qsd_get_pid(v->qsd));
            recover_layers(c, v, true);
            b->adopted(c, v);
            continue;
        }
        if (!b->supervised) { /* started after the backend's check (rbd_lock.h) */
            log_info("plugin", "QSD of a staged RBD volume is not running, checking before "
                     "starting it", "volume=%s", v->id);
            b->restart(c, v);
            continue;
        }
        log_info("plugin", "QSD of a staged volume is not running, starting it", "volume=%s",
                 v->id);
        recover_layers(c, v, false);
        free(msg);
        msg = NULL;
        if (vol_qsd_start(c, v, recovery_started, NULL, &msg) < 0) {
            _cleanup_free_ char *q = log_quote(msg);
            log_error("plugin", "cannot restart the QSD of a staged volume", "volume=%s error=%s",
                      v->id, q);
        }
    }
    /* QSDs of the plugin's volumes that are not staged: left by a plugin
     * killed during NodeUnstageVolume (or NodeStageVolume's undo). */
    qsd_stop_orphans(&c->qcfg, keep_qsd, c);
    for (size_t i = 0; i < s->n_vols; i++)
        if (!s->vols[i]->staging_path)
            recover_layers(c, s->vols[i], false);
}

void reply_controller_caps(struct grpc_call *call,
                           const Csi__V1__ControllerServiceCapability__RPC__Type *types, size_t n)
{
    Csi__V1__ControllerServiceCapability__RPC rpc[16];
    Csi__V1__ControllerServiceCapability caps[16], *list[16];
    n = MIN(n, ARRAY_SIZE(rpc));
    for (size_t i = 0; i < n; i++) {
        rpc[i] = (Csi__V1__ControllerServiceCapability__RPC)
            CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__INIT;
        rpc[i].type = types[i];
        caps[i] = (Csi__V1__ControllerServiceCapability)CSI__V1__CONTROLLER_SERVICE_CAPABILITY__INIT;
        caps[i].type_case = CSI__V1__CONTROLLER_SERVICE_CAPABILITY__TYPE_RPC;
        caps[i].rpc = &rpc[i];
        list[i] = &caps[i];
    }
    Csi__V1__ControllerGetCapabilitiesResponse out =
        CSI__V1__CONTROLLER_GET_CAPABILITIES_RESPONSE__INIT;
    out.n_capabilities = n;
    out.capabilities = list;
    grpc_call_reply_pb(call, &out.base);
}
