/* SPDX-License-Identifier: Apache-2.0 */
/* state.c: see state.h. */
#include "qsd/state/state.h"
#include "qsd/state/records.h"
#include "qsd/qemu/layers.h"
#include "qsd/base/log.h"
#include "qsd/base/names.h"
#include "qsd/base/util.h"

#include <sys/types.h>

static const char *const PHASES[] = {"creating", "ready", "deleting"};

static int phase_parse(const char *s, enum rec_phase *ret)
{
    for (unsigned i = 0; i < ARRAY_SIZE(PHASES); i++)
        if (streq(s, PHASES[i])) {
            *ret = (enum rec_phase)i;
            return 0;
        }
    return -EINVAL;
}

struct vol *vol_new(const char *id)
{
    struct vol *v = xcalloc(1, sizeof(*v));
    v->id = xstrdup(id);
    v->stage_gid = -1;
    v->parameters = json_object();
    v->context = json_object();
    v->format = xstrdup("qcow2");
    v->preallocation = xstrdup("off");
    return v;
}

const char *stage_kind_name(enum stage_kind k)
{
    return k == STAGE_KIND_FS ? "filesystem" : k == STAGE_KIND_BLOCK ? "block" : "vhost-user";
}

void vol_clear_staging(struct vol *v)
{
    free(v->staging_path);
    v->staging_path = NULL;
    free(v->stage_fs);
    v->stage_fs = NULL;
    free(v->stage_loop);
    v->stage_loop = NULL;
    v->stage_loop_diskseq = 0;
    v->stage_kind = STAGE_KIND_VHOST;
    v->stage_gid = -1;
    v->stage_ro = false;
}

void vol_free(struct vol *v)
{
    if (!v)
        return;
    free(v->id);
    free(v->format);
    free(v->preallocation);
    json_decref(v->parameters);
    json_decref(v->mutable_params);
    json_decref(v->context);
    free(v->src_type);
    free(v->src_id);
    free(v->staging_path);
    free(v->stage_fs);
    free(v->stage_loop);
    for (size_t i = 0; i < v->n_pubs; i++) {
        free(v->pubs[i].target);
        free(v->pubs[i].pod_uid);
        free(v->pubs[i].pod_ns);
    }
    free(v->pubs);
    free(v);
}

void vol_add_pub(struct vol *v, const char *target, bool ro)
{
    v->pubs = xrealloc(v->pubs, (v->n_pubs + 1) * sizeof(*v->pubs));
    v->pubs[v->n_pubs++] = (struct publication){.target = xstrdup(target), .read_only = ro};
}

void vol_pub_set_pod(struct vol *v, size_t i, const char *uid, const char *ns)
{
    free(v->pubs[i].pod_uid);
    free(v->pubs[i].pod_ns);
    v->pubs[i].pod_uid = uid && ns ? xstrdup(uid) : NULL;
    v->pubs[i].pod_ns = uid && ns ? xstrdup(ns) : NULL;
}

void vol_del_pub(struct vol *v, size_t i)
{
    free(v->pubs[i].target);
    free(v->pubs[i].pod_uid);
    free(v->pubs[i].pod_ns);
    memmove(&v->pubs[i], &v->pubs[i + 1], (v->n_pubs - i - 1) * sizeof(*v->pubs));
    v->n_pubs--;
}

ssize_t vol_find_pub(const struct vol *v, const char *target)
{
    for (size_t i = 0; i < v->n_pubs; i++)
        if (streq(v->pubs[i].target, target))
            return (ssize_t)i;
    return -1;
}

struct snap *snap_new(const char *id)
{
    struct snap *sn = xcalloc(1, sizeof(*sn));
    sn->id = xstrdup(id);
    return sn;
}

void snap_free(struct snap *sn)
{
    if (!sn)
        return;
    free(sn->id);
    free(sn->source);
    free(sn->group);
    json_decref(sn->layers);
    free(sn);
}

/* ---------------------------------------------------------------- JSON */

json_t *vol_to_json(const struct vol *v)
{
    json_t *pubs = json_array();
    for (size_t i = 0; i < v->n_pubs; i++) {
        json_t *p = json_pack("{s:s, s:b}", "target", v->pubs[i].target, "read_only",
                              v->pubs[i].read_only);
        if (v->pubs[i].pod_uid) {
            json_object_set_new(p, "pod_uid", json_string(v->pubs[i].pod_uid));
            json_object_set_new(p, "pod_namespace", json_string(v->pubs[i].pod_ns));
        }
        json_array_append_new(pubs, p);
    }
    json_t *staged = v->staging_path
                         ? json_pack("{s:s, s:i, s:b}", "path", v->staging_path, "gid",
                                     v->stage_gid, "read_only", v->stage_ro)
                         : json_null();
    if (v->staging_path && v->stage_kind != STAGE_KIND_VHOST) {
        json_object_set_new(staged, "kind", json_string(stage_kind_name(v->stage_kind)));
        if (v->stage_fs)
            json_object_set_new(staged, "fs_type", json_string(v->stage_fs));
        if (v->stage_loop)
            json_object_set_new(staged, "loop", json_pack("{s:s, s:I}", "name", v->stage_loop,
                                                          "diskseq",
                                                          (json_int_t)v->stage_loop_diskseq));
    }
    json_t *src = v->src_type ? json_pack("{s:s, s:s}", "type", v->src_type, "id", v->src_id)
                              : json_null();
    json_t *j = json_pack("{s:i, s:s, s:s, s:s, s:s, s:O, s:O, s:I, s:I, s:o, s:I, s:o, s:o}", "version", 1,
                     "id", v->id, "phase", PHASES[v->phase], "format", v->format,
                     "preallocation", v->preallocation, "parameters", v->parameters,
                     "context", v->context, "size",
                     (json_int_t)v->size, "image_size", (json_int_t)v->image_size, "source", src,
                     "created", (json_int_t)v->created, "staged", staged, "published", pubs);
    if (v->released_ms)
        json_object_set_new(j, "released_ms", json_integer((json_int_t)v->released_ms));
    if (v->raw_exposed)
        json_object_set_new(j, "raw_exposed", json_true());
    if (v->fs_made)
        json_object_set_new(j, "fs_made", json_true());
    if (v->mutable_params && json_object_size(v->mutable_params))
        json_object_set(j, "mutable_parameters", v->mutable_params);
    return j;
}

int vol_from_json(json_t *j, struct vol **ret, char **ret_msg)
{
    const char *id, *phase, *format, *prealloc;
    json_t *params, *src, *staged, *pubs, *ctx = NULL;
    json_int_t size, isize, created, released = 0;
    json_error_t e;
    if (json_unpack_ex(j, &e, 0, "{s:s, s:s, s:s, s:s, s:o, s?o, s:I, s:I, s:o, s:I, s:o, s:o}",
                       "id", &id, "phase", &phase, "format", &format, "preallocation", &prealloc,
                       "parameters", &params, "context", &ctx, "size", &size, "image_size", &isize, "source", &src,
                       "created", &created, "staged", &staged, "published", &pubs) < 0) {
        *ret_msg = xasprintf("bad volume record: %s", e.text);
        return -EBADMSG;
    }
    enum rec_phase ph;
    if (name_validate(id, NULL) < 0 || phase_parse(phase, &ph) < 0 || !json_is_object(params) ||
        !json_is_array(pubs) || (!streq(format, "qcow2") && !streq(format, "raw")) || size < 0 ||
        isize < 0) {
        *ret_msg = xstrdup("bad volume record: invalid id, phase, format, sizes or parameters");
        return -EBADMSG;
    }
    struct vol *v = vol_new(id);
    v->phase = ph;
    free(v->format);
    v->format = xstrdup(format);
    free(v->preallocation);
    v->preallocation = xstrdup(prealloc);
    json_decref(v->parameters);
    v->parameters = json_deep_copy(params);
    if (json_is_object(ctx)) {
        json_decref(v->context);
        v->context = json_deep_copy(ctx);
    }
    json_t *mp = json_object_get(j, "mutable_parameters");
    if (json_is_object(mp))
        v->mutable_params = json_deep_copy(mp);
    v->size = (uint64_t)size;
    v->image_size = (uint64_t)isize;
    v->created = created;
    if (json_is_integer(json_object_get(j, "released_ms")))
        released = json_integer_value(json_object_get(j, "released_ms"));
    v->released_ms = released > 0 ? released : 0;
    v->raw_exposed = json_is_true(json_object_get(j, "raw_exposed"));
    v->fs_made = json_is_true(json_object_get(j, "fs_made"));
    int r = 0;
    if (json_is_object(src)) {
        const char *t, *sid;
        if (json_unpack(src, "{s:s, s:s}", "type", &t, "id", &sid) < 0 ||
            name_validate(sid, NULL) < 0 || (!streq(t, "snapshot") && !streq(t, "volume")))
            r = -EBADMSG;
        else {
            v->src_type = xstrdup(t);
            v->src_id = xstrdup(sid);
        }
    }
    if (r == 0 && json_is_object(staged)) {
        const char *path;
        int gid, ro;
        if (json_unpack(staged, "{s:s, s:i, s:b}", "path", &path, "gid", &gid, "read_only", &ro) < 0)
            r = -EBADMSG;
        else {
            v->staging_path = xstrdup(path);
            v->stage_gid = gid;
            v->stage_ro = ro;
            const char *kind = json_string_value(json_object_get(staged, "kind"));
            const char *fs = json_string_value(json_object_get(staged, "fs_type"));
            if (kind && streq(kind, "filesystem") && fs && (streq(fs, "ext4") || streq(fs, "xfs"))) {
                v->stage_kind = STAGE_KIND_FS;
                v->stage_fs = xstrdup(fs);
            } else if (kind && streq(kind, "block"))
                v->stage_kind = STAGE_KIND_BLOCK;
            else if (kind)
                r = -EBADMSG;
            json_t *loop = json_object_get(staged, "loop");
            const char *ln;
            json_int_t seq;
            if (r == 0 && loop && v->stage_kind != STAGE_KIND_VHOST) {
                if (json_unpack(loop, "{s:s, s:I}", "name", &ln, "diskseq", &seq) < 0 ||
                    !startswith(ln, "loop") || !ln[4] || strspn(ln + 4, "0123456789") != strlen(ln + 4) ||
                    seq <= 0)
                    r = -EBADMSG;
                else {
                    v->stage_loop = xstrdup(ln);
                    v->stage_loop_diskseq = (uint64_t)seq;
                }
            }
        }
    }
    size_t i;
    json_t *p;
    json_array_foreach(pubs, i, p)
    {
        const char *t, *uid = NULL, *ns = NULL;
        int ro;
        if (r == 0 && json_unpack(p, "{s:s, s:b, s?s, s?s}", "target", &t, "read_only", &ro,
                                  "pod_uid", &uid, "pod_namespace", &ns) == 0) {
            vol_add_pub(v, t, ro);
            vol_pub_set_pod(v, v->n_pubs - 1, uid, ns);
        } else
            r = -EBADMSG;
    }
    if (r < 0) {
        vol_free(v);
        *ret_msg = xstrdup("bad volume record: invalid source, staging or publications");
        return r;
    }
    *ret = v;
    return 0;
}

json_t *snap_to_json(const struct snap *sn)
{
    json_t *j = json_pack("{s:i, s:s, s:s, s:s, s:I, s:I, s:i}", "version", 1, "id", sn->id,
                          "phase", PHASES[sn->phase], "source_volume", sn->source, "size",
                          (json_int_t)sn->size, "created_sec", (json_int_t)sn->created_sec,
                          "created_nsec", (int)sn->created_nsec);
    if (sn->layers)
        json_object_set(j, "layers", sn->layers);
    if (sn->group)
        json_object_set_new(j, "group", json_string(sn->group));
    return j;
}

/* An array of 1..LAYER_MAX_DEPTH valid layer names. */
static bool layers_ok(json_t *a)
{
    size_t i, n = json_array_size(a);
    json_t *v;
    if (!json_is_array(a) || n == 0 || n > LAYER_MAX_DEPTH)
        return false;
    json_array_foreach(a, i, v) if (!layer_name_valid(json_string_value(v))) return false;
    return true;
}

int snap_from_json(json_t *j, struct snap **ret, char **ret_msg)
{
    const char *id, *phase, *src;
    json_int_t size, sec;
    int nsec;
    json_error_t e;
    if (json_unpack_ex(j, &e, 0, "{s:s, s:s, s:s, s:I, s:I, s:i}", "id", &id, "phase", &phase,
                       "source_volume", &src, "size", &size, "created_sec", &sec, "created_nsec",
                       &nsec) < 0) {
        *ret_msg = xasprintf("bad snapshot record: %s", e.text);
        return -EBADMSG;
    }
    enum rec_phase ph;
    if (name_validate(id, NULL) < 0 || name_validate(src, NULL) < 0 ||
        phase_parse(phase, &ph) < 0 || size < 0 || nsec < 0 || nsec > 999999999) {
        *ret_msg = xstrdup("bad snapshot record: invalid id, source, phase, size or time");
        return -EBADMSG;
    }
    json_t *layers = json_object_get(j, "layers");
    if (layers && !layers_ok(layers)) {
        *ret_msg = xstrdup("bad snapshot record: invalid layers");
        return -EBADMSG;
    }
    struct snap *sn = snap_new(id);
    sn->phase = ph;
    sn->source = xstrdup(src);
    sn->layers = json_incref(layers);
    const char *group = json_string_value(json_object_get(j, "group"));
    if (group && name_validate(group, NULL) < 0) {
        snap_free(sn);
        *ret_msg = xstrdup("bad snapshot record: invalid group");
        return -EBADMSG;
    }
    sn->group = xstrdup_or_null(group);
    sn->size = (uint64_t)size;
    sn->created_sec = sec;
    sn->created_nsec = nsec;
    *ret = sn;
    return 0;
}

/* --------------------------------------------------------------- store */

int store_save_vol(struct store *s, const struct vol *v)
{
    return records_save(s->rec, s->vol_dir, v->id, vol_to_json(v));
}

int store_save_snap(struct store *s, const struct snap *sn)
{
    return records_save(s->rec, s->snap_dir, sn->id, snap_to_json(sn));
}

struct vol *store_find_vol(struct store *s, const char *id)
{
    for (size_t i = 0; i < s->n_vols; i++)
        if (streq(s->vols[i]->id, id))
            return s->vols[i];
    return NULL;
}

struct snap *store_find_snap(struct store *s, const char *id)
{
    for (size_t i = 0; i < s->n_snaps; i++)
        if (streq(s->snaps[i]->id, id))
            return s->snaps[i];
    return NULL;
}

void store_add_vol(struct store *s, struct vol *v)
{
    s->vols = xrealloc(s->vols, (s->n_vols + 1) * sizeof(*s->vols));
    s->vols[s->n_vols++] = v;
}

void store_add_snap(struct store *s, struct snap *sn)
{
    s->snaps = xrealloc(s->snaps, (s->n_snaps + 1) * sizeof(*s->snaps));
    s->snaps[s->n_snaps++] = sn;
}

int store_remove_vol(struct store *s, struct vol *v)
{
    int r = records_remove(s->rec, s->vol_dir, v->id);
    for (size_t i = 0; i < s->n_vols; i++)
        if (s->vols[i] == v) {
            memmove(&s->vols[i], &s->vols[i + 1], (s->n_vols - i - 1) * sizeof(*s->vols));
            s->n_vols--;
            break;
        }
    vol_free(v);
    return r;
}

int store_remove_snap(struct store *s, struct snap *sn)
{
    int r = records_remove(s->rec, s->snap_dir, sn->id);
    for (size_t i = 0; i < s->n_snaps; i++)
        if (s->snaps[i] == sn) {
            memmove(&s->snaps[i], &s->snaps[i + 1], (s->n_snaps - i - 1) * sizeof(*s->snaps));
            s->n_snaps--;
            break;
        }
    snap_free(sn);
    return r;
}

static int cmp_vol(const void *a, const void *b)
{
    return strcmp((*(struct vol *const *)a)->id, (*(struct vol *const *)b)->id);
}

static int cmp_snap(const void *a, const void *b)
{
    return strcmp((*(struct snap *const *)a)->id, (*(struct snap *const *)b)->id);
}

void store_sort(struct store *s)
{
    if (s->n_vols)
        qsort(s->vols, s->n_vols, sizeof(*s->vols), cmp_vol);
    if (s->n_snaps)
        qsort(s->snaps, s->n_snaps, sizeof(*s->snaps), cmp_snap);
}

static int load_vol(json_t *j, void *opaque, char **msg)
{
    struct vol *v;
    int r = vol_from_json(j, &v, msg);
    if (r == 0)
        store_add_vol(opaque, v);
    return r;
}

static int load_snap(json_t *j, void *opaque, char **msg)
{
    struct snap *sn;
    int r = snap_from_json(j, &sn, msg);
    if (r == 0)
        store_add_snap(opaque, sn);
    return r;
}

int store_open(const char *dir, struct records *rec, struct store **ret, char **ret_msg)
{
    struct store *s = xcalloc(1, sizeof(*s));
    s->rec = rec;
    s->dir = xstrdup(dir);
    s->vol_dir = xasprintf("%s/volumes", dir);
    s->snap_dir = xasprintf("%s/snapshots", dir);
    int r;
    if ((r = mkdir_p(s->vol_dir, 0700)) < 0 || (r = mkdir_p(s->snap_dir, 0700)) < 0) {
        *ret_msg = xasprintf("cannot create state directories under %s: %s", dir, strerror(-r));
        store_free(s);
        return r;
    }
    records_load(s->vol_dir, "id", load_vol, s);
    records_load(s->snap_dir, "id", load_snap, s);
    store_sort(s);
    *ret = s;
    return 0;
}

void store_free(struct store *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n_vols; i++)
        vol_free(s->vols[i]);
    for (size_t i = 0; i < s->n_snaps; i++)
        snap_free(s->snaps[i]);
    free(s->vols);
    free(s->snaps);
    free(s->dir);
    free(s->vol_dir);
    free(s->snap_dir);
    free(s);
}
