/* qsd/qemu/thin.c: thin snapshots, clones, merges and garbage collection on the
 * pool's qcow2 layers.  See thin.h (the steps) and layers.h (the rules). */
#include "qsd/qemu/thin.h"
#include "qsd/qemu/qmpcmd.h"
#include "qsd/qemu/qsdconf.h"
#include <sys/random.h>
#include "qsd/qemu/imagebase.h"
#include "qsd/base/util.h"

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>

#define MERGE_JOB "merge"
#define CANCEL_WAIT_MS 10000u

/* ------------------------------------------------------------ helpers */

static void fsync_dir(const char *dir)
{
    _cleanup_close_ int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0)
        fsync(fd);
}

static int fsync_path(const char *path)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) < 0)
        return -errno;
    return 0;
}

static char *layer_path(const struct pool *p, const char *layer)
{
    return xasprintf("%s/%s.qcow2", p->layers, layer);
}

static char *vol_path(const struct pool *p, const char *vol)
{
    return xasprintf("%s/%s.qcow2", p->volumes, vol);
}

/* "<what>: <strerror>"; takes what. */
static int errmsg_take(int r, char **ret_msg, char *what)
{
    *ret_msg = xasprintf("%s: %s", what, strerror(-r));
    free(what);
    return r;
}
#define errmsg(r, ret_msg, ...) errmsg_take((r), (ret_msg), xasprintf(__VA_ARGS__))

int pool_lock(const struct pool *p, uint64_t timeout_ms, int *ret_fd, char **ret_msg)
{
    /* flock on the pool directory itself: no lock file to leave behind */
    const char *path = p->root;
    _cleanup_close_ int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return errmsg(-errno, ret_msg, "cannot open %s%s", path, "");
    uint64_t deadline = now_ms() + timeout_ms;
    while (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        if (errno != EWOULDBLOCK && errno != EINTR)
            return errmsg(-errno, ret_msg, "cannot lock %s%s", path, "");
        if (now_ms() >= deadline) {
            *ret_msg = xasprintf("the pool is locked by another operation for more than %" PRIu64
                                 " ms (%s)", timeout_ms, path);
            return -EBUSY;
        }
        sleep_ms(10);
    }
    *ret_fd = TAKE_FD(fd);
    return 0;
}

int image_header(const char *path, char ret_backing[LAYER_NAME_LEN + 1], uint64_t *ret_size,
                 char **ret_msg)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return errmsg(-errno, ret_msg, "cannot open %s%s", path, "");
    uint8_t buf[QCOW2_HEADER_MIN];
    struct qcow2_header h;
    if (pread(fd, buf, sizeof(buf), 0) != (ssize_t)sizeof(buf) ||
        qcow2_header_parse(buf, sizeof(buf), &h) < 0) {
        *ret_msg = xasprintf("%s is not a qcow2 image", path);
        return -EINVAL;
    }
    char name[QCOW2_BACKING_MAX + 1] = "";
    if (h.backing_offset) {
        if (pread(fd, name, h.backing_size, (off_t)h.backing_offset) != (ssize_t)h.backing_size) {
            *ret_msg = xasprintf("cannot read the backing file name of %s", path);
            return -EIO;
        }
        name[h.backing_size] = '\0';
    }
    char layer[LAYER_NAME_LEN + 1] = "";
    if (*name && layer_from_ref(name, layer) < 0) {
        *ret_msg = xasprintf("%s is backed by '%s', not by a layer of the pool", path, name);
        return -EXDEV;
    }
    if (ret_backing)
        memcpy(ret_backing, layer, sizeof(layer));
    if (ret_size)
        *ret_size = h.size;
    return 0;
}

void chain_clear(struct chain *c)
{
    for (size_t i = 0; i < c->n; i++)
        free(c->l[i].path);
    free(c->l);
    c->l = NULL;
    c->n = 0;
}

int pool_chain(const struct pool *p, const char *path, const char *format, struct chain *ret,
               char **ret_msg)
{
    struct chain c = {.l = xcalloc(LAYER_MAX_DEPTH * 2, sizeof(struct chain_layer))};
    char *cur = xstrdup(path), layer[LAYER_NAME_LEN + 1] = "";
    bool raw = format && streq(format, "raw");
    while (cur) {
        if (c.n == LAYER_MAX_DEPTH * 2) {
            free(cur);
            chain_clear(&c);
            *ret_msg = xasprintf("the chain of %s is longer than %u layers", path,
                                 LAYER_MAX_DEPTH * 2);
            return -ELOOP;
        }
        struct chain_layer *l = &c.l[c.n++];
        l->path = cur;
        memcpy(l->layer, layer, sizeof(layer));
        struct stat st;
        if (stat(cur, &st) < 0) {
            int r = -errno;
            chain_clear(&c);
            return errmsg(r, ret_msg, "layer %s of the chain of %s is missing", cur, path);
        }
        l->alloc = (uint64_t)st.st_blocks * 512;
        l->nlink = (unsigned)st.st_nlink;
        l->size = (uint64_t)st.st_size;
        cur = NULL;
        if (raw)
            break;
        char next[LAYER_NAME_LEN + 1];
        int r = image_header(l->path, next, &l->size, ret_msg);
        if (r < 0) {
            chain_clear(&c);
            return r;
        }
        if (*next) {
            cur = layer_path(p, next);
            memcpy(layer, next, sizeof(next));
        }
    }
    *ret = c;
    return 0;
}

json_t *chain_to_json(const struct chain *c)
{
    json_t *a = json_array();
    for (size_t i = 0; i < c->n; i++)
        json_array_append_new(a, json_pack("{s:s, s:s?, s:I, s:I, s:b}", "path", c->l[i].path,
                                           "layer", *c->l[i].layer ? c->l[i].layer : NULL,
                                           "allocated", (json_int_t)c->l[i].alloc, "size",
                                           (json_int_t)c->l[i].size, "shared",
                                           i > 0 && c->l[i].nlink > 1));
    return a;
}

int pool_link_layer(const struct pool *p, const char *path, char ret[LAYER_NAME_LEN + 1],
                    char **ret_msg)
{
    for (int tries = 0; tries < 64; tries++) {
        /* Random: a QSD (which may read every layer, qsdconf.h) cannot
         * guess the names of layers outside its own chain. */
        uint64_t v;
        if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v))
            return errmsg(-EIO, ret_msg, "cannot draw a layer name for %s", path);
        char name[LAYER_NAME_LEN + 1];
        layer_name_from(v, name);
        _cleanup_free_ char *lp = layer_path(p, name);
        if (link(path, lp) == 0) {
            fsync_dir(p->layers);
            memcpy(ret, name, sizeof(name));
            return 0;
        }
        if (errno != EEXIST)
            return errmsg(-errno, ret_msg, "cannot link %s into %s", path, p->layers);
    }
    *ret_msg = xstrdup("cannot find a free layer name");
    return -EEXIST;
}

/* Remove layer names that are only a second name of vol's top (a crash
 * between steps 1 and 4).  The top's inode is the truth. */
static void drop_extra_names(const struct pool *p, const char *top)
{
    struct stat st;
    if (stat(top, &st) < 0 || st.st_nlink < 2)
        return;
    DIR *d = opendir(p->layers);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n != LAYER_NAME_LEN + 6 || !streq(de->d_name + LAYER_NAME_LEN, ".qcow2"))
            continue;
        struct stat ls;
        if (fstatat(dirfd(d), de->d_name, &ls, AT_SYMLINK_NOFOLLOW) == 0 && ls.st_ino == st.st_ino &&
            ls.st_dev == st.st_dev)
            unlinkat(dirfd(d), de->d_name, 0);
    }
    closedir(d);
    fsync_dir(p->layers);
}

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
    _cleanup_free_ char *top = vol_path(p, vol);
    char layer[LAYER_NAME_LEN + 1];
    const char *what = NULL;
    if (find_tmp(p, vol, layer)) {
        _cleanup_free_ char *name = layer_tmp_name(vol, layer);
        _cleanup_free_ char *tmp = xasprintf("%s/%s", p->volumes, name);
        _cleanup_free_ char *lp = layer_path(p, layer);
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
            fsync_dir(p->volumes);
            qsd_freeze_layer(lp);
            what = "finished an interrupted snapshot";
        } else {
            unlink(tmp);
            fsync_dir(p->volumes);
            what = "undid an interrupted snapshot";
        }
    }
    struct stat st;
    if (stat(top, &st) == 0 && st.st_nlink > 1) {
        drop_extra_names(p, top);
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
    _cleanup_free_ char *top = vol_path(p, vol);
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
    return image_qemu_img(argv, timeout_ms, NULL, ret_msg);
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

int thin_snapshot(const struct pool *p, const char *vol, struct qmp_sync *s,
                  const struct qsd_opts *o, const char *snap, uint64_t timeout_ms,
                  char ret_layer[LAYER_NAME_LEN + 1], char **ret_msg)
{
    _cleanup_free_ char *top = vol_path(p, vol);
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
    _cleanup_close_ int lock = -1;
    int r = pool_lock(p, POOL_LOCK_TIMEOUT_MS, &lock, ret_msg);
    if (r < 0)
        return r;
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
    char layer[LAYER_NAME_LEN + 1];
    if ((r = pool_link_layer(p, top, layer, ret_msg)) < 0)
        return r;
    _cleanup_free_ char *lp = layer_path(p, layer);
    _cleanup_free_ char *ref = layer_ref(layer);
    _cleanup_free_ char *tname = layer_tmp_name(vol, layer);
    _cleanup_free_ char *tmp = xasprintf("%s/%s", p->volumes, tname);
    /* 2. an empty overlay on it (-u: the backing is not opened; a QSD holds
     * it with a write lock) */
    char sz[32];
    snprintf(sz, sizeof(sz), "%" PRIu64, size);
    char *argv[] = {"qemu-img", "create", "-q", "-u", "-f", "qcow2", "-b", ref, "-F", "qcow2",
                    tmp, sz, NULL};
    if ((r = image_qemu_img(argv, QEMU_IMG_QUICK_MS, NULL, ret_msg)) < 0 || (r = fsync_path(tmp)) < 0) {
        if (!*ret_msg)
            errmsg(r, ret_msg, "cannot write %s%s", tmp, "");
        unlink(tmp);
        unlink(lp);
        return r;
    }
    /* The volume's QSD (its own uid, qsdconf.h) opens it read-write. */
    qsd_give_like(tmp, top);
    fsync_dir(p->volumes);
    /* 3. the running QSD moves its export onto the overlay */
    if (s) {
        _cleanup_free_ char *exp = NULL, *fnode = xasprintf("f-%s", layer),
                        *onode = xasprintf("ov-%s", layer);
        bool refused = true;
        r = qmpc_export_node(s, &exp, ret_msg);
        if (r == 0)
            r = qmpc_call(s, qmpc_named(qmpc_blockdev_add(qsd_file_node_json(o, fnode, tmp)),
                                        "blockdev-add of the overlay's file"),
                          NULL, NULL, ret_msg);
        if (r == 0) {
            json_t *fmt = qsd_format_node_json(o, onode, "qcow2", fnode);
            json_object_set_new(fmt, "backing", json_null());
            r = qmpc_call(s, qmpc_named(qmpc_blockdev_add(fmt), "blockdev-add of the overlay"),
                          NULL, NULL, ret_msg);
            if (r < 0)
                qmp_del_node(s, fnode);
        }
        if (r == 0) {
            r = qmpc_call(s, qmpc_blockdev_snapshot(exp, onode), NULL, &refused, ret_msg);
            if (r < 0 && refused) {
                qmp_del_node(s, onode);
                qmp_del_node(s, fnode);
            }
        }
        if (r < 0) {
            if (refused) {
                /* Nothing switched: undo steps 1 and 2. */
                unlink(tmp);
                unlink(lp);
            }
            /* Otherwise the outcome is unknown (connection lost): the
             * overlay stays for thin_recover to decide. */
            return r;
        }
    }
    /* 4. the overlay is the volume's top from now on (QSD restarts open it) */
    if (rename(tmp, top) < 0)
        return errmsg(-errno, ret_msg, "cannot rename %s to %s", tmp, top);
    fsync_dir(p->volumes);
    qsd_freeze_layer(lp); /* after step 3: QEMU reopened it read-only by name */
    /* 5. the snapshot is a second name of the frozen layer */
    if (spath) {
        if (link(lp, spath) < 0)
            return errmsg(-errno, ret_msg, "cannot link %s to %s", lp, spath);
        fsync_dir(p->snapshots);
    }
    memcpy(ret_layer, layer, sizeof(layer));
    return 0;
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
    _cleanup_free_ char *lp = layer_path(p, layer);
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
    _cleanup_free_ char *final = vol_path(p, vol);
    _cleanup_free_ char *tmp = xasprintf("%s/.%s.qcow2.tmp-%d", p->volumes, vol, (int)getpid());
    char sz[32];
    snprintf(sz, sizeof(sz), "%" PRIu64, size ? size : lsize);
    char *argv[] = {"qemu-img", "create", "-q", "-u", "-f", "qcow2", "-b", ref, "-F", "qcow2",
                    tmp, sz, NULL};
    if ((r = image_qemu_img(argv, QEMU_IMG_QUICK_MS, NULL, ret_msg)) < 0 || (r = fsync_path(tmp)) < 0) {
        if (!*ret_msg)
            errmsg(r, ret_msg, "cannot write %s%s", tmp, "");
        unlink(tmp);
        return r;
    }
    chmod(tmp, 0600);
    return image_publish(tmp, final, ret_msg);
}

/* ----------------------------------------------------------------- gc */

struct scanned {
    struct pool_file *f;
    char **names;    /* PF_LAYER: file name to unlink */
    char (*layers)[LAYER_NAME_LEN + 1];
    char (*backing)[LAYER_NAME_LEN + 1];
    uint64_t *alloc;
    size_t n, cap;
};

static void scan_grow(struct scanned *sc)
{
    if (sc->n < sc->cap)
        return;
    sc->cap = sc->cap ? sc->cap * 2 : 64;
    sc->f = xrealloc(sc->f, sc->cap * sizeof(*sc->f));
    sc->names = xrealloc(sc->names, sc->cap * sizeof(*sc->names));
    sc->layers = xrealloc(sc->layers, sc->cap * sizeof(*sc->layers));
    sc->backing = xrealloc(sc->backing, sc->cap * sizeof(*sc->backing));
    sc->alloc = xrealloc(sc->alloc, sc->cap * sizeof(*sc->alloc));
}

static void scan_dir(struct scanned *sc, const char *dir, enum pool_file_kind kind)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (streq(de->d_name, ".") || streq(de->d_name, ".."))
            continue;
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
            continue;
        scan_grow(sc);
        size_t i = sc->n;
        sc->names[i] = xasprintf("%s/%s", dir, de->d_name);
        sc->f[i] = (struct pool_file){.kind = kind, .nlink = (unsigned)st.st_nlink};
        sc->alloc[i] = (uint64_t)st.st_blocks * 512;
        sc->layers[i][0] = sc->backing[i][0] = '\0';
        if (kind == PF_LAYER) {
            size_t n = strlen(de->d_name);
            if (n != LAYER_NAME_LEN + 6 || !streq(de->d_name + LAYER_NAME_LEN, ".qcow2")) {
                free(sc->names[i]);
                continue; /* not a layer (a stray file is never removed) */
            }
            memcpy(sc->layers[i], de->d_name, LAYER_NAME_LEN);
            sc->layers[i][LAYER_NAME_LEN] = '\0';
            if (!layer_name_valid(sc->layers[i])) {
                free(sc->names[i]);
                continue;
            }
        }
        _cleanup_free_ char *m = NULL;
        int r = image_header(sc->names[i], sc->backing[i], NULL, &m);
        /* a raw volume or a foreign backing is simply not a reference */
        sc->f[i].unreadable = r < 0 && kind == PF_LAYER;
        sc->n++;
    }
    closedir(d);
}

/* Image names used by CreateVolume recently are references (imagebase.h). */
static void scan_images(struct scanned *sc, const struct pool *p)
{
    DIR *d = opendir(p->images);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        char layer[LAYER_NAME_LEN + 1];
        if (imagebase_name_layer(dirfd(d), de->d_name, IMAGEBASE_KEEP_S, layer) <= 0)
            continue;
        scan_grow(sc);
        size_t i = sc->n++;
        sc->names[i] = xasprintf("%s/%s", p->images, de->d_name);
        sc->f[i] = (struct pool_file){.kind = PF_IMAGE, .nlink = 1};
        sc->alloc[i] = 0;
        sc->layers[i][0] = '\0';
        memcpy(sc->backing[i], layer, sizeof(layer));
    }
    closedir(d);
}

int pool_gc(const struct pool *p, unsigned *ret_removed, uint64_t *ret_freed, char **ret_msg)
{
    _cleanup_close_ int lock = -1;
    int r = pool_lock(p, POOL_LOCK_TIMEOUT_MS, &lock, ret_msg);
    if (r < 0)
        return r;
    struct scanned sc = {0};
    scan_dir(&sc, p->volumes, PF_VOLUME);
    scan_dir(&sc, p->snapshots, PF_SNAPSHOT);
    scan_dir(&sc, p->layers, PF_LAYER);
    scan_images(&sc, p);
    for (size_t i = 0; i < sc.n; i++) {
        sc.f[i].layer = sc.f[i].kind == PF_LAYER ? sc.layers[i] : NULL;
        sc.f[i].backing = *sc.backing[i] ? sc.backing[i] : NULL;
    }
    bool *garbage = xcalloc(sc.n + 1, sizeof(bool));
    layers_garbage(sc.f, sc.n, garbage);
    unsigned removed = 0;
    uint64_t freed = 0;
    for (size_t i = 0; i < sc.n; i++) {
        if (garbage[i] && unlink(sc.names[i]) == 0) {
            removed++;
            freed += sc.alloc[i];
        }
        free(sc.names[i]);
    }
    if (removed)
        fsync_dir(p->layers);
    imagebase_gc_locked(p);
    free(garbage);
    free(sc.f);
    free(sc.names);
    free(sc.layers);
    free(sc.backing);
    free(sc.alloc);
    if (ret_removed)
        *ret_removed = removed;
    if (ret_freed)
        *ret_freed = freed;
    return 0;
}
