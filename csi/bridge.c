/* bridge.c: see bridge.h. */
#include "bridge.h"
#include "qsd/base/fsat.h"
#include "qsd/base/log.h"
#include "mounts.h"
#include "qsd/base/names.h"
#include "paths.h"
#include "qsd/base/proc.h"
#include "qsd/base/util.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>

#define COMP "bridge"
#define RECORD_MAX (1u << 20)
#define CTX_PREFIX "csi.storage.k8s.io/"
#define CTX_EPHEMERAL CTX_PREFIX "ephemeral"
#define CTX_POD_NAME CTX_PREFIX "pod.name"
#define CTX_POD_NS CTX_PREFIX "pod.namespace"
#define CTX_POD_UID CTX_PREFIX "pod.uid"

int64_t realtime_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------------ names */

/* Kubernetes object names: pod names are DNS subdomains (253, dots
 * allowed), namespaces DNS labels (63); uids are UUIDs (we allow 64 of
 * [A-Za-z0-9-]: they name a directory). */
static bool k8s_name_ok(const char *s, size_t max, bool dots)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > max)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' ||
                  (dots && ch == '.');
        if (!ok)
            return false;
    }
    return s[0] != '-' && s[0] != '.' && s[n - 1] != '-' && s[n - 1] != '.';
}

static bool uid_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
            return false;
    return s[0] != '-';
}

/* ------------------------------------------------------------ records */

static void placement_clear(struct placement *p)
{
    free(p->disk);
    free(p->volume);
    free(p->pod_uid);
}

static void bridge_free(struct bridge *b)
{
    if (!b)
        return;
    free(b->volume_id);
    free(b->target);
    free(b->pod_uid);
    free(b->ns);
    free(b->pod);
    for (size_t i = 0; i < b->n_pl; i++)
        placement_clear(&b->pl[i]);
    free(b->pl);
    free(b);
}

static void req_free(struct hp_request *r)
{
    if (!r)
        return;
    free(r->volume_id);
    free(r->target);
    free(r->pod_uid);
    free(r->ns);
    free(r->pod);
    free(r->into);
    free(r->disk);
    free(r->bridge_uid);
    free(r);
}

static json_t *bridge_to_json(const struct bridge *b)
{
    json_t *pl = json_array();
    for (size_t i = 0; i < b->n_pl; i++)
        json_array_append_new(pl, json_pack("{s:s, s:s, s:s, s:b}", "disk", b->pl[i].disk,
                                            "volume", b->pl[i].volume, "pod_uid",
                                            b->pl[i].pod_uid, "read_only", b->pl[i].read_only));
    return json_pack("{s:i, s:s, s:s, s:s, s:s, s:s, s:i, s:o}", "version", 1, "volume_id",
                     b->volume_id, "target", b->target, "pod_uid", b->pod_uid, "namespace",
                     b->ns, "pod", b->pod, "gid", b->gid, "placements", pl);
}

static int bridge_from_json(json_t *j, struct bridge **ret)
{
    const char *vid, *tgt, *uid, *ns, *pod;
    int gid;
    json_t *pl;
    if (json_unpack(j, "{s:s, s:s, s:s, s:s, s:s, s:i, s:o}", "volume_id", &vid, "target", &tgt,
                    "pod_uid", &uid, "namespace", &ns, "pod", &pod, "gid", &gid, "placements",
                    &pl) < 0 ||
        !json_is_array(pl) || name_validate(vid, NULL) < 0 || !uid_ok(uid))
        return -EBADMSG;
    struct bridge *b = xcalloc(1, sizeof(*b));
    *b = (struct bridge){.volume_id = xstrdup(vid), .target = xstrdup(tgt),
                         .pod_uid = xstrdup(uid), .ns = xstrdup(ns), .pod = xstrdup(pod),
                         .gid = gid};
    size_t i;
    json_t *p;
    json_array_foreach(pl, i, p)
    {
        const char *disk, *vol, *puid;
        int ro;
        if (json_unpack(p, "{s:s, s:s, s:s, s:b}", "disk", &disk, "volume", &vol, "pod_uid",
                        &puid, "read_only", &ro) < 0 ||
            name_validate(disk, NULL) < 0 || name_validate(vol, NULL) < 0) {
            bridge_free(b);
            return -EBADMSG;
        }
        b->pl = xrealloc(b->pl, (b->n_pl + 1) * sizeof(*b->pl));
        b->pl[b->n_pl++] = (struct placement){xstrdup(disk), xstrdup(vol), xstrdup(puid), ro};
    }
    *ret = b;
    return 0;
}

static json_t *req_to_json(const struct hp_request *r)
{
    return json_pack("{s:i, s:s, s:s, s:s, s:s, s:s, s:s, s:s*, s:s, s:i}", "version", 1,
                     "volume_id", r->volume_id, "target", r->target, "pod_uid", r->pod_uid,
                     "namespace", r->ns, "pod", r->pod, "into", r->into, "disk", r->disk,
                     "bridge_uid", r->bridge_uid, "gid", r->gid);
}

static int req_from_json(json_t *j, struct hp_request **ret)
{
    const char *vid, *tgt, *uid, *ns, *pod, *into, *disk = NULL, *buid;
    int gid;
    if (json_unpack(j, "{s:s, s:s, s:s, s:s, s:s, s:s, s?s, s:s, s:i}", "volume_id", &vid,
                    "target", &tgt, "pod_uid", &uid, "namespace", &ns, "pod", &pod, "into",
                    &into, "disk", &disk, "bridge_uid", &buid, "gid", &gid) < 0 ||
        name_validate(vid, NULL) < 0 || !uid_ok(uid) || !uid_ok(buid))
        return -EBADMSG;
    struct hp_request *r = xcalloc(1, sizeof(*r));
    *r = (struct hp_request){.volume_id = xstrdup(vid), .target = xstrdup(tgt),
                             .pod_uid = xstrdup(uid), .ns = xstrdup(ns), .pod = xstrdup(pod),
                             .into = xstrdup(into), .disk = disk ? xstrdup(disk) : NULL,
                             .bridge_uid = xstrdup(buid), .gid = gid};
    *ret = r;
    return 0;
}

static int save_rec(const char *dir, const char *name, json_t *j)
{
    _cleanup_free_ char *path = xasprintf("%s/%s.json", dir, name);
    _cleanup_free_ char *s = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(j);
    if (!s)
        return -ENOMEM;
    return write_file_atomic(path, s, strlen(s), 0600);
}

static void remove_rec(const char *dir, const char *name)
{
    _cleanup_free_ char *path = xasprintf("%s/%s.json", dir, name);
    if (unlink(path) < 0 && errno != ENOENT)
        log_warn(COMP, "cannot remove record", "path=%s error=\"%s\"", path, strerror(errno));
}

static int save_bridge(struct bridges *bs, const struct bridge *b)
{
    int r = save_rec(bs->bridge_rec_dir, b->pod_uid, bridge_to_json(b));
    if (r < 0)
        log_error(COMP, "cannot write bridge record", "pod_uid=%s error=\"%s\"", b->pod_uid,
                  strerror(-r));
    return r;
}

static void load_recs(struct bridges *bs, bool bridges)
{
    const char *dir = bridges ? bs->bridge_rec_dir : bs->req_rec_dir;
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (de->d_name[0] == '.' || n <= 5 || !streq(de->d_name + n - 5, ".json"))
            continue;
        _cleanup_free_ char *path = xasprintf("%s/%s", dir, de->d_name);
        _cleanup_free_ char *data = NULL;
        json_t *j = NULL;
        int r = read_file(path, RECORD_MAX, &data, NULL);
        if (r == 0 && !(j = json_loads(data, 0, NULL)))
            r = -EBADMSG;
        if (r == 0 && bridges) {
            struct bridge *b;
            if ((r = bridge_from_json(j, &b)) == 0) {
                bs->b = xrealloc(bs->b, (bs->n_b + 1) * sizeof(*bs->b));
                bs->b[bs->n_b++] = b;
            }
        } else if (r == 0) {
            struct hp_request *q;
            if ((r = req_from_json(j, &q)) == 0) {
                bs->r = xrealloc(bs->r, (bs->n_r + 1) * sizeof(*bs->r));
                bs->r[bs->n_r++] = q;
            }
        }
        json_decref(j);
        if (r < 0)
            log_warn("state", "record skipped", "path=%s reason=\"%s\"", path, strerror(-r));
    }
    closedir(d);
}

int bridges_open(struct csi *c, char **ret_msg)
{
    struct bridges *bs = xcalloc(1, sizeof(*bs));
    bs->bridge_rec_dir = xasprintf("%s/bridges", c->cfg->state_dir);
    bs->req_rec_dir = xasprintf("%s/hotplug", c->cfg->state_dir);
    bs->run_dir = xasprintf("%s/bridges", c->cfg->run_dir);
    int r;
    bs->run_fd = -1;
    if ((r = mkdir_p(bs->bridge_rec_dir, 0700)) < 0 || (r = mkdir_p(bs->req_rec_dir, 0700)) < 0 ||
        (r = mkdir_p(bs->run_dir, 0711)) < 0) {
        *ret_msg = xasprintf("cannot create the bridge directories: %s", strerror(-r));
        bridges_free(bs);
        return r;
    }
    bs->run_fd = open(bs->run_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (bs->run_fd < 0) {
        r = -errno;
        *ret_msg = xasprintf("cannot open %s: %s", bs->run_dir, strerror(-r));
        bridges_free(bs);
        return r;
    }
    load_recs(bs, true);
    load_recs(bs, false);
    c->bridges = bs;
    return 0;
}

void bridges_free(struct bridges *bs)
{
    if (!bs)
        return;
    closep(&bs->run_fd);
    for (size_t i = 0; i < bs->n_b; i++)
        bridge_free(bs->b[i]);
    for (size_t i = 0; i < bs->n_r; i++)
        req_free(bs->r[i]);
    free(bs->b);
    free(bs->r);
    free(bs->bridge_rec_dir);
    free(bs->req_rec_dir);
    free(bs->run_dir);
    free(bs);
}

static void del_bridge(struct bridges *bs, struct bridge *b)
{
    remove_rec(bs->bridge_rec_dir, b->pod_uid);
    for (size_t i = 0; i < bs->n_b; i++)
        if (bs->b[i] == b) {
            memmove(&bs->b[i], &bs->b[i + 1], (bs->n_b - i - 1) * sizeof(*bs->b));
            bs->n_b--;
            break;
        }
    bridge_free(b);
}

static void del_req(struct bridges *bs, struct hp_request *q)
{
    remove_rec(bs->req_rec_dir, q->volume_id);
    for (size_t i = 0; i < bs->n_r; i++)
        if (bs->r[i] == q) {
            memmove(&bs->r[i], &bs->r[i + 1], (bs->n_r - i - 1) * sizeof(*bs->r));
            bs->n_r--;
            break;
        }
    req_free(q);
}

static struct bridge *find_bridge_uid(struct bridges *bs, const char *uid)
{
    for (size_t i = 0; i < bs->n_b; i++)
        if (streq(bs->b[i]->pod_uid, uid))
            return bs->b[i];
    return NULL;
}

static struct bridge *find_bridge_vid(struct bridges *bs, const char *vid)
{
    for (size_t i = 0; i < bs->n_b; i++)
        if (streq(bs->b[i]->volume_id, vid))
            return bs->b[i];
    return NULL;
}

static struct hp_request *find_req_vid(struct bridges *bs, const char *vid)
{
    for (size_t i = 0; i < bs->n_r; i++)
        if (streq(bs->r[i]->volume_id, vid))
            return bs->r[i];
    return NULL;
}

static struct hp_request *find_req_pod(struct bridges *bs, const char *uid)
{
    for (size_t i = 0; i < bs->n_r; i++)
        if (streq(bs->r[i]->pod_uid, uid))
            return bs->r[i];
    return NULL;
}

/* ------------------------------------------------------------ mounts */

/* Everything below RUN/bridges goes through bs->run_fd (fsat.h): the
 * bridge directory RUN/bridges/<pod-uid>/ and its placements <disk>/. */

static int bridge_dir_open(struct bridges *bs, const struct bridge *b, int *ret_fd)
{
    return fsat_open(bs->run_fd, b->pod_uid, O_PATH | O_DIRECTORY, ret_fd);
}

/* The bridge directory, 0750 root:<gid>, as a shared bind of itself (or,
 * with join_fd, of join_fd and the mounts under it: the pod's mount still
 * exists after a restart, so the bridge rejoins its peer group). */
static int bridge_dir_make(struct bridges *bs, const struct bridge *b, int join_fd,
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
static void remove_bridge_dir(struct bridges *bs, const struct bridge *b)
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
static int can_place(struct csi *c, struct bridge *b, const char *disk, const struct vol *v,
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

static int do_place(struct csi *c, struct bridge *b, const char *disk, struct vol *v,
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

static void do_unplace(struct csi *c, struct bridge *b, size_t i)
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

/* ------------------------------------------------------------ publish */

static const char *ctx_get(const Csi__V1__NodePublishVolumeRequest *in, const char *key)
{
    for (size_t i = 0; i < in->n_volume_context; i++)
        if (in->volume_context[i]->key && streq(in->volume_context[i]->key, key))
            return in->volume_context[i]->value;
    return NULL;
}

bool bridge_is_ephemeral(const Csi__V1__NodePublishVolumeRequest *in)
{
    return streq_ptr(ctx_get(in, CTX_EPHEMERAL), "true");
}

struct podinfo {
    const char *uid, *ns, *name;
};

static bool get_podinfo(const Csi__V1__NodePublishVolumeRequest *in, struct podinfo *pi)
{
    pi->uid = ctx_get(in, CTX_POD_UID);
    pi->ns = ctx_get(in, CTX_POD_NS);
    pi->name = ctx_get(in, CTX_POD_NAME);
    return uid_ok(pi->uid) && k8s_name_ok(pi->ns, 63, false) && k8s_name_ok(pi->name, 253, true);
}

static void publish_bridge(struct csi *c, struct grpc_call *call,
                           const Csi__V1__NodePublishVolumeRequest *in, const struct podinfo *pi,
                           int gid)
{
    struct bridges *bs = c->bridges;
    struct bridge *b = find_bridge_uid(bs, pi->uid);
    if (b && (!streq(b->volume_id, in->volume_id) || !streq(b->target, in->target_path))) {
        grpc_call_fail(call, GRPC_ALREADY_EXISTS,
                       "pod %s/%s already has a hot-plug bridge (volume %s at %s)", pi->ns,
                       pi->name, b->volume_id, b->target);
        return;
    }
    if (!b && find_bridge_vid(bs, in->volume_id)) {
        grpc_call_fail(call, GRPC_ALREADY_EXISTS, "volume %s is the bridge of another pod",
                       in->volume_id);
        return;
    }
    if (b && gid >= 0 && gid != b->gid) {
        grpc_call_fail(call, GRPC_ALREADY_EXISTS, "the bridge of pod %s/%s has group %d",
                       pi->ns, pi->name, b->gid);
        return;
    }
    bool fresh = !b;
    if (fresh) {
        b = xcalloc(1, sizeof(*b));
        *b = (struct bridge){.volume_id = xstrdup(in->volume_id),
                             .target = xstrdup(in->target_path), .pod_uid = xstrdup(pi->uid),
                             .ns = xstrdup(pi->ns), .pod = xstrdup(pi->name), .gid = gid};
        int r = save_bridge(bs, b);
        if (r < 0) {
            bridge_free(b);
            grpc_call_fail(call, capacity_errno_code(r, GRPC_INTERNAL),
                           "cannot write the bridge record: %s", strerror(-r));
            return;
        }
        bs->b = xrealloc(bs->b, (bs->n_b + 1) * sizeof(*bs->b));
        bs->b[bs->n_b++] = b;
    }
    _cleanup_free_ char *msg = NULL;
    int r = bridge_dir_make(bs, b, -1, &msg), code = GRPC_INTERNAL;
    int mounted = r < 0 ? 0 : mounts_is_mounted(c, in->target_path, &msg);
    if (mounted < 0)
        r = mounted;
    else if (r == 0 && !mounted) {
        _cleanup_close_ int bfd = -1;
        if ((r = bridge_dir_open(bs, b, &bfd)) < 0)
            msg = xasprintf("cannot open the bridge directory: %s", strerror(-r));
        else
            r = mounts_bind(c, bfd, in->target_path, &msg);
    }
    if (r < 0) {
        if (msg && (r == -ELOOP || r == -EXDEV || r == -EEXIST))
            code = mounts_grpc_code(r);
        if (fresh) {
            _cleanup_free_ char *m2 = NULL;
            if (r != -ELOOP && r != -EXDEV && r != -EEXIST)
                mounts_unbind(c, in->target_path, &m2);
            remove_bridge_dir(bs, b);
            del_bridge(bs, b);
        }
        grpc_call_fail(call, code, "%s", msg ? msg : strerror(-r));
        return;
    }
    log_info(COMP, "bridge published", "pod=%s/%s pod_uid=%s gid=%d target=%s", b->ns, b->pod,
             b->pod_uid, b->gid, b->target);
    grpc_call_reply(call, "", 0);
}

/* The PVC publications of pod uid (volumes published for the attachment pod). */
static size_t pod_pvcs(struct csi *c, const char *uid, struct vol **out, bool *ro, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < c->store->n_vols; i++) {
        struct vol *v = c->store->vols[i];
        for (size_t k = 0; k < v->n_pubs && n < max; k++)
            if (streq_ptr(v->pubs[k].pod_uid, uid)) {
                ro[n] = v->pubs[k].read_only;
                out[n++] = v;
                break;
            }
    }
    return n;
}

#define MAX_PVCS 64

static void publish_request(struct csi *c, struct grpc_call *call,
                            const Csi__V1__NodePublishVolumeRequest *in, const struct podinfo *pi,
                            int gid, const char *into, const char *disk)
{
    struct bridges *bs = c->bridges;
    const char *why;
    if (!k8s_name_ok(into, 253, true)) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT,
                       "hotplugInto must be the name of a pod (a DNS subdomain name)");
        return;
    }
    if (disk && name_validate(disk, &why) < 0) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "disk %s", why);
        return;
    }
    struct hp_request *q = find_req_vid(bs, in->volume_id);
    if (q && !streq(q->target, in->target_path)) {
        grpc_call_fail(call, GRPC_ALREADY_EXISTS, "volume %s is published at %s", in->volume_id,
                       q->target);
        return;
    }
    struct hp_request *other = find_req_pod(bs, pi->uid);
    if (other && other != q) {
        grpc_call_fail(call, GRPC_FAILED_PRECONDITION,
                       "pod %s/%s already has a hot-plug request (volume %s)", pi->ns, pi->name,
                       other->volume_id);
        return;
    }
    struct bridge *b = NULL;
    if (q)
        b = find_bridge_uid(bs, q->bridge_uid);
    else
        for (size_t i = 0; i < bs->n_b && !b; i++)
            if (streq(bs->b[i]->ns, pi->ns) && streq(bs->b[i]->pod, into))
                b = bs->b[i];
    if (!b) {
        grpc_call_fail(call, GRPC_NOT_FOUND,
                       "no VM pod %s with a hot-plug bridge in namespace %s on this node", into,
                       pi->ns);
        return;
    }
    if (gid != b->gid) {
        grpc_call_fail(call, GRPC_FAILED_PRECONDITION,
                       "the attachment pod's group (fsGroup) %d differs from the VM pod %s/%s's "
                       "group %d", gid, b->ns, b->pod, b->gid);
        return;
    }
    /* PVCs published for this pod before the request: all must fit. */
    struct vol *vols[MAX_PVCS];
    bool ros[MAX_PVCS];
    size_t n = pod_pvcs(c, pi->uid, vols, ros, MAX_PVCS);
    bool skip[MAX_PVCS] = {false};
    if (disk && n > 1) {
        grpc_call_fail(call, GRPC_FAILED_PRECONDITION,
                       "disk %s names one disk but the attachment pod mounts %zu volumes", disk, n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        enum grpc_code code;
        _cleanup_free_ char *msg = NULL;
        const char *dn = disk ? disk : vols[i]->id;
        int r = can_place(c, b, dn, vols[i], pi->uid, -1, &code, &msg);
        if (r < 0) {
            grpc_call_fail(call, code, "%s", msg);
            return;
        }
        skip[i] = r == 1;
    }
    bool fresh = !q;
    if (fresh) {
        q = xcalloc(1, sizeof(*q));
        *q = (struct hp_request){.volume_id = xstrdup(in->volume_id),
                                 .target = xstrdup(in->target_path), .pod_uid = xstrdup(pi->uid),
                                 .ns = xstrdup(pi->ns), .pod = xstrdup(pi->name),
                                 .into = xstrdup(into), .disk = disk ? xstrdup(disk) : NULL,
                                 .bridge_uid = xstrdup(b->pod_uid), .gid = gid};
        int r = save_rec(bs->req_rec_dir, q->volume_id, req_to_json(q));
        if (r < 0) {
            req_free(q);
            grpc_call_fail(call, capacity_errno_code(r, GRPC_INTERNAL),
                           "cannot write the request record: %s", strerror(-r));
            return;
        }
        bs->r = xrealloc(bs->r, (bs->n_r + 1) * sizeof(*bs->r));
        bs->r[bs->n_r++] = q;
    }
    _cleanup_free_ char *msg = NULL;
    int r = mounts_mkdir(c, in->target_path, &msg);
    size_t placed = 0;
    for (size_t i = 0; i < n && r == 0; i++, placed++)
        if (!skip[i])
            r = do_place(c, b, disk ? disk : vols[i]->id, vols[i], pi->uid, ros[i], &msg);
    if (r < 0) {
        /* Undo what this call placed. */
        for (size_t i = 0; i < placed; i++) {
            if (skip[i])
                continue;
            for (size_t k = 0; k < b->n_pl; k++)
                if (streq(b->pl[k].volume, vols[i]->id)) {
                    do_unplace(c, b, k);
                    break;
                }
        }
        if (fresh) {
            _cleanup_free_ char *m2 = NULL;
            if (r != -ELOOP && r != -EXDEV)
                mounts_unbind(c, in->target_path, &m2);
            del_req(bs, q);
        }
        grpc_call_fail(call, mounts_grpc_code(r), "%s", msg);
        return;
    }
    log_info(COMP, "hot-plug request published",
             "pod=%s/%s pod_uid=%s into=%s disk=%s volumes_placed=%zu", q->ns, q->pod, q->pod_uid,
             q->into, q->disk ? q->disk : "-", n);
    grpc_call_reply(call, "", 0);
}

void bridge_publish_ephemeral(struct csi *c, struct grpc_call *call,
                              const Csi__V1__NodePublishVolumeRequest *in)
{
    const char *why;
    if (!id_ok(call, "volume_id", in->volume_id))
        return;
    if (!in->target_path || !*in->target_path) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "target_path is missing");
        return;
    }
    if ((why = cap_problem(in->volume_capability))) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "%s", why);
        return;
    }
    if (path_check_lexical(c->cfg->kubelet_root, in->target_path, &why) < 0) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "target_path %s (kubelet root %s)", why,
                       c->cfg->kubelet_root);
        return;
    }
    {
        _cleanup_free_ char *other = csi_path_owner(c, in->target_path, in->volume_id);
        if (other) {
            grpc_call_fail(call, GRPC_FAILED_PRECONDITION, "target_path %s is already used by %s",
                           in->target_path, other);
            return;
        }
    }
    struct podinfo pi;
    if (!get_podinfo(in, &pi)) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT,
                       "an inline volume of this driver needs the pod's name, namespace and uid "
                       "in the volume context (CSIDriver podInfoOnMount: true)");
        return;
    }
    int gid;
    cap_group(in->volume_capability, &gid);
    const char *bridge = NULL, *into = NULL, *disk = NULL;
    for (size_t i = 0; i < in->n_volume_context; i++) {
        const char *k = in->volume_context[i]->key, *val = in->volume_context[i]->value;
        if (!k || startswith(k, CTX_PREFIX))
            continue;
        if (streq(k, "bridge"))
            bridge = val;
        else if (streq(k, "hotplugInto"))
            into = val;
        else if (streq(k, "disk"))
            disk = val;
        else {
            grpc_call_fail(call, GRPC_INVALID_ARGUMENT,
                           "unknown volumeAttributes key %s for an inline volume (accepted: "
                           "bridge, or hotplugInto and disk)", k);
            return;
        }
    }
    if (bridge && !into && !disk) {
        if (!streq(bridge, "true")) {
            grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "bridge must be \"true\"");
            return;
        }
        publish_bridge(c, call, in, &pi, gid);
        return;
    }
    if (into && !bridge) {
        publish_request(c, call, in, &pi, gid, into, disk && *disk ? disk : NULL);
        return;
    }
    grpc_call_fail(call, GRPC_INVALID_ARGUMENT,
                   "an inline volume of this driver is either a hot-plug bridge "
                   "(volumeAttributes bridge: \"true\") or a hot-plug request (hotplugInto: "
                   "<VM pod name>, optional disk: <name>)");
}

/* ------------------------------------------------------------ unpublish */

static void unplace_pod(struct csi *c, const char *pod_uid, const char *volume)
{
    struct bridges *bs = c->bridges;
    for (size_t i = 0; i < bs->n_b; i++) {
        struct bridge *b = bs->b[i];
        for (size_t k = 0; k < b->n_pl;) {
            if (streq(b->pl[k].pod_uid, pod_uid) && (!volume || streq(b->pl[k].volume, volume)))
                do_unplace(c, b, k);
            else
                k++;
        }
    }
}

bool bridge_unpublish_ephemeral(struct csi *c, struct grpc_call *call, const char *id,
                                const char *target)
{
    struct bridges *bs = c->bridges;
    struct bridge *b = find_bridge_vid(bs, id);
    struct hp_request *q = find_req_vid(bs, id);
    if (!b && !q) {
        /* kubelet's id of an inline volume we no longer know (removed, and
         * kubelet retries): nothing is published there. */
        struct stat st;
        if (startswith(id, "csi-") && lstat(target, &st) < 0 && errno == ENOENT) {
            grpc_call_reply(call, "", 0);
            return true;
        }
        return false;
    }
    if ((b && !streq(b->target, target)) || (q && !streq(q->target, target))) {
        grpc_call_reply(call, "", 0); /* not published there */
        return true;
    }
    _cleanup_free_ char *msg = NULL;
    if (q) {
        unplace_pod(c, q->pod_uid, NULL);
        int r = mounts_unbind(c, target, &msg);
        if (r < 0) {
            grpc_call_fail(call, mounts_grpc_code(r), "%s", msg);
            return true;
        }
        log_info(COMP, "hot-plug request unpublished", "pod=%s/%s into=%s", q->ns, q->pod,
                 q->into);
        del_req(bs, q);
    } else {
        while (b->n_pl)
            do_unplace(c, b, b->n_pl - 1);
        int r = mounts_unbind(c, target, &msg);
        if (r < 0) {
            grpc_call_fail(call, mounts_grpc_code(r), "%s", msg);
            return true;
        }
        remove_bridge_dir(bs, b);
        log_info(COMP, "bridge unpublished", "pod=%s/%s pod_uid=%s", b->ns, b->pod, b->pod_uid);
        del_bridge(bs, b);
    }
    grpc_call_reply(call, "", 0);
    return true;
}

char *bridge_path_owner(struct csi *c, const char *path, const char *except)
{
    struct bridges *bs = c->bridges;
    for (size_t i = 0; i < bs->n_b; i++)
        if (streq(bs->b[i]->target, path) && !streq_ptr(bs->b[i]->volume_id, except))
            return xasprintf("the bridge of pod %s/%s", bs->b[i]->ns, bs->b[i]->pod);
    for (size_t i = 0; i < bs->n_r; i++)
        if (streq(bs->r[i]->target, path) && !streq_ptr(bs->r[i]->volume_id, except))
            return xasprintf("the hot-plug request of pod %s/%s", bs->r[i]->ns, bs->r[i]->pod);
    return NULL;
}

bool bridge_stats(struct csi *c, struct grpc_call *call, const char *id, const char *path)
{
    struct bridges *bs = c->bridges;
    struct bridge *b = find_bridge_vid(bs, id);
    struct hp_request *q = find_req_vid(bs, id);
    if (!b && !q)
        return false;
    if (!streq(b ? b->target : q->target, path)) {
        grpc_call_fail(call, GRPC_NOT_FOUND, "volume %s is not published at %s", id, path);
        return true;
    }
    Csi__V1__VolumeCondition cond = CSI__V1__VOLUME_CONDITION__INIT;
    _cleanup_free_ char *m = b ? xasprintf("hot-plug bridge of pod %s/%s: %zu volume(s) placed",
                                           b->ns, b->pod, b->n_pl)
                               : xasprintf("hot-plug request of pod %s/%s into %s", q->ns,
                                           q->pod, q->into);
    cond.message = m;
    Csi__V1__NodeGetVolumeStatsResponse out = CSI__V1__NODE_GET_VOLUME_STATS_RESPONSE__INIT;
    out.volume_condition = &cond;
    grpc_call_reply_pb(call, &out.base);
    return true;
}

/* ------------------------------------------------------------ PVC side */

int bridge_pvc_check(struct csi *c, const struct vol *v, const char *pod_uid, int gid,
                     enum grpc_code *ret_code, char **ret_msg)
{
    if (!pod_uid)
        return 0;
    struct hp_request *q = find_req_pod(c->bridges, pod_uid);
    if (!q)
        return 0;
    struct bridge *b = find_bridge_uid(c->bridges, q->bridge_uid);
    if (!b) {
        *ret_code = GRPC_NOT_FOUND;
        *ret_msg = xasprintf("the VM pod %s/%s that volume %s should be hot-plugged into is gone",
                             q->ns, q->into, v->id);
        return -ENOENT;
    }
    const char *disk = q->disk ? q->disk : v->id;
    int r = can_place(c, b, disk, v, pod_uid, gid, ret_code, ret_msg);
    return r < 0 ? r : 0;
}

int bridge_pvc_place(struct csi *c, struct vol *v, const char *pod_uid, bool ro, char **ret_msg)
{
    if (!pod_uid)
        return 0;
    struct hp_request *q = find_req_pod(c->bridges, pod_uid);
    struct bridge *b = q ? find_bridge_uid(c->bridges, q->bridge_uid) : NULL;
    if (!b)
        return 0;
    const char *disk = q->disk ? q->disk : v->id;
    enum grpc_code code;
    _cleanup_free_ char *m = NULL;
    int r = can_place(c, b, disk, v, pod_uid, -1, &code, &m);
    if (r == 1)
        return 0;
    if (r < 0) {
        *ret_msg = TAKE_PTR(m);
        return r;
    }
    return do_place(c, b, disk, v, pod_uid, ro, ret_msg);
}

void bridge_pvc_unplace(struct csi *c, struct vol *v, const char *pod_uid)
{
    if (pod_uid)
        unplace_pod(c, pod_uid, v->id);
}

/* ------------------------------------------------------------ clients */

int export_clients(pid_t pid, const char *socket_path)
{
    _cleanup_close_ int pidfd = pidfd_open_pid(pid);
    if (pidfd < 0)
        return pidfd;
    _cleanup_free_ char *fddir = xasprintf("/proc/%d/fd", (int)pid);
    DIR *d = opendir(fddir);
    if (!d)
        return -errno;
    int n = 0, err = 0, seen = 0;
    struct dirent *de;
    while ((de = readdir(d)) && seen++ < 4096) {
        uint64_t fdn;
        if (parse_uint(de->d_name, 0, INT32_MAX, &fdn) < 0)
            continue;
        char link[64];
        ssize_t len = readlinkat(dirfd(d), de->d_name, link, sizeof(link) - 1);
        if (len < 0)
            continue;
        link[len] = '\0';
        if (!startswith(link, "socket:"))
            continue;
        _cleanup_close_ int fd = (int)syscall(SYS_pidfd_getfd, pidfd, (int)fdn, 0);
        if (fd < 0) {
            if (errno != EBADF)
                err = -errno;
            continue;
        }
        int dom = 0, type = 0, acc = 0;
        socklen_t sl = sizeof(int);
        if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &sl) < 0 || dom != AF_UNIX)
            continue;
        sl = sizeof(int);
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &sl) < 0 || type != SOCK_STREAM)
            continue;
        sl = sizeof(int);
        if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &sl) < 0 || acc)
            continue;
        struct sockaddr_un a = {0};
        socklen_t al = sizeof(a);
        if (getsockname(fd, (struct sockaddr *)&a, &al) < 0 || al <= offsetof(struct sockaddr_un, sun_path))
            continue;
        size_t pl = al - offsetof(struct sockaddr_un, sun_path);
        if (pl >= sizeof(a.sun_path))
            pl = sizeof(a.sun_path) - 1;
        a.sun_path[pl] = '\0';
        if (!streq(a.sun_path, socket_path))
            continue;
        /* An accepted connection whose peer has hung up is on its way out. */
        struct pollfd pfd = {.fd = fd, .events = POLLRDHUP};
        if (poll(&pfd, 1, 0) == 1 && (pfd.revents & (POLLHUP | POLLRDHUP)))
            continue;
        n++;
    }
    closedir(d);
    return n > 0 || !err ? n : err;
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
