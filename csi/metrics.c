/* SPDX-License-Identifier: Apache-2.0 */
/* metrics.c: the metrics registry and its Prometheus text rendering.
 * See metrics.h; the series are listed in docs/observability.md. */
#include "metrics.h"
#include "backend.h"
#include "config.h"
#include "capacity.h"
#include "params.h"
#include "qsd/base/util.h"
#include "service.h"
#include "volstats.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>

/* ------------------------------------------------------------ registry */

static const double rpc_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                    0.5,   1,      2.5,   5,    10,   30,   60,  300};

/* One series per (method, code) that occurred.  Methods are the server's
 * registered ones (a bounded set), or NULL for every unknown path. */
struct rpc_series {
    const struct grpc_method *method;
    enum grpc_code code;
    char *labels;          /* method="...",code="..." */
    struct histogram h;
    struct rpc_series *next;
};

struct metrics {
    struct csi *csi;
    struct rpc_series *rpcs;
    char *qemu_version;    /* NULL: unknown */
};

int metrics_new(struct csi *c, struct metrics **ret)
{
    struct metrics *m = xcalloc(1, sizeof(*m));
    m->csi = c;
    *ret = m;
    return 0;
}

void metrics_free(struct metrics *m)
{
    if (!m)
        return;
    while (m->rpcs) {
        struct rpc_series *r = m->rpcs;
        m->rpcs = r->next;
        histogram_clear(&r->h);
        free(r->labels);
        free(r);
    }
    free(m->qemu_version);
    free(m);
}

void metrics_set_qemu_version(struct metrics *m, const char *qemu_version)
{
    free(m->qemu_version);
    m->qemu_version = qemu_version ? xstrdup(qemu_version) : NULL;
}

char *metrics_qemu_version_parse(const char *out)
{
    const char *p = out ? strstr(out, " version ") : NULL;
    if (!p)
        return NULL;
    p += strlen(" version ");
    size_t n = strspn(p, "0123456789.");
    /* at least MAJOR.MINOR, digits first */
    if (n < 3 || !isdigit((unsigned char)p[0]) || !memchr(p, '.', n) || p[n - 1] == '.')
        return NULL;
    return xstrndup(p, n);
}

void metrics_rpc_observe(const struct grpc_method *method, enum grpc_code code,
                         uint64_t duration_us, void *opaque)
{
    struct metrics *m = opaque;
    struct rpc_series *r = m->rpcs;
    while (r && !(r->method == method && r->code == code))
        r = r->next;
    if (!r) {
        r = xcalloc(1, sizeof(*r));
        r->method = method;
        r->code = code;
        r->labels = metrics_labels("method", method ? method->path : "unknown", "code",
                                   grpc_code_name(code), NULL);
        histogram_init(&r->h, rpc_bounds, ARRAY_SIZE(rpc_bounds));
        r->next = m->rpcs;
        m->rpcs = r;
    }
    histogram_observe(&r->h, (double)duration_us / 1e6);
}

/* ------------------------------------------------------------ the page */

void metrics_build_info(FILE *f, const char *version, const char *revision,
                        const char *qemu_version)
{
    metrics_family(f, "qsd_csi_build_info", "gauge",
                   "Always 1; the labels name the plugin's version, its git revision and "
                   "the QEMU version of its qemu-storage-daemon.");
    _cleanup_free_ char *l =
        metrics_labels("version", version, "revision", revision, "qemu_version",
                       qemu_version ? qemu_version : "unknown", NULL);
    metrics_sample(f, "qsd_csi_build_info", l, 1);
}

static void render_rpcs(FILE *f, struct metrics *m)
{
    metrics_family(f, "qsd_csi_rpc_total", "counter",
                   "CSI calls answered, by method and gRPC status code.");
    for (struct rpc_series *r = m->rpcs; r; r = r->next)
        metrics_sample(f, "qsd_csi_rpc_total", r->labels, (double)r->h.count);
    metrics_family(f, "qsd_csi_rpc_duration_seconds", "histogram",
                   "Time from a CSI call's headers to its answer, by method and gRPC code.");
    for (struct rpc_series *r = m->rpcs; r; r = r->next)
        metrics_histogram(f, "qsd_csi_rpc_duration_seconds", r->labels, &r->h);
}

/* The pool's figures from the collector's cache (statvfs in its worker)
 * and the records, with the capacity policy applied (capacity.h). */
static void render_pool(FILE *f, struct csi *c)
{
    struct pool_stat p = volstats_pool(c->vstats);
    struct pool_figures fig = {.total = p.capacity, .free = p.free};
    for (size_t i = 0; i < c->store->n_vols; i++)
        if (BACKEND_OF(.record = c->store->vols[i])->in_pool)
            fig.committed += c->store->vols[i]->size;
    capacity_apply(&c->cfg->capacity, &fig);
    if (p.valid) {
        metrics_family(f, "qsd_csi_pool_capacity_bytes", "gauge",
                       "Size of the filesystem holding the pool.");
        metrics_sample(f, "qsd_csi_pool_capacity_bytes", NULL, (double)p.capacity);
        metrics_family(f, "qsd_csi_pool_free_bytes", "gauge",
                       "Free space of the pool's filesystem (available to the plugin).");
        metrics_sample(f, "qsd_csi_pool_free_bytes", NULL, (double)p.free);
        metrics_family(f, "qsd_csi_pool_reserved_bytes", "gauge",
                       "Space kept free on the pool's filesystem (--capacity-reserve): nothing "
                       "is created, grown or snapshotted into it.");
        metrics_sample(f, "qsd_csi_pool_reserved_bytes", NULL, (double)fig.reserve);
    }
    metrics_family(f, "qsd_csi_pool_provisioned_bytes", "gauge",
                   "Sum of the capacities (virtual sizes) of the volumes of this node.");
    metrics_sample(f, "qsd_csi_pool_provisioned_bytes", NULL, (double)fig.committed);
    if (!c->cfg->capacity.overcommit_x100)
        return;
    metrics_family(f, "qsd_csi_pool_overcommit_ratio", "gauge",
                   "The configured limit (--overcommit-ratio): provisioned bytes at most this "
                   "times the filesystem's size less the reserve.");
    metrics_sample(f, "qsd_csi_pool_overcommit_ratio", NULL, capacity_overcommit_ratio(c));
    if (p.valid) {
        metrics_family(f, "qsd_csi_pool_provisioned_limit_bytes", "gauge",
                       "The most the volumes' capacities may add up to under the overcommit "
                       "limit.");
        metrics_sample(f, "qsd_csi_pool_provisioned_limit_bytes", NULL, (double)fig.limit);
    }
}

struct vol_series {
    const char *name, *type, *help;
};

enum {
    VOL_STATE, VOL_RESTARTS, VOL_HUNG_KILLS, VOL_ALLOC, VOL_CAPACITY, VOL_RBYTES, VOL_WBYTES, VOL_RSYS, VOL_WSYS,
    VOL_CPU, VOL_DISCARD_OPS, VOL_DISCARD_BYTES, VOL_PROBE, VOL_PROBE_FAILED, VOL_N
};
static const struct vol_series vol_series[VOL_N] = {
    [VOL_STATE] = {"qsd_csi_volume_qsd_state", "gauge",
                   "State of the volume's QSD: 1 for the current one of running, restarting, "
                   "crash-loop, hung, refused (an RBD volume another client holds: docs/rbd.md)."},
    [VOL_RESTARTS] = {"qsd_csi_volume_qsd_restarts_total", "counter",
                      "Times the volume's QSD was restarted after dying, since the plugin "
                      "started."},
    [VOL_HUNG_KILLS] = {"qsd_csi_volume_qsd_hung_kills_total", "counter",
                        "Times the volume's QSD was killed (and then restarted) because its "
                        "monitor stopped answering, since the plugin started."},
    [VOL_ALLOC] = {"qsd_csi_volume_allocated_bytes", "gauge",
                   "Bytes allocated on the pool by the volume's chain of layers (shared "
                   "layers included)."},
    [VOL_CAPACITY] = {"qsd_csi_volume_capacity_bytes", "gauge", "Capacity of the volume."},
    [VOL_RBYTES] = {"qsd_csi_volume_read_bytes_total", "counter",
                    "Bytes the volume's QSD read from storage (kernel I/O accounting of the "
                    "process: image metadata included; resets when the QSD restarts)."},
    [VOL_WBYTES] = {"qsd_csi_volume_write_bytes_total", "counter",
                    "Bytes the volume's QSD wrote to storage (kernel I/O accounting of the "
                    "process: image metadata included; resets when the QSD restarts)."},
    [VOL_RSYS] = {"qsd_csi_volume_read_syscalls_total", "counter",
                  "Read system calls of the volume's QSD (io_uring reads are not counted)."},
    [VOL_WSYS] = {"qsd_csi_volume_write_syscalls_total", "counter",
                  "Write system calls of the volume's QSD (io_uring writes are not counted)."},
    [VOL_CPU] = {"qsd_csi_volume_qsd_cpu_seconds_total", "counter",
                 "CPU time of the volume's QSD (user and system)."},
    [VOL_DISCARD_OPS] = {"qsd_csi_volume_discard_ops_total", "counter",
                         "Discards the volume's QSD passed to its image files (QMP "
                         "query-blockstats)."},
    [VOL_DISCARD_BYTES] = {"qsd_csi_volume_discard_bytes_total", "counter",
                           "Bytes discarded in the volume's image files (QMP "
                           "query-blockstats)."},
    [VOL_PROBE] = {"qsd_csi_volume_qmp_probe_seconds", "histogram",
                   "Round trip of the periodic QMP probe of the volume's QSD (connect, "
                   "query-blockstats): how responsive its main loop is."},
    [VOL_PROBE_FAILED] = {"qsd_csi_volume_qmp_probe_failures_total", "counter",
                          "QMP probes of the volume's QSD that got no answer."},
};

static void render_vol(FILE *f, int k, struct csi *c, const struct vol *v, const char *l)
{
    const struct volstat *st = volstats_get(c->vstats, v->id);
    enum vol_state s = volstats_state(c->vstats, v);
    const char *name = vol_series[k].name;
    switch (k) {
    case VOL_STATE:
        if (s == VS_NONE)
            return;
        for (enum vol_state x = VS_RUNNING; x <= VS_REFUSED; x++) {
            _cleanup_free_ char *l2 = xasprintf("%s,state=\"%s\"", l, vol_state_name(x));
            metrics_sample(f, name, l2, x == s);
        }
        return;
    case VOL_RESTARTS:
        if (v->qsd)
            metrics_sample(f, name, l, qsd_restart_count(v->qsd));
        return;
    case VOL_HUNG_KILLS:
        if (v->qsd)
            metrics_sample(f, name, l, qsd_hung_kill_count(v->qsd));
        return;
    case VOL_CAPACITY: metrics_sample(f, name, l, (double)v->size); return;
    }
    if (!st)
        return;
    switch (k) {
    case VOL_ALLOC:
        if (st->have_alloc)
            metrics_sample(f, name, l, (double)st->allocated);
        return;
    case VOL_PROBE:
        if (s != VS_NONE)
            metrics_histogram(f, name, l, &st->probe);
        return;
    case VOL_PROBE_FAILED:
        if (s != VS_NONE)
            metrics_sample(f, name, l, (double)st->probes_failed);
        return;
    case VOL_DISCARD_OPS:
    case VOL_DISCARD_BYTES:
        if (st->have_discard && s != VS_NONE)
            metrics_sample(f, name, l,
                           (double)(k == VOL_DISCARD_OPS ? st->discard_ops : st->discard_bytes));
        return;
    }
    if (!st->have_io || s == VS_NONE)
        return;
    double val = k == VOL_RBYTES ? (double)st->read_bytes
                 : k == VOL_WBYTES ? (double)st->write_bytes
                 : k == VOL_RSYS   ? (double)st->read_syscalls
                 : k == VOL_WSYS   ? (double)st->write_syscalls
                                   : st->cpu_seconds;
    metrics_sample(f, name, l, val);
}

static const char *context_str(const json_t *context, const char *key)
{
    const char *s = json_string_value(json_object_get(context, key));
    return s ? s : "";
}

char *metrics_volume_labels(const char *volume_id, const char *handle, const json_t *context)
{
    return metrics_labels("volume_id", volume_id, "volume_handle", handle ? handle : "",
                          "namespace", context_str(context, K8S_PREFIX "pvc/namespace"),
                          "persistentvolumeclaim", context_str(context, K8S_PREFIX "pvc/name"),
                          NULL);
}

static void render_volumes(FILE *f, struct csi *c)
{
    struct store *s = c->store;
    char **labels = xcalloc(s->n_vols + 1, sizeof(char *));
    for (size_t i = 0; i < s->n_vols; i++) {
        struct vol *v = s->vols[i];
        _cleanup_free_ char *handle = BACKEND_OF(.record = v)->volume_handle(c, v);
        labels[i] = metrics_volume_labels(v->id, handle, v->context);
    }
    for (int k = 0; k < VOL_N; k++) {
        metrics_family(f, vol_series[k].name, vol_series[k].type, vol_series[k].help);
        for (size_t i = 0; i < s->n_vols; i++)
            if (s->vols[i]->phase == PHASE_READY)
                render_vol(f, k, c, s->vols[i], labels[i]);
    }
    for (size_t i = 0; i < s->n_vols; i++)
        free(labels[i]);
    free(labels);
}

int metrics_render(struct metrics *m, char **ret, size_t *ret_len)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (!f)
        return -errno;
    metrics_build_info(f, QSD_CSI_VERSION, QSD_CSI_REVISION, m->qemu_version);
    render_rpcs(f, m);
    render_pool(f, m->csi);
    render_volumes(f, m->csi);
    if (fclose(f) != 0) {
        free(out);
        return -ENOMEM;
    }
    *ret = out;
    *ret_len = len;
    return 0;
}
