/* SPDX-License-Identifier: Apache-2.0 */
/* http.c: the plugin's small HTTP/1.1 server.  See http.h.
 *
 * One struct conn per accepted connection: it reads the request head into a
 * fixed buffer (nothing grows with what the peer sends), answers once, and
 * closes after the answer is written.  Each connection has one timer: the
 * header deadline while reading, then the write deadline. */
#include "http.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <strings.h>
#include <sys/socket.h>

struct conn {
    struct http_server *srv;
    int fd;
    struct loop_watch *watch;
    struct loop_timer *timer;
    char in[HTTP_MAX_REQUEST];
    size_t in_len;
    char *out;              /* the answer, once decided */
    size_t out_len, out_off;
    struct sockaddr_storage peer; /* address only (port zeroed): the eviction's "who" */
    uint64_t accepted_ms;
    struct conn *next, *prev;
};

struct http_server {
    struct loop *loop;
    int fd;
    struct loop_watch *watch;
    http_handler_fn fn;
    void *opaque;
    struct conn *conns;
    unsigned n_conns;
};

int http_parse_endpoint(const char *endpoint, struct sockaddr_storage *ret, unsigned *ret_len)
{
    const char *colon = strrchr(endpoint, ':');
    if (!colon)
        return -EINVAL;
    uint64_t port;
    if (parse_uint(colon + 1, 1, 65535, &port) < 0)
        return -EINVAL;
    size_t hl = (size_t)(colon - endpoint);
    _cleanup_free_ char *host = xstrndup(endpoint, hl);
    struct sockaddr_storage ss = {0};
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        host[hl - 1] = '\0';
        if (inet_pton(AF_INET6, host + 1, &a->sin6_addr) != 1)
            return -EINVAL;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        *ret_len = sizeof(*a);
    } else if (hl == 0) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_any;
        a->sin6_port = htons((uint16_t)port);
        *ret_len = sizeof(*a);
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
            return -EINVAL;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        *ret_len = sizeof(*a);
    }
    *ret = ss;
    return 0;
}

/* ------------------------------------------------------------ connections */

static void conn_close(struct conn *c)
{
    struct http_server *s = c->srv;
    loop_watch_remove(c->watch);
    loop_timer_cancel(c->timer);
    close(c->fd);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->n_conns--;
    free(c->out);
    free(c);
}

static void on_timeout(struct loop *l, void *opaque);

static const char *reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Internal Server Error";
    }
}

static char *format_response(int status, const char *type, const char *body, size_t len,
                             size_t *ret_len)
{
    char *out = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&out, &n);
    if (!f)
        abort();
    fprintf(f,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
            "Connection: close\r\n\r\n",
            status, reason(status), type, len, status == 405 ? "Allow: GET\r\n" : "");
    fwrite(body, 1, len, f);
    fclose(f);
    *ret_len = n;
    return out;
}

/* Decide the answer; from now on only write, then close. */
static void conn_answer(struct conn *c, int status, const char *type, const char *body,
                        size_t len)
{
    c->out = format_response(status, type, body, len, &c->out_len);
    loop_watch_set_events(c->watch, POLLOUT);
    loop_timer_cancel(c->timer);
    c->timer = loop_timer_add(c->srv->loop, HTTP_WRITE_TIMEOUT_MS, on_timeout, c);
}

static void conn_error(struct conn *c, int status)
{
    _cleanup_free_ char *body = xasprintf("%d %s\n", status, reason(status));
    conn_answer(c, status, "text/plain; charset=utf-8", body, strlen(body));
}

static void on_timeout(struct loop *l, void *opaque)
{
    struct conn *c = opaque;
    c->timer = NULL;
    if (!c->out) {
        conn_error(c, 408); /* slow or silent sender */
        return;
    }
    conn_close(c); /* a reader that does not read */
}

/* RFC 9110 token characters (method, header field names). */
static bool is_tchar(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

static bool is_token(const char *p, size_t n)
{
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!is_tchar(p[i]))
            return false;
    return true;
}

/* Visible characters, spaces and tabs only (no CR, LF or other controls). */
static bool is_field_value(const char *v)
{
    for (; *v; v++)
        if ((unsigned char)*v < 0x20 ? *v != '\t' : *v == 0x7f)
            return false;
    return true;
}

/* Framing a header field announces: 0 for none, else the status to answer.
 * No body is accepted: Transfer-Encoding in any form is 501 (not
 * implemented), a Content-Length other than a single run of digits is 400,
 * a non-zero one too (a GET has no body). */
static int framing(const char *name, size_t nl, const char *value)
{
    if (nl == 17 && strncasecmp(name, "transfer-encoding", nl) == 0)
        return 501;
    if (nl == 14 && strncasecmp(name, "content-length", nl) == 0) {
        value += strspn(value, " \t");
        size_t d = strspn(value, "0123456789");
        if (d == 0 || value[d + strspn(value + d, " \t")] != '\0')
            return 400;
        for (size_t i = 0; i < d; i++)
            if (value[i] != '0')
                return 400;
    }
    return 0;
}

/* The complete head is in c->in (NUL-terminated; CRLF lines checked by
 * head_lines_ok). */
static void conn_request(struct conn *c)
{
    char *line_end = strstr(c->in, "\r\n");
    *line_end = '\0';
    /* METHOD SP request-target SP HTTP-version: single spaces, a token
     * method, a target of visible characters. */
    char *method = c->in, *sp1 = strchr(method, ' ');
    char *target = sp1 ? sp1 + 1 : NULL, *sp2 = target ? strchr(target, ' ') : NULL;
    if (!sp1 || !sp2 || strchr(sp2 + 1, ' ') || !is_token(method, (size_t)(sp1 - method)) ||
        sp2 == target) {
        conn_error(c, 400);
        return;
    }
    *sp1 = *sp2 = '\0';
    const char *version = sp2 + 1;
    if (!is_field_value(target) || strchr(target, '\t') || !startswith(version, "HTTP/")) {
        conn_error(c, 400);
        return;
    }
    if (!streq(version, "HTTP/1.1") && !streq(version, "HTTP/1.0")) {
        conn_error(c, 505);
        return;
    }
    unsigned n_length = 0;
    for (char *h = line_end + 2; *h && !startswith(h, "\r\n");) {
        char *e = strstr(h, "\r\n");
        *e = '\0';
        /* name ":" OWS value OWS; no space before the colon, no folding. */
        char *colon = strchr(h, ':');
        if (!colon || !is_token(h, (size_t)(colon - h)) || !is_field_value(colon + 1)) {
            conn_error(c, 400);
            return;
        }
        size_t nl = (size_t)(colon - h);
        int st = framing(h, nl, colon + 1);
        if (nl == 14 && strncasecmp(h, "content-length", nl) == 0 && ++n_length > 1)
            st = 400;
        if (st) {
            conn_error(c, st);
            return;
        }
        h = e + 2;
    }
    if (!streq(method, "GET")) {
        conn_error(c, 405);
        return;
    }
    if (target[0] != '/') {
        conn_error(c, 400);
        return;
    }
    target[strcspn(target, "?#")] = '\0';
    int status = 500;
    const char *type = "text/plain; charset=utf-8";
    _cleanup_free_ char *body = NULL;
    size_t len = 0;
    c->srv->fn(target, &status, &type, &body, &len, c->srv->opaque);
    if (!body) {
        conn_error(c, status);
        return;
    }
    conn_answer(c, status, type, body, len);
}

/* Read and drop what the peer sent that we did not read (bounded, never
 * waits): closing with unread input would reset the connection, and the
 * peer could lose the answer. */
static void conn_drain(int fd)
{
    char buf[4096];
    for (int i = 0; i < 16 && recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0; i++)
        ;
}

/* Write what the socket takes of the answer; once all of it is written,
 * close.  False when c is gone. */
static bool conn_write(struct conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return true;
        if (n <= 0) {
            conn_close(c);
            return false;
        }
        c->out_off += (size_t)n;
    }
    shutdown(c->fd, SHUT_WR);
    conn_drain(c->fd);
    conn_close(c);
    return false;
}

/* Read what the peer sent; answer once the head is complete.  False when
 * c is gone. */
static bool conn_read(struct conn *c)
{
    for (;;) {
        size_t room = sizeof(c->in) - 1 - c->in_len;
        if (room == 0) {
            conn_error(c, 431);
            return true;
        }
        ssize_t n = recv(c->fd, c->in + c->in_len, room, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return true;
        if (n <= 0) {
            conn_close(c); /* closed or broken before a complete request */
            return false;
        }
        size_t from = c->in_len > 3 ? c->in_len - 3 : 0;
        c->in_len += (size_t)n;
        c->in[c->in_len] = '\0';
        if (memchr(c->in + from, '\0', c->in_len - from)) {
            conn_error(c, 400); /* a NUL byte in the head */
            return true;
        }
        if (strstr(c->in + from, "\r\n\r\n")) {
            conn_request(c);
            return true;
        }
    }
}

/* Serve c as far as it goes without waiting: read, answer, write. */
static void conn_step(struct conn *c)
{
    if (!c->out && !conn_read(c))
        return;
    if (c->out)
        conn_write(c);
}

static void on_conn(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    conn_step(opaque);
}

static bool same_peer(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    return memcmp(a, b, sizeof(*a)) == 0;
}

/* At HTTP_MAX_CONNECTIONS, make room for a new connection from peer: close
 * the oldest connection of the peer that holds the most (the newcomer's own
 * peer counted with it), preferring one still sending its head.  A client
 * that opens many slow connections thus only ever displaces its own, and a
 * scraper from another address always gets a slot. */
static void evict_one(struct http_server *s, const struct sockaddr_storage *peer)
{
    struct conn *victim = NULL;
    unsigned victim_n = 0;
    for (struct conn *c = s->conns; c; c = c->next) {
        unsigned n = same_peer(&c->peer, peer);
        for (struct conn *d = s->conns; d; d = d->next)
            n += same_peer(&c->peer, &d->peer);
        bool better = !victim || n > victim_n ||
                      (n == victim_n && (!c->out && victim->out)) ||
                      (n == victim_n && !c->out == !victim->out &&
                       c->accepted_ms < victim->accepted_ms);
        if (better) {
            victim = c;
            victim_n = n;
        }
    }
    if (victim) {
        log_debug("http", "connection limit: closing the oldest of the busiest peer",
                  "peer_connections=%u reading=%s", victim_n, victim->out ? "no" : "yes");
        conn_close(victim);
    }
}

static void on_accept(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    struct http_server *s = opaque;
    for (;;) {
        struct sockaddr_storage peer = {0};
        socklen_t pl = sizeof(peer);
        int cfd = accept4(fd, (struct sockaddr *)&peer, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) {
            if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                log_warn("http", "accept failed", "error=\"%s\"", strerror(errno));
            return;
        }
        /* The address identifies the peer, not the port. */
        if (peer.ss_family == AF_INET)
            ((struct sockaddr_in *)&peer)->sin_port = 0;
        else if (peer.ss_family == AF_INET6)
            ((struct sockaddr_in6 *)&peer)->sin6_port = 0;
        if (s->n_conns >= HTTP_MAX_CONNECTIONS)
            evict_one(s, &peer);
        struct conn *c = xcalloc(1, sizeof(*c));
        c->srv = s;
        c->fd = cfd;
        c->peer = peer;
        c->accepted_ms = now_ms();
        c->next = s->conns;
        if (s->conns)
            s->conns->prev = c;
        s->conns = c;
        s->n_conns++;
        c->watch = loop_watch_fd(l, cfd, POLLIN, on_conn, c);
        c->timer = loop_timer_add(l, HTTP_HEADER_TIMEOUT_MS, on_timeout, c);
        /* With TCP_DEFER_ACCEPT the request is usually here already: a
         * scraper is answered at once and never waits for a slot. */
        conn_step(c);
    }
}

/* A socket for ss.  Every address (dual, ":PORT"): [::] taking IPv4
 * clients too (IPV6_V6ONLY off, whatever net.ipv6.bindv6only says), or
 * 0.0.0.0 in ss when the kernel has no IPv6. */
static int listen_socket(bool dual, struct sockaddr_storage *ss, unsigned *sl)
{
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 && dual && errno == EAFNOSUPPORT) {
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = ((struct sockaddr_in6 *)ss)->sin6_port,
                                .sin_addr.s_addr = htonl(INADDR_ANY)};
        memset(ss, 0, sizeof(*ss));
        memcpy(ss, &a, sizeof(a));
        *sl = sizeof(a);
        log_info("http", "no IPv6 in this kernel: listening on IPv4 only", "port=%u",
                 (unsigned)ntohs(a.sin_port));
        fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    }
    if (fd < 0)
        return -errno;
    int off = 0;
    if (dual && ss->ss_family == AF_INET6 &&
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off)) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

int http_server_new(struct loop *l, const char *endpoint, http_handler_fn fn, void *opaque,
                    struct http_server **ret)
{
    struct sockaddr_storage ss;
    unsigned sl;
    int r = http_parse_endpoint(endpoint, &ss, &sl);
    if (r < 0)
        return r;
    _cleanup_close_ int fd = -1;
    if ((r = listen_socket(endpoint[0] == ':', &ss, &sl)) < 0)
        return r;
    fd = r;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&ss, sl) < 0 || listen(fd, 64) < 0)
        return -errno;
    /* Wake accept only once the client has sent something (or after
     * HTTP_DEFER_ACCEPT_S): a silent connection holds no slot meanwhile. */
    int defer = HTTP_DEFER_ACCEPT_S;
    setsockopt(fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer, sizeof(defer));
    struct http_server *s = xcalloc(1, sizeof(*s));
    s->loop = l;
    s->fd = TAKE_FD(fd);
    s->fn = fn;
    s->opaque = opaque;
    s->watch = loop_watch_fd(l, s->fd, POLLIN, on_accept, s);
    *ret = s;
    return 0;
}

void http_server_free(struct http_server *s)
{
    if (!s)
        return;
    while (s->conns)
        conn_close(s->conns);
    loop_watch_remove(s->watch);
    close(s->fd);
    free(s);
}
