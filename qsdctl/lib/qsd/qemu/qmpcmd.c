/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/qmpcmd.c: the QMP commands the project sends.  See qmpcmd.h. */
#include "qsd/qemu/qmpcmd.h"
#include "qsd/qemu/qsdopts.h"
#include "qsd/base/util.h"

#include <inttypes.h>

/* ------------------------------------------------------------ builders */

void qmpc_clear(struct qmpc *c)
{
    json_decref(c->args);
    c->args = NULL;
}

struct qmpc qmpc_named(struct qmpc c, const char *what)
{
    c.what = what;
    return c;
}

static struct qmpc cmd(const char *name, json_t *args)
{
    return (struct qmpc){.cmd = name, .args = args, .what = name};
}

struct qmpc qmpc_quit(void) { return cmd("quit", NULL); }
struct qmpc qmpc_query_block_exports(void) { return cmd("query-block-exports", NULL); }
struct qmpc qmpc_query_block_jobs(void) { return cmd("query-block-jobs", NULL); }
struct qmpc qmpc_query_block_graph(void) { return cmd("x-debug-query-block-graph", NULL); }

struct qmpc qmpc_query_named_block_nodes(void)
{
    return cmd("query-named-block-nodes", json_pack("{s:b}", "flat", 1));
}

struct qmpc qmpc_query_blockstats(void)
{
    return cmd("query-blockstats", json_pack("{s:b}", "query-nodes", 1));
}

struct qmpc qmpc_qom_list(const char *path)
{
    return cmd("qom-list", json_pack("{s:s}", "path", path));
}

struct qmpc qmpc_block_resize(const char *node, uint64_t size)
{
    return cmd("block_resize", json_pack("{s:s, s:I}", "node-name", node, "size", (json_int_t)size));
}

struct qmpc qmpc_blockdev_add(json_t *node) { return cmd("blockdev-add", node); }

struct qmpc qmpc_set_limits(const struct qsd_limits *l)
{
    return cmd("qom-set", json_pack("{s:s, s:s, s:o}", "path", QSD_THROTTLE_GROUP, "property",
                                    "limits", "value", qsd_limits_json(l)));
}

struct qmpc qmpc_get_limits(void)
{
    return cmd("qom-get", json_pack("{s:s, s:s}", "path", QSD_THROTTLE_GROUP, "property", "limits"));
}

struct qmpc qmpc_blockdev_add_qcow2_file(const char *node, const char *filename)
{
    return cmd("blockdev-add", json_pack("{s:s, s:s, s:{s:s, s:s}}", "driver", "qcow2", "node-name",
                                         node, "file", "driver", "file", "filename", filename));
}

struct qmpc qmpc_blockdev_del(const char *node)
{
    return cmd("blockdev-del", json_pack("{s:s}", "node-name", node));
}

struct qmpc qmpc_blockdev_snapshot(const char *node, const char *overlay)
{
    return cmd("blockdev-snapshot", json_pack("{s:s, s:s}", "node", node, "overlay", overlay));
}

struct qmpc qmpc_blockdev_backup(const char *job, const char *device, const char *target)
{
    return cmd("blockdev-backup", json_pack("{s:s, s:s, s:s, s:s}", "job-id", job, "device", device,
                                            "target", target, "sync", "full"));
}

struct qmpc qmpc_block_stream(const char *job, const char *device, const char *base_node,
                              const char *backing_file)
{
    json_t *a = json_pack("{s:s, s:s}", "job-id", job, "device", device);
    if (base_node) {
        json_object_set_new(a, "base-node", json_string(base_node));
        json_object_set_new(a, "backing-file", json_string(backing_file));
    }
    return cmd("block-stream", a);
}

struct qmpc qmpc_block_job_cancel(const char *job)
{
    return cmd("block-job-cancel", json_pack("{s:s, s:b}", "device", job, "force", 1));
}

struct qmpc qmpc_raw(const char *name, json_t *args) { return cmd(name, args); }

/* ------------------------------------------------------------- parsers */

/* A string member without NUL bytes (a QSD's reply is not trusted), or NULL. */
static const char *str_member(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    const char *s = json_string_value(v);
    return s && strlen(s) == json_string_length(v) ? s : NULL;
}

/* A non-negative integer member. */
static bool uint_member(json_t *o, const char *key, uint64_t *ret)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *ret = (uint64_t)json_integer_value(v);
    return true;
}

int qmpc_parse_export_node(json_t *ret, const char *export_id, char **ret_node)
{
    if (!json_is_array(ret))
        return -EBADMSG;
    size_t i;
    json_t *it;
    json_array_foreach(ret, i, it)
    {
        if (!streq_ptr(str_member(it, "id"), export_id))
            continue;
        const char *n = str_member(it, "node-name");
        if (!n || !*n)
            return -EBADMSG;
        *ret_node = xstrdup(n);
        return 0;
    }
    return -ENOENT;
}

int qmpc_parse_node_size(json_t *ret, const char *node, uint64_t *ret_size)
{
    if (!json_is_array(ret))
        return -EBADMSG;
    size_t i;
    json_t *it;
    json_array_foreach(ret, i, it)
    {
        if (!streq_ptr(str_member(it, "node-name"), node))
            continue;
        uint64_t v;
        if (!uint_member(json_object_get(it, "image"), "virtual-size", &v))
            return -EBADMSG;
        *ret_size = v;
        return 0;
    }
    return -ENOENT;
}

bool qmpc_event_is_job(json_t *data, const char *job)
{
    return streq_ptr(str_member(data, "device"), job) || streq_ptr(str_member(data, "id"), job);
}

const char *qmpc_job_error(json_t *data)
{
    json_t *e = json_object_get(data, "error");
    if (!e)
        return NULL;
    /* A failure whatever its form; its text only when it is clean text. */
    const char *s = str_member(data, "error");
    return s && *s ? s : "(the job failed without a readable error)";
}

int qmpc_parse_job_listed(json_t *ret, const char *job, bool *ret_listed)
{
    if (!json_is_array(ret))
        return -EBADMSG;
    size_t i;
    json_t *it;
    bool found = false;
    json_array_foreach(ret, i, it) found = found || qmpc_event_is_job(it, job);
    *ret_listed = found;
    return 0;
}

int qmpc_parse_iothreads(json_t *ret, unsigned *ret_n)
{
    if (!json_is_array(ret))
        return -EBADMSG;
    size_t i;
    json_t *it;
    unsigned n = 0;
    json_array_foreach(ret, i, it) n += streq_ptr(str_member(it, "type"), "child<iothread>");
    *ret_n = n;
    return 0;
}

static uint64_t add_sat(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

int qmpc_parse_discard(json_t *ret, struct qmpc_discard *ret_stats)
{
    if (!json_is_array(ret))
        return -EBADMSG;
    struct qmpc_discard st = {0};
    size_t i;
    json_t *it;
    json_array_foreach(ret, i, it)
    {
        json_t *ds = json_object_get(it, "driver-specific");
        if (!streq_ptr(str_member(ds, "driver"), "file"))
            continue;
        uint64_t v;
        if (uint_member(ds, "discard-nb-ok", &v))
            st.ops = add_sat(st.ops, v);
        if (uint_member(ds, "discard-bytes-ok", &v))
            st.bytes = add_sat(st.bytes, v);
    }
    *ret_stats = st;
    return 0;
}

int qmpc_parse_block_graph(json_t *ret, json_t **ret_graph)
{
    if (!json_is_object(ret) || !json_is_array(json_object_get(ret, "nodes")) ||
        !json_is_array(json_object_get(ret, "edges")))
        return -EBADMSG;
    *ret_graph = json_incref(ret);
    return 0;
}

static json_t *graph_node(json_t *nodes, const char *key, json_t *want)
{
    size_t i;
    json_t *n;
    json_array_foreach(nodes, i, n)
        if (json_equal(json_object_get(n, key), want) &&
            streq_ptr(str_member(n, "type"), "block-driver"))
            return n;
    return NULL;
}

int qmpc_parse_filter_child(json_t *graph, const char *filter, const char **ret_child)
{
    json_t *nodes = json_object_get(graph, "nodes"), *edges = json_object_get(graph, "edges");
    if (!json_is_array(nodes) || !json_is_array(edges))
        return -EBADMSG;
    json_t *name = json_string(filter);
    json_t *f = graph_node(nodes, "name", name);
    json_decref(name);
    if (!f)
        return -ENOENT;
    size_t i;
    json_t *e;
    json_array_foreach(edges, i, e)
    {
        if (!streq_ptr(str_member(e, "name"), "file") ||
            !json_equal(json_object_get(e, "parent"), json_object_get(f, "id")))
            continue;
        json_t *c = graph_node(nodes, "id", json_object_get(e, "child"));
        const char *cn = c ? str_member(c, "name") : NULL;
        if (!cn || !*cn)
            return -EBADMSG;
        *ret_child = cn;
        return 0;
    }
    return -ENOENT;
}

int qmpc_parse_limits(json_t *ret, struct qsd_limits *ret_limits)
{
    if (!json_is_object(ret))
        return -EBADMSG;
    struct qsd_limits l = {0};
    for (int i = 0; i < QSD_LIM_N; i++) {
        json_t *v = json_object_get(ret, QSD_LIMIT_KEYS[i]);
        if (!v)
            continue;
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return -EBADMSG;
        l.v[i] = (uint64_t)json_integer_value(v);
    }
    *ret_limits = l;
    return 0;
}

/* -------------------------------------------------------------- runners */

int qmpc_fail_msg(const struct qmpc *c, int status, const struct qmp_error *e, char **ret_msg)
{
    *ret_msg = xasprintf("%s failed: %s (%s)", c->what ? c->what : c->cmd,
                         e && e->desc ? e->desc : strerror(-status),
                         e && e->klass ? e->klass : "error");
    return errno_from_text(status, *ret_msg);
}

int qmpc_send(struct qmp *q, struct qmpc c, uint64_t timeout_ms, qmp_reply_cb cb, void *opaque)
{
    return qmp_send(q, c.cmd, c.args, timeout_ms, cb, opaque);
}

/* The same for a wrapper that owns opaque: release(opaque) if the client is
 * closed before the reply. */
static int send_owned(struct qmp *q, struct qmpc c, uint64_t timeout_ms, qmp_reply_cb cb,
                      void *opaque, void (*release)(void *))
{
    return qmp_send_owned(q, c.cmd, c.args, timeout_ms, cb, opaque, release);
}

struct call {
    bool done;
    int status;
    json_t *ret;
    struct qmp_error err;
};

static void on_call_reply(struct qmp *q, const struct qmp_reply *r, void *opaque)
{
    struct call *c = opaque;
    c->done = true;
    c->status = r->status;
    if (r->status == 0)
        c->ret = json_incref(r->ret);
    else
        qmp_error_set(&c->err, r->err && r->err->klass ? r->err->klass : "Error", "%s",
                      r->err && r->err->desc ? r->err->desc : strerror(-r->status));
}

int qmpc_call(struct qmp_sync *s, struct qmpc c, json_t **ret_return, bool *ret_refused,
              char **ret_msg)
{
    struct call call = {0};
    struct qmp *q = qmp_sync_client(s);
    int r = q ? qmpc_send(q, c, QMP_DEFAULT_TIMEOUT_MS, on_call_reply, &call) : -ENOTCONN;
    if (!q)
        qmpc_clear(&c);
    if (r == 0)
        r = qmp_sync_run(s, &call.done);
    if (r == 0)
        r = call.status;
    if (r < 0) {
        if (ret_refused)
            *ret_refused = r == -EREMOTEIO; /* QEMU answered no: nothing changed */
        if (r == -ENOTCONN && !call.err.desc)
            qmp_error_set(&call.err, "Disconnected", "QMP connection is not usable");
        r = qmpc_fail_msg(&c, r, &call.err, ret_msg);
        qmp_error_clear(&call.err);
        json_decref(call.ret);
        return r;
    }
    if (ret_return)
        *ret_return = call.ret;
    else
        json_decref(call.ret);
    return 0;
}

/* -------------------------------------------------- typed, synchronous */

int qmpc_connect_volume(const char *run_dir, const char *volume, uint64_t timeout_ms,
                        struct qmp_sync **ret, char **ret_msg)
{
    struct qsd_paths p;
    qsd_paths_init(run_dir, volume, &p);
    struct qmp_error e = {0};
    int r = qmp_sync_connect(p.qmp, timeout_ms, ret, &e);
    if (r < 0)
        *ret_msg = xasprintf("cannot reach the QSD of volume %s: %s", volume,
                             e.desc ? e.desc : strerror(-r));
    qmp_error_clear(&e);
    qsd_paths_clear(&p);
    return r;
}

static int export_node_msg(int r, char **ret_msg)
{
    *ret_msg = xstrdup(r == -ENOENT ? "QSD has no export " QSD_EXPORT_ID
                                    : "QSD's reply to query-block-exports is malformed");
    return -EBADMSG;
}

static int node_size_msg(int r, char **ret_msg)
{
    *ret_msg = xstrdup("QSD does not report the exported node's size");
    return -EBADMSG;
}

int qmpc_export_node(struct qmp_sync *s, char **ret_node, char **ret_msg)
{
    json_t *ret = NULL;
    char *node = NULL;
    int r = qmpc_call(s, qmpc_query_block_exports(), &ret, NULL, ret_msg);
    if (r < 0)
        return r;
    r = qmpc_parse_export_node(ret, QSD_EXPORT_ID, &node);
    json_decref(ret);
    if (r < 0)
        return export_node_msg(r, ret_msg);
    if (!streq(node, QSD_THROTTLE_NODE)) {
        *ret_node = node;
        return 0;
    }
    free(node);
    json_t *graph = NULL;
    const char *child;
    if ((r = qmpc_block_graph(s, &graph, ret_msg)) < 0)
        return r;
    r = qmpc_parse_filter_child(graph, QSD_THROTTLE_NODE, &child);
    if (r == 0)
        *ret_node = xstrdup(child);
    else
        *ret_msg = xstrdup("QSD's block graph has no child under the throttle filter "
                           QSD_THROTTLE_NODE);
    json_decref(graph);
    return r < 0 ? -EBADMSG : 0;
}

int qmpc_node_size(struct qmp_sync *s, const char *node, uint64_t *ret_size, char **ret_msg)
{
    json_t *ret = NULL;
    int r = qmpc_call(s, qmpc_query_named_block_nodes(), &ret, NULL, ret_msg);
    if (r < 0)
        return r;
    r = qmpc_parse_node_size(ret, node, ret_size);
    json_decref(ret);
    return r < 0 ? node_size_msg(r, ret_msg) : 0;
}

int qmpc_export_size(struct qmp_sync *s, uint64_t *ret_size, char **ret_msg)
{
    _cleanup_free_ char *node = NULL;
    int r = qmpc_export_node(s, &node, ret_msg);
    return r < 0 ? r : qmpc_node_size(s, node, ret_size, ret_msg);
}

int qmpc_job_listed(struct qmp_sync *s, const char *job, char **ret_msg)
{
    json_t *ret = NULL;
    int r = qmpc_call(s, qmpc_query_block_jobs(), &ret, NULL, ret_msg);
    if (r < 0)
        return r;
    bool listed = false;
    r = qmpc_parse_job_listed(ret, job, &listed);
    json_decref(ret);
    if (r < 0) {
        *ret_msg = xstrdup("QSD's reply to query-block-jobs is malformed");
        return r;
    }
    return listed;
}

int qmpc_iothreads(struct qmp_sync *s, unsigned *ret_n, char **ret_msg)
{
    json_t *ret = NULL;
    int r = qmpc_call(s, qmpc_named(qmpc_qom_list("/objects"), "qom-list /objects"), &ret, NULL, ret_msg);
    if (r < 0)
        return r;
    r = qmpc_parse_iothreads(ret, ret_n);
    json_decref(ret);
    if (r < 0)
        *ret_msg = xstrdup("QSD's reply to qom-list is malformed");
    return r;
}

int qmpc_block_graph(struct qmp_sync *s, json_t **ret_graph, char **ret_msg)
{
    json_t *ret = NULL;
    int r = qmpc_call(s, qmpc_query_block_graph(), &ret, NULL, ret_msg);
    if (r < 0)
        return r;
    r = qmpc_parse_block_graph(ret, ret_graph);
    json_decref(ret);
    if (r < 0)
        *ret_msg = xstrdup("QSD's reply to x-debug-query-block-graph is malformed");
    return r;
}

static bool job_match(json_t *data, void *opaque) { return qmpc_event_is_job(data, opaque); }

int qmpc_job_wait(struct qmp_sync *s, const char *job, const char *what, uint64_t timeout_ms,
                  bool *ret_ended, char **ret_msg)
{
    struct qmp_error e = {0};
    *ret_ended = false;
    json_t *data = NULL;
    int r = qmp_sync_wait_event(s, "BLOCK_JOB_COMPLETED", job_match, (void *)job, timeout_ms,
                                &data, &e);
    if (r < 0) {
        _cleanup_free_ char *w = xasprintf("waiting for the %s", what);
        struct qmpc c = {.cmd = w, .what = w};
        r = qmpc_fail_msg(&c, r, &e, ret_msg);
        qmp_error_clear(&e);
        return r;
    }
    *ret_ended = true;
    const char *err = qmpc_job_error(data);
    if (err) {
        *ret_msg = xasprintf("%s failed: %s", what, err);
        r = errno_from_text(-EIO, err);
    }
    json_decref(data);
    return r;
}

void qmpc_job_cancel(struct qmp_sync *s, const char *job, uint64_t wait_ms)
{
    _cleanup_free_ char *m = NULL;
    qmpc_call(s, qmpc_block_job_cancel(job), NULL, NULL, &m);
    if (!wait_ms)
        return;
    struct qmp_error e = {0};
    qmp_sync_wait_event(s, "BLOCK_JOB_CANCELLED", job_match, (void *)job, wait_ms, NULL, &e);
    qmp_error_clear(&e);
}

/* ---------------------------------------------------- the resize sequence */

struct grow {
    uint64_t want, timeout_ms;
    bool refuse_shrink;
    char *node;
    qmpc_grow_cb cb;
    void *opaque;
};

static void grow_free(void *opaque)
{
    struct grow *g = opaque;
    free(g->node);
    free(g);
}

static void grow_end(struct grow *g, int status, uint64_t size, const char *msg)
{
    qmpc_grow_cb cb = g->cb;
    void *opaque = g->opaque;
    grow_free(g);
    cb(status, size, msg, opaque);
}

/* A failed reply to c: end with its message. */
static void grow_fail_reply(struct grow *g, struct qmpc c, const struct qmp_reply *r)
{
    _cleanup_free_ char *m = NULL;
    int st = qmpc_fail_msg(&c, r->status, r->err, &m);
    qmpc_clear(&c);
    grow_end(g, st, 0, m);
}

static void grow_send(struct qmp *q, struct grow *g, struct qmpc c, qmp_reply_cb cb)
{
    const char *name = c.cmd;
    int r = send_owned(q, c, g->timeout_ms, cb, g, grow_free);
    if (r < 0) {
        _cleanup_free_ char *m = xasprintf("cannot send %s: %s", name, strerror(-r));
        grow_end(g, r, 0, m);
    }
}

static void on_grow_resized(struct qmp *q, const struct qmp_reply *r, void *opaque)
{
    struct grow *g = opaque;
    if (r->status < 0)
        grow_fail_reply(g, qmpc_block_resize(g->node, g->want), r);
    else
        grow_end(g, 0, g->want, NULL);
}

static void on_grow_nodes(struct qmp *q, const struct qmp_reply *r, void *opaque)
{
    struct grow *g = opaque;
    if (r->status < 0) {
        grow_fail_reply(g, qmpc_query_named_block_nodes(), r);
        return;
    }
    uint64_t cur;
    _cleanup_free_ char *m = NULL;
    if (qmpc_parse_node_size(r->ret, g->node, &cur) < 0) {
        int st = node_size_msg(0, &m);
        grow_end(g, st, 0, m);
        return;
    }
    if (cur > g->want && g->refuse_shrink) {
        m = xasprintf("refusing to shrink from %" PRIu64 " to %" PRIu64 " bytes", cur, g->want);
        grow_end(g, -EINVAL, 0, m);
        return;
    }
    if (cur >= g->want) {
        grow_end(g, 0, cur, NULL); /* never shrink */
        return;
    }
    grow_send(q, g, qmpc_block_resize(g->node, g->want), on_grow_resized);
}

/* The exported node: a thin snapshot moves the export to a new overlay
 * (thin.h), so it is asked for, not assumed. */
static void on_grow_exports(struct qmp *q, const struct qmp_reply *r, void *opaque)
{
    struct grow *g = opaque;
    if (r->status < 0) {
        grow_fail_reply(g, qmpc_query_block_exports(), r);
        return;
    }
    int e = qmpc_parse_export_node(r->ret, QSD_EXPORT_ID, &g->node);
    if (e < 0) {
        _cleanup_free_ char *m = NULL;
        int st = export_node_msg(e, &m);
        grow_end(g, st, 0, m);
        return;
    }
    grow_send(q, g, qmpc_query_named_block_nodes(), on_grow_nodes);
}

int qmpc_grow(struct qmp *q, uint64_t size, bool refuse_shrink, uint64_t timeout_ms,
              qmpc_grow_cb cb, void *opaque)
{
    struct grow *g = xcalloc(1, sizeof(*g));
    *g = (struct grow){.want = size, .timeout_ms = timeout_ms, .refuse_shrink = refuse_shrink,
                       .cb = cb, .opaque = opaque};
    int r = send_owned(q, qmpc_query_block_exports(), timeout_ms, on_grow_exports, g, grow_free);
    if (r < 0)
        grow_free(g);
    return r;
}

struct grow_sync {
    bool done;
    int status;
    uint64_t size;
    char *msg;
};

static void on_grow_sync(int status, uint64_t size, const char *msg, void *opaque)
{
    struct grow_sync *gs = opaque;
    gs->done = true;
    gs->status = status;
    gs->size = size;
    gs->msg = msg ? xstrdup(msg) : NULL;
}

int qmpc_grow_sync(struct qmp_sync *s, uint64_t size, bool refuse_shrink, uint64_t *ret_size,
                   char **ret_msg)
{
    struct grow_sync gs = {0};
    struct qmp *q = qmp_sync_client(s);
    int r = q ? qmpc_grow(q, size, refuse_shrink, QMP_DEFAULT_TIMEOUT_MS, on_grow_sync, &gs)
              : -ENOTCONN;
    if (r == 0)
        r = qmp_sync_run(s, &gs.done);
    if (r < 0) {
        free(gs.msg);
        *ret_msg = xasprintf("cannot resize through the QSD's monitor: %s", strerror(-r));
        return r;
    }
    if (gs.status < 0) {
        *ret_msg = gs.msg ? gs.msg : xstrdup(strerror(-gs.status));
        return gs.status;
    }
    free(gs.msg);
    if (ret_size)
        *ret_size = gs.size;
    return 0;
}

/* ------------------------------------------------- typed, asynchronous */

struct discard_req {
    qmpc_discard_cb cb;
    void *opaque;
};

static void on_discard(struct qmp *q, const struct qmp_reply *r, void *opaque)
{
    struct discard_req d = *(struct discard_req *)opaque;
    free(opaque);
    struct qmpc_discard st = {0};
    int status = r->status;
    if (status == 0)
        status = qmpc_parse_discard(r->ret, &st);
    d.cb(status, status == 0 ? &st : NULL, d.opaque);
}

int qmpc_discard_stats(struct qmp *q, uint64_t timeout_ms, qmpc_discard_cb cb, void *opaque)
{
    struct discard_req *d = xmalloc(sizeof(*d));
    *d = (struct discard_req){cb, opaque};
    int r = send_owned(q, qmpc_query_blockstats(), timeout_ms, on_discard, d, free);
    if (r < 0)
        free(d);
    return r;
}

struct limits_req {
    qmpc_done_cb cb;
    void *opaque;
};

static void on_limits(struct qmp *q, const struct qmp_reply *r, void *opaque)
{
    struct limits_req d = *(struct limits_req *)opaque;
    free(opaque);
    _cleanup_free_ char *msg = NULL;
    int status = r->status;
    if (status < 0) {
        struct qmpc c = qmpc_named((struct qmpc){.cmd = "qom-set"}, "qom-set of the throttle group's limits");
        status = qmpc_fail_msg(&c, status, r->err, &msg);
    }
    d.cb(status, msg, d.opaque);
}

int qmpc_set_limits_async(struct qmp *q, const struct qsd_limits *l, uint64_t timeout_ms,
                          qmpc_done_cb cb, void *opaque)
{
    struct limits_req *d = xmalloc(sizeof(*d));
    *d = (struct limits_req){cb, opaque};
    int r = send_owned(q, qmpc_set_limits(l), timeout_ms, on_limits, d, free);
    if (r < 0)
        free(d);
    return r;
}

int qmpc_quit_async(struct qmp *q, uint64_t timeout_ms)
{
    return qmpc_send(q, qmpc_quit(), timeout_ms, NULL, NULL);
}
