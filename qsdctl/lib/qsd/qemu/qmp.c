/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/qmp.c: QMP framing, asynchronous client and synchronous wrapper.  See qmp.h. */
#include "qsd/qemu/qmp.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"

#include <stdarg.h>
#include <sys/socket.h>

/* ---------------------------------------------------------------- framing */

enum qmp_msg_kind qmp_classify(json_t *msg)
{
    if (json_object_get(msg, "QMP"))
        return QMP_MSG_GREETING;
    if (json_object_get(msg, "return"))
        return QMP_MSG_RETURN;
    if (json_is_object(json_object_get(msg, "error")))
        return QMP_MSG_ERROR;
    if (json_is_string(json_object_get(msg, "event")))
        return QMP_MSG_EVENT;
    return QMP_MSG_UNKNOWN;
}

int qmp_parser_feed(struct qmp_parser *p, const char *data, size_t len, qmp_msg_fn fn, void *opaque)
{
    if (p->len + len > p->cap) {
        size_t want = p->len + len;
        if (want > QMP_MAX_LINE + 2)
            want = QMP_MAX_LINE + 2;
        if (want > p->cap) {
            p->cap = MAX(want, p->cap * 2 > QMP_MAX_LINE + 2 ? QMP_MAX_LINE + 2 : p->cap * 2);
            p->buf = xrealloc(p->buf, p->cap);
        }
    }
    size_t off = 0;
    while (off < len) {
        size_t room = p->cap - p->len;
        size_t n = MIN(room, len - off);
        memcpy(p->buf + p->len, data + off, n);
        p->len += n;
        off += n;
        /* Deliver every complete line. */
        size_t start = 0;
        for (;;) {
            char *nl = memchr(p->buf + start, '\n', p->len - start);
            if (!nl)
                break;
            size_t linelen = (size_t)(nl - (p->buf + start));
            json_error_t jerr;
            const char *line = p->buf + start;
            /* Skip blank lines (\r\n only). */
            bool blank = true;
            for (size_t i = 0; i < linelen; i++)
                if (line[i] != '\r' && line[i] != ' ')
                    blank = false;
            if (!blank) {
                json_t *msg = json_loadb(line, linelen, JSON_REJECT_DUPLICATES, &jerr);
                if (!msg || !json_is_object(msg)) {
                    json_decref(msg);
                    p->len = 0;
                    return -EBADMSG;
                }
                fn(msg, opaque);
                json_decref(msg);
            }
            start += linelen + 1;
        }
        if (start > 0) {
            memmove(p->buf, p->buf + start, p->len - start);
            p->len -= start;
        }
        if (p->len >= QMP_MAX_LINE) {
            p->len = 0;
            return -EMSGSIZE;
        }
    }
    return 0;
}

void qmp_parser_free(struct qmp_parser *p)
{
    free(p->buf);
    p->buf = NULL;
    p->len = p->cap = 0;
}

char *qmp_format_command(const char *cmd, json_t *args, const char *id)
{
    json_t *o = json_object();
    json_object_set_new(o, "execute", json_string(cmd));
    if (args)
        json_object_set(o, "arguments", args);
    if (id)
        json_object_set_new(o, "id", json_string(id));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s)
        abort();
    size_t n = strlen(s);
    char *line = xmalloc(n + 2);
    memcpy(line, s, n);
    line[n] = '\n';
    line[n + 1] = '\0';
    free(s);
    return line;
}

/* ----------------------------------------------------------------- errors */

void qmp_error_clear(struct qmp_error *e)
{
    if (!e)
        return;
    free(e->klass);
    free(e->desc);
    e->klass = e->desc = NULL;
}

void qmp_error_set(struct qmp_error *e, const char *klass, const char *fmt, ...)
{
    if (!e)
        return;
    qmp_error_clear(e);
    e->klass = xstrdup(klass);
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&e->desc, fmt, ap) < 0)
        e->desc = NULL;
    va_end(ap);
    if (!e->desc)
        e->desc = xstrdup("(no description)");
}

static void qmp_error_copy(struct qmp_error *dst, const struct qmp_error *src)
{
    if (!dst)
        return;
    qmp_error_clear(dst);
    dst->klass = xstrdup(src && src->klass ? src->klass : "Error");
    dst->desc = xstrdup(src && src->desc ? src->desc : "unknown error");
}

/* ------------------------------------------------------------ async client */

enum qmp_state { QMP_CONNECTING, QMP_GREETING, QMP_NEGOTIATING, QMP_READY, QMP_CLOSED };

struct qmp_pending {
    struct qmp *q;
    char id[24];
    char *cmd;
    qmp_reply_cb cb;
    void *opaque;
    void (*release)(void *opaque); /* when dropped unanswered */
    struct loop_timer *timer;
    struct qmp_pending *next;
};

struct qmp {
    struct loop *loop;
    int fd;
    struct loop_watch *watch;
    enum qmp_state state;
    struct qmp_parser parser;
    char *out;
    size_t out_len, out_off;
    uint64_t next_id;
    struct qmp_pending *pending;
    struct loop_timer *connect_timer;
    qmp_state_cb state_cb;
    void *state_opaque;
    qmp_event_cb event_cb;
    void *event_opaque;
    bool in_dispatch, free_after; /* closed from inside a callback */
};

static void qmp_fail(struct qmp *q, int status, const char *klass, const char *desc);

static void update_watch(struct qmp *q)
{
    if (q->watch)
        loop_watch_set_events(q->watch, POLLIN | (q->out_len > q->out_off ? POLLOUT : 0));
}

static void queue_out(struct qmp *q, const char *line)
{
    size_t n = strlen(line);
    if (q->out_off == q->out_len)
        q->out_off = q->out_len = 0;
    q->out = xrealloc(q->out, q->out_len + n);
    memcpy(q->out + q->out_len, line, n);
    q->out_len += n;
    update_watch(q);
}

static struct qmp_pending *take_pending(struct qmp *q, const char *id)
{
    for (struct qmp_pending **pp = &q->pending; *pp; pp = &(*pp)->next)
        if (streq((*pp)->id, id)) {
            struct qmp_pending *p = *pp;
            *pp = p->next;
            return p;
        }
    return NULL;
}

static void pending_free(struct qmp_pending *p)
{
    loop_timer_cancel(p->timer);
    free(p->cmd);
    free(p);
}

static void complete(struct qmp *q, struct qmp_pending *p, int status, json_t *ret,
                     const struct qmp_error *err)
{
    struct qmp_reply r = {.status = status, .ret = ret, .err = err};
    qmp_reply_cb cb = p->cb;
    void *opaque = p->opaque;
    pending_free(p);
    if (cb)
        cb(q, &r, opaque);
}

static void on_command_timeout(struct loop *l, void *opaque)
{
    struct qmp_pending *p = opaque;
    struct qmp *q = p->q;
    p->timer = NULL;
    take_pending(q, p->id);
    struct qmp_error e = {0};
    qmp_error_set(&e, "Timeout", "no reply to '%s' within the time limit", p->cmd);
    complete(q, p, -ETIMEDOUT, NULL, &e);
    qmp_error_clear(&e);
}

static int send_internal(struct qmp *q, const char *cmd, json_t *args, uint64_t timeout_ms,
                         qmp_reply_cb cb, void *opaque, void (*release)(void *))
{
    struct qmp_pending *p = xcalloc(1, sizeof(*p));
    p->q = q;
    p->release = release;
    snprintf(p->id, sizeof(p->id), "qsd-%llu", (unsigned long long)++q->next_id);
    p->cmd = xstrdup(cmd);
    p->cb = cb;
    p->opaque = opaque;
    p->timer = loop_timer_add(q->loop, timeout_ms, on_command_timeout, p);
    _cleanup_free_ char *line = qmp_format_command(cmd, args, p->id);
    json_decref(args);
    log_debug("qmp", "send", "id=%s cmd=%s", p->id, cmd);
    /* Append to the end so that replies complete in order for equal deadlines. */
    struct qmp_pending **pp = &q->pending;
    while (*pp)
        pp = &(*pp)->next;
    *pp = p;
    queue_out(q, line);
    return 0;
}

int qmp_send_owned(struct qmp *q, const char *cmd, json_t *args, uint64_t timeout_ms,
                   qmp_reply_cb cb, void *opaque, void (*release)(void *opaque))
{
    if (q->state != QMP_READY) {
        json_decref(args);
        return -ENOTCONN;
    }
    return send_internal(q, cmd, args, timeout_ms, cb, opaque, release);
}

int qmp_send(struct qmp *q, const char *cmd, json_t *args, uint64_t timeout_ms, qmp_reply_cb cb,
             void *opaque)
{
    return qmp_send_owned(q, cmd, args, timeout_ms, cb, opaque, NULL);
}

bool qmp_ready(struct qmp *q) { return q && q->state == QMP_READY; }

void qmp_set_event_handler(struct qmp *q, qmp_event_cb cb, void *opaque)
{
    q->event_cb = cb;
    q->event_opaque = opaque;
}

static void on_capabilities(struct qmp *q, const struct qmp_reply *r, void *opaque)
{
    if (r->status < 0) {
        qmp_fail(q, r->status, r->err->klass, r->err->desc);
        return;
    }
    loop_timer_cancel(q->connect_timer);
    q->connect_timer = NULL;
    q->state = QMP_READY;
    if (q->state_cb)
        q->state_cb(q, 0, NULL, q->state_opaque);
}

static void on_message(json_t *msg, void *opaque)
{
    struct qmp *q = opaque;
    if (q->state == QMP_CLOSED)
        return;
    switch (qmp_classify(msg)) {
    case QMP_MSG_GREETING:
        if (q->state != QMP_GREETING)
            return;
        q->state = QMP_NEGOTIATING;
        send_internal(q, "qmp_capabilities", NULL, QMP_DEFAULT_TIMEOUT_MS, on_capabilities, NULL,
                      NULL);
        return;
    case QMP_MSG_RETURN:
    case QMP_MSG_ERROR: {
        json_t *id = json_object_get(msg, "id");
        struct qmp_pending *p = json_is_string(id) ? take_pending(q, json_string_value(id)) : NULL;
        if (!p) {
            log_debug("qmp", "unmatched reply", "id=%s", json_is_string(id) ? json_string_value(id) : "-");
            return;
        }
        if (qmp_classify(msg) == QMP_MSG_RETURN) {
            log_debug("qmp", "reply", "id=%s cmd=%s", p->id, p->cmd);
            complete(q, p, 0, json_object_get(msg, "return"), NULL);
        } else {
            json_t *e = json_object_get(msg, "error");
            const char *klass = json_string_value(json_object_get(e, "class"));
            const char *desc = json_string_value(json_object_get(e, "desc"));
            struct qmp_error err = {.klass = (char *)(klass ? klass : "GenericError"),
                                    .desc = (char *)(desc ? desc : "(no description)")};
            log_debug("qmp", "error reply", "id=%s cmd=%s class=%s", p->id, p->cmd, err.klass);
            complete(q, p, -EREMOTEIO, NULL, &err);
        }
        return;
    }
    case QMP_MSG_EVENT:
        if (q->event_cb)
            q->event_cb(q, json_string_value(json_object_get(msg, "event")),
                        json_object_get(msg, "data"), q->event_opaque);
        return;
    case QMP_MSG_UNKNOWN:
        log_debug("qmp", "unknown message", "%s", "");
        return;
    }
}

static void qmp_teardown(struct qmp *q)
{
    loop_watch_remove(q->watch);
    q->watch = NULL;
    if (q->fd >= 0)
        close(q->fd);
    q->fd = -1;
    loop_timer_cancel(q->connect_timer);
    q->connect_timer = NULL;
}

/* The connection is unusable: fail everything that waits on it. */
static void qmp_fail(struct qmp *q, int status, const char *klass, const char *desc)
{
    if (q->state == QMP_CLOSED)
        return;
    q->state = QMP_CLOSED;
    qmp_teardown(q);
    struct qmp_error e = {.klass = (char *)klass, .desc = (char *)desc};
    bool outer = q->in_dispatch;
    q->in_dispatch = true;
    while (q->pending && !q->free_after) {
        struct qmp_pending *p = q->pending;
        q->pending = p->next;
        if (p->cb == on_capabilities) {
            pending_free(p);
            continue;
        }
        complete(q, p, status == -ETIMEDOUT ? -ETIMEDOUT : -ECONNRESET, NULL, &e);
    }
    if (q->state_cb && !q->free_after)
        q->state_cb(q, status, &e, q->state_opaque);
    q->in_dispatch = outer;
    if (!outer && q->free_after) {
        q->free_after = false;
        qmp_close(q);
    }
}

static void on_io(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    struct qmp *q = opaque;
    q->in_dispatch = true;
    if (revents & POLLOUT && q->out_len > q->out_off) {
        ssize_t n = send(q->fd, q->out + q->out_off, q->out_len - q->out_off, MSG_NOSIGNAL);
        if (n > 0)
            q->out_off += (size_t)n;
        else if (n < 0 && errno != EAGAIN && errno != EINTR) {
            char desc[128];
            snprintf(desc, sizeof(desc), "write to QMP socket failed: %s", strerror(errno));
            qmp_fail(q, -ECONNRESET, "Disconnected", desc);
            goto out;
        }
        update_watch(q);
    }
    if (revents & (POLLIN | POLLHUP | POLLERR)) {
        char buf[65536];
        for (;;) {
            ssize_t n = recv(q->fd, buf, sizeof(buf), 0);
            if (n < 0 && (errno == EAGAIN || errno == EINTR))
                break;
            if (n <= 0) {
                qmp_fail(q, -ECONNRESET, "Disconnected",
                         n == 0 ? "QMP connection closed by QEMU" : "QMP connection broken");
                goto out;
            }
            int r = qmp_parser_feed(&q->parser, buf, (size_t)n, on_message, q);
            if (q->free_after || q->state == QMP_CLOSED)
                goto out;
            if (r < 0) {
                qmp_fail(q, -EPROTO, "ProtocolError",
                         r == -EMSGSIZE ? "QMP message too long" : "QMP message is not a JSON object");
                goto out;
            }
            if ((size_t)n < sizeof(buf))
                break;
        }
    }
out:
    q->in_dispatch = false;
    if (q->free_after) {
        q->free_after = false;
        qmp_close(q);
    }
}

static void on_connect_timeout(struct loop *l, void *opaque)
{
    struct qmp *q = opaque;
    q->connect_timer = NULL;
    qmp_fail(q, -ETIMEDOUT, "Timeout", "QMP greeting and negotiation did not complete in time");
}

int qmp_connect(struct loop *l, const char *path, uint64_t timeout_ms, qmp_state_cb state_cb,
                void *opaque, struct qmp **ret)
{
    int fd;
    int r = unix_connect(path, true, &fd);
    if (r < 0)
        return r;
    struct qmp *q = xcalloc(1, sizeof(*q));
    q->loop = l;
    q->fd = fd;
    q->state = QMP_GREETING;
    q->state_cb = state_cb;
    q->state_opaque = opaque;
    q->watch = loop_watch_fd(l, fd, POLLIN, on_io, q);
    q->connect_timer = loop_timer_add(l, timeout_ms, on_connect_timeout, q);
    *ret = q;
    return 0;
}

void qmp_close(struct qmp *q)
{
    if (!q)
        return;
    if (q->in_dispatch) {
        /* Defer: we are inside one of q's callbacks. */
        q->free_after = true;
        q->state = QMP_CLOSED;
        qmp_teardown(q);
        return;
    }
    qmp_teardown(q);
    while (q->pending) {
        struct qmp_pending *p = q->pending;
        q->pending = p->next;
        if (p->release)
            p->release(p->opaque);
        pending_free(p);
    }
    qmp_parser_free(&q->parser);
    free(q->out);
    free(q);
}

/* -------------------------------------------------------------- sync API */

#define SYNC_MAX_EVENTS 256

struct qmp_sync {
    struct loop *loop;
    struct qmp *qmp;
    int state;   /* 1 pending, 0 ready, < 0 failed */
    struct qmp_error state_err;
    json_t *events; /* array of received events {event, data} */
};

int qmp_sync_peer(struct qmp_sync *s, uid_t *ret_uid, gid_t *ret_gid)
{
    struct ucred cr;
    socklen_t len = sizeof(cr);
    if (!s->qmp || s->qmp->fd < 0)
        return -ENOTCONN;
    if (getsockopt(s->qmp->fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
        return -errno;
    *ret_uid = cr.uid;
    *ret_gid = cr.gid;
    return 0;
}

static void sync_state(struct qmp *q, int status, const struct qmp_error *err, void *opaque)
{
    struct qmp_sync *s = opaque;
    s->state = status;
    if (status < 0)
        qmp_error_copy(&s->state_err, err);
}

static void sync_event(struct qmp *q, const char *event, json_t *data, void *opaque)
{
    struct qmp_sync *s = opaque;
    if (json_array_size(s->events) >= SYNC_MAX_EVENTS)
        json_array_remove(s->events, 0);
    json_t *e = json_pack("{s:s, s:O?}", "event", event, "data", data);
    json_array_append_new(s->events, e);
}

int qmp_sync_connect(const char *path, uint64_t timeout_ms, struct qmp_sync **ret,
                     struct qmp_error *err)
{
    struct qmp_sync *s = xcalloc(1, sizeof(*s));
    s->events = json_array();
    int r = loop_new(&s->loop);
    if (r < 0) {
        qmp_error_set(err, "Internal", "cannot create event loop: %s", strerror(-r));
        json_decref(s->events);
        free(s);
        return r;
    }
    s->state = 1;
    r = qmp_connect(s->loop, path, timeout_ms, sync_state, s, &s->qmp);
    if (r < 0) {
        qmp_error_set(err, "Disconnected", "cannot connect to QMP socket %s: %s", path, strerror(-r));
        qmp_sync_close(s);
        return r;
    }
    qmp_set_event_handler(s->qmp, sync_event, s);
    while (s->state == 1) {
        r = loop_run_once(s->loop, -1);
        if (r < 0)
            break;
    }
    if (s->state != 0) {
        r = s->state < 0 ? s->state : r;
        qmp_error_copy(err, &s->state_err);
        qmp_sync_close(s);
        return r < 0 ? r : -EIO;
    }
    *ret = s;
    return 0;
}

struct sync_call {
    bool done;
    int status;
    json_t *ret;
    struct qmp_error err;
};

static void sync_reply(struct qmp *q, const struct qmp_reply *r, void *opaque)
{
    struct sync_call *c = opaque;
    c->done = true;
    c->status = r->status;
    if (r->status == 0)
        c->ret = json_incref(r->ret);
    else
        qmp_error_copy(&c->err, r->err);
}

int qmp_sync_call(struct qmp_sync *s, const char *cmd, json_t *args, uint64_t timeout_ms,
                  json_t **ret_return, struct qmp_error *err)
{
    struct sync_call c = {0};
    if (!s->qmp) {
        json_decref(args);
        qmp_error_set(err, "Disconnected", "QMP connection is closed");
        return -ENOTCONN;
    }
    int r = qmp_send(s->qmp, cmd, args, timeout_ms, sync_reply, &c);
    if (r < 0) {
        qmp_error_set(err, "Disconnected", "QMP connection is not usable: %s", s->state_err.desc ? s->state_err.desc : strerror(-r));
        return r;
    }
    while (!c.done) {
        r = loop_run_once(s->loop, -1);
        if (r < 0) {
            /* The loop itself failed: drop the pending command. */
            qmp_close(s->qmp);
            s->qmp = NULL;
            qmp_error_set(err, "Internal", "event loop failed: %s", strerror(-r));
            return r;
        }
    }
    if (c.status < 0) {
        if (err) {
            qmp_error_clear(err);
            *err = c.err;
        } else {
            qmp_error_clear(&c.err);
        }
        return c.status;
    }
    if (ret_return)
        *ret_return = c.ret;
    else
        json_decref(c.ret);
    return 0;
}

struct qmp *qmp_sync_client(struct qmp_sync *s) { return s ? s->qmp : NULL; }

int qmp_sync_run(struct qmp_sync *s, const bool *done)
{
    while (!*done) {
        int r = loop_run_once(s->loop, -1);
        if (r < 0) {
            /* The loop itself failed: drop what is pending. */
            qmp_close(s->qmp);
            s->qmp = NULL;
            return r;
        }
    }
    return 0;
}

static void sync_timeout(struct loop *l, void *opaque) { *(bool *)opaque = true; }

int qmp_sync_wait_event(struct qmp_sync *s, const char *event,
                        bool (*match)(json_t *data, void *opaque), void *opaque,
                        uint64_t timeout_ms, json_t **ret_data, struct qmp_error *err)
{
    bool expired = false;
    struct loop_timer *t = loop_timer_add(s->loop, timeout_ms, sync_timeout, &expired);
    size_t seen = 0;
    for (;;) {
        for (; seen < json_array_size(s->events); seen++) {
            json_t *e = json_array_get(s->events, seen);
            json_t *data = json_object_get(e, "data");
            if (streq(json_string_value(json_object_get(e, "event")), event) &&
                (!match || match(data, opaque))) {
                if (ret_data)
                    *ret_data = json_incref(data);
                json_array_remove(s->events, seen);
                loop_timer_cancel(t);
                return 0;
            }
        }
        if (expired) {
            qmp_error_set(err, "Timeout", "event %s did not arrive in time", event);
            return -ETIMEDOUT;
        }
        if (s->state < 0) {
            loop_timer_cancel(t);
            qmp_error_copy(err, &s->state_err);
            return -ECONNRESET;
        }
        int r = loop_run_once(s->loop, -1);
        if (r < 0) {
            loop_timer_cancel(t);
            qmp_error_set(err, "Internal", "event loop failed: %s", strerror(-r));
            return r;
        }
        /* The events array may have shrunk (oldest dropped). */
        if (seen > json_array_size(s->events))
            seen = 0;
    }
}

void qmp_sync_close(struct qmp_sync *s)
{
    if (!s)
        return;
    qmp_close(s->qmp);
    loop_free(s->loop);
    qmp_error_clear(&s->state_err);
    json_decref(s->events);
    free(s);
}
