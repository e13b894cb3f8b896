/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/log.c: see log.h.  Writes whole lines with one write(2) to stderr. */
#include "qsd/base/log.h"
#include "qsd/base/util.h"

#include <stdarg.h>
#include <time.h>

enum log_level log_min_level = LOG_INFO;
static enum log_format log_format = LOG_FORMAT_TEXT;

static const char *level_names[] = {"debug", "info", "warn", "error"};

void log_set_level(enum log_level l) { log_min_level = l; }
void log_set_format(enum log_format f) { log_format = f; }

int log_parse_level(const char *s, enum log_level *ret)
{
    for (unsigned i = 0; i < ARRAY_SIZE(level_names); i++)
        if (streq(s, level_names[i])) {
            *ret = (enum log_level)i;
            return 0;
        }
    if (streq(s, "warning")) {
        *ret = LOG_WARN;
        return 0;
    }
    return -EINVAL;
}

int log_parse_format(const char *s, enum log_format *ret)
{
    if (streq(s, "text") || streq(s, "logfmt"))
        *ret = LOG_FORMAT_TEXT;
    else if (streq(s, "json"))
        *ret = LOG_FORMAT_JSON;
    else
        return -EINVAL;
    return 0;
}

char *log_quote(const char *v)
{
    bool need = !*v;
    for (const char *p = v; *p; p++)
        if (*p <= ' ' || *p == '"' || *p == '=' || *p == '\\' || (unsigned char)*p >= 0x7f)
            need = true;
    if (!need)
        return xstrdup(v);
    size_t n = strlen(v);
    char *out = xmalloc(n * 4 + 3), *o = out;
    *o++ = '"';
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        if (*p == '"' || *p == '\\') {
            *o++ = '\\';
            *o++ = (char)*p;
        } else if (*p == '\n') {
            *o++ = '\\';
            *o++ = 'n';
        } else if (*p < ' ' || *p == 0x7f) {
            o += sprintf(o, "\\x%02x", *p);
        } else {
            *o++ = (char)*p;
        }
    }
    *o++ = '"';
    *o = '\0';
    return out;
}

/* The caller's "k=v k2=\"v 2\"" as pairs.  A value is either quoted
 * (log_quote's escapes are undone) or runs to the next " key=": a word
 * without '=' belongs to the value before it, so an unquoted value with
 * spaces (a strerror text) is kept whole. */
struct kv {
    char *key, *val;
};

static size_t parse_kv(const char *s, struct kv **ret)
{
    struct kv *v = NULL;
    size_t n = 0;
    const char *p = s;
    for (;;) {
        while (*p == ' ')
            p++;
        if (!*p)
            break;
        const char *eq = p;
        while (*eq && *eq != '=' && *eq != ' ')
            eq++;
        if (*eq != '=' || eq == p) {
            /* a word without key: continues the previous value */
            const char *e = strchr(p, ' ');
            size_t wl = e ? (size_t)(e - p) : strlen(p);
            if (n) {
                char *nv = xasprintf("%s %.*s", v[n - 1].val, (int)wl, p);
                free(v[n - 1].val);
                v[n - 1].val = nv;
            }
            p += wl;
            continue;
        }
        v = xrealloc(v, (n + 1) * sizeof(*v));
        v[n].key = xstrndup(p, (size_t)(eq - p));
        p = eq + 1;
        char *out = xmalloc(strlen(p) + 1), *o = out;
        if (*p == '"') {
            for (p++; *p && *p != '"'; p++) {
                if (*p == '\\' && p[1]) {
                    p++;
                    if (*p == 'n')
                        *o++ = '\n';
                    else if (*p == 't')
                        *o++ = '\t';
                    else if (*p == 'x' && p[1] && p[2]) {
                        char hex[3] = {p[1], p[2], 0};
                        *o++ = (char)strtol(hex, NULL, 16);
                        p += 2;
                    } else
                        *o++ = *p;
                } else {
                    *o++ = *p;
                }
            }
            if (*p)
                p++;
        } else {
            while (*p && *p != ' ')
                *o++ = *p++;
        }
        *o = '\0';
        v[n++].val = out;
    }
    *ret = v;
    return n;
}

static bool is_json_number(const char *s)
{
    const char *p = s;
    if (*p == '-')
        p++;
    if (*p == '0')
        p++;
    else if (*p >= '1' && *p <= '9')
        while (*p >= '0' && *p <= '9')
            p++;
    else
        return false;
    if (*p == '.') {
        p++;
        if (!(*p >= '0' && *p <= '9'))
            return false;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    return *p == '\0' && p - s < 20;
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < ' ' || *p == 0x7f)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

void log_emit(enum log_level level, const char *comp, const char *msg, const char *fmt, ...)
{
    char ts[40];
    struct timespec now;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    size_t n = strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + n, sizeof(ts) - n, ".%03ldZ", now.tv_nsec / 1000000L);

    _cleanup_free_ char *kv = NULL;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&kv, fmt, ap) < 0)
        kv = NULL;
    va_end(ap);
    _cleanup_free_ char *qmsg = log_quote(msg);

    char *line = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&line, &len);
    if (!f)
        return;
    struct kv *kvs = NULL;
    size_t nkv = kv ? parse_kv(kv, &kvs) : 0;
    if (log_format == LOG_FORMAT_JSON) {
        fprintf(f, "{\"ts\":\"%s\",\"level\":\"%s\",\"comp\":", ts, level_names[level]);
        json_string(f, comp);
        fputs(",\"msg\":", f);
        json_string(f, msg);
        for (size_t i = 0; i < nkv; i++) {
            fputc(',', f);
            json_string(f, kvs[i].key);
            fputc(':', f);
            if (is_json_number(kvs[i].val))
                fputs(kvs[i].val, f);
            else
                json_string(f, kvs[i].val);
        }
        fputs("}\n", f);
    } else {
        fprintf(f, "ts=%s level=%s comp=%s msg=%s", ts, level_names[level], comp, qmsg);
        for (size_t i = 0; i < nkv; i++) {
            _cleanup_free_ char *q = log_quote(kvs[i].val);
            fprintf(f, " %s=%s", kvs[i].key, q);
        }
        fputc('\n', f);
    }
    for (size_t i = 0; i < nkv; i++) {
        free(kvs[i].key);
        free(kvs[i].val);
    }
    free(kvs);
    fclose(f);
    (void)!write(STDERR_FILENO, line, len);
    free(line);
}

bool log_budget_take(struct log_budget *b)
{
    uint64_t now = now_ms();
    if (now - b->window_ms >= 1000) {
        b->window_ms = now;
        b->used = 0;
    }
    if (b->used >= b->per_sec) {
        b->suppressed++;
        return false;
    }
    b->used++;
    return true;
}
