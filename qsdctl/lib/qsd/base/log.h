/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/log.h: one line per event, logfmt (key=value) or JSON, with a component.
 *
 *   log_info("qsd", "started", "volume=%s pid=%d", vol, pid);
 *
 * prints   ts=2026-11-22T00:00:00.123Z level=info comp=qsd msg=started volume=v1 pid=42
 * The level is checked before anything is formatted.  Library code does not
 * log errors it returns: the caller that decides what to do logs once. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR };
enum log_format { LOG_FORMAT_TEXT, LOG_FORMAT_JSON };

extern enum log_level log_min_level;

void log_set_level(enum log_level l);
int log_parse_level(const char *s, enum log_level *ret);
void log_set_format(enum log_format f);
int log_parse_format(const char *s, enum log_format *ret);

void log_emit(enum log_level level, const char *comp, const char *msg, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define log_at(level, comp, msg, ...)                                          \
    do {                                                                       \
        if ((level) >= log_min_level)                                          \
            log_emit(level, comp, msg, __VA_ARGS__);                           \
    } while (0)
#define log_debug(comp, msg, ...) log_at(LOG_DEBUG, comp, msg, __VA_ARGS__)
#define log_info(comp, msg, ...) log_at(LOG_INFO, comp, msg, __VA_ARGS__)
#define log_warn(comp, msg, ...) log_at(LOG_WARN, comp, msg, __VA_ARGS__)
#define log_error(comp, msg, ...) log_at(LOG_ERROR, comp, msg, __VA_ARGS__)

/* A budget of lines per second, for a path a peer can make noisy (a
 * server's connections): beyond per_sec in one second, lines are counted
 * in suppressed instead of printed.  Zero-initialised but for per_sec. */
struct log_budget {
    unsigned per_sec;
    uint64_t window_ms;
    unsigned used;
    uint64_t suppressed;
};
/* True when one more line fits in this second's budget. */
bool log_budget_take(struct log_budget *b);
#define log_limited(b, level, comp, msg, ...)                                  \
    do {                                                                       \
        if ((level) >= log_min_level && log_budget_take(b))                    \
            log_emit(level, comp, msg, __VA_ARGS__);                           \
    } while (0)

/* Quote a value for logfmt if needed; returns a malloc'd string. */
char *log_quote(const char *v);
