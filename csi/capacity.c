/* SPDX-License-Identifier: Apache-2.0 */
/* capacity.c: see capacity.h. */
#include "capacity.h"
#include "backend.h"
#include "service.h"
#include "qsd/base/util.h"

#include <inttypes.h>
#include <sys/statvfs.h>

int capacity_parse_reserve(const char *s, struct capacity_policy *p)
{
    size_t n = s ? strlen(s) : 0;
    if (n >= 2 && s[n - 1] == '%') {
        _cleanup_free_ char *num = xstrndup(s, n - 1);
        uint64_t v;
        if (parse_uint(num, 0, 99, &v) < 0)
            return -EINVAL;
        p->reserve_pct = (unsigned)v;
        p->reserve_bytes = 0;
        return 0;
    }
    uint64_t v;
    if (parse_size(s, &v) < 0)
        return -EINVAL;
    p->reserve_bytes = v;
    p->reserve_pct = 0;
    return 0;
}

int capacity_parse_ratio(const char *s, struct capacity_policy *p)
{
    if (!s || !*s)
        return -EINVAL;
    const char *dot = strchr(s, '.');
    _cleanup_free_ char *ip = dot ? xstrndup(s, (size_t)(dot - s)) : xstrdup(s);
    uint64_t whole, frac = 0;
    if (parse_uint(ip, 0, 1000, &whole) < 0)
        return -EINVAL;
    if (dot) {
        size_t nf = strlen(dot + 1);
        if (nf < 1 || nf > 2 || parse_uint(dot + 1, 0, 99, &frac) < 0)
            return -EINVAL;
        if (nf == 1)
            frac *= 10;
    }
    uint64_t x = whole * 100 + frac;
    if (x == 0 || x > 100000)
        return -EINVAL;
    p->overcommit_x100 = (unsigned)x;
    return 0;
}

void capacity_apply(const struct capacity_policy *p, struct pool_figures *f)
{
    f->reserve = p->reserve_pct ? (uint64_t)((unsigned __int128)f->total * p->reserve_pct / 100)
                                : p->reserve_bytes;
    if (!p->overcommit_x100) {
        f->limit = UINT64_MAX;
        return;
    }
    uint64_t base = f->total > f->reserve ? f->total - f->reserve : 0;
    unsigned __int128 l = (unsigned __int128)base * p->overcommit_x100 / 100;
    f->limit = l > UINT64_MAX ? UINT64_MAX : (uint64_t)l;
}

static char *reserve_text(const struct capacity_policy *p, const struct pool_figures *f)
{
    if (p->reserve_pct)
        return xasprintf("%" PRIu64 " bytes (--capacity-reserve %u%% of %" PRIu64 ")", f->reserve,
                         p->reserve_pct, f->total);
    return xasprintf("%" PRIu64 " bytes (--capacity-reserve)", f->reserve);
}

char *capacity_refuse(const struct capacity_policy *p, const struct pool_figures *f,
                      uint64_t grow, uint64_t need)
{
    if (f->free <= f->reserve) {
        _cleanup_free_ char *r = reserve_text(p, f);
        return xasprintf("the pool has %" PRIu64 " bytes free, not more than its reserve of %s",
                         f->free, r);
    }
    if (need > f->free - f->reserve) {
        _cleanup_free_ char *r = reserve_text(p, f);
        return xasprintf("it needs %" PRIu64 " bytes free now; the pool has %" PRIu64
                         " bytes free, of which it keeps a reserve of %s", need, f->free, r);
    }
    if (f->limit != UINT64_MAX && (grow > f->limit || f->committed > f->limit - grow))
        return xasprintf("the volumes' virtual sizes would add up to %" PRIu64
                         " bytes (now %" PRIu64 ", +%" PRIu64 "), above the overcommit limit of "
                         "%" PRIu64 " bytes (--overcommit-ratio %u.%02u x (filesystem %" PRIu64
                         " - reserve %" PRIu64 "))", f->committed + grow, f->committed, grow,
                         f->limit, p->overcommit_x100 / 100, p->overcommit_x100 % 100, f->total,
                         f->reserve);
    return NULL;
}

void capacity_available(const struct pool_figures *f, bool prealloc, unsigned align,
                        uint64_t max_size, uint64_t *ret_available, uint64_t *ret_max)
{
    uint64_t free_left = f->free > f->reserve ? f->free - f->reserve : 0;
    uint64_t virt_left = f->limit == UINT64_MAX ? UINT64_MAX
                         : f->limit > f->committed ? f->limit - f->committed : 0;
    uint64_t avail, max;
    if (free_left == 0) {
        avail = max = 0;
    } else if (prealloc) {
        avail = max = MIN(free_left, virt_left);
    } else if (virt_left == UINT64_MAX) {
        /* Thin without a limit: what is really free; any size is accepted. */
        avail = free_left;
        max = max_size;
    } else {
        avail = max = virt_left;
    }
    *ret_available = MIN(avail, (uint64_t)INT64_MAX);
    max = MIN(max, max_size);
    *ret_max = max - max % align;
}

enum grpc_code capacity_errno_code(int err, enum grpc_code dflt)
{
    return err == -ENOSPC || err == -EDQUOT ? GRPC_RESOURCE_EXHAUSTED : dflt;
}

/* ---------------------------------------------------------------- shell */

int capacity_figures(struct csi *c, struct pool_figures *ret, char **ret_msg)
{
    struct statvfs sv;
    if (statvfs(c->pool.volumes, &sv) < 0) {
        int e = -errno;
        *ret_msg = xasprintf("statvfs %s: %s", c->pool.volumes, strerror(errno));
        return e;
    }
    struct pool_figures f = {
        .total = (uint64_t)sv.f_blocks * sv.f_frsize,
        .free = (uint64_t)sv.f_bavail * sv.f_frsize,
    };
    for (size_t i = 0; i < c->store->n_vols; i++)
        if (BACKEND_OF(.record = c->store->vols[i])->in_pool)
            f.committed += c->store->vols[i]->size;
    capacity_apply(&c->cfg->capacity, &f);
    *ret = f;
    return 0;
}

uint64_t capacity_reserved_bytes(struct csi *c)
{
    struct pool_figures f;
    _cleanup_free_ char *m = NULL;
    return capacity_figures(c, &f, &m) == 0 ? f.reserve : 0;
}

double capacity_overcommit_ratio(const struct csi *c)
{
    return c->cfg->capacity.overcommit_x100 / 100.0;
}

bool capacity_admit(struct csi *c, struct grpc_call *call, const char *what, uint64_t grow,
                    uint64_t need)
{
    struct pool_figures f;
    _cleanup_free_ char *m = NULL;
    int r = capacity_figures(c, &f, &m);
    if (r < 0) {
        grpc_call_fail(call, GRPC_INTERNAL, "%s", m);
        return false;
    }
    _cleanup_free_ char *why = capacity_refuse(&c->cfg->capacity, &f, grow, need);
    if (!why)
        return true;
    grpc_call_fail(call, GRPC_RESOURCE_EXHAUSTED, "%s: %s", what, why);
    return false;
}

int capacity_pick(int64_t required, int64_t limit, uint64_t min_size, unsigned align,
                  uint64_t *ret, char **ret_msg)
{
    if (required < 0 || limit < 0) {
        *ret_msg = xstrdup("capacity_range: required_bytes and limit_bytes must not be negative");
        return -EINVAL;
    }
    if (limit > 0 && required > limit) {
        *ret_msg = xasprintf("capacity_range: required_bytes %" PRId64 " exceeds limit_bytes %" PRId64,
                             required, limit);
        return -EINVAL;
    }
    if (align == 0)
        align = IMAGE_SIZE_ALIGN;
    uint64_t want = (uint64_t)required;
    if (want == 0) {
        want = min_size ? min_size : VOLUME_DEFAULT_SIZE;
        if (limit > 0 && want > (uint64_t)limit && min_size == 0)
            want = (uint64_t)limit - (uint64_t)limit % align; /* the largest aligned size allowed */
    }
    if (want < min_size)
        want = min_size;
    if (want > IMAGE_MAX_SIZE) {
        *ret_msg = xasprintf("capacity %" PRIu64 " bytes is above the maximum of 1 PiB", want);
        return -ERANGE;
    }
    want = (want + align - 1) / align * align;
    if (want == 0) {
        *ret_msg = xasprintf("capacity_range allows no size that is a multiple of %u bytes", align);
        return -ERANGE;
    }
    if (limit > 0 && want > (uint64_t)limit) {
        *ret_msg = xasprintf("no size of at least %" PRIu64 " bytes (multiple of %u%s) fits "
                             "limit_bytes %" PRId64, want, align,
                             min_size ? ", content source included" : "", limit);
        return -ERANGE;
    }
    *ret = want;
    return 0;
}
