/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for qmp.c: framing, command formatting, and the client replayed
 * against recorded QMP transcripts by a fake monitor (a thread on a unix
 * socket) that fails on any unexpected command. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "qmp_fake.h"
#include "qsd/qemu/qmp.h"
#include "qsd/base/util.h"

/* ------------------------------------------------------------ framing */

struct collected {
    json_t *msgs;
};

static void collect(json_t *msg, void *opaque)
{
    struct collected *c = opaque;
    json_array_append(c->msgs, msg);
}

static void test_framing_split(void **state)
{
    struct qmp_parser p = {0};
    struct collected c = {json_array()};
    const char *data = "{\"return\": {}, \"id\": \"a\"}\r\n{\"event\": \"X\", \"data\": {}}\r\n\r\n{\"ret";
    /* Feed byte by byte: framing must not depend on read boundaries. */
    for (size_t i = 0; i < strlen(data); i++)
        assert_int_equal(qmp_parser_feed(&p, data + i, 1, collect, &c), 0);
    assert_int_equal(json_array_size(c.msgs), 2);
    assert_int_equal(qmp_classify(json_array_get(c.msgs, 0)), QMP_MSG_RETURN);
    assert_int_equal(qmp_classify(json_array_get(c.msgs, 1)), QMP_MSG_EVENT);
    assert_int_equal(qmp_parser_feed(&p, "urn\": 1}\n", 9, collect, &c), 0);
    assert_int_equal(json_array_size(c.msgs), 3);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(c.msgs, 2), "return")), 1);
    json_decref(c.msgs);
    qmp_parser_free(&p);
}

static void test_framing_errors(void **state)
{
    struct qmp_parser p = {0};
    struct collected c = {json_array()};
    assert_int_equal(qmp_parser_feed(&p, "not json\n", 9, collect, &c), -EBADMSG);
    assert_int_equal(qmp_parser_feed(&p, "[1,2]\n", 6, collect, &c), -EBADMSG);
    /* A line longer than the limit is refused without buffering it all. */
    size_t big = QMP_MAX_LINE + 10;
    char *junk = xmalloc(big);
    memset(junk, 'x', big);
    assert_int_equal(qmp_parser_feed(&p, junk, big, collect, &c), -EMSGSIZE);
    free(junk);
    assert_int_equal(json_array_size(c.msgs), 0);
    json_decref(c.msgs);
    qmp_parser_free(&p);
}

static void test_classify(void **state)
{
    json_t *g = json_loads("{\"QMP\": {}}", 0, NULL);
    json_t *e = json_loads("{\"error\": {\"class\": \"GenericError\", \"desc\": \"x\"}}", 0, NULL);
    json_t *u = json_loads("{\"foo\": 1}", 0, NULL);
    assert_int_equal(qmp_classify(g), QMP_MSG_GREETING);
    assert_int_equal(qmp_classify(e), QMP_MSG_ERROR);
    assert_int_equal(qmp_classify(u), QMP_MSG_UNKNOWN);
    json_decref(g), json_decref(e), json_decref(u);
}

static void test_format_escapes(void **state)
{
    json_t *args = json_pack("{s:s}", "filename", "/a\"b\n,c");
    char *line = qmp_format_command("blockdev-add", args, "qsd-1");
    json_decref(args);
    size_t n = strlen(line);
    assert_true(n > 0 && line[n - 1] == '\n');
    assert_null(memchr(line, '\n', n - 1)); /* one line: newlines are escaped */
    json_t *back = json_loads(line, 0, NULL);
    assert_non_null(back);
    assert_string_equal(json_string_value(json_object_get(json_object_get(back, "arguments"), "filename")),
                        "/a\"b\n,c");
    assert_string_equal(json_string_value(json_object_get(back, "id")), "qsd-1");
    json_decref(back);
    free(line);
}

/* ------------------------------------------------------ replay tests */

static void test_replay_capabilities(void **state)
{
    struct fake f = {0};
    fake_start(&f, "capabilities.replay");
    struct qmp_sync *s;
    struct qmp_error e = {0};
    assert_int_equal(qmp_sync_connect(f.path, 5000, &s, &e), 0);
    json_t *ret = NULL;
    assert_int_equal(qmp_sync_call(s, "query-block-exports", NULL, 5000, &ret, &e), 0);
    assert_string_equal(json_string_value(json_object_get(json_array_get(ret, 0), "id")), "exp0");
    json_decref(ret);
    /* QEMU's error class and description reach the caller. */
    int r = qmp_sync_call(s, "block_resize", json_pack("{s:s, s:i}", "node-name", "vol", "size", 1),
                          5000, &ret, &e);
    assert_int_equal(r, -EREMOTEIO);
    assert_string_equal(e.klass, "GenericError");
    assert_string_equal(e.desc, "Cannot shrink the image");
    qmp_error_clear(&e);
    qmp_sync_close(s);
    fake_finish(&f);
}

static bool match_j1(json_t *data, void *opaque)
{
    return streq_ptr(json_string_value(json_object_get(data, "device")), "j1");
}

static void test_replay_events(void **state)
{
    struct fake f = {0};
    f.stay_silent = true;
    fake_start(&f, "backup-events.replay");
    struct qmp_sync *s;
    struct qmp_error e = {0};
    assert_int_equal(qmp_sync_connect(f.path, 5000, &s, &e), 0);
    assert_int_equal(qmp_sync_call(s, "blockdev-backup",
                                   json_pack("{s:s, s:s, s:s, s:s}", "job-id", "j1", "device",
                                             "vol", "target", "t", "sync", "full"),
                                   5000, NULL, &e),
                     0);
    json_t *data = NULL;
    assert_int_equal(qmp_sync_wait_event(s, "BLOCK_JOB_COMPLETED", match_j1, NULL, 5000, &data, &e), 0);
    assert_int_equal(json_integer_value(json_object_get(data, "len")), 1048576);
    json_decref(data);
    /* An event that never comes: bounded wait. */
    uint64_t t0 = now_ms();
    assert_int_equal(qmp_sync_wait_event(s, "NEVER", NULL, NULL, 100, NULL, &e), -ETIMEDOUT);
    assert_true(now_ms() - t0 < 2000);
    qmp_error_clear(&e);
    qmp_sync_close(s);
    fake_finish(&f);
}

static void test_unexpected_command_is_caught(void **state)
{
    /* The fake monitor itself must fail on a command it does not expect:
     * this is what makes the replay tests meaningful. */
    struct fake f = {0};
    fake_start(&f, "< {\"QMP\": {}}\n> {\"execute\": \"qmp_capabilities\"}\n< {\"return\": {}}\n"
                   "> {\"execute\": \"query-version\"}\n< {\"return\": {}}\n");
    struct qmp_sync *s;
    struct qmp_error e = {0};
    assert_int_equal(qmp_sync_connect(f.path, 5000, &s, &e), 0);
    int r = qmp_sync_call(s, "quit", NULL, 300, NULL, &e);
    assert_int_not_equal(r, 0);
    qmp_error_clear(&e);
    qmp_sync_close(s);
    pthread_join(f.thread, NULL);
    assert_non_null(strstr(f.error, "unexpected command"));
    close(f.listen_fd);
    unlink(f.path);
    rmdir(f.dir);
    free(f.script);
}

static void test_timeout_and_disconnect(void **state)
{
    struct fake f = {0};
    f.stay_silent = true;
    fake_start(&f, "< {\"QMP\": {}}\n> {\"execute\": \"qmp_capabilities\"}\n< {\"return\": {}}\n"
                   "> {\"execute\": \"query-version\"}\n");
    struct qmp_sync *s;
    struct qmp_error e = {0};
    assert_int_equal(qmp_sync_connect(f.path, 5000, &s, &e), 0);
    uint64_t t0 = now_ms();
    assert_int_equal(qmp_sync_call(s, "query-version", NULL, 200, NULL, &e), -ETIMEDOUT);
    assert_true(now_ms() - t0 >= 150 && now_ms() - t0 < 3000);
    assert_string_equal(e.klass, "Timeout");
    qmp_error_clear(&e);
    qmp_sync_close(s); /* the fake sees EOF and exits */
    fake_finish(&f);

    /* No greeting at all: the connect itself is bounded. */
    struct fake g = {0};
    g.stay_silent = true;
    fake_start(&g, "# silent\n");
    t0 = now_ms();
    assert_int_equal(qmp_sync_connect(g.path, 200, &s, &e), -ETIMEDOUT);
    assert_true(now_ms() - t0 < 3000);
    qmp_error_clear(&e);
    fake_finish(&g);

    /* The monitor hangs up with a command pending: -ECONNRESET. */
    struct fake h = {0};
    fake_start(&h, "< {\"QMP\": {}}\n> {\"execute\": \"qmp_capabilities\"}\n< {\"return\": {}}\n"
                   "> {\"execute\": \"quit\"}\n");
    assert_int_equal(qmp_sync_connect(h.path, 5000, &s, &e), 0);
    assert_int_equal(qmp_sync_call(s, "quit", NULL, 5000, NULL, &e), -ECONNRESET);
    assert_string_equal(e.klass, "Disconnected");
    qmp_error_clear(&e);
    /* Further calls fail at once. */
    assert_int_equal(qmp_sync_call(s, "query-version", NULL, 5000, NULL, &e), -ENOTCONN);
    qmp_error_clear(&e);
    qmp_sync_close(s);
    fake_finish(&h);
}

/* Async API: several commands in flight, replies out of order. */
struct async_ctx {
    int done;
    char order[8];
};

static void on_reply(struct qmp *q, const struct qmp_reply *r, void *opaque)
{
    struct async_ctx *c = opaque;
    c->order[c->done++] = (char)('0' + json_integer_value(r->ret));
}

static void on_state(struct qmp *q, int status, const struct qmp_error *err, void *opaque)
{
    *(int *)opaque = status == 0 ? 1 : -1;
}

static void *out_of_order_server(void *opaque)
{
    struct fake *f = opaque;
    int fd = accept(f->listen_fd, NULL, NULL);
    char buf[4096], ids[3][64];
    dprintf(fd, "{\"QMP\": {}}\r\n");
    read_line(fd, buf, sizeof(buf));
    json_t *j = json_loads(buf, 0, NULL);
    dprintf(fd, "{\"return\": {}, \"id\": \"%s\"}\r\n", json_string_value(json_object_get(j, "id")));
    json_decref(j);
    for (int i = 0; i < 3; i++) {
        read_line(fd, buf, sizeof(buf));
        j = json_loads(buf, 0, NULL);
        snprintf(ids[i], sizeof(ids[i]), "%s", json_string_value(json_object_get(j, "id")));
        json_decref(j);
    }
    /* Answer the third first, then the first, then the second. */
    dprintf(fd, "{\"return\": 3, \"id\": \"%s\"}\r\n{\"return\": 1, \"id\": \"%s\"}\r\n"
                "{\"return\": 2, \"id\": \"%s\"}\r\n", ids[2], ids[0], ids[1]);
    while (read(fd, buf, sizeof(buf)) > 0)
        ;
    close(fd);
    return NULL;
}

static void test_async_out_of_order(void **state)
{
    struct fake f = {0};
    strcpy(f.dir, "/tmp/qmp-test-XXXXXX");
    assert_non_null(mkdtemp(f.dir));
    snprintf(f.path, sizeof(f.path), "%s/qmp.sock", f.dir);
    f.listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    strcpy(sa.sun_path, f.path);
    assert_int_equal(bind(f.listen_fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(f.listen_fd, 1), 0);
    assert_int_equal(pthread_create(&f.thread, NULL, out_of_order_server, &f), 0);

    struct loop *l;
    assert_int_equal(loop_new(&l), 0);
    struct qmp *q;
    int ready = 0;
    assert_int_equal(qmp_connect(l, f.path, 5000, on_state, &ready, &q), 0);
    uint64_t deadline = now_ms() + 5000;
    while (!ready && now_ms() < deadline)
        loop_run_once(l, 100);
    assert_int_equal(ready, 1);
    struct async_ctx c = {0};
    for (int i = 0; i < 3; i++)
        assert_int_equal(qmp_send(q, "x", NULL, 5000, on_reply, &c), 0);
    while (c.done < 3 && now_ms() < deadline)
        loop_run_once(l, 100);
    assert_int_equal(c.done, 3);
    assert_string_equal(c.order, "312"); /* each callback got its own reply */
    qmp_close(q);
    loop_free(l);
    pthread_join(f.thread, NULL);
    close(f.listen_fd);
    unlink(f.path);
    rmdir(f.dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_framing_split),
        cmocka_unit_test(test_framing_errors),
        cmocka_unit_test(test_classify),
        cmocka_unit_test(test_format_escapes),
        cmocka_unit_test(test_replay_capabilities),
        cmocka_unit_test(test_replay_events),
        cmocka_unit_test(test_unexpected_command_is_caught),
        cmocka_unit_test(test_timeout_and_disconnect),
        cmocka_unit_test(test_async_out_of_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
