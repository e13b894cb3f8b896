/* SPDX-License-Identifier: Apache-2.0 */
/* test_grpc.c: the HTTP/2 + gRPC session layer driven entirely from memory.
 *
 * A client-side nghttp2 session talks to our server session; pump() moves
 * bytes both ways until neither side has anything to say.  No sockets, no
 * loop: deadlines are driven with grpc_server_expire(). */
#include "grpc.h"
#include "csi.pb-c.h"
#include "qsd/base/util.h"

#include <nghttp2/nghttp2.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define MAXR 300

struct rsp {
    int32_t id;
    int http_status;
    int grpc_status;
    char grpc_message[512];
    uint8_t *data;
    size_t data_len;
    bool closed;
    uint32_t close_code;
    /* request body (owned copy) */
    uint8_t *req;
    size_t req_len, req_off;
};

struct client {
    nghttp2_session *h2;
    struct rsp r[MAXR];
    int n;
    bool goaway;
    int32_t goaway_last;
};

/* ------------------------------------------------------------ test server */

static struct grpc_call *pending[MAXR];
static int n_pending;
static int wakeups;
static int cancels;

static void on_wakeup(struct grpc_session *s, void *opaque) { wakeups++; }
static void on_cancel(struct grpc_call *c, void *opaque) { cancels++; }

static void h_echo(struct grpc_call *c, const uint8_t *req, size_t len, void *opaque)
{
    grpc_call_reply(c, req, len);
}

static void h_later(struct grpc_call *c, const uint8_t *req, size_t len, void *opaque)
{
    pending[n_pending++] = c;
}

static void h_fail(struct grpc_call *c, const uint8_t *req, size_t len, void *opaque)
{
    grpc_call_fail(c, GRPC_INVALID_ARGUMENT, "bad \xc3\xa9\n%%x");
}

/* Server streaming: the request is "COUNT FAIL_AT": COUNT messages
 * (BlockMetadata{byte_offset = i, size_bytes = 4096}), produced only while
 * the call is writable; with FAIL_AT >= 0 the call ends INTERNAL after
 * that many. */
static struct {
    struct grpc_call *call;
    long count, fail_at, sent;
    int send_errors;
} sp;

static void stream_more(struct grpc_call *c, void *opaque)
{
    while (grpc_call_writable(c)) {
        if (sp.fail_at >= 0 && sp.sent == sp.fail_at) {
            sp.call = NULL;
            grpc_call_end(c, GRPC_INTERNAL, "failed after %ld", sp.sent);
            return;
        }
        if (sp.sent == sp.count) {
            sp.call = NULL;
            grpc_call_end(c, GRPC_OK, NULL);
            return;
        }
        Csi__V1__BlockMetadata m = CSI__V1__BLOCK_METADATA__INIT;
        m.byte_offset = sp.sent;
        m.size_bytes = 4096;
        if (grpc_call_send_pb(c, &m.base) < 0) {
            sp.send_errors++;
            return;
        }
        sp.sent++;
        assert_true(grpc_call_queued(c) <= GRPC_STREAM_MAX);
    }
}

static void h_stream(struct grpc_call *c, const uint8_t *req, size_t len, void *opaque)
{
    char buf[64];
    snprintf(buf, sizeof(buf), "%.*s", (int)len, (const char *)req);
    memset(&sp, 0, sizeof(sp));
    assert_int_equal(sscanf(buf, "%ld %ld", &sp.count, &sp.fail_at), 2);
    sp.call = c;
    grpc_call_on_cancel(c, on_cancel, NULL);
    grpc_call_on_writable(c, stream_more, NULL);
    stream_more(c, NULL);
}

static const struct grpc_method methods[] = {
    {"/test.T/Stream", h_stream, NULL, LOG_INFO},
    {"/test.T/Echo", h_echo, NULL, LOG_INFO},
    {"/test.T/Later", h_later, NULL, LOG_INFO},
    {"/test.T/Fail", h_fail, NULL, LOG_INFO},
};


/* ------------------------------------------------------------ client */

static struct rsp *find(struct client *cl, int32_t id)
{
    for (int i = 0; i < cl->n; i++)
        if (cl->r[i].id == id)
            return &cl->r[i];
    return NULL;
}

static int c_on_header(nghttp2_session *h2, const nghttp2_frame *frame, const uint8_t *name,
                       size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                       void *user_data)
{
    struct rsp *r = find(user_data, frame->hd.stream_id);
    if (!r)
        return 0;
    char v[512];
    snprintf(v, sizeof(v), "%.*s", (int)valuelen, value);
    if (namelen == 7 && !memcmp(name, ":status", 7))
        r->http_status = atoi(v);
    else if (namelen == 11 && !memcmp(name, "grpc-status", 11))
        r->grpc_status = atoi(v);
    else if (namelen == 12 && !memcmp(name, "grpc-message", 12))
        snprintf(r->grpc_message, sizeof(r->grpc_message), "%s", v);
    return 0;
}

static int c_on_data(nghttp2_session *h2, uint8_t flags, int32_t id, const uint8_t *data,
                     size_t len, void *user_data)
{
    struct rsp *r = find(user_data, id);
    if (!r)
        return 0;
    r->data = xrealloc(r->data, r->data_len + len + 1);
    memcpy(r->data + r->data_len, data, len);
    r->data_len += len;
    return 0;
}

static int c_on_close(nghttp2_session *h2, int32_t id, uint32_t code, void *user_data)
{
    struct rsp *r = find(user_data, id);
    if (r) {
        r->closed = true;
        r->close_code = code;
    }
    return 0;
}

static int c_on_frame(nghttp2_session *h2, const nghttp2_frame *frame, void *user_data)
{
    struct client *cl = user_data;
    if (frame->hd.type == NGHTTP2_GOAWAY) {
        cl->goaway = true;
        cl->goaway_last = frame->goaway.last_stream_id;
    }
    return 0;
}

static void client_init(struct client *cl)
{
    memset(cl, 0, sizeof(*cl));
    nghttp2_session_callbacks *cbs;
    assert_int_equal(nghttp2_session_callbacks_new(&cbs), 0);
    nghttp2_session_callbacks_set_on_header_callback(cbs, c_on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, c_on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, c_on_close);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, c_on_frame);
    assert_int_equal(nghttp2_session_client_new(&cl->h2, cbs, cl), 0);
    nghttp2_session_callbacks_del(cbs);
    assert_int_equal(nghttp2_submit_settings(cl->h2, NGHTTP2_FLAG_NONE, NULL, 0), 0);
}

static void client_free(struct client *cl)
{
    nghttp2_session_del(cl->h2);
    for (int i = 0; i < cl->n; i++) {
        free(cl->r[i].data);
        free(cl->r[i].req);
    }
}

static ssize_t c_read(nghttp2_session *h2, int32_t id, uint8_t *buf, size_t length,
                      uint32_t *flags, nghttp2_data_source *src, void *user_data)
{
    struct rsp *r = src->ptr;
    size_t n = MIN(length, r->req_len - r->req_off);
    memcpy(buf, r->req + r->req_off, n);
    r->req_off += n;
    if (r->req_off == r->req_len)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

/* A request with raw body bytes (prefix included) and extra headers. */
static struct rsp *request_raw(struct client *cl, const char *path, const uint8_t *body,
                               size_t len, const char *method, const char *ctype,
                               const char *timeout)
{
    nghttp2_nv nv[8];
    size_t n = 0;
#define ADD(k, v)                                                                              \
    nv[n++] = (nghttp2_nv){(uint8_t *)(k), (uint8_t *)(v), strlen(k), strlen(v),             \
                           NGHTTP2_NV_FLAG_NONE}
    ADD(":method", method);
    ADD(":scheme", "http");
    ADD(":authority", "localhost");
    ADD(":path", path);
    if (ctype)
        ADD("content-type", ctype);
    ADD("te", "trailers");
    if (timeout)
        ADD("grpc-timeout", timeout);
#undef ADD
    assert_true(cl->n < MAXR);
    struct rsp *r = &cl->r[cl->n++];
    memset(r, 0, sizeof(*r));
    r->grpc_status = -1;
    r->req = len ? xmalloc(len) : NULL;
    if (len)
        memcpy(r->req, body, len);
    r->req_len = len;
    nghttp2_data_provider prd = {.source.ptr = r, .read_callback = c_read};
    int32_t id = nghttp2_submit_request(cl->h2, NULL, nv, n, body ? &prd : NULL, NULL);
    assert_true(id > 0);
    r->id = id;
    return r;
}

static uint8_t *framed(const void *msg, size_t len, uint8_t flag)
{
    uint8_t *b = xmalloc(len + 5);
    b[0] = flag;
    b[1] = (uint8_t)(len >> 24);
    b[2] = (uint8_t)(len >> 16);
    b[3] = (uint8_t)(len >> 8);
    b[4] = (uint8_t)len;
    memcpy(b + 5, msg, len);
    return b;
}

/* Move bytes until both sides are quiet.  Returns the server's last recv result. */
static int pump(struct client *cl, struct grpc_session *s)
{
    int rs = 0;
    for (int rounds = 0; rounds < 100000; rounds++) {
        bool moved = false;
        const uint8_t *p;
        ssize_t n;
        while ((n = nghttp2_session_mem_send(cl->h2, &p)) > 0) {
            moved = true;
            if (rs == 0)
                rs = grpc_session_recv(s, p, (size_t)n);
        }
        size_t len;
        if (grpc_session_output(s, &p, &len) == 0 && len > 0) {
            moved = true;
            assert_true(nghttp2_session_mem_recv(cl->h2, p, len) >= 0);
            grpc_session_consume(s, len);
        }
        if (!moved)
            return rs;
    }
    fail_msg("pump did not settle");
    return rs;
}

struct fx {
    struct grpc_server *srv;
    struct grpc_session *s;
    struct client cl;
};

static void fx_init(struct fx *f, const struct grpc_limits *lim)
{
    n_pending = wakeups = cancels = 0;
    assert_int_equal(grpc_server_new(lim, &f->srv), 0);
    assert_int_equal(grpc_server_add_methods(f->srv, methods, ARRAY_SIZE(methods)), 0);
    assert_int_equal(grpc_session_new(f->srv, on_wakeup, NULL, &f->s), 0);
    client_init(&f->cl);
}

static void fx_free(struct fx *f)
{
    client_free(&f->cl);
    grpc_server_free(f->srv); /* frees the session too */
}

static struct rsp *call(struct fx *f, const char *path, const char *msg, const char *timeout)
{
    uint8_t *b = framed(msg, strlen(msg), 0);
    struct rsp *r = request_raw(&f->cl, path, b, strlen(msg) + 5, "POST", "application/grpc",
                                timeout);
    pump(&f->cl, f->s);
    free(b);
    return r;
}

/* ------------------------------------------------------------ tests */

static void test_single_call(void **state)
{
    struct fx f;
    fx_init(&f, NULL);
    struct rsp *r = call(&f, "/test.T/Echo", "hello", NULL);
    assert_true(r->closed);
    assert_int_equal(r->close_code, 0);
    assert_int_equal(r->http_status, 200);
    assert_int_equal(r->grpc_status, 0);
    assert_int_equal(r->data_len, 10);
    assert_memory_equal(r->data, "\0\0\0\0\5hello", 10);
    assert_true(grpc_session_alive(f.s));
    fx_free(&f);
}

static void test_empty_message(void **state)
{
    struct fx f;
    fx_init(&f, NULL);
    struct rsp *r = call(&f, "/test.T/Echo", "", NULL);
    assert_int_equal(r->grpc_status, 0);
    assert_int_equal(r->data_len, 5);
    fx_free(&f);
}

static void test_many_streams(void **state)
{
    struct fx f;
    fx_init(&f, NULL);
    static char msgs[100][16];
    static uint8_t *bodies[100];
    struct rsp *rs[100];
    for (int i = 0; i < 100; i++) {
        snprintf(msgs[i], sizeof(msgs[i]), "m%d", i);
        bodies[i] = framed(msgs[i], strlen(msgs[i]), 0);
        rs[i] = request_raw(&f.cl, "/test.T/Echo", bodies[i], strlen(msgs[i]) + 5, "POST",
                            "application/grpc", NULL);
    }
    pump(&f.cl, f.s);
    for (int i = 0; i < 100; i++) {
        assert_int_equal(rs[i]->grpc_status, 0);
        assert_int_equal(rs[i]->data_len, strlen(msgs[i]) + 5);
        assert_memory_equal(rs[i]->data + 5, msgs[i], strlen(msgs[i]));
        free(bodies[i]);
    }
    assert_int_equal(grpc_session_streams(f.s), 0);
    fx_free(&f);
}

static void test_unknown_method(void **state)
{
    struct fx f;
    fx_init(&f, NULL);
    struct rsp *r = call(&f, "/csi.v1.Node/NodeStageVolume", "x", NULL);
    assert_int_equal(r->http_status, 200);
    assert_int_equal(r->grpc_status, GRPC_UNIMPLEMENTED);
    assert_int_equal(r->data_len, 0);
    fx_free(&f);
}

static void test_fail_message_encoded(void **state)
{
    struct fx f;
    fx_init(&f, NULL);
    struct rsp *r = call(&f, "/test.T/Fail", "x", NULL);
    assert_int_equal(r->grpc_status, GRPC_INVALID_ARGUMENT);
    assert_string_equal(r->grpc_message, "bad %C3%A9%0A%25x");
    fx_free(&f);
}

static void test_oversize(void **state)
{
    struct grpc_limits lim;
    grpc_limits_default(&lim);
    lim.max_message = 1024;
    struct fx f;
    fx_init(&f, &lim);
    /* Exactly the limit passes. */
    char *ok = xmalloc(1025);
    memset(ok, 'a', 1024);
    ok[1024] = 0;
    struct rsp *r = call(&f, "/test.T/Echo", ok, NULL);
    assert_int_equal(r->grpc_status, 0);
    /* One byte more is refused. */
    char *big = xmalloc(1026);
    memset(big, 'a', 1025);
    big[1025] = 0;
    r = call(&f, "/test.T/Echo", big, NULL);
    assert_int_equal(r->grpc_status, GRPC_RESOURCE_EXHAUSTED);
    assert_true(r->closed);
    /* A prefix that declares 1 GiB with little data behind it. */
    uint8_t liar[8] = {0, 0x40, 0, 0, 0, 'a', 'b', 'c'};
    r = request_raw(&f.cl, "/test.T/Echo", liar, sizeof(liar), "POST", "application/grpc",
                    NULL);
    pump(&f.cl, f.s);
    assert_int_equal(r->grpc_status, GRPC_RESOURCE_EXHAUSTED);
    /* Unknown method + oversize is UNIMPLEMENTED (decided at the end). */
    r = call(&f, "/x.Y/Z", big, NULL);
    assert_int_equal(r->grpc_status, GRPC_UNIMPLEMENTED);
    /* The session survives. */
    r = call(&f, "/test.T/Echo", "still", NULL);
    assert_int_equal(r->grpc_status, 0);
    free(ok);
    free(big);
    fx_free(&f);
}

static void test_bad_bodies(void **state)
{
    struct fx f;
    fx_init(&f, NULL);
    /* No message at all (HEADERS with END_STREAM). */
    struct rsp *r = request_raw(&f.cl, "/test.T/Echo", NULL, 0, "POST", "application/grpc",
                                NULL);
    pump(&f.cl, f.s);
    assert_int_equal(r->grpc_status, GRPC_INTERNAL);
    /* Two messages in a unary call. */
    uint8_t two[12] = {0, 0, 0, 0, 1, 'a', 0, 0, 0, 0, 1, 'b'};
    r = request_raw(&f.cl, "/test.T/Echo", two, sizeof(two), "POST", "application/grpc",
                    NULL);
    pump(&f.cl, f.s);
    assert_int_equal(r->grpc_status, GRPC_INTERNAL);
    /* Truncated message. */
    uint8_t trunc[7] = {0, 0, 0, 0, 9, 'a', 'b'};
    r = request_raw(&f.cl, "/test.T/Echo", trunc, sizeof(trunc), "POST", "application/grpc",
                    NULL);
    pump(&f.cl, f.s);
    assert_int_equal(r->grpc_status, GRPC_INTERNAL);
    /* Compressed flag. */
    uint8_t *comp = framed("a", 1, 1);
    r = request_raw(&f.cl, "/test.T/Echo", comp, 6, "POST", "application/grpc", NULL);
    pump(&f.cl, f.s);
    assert_int_equal(r->grpc_status, GRPC_UNIMPLEMENTED);
    free(comp);
    /* Not gRPC: content type and method. */
    uint8_t *m = framed("a", 1, 0);
    r = request_raw(&f.cl, "/test.T/Echo", m, 6, "POST", "text/plain", NULL);
    pump(&f.cl, f.s);
    assert_int_equal(r->http_status, 415);
    r = request_raw(&f.cl, "/test.T/Echo", m, 6, "POST", NULL, NULL);
    pump(&f.cl, f.s);
    assert_int_equal(r->http_status, 415);
    r = request_raw(&f.cl, "/test.T/Echo", NULL, 0, "GET", "application/grpc", NULL);
    pump(&f.cl, f.s);
    assert_int_equal(r->http_status, 405);
    /* application/grpc+proto is gRPC. */
    r = request_raw(&f.cl, "/test.T/Echo", m, 6, "POST", "application/grpc+proto", NULL);
    pump(&f.cl, f.s);
    assert_int_equal(r->grpc_status, 0);
    free(m);
    /* Malformed grpc-timeout. */
    r = call(&f, "/test.T/Echo", "a", "12x");
    assert_int_equal(r->grpc_status, GRPC_INTERNAL);
    assert_int_equal(grpc_session_streams(f.s), 0);
    fx_free(&f);
}

static void test_async_completion(void **state)
{
    struct fx f;
    fx_init(&f, NULL);
    struct rsp *r = call(&f, "/test.T/Later", "q", NULL);
    assert_int_equal(n_pending, 1);
    assert_false(r->closed);
    assert_int_equal(r->http_status, 0);
    assert_string_equal(grpc_call_method(pending[0]), "/test.T/Later");
    assert_false(grpc_call_cancelled(pending[0]));
    wakeups = 0;
    assert_int_equal(grpc_call_reply(pending[0], "ans", 3), 0);
    assert_int_equal(wakeups, 1);
    pump(&f.cl, f.s);
    assert_true(r->closed);
    assert_int_equal(r->grpc_status, 0);
    assert_memory_equal(r->data + 5, "ans", 3);
    fx_free(&f);
}

static uint64_t barrier_seq;
static uint64_t barrier(void *opaque) { return barrier_seq; }

/* An answer completed while state changes are not durable waits for them:
 * grpc_server_durable below its number releases nothing, at it the answer
 * goes out as decided; a failed flush turns a held answer into INTERNAL. */
static void test_durability_barrier(void **state)
{
    struct fx f;
    fx_init(&f, NULL);
    grpc_server_set_barrier(f.srv, barrier, NULL);
    barrier_seq = 2;
    struct rsp *r = call(&f, "/test.T/Echo", "held", NULL);
    struct rsp *r2 = call(&f, "/test.T/Fail", "x", NULL);
    assert_false(r->closed);
    assert_false(r2->closed);
    grpc_server_durable(f.srv, 1, 0);
    pump(&f.cl, f.s);
    assert_false(r->closed);
    grpc_server_durable(f.srv, 2, 0);
    pump(&f.cl, f.s);
    assert_true(r->closed);
    assert_int_equal(r->grpc_status, 0);
    assert_memory_equal(r->data + 5, "held", 4);
    assert_true(r2->closed);
    assert_int_equal(r2->grpc_status, GRPC_INVALID_ARGUMENT);
    /* Nothing pending: answered at once. */
    r = call(&f, "/test.T/Echo", "now", NULL);
    assert_true(r->closed);
    /* A flush that failed. */
    barrier_seq = 3;
    r = call(&f, "/test.T/Echo", "lost", NULL);
    assert_false(r->closed);
    grpc_server_durable(f.srv, 3, -EIO);
    pump(&f.cl, f.s);
    assert_true(r->closed);
    assert_int_equal(r->grpc_status, GRPC_INTERNAL);
    assert_non_null(strstr(r->grpc_message, "could not be written to disk"));
    /* A held answer whose stream goes away is freed with it. */
    barrier_seq = 4;
    r = call(&f, "/test.T/Echo", "gone", NULL);
    assert_false(r->closed);
    fx_free(&f);
    barrier_seq = 0;
}

static void test_deadline(void **state)
{
    struct fx f;
    fx_init(&f, NULL);
    struct rsp *r = call(&f, "/test.T/Later", "q", "100m");
    assert_int_equal(n_pending, 1);
    uint64_t dl = grpc_call_deadline(pending[0]);
    assert_int_equal(grpc_server_next_deadline(f.srv), dl);
    grpc_call_on_cancel(pending[0], on_cancel, NULL);
    grpc_server_expire(f.srv, dl - 1);
    pump(&f.cl, f.s);
    assert_false(r->closed);
    grpc_server_expire(f.srv, dl);
    pump(&f.cl, f.s);
    assert_true(r->closed);
    assert_int_equal(r->grpc_status, GRPC_DEADLINE_EXCEEDED);
    assert_int_equal(cancels, 1);
    assert_true(grpc_call_cancelled(pending[0]));
    /* The late completion is discarded and frees the handle. */
    assert_int_equal(grpc_call_reply(pending[0], "late", 4), -ECANCELED);
    assert_int_equal(grpc_server_next_deadline(f.srv), 0);
    fx_free(&f);
}

static void test_default_deadline_capped(void **state)
{
    struct grpc_limits lim;
    grpc_limits_default(&lim);
    lim.max_deadline_ms = 1000;
    struct fx f;
    fx_init(&f, &lim);
    uint64_t t0 = now_us();
    call(&f, "/test.T/Later", "q", NULL);
    call(&f, "/test.T/Later", "q", "5H");
    assert_int_equal(n_pending, 2);
    for (int i = 0; i < 2; i++) {
        assert_true(grpc_call_deadline(pending[i]) >= t0 + 1000000);
        assert_true(grpc_call_deadline(pending[i]) <= now_us() + 1000000);
    }
    /* Freeing the server cancels both; completions are then discarded. */
    fx_free(&f);
    assert_int_equal(grpc_call_fail(pending[0], GRPC_INTERNAL, "x"), -ECANCELED);
    assert_int_equal(grpc_call_reply(pending[1], "y", 1), -ECANCELED);
}

static void test_peer_reset_cancels(void **state)
{
    struct fx f;
    fx_init(&f, NULL);
    struct rsp *r = call(&f, "/test.T/Later", "q", NULL);
    grpc_call_on_cancel(pending[0], on_cancel, NULL);
    nghttp2_submit_rst_stream(f.cl.h2, NGHTTP2_FLAG_NONE, r->id, NGHTTP2_CANCEL);
    pump(&f.cl, f.s);
    assert_int_equal(cancels, 1);
    assert_int_equal(grpc_session_streams(f.s), 0);
    assert_int_equal(grpc_call_reply(pending[0], "x", 1), -ECANCELED);
    fx_free(&f);
}

static void test_max_streams(void **state)
{
    struct grpc_limits lim;
    grpc_limits_default(&lim);
    lim.max_streams = 2;
    struct fx f;
    fx_init(&f, &lim);
    /* Let the client learn SETTINGS first, then ignore them on purpose by
     * sending from a fresh client that has not seen them. */
    struct rsp *a = call(&f, "/test.T/Later", "1", NULL);
    struct rsp *b = call(&f, "/test.T/Later", "2", NULL);
    assert_int_equal(n_pending, 2);
    assert_false(a->closed);
    assert_false(b->closed);
    /* The client itself holds back a third stream (it honours the limit). */
    struct rsp *c = call(&f, "/test.T/Later", "3", NULL);
    assert_int_equal(n_pending, 2);
    assert_false(c->closed);
    grpc_call_reply(pending[0], "a", 1);
    pump(&f.cl, f.s);
    assert_int_equal(a->grpc_status, 0);
    assert_int_equal(n_pending, 3); /* the third went out once a slot freed */
    grpc_call_reply(pending[1], "b", 1);
    grpc_call_reply(pending[2], "c", 1);
    pump(&f.cl, f.s);
    assert_int_equal(b->grpc_status, 0);
    assert_int_equal(c->grpc_status, 0);
    fx_free(&f);
}

static void test_max_streams_rude_peer(void **state)
{
    struct grpc_limits lim;
    grpc_limits_default(&lim);
    lim.max_streams = 2;
    struct fx f;
    fx_init(&f, &lim);
    /* Three requests sent before the client sees our SETTINGS. */
    uint8_t *m = framed("x", 1, 0);
    struct rsp *r[3];
    for (int i = 0; i < 3; i++)
        r[i] = request_raw(&f.cl, "/test.T/Later", m, 6, "POST", "application/grpc", NULL);
    pump(&f.cl, f.s);
    assert_int_equal(n_pending, 2);
    assert_true(r[2]->closed);
    assert_int_equal(r[2]->close_code, NGHTTP2_REFUSED_STREAM);
    for (int i = 0; i < n_pending; i++)
        grpc_call_reply(pending[i], "a", 1);
    pump(&f.cl, f.s);
    assert_int_equal(r[0]->grpc_status, 0);
    assert_int_equal(r[1]->grpc_status, 0);
    free(m);
    fx_free(&f);
}

static void test_header_limit(void **state)
{
    struct grpc_limits lim;
    grpc_limits_default(&lim);
    lim.max_header_list = 512; /* a normal request is about 300 */
    struct fx f;
    fx_init(&f, &lim);
    char longpath[600];
    memset(longpath, 'p', sizeof(longpath) - 1);
    longpath[0] = '/';
    longpath[sizeof(longpath) - 1] = 0;
    struct rsp *r = call(&f, longpath, "x", NULL);
    assert_true(r->closed);
    assert_int_equal(r->close_code, NGHTTP2_ENHANCE_YOUR_CALM);
    r = call(&f, "/test.T/Echo", "ok", NULL);
    assert_int_equal(r->grpc_status, 0);
    fx_free(&f);
}

static void test_graceful_shutdown(void **state)
{
    struct fx f;
    fx_init(&f, NULL);
    struct rsp *a = call(&f, "/test.T/Later", "1", NULL);
    assert_int_equal(n_pending, 1);
    grpc_server_shutdown(f.srv);
    assert_true(grpc_server_draining(f.srv));
    pump(&f.cl, f.s);
    assert_true(f.cl.goaway);
    assert_int_equal(f.cl.goaway_last, a->id);
    /* New sessions are refused. */
    struct grpc_session *s2;
    assert_int_equal(grpc_session_new(f.srv, NULL, NULL, &s2), -ESHUTDOWN);
    /* The call in flight still completes. */
    assert_true(grpc_session_alive(f.s));
    grpc_call_reply(pending[0], "done", 4);
    pump(&f.cl, f.s);
    assert_int_equal(a->grpc_status, 0);
    assert_false(grpc_session_alive(f.s));
    fx_free(&f);
}

static void test_max_connections(void **state)
{
    struct grpc_limits lim;
    grpc_limits_default(&lim);
    lim.max_connections = 2;
    struct grpc_server *srv;
    assert_int_equal(grpc_server_new(&lim, &srv), 0);
    struct grpc_session *a, *b, *c;
    assert_int_equal(grpc_session_new(srv, NULL, NULL, &a), 0);
    assert_int_equal(grpc_session_new(srv, NULL, NULL, &b), 0);
    assert_int_equal(grpc_session_new(srv, NULL, NULL, &c), -EUSERS);
    assert_int_equal(grpc_server_sessions(srv), 2);
    grpc_session_free(a);
    assert_int_equal(grpc_session_new(srv, NULL, NULL, &c), 0);
    grpc_server_free(srv);
}

static void test_method_table(void **state)
{
    struct grpc_server *srv;
    assert_int_equal(grpc_server_new(NULL, &srv), 0);
    assert_int_equal(grpc_server_add_methods(srv, methods, ARRAY_SIZE(methods)), 0);
    assert_int_equal(grpc_server_add_methods(srv, methods, 1), -EEXIST);
    static const struct grpc_method bad[] = {{"noslash", h_echo, NULL, LOG_INFO}};
    assert_int_equal(grpc_server_add_methods(srv, bad, 1), -EINVAL);
    grpc_server_free(srv);
    struct grpc_limits lim;
    grpc_limits_default(&lim);
    lim.max_streams = 0;
    assert_int_equal(grpc_server_new(&lim, &srv), -EINVAL);
}

static void test_malformed_frames(void **state)
{
    static const struct {
        const char *name;
        const char *bytes;
        size_t len;
    } cases[] = {
        {"not a preface", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27},
        {"preface then garbage",
         "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 34},
        /* preface, then a DATA frame on stream 0 (connection error) */
        {"data on stream 0", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0"
                             "\0\0\1\0\0\0\0\0\0", 42},
    };
    for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
        struct grpc_server *srv;
        struct grpc_session *s;
        assert_int_equal(grpc_server_new(NULL, &srv), 0);
        assert_int_equal(grpc_session_new(srv, NULL, NULL, &s), 0);
        int r = grpc_session_recv(s, (const uint8_t *)cases[i].bytes, cases[i].len);
        const uint8_t *p;
        size_t n;
        int ro = grpc_session_output(s, &p, &n);
        /* Either refused at once, or a GOAWAY is queued and the session ends. */
        if (r == 0 && ro == 0) {
            grpc_session_consume(s, n);
            assert_false(grpc_session_alive(s));
        }
        grpc_server_free(srv);
    }
}


/* ------------------------------------------------------------ streaming */

/* Split a response body into gRPC messages; each must be a BlockMetadata
 * whose byte_offset is its index.  Returns how many. */
static long check_frames(const struct rsp *r)
{
    long n = 0;
    size_t off = 0;
    while (off < r->data_len) {
        assert_true(r->data_len - off >= 5);
        assert_int_equal(r->data[off], 0);
        uint32_t len = (uint32_t)r->data[off + 1] << 24 | (uint32_t)r->data[off + 2] << 16 |
                       (uint32_t)r->data[off + 3] << 8 | r->data[off + 4];
        assert_true(r->data_len - off - 5 >= len);
        Csi__V1__BlockMetadata *m =
            csi__v1__block_metadata__unpack(NULL, len, r->data + off + 5);
        assert_non_null(m);
        assert_int_equal(m->byte_offset, n);
        assert_int_equal(m->size_bytes, 4096);
        csi__v1__block_metadata__free_unpacked(m, NULL);
        off += 5 + len;
        n++;
    }
    return n;
}

static void test_stream_many(void **state)
{
    struct fx f;
    fx_init(&f, NULL);
    /* ~14 bytes each with the prefix: 700 KB, past the window and the queue */
    struct rsp *r = call(&f, "/test.T/Stream", "50000 -1", NULL);
    assert_true(r->closed);
    assert_int_equal(r->close_code, 0);
    assert_int_equal(r->http_status, 200);
    assert_int_equal(r->grpc_status, 0);
    assert_string_equal(r->grpc_message, "");
    assert_int_equal(check_frames(r), 50000);
    assert_int_equal(sp.send_errors, 0);
    assert_int_equal(grpc_session_streams(f.s), 0);
    fx_free(&f);
}

static void test_stream_empty(void **state)
{
    struct fx f;
    fx_init(&f, NULL);
    struct rsp *r = call(&f, "/test.T/Stream", "0 -1", NULL);
    assert_true(r->closed);
    assert_int_equal(r->grpc_status, 0);
    assert_int_equal(r->data_len, 0);
    fx_free(&f);
}

static void test_stream_error_after_messages(void **state)
{
    struct fx f;
    fx_init(&f, NULL);
    struct rsp *r = call(&f, "/test.T/Stream", "100 3", NULL);
    assert_true(r->closed);
    assert_int_equal(r->http_status, 200);
    assert_int_equal(check_frames(r), 3);
    assert_int_equal(r->grpc_status, GRPC_INTERNAL);
    assert_string_equal(r->grpc_message, "failed after 3");
    fx_free(&f);
}

/* A client that reads nothing: the producer stops at the flow-control
 * window plus the bounded queue instead of buffering the whole stream. */
static void test_stream_slow_reader(void **state)
{
    struct fx f;
    fx_init(&f, NULL);
    uint8_t *b = framed("10000000 -1", 11, 0);
    request_raw(&f.cl, "/test.T/Stream", b, 16, "POST", "application/grpc", NULL);
    free(b);
    const uint8_t *p;
    ssize_t n;
    while ((n = nghttp2_session_mem_send(f.cl.h2, &p)) > 0)
        assert_int_equal(grpc_session_recv(f.s, p, (size_t)n), 0);
    long before = -1;
    size_t taken = 0;
    for (int i = 0; i < 200; i++) { /* the transport writes, the peer never answers */
        size_t len;
        assert_int_equal(grpc_session_output(f.s, &p, &len), 0);
        taken += len;
        grpc_session_consume(f.s, len);
        if (i == 100)
            before = sp.sent;
    }
    assert_true(sp.sent > 1000);             /* it did stream */
    assert_int_equal(sp.sent, before);      /* and then stopped */
    assert_true(taken < 65535 + 1024);      /* HTTP/2's initial window, no WINDOW_UPDATE */
    assert_true(grpc_call_queued(sp.call) <= GRPC_STREAM_HIGH + 64);
    assert_int_equal(sp.send_errors, 0);
    /* The peer goes away: the handler hears it and ends the call. */
    struct grpc_call *c = sp.call;
    grpc_session_free(f.s);
    assert_int_equal(cancels, 1);
    assert_int_equal(grpc_call_end(c, GRPC_OK, NULL), -ECANCELED);
    client_free(&f.cl);
    grpc_server_free(f.srv);
}

static void test_stream_deadline(void **state)
{
    struct fx f;
    fx_init(&f, NULL);
    uint8_t *b = framed("10000000 -1", 11, 0);
    struct rsp *r =
        request_raw(&f.cl, "/test.T/Stream", b, 16, "POST", "application/grpc", "100m");
    free(b);
    const uint8_t *p;
    ssize_t n;
    while ((n = nghttp2_session_mem_send(f.cl.h2, &p)) > 0)
        assert_int_equal(grpc_session_recv(f.s, p, (size_t)n), 0);
    size_t len;
    assert_int_equal(grpc_session_output(f.s, &p, &len), 0);
    grpc_server_expire(f.srv, now_us() + 200000);
    assert_int_equal(cancels, 1);
    struct grpc_call *c = sp.call;
    assert_false(grpc_call_writable(c));
    assert_int_equal(grpc_call_end(c, GRPC_OK, NULL), -ECANCELED);
    assert_true(nghttp2_session_mem_recv(f.cl.h2, p, len) >= 0);
    grpc_session_consume(f.s, len);
    pump(&f.cl, f.s);
    assert_true(r->closed);
    assert_int_equal(r->grpc_status, GRPC_DEADLINE_EXCEEDED);
    assert_true(check_frames(r) > 0);
    fx_free(&f);
}

static void test_parse_timeout(void **state)
{
    static const struct {
        const char *s;
        int r;
        uint64_t us;
    } t[] = {
        {"1S", 0, 1000000},       {"100m", 0, 100000},   {"5u", 0, 5},
        {"1n", 0, 1},             {"1000n", 0, 1},       {"1001n", 0, 2},
        {"2M", 0, 120000000},     {"1H", 0, 3600000000}, {"0m", 0, 0},
        {"99999999H", 0, 99999999ull * 3600000000ull},
        {"123456789S", -EINVAL, 0}, {"", -EINVAL, 0},   {"S", -EINVAL, 0},
        {"10", -EINVAL, 0},       {"1s", -EINVAL, 0},    {"-1S", -EINVAL, 0},
        {"1 S", -EINVAL, 0},      {"1.5S", -EINVAL, 0},
    };
    for (size_t i = 0; i < ARRAY_SIZE(t); i++) {
        uint64_t us = 777;
        int r = grpc_parse_timeout(t[i].s, strlen(t[i].s), &us);
        assert_int_equal(r, t[i].r);
        if (r == 0)
            assert_int_equal(us, t[i].us);
        else
            assert_int_equal(us, 777); /* untouched on failure */
    }
}

static void test_percent_encode(void **state)
{
    static const struct {
        const char *in, *out;
    } t[] = {
        {"", ""},
        {"plain text: ok!", "plain text: ok!"},
        {"100%", "100%25"},
        {"a\nb\tc", "a%0Ab%09c"},
        {"caf\xc3\xa9", "caf%C3%A9"},
        {"\x7f~", "%7F~"},
    };
    for (size_t i = 0; i < ARRAY_SIZE(t); i++) {
        char *e = grpc_percent_encode(t[i].in);
        assert_string_equal(e, t[i].out);
        free(e);
    }
}

static void test_code_names(void **state)
{
    assert_string_equal(grpc_code_name(GRPC_OK), "OK");
    assert_string_equal(grpc_code_name(GRPC_UNAUTHENTICATED), "UNAUTHENTICATED");
    assert_string_equal(grpc_code_name((enum grpc_code)99), "INVALID_CODE");
}

int main(void)
{
    log_set_level(LOG_ERROR); /* keep test output readable */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_call),
        cmocka_unit_test(test_empty_message),
        cmocka_unit_test(test_many_streams),
        cmocka_unit_test(test_unknown_method),
        cmocka_unit_test(test_fail_message_encoded),
        cmocka_unit_test(test_oversize),
        cmocka_unit_test(test_bad_bodies),
        cmocka_unit_test(test_async_completion),
        cmocka_unit_test(test_durability_barrier),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_default_deadline_capped),
        cmocka_unit_test(test_peer_reset_cancels),
        cmocka_unit_test(test_max_streams),
        cmocka_unit_test(test_max_streams_rude_peer),
        cmocka_unit_test(test_header_limit),
        cmocka_unit_test(test_graceful_shutdown),
        cmocka_unit_test(test_max_connections),
        cmocka_unit_test(test_method_table),
        cmocka_unit_test(test_malformed_frames),
        cmocka_unit_test(test_stream_many),
        cmocka_unit_test(test_stream_empty),
        cmocka_unit_test(test_stream_error_after_messages),
        cmocka_unit_test(test_stream_slow_reader),
        cmocka_unit_test(test_stream_deadline),
        cmocka_unit_test(test_parse_timeout),
        cmocka_unit_test(test_percent_encode),
        cmocka_unit_test(test_code_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
