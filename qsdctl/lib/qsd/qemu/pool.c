/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/pool.c: the volume pool at the bottom of qemu/: its layout, lock,
 * lookups, layer chains and names, and the garbage collection.  See pool.h. */
#include "qsd/qemu/pool.h"
#include "qsd/base/util.h"

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* "<what>: <strerror>"; takes what. */
static int errmsg_take(int r, char **ret_msg, char *what)
{
    *ret_msg = xasprintf("%s: %s", what, strerror(-r));
    free(what);
    return r;
}
#define errmsg(r, ret_msg, ...) errmsg_take((r), (ret_msg), xasprintf(__VA_ARGS__))

/* ------------------------------------------------------------- layout */

int pool_open(const char *root, bool create, struct pool *ret, char **ret_msg)
{
    struct pool p = {
        .root = xstrdup(root),
        .volumes = xasprintf("%s/volumes", root),
        .snapshots = xasprintf("%s/snapshots", root),
        .layers = xasprintf("%s/layers", root),
        .images = xasprintf("%s/images", root),
    };
    int r = 0;
    /* volumes/ and layers/: searchable by QSDs (each runs as a uid of its
     * own and opens its chain by name), listable by none; snapshots/ and
     * images/ not even searchable (qsdconf.h). */
    if (create && ((r = mkdir_p(p.volumes, 0711)) < 0 || (r = mkdir_p(p.snapshots, 0700)) < 0 ||
                   (r = mkdir_p(p.layers, 0711)) < 0 || (r = mkdir_p(p.images, 0700)) < 0)) {
        *ret_msg = xasprintf("cannot create pool directories under %s: %s", root, strerror(-r));
        pool_close(&p);
        return r;
    }
    if (create) {
        chmod(p.volumes, 0711);
        chmod(p.layers, 0711);
    }
    *ret = p;
    return 0;
}

void pool_close(struct pool *p)
{
    free(p->root);
    free(p->volumes);
    free(p->snapshots);
    free(p->layers);
    free(p->images);
    memset(p, 0, sizeof(*p));
}

int pool_find_volume(const struct pool *p, const char *name, char **ret_path, char **ret_format)
{
    static const char *const fmts[] = {"qcow2", "raw"};
    for (unsigned i = 0; i < ARRAY_SIZE(fmts); i++) {
        _cleanup_free_ char *path = xasprintf("%s/%s.%s", p->volumes, name, fmts[i]);
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            if (ret_path)
                *ret_path = TAKE_PTR(path);
            if (ret_format)
                *ret_format = xstrdup(fmts[i]);
            return 0;
        }
    }
    return -ENOENT;
}

char *pool_snapshot_path(const struct pool *p, const char *name)
{
    return xasprintf("%s/%s.qcow2", p->snapshots, name);
}

char *pool_layer_path(const struct pool *p, const char *layer)
{
    return xasprintf("%s/%s.qcow2", p->layers, layer);
}

char *pool_volume_path(const struct pool *p, const char *vol)
{
    return xasprintf("%s/%s.qcow2", p->volumes, vol);
}

void pool_fsync_dir(const char *dir)
{
    _cleanup_close_ int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0)
        fsync(fd);
}


/* Move tmp to final without replacing an existing file. */
int pool_publish(const char *tmp, const char *final, char **ret_msg)
{
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_NOREPLACE) < 0) {
        int e = -errno;
        unlink(tmp);
        *ret_msg = e == -EEXIST ? xasprintf("%s already exists", final)
                                : xasprintf("cannot rename %s: %s", tmp, strerror(-e));
        return e;
    }
    _cleanup_free_ char *dir = xstrdup(final);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    _cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0)
        fsync(dfd);
    return 0;
}

/* --------------------------------------------------------------- lock */

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

/* ------------------------------------------------------ layers, chains */

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
            cur = pool_layer_path(p, next);
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
        _cleanup_free_ char *lp = pool_layer_path(p, name);
        if (link(path, lp) == 0) {
            pool_fsync_dir(p->layers);
            memcpy(ret, name, sizeof(name));
            return 0;
        }
        if (errno != EEXIST)
            return errmsg(-errno, ret_msg, "cannot link %s into %s", path, p->layers);
    }
    *ret_msg = xstrdup("cannot find a free layer name");
    return -EEXIST;
}

void pool_drop_extra_names(const struct pool *p, const char *top)
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
    pool_fsync_dir(p->layers);
}

/* ---------------------------------------------------------- image names */

bool pool_image_name_valid(const char *name)
{
    if (!name || (strlen(name) != POOL_IMAGE_NAME_LEN && strlen(name) != POOL_IMAGE_NAME_LEN_512))
        return false;
    for (const char *c = name; *c; c++)
        if (!strchr("0123456789abcdef", *c))
            return false;
    return true;
}

int pool_image_layer(int dfd, const char *name, char ret_layer[LAYER_NAME_LEN + 1],
                     struct stat *ret_st)
{
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return -errno;
    if (!S_ISLNK(st.st_mode))
        return -EINVAL;
    char ref[64];
    ssize_t n = readlinkat(dfd, name, ref, sizeof(ref) - 1);
    if (n < 0)
        return -errno;
    ref[n] = '\0';
    if (layer_from_ref(ref, ret_layer) < 0)
        return -EINVAL;
    if (ret_st)
        *ret_st = st;
    return 0;
}

bool pool_layer_exists(const struct pool *p, const char *layer)
{
    _cleanup_free_ char *lp = pool_layer_path(p, layer);
    struct stat st;
    return lstat(lp, &st) == 0 && S_ISREG(st.st_mode);
}

/* 1 when name (in images/, dfd) is an image name used within keep_s
 * seconds, with its layer; 0 otherwise. */
static int image_name_recent(int dfd, const char *name, uint64_t keep_s,
                             char ret_layer[LAYER_NAME_LEN + 1])
{
    struct stat st;
    if (!pool_image_name_valid(name) || pool_image_layer(dfd, name, ret_layer, &st) < 0)
        return 0;
    return (uint64_t)time(NULL) < (uint64_t)st.st_mtime + keep_s;
}

/* ----------------------------------------------------------------- gc */

/* In images/: remove names whose layer is gone and the temporaries of
 * fetches (pool.h) that no fetch holds. */
static void gc_images(const struct pool *p)
{
    DIR *d = opendir(p->images);
    if (!d)
        return;
    int dfd = dirfd(d);
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        char layer[LAYER_NAME_LEN + 1];
        if (pool_image_name_valid(n)) {
            if (pool_image_layer(dfd, n, layer, NULL) == 0 && !pool_layer_exists(p, layer))
                unlinkat(dfd, n, 0); /* its layer was removed */
            continue;
        }
        /* .<image name><rest> */
        const char *rest = n[0] == '.' ? strchr(n + 1, '.') : NULL;
        if (!rest)
            continue;
        _cleanup_free_ char *sha = xstrndup(n + 1, (size_t)(rest - n - 1));
        if (!pool_image_name_valid(sha))
            continue;
        if (streq(rest, ".link")) {
            unlinkat(dfd, n, 0); /* made and renamed under the pool lock: stale */
        } else if (streq(rest, ".part")) {
            int fd = openat(dfd, n, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
            if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0) {
                _cleanup_free_ char *conv = xasprintf("%s.qcow2", n);
                unlinkat(dfd, conv, 0);
                unlinkat(dfd, n, 0);
            }
            if (fd >= 0)
                close(fd);
        } else if (streq(rest, ".part.qcow2")) {
            _cleanup_free_ char *part = xasprintf(".%s.part", sha);
            struct stat st;
            if (fstatat(dfd, part, &st, AT_SYMLINK_NOFOLLOW) < 0 && errno == ENOENT)
                unlinkat(dfd, n, 0); /* a fetch keeps its .part until after this */
        }
    }
    closedir(d);
}

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

/* Image names used by CreateVolume recently are references (pool.h). */
static void scan_images(struct scanned *sc, const struct pool *p)
{
    DIR *d = opendir(p->images);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        char layer[LAYER_NAME_LEN + 1];
        if (image_name_recent(dirfd(d), de->d_name, POOL_IMAGE_KEEP_S, layer) <= 0)
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
        pool_fsync_dir(p->layers);
    gc_images(p);
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
