/* SPDX-License-Identifier: Apache-2.0 */
/* recover.c: start-up recovery (recover.h). */
#include "recover.h"
#include "local.h"
#include "service.h"
#include "backend.h"
#include "op.h"
#include "volqsd.h"
#include "qsd/base/log.h"
#include "qsd/qemu/qmpcmd.h"
#include "qsd/qemu/thin.h"
#include "qsd/base/util.h"

#include <dirent.h>

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

/* An adopted QSD gets the record's limits (qos.h) again: a
 * ControllerModifyVolume cut short between its record and its qom-set
 * (modify.c) is finished here.  A QSD started before throttle groups has
 * none to set: it gets them at its next start. */
static void recover_limits(struct csi *c, struct vol *v, const struct qsd_limits *l)
{
    struct qmp_sync *s = NULL;
    _cleanup_free_ char *msg = NULL;
    int r = qmpc_connect_volume(c->cfg->run_dir, v->id, QMP_DEFAULT_TIMEOUT_MS, &s, &msg);
    if (r == 0)
        r = qmpc_call(s, qmpc_set_limits(l), NULL, NULL, &msg);
    qmp_sync_close(s);
    if (r < 0) {
        _cleanup_free_ char *q = log_quote(msg ? msg : strerror(-r));
        log_warn("plugin", "cannot set the recorded limits on an adopted QSD", "volume=%s error=%s",
                 v->id, q);
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
    local_group_recover(c); /* first: consumers stopped by a killed group snapshot */
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
        vol_qsd_new(c, v, &o);
        struct qsd_limits limits = o.limits;
        qsd_opts_clear(&o);
        const struct backend *b = BACKEND_OF(.record = v);
        if (qsd_adopt(v->qsd) == 0) {
            log_info("plugin", "adopted the QSD of a staged volume", "volume=%s pid=%d", v->id,
                     (int)qsd_get_pid(v->qsd));
            recover_limits(c, v, &limits);
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
        if (vol_qsd_start(c, v, -1, recovery_started, NULL, &msg) < 0) {
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
