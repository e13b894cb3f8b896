/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/fsat.c: see fsat.h. */
#include "qsd/base/fsat.h"
#include "qsd/base/util.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#define RESOLVE_STRICT (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
#define MAX_STACKED_MOUNTS 8

const char *fsat_rel(const char *root, const char *path)
{
    size_t rn = strlen(root);
    if (rn == 1 && root[0] == '/')
        return path[0] == '/' && path[1] ? path + 1 : NULL;
    if (strncmp(path, root, rn) != 0 || path[rn] != '/' || !path[rn + 1])
        return NULL;
    return path + rn + 1;
}

int fsat_open(int dfd, const char *rel, int flags, int *ret_fd)
{
    struct open_how how = {
        .flags = (unsigned)(flags | O_CLOEXEC),
        .resolve = RESOLVE_STRICT,
    };
    if (flags & O_CREAT)
        how.mode = 0600;
    int fd;
    do
        fd = (int)syscall(SYS_openat2, dfd, rel, &how, sizeof(how));
    while (fd < 0 && errno == EAGAIN); /* a concurrent rename: retry */
    if (fd < 0)
        return -errno;
    *ret_fd = fd;
    return 0;
}

/* Split rel into its parent (opened beneath dfd, or dfd itself) and base. */
static int open_parent(int dfd, const char *rel, int *ret_pfd, bool *ret_own, const char **ret_base)
{
    const char *slash = strrchr(rel, '/');
    if (!slash) {
        *ret_pfd = dfd;
        *ret_own = false;
        *ret_base = rel;
        return 0;
    }
    _cleanup_free_ char *parent = xstrndup(rel, (size_t)(slash - rel));
    int r = fsat_open(dfd, parent, O_PATH | O_DIRECTORY, ret_pfd);
    if (r < 0)
        return r;
    *ret_own = true;
    *ret_base = slash + 1;
    return 0;
}

/* rmdir of rel beneath dfd (its parent opened without following symlinks);
 * missing is not an error. */
static int rmdir_beneath(int dfd, const char *rel)
{
    int pfd;
    bool own;
    const char *base;
    int r = open_parent(dfd, rel, &pfd, &own, &base);
    if (r < 0)
        return r == -ENOENT ? 0 : r;
    /* A block volume's publication is a file (a device node bound on it). */
    if (unlinkat(pfd, base, AT_REMOVEDIR) < 0 && errno != ENOENT &&
        (errno != ENOTDIR || unlinkat(pfd, base, 0) < 0))
        r = -errno;
    if (own)
        close(pfd);
    return r;
}

int fsat_mkdirs(int dfd, const char *rel, unsigned mode, int *ret_fd)
{
    _cleanup_free_ char *p = xstrdup(rel);
    _cleanup_close_ int cur = -1;
    char *save = NULL;
    for (char *comp = strtok_r(p, "/", &save); comp; comp = strtok_r(NULL, "/", &save)) {
        int base = cur >= 0 ? cur : dfd, next;
        int r = fsat_open(base, comp, O_PATH | O_DIRECTORY, &next);
        if (r == -ENOENT) {
            if (mkdirat(base, comp, mode) < 0 && errno != EEXIST)
                return -errno;
            r = fsat_open(base, comp, O_PATH | O_DIRECTORY, &next);
        }
        if (r < 0)
            return r;
        closep(&cur);
        cur = next;
    }
    if (cur < 0)
        return -EINVAL; /* empty rel */
    if (ret_fd)
        *ret_fd = TAKE_FD(cur);
    return 0;
}

static int write_atomic(int dfd, const char *name, const void *data, size_t len, unsigned mode,
                        int gid, bool sync)
{
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != (ssize_t)sizeof(rnd))
        rnd = now_us() ^ ((uint64_t)getpid() << 32);
    char tmp[64];
    snprintf(tmp, sizeof(tmp), ".tmp-%016llx", (unsigned long long)rnd);
    int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                    0600);
    if (fd < 0)
        return -errno;
    int r = 0;
    if (gid >= 0 && fchown(fd, 0, (gid_t)gid) < 0)
        r = -errno;
    if (r == 0 && fchmod(fd, mode) < 0)
        r = -errno;
    if (r == 0)
        r = write_all(fd, data, len);
    if (r == 0 && sync && fsync(fd) < 0)
        r = -errno;
    if (close(fd) < 0 && r == 0)
        r = -errno;
    if (r == 0 && renameat(dfd, tmp, dfd, name) < 0) {
        r = -errno;
        /* An empty directory at the name (nothing of ours): removed, once. */
        if ((r == -EISDIR || r == -ENOTEMPTY || r == -EEXIST) &&
            unlinkat(dfd, name, AT_REMOVEDIR) == 0)
            r = renameat(dfd, tmp, dfd, name) < 0 ? -errno : 0;
    }
    if (r < 0) {
        unlinkat(dfd, tmp, 0);
        return r;
    }
    if (!sync)
        return 0;
    _cleanup_close_ int sfd = -1;
    if ((r = fsat_open(dfd, ".", O_RDONLY | O_DIRECTORY, &sfd)) < 0)
        return r;
    return fsync(sfd) < 0 ? -errno : 0;
}

int fsat_write_atomic(int dfd, const char *name, const void *data, size_t len, unsigned mode,
                      int gid)
{
    return write_atomic(dfd, name, data, len, mode, gid, true);
}

int fsat_write_replace(int dfd, const char *name, const void *data, size_t len, unsigned mode,
                       int gid)
{
    return write_atomic(dfd, name, data, len, mode, gid, false);
}

int fsat_remove_tmp(int dfd)
{
    int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *hex = de->d_name + 5;
        struct stat st;
        if (strncmp(de->d_name, ".tmp-", 5) != 0 || strlen(hex) != 16 ||
            strspn(hex, "0123456789abcdef") != 16 ||
            fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
            continue;
        if (unlinkat(dirfd(d), de->d_name, 0) == 0)
            n++;
    }
    closedir(d);
    return n;
}

int fsat_chown_mode(int dfd, const char *name, int gid, unsigned mode)
{
    _cleanup_close_ int fd = openat(dfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) < 0)
        return -errno;
    if (S_ISLNK(st.st_mode))
        return -ELOOP;
    if (fchownat(fd, "", 0, gid >= 0 ? (gid_t)gid : 0, AT_EMPTY_PATH) < 0)
        return -errno;
    /* chmod through the descriptor's magic link: the very inode opened
     * above, whatever the name points to now. */
    char p[40];
    snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
    return chmod(p, mode) < 0 ? -errno : 0;
}

int fsat_bind(int src_fd, int target_fd, unsigned flags)
{
    _cleanup_close_ int fd = -1;
    return fsat_bind_fd(src_fd, target_fd, flags, &fd);
}

int fsat_mnt_id(int fd, uint64_t *ret)
{
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, &sx) < 0)
        return -errno;
    if (!(sx.stx_mask & STATX_MNT_ID))
        return -EOPNOTSUPP;
    *ret = sx.stx_mnt_id;
    return 0;
}

int fsat_detach(int fd)
{
    char p[40];
    snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
    return umount2(p, MNT_DETACH) < 0 ? -errno : 0;
}

int fsat_bind_fd(int src_fd, int target_fd, unsigned flags, int *ret_mnt_fd)
{
    _cleanup_close_ int tree =
        open_tree(src_fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH |
                                  ((flags & FSAT_BIND_REC) ? AT_RECURSIVE : 0));
    if (tree < 0)
        return -errno;
    struct mount_attr attr = {0};
    if (flags & FSAT_BIND_POD) {
        attr.attr_set = MOUNT_ATTR_NOSUID | ((flags & FSAT_BIND_RO) ? MOUNT_ATTR_RDONLY : 0) |
                        ((flags & FSAT_BIND_DEV) ? MOUNT_ATTR_NOEXEC : MOUNT_ATTR_NODEV);
        if (!(flags & FSAT_BIND_RO))
            attr.attr_clr = MOUNT_ATTR_RDONLY;
    } else if (flags & FSAT_BIND_RO)
        attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV |
                        MOUNT_ATTR_NOEXEC;
    else
        attr.attr_clr = MOUNT_ATTR_RDONLY;
    if (mount_setattr(tree, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0)
        return -errno;
    if (move_mount(tree, "", target_fd, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0)
        return -errno;
    *ret_mnt_fd = TAKE_FD(tree);
    return 0;
}

int fsat_make_shared(int fd)
{
    struct mount_attr attr = {.propagation = MS_SHARED};
    return mount_setattr(fd, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0 ? -errno : 0;
}

int fsat_is_mount_root(int fd)
{
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT, STATX_BASIC_STATS,
              &sx) < 0)
        return -errno;
    if (!(sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT))
        return -EOPNOTSUPP;
    return (sx.stx_attributes & STATX_ATTR_MOUNT_ROOT) ? 1 : 0;
}

int fsat_unmount(int dfd, const char *rel)
{
    for (int i = 0;; i++) {
        _cleanup_close_ int fd = -1;
        int r = fsat_open(dfd, rel, O_PATH, &fd);
        if (r == -ENOENT)
            return 0;
        if (r < 0)
            return r;
        if ((r = fsat_is_mount_root(fd)) < 0)
            return r;
        if (r == 0)
            break;
        if (i == MAX_STACKED_MOUNTS)
            return -EBUSY;
        /* Unmount exactly the mount this descriptor is on: its magic link
         * resolves to that mount's root, whatever the path holds now. */
        char p[40];
        snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
        if (umount2(p, 0) < 0 && (errno != EBUSY || umount2(p, MNT_DETACH) < 0))
            return -errno;
    }
    return 0;
}

int fsat_unmount_rmdir(int dfd, const char *rel)
{
    int r = fsat_unmount(dfd, rel);
    return r < 0 ? r : rmdir_beneath(dfd, rel);
}

int fsat_unlink(int dfd, const char *name)
{
    if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT)
        return 0;
    if (errno != EISDIR && errno != EPERM)
        return -errno;
    return unlinkat(dfd, name, AT_REMOVEDIR) == 0 || errno == ENOENT ? 0 : -errno;
}

int fsat_remove_dir(int dfd, const char *rel, const char *const *names)
{
    _cleanup_close_ int fd = -1;
    int r = fsat_open(dfd, rel, O_PATH | O_DIRECTORY, &fd);
    if (r == -ENOENT)
        return 0;
    if (r < 0)
        return r;
    for (size_t i = 0; names && names[i]; i++)
        (void)fsat_unlink(fd, names[i]); /* a non-empty directory stays: ENOTEMPTY below */
    return rmdir_beneath(dfd, rel);
}
