/* SPDX-License-Identifier: Apache-2.0 */
/* exposition.c: see exposition.h. */
#include "exposition.h"
#include "qsd/base/util.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>

void metrics_family(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void put_value(FILE *f, double v)
{
    if (isnan(v))
        fputs("NaN", f);
    else if (isinf(v))
        fputs(v > 0 ? "+Inf" : "-Inf", f);
    else if (v > -9007199254740992.0 && v < 9007199254740992.0 && v == (double)(long long)v)
        fprintf(f, "%lld", (long long)v);
    else {
        /* The shortest of 15 or 17 digits that reads back as v. */
        char buf[32];
        snprintf(buf, sizeof(buf), "%.15g", v);
        if (strtod(buf, NULL) != v)
            snprintf(buf, sizeof(buf), "%.17g", v);
        fputs(buf, f);
    }
}

void metrics_sample(FILE *f, const char *name, const char *labels, double value)
{
    if (labels && *labels)
        fprintf(f, "%s{%s} ", name, labels);
    else
        fprintf(f, "%s ", name);
    put_value(f, value);
    fputc('\n', f);
}

char *metrics_labels(const char *key, ...)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (!f)
        abort();
    va_list ap;
    va_start(ap, key);
    for (const char *k = key; k; k = va_arg(ap, const char *)) {
        const char *v = va_arg(ap, const char *);
        fprintf(f, "%s%s=\"", k == key ? "" : ",", k);
        for (const char *p = v; *p; p++) {
            if (*p == '\\')
                fputs("\\\\", f);
            else if (*p == '"')
                fputs("\\\"", f);
            else if (*p == '\n')
                fputs("\\n", f);
            else
                fputc(*p, f);
        }
        fputc('"', f);
    }
    va_end(ap);
    fclose(f);
    return out;
}

void histogram_init(struct histogram *h, const double *bounds, size_t n)
{
    *h = (struct histogram){.bounds = bounds, .n = n, .counts = xcalloc(n + 1, sizeof(uint64_t))};
}

void histogram_clear(struct histogram *h)
{
    free(h->counts);
    h->counts = NULL;
}

void histogram_observe(struct histogram *h, double v)
{
    size_t i = 0;
    while (i < h->n && v > h->bounds[i])
        i++;
    h->counts[i]++;
    h->count++;
    h->sum += v;
}

void metrics_histogram(FILE *f, const char *name, const char *labels, const struct histogram *h)
{
    const char *sep = labels && *labels ? "," : "";
    uint64_t cum = 0;
    for (size_t i = 0; i <= h->n; i++) {
        cum += h->counts[i];
        fprintf(f, "%s_bucket{%s%sle=\"", name, labels ? labels : "", sep);
        if (i < h->n)
            fprintf(f, "%g", h->bounds[i]);
        else
            fputs("+Inf", f);
        fprintf(f, "\"} %" PRIu64 "\n", cum);
    }
    _cleanup_free_ char *s = xasprintf("%s_sum", name), *c = xasprintf("%s_count", name);
    metrics_sample(f, s, labels, h->sum);
    metrics_sample(f, c, labels, (double)h->count);
}
