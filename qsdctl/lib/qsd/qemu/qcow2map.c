/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/qcow2map.c: a qcow2 layer's own allocation map and the walks
 * over chains of them.  See qcow2map.h.
 *
 * The qcow2 fields used (QEMU's docs/interop/qcow2.txt): the header's magic,
 * version (2 or 3), cluster_bits, size, l1_size, l1_table_offset and, for
 * version 3, incompatible_features; an L1 entry's L2 table offset; an L2
 * entry's compressed flag (bit 62), host offset (bits 9-55) and, version
 * 3, zero flag (bit 0).  Refused: the corrupt bit, extended L2 entries
 * (subclusters, never written by this project) and unknown incompatible
 * features. */
#include "qsd/qemu/qcow2map.h"
#include "qsd/base/util.h"

#include <fcntl.h>
#include <unistd.h>

#define QCOW2_MAGIC 0x514649fbu
#define HEADER_V2 72u
#define HEADER_V3 104u
#define OFFSET_MASK 0x00fffffffffffe00ull
#define L2_COMPRESSED (1ull << 62)
#define L2_ZERO 1ull
#define INCOMPAT_CORRUPT (1ull << 1)
#define INCOMPAT_EXTL2 (1ull << 4)
#define INCOMPAT_KNOWN 0x1full
#define SIZE_MAX_BYTES (1ull << 56)
#define CHEAP_WINDOWS (1u << 16) /* windows no layer maps, skipped per step */

struct qcow2_map {
    int fd;
    char *name;
    uint32_t version;
    unsigned cluster_bits;
    uint64_t size;
    uint64_t *l1;   /* entries covering size, host order */
    size_t l1_n;
    uint8_t *l2;    /* the last L2 table read (one cluster) */
    uint64_t l2_at; /* its L1 index + 1 (0: none) */
};

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static uint64_t be64(const uint8_t *p) { return (uint64_t)be32(p) << 32 | be32(p + 4); }

/* pread all of len at off; -EIO naming what when the file ends first. */
static int read_at(struct qcow2_map *m, void *buf, size_t len, uint64_t off, const char *what,
                   char **ret_msg)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread(m->fd, (uint8_t *)buf + got, len - got, (off_t)(off + got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? -errno : -EIO;
            *ret_msg = xasprintf("%s: cannot read its %s (%zu bytes at %llu): %s", m->name, what,
                                 len, (unsigned long long)off,
                                 n < 0 ? strerror(-e) : "the file ends first");
            return e;
        }
        got += (size_t)n;
    }
    return 0;
}

static int bad(struct qcow2_map *m, char **ret_msg, const char *why)
{
    *ret_msg = xasprintf("%s is not a qcow2 layer this can map: %s", m->name, why);
    return -EINVAL;
}

static int parse_header(struct qcow2_map *m, char **ret_msg)
{
    uint8_t h[HEADER_V3] = {0};
    ssize_t n = pread(m->fd, h, sizeof(h), 0);
    if (n < (ssize_t)HEADER_V2)
        return bad(m, ret_msg, "short header");
    if (be32(h) != QCOW2_MAGIC)
        return bad(m, ret_msg, "no qcow2 magic");
    m->version = be32(h + 4);
    if (m->version != 2 && m->version != 3)
        return bad(m, ret_msg, "qcow2 version neither 2 nor 3");
    m->cluster_bits = be32(h + 20);
    if (m->cluster_bits < 9 || m->cluster_bits > 21)
        return bad(m, ret_msg, "cluster size outside 512 B..2 MiB");
    m->size = be64(h + 24);
    if (m->size > SIZE_MAX_BYTES)
        return bad(m, ret_msg, "virtual size too large");
    if (m->version == 3) {
        if (n < (ssize_t)HEADER_V3 || be32(h + 100) < HEADER_V3)
            return bad(m, ret_msg, "short version 3 header");
        uint64_t inc = be64(h + 72);
        if (inc & INCOMPAT_CORRUPT)
            return bad(m, ret_msg, "marked corrupt");
        if (inc & INCOMPAT_EXTL2)
            return bad(m, ret_msg, "extended L2 entries (subclusters)");
        if (inc & ~INCOMPAT_KNOWN)
            return bad(m, ret_msg, "unknown incompatible features");
    }
    uint32_t l1_size = be32(h + 36);
    uint64_t l1_off = be64(h + 40);
    unsigned span = qcow2_map_span_bits(m);
    uint64_t need = (m->size + (1ull << span) - 1) >> span;
    if (l1_size < need)
        return bad(m, ret_msg, "L1 table smaller than the virtual size");
    if (need * 8 > QCOW2_L1_MAX_BYTES)
        return bad(m, ret_msg, "L1 table larger than 32 MiB");
    if (need && (l1_off & ((1ull << m->cluster_bits) - 1)))
        return bad(m, ret_msg, "L1 table not cluster-aligned");
    m->l1_n = need;
    m->l1 = xcalloc(need ? need : 1, sizeof(uint64_t));
    if (need) {
        int r = read_at(m, m->l1, need * 8, l1_off, "L1 table", ret_msg);
        if (r < 0)
            return r;
        for (size_t i = 0; i < need; i++)
            m->l1[i] = be64((const uint8_t *)&m->l1[i]) & OFFSET_MASK;
    }
    return 0;
}

int qcow2_map_open_fd(int fd, const char *name, struct qcow2_map **ret, char **ret_msg)
{
    struct qcow2_map *m = xcalloc(1, sizeof(*m));
    m->fd = fd;
    m->name = xstrdup(name);
    int r = parse_header(m, ret_msg);
    if (r < 0) {
        qcow2_map_free(m);
        return r;
    }
    *ret = m;
    return 0;
}

int qcow2_map_open(const char *path, struct qcow2_map **ret, char **ret_msg)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY);
    if (fd < 0) {
        int e = -errno;
        *ret_msg = xasprintf("cannot open %s: %s", path, strerror(errno));
        return e;
    }
    return qcow2_map_open_fd(fd, path, ret, ret_msg);
}

void qcow2_map_free(struct qcow2_map *m)
{
    if (!m)
        return;
    if (m->fd >= 0)
        close(m->fd);
    free(m->name);
    free(m->l1);
    free(m->l2);
    free(m);
}

uint64_t qcow2_map_size(const struct qcow2_map *m) { return m->size; }
unsigned qcow2_map_cluster_bits(const struct qcow2_map *m) { return m->cluster_bits; }
unsigned qcow2_map_span_bits(const struct qcow2_map *m) { return 2 * m->cluster_bits - 3; }

/* The L2 table of the span at off, or NULL when none is allocated. */
static bool span_mapped(const struct qcow2_map *m, uint64_t off)
{
    uint64_t i = off >> qcow2_map_span_bits(m);
    return off < m->size && i < m->l1_n && m->l1[i] != 0;
}

static int load_l2(struct qcow2_map *m, uint64_t l1i, char **ret_msg)
{
    if (m->l2_at == l1i + 1)
        return 0;
    uint64_t at = m->l1[l1i];
    size_t cs = (size_t)1 << m->cluster_bits;
    if (at & (cs - 1))
        return bad(m, ret_msg, "L2 table not cluster-aligned");
    if (!m->l2)
        m->l2 = xmalloc(cs);
    m->l2_at = 0;
    int r = read_at(m, m->l2, cs, at, "L2 table", ret_msg);
    if (r < 0)
        return r;
    m->l2_at = l1i + 1;
    return 0;
}

int qcow2_map_read(struct qcow2_map *m, uint64_t off, size_t n, unsigned gbits, uint8_t *flags,
                   char **ret_msg)
{
    unsigned span = qcow2_map_span_bits(m);
    if (gbits > m->cluster_bits || (off & ((1ull << gbits) - 1)) || n == 0 ||
        (n << gbits) > (1ull << span) || (off >> span) != ((off + (n << gbits) - 1) >> span)) {
        *ret_msg = xasprintf("%s: bad map request", m->name);
        return -EINVAL;
    }
    memset(flags, 0, n);
    if (!span_mapped(m, off))
        return 0;
    int r = load_l2(m, off >> span, ret_msg);
    if (r < 0)
        return r;
    size_t l2n = (size_t)1 << (m->cluster_bits - 3);
    for (size_t i = 0; i < n; i++) {
        uint64_t b = off + ((uint64_t)i << gbits);
        if (b >= m->size)
            break;
        uint64_t e = be64(m->l2 + ((b >> m->cluster_bits) & (l2n - 1)) * 8);
        if (e & L2_COMPRESSED) {
            flags[i] = QCOW2_MAP_PRESENT | QCOW2_MAP_DATA;
        } else {
            bool zero = m->version >= 3 && (e & L2_ZERO);
            if ((e & OFFSET_MASK) || zero)
                flags[i] = QCOW2_MAP_PRESENT | (zero ? 0 : QCOW2_MAP_DATA);
        }
    }
    return 0;
}

/* ------------------------------------------------------------ walks */

struct qcow2_walk {
    enum qcow2_walk_kind kind;
    struct qcow2_map *const *layers;
    size_t n;
    uint64_t size, end;  /* end: size rounded up to a block */
    unsigned gbits, wbits;
    uint64_t pos;        /* start of the current (or next) window */
    uint8_t *flags, *acc;
    size_t wi, wn;       /* position in the loaded window, its blocks */
    bool loaded, have, done;
    struct qcow2_extent ext; /* pending (may grow) */
};

int qcow2_walk_new(enum qcow2_walk_kind kind, struct qcow2_map *const *layers, size_t n,
                   uint64_t size, uint64_t start, struct qcow2_walk **ret)
{
    if (n == 0 || start >= size)
        return -EINVAL;
    struct qcow2_walk *w = xcalloc(1, sizeof(*w));
    w->kind = kind;
    w->layers = layers;
    w->n = n;
    w->size = size;
    w->gbits = 21;
    w->wbits = 2 * 21 - 3;
    for (size_t i = 0; i < n; i++) {
        w->gbits = MIN(w->gbits, qcow2_map_cluster_bits(layers[i]));
        w->wbits = MIN(w->wbits, qcow2_map_span_bits(layers[i]));
    }
    uint64_t block = 1ull << w->gbits;
    w->end = (size + block - 1) & ~(block - 1);
    w->pos = start & ~(block - 1);
    size_t wmax = (size_t)1 << (w->wbits - w->gbits);
    w->flags = xmalloc(wmax);
    w->acc = xmalloc(wmax);
    *ret = w;
    return 0;
}

void qcow2_walk_free(struct qcow2_walk *w)
{
    if (!w)
        return;
    free(w->flags);
    free(w->acc);
    free(w);
}

uint64_t qcow2_walk_block(const struct qcow2_walk *w) { return 1ull << w->gbits; }

/* acc[] of the window at w->pos (w->wn blocks): nonzero = in the answer.
 * *ret_read: whether any layer maps part of it. */
static int window_load(struct qcow2_walk *w, bool *ret_read, char **ret_msg)
{
    memset(w->acc, 0, w->wn);
    *ret_read = false;
    for (size_t l = 0; l < w->n; l++) {
        struct qcow2_map *m = w->layers[l];
        if (w->kind == QCOW2_WALK_ALLOCATED && m->size < w->pos + (w->wn << w->gbits)) {
            /* past this layer's end it reads zeros: decided, no data */
            for (size_t j = 0; j < w->wn; j++)
                if (w->pos + (j << w->gbits) >= m->size && !(w->acc[j] & 1))
                    w->acc[j] = 1;
        }
        if (!span_mapped(m, w->pos))
            continue;
        *ret_read = true;
        int r = qcow2_map_read(m, w->pos, w->wn, w->gbits, w->flags, ret_msg);
        if (r < 0)
            return r;
        for (size_t j = 0; j < w->wn; j++) {
            uint8_t f = w->flags[j];
            if (w->kind == QCOW2_WALK_CHANGED)
                w->acc[j] |= (f & QCOW2_MAP_PRESENT) ? 2 : 0;
            else if (!(w->acc[j] & 1) && (f & QCOW2_MAP_PRESENT))
                w->acc[j] = 1 | ((f & QCOW2_MAP_DATA) ? 2 : 0);
        }
    }
    return 0;
}

static void emit(struct qcow2_walk *w, struct qcow2_extent *out, size_t *n)
{
    struct qcow2_extent e = w->ext;
    if (e.off + e.len > w->size)
        e.len = w->size - e.off;
    out[(*n)++] = e;
    w->have = false;
}

int qcow2_walk_next(struct qcow2_walk *w, struct qcow2_extent *out, size_t max,
                    unsigned max_windows, size_t *ret_n, char **ret_msg)
{
    size_t n = 0;
    unsigned reads = 0, cheap = 0;
    uint64_t block = 1ull << w->gbits, wsize = 1ull << w->wbits;
    *ret_n = 0;
    if (w->done)
        return 1;
    while (n < max) {
        if (!w->loaded) {
            if (w->pos >= w->end) {
                if (w->have)
                    emit(w, out, &n);
                w->done = true;
                *ret_n = n;
                return 1;
            }
            if (reads >= max_windows || cheap >= CHEAP_WINDOWS)
                break;
            uint64_t wend = MIN((w->pos | (wsize - 1)) + 1, w->end);
            w->wn = (size_t)((wend - w->pos) >> w->gbits);
            bool read;
            int r = window_load(w, &read, ret_msg);
            if (r < 0)
                return r;
            if (read)
                reads++;
            else
                cheap++;
            w->wi = 0;
            w->loaded = true;
        }
        while (w->wi < w->wn && n < max) {
            uint64_t b = w->pos + (w->wi << w->gbits);
            if (w->acc[w->wi] & 2) {
                if (w->have && w->ext.off + w->ext.len == b) {
                    w->ext.len += block;
                } else {
                    if (w->have)
                        emit(w, out, &n);
                    w->ext = (struct qcow2_extent){b, block};
                    w->have = true;
                }
            }
            w->wi++;
        }
        if (w->wi == w->wn) {
            w->pos += (uint64_t)w->wn << w->gbits;
            w->loaded = false;
        }
    }
    *ret_n = n;
    return 0;
}
