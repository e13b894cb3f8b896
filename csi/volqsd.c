/* SPDX-License-Identifier: Apache-2.0 */
/* volqsd.c: the QSD side of a staged volume (volqsd.h): its export
 * options, its start, its events, its runtime directories. */
#include "volqsd.h"
#include "service.h"
#include "backend.h"
#include "params.h"
#include "qos.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"

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
    struct qsd_limits l = {0};
    int r = v->mutable_params ? qos_limits(v->mutable_params, &l, ret_msg) : 0;
    if (r < 0 || (r = BACKEND_OF(.record = v)->export_opts(c, v, ret, ret_msg)) < 0)
        return r;
    ret->limits = l; /* the throttle group's (qos.h) */
    return 0;
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

void vol_qsd_new(struct csi *c, struct vol *v, const struct qsd_opts *o)
{
    qsd_new(c->loop, &c->qcfg, v->id, o, &v->qsd);
    qsd_set_event_handler(v->qsd, qsd_event, c);
    qsd_set_supervised(v->qsd, BACKEND_OF(.record = v)->supervised);
}

int vol_qsd_start(struct csi *c, struct vol *v, int fuse_fd, vol_started_fn done, void *opaque,
                  char **ret_msg)
{
    struct qsd_opts o;
    int r = vol_export_opts(c, v, &o, ret_msg);
    if (r < 0) {
        closep(&fuse_fd);
        return r;
    }
    if (!v->qsd)
        vol_qsd_new(c, v, &o);
    qsd_opts_clear(&o);
    if (fuse_fd >= 0)
        qsd_set_fuse_fd(v->qsd, fuse_fd);
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

void csi_remove_runtime(struct csi *c, const char *id)
{
    int r = qsd_remove_runtime(c->cfg->run_dir, id);
    if (r < 0)
        log_warn("plugin", "cannot remove a volume's runtime directories",
                 "volume=%s error=\"%s\"", id, strerror(-r));
}
