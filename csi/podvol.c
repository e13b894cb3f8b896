/* SPDX-License-Identifier: Apache-2.0 */
/* podvol.c: a volume served to ordinary pods (podvol.h). */
#include "podvol.h"
#include "mounts.h"
#include "service.h"
#include "qsd/base/fsat.h"
#include "qsd/base/log.h"
#include "qsd/base/proc.h"
#include "qsd/base/util.h"

#include <dirent.h>
#include <inttypes.h>
#include <linux/fs.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

/* Every program run here is bounded; mkfs of a large xfs is the slowest. */
#define TOOL_TIMEOUT_MS (5 * 60 * 1000)

char *podvol_fuse_path(const struct csi *c, const char *id)
{
    return xasprintf("%s/fuse/%s", c->cfg->run_dir, id);
}

/* The device of the topmost mount at path in this mount namespace, from
 * mountinfo (never a stat of path, which would ask the FUSE daemon):
 * -ENOENT when nothing is mounted there. */
static int mount_dev_at(const char *path, dev_t *ret)
{
    _cleanup_fclose_ FILE *f = fopen("/proc/self/mountinfo", "re");
    char line[4096];
    int r = -ENOENT;
    while (f && fgets(line, sizeof(line), f)) {
        char mp[4096];
        unsigned maj, min;
        /* id parent major:minor root mountpoint ...; paths here have no
         * spaces (RUN and volume ids are checked).  The last match is the
         * top of a stack of mounts. */
        if (sscanf(line, "%*s %*s %u:%u %*s %4095s", &maj, &min, mp) == 3 && streq(mp, path)) {
            *ret = makedev(maj, min);
            r = 0;
        }
    }
    return r;
}

static bool mounted_at(const char *path)
{
    dev_t d;
    return mount_dev_at(path, &d) == 0;
}

/* Whether loop device dev's backing file lives on the filesystem of
 * device fs (LOOP_GET_STATUS64: the backing file's st_dev, which no
 * rebinding by a holder of the device can forge): 1 yes, 0 no, negative
 * errno when the kernel cannot tell (it asks the backing file: a dead
 * FUSE export answers ENOTCONN). */
static int loop_backed_by(const char *dev, dev_t fs)
{
    _cleanup_close_ int fd = open(dev, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct loop_info64 li = {0};
    if (fd < 0 || ioctl(fd, LOOP_GET_STATUS64, &li) < 0)
        return -errno;
    return (dev_t)li.lo_device == fs;
}

/* Whether loop device NAME (loopN) names path as its backing file in
 * /sys (a path a pod can imitate: never enough alone). */
static bool loop_names(const char *name, const char *path)
{
    _cleanup_free_ char *bf = xasprintf("/sys/block/%s/loop/backing_file", name);
    _cleanup_fclose_ FILE *f = fopen(bf, "re");
    char line[4096];
    if (!f || !fgets(line, sizeof(line), f))
        return false;
    line[strcspn(line, "\n")] = '\0';
    return streq(line, path);
}

/* A loop device of the FUSE mount at path (its device fs): one that names
 * path and is backed by it (what may be used), or, when dead_too, one that
 * names path and whose backing file no longer answers (the mount's QSD is
 * dead: what may only be let go of; a pod's rebound device answers, from
 * its own file).  The name first: the status call asks the backing file,
 * and only path's own (or an imitation of it) is asked, never another
 * volume's, whose QSD may hang. */
static bool loop_of_mount(const char *name, const char *path, dev_t fs, bool dead_too)
{
    if (!loop_names(name, path))
        return false;
    _cleanup_free_ char *dev = xasprintf("/dev/%s", name);
    int r = loop_backed_by(dev, fs);
    if (r == 1)
        return true;
    if (r < 0 && dead_too)
        return true;
    if (r == 0)
        log_warn("node", "a loop device names a volume's FUSE file but is not backed by it "
                 "(rebound by a pod?): ignored", "device=%s path=%s", dev, path);
    return false;
}

/* Every loop device backed by the FUSE mount at path let go of
 * (LOOP_CLR_FD; a device still open, e.g. under a dead pod's filesystem,
 * goes at its last close: the kernel's autoclear), before that mount is
 * detached.  Once detached, a device on it would show "/" as its backing
 * file and be found by nothing: every QSD death under a mounted filesystem
 * left one loop device bound for good. */
static void release_loops(const char *path)
{
    dev_t fs;
    if (mount_dev_at(path, &fs) < 0)
        return;
    DIR *d = opendir("/sys/block");
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strncmp(e->d_name, "loop", 4) != 0)
            continue;
        if (!loop_of_mount(e->d_name, path, fs, true))
            continue;
        _cleanup_free_ char *dev = xasprintf("/dev/%s", e->d_name);
        _cleanup_close_ int fd = open(dev, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        if (fd < 0 || (ioctl(fd, LOOP_CLR_FD, 0) < 0 && errno != ENXIO))
            log_warn("node", "cannot let go of a loop device on a FUSE export", "device=%s "
                     "path=%s error=\"%s\"", dev, path, strerror(errno));
        else
            log_info("node", "loop device on a detached FUSE export let go", "device=%s path=%s",
                     dev, path);
    }
    if (d)
        closedir(d);
}

/* path's FUSE mounts detached, the loop devices on them let go first. */
static int fuse_detach(const char *path)
{
    while (mounted_at(path)) {
        release_loops(path);
        if (umount2(path, MNT_DETACH) < 0)
            return -errno;
    }
    return 0;
}

int podvol_fuse_mount(struct csi *c, const char *id, int *ret_fd, char **ret_msg)
{
    _cleanup_free_ char *dir = xasprintf("%s/fuse", c->cfg->run_dir);
    _cleanup_free_ char *path = podvol_fuse_path(c, id);
    if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
        *ret_msg = xasprintf("cannot create %s: %s", dir, strerror(errno));
        return -errno;
    }
    fuse_detach(path); /* a dead QSD's: its connection is gone */
    _cleanup_close_ int f = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (f < 0) {
        *ret_msg = xasprintf("cannot create %s: %s", path, strerror(errno));
        return -errno;
    }
    _cleanup_close_ int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        *ret_msg = xasprintf("cannot open /dev/fuse: %s", strerror(errno));
        return -errno;
    }
    /* Owner root, no allow_other: only root (the plugin, the loop driver)
     * may open it.  The kernel sends FUSE_INIT without waiting. */
    char opts[128];
    snprintf(opts, sizeof(opts), "fd=%d,rootmode=100000,user_id=0,group_id=0", fd);
    if (mount("qsd-csi", path, "fuse.qsd-csi", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts) < 0) {
        *ret_msg = xasprintf("cannot mount FUSE on %s: %s", path, strerror(errno));
        return -errno;
    }
    *ret_fd = TAKE_FD(fd);
    return 0;
}

void podvol_fuse_unmount(struct csi *c, const char *id)
{
    _cleanup_free_ char *path = podvol_fuse_path(c, id);
    fuse_detach(path);
    unlink(path);
}

/* Whether process pid has /dev/fuse open. */
static bool holds_fuse(pid_t pid)
{
    char dir[64];
    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(dir);
    bool found = false;
    for (struct dirent *e; d && !found && (e = readdir(d));) {
        char link[384], target[64];
        snprintf(link, sizeof(link), "%s/%s", dir, e->d_name);
        ssize_t n = readlink(link, target, sizeof(target) - 1);
        if (n > 0) {
            target[n] = '\0';
            found = streq(target, "/dev/fuse");
        }
    }
    if (d)
        closedir(d);
    return found;
}

bool podvol_served(struct csi *c, const struct vol *v)
{
    _cleanup_free_ char *path = podvol_fuse_path(c, v->id);
    pid_t pid = v->qsd ? qsd_get_qsd_pid(v->qsd) : 0;
    return pid > 0 && mounted_at(path) && holds_fuse(pid);
}

/* The first loop device of the FUSE mount at path (loop_of_mount). */
static int loop_find(const char *path, bool dead_too, char **ret_dev)
{
    /* The backing file's path in sysfs is not enough: a pod holding its
     * Block volume's loop device may detach it and bind it to a file of its
     * own (LOOP_CLR_FD, LOOP_SET_FD: no capability needed), and a file at
     * the same path in its container's root reads, from here, exactly like
     * another volume's FUSE file.  So the device must also be backed by the
     * FUSE mount at path, which a pod cannot open. */
    dev_t fs;
    if (mount_dev_at(path, &fs) < 0)
        return -ENOENT;
    DIR *d = opendir("/sys/block");
    int r = -ENOENT;
    for (struct dirent *e; d && r == -ENOENT && (e = readdir(d));)
        if (!strncmp(e->d_name, "loop", 4) && loop_of_mount(e->d_name, path, fs, dead_too)) {
            *ret_dev = xasprintf("/dev/%s", e->d_name);
            r = 0;
        }
    if (d)
        closedir(d);
    return r;
}

int podvol_loop_of(const char *path, char **ret_dev)
{
    return loop_find(path, false, ret_dev);
}

/* Run argv (bounded): 0, or -EIO with its last stderr line in *ret_msg;
 * *ret_code: its exit code. */
static int run(char *const argv[], int *ret_code, char **ret_out, char **ret_msg)
{
    struct proc_result res = {0};
    int r = proc_run(argv, TOOL_TIMEOUT_MS, &res);
    if (r < 0) {
        *ret_msg = xasprintf("%s: %s", argv[0], r == -ETIMEDOUT ? "timed out" : strerror(-r));
        proc_result_clear(&res);
        return r;
    }
    *ret_code = res.exit_code;
    if (ret_out)
        *ret_out = TAKE_PTR(res.out);
    if (res.exit_code != 0) {
        char buf[512];
        *ret_msg = xasprintf("%s exited with %d: %s", argv[0], res.exit_code,
                             proc_last_line(res.err, buf, sizeof(buf)));
    }
    proc_result_clear(&res);
    return 0;
}

/* Whether dev's size is the FUSE file's (size, which the QSD reports; 0
 * when it does not answer): a device made while the export was not
 * serving yet is told again (LOOP_SET_CAPACITY). */
static bool loop_size_ok(const char *dev, uint64_t size)
{
    _cleanup_close_ int fd = open(dev, O_RDONLY | O_CLOEXEC);
    uint64_t now = 0;
    if (fd < 0 || size == 0)
        return false;
    if (ioctl(fd, BLKGETSIZE64, &now) == 0 && now == size)
        return true;
    return ioctl(fd, LOOP_SET_CAPACITY, 0) == 0 && ioctl(fd, BLKGETSIZE64, &now) == 0 &&
           now == size;
}

static int loop_make(const char *path, char **ret_dev, char **ret_msg)
{
    /* Without direct I/O: with it (loop over this FUSE file, QSD 10.0.2),
     * mkfs.ext4's filesystem read back corrupt (journal inode checksum),
     * raw and qcow2 alike; buffered, e2fsck -fn finds it clean
     * (docs/pod-volumes.md). */
    char *argv[] = {"losetup", "--find", "--show", "--direct-io=off", (char *)path, NULL};
    _cleanup_free_ char *out = NULL;
    int code, r = run(argv, &code, &out, ret_msg);
    if (r < 0 || code != 0)
        return r < 0 ? r : -EIO;
    out[strcspn(out, "\n")] = '\0';
    if (strncmp(out, "/dev/loop", 9) != 0) {
        *ret_msg = xasprintf("losetup printed no loop device for %s", path);
        return -EIO;
    }
    *ret_dev = TAKE_PTR(out);
    return 0;
}

/* The loop device on path, made when missing, of the FUSE file's size: one
 * of another size (left by a plugin killed while it was made) is detached
 * and made again.  -EAGAIN when the size still differs (retry). */
static int loop_attach(const char *path, char **ret_dev, char **ret_msg)
{
    struct stat st;
    if (stat(path, &st) < 0) {
        *ret_msg = xasprintf("the FUSE export %s does not answer: %s", path, strerror(errno));
        return -EAGAIN;
    }
    _cleanup_free_ char *dev = NULL;
    for (int i = 0; i < 2; i++) {
        int r = podvol_loop_of(path, &dev);
        if (r < 0 && (r = loop_make(path, &dev, ret_msg)) < 0)
            return r;
        if (loop_size_ok(dev, (uint64_t)st.st_size)) {
            *ret_dev = TAKE_PTR(dev);
            return 0;
        }
        _cleanup_close_ int fd = open(dev, O_RDONLY | O_CLOEXEC);
        if (fd >= 0)
            ioctl(fd, LOOP_CLR_FD, 0);
        free(dev);
        dev = NULL;
    }
    *ret_msg = xasprintf("no loop device of %s's size (%lld bytes) could be made: retry", path,
                         (long long)st.st_size);
    return -EAGAIN;
}

/* What blkid finds on dev: NULL (nothing: an empty device) or its TYPE (or
 * PTTYPE) in *ret_type. */
static int probe(const char *dev, char **ret_type, char **ret_msg)
{
    char *argv[] = {"blkid", "-p", "-o", "export", (char *)dev, NULL};
    _cleanup_free_ char *out = NULL, *m = NULL;
    int code, r = run(argv, &code, &out, &m);
    if (r < 0) {
        *ret_msg = TAKE_PTR(m);
        return r;
    }
    *ret_type = NULL;
    if (code == 2) /* no signature at all */
        return 0;
    if (code != 0) {
        *ret_msg = TAKE_PTR(m);
        return -EIO;
    }
    for (char *save = NULL, *l = strtok_r(out, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
        if (!strncmp(l, "TYPE=", 5) || (!*ret_type && !strncmp(l, "PTTYPE=", 7))) {
            free(*ret_type);
            *ret_type = xstrdup(l);
        }
    if (!*ret_type)
        *ret_type = xstrdup("an unknown signature");
    return 0;
}

/* mkfs on an empty device, or the check of an existing filesystem. */
static int make_or_check(const struct vol *v, const char *dev, char **ret_msg)
{
    _cleanup_free_ char *type = NULL, *want = xasprintf("TYPE=%s", v->stage_fs);
    int code, r = probe(dev, &type, ret_msg);
    if (r < 0)
        return r;
    if (!type && v->fs_made) {
        *ret_msg = xasprintf("volume %s had a filesystem made by this driver and none is found "
                             "now: it is not formatted again", v->id);
        return -EUCLEAN;
    }
    if (!type && v->raw_exposed) {
        /* No signature, but a tenant's bytes: never formatted over. */
        *ret_msg = xasprintf("volume %s holds no filesystem and was a block device of a tenant "
                             "(a VM's disk or a Block-mode pod's): it is not formatted over",
                             v->id);
        return -EUCLEAN;
    }
    if (!type) {
        char *ext4[] = {"mkfs.ext4", "-q", "-F", "-E", "nodiscard", (char *)dev, NULL};
        char *xfs[] = {"mkfs.xfs", "-q", "-K", (char *)dev, NULL};
        r = run(streq(v->stage_fs, "xfs") ? xfs : ext4, &code, NULL, ret_msg);
        return r < 0 ? r : code ? -EIO : 0;
    }
    if (!streq(type, want)) {
        *ret_msg = xasprintf("volume %s holds %s, not an %s filesystem or nothing: it is not "
                             "formatted over, nor mounted", v->id, type, v->stage_fs);
        return -EUCLEAN;
    }
    if (!v->raw_exposed)
        return 0;
    /* Its bytes were a tenant's block device: the kernel mounts it only
     * when a read-only check finds nothing wrong (docs/security.md). */
    char *e2[] = {"e2fsck", "-f", "-n", (char *)dev, NULL};
    char *x[] = {"xfs_repair", "-n", (char *)dev, NULL};
    _cleanup_free_ char *m = NULL;
    r = run(streq(v->stage_fs, "xfs") ? x : e2, &code, NULL, &m);
    if (r < 0) {
        *ret_msg = TAKE_PTR(m);
        return r;
    }
    if (code != 0) {
        *ret_msg = xasprintf("volume %s was a block device of a tenant and its %s filesystem "
                             "does not pass a read-only check (%s): not mounted", v->id,
                             v->stage_fs, m ? m : "errors");
        return -EUCLEAN;
    }
    return 0;
}

/* Growth the filesystem did not follow (ext4 online growth needs
 * CAP_SYS_RESOURCE, which the plugin may lack: docs/pod-volumes.md) is
 * done offline before the mount: when the device is at least this much
 * larger than the filesystem.  Below it, resize2fs may leave the tail
 * unused (a last block group too small for its metadata) and every stage
 * would check again. */
#define EXT4_GROW_MIN (4ull << 20)

/* An ext4 on dev (not mounted) grown to dev's size, when the device grew
 * under it by EXT4_GROW_MIN or more: e2fsck -f -p (resize2fs wants a
 * checked filesystem; it also replays a journal, as a mount would), then
 * resize2fs.  A check that finds what it may not fix alone is -EUCLEAN. */
static int ext4_grow_offline(const struct vol *v, const char *dev, char **ret_msg)
{
    _cleanup_close_ int fd = open(dev, O_RDONLY | O_CLOEXEC);
    uint64_t devsize = 0, count = 0, bsize = 0;
    if (fd < 0 || ioctl(fd, BLKGETSIZE64, &devsize) < 0) {
        *ret_msg = xasprintf("cannot read the size of %s: %s", dev, strerror(errno));
        return -errno;
    }
    char *dump[] = {"dumpe2fs", "-h", (char *)dev, NULL};
    _cleanup_free_ char *out = NULL;
    int code, r = run(dump, &code, &out, ret_msg);
    if (r < 0 || code != 0)
        return r < 0 ? r : -EIO;
    for (char *save = NULL, *l = strtok_r(out, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        sscanf(l, "Block count: %" SCNu64, &count);
        sscanf(l, "Block size: %" SCNu64, &bsize);
    }
    if (!count || !bsize || count * bsize + EXT4_GROW_MIN > devsize)
        return 0;
    log_info("node", "growing a filesystem offline", "volume=%s from=%" PRIu64 " to=%" PRIu64,
             v->id, count * bsize, devsize);
    char *fsck[] = {"e2fsck", "-f", "-p", (char *)dev, NULL};
    _cleanup_free_ char *m = NULL;
    if ((r = run(fsck, &code, NULL, &m)) < 0) {
        *ret_msg = TAKE_PTR(m);
        return r;
    }
    if (code > 1) { /* 1: errors fixed; more: it needs a person */
        *ret_msg = xasprintf("volume %s: e2fsck before growing its filesystem: %s", v->id,
                             m ? m : "errors left");
        return -EUCLEAN;
    }
    char *grow[] = {"resize2fs", (char *)dev, NULL};
    r = run(grow, &code, NULL, ret_msg);
    return r < 0 ? r : code ? -EIO : 0;
}

/* fsGroup, as kubelet applies it when it does (SetVolumeOwnership):
 * every file's group the pod's, group read and write added, directories
 * also group search and setgid.  Delegated to the driver (CSIDriver
 * fsGroupPolicy File, VOLUME_MOUNT_GROUP) and done when the filesystem's
 * root is not the group's yet (kubelet's OnRootMismatch): a new group walks
 * the tree once, later stages only check the root.  The tree is a
 * tenant's: never through a symlink (lchown only), a file changed through
 * a descriptor opened with O_NOFOLLOW and checked to be what was listed,
 * never across a mount, bounded in depth and count. */
#define OWN_MAX_DEPTH 128
#define OWN_MAX_ENTRIES 1000000

struct own_walk {
    gid_t gid;
    dev_t dev;
    unsigned long n;
};

/* fd (a directory or regular file, st its stat) given the group. */
static void own_fd(int fd, const struct stat *st, gid_t gid)
{
    mode_t add = S_ISDIR(st->st_mode) ? (02000 | 0070) : 0060;
    if (fchown(fd, (uid_t)-1, gid) < 0 || fchmod(fd, (st->st_mode & 07777) | add) < 0)
        log_debug("node", "fsGroup: cannot change a file", "error=\"%s\"", strerror(errno));
}

static void own_dir(int dfd, struct own_walk *w, int depth)
{
    int dup_fd = fcntl(dfd, F_DUPFD_CLOEXEC, 3);
    DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (!d) {
        if (dup_fd >= 0)
            close(dup_fd);
        return;
    }
    for (struct dirent *e; w->n < OWN_MAX_ENTRIES && (e = readdir(d));) {
        if (streq(e->d_name, ".") || streq(e->d_name, ".."))
            continue;
        w->n++;
        struct stat st, now;
        if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || st.st_dev != w->dev)
            continue;
        if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
            fchownat(dfd, e->d_name, (uid_t)-1, w->gid, AT_SYMLINK_NOFOLLOW);
            continue;
        }
        _cleanup_close_ int fd = openat(dfd, e->d_name,
                                        O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC |
                                            (S_ISDIR(st.st_mode) ? O_DIRECTORY : 0));
        if (fd < 0 || fstat(fd, &now) < 0 || now.st_ino != st.st_ino || now.st_dev != st.st_dev)
            continue; /* replaced meanwhile */
        own_fd(fd, &now, w->gid);
        if (S_ISDIR(now.st_mode) && depth < OWN_MAX_DEPTH)
            own_dir(fd, w, depth + 1);
    }
    closedir(d);
}

/* The root of the filesystem mounted at mfd given gid, and everything in
 * it when the root was another group's. */
static void own_tree(const struct vol *v, int mfd, gid_t gid)
{
    _cleanup_close_ int root = openat(mfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct stat st;
    if (root < 0 || fstat(root, &st) < 0) {
        log_warn("node", "fsGroup: cannot open a filesystem's root", "volume=%s error=\"%s\"",
                 v->id, strerror(errno));
        return;
    }
    bool walk = st.st_gid != gid;
    own_fd(root, &st, gid);
    if (!walk)
        return;
    struct own_walk w = {.gid = gid, .dev = st.st_dev};
    own_dir(root, &w, 1);
    log_info("node", "fsGroup applied to a filesystem", "volume=%s gid=%u entries=%lu bound=%s",
             v->id, (unsigned)gid, w.n, w.n >= OWN_MAX_ENTRIES ? "reached" : "no");
}

/* The filesystem on dev mounted on the staging directory (its descriptor
 * beneath the kubelet root), unless it is there already. */
static int mount_fs(struct csi *c, const struct vol *v, const char *dev, char **ret_msg)
{
    _cleanup_close_ int dfd = -1, fsfd = -1, mfd = -1;
    int r = mounts_open_target(c, v->staging_path, &dfd);
    if (r < 0) {
        *ret_msg = xasprintf("cannot open staging path %s: %s", v->staging_path, strerror(-r));
        return r;
    }
    struct stat sd, sdev;
    if (fsat_is_mount_root(dfd) == 1) {
        if (fstatat(dfd, "", &sd, AT_EMPTY_PATH) == 0 && stat(dev, &sdev) == 0 &&
            sd.st_dev == sdev.st_rdev)
            return 0;
        *ret_msg = xasprintf("staging path %s is a mount, not of volume %s", v->staging_path,
                             v->id);
        return -EUCLEAN;
    }
    if ((fsfd = fsopen(v->stage_fs, FSOPEN_CLOEXEC)) < 0 ||
        fsconfig(fsfd, FSCONFIG_SET_STRING, "source", dev, 0) < 0 ||
        (streq(v->stage_fs, "ext4") &&
         fsconfig(fsfd, FSCONFIG_SET_STRING, "errors", "remount-ro", 0) < 0) ||
        fsconfig(fsfd, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0 ||
        (mfd = fsmount(fsfd, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)) < 0 ||
        move_mount(mfd, "", dfd, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0) {
        r = -errno;
        *ret_msg = xasprintf("cannot mount the %s filesystem of volume %s at %s: %s",
                             v->stage_fs, v->id, v->staging_path, strerror(errno));
        return r;
    }
    if (v->stage_gid >= 0) /* fsGroup (volume_mount_group) */
        own_tree(v, mfd, (gid_t)v->stage_gid);
    return 0;
}

/* /sys/block/NAME/diskseq: -ENOENT without it (kernels before 5.15). */
static int loop_diskseq(const char *name, uint64_t *ret)
{
    _cleanup_free_ char *p = xasprintf("/sys/block/%s/diskseq", name), *text = NULL;
    size_t len;
    int r = read_file(p, 64, &text, &len);
    if (r < 0)
        return r;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(text, &end, 10);
    if (errno || end == text || (*end && *end != '\n') || n == 0)
        return -EBADMSG;
    *ret = n;
    return 0;
}

int podvol_attach(struct csi *c, const struct vol *v, struct podvol_loop *ret_loop,
                  char **ret_msg)
{
    _cleanup_free_ char *path = podvol_fuse_path(c, v->id), *dev = NULL;
    int r = loop_attach(path, &dev, ret_msg);
    if (r == 0 && v->stage_kind == STAGE_KIND_FS) {
        _cleanup_close_ int dfd = -1;
        bool mounted = mounts_open_target(c, v->staging_path, &dfd) == 0 &&
                       fsat_is_mount_root(dfd) == 1;
        if (!mounted)
            r = make_or_check(v, dev, ret_msg);
        if (r == 0 && !mounted && streq(v->stage_fs, "ext4"))
            r = ext4_grow_offline(v, dev, ret_msg);
        if (r == 0)
            r = mount_fs(c, v, dev, ret_msg);
    }
    /* The sequence number read after the check that the device is backed
     * by the export: only a holder of the device (this volume's own pods)
     * could rebind it in between. */
    const char *name = dev ? dev + strlen("/dev/") : "";
    *ret_loop = (struct podvol_loop){0};
    if (r == 0 && strlen(name) < sizeof(ret_loop->name) &&
        loop_diskseq(name, &ret_loop->diskseq) == 0)
        snprintf(ret_loop->name, sizeof(ret_loop->name), "%s", name);
    return r;
}

int podvol_loop_open(struct csi *c, const struct vol *v, int *ret_fd)
{
    _cleanup_free_ char *path = podvol_fuse_path(c, v->id), *dev = NULL;
    if (!v->stage_loop) {
        int r = podvol_loop_of(path, &dev);
        if (r == 0 && (*ret_fd = open(dev, O_PATH | O_CLOEXEC)) < 0)
            r = -errno;
        return r;
    }
    dev = xasprintf("/dev/%s", v->stage_loop);
    _cleanup_close_ int fd = open(dev, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    uint64_t seq;
    if (fd < 0 || fstat(fd, &st) < 0)
        return errno == ENOENT ? -ENOENT : -errno;
    if (!S_ISBLK(st.st_mode) || loop_diskseq(v->stage_loop, &seq) < 0 ||
        seq != v->stage_loop_diskseq || !loop_names(v->stage_loop, path))
        return -ENOENT; /* let go of, rebound, or taken by another volume since */
    *ret_fd = TAKE_FD(fd);
    return 0;
}

/* The loop device of v told its backing file grew to size: once the FUSE
 * file's size, asked again after the kernel's attribute timeout (1 s, the
 * export's), shows it. */
static int loop_grow(const char *path, const char *dev, uint64_t size, char **ret_msg)
{
    _cleanup_close_ int fd = open(dev, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        *ret_msg = xasprintf("cannot open %s: %s", dev, strerror(errno));
        return -errno;
    }
    for (int i = 0; i < 50; i++) { /* 5 s */
        struct stat st;
        uint64_t now = 0;
        if (stat(path, &st) == 0 && (uint64_t)st.st_size >= size &&
            ioctl(fd, LOOP_SET_CAPACITY, 0) == 0 && ioctl(fd, BLKGETSIZE64, &now) == 0 &&
            now >= size)
            return 0;
        usleep(100 * 1000);
    }
    *ret_msg = xasprintf("loop device %s did not grow to %" PRIu64 " bytes within 5 s", dev, size);
    return -ETIMEDOUT;
}

int podvol_grow(struct csi *c, const struct vol *v, uint64_t size, char **ret_msg)
{
    _cleanup_free_ char *path = podvol_fuse_path(c, v->id), *dev = NULL;
    int r = podvol_loop_of(path, &dev);
    if (r < 0) {
        *ret_msg = xasprintf("volume %s has no loop device: stage it again", v->id);
        return r;
    }
    if ((r = loop_grow(path, dev, size, ret_msg)) < 0 || v->stage_kind != STAGE_KIND_FS)
        return r;
    int code;
    if (streq(v->stage_fs, "ext4")) {
        char *argv[] = {"resize2fs", dev, NULL};
        r = run(argv, &code, NULL, ret_msg);
        if (r == 0 && code && *ret_msg && strstr(*ret_msg, "Permission denied")) {
            char *m = xasprintf("%s (online ext4 growth needs CAP_SYS_RESOURCE; the "
                                "filesystem grows at its next stage)", *ret_msg);
            free(*ret_msg);
            *ret_msg = m;
        }
    } else {
        /* xfs_growfs wants the mount point: the staging directory's
         * descriptor, through this process's /proc entry. */
        _cleanup_close_ int dfd = -1;
        if ((r = mounts_open_target(c, v->staging_path, &dfd)) < 0) {
            *ret_msg = xasprintf("cannot open staging path %s: %s", v->staging_path,
                                 strerror(-r));
            return r;
        }
        _cleanup_free_ char *mp = xasprintf("/proc/%d/fd/%d", (int)getpid(), dfd);
        char *argv[] = {"xfs_growfs", mp, NULL};
        r = run(argv, &code, NULL, ret_msg);
    }
    return r < 0 ? r : code ? -EIO : 0;
}

int podvol_detach(struct csi *c, const struct vol *v, char **ret_msg)
{
    _cleanup_free_ char *path = podvol_fuse_path(c, v->id);
    int r;
    if (v->stage_kind == STAGE_KIND_FS && v->staging_path &&
        (r = mounts_unmount(c, v->staging_path, ret_msg)) < 0)
        return r;
    /* Each loop device flushed (through the FUSE file to the QSD, which
     * writes its image's metadata), then detached; a detach the kernel
     * defers while someone else has the device open is waited for
     * (bounded): the FUSE file must not go from under a live device. */
    for (int i = 0; i < 50; i++) {
        _cleanup_free_ char *dev = NULL;
        if (loop_find(path, true, &dev) < 0)
            break;
        _cleanup_close_ int fd = open(dev, O_RDWR | O_CLOEXEC);
        if (fd >= 0 && i == 0 && fsync(fd) < 0)
            log_warn("node", "cannot flush a loop device", "volume=%s device=%s error=\"%s\"",
                     v->id, dev, strerror(errno));
        if (fd < 0 || (ioctl(fd, LOOP_CLR_FD, 0) < 0 && errno != ENXIO)) {
            r = -errno;
            *ret_msg = xasprintf("cannot detach loop device %s of volume %s: %s", dev, v->id,
                                 strerror(errno));
            return r;
        }
        closep(&fd);
        fd = -1;
        if (i > 0)
            usleep(100 * 1000);
    }
    _cleanup_free_ char *still = NULL;
    if (loop_find(path, true, &still) == 0) {
        *ret_msg = xasprintf("loop device %s of volume %s is still in use (open elsewhere)", still,
                             v->id);
        return -EBUSY;
    }
    if ((r = fuse_detach(path)) < 0) {
        *ret_msg = xasprintf("cannot unmount %s: %s", path, strerror(-r));
        return r;
    }
    if (unlink(path) < 0 && errno != ENOENT) {
        r = -errno;
        *ret_msg = xasprintf("cannot remove %s: %s", path, strerror(errno));
        return r;
    }
    return 0;
}
