/* SPDX-License-Identifier: Apache-2.0 */
/* test_grpc_client.c: the pure parts of csi/grpc_client.h (grpc-timeout
 * written, grpc-message decoded), each checked against the server's
 * reading of them (grpc_parse_timeout, grpc_percent_encode), the client's
 * refusals that need no server, and the client against our own server
 * (grpc.h on the loop, in a forked child: what the node plugin will
 * serve).  The client against servers that are not ours:
 * tests/csi/test_grpc_client.py. */
#include "csi.pb-c.h"
#include "grpc_client.h"
#include "qsd/base/loop.h"
#include "qsd/base/util.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

static void test_format_timeout(void **state)
{
    static const uint64_t t[] = {
        0, 1, 999, 99999999, 100000000, 100000001, 3600ull * 1000000 * 24,
        99999999ull * 1000, 99999999ull * 1000000 + 1, UINT64_MAX / 2,
    };
    for (size_t i = 0; i < ARRAY_SIZE(t); i++) {
        char buf[16];
        grpc_format_timeout(t[i], buf);
        uint64_t us = 0;
        assert_int_equal(grpc_parse_timeout(buf, strlen(buf), &us), 0);
        /* Never shorter than asked (the server must not end the call
         * first), at most one unit longer; past 99999999H, clamped. */
        uint64_t unit = 1;
        switch (buf[strlen(buf) - 1]) {
        case 'm': unit = 1000; break;
        case 'S': unit = 1000000; break;
        case 'M': unit = 60000000; break;
        case 'H': unit = 3600000000ull; break;
        }
        if (t[i] < 99999999ull * 3600000000ull) {
            assert_true(us >= t[i]);
            assert_true(us < t[i] + unit + (t[i] == 0));
        } else {
            assert_string_equal(buf, "99999999H");
        }
    }
    char buf[16];
    grpc_format_timeout(1500, buf);
    assert_string_equal(buf, "1500u");
    grpc_format_timeout(123456789, buf);
    assert_string_equal(buf, "123457m");
    grpc_format_timeout(0, buf);
    assert_string_equal(buf, "1u");
}

static void test_percent_decode(void **state)
{
    static const struct { const char *in, *out; } t[] = {
        {"", ""},
        {"plain", "plain"},
        {"100%25 done", "100% done"},
        {"%C3%BC", "\xc3\xbc"},
        {"%c3%bc", "\xc3\xbc"},
        {"lone %", "lone %"},
        {"short %4", "short %4"},
        {"bad %G1 digits", "bad %G1 digits"},
        {"%00 stays", "%00 stays"},
        {"%%41", "%A"},
    };
    for (size_t i = 0; i < ARRAY_SIZE(t); i++) {
        char *d = grpc_percent_decode((const uint8_t *)t[i].in, strlen(t[i].in));
        assert_string_equal(d, t[i].out);
        free(d);
    }
    /* What the server encodes, the client reads back, byte for byte. */
    static const char *const rt[] = {"ünïcödé 100% done %41", "tab\there\nnewline", "~!@#$^&*()"};
    for (size_t i = 0; i < ARRAY_SIZE(rt); i++) {
        char *e = grpc_percent_encode(rt[i]);
        char *d = grpc_percent_decode((const uint8_t *)e, strlen(e));
        assert_string_equal(d, rt[i]);
        free(e);
        free(d);
    }
}

static void test_connect_refusals(void **state)
{
    struct grpc_client *c = NULL;
    struct grpc_client_status st = {0};
    /* No server there. */
    assert_int_equal(grpc_client_connect("/nonexistent/qsd-csi-grpc-client.sock", NULL,
                                         now_us() + 1000000, &c, &st),
                     GRPC_UNAVAILABLE);
    assert_null(c);
    assert_non_null(strstr(st.message, "/nonexistent/qsd-csi-grpc-client.sock"));
    grpc_client_status_done(&st);
    /* A path longer than a unix socket address holds. */
    char longp[200];
    memset(longp, 'a', sizeof(longp) - 1);
    longp[sizeof(longp) - 1] = '\0';
    assert_int_equal(grpc_client_connect(longp, NULL, now_us() + 1000000, &c, &st),
                     GRPC_UNAVAILABLE);
    assert_null(c);
    grpc_client_status_done(&st);
    /* A limit beyond 1 GiB. */
    struct grpc_client_opts o = {.max_message = (1u << 30) + 1};
    assert_int_equal(grpc_client_connect("/x", &o, now_us() + 1000000, &c, &st),
                     GRPC_INVALID_ARGUMENT);
    assert_null(c);
    grpc_client_status_done(&st);
    grpc_client_status_done(NULL);
    grpc_client_free(NULL);
    assert_false(grpc_client_usable(NULL));
}

/* ------------------------------------------------------------ our own server */

struct prod {
    unsigned i, n;
    size_t size;
};

static void own_echo(struct grpc_call *c, const uint8_t *req, size_t len, void *opaque)
{
    grpc_call_reply(c, req, len);
}

static void own_fail(struct grpc_call *c, const uint8_t *req, size_t len, void *opaque)
{
    grpc_call_fail(c, GRPC_NOT_FOUND, "volume \u00ab%.*s\u00bb 100%% gone", (int)len, req);
}

static void prod_end(struct grpc_call *c, struct prod *p, enum grpc_code code)
{
    grpc_call_end(c, code, "%s", code == GRPC_OK ? "" : "cancelled");
    free(p);
}

/* Messages "msg-<i>" with size bytes of filler, while the queue is short. */
static void own_produce(struct grpc_call *c, void *opaque)
{
    struct prod *p = opaque;
    _cleanup_free_ char *fill = xmalloc(p->size + 1);
    memset(fill, 'a' + (char)(p->i % 26), p->size);
    fill[p->size] = '\0';
    while (p->i < p->n && grpc_call_writable(c)) {
        char name[32];
        snprintf(name, sizeof(name), "msg-%u", p->i);
        Csi__V1__GetPluginInfoResponse m = CSI__V1__GET_PLUGIN_INFO_RESPONSE__INIT;
        m.name = name;
        m.vendor_version = fill;
        if (grpc_call_send_pb(c, &m.base) < 0)
            return; /* gone: own_cancel ends it */
        p->i++;
        memset(fill, 'a' + (char)(p->i % 26), p->size);
    }
    if (p->i == p->n)
        prod_end(c, p, GRPC_OK);
}

static void own_cancel(struct grpc_call *c, void *opaque)
{
    prod_end(c, opaque, GRPC_CANCELLED);
}

static void own_stream(struct grpc_call *c, const uint8_t *req, size_t len, void *opaque)
{
    char buf[64];
    snprintf(buf, sizeof(buf), "%.*s", (int)MIN(len, sizeof(buf) - 1), req);
    struct prod *p = xcalloc(1, sizeof(*p));
    if (sscanf(buf, "%u %zu", &p->n, &p->size) != 2) {
        free(p);
        grpc_call_fail(c, GRPC_INVALID_ARGUMENT, "want N SIZE");
        return;
    }
    grpc_call_on_cancel(c, own_cancel, p);
    grpc_call_on_writable(c, own_produce, p);
    own_produce(c, p);
}

static const struct grpc_method own_methods[] = {
    {"/t.T/Echo", own_echo, NULL, LOG_DEBUG},
    {"/t.T/Fail", own_fail, NULL, LOG_DEBUG},
    {"/t.T/Stream", own_stream, NULL, LOG_DEBUG},
};

/* Our server on the loop in a child (killed by the test); waits until it
 * listens. */
static pid_t own_server(const char *path)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct loop *l;
        struct grpc_server *srv;
        struct grpc_listener *ln;
        if (loop_new(&l) < 0 || grpc_server_new(NULL, &srv) < 0 ||
            grpc_server_add_methods(srv, own_methods, ARRAY_SIZE(own_methods)) < 0 ||
            grpc_listener_new(l, srv, path, 0600, &ln) < 0)
            _exit(1);
        for (;;)
            loop_run_once(l, 1000);
    }
    for (int i = 0; i < 500 && unix_socket_listening(path) <= 0; i++)
        sleep_ms(10);
    assert_true(unix_socket_listening(path) > 0);
    return pid;
}

struct seen {
    unsigned n, bad, stop;
    size_t size;
};

static int own_on_msg(const uint8_t *msg, size_t len, void *opaque)
{
    struct seen *s = opaque;
    Csi__V1__GetPluginInfoResponse *m =
        csi__v1__get_plugin_info_response__unpack(NULL, len, msg);
    char want[32];
    snprintf(want, sizeof(want), "msg-%u", s->n);
    bool ok = m && streq(m->name, want) && strlen(m->vendor_version) == s->size;
    for (size_t i = 0; ok && i < s->size; i++)
        ok = m->vendor_version[i] == 'a' + (char)(s->n % 26);
    s->bad += !ok;
    s->n++;
    if (m)
        csi__v1__get_plugin_info_response__free_unpacked(m, NULL);
    return s->stop && s->n >= s->stop;
}

static enum grpc_code own_stream_call(struct grpc_client *c, unsigned n, size_t size,
                                      unsigned stop, struct seen *ret)
{
    char req[64];
    snprintf(req, sizeof(req), "%u %zu", n, size);
    *ret = (struct seen){.size = size, .stop = stop};
    struct grpc_client_status st = {0};
    enum grpc_code code = grpc_client_stream(c, "/t.T/Stream", (const uint8_t *)req,
                                             strlen(req), now_us() + 30000000, own_on_msg, ret,
                                             &st);
    grpc_client_status_done(&st);
    return code;
}

static void test_own_server(void **state)
{
    char dir[] = "/tmp/qsd-grpc-client-XXXXXX";
    assert_non_null(mkdtemp(dir));
    _cleanup_free_ char *path = xasprintf("%s/s.sock", dir);
    pid_t pid = own_server(path);

    struct grpc_client *c = NULL;
    struct grpc_client_status st = {0};
    assert_int_equal(grpc_client_connect(path, NULL, now_us() + 5000000, &c, &st), GRPC_OK);
    grpc_client_status_done(&st);

    /* Unary both ways, the request over our server's window and limit. */
    size_t big = 3u << 20;
    _cleanup_free_ uint8_t *req = xmalloc(big);
    for (size_t i = 0; i < big; i++)
        req[i] = (uint8_t)(i * 7);
    uint8_t *resp = NULL;
    size_t len = 0;
    assert_int_equal(grpc_client_unary(c, "/t.T/Echo", req, big, now_us() + 10000000, &resp,
                                       &len, &st), GRPC_OK);
    assert_int_equal(len, big);
    assert_memory_equal(resp, req, big);
    free(resp);
    grpc_client_status_done(&st);
    _cleanup_free_ uint8_t *huge = xcalloc(5u << 20, 1);
    assert_int_equal(grpc_client_unary(c, "/t.T/Echo", huge, 5u << 20, now_us() + 10000000,
                                       &resp, &len, &st), GRPC_RESOURCE_EXHAUSTED);
    grpc_client_status_done(&st);

    /* Our percent-encoding, decoded. */
    assert_int_equal(grpc_client_unary(c, "/t.T/Fail", (const uint8_t *)"v\xc3\xbc", 3,
                                       now_us() + 5000000, &resp, &len, &st), GRPC_NOT_FOUND);
    assert_string_equal(st.message, "volume \u00abv\u00fc\u00bb 100% gone");
    grpc_client_status_done(&st);
    assert_int_equal(grpc_client_unary(c, "/t.T/Nope", NULL, 0, now_us() + 5000000, &resp,
                                       &len, &st), GRPC_UNIMPLEMENTED);
    grpc_client_status_done(&st);

    /* Streams through our server's writable queue and both windows. */
    struct seen s;
    assert_int_equal(own_stream_call(c, 2000, 1000, 0, &s), GRPC_OK);
    assert_int_equal(s.n, 2000);
    assert_int_equal(s.bad, 0);
    assert_int_equal(own_stream_call(c, 12, 1u << 20, 0, &s), GRPC_OK);
    assert_int_equal(s.n, 12);
    assert_int_equal(s.bad, 0);
    /* Stopped early, twice, then the connection still serves. */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(own_stream_call(c, 1000, 65536, 3, &s), GRPC_CANCELLED);
        assert_int_equal(s.n, 3);
        assert_int_equal(s.bad, 0);
    }
    assert_true(grpc_client_usable(c));
    assert_int_equal(grpc_client_unary(c, "/t.T/Echo", (const uint8_t *)"x", 1,
                                       now_us() + 5000000, &resp, &len, &st), GRPC_OK);
    assert_int_equal(len, 1);
    free(resp);
    grpc_client_status_done(&st);

    /* The server goes away: UNAVAILABLE, at once on the next call too. */
    kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, NULL, 0), pid);
    assert_int_equal(own_stream_call(c, 10, 10, 0, &s), GRPC_UNAVAILABLE);
    assert_false(grpc_client_usable(c));
    uint64_t t0 = now_us();
    assert_int_equal(own_stream_call(c, 10, 10, 0, &s), GRPC_UNAVAILABLE);
    assert_true(now_us() - t0 < 100000);
    grpc_client_free(c);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format_timeout),
        cmocka_unit_test(test_percent_decode),
        cmocka_unit_test(test_connect_refusals),
        cmocka_unit_test(test_own_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
