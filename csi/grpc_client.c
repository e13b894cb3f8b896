/* SPDX-License-Identifier: Apache-2.0 */
/* grpc_client.c: the blocking gRPC client over a unix socket.  See
 * grpc_client.h.
 *
 * One struct grpc_client per connection, one struct ccall per call (on the
 * caller's stack, the stream's user data while it runs).  nghttp2 does no
 * I/O: call_run() moves bytes between it and the non-blocking socket, with
 * poll(2) bounded by the call's deadline, until the stream is closed, the
 * call is decided here, or the connection fails.  What the callbacks decide
 * goes in the ccall; call_outcome() turns it into one status. */
#include "grpc_client.h"
#include "preamble.h"
#include "qsd/base/util.h"

#include <inttypes.h>
#include <nghttp2/nghttp2.h>
#include <poll.h>
#include <stdarg.h>
#include <sys/socket.h>

#define GRPC_PREFIX 5
#define READ_CHUNK 65536
#define DEFAULT_MAX_MESSAGE (4u << 20)
#define WINDOW (1u << 20) /* our stream and connection receive windows */

struct grpc_client {
    int fd;
    nghttp2_session *h2;
    size_t max_message;
    uint8_t *out;            /* output nghttp2 gave that the socket did not take */
    size_t out_len, out_off;
    bool broken;             /* the connection failed: every call UNAVAILABLE */
    enum grpc_code broken_code; /* the status of the call it failed */
    char *broken_msg;
    bool write_closed;       /* the server closed its reading side: output dropped */
    bool goaway;             /* the server sent GOAWAY */
    int32_t goaway_last;
    uint32_t goaway_code;
};

struct ccall {
    struct grpc_client *c;
    int32_t id;
    bool unary;
    const uint8_t *req;      /* framed request (prefix + message) */
    size_t req_len, req_off;
    /* response headers */
    int http_status;
    bool content_type_ok;
    size_t header_bytes;
    bool have_status;
    enum grpc_code status;
    char *status_msg;        /* decoded grpc-message */
    char *bad_status;        /* a grpc-status that is not a code (UNKNOWN) */
    bool remote_end;         /* END_STREAM from the server */
    /* the message being assembled */
    uint8_t prefix[GRPC_PREFIX];
    size_t prefix_len;
    uint8_t *msg;
    size_t msg_len, msg_got;
    bool in_msg;             /* prefix complete, body in progress */
    unsigned n_msgs;
    uint8_t *resp;           /* unary: the one response message */
    size_t resp_len;
    grpc_client_msg_fn fn;
    void *opaque;
    /* decided here (first decision wins) */
    bool failed;
    enum grpc_code fail_code;
    char *fail_msg;
    bool closed;             /* on_stream_close ran */
    bool server_rst;
    uint32_t rst_code;
};

void grpc_client_status_done(struct grpc_client_status *st)
{
    if (!st)
        return;
    free(st->message);
    st->message = NULL;
}

static enum grpc_code status_set(struct grpc_client_status *st, enum grpc_code code, char *msg)
{
    st->code = code;
    st->message = msg ? msg : xstrdup("");
    return code;
}

static enum grpc_code status_setf(struct grpc_client_status *st, enum grpc_code code,
                                  const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static enum grpc_code status_setf(struct grpc_client_status *st, enum grpc_code code,
                                  const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *msg = NULL;
    if (vasprintf(&msg, fmt, ap) < 0)
        abort();
    va_end(ap);
    return status_set(st, code, msg);
}

/* ------------------------------------------------------------ pure helpers */

void grpc_format_timeout(uint64_t us, char buf[static 16])
{
    /* At most 8 digits: the smallest unit that holds us (rounded up). */
    static const struct { char unit; uint64_t us; } units[] = {
        {'u', 1}, {'m', 1000}, {'S', 1000000}, {'M', 60000000}, {'H', 3600000000ull},
    };
    for (size_t i = 0; i < ARRAY_SIZE(units); i++) {
        uint64_t v = (us + units[i].us - 1) / units[i].us;
        if (v < 100000000) {
            snprintf(buf, 16, "%" PRIu64 "%c", v ? v : 1, units[i].unit);
            return;
        }
    }
    snprintf(buf, 16, "99999999H");
}

static int hexval(uint8_t ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

char *grpc_percent_decode(const uint8_t *s, size_t len)
{
    char *out = xmalloc(len + 1), *o = out;
    for (size_t i = 0; i < len; i++) {
        int hi, lo;
        if (s[i] == '%' && i + 2 < len && (hi = hexval(s[i + 1])) >= 0 && (lo = hexval(s[i + 2])) >= 0 && (hi | lo) != 0) {
            *o++ = (char)(hi << 4 | lo);
            i += 2;
        } else {
            *o++ = s[i] ? (char)s[i] : '?';
        }
    }
    *o = '\0';
    return out;
}

/* The gRPC code of an HTTP status that is not 200 (the gRPC spec's
 * "HTTP to gRPC Status Code Mapping"). */
static enum grpc_code http_to_grpc(int status)
{
    switch (status) {
    case 400: return GRPC_INTERNAL;
    case 401: return GRPC_UNAUTHENTICATED;
    case 403: return GRPC_PERMISSION_DENIED;
    case 404: return GRPC_UNIMPLEMENTED;
    case 429: case 502: case 503: case 504: return GRPC_UNAVAILABLE;
    default: return GRPC_UNKNOWN;
    }
}

/* The gRPC code of a RST_STREAM the server sent (the gRPC spec's
 * "Errors" of PROTOCOL-HTTP2). */
static enum grpc_code rst_to_grpc(uint32_t code)
{
    switch (code) {
    case NGHTTP2_REFUSED_STREAM: return GRPC_UNAVAILABLE;
    case NGHTTP2_CANCEL: return GRPC_CANCELLED;
    case NGHTTP2_ENHANCE_YOUR_CALM: return GRPC_RESOURCE_EXHAUSTED;
    case NGHTTP2_INADEQUATE_SECURITY: return GRPC_PERMISSION_DENIED;
    default: return GRPC_INTERNAL;
    }
}

/* ------------------------------------------------------------ call state */

static void call_fail(struct ccall *k, enum grpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void call_fail(struct ccall *k, enum grpc_code code, const char *fmt, ...)
{
    if (k->failed)
        return;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&k->fail_msg, fmt, ap) < 0)
        abort();
    va_end(ap);
    k->failed = true;
    k->fail_code = code;
    if (!k->closed && k->id > 0)
        nghttp2_submit_rst_stream(k->c->h2, NGHTTP2_FLAG_NONE, k->id, NGHTTP2_CANCEL);
}

/* The connection failed: code is the status of the call running (INTERNAL
 * for what the server got wrong, UNAVAILABLE for a connection that went
 * away); every later call is UNAVAILABLE. */
static void client_break(struct grpc_client *c, enum grpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void client_break(struct grpc_client *c, enum grpc_code code, const char *fmt, ...)
{
    if (c->broken)
        return;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&c->broken_msg, fmt, ap) < 0)
        abort();
    va_end(ap);
    c->broken = true;
    c->broken_code = code;
}

static struct ccall *call_of(nghttp2_session *h2, int32_t id)
{
    return id > 0 ? nghttp2_session_get_stream_user_data(h2, id) : NULL;
}

/* A complete message: the unary answer kept, or the stream's callback. */
static void call_message(struct ccall *k)
{
    k->n_msgs++;
    if (k->unary) {
        if (k->n_msgs > 1) {
            call_fail(k, GRPC_INTERNAL, "the server sent more than one message to a unary call");
            return;
        }
        k->resp = TAKE_PTR(k->msg);
        k->resp_len = k->msg_len;
        return;
    }
    int r = k->fn(k->msg ? k->msg : (const uint8_t *)"", k->msg_len, k->opaque);
    if (r != 0)
        call_fail(k, GRPC_CANCELLED, "stopped by the caller after %u messages", k->n_msgs);
}

/* The message prefix is complete: check it, allocate the body. */
static void call_prefix(struct ccall *k)
{
    const uint8_t *p = k->prefix;
    uint32_t len = (uint32_t)p[1] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 8 | p[4];
    k->prefix_len = 0;
    if (p[0] != 0) {
        call_fail(k, GRPC_INTERNAL, "the server sent a %s message (flags 0x%02x)",
                  p[0] == 1 ? "compressed" : "malformed", p[0]);
        return;
    }
    if (len > k->c->max_message) {
        call_fail(k, GRPC_RESOURCE_EXHAUSTED,
                  "response message of %" PRIu32 " bytes is over the limit of %zu bytes", len,
                  k->c->max_message);
        return;
    }
    k->msg_len = len;
    k->msg_got = 0;
    k->msg = len ? xmalloc(len) : NULL;
    k->in_msg = true;
}

static void call_data(struct ccall *k, const uint8_t *data, size_t len)
{
    while (len > 0 && !k->failed) {
        if (!k->in_msg) {
            size_t n = MIN(len, GRPC_PREFIX - k->prefix_len);
            memcpy(k->prefix + k->prefix_len, data, n);
            k->prefix_len += n;
            data += n;
            len -= n;
            if (k->prefix_len == GRPC_PREFIX)
                call_prefix(k);
            if (!k->in_msg || k->msg_len > 0)
                continue;
        }
        size_t n = MIN(len, k->msg_len - k->msg_got);
        if (n)
            memcpy(k->msg + k->msg_got, data, n);
        k->msg_got += n;
        data += n;
        len -= n;
        if (k->msg_got == k->msg_len) {
            k->in_msg = false;
            call_message(k);
            free(TAKE_PTR(k->msg));
        }
    }
}

/* ------------------------------------------------------------ nghttp2 callbacks */

static int on_header(nghttp2_session *h2, const nghttp2_frame *frame, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                     void *user_data)
{
    struct ccall *k = frame->hd.type == NGHTTP2_HEADERS ? call_of(h2, frame->hd.stream_id) : NULL;
    if (!k || k->failed)
        return 0;
    k->header_bytes += namelen + valuelen + 32;
    if (k->header_bytes > GRPC_CLIENT_HEADERS_MAX) {
        call_fail(k, GRPC_INTERNAL, "the server's headers are over %u bytes",
                  GRPC_CLIENT_HEADERS_MAX);
        return 0;
    }
#define IS(lit) (namelen == sizeof(lit) - 1 && memcmp(name, lit, namelen) == 0)
    bool first = frame->headers.cat == NGHTTP2_HCAT_RESPONSE;
    bool last = frame->hd.flags & NGHTTP2_FLAG_END_STREAM;
    if (first && IS(":status")) {
        int v = 0;
        for (size_t i = 0; i < valuelen && i < 3; i++)
            v = v * 10 + (value[i] >= '0' && value[i] <= '9' ? value[i] - '0' : 0);
        k->http_status = valuelen == 3 ? v : 0;
    } else if (first && IS("content-type")) {
        static const char ct[] = "application/grpc";
        k->content_type_ok = valuelen >= sizeof(ct) - 1 && memcmp(value, ct, sizeof(ct) - 1) == 0 &&
                             (valuelen == sizeof(ct) - 1 || value[sizeof(ct) - 1] == '+' ||
                              value[sizeof(ct) - 1] == ';');
    } else if (last && IS("grpc-status")) {
        unsigned v = 0;
        bool ok = valuelen > 0 && valuelen <= 3;
        for (size_t i = 0; ok && i < valuelen; i++) {
            ok = value[i] >= '0' && value[i] <= '9';
            v = v * 10 + (unsigned)(value[i] - '0');
        }
        k->have_status = true;
        k->status = ok && v <= GRPC_UNAUTHENTICATED ? (enum grpc_code)v : GRPC_UNKNOWN;
        free(TAKE_PTR(k->bad_status));
        if (!(ok && v <= GRPC_UNAUTHENTICATED))
            k->bad_status = grpc_percent_decode(value, MIN(valuelen, 32));
    } else if (last && IS("grpc-message")) {
        free(k->status_msg);
        k->status_msg = grpc_percent_decode(value, valuelen);
    }
#undef IS
    return 0;
}

/* The response headers are complete: a gRPC answer, or the call fails. */
static void call_headers_done(struct ccall *k)
{
    if (k->http_status != 200) {
        call_fail(k, http_to_grpc(k->http_status), "the server answered HTTP status %d",
                  k->http_status);
        return;
    }
    if (!k->content_type_ok)
        call_fail(k, GRPC_INTERNAL, "the server's answer is not gRPC (content-type)");
}

static int on_frame_recv(nghttp2_session *h2, const nghttp2_frame *frame, void *user_data)
{
    struct grpc_client *c = user_data;
    if (frame->hd.type == NGHTTP2_GOAWAY) {
        c->goaway = true;
        c->goaway_last = frame->goaway.last_stream_id;
        c->goaway_code = frame->goaway.error_code;
        return 0;
    }
    struct ccall *k = call_of(h2, frame->hd.stream_id);
    if (!k)
        return 0;
    if (frame->hd.type == NGHTTP2_RST_STREAM) {
        k->server_rst = true;
        k->rst_code = frame->rst_stream.error_code;
        return 0;
    }
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_RESPONSE)
        call_headers_done(k);
    if ((frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
        (frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
        k->remote_end = true;
    return 0;
}

static int on_data_chunk_recv(nghttp2_session *h2, uint8_t flags, int32_t stream_id,
                              const uint8_t *data, size_t len, void *user_data)
{
    struct ccall *k = call_of(h2, stream_id);
    if (k && !k->failed)
        call_data(k, data, len);
    return 0;
}

static int on_stream_close(nghttp2_session *h2, int32_t stream_id, uint32_t error_code,
                           void *user_data)
{
    struct grpc_client *c = user_data;
    struct ccall *k = call_of(h2, stream_id);
    if (!k)
        return 0;
    k->closed = true;
    if (error_code == NGHTTP2_NO_ERROR || k->server_rst || k->remote_end)
        return 0;
    if (c->goaway && stream_id > c->goaway_last)
        call_fail(k, GRPC_UNAVAILABLE, "the server is going away (GOAWAY %s) and did not take "
                  "the call", nghttp2_http2_strerror(c->goaway_code));
    else
        call_fail(k, GRPC_INTERNAL, "the stream failed: %s", nghttp2_http2_strerror(error_code));
    return 0;
}

/* nghttp2 ends the session itself when the server breaks the protocol: it
 * sends a GOAWAY with the reason, and no stream of ours will close. */
static int on_frame_send(nghttp2_session *h2, const nghttp2_frame *frame, void *user_data)
{
    struct grpc_client *c = user_data;
    if (frame->hd.type == NGHTTP2_GOAWAY && frame->goaway.error_code != NGHTTP2_NO_ERROR)
        client_break(c, GRPC_INTERNAL, "the server broke HTTP/2 (%s%s%.*s)",
                     nghttp2_http2_strerror(frame->goaway.error_code),
                     frame->goaway.opaque_data_len ? ": " : "",
                     (int)MIN(frame->goaway.opaque_data_len, 200),
                     frame->goaway.opaque_data ? (const char *)frame->goaway.opaque_data : "");
    return 0;
}

static ssize_t req_read(nghttp2_session *h2, int32_t stream_id, uint8_t *buf, size_t length,
                        uint32_t *data_flags, nghttp2_data_source *source, void *user_data)
{
    /* Not source->ptr: the call may have returned (its stream reset but
     * not gone yet); then the stream's user data is NULL. */
    struct ccall *k = call_of(h2, stream_id);
    if (!k)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    size_t n = MIN(length, k->req_len - k->req_off);
    memcpy(buf, k->req + k->req_off, n);
    k->req_off += n;
    if (k->req_off == k->req_len)
        *data_flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

static nghttp2_session_callbacks *client_callbacks(void)
{
    nghttp2_session_callbacks *cbs;
    if (nghttp2_session_callbacks_new(&cbs) != 0)
        abort();
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk_recv);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
    nghttp2_session_callbacks_set_on_frame_send_callback(cbs, on_frame_send);
    return cbs;
}

/* ------------------------------------------------------------ transport */

/* Send what nghttp2 has, as far as the socket takes it without waiting. */
static void client_flush(struct grpc_client *c)
{
    while (!c->broken) {
        if (c->out_off == c->out_len) {
            const uint8_t *p;
            ssize_t n = nghttp2_session_mem_send(c->h2, &p);
            if (n < 0) {
                client_break(c, GRPC_INTERNAL, "HTTP/2 session failed: %s", nghttp2_strerror((int)n));
                return;
            }
            if (n == 0)
                return;
            free(c->out);
            c->out = xmalloc((size_t)n);
            memcpy(c->out, p, (size_t)n);
            c->out_len = (size_t)n;
            c->out_off = 0;
        }
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        if (w < 0 && (errno == EPIPE || errno == ECONNRESET) && !c->write_closed) {
            /* What the server sent before it closed may still be read:
             * the call ends with that, or at the end of the connection. */
            c->write_closed = true;
        }
        if (c->write_closed) {
            c->out_off = c->out_len;
            continue;
        }
        if (w < 0) {
            client_break(c, GRPC_UNAVAILABLE, "writing to the server failed: %s", strerror(errno));
            return;
        }
        c->out_off += (size_t)w;
    }
}

static void client_feed(struct grpc_client *c, const uint8_t *data, size_t len)
{
    ssize_t r = nghttp2_session_mem_recv(c->h2, data, len);
    if (r < 0)
        client_break(c, GRPC_INTERNAL, "the server sent malformed HTTP/2: %s", nghttp2_strerror((int)r));
    else if (!nghttp2_session_want_read(c->h2) && !nghttp2_session_want_write(c->h2))
        client_break(c, GRPC_UNAVAILABLE, "the HTTP/2 session ended");
}

/* Wait (at most until deadline_us) for the socket; 0, or -ETIMEDOUT. */
static int client_wait(struct grpc_client *c, short events, uint64_t deadline_us)
{
    int r = preamble_wait(c->fd, events, deadline_us);
    if (r == -ETIMEDOUT)
        return r;
    if (r < 0)
        client_break(c, GRPC_UNAVAILABLE, "poll failed: %s", strerror(-r));
    return 0;
}

/* Read once what the socket has (after client_wait): fed to nghttp2. */
static void client_read(struct grpc_client *c)
{
    uint8_t buf[READ_CHUNK];
    ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n < 0 && errno != ECONNRESET)
        client_break(c, GRPC_UNAVAILABLE, "reading from the server failed: %s", strerror(errno));
    else if (n <= 0) /* ECONNRESET: it closed with our bytes unread */
        client_break(c, GRPC_UNAVAILABLE, "the server closed the connection%s",
                     n < 0 || c->write_closed ? " (reset)" : "");
    else
        client_feed(c, buf, (size_t)n);
}

/* ------------------------------------------------------------ connect */

/* Write the preamble and read its one-line answer (preamble.h); bytes
 * after the line are kept in *ret_rest for HTTP/2.  0, or fills st and
 * returns -1. */
static int client_preamble(struct grpc_client *c, const struct grpc_client_opts *o,
                           uint64_t deadline_us, uint8_t **ret_rest, size_t *ret_rest_len,
                           struct grpc_client_status *st)
{
    char *msg = NULL;
    int r = preamble_exchange(c->fd, o->preamble, o->preamble_len, o->expect ? o->expect : "OK",
                              deadline_us, ret_rest, ret_rest_len, &msg);
    if (r == 0)
        return 0;
    status_set(st, r == -ETIMEDOUT ? GRPC_DEADLINE_EXCEEDED : GRPC_UNAVAILABLE, msg);
    return -1;
}

static int client_session(struct grpc_client *c)
{
    nghttp2_session_callbacks *cbs = client_callbacks();
    nghttp2_option *opt = grpc_h2_options();
    int r = nghttp2_session_client_new2(&c->h2, cbs, c, opt);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cbs);
    if (r != 0)
        return -ENOMEM;
    const nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, WINDOW},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, GRPC_CLIENT_HEADERS_MAX},
    };
    if (nghttp2_submit_settings(c->h2, NGHTTP2_FLAG_NONE, iv, ARRAY_SIZE(iv)) != 0 ||
        nghttp2_session_set_local_window_size(c->h2, NGHTTP2_FLAG_NONE, 0, WINDOW) != 0)
        return -EIO;
    return 0;
}

enum grpc_code grpc_client_connect(const char *path, const struct grpc_client_opts *opts,
                                   uint64_t deadline_us, struct grpc_client **ret,
                                   struct grpc_client_status *ret_st)
{
    static const struct grpc_client_opts none;
    const struct grpc_client_opts *o = opts ? opts : &none;
    if (o->max_message > (1u << 30))
        return status_setf(ret_st, GRPC_INVALID_ARGUMENT, "max_message is over 1 GiB");
    struct grpc_client *c = xcalloc(1, sizeof(*c));
    c->fd = -1;
    c->max_message = o->max_message ? o->max_message : DEFAULT_MAX_MESSAGE;
    int r = unix_connect(path, true, &c->fd);
    if (r < 0) {
        grpc_client_free(c);
        return status_setf(ret_st, GRPC_UNAVAILABLE, "connecting to %s failed: %s", path,
                           strerror(-r));
    }
    _cleanup_free_ uint8_t *rest = NULL;
    size_t rest_len = 0;
    if (o->preamble && client_preamble(c, o, deadline_us, &rest, &rest_len, ret_st) < 0) {
        grpc_client_free(c);
        return ret_st->code;
    }
    if (client_session(c) < 0) {
        grpc_client_free(c);
        return status_setf(ret_st, GRPC_INTERNAL, "could not start an HTTP/2 session");
    }
    if (rest_len)
        client_feed(c, rest, rest_len);
    if (c->broken) {
        enum grpc_code code = status_setf(ret_st, c->broken_code, "%s", c->broken_msg);
        grpc_client_free(c);
        return code;
    }
    *ret = c;
    return status_set(ret_st, GRPC_OK, NULL);
}

void grpc_client_free(struct grpc_client *c)
{
    if (!c)
        return;
    if (c->h2 && !c->broken) {
        nghttp2_session_terminate_session(c->h2, NGHTTP2_NO_ERROR);
        client_flush(c);
    }
    nghttp2_session_del(c->h2);
    if (c->fd >= 0)
        close(c->fd);
    free(c->out);
    free(c->broken_msg);
    free(c);
}

bool grpc_client_usable(const struct grpc_client *c) { return c && !c->broken && !c->goaway; }

/* ------------------------------------------------------------ calls */

static int call_submit(struct ccall *k, const char *method, uint64_t deadline_us)
{
    char timeout[16];
    uint64_t now = now_us();
    grpc_format_timeout(deadline_us > now ? deadline_us - now : 0, timeout);
#define NV(n, v) {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v), NGHTTP2_NV_FLAG_NONE}
    const nghttp2_nv hdrs[] = {
        NV(":method", "POST"),      NV(":scheme", "http"),
        NV(":path", method),        NV(":authority", "localhost"),
        NV("content-type", "application/grpc"), NV("te", "trailers"),
        NV("grpc-timeout", timeout), NV("user-agent", "qsd-csi-grpc-client"),
    };
#undef NV
    nghttp2_data_provider prd = {.read_callback = req_read};
    int32_t id = nghttp2_submit_request(k->c->h2, NULL, hdrs, ARRAY_SIZE(hdrs), &prd, k);
    if (id < 0)
        return -EIO;
    k->id = id;
    return 0;
}

/* Move bytes until the call is decided, its stream closed, the connection
 * broken or the deadline passed. */
static void call_run(struct ccall *k, uint64_t deadline_us)
{
    struct grpc_client *c = k->c;
    for (;;) {
        client_flush(c);
        if (k->closed || k->failed || k->remote_end || c->broken)
            return;
        if (c->goaway && c->goaway_last < k->id) {
            call_fail(k, GRPC_UNAVAILABLE, "the server is going away (GOAWAY %s) and did not take the call",
                      nghttp2_http2_strerror(c->goaway_code));
            return;
        }
        short ev = POLLIN | (c->out_off < c->out_len ? POLLOUT : 0);
        if (client_wait(c, ev, deadline_us) < 0) {
            call_fail(k, GRPC_DEADLINE_EXCEEDED, "deadline exceeded");
            return;
        }
        client_read(c);
    }
}

/* The call's one status, from what was decided here or what the server said. */
static enum grpc_code call_outcome(struct ccall *k, struct grpc_client_status *st)
{
    struct grpc_client *c = k->c;
    if (k->failed)
        return status_set(st, k->fail_code, TAKE_PTR(k->fail_msg));
    if (k->have_status && k->remote_end) {
        if (k->in_msg || k->prefix_len)
            return status_setf(st, GRPC_INTERNAL, "the server ended the stream inside a message");
        if (k->status == GRPC_OK && k->unary && k->n_msgs != 1)
            return status_setf(st, GRPC_INTERNAL, "the server answered a unary call with %u messages",
                               k->n_msgs);
        if (k->bad_status && !k->status_msg)
            return status_setf(st, GRPC_UNKNOWN, "the server sent grpc-status \"%s\"",
                               k->bad_status);
        return status_set(st, k->status, TAKE_PTR(k->status_msg));
    }
    if (k->server_rst)
        return status_setf(st, rst_to_grpc(k->rst_code), "the server reset the stream (%s)",
                           nghttp2_http2_strerror(k->rst_code));
    if (k->remote_end)
        return status_setf(st, GRPC_INTERNAL, "the server ended the stream without grpc-status");
    if (c->broken)
        return status_setf(st, c->broken_code, "%s", c->broken_msg);
    if (c->goaway)
        return status_setf(st, GRPC_UNAVAILABLE, "the server went away (GOAWAY %s) during the call",
                           nghttp2_http2_strerror(c->goaway_code));
    return status_setf(st, GRPC_INTERNAL, "the stream closed without an answer");
}

static void call_done(struct ccall *k)
{
    if (k->id > 0 && !k->closed) {
        nghttp2_session_set_stream_user_data(k->c->h2, k->id, NULL);
        /* Still open (our request not all sent, or the call decided here):
         * the server hears that it is over. */
        if (!k->failed) /* call_fail sent one */
            nghttp2_submit_rst_stream(k->c->h2, NGHTTP2_FLAG_NONE, k->id, NGHTTP2_CANCEL);
    }
    if (k->id > 0)
        client_flush(k->c); /* a RST_STREAM, if the socket takes it now */
    free(k->status_msg);
    free(k->bad_status);
    free(k->fail_msg);
    free(k->msg);
    free(k->resp);
}

/* Frame req, run the call, decide its status.  k is set up by the caller. */
static enum grpc_code call_do(struct ccall *k, const char *method, const uint8_t *req,
                              size_t len, uint64_t deadline_us, struct grpc_client_status *st)
{
    struct grpc_client *c = k->c;
    if (c->broken)
        return status_setf(st, GRPC_UNAVAILABLE, "%s", c->broken_msg);
    if (c->goaway)
        return status_setf(st, GRPC_UNAVAILABLE, "the server went away (GOAWAY %s)",
                           nghttp2_http2_strerror(c->goaway_code));
    if (!method || method[0] != '/' || len > UINT32_MAX)
        return status_setf(st, GRPC_INVALID_ARGUMENT, "bad method or request");
    if (now_us() >= deadline_us)
        return status_setf(st, GRPC_DEADLINE_EXCEEDED, "deadline exceeded before the call");
    _cleanup_free_ uint8_t *framed = xmalloc(len + GRPC_PREFIX);
    framed[0] = 0;
    framed[1] = (uint8_t)(len >> 24);
    framed[2] = (uint8_t)(len >> 16);
    framed[3] = (uint8_t)(len >> 8);
    framed[4] = (uint8_t)len;
    if (len)
        memcpy(framed + GRPC_PREFIX, req, len);
    k->req = framed;
    k->req_len = len + GRPC_PREFIX;
    if (call_submit(k, method, deadline_us) < 0)
        return status_setf(st, GRPC_INTERNAL, "could not submit the request");
    call_run(k, deadline_us);
    return call_outcome(k, st);
}

enum grpc_code grpc_client_unary(struct grpc_client *c, const char *method, const uint8_t *req,
                                 size_t len, uint64_t deadline_us, uint8_t **ret_resp,
                                 size_t *ret_len, struct grpc_client_status *ret_st)
{
    struct ccall k = {.c = c, .unary = true};
    enum grpc_code code = call_do(&k, method, req, len, deadline_us, ret_st);
    if (code == GRPC_OK) {
        *ret_resp = TAKE_PTR(k.resp);
        *ret_len = k.resp_len;
    }
    call_done(&k);
    return code;
}

enum grpc_code grpc_client_unary_pb(struct grpc_client *c, const char *method,
                                    const ProtobufCMessage *req,
                                    const ProtobufCMessageDescriptor *resp_desc,
                                    uint64_t deadline_us, ProtobufCMessage **ret_resp,
                                    struct grpc_client_status *ret_st)
{
    size_t len = protobuf_c_message_get_packed_size(req);
    _cleanup_free_ uint8_t *buf = xmalloc(len ? len : 1);
    protobuf_c_message_pack(req, buf);
    _cleanup_free_ uint8_t *resp = NULL;
    size_t resp_len = 0;
    enum grpc_code code = grpc_client_unary(c, method, buf, len, deadline_us, &resp, &resp_len,
                                            ret_st);
    if (code != GRPC_OK)
        return code;
    ProtobufCMessage *m = protobuf_c_message_unpack(resp_desc, NULL, resp_len, resp);
    if (!m) {
        grpc_client_status_done(ret_st);
        return status_setf(ret_st, GRPC_INTERNAL, "the response does not decode as %s",
                           resp_desc->name);
    }
    *ret_resp = m;
    return code;
}

enum grpc_code grpc_client_stream(struct grpc_client *c, const char *method, const uint8_t *req,
                                  size_t len, uint64_t deadline_us, grpc_client_msg_fn fn,
                                  void *opaque, struct grpc_client_status *ret_st)
{
    struct ccall k = {.c = c, .fn = fn, .opaque = opaque};
    enum grpc_code code = call_do(&k, method, req, len, deadline_us, ret_st);
    call_done(&k);
    return code;
}
