/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for qcow2map.c: qcow2 layers built byte by byte in memory
 * files (memfd), their maps, the allocated and changed walks over chains
 * (extents merged across L2 spans, paging, a starting offset), and hostile
 * headers and tables refused with an error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "qsd/qemu/qcow2map.h"
#include "qsd/base/util.h"

#include <sys/mman.h>
#include <unistd.h>

#define CB 16u
#define CS (1ull << CB)
#define SPAN (1ull << (2 * CB - 3)) /* 512 MiB */
#define L2N (CS / 8)

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

/* A version 3 layer of size bytes, 64 KiB clusters: header in cluster 0,
 * L1 in cluster 1, the L2 table of span s in cluster 2 + s. */
struct img {
    uint8_t *b;
    size_t len;
    uint64_t size;
};

static void img_init(struct img *im, uint64_t size)
{
    uint64_t spans = (size + SPAN - 1) / SPAN;
    im->size = size;
    im->len = (size_t)((2 + spans) * CS);
    im->b = xcalloc(1, im->len);
    put32(im->b, 0x514649fb);
    put32(im->b + 4, 3);
    put32(im->b + 20, CB);
    put64(im->b + 24, size);
    put32(im->b + 36, (uint32_t)spans);
    put64(im->b + 40, CS);
    put32(im->b + 100, 104);
}

/* Cluster c: 'd' data, 'z' zero, 'c' compressed. */
static void img_set(struct img *im, uint64_t c, char kind)
{
    uint64_t s = c / L2N, l2 = (2 + s) * CS;
    put64(im->b + CS + s * 8, l2);
    uint64_t e = kind == 'z' ? 1 : kind == 'c' ? (1ull << 62) | 0x1000 : (1000 + c) * CS;
    put64(im->b + l2 + (c % L2N) * 8, e);
}

static struct qcow2_map *img_open(struct img *im)
{
    int fd = memfd_create("layer", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, im->b, im->len), (ssize_t)im->len);
    struct qcow2_map *m = NULL;
    _cleanup_free_ char *msg = NULL;
    int r = qcow2_map_open_fd(fd, "layer", &m, &msg);
    if (r < 0)
        fail_msg("open: %s", msg);
    free(im->b);
    return m;
}

static int img_open_err(struct img *im, char **msg)
{
    int fd = memfd_create("layer", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, im->b, im->len), (ssize_t)im->len);
    free(im->b);
    struct qcow2_map *m = NULL;
    int r = qcow2_map_open_fd(fd, "layer", &m, msg);
    assert_true(r < 0);
    assert_null(m);
    return r;
}

/* The whole walk, max extents per call, as "off+len,..." in clusters. */
static char *walk(enum qcow2_walk_kind k, struct qcow2_map **l, size_t n, uint64_t size,
                  uint64_t start, size_t max)
{
    struct qcow2_walk *w;
    assert_int_equal(qcow2_walk_new(k, l, n, size, start, &w), 0);
    char *s = xstrdup("");
    struct qcow2_extent ext[16];
    int r, calls = 0;
    do {
        size_t got;
        _cleanup_free_ char *msg = NULL;
        r = qcow2_walk_next(w, ext, max, 1, &got, &msg);
        assert_true(r >= 0);
        assert_true(got <= max);
        for (size_t i = 0; i < got; i++) {
            char *t = xasprintf("%s%s%llu+%llu", s, *s ? "," : "",
                                (unsigned long long)(ext[i].off / CS),
                                (unsigned long long)((ext[i].len + CS - 1) / CS));
            free(s);
            s = t;
        }
        assert_true(++calls < 100000);
    } while (r == 0);
    qcow2_walk_free(w);
    return s;
}

static void test_single_layer(void **state)
{
    struct img im;
    img_init(&im, 64 * CS);
    img_set(&im, 0, 'd');
    img_set(&im, 1, 'c');
    img_set(&im, 5, 'd');
    img_set(&im, 7, 'z');
    img_set(&im, 63, 'd');
    struct qcow2_map *m = img_open(&im);
    assert_int_equal(qcow2_map_size(m), 64 * CS);
    uint8_t f[64];
    _cleanup_free_ char *msg = NULL;
    assert_int_equal(qcow2_map_read(m, 0, 64, CB, f, &msg), 0);
    assert_int_equal(f[0], QCOW2_MAP_PRESENT | QCOW2_MAP_DATA);
    assert_int_equal(f[1], QCOW2_MAP_PRESENT | QCOW2_MAP_DATA);
    assert_int_equal(f[2], 0);
    assert_int_equal(f[7], QCOW2_MAP_PRESENT);
    /* smaller blocks than clusters: every block of a cluster alike */
    assert_int_equal(qcow2_map_read(m, 4 * CS, 32, CB - 3, f, &msg), 0);
    assert_int_equal(f[0], 0);
    assert_int_equal(f[8], QCOW2_MAP_PRESENT | QCOW2_MAP_DATA);
    assert_int_equal(f[15], QCOW2_MAP_PRESENT | QCOW2_MAP_DATA);
    assert_int_equal(f[16], 0);
    /* requests across a span or misaligned are refused */
    assert_int_equal(qcow2_map_read(m, 1, 1, CB, f, &msg), -EINVAL);
    struct qcow2_map *l[] = {m};
    char *s;
    assert_string_equal(s = walk(QCOW2_WALK_ALLOCATED, l, 1, 64 * CS, 0, 16), "0+2,5+1,63+1");
    free(s);
    assert_string_equal(s = walk(QCOW2_WALK_CHANGED, l, 1, 64 * CS, 0, 16), "0+2,5+1,7+1,63+1");
    free(s);
    /* paging: one extent per call, the same list */
    assert_string_equal(s = walk(QCOW2_WALK_CHANGED, l, 1, 64 * CS, 0, 1), "0+2,5+1,7+1,63+1");
    free(s);
    /* a starting offset inside an extent: that extent first, whole */
    assert_string_equal(s = walk(QCOW2_WALK_CHANGED, l, 1, 64 * CS, CS + 17, 16),
                        "1+1,5+1,7+1,63+1");
    free(s);
    assert_string_equal(s = walk(QCOW2_WALK_CHANGED, l, 1, 64 * CS, 6 * CS, 16), "7+1,63+1");
    free(s);
    struct qcow2_walk *w;
    assert_int_equal(qcow2_walk_new(QCOW2_WALK_CHANGED, l, 1, 64 * CS, 64 * CS, &w), -EINVAL);
    qcow2_map_free(m);
}

/* top: zero at 0, data at 3; base: data at 0..2 and 9; the volume grew
 * past the base's size (base 8 clusters, top 16). */
static void test_chain(void **state)
{
    struct img top, base;
    img_init(&top, 16 * CS);
    img_set(&top, 0, 'z');
    img_set(&top, 3, 'd');
    img_set(&top, 12, 'd');
    img_init(&base, 10 * CS);
    img_set(&base, 0, 'd');
    img_set(&base, 1, 'd');
    img_set(&base, 2, 'd');
    img_set(&base, 9, 'd');
    put64(base.b + 24, 8 * CS); /* cluster 9 lies past its size: never read */
    struct qcow2_map *l[] = {img_open(&top), img_open(&base)};
    char *s;
    assert_string_equal(s = walk(QCOW2_WALK_ALLOCATED, l, 2, 16 * CS, 0, 16), "1+3,12+1");
    free(s);
    /* changed from a snapshot whose chain is the base alone: the top's */
    assert_string_equal(s = walk(QCOW2_WALK_CHANGED, l, 1, 16 * CS, 0, 16), "0+1,3+1,12+1");
    free(s);
    /* a size that is not a multiple of the block: the last extent clipped */
    struct qcow2_walk *w;
    assert_int_equal(qcow2_walk_new(QCOW2_WALK_ALLOCATED, l, 2, 12 * CS + 100, 0, &w), 0);
    struct qcow2_extent e[4];
    size_t n;
    _cleanup_free_ char *msg = NULL;
    assert_int_equal(qcow2_walk_next(w, e, 4, 100, &n, &msg), 1);
    assert_int_equal(n, 2);
    assert_int_equal(e[1].off, 12 * CS);
    assert_int_equal(e[1].len, 100);
    qcow2_walk_free(w);
    qcow2_map_free(l[0]);
    qcow2_map_free(l[1]);
}

/* Extents merge across L2 spans; windows without any table are skipped. */
static void test_spans(void **state)
{
    struct img im;
    img_init(&im, 4 * SPAN);
    img_set(&im, L2N - 2, 'd');
    img_set(&im, L2N - 1, 'd');
    img_set(&im, L2N, 'd');
    img_set(&im, 3 * L2N + 4, 'd');
    struct qcow2_map *l[] = {img_open(&im)};
    _cleanup_free_ char *want = xasprintf("%llu+3,%llu+1", (unsigned long long)(L2N - 2),
                                          (unsigned long long)(3 * L2N + 4));
    char *s = walk(QCOW2_WALK_ALLOCATED, l, 1, 4 * SPAN, 0, 16);
    assert_string_equal(s, want);
    free(s);
    qcow2_map_free(l[0]);
}

static void test_hostile(void **state)
{
    struct img im;
    char *msg = NULL;
    img_init(&im, 4 * CS);
    im.b[0] = 0;
    img_open_err(&im, &msg);
    assert_non_null(strstr(msg, "magic"));
    free(msg), msg = NULL;

    img_init(&im, 4 * CS);
    put64(im.b + 72, 2); /* corrupt */
    img_open_err(&im, &msg);
    assert_non_null(strstr(msg, "corrupt"));
    free(msg), msg = NULL;

    img_init(&im, 4 * CS);
    put64(im.b + 72, 1u << 4); /* extended L2 */
    img_open_err(&im, &msg);
    free(msg), msg = NULL;

    img_init(&im, 2 * SPAN);
    put32(im.b + 36, 1); /* L1 smaller than the size needs */
    img_open_err(&im, &msg);
    assert_non_null(strstr(msg, "L1"));
    free(msg), msg = NULL;

    img_init(&im, 4 * CS);
    put64(im.b + 40, 1000 * CS); /* L1 past the end of the file */
    img_open_err(&im, &msg);
    assert_non_null(strstr(msg, "ends first"));
    free(msg), msg = NULL;

    img_init(&im, 4 * CS);
    put32(im.b + 20, 30); /* cluster bits */
    img_open_err(&im, &msg);
    free(msg), msg = NULL;

    img_init(&im, 4 * CS);
    put64(im.b + 24, 1ull << 62); /* size, and an L1 that would need GiBs */
    img_open_err(&im, &msg);
    free(msg), msg = NULL;

    /* an L2 table pointer past the end of the file, or misaligned: the
     * open succeeds (the L1 is fine), the walk fails */
    for (int i = 0; i < 2; i++) {
        img_init(&im, 4 * CS);
        put64(im.b + CS, i ? 5000 * CS : 2 * CS + 512);
        struct qcow2_map *l[] = {img_open(&im)};
        struct qcow2_walk *w;
        assert_int_equal(qcow2_walk_new(QCOW2_WALK_CHANGED, l, 1, 4 * CS, 0, &w), 0);
        struct qcow2_extent e[4];
        size_t n;
        assert_true(qcow2_walk_next(w, e, 4, 10, &n, &msg) < 0);
        assert_non_null(msg);
        free(msg), msg = NULL;
        qcow2_walk_free(w);
        qcow2_map_free(l[0]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_layer),
        cmocka_unit_test(test_chain),
        cmocka_unit_test(test_spans),
        cmocka_unit_test(test_hostile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
