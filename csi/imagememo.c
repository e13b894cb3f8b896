/* SPDX-License-Identifier: Apache-2.0 */
/* imagememo.c: see imagememo.h. */
#include "imagememo.h"
#include "qsd/base/util.h"

#include <stdlib.h>
#include <string.h>

struct refusal {
    char *url, *expected, *got;
    uint64_t at_ms;
};

struct imagememo {
    struct refusal e[IMAGEMEMO_MAX];
    unsigned n;
};

struct imagememo *imagememo_new(void)
{
    return xcalloc(1, sizeof(struct imagememo));
}

static void drop(struct imagememo *m, unsigned i)
{
    free(m->e[i].url);
    free(m->e[i].expected);
    free(m->e[i].got);
    m->e[i] = m->e[--m->n];
}

void imagememo_free(struct imagememo *m)
{
    if (!m)
        return;
    while (m->n)
        drop(m, 0);
    free(m);
}

static int index_of(const struct imagememo *m, const char *url, const char *expected)
{
    for (unsigned i = 0; i < m->n; i++)
        if (streq(m->e[i].url, url) && streq(m->e[i].expected, expected))
            return (int)i;
    return -1;
}

static void expire(struct imagememo *m, uint64_t now_ms)
{
    for (unsigned i = m->n; i-- > 0;)
        if (now_ms >= m->e[i].at_ms + IMAGEMEMO_TTL_MS)
            drop(m, i);
}

void imagememo_note(struct imagememo *m, const char *url, const char *expected, const char *got,
                    uint64_t now_ms)
{
    expire(m, now_ms);
    imagememo_forget(m, url, expected);
    if (m->n == IMAGEMEMO_MAX) {
        unsigned oldest = 0;
        for (unsigned i = 1; i < m->n; i++)
            if (m->e[i].at_ms < m->e[oldest].at_ms)
                oldest = i;
        drop(m, oldest);
    }
    m->e[m->n++] = (struct refusal){xstrdup(url), xstrdup(expected), xstrdup(got), now_ms};
}

bool imagememo_find(struct imagememo *m, const char *url, const char *expected, uint64_t now_ms,
                    const char **ret_got, uint64_t *ret_left_ms)
{
    expire(m, now_ms);
    int i = index_of(m, url, expected);
    if (i < 0)
        return false;
    *ret_got = m->e[i].got;
    *ret_left_ms = m->e[i].at_ms + IMAGEMEMO_TTL_MS - now_ms;
    return true;
}

void imagememo_forget(struct imagememo *m, const char *url, const char *expected)
{
    int i = index_of(m, url, expected);
    if (i >= 0)
        drop(m, (unsigned)i);
}

unsigned imagememo_count(const struct imagememo *m)
{
    return m->n;
}
