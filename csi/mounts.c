/* SPDX-License-Identifier: Apache-2.0 */
/* mounts.c: see mounts.h. */
#include "mounts.h"
#include "qsd/base/fsat.h"
#include "grpc.h"
#include "service.h"
#include "qsd/base/util.h"

#include <fcntl.h>
#include <sys/mount.h>

/* The mounts made here, by target, each with a descriptor of the mount
 * itself: found wherever a rename moved it (runtime only). */
struct tracked {
    char *target;
    int fd;
};

static ssize_t tracked_find(struct csi *c, const char *target)
{
    for (size_t i = 0; i < c->n_tracked; i++)
        if (streq(c->tracked[i].target, target))
            return (ssize_t)i;
    return -1;
}

static void tracked_drop(struct csi *c, size_t i)
{
    free(c->tracked[i].target);
    close(c->tracked[i].fd);
    c->tracked[i] = c->tracked[--c->n_tracked];
}

void mounts_open(struct csi *c)
{
    /* Opened again on first use when it does not exist yet (a node whose
     * kubelet has not started, or an Identity-only test). */
    c->kubelet_fd = open(c->cfg->kubelet_root, O_PATH | O_DIRECTORY | O_CLOEXEC);
}

static int kfd(struct csi *c)
{
    if (c->kubelet_fd < 0)
        c->kubelet_fd = open(c->cfg->kubelet_root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    return c->kubelet_fd;
}

void mounts_close(struct csi *c)
{
    closep(&c->kubelet_fd);
    c->kubelet_fd = -1;
    while (c->n_tracked)
        tracked_drop(c, c->n_tracked - 1);
    free(c->tracked);
    c->tracked = NULL;
}

static const char *rel_of(struct csi *c, const char *target)
{
    return fsat_rel(c->cfg->kubelet_root, target);
}


static int fail(int r, const char *what, const char *target, char **ret_msg)
{
    const char *why = r == -ELOOP ? "a component is a symbolic link"
                      : r == -EXDEV ? "it resolves outside the kubelet root"
                      : r == -EEXIST ? "it is already a mount (another publication?)"
                                     : strerror(-r);
    *ret_msg = xasprintf("cannot %s %s: %s", what, target, why);
    return r;
}

/* Is the mount at target (beneath the kubelet root) the one mnt_fd is? */
static bool is_at(struct csi *c, const char *rel, int mnt_fd)
{
    _cleanup_close_ int fd = -1;
    uint64_t a, b;
    return fsat_open(kfd(c), rel, O_PATH, &fd) == 0 && fsat_mnt_id(fd, &a) == 0 &&
           fsat_mnt_id(mnt_fd, &b) == 0 && a == b && fsat_is_mount_root(fd) == 1;
}

/* The target of a block volume's publication: an empty file (0600; its
 * directories 0750), created beneath the kubelet root; *ret_fd O_PATH. */
static int make_file(struct csi *c, const char *rel, int *ret_fd)
{
    _cleanup_free_ char *dir = xstrdup(rel);
    char *slash = strrchr(dir, '/');
    const char *base = slash ? slash + 1 : rel;
    _cleanup_close_ int pfd = -1;
    int r = slash ? (*slash = '\0', fsat_mkdirs(kfd(c), dir, 0750, &pfd)) : 0;
    if (r < 0)
        return r;
    int d = slash ? pfd : kfd(c);
    int fd = openat(d, base, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EISDIR)
        return -errno;
    closep(&fd);
    return fsat_open(d, base, O_PATH, ret_fd);
}

static int bind_at(struct csi *c, int src_fd, const char *target, unsigned flags, bool file,
                   char **ret_msg)
{
    const char *rel = rel_of(c, target);
    if (!rel)
        return fail(-EXDEV, "mount on", target, ret_msg);
    _cleanup_close_ int fd = -1, mnt = -1;
    int r = file ? make_file(c, rel, &fd) : fsat_mkdirs(kfd(c), rel, 0750, &fd);
    if (r < 0)
        return fail(r, "create", target, ret_msg);
    if ((r = fsat_is_mount_root(fd)) != 0)
        return fail(r > 0 ? -EEXIST : r, "mount on", target, ret_msg);
    if ((r = fsat_bind_fd(src_fd, fd, flags, &mnt)) < 0)
        return fail(r, "bind-mount on", target, ret_msg);
    /* The directory may have been renamed away between its resolution and
     * the mount: the mount must be reachable at target, or it goes. */
    if (!is_at(c, rel, mnt)) {
        fsat_detach(mnt);
        return fail(-EXDEV, "mount on", target, ret_msg);
    }
    ssize_t i = tracked_find(c, target);
    if (i >= 0)
        tracked_drop(c, (size_t)i);
    c->tracked = xrealloc(c->tracked, (c->n_tracked + 1) * sizeof(*c->tracked));
    c->tracked[c->n_tracked++] = (struct tracked){xstrdup(target), TAKE_FD(mnt)};
    return 0;
}

int mounts_bind(struct csi *c, int src_fd, const char *target, char **ret_msg)
{
    return bind_at(c, src_fd, target, FSAT_BIND_RO, false, ret_msg);
}

int mounts_bind_pod(struct csi *c, int src_fd, const char *target, bool device, bool ro,
                    char **ret_msg)
{
    unsigned flags = FSAT_BIND_POD | (device ? FSAT_BIND_DEV : 0) | (ro ? FSAT_BIND_RO : 0);
    return bind_at(c, src_fd, target, flags, device, ret_msg);
}

int mounts_unmount(struct csi *c, const char *target, char **ret_msg)
{
    const char *rel = rel_of(c, target);
    if (!rel)
        return fail(-EXDEV, "unmount", target, ret_msg);
    /* Through the parent's descriptor: a descriptor of the mount itself
     * would keep it busy. */
    _cleanup_free_ char *dir = xstrdup(rel);
    char *slash = strrchr(dir, '/');
    const char *base = slash ? slash + 1 : rel;
    _cleanup_close_ int pfd = -1;
    int r = slash ? (*slash = '\0', fsat_open(kfd(c), dir, O_PATH | O_DIRECTORY, &pfd)) : 0;
    if (r == -ENOENT)
        return 0;
    if (r < 0)
        return fail(r, "unmount", target, ret_msg);
    int d = slash ? pfd : kfd(c);
    for (int i = 0; i < 8; i++) {
        _cleanup_close_ int fd = -1;
        r = fsat_open(d, base, O_PATH | O_DIRECTORY, &fd);
        if (r == -ENOENT)
            return 0;
        if (r == 0 && (r = fsat_is_mount_root(fd)) == 0)
            return 0;
        if (r < 0)
            return fail(r, "unmount", target, ret_msg);
        closep(&fd);
        fd = -1;
        /* Never detached lazily: what is under it (a loop device) goes
         * next, and must not while the filesystem still writes to it.
         * Busy for a moment after a worker that had it open reported (it
         * exits after): 2 s at most, then the caller retries. */
        _cleanup_free_ char *p = xasprintf("/proc/self/fd/%d/%s", d, base);
        for (int k = 0; umount2(p, UMOUNT_NOFOLLOW) < 0; k++) {
            if (errno != EBUSY || k == 40)
                return fail(-errno, "unmount", target, ret_msg);
            usleep(50 * 1000);
        }
    }
    return fail(-EBUSY, "unmount", target, ret_msg);
}

int mounts_is_mounted(struct csi *c, const char *target, char **ret_msg)
{
    const char *rel = rel_of(c, target);
    if (!rel)
        return fail(-EXDEV, "open", target, ret_msg);
    _cleanup_close_ int fd = -1;
    int r = fsat_open(kfd(c), rel, O_PATH, &fd); /* a block publication is a file */
    if (r == -ENOENT)
        return 0;
    if (r == 0)
        r = fsat_is_mount_root(fd);
    return r < 0 ? fail(r, "open", target, ret_msg) : r;
}

int mounts_open_target(struct csi *c, const char *target, int *ret_fd)
{
    const char *rel = rel_of(c, target);
    return rel ? fsat_open(kfd(c), rel, O_PATH | O_DIRECTORY, ret_fd) : -EXDEV;
}

int mounts_unbind(struct csi *c, const char *target, char **ret_msg)
{
    const char *rel = rel_of(c, target);
    if (!rel)
        return fail(-EXDEV, "unmount", target, ret_msg);
    /* The mount made here is detached through its own descriptor,
     * wherever a rename moved it (a check of where it is would race the
     * next rename); then whatever else is at the path. */
    ssize_t i = tracked_find(c, target);
    if (i >= 0) {
        fsat_detach(c->tracked[i].fd);
        tracked_drop(c, (size_t)i);
    }
    int r = fsat_unmount_rmdir(kfd(c), rel);
    return r < 0 ? fail(r, "unmount and remove", target, ret_msg) : 0;
}

int mounts_check(struct csi *c, const char *path, char **ret_msg)
{
    const char *rel = rel_of(c, path);
    if (!rel)
        return fail(-EXDEV, "resolve", path, ret_msg);
    _cleanup_free_ char *p = xstrdup(rel);
    for (;;) {
        _cleanup_close_ int fd = -1;
        int r = fsat_open(kfd(c), p, O_PATH, &fd);
        if (r == 0)
            return 0;
        char *slash = strrchr(p, '/');
        if ((r != -ENOENT && r != -ENOTDIR) || !slash)
            return r == -ENOENT ? 0 : fail(r, "resolve", path, ret_msg);
        *slash = '\0';
    }
}

int mounts_mkdir(struct csi *c, const char *target, char **ret_msg)
{
    const char *rel = rel_of(c, target);
    if (!rel)
        return fail(-EXDEV, "create", target, ret_msg);
    int r = fsat_mkdirs(kfd(c), rel, 0750, NULL);
    return r < 0 ? fail(r, "create", target, ret_msg) : 0;
}

int mounts_grpc_code(int err)
{
    switch (err) {
    case -ELOOP:
    case -EXDEV:
        return GRPC_INVALID_ARGUMENT;
    case -EEXIST:
    case -ENOTDIR:
        return GRPC_FAILED_PRECONDITION;
    default:
        return GRPC_INTERNAL;
    }
}
