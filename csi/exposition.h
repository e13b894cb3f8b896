/* SPDX-License-Identifier: Apache-2.0 */
/* exposition.h: the Prometheus text exposition format (0.0.4), pure.
 *
 * Owns: HELP and TYPE lines, samples, escaped label values, and histograms
 * with cumulative buckets: what the /metrics page (metrics.c) and the
 * collector's per-volume figures (volstats.c) are written with. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* "# HELP name help\n# TYPE name type\n". */
void metrics_family(FILE *f, const char *name, const char *type, const char *help);
/* name{labels} value: labels is the inside of the braces (from
 * metrics_labels) or NULL. */
void metrics_sample(FILE *f, const char *name, const char *labels, double value);
/* k1="v1",k2="v2"... (NULL-terminated pairs), values escaped as the format
 * says (backslash, double quote, newline).  malloc'd. */
char *metrics_labels(const char *key, ...) __attribute__((sentinel));

struct histogram {
    const double *bounds; /* upper bounds, increasing; +Inf is implied */
    size_t n;
    uint64_t *counts;     /* per bucket (not cumulative), n + 1 with +Inf */
    uint64_t count;
    double sum;
};
void histogram_init(struct histogram *h, const double *bounds, size_t n);
void histogram_clear(struct histogram *h);
void histogram_observe(struct histogram *h, double v);
/* name_bucket{labels,le="..."} (cumulative), name_sum, name_count. */
void metrics_histogram(FILE *f, const char *name, const char *labels,
                       const struct histogram *h);
