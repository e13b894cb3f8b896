/* SPDX-License-Identifier: Apache-2.0 */
/* vufilter_io.c: the vhost-user filter's sockets (see vufilter_io.h). */
#include "vufilter_io.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "qsd/base/log.h"
#include "qsd/base/util.h"
#include "qsd/vhost/vufilter.h"

#define COMP "vufilter"
#define RETRY_MS 50
#define LOG_BURST 5 /* lines per second from the connection path */

/* One direction of one channel: a message being read, then being written. */
struct vf_dir {
    int *from, *to;        /* the connection's fds */
    enum vuf_chan ch;
    enum vuf_side side;
    bool writing;          /* buf holds a whole message being sent */
    uint8_t buf[VUF_MSG_MAX];
    size_t have, sent;
    int fds[VUF_MAX_FDS];
    unsigned nfds;
    uint64_t started_ms;   /* first byte of the message read */
};

enum { D_TQ, D_QT, D_BQT, D_BTQ, D_COUNT };

struct vf_conn {
    int tenant, qsd, tenant_be, qsd_be;
    bool up;               /* connected upstream */
    uint64_t connect_deadline, next_try;
    struct vufilter f;
    struct vf_dir d[D_COUNT];
};

struct vf_export {
    char *name;            /* the tenant spec, for logs */
    char *upstream;
    int listen_fd;
    char *created_path;    /* a socket we made (removed at the end) */
    struct vf_conn *conn;
};

struct vf_server {
    struct vf_options o;
    struct vf_export *e;
    unsigned n;
    struct vf_stats st;
    struct log_budget logb;   /* the connection path's lines */
};

/* ---- rate-limited log ---------------------------------------------------- */

#define conn_log(s, level, msg, ...) log_limited(&(s)->logb, level, COMP, msg, __VA_ARGS__)

/* ---- connections --------------------------------------------------------- */

static void close_fds(int *fds, unsigned *n)
{
    for (unsigned i = 0; i < *n; i++)
        close(fds[i]);
    *n = 0;
}

static void conn_free(struct vf_conn *c)
{
    if (!c)
        return;
    for (unsigned i = 0; i < D_COUNT; i++)
        close_fds(c->d[i].fds, &c->d[i].nfds);
    int *fds[] = {&c->tenant, &c->qsd, &c->tenant_be, &c->qsd_be};
    for (unsigned i = 0; i < ARRAY_SIZE(fds); i++)
        if (*fds[i] >= 0)
            close(*fds[i]);
    free(c);
}

static void conn_close(struct vf_server *s, struct vf_export *e, const char *why)
{
    conn_log(s, LOG_INFO, "closed", "export=%s reason=\"%s\"", e->name, why);
    conn_free(e->conn);
    e->conn = NULL;
}

static struct vf_conn *conn_new(struct vf_server *s, int tenant)
{
    struct vf_conn *c = xcalloc(1, sizeof(*c));
    c->tenant = tenant;
    c->qsd = c->tenant_be = c->qsd_be = -1;
    vufilter_init(&c->f, s->o.queues, s->o.allow_adjacent);
    c->connect_deadline = now_ms() + s->o.connect_timeout_ms;
    c->d[D_TQ] = (struct vf_dir){.from = &c->tenant, .to = &c->qsd, .ch = VUF_MAIN,
                                 .side = VUF_FROM_TENANT};
    c->d[D_QT] = (struct vf_dir){.from = &c->qsd, .to = &c->tenant, .ch = VUF_MAIN,
                                 .side = VUF_FROM_QSD};
    c->d[D_BQT] = (struct vf_dir){.from = &c->qsd_be, .to = &c->tenant_be, .ch = VUF_BACKEND,
                                  .side = VUF_FROM_QSD};
    c->d[D_BTQ] = (struct vf_dir){.from = &c->tenant_be, .to = &c->qsd_be, .ch = VUF_BACKEND,
                                  .side = VUF_FROM_TENANT};
    return c;
}

static int try_upstream(struct vf_server *s, struct vf_export *e)
{
    struct vf_conn *c = e->conn;
    int fd, r = unix_connect(e->upstream, true, &fd);
    if (r == 0) {
        c->qsd = fd;
        c->up = true;
        conn_log(s, LOG_DEBUG, "upstream", "export=%s", e->name);
        return 0;
    }
    if (r != -ENOENT && r != -ECONNREFUSED && r != -EAGAIN)
        return r;
    if (now_ms() >= c->connect_deadline)
        return -ETIMEDOUT;
    c->next_try = now_ms() + RETRY_MS;
    return 0;
}

/* SET_BACKEND_REQ_FD passed: keep the tenant's end, give QSD ours. */
static int interpose_backend(struct vf_dir *d, struct vf_conn *c)
{
    int sv[2];
    if (d->nfds != 1)
        return -EPROTO;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
        return -errno;
    c->tenant_be = d->fds[0];
    int fl = fcntl(c->tenant_be, F_GETFL);
    if (fl < 0 || fcntl(c->tenant_be, F_SETFL, fl | O_NONBLOCK) < 0) {
        close(sv[0]);
        close(sv[1]);
        d->nfds = 0;
        return -errno;
    }
    c->qsd_be = sv[0];
    d->fds[0] = sv[1];
    return 0;
}

/* Debug only (a tenant controls how often): what passed, with the memory
 * regions of SET_MEM_TABLE and ADD_MEM_REG (how a real front-end lays out
 * guest memory is what the adjacency rule depends on). */
static void log_passed(const struct vf_dir *d, uint32_t req, uint32_t size, enum vuf_verdict v)
{
    char nb[32], regions[256] = "";
    const uint8_t *p = d->buf + VUF_HDR_SIZE;
    bool tq = d->ch == VUF_MAIN && d->side == VUF_FROM_TENANT;
    unsigned first = 0, n = 0;
    if (tq && req == 5 && size >= 8) { /* SET_MEM_TABLE */
        memcpy(&n, p, 4);
        first = 8;
    } else if (tq && req == VUF_REQ_ADD_MEM_REG && size == 40) {
        n = 1;
        first = 8;
    }
    for (unsigned i = 0, at = 0; i < n && first + 32 * i + 16 <= size; i++) {
        uint64_t gpa, len;
        memcpy(&gpa, p + first + 32 * i, 8);
        memcpy(&len, p + first + 32 * i + 8, 8);
        int k = snprintf(regions + at, sizeof(regions) - at, "%s0x%llx+0x%llx", i ? "," : "",
                         (unsigned long long)gpa, (unsigned long long)len);
        if (k < 0 || (size_t)k >= sizeof(regions) - at)
            break;
        at += (unsigned)k;
    }
    log_debug(COMP, "passed", "from=%s channel=%s request=%s size=%u fds=%u%s%s%s",
              d->side == VUF_FROM_TENANT ? "tenant" : "qsd", d->ch == VUF_MAIN ? "main" : "backend",
              d->ch == VUF_MAIN ? vufilter_request_name(req, nb, sizeof(nb)) : "backend-msg", size,
              d->nfds, v == VUF_MODIFIED ? " modified=yes" : "", n ? " regions=" : "", regions);
}

/* Guest memory comes as memfds (or files on hugetlbfs, /dev/shm): regular
 * files.  Anything else (a socket, a pipe, a userfaultfd, a device) is not
 * what the QSD should mmap. */
static int check_memory_fds(struct vf_conn *c, const struct vf_dir *d)
{
    for (unsigned i = 0; i < d->nfds; i++) {
        struct stat st;
        if (fstat(d->fds[i], &st) < 0 || !S_ISREG(st.st_mode)) {
            snprintf(c->f.reason, sizeof(c->f.reason),
                     "memory descriptor %u is not a regular file (memfd)", i);
            c->f.dead = true;
            return -EPROTO;
        }
    }
    return 0;
}

/* Read what is missing of the message (header first, then its payload). */
static int dir_read(struct vf_server *s, struct vf_conn *c, struct vf_dir *d)
{
    size_t need = VUF_HDR_SIZE;
    if (d->have >= VUF_HDR_SIZE) {
        uint32_t size;
        memcpy(&size, d->buf + 8, 4);
        need += size;
    }
    char control[CMSG_SPACE(sizeof(int) * (VUF_MAX_FDS + 1))];
    struct iovec iov = {d->buf + d->have, need - d->have};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                        .msg_controllen = sizeof(control)};
    ssize_t n = recvmsg(*d->from, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0)
        return errno == EAGAIN || errno == EINTR ? 0 : -errno;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        unsigned k = (unsigned)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        int *fds = (int *)CMSG_DATA(cm);
        for (unsigned i = 0; i < k; i++) {
            if (d->nfds < VUF_MAX_FDS)
                d->fds[d->nfds++] = fds[i];
            else {
                close(fds[i]);
                mh.msg_flags |= MSG_CTRUNC;
            }
        }
    }
    if (mh.msg_flags & MSG_CTRUNC) {
        snprintf(c->f.reason, sizeof(c->f.reason), "more than %u descriptors", VUF_MAX_FDS);
        return -E2BIG;
    }
    if (n == 0)
        return -ECONNRESET;
    if (d->have == 0)
        d->started_ms = now_ms();
    d->have += (size_t)n;
    if (d->have == VUF_HDR_SIZE &&
        vufilter_check_header(&c->f, d->ch, d->side, d->buf) == VUF_REFUSE)
        return -EPROTO;
    if (d->have < VUF_HDR_SIZE)
        return 0;
    uint32_t size;
    memcpy(&size, d->buf + 8, 4);
    if (d->have < VUF_HDR_SIZE + size)
        return 0;
    /* A whole message: judge it. */
    enum vuf_verdict v = vufilter_feed(&c->f, d->ch, d->side, d->buf, d->have, d->nfds);
    if (v == VUF_REFUSE) {
        s->st.refused++;
        return -EPROTO;
    }
    if (d->ch == VUF_MAIN && d->side == VUF_FROM_TENANT) {
        uint32_t rq;
        memcpy(&rq, d->buf, 4);
        if (rq == 5 /* SET_MEM_TABLE */ || rq == VUF_REQ_ADD_MEM_REG) {
            int r = check_memory_fds(c, d);
            if (r < 0) {
                s->st.refused++;
                return r;
            }
        }
    }
    s->st.passed++;
    if (v == VUF_MODIFIED)
        s->st.modified++;
    uint32_t req;
    memcpy(&req, d->buf, 4);
    if (log_min_level <= LOG_DEBUG)
        log_passed(d, req, size, v);
    if (d->ch == VUF_MAIN && d->side == VUF_FROM_TENANT && req == 21 /* SET_BACKEND_REQ_FD */) {
        int r = interpose_backend(d, c);
        if (r < 0)
            return r;
    }
    d->writing = true;
    d->sent = 0;
    return 0;
}

/* Send the rest of the message; the descriptors go with its first byte. */
static int dir_write(struct vf_dir *d)
{
    char control[CMSG_SPACE(sizeof(int) * VUF_MAX_FDS)];
    struct iovec iov = {d->buf + d->sent, d->have - d->sent};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (d->sent == 0 && d->nfds) {
        memset(control, 0, sizeof(control));
        mh.msg_control = control;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * d->nfds);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * d->nfds);
        memcpy(CMSG_DATA(cm), d->fds, sizeof(int) * d->nfds);
    }
    ssize_t n = sendmsg(*d->to, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0)
        return errno == EAGAIN || errno == EINTR ? 0 : -errno;
    if (d->sent == 0)
        close_fds(d->fds, &d->nfds);
    d->sent += (size_t)n;
    if (d->sent == d->have) {
        d->writing = false;
        d->have = d->sent = 0;
    }
    return 0;
}

/* ---- listening sockets --------------------------------------------------- */

static int open_listener(struct vf_export *e, const char *spec)
{
    if (startswith(spec, "fd:")) {
        uint64_t fd;
        int r = parse_uint(spec + 3, 0, 65535, &fd);
        if (r < 0)
            return r;
        int acc = 0;
        socklen_t len = sizeof(acc);
        if (getsockopt((int)fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len) < 0)
            return -errno;
        if (!acc)
            return -ENOTCONN;
        if (fcntl((int)fd, F_SETFD, FD_CLOEXEC) < 0)
            return -errno;
        e->listen_fd = (int)fd;
        return 0;
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(spec) >= sizeof(sa.sun_path))
        return -ENAMETOOLONG;
    strcpy(sa.sun_path, spec);
    struct stat st;
    if (lstat(spec, &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            return -EEXIST;
        unlinkat(AT_FDCWD, spec, 0); /* not unlink(2): the FILTER profile has only the *at calls */
    }
    _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 8) < 0)
        return -errno;
    e->created_path = xstrdup(spec);
    e->listen_fd = TAKE_FD(fd);
    return 0;
}

int vf_server_new(const struct vf_export_spec *specs, unsigned n, const struct vf_options *o,
                  struct vf_server **ret)
{
    if (n == 0 || o->queues < 1 || o->queues > VUF_MAX_QUEUES)
        return -EINVAL;
    struct vf_server *s = xcalloc(1, sizeof(*s));
    s->logb.per_sec = LOG_BURST;
    s->o = *o;
    if (!s->o.connect_timeout_ms)
        s->o.connect_timeout_ms = 5000;
    if (!s->o.msg_timeout_ms)
        s->o.msg_timeout_ms = 5000;
    s->e = xcalloc(n, sizeof(*s->e));
    for (unsigned i = 0; i < n; i++)
        s->e[i].listen_fd = -1;
    s->n = n;
    for (unsigned i = 0; i < n; i++) {
        s->e[i].name = xstrdup(specs[i].tenant);
        s->e[i].upstream = xstrdup(specs[i].upstream);
        int r = open_listener(&s->e[i], specs[i].tenant);
        if (r < 0) {
            vf_server_free(s);
            return r;
        }
    }
    *ret = s;
    return 0;
}

void vf_server_free(struct vf_server *s)
{
    if (!s)
        return;
    for (unsigned i = 0; i < s->n; i++) {
        struct vf_export *e = &s->e[i];
        conn_free(e->conn);
        if (e->listen_fd >= 0)
            close(e->listen_fd);
        if (e->created_path)
            unlinkat(AT_FDCWD, e->created_path, 0);
        free(e->created_path);
        free(e->name);
        free(e->upstream);
    }
    free(s->e);
    free(s);
}

void vf_server_stats(const struct vf_server *s, struct vf_stats *ret)
{
    *ret = s->st;
    ret->log_suppressed = s->logb.suppressed;
}

/* ---- the loop ------------------------------------------------------------- */

#define MAX_POLL(n) (1 + (n) * 5)

enum slot_kind { K_EXTRA, K_LISTEN, K_DIR_IN, K_DIR_OUT };
struct slot {
    enum slot_kind kind;
    unsigned e, d;
};

static void add(struct pollfd *p, struct slot *sl, unsigned *np, int fd, short ev,
                struct slot what)
{
    p[*np] = (struct pollfd){.fd = fd, .events = ev};
    sl[*np] = what;
    (*np)++;
}

/* Fill the poll set; returns the poll timeout (ms, -1 none). */
static int build(struct vf_server *s, int extra_fd, struct pollfd *p, struct slot *sl,
                 unsigned *np)
{
    uint64_t now = now_ms(), next = UINT64_MAX;
    *np = 0;
    add(p, sl, np, extra_fd, POLLIN, (struct slot){K_EXTRA, 0, 0});
    for (unsigned i = 0; i < s->n; i++) {
        struct vf_conn *c = s->e[i].conn;
        if (!c) {
            add(p, sl, np, s->e[i].listen_fd, POLLIN, (struct slot){K_LISTEN, i, 0});
            continue;
        }
        if (!c->up) {
            next = MIN(next, c->next_try);
            /* notice a tenant that hangs up while we wait */
            add(p, sl, np, c->tenant, POLLRDHUP, (struct slot){K_DIR_IN, i, D_COUNT});
            continue;
        }
        for (unsigned k = 0; k < D_COUNT; k++) {
            struct vf_dir *d = &c->d[k];
            if (*d->from < 0 || *d->to < 0)
                continue;
            if (d->writing)
                add(p, sl, np, *d->to, POLLOUT, (struct slot){K_DIR_OUT, i, k});
            else
                add(p, sl, np, *d->from, POLLIN, (struct slot){K_DIR_IN, i, k});
            if (d->have || d->writing)
                next = MIN(next, d->started_ms + s->o.msg_timeout_ms);
        }
    }
    if (next == UINT64_MAX)
        return -1;
    return next <= now ? 0 : (int)MIN(next - now, 60000u);
}

static void on_accept(struct vf_server *s, struct vf_export *e)
{
    int fd = accept4(e->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
        return;
    s->st.connections++;
    e->conn = conn_new(s, fd);
    conn_log(s, LOG_INFO, "connected", "export=%s", e->name);
    int r = try_upstream(s, e);
    if (r < 0)
        conn_close(s, e, strerror(-r));
}

/* Timers: upstream retries and messages that take too long. */
static void on_timers(struct vf_server *s)
{
    uint64_t now = now_ms();
    for (unsigned i = 0; i < s->n; i++) {
        struct vf_export *e = &s->e[i];
        struct vf_conn *c = e->conn;
        if (!c)
            continue;
        if (!c->up) {
            if (now >= c->next_try) {
                int r = try_upstream(s, e);
                if (r < 0)
                    conn_close(s, e, r == -ETIMEDOUT ? "QSD socket not accepting" : strerror(-r));
            }
            continue;
        }
        for (unsigned k = 0; k < D_COUNT; k++) {
            struct vf_dir *d = &c->d[k];
            if ((d->have || d->writing) && now >= d->started_ms + s->o.msg_timeout_ms) {
                conn_close(s, e, "a message did not complete in time");
                break;
            }
        }
    }
}

static void on_dir(struct vf_server *s, struct vf_export *e, unsigned k, short rev, bool out)
{
    struct vf_conn *c = e->conn;
    if (!c)
        return; /* closed earlier in this round */
    if (k == D_COUNT) { /* waiting upstream: the tenant left */
        if (rev & (POLLRDHUP | POLLHUP | POLLERR))
            conn_close(s, e, "tenant left");
        return;
    }
    struct vf_dir *d = &c->d[k];
    int r = out ? dir_write(d) : dir_read(s, c, d);
    if (r == 0 && !out && d->writing)
        r = dir_write(d); /* usually goes at once */
    if (r == 0)
        return;
    if (r == -EPROTO || r == -E2BIG) {
        conn_log(s, LOG_WARN, "refused", "export=%s from=%s channel=%s reason=\"%s\"", e->name,
                 d->side == VUF_FROM_TENANT ? "tenant" : "qsd",
                 d->ch == VUF_MAIN ? "main" : "backend", c->f.reason);
        conn_free(e->conn);
        e->conn = NULL;
        return;
    }
    conn_close(s, e, r == -ECONNRESET ? (d->side == VUF_FROM_TENANT ? "tenant closed" : "qsd closed")
                                      : strerror(-r));
}

int vf_server_run(struct vf_server *s, int extra_fd, int (*on_extra)(void *opaque),
                  void *opaque)
{
    unsigned max = MAX_POLL(s->n);
    _cleanup_free_ struct pollfd *p = xcalloc(max, sizeof(*p));
    _cleanup_free_ struct slot *sl = xcalloc(max, sizeof(*sl));
    for (;;) {
        unsigned np;
        int timeout = build(s, extra_fd, p, sl, &np);
        int n = poll(p, np, timeout);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        for (unsigned i = 0; i < np; i++) {
            if (!p[i].revents)
                continue;
            switch (sl[i].kind) {
            case K_EXTRA: {
                int r = on_extra(opaque);
                if (r)
                    return r;
                break;
            }
            case K_LISTEN:
                on_accept(s, &s->e[sl[i].e]);
                break;
            case K_DIR_IN:
            case K_DIR_OUT:
                on_dir(s, &s->e[sl[i].e], sl[i].d, p[i].revents, sl[i].kind == K_DIR_OUT);
                break;
            }
        }
        on_timers(s);
    }
}
