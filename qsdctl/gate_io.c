/* SPDX-License-Identifier: Apache-2.0 */
/* gate_io.c: qsd-node-gate's connections (see gate_io.h). */
#include "gate_io.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <openssl/err.h>

#include "gate_tls.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"

#define COMP "gate"
#define BUF_SIZE (64 * 1024) /* per direction, per relayed connection */
#define LOG_BURST 20         /* connection-path lines per second */
#define ACCEPT_BATCH 64      /* accepts per wake-up */
#define PUMP_ROUNDS 64       /* relay rounds per wake-up, then others go */
#define MAX_EVENTS 64

/* epoll tags: the listener, the extra fd, or slot << 1 | (1 for forward). */
#define TAG_LISTEN UINT64_MAX
#define TAG_EXTRA (UINT64_MAX - 1)

struct gbuf {
    uint8_t *data;
    size_t head, len;
};

enum { WANT_IN = 1, WANT_OUT = 2 };

struct gate_conn {
    unsigned slot;
    int tcp, fwd;
    SSL *ssl;
    bool relaying;
    bool tls_eof, fwd_eof, fwd_shut;
    bool again;                  /* stopped at PUMP_ROUNDS with work left */
    uint32_t tcp_ev, fwd_ev;     /* registered interest, 0: not in the set */
    unsigned tls_want, fwd_want; /* what the last round blocked on */
    struct gbuf up, down;        /* client -> forward, forward -> client */
    uint64_t started_ms, last_ms;
    uint64_t to_fwd, from_fwd;
    char peer[64];
};

struct gate_server {
    const struct gate_conf *c;
    SSL_CTX *ctx;
    int lfd, ep;
    struct gate_conn **conns; /* c->max_conns slots */
    unsigned nconns;
    struct gate_stats st;
    uint64_t log_window_ms;
    unsigned log_in_window;
};

/* ---- log ------------------------------------------------------------------ */

static bool log_allowed(struct gate_server *s)
{
    uint64_t now = now_ms();
    if (now - s->log_window_ms >= 1000) {
        s->log_window_ms = now;
        s->log_in_window = 0;
    }
    if (s->log_in_window >= LOG_BURST) {
        s->st.log_suppressed++;
        return false;
    }
    s->log_in_window++;
    return true;
}

#define conn_log(s, level, msg, ...)                                           \
    do {                                                                       \
        if ((level) >= log_min_level && log_allowed(s))                        \
            log_emit(level, COMP, msg, __VA_ARGS__);                           \
    } while (0)

/* ---- epoll interest --------------------------------------------------------- */

static int set_interest(struct gate_server *s, int fd, uint64_t tag, uint32_t *cur, uint32_t want)
{
    if (want == *cur)
        return 0;
    struct epoll_event ev = {.events = want, .data.u64 = tag};
    int op = !*cur ? EPOLL_CTL_ADD : want ? EPOLL_CTL_MOD : EPOLL_CTL_DEL;
    /* An fd without interest leaves the set: a hung-up socket would
     * otherwise be reported (EPOLLHUP) on every wait. */
    if (epoll_ctl(s->ep, op, fd, &ev) < 0)
        return -errno;
    *cur = want;
    return 0;
}

static uint32_t events_of(unsigned want)
{
    return (want & WANT_IN ? EPOLLIN : 0) | (want & WANT_OUT ? EPOLLOUT : 0);
}

/* ---- connections -------------------------------------------------------- */

static void conn_free(struct gate_server *s, struct gate_conn *c)
{
    if (c->ssl)
        SSL_free(c->ssl);
    if (c->tcp >= 0)
        close(c->tcp); /* leaves the epoll set with it */
    if (c->fwd >= 0)
        close(c->fwd);
    free(c->up.data);
    free(c->down.data);
    s->conns[c->slot] = NULL;
    s->nconns--;
    free(c);
}

static void conn_close(struct gate_server *s, struct gate_conn *c, const char *why)
{
    if (c->relaying)
        conn_log(s, LOG_INFO, "closed", "peer=%s reason=\"%s\" to_forward=%llu "
                 "from_forward=%llu ms=%llu", c->peer, why, (unsigned long long)c->to_fwd,
                 (unsigned long long)c->from_fwd,
                 (unsigned long long)(now_ms() - c->started_ms));
    conn_free(s, c);
}

/* The handshake did not complete: logged with OpenSSL's reason. */
static void conn_refuse(struct gate_server *s, struct gate_conn *c, const char *why)
{
    s->st.refused++;
    conn_log(s, LOG_WARN, "refused", "peer=%s reason=\"%s\"", c->peer, why);
    conn_free(s, c);
}

static void on_accept(struct gate_server *s)
{
    for (unsigned i = 0; i < ACCEPT_BATCH; i++) {
        struct sockaddr_storage sa;
        socklen_t sl = sizeof(sa);
        int fd = accept4(s->lfd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                conn_log(s, LOG_WARN, "accept failed", "error=\"%s\"", strerror(errno));
            return;
        }
        char peer[64];
        gate_format_addr((struct sockaddr *)&sa, peer, sizeof(peer));
        if (s->nconns >= s->c->max_conns) {
            close(fd);
            s->st.busy++;
            conn_log(s, LOG_WARN, "refused", "peer=%s reason=max-conns max_conns=%u", peer,
                     s->c->max_conns);
            continue;
        }
        unsigned slot = 0;
        while (s->conns[slot])
            slot++;
        struct gate_conn *c = xcalloc(1, sizeof(*c));
        *c = (struct gate_conn){.slot = slot, .tcp = fd, .fwd = -1, .started_ms = now_ms()};
        c->last_ms = c->started_ms;
        memcpy(c->peer, peer, sizeof(peer));
        s->conns[slot] = c;
        s->nconns++;
        s->st.accepted++;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        c->ssl = SSL_new(s->ctx);
        if (!c->ssl || SSL_set_fd(c->ssl, fd) != 1) {
            ERR_clear_error();
            conn_refuse(s, c, "out of memory for TLS");
            continue;
        }
        int r = set_interest(s, fd, (uint64_t)slot << 1, &c->tcp_ev, EPOLLIN);
        if (r < 0) {
            conn_refuse(s, c, strerror(-r));
            continue;
        }
        conn_log(s, LOG_DEBUG, "accepted", "peer=%s", peer);
    }
}

/* ---- the relay ---------------------------------------------------------------- */

static size_t buf_room(struct gbuf *b)
{
    if (b->len == 0)
        b->head = 0;
    else if (b->head + b->len == BUF_SIZE && b->head > 0) {
        memmove(b->data, b->data + b->head, b->len);
        b->head = 0;
    }
    return BUF_SIZE - b->head - b->len;
}

/* What an SSL call that returned n <= 0 means: 0 blocked (want set),
 * 1 the peer ended (close_notify, or EOF without one), <0 an error. */
static int ssl_result(struct gate_conn *c, int n, bool *fatal)
{
    int e = SSL_get_error(c->ssl, n);
    switch (e) {
    case SSL_ERROR_WANT_READ:
        c->tls_want |= WANT_IN;
        return 0;
    case SSL_ERROR_WANT_WRITE:
        c->tls_want |= WANT_OUT;
        return 0;
    case SSL_ERROR_ZERO_RETURN:
        return 1;
    default:
        *fatal = true;
        ERR_clear_error();
        return e == SSL_ERROR_SYSCALL && errno ? -errno : -ECONNRESET;
    }
}

/* TLS -> up buffer -> forward socket.  >0 progress, 0 none, <0 error. */
static int pump_up(struct gate_conn *c, bool *fatal)
{
    int progress = 0;
    size_t room = buf_room(&c->up);
    if (!c->tls_eof && room) {
        int n = SSL_read(c->ssl, c->up.data + c->up.head + c->up.len, (int)room);
        if (n > 0) {
            c->up.len += (size_t)n;
            progress = 1;
        } else {
            int r = ssl_result(c, n, fatal);
            if (r < 0)
                return r;
            if (r == 1)
                c->tls_eof = true, progress = 1;
        }
    }
    if (c->up.len) {
        ssize_t n = send(c->fwd, c->up.data + c->up.head, c->up.len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            c->up.head += (size_t)n;
            c->up.len -= (size_t)n;
            c->to_fwd += (uint64_t)n;
            progress = 1;
        } else if (errno == EAGAIN || errno == EINTR)
            c->fwd_want |= WANT_OUT;
        else
            return -errno;
    }
    if (c->tls_eof && !c->up.len && !c->fwd_shut) {
        shutdown(c->fwd, SHUT_WR);
        c->fwd_shut = true;
    }
    return progress;
}

/* Forward socket -> down buffer -> TLS. */
static int pump_down(struct gate_conn *c, bool *fatal)
{
    int progress = 0;
    size_t room = buf_room(&c->down);
    if (!c->fwd_eof && room) {
        ssize_t n = recv(c->fwd, c->down.data + c->down.head + c->down.len, room, MSG_DONTWAIT);
        if (n > 0) {
            c->down.len += (size_t)n;
            progress = 1;
        } else if (n == 0)
            c->fwd_eof = true, progress = 1;
        else if (errno == EAGAIN || errno == EINTR)
            c->fwd_want |= WANT_IN;
        else
            return -errno;
    }
    if (c->down.len) {
        int n = SSL_write(c->ssl, c->down.data + c->down.head, (int)c->down.len);
        if (n > 0) {
            c->down.head += (size_t)n;
            c->down.len -= (size_t)n;
            c->from_fwd += (uint64_t)n;
            progress = 1;
        } else {
            int r = ssl_result(c, n, fatal);
            if (r == 1)
                *fatal = true; /* the client's side is closed for writing */
            if (r != 0)
                return r < 0 ? r : -EPIPE;
        }
    }
    return progress;
}

/* Move bytes until nothing moves (or PUMP_ROUNDS), then wait for what
 * blocked.  Closes the connection when it is over. */
static void relay(struct gate_server *s, struct gate_conn *c)
{
    bool fatal = false;
    int r = 0;
    c->again = false;
    for (unsigned round = 0;; round++) {
        if (round == PUMP_ROUNDS) {
            c->again = true;
            break;
        }
        c->tls_want = c->fwd_want = 0;
        int a = pump_up(c, &fatal), b = a < 0 ? 0 : pump_down(c, &fatal);
        if (a < 0 || b < 0) {
            r = a < 0 ? a : b;
            break;
        }
        if (a || b)
            c->last_ms = now_ms();
        if (c->fwd_eof && !c->down.len) {
            /* The forward side is done and everything it said was passed
             * on: close_notify (best effort: non-blocking), then close. */
            SSL_shutdown(c->ssl);
            ERR_clear_error();
            conn_close(s, c, c->tls_eof ? "both ended" : "forward ended");
            return;
        }
        if (!a && !b)
            break;
    }
    if (r < 0) {
        char why[96];
        snprintf(why, sizeof(why), "%s: %s", fatal ? "client" : "forward", strerror(-r));
        conn_close(s, c, why);
        return;
    }
    uint64_t tag = (uint64_t)c->slot << 1;
    if ((r = set_interest(s, c->tcp, tag, &c->tcp_ev, events_of(c->tls_want))) < 0 ||
        (r = set_interest(s, c->fwd, tag | 1, &c->fwd_ev, events_of(c->fwd_want))) < 0)
        conn_close(s, c, strerror(-r));
}

/* The handshake completed: the client is verified.  Connect the forward
 * socket (by name, from the working directory) and start relaying. */
static void start_relay(struct gate_server *s, struct gate_conn *c)
{
    int r = unix_connect(s->c->forward_name, true, &c->fwd);
    if (r < 0) {
        s->st.refused++;
        conn_log(s, LOG_WARN, "forward unavailable", "peer=%s forward=%s error=\"%s\"", c->peer,
                 s->c->forward, strerror(-r));
        conn_free(s, c); /* no close_notify: the client learns by the close */
        return;
    }
    c->up.data = xmalloc(BUF_SIZE);
    c->down.data = xmalloc(BUF_SIZE);
    c->relaying = true;
    c->last_ms = now_ms();
    s->st.relayed++;
    conn_log(s, LOG_INFO, "connected", "peer=%s handshake_ms=%llu", c->peer,
             (unsigned long long)(c->last_ms - c->started_ms));
    relay(s, c);
}

static void handshake(struct gate_server *s, struct gate_conn *c)
{
    ERR_clear_error();
    errno = 0;
    int n = SSL_accept(c->ssl);
    if (n == 1) {
        start_relay(s, c);
        return;
    }
    int e = SSL_get_error(c->ssl, n);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        int r = set_interest(s, c->tcp, (uint64_t)c->slot << 1, &c->tcp_ev,
                             e == SSL_ERROR_WANT_READ ? EPOLLIN : EPOLLOUT);
        if (r < 0)
            conn_refuse(s, c, strerror(-r));
        return;
    }
    char why[160];
    conn_refuse(s, c, gate_tls_failure(c->ssl, e, why, sizeof(why)));
}

/* Handshake and idle deadlines; returns the ms until the next one (-1:
 * none) and whether a connection still has relay work (timeout 0). */
static int sweep(struct gate_server *s)
{
    uint64_t now = now_ms(), next = UINT64_MAX;
    bool again = false;
    for (unsigned i = 0; i < s->c->max_conns; i++) {
        struct gate_conn *c = s->conns[i];
        if (!c)
            continue;
        uint64_t due = c->relaying ? c->last_ms + s->c->idle_ms
                                   : c->started_ms + s->c->handshake_ms;
        if (now >= due) {
            if (c->relaying)
                conn_close(s, c, "idle timeout");
            else
                conn_refuse(s, c, "handshake timeout");
            continue;
        }
        next = MIN(next, due);
        again |= c->again;
    }
    if (again)
        return 0;
    return next == UINT64_MAX ? -1 : (int)MIN(next - now, (uint64_t)INT32_MAX);
}

static void on_conn(struct gate_server *s, uint64_t tag)
{
    struct gate_conn *c = s->conns[tag >> 1];
    if (!c)
        return; /* closed earlier in this batch */
    if (c->relaying)
        relay(s, c);
    else
        handshake(s, c);
}

int gate_server_run(struct gate_server *s, int extra_fd, int (*on_extra)(void *opaque),
                    void *opaque)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = TAG_EXTRA};
    if (epoll_ctl(s->ep, EPOLL_CTL_ADD, extra_fd, &ev) < 0)
        return -errno;
    ev.data.u64 = TAG_LISTEN;
    if (epoll_ctl(s->ep, EPOLL_CTL_ADD, s->lfd, &ev) < 0)
        return -errno;
    for (;;) {
        struct epoll_event evs[MAX_EVENTS];
        int timeout = sweep(s);
        int n = epoll_wait(s->ep, evs, MAX_EVENTS, timeout);
        if (n < 0 && errno != EINTR)
            return -errno;
        for (int i = 0; i < n; i++) {
            uint64_t tag = evs[i].data.u64;
            if (tag == TAG_EXTRA) {
                int r = on_extra(opaque);
                if (r)
                    return r;
            } else if (tag == TAG_LISTEN) {
                on_accept(s);
            } else {
                on_conn(s, tag);
            }
        }
        for (unsigned i = 0; i < s->c->max_conns; i++)
            if (s->conns[i] && s->conns[i]->again)
                relay(s, s->conns[i]);
    }
}

/* ---- the server ------------------------------------------------------------- */

int gate_server_new(const struct gate_conf *c, SSL_CTX *ctx, struct gate_server **ret)
{
    _cleanup_close_ int lfd =
        socket(c->listen.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0)
        return -errno;
    int one = 1;
    if (setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0)
        return -errno;
    if (c->listen.ss_family == AF_INET6 &&
        setsockopt(lfd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)) < 0)
        return -errno;
    if (bind(lfd, (const struct sockaddr *)&c->listen, c->listen_len) < 0 || listen(lfd, 128) < 0)
        return -errno;
    _cleanup_close_ int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0)
        return -errno;
    struct gate_server *s = xcalloc(1, sizeof(*s));
    s->c = c;
    s->ctx = ctx;
    s->conns = xcalloc(c->max_conns, sizeof(*s->conns));
    s->lfd = TAKE_FD(lfd);
    s->ep = TAKE_FD(ep);
    *ret = s;
    return 0;
}

void gate_server_free(struct gate_server *s)
{
    if (!s)
        return;
    for (unsigned i = 0; i < s->c->max_conns; i++)
        if (s->conns[i])
            conn_close(s, s->conns[i], "gate stopping");
    free(s->conns);
    close(s->lfd);
    close(s->ep);
    free(s);
}

const char *gate_server_addr(struct gate_server *s, char *buf, size_t len)
{
    struct sockaddr_storage sa;
    socklen_t sl = sizeof(sa);
    if (getsockname(s->lfd, (struct sockaddr *)&sa, &sl) < 0)
        sa.ss_family = AF_UNSPEC;
    return gate_format_addr((struct sockaddr *)&sa, buf, len);
}

void gate_server_stats(const struct gate_server *s, struct gate_stats *ret)
{
    *ret = s->st;
}
