/* SPDX-License-Identifier: Apache-2.0 */
/* nodecall.c: forwarding a call to the volume's node (nodecall.h). */
#include "nodecall.h"
#include "grpc_client.h"
#include "kube.h"
#include "op.h"
#include "service.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#define LOOKUP_MAX_US (10ull * 1000 * 1000) /* the API server's share of the deadline */
#define MARGIN_US (200ull * 1000)            /* to answer before the caller gives up */
#define RELAY_MSG_MAX (16u << 20)            /* a streamed message through the pipe */

struct nodecall {
    char *node, *method;
    uint8_t *req;
    size_t len;
    uint64_t deadline_us;
    uint64_t start_us; /* the call's arrival (the "forwarded" log's ms) */
    uint64_t worker_ms; /* the worker's own bound: the call's, and a little to report */
    bool stream;
    /* a stream (nodecall_stream): the worker writes each message into the
     * pipe as [u32 big-endian length][bytes]; the loop reads them out as
     * fast as the caller takes them */
    int rfd, wfd;
    struct loop_watch *watch;
    uint8_t hdr[4];
    size_t hdr_got;
    uint8_t *msg;
    size_t msg_len, msg_got;
    bool eof, done, ended;
    int code;
    char *message;
};

static void nodecall_free(void *p)
{
    struct nodecall *x = p;
    loop_watch_remove(x->watch);
    if (x->rfd >= 0)
        close(x->rfd);
    if (x->wfd >= 0)
        close(x->wfd);
    free(x->node);
    free(x->method);
    free(x->req);
    free(x->msg);
    free(x->message);
    free(x);
}

static const struct op_ctx_type nodecall_type = {"nodecall", nodecall_free};

static char *hex(const uint8_t *p, size_t n)
{
    char *s = xmalloc(2 * n + 1);
    for (size_t i = 0; i < n; i++)
        snprintf(s + 2 * i, 3, "%02x", p[i]);
    s[2 * n] = '\0';
    return s;
}

static int unhex(const char *s, uint8_t **ret, size_t *ret_len)
{
    size_t n = strlen(s);
    if (n % 2)
        return -EINVAL;
    uint8_t *p = xmalloc(n / 2 + 1);
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) {
            free(p);
            return -EINVAL;
        }
        p[i] = (uint8_t)v;
    }
    *ret = p;
    *ret_len = n / 2;
    return 0;
}

/* In the worker: the node's address, then a connection to it through the
 * dial gate.  GRPC_OK and *ret_gc, or a code and *ret_msg saying why; ip
 * is set once known. */
static enum grpc_code dial_node(const struct plugin_config *cfg, const struct nodecall *x,
                                char ip[INET6_ADDRSTRLEN], struct grpc_client **ret_gc,
                                uint64_t *ret_lookup_us, char **ret_msg)
{
    char *why = NULL;
    uint64_t t0 = now_us();
    uint64_t lookup_by = MIN(x->deadline_us, t0 + LOOKUP_MAX_US);
    int r = kube_node_ip(cfg->node_dial_path, cfg->api_token_file, x->node, lookup_by, ip, &why);
    *ret_lookup_us = now_us() - t0;
    if (r < 0) {
        *ret_msg = xasprintf("cannot find node %s: %s", x->node, why);
        free(why);
        return r == -ENOENT || r == -EINVAL ? GRPC_NOT_FOUND
               : r == -ETIMEDOUT             ? GRPC_DEADLINE_EXCEEDED
                                             : GRPC_UNAVAILABLE;
    }
    _cleanup_free_ char *pre = xasprintf("CONNECT %s\n", ip);
    struct grpc_client_opts o = {.preamble = pre, .preamble_len = strlen(pre)};
    struct grpc_client_status st = {0};
    enum grpc_code code = grpc_client_connect(cfg->node_dial_path, &o, x->deadline_us, ret_gc,
                                              &st);
    if (code != GRPC_OK)
        *ret_msg = xasprintf("node %s (%s): %s", x->node, ip, st.message);
    grpc_client_status_done(&st);
    return code;
}

/* The outcome as the worker's result: always a gRPC status. */
static int outcome(enum grpc_code code, const char *node, const char *ip,
                   struct grpc_client_status *st, char *msg, const char *resp_hex,
                   const uint64_t ms[3], json_t **ret_result)
{
    if (!msg)
        msg = xasprintf("node %s (%s)%s%s", node, ip, *st->message ? ": " : "", st->message);
    *ret_result = json_pack("{s:i, s:s, s:s, s:I, s:I, s:I}", "code", (int)code, "message", msg,
                            "response", resp_hex ? resp_hex : "", "lookup_ms", (json_int_t)ms[0],
                            "dial_ms", (json_int_t)ms[1], "call_ms", (json_int_t)ms[2]);
    free(msg);
    return 0;
}

/* In the worker, per message of the node's stream: into the pipe (a
 * blocking write: the loop's reading paces the node). */
static int to_pipe(const uint8_t *msg, size_t len, void *opaque)
{
    const struct nodecall *x = opaque;
    uint8_t h[4] = {(uint8_t)(len >> 24), (uint8_t)(len >> 16), (uint8_t)(len >> 8),
                    (uint8_t)len};
    return write_all(x->wfd, h, sizeof(h)) < 0 || write_all(x->wfd, msg, len) < 0 ? -1 : 0;
}

/* In the worker: look the node up, dial it, make the call ({code, message,
 * response, and the milliseconds of the three steps: lookup_ms, dial_ms,
 * call_ms}; a stream's messages go into the pipe, its response is ""). */
static int nodecall_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    (void)ret_msg;
    struct op *op = arg;
    struct nodecall *x = op_ctx(op, &nodecall_type);
    char ip[INET6_ADDRSTRLEN] = "?";
    char *msg = NULL;
    struct grpc_client *gc = NULL;
    struct grpc_client_status st = {.message = xstrdup("")};
    uint8_t *resp = NULL;
    size_t rlen = 0;
    _cleanup_free_ char *resp_hex = NULL;
    uint64_t lookup_us = 0, t0 = now_us(), t1, ms[3] = {0};
    if (x->stream)
        close(x->rfd); /* the loop's end */
    enum grpc_code code = dial_node(op->csi->cfg, x, ip, &gc, &lookup_us, &msg);
    t1 = now_us();
    ms[0] = lookup_us / 1000;
    ms[1] = (t1 - t0 - lookup_us) / 1000;
    if (code == GRPC_OK) {
        grpc_client_status_done(&st);
        if (x->stream) {
            code = grpc_client_stream(gc, x->method, x->req, x->len, x->deadline_us, to_pipe,
                                      x, &st);
        } else {
            code = grpc_client_unary(gc, x->method, x->req, x->len, x->deadline_us, &resp,
                                     &rlen, &st);
            if (code == GRPC_OK)
                resp_hex = hex(resp, rlen);
        }
    }
    if (code == GRPC_OK || gc)
        ms[2] = (now_us() - t1) / 1000;
    free(resp);
    grpc_client_free(gc);
    int r = outcome(code, x->node, ip, &st, msg, resp_hex, ms, ret_result);
    grpc_client_status_done(&st);
    return r;
}

static void nodecall_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    struct nodecall *x = op_ctx(op, &nodecall_type);
    op->worker = NULL;
    json_int_t code = json_integer_value(json_object_get(result, "code"));
    const char *m = json_string_value(json_object_get(result, "message"));
    const char *h = json_string_value(json_object_get(result, "response"));
    uint8_t *resp = NULL;
    size_t rlen = 0;
    if (status < 0 || !result || !m || !h) {
        grpc_call_fail(op->call, status == -ETIMEDOUT ? GRPC_DEADLINE_EXCEEDED : GRPC_UNAVAILABLE,
                       "the call to node %s did not finish: %s", x->node,
                       msg ? msg : strerror(status < 0 ? -status : EIO));
    } else if (code != GRPC_OK) {
        log_warn("nodecall", "the node refused or was not reached", "node=%s method=%s code=%d",
                 x->node, x->method, (int)code);
        grpc_call_fail(op->call, (enum grpc_code)code, "%s", m);
    } else if (unhex(h, &resp, &rlen) < 0) {
        grpc_call_fail(op->call, GRPC_INTERNAL, "node %s: a garbled answer", x->node);
    } else {
        /* When the call came (the line's time minus ms) and where its time
         * went: the node's address from the API server, the connection
         * (the dial gate's mutual TLS to the node's gate), the node's call
         * (tests/k8s's modify step prints them). */
        log_info("nodecall", "forwarded", "node=%s method=%s ms=%llu lookup_ms=%lld dial_ms=%lld "
                 "call_ms=%lld", x->node, x->method,
                 (unsigned long long)((now_us() - x->start_us) / 1000),
                 (long long)json_integer_value(json_object_get(result, "lookup_ms")),
                 (long long)json_integer_value(json_object_get(result, "dial_ms")),
                 (long long)json_integer_value(json_object_get(result, "call_ms")));
        grpc_call_reply(op->call, resp, rlen);
    }
    free(resp);
    op_end(op);
}

/* The common start: the deadline checked, the request copied, for a
 * stream the pipe made.  The op, or NULL with the call failed. */
static struct op *nodecall_begin(struct csi *c, struct grpc_call *call, const char *node,
                                 const char *method, const uint8_t *req, size_t len,
                                 bool stream)
{
    uint64_t now = now_us(), deadline = grpc_call_deadline(call);
    if (deadline <= now + MARGIN_US) {
        grpc_call_fail(call, GRPC_DEADLINE_EXCEEDED, "no time left to reach node %s", node);
        return NULL;
    }
    int p[2] = {-1, -1};
    if (stream && (pipe2(p, O_CLOEXEC) < 0 || fcntl(p[0], F_SETFL, O_NONBLOCK) < 0)) {
        int e = errno;
        if (p[0] >= 0) {
            close(p[0]);
            close(p[1]);
        }
        grpc_call_fail(call, GRPC_INTERNAL, "cannot make a pipe: %s", strerror(e));
        return NULL;
    }
    struct op *op = op_begin(c, call);
    struct nodecall *x = op_set_ctx(op, &nodecall_type, xcalloc(1, sizeof(*x)));
    x->rfd = p[0];
    x->wfd = p[1];
    x->stream = stream;
    x->node = xstrdup(node);
    x->method = xstrdup(method);
    x->req = xmalloc(len ? len : 1);
    memcpy(x->req, req, len);
    x->len = len;
    x->deadline_us = deadline - MARGIN_US;
    x->start_us = now;
    x->worker_ms = (deadline - now) / 1000 + 1000;
    return op;
}

void nodecall_forward(struct csi *c, struct grpc_call *call, const char *node,
                      const char *method, const uint8_t *req, size_t len)
{
    struct op *op = nodecall_begin(c, call, node, method, req, len, false);
    if (op) {
        const struct nodecall *x = op_ctx(op, &nodecall_type);
        op_worker(op, nodecall_fn, x->worker_ms, nodecall_done);
    }
}

/* ---- streams ---------------------------------------------------------------- */

static void stream_end(struct op *op, enum grpc_code code, const char *msg)
{
    struct nodecall *x = op_ctx(op, &nodecall_type);
    if (op->worker) {
        worker_cancel(op->worker);
        op->worker = NULL;
    }
    if (!x->ended) {
        x->ended = true;
        grpc_call_end(op->call, code, "%s", msg ? msg : "");
    }
    op_end(op);
}

/* One whole message from the pipe: 1; 0 when it has no more for now (or
 * ended); negative on a read error or a length over RELAY_MSG_MAX. */
static int read_frame(struct nodecall *x)
{
    while (x->hdr_got < sizeof(x->hdr) || x->msg_got < x->msg_len) {
        bool in_hdr = x->hdr_got < sizeof(x->hdr);
        uint8_t *p = in_hdr ? x->hdr + x->hdr_got : x->msg + x->msg_got;
        size_t want = in_hdr ? sizeof(x->hdr) - x->hdr_got : x->msg_len - x->msg_got;
        ssize_t n = read(x->rfd, p, want);
        if (n == 0) {
            x->eof = true;
            return 0;
        }
        if (n < 0)
            return errno == EAGAIN || errno == EINTR ? 0 : -errno;
        if (!in_hdr) {
            x->msg_got += (size_t)n;
            continue;
        }
        x->hdr_got += (size_t)n;
        if (x->hdr_got == sizeof(x->hdr)) {
            x->msg_len = (size_t)x->hdr[0] << 24 | (size_t)x->hdr[1] << 16 |
                         (size_t)x->hdr[2] << 8 | x->hdr[3];
            if (x->msg_len > RELAY_MSG_MAX)
                return -EPROTO;
            x->msg = xmalloc(x->msg_len ? x->msg_len : 1);
            x->msg_got = 0;
        }
    }
    return 1;
}

/* Move messages from the pipe to the caller while it takes them; end the
 * call once the worker is done and the pipe is empty. */
static void pump(struct op *op)
{
    struct nodecall *x = op_ctx(op, &nodecall_type);
    for (;;) {
        if (!grpc_call_writable(op->call)) {
            loop_watch_set_events(x->watch, 0); /* stream_writable goes on */
            return;
        }
        int r = read_frame(x);
        if (r < 0) {
            stream_end(op, GRPC_INTERNAL, "the relay from the worker failed");
            return;
        }
        if (r == 0) {
            if (x->done) {
                stream_end(op, (enum grpc_code)x->code, x->message);
                return;
            }
            /* after EOF, nothing more comes: wait for the worker's end */
            loop_watch_set_events(x->watch, x->eof ? 0 : POLLIN);
            return;
        }
        int e = grpc_call_send(op->call, x->msg, x->msg_len);
        free(x->msg);
        x->msg = NULL;
        x->msg_len = x->msg_got = x->hdr_got = 0;
        if (e < 0) {
            stream_end(op, e == -ECANCELED ? GRPC_CANCELLED : GRPC_RESOURCE_EXHAUSTED,
                       "cannot queue a message of the node's stream");
            return;
        }
    }
}

static void stream_readable(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    (void)l, (void)fd, (void)revents;
    pump(opaque);
}

static void stream_writable(struct grpc_call *call, void *opaque)
{
    (void)call;
    pump(opaque);
}

static void stream_cancelled(struct grpc_call *call, void *opaque)
{
    (void)call;
    stream_end(opaque, GRPC_CANCELLED, "cancelled");
}

static void stream_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    struct nodecall *x = op_ctx(op, &nodecall_type);
    op->worker = NULL;
    const char *m = json_string_value(json_object_get(result, "message"));
    x->done = true;
    if (status < 0 || !m) {
        x->code = status == -ETIMEDOUT ? GRPC_DEADLINE_EXCEEDED : GRPC_UNAVAILABLE;
        x->message = xasprintf("the stream from node %s did not finish: %s", x->node,
                               msg ? msg : strerror(status < 0 ? -status : EIO));
    } else {
        x->code = (int)json_integer_value(json_object_get(result, "code"));
        x->message = xstrdup(m);
        log_at(x->code == GRPC_OK ? LOG_INFO : LOG_WARN, "nodecall", "stream relayed",
               "node=%s method=%s code=%d", x->node, x->method, x->code);
    }
    pump(op);
}

void nodecall_stream(struct csi *c, struct grpc_call *call, const char *node,
                     const char *method, const uint8_t *req, size_t len)
{
    struct op *op = nodecall_begin(c, call, node, method, req, len, true);
    if (!op)
        return;
    struct nodecall *x = op_ctx(op, &nodecall_type);
    /* (on failure op_worker has failed the call and ended op: the pipe is
     * closed with its context) */
    if (op_worker(op, nodecall_fn, x->worker_ms, stream_done) < 0)
        return;
    close(x->wfd); /* the worker's now */
    x->wfd = -1;
    x->watch = loop_watch_fd(c->loop, x->rfd, POLLIN, stream_readable, op);
    grpc_call_on_cancel(call, stream_cancelled, op);
    grpc_call_on_writable(call, stream_writable, op);
}
