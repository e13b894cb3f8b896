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
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <openssl/err.h>

#include "gate_preamble.h"
#include "gate_relay.h"
#include "gate_tls.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"

#define COMP "gate"
#define LOG_BURST 20    /* connection-path lines per second */
#define ACCEPT_BATCH 64 /* accepts per wake-up */
#define MAX_EVENTS 64

/* epoll tags: the listener, the extra fd, or slot << 1 | (1: the server
 * side's socket, 0: the client side's). */
#define TAG_LISTEN UINT64_MAX
#define TAG_EXTRA (UINT64_MAX - 1)

enum conn_state {
    ST_HANDSHAKE, /* serve: SSL_accept */
    ST_PREAMBLE,  /* dial: reading CONNECT <ip> */
    ST_CONNECTING, /* dial: the TCP connect */
    ST_DIALING,   /* dial: SSL_connect */
    ST_RELAYING,
};

struct gate_conn {
    unsigned slot;
    enum conn_state state;
    struct gate_relay rl;     /* its sides own the sockets */
    struct gate_side *tls;    /* the side with the TLS session */
    uint32_t ev[2];           /* registered interest (client, server side) */
    uint64_t started_ms, deadline_ms, last_ms;
    bool api;                 /* dial: to the API server (`API`) */
    size_t pre_len;
    char pre[GATE_PREAMBLE_MAX];
    char peer[64];            /* serve: the client's address; dial: the
                               * client's pid, then the destination */
};

struct gate_server {
    const struct gate_conf *c;
    SSL_CTX *ctx;
    SSL_CTX *api_ctx;         /* dial with --api-host, else NULL */
    int lfd, ep;
    struct gate_conn **conns; /* c->max_conns slots */
    unsigned nconns;
    struct gate_stats st;
    struct log_budget logb;   /* the connection path's lines */
};

/* ---- log ------------------------------------------------------------------ */

#define conn_log(s, level, msg, ...) log_limited(&(s)->logb, level, COMP, msg, __VA_ARGS__)

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
    return (want & GATE_WANT_IN ? EPOLLIN : 0) | (want & GATE_WANT_OUT ? EPOLLOUT : 0);
}

/* The interest of one side of c (server: the side dialled or forwarded to). */
static int watch(struct gate_server *s, struct gate_conn *c, bool server, uint32_t events)
{
    struct gate_side *side = server ? &c->rl.server : &c->rl.client;
    return set_interest(s, side->fd, (uint64_t)c->slot << 1 | server, &c->ev[server], events);
}

/* ---- connections -------------------------------------------------------- */

static void conn_free(struct gate_server *s, struct gate_conn *c)
{
    if (c->tls && c->tls->ssl)
        SSL_free(c->tls->ssl);
    if (c->rl.client.fd >= 0)
        close(c->rl.client.fd); /* leaves the epoll set with it */
    if (c->rl.server.fd >= 0)
        close(c->rl.server.fd);
    gate_relay_release(&c->rl);
    s->conns[c->slot] = NULL;
    s->nconns--;
    free(c);
}

/* The names of the sides, in logs. */
static const char *server_name(const struct gate_server *s)
{
    return s->c->dial ? "server" : "forward";
}

static void conn_close(struct gate_server *s, struct gate_conn *c, const char *why)
{
    if (c->state == ST_RELAYING)
        conn_log(s, LOG_INFO, "closed", "peer=%s reason=\"%s\" to_%s=%llu from_%s=%llu "
                 "ms=%llu", c->peer, why, server_name(s), (unsigned long long)c->rl.up_bytes,
                 server_name(s), (unsigned long long)c->rl.down_bytes,
                 (unsigned long long)(now_ms() - c->started_ms));
    conn_free(s, c);
}

/* The connection did not get to the relay: logged with the reason. */
static void conn_refuse(struct gate_server *s, struct gate_conn *c, const char *why)
{
    s->st.refused++;
    conn_log(s, LOG_WARN, "refused", "peer=%s reason=\"%s\"", c->peer, why);
    conn_free(s, c);
}

/* Dial mode: the unix client is told why (one line, best effort: it may
 * be gone), then refused. */
static void conn_err(struct gate_server *s, struct gate_conn *c, const char *why)
{
    char line[192];
    int n = snprintf(line, sizeof(line), "ERR %s\n", why);
    if (n > 0 && (size_t)n < sizeof(line))
        send(c->rl.client.fd, line, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL);
    conn_refuse(s, c, why);
}

static struct gate_conn *conn_new(struct gate_server *s, int fd, const char *peer)
{
    unsigned slot = 0;
    while (s->conns[slot])
        slot++;
    struct gate_conn *c = xcalloc(1, sizeof(*c));
    *c = (struct gate_conn){.slot = slot, .started_ms = now_ms()};
    c->rl.client.fd = fd;
    c->rl.server.fd = -1;
    c->last_ms = c->started_ms;
    c->deadline_ms = c->started_ms + s->c->handshake_ms;
    snprintf(c->peer, sizeof(c->peer), "%s", peer);
    s->conns[slot] = c;
    s->nconns++;
    s->st.accepted++;
    return c;
}

/* serve: a TLS session on the accepted socket; dial: read the preamble. */
static void conn_begin(struct gate_server *s, struct gate_conn *c)
{
    if (!s->c->dial) {
        int one = 1;
        setsockopt(c->rl.client.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        c->tls = &c->rl.client;
        c->tls->ssl = SSL_new(s->ctx);
        if (!c->tls->ssl || SSL_set_fd(c->tls->ssl, c->tls->fd) != 1) {
            ERR_clear_error();
            conn_refuse(s, c, "out of memory for TLS");
            return;
        }
    }
    c->state = s->c->dial ? ST_PREAMBLE : ST_HANDSHAKE;
    int r = watch(s, c, false, EPOLLIN);
    if (r < 0)
        conn_refuse(s, c, strerror(-r));
}

/* Who is at the other end: the address, or a unix client's pid. */
static void peer_of(int fd, const struct sockaddr_storage *sa, char *buf, size_t len)
{
    struct ucred uc;
    socklen_t ul = sizeof(uc);
    if (sa->ss_family != AF_UNIX)
        gate_format_addr((const struct sockaddr *)sa, buf, len);
    else if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &ul) == 0)
        snprintf(buf, len, "pid:%d", (int)uc.pid);
    else
        snprintf(buf, len, "unix");
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
        peer_of(fd, &sa, peer, sizeof(peer));
        if (s->nconns >= s->c->max_conns) {
            if (s->c->dial)
                send(fd, "ERR max-conns\n", 14, MSG_DONTWAIT | MSG_NOSIGNAL);
            close(fd);
            s->st.busy++;
            conn_log(s, LOG_WARN, "refused", "peer=%s reason=max-conns max_conns=%u", peer,
                     s->c->max_conns);
            continue;
        }
        conn_begin(s, conn_new(s, fd, peer));
        conn_log(s, LOG_DEBUG, "accepted", "peer=%s", peer);
    }
}

/* ---- the relay ---------------------------------------------------------------- */

/* Move bytes until nothing moves (or the relay's bound of rounds), then
 * wait for what blocked.  Closes the connection when it is over. */
static void relay(struct gate_server *s, struct gate_conn *c)
{
    struct gate_side *failed = NULL;
    bool moved;
    int r = gate_relay_step(&c->rl, &failed, &moved);
    if (moved)
        c->last_ms = now_ms();
    if (r == 1) {
        /* The server side is done and everything it said was passed on:
         * end the client's side (best effort: non-blocking), then close. */
        gate_side_end(&c->rl.client);
        char why[32];
        snprintf(why, sizeof(why), "%s ended", c->rl.client.eof ? "both" : server_name(s));
        conn_close(s, c, why);
        return;
    }
    if (r < 0) {
        char why[96];
        snprintf(why, sizeof(why), "%s: %s",
                 failed == &c->rl.client ? "client" : server_name(s), strerror(-r));
        conn_close(s, c, why);
        return;
    }
    if ((r = watch(s, c, false, events_of(c->rl.client.want))) < 0 ||
        (r = watch(s, c, true, events_of(c->rl.server.want))) < 0)
        conn_close(s, c, strerror(-r));
}

static void start_relay(struct gate_server *s, struct gate_conn *c)
{
    gate_relay_start(&c->rl);
    c->state = ST_RELAYING;
    c->last_ms = now_ms();
    s->st.relayed++;
    conn_log(s, LOG_INFO, "connected", "peer=%s handshake_ms=%llu", c->peer,
             (unsigned long long)(c->last_ms - c->started_ms));
    relay(s, c);
}

/* ---- serve mode: accept TLS, then the forward socket ----------------------------- */

/* The handshake completed: the client is verified.  Connect the forward
 * socket (by name, from the working directory) and start relaying. */
static void serve_verified(struct gate_server *s, struct gate_conn *c)
{
    int r = unix_connect(s->c->sock_name, true, &c->rl.server.fd);
    if (r < 0) {
        s->st.refused++;
        conn_log(s, LOG_WARN, "forward unavailable", "peer=%s forward=%s error=\"%s\"", c->peer,
                 s->c->forward, strerror(-r));
        conn_free(s, c); /* no close_notify: the client learns by the close */
        return;
    }
    start_relay(s, c);
}

/* SSL_accept or SSL_connect, n its result: 1 done, 0 waiting, -1 failed
 * (why filled). */
static int handshake_result(struct gate_server *s, struct gate_conn *c, int n, char *why,
                            size_t len)
{
    if (n == 1)
        return 1;
    int e = SSL_get_error(c->tls->ssl, n);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        int r = watch(s, c, c->tls == &c->rl.server,
                      e == SSL_ERROR_WANT_READ ? EPOLLIN : EPOLLOUT);
        if (r == 0)
            return 0;
        snprintf(why, len, "%s", strerror(-r));
        return -1;
    }
    gate_tls_failure(c->tls->ssl, e, why, len);
    return -1;
}

static void serve_handshake(struct gate_server *s, struct gate_conn *c)
{
    char why[160];
    ERR_clear_error();
    errno = 0;
    int r = handshake_result(s, c, SSL_accept(c->tls->ssl), why, sizeof(why));
    if (r == 1)
        serve_verified(s, c);
    else if (r < 0)
        conn_refuse(s, c, why);
}

/* ---- dial mode: the preamble, the connect, TLS, then OK ------------------------- */

static void dial_handshake(struct gate_server *s, struct gate_conn *c);

/* The server is verified.  A client that sent bytes before OK (or left)
 * is refused; else OK, and the relay. */
static void dial_verified(struct gate_server *s, struct gate_conn *c)
{
    char b;
    ssize_t n = recv(c->rl.client.fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) {
        conn_err(s, c, "bytes before OK");
        return;
    }
    if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        conn_refuse(s, c, "client left before OK");
        return;
    }
    /* Three bytes into an empty socket buffer: they fit, or the client is gone. */
    if (send(c->rl.client.fd, "OK\n", 3, MSG_DONTWAIT | MSG_NOSIGNAL) != 3) {
        conn_refuse(s, c, "client: cannot send OK");
        return;
    }
    start_relay(s, c);
}

/* The TCP connection is up: start TLS as the client. */
static void dial_tls(struct gate_server *s, struct gate_conn *c)
{
    int one = 1;
    setsockopt(c->rl.server.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->tls = &c->rl.server;
    c->tls->ssl = SSL_new(c->api ? s->api_ctx : s->ctx);
    if (!c->tls->ssl || SSL_set_fd(c->tls->ssl, c->tls->fd) != 1 ||
        SSL_set_tlsext_host_name(c->tls->ssl, (c->api ? s->c->api_name : s->c->peer_name)) != 1) {
        ERR_clear_error();
        conn_err(s, c, "out of memory for TLS");
        return;
    }
    SSL_set_connect_state(c->tls->ssl);
    c->state = ST_DIALING;
    dial_handshake(s, c);
}

static void dial_handshake(struct gate_server *s, struct gate_conn *c)
{
    char why[160];
    ERR_clear_error();
    errno = 0;
    int r = handshake_result(s, c, SSL_connect(c->tls->ssl), why + 5, sizeof(why) - 5);
    if (r == 1) {
        dial_verified(s, c);
    } else if (r < 0) {
        memcpy(why, "tls: ", 5);
        conn_err(s, c, why);
    }
}

static void dial_connected(struct gate_server *s, struct gate_conn *c)
{
    int e = 0;
    socklen_t el = sizeof(e);
    if (getsockopt(c->rl.server.fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
        e = errno;
    if (e) {
        char why[96];
        snprintf(why, sizeof(why), "connect: %s", strerror(e));
        conn_err(s, c, why);
        return;
    }
    dial_tls(s, c);
}

/* A good preamble: connect (non-blocking) to the destination.  The client
 * side is not watched until the relay. */
static void dial_connect(struct gate_server *s, struct gate_conn *c,
                         const struct sockaddr_storage *to, socklen_t tl)
{
    char why[96];
    int r = watch(s, c, false, 0);
    gate_format_addr((const struct sockaddr *)to, c->peer, sizeof(c->peer));
    c->rl.server.fd = socket(to->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (r < 0 || c->rl.server.fd < 0) {
        snprintf(why, sizeof(why), "connect: %s", strerror(r < 0 ? -r : errno));
        conn_err(s, c, why);
        return;
    }
    c->state = ST_CONNECTING;
    c->deadline_ms = now_ms() + s->c->handshake_ms;
    if (connect(c->rl.server.fd, (const struct sockaddr *)to, tl) == 0) {
        dial_tls(s, c);
        return;
    }
    if (errno != EINPROGRESS) {
        snprintf(why, sizeof(why), "connect: %s", strerror(errno));
        conn_err(s, c, why);
        return;
    }
    if ((r = watch(s, c, true, EPOLLOUT)) < 0)
        conn_err(s, c, strerror(-r));
}

static void dial_preamble(struct gate_server *s, struct gate_conn *c)
{
    size_t room = sizeof(c->pre) - c->pre_len;
    ssize_t n = recv(c->rl.client.fd, c->pre + c->pre_len, room, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0) {
        conn_err(s, c, n == 0 ? "preamble not terminated" : strerror(errno));
        return;
    }
    c->pre_len += (size_t)n;
    struct sockaddr_storage to;
    socklen_t tl;
    const char *why;
    int r = gate_preamble_parse(c->pre, c->pre_len, s->c->port, &to, &tl, &why);
    if (r < 0) {
        conn_err(s, c, why);
    } else if (r == GATE_PREAMBLE_CONNECT) {
        dial_connect(s, c, &to, tl);
    } else if (r == GATE_PREAMBLE_API) {
        if (!s->api_ctx) {
            conn_err(s, c, "no API server route (--api-host)");
            return;
        }
        c->api = true;
        dial_connect(s, c, &s->c->api, s->c->api_len);
    }
}

/* ---- the loop ----------------------------------------------------------------- */

static const char *timeout_reason(enum conn_state st)
{
    switch (st) {
    case ST_PREAMBLE: return "preamble timeout";
    case ST_CONNECTING: return "connect timeout";
    default: return "handshake timeout";
    }
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
        bool relaying = c->state == ST_RELAYING;
        uint64_t due = relaying ? c->last_ms + s->c->idle_ms : c->deadline_ms;
        if (now >= due) {
            if (relaying)
                conn_close(s, c, "idle timeout");
            else if (s->c->dial)
                conn_err(s, c, timeout_reason(c->state));
            else
                conn_refuse(s, c, "handshake timeout");
            continue;
        }
        next = MIN(next, due);
        again |= relaying && c->rl.again;
    }
    if (again)
        return 0;
    return next == UINT64_MAX ? -1 : (int)MIN(next - now, (uint64_t)INT32_MAX);
}

static void on_conn(struct gate_server *s, uint64_t tag)
{
    struct gate_conn *c = s->conns[tag >> 1];
    bool server = tag & 1;
    if (!c)
        return; /* closed earlier in this batch */
    /* Before the relay only the side a stage waits on counts (an event of
     * the other, reported in the same batch, is stale). */
    switch (c->state) {
    case ST_HANDSHAKE: if (!server) serve_handshake(s, c); break;
    case ST_PREAMBLE: if (!server) dial_preamble(s, c); break;
    case ST_CONNECTING: if (server) dial_connected(s, c); break;
    case ST_DIALING: if (server) dial_handshake(s, c); break;
    case ST_RELAYING: relay(s, c); break;
    }
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
            if (s->conns[i] && s->conns[i]->state == ST_RELAYING && s->conns[i]->rl.again)
                relay(s, s->conns[i]);
    }
}

/* ---- the server ------------------------------------------------------------- */

static int listen_tcp(const struct gate_conf *c)
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
    return TAKE_FD(lfd);
}

/* What is at the unix socket's name (in the working directory): nothing,
 * or a socket nobody listens on (a previous gate's: removed).  -EADDRINUSE
 * when a server answers there, -EEXIST for something not a socket. */
static int clear_stale(const char *name)
{
    struct stat st;
    if (lstat(name, &st) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (!S_ISSOCK(st.st_mode))
        return -EEXIST;
    /* Non-blocking: a live server with a full backlog answers EAGAIN
     * instead of holding the start-up. */
    _cleanup_close_ int fd = -1;
    int r = unix_connect(name, true, &fd);
    if (r == 0 || r == -EAGAIN)
        return -EADDRINUSE;
    if (r != -ECONNREFUSED)
        return r;
    return unlink(name) < 0 && errno != ENOENT ? -errno : 0;
}

/* The dial mode's unix socket, created 0600 (never wider, whatever the
 * umask), then opened to the group: 0660. */
static int listen_unix(const struct gate_conf *c)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int r = clear_stale(c->sock_name);
    if (r < 0)
        return r;
    strcpy(sa.sun_path, c->sock_name); /* fits: gate_conf checked */
    _cleanup_close_ int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0)
        return -errno;
    mode_t old = umask(0177);
    r = bind(lfd, (const struct sockaddr *)&sa, sizeof(sa));
    int e = errno;
    umask(old);
    if (r < 0)
        return -e;
    if (chmod(c->sock_name, 0660) < 0 || listen(lfd, 128) < 0) {
        e = errno;
        unlink(c->sock_name);
        return -e;
    }
    return TAKE_FD(lfd);
}

int gate_server_new(const struct gate_conf *c, SSL_CTX *ctx, SSL_CTX *api_ctx,
                    struct gate_server **ret)
{
    _cleanup_close_ int lfd = c->dial ? listen_unix(c) : listen_tcp(c);
    if (lfd < 0)
        return lfd;
    _cleanup_close_ int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0)
        return -errno;
    struct gate_server *s = xcalloc(1, sizeof(*s));
    s->logb.per_sec = LOG_BURST;
    s->c = c;
    s->ctx = ctx;
    s->api_ctx = api_ctx;
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
    if (s->c->dial) {
        snprintf(buf, len, "unix:%s", s->c->listen_unix);
        return buf;
    }
    struct sockaddr_storage sa;
    socklen_t sl = sizeof(sa);
    if (getsockname(s->lfd, (struct sockaddr *)&sa, &sl) < 0)
        sa.ss_family = AF_UNSPEC;
    return gate_format_addr((struct sockaddr *)&sa, buf, len);
}

void gate_server_stats(const struct gate_server *s, struct gate_stats *ret)
{
    *ret = s->st;
    ret->log_suppressed = s->logb.suppressed;
}
