/* SPDX-License-Identifier: Apache-2.0 */
/* bridge_place.c: the bridge directories and mounts, the placement policy
 * (which PVC may go into which bridge as which disk) and the placements'
 * mounts, and their re-creation at start (bridges_recover). */
#include "bridge_int.h"
#include "clients.h"
#include "qsd/base/fsat.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"
#include "mounts.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>

/* ------------------------------------------------------------ mounts */

/* Everything below RUN/bridges goes through bs->run_fd (fsat.h): the
 * bridge directory RUN/bridges/<pod-uid>/ and its placements <disk>/. */

int bridge_dir_open(struct bridges *bs, const struct bridge *b, int *ret_fd)
{
    return fsat_open(bs->run_fd, b->pod_uid, O_PATH | O_DIRECTORY, ret_fd);
}

/* The bridge directory, 0750 root:<gid>, as a shared bind of itself (or,
 * with join_fd, of join_fd and the mounts under it: the pod's mount still
 * exists after a restart, so the bridge rejoins its peer group). */
int bridge_dir_make(struct bridges *bs, const struct bridge *b, int join_fd,
                    char **ret_msg)
{
    _cleanup_close_ int fd = -1;
    int r = 0;
    const char *what = "create";
    if (mkdirat(bs->run_fd, b->pod_uid, 0750) < 0 && errno != EEXIST)
        r = -errno;
    if (r == 0 && (what = "set the group of", r = fsat_chown_mode(bs->run_fd, b->pod_uid, b->gid,
                                                                  0750)) == 0 &&
        (what = "open", r = bridge_dir_open(bs, b, &fd)) == 0 &&
        (what = "inspect", r = fsat_is_mount_root(fd)) == 0) {
        what = "bind onto itself";
        if (join_fd >= 0)
            r = fsat_bind(join_fd, fd, FSAT_BIND_REC);
        else
            r = fsat_bind(fd, fd, 0);
        closep(&fd);
        fd = -1;
        if (r == 0)
            r = bridge_dir_open(bs, b, &fd);
    }
    if (r >= 0 && (what = "make shared", r = fsat_make_shared(fd)) == 0)
        return 0;
    *ret_msg = xasprintf("cannot %s the bridge directory %s/%s: %s", what, bs->run_dir,
                         b->pod_uid, strerror(-r));
    return r;
}

/* Remove the bridge directory: its mounts, then only empty directories
 * inside (placements the plugin made), never recursing. */
void remove_bridge_dir(struct bridges *bs, const struct bridge *b)
{
    int r = fsat_unmount(bs->run_fd, b->pod_uid);
    _cleanup_close_ int fd = -1;
    if (r == 0 && fsat_open(bs->run_fd, b->pod_uid, O_RDONLY | O_DIRECTORY, &fd) == 0) {
        DIR *d = fdopendir(fd);
        if (d) {
            fd = -1;
            struct dirent *de;
            while ((de = readdir(d))) {
                if (streq(de->d_name, ".") || streq(de->d_name, ".."))
                    continue;
                if (unlinkat(dirfd(d), de->d_name, AT_REMOVEDIR) < 0)
                    log_warn(COMP, "left an entry in a removed bridge",
                             "pod_uid=%s entry=%s error=\"%s\"", b->pod_uid, de->d_name,
                             strerror(errno));
            }
            closedir(d);
        }
    }
    if (r == 0 && unlinkat(bs->run_fd, b->pod_uid, AT_REMOVEDIR) < 0 && errno != ENOENT)
        r = -errno;
    if (r < 0)
        log_warn(COMP, "cannot remove bridge directory", "pod_uid=%s error=\"%s\"", b->pod_uid,
                 strerror(-r));
}

/* Bind the export directory of v (the read-only one when ro and v is
 * read-write) onto <bridge>/<disk>, read-only for the pod. */
static int place_mount(struct csi *c, struct bridge *b, const char *disk, const struct vol *v,
                       bool ro, char **ret_msg)
{
    _cleanup_close_ int bfd = -1, tfd = -1, src = -1;
    int r = bridge_dir_open(c->bridges, b, &bfd);
    const char *what = "open the bridge for";
    if (r == 0) {
        what = "create";
        if (mkdirat(bfd, disk, 0750) < 0 && errno != EEXIST)
            r = -errno;
    }
    if (r == 0 && (what = "open", r = fsat_open(bfd, disk, O_PATH | O_DIRECTORY, &tfd)) == 0 &&
        (what = "open the export for",
         r = qsd_export_dir_open(c->cfg->run_dir, v->id, ro && !v->stage_ro, &src)) == 0 &&
        (what = "bind-mount", r = fsat_bind(src, tfd, FSAT_BIND_RO)) == 0)
        return 0;
    *ret_msg = xasprintf("cannot %s placement %s of volume %s in the bridge of pod %s/%s: %s",
                         what, disk, v->id, b->ns, b->pod, strerror(-r));
    if (bfd >= 0 && tfd >= 0 && fsat_is_mount_root(tfd) == 0)
        unlinkat(bfd, disk, AT_REMOVEDIR);
    return r;
}

/* ------------------------------------------------------------ placements */

static struct placement *find_pl_disk(struct bridge *b, const char *disk)
{
    for (size_t i = 0; i < b->n_pl; i++)
        if (streq(b->pl[i].disk, disk))
            return &b->pl[i];
    return NULL;
}

static struct placement *find_pl_vol(struct bridges *bs, const char *vol, struct bridge **ret_b)
{
    for (size_t i = 0; i < bs->n_b; i++)
        for (size_t k = 0; k < bs->b[i]->n_pl; k++)
            if (streq(bs->b[i]->pl[k].volume, vol)) {
                if (ret_b)
                    *ret_b = bs->b[i];
                return &bs->b[i]->pl[k];
            }
    return NULL;
}

/* Can volume v (published for the attachment pod with group gid) go into
 * bridge b under disk?  0: yes; 1: already there (same volume, same pod). */
int can_place(struct csi *c, struct bridge *b, const char *disk, const struct vol *v,
              const char *pod_uid, int gid, enum grpc_code *code, char **msg)
{
    struct bridge *ob = NULL;
    struct placement *p = find_pl_vol(c->bridges, v->id, &ob);
    if (p && ob == b && streq(p->disk, disk) && streq(p->pod_uid, pod_uid))
        return 1;
    if (p) {
        *code = GRPC_FAILED_PRECONDITION;
        *msg = xasprintf("volume %s is already placed as %s in the bridge of pod %s/%s", v->id,
                         p->disk, ob->ns, ob->pod);
        return -EBUSY;
    }
    if (find_pl_disk(b, disk)) {
        *code = GRPC_FAILED_PRECONDITION;
        *msg = xasprintf("disk name %s is already used in the bridge of pod %s/%s", disk, b->ns,
                         b->pod);
        return -EEXIST;
    }
    _cleanup_close_ int bfd = -1;
    struct stat st;
    if (bridge_dir_open(c->bridges, b, &bfd) < 0 ||
        fstatat(bfd, disk, &st, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT) {
        *code = GRPC_FAILED_PRECONDITION;
        *msg = xasprintf("disk name %s is already taken in the bridge of pod %s/%s (an entry of "
                         "that name exists)", disk, b->ns, b->pod);
        return -EEXIST;
    }
    int vg = gid >= 0 ? gid : v->stage_gid;
    if (vg != b->gid) {
        *code = GRPC_FAILED_PRECONDITION;
        *msg = xasprintf("volume %s is served to group %d but the VM pod %s/%s has group %d "
                         "(give the attachment pod the VM pod's fsGroup)", v->id, vg, b->ns,
                         b->pod, b->gid);
        return -EPERM;
    }
    if (!v->staging_path) {
        *code = GRPC_FAILED_PRECONDITION;
        *msg = xasprintf("volume %s is not staged", v->id);
        return -ENOENT;
    }
    return 0;
}

int do_place(struct csi *c, struct bridge *b, const char *disk, struct vol *v,
             const char *pod_uid, bool ro, char **ret_msg)
{
    struct bridges *bs = c->bridges;
    b->pl = xrealloc(b->pl, (b->n_pl + 1) * sizeof(*b->pl));
    b->pl[b->n_pl++] = (struct placement){xstrdup(disk), xstrdup(v->id), xstrdup(pod_uid), ro};
    int r = save_bridge(bs, b);
    if (r < 0)
        *ret_msg = xasprintf("cannot write the bridge record: %s", strerror(-r));
    else
        r = place_mount(c, b, disk, v, ro, ret_msg);
    if (r < 0) {
        placement_clear(&b->pl[--b->n_pl]);
        save_bridge(bs, b);
        return r;
    }
    log_info(COMP, "volume placed", "volume=%s disk=%s vm_pod=%s/%s vm_pod_uid=%s read_only=%s",
             v->id, disk, b->ns, b->pod, b->pod_uid, ro ? "true" : "false");
    return 0;
}

void do_unplace(struct csi *c, struct bridge *b, size_t i)
{
    struct bridges *bs = c->bridges;
    struct placement *p = &b->pl[i];
    _cleanup_free_ char *rel = xasprintf("%s/%s", b->pod_uid, p->disk);
    int r = fsat_unmount_rmdir(bs->run_fd, rel);
    if (r < 0)
        log_error(COMP, "cannot remove a placement", "volume=%s disk=%s error=\"%s\"", p->volume,
                  p->disk, strerror(-r));
    log_info(COMP, "volume removed from bridge", "volume=%s disk=%s vm_pod=%s/%s", p->volume,
             p->disk, b->ns, b->pod);
    struct vol *v = store_find_vol(c->store, p->volume);
    if (v) {
        v->released_ms = realtime_ms();
        store_save_vol(c->store, v);
    }
    placement_clear(p);
    memmove(&b->pl[i], &b->pl[i + 1], (b->n_pl - i - 1) * sizeof(*b->pl));
    b->n_pl--;
    save_bridge(bs, b);
}

/* ------------------------------------------------------------ recovery */

void bridges_recover(struct csi *c)
{
    struct bridges *bs = c->bridges;
    for (size_t i = 0; i < bs->n_b; i++) {
        struct bridge *b = bs->b[i];
        _cleanup_free_ char *msg = NULL;
        _cleanup_close_ int dfd = -1;
        int dir_m = bridge_dir_open(bs, b, &dfd) == 0 ? fsat_is_mount_root(dfd) : 0;
        int tgt_m = mounts_is_mounted(c, b->target, &msg);
        bool redone = false;
        if (tgt_m < 0) {
            /* A symlink or an escape where the target was: not ours to touch. */
        } else if (dir_m != 1) {
            /* The pod's mount still exists: join its peer group (with the
             * placements under it) instead of starting a new one. */
            _cleanup_close_ int tfd = -1;
            if (tgt_m == 1 && mounts_open_target(c, b->target, &tfd) < 0)
                tfd = -1;
            if (bridge_dir_make(bs, b, tfd, &msg) == 0)
                redone = true;
        }
        if (!msg && tgt_m == 0) {
            _cleanup_close_ int bfd = -1;
            int r = bridge_dir_open(bs, b, &bfd);
            if (r == 0)
                r = mounts_bind(c, bfd, b->target, &msg);
            if (r == 0)
                redone = true;
            else if (r == -ENOENT)
                log_warn(COMP, "bridge target is gone (pod removed?); waiting for "
                         "NodeUnpublishVolume", "pod=%s/%s target=%s", b->ns, b->pod, b->target);
        }
        if (msg) {
            _cleanup_free_ char *q = log_quote(msg);
            log_error(COMP, "cannot restore a bridge", "pod=%s/%s error=%s", b->ns, b->pod, q);
            continue;
        }
        for (size_t k = 0; k < b->n_pl; k++) {
            struct placement *p = &b->pl[k];
            _cleanup_free_ char *rel = xasprintf("%s/%s", b->pod_uid, p->disk);
            _cleanup_close_ int pfd = -1;
            if (fsat_open(bs->run_fd, rel, O_PATH | O_DIRECTORY, &pfd) == 0 &&
                fsat_is_mount_root(pfd) == 1)
                continue;
            struct vol *v = store_find_vol(c->store, p->volume);
            if (!v || !v->staging_path) {
                log_warn(COMP, "placed volume is not staged any more", "volume=%s disk=%s",
                         p->volume, p->disk);
                continue;
            }
            _cleanup_free_ char *m = NULL;
            if (place_mount(c, b, p->disk, v, p->read_only, &m) < 0) {
                _cleanup_free_ char *q = log_quote(m);
                log_error(COMP, "cannot restore a placement", "volume=%s disk=%s error=%s",
                          p->volume, p->disk, q);
            } else {
                log_info(COMP, "placement restored", "volume=%s disk=%s vm_pod=%s/%s", p->volume,
                         p->disk, b->ns, b->pod);
            }
        }
        log_info(COMP, redone ? "bridge restored" : "bridge intact", "pod=%s/%s placements=%zu",
                 b->ns, b->pod, b->n_pl);
    }
}
