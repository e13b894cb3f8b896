/* SPDX-License-Identifier: Apache-2.0 */
/* test_grpc_unix.c: the unix-socket transport on the real event loop.
 *
 * One process: the listener runs on the loop, a client nghttp2 session talks
 * to it over a real socket, and the test turns the loop by hand.  Covers
 * what the in-memory tests cannot: socket mode and stale-socket handling,
 * the deadline timer, write wakeups after asynchronous completions, and
 * graceful shutdown with a call in flight (finished, or cut by the grace
 * period). */
#include "grpc.h"
#include "qsd/base/loop.h"
#include "qsd/base/util.h"

#include <nghttp2/nghttp2.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <cmocka.h>

struct rsp {
    int32_t id;
    int grpc_status;
    bool closed;
    uint8_t body[16];
    size_t body_len, body_off;
};

struct client {
    int fd;
    nghttp2_session *h2;
    struct rsp r[8];
    int n;
    bool eof;
};

static struct grpc_call *pending[8];
static int n_pending;
static bool drained_called;

static void h_later(struct grpc_call *c, const uint8_t *req, size_t len, void *opaque)
{
    pending[n_pending++] = c;
}

static void h_echo(struct grpc_call *c, const uint8_t *req, size_t len, void *opaque)
{
    grpc_call_reply(c, req, len);
}

static const struct grpc_method methods[] = {
    {"/t.T/Later", h_later, NULL, LOG_INFO},
    {"/t.T/Echo", h_echo, NULL, LOG_INFO},
};

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
    if (r && namelen == 11 && !memcmp(name, "grpc-status", 11)) {
        char v[16];
        snprintf(v, sizeof(v), "%.*s", (int)valuelen, value);
        r->grpc_status = atoi(v);
    }
    return 0;
}

static int c_on_close(nghttp2_session *h2, int32_t id, uint32_t code, void *user_data)
{
    struct rsp *r = find(user_data, id);
    if (r)
        r->closed = true;
    return 0;
}

static ssize_t c_read(nghttp2_session *h2, int32_t id, uint8_t *buf, size_t length,
                      uint32_t *flags, nghttp2_data_source *src, void *user_data)
{
    struct rsp *r = src->ptr;
    size_t n = MIN(length, r->body_len - r->body_off);
    memcpy(buf, r->body + r->body_off, n);
    r->body_off += n;
    if (r->body_off == r->body_len)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

static void client_connect(struct client *cl, const char *path)
{
    memset(cl, 0, sizeof(*cl));
    assert_int_equal(unix_connect(path, true, &cl->fd), 0);
    nghttp2_session_callbacks *cbs;
    assert_int_equal(nghttp2_session_callbacks_new(&cbs), 0);
    nghttp2_session_callbacks_set_on_header_callback(cbs, c_on_header);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, c_on_close);
    assert_int_equal(nghttp2_session_client_new(&cl->h2, cbs, cl), 0);
    nghttp2_session_callbacks_del(cbs);
    nghttp2_submit_settings(cl->h2, NGHTTP2_FLAG_NONE, NULL, 0);
}

static void client_close(struct client *cl)
{
    nghttp2_session_del(cl->h2);
    close(cl->fd);
}

static struct rsp *client_call(struct client *cl, const char *path, const char *timeout)
{
    nghttp2_nv nv[7];
    size_t n = 0;
#define ADD(k, v)                                                                              \
    nv[n++] = (nghttp2_nv){(uint8_t *)(k), (uint8_t *)(v), strlen(k), strlen(v),             \
                           NGHTTP2_NV_FLAG_NONE}
    ADD(":method", "POST");
    ADD(":scheme", "http");
    ADD(":authority", "x");
    ADD(":path", path);
    ADD("content-type", "application/grpc");
    if (timeout)
        ADD("grpc-timeout", timeout);
#undef ADD
    struct rsp *r = &cl->r[cl->n++];
    r->grpc_status = -1;
    memcpy(r->body, "\0\0\0\0\2hi", 7);
    r->body_len = 7;
    nghttp2_data_provider prd = {.source.ptr = r, .read_callback = c_read};
    r->id = nghttp2_submit_request(cl->h2, NULL, nv, n, &prd, NULL);
    assert_true(r->id > 0);
    return r;
}

/* Turn the loop and move client bytes until done() or timeout_ms. */
static bool run_until(struct loop *l, struct client *cl, bool (*done)(void *), void *arg,
                      int timeout_ms)
{
    uint64_t end = now_ms() + (uint64_t)timeout_ms;
    while (now_ms() < end) {
        if (cl && !cl->eof) {
            const uint8_t *p;
            ssize_t n;
            while ((n = nghttp2_session_mem_send(cl->h2, &p)) > 0)
                assert_int_equal(write_all(cl->fd, p, (size_t)n), 0);
        }
        loop_run_once(l, 5);
        if (cl && !cl->eof) {
            uint8_t buf[16384];
            ssize_t n;
            while ((n = recv(cl->fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
                assert_true(nghttp2_session_mem_recv(cl->h2, buf, (size_t)n) >= 0);
            if (n == 0)
                cl->eof = true;
        }
        if (done(arg))
            return true;
    }
    return false;
}

static bool rsp_closed(void *arg) { return ((struct rsp *)arg)->closed; }
static bool pending_1(void *arg) { return n_pending >= 1; }
static bool is_drained(void *arg) { return drained_called; }
static bool conns_0(void *arg) { return grpc_listener_connections(arg) == 0; }

static void on_drained(struct grpc_listener *ln, void *opaque) { drained_called = true; }

struct fx {
    char dir[64];
    char path[96];
    struct loop *loop;
    struct grpc_server *srv;
    struct grpc_listener *ln;
};

static void fx_init(struct fx *f)
{
    n_pending = 0;
    drained_called = false;
    snprintf(f->dir, sizeof(f->dir), "/tmp/qsd-grpc-test.XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->path, sizeof(f->path), "%s/csi.sock", f->dir);
    int r = loop_new(&f->loop);
    if (r < 0) {
        rm_rf(f->dir);
        skip(); /* io_uring not available here */
    }
    assert_int_equal(grpc_server_new(NULL, &f->srv), 0);
    assert_int_equal(grpc_server_add_methods(f->srv, methods, ARRAY_SIZE(methods)), 0);
}

static void fx_listen(struct fx *f)
{
    assert_int_equal(grpc_listener_new(f->loop, f->srv, f->path, 0660, &f->ln), 0);
}

static void fx_free(struct fx *f)
{
    grpc_listener_free(f->ln);
    grpc_server_free(f->srv);
    loop_free(f->loop);
    assert_int_equal(rm_rf(f->dir), 0);
}

static void test_socket_file(void **state)
{
    struct fx f;
    fx_init(&f);
    /* A regular file at the path is not ours to remove. */
    assert_int_equal(write_file_atomic(f.path, "x", 1, 0600), 0);
    assert_int_equal(grpc_listener_new(f.loop, f.srv, f.path, 0660, &f.ln), -EEXIST);
    unlink(f.path);
    /* A stale socket is replaced. */
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    strcpy(sa.sun_path, f.path);
    assert_int_equal(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
    close(s);
    fx_listen(&f);
    struct stat st;
    assert_int_equal(stat(f.path, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0660);
    /* A live server at the path is not replaced. */
    struct grpc_listener *ln2;
    assert_int_equal(grpc_listener_new(f.loop, f.srv, f.path, 0660, &ln2), -EADDRINUSE);
    assert_int_equal(stat(f.path, &st), 0);
    fx_free(&f);
}

static void test_call_and_async(void **state)
{
    struct fx f;
    fx_init(&f);
    fx_listen(&f);
    struct client cl;
    client_connect(&cl, f.path);
    struct rsp *a = client_call(&cl, "/t.T/Echo", NULL);
    assert_true(run_until(f.loop, &cl, rsp_closed, a, 5000));
    assert_int_equal(a->grpc_status, 0);
    struct rsp *b = client_call(&cl, "/t.T/Later", NULL);
    assert_true(run_until(f.loop, &cl, pending_1, NULL, 5000));
    /* Completed outside any socket event: the wakeup must get it written. */
    assert_int_equal(grpc_call_reply(pending[0], "ok", 2), 0);
    assert_true(run_until(f.loop, &cl, rsp_closed, b, 5000));
    assert_int_equal(b->grpc_status, 0);
    client_close(&cl);
    assert_true(run_until(f.loop, NULL, conns_0, f.ln, 5000));
    fx_free(&f);
}

static void test_deadline_timer(void **state)
{
    struct fx f;
    fx_init(&f);
    fx_listen(&f);
    struct client cl;
    client_connect(&cl, f.path);
    uint64_t t0 = now_ms();
    struct rsp *a = client_call(&cl, "/t.T/Later", "50m");
    assert_true(run_until(f.loop, &cl, rsp_closed, a, 5000));
    assert_int_equal(a->grpc_status, GRPC_DEADLINE_EXCEEDED);
    assert_true(now_ms() - t0 >= 50);
    assert_int_equal(n_pending, 1);
    assert_int_equal(grpc_call_reply(pending[0], "late", 4), -ECANCELED);
    client_close(&cl);
    fx_free(&f);
}

static void test_shutdown_finishes_in_flight(void **state)
{
    struct fx f;
    fx_init(&f);
    fx_listen(&f);
    struct client cl;
    client_connect(&cl, f.path);
    struct rsp *a = client_call(&cl, "/t.T/Later", NULL);
    assert_true(run_until(f.loop, &cl, pending_1, NULL, 5000));
    grpc_listener_shutdown(f.ln, 5000, on_drained, NULL);
    assert_int_equal(access(f.path, F_OK), -1); /* socket removed at once */
    run_until(f.loop, &cl, is_drained, NULL, 50);
    assert_false(drained_called); /* waits for the call */
    assert_int_equal(grpc_call_reply(pending[0], "ok", 2), 0);
    assert_true(run_until(f.loop, &cl, is_drained, NULL, 5000));
    assert_true(a->closed);
    assert_int_equal(a->grpc_status, 0);
    client_close(&cl);
    fx_free(&f);
}

static void test_shutdown_grace_bounded(void **state)
{
    struct fx f;
    fx_init(&f);
    fx_listen(&f);
    struct client cl;
    client_connect(&cl, f.path);
    client_call(&cl, "/t.T/Later", NULL);
    assert_true(run_until(f.loop, &cl, pending_1, NULL, 5000));
    uint64_t t0 = now_ms();
    grpc_listener_shutdown(f.ln, 200, on_drained, NULL);
    assert_true(run_until(f.loop, &cl, is_drained, NULL, 5000));
    uint64_t took = now_ms() - t0;
    assert_true(took >= 200 && took < 2000);
    assert_int_equal(grpc_listener_connections(f.ln), 0);
    /* The handler finishes later: discarded, no leak. */
    assert_true(grpc_call_cancelled(pending[0]));
    assert_int_equal(grpc_call_reply(pending[0], "ok", 2), -ECANCELED);
    client_close(&cl);
    fx_free(&f);
}

int main(void)
{
    log_set_level(LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_socket_file),
        cmocka_unit_test(test_call_and_async),
        cmocka_unit_test(test_deadline_timer),
        cmocka_unit_test(test_shutdown_finishes_in_flight),
        cmocka_unit_test(test_shutdown_grace_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
