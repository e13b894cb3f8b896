/* metrics.h: the plugin's metrics registry and its Prometheus rendering.
 *
 * Owns: the exposition helpers (text format 0.0.4: HELP and TYPE lines,
 * escaped label values, histograms with cumulative buckets), the RPC
 * registry (count and duration histogram per registered method and gRPC
 * code, fed by the gRPC server's observer), and the /metrics page: RPC
 * series, then the pool and per-volume series read from the collector's
 * cache (volstats.h).  Rendering never waits: it reads what is cached.
 * Every series name starts with qsd_csi_ (docs/observability.md). */
#pragma once

#include "grpc.h"

#include <stdint.h>
#include <stdio.h>

struct csi;

/* ---- exposition helpers (pure) ---- */
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

/* ---- the plugin's registry ---- */
struct metrics;
int metrics_new(struct csi *c, struct metrics **ret);
void metrics_free(struct metrics *m);
/* A grpc_observer_fn (opaque: the struct metrics). */
void metrics_rpc_observe(const struct grpc_method *method, enum grpc_code code,
                         uint64_t duration_us, void *opaque);
/* The whole page (malloc'd, *ret_len bytes). */
int metrics_render(struct metrics *m, char **ret, size_t *ret_len);
