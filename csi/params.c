/* SPDX-License-Identifier: Apache-2.0 */
/* params.c: see params.h. */
#include "params.h"
#include "qsd/qemu/image.h"
#include "qsd/qemu/imagebase.h"
#include "qsd/base/util.h"

#include <inttypes.h>

/* StorageClass spelling -> qsd_opts_set() spelling. */
static const struct {
    const char *sc, *opt;
} OPT_KEYS[] = {
    {"cache", "cache"},
    {"aio", "aio"},
    {"numQueues", "num-queues"},
    {"logicalBlockSize", "logical-block-size"},
    {"discard", "discard"},
    {"detectZeroes", "detect-zeroes"},
};

void vol_params_clear(struct vol_params *p)
{
    free(p->format);
    free(p->preallocation);
    free(p->image);
    free(p->image_digest);
    qsd_opts_clear(&p->opts);
    memset(p, 0, sizeof(*p));
}

int vol_params_parse(size_t n, const char *const *keys, const char *const *values,
                     struct vol_params *ret, char **ret_msg)
{
    struct vol_params p = {.format = xstrdup("qcow2"), .preallocation = xstrdup("off")};
    qsd_opts_init(&p.opts);
    int r = 0;
    for (size_t i = 0; i < n && r == 0; i++) {
        const char *k = keys[i], *v = values[i];
        if (startswith(k, K8S_PREFIX))
            continue;
        if (streq(k, "format")) {
            if (!streq(v, "qcow2") && !streq(v, "raw")) {
                *ret_msg = xasprintf("invalid parameter format=%s: expected qcow2 or raw", v);
                r = -EINVAL;
            } else {
                free(p.format);
                p.format = xstrdup(v);
            }
            continue;
        }
        if (streq(k, "preallocation")) {
            free(p.preallocation);
            p.preallocation = xstrdup(v);
            continue;
        }
        if (streq(k, "image") || streq(k, "imageSha256") || streq(k, "imageSha512")) {
            bool url = streq(k, "image");
            const char *why = url ? imagebase_url_problem(v)
                                  : imagebase_digest_problem(streq(k, "imageSha512") ? "sha512"
                                                                                    : "sha256", v);
            if (why) {
                *ret_msg = xasprintf("invalid parameter %s: %s", k, why);
                r = -EINVAL;
            } else if (!url && p.image_digest) {
                *ret_msg = xstrdup("parameters imageSha256 and imageSha512: give one of them, "
                                   "not both");
                r = -EINVAL;
            } else {
                char **dst = url ? &p.image : &p.image_digest;
                free(*dst);
                *dst = xstrdup(v);
            }
            continue;
        }
        size_t j;
        for (j = 0; j < ARRAY_SIZE(OPT_KEYS); j++)
            if (streq(k, OPT_KEYS[j].sc))
                break;
        if (j == ARRAY_SIZE(OPT_KEYS)) {
            *ret_msg = xasprintf("unknown parameter '%s' (known: format, preallocation, image, "
                                 "imageSha256, imageSha512, cache, aio, numQueues, logicalBlockSize, discard, "
                                 "detectZeroes)", k);
            r = -EINVAL;
            break;
        }
        _cleanup_free_ char *m = NULL;
        if (qsd_opts_set(&p.opts, OPT_KEYS[j].opt, v, &m) < 0) {
            *ret_msg = xasprintf("invalid parameter %s: %s", k, m);
            r = -EINVAL;
        }
    }
    if (r == 0 && !p.image != !p.image_digest) {
        *ret_msg = xstrdup(p.image ? "parameter image needs imageSha256 or imageSha512 (the "
                                     "image's SHA-256 or SHA-512)"
                                   : "parameter imageSha256 or imageSha512 needs image (the "
                                     "image's URL)");
        r = -EINVAL;
    }
    if (r == 0 && p.image && (!streq(p.format, "qcow2") || !streq(p.preallocation, "off"))) {
        *ret_msg = xstrdup("parameter image: volumes of an image are thin qcow2 overlays on it "
                           "(format qcow2, preallocation off)");
        r = -EINVAL;
    }
    if (r == 0) {
        _cleanup_free_ char *m = NULL;
        if (image_check_prealloc(p.format, p.preallocation, &m) < 0) {
            *ret_msg = xasprintf("invalid parameter preallocation: %s", m);
            r = -EINVAL;
        }
    }
    if (r == 0) {
        /* Cross-option rules (aio=native needs O_DIRECT...). */
        _cleanup_free_ char *m = NULL;
        p.opts.image = xstrdup("/validate");
        p.opts.format = xstrdup(p.format);
        if (qsd_opts_validate(&p.opts, &m) < 0) {
            *ret_msg = xasprintf("invalid parameters: %s", m);
            r = -EINVAL;
        }
        free(p.opts.image);
        free(p.opts.format);
        p.opts.image = p.opts.format = NULL;
    }
    if (r < 0) {
        vol_params_clear(&p);
        return r;
    }
    *ret = p;
    return 0;
}

