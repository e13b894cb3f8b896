/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/qsdconf.c: see qsdconf.h. */
#include "qsd/qemu/qsdconf.h"
#include "qsd/base/cgroup.h"
#include "qsd/base/fsat.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"
#include "qsd/qemu/layers.h"
#include "qsd/qemu/qsdopts.h"
#include "qsd/qemu/rbdsrc.h"
#include "qsd/qemu/pool.h"

#include <dirent.h>
#include <fcntl.h>
#include <libgen.h>
#include <sys/random.h>
#include <time.h>
#include <sys/stat.h>

/* QSD file descriptors and threads: vhost-user clients bring a few fds per
 * queue and memory region; librbd runs dozens of threads. */
#define QSD_NOFILE 4096

/* --------------------------------------------------------------- uids */

static char *uids_dir(const char *run_dir) { return xasprintf("%s/uids", run_dir); }

static bool record_names(int dfd, const char *name, const char *volume)
{
    _cleanup_close_ int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    char buf[256];
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    return streq(buf, volume);
}

/* A record's uid from its name (decimal, within the range), else 0. */
static uint32_t record_uid(const char *name)
{
    uint64_t v;
    if (name[0] == '.' || parse_uint(name, 1, UINT32_MAX - 1, &v) < 0)
        return 0;
    return (uint32_t)v;
}

int qsd_uid_lookup(const char *run_dir, const char *volume, uid_t *ret)
{
    _cleanup_free_ char *dir = uids_dir(run_dir);
    DIR *d = opendir(dir);
    if (!d)
        return -errno;
    int r = -ENOENT;
    struct dirent *de;
    while ((de = readdir(d))) {
        uint32_t u = record_uid(de->d_name);
        if (u && record_names(dirfd(d), de->d_name, volume)) {
            *ret = u;
            r = 0;
            break;
        }
    }
    closedir(d);
    return r;
}

int qsd_uid_acquire(const char *run_dir, uint32_t base, uint32_t count, const char *volume,
                    uid_t *ret)
{
    uid_t u;
    if (qsd_uid_lookup(run_dir, volume, &u) == 0 && u >= base && u - base < count) {
        *ret = u;
        return 0;
    }
    _cleanup_free_ char *dir = uids_dir(run_dir);
    int r = mkdir_p(dir, 0700);
    if (r < 0)
        return r;
    _cleanup_close_ int dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return -errno;
    /* The record is whole before it has its name: written under a
     * temporary name, then link(2)ed (EEXIST: the slot is taken). */
    char tmp[64];
    uint64_t rnd = 0;
    (void)!getrandom(&rnd, sizeof(rnd), 0);
    snprintf(tmp, sizeof(tmp), ".tmp-%d-%016llx", (int)getpid(), (unsigned long long)rnd);
    _cleanup_close_ int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    if (write(fd, volume, strlen(volume)) != (ssize_t)strlen(volume)) {
        unlinkat(dfd, tmp, 0);
        return -EIO;
    }
    /* Start at a hash of the name: a volume tends to get the same slot
     * even after its record was lost (a reboot empties RUN). */
    uint32_t h = 2166136261u;
    for (const char *c = volume; *c; c++)
        h = (h ^ (uint8_t)*c) * 16777619u;
    r = -ENOSPC;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t uid = base + (h + i) % count;
        char name[16];
        snprintf(name, sizeof(name), "%u", uid);
        if (linkat(dfd, tmp, dfd, name, 0) == 0) {
            *ret = uid;
            r = 0;
            break;
        }
        if (errno != EEXIST) {
            r = -errno;
            break;
        }
    }
    unlinkat(dfd, tmp, 0);
    return r;
}

void qsd_uid_release(const char *run_dir, const char *volume)
{
    _cleanup_free_ char *dir = uids_dir(run_dir);
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d)))
        if (record_uid(de->d_name) && record_names(dirfd(d), de->d_name, volume))
            unlinkat(dirfd(d), de->d_name, 0);
    closedir(d);
}

int qsd_uid_sweep(const char *run_dir)
{
    _cleanup_free_ char *dir = uids_dir(run_dir);
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (startswith(de->d_name, ".tmp-")) {
            struct stat st;
            if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                st.st_mtime + 60 < time(NULL))
                unlinkat(dirfd(d), de->d_name, 0);
            continue;
        }
        if (!record_uid(de->d_name))
            continue;
        _cleanup_close_ int fd = openat(dirfd(d), de->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        char vol[256];
        ssize_t len = fd < 0 ? -1 : read(fd, vol, sizeof(vol) - 1);
        if (len <= 0)
            continue;
        vol[len] = '\0';
        _cleanup_free_ char *ctl = xasprintf("%s/ctl/%s", run_dir, vol);
        struct stat st;
        if (strchr(vol, '/') || (lstat(ctl, &st) < 0 && errno == ENOENT)) {
            unlinkat(dirfd(d), de->d_name, 0);
            n++;
        }
    }
    closedir(d);
    return n;
}

/* -------------------------------------------------------- file access */

int qsd_give_like(const char *path, const char *like)
{
    struct stat st;
    if (stat(like, &st) < 0)
        return -errno;
    if (chown(path, st.st_uid, st.st_gid) < 0 || chmod(path, 0600) < 0)
        return -errno;
    return 0;
}

int qsd_freeze_layer(const char *path)
{
    if (chown(path, 0, 0) < 0 || chmod(path, 0444) < 0)
        return -errno;
    return 0;
}

/* o+x on every directory from / to path (search only, never listing): a
 * QSD reaches its files by name. */
static void make_traversable(const char *path)
{
    _cleanup_free_ char *p = xstrdup(path);
    for (char *s = p + 1;; s++) {
        bool end = *s == '\0';
        if (*s == '/' || end) {
            char c = *s;
            *s = '\0';
            struct stat st;
            if (stat(p, &st) == 0 && S_ISDIR(st.st_mode) && !(st.st_mode & S_IXOTH)) {
                if (chmod(p, (st.st_mode & 07777) | S_IXOTH) == 0)
                    log_info("qsd", "made a directory searchable for QSDs (o+x, not listable)",
                             "path=%s", p);
            }
            *s = c;
        }
        if (end)
            break;
    }
}

/* fd-based chown + chmod of dir/name (no symlink followed). */
static int own_at(int dfd, const char *name, uid_t uid, gid_t gid, unsigned mode)
{
    _cleanup_close_ int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -errno;
    if (fchown(fd, uid, gid) < 0 || fchmod(fd, mode) < 0)
        return -errno;
    return 0;
}

/* The pool directory of a pool volume's top (POOL/volumes/<id>.qcow2), or
 * NULL for an image elsewhere. */
static char *pool_of(const char *image)
{
    _cleanup_free_ char *a = xstrdup(image);
    char *dir = dirname(a);
    const char *slash = strrchr(dir, '/');
    if (!slash || !streq(slash + 1, "volumes") || slash == dir)
        return NULL;
    return xstrndup(dir, (size_t)(slash - dir));
}

/* Layers of image's chain: readable by its QSD (older pools froze them
 * 0400). */
static void open_chain(const char *pool, const char *image)
{
    _cleanup_free_ char *cur = xstrdup(image);
    for (int depth = 0; depth < 256; depth++) {
        char backing[LAYER_NAME_LEN + 1];
        uint64_t size;
        _cleanup_free_ char *msg = NULL;
        if (image_header(cur, backing, &size, &msg) < 0 || !backing[0])
            return;
        free(cur);
        cur = xasprintf("%s/layers/%s.qcow2", pool, backing);
        struct stat st;
        if (stat(cur, &st) == 0 && (st.st_mode & 0444) != 0444)
            chmod(cur, 0444);
    }
}

static const char *keep(struct qsd_confinement *qc, char *s)
{
    if (qc->n_strs == ARRAY_SIZE(qc->strs)) {
        free(s);
        return NULL;
    }
    qc->strs[qc->n_strs++] = s;
    return s;
}

static void add(struct qsd_confinement *qc, const char **list, char *s)
{
    size_t n = 0;
    while (list[n])
        n++;
    const char *k = keep(qc, s);
    if (k && n < QSD_CONFINE_MAX_PATHS)
        list[n] = k;
}

void qsd_confinement_clear(struct qsd_confinement *qc)
{
    for (size_t i = 0; i < qc->n_strs; i++)
        free(qc->strs[i]);
    memset(qc, 0, sizeof(*qc));
    qc->c = (struct confine)CONFINE_INIT;
}

/* Hand the QSD its files: ctl dir (sticky, group-writable: it creates its
 * QMP socket there but cannot remove or replace the plugin's files), RBD
 * key and configuration (group-readable), export directories (its own:
 * it creates the socket there), top image. */
static int hand_over(const struct qsd_config *cfg, const char *volume, const struct qsd_opts *o,
                     const struct qsd_paths *p, uid_t uid, gid_t gid, char **ret_msg)
{
    _cleanup_close_ int ctl = open(p->ctl_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int r;
    if (ctl < 0 || fchown(ctl, 0, gid) < 0 || fchmod(ctl, 01770) < 0) {
        *ret_msg = xasprintf("cannot hand %s to the QSD's uid %u: %s", p->ctl_dir, (unsigned)uid,
                             strerror(errno));
        return -errno;
    }
    /* RUN/ctl: searchable, not listable. */
    _cleanup_free_ char *ctl_parent = xasprintf("%s/ctl", cfg->run_dir);
    chmod(ctl_parent, 0711);
    static const char *const rbd_files[] = {"rbd.key", "rbd.conf", NULL};
    for (const char *const *f = rbd_files; *f; f++)
        if ((r = own_at(ctl, *f, 0, gid, 0640)) < 0 && r != -ENOENT) {
            *ret_msg = xasprintf("cannot hand %s/%s to the QSD: %s", p->ctl_dir, *f, strerror(-r));
            return r;
        }
    if (o->rbd && o->rbd->key_file && !startswith(o->rbd->key_file, p->ctl_dir)) {
        /* A key file of the caller's (qsdctl): readable by the QSD's group. */
        struct stat st;
        if (stat(o->rbd->key_file, &st) == 0 && chown(o->rbd->key_file, st.st_uid, gid) == 0)
            chmod(o->rbd->key_file, (st.st_mode & 0700) | 0040);
    }
    for (int ro = 0; ro <= (o->read_only ? 0 : 1); ro++) {
        _cleanup_free_ char *parent = xasprintf("%s/%s", cfg->run_dir, ro ? "exports-ro" : "exports");
        _cleanup_close_ int pfd = open(parent, O_PATH | O_DIRECTORY | O_CLOEXEC);
        int sg = o->socket_gid;
        if (pfd < 0 || (r = own_at(pfd, volume, uid, sg >= 0 ? (gid_t)sg : 0, 0750)) < 0) {
            r = pfd < 0 ? -errno : r;
            *ret_msg = xasprintf("cannot hand %s/%s to the QSD: %s", parent, volume, strerror(-r));
            return r;
        }
    }
    if (o->image) {
        struct stat st;
        if (stat(o->image, &st) < 0) {
            *ret_msg = xasprintf("cannot stat %s: %s", o->image, strerror(errno));
            return -errno;
        }
        if (S_ISREG(st.st_mode) && (chown(o->image, uid, gid) < 0 || chmod(o->image, 0600) < 0)) {
            *ret_msg = xasprintf("cannot hand %s to the QSD: %s", o->image, strerror(errno));
            return -errno;
        }
        _cleanup_free_ char *pool = pool_of(o->image);
        if (pool) {
            static const char *const dirs[] = {"", "/volumes", "/layers", NULL};
            for (const char *const *d = dirs; *d; d++) {
                _cleanup_free_ char *dp = xasprintf("%s%s", pool, *d);
                struct stat ds;
                if (stat(dp, &ds) == 0 && (ds.st_mode & 0011) != 0011)
                    chmod(dp, (ds.st_mode & 07777) | 0011);
            }
            open_chain(pool, o->image);
            make_traversable(pool);
        } else {
            _cleanup_free_ char *a = xstrdup(o->image);
            make_traversable(dirname(a));
        }
    }
    make_traversable(cfg->run_dir);
    return 0;
}

int qsd_confine_for(const struct qsd_config *cfg, const char *volume, const struct qsd_opts *o,
                    const struct qsd_paths *p, struct qsd_confinement *ret, char **ret_msg)
{
    memset(ret, 0, sizeof(*ret));
    ret->c = (struct confine)CONFINE_INIT;
    if (!cfg->uid_count)
        return 0;
    uid_t uid;
    int r = qsd_uid_acquire(cfg->run_dir, cfg->uid_base, cfg->uid_count, volume, &uid);
    if (r < 0) {
        *ret_msg = xasprintf("cannot allocate a uid for the QSD of %s in %u..%u: %s", volume,
                             cfg->uid_base, cfg->uid_base + cfg->uid_count - 1, strerror(-r));
        return r;
    }
    gid_t gid = (gid_t)uid;
    if ((r = hand_over(cfg, volume, o, p, uid, gid, ret_msg)) < 0)
        return r;
    struct qsd_confinement *qc = ret;
    qc->c.uid = uid;
    qc->c.gid = gid;
    qc->c.mount_ns = true;
    qc->c.profile = CONFINE_PROFILE_QSD;
    qc->c.rlimit_nofile = QSD_NOFILE;
    qc->c.dev_fd_file = o->fuse_fd;
    qc->c.writable = qc->writable;
    qc->c.hidden = qc->hidden;
    /* Writable: its own places. */
    add(qc, qc->writable, xstrdup(p->ctl_dir));
    add(qc, qc->writable, xstrdup(p->export_dir));
    if (!o->read_only)
        add(qc, qc->writable, xstrdup(p->ro_dir));
    _cleanup_free_ char *pool = o->image ? pool_of(o->image) : NULL;
    if (pool) {
        add(qc, qc->writable, xstrdup(pool));
        add(qc, qc->hidden, xasprintf("%s/snapshots", pool));
        add(qc, qc->hidden, xasprintf("%s/images", pool));
    } else if (o->image) {
        _cleanup_free_ char *a = xstrdup(o->image);
        add(qc, qc->writable, xstrdup(dirname(a)));
    }
    if (o->rbd && o->rbd->key_file && !startswith(o->rbd->key_file, p->ctl_dir)) {
        _cleanup_free_ char *a = xstrdup(o->rbd->key_file);
        add(qc, qc->writable, xstrdup(dirname(a)));
    }
    /* Hidden: other volumes' runtime, the plugin's places, homes, temp. */
    add(qc, qc->hidden, xasprintf("%s/ctl", cfg->run_dir));
    add(qc, qc->hidden, xasprintf("%s/exports", cfg->run_dir));
    add(qc, qc->hidden, xasprintf("%s/exports-ro", cfg->run_dir));
    add(qc, qc->hidden, xasprintf("%s/uids", cfg->run_dir));
    add(qc, qc->hidden, xasprintf("%s/bridges", cfg->run_dir));
    static const char *const host[] = {"/root", "/home", "/tmp", "/var/tmp", "/dev/shm",
                                       "/var/lib/kubelet", "/etc/ceph", NULL};
    for (const char *const *h = host; *h; h++)
        add(qc, qc->hidden, xstrdup(*h));
    for (const char *const *h = cfg->hidden; h && *h; h++)
        add(qc, qc->hidden, xstrdup(*h));
    return 0;
}

/* -------------------------------------------------------------- cgroup */

static char *vol_group(const struct qsd_config *cfg, const char *volume)
{
    return xasprintf("%s/vol-%s", streq(cfg->cgroup, "/") ? "" : cfg->cgroup, volume);
}

int qsd_cgroup_for(const struct qsd_config *cfg, const char *volume, struct qsd_cgroup *ret,
                   char **ret_msg)
{
    if (!cfg->cgroup)
        return -ENOENT;
    _cleanup_free_ char *path = vol_group(cfg, volume);
    return qsd_cgroup_open(cfg->cgroup_root ? cfg->cgroup_root : "/sys/fs/cgroup", path,
                           cfg->vol_cpu_weight, cfg->vol_memory_max, cfg->vol_pids_max, ret,
                           ret_msg);
}

int qsd_cgroup_release(const struct qsd_config *cfg, const char *volume)
{
    if (!cfg->cgroup)
        return 0;
    _cleanup_free_ char *path = vol_group(cfg, volume);
    return qsd_cgroup_remove(cfg->cgroup_root ? cfg->cgroup_root : "/sys/fs/cgroup", path);
}

void qsd_cgroup_sweep(const struct qsd_config *cfg)
{
    if (!cfg->cgroup)
        return;
    const char *root = cfg->cgroup_root ? cfg->cgroup_root : "/sys/fs/cgroup";
    /* The groups are the same in every hierarchy: list one that has them. */
    static const char *const where[] = {"", "/unified", "/memory", "/pids", NULL};
    for (const char *const *w = where; *w; w++) {
        _cleanup_free_ char *dir = xasprintf("%s%s%s", root, *w, streq(cfg->cgroup, "/") ? "" : cfg->cgroup);
        DIR *d = opendir(dir);
        if (!d)
            continue;
        struct dirent *de;
        while ((de = readdir(d))) {
            if (!startswith(de->d_name, "vol-"))
                continue;
            const char *vol = de->d_name + 4;
            _cleanup_free_ char *ctl = xasprintf("%s/ctl/%s", cfg->run_dir, vol);
            if (access(ctl, F_OK) < 0 && errno == ENOENT)
                qsd_cgroup_release(cfg, vol); /* -EBUSY while a process is in it: kept */
        }
        closedir(d);
    }
}
