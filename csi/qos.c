/* SPDX-License-Identifier: Apache-2.0 */
/* qos.c: a volume's mutable parameters, parsed into throttle-group limits
 * (qos.h). */
#include "qos.h"
#include "qsd/base/util.h"

#include <errno.h>
#include <string.h>

/* The keys in the order of qsdopts.h's QSD_LIM_* indices. */
static const char *const KEYS[QSD_LIM_N] = {
    "readIops",      "writeIops",      "readBps",      "writeBps",
    "readIopsBurst", "writeIopsBurst", "readBpsBurst", "writeBpsBurst",
};

static int key_index(const char *k)
{
    for (int i = 0; i < QSD_LIM_N; i++)
        if (streq(k, KEYS[i]))
            return i;
    return -1;
}

static int parse_value(const char *k, const char *s, uint64_t *ret, char **ret_msg)
{
    uint64_t v = 0;
    if (!*s)
        goto bad;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9' || p - s > 16)
            goto bad;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (v > QSD_LIMIT_MAX)
        goto bad;
    *ret = v;
    return 0;
bad:
    *ret_msg = xasprintf("invalid %s '%s': expected a whole number from 0 (unlimited) to %llu",
                         k, s, QSD_LIMIT_MAX);
    return -EINVAL;
}

static int check_bursts(const struct qsd_limits *l, char **ret_msg)
{
    for (int i = 0; i < QSD_LIM_IOPS_READ_MAX; i++) {
        uint64_t base = l->v[i], burst = l->v[i + QSD_LIM_IOPS_READ_MAX];
        if (burst && burst < base) {
            *ret_msg = xasprintf("invalid %s %llu: below %s %llu", KEYS[i + QSD_LIM_IOPS_READ_MAX],
                                 (unsigned long long)burst, KEYS[i], (unsigned long long)base);
            return -EINVAL;
        }
        if (burst && !base) {
            *ret_msg = xasprintf("invalid %s: a burst needs %s too", KEYS[i + QSD_LIM_IOPS_READ_MAX],
                                 KEYS[i]);
            return -EINVAL;
        }
    }
    return 0;
}

int qos_merge(json_t *current, size_t n, const char *const *keys, const char *const *vals,
              json_t **ret_params, struct qsd_limits *ret_limits, char **ret_msg)
{
    struct qsd_limits l = {0};
    const char *k;
    json_t *val;
    if (current)
        json_object_foreach(current, k, val)
        {
            int i = key_index(k);
            const char *s = json_string_value(val);
            if (i < 0 || !s) {
                *ret_msg = xasprintf(i < 0 ? "unknown mutable parameter '%s' in the volume's "
                                             "record"
                                           : "%s in the volume's record is not a string", k);
                return -EINVAL;
            }
            if (parse_value(k, s, &l.v[i], ret_msg) < 0)
                return -EINVAL;
        }
    for (size_t j = 0; j < n; j++) {
        int i = key_index(keys[j]);
        if (i < 0) {
            *ret_msg = xasprintf("unknown mutable parameter '%s' (expected readIops, writeIops, "
                                 "readBps, writeBps or their ...Burst)", keys[j]);
            return -EINVAL;
        }
        if (parse_value(keys[j], vals[j], &l.v[i], ret_msg) < 0)
            return -EINVAL;
    }
    if (check_bursts(&l, ret_msg) < 0)
        return -EINVAL;
    if (ret_params) {
        json_t *p = json_object();
        for (int i = 0; i < QSD_LIM_N; i++)
            if (l.v[i]) {
                char buf[24];
                snprintf(buf, sizeof(buf), "%llu", (unsigned long long)l.v[i]);
                json_object_set_new(p, KEYS[i], json_string(buf));
            }
        *ret_params = p;
    }
    if (ret_limits)
        *ret_limits = l;
    return 0;
}

int qos_check(size_t n, const char *const *keys, const char *const *vals, char **ret_msg)
{
    uint64_t v;
    for (size_t j = 0; j < n; j++) {
        if (key_index(keys[j]) < 0) {
            *ret_msg = xasprintf("unknown mutable parameter '%s' (expected readIops, writeIops, "
                                 "readBps, writeBps or their ...Burst)", keys[j]);
            return -EINVAL;
        }
        if (parse_value(keys[j], vals[j], &v, ret_msg) < 0)
            return -EINVAL;
    }
    return 0;
}

int qos_limits(json_t *params, struct qsd_limits *ret, char **ret_msg)
{
    return qos_merge(params, 0, NULL, NULL, NULL, ret, ret_msg);
}
