/* rbd_lock.c: see rbd_lock.h.
 *
 * Why watches: librbd's exclusive lock is cooperative.  A second client
 * that writes asks the holder for the lock and the holder hands it over,
 * so two QSDs serving one image both write, in turns (seen with Ceph
 * 16.2: two QSDs, alternate writes all succeed).  The lock alone therefore
 * cannot keep two nodes apart; a client's watch on the image header can:
 * every client that opens the image read-write (a QSD, also one exported
 * read-only) keeps one while it lives, and the OSD drops it
 * osd_client_watch_timeout (30 s by default) after the client stopped
 * answering.  A lock holder without a watch is dead or cut off; breaking
 * its lock with rbd_break_lock blocklists its address first
 * (rbd_blocklist_on_break_lock, set by conn_open), so a holder that comes
 * back gets errors (ESHUTDOWN) instead of writing.
 *
 * Two nodes staging at once: each QSD registers its watch when it opens
 * the image, before the second check lists the watchers; whichever node
 * checks last sees the other's QSD and gives up (both may: kubelet
 * retries).  No QSD gets a client before its node's check passed (the
 * socket is published after NodeStageVolume answered), so none writes. */
#include "rbd_lock.h"
#include "rbd.h"
#include "service.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"

#include <inttypes.h>

#define WATCHERS_MAX 16
#define LOCKERS_BUF 4096
#define CONFIRM_MS (60ull * 1000) /* as every RBD worker (rbd.c) */

/* Whether the lock holder client ("client.N") at addr still has a watch:
 * the same client id, or the same address (a client that lost its watch
 * and registered a new one keeps both). */
static bool holder_alive(const rbd_image_watcher_t *w, size_t nw, const char *client,
                         const char *addr)
{
    for (size_t i = 0; i < nw; i++) {
        char id[32];
        snprintf(id, sizeof(id), "client.%" PRId64, w[i].id);
        if (streq(id, client) || streq_ptr(w[i].addr, addr))
            return true;
    }
    return false;
}

int rbd_lock_claim(rbd_image_t img, const char *name, size_t own, json_t **ret_fenced,
                   char **ret_msg)
{
    rbd_image_watcher_t w[WATCHERS_MAX];
    size_t nw = WATCHERS_MAX;
    int r = rbd_watchers_list(img, w, &nw);
    if (r == -ERANGE) {
        *ret_msg = xasprintf("volume %s is in use: image %s has more than %d clients", name,
                             name, WATCHERS_MAX);
        return -EBUSY;
    }
    if (r < 0) {
        *ret_msg = xasprintf("cannot list the clients of image %s: %s", name, strerror(-r));
        return r;
    }
    int excl = 0;
    char tag[256], clients[LOCKERS_BUF], cookies[LOCKERS_BUF], addrs[LOCKERS_BUF];
    size_t tl = sizeof(tag), cl = sizeof(clients), kl = sizeof(cookies), al = sizeof(addrs);
    ssize_t n = rbd_list_lockers(img, &excl, tag, &tl, clients, &cl, cookies, &kl, addrs, &al);
    if (n < 0) {
        *ret_msg = xasprintf("cannot read the lock of image %s: %s", name, strerror((int)-n));
        rbd_watchers_list_cleanup(w, nw);
        return (int)n;
    }
    json_t *fenced = json_array();
    const char *cli = clients, *ck = cookies, *ad = addrs;
    for (ssize_t i = 0; i < n && r == 0; i++) {
        if (holder_alive(w, nw, cli, ad)) {
            *ret_msg = xasprintf("volume %s is in use: %s at %s holds the image's lock and is "
                                 "alive (it watches the image); unstage the volume on its node, "
                                 "or stop that node: Ceph drops a dead client's watch after "
                                 "osd_client_watch_timeout (docs/rbd.md, node loss)", name, cli,
                                 ad);
            r = -EBUSY;
        } else if ((r = rbd_break_lock(img, cli, ck)) < 0 && r != -ENOENT) {
            *ret_msg = xasprintf("cannot fence %s at %s, the dead holder of image %s's lock "
                                 "(blocklist, then break the lock): %s", cli, ad, name,
                                 strerror(-r));
        } else {
            r = 0;
            json_array_append_new(fenced, json_pack("{s:s, s:s}", "client", cli, "addr", ad));
        }
        cli += strlen(cli) + 1;
        ck += strlen(ck) + 1;
        ad += strlen(ad) + 1;
    }
    if (r == 0 && nw > own) {
        *ret_msg = xasprintf("volume %s is in use: %zu other client(s) have image %s open (%s%s); "
                             "unstage it on the node serving it (a client that died keeps its "
                             "watch until osd_client_watch_timeout)", name, nw - own, name,
                             w[0].addr, nw - own > 1 ? ", ..." : "");
        r = -EBUSY;
    }
    rbd_watchers_list_cleanup(w, nw);
    if (r == 0 && json_array_size(fenced) > 0)
        *ret_fenced = json_incref(fenced);
    json_decref(fenced);
    return r;
}

/* ------------------------------------------------------------ loop side */

void rbd_log_fenced(const char *volume, json_t *fenced)
{
    size_t i;
    json_t *f;
    json_array_foreach(fenced, i, f)
        log_warn("rbd", "dead client fenced: blocklisted, its lock broken",
                 "volume=%s client=%s addr=%s", volume,
                 json_string_value(json_object_get(f, "client")),
                 json_string_value(json_object_get(f, "addr")));
}

/* A refusal, answered once the QSD is stopped. */
struct refusal {
    struct op *op;
    int status;
    char *msg;
};

static void confirm_stopped(struct qsd *q, int status, const char *msg, void *opaque)
{
    struct refusal *f = opaque;
    struct op *op = f->op;
    struct csi *c = op->csi;
    struct vol *v = op->vol;
    (void)q;
    if (status < 0) /* still running: the next plugin start stops it (orphan) */
        log_warn("rbd", "cannot stop the QSD of a refused stage", "volume=%s error=\"%s\"",
                 v->id, msg ? msg : strerror(-status));
    qsd_free(v->qsd);
    v->qsd = NULL;
    csi_remove_runtime(c, v->id);
    vol_clear_staging(v);
    op->vol = NULL;
    store_remove_vol(c->store, v);
    grpc_call_fail(op->call, rbd_code(f->status), "%s", f->msg);
    op_end(op);
    free(f->msg);
    free(f);
}

static void confirm_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    struct vol *v = op->vol;
    op->worker = NULL;
    rbd_log_fenced(v->id, json_object_get(result, "fenced"));
    if (status == 0) {
        log_info("node", "volume staged", "volume=%s pid=%d", v->id, (int)qsd_get_pid(v->qsd));
        grpc_call_reply(op->call, "", 0);
        op_end(op);
        return;
    }
    /* Undo: stop the QSD (it has no client yet), drop the record, answer. */
    log_warn("rbd", "stage refused after the QSD started", "volume=%s error=\"%s\"", v->id,
             msg ? msg : strerror(-status));
    struct refusal *f = xmalloc(sizeof(*f));
    *f = (struct refusal){op, status, xstrdup(msg ? msg : strerror(-status))};
    if (qsd_stop(v->qsd, confirm_stopped, f) < 0)
        confirm_stopped(v->qsd, -ESRCH, "qsd_stop failed", f);
}

void rbd_stage_confirm(struct op *op)
{
    op_worker(op, rbd_confirm_fn, CONFIRM_MS, confirm_done);
}
