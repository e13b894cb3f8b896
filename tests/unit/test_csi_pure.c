/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the CSI plugin's pure parts: StorageClass parameters
 * (every key, unknown keys, bad values, combinations), capacity ranges, the
 * lexical path rules, the state records' JSON round trip, the capacity
 * policy (flags, refusals, GetCapacity figures), and the record store
 * (records.h: a change is visible at once, durable once the flusher says
 * so, loaded back with its id checked), the RBD backend's ids,
 * parameters, secrets and cluster file (rbd.h), and the choice of a
 * backend (backend.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "backend.h"
#include "capacity.h"
#include "csi.pb-c.h"
#include "params.h"
#include "pbcheck.h"
#include "qos.h"
#include "paths.h"
#include "rbd.h"
#include "qsd/state/records.h"
#include "qsd/state/state.h"
#include "qsd/base/loop.h"
#include "qsd/base/util.h"
#include "qsd/qemu/imagebase.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>

static int parse(const char *const *kv, size_t n, struct vol_params *p, char **msg)
{
    const char *keys[16], *vals[16];
    for (size_t i = 0; i < n; i++) {
        keys[i] = kv[2 * i];
        vals[i] = kv[2 * i + 1];
    }
    return vol_params_parse(n, keys, vals, p, msg);
}

static void test_params_defaults(void **state)
{
    struct vol_params p;
    char *msg = NULL;
    assert_int_equal(vol_params_parse(0, NULL, NULL, &p, &msg), 0);
    assert_string_equal(p.format, "qcow2");
    assert_string_equal(p.preallocation, "off");
    assert_int_equal(p.opts.num_queues, 1);
    assert_int_equal(p.opts.logical_block_size, 512);
    assert_string_equal(p.opts.cache, "none");
    assert_null(p.opts.aio); /* the default, resolved by qsd_opts_aio() */
    assert_string_equal(p.opts.discard, "unmap");
    assert_string_equal(p.opts.detect_zeroes, "off");
    assert_null(p.opts.image);
    vol_params_clear(&p);
}

static void test_params_every_key(void **state)
{
    static const char *const kv[] = {
        "format", "raw", "preallocation", "falloc", "cache", "writeback", "aio", "threads",
        "numQueues", "4", "logicalBlockSize", "4096", "discard", "ignore", "detectZeroes", "on",
        "csi.storage.k8s.io/pvc/name", "claim", "csi.storage.k8s.io/pv/name", "pv",
    };
    struct vol_params p;
    char *msg = NULL;
    assert_int_equal(parse(kv, ARRAY_SIZE(kv) / 2, &p, &msg), 0);
    assert_string_equal(p.format, "raw");
    assert_string_equal(p.preallocation, "falloc");
    assert_string_equal(p.opts.cache, "writeback");
    assert_string_equal(p.opts.aio, "threads");
    assert_int_equal(p.opts.num_queues, 4);
    assert_int_equal(p.opts.logical_block_size, 4096);
    assert_string_equal(p.opts.discard, "ignore");
    assert_string_equal(p.opts.detect_zeroes, "on");
    vol_params_clear(&p);
}

static void test_params_bad(void **state)
{
    static const struct {
        const char *k, *v, *needle;
    } cases[] = {
        {"colour", "blue", "unknown parameter 'colour'"},
        {"Format", "qcow2", "unknown parameter"},
        {"format", "vmdk", "format"},
        {"preallocation", "metadata-ish", "preallocation"},
        {"cache", "sometimes", "cache"},
        {"aio", "posix", "aio"},
        {"numQueues", "0", "numQueues"},
        {"numQueues", "17", "numQueues"},
        {"numQueues", "two", "numQueues"},
        {"logicalBlockSize", "1024", "logicalBlockSize"},
        {"discard", "yes", "discard"},
        {"detectZeroes", "always", "detectZeroes"},
    };
    for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
        const char *kv[] = {cases[i].k, cases[i].v};
        struct vol_params p;
        char *msg = NULL;
        assert_int_equal(parse(kv, 1, &p, &msg), -EINVAL);
        assert_non_null(msg);
        if (!strstr(msg, cases[i].needle))
            fail_msg("case %zu: message '%s' lacks '%s'", i, msg, cases[i].needle);
        free(msg);
    }
}

static void test_params_combinations(void **state)
{
    static const char *const native[] = {"aio", "native", "cache", "writeback"};
    static const char *const dz[] = {"detectZeroes", "unmap", "discard", "ignore"};
    static const char *const rawmeta[] = {"format", "raw", "preallocation", "metadata"};
    static const char *const ok[] = {"aio", "native", "cache", "directsync"};
    const char *const *bad[] = {native, dz, rawmeta};
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        struct vol_params p;
        char *msg = NULL;
        assert_int_equal(parse(bad[i], 2, &p, &msg), -EINVAL);
        free(msg);
    }
    struct vol_params p;
    char *msg = NULL;
    assert_int_equal(parse(ok, 2, &p, &msg), 0);
    vol_params_clear(&p);
}

static void test_params_image(void **state)
{
    static const char sha[] = "d9298a10d1b0735837dc4bd85dac641b0f3cef27a47e5d53a54f2f3f5b2fcffa";
    static const char *const ok[] = {"image", "https://example.org/img.qcow2", "imageSha256", sha};
    struct vol_params p;
    char *msg = NULL;
    assert_int_equal(parse(ok, 2, &p, &msg), 0);
    assert_string_equal(p.image, "https://example.org/img.qcow2");
    assert_string_equal(p.image_digest, sha);
    vol_params_clear(&p);
    /* SHA-512: Debian publishes SHA512SUMS only */
    static const char sha512[] =
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
        "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
    static const char *const ok512[] = {"image", "https://example.org/img.qcow2",
                                        "imageSha512", sha512};
    assert_int_equal(parse(ok512, 2, &p, &msg), 0);
    assert_string_equal(p.image_digest, sha512);
    vol_params_clear(&p);
    static const struct {
        const char *kv[6];
        size_t n;
        const char *needle;
    } bad[] = {
        {{"image", "https://example.org/x"}, 1, "needs imageSha256"},
        {{"imageSha256", sha}, 1, "needs image"},
        {{"image", "file:///etc/shadow", "imageSha256", sha}, 2, "parameter image: is not an http"},
        {{"image", "ftp://h/x", "imageSha256", sha}, 2, "image"},
        {{"image", "http://", "imageSha256", sha}, 2, "no host"},
        {{"image", "http:///x", "imageSha256", sha}, 2, "no host"},
        {{"image", "http://h/a b", "imageSha256", sha}, 2, "space"},
        {{"image", "http://h/a\x7f", "imageSha256", sha}, 2, "control"},
        {{"image", "", "imageSha256", sha}, 2, "empty"},
        {{"image", "http://h/x", "imageSha256", "abc"}, 2, "imageSha256: is not 64"},
        {{"image", "http://h/x", "imageSha256", "D9298A10D1B0735837DC4BD85DAC641B0F3CEF27A47E5D53A54F2F3F5B2FCFFA"},
         2, "lowercase"},
        {{"image", "http://h/x", "imageSha256", sha, "format", "raw"}, 3, "format qcow2"},
        {{"image", "http://h/x", "imageSha256", sha, "preallocation", "full"}, 3, "preallocation off"},
        {{"image", "http://h/x", "imageSha256", sha, "imageSha512", sha512}, 3,
         "imageSha256 and imageSha512: give one of them, not both"},
        {{"image", "http://h/x", "imageSha512", sha512, "imageSha256", sha}, 3, "not both"},
        {{"imageSha512", sha512}, 1, "needs image"},
        {{"image", "http://h/x"}, 1, "needs imageSha256 or imageSha512"},
        {{"image", "http://h/x", "imageSha512", sha}, 2,
         "invalid parameter imageSha512: is not 128 hexadecimal digits"},
        {{"image", "http://h/x", "imageSha256", sha512}, 2,
         "invalid parameter imageSha256: is not 64 hexadecimal digits"},
        {{"image", "http://h/x", "imageSha512",
          "0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef"
          "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"},
         2, "imageSha512: is not 128 lowercase"},
        {{"image", "http://h/x", "imageSha512",
          "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
          "fedcba9876543210fedcba9876543210fedcba9876543210fedcba987654321g"},
         2, "imageSha512: is not 128 lowercase"},
    };
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        msg = NULL;
        assert_int_equal(parse(bad[i].kv, bad[i].n, &p, &msg), -EINVAL);
        if (!strstr(msg, bad[i].needle))
            fail_msg("case %zu: message '%s' lacks '%s'", i, msg, bad[i].needle);
        free(msg);
    }
    char *longurl = xmalloc(2100);
    memset(longurl, 'a', 2099);
    memcpy(longurl, "http://", 7);
    longurl[2099] = '\0';
    const char *kv[] = {"image", longurl, "imageSha256", sha};
    msg = NULL;
    assert_int_equal(parse(kv, 2, &p, &msg), -EINVAL);
    assert_non_null(strstr(msg, "2048"));
    free(msg);
    free(longurl);
}

static void test_capacity(void **state)
{
    uint64_t s;
    char *msg = NULL;
    assert_int_equal(capacity_pick(0, 0, 0, 512, &s, &msg), 0);
    assert_int_equal(s, VOLUME_DEFAULT_SIZE);
    assert_int_equal(capacity_pick(1, 0, 0, 512, &s, &msg), 0);
    assert_int_equal(s, 512);
    assert_int_equal(capacity_pick(4097, 0, 0, 4096, &s, &msg), 0);
    assert_int_equal(s, 8192);
    assert_int_equal(capacity_pick(0, 10 << 20, 0, 512, &s, &msg), 0);
    assert_int_equal(s, 10 << 20);
    assert_int_equal(capacity_pick(0, 1000, 0, 512, &s, &msg), 0);
    assert_int_equal(s, 512);
    assert_int_equal(capacity_pick(0, 0, 3 << 20, 512, &s, &msg), 0); /* source size */
    assert_int_equal(s, 3 << 20);
    assert_int_equal(capacity_pick(1 << 20, 0, 3 << 20, 512, &s, &msg), 0);
    assert_int_equal(s, 3 << 20);
    static const struct {
        int64_t req, lim;
        uint64_t min;
        unsigned align;
        int want;
    } bad[] = {
        {-1, 0, 0, 512, -EINVAL},
        {0, -1, 0, 512, -EINVAL},
        {2048, 1024, 0, 512, -EINVAL},
        {1000, 1000, 0, 512, -ERANGE},
        {0, 100, 0, 512, -ERANGE},
        {0, 1 << 20, 2 << 20, 512, -ERANGE},
        {(int64_t)(2ull << 50), 0, 0, 512, -ERANGE},
    };
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        msg = NULL;
        int r = capacity_pick(bad[i].req, bad[i].lim, bad[i].min, bad[i].align, &s, &msg);
        if (r != bad[i].want)
            fail_msg("case %zu: got %d", i, r);
        assert_non_null(msg);
        free(msg);
    }
}

/* Strings with a NUL byte are named by their field path, at any depth and
 * in map entries; clean and malformed messages pass (the decoder judges). */
static void test_pbcheck(void **state)
{
    char *f = NULL;
    static const uint8_t del[] = {0x0a, 16, 'p', 'v', 'c', '-', 'v', 'i', 'c', 't', 'i', 'm',
                                  0,    '/', '.', '.', '/', 'x'};
    assert_int_equal(pb_check_strings(&csi__v1__delete_volume_request__descriptor, del,
                                      sizeof(del), &f), -EINVAL);
    assert_string_equal(f, "volume_id");
    free(f), f = NULL;
    static const uint8_t clean[] = {0x0a, 3, 'p', 'v', 'c'};
    assert_int_equal(pb_check_strings(&csi__v1__delete_volume_request__descriptor, clean,
                                      sizeof(clean), &f), 0);
    /* CreateVolumeRequest.parameters (4) = {key (1): "k", value (2): "a\0b"} */
    static const uint8_t params[] = {0x0a, 1, 'n', 0x22, 8, 0x0a, 1, 'k', 0x12, 3, 'a', 0, 'b'};
    assert_int_equal(pb_check_strings(&csi__v1__create_volume_request__descriptor, params,
                                      sizeof(params), &f), -EINVAL);
    assert_string_equal(f, "parameters.value");
    free(f), f = NULL;
    /* NodeStageVolumeRequest.volume_capability (4).mount (2).volume_mount_group (3) */
    static const uint8_t stage[] = {0x22, 6, 0x12, 4, 0x1a, 2, '1', 0};
    assert_int_equal(pb_check_strings(&csi__v1__node_stage_volume_request__descriptor, stage,
                                      sizeof(stage), &f), -EINVAL);
    assert_string_equal(f, "volume_capability.mount.volume_mount_group");
    free(f), f = NULL;
    /* bytes fields and unknown fields may hold NULs; truncated input passes */
    static const uint8_t unknown[] = {0xfa, 0x01, 2, 0, 0};
    assert_int_equal(pb_check_strings(&csi__v1__delete_volume_request__descriptor, unknown,
                                      sizeof(unknown), &f), 0);
    static const uint8_t trunc[] = {0x0a, 40, 'a', 0};
    assert_int_equal(pb_check_strings(&csi__v1__delete_volume_request__descriptor, trunc,
                                      sizeof(trunc), &f), 0);
    assert_null(f);
    /* 100000 empty volume_capabilities (field 3): a 200 KB request that
     * protobuf-c would turn into 100000 structures */
    size_t n = 100000;
    uint8_t *many = malloc(2 * n);
    for (size_t i = 0; i < n; i++)
        many[2 * i] = 0x1a, many[2 * i + 1] = 0;
    assert_int_equal(pb_check_strings(&csi__v1__create_volume_request__descriptor, many, 2 * n,
                                      &f), -E2BIG);
    assert_int_equal(pb_check_strings(&csi__v1__create_volume_request__descriptor, many, 2000,
                                      &f), 0);
    free(many);
}

static void test_paths(void **state)
{
    const char *why;
    const char *root = "/var/lib/kubelet";
    static const char *const good[] = {
        "/var/lib/kubelet/pods/x/volumes/kubernetes.io~csi/pvc-1/mount",
        "/var/lib/kubelet/a",
        "/var/lib/kubelet/..a/b...",
    };
    for (size_t i = 0; i < ARRAY_SIZE(good); i++)
        if (path_check_lexical(root, good[i], &why) != 0)
            fail_msg("%s refused: %s", good[i], why);
    static const char *const bad[] = {
        "", "relative/path", "/var/lib/kubelet", "/var/lib/kubelet/", "/var/lib/kubeletX/a",
        "/var/lib/kubelet/../etc", "/var/lib/kubelet/a/../../etc", "/var/lib/kubelet/./a",
        "/var/lib/kubelet//a", "/etc/passwd", "/var/lib/kubelet/a\nb", "/var/lib/kubelet/..",
    };
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        why = NULL;
        if (path_check_lexical(root, bad[i], &why) != -EINVAL)
            fail_msg("'%s' accepted", bad[i]);
        assert_non_null(why);
    }
    _cleanup_free_ char *big = xmalloc(CSI_PATH_MAX + 32);
    strcpy(big, "/var/lib/kubelet/");
    memset(big + strlen(big), 'a', CSI_PATH_MAX);
    big[CSI_PATH_MAX + 10] = '\0';
    assert_int_equal(path_check_lexical(root, big, &why), -EINVAL);
    assert_int_equal(path_check_lexical("/", "/a/b", &why), 0);
    assert_int_equal(path_check_lexical("/", "/", &why), -EINVAL);
}

static void test_state_roundtrip(void **state)
{
    struct vol *v = vol_new("pvc-1");
    v->phase = PHASE_READY;
    v->size = 1 << 30;
    v->image_size = 1 << 29;
    json_object_set_new(v->parameters, "numQueues", json_string("2"));
    v->src_type = xstrdup("snapshot");
    v->src_id = xstrdup("snap-1");
    v->staging_path = xstrdup("/k/staging");
    v->stage_gid = 107;
    vol_add_pub(v, "/k/t1", false);
    vol_add_pub(v, "/k/t2", true);
    vol_pub_set_pod(v, 1, "a2a2-uid", "vm-demo");
    v->released_ms = 1763776000123;
    v->mutable_params = json_pack("{s:s}", "readIops", "500");
    json_t *j = vol_to_json(v);
    struct vol *w;
    char *msg = NULL;
    assert_int_equal(vol_from_json(j, &w, &msg), 0);
    json_t *j2 = vol_to_json(w);
    assert_true(json_equal(j, j2));
    assert_int_equal(w->n_pubs, 2);
    assert_true(w->pubs[1].read_only);
    assert_null(w->pubs[0].pod_uid);
    assert_string_equal(w->pubs[1].pod_uid, "a2a2-uid");
    assert_string_equal(w->pubs[1].pod_ns, "vm-demo");
    assert_int_equal(w->released_ms, 1763776000123);
    assert_int_equal(w->stage_gid, 107);
    assert_string_equal(json_string_value(json_object_get(w->mutable_params, "readIops")), "500");
    json_decref(j2);
    /* A record naming a traversal id is refused. */
    json_object_set_new(j, "id", json_string("../x"));
    struct vol *x = NULL;
    assert_int_equal(vol_from_json(j, &x, &msg), -EBADMSG);
    assert_null(x);
    free(msg);
    json_decref(j);
    vol_free(v);
    vol_free(w);

    struct snap *sn = snap_new("s1");
    sn->source = xstrdup("pvc-1");
    sn->size = 4096;
    sn->created_sec = 1700000000;
    sn->created_nsec = 5;
    j = snap_to_json(sn);
    struct snap *sn2;
    msg = NULL;
    assert_int_equal(snap_from_json(j, &sn2, &msg), 0);
    assert_string_equal(sn2->source, "pvc-1");
    assert_int_equal(sn2->created_nsec, 5);
    assert_null(sn2->layers); /* a full copy (or a record from before layers) */
    json_decref(j);
    snap_free(sn2);

    /* thin: the chain of layers, its own first; names are checked */
    sn->layers = json_pack("[s,s]", "L00000000000000c3", "L00000000000000a1");
    j = snap_to_json(sn);
    assert_int_equal(snap_from_json(j, &sn2, &msg), 0);
    assert_true(json_equal(sn2->layers, sn->layers));
    snap_free(sn2);
    json_object_set_new(j, "layers", json_pack("[s]", "../../etc/passwd"));
    sn2 = NULL;
    assert_int_equal(snap_from_json(j, &sn2, &msg), -EBADMSG);
    assert_null(sn2);
    free(msg);
    json_object_set_new(j, "layers", json_array());
    msg = NULL;
    assert_int_equal(snap_from_json(j, &sn2, &msg), -EBADMSG);
    free(msg);
    json_decref(j);
    snap_free(sn);
}

static uint64_t durable_seq;
static int durable_err = 1;
static void on_durable(uint64_t seq, int err, void *opaque)
{
    (void)opaque;
    durable_seq = seq;
    durable_err = err;
}

static int load_one(json_t *j, void *opaque, char **msg)
{
    (void)msg;
    int *n = opaque;
    assert_int_equal(json_integer_value(json_object_get(j, "v")), 2);
    (*n)++;
    return 0;
}

static void test_records(void **state)
{
    (void)state;
    char dir[] = "/tmp/test-records-XXXXXX";
    assert_non_null(mkdtemp(dir));
    struct loop *l;
    struct records *r;
    assert_int_equal(loop_new(&l), 0);
    assert_int_equal(records_new(l, &r), 0);
    records_on_durable(r, on_durable, NULL);
    assert_int_equal(records_queued(r), 0);
    assert_int_equal(records_save(r, dir, "a", json_pack("{s:s, s:i}", "id", "a", "v", 1)), 0);
    assert_int_equal(records_save(r, dir, "a", json_pack("{s:s, s:i}", "id", "a", "v", 2)), 0);
    assert_int_equal(records_save(r, dir, "b", json_pack("{s:s, s:i}", "id", "x", "v", 2)), 0);
    assert_int_equal(records_save(r, dir, "c", json_pack("{s:s, s:i}", "id", "c", "v", 2)), 0);
    assert_int_equal(records_remove(r, dir, "c"), 0);
    assert_int_equal(records_remove(r, dir, "never"), 0);
    assert_int_equal(records_queued(r), 5);
    /* in a worker child this is what runs before the operation */
    assert_int_equal(records_flush_pending(r), 0);
    for (int i = 0; i < 500 && durable_seq < 5; i++)
        assert_true(loop_run_once(l, 20) >= 0);
    assert_int_equal(durable_seq, 5);
    assert_int_equal(durable_err, 0);
    /* "b" names another id: skipped; "c" is gone */
    int n = 0;
    records_load(dir, "id", load_one, &n);
    assert_int_equal(n, 1);
    n = 0;
    records_load(dir, NULL, load_one, &n);
    assert_int_equal(n, 2);
    records_free(r);
    loop_free(l);
    /* without a flusher: synchronous */
    assert_int_equal(records_save(NULL, dir, "d", json_pack("{s:s, s:i}", "id", "d", "v", 2)), 0);
    assert_int_equal(records_remove(NULL, dir, "d"), 0);
    const char *names[] = {"a", "b"};
    for (size_t i = 0; i < 2; i++)
        assert_int_equal(records_remove(NULL, dir, names[i]), 0);
    assert_int_equal(rmdir(dir), 0);
}

static void test_capacity_policy(void **state)
{
    struct capacity_policy p = {0};
    assert_int_equal(capacity_parse_reserve("10%", &p), 0);
    assert_int_equal(p.reserve_pct, 10);
    assert_int_equal(capacity_parse_reserve("1G", &p), 0);
    assert_int_equal(p.reserve_pct, 0);
    assert_true(p.reserve_bytes == 1ull << 30);
    const char *bad_reserve[] = {"", "%", "100%", "-1", "1.5G", "x%", "10 %"};
    for (size_t i = 0; i < ARRAY_SIZE(bad_reserve); i++)
        assert_int_equal(capacity_parse_reserve(bad_reserve[i], &p), -EINVAL);
    assert_int_equal(capacity_parse_ratio("1.5", &p), 0);
    assert_int_equal(p.overcommit_x100, 150);
    assert_int_equal(capacity_parse_ratio("2.25", &p), 0);
    assert_int_equal(p.overcommit_x100, 225);
    const char *bad_ratio[] = {"", "0", "0.00", "1.", ".5", "1.234", "1001", "-1", "1e3"};
    for (size_t i = 0; i < ARRAY_SIZE(bad_ratio); i++)
        assert_int_equal(capacity_parse_ratio(bad_ratio[i], &p), -EINVAL);

    /* 1000 bytes, 10% reserve, ratio 2: limit 2 x 900 */
    p = (struct capacity_policy){.reserve_pct = 10, .overcommit_x100 = 200};
    struct pool_figures f = {.total = 1000, .free = 500, .committed = 1000};
    capacity_apply(&p, &f);
    assert_int_equal(f.reserve, 100);
    assert_int_equal(f.limit, 1800);
    char *why = capacity_refuse(&p, &f, 800, 0);
    assert_null(why);
    why = capacity_refuse(&p, &f, 801, 0);
    assert_non_null(why);
    assert_non_null(strstr(why, "above the overcommit limit of 1800 bytes"));
    free(why);
    why = capacity_refuse(&p, &f, 0, 401); /* 500 free - 100 reserve */
    assert_non_null(strstr(why, "needs 401 bytes free"));
    free(why);
    uint64_t avail, max;
    capacity_available(&f, false, 8, 1ull << 50, &avail, &max);
    assert_int_equal(avail, 800);
    assert_int_equal(max, 800);
    capacity_available(&f, true, 8, 1ull << 50, &avail, &max);
    assert_int_equal(avail, 400);
    /* no limit: thin volumes of any size, preallocated up to free - reserve */
    p.overcommit_x100 = 0;
    capacity_apply(&p, &f);
    assert_true(f.limit == UINT64_MAX);
    assert_null(capacity_refuse(&p, &f, UINT64_MAX / 2, 0));
    capacity_available(&f, false, 512, 1ull << 50, &avail, &max);
    assert_int_equal(avail, 400);
    assert_true(max == 1ull << 50);
    /* at the reserve: nothing */
    f.free = 100;
    why = capacity_refuse(&p, &f, 0, 0);
    assert_non_null(strstr(why, "not more than its reserve of 100 bytes"));
    free(why);
    capacity_available(&f, false, 512, 1ull << 50, &avail, &max);
    assert_int_equal(avail, 0);
    assert_int_equal(max, 0);
    assert_int_equal(capacity_errno_code(-ENOSPC, GRPC_INTERNAL), GRPC_RESOURCE_EXHAUSTED);
    assert_int_equal(capacity_errno_code(-EDQUOT, GRPC_INTERNAL), GRPC_RESOURCE_EXHAUSTED);
    assert_int_equal(capacity_errno_code(-EIO, GRPC_INTERNAL), GRPC_INTERNAL);
    assert_int_equal(errno_from_text(-EIO, "qemu-img: x: No space left on device"), -ENOSPC);
    assert_int_equal(errno_from_text(-EIO, "other"), -EIO);
}

static void test_rbd_pure(void **state)
{
    (void)state;
    char *msg = NULL;
    struct rbd_loc l;
    /* ids */
    assert_int_equal(rbd_id_parse("rbd:c1:pool:ns:img", "volume_id", &l, &msg), 0);
    assert_string_equal(l.cluster, "c1");
    assert_string_equal(l.ns, "ns");
    char *id = rbd_id_format(&l);
    assert_string_equal(id, "rbd:c1:pool:ns:img");
    free(id);
    rbd_loc_clear(&l);
    assert_int_equal(rbd_id_parse("rbd:c1:pool::img", "volume_id", &l, &msg), 0);
    assert_string_equal(l.ns, "");
    rbd_loc_clear(&l);
    const char *bad[] = {"c1:pool:ns:img", "rbd:c1:pool:img", "rbd:c1:po/ol::img", "rbd::p::i",
                         "rbd:c1:p:..:i", "rbd:c1:p::i:j"};
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        assert_int_equal(rbd_id_parse(bad[i], "volume_id", &l, &msg), -EINVAL);
        assert_non_null(strstr(msg, "volume_id"));
        free(msg);
        msg = NULL;
    }
    /* parameters */
    Csi__V1__CreateVolumeRequest__ParametersEntry e[4], *pe[4];
    const char *kv[][2] = {{"backend", "rbd"}, {"clusterID", "c1"}, {"pool", "rbd"},
                           {"csi.storage.k8s.io/pvc/name", "x"}};
    for (size_t i = 0; i < 4; i++) {
        e[i] = (Csi__V1__CreateVolumeRequest__ParametersEntry)
            CSI__V1__CREATE_VOLUME_REQUEST__PARAMETERS_ENTRY__INIT;
        e[i].key = (char *)kv[i][0];
        e[i].value = (char *)kv[i][1];
        pe[i] = &e[i];
    }
    assert_true(rbd_selected(4, pe));
    assert_false(rbd_selected(0, pe));
    assert_int_equal(rbd_params_parse(4, pe, "pvc-1", &l, &msg), 0);
    assert_string_equal(l.ns, "");
    assert_string_equal(l.image, "pvc-1");
    rbd_loc_clear(&l);
    assert_int_equal(rbd_params_parse(2, pe, "pvc-1", &l, &msg), -EINVAL); /* no pool */
    assert_non_null(strstr(msg, "pool"));
    free(msg);
    e[2].key = (char *)"format";
    assert_int_equal(rbd_params_parse(4, pe, "pvc-1", &l, &msg), -EINVAL);
    assert_non_null(strstr(msg, "'format'"));
    free(msg);
    e[2].key = (char *)"pool";
    /* secrets: the message names the key, never the value */
    Csi__V1__CreateVolumeRequest__SecretsEntry s[2], *ps[2];
    const char *skv[][2] = {{"userID", "csi"}, {"userKey", "not a key!"}};
    for (size_t i = 0; i < 2; i++) {
        s[i] = (Csi__V1__CreateVolumeRequest__SecretsEntry)
            CSI__V1__CREATE_VOLUME_REQUEST__SECRETS_ENTRY__INIT;
        s[i].key = (char *)skv[i][0];
        s[i].value = (char *)skv[i][1];
        ps[i] = &s[i];
    }
    struct rbd_cred cr;
    assert_int_equal(rbd_cred_parse(1, ps, "provisioner", &cr, &msg), -EINVAL);
    assert_non_null(strstr(msg, "userKey"));
    free(msg);
    assert_int_equal(rbd_cred_parse(2, ps, "provisioner", &cr, &msg), -EINVAL);
    assert_null(strstr(msg, "not a key"));
    free(msg);
    s[1].value = (char *)"AQBz+/==";
    assert_int_equal(rbd_cred_parse(2, ps, "provisioner", &cr, &msg), 0);
    assert_string_equal(cr.user, "csi");
    rbd_cred_clear(&cr);
    /* the cluster file */
    char path[] = "/tmp/rbd-clusters-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *js = "[{\"clusterID\": \"c1\", \"monitors\": [\"10.0.0.1:3300\", \"v2:m2:3300\"]},"
                     " {\"clusterID\": \"bad\", \"monitors\": [\"no port\"]}]";
    assert_int_equal(write(fd, js, strlen(js)), (ssize_t)strlen(js));
    close(fd);
    char *mons = NULL;
    assert_int_equal(rbd_cluster_monitors(path, "c1", &mons, &msg), 0);
    assert_string_equal(mons, "10.0.0.1:3300,v2:m2:3300");
    free(mons);
    assert_int_equal(rbd_cluster_monitors(path, "c9", &mons, &msg), -ENOENT);
    assert_non_null(strstr(msg, "clusterID"));
    free(msg);
    assert_int_equal(rbd_cluster_monitors(path, "bad", &mons, &msg), -EIO);
    free(msg);
    assert_int_equal(rbd_cluster_monitors(NULL, "c1", &mons, &msg), -ENOENT);
    free(msg);
    /* As Kubernetes mounts a ConfigMap: clusters.json -> ..data/clusters.json
     * (tests/k8s found the file refused with ELOOP). */
    char dir[] = "/tmp/rbd-cm-XXXXXX";
    assert_non_null(mkdtemp(dir));
    _cleanup_free_ char *data = xasprintf("%s/..data", dir), *link = xasprintf("%s/clusters.json", dir),
                        *real = xasprintf("%s/..data/clusters.json", dir);
    assert_int_equal(mkdir(data, 0755), 0);
    assert_int_equal(rename(path, real), 0);
    assert_int_equal(symlink("..data/clusters.json", link), 0);
    assert_int_equal(rbd_cluster_monitors(link, "c1", &mons, &msg), 0);
    assert_string_equal(mons, "10.0.0.1:3300,v2:m2:3300");
    free(mons);
    /* Followed, but to a regular file only. */
    assert_int_equal(unlink(real), 0);
    assert_int_equal(mkfifo(real, 0600), 0);
    assert_int_equal(rbd_cluster_monitors(link, "c1", &mons, &msg), -EIO);
    free(msg);
    unlink(real);
    unlink(link);
    rmdir(data);
    rmdir(dir);
}

/* Issue 21: what an image URL shows of itself, and the allowed ranges. */
static void test_imagebase_redact_net(void **state)
{
    static const char *const cases[][2] = {
        {"http://h/x.img", "http://h/x.img"},
        {"https://u:p@h:8443/x.img", "https://***@h:8443/x.img"},
        {"http://u@h/x?token=abc#frag", "http://***@h/x?***"},
        {"http://h/x#frag", "http://h/x"},
        {"http://h?sig=1", "http://h?***"},
        {"http://a@b@h/p@q", "http://***@h/p@q"},
        {"https://[::1]:1/x", "https://[::1]:1/x"},
    };
    for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
        char *r = imagebase_url_redact(cases[i][0]);
        assert_string_equal(r, cases[i][1]);
        free(r);
    }
    struct imagebase_net n;
    assert_int_equal(imagebase_parse_net("127.0.0.0/8", &n), 0);
    assert_int_equal(n.family, AF_INET);
    assert_int_equal(n.prefix, 8);
    assert_int_equal(imagebase_parse_net("::1", &n), 0);
    assert_int_equal(n.family, AF_INET6);
    assert_int_equal(n.prefix, 128);
    static const char *const bad[] = {"", "127.0.0.1/33", "::1/129", "host/8", "1.2.3.4/x",
                                      "1.2.3/8"};
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
        assert_int_equal(imagebase_parse_net(bad[i], &n), -EINVAL);
}

/* backend_of: the parameters, any id naming RBD, or the record, decide. */
static void test_backend_of(void **state)
{
    (void)state;
    Csi__V1__CreateVolumeRequest__ParametersEntry e[2], *pe[2];
    const char *kv[][2] = {{"format", "qcow2"}, {"backend", "rbd"}};
    for (size_t i = 0; i < 2; i++) {
        e[i] = (Csi__V1__CreateVolumeRequest__ParametersEntry)
            CSI__V1__CREATE_VOLUME_REQUEST__PARAMETERS_ENTRY__INIT;
        e[i].key = (char *)kv[i][0];
        e[i].value = (char *)kv[i][1];
        pe[i] = &e[i];
    }
    assert_ptr_equal(BACKEND_OF(0), &backend_local);
    assert_ptr_equal(BACKEND_OF(.n_params = 1, .params = pe), &backend_local);
    assert_ptr_equal(BACKEND_OF(.n_params = 2, .params = pe), &backend_rbd);
    assert_ptr_equal(BACKEND_OF(.volume_id = "v1"), &backend_local);
    assert_ptr_equal(BACKEND_OF(.volume_id = "v1@node-1"), &backend_local);
    assert_ptr_equal(BACKEND_OF(.volume_id = "rbd:c1:p::img"), &backend_rbd);
    assert_ptr_equal(BACKEND_OF(.volume_id = "rbdsnap:c1:p::s"), &backend_local);
    assert_ptr_equal(BACKEND_OF(.snapshot_id = "rbdsnap:c1:p::s"), &backend_rbd);
    assert_ptr_equal(BACKEND_OF(.snapshot_id = "s1", .volume_id = "rbd:c1:p::img"), &backend_rbd);
    assert_ptr_equal(BACKEND_OF(.record_name = "rbd_c1_p__img"), &backend_rbd);
    assert_ptr_equal(BACKEND_OF(.record_name = "v1"), &backend_local);
    struct vol *v = vol_new("rbd_c1_p__img");
    /* the record decides, whatever its name */
    assert_ptr_equal(BACKEND_OF(.record = v, .record_name = v->id), &backend_local);
    json_object_set_new(v->parameters, "backend", json_string("rbd"));
    assert_ptr_equal(BACKEND_OF(.record = v), &backend_rbd);
    vol_free(v);
    /* What the handlers rely on: local volumes are in the pool, supervised,
     * recorded beyond staging, node-local; RBD's the opposite. */
    assert_true(backend_local.in_pool && backend_local.supervised && !backend_local.central &&
                !backend_local.record_staged_only && !backend_local.stage_prepare);
    assert_true(!backend_rbd.in_pool && !backend_rbd.supervised && backend_rbd.central &&
                backend_rbd.record_staged_only && backend_rbd.stage_prepare && backend_rbd.restart);
    const struct backend *all[] = {&backend_local, &backend_rbd};
    for (size_t i = 0; i < ARRAY_SIZE(all); i++) {
        const struct backend *b = all[i];
        assert_true(b->create_volume && b->delete_volume && b->expand_volume && b->get_capacity &&
                    b->create_snapshot && b->delete_snapshot && b->list_snapshots &&
                    b->record_name && b->stage_confirm && b->export_opts && b->adopted &&
                    b->refused && b->forget);
    }
}

/* RBD_CRED_OF reads the secrets of any request type. */
static void test_rbd_cred_of(void **state)
{
    (void)state;
    Csi__V1__NodeStageVolumeRequest in = CSI__V1__NODE_STAGE_VOLUME_REQUEST__INIT;
    Csi__V1__NodeStageVolumeRequest__SecretsEntry s[2], *ps[2];
    const char *skv[][2] = {{"userKey", "AQBz+/=="}, {"userID", "csi"}};
    for (size_t i = 0; i < 2; i++) {
        s[i] = (Csi__V1__NodeStageVolumeRequest__SecretsEntry)
            CSI__V1__NODE_STAGE_VOLUME_REQUEST__SECRETS_ENTRY__INIT;
        s[i].key = (char *)skv[i][0];
        s[i].value = (char *)skv[i][1];
        ps[i] = &s[i];
    }
    in.secrets = ps;
    in.n_secrets = 1;
    struct rbd_cred cr = {0};
    char *msg = NULL;
    assert_int_equal(RBD_CRED_OF(&in, "node-stage", &cr, &msg), -EINVAL);
    assert_non_null(strstr(msg, "userID"));
    assert_non_null(strstr(msg, "node-stage"));
    free(msg);
    in.n_secrets = 2;
    assert_int_equal(RBD_CRED_OF(&in, "node-stage", &cr, &msg), 0);
    assert_string_equal(cr.user, "csi");
    assert_string_equal(cr.key, "AQBz+/==");
    rbd_cred_clear(&cr);
}

/* Mutable parameters (qos.h): every key, the merge over the record's,
 * and each refusal names its key and changes nothing. */
static int qos(json_t *cur, const char *const *kv, size_t n, json_t **ret, struct qsd_limits *l,
               char **msg)
{
    const char *keys[16], *vals[16];
    for (size_t i = 0; i < n; i++) {
        keys[i] = kv[2 * i];
        vals[i] = kv[2 * i + 1];
    }
    return qos_merge(cur, n, keys, vals, ret, l, msg);
}

static void test_qos(void **state)
{
    (void)state;
    static const char *const all[] = {"readIops", "500", "writeIops", "600", "readBps", "1048576",
                                      "writeBps", "2097152", "readIopsBurst", "1000",
                                      "writeIopsBurst", "600", "readBpsBurst", "4194304",
                                      "writeBpsBurst", "1000000000000000"};
    json_t *p = NULL;
    struct qsd_limits l;
    char *msg = NULL;
    assert_int_equal(qos(NULL, all, 8, &p, &l, &msg), 0);
    assert_int_equal(l.v[QSD_LIM_IOPS_READ], 500);
    assert_int_equal(l.v[QSD_LIM_IOPS_WRITE], 600);
    assert_int_equal(l.v[QSD_LIM_BPS_READ], 1048576);
    assert_int_equal(l.v[QSD_LIM_BPS_WRITE], 2097152);
    assert_int_equal(l.v[QSD_LIM_IOPS_READ_MAX], 1000);
    assert_int_equal(l.v[QSD_LIM_IOPS_WRITE_MAX], 600);
    assert_int_equal(l.v[QSD_LIM_BPS_READ_MAX], 4194304);
    assert_true(l.v[QSD_LIM_BPS_WRITE_MAX] == QSD_LIMIT_MAX);
    assert_int_equal(json_object_size(p), 8);
    /* merged: writeIops changed, readIopsBurst dropped (0), the rest kept */
    static const char *const upd[] = {"writeIops", "100", "writeIopsBurst", "200",
                                      "readIopsBurst", "0"};
    json_t *p2 = NULL;
    assert_int_equal(qos(p, upd, 3, &p2, &l, &msg), 0);
    assert_int_equal(l.v[QSD_LIM_IOPS_WRITE], 100);
    assert_int_equal(l.v[QSD_LIM_IOPS_READ_MAX], 0);
    assert_int_equal(l.v[QSD_LIM_IOPS_READ], 500);
    assert_int_equal(json_object_size(p2), 7);
    assert_string_equal(json_string_value(json_object_get(p2, "writeIops")), "100");
    assert_null(json_object_get(p2, "readIopsBurst"));
    assert_int_equal(qos_limits(p2, &l, &msg), 0);
    assert_int_equal(l.v[QSD_LIM_IOPS_WRITE_MAX], 200);
    json_decref(p2);
    /* refusals: the key named, nothing returned */
    static const struct {
        const char *k, *v, *word;
    } bad[] = {
        {"iops", "5", "'iops'"},
        {"readiops", "5", "'readiops'"},
        {"readIops", "", "readIops"},
        {"readIops", "abc", "readIops"},
        {"readIops", "-1", "readIops"},
        {"readIops", "1.5", "readIops"},
        {"readIops", " 5", "readIops"},
        {"readIops", "1000000000000001", "readIops"},
        {"writeBps", "99999999999999999999999", "writeBps"},
        {"readIopsBurst", "499", "readIopsBurst"}, /* below readIops 500 */
        {"writeBpsBurst", "2097151", "writeBpsBurst"},
    };
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        const char *kv[] = {bad[i].k, bad[i].v};
        json_t *r = (json_t *)0x1;
        struct qsd_limits lr = {{7}};
        assert_int_equal(qos(p, kv, 1, &r, &lr, &msg), -EINVAL);
        if (!strstr(msg, bad[i].word))
            fail_msg("%s=%s: %s", bad[i].k, bad[i].v, msg);
        assert_ptr_equal(r, (json_t *)0x1);
        assert_int_equal(lr.v[0], 7);
        free(msg);
        msg = NULL;
    }
    assert_int_equal(json_object_size(p), 8); /* the record's object is untouched */
    json_decref(p);
    /* a burst needs its base */
    const char *nobase[] = {"readBpsBurst", "100"};
    assert_int_equal(qos(NULL, nobase, 1, &p, &l, &msg), -EINVAL);
    assert_non_null(strstr(msg, "readBpsBurst"));
    free(msg);
    /* nothing: unlimited, an empty object */
    assert_int_equal(qos(NULL, NULL, 0, &p, &l, &msg), 0);
    assert_int_equal(json_object_size(p), 0);
    for (int i = 0; i < QSD_LIM_N; i++)
        assert_int_equal(l.v[i], 0);
    json_decref(p);
    /* a record holding a key qos.h does not know is refused too */
    json_t *cur = json_pack("{s:s}", "weird", "1");
    assert_int_equal(qos(cur, NULL, 0, &p, &l, &msg), -EINVAL);
    assert_non_null(strstr(msg, "weird"));
    free(msg);
    json_decref(cur);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_params_defaults),
        cmocka_unit_test(test_params_every_key),
        cmocka_unit_test(test_params_bad),
        cmocka_unit_test(test_params_combinations),
        cmocka_unit_test(test_params_image),
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_capacity_policy),
        cmocka_unit_test(test_paths),
        cmocka_unit_test(test_pbcheck),
        cmocka_unit_test(test_state_roundtrip),
        cmocka_unit_test(test_records),
        cmocka_unit_test(test_rbd_pure),
        cmocka_unit_test(test_backend_of),
        cmocka_unit_test(test_rbd_cred_of),
        cmocka_unit_test(test_imagebase_redact_net),
        cmocka_unit_test(test_qos),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
