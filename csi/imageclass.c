/* SPDX-License-Identifier: Apache-2.0 */
/* imageclass.c: CreateVolume of an image class.  See imageclass.h. */
#include "imageclass.h"
#include "capacity.h"
#include "imagememo.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"
#include "qsd/qemu/imagebase.h"
#include "qsd/qemu/thin.h"
#include "op.h"

#include <inttypes.h>

#define FETCH_ATTEMPTS 3u
/* after the download (--image-timeout): the checksum, conversion and overlay */
#define AFTER_FETCH_MS (45ull * 60 * 1000)

static worker_done g_done; /* the controller's completion */

static void create_ctx_free(void *p)
{
    struct create_ctx *x = p;
    free(x->image);
    free(x->image_refusal);
    free(x);
}

const struct op_ctx_type create_ctx_type = {"CreateVolume", create_ctx_free};

static struct create_ctx *ctx_of(const struct op *op)
{
    return op_ctx(op, &create_ctx_type);
}

static struct op *lead_of(struct csi *c, const char *sha)
{
    for (struct op *o = c->ops; o; o = o->next) {
        const struct create_ctx *x = ctx_of(o);
        if (x && x->image && x->image_lead && streq(x->image, sha))
            return o;
    }
    return NULL;
}

static const char *image_url(const struct op *op)
{
    return json_string_value(json_object_get(op->vol->parameters, "image"));
}

/* The StorageClass parameter that names the digest. */
static const char *digest_param(const char *digest)
{
    return streq(imagebase_digest_algo(digest), "sha512") ? "imageSha512" : "imageSha256";
}

/* Worker: the overlay, after downloading the base if op leads and the pool
 * has none.  result: {"size", "fetched", "fetch_failed", "got" (the
 * content's digest when it was not the class's)}. */
static int image_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    struct create_ctx *x = ctx_of(op);
    struct csi *c = op->csi;
    const char *vol = op->vol->id;
    bool fetched = false;
    int r = imagebase_create_volume(&c->pool, vol, x->image, x->size, ret_msg);
    if (r == -ENOLINK && x->image_lead && x->image_refusal) {
        /* no base, and this download failed its checksum a moment ago */
        free(*ret_msg);
        *ret_msg = xstrdup(x->image_refusal);
        *ret_result = json_pack("{s:b}", "fetch_failed", 1); /* the waiters too */
        return -EBADMSG;
    }
    if (r == -ENOLINK && x->image_lead) {
        free(*ret_msg);
        *ret_msg = NULL;
        char got[IMAGEBASE_DIGEST_MAX + 1] = "";
        struct imagebase_fetch f = {
            .url = image_url(op),
            .digest = x->image,
            .max_bytes = c->cfg->image_max_bytes,
            .timeout_ms = c->cfg->image_timeout_ms,
            .attempts = FETCH_ATTEMPTS,
            .keep_free = capacity_reserved_bytes(c), /* --capacity-reserve */
            .allow = c->cfg->image_allow,
            .n_allow = c->cfg->n_image_allow,
            .ret_got = got,
        };
        if ((r = imagebase_fetch(&c->pool, &f, ret_msg)) < 0) {
            char *m = *ret_msg;
            *ret_msg = xasprintf("parameter %s: %s", r == -EBADMSG ? digest_param(x->image)
                                                                   : "image", m);
            free(m);
            *ret_result = json_pack("{s:b, s:s}", "fetch_failed", 1, "got", got);
            return r;
        }
        fetched = true;
        r = imagebase_create_volume(&c->pool, vol, x->image, x->size, ret_msg);
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

/* A checksum refusal of this image remembered (imagememo.h): its error,
 * with the time left, in the context's image_refusal; the worker gives it instead of
 * downloading when the pool has no base (another class may have brought
 * the right content under that digest meanwhile: then the volume is made). */
static void note_refusal(struct op *op)
{
    struct csi *c = op->csi;
    struct create_ctx *x = ctx_of(op);
    const char *url = image_url(op), *got;
    uint64_t left_ms;
    free(x->image_refusal);
    x->image_refusal = NULL;
    if (!url || !imagememo_find(c->image_refusals, url, x->image, now_ms(), &got, &left_ms))
        return;
    _cleanup_free_ char *shown = imagebase_url_redact(url);
    /* as the download's error: the expected digest only, the content's in
     * the log (imagebase.c check_sha) */
    x->image_refusal = xasprintf(
        "parameter %s: the content at %s does not have %s %s (its own is in the node plugin's "
        "log: msg=\"checksum mismatch\"); found %" PRIu64 " s ago, not downloaded again for "
        "%" PRIu64 " s", digest_param(x->image), shown, imagebase_digest_algo(x->image),
        x->image, (uint64_t)((IMAGEMEMO_TTL_MS - left_ms) / 1000), (left_ms + 999) / 1000);
    log_info("controller", "checksum refusal remembered: no download unless the pool has the base",
             "volume=%s url=%s expected=%s got=%s left_s=%" PRIu64, op->vol->id, shown,
             x->image, got, (left_ms + 999) / 1000);
}

void imageclass_create(struct op *op, const char *digest, worker_done done)
{
    g_done = done;
    struct create_ctx *x = ctx_of(op);
    if (!x->image)
        x->image = xstrdup(digest);
    x->image_lead = !lead_of(op->csi, digest);
    if (!x->image_lead) {
        log_info("controller", "waiting for the image download of another volume",
                 "volume=%s digest=%s", op->vol->id, digest);
        return;
    }
    note_refusal(op);
    start(op);
}

static void image_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    struct csi *c = op->csi;
    struct create_ctx *x = ctx_of(op);
    op->worker = NULL;
    if (status == -ENOLINK) {
        /* A waiter found no base (the lead failed before downloading): it
         * leads now, or waits for the one that does. */
        x->image_lead = false;
        imageclass_create(op, x->image, g_done);
        return;
    }
    if (x->image_lead) {
        x->image_lead = false;
        bool fetch_failed = json_is_true(json_object_get(result, "fetch_failed"));
        const char *got = json_string_value(json_object_get(result, "got"));
        const char *url = image_url(op);
        if (json_is_true(json_object_get(result, "fetched"))) {
            log_info("controller", "image downloaded", "volume=%s digest=%s", op->vol->id,
                     x->image);
            if (url)
                imagememo_forget(c->image_refusals, url, x->image);
        }
        if (fetch_failed && status == -EBADMSG && url && got && *got)
            imagememo_note(c->image_refusals, url, x->image, got, now_ms());
        /* The waiters: one error for all, or their overlays in parallel
         * (the first becomes the lead, should the base be missing). */
        struct op *next;
        for (struct op *o = c->ops; o; o = next) {
            next = o->next;
            struct create_ctx *ox = ctx_of(o);
            if (o == op || o->worker || !ox || !ox->image || !streq(ox->image, x->image))
                continue;
            if (fetch_failed) {
                g_done(status, msg, NULL, o);
            } else {
                ox->image_lead = !lead_of(c, ox->image);
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
