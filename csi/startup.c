/* SPDX-License-Identifier: Apache-2.0 */
/* startup.c: see startup.h. */
#include "startup.h"
#include "local.h"
#include "backend.h"
#include "bridge.h"
#include "qsd/base/log.h"
#include "imagememo.h"
#include "mounts.h"
#include "qsd/state/records.h"
#include "service.h"
#include "qsd/base/util.h"
#include "recover.h"
#include "op.h"

#define LOG_TRIM_MS 1000

static void trim_logs(struct loop *l, void *opaque)
{
    struct csi *c = opaque;
    for (size_t i = 0; c->store && i < c->store->n_vols; i++) {
        struct vol *v = c->store->vols[i];
        if (v->qsd && qsd_log_trim(v->qsd) == 1)
            log_warn("qsd", "log over its bound, cut to its last lines", "volume=%s", v->id);
    }
    c->log_timer = loop_timer_add(l, LOG_TRIM_MS, trim_logs, c);
}

int csi_new(const struct plugin_config *cfg, struct loop *loop, struct csi **ret, char **ret_msg)
{
    struct csi *c = xcalloc(1, sizeof(*c));
    c->cfg = cfg;
    c->loop = loop;
    c->qcfg = (struct qsd_config){.run_dir = cfg->run_dir, .binary = cfg->qsd_binary,
                                  .filter = cfg->filter_path,
                                  .uid_base = cfg->qsd_uid_base, .uid_count = cfg->qsd_uid_count,
                                  .hidden = c->qsd_hidden};
    /* What no QSD may see besides other volumes' runtime (qsdconf.c). */
    c->qsd_hidden[0] = cfg->state_dir;
    c->qsd_hidden[1] = cfg->kubelet_root;
    c->qsd_hidden[2] = NULL;
    c->topo_key = xasprintf("topology.%s/node", cfg->driver_name);
    c->image_refusals = imagememo_new();
    mounts_open(c);
    int r = 0;
    if (cfg->qsd_cgroup) {
        r = qsd_cgroup_open("/sys/fs/cgroup", cfg->qsd_cgroup, cfg->qsd_cpu_weight,
                            cfg->qsd_memory_max, 0, &c->cgroup, ret_msg);
        if (r < 0)
            goto fail;
        c->qcfg.join_fds = c->cgroup.fds;
        c->qcfg.n_join = c->cgroup.n;
        c->qcfg.cgroup_root = "/sys/fs/cgroup";
        c->qcfg.cgroup = cfg->qsd_cgroup;
        c->qcfg.vol_memory_max = cfg->qsd_vol_memory_max;
        c->qcfg.vol_pids_max = cfg->qsd_vol_pids_max;
        c->qcfg.vol_cpu_weight = cfg->qsd_vol_cpu_weight;
        log_info("plugin", "QSDs run in their own cgroup", "cgroup=%s hierarchies=%zu cpu_weight=%u "
                 "memory_max=%llu", cfg->qsd_cgroup, c->cgroup.n, cfg->qsd_cpu_weight,
                 (unsigned long long)cfg->qsd_memory_max);
    }
    r = pool_open(cfg->pool_dir, true, &c->pool, ret_msg);
    if (r < 0)
        goto fail;
    r = records_new(loop, &c->records);
    if (r < 0)
        *ret_msg = xasprintf("cannot start the record writer: %s", strerror(-r));
    else
        r = store_open(cfg->state_dir, c->records, &c->store, ret_msg);
    if (r < 0)
        goto fail;
    r = bridges_open(c, ret_msg);
    if (r < 0)
        goto fail;
    csi_recover(c);
    bridges_recover(c);
    csi_gc(c);
    c->log_timer = loop_timer_add(loop, LOG_TRIM_MS, trim_logs, c);
    *ret = c;
    return 0;
fail:
    csi_free(c); /* every part is closed whether or not it was opened */
    return r;
}

void csi_free(struct csi *c)
{
    if (!c)
        return;
    while (c->ops) {
        struct op *op = c->ops;
        worker_cancel(op->worker);
        op->worker = NULL;
        if (op->call)
            grpc_call_fail(op->call, GRPC_UNAVAILABLE, "the plugin is shutting down");
        op_end(op);
    }
    for (size_t i = 0; c->store && i < c->store->n_vols; i++) {
        struct vol *v = c->store->vols[i];
        qsd_free(v->qsd); /* the process keeps running: the next start adopts it */
        v->qsd = NULL;
        free(v->start_ctx);
        v->start_ctx = NULL;
        BACKEND_OF(.record = v)->forget(v);
    }
    worker_cancel(c->gc);
    c->gc = NULL;
    loop_timer_cancel(c->log_timer);
    bridges_free(c->bridges);
    local_group_free(c);
    imagememo_free(c->image_refusals);
    store_free(c->store);
    records_free(c->records);
    pool_close(&c->pool);
    mounts_close(c);
    qsd_cgroup_close(&c->cgroup);
    free(c->topo_key);
    free(c);
}
