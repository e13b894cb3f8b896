/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/thin.c: thin snapshots, clones, merges and crash recovery on the
 * pool's qcow2 layers (pool.h), through qemu-img or the volume's QSD.  See
 * thin.h (the steps) and layers.h (the rules). */
#include "qsd/qemu/thin.h"
#include "qsd/qemu/qemuimg.h"
#include "qsd/qemu/qmpcmd.h"
#include "qsd/qemu/qsdconf.h"
#include "qsd/base/util.h"

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <sys/stat.h>

#define MERGE_JOB "merge"
#define CANCEL_WAIT_MS 10000u

/* ------------------------------------------------------------ helpers */

static int fsync_path(const char *path)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) < 0)
        return -errno;
    return 0;
}

/* "<what>: <strerror>"; takes what. */
static int errmsg_take(int r, char **ret_msg, char *what)
{
    *ret_msg = xasprintf("%s: %s", what, strerror(-r));
    free(what);
    return r;
}
#define errmsg(r, ret_msg, ...) errmsg_take((r), (ret_msg), xasprintf(__VA_ARGS__))

/* ---------------------------------------------------------------- QMP */

int thin_merge_running(struct qmp_sync *s, char **ret_msg)
{
    return qmpc_job_listed(s, MERGE_JOB, ret_msg);
}

/* Cancel a running merge: a stream stopped halfway leaves the chain as it
 * was, with some data already in the top (the next merge skips it). */
static int cancel_merge(struct qmp_sync *s, char **ret_msg)
{
    int r = thin_merge_running(s, ret_msg);
    if (r <= 0)
        return r;
    bool refused = false;
    _cleanup_free_ char *m = NULL;
    r = qmpc_call(s, qmpc_block_job_cancel(MERGE_JOB), NULL, &refused, &m);
    if (r < 0 && !refused) {
        *ret_msg = TAKE_PTR(m);
        return r;
    }
    /* refused: it may have finished meanwhile */
    uint64_t deadline = now_ms() + CANCEL_WAIT_MS;
    while ((r = thin_merge_running(s, ret_msg)) == 1) {
        if (now_ms() >= deadline) {
            *ret_msg = xstrdup("the running merge did not stop within 10 s");
            return -ETIMEDOUT;
        }
        sleep_ms(20);
    }
    return r;
}

static void qmp_del_node(struct qmp_sync *s, const char *node)
{
    _cleanup_free_ char *m = NULL;
    qmpc_call(s, qmpc_blockdev_del(node), NULL, NULL, &m);
}

/* QEMU 10.0.2 (measured): with the export in an iothread, any drain while
 * the vhost-user client does I/O (blockdev-add attaching a child,
 * blockdev-snapshot, block-stream's completion, even block_resize) hangs
 * QSD for good, or aborts it in vhost_user_server_attach_aio_context.  In
 * the main loop the same sequences work.  So graph changes are only made in
 * a QSD without iothreads (the CSI plugin starts them so); for the others
 * the caller falls back to a full copy. */
static int refuse_iothread(struct qmp_sync *s, char **ret_msg)
{
    unsigned n;
    int r = qmpc_iothreads(s, &n, ret_msg);
    if (r < 0)
        return r;
    if (n) {
        *ret_msg = xstrdup("the volume's QSD runs its export in an iothread: QEMU 10.0 hangs on "
                           "a graph change under I/O there (start it without iothread)");
        return -EOPNOTSUPP;
    }
    return 0;
}

/* ----------------------------------------------------------- recovery */

/* Finds the in-flight overlay of vol, if any. */
static bool find_tmp(const struct pool *p, const char *vol, char ret_layer[LAYER_NAME_LEN + 1])
{
    DIR *d = opendir(p->volumes);
    if (!d)
        return false;
    bool found = false;
    struct dirent *de;
    while (!found && (de = readdir(d)))
        found = layer_tmp_parse(de->d_name, vol, ret_layer);
    closedir(d);
    return found;
}

static int recover_locked(const struct pool *p, const char *vol, struct qmp_sync *s,
                          const char **ret_what, char **ret_msg)
{
    _cleanup_free_ char *top = pool_volume_path(p, vol);
    char layer[LAYER_NAME_LEN + 1];
    const char *what = NULL;
    if (find_tmp(p, vol, layer)) {
        _cleanup_free_ char *name = layer_tmp_name(vol, layer);
        _cleanup_free_ char *tmp = xasprintf("%s/%s", p->volumes, name);
        _cleanup_free_ char *lp = pool_layer_path(p, layer);
        bool forward;
        if (s) {
            /* A running QSD: did it switch to the overlay (step 3)? */
            _cleanup_free_ char *node = NULL, *ov = xasprintf("ov-%s", layer);
            int r = qmpc_export_node(s, &node, ret_msg);
            if (r < 0)
                return r;
            forward = streq(node, ov);
        } else {
            /* No QSD writes the old top: the overlay on it is the same data
             * if it is complete, so finish (a torn overlay is undone). */
            char b[LAYER_NAME_LEN + 1];
            _cleanup_free_ char *m = NULL;
            forward = image_header(tmp, b, NULL, &m) == 0 && streq(b, layer) &&
                      access(lp, F_OK) == 0 && fsync_path(tmp) == 0;
        }
        if (forward) {
            if (rename(tmp, top) < 0)
                return errmsg(-errno, ret_msg, "cannot rename %s to %s", tmp, top);
            pool_fsync_dir(p->volumes);
            qsd_freeze_layer(lp);
            what = "finished an interrupted snapshot";
        } else {
            unlink(tmp);
            pool_fsync_dir(p->volumes);
            what = "undid an interrupted snapshot";
        }
    }
    struct stat st;
    if (stat(top, &st) == 0 && st.st_nlink > 1) {
        pool_drop_extra_names(p, top);
        what = what ? what : "removed the layer name of an interrupted snapshot";
    }
    if (ret_what)
        *ret_what = what;
    return 0;
}

int thin_recover(const struct pool *p, const char *vol, struct qmp_sync *s, const char **ret_what,
                 char **ret_msg)
{
    _cleanup_close_ int lock = -1;
    int r = pool_lock(p, POOL_LOCK_TIMEOUT_MS, &lock, ret_msg);
    if (r < 0)
        return r;
    return recover_locked(p, vol, s, ret_what, ret_msg);
}

/* -------------------------------------------------------------- merge */

static int merge_locked(const struct pool *p, const char *vol, struct qmp_sync *s, unsigned to,
                        bool wait, uint64_t timeout_ms, char **ret_msg)
{
    _cleanup_free_ char *top = pool_volume_path(p, vol);
    struct chain c;
    int r = pool_chain(p, top, "qcow2", &c, ret_msg);
    if (r < 0)
        return r;
    if (to < 1)
        to = 1;
    if (c.n <= to) {
        chain_clear(&c);
        return 1;
    }
    /* Layers 1..m go into the top; index m+1 (if any) becomes its backing. */
    size_t m = c.n - to;
    const char *base = m + 1 < c.n ? c.l[m + 1].layer : NULL;
    _cleanup_free_ char *ref = base ? layer_ref(base) : NULL;
    if (s) {
        if ((r = refuse_iothread(s, ret_msg)) < 0 || (r = thin_merge_running(s, ret_msg)) != 0) {
            chain_clear(&c);
            return r < 0 ? r : 1;
        }
        _cleanup_free_ char *exp = NULL;
        json_t *graph = NULL;
        if ((r = qmpc_export_node(s, &exp, ret_msg)) < 0 ||
            (r = qmpc_block_graph(s, &graph, ret_msg)) < 0) {
            chain_clear(&c);
            return r;
        }
        const char **names = NULL;
        size_t n = 0;
        r = layers_qemu_chain(graph, exp, &names, &n);
        if (r < 0 || n != c.n) {
            *ret_msg = xasprintf("the QSD's chain (%zu nodes) does not match the pool's (%zu files)",
                                 n, c.n);
            free(names);
            json_decref(graph);
            chain_clear(&c);
            return -EPROTO;
        }
        struct qmpc cmd = qmpc_block_stream(MERGE_JOB, exp, base ? names[m + 1] : NULL, ref);
        free(names);
        json_decref(graph);
        chain_clear(&c);
        if ((r = qmpc_call(s, cmd, NULL, NULL, ret_msg)) < 0 || !wait)
            return r;
        bool ended = false;
        r = qmpc_job_wait(s, MERGE_JOB, "merge", timeout_ms, &ended, ret_msg);
        if (r < 0 && !ended) {
            _cleanup_free_ char *m2 = NULL;
            cancel_merge(s, &m2);
        }
        return r;
    }
    chain_clear(&c);
    /* Offline: qemu-img rebase (safe mode) copies what differs between the
     * old and the new backing into the top, then rewrites its header.
     * Killed halfway, the top keeps its old backing and correct data. */
    char *argv[] = {"qemu-img", "rebase", "-q", "-f", "qcow2", "-b", ref ? ref : "", NULL, NULL,
                    NULL, NULL};
    int k = 7;
    if (ref) {
        argv[k++] = "-F";
        argv[k++] = "qcow2";
    }
    argv[k++] = top;
    return qemu_img_run(argv, timeout_ms, NULL, ret_msg);
}

int thin_merge(const struct pool *p, const char *vol, struct qmp_sync *s, unsigned to, bool wait,
               uint64_t timeout_ms, char **ret_msg)
{
    _cleanup_close_ int lock = -1;
    int r = pool_lock(p, POOL_LOCK_TIMEOUT_MS, &lock, ret_msg);
    if (r < 0)
        return r;
    if ((r = recover_locked(p, vol, s, NULL, ret_msg)) < 0)
        return r;
    return merge_locked(p, vol, s, to, wait, timeout_ms, ret_msg);
}

/* ----------------------------------------------------------- snapshot */

/* Step 3a of a snapshot: add the overlay tmp (of layer) to the QSD as
 * "f-<layer>" and "ov-<layer>" (nothing uses them yet); *ret_exp: the
 * export's node, which 3b moves onto the overlay. */
static int attach_live(struct qmp_sync *s, const struct qsd_opts *o, const char *layer,
                       const char *tmp, char **ret_exp, char **ret_msg)
{
    _cleanup_free_ char *exp = NULL, *fnode = xasprintf("f-%s", layer);
    int r = qmpc_export_node(s, &exp, ret_msg);
    if (r == 0)
        r = qmpc_call(s, qmpc_named(qmpc_blockdev_add(qsd_file_node_json(o, fnode, tmp)),
                                    "blockdev-add of the overlay's file"),
                      NULL, NULL, ret_msg);
    if (r == 0) {
        _cleanup_free_ char *onode = xasprintf("ov-%s", layer);
        json_t *fmt = qsd_format_node_json(o, onode, "qcow2", fnode);
        json_object_set_new(fmt, "backing", json_null());
        r = qmpc_call(s, qmpc_named(qmpc_blockdev_add(fmt), "blockdev-add of the overlay"),
                      NULL, NULL, ret_msg);
        if (r < 0)
            qmp_del_node(s, fnode);
    }
    if (r == 0)
        *ret_exp = TAKE_PTR(exp);
    return r;
}

/* Remove the nodes of 3a again (nothing switched). */
static void detach_live(struct qmp_sync *s, const char *layer)
{
    _cleanup_free_ char *fnode = xasprintf("f-%s", layer), *onode = xasprintf("ov-%s", layer);
    qmp_del_node(s, onode);
    qmp_del_node(s, fnode);
}

/* Step 3b: blockdev-snapshot moves the export onto the overlay.
 * *ret_refused: the QSD refused (nothing switched); false when the outcome
 * is unknown (connection lost). */
static int switch_live(struct qmp_sync *s, const char *exp, const char *layer, bool *ret_refused,
                       char **ret_msg)
{
    _cleanup_free_ char *onode = xasprintf("ov-%s", layer);
    bool refused = true;
    int r = qmpc_call(s, qmpc_blockdev_snapshot(exp, onode), NULL, &refused, ret_msg);
    *ret_refused = refused;
    return r;
}

int thin_step_prepare(const struct pool *p, const char *vol, struct qmp_sync *s, const char *snap,
                      uint64_t timeout_ms, struct thin_step *st, char **ret_msg)
{
    *st = (struct thin_step){0};
    _cleanup_free_ char *top = pool_volume_path(p, vol);
    if (access(top, F_OK) < 0) {
        _cleanup_free_ char *raw = xasprintf("%s/%s.raw", p->volumes, vol);
        if (access(raw, F_OK) == 0) {
            *ret_msg = xasprintf("volume %s is raw: raw volumes have no layers", vol);
            return -EOPNOTSUPP;
        }
        *ret_msg = xasprintf("volume %s does not exist", vol);
        return -ENOENT;
    }
    _cleanup_free_ char *spath = snap ? xasprintf("%s/%s.qcow2", p->snapshots, snap) : NULL;
    if (spath && access(spath, F_OK) == 0) {
        *ret_msg = xasprintf("snapshot %s already exists", snap);
        return -EEXIST;
    }
    int r;
    if (s && (r = refuse_iothread(s, ret_msg)) < 0)
        return r;
    if ((r = recover_locked(p, vol, s, NULL, ret_msg)) < 0)
        return r;
    struct chain c;
    if ((r = pool_chain(p, top, "qcow2", &c, ret_msg)) < 0)
        return r;
    size_t depth = c.n;
    uint64_t size = c.l[0].size;
    chain_clear(&c);
    if (layers_full((unsigned)depth)) {
        /* Rare: a live volume is merged in the background long before. */
        r = merge_locked(p, vol, s, LAYER_MERGE_TO, true, timeout_ms, ret_msg);
        if (r < 0)
            return r;
    }
    if (s && (r = cancel_merge(s, ret_msg)) < 0)
        return r;

    /* 1. the top gets a layer name */
    if ((r = pool_link_layer(p, top, st->layer, ret_msg)) < 0)
        return r;
    _cleanup_free_ char *lp = pool_layer_path(p, st->layer);
    _cleanup_free_ char *ref = layer_ref(st->layer);
    _cleanup_free_ char *tname = layer_tmp_name(vol, st->layer);
    _cleanup_free_ char *tmp = xasprintf("%s/%s", p->volumes, tname);
    /* 2. an empty overlay on it (-u: the backing is not opened; a QSD holds
     * it with a write lock) */
    char sz[32];
    snprintf(sz, sizeof(sz), "%" PRIu64, size);
    char *argv[] = {"qemu-img", "create", "-q", "-u", "-f", "qcow2", "-b", ref, "-F", "qcow2",
                    tmp, sz, NULL};
    if ((r = qemu_img_run(argv, QEMU_IMG_QUICK_MS, NULL, ret_msg)) < 0 || (r = fsync_path(tmp)) < 0) {
        if (!*ret_msg)
            errmsg(r, ret_msg, "cannot write %s%s", tmp, "");
        unlink(tmp);
        unlink(lp);
        return r;
    }
    /* The volume's QSD (its own uid, qsdconf.h) opens it read-write. */
    qsd_give_like(tmp, top);
    pool_fsync_dir(p->volumes);
    st->top = TAKE_PTR(top);
    st->tmp = TAKE_PTR(tmp);
    st->lp = TAKE_PTR(lp);
    st->spath = TAKE_PTR(spath);
    st->prepared = true;
    return 0;
}

int thin_step_attach(struct thin_step *st, struct qmp_sync *s, const struct qsd_opts *o,
                     char **ret_msg)
{
    if (!s)
        return 0;
    int r = attach_live(s, o, st->layer, st->tmp, &st->exp, ret_msg);
    if (r == 0)
        st->s = s;
    return r;
}

int thin_step_switch(struct thin_step *st, char **ret_msg)
{
    if (!st->s) {
        st->switched = true; /* offline: the rename (step 4) is the switch */
        return 0;
    }
    bool refused = true;
    int r = switch_live(st->s, st->exp, st->layer, &refused, ret_msg);
    if (r < 0) {
        /* Refused: nothing switched (thin_step_undo); otherwise the outcome
         * is unknown (connection lost): the overlay stays for thin_recover
         * to decide. */
        st->unknown = !refused;
        return r;
    }
    st->switched = true;
    return 0;
}

int thin_step_finish(const struct pool *p, struct thin_step *st, char **ret_msg)
{
    /* 4. the overlay is the volume's top from now on (QSD restarts open it) */
    if (rename(st->tmp, st->top) < 0)
        return errmsg(-errno, ret_msg, "cannot rename %s to %s", st->tmp, st->top);
    pool_fsync_dir(p->volumes);
    qsd_freeze_layer(st->lp); /* after step 3: QEMU reopened it read-only by name */
    /* 5. the snapshot is a second name of the frozen layer */
    if (st->spath) {
        if (link(st->lp, st->spath) < 0)
            return errmsg(-errno, ret_msg, "cannot link %s to %s", st->lp, st->spath);
        pool_fsync_dir(p->snapshots);
    }
    return 0;
}

void thin_step_undo(struct thin_step *st)
{
    if (st->prepared && !st->switched && !st->unknown) {
        if (st->s)
            detach_live(st->s, st->layer);
        unlink(st->tmp);
        unlink(st->lp);
    }
}

void thin_step_clear(struct thin_step *st)
{
    free(st->top);
    free(st->tmp);
    free(st->lp);
    free(st->spath);
    free(st->exp);
    *st = (struct thin_step){0};
}

int thin_snapshot(const struct pool *p, const char *vol, struct qmp_sync *s,
                  const struct qsd_opts *o, const char *snap, uint64_t timeout_ms,
                  char ret_layer[LAYER_NAME_LEN + 1], char **ret_msg)
{
    _cleanup_close_ int lock = -1;
    int r = pool_lock(p, POOL_LOCK_TIMEOUT_MS, &lock, ret_msg);
    if (r < 0)
        return r;
    struct thin_step st;
    if ((r = thin_step_prepare(p, vol, s, snap, timeout_ms, &st, ret_msg)) < 0)
        return r;
    /* 3. the running QSD moves its export onto the overlay */
    if ((r = thin_step_attach(&st, s, o, ret_msg)) < 0 || (r = thin_step_switch(&st, ret_msg)) < 0)
        thin_step_undo(&st);
    else if ((r = thin_step_finish(p, &st, ret_msg)) == 0)
        memcpy(ret_layer, st.layer, sizeof(st.layer));
    thin_step_clear(&st);
    return r;
}

int thin_snapshot_layer(const struct pool *p, const char *snap, char ret_layer[LAYER_NAME_LEN + 1],
                        char **ret_msg)
{
    _cleanup_free_ char *spath = xasprintf("%s/%s.qcow2", p->snapshots, snap);
    _cleanup_close_ int lock = -1;
    int r = pool_lock(p, POOL_LOCK_TIMEOUT_MS, &lock, ret_msg);
    if (r < 0)
        return r;
    struct stat st;
    if (stat(spath, &st) < 0)
        return errmsg(-errno, ret_msg, "snapshot %s%s", snap, "");
    if (st.st_nlink == 1) {
        /* A standalone snapshot file: give it a layer name. */
        char b[LAYER_NAME_LEN + 1];
        if ((r = image_header(spath, b, NULL, ret_msg)) < 0)
            return r;
        return pool_link_layer(p, spath, ret_layer, ret_msg);
    }
    DIR *d = opendir(p->layers);
    if (!d)
        return errmsg(-errno, ret_msg, "cannot read %s%s", p->layers, "");
    struct dirent *de;
    r = -ENOENT;
    while ((de = readdir(d))) {
        struct stat ls;
        if (strlen(de->d_name) == LAYER_NAME_LEN + 6 &&
            fstatat(dirfd(d), de->d_name, &ls, AT_SYMLINK_NOFOLLOW) == 0 &&
            ls.st_ino == st.st_ino && ls.st_dev == st.st_dev) {
            memcpy(ret_layer, de->d_name, LAYER_NAME_LEN);
            ret_layer[LAYER_NAME_LEN] = '\0';
            if (layer_name_valid(ret_layer)) {
                r = 0;
                break;
            }
        }
    }
    closedir(d);
    if (r < 0)
        *ret_msg = xasprintf("snapshot %s has another name but none in %s", snap, p->layers);
    return r;
}

int thin_create(const struct pool *p, const char *vol, const char *layer, uint64_t size,
                char **ret_msg)
{
    if (pool_find_volume(p, vol, NULL, NULL) == 0) {
        *ret_msg = xasprintf("volume %s already exists", vol);
        return -EEXIST;
    }
    _cleanup_close_ int lock = -1;
    int r = pool_lock(p, POOL_LOCK_TIMEOUT_MS, &lock, ret_msg);
    if (r < 0)
        return r;
    return thin_create_locked(p, vol, layer, size, ret_msg);
}

int thin_create_locked(const struct pool *p, const char *vol, const char *layer, uint64_t size,
                       char **ret_msg)
{
    _cleanup_free_ char *lp = pool_layer_path(p, layer);
    uint64_t lsize;
    int r;
    if ((r = image_header(lp, NULL, &lsize, ret_msg)) < 0)
        return r == -ENOENT ? -ENOENT : r;
    if (size && size < lsize) {
        *ret_msg = xasprintf("requested size %" PRIu64 " is smaller than the source (%" PRIu64
                             " bytes)", size, lsize);
        return -ERANGE;
    }
    _cleanup_free_ char *ref = layer_ref(layer);
    _cleanup_free_ char *final = pool_volume_path(p, vol);
    _cleanup_free_ char *tmp = xasprintf("%s/.%s.qcow2.tmp-%d", p->volumes, vol, (int)getpid());
    char sz[32];
    snprintf(sz, sizeof(sz), "%" PRIu64, size ? size : lsize);
    char *argv[] = {"qemu-img", "create", "-q", "-u", "-f", "qcow2", "-b", ref, "-F", "qcow2",
                    tmp, sz, NULL};
    if ((r = qemu_img_run(argv, QEMU_IMG_QUICK_MS, NULL, ret_msg)) < 0 || (r = fsync_path(tmp)) < 0) {
        if (!*ret_msg)
            errmsg(r, ret_msg, "cannot write %s%s", tmp, "");
        unlink(tmp);
        return r;
    }
    chmod(tmp, 0600);
    return pool_publish(tmp, final, ret_msg);
}
