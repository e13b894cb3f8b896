/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for qmpcmd.c: every builder's JSON, every reply parser on good,
 * error, malformed and hostile replies (wrong types, missing fields, huge
 * and negative numbers, NUL bytes), error messages, and the resize sequence
 * and the synchronous wrappers replayed against a fake monitor. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "qmp_fake.h"
#include "qsd/qemu/qmpcmd.h"
#include "qsd/qemu/qsd.h"
#include "qsd/base/util.h"

/* ------------------------------------------------------------ builders */

/* c serialised as the transport sends it equals want (JSON, without id). */
static void assert_cmd(struct qmpc c, const char *want)
{
    char *line = qmp_format_command(c.cmd, c.args, NULL);
    json_t *got = json_loads(line, 0, NULL), *exp = json_loads(want, 0, NULL);
    assert_non_null(got);
    assert_non_null(exp);
    if (!json_equal(got, exp))
        fail_msg("built %s, expected %s", line, want);
    json_decref(got);
    json_decref(exp);
    free(line);
    qmpc_clear(&c);
}

/* The throttle group's limits (qsdopts.h): set all eight, read back what
 * QEMU reports; the filter's child in the block graph. */
static void test_limits_and_filter(void **state)
{
    struct qsd_limits l = {{0}};
    l.v[QSD_LIM_IOPS_READ] = 500;
    l.v[QSD_LIM_BPS_WRITE_MAX] = 1ull << 40;
    assert_cmd(qmpc_set_limits(&l),
               "{\"execute\": \"qom-set\", \"arguments\": {\"path\": \"tg0\", \"property\": "
               "\"limits\", \"value\": {\"iops-read\": 500, \"iops-write\": 0, \"bps-read\": 0, "
               "\"bps-write\": 0, \"iops-read-max\": 0, \"iops-write-max\": 0, \"bps-read-max\": "
               "0, \"bps-write-max\": 1099511627776}}}");
    assert_cmd(qmpc_get_limits(), "{\"execute\": \"qom-get\", \"arguments\": {\"path\": "
                                  "\"tg0\", \"property\": \"limits\"}}");
    json_t *j = json_loads("{\"iops-read\": 500, \"iops-total\": 0, \"bps-write-max-length\": 1,"
                           " \"bps-write-max\": 7}", 0, NULL);
    struct qsd_limits got;
    assert_int_equal(qmpc_parse_limits(j, &got), 0);
    assert_int_equal(got.v[QSD_LIM_IOPS_READ], 500);
    assert_int_equal(got.v[QSD_LIM_BPS_WRITE_MAX], 7);
    assert_int_equal(got.v[QSD_LIM_IOPS_WRITE], 0);
    json_decref(j);
    static const char *const bad[] = {"[]", "{\"iops-read\": -1}", "{\"iops-read\": \"5\"}",
                                      "{\"bps-read\": 1.5}", NULL};
    for (int i = 0; bad[i]; i++) {
        j = json_loads(bad[i], 0, NULL);
        got.v[0] = 9;
        assert_int_equal(qmpc_parse_limits(j, &got), -EBADMSG);
        assert_int_equal(got.v[0], 9);
        json_decref(j);
    }
    /* export -> qos (throttle) -file-> ov-L (after a snapshot) -backing-> vol */
    j = json_loads("{\"nodes\": [{\"id\": 1, \"type\": \"block-export\", \"name\": \"exp0\"},"
                   " {\"id\": 2, \"type\": \"block-driver\", \"name\": \"qos\"},"
                   " {\"id\": 3, \"type\": \"block-driver\", \"name\": \"ov-L\"},"
                   " {\"id\": 4, \"type\": \"block-driver\", \"name\": \"vol\"}],"
                   " \"edges\": [{\"parent\": 1, \"child\": 2, \"name\": \"root\"},"
                   " {\"parent\": 3, \"child\": 4, \"name\": \"backing\"},"
                   " {\"parent\": 2, \"child\": 3, \"name\": \"file\"}]}", 0, NULL);
    const char *child = NULL;
    assert_int_equal(qmpc_parse_filter_child(j, "qos", &child), 0);
    assert_string_equal(child, "ov-L");
    assert_int_equal(qmpc_parse_filter_child(j, "vol", &child), -ENOENT); /* no file edge */
    assert_int_equal(qmpc_parse_filter_child(j, "nope", &child), -ENOENT);
    assert_int_equal(qmpc_parse_filter_child(j, "exp0", &child), -ENOENT); /* not a driver */
    json_decref(j);
    j = json_loads("{\"nodes\": {}, \"edges\": []}", 0, NULL);
    assert_int_equal(qmpc_parse_filter_child(j, "qos", &child), -EBADMSG);
    json_decref(j);
}

static void test_builders(void **state)
{
    assert_cmd(qmpc_quit(), "{\"execute\": \"quit\"}");
    assert_cmd(qmpc_query_block_exports(), "{\"execute\": \"query-block-exports\"}");
    assert_cmd(qmpc_query_block_jobs(), "{\"execute\": \"query-block-jobs\"}");
    assert_cmd(qmpc_query_block_graph(), "{\"execute\": \"x-debug-query-block-graph\"}");
    assert_cmd(qmpc_query_named_block_nodes(),
               "{\"execute\": \"query-named-block-nodes\", \"arguments\": {\"flat\": true}}");
    assert_cmd(qmpc_query_blockstats(),
               "{\"execute\": \"query-blockstats\", \"arguments\": {\"query-nodes\": true}}");
    assert_cmd(qmpc_qom_list("/objects"),
               "{\"execute\": \"qom-list\", \"arguments\": {\"path\": \"/objects\"}}");
    assert_cmd(qmpc_block_resize("vol", 1ull << 40),
               "{\"execute\": \"block_resize\", \"arguments\": {\"node-name\": \"vol\", "
               "\"size\": 1099511627776}}");
    assert_cmd(qmpc_blockdev_add(json_pack("{s:s, s:s}", "driver", "file", "node-name", "f")),
               "{\"execute\": \"blockdev-add\", \"arguments\": {\"driver\": \"file\", "
               "\"node-name\": \"f\"}}");
    assert_cmd(qmpc_blockdev_add_qcow2_file("snap-1", "/p/c/.s.tmp-1"),
               "{\"execute\": \"blockdev-add\", \"arguments\": {\"driver\": \"qcow2\", "
               "\"node-name\": \"snap-1\", \"file\": {\"driver\": \"file\", "
               "\"filename\": \"/p/c/.s.tmp-1\"}}}");
    assert_cmd(qmpc_blockdev_del("snap-1"),
               "{\"execute\": \"blockdev-del\", \"arguments\": {\"node-name\": \"snap-1\"}}");
    assert_cmd(qmpc_blockdev_snapshot("vol", "ov-x"),
               "{\"execute\": \"blockdev-snapshot\", \"arguments\": {\"node\": \"vol\", "
               "\"overlay\": \"ov-x\"}}");
    assert_cmd(qmpc_blockdev_backup("j", "vol", "t"),
               "{\"execute\": \"blockdev-backup\", \"arguments\": {\"job-id\": \"j\", "
               "\"device\": \"vol\", \"target\": \"t\", \"sync\": \"full\"}}");
    assert_cmd(qmpc_block_stream("merge", "vol", NULL, NULL),
               "{\"execute\": \"block-stream\", \"arguments\": {\"job-id\": \"merge\", "
               "\"device\": \"vol\"}}");
    assert_cmd(qmpc_block_stream("merge", "vol", "n2", "../layers/L.qcow2"),
               "{\"execute\": \"block-stream\", \"arguments\": {\"job-id\": \"merge\", "
               "\"device\": \"vol\", \"base-node\": \"n2\", \"backing-file\": "
               "\"../layers/L.qcow2\"}}");
    assert_cmd(qmpc_block_job_cancel("merge"),
               "{\"execute\": \"block-job-cancel\", \"arguments\": {\"device\": \"merge\", "
               "\"force\": true}}");
    assert_cmd(qmpc_raw("query-version", NULL), "{\"execute\": \"query-version\"}");
    /* Names are data, never syntax: quotes and newlines stay inside a string. */
    assert_cmd(qmpc_blockdev_del("a\"b\n}"),
               "{\"execute\": \"blockdev-del\", \"arguments\": {\"node-name\": \"a\\\"b\\n}\"}}");
    struct qmpc c = qmpc_named(qmpc_blockdev_del("x"), "blockdev-del of the snapshot target");
    assert_string_equal(c.cmd, "blockdev-del");
    assert_string_equal(c.what, "blockdev-del of the snapshot target");
    qmpc_clear(&c);
}

/* ------------------------------------------------------------- parsers */

static json_t *J(const char *text)
{
    json_error_t e;
    json_t *j = json_loads(text, JSON_ALLOW_NUL | JSON_DECODE_ANY, &e);
    if (!j)
        fail_msg("bad test JSON %s: %s", text, e.text);
    return j;
}

static int export_node(const char *reply, char **ret)
{
    json_t *j = J(reply);
    int r = qmpc_parse_export_node(j, QSD_EXPORT_ID, ret);
    json_decref(j);
    return r;
}

static void test_parse_export_node(void **state)
{
    char *n = NULL;
    assert_int_equal(export_node("[{\"id\": \"exp-ro\", \"node-name\": \"ro\"}, {\"id\": \"exp0\", "
                                 "\"node-name\": \"ov-abc\", \"type\": \"vhost-user-blk\"}]", &n), 0);
    assert_string_equal(n, "ov-abc");
    free(n);
    n = NULL;
    /* absent, wrong types, missing fields */
    assert_int_equal(export_node("[]", &n), -ENOENT);
    assert_int_equal(export_node("[{\"id\": \"exp-ro\", \"node-name\": \"ro\"}]", &n), -ENOENT);
    assert_int_equal(export_node("{}", &n), -EBADMSG);
    assert_int_equal(export_node("null", &n), -EBADMSG);
    assert_int_equal(export_node("[1, \"exp0\", null]", &n), -ENOENT);
    assert_int_equal(export_node("[{\"id\": 0, \"node-name\": \"x\"}]", &n), -ENOENT);
    assert_int_equal(export_node("[{\"id\": \"exp0\"}]", &n), -EBADMSG);
    assert_int_equal(export_node("[{\"id\": \"exp0\", \"node-name\": 7}]", &n), -EBADMSG);
    assert_int_equal(export_node("[{\"id\": \"exp0\", \"node-name\": \"\"}]", &n), -EBADMSG);
    /* NUL bytes: "exp0\0x" is not exp0, and a node name with a NUL is refused */
    assert_int_equal(export_node("[{\"id\": \"exp0\\u0000x\", \"node-name\": \"a\"}]", &n), -ENOENT);
    assert_int_equal(export_node("[{\"id\": \"exp0\", \"node-name\": \"vol\\u0000evil\"}]", &n),
                     -EBADMSG);
    assert_null(n); /* set on success only */
}

static int node_size(const char *reply, const char *node, uint64_t *ret)
{
    json_t *j = J(reply);
    int r = qmpc_parse_node_size(j, node, ret);
    json_decref(j);
    return r;
}

static void test_parse_node_size(void **state)
{
    uint64_t v = 42;
    assert_int_equal(node_size("[{\"node-name\": \"f\", \"image\": {\"virtual-size\": 1}}, "
                               "{\"node-name\": \"vol\", \"image\": {\"virtual-size\": 1073741824}}]",
                               "vol", &v), 0);
    assert_int_equal(v, 1073741824);
    assert_int_equal(node_size("[{\"node-name\": \"vol\", \"image\": {\"virtual-size\": "
                               "9223372036854775807}}]", "vol", &v), 0);
    assert_true(v == INT64_MAX);
    v = 42;
    assert_int_equal(node_size("[]", "vol", &v), -ENOENT);
    assert_int_equal(node_size("{\"vol\": 1}", "vol", &v), -EBADMSG);
    assert_int_equal(node_size("[{\"node-name\": \"vol\"}]", "vol", &v), -EBADMSG);
    assert_int_equal(node_size("[{\"node-name\": \"vol\", \"image\": 5}]", "vol", &v), -EBADMSG);
    assert_int_equal(node_size("[{\"node-name\": \"vol\", \"image\": {\"virtual-size\": \"1\"}}]",
                               "vol", &v), -EBADMSG);
    assert_int_equal(node_size("[{\"node-name\": \"vol\", \"image\": {\"virtual-size\": -1}}]",
                               "vol", &v), -EBADMSG);
    /* beyond int64: a real number, not a size */
    assert_int_equal(node_size("[{\"node-name\": \"vol\", \"image\": {\"virtual-size\": 1e30}}]",
                               "vol", &v), -EBADMSG);
    assert_int_equal(node_size("[{\"node-name\": \"vol\", \"image\": {\"virtual-size\": 1.5}}]",
                               "vol", &v), -EBADMSG);
    assert_int_equal(node_size("[{\"node-name\": \"vol\\u0000\", \"image\": {\"virtual-size\": 1}}]",
                               "vol", &v), -ENOENT);
    assert_int_equal(v, 42);
}

static void test_parse_small(void **state)
{
    bool listed = true;
    json_t *j = J("[{\"device\": \"merge\", \"type\": \"stream\"}]");
    assert_int_equal(qmpc_parse_job_listed(j, "merge", &listed), 0);
    assert_true(listed);
    assert_int_equal(qmpc_parse_job_listed(j, "backup-1", &listed), 0);
    assert_false(listed);
    json_decref(j);
    j = J("[{\"id\": \"merge\\u0000\"}, 3, null]");
    assert_int_equal(qmpc_parse_job_listed(j, "merge", &listed), 0);
    assert_false(listed);
    json_decref(j);
    j = J("\"merge\"");
    assert_int_equal(qmpc_parse_job_listed(j, "merge", &listed), -EBADMSG);
    json_decref(j);

    unsigned n = 99;
    j = J("[{\"name\": \"iot0\", \"type\": \"child<iothread>\"}, {\"name\": \"s\", \"type\": "
          "\"child<secret>\"}, {\"type\": 1}, {\"name\": \"iot1\", \"type\": \"child<iothread>\"}]");
    assert_int_equal(qmpc_parse_iothreads(j, &n), 0);
    assert_int_equal(n, 2);
    json_decref(j);
    j = J("{}");
    assert_int_equal(qmpc_parse_iothreads(j, &n), -EBADMSG);
    json_decref(j);

    json_t *g = NULL;
    j = J("{\"nodes\": [], \"edges\": []}");
    assert_int_equal(qmpc_parse_block_graph(j, &g), 0);
    assert_ptr_equal(g, j);
    json_decref(g);
    json_decref(j);
    j = J("{\"nodes\": []}");
    g = NULL;
    assert_int_equal(qmpc_parse_block_graph(j, &g), -EBADMSG);
    assert_null(g);
    json_decref(j);

    j = J("{\"device\": \"backup-1\", \"len\": 1, \"offset\": 1}");
    assert_true(qmpc_event_is_job(j, "backup-1"));
    assert_false(qmpc_event_is_job(j, "backup-2"));
    assert_null(qmpc_job_error(j));
    json_decref(j);
    j = J("{\"id\": \"merge\", \"error\": \"No space left on device\"}");
    assert_true(qmpc_event_is_job(j, "merge"));
    assert_string_equal(qmpc_job_error(j), "No space left on device");
    json_decref(j);
    /* an error of the wrong form still fails the job */
    j = J("{\"device\": \"merge\", \"error\": {\"x\": 1}}");
    assert_non_null(qmpc_job_error(j));
    json_decref(j);
    j = J("{\"device\": \"merge\", \"error\": \"a\\u0000b\"}");
    assert_non_null(qmpc_job_error(j));
    assert_string_not_equal(qmpc_job_error(j), "a");
    json_decref(j);
}

static void test_parse_discard(void **state)
{
    struct qmpc_discard st = {7, 7};
    json_t *j = J("[{\"node-name\": \"f\", \"driver-specific\": {\"driver\": \"file\", "
                  "\"discard-nb-ok\": 3, \"discard-bytes-ok\": 4096}},"
                  " {\"node-name\": \"vol\", \"driver-specific\": {\"driver\": \"qcow2\", "
                  "\"discard-nb-ok\": 100}},"
                  " {\"node-name\": \"g\", \"driver-specific\": {\"driver\": \"file\", "
                  "\"discard-nb-ok\": 2, \"discard-bytes-ok\": 512}}]");
    assert_int_equal(qmpc_parse_discard(j, &st), 0);
    assert_int_equal(st.ops, 5);
    assert_int_equal(st.bytes, 4608);
    json_decref(j);
    /* hostile figures: negative and non-integer ignored, sums saturate */
    j = J("[{\"driver-specific\": {\"driver\": \"file\", \"discard-nb-ok\": -5, "
          "\"discard-bytes-ok\": 9223372036854775807}},"
          " {\"driver-specific\": {\"driver\": \"file\", \"discard-nb-ok\": \"9\", "
          "\"discard-bytes-ok\": 9223372036854775807}},"
          " {\"driver-specific\": {\"driver\": \"file\", \"discard-bytes-ok\": 9223372036854775807}},"
          " {\"driver-specific\": {\"driver\": \"file\\u0000\", \"discard-nb-ok\": 1}},"
          " {\"driver-specific\": 4}, 5]");
    assert_int_equal(qmpc_parse_discard(j, &st), 0);
    assert_int_equal(st.ops, 0);
    assert_true(st.bytes == UINT64_MAX);
    json_decref(j);
    j = J("{}");
    st = (struct qmpc_discard){7, 7};
    assert_int_equal(qmpc_parse_discard(j, &st), -EBADMSG);
    assert_int_equal(st.ops, 7);
    json_decref(j);
}

static void test_fail_msg(void **state)
{
    char *m = NULL;
    struct qmpc c = qmpc_named(qmpc_blockdev_del("x"), "blockdev-del of the snapshot target");
    struct qmp_error e = {.klass = "GenericError", .desc = "Node x is in use"};
    assert_int_equal(qmpc_fail_msg(&c, -EREMOTEIO, &e, &m), -EREMOTEIO);
    assert_string_equal(m, "blockdev-del of the snapshot target failed: Node x is in use "
                           "(GenericError)");
    free(m);
    /* QEMU's words for a full disk keep their errno */
    e.desc = "Could not resize: No space left on device";
    assert_int_equal(qmpc_fail_msg(&c, -EREMOTEIO, &e, &m), -ENOSPC);
    free(m);
    assert_int_equal(qmpc_fail_msg(&c, -ETIMEDOUT, NULL, &m), -ETIMEDOUT);
    assert_non_null(strstr(m, "failed: "));
    assert_non_null(strstr(m, "(error)"));
    free(m);
    qmpc_clear(&c);
}

/* ------------------------------------------------------ against a monitor */

#define GREET "< {\"QMP\": {}}\n> {\"execute\": \"qmp_capabilities\"}\n< {\"return\": {}}\n"
#define EXPORTS                                                                                    \
    "> {\"execute\": \"query-block-exports\"}\n"                                                   \
    "< {\"return\": [{\"id\": \"exp-ro\", \"node-name\": \"vol\"}, {\"id\": \"exp0\", "            \
    "\"node-name\": \"vol\"}]}\n"
#define NODES(size)                                                                                \
    "> {\"execute\": \"query-named-block-nodes\", \"arguments\": {\"flat\": true}}\n"              \
    "< {\"return\": [{\"node-name\": \"f\", \"image\": {\"virtual-size\": 5}}, "                   \
    "{\"node-name\": \"vol\", \"image\": {\"virtual-size\": " size "}}]}\n"

struct grow_result {
    bool done;
    int status;
    uint64_t size;
    char *msg;
};

static int grow_sync(const char *script, uint64_t size, bool refuse, struct grow_result *g)
{
    struct fake f = {0};
    fake_start(&f, script);
    struct qmp_sync *s;
    struct qmp_error e = {0};
    assert_int_equal(qmp_sync_connect(f.path, 5000, &s, &e), 0);
    g->msg = NULL;
    g->size = 0;
    g->status = qmpc_grow_sync(s, size, refuse, &g->size, &g->msg);
    qmp_sync_close(s);
    fake_finish(&f);
    return g->status;
}

static void test_grow(void **state)
{
    struct grow_result g;
    /* grows */
    assert_int_equal(grow_sync(GREET EXPORTS NODES("1048576")
                               "> {\"execute\": \"block_resize\", \"arguments\": {\"node-name\": "
                               "\"vol\", \"size\": 2097152}}\n< {\"return\": {}}\n",
                               2097152, true, &g), 0);
    assert_int_equal(g.size, 2097152);
    assert_null(g.msg);
    /* already that large: no block_resize (the fake fails on one) */
    assert_int_equal(grow_sync(GREET EXPORTS NODES("2097152"), 2097152, true, &g), 0);
    assert_int_equal(g.size, 2097152);
    /* larger: left alone, or refused */
    assert_int_equal(grow_sync(GREET EXPORTS NODES("4194304"), 2097152, false, &g), 0);
    assert_int_equal(g.size, 4194304);
    assert_int_equal(grow_sync(GREET EXPORTS NODES("4194304"), 2097152, true, &g), -EINVAL);
    assert_string_equal(g.msg, "refusing to shrink from 4194304 to 2097152 bytes");
    free(g.msg);
    /* QEMU's error, with its class */
    assert_int_equal(grow_sync(GREET EXPORTS NODES("1048576")
                               "> {\"execute\": \"block_resize\", \"arguments\": {\"node-name\": "
                               "\"vol\", \"size\": 2097152}}\n"
                               "< {\"error\": {\"class\": \"GenericError\", \"desc\": \"Could not "
                               "resize: No space left on device\"}}\n",
                               2097152, true, &g), -ENOSPC);
    assert_string_equal(g.msg, "block_resize failed: Could not resize: No space left on device "
                               "(GenericError)");
    free(g.msg);
    /* no export, malformed size */
    assert_int_equal(grow_sync(GREET "> {\"execute\": \"query-block-exports\"}\n< {\"return\": []}\n",
                               2097152, true, &g), -EBADMSG);
    assert_string_equal(g.msg, "QSD has no export exp0");
    free(g.msg);
    assert_int_equal(grow_sync(GREET EXPORTS NODES("\"big\""), 2097152, true, &g), -EBADMSG);
    assert_string_equal(g.msg, "QSD does not report the exported node's size");
    free(g.msg);
    /* an error reply to a query */
    assert_int_equal(grow_sync(GREET "> {\"execute\": \"query-block-exports\"}\n"
                                     "< {\"error\": {\"class\": \"CommandNotFound\", \"desc\": \"no\"}}\n",
                               2097152, true, &g), -EREMOTEIO);
    assert_string_equal(g.msg, "query-block-exports failed: no (CommandNotFound)");
    free(g.msg);
}

/* The monitor hangs up in the middle of the sequence: -ECONNRESET, and
 * nothing leaks (ASan). */
static void test_grow_disconnect(void **state)
{
    struct grow_result g;
    assert_int_equal(grow_sync(GREET EXPORTS "> {\"execute\": \"query-named-block-nodes\", "
                                             "\"arguments\": {\"flat\": true}}\n",
                               2097152, true, &g), -ECONNRESET);
    assert_non_null(strstr(g.msg, "query-named-block-nodes failed: "));
    free(g.msg);
}

static void on_grow_async(int status, uint64_t size, const char *msg, void *opaque)
{
    struct grow_result *g = opaque;
    g->done = true;
}

static void on_ready(struct qmp *q, int status, const struct qmp_error *err, void *opaque)
{
    *(int *)opaque = status == 0 ? 1 : -1;
}

/* Closed by its owner with the sequence pending: the callback is not
 * called and the sequence's state is released (ASan would see a leak). */
static void test_grow_closed(void **state)
{
    struct fake f = {0};
    f.stay_silent = true;
    fake_start(&f, GREET); /* then reads whatever comes, never answers */
    struct loop *l;
    assert_int_equal(loop_new(&l), 0);
    struct qmp *q;
    int ready = 0;
    assert_int_equal(qmp_connect(l, f.path, 5000, on_ready, &ready, &q), 0);
    uint64_t deadline = now_ms() + 5000;
    while (!ready && now_ms() < deadline)
        loop_run_once(l, 100);
    assert_int_equal(ready, 1);
    struct grow_result g = {0};
    assert_int_equal(qmpc_grow(q, 1 << 20, false, 5000, on_grow_async, &g), 0);
    loop_run_once(l, 50);
    qmp_close(q);
    assert_false(g.done);
    loop_free(l);
    fake_finish(&f);
}

static void test_sync_wrappers(void **state)
{
    struct fake f = {0};
    fake_start(&f, GREET EXPORTS NODES("8388608")
               "> {\"execute\": \"query-block-jobs\"}\n< {\"return\": [{\"device\": \"merge\"}]}\n"
               "> {\"execute\": \"qom-list\", \"arguments\": {\"path\": \"/objects\"}}\n"
               "< {\"return\": [{\"name\": \"iot0\", \"type\": \"child<iothread>\"}]}\n"
               "> {\"execute\": \"x-debug-query-block-graph\"}\n< {\"return\": {\"nodes\": 1}}\n"
               "> {\"execute\": \"blockdev-snapshot\", \"arguments\": {\"node\": \"vol\", "
               "\"overlay\": \"ov\"}}\n"
               "< {\"error\": {\"class\": \"GenericError\", \"desc\": \"busy\"}}\n"
               "> {\"execute\": \"quit\"}\n");
    struct qmp_sync *s;
    struct qmp_error e = {0};
    assert_int_equal(qmp_sync_connect(f.path, 5000, &s, &e), 0);
    char *msg = NULL;
    uint64_t size = 0;
    assert_int_equal(qmpc_export_size(s, &size, &msg), 0);
    assert_int_equal(size, 8388608);
    assert_int_equal(qmpc_job_listed(s, "merge", &msg), 1);
    unsigned n = 0;
    assert_int_equal(qmpc_iothreads(s, &n, &msg), 0);
    assert_int_equal(n, 1);
    json_t *graph = NULL;
    assert_int_equal(qmpc_block_graph(s, &graph, &msg), -EBADMSG);
    assert_non_null(strstr(msg, "malformed"));
    free(msg);
    msg = NULL;
    bool refused = false;
    assert_int_equal(qmpc_call(s, qmpc_blockdev_snapshot("vol", "ov"), NULL, &refused, &msg),
                     -EREMOTEIO);
    assert_true(refused); /* QEMU said no: nothing changed */
    assert_string_equal(msg, "blockdev-snapshot failed: busy (GenericError)");
    free(msg);
    msg = NULL;
    /* no answer at all (the fake hangs up after quit): the outcome is unknown */
    refused = true;
    assert_int_equal(qmpc_call(s, qmpc_quit(), NULL, &refused, &msg), -ECONNRESET);
    assert_false(refused);
    free(msg);
    msg = NULL;
    /* and later calls fail at once */
    assert_int_equal(qmpc_job_listed(s, "merge", &msg), -ENOTCONN);
    assert_non_null(strstr(msg, "query-block-jobs failed: "));
    free(msg);
    qmp_sync_close(s);
    fake_finish(&f);
}

static void test_job_wait(void **state)
{
    struct fake f = {0};
    f.stay_silent = true;
    fake_start(&f, GREET
               "< {\"event\": \"BLOCK_JOB_COMPLETED\", \"data\": {\"device\": \"other\"}}\n"
               "< {\"event\": \"BLOCK_JOB_COMPLETED\", \"data\": {\"device\": \"j1\", \"error\": "
               "\"No space left on device\"}}\n"
               "< {\"event\": \"BLOCK_JOB_COMPLETED\", \"data\": {\"device\": \"j2\"}}\n");
    struct qmp_sync *s;
    struct qmp_error e = {0};
    assert_int_equal(qmp_sync_connect(f.path, 5000, &s, &e), 0);
    char *msg = NULL;
    bool ended = false;
    assert_int_equal(qmpc_job_wait(s, "j1", "merge", 5000, &ended, &msg), -ENOSPC);
    assert_true(ended);
    assert_string_equal(msg, "merge failed: No space left on device");
    free(msg);
    msg = NULL;
    assert_int_equal(qmpc_job_wait(s, "j2", "merge", 5000, &ended, &msg), 0);
    assert_true(ended);
    uint64_t t0 = now_ms();
    assert_int_equal(qmpc_job_wait(s, "j3", "snapshot copy", 100, &ended, &msg), -ETIMEDOUT);
    assert_true(now_ms() - t0 < 3000);
    assert_false(ended);
    assert_non_null(strstr(msg, "waiting for the snapshot copy failed: "));
    free(msg);
    qmp_sync_close(s);
    fake_finish(&f);
}

static void test_connect_volume(void **state)
{
    char dir[] = "/tmp/qmpc-test-XXXXXX";
    assert_non_null(mkdtemp(dir));
    struct qmp_sync *s = NULL;
    char *msg = NULL;
    int r = qmpc_connect_volume(dir, "vol1", 500, &s, &msg);
    assert_true(r < 0);
    assert_null(s);
    assert_non_null(strstr(msg, "cannot reach the QSD of volume vol1: "));
    free(msg);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builders),         cmocka_unit_test(test_parse_export_node),
        cmocka_unit_test(test_limits_and_filter),
        cmocka_unit_test(test_parse_node_size),  cmocka_unit_test(test_parse_small),
        cmocka_unit_test(test_parse_discard),    cmocka_unit_test(test_fail_msg),
        cmocka_unit_test(test_grow),             cmocka_unit_test(test_grow_disconnect),
        cmocka_unit_test(test_grow_closed),      cmocka_unit_test(test_sync_wrappers),
        cmocka_unit_test(test_job_wait),         cmocka_unit_test(test_connect_volume),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
