/* SPDX-License-Identifier: Apache-2.0 */
/* health.c: see health.h.
 *
 * The verdict checks, first adverse finding wins: the image in the pool
 * (DATA_LOSS when it is gone: a running QSD still serves the unlinked
 * file, its next start fails); for a staged volume its QSD (hung, restart
 * refused, crash loop, not running: INACCESSIBLE), its pods' FUSE export,
 * its vhost-user socket; then the allocation figure (not read in time:
 * DEGRADED) and the pool's room for what the volume may still write
 * (DEGRADED).  The RPCs take the allocation from volstats' last round. */
#include "health.h"

#include "backend.h"
#include "ids.h" /* list_start_ok */
#include "podvol.h"
#include "service.h"
#include "volqsd.h"
#include "volstats.h"
#include "qsd/base/util.h"

#include <sys/stat.h>

#define LIST_TOKEN_HEALTH "h1:"
#define ALLOC_TIMEOUT_S 10 /* node.c's STATS_TIMEOUT_MS */

#define DATA_LOSS CSI__V1__VOLUME_HEALTH_ERROR_TYPE__DATA_LOSS
#define INACCESSIBLE CSI__V1__VOLUME_HEALTH_ERROR_TYPE__INACCESSIBLE
#define DEGRADED CSI__V1__VOLUME_HEALTH_ERROR_TYPE__DEGRADED

static char *adverse(struct vol_health *h, Csi__V1__VolumeHealthErrorType status,
                     const char *reason, char *msg)
{
    h->status = status;
    h->reason = reason;
    return msg;
}

/* The staged volume's QSD and export: NULL when served. */
static char *served_problem(struct csi *c, const struct vol *v, struct vol_health *h)
{
    const struct backend *b = BACKEND_OF(.record = v);
    const char *hung = volstats_hung_reason(c->vstats, v);
    if (vol_live(v) && hung)
        return adverse(h, INACCESSIBLE, "QsdHung",
                       xasprintf("qemu-storage-daemon of volume %s (pid %d) is hung: %s", v->id,
                                 (int)qsd_get_pid(v->qsd), hung));
    if (!vol_live(v) && b->refused(v))
        return adverse(h, INACCESSIBLE, "RestartRefused",
                       xasprintf("volume %s is %s", v->id, b->refused(v)));
    if (v->qsd && qsd_crash_looping(v->qsd))
        return adverse(h, INACCESSIBLE, "QsdCrashLoop",
                       xasprintf("qemu-storage-daemon of volume %s keeps dying at start (crash "
                                 "loop, retried every 30 s); last exit: %s", v->id,
                                 qsd_last_death(v->qsd)));
    if (!vol_live(v))
        return adverse(h, INACCESSIBLE, "QsdNotRunning",
                       xasprintf("qemu-storage-daemon of volume %s is not running (being "
                                 "restarted)", v->id));
    if (v->stage_kind != STAGE_KIND_VHOST && !podvol_served(c, v))
        return adverse(h, INACCESSIBLE, "FuseExportGone",
                       xasprintf("the FUSE export of volume %s is gone (its QSD was restarted): "
                                 "the pods using it get I/O errors until it is staged again",
                                 v->id));
    struct qsd_paths p;
    struct stat st;
    char *m = NULL;
    qsd_paths_init(c->cfg->run_dir, v->id, &p);
    if (stat(p.socket, &st) < 0 || !S_ISSOCK(st.st_mode))
        m = adverse(h, INACCESSIBLE, "SocketMissing",
                    xasprintf("vhost-user socket %s is missing", p.socket));
    qsd_paths_clear(&p);
    return m;
}

void health_of(struct csi *c, const struct vol *v, enum health_used known, uint64_t used,
               struct vol_health *ret)
{
    struct vol_health h = {0};
    char *m = NULL;
    if (BACKEND_OF(.record = v)->in_pool) {
        if (pool_find_volume(&c->pool, v->id, NULL, NULL) == -ENOENT)
            m = adverse(&h, DATA_LOSS, "ImageMissing",
                        xasprintf("the image of volume %s is missing from the pool%s", v->id,
                                  vol_live(v) ? " (its running QSD still serves the removed "
                                                "file; its next start fails)" : ""));
    }
    if (!m && v->staging_path)
        m = served_problem(c, v, &h);
    if (!m && known == HEALTH_USED_TIMED_OUT)
        m = adverse(&h, DEGRADED, "AllocationUnknown",
                    xasprintf("the pool did not tell the volume's allocation within %d s (a "
                              "hung disk?)", ALLOC_TIMEOUT_S));
    if (!m && known == HEALTH_USED_KNOWN && (m = volstats_pool_problem(c->vstats, v, used)))
        adverse(&h, DEGRADED, "PoolNearlyFull", NULL);
    if (!m && !v->staging_path)
        m = xstrdup("not staged");
    else if (!m && qsd_hung_kill_count(v->qsd))
        m = xasprintf("served by qemu-storage-daemon pid %d (restarts: %u; killed as hung %u "
                      "times, last exit: %s)",
                      (int)qsd_get_pid(v->qsd), qsd_restart_count(v->qsd),
                      qsd_hung_kill_count(v->qsd), qsd_last_death(v->qsd));
    else if (!m)
        m = xasprintf("served by qemu-storage-daemon pid %d (restarts: %u)",
                      (int)qsd_get_pid(v->qsd), qsd_restart_count(v->qsd));
    h.message = m;
    *ret = h;
}

void vol_health_clear(struct vol_health *h)
{
    free(h->message);
    *h = (struct vol_health){0};
}

/* ------------------------------------------------------------ the RPCs */

/* The verdict on v from the background figures (volstats.h). */
static void health_cached(struct csi *c, const struct vol *v, struct vol_health *ret)
{
    const struct volstat *st = volstats_get(c->vstats, v->id);
    bool known = st && st->have_alloc;
    health_of(c, v, known ? HEALTH_USED_KNOWN : HEALTH_USED_UNKNOWN, known ? st->allocated : 0,
              ret);
}

/* A VolumeHealth message: id as the CO named it; one entry when adverse. */
struct healthmsg {
    Csi__V1__VolumeHealth vh;
    Csi__V1__VolumeHealth__VolumeHealthEntry e;
    Csi__V1__VolumeHealth__VolumeHealthEntry *ep[1];
};

static void healthmsg_fill(const char *id, const struct vol_health *h, struct healthmsg *m)
{
    *m = (struct healthmsg){
        .vh = CSI__V1__VOLUME_HEALTH__INIT,
        .e = CSI__V1__VOLUME_HEALTH__VOLUME_HEALTH_ENTRY__INIT,
    };
    m->vh.volume_id = (char *)id;
    if (h->status) {
        m->e.status = h->status;
        m->e.reason = (char *)h->reason;
        m->e.message = h->message;
        m->ep[0] = &m->e;
        m->vh.n_health_statuses = 1;
        m->vh.health_statuses = m->ep;
    }
}

/* The ready record an id names (cut to the record's name in place: id),
 * or NULL with the call failed. */
static const struct vol *volume_of(struct csi *c, struct grpc_call *call, char *id)
{
    if (!csi_id_ok(c, call, "volume_id", id))
        return NULL;
    const struct vol *v = store_find_vol(c->store, id);
    if (!v || v->phase != PHASE_READY) {
        grpc_call_fail(call, GRPC_NOT_FOUND, "volume %s does not exist", id);
        return NULL;
    }
    return v;
}

static void controller_get(struct csi *c, struct grpc_call *call,
                           Csi__V1__ControllerGetVolumeHealthRequest *in)
{
    _cleanup_free_ char *id = xstrdup(in->volume_id ? in->volume_id : "");
    const struct vol *v = volume_of(c, call, in->volume_id);
    if (!v)
        return;
    struct vol_health h;
    struct healthmsg m;
    health_cached(c, v, &h);
    healthmsg_fill(id, &h, &m);
    Csi__V1__ControllerGetVolumeHealthResponse out =
        CSI__V1__CONTROLLER_GET_VOLUME_HEALTH_RESPONSE__INIT;
    out.volume_health = &m.vh;
    grpc_call_reply_pb(call, &out.base);
    vol_health_clear(&h);
}

/* The volumes ListVolumes lists, the abnormal ones only, paginated the
 * same way (over the id order, "h1:<last id>"). */
static void controller_list(struct csi *c, struct grpc_call *call,
                            Csi__V1__ControllerListVolumeHealthRequest *in)
{
    const char *after;
    if (!list_start_ok(call, in->max_entries, in->starting_token, LIST_TOKEN_HEALTH, &after))
        return;
    store_sort(c->store);
    size_t cap = c->store->n_vols, n = 0;
    struct vol_health *hs = xcalloc(cap + 1, sizeof(*hs));
    struct healthmsg *msgs = xcalloc(cap + 1, sizeof(*msgs));
    char (*ids)[CSI_ID_MAX + 1] = xcalloc(cap + 1, sizeof(*ids));
    Csi__V1__VolumeHealth **list = xcalloc(cap + 1, sizeof(*list));
    _cleanup_free_ char *next = NULL;
    const char *last = NULL;
    for (size_t i = 0; i < cap; i++) {
        struct vol *v = c->store->vols[i];
        if (v->phase != PHASE_READY || (after && strcmp(v->id, after) <= 0) ||
            !BACKEND_OF(.record = v)->in_pool)
            continue;
        struct vol_health h;
        health_cached(c, v, &h);
        if (!h.status) {
            vol_health_clear(&h);
            continue;
        }
        if (in->max_entries > 0 && n == (size_t)in->max_entries) {
            vol_health_clear(&h);
            next = xasprintf("%s%s", LIST_TOKEN_HEALTH, last);
            break;
        }
        hs[n] = h;
        healthmsg_fill(csi_id_out(c, v->id, ids[n]), &hs[n], &msgs[n]);
        list[n] = &msgs[n].vh;
        last = v->id;
        n++;
    }
    Csi__V1__ControllerListVolumeHealthResponse out =
        CSI__V1__CONTROLLER_LIST_VOLUME_HEALTH_RESPONSE__INIT;
    out.n_entries = n;
    out.entries = list;
    out.next_token = next ? next : (char *)"";
    grpc_call_reply_pb(call, &out.base);
    for (size_t i = 0; i < n; i++)
        vol_health_clear(&hs[i]);
    free(list);
    free(ids);
    free(msgs);
    free(hs);
}

/* The node's view: the volume as staged and published here, when the
 * request names the paths. */
static void node_get(struct csi *c, struct grpc_call *call, Csi__V1__NodeGetVolumeHealthRequest *in)
{
    _cleanup_free_ char *id = xstrdup(in->volume_id ? in->volume_id : "");
    const struct vol *v = volume_of(c, call, in->volume_id);
    if (!v)
        return;
    const char *stg = in->staging_target_path, *pub = in->volume_publish_path;
    if (stg && *stg && !streq_ptr(v->staging_path, stg)) {
        grpc_call_fail(call, GRPC_NOT_FOUND, "staging_target_path: volume %s is not staged at %s",
                       v->id, stg);
        return;
    }
    if (pub && *pub && vol_find_pub(v, pub) < 0) {
        grpc_call_fail(call, GRPC_NOT_FOUND,
                       "volume_publish_path: volume %s is not published at %s", v->id, pub);
        return;
    }
    struct vol_health h;
    struct healthmsg m;
    health_cached(c, v, &h);
    healthmsg_fill(id, &h, &m);
    Csi__V1__NodeGetVolumeHealthResponse out = CSI__V1__NODE_GET_VOLUME_HEALTH_RESPONSE__INIT;
    out.volume_health = &m.vh;
    grpc_call_reply_pb(call, &out.base);
    vol_health_clear(&h);
}

/* The node's storage: the pool (and the plugin's directories and QSD
 * binary, Probe's readiness). */
static void node_storage(struct csi *c, struct grpc_call *call,
                         Csi__V1__NodeGetStorageHealthRequest *in)
{
    (void)in;
    Csi__V1__NodeGetStorageHealthResponse__StorageBackendHealth b =
        CSI__V1__NODE_GET_STORAGE_HEALTH_RESPONSE__STORAGE_BACKEND_HEALTH__INIT;
    Csi__V1__NodeGetStorageHealthResponse__StorageBackendHealth *bl[1] = {&b};
    Csi__V1__NodeGetStorageHealthResponse out = CSI__V1__NODE_GET_STORAGE_HEALTH_RESPONSE__INIT;
    const char *why = NULL;
    _cleanup_free_ char *m = NULL;
    if (plugin_check_ready(c->cfg, &why) < 0) {
        b.status = CSI__V1__STORAGE_HEALTH_ERROR_TYPE__STORAGE_UNREACHABLE;
        b.reason = (char *)"PluginNotReady";
        b.message = m = xstrdup(why);
    } else if ((m = volstats_pool_low(c->vstats))) {
        b.status = CSI__V1__STORAGE_HEALTH_ERROR_TYPE__STORAGE_DEGRADED;
        b.reason = (char *)"PoolNearlyFull";
        b.message = m;
    }
    out.n_backend_health = b.status ? 1 : 0;
    out.backend_health = bl;
    grpc_call_reply_pb(call, &out.base);
}

CSI_HANDLER(h_controller_get, controller_get, Csi__V1__ControllerGetVolumeHealthRequest,
            csi__v1__controller_get_volume_health_request)
CSI_HANDLER(h_controller_list, controller_list, Csi__V1__ControllerListVolumeHealthRequest,
            csi__v1__controller_list_volume_health_request)
CSI_HANDLER(h_node_get, node_get, Csi__V1__NodeGetVolumeHealthRequest,
            csi__v1__node_get_volume_health_request)
CSI_HANDLER(h_node_storage, node_storage, Csi__V1__NodeGetStorageHealthRequest,
            csi__v1__node_get_storage_health_request)

void health_controller_get(struct grpc_call *call, const uint8_t *req, size_t len, void *opaque)
{
    h_controller_get(call, req, len, opaque);
}

void health_controller_list(struct grpc_call *call, const uint8_t *req, size_t len, void *opaque)
{
    h_controller_list(call, req, len, opaque);
}

void health_node_get(struct grpc_call *call, const uint8_t *req, size_t len, void *opaque)
{
    h_node_get(call, req, len, opaque);
}

void health_node_storage(struct grpc_call *call, const uint8_t *req, size_t len, void *opaque)
{
    h_node_storage(call, req, len, opaque);
}
