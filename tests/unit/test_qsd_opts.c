/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for qsdopts.c (what a QSD is given, pure): option parsing and
 * validation, the runtime paths, the QSD command line and block nodes, the
 * options record; and the RBD source (rbdsrc.h).  No QSD, no files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "qsd/qemu/qsdopts.h"
#include "qsd/qemu/rbdsrc.h"
#include "qsd/base/util.h"

static void test_defaults_argv(void **state)
{
    struct qsd_opts o;
    qsd_opts_init(&o);
    o.image = xstrdup("/pool/volumes/v1.qcow2");
    o.format = xstrdup("qcow2");
    struct qsd_paths p;
    qsd_paths_init("/run/q,sd", "v1", &p);
    assert_string_equal(p.socket, "/run/q,sd/exports/v1/vhost.sock");
    assert_string_equal(p.qmp, "/run/q,sd/ctl/v1/qmp.sock");
    char **argv = qsd_argv("qemu-storage-daemon", &o, &p);
    const char *want[] = {
        "qemu-storage-daemon",
        "--blockdev",
        "{\"aio\":\"native\",\"cache\":{\"direct\":true,\"no-flush\":false},\"discard\":\"unmap\","
        "\"driver\":\"file\",\"filename\":\"/pool/volumes/v1.qcow2\",\"node-name\":\"file0\","
        "\"read-only\":false}",
        "--blockdev",
        "{\"cache\":{\"direct\":true,\"no-flush\":false},\"detect-zeroes\":\"off\",\"discard\":"
        "\"unmap\",\"driver\":\"qcow2\",\"file\":\"file0\",\"node-name\":\"vol\",\"read-only\":false}",
        /* the volume's limits (none yet) and the filter the exports serve */
        "--object",
        "{\"id\":\"tg0\",\"limits\":{\"bps-read\":0,\"bps-read-max\":0,\"bps-write\":0,"
        "\"bps-write-max\":0,\"iops-read\":0,\"iops-read-max\":0,\"iops-write\":0,"
        "\"iops-write-max\":0},\"qom-type\":\"throttle-group\"}",
        "--blockdev",
        "{\"driver\":\"throttle\",\"file\":\"vol\",\"node-name\":\"qos\",\"throttle-group\":"
        "\"tg0\"}",
        "--object",
        "{\"id\":\"iot0\",\"qom-type\":\"iothread\"}",
        /* the monitor before the exports: listening once an export accepts */
        "--chardev",
        "socket,id=qmp0,path=/run/q,,sd/ctl/v1/qmp.sock,server=on,wait=off", /* ',' doubled */
        "--monitor",
        "chardev=qmp0",
        "--export",
        "{\"addr\":{\"path\":\"/run/q,sd/exports/v1/vhost.sock\",\"type\":\"unix\"},\"id\":\"exp0\","
        "\"iothread\":\"iot0\",\"logical-block-size\":512,\"node-name\":\"qos\",\"num-queues\":1,"
        "\"type\":\"vhost-user-blk\",\"writable\":true,\"writethrough\":true}",
        /* the read-only export of the same node, in a directory of its own */
        "--export",
        "{\"addr\":{\"path\":\"/run/q,sd/exports-ro/v1/vhost.sock\",\"type\":\"unix\"},"
        "\"id\":\"exp-ro\",\"iothread\":\"iot0\",\"logical-block-size\":512,\"node-name\":"
        "\"qos\",\"num-queues\":1,\"type\":\"vhost-user-blk\",\"writable\":false,"
        "\"writethrough\":true}",
        NULL,
    };
    for (int i = 0; want[i]; i++) {
        assert_non_null(argv[i]);
        assert_string_equal(argv[i], want[i]);
    }
    assert_null(argv[ARRAY_SIZE(want) - 1]);
    qsd_argv_free(argv);
    qsd_paths_clear(&p);
    qsd_opts_clear(&o);
}

static void test_cache_modes_and_readonly(void **state)
{
    struct qsd_opts o;
    qsd_opts_init(&o);
    o.image = xstrdup("/i.raw");
    o.format = xstrdup("raw");
    char *msg = NULL;
    assert_int_equal(qsd_opts_set(&o, "cache", "unsafe", &msg), 0);
    assert_int_equal(qsd_opts_set(&o, "aio", "threads", &msg), 0);
    assert_int_equal(qsd_opts_set(&o, "read-only", "true", &msg), 0);
    assert_int_equal(qsd_opts_set(&o, "iothread", "false", &msg), 0);
    assert_int_equal(qsd_opts_set(&o, "num-queues", "4", &msg), 0);
    assert_int_equal(qsd_opts_validate(&o, &msg), 0);
    o.limits.v[QSD_LIM_IOPS_READ] = 500;
    o.limits.v[QSD_LIM_IOPS_READ_MAX] = 1000;
    o.limits.v[QSD_LIM_BPS_WRITE] = 1ull << 20;
    struct qsd_paths p;
    qsd_paths_init("/run", "v", &p);
    char **argv = qsd_argv("qsd", &o, &p);
    assert_non_null(strstr(argv[2], "\"no-flush\":true"));
    assert_non_null(strstr(argv[2], "\"direct\":false"));
    assert_non_null(strstr(argv[2], "\"read-only\":true"));
    /* the limits in the throttle group */
    assert_non_null(strstr(argv[6], "\"iops-read\":500,\"iops-read-max\":1000,"));
    assert_non_null(strstr(argv[6], "\"bps-write\":1048576,"));
    assert_string_equal(argv[9], "--chardev"); /* no iothread object */
    assert_string_equal(argv[13], "--export");
    assert_non_null(strstr(argv[14], "\"writable\":false"));
    assert_non_null(strstr(argv[14], "\"num-queues\":4"));
    assert_non_null(strstr(argv[14], "\"writethrough\":false")); /* unsafe never flushes */
    assert_null(strstr(argv[14], "iothread"));
    assert_null(argv[15]); /* a read-only volume has one export */
    qsd_argv_free(argv);
    qsd_paths_clear(&p);
    qsd_opts_clear(&o);
}

/* Behind the vhost-user filter: the head serves the tenant-facing sockets
 * and the QSD's exports listen in the private control directory; a
 * read-only volume has one of each. */
static void test_unit_argv(void **state)
{
    struct qsd_opts o;
    qsd_opts_init(&o);
    o.image = xstrdup("/pool/volumes/v1.qcow2");
    o.format = xstrdup("qcow2");
    o.num_queues = 2;
    struct qsd_paths p;
    qsd_paths_init("/run", "v1", &p);
    char **argv = qsd_unit_argv("/bin/qsd-vhost-filter", "qsd", &o, &p);
    const char *head[] = {"/bin/qsd-vhost-filter", "--export",
                          "/run/exports/v1/vhost.sock=/run/ctl/v1/vhost.sock", "--export",
                          "/run/exports-ro/v1/vhost.sock=/run/ctl/v1/vhost-ro.sock", "--queues",
                          "2", "--qsd-fd", "3", "--", "qsd", NULL};
    for (int i = 0; head[i]; i++)
        assert_string_equal(argv[i], head[i]);
    int n = 0;
    for (char **a = argv; *a; a++, n++) {
        /* no export of the QSD itself is reachable from a pod's directory */
        if (n > 10)
            assert_null(strstr(*a, "/run/exports"));
    }
    bool private_export = false;
    for (char **a = argv; *a; a++)
        private_export |= strstr(*a, "\"path\":\"/run/ctl/v1/vhost.sock\"") != NULL;
    assert_true(private_export);
    qsd_argv_free(argv);
    /* without a filter: exactly qsd_argv */
    argv = qsd_unit_argv(NULL, "qsd", &o, &p);
    char **direct = qsd_argv("qsd", &o, &p);
    for (int i = 0; direct[i] || argv[i]; i++)
        assert_string_equal(argv[i], direct[i]);
    qsd_argv_free(direct);
    qsd_argv_free(argv);
    o.read_only = true;
    argv = qsd_unit_argv("/f", "qsd", &o, &p);
    assert_string_equal(argv[3], "--queues");
    assert_string_equal(argv[5], "--qsd-fd");
    qsd_argv_free(argv);
    qsd_paths_clear(&p);
    qsd_opts_clear(&o);
}

/* The export flushes every write unless QSD holds nothing a crash could
 * lose (raw) or the mode says never flush (unsafe). */
static void test_export_writethrough(void **state)
{
    static const struct {
        const char *format, *cache;
        bool writethrough;
    } cases[] = {
        {"raw", "none", false},         {"raw", "writeback", false},
        {"raw", "writethrough", true},  {"raw", "directsync", true},
        {"raw", "unsafe", false},       {"qcow2", "none", true},
        {"qcow2", "writeback", true},   {"qcow2", "unsafe", false},
    };
    for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
        struct qsd_opts o;
        qsd_opts_init(&o);
        o.image = xstrdup("/i");
        o.format = xstrdup(cases[i].format);
        char *msg = NULL;
        assert_int_equal(qsd_opts_set(&o, "cache", cases[i].cache, &msg), 0);
        struct qsd_paths p;
        qsd_paths_init("/run", "v", &p);
        char **argv = qsd_argv("qsd", &o, &p);
        const char *want = cases[i].writethrough ? "\"writethrough\":true" : "\"writethrough\":false";
        if (!strstr(argv[16], want))
            fail_msg("%s/%s: %s", cases[i].format, cases[i].cache, argv[16]);
        qsd_argv_free(argv);
        qsd_paths_clear(&p);
        qsd_opts_clear(&o);
    }
}

static void expect_bad(const char *key, const char *value, const char *in_msg)
{
    struct qsd_opts o;
    qsd_opts_init(&o);
    char *msg = NULL;
    assert_int_equal(qsd_opts_set(&o, key, value, &msg), -EINVAL);
    assert_non_null(msg);
    if (!strstr(msg, in_msg))
        fail_msg("message '%s' does not mention '%s'", msg, in_msg);
    free(msg);
    qsd_opts_clear(&o);
}

/* The I/O engine by default: Linux AIO wherever it is valid (O_DIRECT),
 * write-through exports too, io_uring elsewhere; a value set
 * explicitly wins; the options record holds the engine the QSD runs with. */
static void test_default_aio(void **state)
{
    (void)state;
    static const struct {
        const char *format, *cache, *aio;
    } cases[] = {
        {"raw", "none", "native"},         {"raw", "directsync", "native"},
        {"raw", "writeback", "io_uring"},  {"raw", "writethrough", "io_uring"},
        {"raw", "unsafe", "io_uring"},     {"qcow2", "none", "native"},
        {"qcow2", "directsync", "native"}, {"qcow2", "writeback", "io_uring"},
    };
    char *msg = NULL;
    for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
        struct qsd_opts o;
        qsd_opts_init(&o);
        o.image = xstrdup("/i.img");
        o.format = xstrdup(cases[i].format);
        assert_int_equal(qsd_opts_set(&o, "cache", cases[i].cache, &msg), 0);
        assert_int_equal(qsd_opts_validate(&o, &msg), 0);
        assert_string_equal(qsd_opts_aio(&o), cases[i].aio);
        json_t *node = qsd_file_node_json(&o, "f", "/i.img");
        assert_string_equal(json_string_value(json_object_get(node, "aio")), cases[i].aio);
        json_decref(node);
        json_t *j = qsd_opts_to_json(&o);
        assert_string_equal(json_string_value(json_object_get(j, "aio")), cases[i].aio);
        json_decref(j);
        qsd_opts_clear(&o);
    }
    struct qsd_opts o;
    qsd_opts_init(&o);
    o.image = xstrdup("/i.raw");
    o.format = xstrdup("raw");
    assert_int_equal(qsd_opts_set(&o, "aio", "io_uring", &msg), 0);
    assert_string_equal(qsd_opts_aio(&o), "io_uring"); /* with O_DIRECT too */
    qsd_opts_clear(&o);
}

static void test_bad_options(void **state)
{
    expect_bad("num-queues", "0", "num-queues");
    expect_bad("num-queues", "17", "1 to 16");
    expect_bad("num-queues", "two", "num-queues");
    expect_bad("logical-block-size", "1024", "512 or 4096");
    expect_bad("cache", "fast", "expected one of none, writeback");
    expect_bad("aio", "posix", "io_uring");
    expect_bad("discard", "yes", "unmap, ignore");
    expect_bad("detect-zeroes", "maybe", "off, on, unmap");
    expect_bad("read-only", "perhaps", "true or false");
    expect_bad("socket-mode", "0666", "no world");
    expect_bad("socket-mode", "0770", "no world or execute");
    expect_bad("socket-mode", "9", "octal");
    expect_bad("socket-group", "no-such-group-xyz", "no such group");
    expect_bad("bogus", "1", "unknown option 'bogus'");
}

static void test_validate_combinations(void **state)
{
    struct qsd_opts o;
    qsd_opts_init(&o);
    char *msg = NULL;
    assert_int_equal(qsd_opts_validate(&o, &msg), -EINVAL); /* no image */
    free(msg);
    o.image = xstrdup("relative.qcow2");
    o.format = xstrdup("qcow2");
    assert_int_equal(qsd_opts_validate(&o, &msg), -EINVAL);
    assert_non_null(strstr(msg, "absolute"));
    free(msg);
    free(o.image);
    o.image = xstrdup("/abs.qcow2");
    assert_int_equal(qsd_opts_set(&o, "aio", "native", &msg), 0);
    assert_int_equal(qsd_opts_set(&o, "cache", "writeback", &msg), 0);
    assert_int_equal(qsd_opts_validate(&o, &msg), -EINVAL);
    assert_non_null(strstr(msg, "aio=native needs O_DIRECT"));
    free(msg);
    assert_int_equal(qsd_opts_set(&o, "cache", "none", &msg), 0);
    assert_int_equal(qsd_opts_validate(&o, &msg), 0);
    assert_int_equal(qsd_opts_set(&o, "detect-zeroes", "unmap", &msg), 0);
    assert_int_equal(qsd_opts_set(&o, "discard", "ignore", &msg), 0);
    assert_int_equal(qsd_opts_validate(&o, &msg), -EINVAL);
    assert_non_null(strstr(msg, "detect-zeroes=unmap needs discard=unmap"));
    free(msg);
    qsd_opts_clear(&o);
}

static void test_json_roundtrip(void **state)
{
    struct qsd_opts o, back;
    qsd_opts_init(&o);
    o.image = xstrdup("/p/v.raw");
    o.format = xstrdup("raw");
    o.num_queues = 3;
    o.read_only = true;
    o.socket_gid = 107;
    json_t *j = qsd_opts_to_json(&o);
    char *msg = NULL;
    assert_int_equal(qsd_opts_from_json(j, &back, &msg), 0);
    assert_string_equal(back.image, "/p/v.raw");
    assert_int_equal(back.num_queues, 3);
    assert_true(back.read_only);
    assert_int_equal(back.socket_gid, 107);
    json_object_del(j, "aio");
    assert_int_equal(qsd_opts_from_json(j, &o, &msg), -EINVAL); /* o untouched on failure */
    assert_non_null(strstr(msg, "aio"));
    free(msg);
    json_decref(j);
    qsd_opts_clear(&back);
    qsd_opts_clear(&o);
}

/* An RBD source: options, validation, JSON round trip, and a command line
 * that names the key file, never a key. */
static void test_rbd(void **state)
{
    (void)state;
    struct qsd_opts o;
    qsd_opts_init(&o);
    char *msg = NULL;
    const char *kv[][2] = {{"rbd-image", "rbd/ns1/disk"}, {"rbd-monitors", "10.0.0.1:3300,[::1]:6789"},
                           {"rbd-user", "csi"}, {"rbd-key-file", "/secrets/k"}};
    for (size_t i = 0; i < 4; i++)
        assert_int_equal(qsd_opts_set(&o, kv[i][0], kv[i][1], &msg), 0);
    o.format = xstrdup("raw");
    assert_int_equal(qsd_opts_validate(&o, &msg), 0);
    struct qsd_paths p;
    qsd_paths_init("/run/q", "v1", &p);
    char **argv = qsd_argv("qsd", &o, &p);
    assert_string_equal(argv[1], "--object");
    assert_string_equal(argv[2], "{\"file\":\"/secrets/k\",\"format\":\"base64\",\"id\":\"rbd-key0\","
                                 "\"qom-type\":\"secret\"}");
    assert_string_equal(argv[3], "--blockdev");
    assert_non_null(strstr(argv[4], "\"driver\":\"rbd\""));
    assert_non_null(strstr(argv[4], "\"namespace\":\"ns1\""));
    /* Monitors in the volume's own configuration file, with their protocol. */
    assert_non_null(strstr(argv[4], "\"conf\":\"/run/q/ctl/v1/rbd.conf\""));
    assert_null(strstr(argv[4], "\"server\""));
    _cleanup_free_ char *conf = qsd_rbd_conf(o.rbd);
    assert_string_equal(conf, "[global]\nmon_host = v2:10.0.0.1:3300,v2:[::1]:6789\n"
                              "client_mount_timeout = 10\n");
    assert_non_null(strstr(argv[4], "\"key-secret\":\"rbd-key0\""));
    assert_null(strstr(argv[4], "aio")); /* not a file: no I/O engine */
    assert_non_null(strstr(argv[6], "\"driver\":\"raw\""));
    qsd_argv_free(argv);
    qsd_paths_clear(&p);
    /* JSON round trip */
    json_t *j = qsd_opts_to_json(&o);
    struct qsd_opts back;
    assert_int_equal(qsd_opts_from_json(j, &back, &msg), 0);
    assert_non_null(back.rbd);
    assert_null(back.image);
    assert_string_equal(back.rbd->ns, "ns1");
    assert_string_equal(back.rbd->monitors, "10.0.0.1:3300,[::1]:6789");
    json_decref(j);
    qsd_opts_clear(&back);
    /* Refusals, each naming the option. */
    const char *bad[][2] = {{"rbd-image", "justone"}, {"rbd-image", "a/b/c/d"},
                            {"rbd-image", "p/../x"}, {"rbd-monitors", "host"},
                            {"rbd-monitors", "h:1,bad host:2"}, {"rbd-key-file", "rel"},
                            {"rbd-user", "a b"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct qsd_opts b;
        qsd_opts_copy(&b, &o);
        int r = qsd_opts_set(&b, bad[i][0], bad[i][1], &msg);
        if (r == 0)
            r = qsd_opts_validate(&b, &msg);
        assert_int_equal(r, -EINVAL);
        assert_non_null(strstr(msg, "rbd-"));
        free(msg);
        msg = NULL;
        qsd_opts_clear(&b);
    }
    assert_false(qsd_rbd_monitor_ok("[::1:3300"));
    assert_true(qsd_rbd_monitor_ok("v2:mon-a.example:3300"));
    qsd_opts_clear(&o);
}

/* Every runtime path of a volume, as docs/runtime-layout.md lays them out. */
static void test_paths_layout(void **state)
{
    (void)state;
    struct qsd_paths p;
    qsd_paths_init("/run/x", "vol-1", &p);
    const struct {
        const char *got, *want;
    } cases[] = {
        {p.run_dir, "/run/x"},
        {p.export_dir, "/run/x/exports/vol-1"},
        {p.socket, "/run/x/exports/vol-1/vhost.sock"},
        {p.meta, "/run/x/exports/vol-1/volume.json"},
        {p.ro_dir, "/run/x/exports-ro/vol-1"},
        {p.ro_socket, "/run/x/exports-ro/vol-1/vhost.sock"},
        {p.ctl_dir, "/run/x/ctl/vol-1"},
        {p.qmp, "/run/x/ctl/vol-1/qmp.sock"},
        {p.state, "/run/x/ctl/vol-1/qsd.json"},
        {p.log, "/run/x/ctl/vol-1/qsd.log"},
        {p.lock, "/run/x/ctl/vol-1/lock"},
        {p.rbd_key, "/run/x/ctl/vol-1/rbd.key"},
        {p.rbd_conf, "/run/x/ctl/vol-1/rbd.conf"},
        {p.upstream, "/run/x/ctl/vol-1/vhost.sock"},
        {p.ro_upstream, "/run/x/ctl/vol-1/vhost-ro.sock"},
    };
    for (size_t i = 0; i < ARRAY_SIZE(cases); i++)
        assert_string_equal(cases[i].got, cases[i].want);
    qsd_paths_clear(&p);
    assert_null(p.socket); /* cleared: a second clear is harmless */
    qsd_paths_clear(&p);
}

/* QEMU's option syntax: every ',' doubled, nothing else touched. */
static void test_opt_escape(void **state)
{
    (void)state;
    const char *cases[][2] = {
        {"", ""}, {"a", "a"}, {",", ",,"}, {"a,,b,", "a,,,,b,,"}, {"/r=1 x/q.sock", "/r=1 x/q.sock"},
    };
    for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
        char *e = qsd_opt_escape(cases[i][0]);
        assert_string_equal(e, cases[i][1]);
        free(e);
    }
}

/* The two block nodes for the options that change them: O_DIRECT by cache
 * mode, no-flush only for unsafe, discard, detect-zeroes, read-only. */
static void test_node_json(void **state)
{
    (void)state;
    const struct {
        const char *cache, *discard, *dz;
        bool ro;
        const char *file, *format;
    } cases[] = {
        {"writeback", "ignore", "on", true,
         "{\"aio\":\"io_uring\",\"cache\":{\"direct\":false,\"no-flush\":false},\"discard\":"
         "\"ignore\",\"driver\":\"file\",\"filename\":\"/p/v.raw\",\"node-name\":\"f\","
         "\"read-only\":true}",
         "{\"cache\":{\"direct\":false,\"no-flush\":false},\"detect-zeroes\":\"on\",\"discard\":"
         "\"ignore\",\"driver\":\"raw\",\"file\":\"f\",\"node-name\":\"n\",\"read-only\":true}"},
        {"unsafe", "unmap", "unmap", false,
         "{\"aio\":\"io_uring\",\"cache\":{\"direct\":false,\"no-flush\":true},\"discard\":"
         "\"unmap\",\"driver\":\"file\",\"filename\":\"/p/v.raw\",\"node-name\":\"f\","
         "\"read-only\":false}",
         "{\"cache\":{\"direct\":false,\"no-flush\":true},\"detect-zeroes\":\"unmap\",\"discard\":"
         "\"unmap\",\"driver\":\"raw\",\"file\":\"f\",\"node-name\":\"n\",\"read-only\":false}"},
        {"directsync", "unmap", "off", false,
         "{\"aio\":\"native\",\"cache\":{\"direct\":true,\"no-flush\":false},\"discard\":"
         "\"unmap\",\"driver\":\"file\",\"filename\":\"/p/v.raw\",\"node-name\":\"f\","
         "\"read-only\":false}",
         "{\"cache\":{\"direct\":true,\"no-flush\":false},\"detect-zeroes\":\"off\",\"discard\":"
         "\"unmap\",\"driver\":\"raw\",\"file\":\"f\",\"node-name\":\"n\",\"read-only\":false}"},
    };
    for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
        struct qsd_opts o;
        qsd_opts_init(&o);
        o.image = xstrdup("/p/v.raw");
        o.format = xstrdup("raw");
        char *msg = NULL;
        assert_int_equal(qsd_opts_set(&o, "cache", cases[i].cache, &msg), 0);
        assert_int_equal(qsd_opts_set(&o, "discard", cases[i].discard, &msg), 0);
        assert_int_equal(qsd_opts_set(&o, "detect-zeroes", cases[i].dz, &msg), 0);
        o.read_only = cases[i].ro;
        assert_int_equal(qsd_opts_validate(&o, &msg), 0);
        json_t *f = qsd_file_node_json(&o, "f", o.image);
        json_t *n = qsd_format_node_json(&o, "n", o.format, "f");
        char *fs = json_dumps(f, JSON_COMPACT | JSON_SORT_KEYS);
        char *ns = json_dumps(n, JSON_COMPACT | JSON_SORT_KEYS);
        assert_string_equal(fs, cases[i].file);
        assert_string_equal(ns, cases[i].format);
        free(fs);
        free(ns);
        json_decref(f);
        json_decref(n);
        qsd_opts_clear(&o);
    }
}

/* A copy owns its strings: the source cleared, the copy still reads. */
static void test_opts_copy(void **state)
{
    (void)state;
    struct qsd_opts o, c;
    qsd_opts_init(&o);
    o.image = xstrdup("/p/v.qcow2");
    o.format = xstrdup("qcow2");
    char *msg = NULL;
    assert_int_equal(qsd_opts_set(&o, "cache", "writeback", &msg), 0);
    qsd_opts_copy(&c, &o);
    qsd_opts_clear(&o);
    assert_null(o.image);
    assert_string_equal(c.image, "/p/v.qcow2");
    assert_string_equal(c.cache, "writeback");
    assert_int_equal(qsd_opts_validate(&c, &msg), 0);
    qsd_opts_clear(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_argv),
        cmocka_unit_test(test_cache_modes_and_readonly),
        cmocka_unit_test(test_unit_argv),
        cmocka_unit_test(test_export_writethrough),
        cmocka_unit_test(test_default_aio),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_validate_combinations),
        cmocka_unit_test(test_json_roundtrip),
        cmocka_unit_test(test_rbd),
        cmocka_unit_test(test_paths_layout),
        cmocka_unit_test(test_opt_escape),
        cmocka_unit_test(test_node_json),
        cmocka_unit_test(test_opts_copy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
