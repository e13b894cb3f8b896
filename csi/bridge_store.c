/* SPDX-License-Identifier: Apache-2.0 */
/* bridge_store.c: the bridges' and hot-plug requests' records and tables
 * (bridge_int.h): Kubernetes name checks, JSON form, the record store
 * (records.h) under STATE/bridges and STATE/hotplug, and lookups. */
#include "bridge_int.h"
#include "qsd/base/names.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"
#include "qsd/state/records.h"

#include <fcntl.h>
#include <sys/mount.h>

/* ------------------------------------------------------------ names */

/* Kubernetes object names: pod names are DNS subdomains (253, dots
 * allowed), namespaces DNS labels (63); uids are UUIDs (we allow 64 of
 * [A-Za-z0-9-]: they name a directory). */
bool k8s_name_ok(const char *s, size_t max, bool dots)
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

bool uid_ok(const char *s)
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

void placement_clear(struct placement *p)
{
    free(p->disk);
    free(p->volume);
    free(p->pod_uid);
}

void bridge_free(struct bridge *b)
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

void req_free(struct hp_request *r)
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

json_t *req_to_json(const struct hp_request *r)
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

int save_rec(struct bridges *bs, const char *dir, const char *name, json_t *j)
{
    return records_save(bs->rec, dir, name, j);
}

static void remove_rec(struct bridges *bs, const char *dir, const char *name)
{
    int r = records_remove(bs->rec, dir, name);
    if (r < 0)
        log_warn(COMP, "cannot remove record", "dir=%s name=%s error=\"%s\"", dir, name,
                 strerror(-r));
}

int save_bridge(struct bridges *bs, const struct bridge *b)
{
    int r = save_rec(bs, bs->bridge_rec_dir, b->pod_uid, bridge_to_json(b));
    if (r < 0)
        log_error(COMP, "cannot write bridge record", "pod_uid=%s error=\"%s\"", b->pod_uid,
                  strerror(-r));
    return r;
}

void add_bridge(struct bridges *bs, struct bridge *b)
{
    bs->b = xrealloc(bs->b, (bs->n_b + 1) * sizeof(*bs->b));
    bs->b[bs->n_b++] = b;
}

void add_req(struct bridges *bs, struct hp_request *q)
{
    bs->r = xrealloc(bs->r, (bs->n_r + 1) * sizeof(*bs->r));
    bs->r[bs->n_r++] = q;
}

static int load_bridge(json_t *j, void *opaque, char **msg)
{
    (void)msg;
    struct bridge *b;
    int r = bridge_from_json(j, &b);
    if (r == 0)
        add_bridge(opaque, b);
    return r;
}

static int load_req(json_t *j, void *opaque, char **msg)
{
    (void)msg;
    struct hp_request *q;
    int r = req_from_json(j, &q);
    if (r == 0)
        add_req(opaque, q);
    return r;
}

int bridges_open(struct csi *c, char **ret_msg)
{
    struct bridges *bs = xcalloc(1, sizeof(*bs));
    bs->rec = c->store->rec;
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
    records_load(bs->bridge_rec_dir, NULL, load_bridge, bs);
    records_load(bs->req_rec_dir, NULL, load_req, bs);
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

void del_bridge(struct bridges *bs, struct bridge *b)
{
    remove_rec(bs, bs->bridge_rec_dir, b->pod_uid);
    for (size_t i = 0; i < bs->n_b; i++)
        if (bs->b[i] == b) {
            memmove(&bs->b[i], &bs->b[i + 1], (bs->n_b - i - 1) * sizeof(*bs->b));
            bs->n_b--;
            break;
        }
    bridge_free(b);
}

void del_req(struct bridges *bs, struct hp_request *q)
{
    remove_rec(bs, bs->req_rec_dir, q->volume_id);
    for (size_t i = 0; i < bs->n_r; i++)
        if (bs->r[i] == q) {
            memmove(&bs->r[i], &bs->r[i + 1], (bs->n_r - i - 1) * sizeof(*bs->r));
            bs->n_r--;
            break;
        }
    req_free(q);
}

struct bridge *find_bridge_uid(struct bridges *bs, const char *uid)
{
    for (size_t i = 0; i < bs->n_b; i++)
        if (streq(bs->b[i]->pod_uid, uid))
            return bs->b[i];
    return NULL;
}

struct bridge *find_bridge_vid(struct bridges *bs, const char *vid)
{
    for (size_t i = 0; i < bs->n_b; i++)
        if (streq(bs->b[i]->volume_id, vid))
            return bs->b[i];
    return NULL;
}

struct hp_request *find_req_vid(struct bridges *bs, const char *vid)
{
    for (size_t i = 0; i < bs->n_r; i++)
        if (streq(bs->r[i]->volume_id, vid))
            return bs->r[i];
    return NULL;
}

struct hp_request *find_req_pod(struct bridges *bs, const char *uid)
{
    for (size_t i = 0; i < bs->n_r; i++)
        if (streq(bs->r[i]->pod_uid, uid))
            return bs->r[i];
    return NULL;
}
