/* log.c: see log.h.  Writes whole lines with one write(2) to stderr. */
#include "log.h"
#include "util.h"

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

/* Split "k=v k2=v2" produced by the caller into JSON members.  Values that
 * contain spaces must have been produced with log_quote (double quotes). */
static void append_json_fields(FILE *f, const char *kv)
{
    const char *p = kv;
    while (*p) {
        while (*p == ' ')
            p++;
        const char *eq = strchr(p, '=');
        if (!eq)
            break;
        fprintf(f, ",\"%.*s\":", (int)(eq - p), p);
        p = eq + 1;
        if (*p == '"') {
            const char *s = ++p;
            while (*p && *p != '"') {
                if (*p == '\\' && p[1])
                    p++;
                p++;
            }
            fprintf(f, "\"%.*s\"", (int)(p - s), s);
            if (*p)
                p++;
        } else {
            const char *s = p;
            while (*p && *p != ' ')
                p++;
            fputc('"', f);
            for (const char *q = s; q < p; q++) {
                if (*q == '"' || *q == '\\')
                    fputc('\\', f);
                fputc(*q, f);
            }
            fputc('"', f);
        }
    }
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
    if (log_format == LOG_FORMAT_JSON) {
        fprintf(f, "{\"ts\":\"%s\",\"level\":\"%s\",\"comp\":\"%s\",\"msg\":", ts,
                level_names[level], comp);
        fputc('"', f);
        for (const char *p = msg; *p; p++) {
            if (*p == '"' || *p == '\\')
                fputc('\\', f);
            if ((unsigned char)*p < ' ')
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
        fputc('"', f);
        if (kv)
            append_json_fields(f, kv);
        fputs("}\n", f);
    } else {
        fprintf(f, "ts=%s level=%s comp=%s msg=%s%s%s\n", ts, level_names[level], comp, qmsg,
                kv && *kv ? " " : "", kv ? kv : "");
    }
    fclose(f);
    (void)!write(STDERR_FILENO, line, len);
    free(line);
}
