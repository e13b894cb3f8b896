/* SPDX-License-Identifier: Apache-2.0 */
/* grpc.c: the gRPC session layer on nghttp2.  See grpc.h.
 *
 * One struct per connection (grpc_session), one per stream (grpc_stream), one
 * per dispatched RPC (grpc_call, which outlives its stream when a handler is
 * slow).  A stream is created in on_begin_headers, dispatched on END_STREAM and
 * freed in on_stream_close.  All nghttp2 callbacks are registered in
 * session_callbacks().  No I/O here: the transport moves bytes. */
#include "grpc.h"
#include "qsd/base/util.h"

#include <nghttp2/nghttp2.h>
#include <stdarg.h>

#define GRPC_PREFIX 5
#define GRPC_STREAM_LOW (GRPC_STREAM_HIGH / 2) /* writable_cb below this */
#define PATH_MAX_LEN 256
#define OVER_BUDGET_MSG "the plugin's request buffers are full; retry"

struct grpc_stream;

struct grpc_call {
    struct grpc_stream *stream; /* NULL once detached (stream gone or answered) */
    const struct grpc_method *method;
    uint64_t start_us;
    uint64_t deadline_us;
    grpc_cancel_fn cancel_cb;
    void *cancel_opaque;
    grpc_writable_fn writable_cb;
    void *writable_opaque;
    bool cancelled;
};

struct grpc_stream {
    struct grpc_session *sess;
    int32_t id;
    char *path;
    size_t header_bytes;
    uint64_t start_us;
    uint64_t deadline_us;
    bool bad_method;       /* :method is not POST */
    bool content_type_ok;  /* application/grpc[+proto|;...] */
    bool bad_timeout;
    bool compressed_encoding; /* grpc-encoding other than identity */
    uint8_t *body;         /* request bytes, prefix included */
    size_t body_len, body_cap;
    bool too_big;
    bool over_budget;      /* the server's buffers were full */
    bool answered;         /* response submitted */
    struct grpc_call *call;
    uint8_t *resp;         /* response DATA payload (prefix + message) */
    size_t resp_len, resp_off, resp_cap;
    /* Server streaming (grpc_call_send_pb): the headers went out with the
     * first message; resp is a queue of framed messages that the data
     * provider drains; answered once the handler ended the call (the
     * trailers follow the queue). */
    bool streaming;
    bool deferred;         /* the data provider waits for more (DEFERRED) */
    bool want_more;        /* the queue fell below the low mark: call writable_cb */
    enum grpc_code code;
    char *message;
    /* An answer decided while record changes were not durable yet: submitted
     * once the barrier reaches held (grpc_server_durable). */
    uint64_t held;
    enum grpc_code held_code;
    char *held_msg;
    const struct grpc_method *held_method;
    struct grpc_stream *next, *prev;
};

struct grpc_session {
    struct grpc_server *srv;
    nghttp2_session *h2;
    grpc_wakeup_fn wakeup;
    void *wakeup_opaque;
    struct grpc_stream *streams;
    unsigned n_streams;
    uint8_t *out;          /* output not yet taken by the transport */
    size_t out_len, out_off, out_cap;
    bool in_recv;          /* inside grpc_session_recv: no wakeups needed */
    bool goaway_sent;
    struct grpc_session *next, *prev;
};

struct grpc_server {
    struct grpc_limits lim;
    const struct grpc_method **tables;
    size_t *table_len;
    size_t n_tables;
    struct grpc_session *sessions;
    unsigned n_sessions;
    size_t buffered;       /* sum of every stream's body_cap */
    bool draining;
    grpc_barrier_fn barrier;
    void *barrier_opaque;
    uint64_t durable;      /* the barrier's sequence known durable */
    grpc_observer_fn observer;
    void *observer_opaque;
};

static const char *const code_names[] = {
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED",
};

const char *grpc_code_name(enum grpc_code c)
{
    if ((unsigned)c < ARRAY_SIZE(code_names))
        return code_names[c];
    return "INVALID_CODE";
}

void grpc_limits_default(struct grpc_limits *ret)
{
    *ret = (struct grpc_limits){
        .max_message = 4u << 20,
        .max_streams = 128,
        .max_connections = 64,
        .max_header_list = 16u << 10,
        .max_deadline_ms = 10 * 60 * 1000,
        .max_output = 1u << 20,
        .max_buffered = 64u << 20,
    };
}

/* ------------------------------------------------------------ pure helpers */

int grpc_parse_timeout(const char *s, size_t len, uint64_t *ret_us)
{
    if (len < 2 || len > 9)
        return -EINVAL;
    uint64_t v = 0;
    for (size_t i = 0; i < len - 1; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -EINVAL;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    /* 8 digits at most: v < 1e8, so none of these overflow. */
    switch (s[len - 1]) {
    case 'H': v *= 3600ull * 1000000; break;
    case 'M': v *= 60ull * 1000000; break;
    case 'S': v *= 1000000; break;
    case 'm': v *= 1000; break;
    case 'u': break;
    case 'n': v = (v + 999) / 1000; break;
    default: return -EINVAL;
    }
    *ret_us = v;
    return 0;
}

char *grpc_percent_encode(const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen(s);
    char *out = xmalloc(n * 3 + 1), *o = out;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p >= 0x20 && *p <= 0x7e && *p != '%') {
            *o++ = (char)*p;
        } else {
            *o++ = '%';
            *o++ = hex[*p >> 4];
            *o++ = hex[*p & 15];
        }
    }
    *o = '\0';
    return out;
}

/* ------------------------------------------------------------ server */

int grpc_server_new(const struct grpc_limits *lim, struct grpc_server **ret)
{
    struct grpc_server *srv = xcalloc(1, sizeof(*srv));
    if (lim)
        srv->lim = *lim;
    else
        grpc_limits_default(&srv->lim);
    if (srv->lim.max_message == 0 || srv->lim.max_streams == 0 ||
        srv->lim.max_connections == 0 || srv->lim.max_header_list == 0 ||
        srv->lim.max_message > (1u << 30) || srv->lim.max_buffered < srv->lim.max_message) {
        free(srv);
        return -EINVAL;
    }
    *ret = srv;
    return 0;
}

int grpc_server_add_methods(struct grpc_server *srv, const struct grpc_method *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!m[i].path || m[i].path[0] != '/' || !m[i].handler)
            return -EINVAL;
        for (size_t t = 0; t < srv->n_tables; t++)
            for (size_t j = 0; j < srv->table_len[t]; j++)
                if (streq(srv->tables[t][j].path, m[i].path))
                    return -EEXIST;
    }
    srv->tables = xrealloc(srv->tables, (srv->n_tables + 1) * sizeof(*srv->tables));
    srv->table_len = xrealloc(srv->table_len, (srv->n_tables + 1) * sizeof(*srv->table_len));
    srv->tables[srv->n_tables] = m;
    srv->table_len[srv->n_tables] = n;
    srv->n_tables++;
    return 0;
}

static const struct grpc_method *server_find(const struct grpc_server *srv, const char *path)
{
    for (size_t t = 0; t < srv->n_tables; t++)
        for (size_t j = 0; j < srv->table_len[t]; j++)
            if (streq(srv->tables[t][j].path, path))
                return &srv->tables[t][j];
    return NULL;
}

void grpc_server_set_observer(struct grpc_server *srv, grpc_observer_fn fn, void *opaque)
{
    srv->observer = fn;
    srv->observer_opaque = opaque;
}

void grpc_server_free(struct grpc_server *srv)
{
    if (!srv)
        return;
    while (srv->sessions)
        grpc_session_free(srv->sessions);
    free(srv->tables);
    free(srv->table_len);
    free(srv);
}

bool grpc_server_draining(const struct grpc_server *srv) { return srv->draining; }
unsigned grpc_server_sessions(const struct grpc_server *srv) { return srv->n_sessions; }

static void session_wake(struct grpc_session *s)
{
    if (!s->in_recv && s->wakeup)
        s->wakeup(s, s->wakeup_opaque);
}

void grpc_server_shutdown(struct grpc_server *srv)
{
    if (srv->draining)
        return;
    srv->draining = true;
    for (struct grpc_session *s = srv->sessions; s; s = s->next) {
        if (!s->goaway_sent) {
            /* Streams already started finish; later ones are refused. */
            nghttp2_submit_goaway(s->h2, NGHTTP2_FLAG_NONE,
                                  nghttp2_session_get_last_proc_stream_id(s->h2),
                                  NGHTTP2_NO_ERROR, NULL, 0);
            s->goaway_sent = true;
        }
        session_wake(s);
    }
}

/* ------------------------------------------------------------ RPC logging */

/* The one place every RPC ends: its log line and the server's observer
 * (metrics).  The observer sees a registered method or NULL, never the
 * peer's path (a peer could send any number of distinct paths). */
static void log_rpc(struct grpc_server *srv, const char *method, enum log_level ok_level,
                    enum grpc_code code, const char *message, uint64_t start_us)
{
    uint64_t us = now_us() - start_us;
    if (srv->observer)
        srv->observer(streq(method, "-") ? NULL : server_find(srv, method), code, us,
                      srv->observer_opaque);
    enum log_level level = code == GRPC_OK ? ok_level : LOG_WARN;
    if (level < log_min_level)
        return;
    if (message && *message) {
        _cleanup_free_ char *q = log_quote(message);
        log_emit(level, "grpc", "rpc", "method=%s code=%s duration_ms=%.3f error=%s", method,
                 grpc_code_name(code), (double)us / 1000.0, q);
    } else {
        log_emit(level, "grpc", "rpc", "method=%s code=%s duration_ms=%.3f", method,
                 grpc_code_name(code), (double)us / 1000.0);
    }
}

/* ------------------------------------------------------------ responses */

static void call_detach(struct grpc_call *c, bool notify)
{
    if (!c)
        return;
    struct grpc_stream *st = c->stream;
    if (st)
        st->call = NULL;
    c->stream = NULL;
    c->cancelled = true;
    if (notify && c->cancel_cb) {
        grpc_cancel_fn cb = c->cancel_cb;
        c->cancel_cb = NULL;
        cb(c, c->cancel_opaque);
    }
}

/* The trailers of a response: grpc-status, and grpc-message when not OK. */
static int submit_trailers(nghttp2_session *h2, struct grpc_stream *st)
{
    char codebuf[12];
    int cl = snprintf(codebuf, sizeof(codebuf), "%u", (unsigned)st->code);
    const char *m = st->message ? st->message : "";
    const nghttp2_nv trailer[] = {
        {(uint8_t *)"grpc-status", (uint8_t *)codebuf, 11, (size_t)cl, NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)"grpc-message", (uint8_t *)m, 12, strlen(m), NGHTTP2_NV_FLAG_NONE},
    };
    return nghttp2_submit_trailer(h2, st->id, trailer, m[0] ? 2 : 1);
}

static ssize_t data_read_cb(nghttp2_session *h2, int32_t stream_id, uint8_t *buf, size_t length,
                            uint32_t *data_flags, nghttp2_data_source *source, void *user_data)
{
    struct grpc_stream *st = source->ptr;
    size_t n = st->resp ? MIN(length, st->resp_len - st->resp_off) : 0;
    if (n == 0 && st->streaming && !st->answered) {
        /* The handler has not produced the next message yet. */
        st->deferred = true;
        if (st->call && st->call->writable_cb)
            st->want_more = true;
        return NGHTTP2_ERR_DEFERRED;
    }
    if (n)
        memcpy(buf, st->resp + st->resp_off, n);
    st->resp_off += n;
    if (st->streaming && st->resp_len - st->resp_off < GRPC_STREAM_LOW && st->call &&
        st->call->writable_cb)
        st->want_more = true;
    if (st->resp_off == st->resp_len && (!st->streaming || st->answered)) {
        *data_flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
        if (submit_trailers(h2, st) < 0)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    return (ssize_t)n;
}

#define NV(n, v, vl) {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, (vl), NGHTTP2_NV_FLAG_NONE}

/* End a streaming response: its status goes out in the trailers, after
 * the messages still queued. */
static void stream_end(struct grpc_stream *st, enum grpc_code code, const char *message,
                       const char *method_for_log, enum log_level ok_level)
{
    struct grpc_session *s = st->sess;
    st->answered = true;
    st->code = code;
    free(st->message);
    st->message = code == GRPC_OK ? NULL : grpc_percent_encode(message ? message : "");
    log_rpc(s->srv, method_for_log, ok_level, code, message, st->start_us);
    if (st->deferred) {
        st->deferred = false;
        nghttp2_session_resume_data(s->h2, st->id);
    }
    session_wake(s);
}

/* Submit the final answer of a stream.  With code OK, st->resp holds the
 * DATA payload; otherwise a trailers-only response carries the status.  A
 * streaming response (headers and messages sent) ends with trailers. */
static int stream_answer(struct grpc_stream *st, enum grpc_code code, const char *message,
                         const char *method_for_log, enum log_level ok_level)
{
    struct grpc_session *s = st->sess;
    if (st->answered)
        return -EALREADY;
    if (st->streaming) {
        stream_end(st, code, message, method_for_log, ok_level);
        return 0;
    }
    st->answered = true;
    st->code = code;
    log_rpc(s->srv, method_for_log, ok_level, code, message, st->start_us);

    int r;
    if (code == GRPC_OK) {
        const nghttp2_nv hdrs[] = {
            NV(":status", "200", 3),
            NV("content-type", "application/grpc", 16),
        };
        nghttp2_data_provider prd = {.source.ptr = st, .read_callback = data_read_cb};
        r = nghttp2_submit_response(s->h2, st->id, hdrs, ARRAY_SIZE(hdrs), &prd);
    } else {
        char codebuf[12];
        int cl = snprintf(codebuf, sizeof(codebuf), "%u", (unsigned)code);
        free(st->message);
        st->message = grpc_percent_encode(message ? message : "");
        nghttp2_nv hdrs[] = {
            NV(":status", "200", 3),
            NV("content-type", "application/grpc", 16),
            NV("grpc-status", codebuf, (size_t)cl),
            NV("grpc-message", st->message, strlen(st->message)),
        };
        r = nghttp2_submit_response(s->h2, st->id, hdrs, st->message[0] ? 4 : 3, NULL);
    }
    session_wake(s);
    return r < 0 ? -EIO : 0;
}

/* A non-gRPC request (wrong method or content type): plain HTTP error. */
static void stream_http_error(struct grpc_stream *st, const char *status)
{
    if (st->answered)
        return;
    st->answered = true;
    const nghttp2_nv hdrs[] = {NV(":status", status, 3)};
    nghttp2_submit_response(st->sess->h2, st->id, hdrs, ARRAY_SIZE(hdrs), NULL);
    log_rpc(st->sess->srv, st->path ? st->path : "-", LOG_INFO, GRPC_INTERNAL,
            streq(status, "415") ? "unsupported content-type" : "method not allowed",
            st->start_us);
    session_wake(st->sess);
}

static void call_free(struct grpc_call *c) { free(c); }

/* Completion common path.  resp (prefix + message, malloc'd) is taken. */
static int call_complete(struct grpc_call *c, enum grpc_code code, const char *message,
                         uint8_t *resp, size_t resp_len)
{
    struct grpc_stream *st = c->stream;
    if (!st || st->answered) {
        free(resp);
        call_free(c);
        return -ECANCELED;
    }
    st->call = NULL;
    c->stream = NULL;
    if (st->streaming) {
        /* A streaming call's end: no barrier (its RPCs only read). */
        free(resp);
        stream_end(st, code, message, c->method->path, c->method->log_level);
        call_free(c);
        return 0;
    }
    if (code == GRPC_OK) {
        st->resp = resp;
        st->resp_len = resp_len;
        st->resp_off = 0;
    } else {
        free(resp);
    }
    struct grpc_server *srv = st->sess->srv;
    uint64_t seq = srv->barrier ? srv->barrier(srv->barrier_opaque) : 0;
    if (seq > srv->durable) {
        st->held = seq;
        st->held_code = code;
        st->held_msg = message ? xstrdup(message) : NULL;
        st->held_method = c->method;
        call_free(c);
        return 0;
    }
    int r = stream_answer(st, code, message, c->method->path, c->method->log_level);
    call_free(c);
    return r;
}

static uint8_t *frame_message(size_t len)
{
    uint8_t *b = xmalloc(GRPC_PREFIX + len);
    b[0] = 0;
    b[1] = (uint8_t)(len >> 24);
    b[2] = (uint8_t)(len >> 16);
    b[3] = (uint8_t)(len >> 8);
    b[4] = (uint8_t)len;
    return b;
}

int grpc_call_reply(struct grpc_call *c, const void *msg, size_t len)
{
    if (len > UINT32_MAX)
        return grpc_call_fail(c, GRPC_RESOURCE_EXHAUSTED, "response too large");
    uint8_t *b = frame_message(len);
    if (len)
        memcpy(b + GRPC_PREFIX, msg, len);
    return call_complete(c, GRPC_OK, NULL, b, GRPC_PREFIX + len);
}

int grpc_call_reply_pb(struct grpc_call *c, const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    if (len > UINT32_MAX)
        return grpc_call_fail(c, GRPC_RESOURCE_EXHAUSTED, "response too large");
    uint8_t *b = frame_message(len);
    protobuf_c_message_pack(msg, b + GRPC_PREFIX);
    return call_complete(c, GRPC_OK, NULL, b, GRPC_PREFIX + len);
}

int grpc_call_fail(struct grpc_call *c, enum grpc_code code, const char *fmt, ...)
{
    _cleanup_free_ char *m = NULL;
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        if (vasprintf(&m, fmt, ap) < 0)
            abort();
        va_end(ap);
    }
    if (code == GRPC_OK)
        code = GRPC_UNKNOWN; /* failing with OK is a bug in the handler */
    return call_complete(c, code, m, NULL, 0);
}

int grpc_call_end(struct grpc_call *c, enum grpc_code code, const char *fmt, ...)
{
    _cleanup_free_ char *m = NULL;
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        if (vasprintf(&m, fmt, ap) < 0)
            abort();
        va_end(ap);
    }
    return call_complete(c, code, m, NULL, 0);
}

static void fill_pb(uint8_t *dst, const void *src, size_t len)
{
    (void)len;
    protobuf_c_message_pack(src, dst);
}

static void fill_raw(uint8_t *dst, const void *src, size_t len)
{
    memcpy(dst, src, len);
}

/* Queue one message of len bytes, written by fill into the queue. */
static int stream_queue(struct grpc_call *c, size_t len,
                        void (*fill)(uint8_t *dst, const void *src, size_t len), const void *src)
{
    struct grpc_stream *st = c->stream;
    if (!st || st->answered)
        return -ECANCELED;
    size_t queued = st->resp_len - st->resp_off;
    if (len > GRPC_STREAM_MAX || queued + GRPC_PREFIX + len > GRPC_STREAM_MAX)
        return -ENOBUFS;
    /* Compact once the sent part outweighs the rest (amortised O(1)). */
    size_t need = GRPC_PREFIX + len;
    if (st->resp_off > 0 && (st->resp_off >= queued || st->resp_len + need > st->resp_cap)) {
        memmove(st->resp, st->resp + st->resp_off, queued);
        st->resp_len = queued;
        st->resp_off = 0;
    }
    if (st->resp_len + need > st->resp_cap) {
        st->resp_cap = MAX(st->resp_cap * 2, st->resp_len + need);
        st->resp = xrealloc(st->resp, st->resp_cap);
    }
    uint8_t *b = st->resp + st->resp_len;
    b[0] = 0;
    b[1] = (uint8_t)(len >> 24);
    b[2] = (uint8_t)(len >> 16);
    b[3] = (uint8_t)(len >> 8);
    b[4] = (uint8_t)len;
    fill(b + GRPC_PREFIX, src, len);
    st->resp_len += need;
    struct grpc_session *s = st->sess;
    if (!st->streaming) {
        st->streaming = true;
        const nghttp2_nv hdrs[] = {
            NV(":status", "200", 3),
            NV("content-type", "application/grpc", 16),
        };
        nghttp2_data_provider prd = {.source.ptr = st, .read_callback = data_read_cb};
        if (nghttp2_submit_response(s->h2, st->id, hdrs, ARRAY_SIZE(hdrs), &prd) < 0)
            return -EIO;
    } else if (st->deferred) {
        st->deferred = false;
        nghttp2_session_resume_data(s->h2, st->id);
    }
    session_wake(s);
    return 0;
}

int grpc_call_send_pb(struct grpc_call *c, const ProtobufCMessage *msg)
{
    return stream_queue(c, protobuf_c_message_get_packed_size(msg), fill_pb, msg);
}

int grpc_call_send(struct grpc_call *c, const void *msg, size_t len)
{
    return stream_queue(c, len, fill_raw, msg);
}

bool grpc_call_writable(const struct grpc_call *c)
{
    const struct grpc_stream *st = c->stream;
    return st && !st->answered && st->resp_len - st->resp_off < GRPC_STREAM_HIGH;
}

void grpc_call_on_writable(struct grpc_call *c, grpc_writable_fn cb, void *opaque)
{
    c->writable_cb = cb;
    c->writable_opaque = opaque;
}

size_t grpc_call_queued(const struct grpc_call *c)
{
    return c->stream ? c->stream->resp_len - c->stream->resp_off : 0;
}

void grpc_server_set_barrier(struct grpc_server *srv, grpc_barrier_fn fn, void *opaque)
{
    srv->barrier = fn;
    srv->barrier_opaque = opaque;
}

void grpc_server_durable(struct grpc_server *srv, uint64_t seq, int err)
{
    if (seq > srv->durable)
        srv->durable = seq;
    for (struct grpc_session *s = srv->sessions; s; s = s->next)
        for (struct grpc_stream *st = s->streams; st; st = st->next) {
            if (!st->held || st->held > seq || st->answered)
                continue;
            const struct grpc_method *m = st->held_method;
            st->held = 0;
            if (err < 0) {
                _cleanup_free_ char *msg = xasprintf(
                    "the plugin's records could not be written to disk (%s); retry",
                    strerror(-err));
                stream_answer(st, GRPC_INTERNAL, msg, m->path, m->log_level);
            } else {
                stream_answer(st, st->held_code, st->held_msg, m->path, m->log_level);
            }
        }
}

const char *grpc_call_method(const struct grpc_call *c) { return c->method->path; }
uint64_t grpc_call_deadline(const struct grpc_call *c) { return c->deadline_us; }
bool grpc_call_cancelled(const struct grpc_call *c) { return c->cancelled; }
void grpc_call_on_cancel(struct grpc_call *c, grpc_cancel_fn cb, void *opaque)
{
    c->cancel_cb = cb;
    c->cancel_opaque = opaque;
}

/* ------------------------------------------------------------ dispatch */

static void stream_dispatch(struct grpc_stream *st)
{
    struct grpc_server *srv = st->sess->srv;
    if (st->answered)
        return;
    if (st->bad_method || !st->path) {
        stream_http_error(st, "405");
        return;
    }
    if (!st->content_type_ok) {
        stream_http_error(st, "415");
        return;
    }
    const struct grpc_method *m = server_find(srv, st->path);
    if (!m) {
        stream_answer(st, GRPC_UNIMPLEMENTED, "unknown method", st->path, LOG_INFO);
        return;
    }
    if (st->bad_timeout) {
        stream_answer(st, GRPC_INTERNAL, "malformed grpc-timeout", m->path, m->log_level);
        return;
    }
    if (st->too_big) {
        char msg[96];
        snprintf(msg, sizeof(msg), "request message larger than max (%zu bytes)",
                 srv->lim.max_message);
        stream_answer(st, GRPC_RESOURCE_EXHAUSTED, st->over_budget ? OVER_BUDGET_MSG : msg,
                      m->path, m->log_level);
        return;
    }
    if (st->body_len < GRPC_PREFIX) {
        stream_answer(st, GRPC_INTERNAL, "unary request without a message", m->path,
                      m->log_level);
        return;
    }
    uint32_t len = (uint32_t)st->body[1] << 24 | (uint32_t)st->body[2] << 16 |
                   (uint32_t)st->body[3] << 8 | st->body[4];
    if ((size_t)len + GRPC_PREFIX != st->body_len) {
        stream_answer(st, GRPC_INTERNAL, "unary request must carry exactly one message",
                      m->path, m->log_level);
        return;
    }
    if (st->body[0] != 0) {
        stream_answer(st, GRPC_UNIMPLEMENTED, "compressed messages are not supported",
                      m->path, m->log_level);
        return;
    }
    struct grpc_call *c = xcalloc(1, sizeof(*c));
    c->stream = st;
    c->method = m;
    c->start_us = st->start_us;
    c->deadline_us = st->deadline_us;
    st->call = c;
    /* The handler may complete (and free c) before returning. */
    m->handler(c, st->body + GRPC_PREFIX, len, m->opaque);
}

/* Early answer: the peer is still sending but we already know the outcome. */
static void stream_refuse_early(struct grpc_stream *st)
{
    struct grpc_server *srv = st->sess->srv;
    const struct grpc_method *m = st->path ? server_find(srv, st->path) : NULL;
    if (!m)
        return; /* decided at END_STREAM */
    char msg[96];
    snprintf(msg, sizeof(msg), "request message larger than max (%zu bytes)",
             srv->lim.max_message);
    stream_answer(st, GRPC_RESOURCE_EXHAUSTED, st->over_budget ? OVER_BUDGET_MSG : msg, m->path,
                  m->log_level);
}

size_t grpc_server_buffered(const struct grpc_server *srv) { return srv->buffered; }

/* ------------------------------------------------------------ streams */

static void stream_free(struct grpc_stream *st)
{
    struct grpc_session *s = st->sess;
    if (!st->answered) {
        /* Abandoned before an answer (peer reset, connection closed,
         * shutdown grace over): the only log line of this RPC. */
        const struct grpc_method *m = st->call ? st->call->method : st->held_method;
        log_rpc(s->srv, m ? m->path : (st->path ? st->path : "-"),
                m ? m->log_level : LOG_INFO,
                GRPC_CANCELLED,
                st->call   ? "stream closed before the handler answered"
                : st->held ? "stream closed while its answer waited for the disk"
                           : "stream closed before the request was complete",
                st->start_us);
    }
    if (st->call)
        call_detach(st->call, true);
    if (st->prev)
        st->prev->next = st->next;
    else
        s->streams = st->next;
    if (st->next)
        st->next->prev = st->prev;
    s->n_streams--;
    s->srv->buffered -= st->body_cap;
    free(st->path);
    free(st->body);
    free(st->resp);
    free(st->message);
    free(st->held_msg);
    free(st);
}

static int on_begin_headers(nghttp2_session *h2, const nghttp2_frame *frame, void *user_data)
{
    struct grpc_session *s = user_data;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    if (s->n_streams >= s->srv->lim.max_streams || s->srv->draining) {
        /* No stream object: the rest of this request is ignored. */
        nghttp2_submit_rst_stream(h2, NGHTTP2_FLAG_NONE, frame->hd.stream_id,
                                  NGHTTP2_REFUSED_STREAM);
        return 0;
    }
    struct grpc_stream *st = xcalloc(1, sizeof(*st));
    st->sess = s;
    st->id = frame->hd.stream_id;
    st->start_us = now_us();
    uint64_t cap = s->srv->lim.max_deadline_ms * 1000;
    st->deadline_us = cap ? st->start_us + cap : 0;
    st->next = s->streams;
    if (s->streams)
        s->streams->prev = st;
    s->streams = st;
    s->n_streams++;
    nghttp2_session_set_stream_user_data(h2, st->id, st);
    return 0;
}

static bool content_type_grpc(const uint8_t *v, size_t len)
{
    static const char ct[] = "application/grpc";
    size_t n = sizeof(ct) - 1;
    if (len < n || memcmp(v, ct, n) != 0)
        return false;
    return len == n || v[n] == '+' || v[n] == ';';
}

static int on_header(nghttp2_session *h2, const nghttp2_frame *frame, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                     void *user_data)
{
    struct grpc_session *s = user_data;
    struct grpc_stream *st = nghttp2_session_get_stream_user_data(h2, frame->hd.stream_id);
    if (!st || st->answered || frame->hd.type != NGHTTP2_HEADERS)
        return 0;
    /* RFC 7541 accounting: 32 bytes overhead per field. */
    st->header_bytes += namelen + valuelen + 32;
    if (st->header_bytes > s->srv->lim.max_header_list) {
        st->answered = true; /* nothing more is dispatched or sent on it */
        log_rpc(s->srv, st->path ? st->path : "-", LOG_INFO, GRPC_RESOURCE_EXHAUSTED,
                "header list too large", st->start_us);
        nghttp2_submit_rst_stream(h2, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_ENHANCE_YOUR_CALM);
        return 0;
    }
    if (frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0; /* request trailers: ignored */
#define IS(lit) (namelen == sizeof(lit) - 1 && memcmp(name, lit, namelen) == 0)
    if (IS(":path")) {
        free(st->path);
        st->path = valuelen <= PATH_MAX_LEN ? xstrndup((const char *)value, valuelen) : NULL;
        if (st->path && strlen(st->path) != valuelen) {
            free(st->path);
            st->path = NULL;
        }
    } else if (IS(":method")) {
        st->bad_method = !(valuelen == 4 && memcmp(value, "POST", 4) == 0);
    } else if (IS("content-type")) {
        st->content_type_ok = content_type_grpc(value, valuelen);
    } else if (IS("grpc-timeout")) {
        uint64_t us;
        if (grpc_parse_timeout((const char *)value, valuelen, &us) < 0) {
            st->bad_timeout = true;
        } else {
            uint64_t cap = s->srv->lim.max_deadline_ms * 1000;
            if (cap && us > cap)
                us = cap;
            st->deadline_us = st->start_us + us;
        }
    } else if (IS("grpc-encoding")) {
        st->compressed_encoding = !(valuelen == 8 && memcmp(value, "identity", 8) == 0);
    }
#undef IS
    return 0;
}

static int on_data_chunk_recv(nghttp2_session *h2, uint8_t flags, int32_t stream_id,
                              const uint8_t *data, size_t len, void *user_data)
{
    struct grpc_session *s = user_data;
    struct grpc_stream *st = nghttp2_session_get_stream_user_data(h2, stream_id);
    if (!st || st->too_big || st->answered || len == 0)
        return 0; /* discarded; flow control is still replenished by nghttp2 */
    size_t max = s->srv->lim.max_message + GRPC_PREFIX;
    if (st->body_len + len > max) {
        st->too_big = true;
    } else if (st->body_len < GRPC_PREFIX && st->body_len + len >= GRPC_PREFIX) {
        /* Look at the declared length as soon as the prefix is complete. */
        uint8_t pre[GRPC_PREFIX];
        size_t have = st->body_len;
        if (have)
            memcpy(pre, st->body, have);
        memcpy(pre + have, data, GRPC_PREFIX - have);
        uint32_t declared = (uint32_t)pre[1] << 24 | (uint32_t)pre[2] << 16 |
                            (uint32_t)pre[3] << 8 | pre[4];
        if (declared > s->srv->lim.max_message)
            st->too_big = true;
    }
    size_t cap = st->body_cap;
    if (!st->too_big && st->body_len + len > st->body_cap) {
        cap = MAX(st->body_cap * 2, st->body_len + len);
        cap = MIN(MAX(cap, (size_t)256), max);
        /* One budget for every partial request of every connection. */
        if (s->srv->buffered - st->body_cap + cap > s->srv->lim.max_buffered)
            st->too_big = st->over_budget = true;
    }
    if (st->too_big) {
        s->srv->buffered -= st->body_cap;
        free(st->body);
        st->body = NULL;
        st->body_len = st->body_cap = 0;
        stream_refuse_early(st);
        return 0;
    }
    if (cap != st->body_cap) {
        s->srv->buffered += cap - st->body_cap;
        st->body = xrealloc(st->body, cap);
        st->body_cap = cap;
    }
    memcpy(st->body + st->body_len, data, len);
    st->body_len += len;
    return 0;
}

static int on_frame_recv(nghttp2_session *h2, const nghttp2_frame *frame, void *user_data)
{
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA)
        return 0;
    if (!(frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
        return 0;
    struct grpc_stream *st = nghttp2_session_get_stream_user_data(h2, frame->hd.stream_id);
    if (st)
        stream_dispatch(st);
    return 0;
}

static int on_stream_close(nghttp2_session *h2, int32_t stream_id, uint32_t error_code,
                           void *user_data)
{
    struct grpc_stream *st = nghttp2_session_get_stream_user_data(h2, stream_id);
    if (st) {
        nghttp2_session_set_stream_user_data(h2, stream_id, NULL);
        stream_free(st);
    }
    return 0;
}

static nghttp2_session_callbacks *session_callbacks(void)
{
    nghttp2_session_callbacks *cbs;
    if (nghttp2_session_callbacks_new(&cbs) != 0)
        abort();
    nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk_recv);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
    return cbs;
}

/* ------------------------------------------------------------ sessions */

nghttp2_option *grpc_h2_options(void)
{
    nghttp2_option *opt;
    if (nghttp2_option_new(&opt) != 0)
        abort();
    /* What nghttp2 keeps for a peer is bounded: its SETTINGS frames, the
     * acknowledgements queued for it, its HPACK table. */
    nghttp2_option_set_max_settings(opt, 32);
    nghttp2_option_set_max_outbound_ack(opt, 1000);
    nghttp2_option_set_max_deflate_dynamic_table_size(opt, 4096);
    return opt;
}

int grpc_session_new(struct grpc_server *srv, grpc_wakeup_fn wakeup, void *opaque,
                     struct grpc_session **ret)
{
    if (srv->draining)
        return -ESHUTDOWN;
    if (srv->n_sessions >= srv->lim.max_connections)
        return -EUSERS;

    struct grpc_session *s = xcalloc(1, sizeof(*s));
    s->srv = srv;
    s->wakeup = wakeup;
    s->wakeup_opaque = opaque;

    nghttp2_session_callbacks *cbs = session_callbacks();
    nghttp2_option *opt = grpc_h2_options();
    nghttp2_option_set_max_send_header_block_length(opt, 16384);
    int r = nghttp2_session_server_new2(&s->h2, cbs, s, opt);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cbs);
    if (r != 0) {
        free(s);
        return -ENOMEM;
    }

    const nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, srv->lim.max_streams},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, srv->lim.max_header_list},
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
    };
    r = nghttp2_submit_settings(s->h2, NGHTTP2_FLAG_NONE, iv, ARRAY_SIZE(iv));
    if (r != 0) {
        nghttp2_session_del(s->h2);
        free(s);
        return -EIO;
    }

    s->next = srv->sessions;
    if (srv->sessions)
        srv->sessions->prev = s;
    srv->sessions = s;
    srv->n_sessions++;
    *ret = s;
    return 0;
}

void grpc_session_free(struct grpc_session *s)
{
    if (!s)
        return;
    struct grpc_server *srv = s->srv;
    while (s->streams)
        stream_free(s->streams);
    nghttp2_session_del(s->h2);
    if (s->prev)
        s->prev->next = s->next;
    else
        srv->sessions = s->next;
    if (s->next)
        s->next->prev = s->prev;
    srv->n_sessions--;
    free(s->out);
    free(s);
}

int grpc_session_recv(struct grpc_session *s, const uint8_t *data, size_t len)
{
    s->in_recv = true;
    ssize_t r = nghttp2_session_mem_recv(s->h2, data, len);
    s->in_recv = false;
    if (r < 0)
        return r == NGHTTP2_ERR_NOMEM ? -ENOMEM : -EPROTO;
    return 0;
}

/* Let the handlers of streams whose queue ran low produce more (outside
 * nghttp2's callbacks: they submit).  Returns whether any ran. */
static bool session_run_writable(struct grpc_session *s)
{
    bool ran = false;
    for (struct grpc_stream *st = s->streams; st; st = st->next) {
        if (!st->want_more)
            continue;
        st->want_more = false;
        struct grpc_call *c = st->call;
        if (c && c->writable_cb && !st->answered) {
            ran = true;
            c->writable_cb(c, c->writable_opaque);
        }
    }
    return ran;
}

static bool session_wants_more(const struct grpc_session *s)
{
    for (const struct grpc_stream *st = s->streams; st; st = st->next)
        if (st->want_more)
            return true;
    return false;
}

static int session_pull(struct grpc_session *s);

int grpc_session_output(struct grpc_session *s, const uint8_t **ret_data, size_t *ret_len)
{
    /* Streaming handlers refill their queues, nghttp2 drains them into our
     * buffer; a few rounds at most, the rest on the next call. */
    for (int round = 0; round < 4; round++) {
        bool ran = session_run_writable(s);
        int r = session_pull(s);
        if (r < 0)
            return r;
        bool full = s->out_len - s->out_off >= s->srv->lim.max_output;
        if ((!ran && !session_wants_more(s)) || full)
            break;
    }
    if (session_wants_more(s))
        session_wake(s);
    *ret_data = s->out + s->out_off;
    *ret_len = s->out_len - s->out_off;
    return 0;
}

/* Pull from nghttp2 until our buffer holds max_output bytes. */
static int session_pull(struct grpc_session *s)
{
    while (s->out_len - s->out_off < s->srv->lim.max_output) {
        const uint8_t *p;
        ssize_t n = nghttp2_session_mem_send(s->h2, &p);
        if (n < 0)
            return -EPROTO;
        if (n == 0)
            break;
        if (s->out_off > 0 && s->out_off == s->out_len)
            s->out_off = s->out_len = 0;
        if (s->out_len + (size_t)n > s->out_cap) {
            if (s->out_off > 0) {
                memmove(s->out, s->out + s->out_off, s->out_len - s->out_off);
                s->out_len -= s->out_off;
                s->out_off = 0;
            }
            if (s->out_len + (size_t)n > s->out_cap) {
                s->out_cap = MAX(s->out_cap * 2, s->out_len + (size_t)n);
                s->out = xrealloc(s->out, s->out_cap);
            }
        }
        memcpy(s->out + s->out_len, p, (size_t)n);
        s->out_len += (size_t)n;
    }
    return 0;
}

void grpc_session_consume(struct grpc_session *s, size_t n)
{
    s->out_off += MIN(n, s->out_len - s->out_off);
    if (s->out_off == s->out_len)
        s->out_off = s->out_len = 0;
}

size_t grpc_session_pending_output(struct grpc_session *s)
{
    return s->out_len - s->out_off;
}

bool grpc_session_want_read(struct grpc_session *s)
{
    return nghttp2_session_want_read(s->h2) &&
           grpc_session_pending_output(s) < s->srv->lim.max_output;
}

bool grpc_session_alive(struct grpc_session *s)
{
    return nghttp2_session_want_read(s->h2) || nghttp2_session_want_write(s->h2) ||
           grpc_session_pending_output(s) > 0;
}

unsigned grpc_session_streams(const struct grpc_session *s) { return s->n_streams; }

/* ------------------------------------------------------------ deadlines */

static bool stream_waiting(const struct grpc_stream *st)
{
    return !st->answered && st->deadline_us != 0;
}

void grpc_server_expire(struct grpc_server *srv, uint64_t now)
{
    for (struct grpc_session *s = srv->sessions; s; s = s->next) {
        for (struct grpc_stream *st = s->streams; st; st = st->next) {
            if (!stream_waiting(st) || st->deadline_us > now)
                continue;
            struct grpc_call *c = st->call;
            const struct grpc_method *m = c ? c->method : NULL;
            if (!m && st->path)
                m = server_find(srv, st->path);
            stream_answer(st, GRPC_DEADLINE_EXCEEDED, "deadline exceeded",
                          m ? m->path : (st->path ? st->path : "-"),
                          m ? m->log_level : LOG_INFO);
            call_detach(c, true);
        }
    }
}

uint64_t grpc_server_next_deadline(const struct grpc_server *srv)
{
    uint64_t best = 0;
    for (const struct grpc_session *s = srv->sessions; s; s = s->next)
        for (const struct grpc_stream *st = s->streams; st; st = st->next)
            if (stream_waiting(st) && (best == 0 || st->deadline_us < best))
                best = st->deadline_us;
    return best;
}
