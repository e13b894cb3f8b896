/* SPDX-License-Identifier: Apache-2.0 */
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
 * retries).  No QSD of a first stage gets a client before its node's check
 * passed (the socket is published after NodeStageVolume answered), so none
 * writes.  A restarted QSD does: its socket is published, its guest
 * reconnects and writes at once, and librbd hands our QSD the lock (the
 * dead holder's was broken by the first check).  So in the second check
 * of a QSD just started (fresh: a new client, not blocklisted, its watch
 * registered when it opened the image) the image's only watcher holding
 * the lock is our QSD, not a live other client; with more watchers it is
 * refused anyway.  An adopted QSD of unknown age gets no such benefit: it
 * may have been fenced (watch gone) while another node's QSD took over. */
#include "rbd_lock.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"

#include <inttypes.h>

#define WATCHERS_MAX 16
#define LOCKERS_BUF 4096

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

/* Drop the watchers at address dead (our QSD, reaped: its watch outlives
 * it until Ceph expires it) from w; how many are left. */
static size_t drop_dead(rbd_image_watcher_t *w, size_t nw, const char *dead)
{
    size_t n = 0;
    for (size_t i = 0; i < nw; i++) {
        rbd_image_watcher_t t = w[n];
        w[n] = w[i];
        w[i] = t;
        if (!dead || !streq_ptr(w[n].addr, dead))
            n++;
    }
    return n;
}

int rbd_lock_claim(rbd_image_t img, const char *name, size_t own, bool fresh, const char *dead,
                   json_t **ret_fenced, char **ret_own, bool *ret_held, char **ret_msg)
{
    rbd_image_watcher_t w[WATCHERS_MAX];
    size_t all = WATCHERS_MAX, nw;
    int r = rbd_watchers_list(img, w, &all);
    nw = r == 0 ? drop_dead(w, all, dead) : 0;
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
        rbd_watchers_list_cleanup(w, all);
        return (int)n;
    }
    json_t *fenced = json_array();
    const char *cli = clients, *ck = cookies, *ad = addrs;
    for (ssize_t i = 0; i < n && r == 0; i++) {
        if (fresh && own == 1 && nw == 1 && holder_alive(w, 1, cli, ad)) {
            /* Our new QSD, the only client left, holds the lock: its
             * guest wrote before this check (a restart's client reconnects
             * at once).  Not another node's. */
        } else if (holder_alive(w, nw, cli, ad)) {
            *ret_msg = xasprintf("volume %s is in use: %s at %s holds the image's lock and is "
                                 "alive (it watches the image); unstage the volume on its node, "
                                 "or stop that node: Ceph drops a dead client's watch after "
                                 "osd_client_watch_timeout (docs/rbd.md, node loss)", name, cli,
                                 ad);
            *ret_held = true;
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
    if (r == 0 && own == 1 && nw == 1 && ret_own)
        *ret_own = xstrdup(w[0].addr);
    rbd_watchers_list_cleanup(w, all);
    if (r == 0 && json_array_size(fenced) > 0)
        *ret_fenced = json_incref(fenced);
    json_decref(fenced);
    return r;
}

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
