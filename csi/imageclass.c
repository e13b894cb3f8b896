/* imageclass.c: CreateVolume of an image class.  See imageclass.h. */
#include "imageclass.h"
#include "capacity.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"
#include "qsd/qemu/imagebase.h"
#include "qsd/qemu/thin.h"
#include "op.h"

#define FETCH_ATTEMPTS 3u
/* after the download (--image-timeout): sha256sum, conversion and overlay */
#define AFTER_FETCH_MS (45ull * 60 * 1000)

static worker_done g_done; /* the controller's completion */

static struct op *lead_of(struct csi *c, const char *sha)
{
    for (struct op *o = c->ops; o; o = o->next)
        if (o->image && o->image_lead && streq(o->image, sha))
            return o;
    return NULL;
}

/* Worker: the overlay, after downloading the base if op leads and the pool
 * has none.  result: {"size", "fetched", "fetch_failed"}. */
static int image_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    struct csi *c = op->csi;
    const char *vol = op->vol->id;
    bool fetched = false;
    int r = imagebase_create_volume(&c->pool, vol, op->image, op->size, ret_msg);
    if (r == -ENOLINK && op->image_lead) {
        free(*ret_msg);
        *ret_msg = NULL;
        struct imagebase_fetch f = {
            .url = json_string_value(json_object_get(op->vol->parameters, "image")),
            .sha256 = op->image,
            .max_bytes = c->cfg->image_max_bytes,
            .timeout_ms = c->cfg->image_timeout_ms,
            .attempts = FETCH_ATTEMPTS,
            .keep_free = capacity_reserved_bytes(c), /* --capacity-reserve */
            .allow = c->cfg->image_allow,
            .n_allow = c->cfg->n_image_allow,
        };
        if ((r = imagebase_fetch(&c->pool, &f, ret_msg)) < 0) {
            char *m = *ret_msg;
            *ret_msg = xasprintf("parameter %s: %s", r == -EBADMSG ? "imageSha256" : "image", m);
            free(m);
            *ret_result = json_pack("{s:b}", "fetch_failed", 1);
            return r;
        }
        fetched = true;
        r = imagebase_create_volume(&c->pool, vol, op->image, op->size, ret_msg);
    }
    if (r == -ERANGE) {
        char *m = *ret_msg;
        *ret_msg = xasprintf("capacity_range: %s (parameter image)", m);
        free(m);
    }
    if (r < 0)
        return r == -EEXIST ? -EIO : r; /* EEXIST was checked before: a race */
    _cleanup_free_ char *path = NULL;
    uint64_t size = 0;
    if ((r = pool_find_volume(&c->pool, vol, &path, NULL)) < 0 ||
        (r = image_header(path, NULL, &size, ret_msg)) < 0)
        return r;
    *ret_result = json_pack("{s:I, s:b}", "size", (json_int_t)size, "fetched", fetched);
    return 0;
}

static void image_done(int status, const char *msg, json_t *result, void *opaque);

static void start(struct op *op)
{
    struct csi *c = op->csi;
    struct vol *v = op->vol;
    if (op_worker(op, image_fn, c->cfg->image_timeout_ms + AFTER_FETCH_MS, image_done) < 0)
        store_remove_vol(c->store, v); /* op_worker failed the call and ended op */
}

void imageclass_create(struct op *op, const char *sha256, worker_done done)
{
    g_done = done;
    if (!op->image)
        op->image = xstrdup(sha256);
    op->image_lead = !lead_of(op->csi, sha256);
    if (!op->image_lead) {
        log_info("controller", "waiting for the image download of another volume",
                 "volume=%s sha256=%s", op->vol->id, sha256);
        return;
    }
    start(op);
}

static void image_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    struct csi *c = op->csi;
    op->worker = NULL;
    if (status == -ENOLINK) {
        /* A waiter found no base (the lead failed before downloading): it
         * leads now, or waits for the one that does. */
        op->image_lead = false;
        imageclass_create(op, op->image, g_done);
        return;
    }
    if (op->image_lead) {
        op->image_lead = false;
        bool fetch_failed = json_is_true(json_object_get(result, "fetch_failed"));
        if (json_is_true(json_object_get(result, "fetched")))
            log_info("controller", "image downloaded", "volume=%s sha256=%s", op->vol->id,
                     op->image);
        /* The waiters: one error for all, or their overlays in parallel
         * (the first becomes the lead, should the base be missing). */
        struct op *next;
        for (struct op *o = c->ops; o; o = next) {
            next = o->next;
            if (o == op || o->worker || !o->image || !streq(o->image, op->image))
                continue;
            if (fetch_failed) {
                g_done(status, msg, NULL, o);
            } else {
                o->image_lead = !lead_of(c, o->image);
                start(o);
            }
        }
    }
    g_done(status, msg, result, op);
}

bool imageclass_code(int status, enum grpc_code *ret)
{
    switch (status) {
    case -EBADMSG:     /* checksum */
    case -EMEDIUMTYPE: /* content refused, or qemu-img cannot convert it */
    case -EACCES:      /* the server refuses (4xx), TLS verification */
    case -EFBIG:       /* above --image-max-size */
    case -EINVAL:      /* a URL curl refuses */
        *ret = GRPC_FAILED_PRECONDITION;
        return true;
    case -EADDRNOTAVAIL: /* the URL or a redirect leads to a refused address */
        *ret = GRPC_INVALID_ARGUMENT;
        return true;
    case -EBUSY:       /* another download of the image runs */
        *ret = GRPC_ABORTED;
        return true;
    default:
        return false;
    }
}
