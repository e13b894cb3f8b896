/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for layers.c, the pure graph logic of thin snapshots: qcow2
 * header parsing, layer names and backing references, in-flight overlay
 * names, the garbage rule (reference counting, deletion order) and the
 * chain-depth policy, and the chain read from QEMU's block graph.  No
 * daemon, no file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "qsd/qemu/layers.h"
#include "qsd/base/util.h"

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

static void header(uint8_t *b, uint32_t version, uint64_t boff, uint32_t bsize, uint64_t size)
{
    memset(b, 0, 64);
    memcpy(b, "QFI\xfb", 4);
    put32(b + 4, version);
    put64(b + 8, boff);
    put32(b + 16, bsize);
    put64(b + 24, size);
}

static void test_header(void **state)
{
    uint8_t b[64];
    struct qcow2_header h;
    header(b, 3, 0x200, 30, 1ull << 30);
    assert_int_equal(qcow2_header_parse(b, sizeof(b), &h), 0);
    assert_int_equal(h.version, 3);
    assert_int_equal(h.backing_offset, 0x200);
    assert_int_equal(h.backing_size, 30);
    assert_int_equal(h.size, 1ull << 30);
    header(b, 2, 0, 99, 4096); /* no backing: the size field is ignored */
    assert_int_equal(qcow2_header_parse(b, sizeof(b), &h), 0);
    assert_int_equal(h.backing_size, 0);
    header(b, 3, 0x200, 30, 1);
    assert_int_equal(qcow2_header_parse(b, 31, &h), -EINVAL);   /* too short */
    header(b, 4, 0x200, 30, 1);
    assert_int_equal(qcow2_header_parse(b, sizeof(b), &h), -EINVAL); /* version */
    header(b, 3, 0x200, 1024, 1);
    assert_int_equal(qcow2_header_parse(b, sizeof(b), &h), -EINVAL); /* name too long */
    header(b, 3, 0x200, 0, 1);
    assert_int_equal(qcow2_header_parse(b, sizeof(b), &h), -EINVAL); /* empty name */
    header(b, 3, 0, 0, 1);
    b[3] = 0xfc;
    assert_int_equal(qcow2_header_parse(b, sizeof(b), &h), -EINVAL); /* magic */
}

/* The format probe of an untrusted image (image_probe). */
static void test_probe(void **state)
{
    uint8_t b[IMAGE_PROBE_LEN];
    struct image_probe pr;
    const char *why = NULL;
    memset(b, 0xab, sizeof(b));
    assert_int_equal(image_probe(b, sizeof(b), &pr, &why), 0);
    assert_string_equal(pr.format, "raw");
    assert_int_equal(image_probe(b, 3, &pr, &why), 0); /* short: raw */
    memset(b, 0, sizeof(b));
    header(b, 3, 0, 0, 1ull << 30);
    put32(b + 100, 104);
    assert_int_equal(image_probe(b, sizeof(b), &pr, &why), 0);
    assert_string_equal(pr.format, "qcow2");
    assert_int_equal(pr.size, 1ull << 30);
    header(b, 2, 0, 0, 4096);
    assert_int_equal(image_probe(b, sizeof(b), &pr, &why), 0);
    /* refused: what would make QEMU open another file or want a key */
    header(b, 3, 0x200, 11, 4096);
    assert_int_equal(image_probe(b, sizeof(b), &pr, &why), -EMEDIUMTYPE);
    assert_non_null(strstr(why, "backing file"));
    header(b, 3, 0, 0, 4096);
    put32(b + 32, 1); /* crypt_method AES */
    assert_int_equal(image_probe(b, sizeof(b), &pr, &why), -EMEDIUMTYPE);
    assert_non_null(strstr(why, "encrypted"));
    header(b, 3, 0, 0, 4096);
    put64(b + 72, 1u << 2); /* incompatible feature: external data file */
    assert_int_equal(image_probe(b, sizeof(b), &pr, &why), -EMEDIUMTYPE);
    assert_non_null(strstr(why, "external data file"));
    header(b, 2, 0, 0, 4096);
    put64(b + 72, 1u << 2); /* version 2 has no such field: data */
    assert_int_equal(image_probe(b, sizeof(b), &pr, &why), 0);
    header(b, 3, 0, 0, 4096);
    assert_int_equal(image_probe(b, 50, &pr, &why), -EMEDIUMTYPE); /* truncated */
    header(b, 5, 0, 0, 4096);
    assert_int_equal(image_probe(b, sizeof(b), &pr, &why), -EMEDIUMTYPE); /* version */
    /* other formats */
    static const struct {
        size_t off;
        const char *magic, *name;
    } other[] = {{0, "KDMV", "vmdk"}, {0, "# Disk DescriptorFile", "vmdk"},
                 {0, "vhdxfile", "vhdx"}, {0, "conectix", "vpc"}, {64, "\x7f\x10\xda\xbe", "vdi"},
                 {0, "QED", "qed"}, {0, "LUKS\xba\xbe", "luks"}};
    for (size_t i = 0; i < ARRAY_SIZE(other); i++) {
        memset(b, 0, sizeof(b));
        memcpy(b + other[i].off, other[i].magic, strlen(other[i].magic));
        assert_int_equal(image_probe(b, sizeof(b), &pr, &why), -EMEDIUMTYPE);
        assert_non_null(strstr(why, other[i].name));
    }
    memcpy(b, "QEDX", 4); /* not qed's magic */
    assert_int_equal(image_probe(b, sizeof(b), &pr, &why), 0);
}

static void test_names_and_refs(void **state)
{
    char n[LAYER_NAME_LEN + 1], back[LAYER_NAME_LEN + 1];
    layer_name_from(0x0123456789abcdefull, n);
    assert_string_equal(n, "L0123456789abcdef");
    assert_true(layer_name_valid(n));
    assert_false(layer_name_valid("L0123456789ABCDEF"));
    assert_false(layer_name_valid("L0123456789abcde"));
    assert_false(layer_name_valid("X0123456789abcdef"));
    assert_false(layer_name_valid(NULL));
    _cleanup_free_ char *ref = layer_ref(n);
    assert_string_equal(ref, "../layers/L0123456789abcdef.qcow2");
    assert_int_equal(layer_from_ref(ref, back), 0);
    assert_string_equal(back, n);
    /* anything else is not one of ours: absolute, other directory, traversal */
    assert_int_equal(layer_from_ref("/pool/layers/L0123456789abcdef.qcow2", back), -EINVAL);
    assert_int_equal(layer_from_ref("../volumes/L0123456789abcdef.qcow2", back), -EINVAL);
    assert_int_equal(layer_from_ref("../layers/../L0123456789abcd.qcow2", back), -EINVAL);
    assert_int_equal(layer_from_ref("../layers/L0123456789abcdef.raw", back), -EINVAL);
    assert_int_equal(layer_from_ref(NULL, back), -EINVAL);
}

static void test_tmp_names(void **state)
{
    char l[LAYER_NAME_LEN + 1];
    _cleanup_free_ char *t = layer_tmp_name("pvc-1", "L00000000000000ff");
    assert_string_equal(t, ".pvc-1.qcow2.L00000000000000ff");
    assert_true(layer_tmp_parse(t, "pvc-1", l));
    assert_string_equal(l, "L00000000000000ff");
    /* another volume whose name extends this one's is not confused */
    assert_false(layer_tmp_parse(".pvc-1.qcow2.L00000000000000ff", "pvc", l));
    assert_false(layer_tmp_parse(".pvc-10.qcow2.L00000000000000ff", "pvc-1", l));
    /* restore/create temporaries and the volume itself are not in-flight overlays */
    assert_false(layer_tmp_parse(".pvc-1.qcow2.tmp-1234", "pvc-1", l));
    assert_false(layer_tmp_parse("pvc-1.qcow2", "pvc-1", l));
}

#define LA "L000000000000000a"
#define LB "L000000000000000b"
#define LC "L000000000000000c"
#define LD "L000000000000000d"

static void test_garbage_refcount(void **state)
{
    /* volume v: top -> C -> B -> A; snapshot s1 = A (second name), snapshot
     * s2 = C; restored volume r: top -> B.  D: left over, nothing uses it. */
    struct pool_file f[] = {
        {.kind = PF_VOLUME, .nlink = 1, .backing = LC},                    /* v */
        {.kind = PF_VOLUME, .nlink = 1, .backing = LB},                    /* r */
        {.kind = PF_SNAPSHOT, .nlink = 2},                                 /* s1 = A */
        {.kind = PF_SNAPSHOT, .nlink = 2, .backing = LB},                  /* s2 = C */
        {.kind = PF_LAYER, .layer = LA, .nlink = 2},
        {.kind = PF_LAYER, .layer = LB, .nlink = 1, .backing = LA},
        {.kind = PF_LAYER, .layer = LC, .nlink = 2, .backing = LB},
        {.kind = PF_LAYER, .layer = LD, .nlink = 1, .backing = LA},
    };
    bool g[ARRAY_SIZE(f)];
    assert_int_equal(layers_garbage(f, ARRAY_SIZE(f), g), 1);
    assert_true(g[7]);
    for (int i = 0; i < 7; i++)
        assert_false(g[i]);

    /* DeleteSnapshot s1: A loses its second name but B (used by v and r)
     * still needs it. */
    f[2].nlink = 0, f[2].kind = PF_LAYER, f[2].layer = "Lffffffffffffff0"; /* gone: a dummy */
    f[2].nlink = 2;
    f[4].nlink = 1;
    assert_int_equal(layers_garbage(f, ARRAY_SIZE(f), g), 1);
    assert_false(g[4]);

    /* DeleteVolume v, DeleteSnapshot s2: C goes; B and A stay for r. */
    f[0].backing = NULL, f[0].kind = PF_LAYER, f[0].layer = "Lfffffffffffffff", f[0].nlink = 2;
    f[3].backing = NULL;
    f[6].nlink = 1;
    assert_int_equal(layers_garbage(f, ARRAY_SIZE(f), g), 2);
    assert_true(g[6] && g[7]);
    assert_false(g[4] || g[5]);

    /* DeleteVolume r: everything below goes at once, whatever the order. */
    f[1].backing = NULL;
    assert_int_equal(layers_garbage(f, ARRAY_SIZE(f), g), 4);
    assert_true(g[4] && g[5] && g[6] && g[7]);
}

static void test_garbage_temporaries_and_unreadable(void **state)
{
    /* A snapshot in flight: the overlay (a file in volumes/) holds its new
     * layer; a layer whose header cannot be read is kept and not followed. */
    struct pool_file f[] = {
        {.kind = PF_VOLUME, .nlink = 1, .backing = LA},      /* .v.qcow2.LA */
        {.kind = PF_LAYER, .layer = LA, .nlink = 1, .backing = LB},
        {.kind = PF_LAYER, .layer = LB, .nlink = 1},
        {.kind = PF_LAYER, .layer = LC, .nlink = 1, .unreadable = true, .backing = LD},
        {.kind = PF_LAYER, .layer = LD, .nlink = 1},
    };
    bool g[ARRAY_SIZE(f)];
    assert_int_equal(layers_garbage(f, ARRAY_SIZE(f), g), 1);
    assert_true(g[4]);
    assert_false(g[0] || g[1] || g[2] || g[3]);
    /* a cycle (never made by us) does not loop */
    struct pool_file cyc[] = {
        {.kind = PF_LAYER, .layer = LA, .nlink = 1, .backing = LB},
        {.kind = PF_LAYER, .layer = LB, .nlink = 1, .backing = LA},
        {.kind = PF_VOLUME, .nlink = 1, .backing = LA},
    };
    bool gc[3];
    assert_int_equal(layers_garbage(cyc, 3, gc), 0);
    cyc[2].backing = NULL;
    assert_int_equal(layers_garbage(cyc, 3, gc), 2);
}

static void test_depth_policy(void **state)
{
    assert_int_equal(layers_merge_count(1, LAYER_MERGE_AT, LAYER_MERGE_TO), 0);
    assert_int_equal(layers_merge_count(LAYER_MERGE_AT, LAYER_MERGE_AT, LAYER_MERGE_TO), 0);
    /* past the threshold: back to LAYER_MERGE_TO, the base stays */
    assert_int_equal(layers_merge_count(LAYER_MERGE_AT + 1, LAYER_MERGE_AT, LAYER_MERGE_TO),
                     LAYER_MERGE_AT + 1 - LAYER_MERGE_TO);
    assert_int_equal(layers_merge_count(16, 8, 4), 12);
    /* explicit flatten keeps the top and one base at least */
    assert_int_equal(layers_merge_count(5, 0, 1), 3);
    assert_int_equal(layers_merge_count(2, 0, 1), 0);
    assert_false(layers_full(LAYER_MAX_DEPTH - 1));
    assert_true(layers_full(LAYER_MAX_DEPTH));
    /* a snapshot's chain is at most MAX-1, so a restore on it fits */
    assert_false(layers_full(LAYER_MAX_DEPTH - 1));
}

static void test_qemu_chain(void **state)
{
    /* The graph of a QSD after two live snapshots: export -> ov-2 -> ov-1 -> vol. */
    json_t *g = json_loads(
        "{\"nodes\":[{\"id\":1,\"name\":\"\",\"type\":\"block-backend\"},"
        "{\"id\":2,\"name\":\"vol\",\"type\":\"block-driver\"},"
        "{\"id\":3,\"name\":\"file0\",\"type\":\"block-driver\"},"
        "{\"id\":4,\"name\":\"ov-1\",\"type\":\"block-driver\"},"
        "{\"id\":5,\"name\":\"f-1\",\"type\":\"block-driver\"},"
        "{\"id\":6,\"name\":\"ov-2\",\"type\":\"block-driver\"}],"
        "\"edges\":[{\"parent\":1,\"child\":6,\"name\":\"root\"},"
        "{\"parent\":6,\"child\":4,\"name\":\"backing\"},"
        "{\"parent\":4,\"child\":5,\"name\":\"file\"},"
        "{\"parent\":4,\"child\":2,\"name\":\"backing\"},"
        "{\"parent\":2,\"child\":3,\"name\":\"file\"}]}",
        0, NULL);
    assert_non_null(g);
    const char **names;
    size_t n;
    assert_int_equal(layers_qemu_chain(g, "ov-2", &names, &n), 0);
    assert_int_equal(n, 3);
    assert_string_equal(names[0], "ov-2");
    assert_string_equal(names[1], "ov-1");
    assert_string_equal(names[2], "vol");
    free(names);
    assert_int_equal(layers_qemu_chain(g, "nope", &names, &n), -ENOENT);
    /* a loop is bounded */
    json_array_append_new(json_object_get(g, "edges"),
                          json_pack("{s:i, s:i, s:s}", "parent", 2, "child", 6, "name", "backing"));
    assert_int_equal(layers_qemu_chain(g, "ov-2", &names, &n), -ELOOP);
    json_decref(g);
    json_t *bad = json_pack("{s:[]}", "nodes");
    assert_int_equal(layers_qemu_chain(bad, "x", &names, &n), -EBADMSG);
    json_decref(bad);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header),
        cmocka_unit_test(test_probe),
        cmocka_unit_test(test_names_and_refs),
        cmocka_unit_test(test_tmp_names),
        cmocka_unit_test(test_garbage_refcount),
        cmocka_unit_test(test_garbage_temporaries_and_unreadable),
        cmocka_unit_test(test_depth_policy),
        cmocka_unit_test(test_qemu_chain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
