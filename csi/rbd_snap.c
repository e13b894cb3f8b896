/* SPDX-License-Identifier: Apache-2.0 */
/* rbd_snap.c: snapshots and clones of RBD volumes (docs/rbd.md, "Snapshots
 * and clones").
 *
 * Owns: CreateSnapshot, DeleteSnapshot and ListSnapshots of RBD volumes,
 * CreateVolume from an RBD snapshot or volume, the snapshot id
 * ("rbdsnap:<clusterID>:<pool>:<namespace>:<name>"), the removal of images
 * that clones still need (through the RBD trash), and the clone depth bound
 * with its background flatten.
 *
 * Design (ceph-csi's): a snapshot N of volume V is an image of its own,
 * SNAP_IMAGE_PREFIX N, cloned (clone format 2) from a short-lived snapshot
 * of V, with one snapshot SNAP_NAME of its own; the short-lived snapshot is
 * removed at once (librbd keeps it in V's trash namespace while the clone
 * needs it).  So V carries no snapshot a user sees and can be deleted:
 * DeleteVolume moves an image that clones still need to the RBD trash, and
 * the removal of its last dependent takes it out of the trash.  A volume
 * restored from N is a clone of N's image at SNAP_NAME; a volume cloned from
 * a volume is made like a snapshot's image.  An image with more than
 * RBD_DEPTH_MAX ancestors is flattened by a worker that outlives the
 * request (an operation without a call, bounded by FLATTEN_MS); until it is
 * flat, CreateVolume answers ABORTED and CreateSnapshot ready_to_use false,
 * so the CO retries, and a retry finding the image still deep and no
 * flatten running (the plugin was killed: a flatten cut short leaves a
 * correct clone) starts it again.
 *
 * Every Ceph operation runs in a worker (rbd.c's connection and bounds);
 * the loop only validates (the plans of rbd_int.h) and replies. */
#include "rbd.h"
#include "rbd_int.h"
#include "service.h"
#include "qsd/base/log.h"
#include "qsd/base/names.h"
#include "qsd/base/util.h"
#include "ids.h"
#include "op.h"

#include <inttypes.h>
#include <time.h>

#define SNAP_IMAGE_PREFIX "csi-snap." /* the image of snapshot N */
#define TMP_SNAP_PREFIX "csi-tmp."    /* short-lived snapshot on a source volume */
#define SNAP_NAME "csi-snap"          /* the snapshot of a snapshot's image */
#define META_SNAP "qsd-csi.snapshot"  /* a snapshot's image: the snapshot name (ours) */
#define META_SOURCE "qsd-csi.source"  /* a snapshot or clone: the source's id */
#define RBD_DEPTH_MAX 4               /* ancestors an image may have unflattened */
#define CHAIN_MAX 16                  /* the most parents any walk follows */
#define FLATTEN_MS (10ull * 60 * 1000)
#define LIST_TOKEN "r1:"

bool rbd_is_snap_id(const char *id)
{
    return id && startswith(id, RBD_SNAP_ID_PREFIX);
}

/* "rbdsnap:C:P:N:NAME" -> loc with image = NAME. */
static int snap_id_parse(const char *id, const char *field, struct rbd_loc *ret, char **ret_msg)
{
    if (!rbd_is_snap_id(id) || strlen(id) > CSI_ID_MAX) {
        *ret_msg = xasprintf("%s is not an RBD snapshot id (" RBD_SNAP_ID_PREFIX
                             "CLUSTER:POOL:NAMESPACE:NAME, at most %d bytes)", field, CSI_ID_MAX);
        return -EINVAL;
    }
    _cleanup_free_ char *vid = xasprintf(RBD_ID_PREFIX "%s", id + strlen(RBD_SNAP_ID_PREFIX));
    return rbd_id_parse(vid, field, ret, ret_msg);
}

static char *snap_id_format(const struct rbd_loc *l, const char *name)
{
    char *id = xasprintf(RBD_SNAP_ID_PREFIX "%s:%s:%s:%s", l->cluster, l->pool, l->ns, name);
    if (strlen(id) > CSI_ID_MAX) {
        free(id);
        return NULL;
    }
    return id;
}

static void loc_copy(struct rbd_loc *dst, const struct rbd_loc *src)
{
    *dst = (struct rbd_loc){xstrdup(src->cluster), xstrdup(src->pool), xstrdup(src->ns),
                            xstrdup(src->image)};
}

/* ------------------------------------------------------------ worker side */

/* 1 when img's metadata key is want, 0 when absent or other, or < 0. */
static int meta_is(rbd_image_t img, const char *key, const char *want)
{
    char val[CSI_ID_MAX + 1];
    size_t vl = sizeof(val);
    int r = rbd_metadata_get(img, key, val, &vl);
    if (r == -ENOENT || r == -ERANGE)
        return 0;
    return r < 0 ? r : streq(val, want);
}

/* Mark a new image as ours: key = name, META_SOURCE = src_id, and the other
 * mark a clone inherits from its parent's metadata removed. */
static int mark(rbd_image_t img, const char *key, const char *name, const char *src_id)
{
    const char *other = streq(key, RBD_META_KEY) ? META_SNAP : RBD_META_KEY;
    int r = rbd_metadata_remove(img, other);
    if (r < 0 && r != -ENOENT)
        return r;
    if ((r = rbd_metadata_set(img, META_SOURCE, src_id)) < 0)
        return r;
    return rbd_metadata_set(img, key, name);
}

/* The name of img's parent image ("" when none). */
static int parent_name(rbd_image_t img, char **ret)
{
    rbd_linked_image_spec_t p;
    rbd_snap_spec_t s;
    int r = rbd_get_parent(img, &p, &s);
    if (r == -ENOENT) {
        *ret = xstrdup("");
        return 0;
    }
    if (r < 0)
        return r;
    *ret = xstrdup(p.image_name);
    rbd_linked_image_spec_cleanup(&p);
    rbd_snap_spec_cleanup(&s);
    return 0;
}

/* How many ancestors img has (CHAIN_MAX when the walk stops early: a
 * parent elsewhere or unreadable counts as deep). */
static int chain_depth(rados_ioctx_t io, rbd_image_t img)
{
    rbd_image_t cur = img;
    int depth = 0;
    for (;;) {
        rbd_linked_image_spec_t p;
        rbd_snap_spec_t s;
        int r = rbd_get_parent(cur, &p, &s);
        if (cur != img)
            rbd_close(cur);
        if (r == -ENOENT)
            return depth;
        if (r < 0 || ++depth >= CHAIN_MAX)
            return CHAIN_MAX;
        r = rbd_open_by_id_read_only(io, p.image_id, &cur, NULL);
        rbd_linked_image_spec_cleanup(&p);
        rbd_snap_spec_cleanup(&s);
        if (r < 0)
            return CHAIN_MAX;
    }
}

/* Clone parent@snap into dst (format 2: the parent's snapshot needs no
 * protection and may be removed while dst needs it). */
static int clone2(rados_ioctx_t io, const char *parent, const char *snap, const char *dst)
{
    rbd_image_options_t o;
    rbd_image_options_create(&o);
    int r = rbd_image_options_set_uint64(o, RBD_IMAGE_OPTION_FEATURES, RBD_FEATURES);
    if (r == 0)
        r = rbd_image_options_set_uint64(o, RBD_IMAGE_OPTION_CLONE_FORMAT, 2);
    if (r == 0)
        r = rbd_clone3(io, parent, snap, io, dst, o);
    rbd_image_options_destroy(o);
    return r;
}

/* Clone the volume src (open) as it is now into dst, through the
 * short-lived snapshot TMP_SNAP_PREFIX dst, removed after (-EEXIST: dst
 * exists already). */
static int clone_now(rados_ioctx_t io, rbd_image_t src, const char *src_name, const char *dst,
                     char **ret_msg)
{
    _cleanup_free_ char *tmp = xasprintf(TMP_SNAP_PREFIX "%s", dst);
    int r = rbd_snap_create(src, tmp);
    if (r < 0 && r != -EEXIST) {
        *ret_msg = xasprintf("cannot snapshot image %s: %s", src_name, strerror(-r));
        return r;
    }
    if ((r = clone2(io, src_name, tmp, dst)) < 0 && r != -EEXIST)
        *ret_msg = xasprintf("cannot clone image %s into %s: %s", src_name, dst, strerror(-r));
    /* To the trash namespace while dst needs it, else gone. */
    int r2 = rbd_snap_remove(src, tmp);
    if (r == 0 && r2 < 0 && r2 != -ENOENT) {
        *ret_msg = xasprintf("cannot remove the snapshot %s of image %s: %s", tmp, src_name,
                             strerror(-r2));
        r = r2;
    }
    return r;
}

/* Take the image with this id out of the trash if nothing needs it any
 * more (no snapshots left: librbd removed its trashed ones with their last
 * clone), then its parent likewise.  Only images of ours. */
static void trash_cleanup(rados_ioctx_t io, const char *first_id)
{
    _cleanup_free_ char *id = xstrdup(first_id);
    for (int i = 0; id && i < CHAIN_MAX; i++) {
        rbd_image_t img;
        if (rbd_open_by_id_read_only(io, id, &img, NULL) < 0)
            return;
        char val[CSI_ID_MAX + 1];
        size_t vl = sizeof(val);
        bool ours = rbd_metadata_get(img, RBD_META_KEY, val, &vl) == 0 ||
                    (vl = sizeof(val), rbd_metadata_get(img, META_SNAP, val, &vl) == 0);
        rbd_linked_image_spec_t p;
        rbd_snap_spec_t s;
        char *next = NULL;
        if (rbd_get_parent(img, &p, &s) == 0) {
            if (p.trash)
                next = xstrdup(p.image_id);
            rbd_linked_image_spec_cleanup(&p);
            rbd_snap_spec_cleanup(&s);
        }
        rbd_close(img);
        if (!ours || rbd_trash_remove(io, id, false) < 0) { /* still needed */
            free(next);
            return;
        }
        free(id);
        id = next;
    }
}

int rbd_image_remove(rados_ioctx_t io, const char *name, char **ret_msg)
{
    rbd_image_t img;
    int r = rbd_open(io, name, &img, NULL);
    if (r < 0) {
        if (r != -ENOENT)
            *ret_msg = xasprintf("cannot open image %s: %s", name, strerror(-r));
        return r;
    }
    _cleanup_free_ char *parent = NULL;
    rbd_linked_image_spec_t p;
    rbd_snap_spec_t s;
    if (rbd_get_parent(img, &p, &s) == 0) {
        if (p.trash)
            parent = xstrdup(p.image_id);
        rbd_linked_image_spec_cleanup(&p);
        rbd_snap_spec_cleanup(&s);
    }
    /* Its user snapshots (a snapshot image's SNAP_NAME, a short-lived one
     * left by a crash): those clones need go to the trash namespace. */
    rbd_snap_info_t snaps[16];
    int max = ARRAY_SIZE(snaps);
    int n = rbd_snap_list(img, snaps, &max);
    if (n < 0) {
        *ret_msg = xasprintf("cannot list the snapshots of image %s: %s", name, strerror(-n));
        rbd_close(img);
        return n;
    }
    for (int i = 0; i < n && r == 0; i++) {
        rbd_snap_namespace_type_t t;
        if (rbd_snap_get_namespace_type(img, snaps[i].id, &t) == 0 &&
            t == RBD_SNAP_NAMESPACE_TYPE_USER && (r = rbd_snap_remove(img, snaps[i].name)) < 0)
            *ret_msg = xasprintf("cannot remove snapshot %s of image %s: %s", snaps[i].name, name,
                                 strerror(-r));
    }
    rbd_snap_list_end(snaps);
    rbd_close(img);
    if (r < 0)
        return r;
    r = rbd_remove(io, name);
    if (r == -ENOTEMPTY) /* snapshots in the trash namespace: clones need them */
        r = rbd_trash_move(io, name, 0);
    if (r < 0 && r != -ENOENT) {
        *ret_msg = xasprintf("cannot remove image %s: %s%s", name, strerror(-r),
                             r == -EBUSY ? " (a client opened it meanwhile)" : "");
        return r;
    }
    if (parent)
        trash_cleanup(io, parent);
    return r;
}

/* A snapshot's image (open): {size, sec, nsec, source, flatten: whether it
 * is too deep}; -EAGAIN when its snapshot is not made yet. */
static int describe(rados_ioctx_t io, rbd_image_t img, json_t **ret)
{
    uint64_t sid;
    struct timespec ts;
    rbd_image_info_t info;
    char src[CSI_ID_MAX + 1];
    size_t sl = sizeof(src);
    int r = rbd_snap_get_id(img, SNAP_NAME, &sid);
    if (r == -ENOENT)
        return -EAGAIN;
    if (r == 0)
        r = rbd_snap_get_timestamp(img, sid, &ts);
    if (r == 0)
        r = rbd_stat(img, &info, sizeof(info));
    if (r == 0)
        r = rbd_metadata_get(img, META_SOURCE, src, &sl);
    if (r < 0)
        return r;
    *ret = json_pack("{s:I, s:I, s:i, s:s, s:b}", "size", (json_int_t)info.size, "sec",
                     (json_int_t)ts.tv_sec, "nsec", (int)ts.tv_nsec, "source", src, "flatten",
                     chain_depth(io, img) > RBD_DEPTH_MAX);
    return 0;
}

/* CreateSnapshot: q->loc the source volume, q->name the snapshot. */
static int snapshot_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    const struct rbd_req *q = rbd_req_of(op);
    _cleanup_free_ char *simg = xasprintf(SNAP_IMAGE_PREFIX "%s", q->name);
    _cleanup_free_ char *src_id = rbd_id_format(&q->loc);
    struct conn k = {0};
    rbd_image_t src = NULL, img = NULL;
    uint64_t size;
    int r = conn_open(q, &k, ret_msg);
    if (r < 0)
        return r == -ENOENT ? -ENODEV : r;
    /* An image of that name first: a retry (or another source's). */
    bool fresh = (r = rbd_open(k.io, simg, &img, NULL)) == -ENOENT;
    if (r < 0 && !fresh) {
        *ret_msg = xasprintf("cannot open image %s: %s", simg, strerror(-r));
        goto out;
    }
    /* The source (gone is fine for a retry: the snapshot outlives it). */
    if ((r = rbd_open(k.io, q->loc.image, &src, NULL)) < 0) {
        src = NULL;
    } else if ((r = image_ours(src, q->loc.image, &size)) <= 0) {
        rbd_close(src);
        src = NULL;
    }
    if (!src && (fresh || (r < 0 && r != -ENOENT))) {
        *ret_msg = r < 0 && r != -ENOENT
                       ? xasprintf("source_volume_id: cannot read %s: %s", src_id, strerror(-r))
                       : xasprintf("source_volume_id: volume %s does not exist", src_id);
        r = r < 0 && r != -ENOENT ? r : -ENODEV;
        goto out;
    }
    if (fresh) {
        if ((r = clone_now(k.io, src, q->loc.image, simg, ret_msg)) < 0 && r != -EEXIST)
            goto out;
        if ((r = rbd_open(k.io, simg, &img, NULL)) < 0) {
            *ret_msg = xasprintf("cannot open image %s: %s", simg, strerror(-r));
            img = NULL;
            goto out;
        }
    }
    /* Ours (marked, or cloned from this source and not marked yet by a
     * crashed attempt), from this source? */
    if ((r = meta_is(img, META_SNAP, q->name)) == 0) {
        _cleanup_free_ char *pn = NULL;
        if ((r = parent_name(img, &pn)) == 0 && streq(pn, q->loc.image) && src)
            r = mark(img, META_SNAP, q->name, src_id);
        else if (r == 0) {
            *ret_msg = xasprintf("name: an image %s exists in pool %s and is not snapshot %s of "
                                 "this plugin", simg, q->loc.pool, q->name);
            r = -EEXIST;
        }
    } else if (r > 0 && (r = meta_is(img, META_SOURCE, src_id)) == 0) {
        *ret_msg = xasprintf("name: snapshot %s exists with another source volume", q->name);
        r = -EEXIST;
    } else if (r > 0) {
        r = 0;
    }
    if (r < 0)
        goto out;
    if (src) { /* left by a crash between clone and removal */
        _cleanup_free_ char *tmp = xasprintf(TMP_SNAP_PREFIX "%s", simg);
        rbd_snap_remove(src, tmp);
    }
    bool exists = false;
    if ((r = rbd_snap_exists(img, SNAP_NAME, &exists)) == 0 && !exists)
        r = rbd_snap_create(img, SNAP_NAME);
    if (r < 0) {
        *ret_msg = xasprintf("cannot snapshot image %s: %s", simg, strerror(-r));
        goto out;
    }
    if ((r = describe(k.io, img, ret_result)) < 0) {
        *ret_msg = xasprintf("cannot read snapshot %s: %s", simg, strerror(-r));
        goto out;
    }
out:
    if (img)
        rbd_close(img);
    if (src)
        rbd_close(src);
    conn_close(&k);
    return r;
}

/* CreateVolume from a source: q->loc the new volume, q->src the source. */
static int clone_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    const struct rbd_req *q = rbd_req_of(op);
    const char *name = q->loc.image;
    _cleanup_free_ char *src_id = q->src_snap ? snap_id_format(&q->src, q->src.image)
                                              : rbd_id_format(&q->src);
    _cleanup_free_ char *parent = q->src_snap ? xasprintf(SNAP_IMAGE_PREFIX "%s", q->src.image)
                                              : xstrdup(q->src.image);
    const char *field = q->src_snap ? "volume_content_source.snapshot.snapshot_id"
                                    : "volume_content_source.volume.volume_id";
    struct conn k = {0};
    rbd_image_t img = NULL, src = NULL;
    uint64_t size = 0, src_size = 0;
    int r = conn_open(q, &k, ret_msg);
    if (r < 0)
        return r == -ENOENT ? -EINVAL : r;
    bool fresh = (r = rbd_open(k.io, name, &img, NULL)) == -ENOENT;
    if (r < 0 && !fresh) {
        *ret_msg = xasprintf("cannot open image %s: %s", name, strerror(-r));
        goto out;
    }
    /* The source: a volume of ours, or a snapshot's image with its snapshot. */
    if ((r = rbd_open(k.io, parent, &src, NULL)) < 0) {
        src = NULL;
    } else {
        bool snapped = false;
        rbd_image_info_t info;
        r = q->src_snap ? meta_is(src, META_SNAP, q->src.image) : image_ours(src, parent, &size);
        if (r > 0 && q->src_snap && (r = rbd_snap_exists(src, SNAP_NAME, &snapped)) == 0)
            r = snapped;
        if (r > 0 && (r = rbd_stat(src, &info, sizeof(info))) == 0) {
            src_size = info.size;
            r = 1;
        }
        if (r <= 0) {
            rbd_close(src);
            src = NULL;
        }
    }
    if (!src && (fresh || (r < 0 && r != -ENOENT))) {
        *ret_msg = r < 0 && r != -ENOENT
                       ? xasprintf("%s: cannot read %s: %s", field, src_id, strerror(-r))
                       : xasprintf("%s: %s %s does not exist", field,
                                   q->src_snap ? "snapshot" : "volume", src_id);
        r = r < 0 && r != -ENOENT ? r : -ENODEV;
        goto out;
    }
    if (fresh) {
        if (q->limit > 0 && src_size > (uint64_t)q->limit) {
            *ret_msg = xasprintf("capacity_range: limit_bytes %" PRId64 " is below the size of "
                                 "the source %s (%" PRIu64 " bytes)", q->limit, src_id, src_size);
            r = -ERANGE;
            goto out;
        }
        r = q->src_snap ? clone2(k.io, parent, SNAP_NAME, name)
                        : clone_now(k.io, src, parent, name, ret_msg);
        if (r < 0 && r != -EEXIST) {
            if (!*ret_msg)
                *ret_msg = xasprintf("cannot clone %s into image %s: %s", parent, name,
                                     strerror(-r));
            goto out;
        }
        if ((r = rbd_open(k.io, name, &img, NULL)) < 0) {
            *ret_msg = xasprintf("cannot open image %s: %s", name, strerror(-r));
            img = NULL;
            goto out;
        }
    }
    /* Ours from this source (or cloned from it by a crashed attempt)? */
    if ((r = meta_is(img, RBD_META_KEY, name)) > 0)
        r = meta_is(img, META_SOURCE, src_id) > 0 ? 0 : -EEXIST;
    else if (r == 0) {
        _cleanup_free_ char *pn = NULL;
        r = parent_name(img, &pn) == 0 && streq(pn, parent) && src ? mark(img, RBD_META_KEY, name,
                                                                          src_id)
                                                                   : -EEXIST;
    }
    if (r == -EEXIST)
        *ret_msg = xasprintf("name: an image %s exists in pool %s and is not a volume of this "
                             "plugin made from %s", name, q->loc.pool, src_id);
    else if (r < 0)
        *ret_msg = xasprintf("cannot mark image %s as a volume: %s", name, strerror(-r));
    /* A clone inherits its source's metadata: the limits are the request's
     * (rbd_qos.c), none when it has none. */
    if (r == 0)
        r = rbd_qos_write(img, q->mparams, ret_msg);
    rbd_image_info_t info;
    if (r == 0 && (r = rbd_stat(img, &info, sizeof(info))) < 0)
        *ret_msg = xasprintf("cannot read image %s: %s", name, strerror(-r));
    if (r < 0)
        goto out;
    size = info.size;
    if (size < (uint64_t)q->required) {
        if (!fresh) { /* a retry asks what the first request did */
            *ret_msg = xasprintf("volume %s exists with a different capacity (%" PRIu64
                                 " bytes)", name, size);
            r = -EEXIST;
            goto out;
        }
        if ((r = rbd_resize(img, (uint64_t)q->required)) < 0) {
            *ret_msg = xasprintf("cannot grow image %s: %s", name, strerror(-r));
            goto out;
        }
        size = (uint64_t)q->required;
    } else if (!fresh && q->limit > 0 && size > (uint64_t)q->limit) {
        *ret_msg = xasprintf("volume %s exists with a different capacity (%" PRIu64 " bytes)",
                             name, size);
        r = -EEXIST;
        goto out;
    }
    *ret_result = json_pack("{s:I, s:b}", "size", (json_int_t)size, "flatten",
                            chain_depth(k.io, img) > RBD_DEPTH_MAX);
out:
    if (img)
        rbd_close(img);
    if (src)
        rbd_close(src);
    if (r < 0 && fresh && r != -EEXIST && img) { /* made here, unusable: undone */
        _cleanup_free_ char *m = NULL;
        rbd_image_remove(k.io, name, &m);
    }
    conn_close(&k);
    return r;
}

/* Flatten q->loc.image (no ancestors after), then let its former parent
 * leave the trash if it was the last that needed it. */
static int flatten_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    const struct rbd_req *q = rbd_req_of(op);
    (void)ret_result;
    struct conn k = {0};
    rbd_image_t img;
    int r = conn_open(q, &k, ret_msg);
    if (r < 0)
        return r;
    if ((r = rbd_open(k.io, q->loc.image, &img, NULL)) < 0) {
        *ret_msg = xasprintf("cannot open image %s: %s", q->loc.image, strerror(-r));
        conn_close(&k);
        return r;
    }
    _cleanup_free_ char *parent = NULL;
    rbd_linked_image_spec_t p;
    rbd_snap_spec_t s;
    if (rbd_get_parent(img, &p, &s) == 0) {
        parent = xstrdup(p.image_id);
        rbd_linked_image_spec_cleanup(&p);
        rbd_snap_spec_cleanup(&s);
    }
    if (parent && (r = rbd_flatten(img)) < 0)
        *ret_msg = xasprintf("cannot flatten image %s: %s", q->loc.image, strerror(-r));
    rbd_close(img);
    if (r == 0 && parent)
        trash_cleanup(k.io, parent);
    conn_close(&k);
    return r;
}

/* DeleteSnapshot: q->loc.image the snapshot's name. */
static int delete_snapshot_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    const struct rbd_req *q = rbd_req_of(op);
    (void)ret_result;
    _cleanup_free_ char *simg = xasprintf(SNAP_IMAGE_PREFIX "%s", q->loc.image);
    struct conn k = {0};
    rbd_image_t img;
    int r = conn_open(q, &k, ret_msg);
    if (r == -ENOENT) { /* no such pool: no such snapshot */
        free(*ret_msg);
        *ret_msg = NULL;
        return 0;
    }
    if (r < 0)
        return r;
    if ((r = rbd_open(k.io, simg, &img, NULL)) == 0) {
        if ((r = meta_is(img, META_SNAP, q->loc.image)) == 0) {
            *ret_msg = xasprintf("image %s in pool %s is not a snapshot of this plugin: not "
                                 "deleted", simg, q->loc.pool);
            r = -EBUSY;
        }
        rbd_close(img);
        if (r > 0)
            r = rbd_image_remove(k.io, simg, ret_msg);
    }
    conn_close(&k);
    return r == -ENOENT ? 0 : r;
}

/* ListSnapshots: one snapshot (q->name set) or those of volume q->loc. */
static int list_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    const struct rbd_req *q = rbd_req_of(op);
    _cleanup_free_ char *src_id = q->name ? NULL : rbd_id_format(&q->loc);
    struct conn k = {0};
    int r = conn_open(q, &k, ret_msg);
    if (r == -ENOENT) { /* no such pool: nothing */
        free(*ret_msg);
        *ret_msg = NULL;
        *ret_result = json_array();
        return 0;
    }
    if (r < 0)
        return r;
    size_t n = 64;
    _cleanup_free_ rbd_image_spec_t *specs = xcalloc(n, sizeof(*specs));
    _cleanup_free_ char *one = q->name ? xasprintf(SNAP_IMAGE_PREFIX "%s", q->name) : NULL;
    /* -ERANGE: n says how many there are (twice at most: new images meanwhile) */
    for (int i = 0; !one && i < 3 && (r = rbd_list2(k.io, specs, &n)) == -ERANGE; i++) {
        free(specs);
        specs = xcalloc(n, sizeof(*specs));
    }
    if (!one && r < 0) {
        *ret_msg = xasprintf("cannot list the images of pool %s: %s", q->loc.pool, strerror(-r));
        conn_close(&k);
        return r;
    }
    json_t *out = json_array();
    for (size_t i = 0; i < (one ? 1 : n); i++) {
        const char *iname = one ? one : specs[i].name;
        rbd_image_t img;
        json_t *d = NULL;
        if (!startswith(iname, SNAP_IMAGE_PREFIX) ||
            rbd_open_read_only(k.io, iname, &img, NULL) < 0)
            continue;
        const char *sname = iname + strlen(SNAP_IMAGE_PREFIX);
        if (meta_is(img, META_SNAP, sname) > 0 &&
            (one || meta_is(img, META_SOURCE, src_id) > 0) && describe(k.io, img, &d) == 0) {
            json_object_set_new(d, "name", json_string(sname));
            json_array_append_new(out, d);
        }
        rbd_close(img);
    }
    if (!one)
        rbd_image_spec_list_cleanup(specs, n);
    conn_close(&k);
    *ret_result = out;
    return 0;
}

/* -------------------------------------------------------------- loop side */

/* Fail the call of op with the worker's error and end op; false when
 * status is success. */
static bool failed(struct op *op, int status, const char *msg)
{
    op->worker = NULL;
    if (status >= 0)
        return false;
    grpc_call_fail(op->call, rbd_code(status), "%s", msg ? msg : strerror(-status));
    op_end(op);
    return true;
}

static void flatten_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    (void)result;
    op->worker = NULL;
    _cleanup_free_ char *id = rbd_id_format(&rbd_req_of(op)->loc);
    if (status < 0)
        log_warn("rbd", "flatten failed", "image=%s error=\"%s\"", id,
                 msg ? msg : strerror(-status));
    else
        log_info("rbd", "flattened", "image=%s", id);
    op_end(op);
}

/* Whether a flatten of image (in l's pool and namespace) runs. */
static bool flatten_running(struct csi *c, const struct rbd_loc *l, const char *image)
{
    for (struct op *o = c->ops; o; o = o->next) {
        const struct rbd_req *q = rbd_req_of(o);
        if (!o->call && q && streq(q->loc.cluster, l->cluster) && streq(q->loc.pool, l->pool) &&
            streq(q->loc.ns, l->ns) && streq(q->loc.image, image))
            return true;
    }
    return false;
}

/* Flatten image of q's pool in the background, unless that runs already:
 * an operation without a call, cancelled (its worker killed) when the
 * plugin stops. */
static void flatten_start(struct csi *c, const struct rbd_req *from, const char *image)
{
    if (flatten_running(c, &from->loc, image))
        return;
    struct rbd_req *q = xcalloc(1, sizeof(*q));
    loc_copy(&q->loc, &from->loc);
    free(q->loc.image);
    q->loc.image = xstrdup(image);
    q->cred = (struct rbd_cred){xstrdup(from->cred.user), xstrdup(from->cred.key)};
    q->clusters = from->clusters;
    struct op *op = op_begin(c, NULL);
    op_set_ctx(op, &rbd_req_ctx, q);
    _cleanup_free_ char *id = rbd_id_format(&q->loc);
    log_info("rbd", "flattening", "image=%s depth_max=%d", id, RBD_DEPTH_MAX);
    int r = worker_start(c->loop, flatten_fn, op, FLATTEN_MS, flatten_done, op, &op->worker);
    if (r < 0) {
        log_warn("rbd", "cannot start a flatten", "image=%s error=\"%s\"", id, strerror(-r));
        op_end(op);
    }
}

static void clone_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    const struct rbd_req *q = rbd_req_of(op);
    if (status == 0 && json_is_true(json_object_get(result, "flatten"))) {
        flatten_start(op->csi, q, q->loc.image);
        grpc_call_fail(op->call, GRPC_ABORTED, "volume %s is being flattened (a clone chain "
                       "deeper than %d); retry", q->loc.image, RBD_DEPTH_MAX);
        op_end(op);
        return;
    }
    rbd_create_done(status, msg, result, op);
}

bool rbd_clone_check(const Csi__V1__VolumeContentSource *cs, struct rbd_req *q,
                     struct verdict *v)
{
    const char *id = NULL, *field = NULL;
    _cleanup_free_ char *msg = NULL;
    int r = -EINVAL;
    if (cs->type_case == CSI__V1__VOLUME_CONTENT_SOURCE__TYPE_SNAPSHOT && cs->snapshot) {
        id = cs->snapshot->snapshot_id;
        field = "volume_content_source.snapshot.snapshot_id";
        q->src_snap = true;
        if (rbd_is_snap_id(id))
            r = snap_id_parse(id, field, &q->src, &msg);
        else
            msg = xasprintf("%s: %s is not an RBD snapshot: backend rbd restores RBD snapshots "
                            "only (a local volume's snapshot cannot become an RBD volume)",
                            field, id ? id : "");
    } else if (cs->type_case == CSI__V1__VOLUME_CONTENT_SOURCE__TYPE_VOLUME && cs->volume) {
        id = cs->volume->volume_id;
        field = "volume_content_source.volume.volume_id";
        if (rbd_is_id(id))
            r = rbd_id_parse(id, field, &q->src, &msg);
        else
            msg = xasprintf("%s: %s is not an RBD volume: backend rbd clones RBD volumes only",
                            field, id ? id : "");
    } else {
        msg = xstrdup("volume_content_source has no type");
    }
    /* A clone lives with its parent (one connection, one set of caps). */
    if (r == 0 && (!streq(q->src.cluster, q->loc.cluster) || !streq(q->src.pool, q->loc.pool) ||
                   !streq(q->src.ns, q->loc.ns))) {
        msg = xasprintf("%s: the source is in cluster %s pool %s namespace '%s'; the parameters "
                        "clusterID, pool, radosNamespace must name the same place", field,
                        q->src.cluster, q->src.pool, q->src.ns);
        r = -EINVAL;
    }
    if (r < 0)
        return verdict_fail(v, GRPC_INVALID_ARGUMENT, "%s", msg);
    return true;
}

void rbd_clone_volume(struct csi *c, struct grpc_call *call, Csi__V1__CreateVolumeRequest *in,
                      struct rbd_req *q)
{
    if (flatten_running(c, &q->loc, q->loc.image)) {
        grpc_call_fail(call, GRPC_ABORTED, "volume %s is being flattened; retry", in->name);
        rbd_req_free(q);
        return;
    }
    rbd_start(c, call, q, 0, clone_fn, clone_done);
}

static void snapshot_msg(const struct rbd_loc *l, json_t *d, Csi__V1__Snapshot *s,
                         Google__Protobuf__Timestamp *ts, char **id)
{
    json_int_t size = 0, sec = 0;
    int nsec = 0;
    const char *src = NULL, *name = NULL;
    json_unpack(d, "{s:I, s:I, s:i, s:s, s?s}", "size", &size, "sec", &sec, "nsec", &nsec,
                "source", &src, "name", &name);
    *id = snap_id_format(l, name ? name : l->image);
    *ts = (Google__Protobuf__Timestamp)GOOGLE__PROTOBUF__TIMESTAMP__INIT;
    ts->seconds = sec;
    ts->nanos = nsec;
    *s = (Csi__V1__Snapshot)CSI__V1__SNAPSHOT__INIT;
    s->snapshot_id = *id;
    s->source_volume_id = (char *)src;
    s->size_bytes = size;
    s->creation_time = ts;
    /* An RBD snapshot is complete when made; one of a deep chain is ready
     * once its image is flattened. */
    s->ready_to_use = !json_is_true(json_object_get(d, "flatten"));
}

static void snapshot_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    struct rbd_req *q = rbd_req_of(op);
    if (failed(op, status, msg))
        return;
    struct rbd_loc l = q->loc; /* the snapshot's place: its source's */
    l.image = q->name;
    Csi__V1__Snapshot s;
    Google__Protobuf__Timestamp ts;
    _cleanup_free_ char *id = NULL;
    snapshot_msg(&l, result, &s, &ts, &id);
    log_info("rbd", "snapshot created", "snapshot=%s volume=%s size=%" PRId64 " ready=%s", id,
             s.source_volume_id, s.size_bytes, s.ready_to_use ? "true" : "false");
    Csi__V1__CreateSnapshotResponse out = CSI__V1__CREATE_SNAPSHOT_RESPONSE__INIT;
    out.snapshot = &s;
    grpc_call_reply_pb(op->call, &out.base);
    if (json_is_true(json_object_get(result, "flatten"))) {
        _cleanup_free_ char *simg = xasprintf(SNAP_IMAGE_PREFIX "%s", q->name);
        flatten_start(op->csi, q, simg);
    }
    op_end(op);
}

/* A plan's refusal with msg (INVALID_ARGUMENT), or PLAN_ACT. */
static void plan_done(struct rbd_plan *pl, int r, const char *msg)
{
    if (r < 0)
        verdict_fail(&pl->refusal, GRPC_INVALID_ARGUMENT, "%s", msg);
    else
        pl->kind = PLAN_ACT;
}

void rbd_snapshot_plan(Csi__V1__CreateSnapshotRequest *in, struct rbd_plan *pl)
{
    *pl = (struct rbd_plan){.kind = PLAN_REFUSE};
    const char *why;
    if (!in->name || !*in->name || name_validate(in->name, &why) < 0 || strchr(in->name, '_')) {
        verdict_fail(&pl->refusal, GRPC_INVALID_ARGUMENT,
                     "name %s (an RBD snapshot's name: 1-128 bytes of [A-Za-z0-9.-])",
                     !in->name || !*in->name ? "is missing"
                     : strchr(in->name, '_') ? "must not contain '_'" : why);
        return;
    }
    struct rbd_req *q = pl->q = xcalloc(1, sizeof(*q));
    _cleanup_free_ char *msg = NULL, *sid = NULL;
    int r = rbd_id_parse(in->source_volume_id, "source_volume_id", &q->loc, &msg);
    if (r == 0 && !(sid = snap_id_format(&q->loc, in->name))) {
        msg = xasprintf("name: the snapshot id " RBD_SNAP_ID_PREFIX "%s:%s:%s:%s would pass %d "
                        "bytes; use a shorter name", q->loc.cluster, q->loc.pool, q->loc.ns,
                        in->name, CSI_ID_MAX);
        r = -EINVAL;
    }
    if (r == 0)
        r = RBD_CRED_OF(in, "snapshotter", &q->cred, &msg);
    q->name = xstrdup(in->name);
    plan_done(pl, r, msg);
}

/* (controller.c checked the parameters: none but the CO's.) */
void rbd_create_snapshot(struct csi *c, struct grpc_call *call, Csi__V1__CreateSnapshotRequest *in)
{
    struct rbd_plan pl;
    rbd_snapshot_plan(in, &pl);
    rbd_plan_run(c, call, &pl, 0, snapshot_fn, snapshot_done);
}

static void delete_snapshot_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    (void)result;
    if (failed(op, status, msg))
        return;
    const struct rbd_req *q = rbd_req_of(op);
    _cleanup_free_ char *id = snap_id_format(&q->loc, q->loc.image);
    log_info("rbd", "snapshot deleted", "snapshot=%s", id);
    Csi__V1__DeleteSnapshotResponse out = CSI__V1__DELETE_SNAPSHOT_RESPONSE__INIT;
    grpc_call_reply_pb(op->call, &out.base);
    op_end(op);
}

void rbd_delete_snapshot_plan(Csi__V1__DeleteSnapshotRequest *in, struct rbd_plan *pl)
{
    *pl = (struct rbd_plan){.kind = PLAN_REFUSE};
    struct rbd_req *q = pl->q = xcalloc(1, sizeof(*q));
    _cleanup_free_ char *msg = NULL;
    int r = snap_id_parse(in->snapshot_id, "snapshot_id", &q->loc, &msg);
    if (r == 0)
        r = RBD_CRED_OF(in, "snapshotter", &q->cred, &msg);
    plan_done(pl, r, msg);
}

void rbd_delete_snapshot(struct csi *c, struct grpc_call *call, Csi__V1__DeleteSnapshotRequest *in)
{
    struct rbd_plan pl;
    rbd_delete_snapshot_plan(in, &pl);
    rbd_plan_run(c, call, &pl, 0, delete_snapshot_fn, delete_snapshot_done);
}

static void list_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    struct rbd_req *q = rbd_req_of(op);
    if (failed(op, status, msg))
        return;
    /* Sorted by name; the page after q->path (a token's name), at most
     * q->limit entries (0: all). */
    size_t cap = json_array_size(result), n = 0, i;
    Csi__V1__Snapshot *snaps = xcalloc(cap + 1, sizeof(*snaps));
    Google__Protobuf__Timestamp *ts = xcalloc(cap + 1, sizeof(*ts));
    char **ids = xcalloc(cap + 1, sizeof(*ids));
    Csi__V1__ListSnapshotsResponse__Entry *ents = xcalloc(cap + 1, sizeof(*ents));
    Csi__V1__ListSnapshotsResponse__Entry **list = xcalloc(cap + 1, sizeof(*list));
    _cleanup_free_ char *next = NULL;
    json_t *d, **sorted = xcalloc(cap + 1, sizeof(*sorted));
    json_array_foreach(result, i, d)
    {
        size_t k = i;
        while (k > 0 && strcmp(json_string_value(json_object_get(sorted[k - 1], "name")),
                               json_string_value(json_object_get(d, "name"))) > 0) {
            sorted[k] = sorted[k - 1];
            k--;
        }
        sorted[k] = d;
    }
    const char *last = NULL;
    for (i = 0; i < cap; i++) {
        const char *name = json_string_value(json_object_get(sorted[i], "name"));
        if (q->path && strcmp(name, q->path) <= 0)
            continue;
        if (q->limit > 0 && n == (size_t)q->limit) {
            next = xasprintf(LIST_TOKEN "%s", last);
            break;
        }
        snapshot_msg(&q->loc, sorted[i], &snaps[n], &ts[n], &ids[n]);
        ents[n] = (Csi__V1__ListSnapshotsResponse__Entry)CSI__V1__LIST_SNAPSHOTS_RESPONSE__ENTRY__INIT;
        ents[n].snapshot = &snaps[n];
        list[n] = &ents[n];
        last = name;
        n++;
    }
    Csi__V1__ListSnapshotsResponse out = CSI__V1__LIST_SNAPSHOTS_RESPONSE__INIT;
    out.n_entries = n;
    out.entries = list;
    out.next_token = next ? next : (char *)"";
    grpc_call_reply_pb(op->call, &out.base);
    for (i = 0; i < n; i++)
        free(ids[i]);
    free(sorted);
    free(list);
    free(ents);
    free(ids);
    free(ts);
    free(snaps);
    op_end(op);
}

void rbd_list_plan(Csi__V1__ListSnapshotsRequest *in, struct rbd_plan *pl)
{
    *pl = (struct rbd_plan){.kind = PLAN_REFUSE};
    const char *after;
    if (!list_start_check(&pl->refusal, in->max_entries, in->starting_token, LIST_TOKEN, &after))
        return;
    struct rbd_req *q = pl->q = xcalloc(1, sizeof(*q));
    _cleanup_free_ char *msg = NULL;
    int r;
    if (in->snapshot_id && *in->snapshot_id) {
        r = snap_id_parse(in->snapshot_id, "snapshot_id", &q->loc, &msg);
        if (r == 0)
            q->name = xstrdup(q->loc.image);
    } else {
        r = rbd_id_parse(in->source_volume_id, "source_volume_id", &q->loc, &msg);
    }
    if (r == 0)
        r = RBD_CRED_OF(in, "snapshotter-list", &q->cred, &msg);
    q->limit = in->max_entries;
    q->path = after ? xstrdup(after) : NULL;
    plan_done(pl, r, msg);
}

void rbd_list_snapshots(struct csi *c, struct grpc_call *call, Csi__V1__ListSnapshotsRequest *in)
{
    struct rbd_plan pl;
    rbd_list_plan(in, &pl);
    rbd_plan_run(c, call, &pl, 0, list_fn, list_done);
}
