/* SPDX-License-Identifier: Apache-2.0 */
/* grpc_unix.c: the unix-socket transport of the gRPC server, on the event
 * loop.  One struct conn per accepted connection, each owning one
 * grpc_session; one loop timer for the earliest RPC deadline; one for the
 * shutdown grace period; one sweep (every second while connections exist)
 * that closes connections that never sent their preface within
 * HANDSHAKE_MS.  An idle connection is kept, however long: the sidecars
 * (csi-lib-utils) hold one connection for their life and exit when it
 * closes ("Lost connection to CSI driver, exiting"), so closing idle ones
 * restarted them every few idle minutes.  At the connection limit the
 * longest-idle connection makes room for a new one, so idle peers cannot
 * lock kubelet out.  A peer that
 * half-closes (shutdown(SHUT_WR)) still gets its answers.  Non-blocking
 * sockets only: nothing here waits. */
#include "grpc.h"
#include "qsd/base/loop.h"
#include "qsd/base/probe.h"
#include "qsd/base/util.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#define READ_CHUNK 65536
#define READS_PER_EVENT 8 /* fairness between connections */
#define HANDSHAKE_MS 10000
#define SWEEP_MS 1000

struct conn {
    struct grpc_listener *ln;
    int fd;
    struct loop_watch *watch;
    uint32_t events;
    struct grpc_session *sess;
    uint64_t accepted_ms, active_ms;
    bool got_bytes;        /* the peer sent something (its preface) */
    bool read_eof;         /* the peer half-closed: answer, then close */
    struct conn *next, *prev;
};

struct grpc_listener {
    struct loop *loop;
    struct grpc_server *srv;
    char *path;
    int fd;
    struct loop_watch *watch;
    struct conn *conns;
    unsigned n_conns;
    struct loop_timer *deadline_timer;
    uint64_t deadline_at;
    struct loop_timer *grace_timer;
    struct loop_timer *sweep_timer;
    grpc_drained_fn drained_cb;
    void *drained_opaque;
    bool shutting_down;
};

static void listener_rearm_deadline(struct grpc_listener *ln);

static void conn_close(struct conn *c)
{
    struct grpc_listener *ln = c->ln;
    loop_watch_remove(c->watch);
    grpc_session_free(c->sess);
    close(c->fd);
    if (c->prev)
        c->prev->next = c->next;
    else
        ln->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    ln->n_conns--;
    free(c);
}

static void listener_check_drained(struct grpc_listener *ln)
{
    if (!ln->shutting_down || ln->n_conns > 0 || !ln->drained_cb)
        return;
    loop_timer_cancel(ln->grace_timer);
    ln->grace_timer = NULL;
    grpc_drained_fn cb = ln->drained_cb;
    ln->drained_cb = NULL;
    cb(ln, ln->drained_opaque);
}

/* Write what we can, then pick the events to wait for.  Returns false when
 * the connection was closed. */
static bool conn_flush(struct conn *c)
{
    for (;;) {
        const uint8_t *p;
        size_t n;
        if (grpc_session_output(c->sess, &p, &n) < 0)
            goto close;
        if (n == 0)
            break;
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EAGAIN || errno == EINTR)
                break;
            goto close;
        }
        grpc_session_consume(c->sess, (size_t)w);
        if ((size_t)w < n)
            break;
    }
    if (!grpc_session_alive(c->sess))
        goto close;
    if (c->read_eof && grpc_session_streams(c->sess) == 0 &&
        grpc_session_pending_output(c->sess) == 0)
        goto close; /* half-closed and every answer sent */
    uint32_t ev = 0;
    if (!c->read_eof && grpc_session_want_read(c->sess))
        ev |= POLLIN;
    if (grpc_session_pending_output(c->sess) > 0)
        ev |= POLLOUT;
    if (ev != c->events) {
        c->events = ev;
        loop_watch_set_events(c->watch, ev);
    }
    return true;
close:;
    struct grpc_listener *ln = c->ln;
    conn_close(c);
    listener_check_drained(ln);
    return false;
}

static void conn_io(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    struct conn *c = opaque;
    struct grpc_listener *ln = c->ln;
    if ((revents & (POLLIN | POLLERR | POLLHUP)) && !c->read_eof) {
        uint8_t buf[READ_CHUNK];
        for (int i = 0; i < READS_PER_EVENT; i++) {
            ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EINTR))
                break;
            if (n == 0 && !(revents & POLLERR) && grpc_session_streams(c->sess) > 0) {
                /* Half-closed with calls in flight: they still get their
                 * answers (conn_flush closes once they are sent). */
                c->read_eof = true;
                break;
            }
            if (n > 0) {
                c->got_bytes = true;
                c->active_ms = now_ms();
            }
            if (n <= 0 || grpc_session_recv(c->sess, buf, (size_t)n) < 0) {
                /* EOF, error, or protocol error: send what is queued (a
                 * GOAWAY) best effort, then close. */
                const uint8_t *p;
                size_t len;
                if (n > 0 && grpc_session_output(c->sess, &p, &len) == 0 && len > 0)
                    (void)!send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
                conn_close(c);
                listener_check_drained(ln);
                listener_rearm_deadline(ln);
                return;
            }
            if ((size_t)n < sizeof(buf) || !grpc_session_want_read(c->sess))
                break;
        }
    }
    conn_flush(c);
    listener_rearm_deadline(ln);
}

static void session_wakeup(struct grpc_session *s, void *opaque)
{
    struct conn *c = opaque;
    /* Only schedule: we may be deep inside a completion.  POLLOUT on a
     * socket with buffer space fires at once. */
    if (!(c->events & POLLOUT)) {
        c->events |= POLLOUT;
        loop_watch_set_events(c->watch, c->events);
    }
}

static void sweep(struct loop *l, void *opaque);

static void sweep_arm(struct grpc_listener *ln)
{
    if (!ln->sweep_timer && ln->n_conns > 0)
        ln->sweep_timer = loop_timer_add(ln->loop, SWEEP_MS, sweep, ln);
}

static bool conn_idle(const struct conn *c)
{
    return grpc_session_streams(c->sess) == 0 && grpc_session_pending_output(c->sess) == 0;
}

static void sweep(struct loop *l, void *opaque)
{
    struct grpc_listener *ln = opaque;
    ln->sweep_timer = NULL;
    uint64_t now = now_ms();
    for (struct conn *c = ln->conns, *next; c; c = next) {
        next = c->next;
        if (!c->got_bytes && now - c->accepted_ms > HANDSHAKE_MS) {
            log_info("grpc", "connection closed",
                     "reason=\"no preface within the handshake timeout\"");
            conn_close(c);
        }
    }
    listener_check_drained(ln);
    sweep_arm(ln);
}

/* At the connection limit: close the connection idle the longest, if any
 * is idle, to make room.  True when there is room now. */
static bool make_room(struct grpc_listener *ln)
{
    struct conn *victim = NULL;
    for (struct conn *c = ln->conns; c; c = c->next)
        if (conn_idle(c) && (!victim || c->active_ms < victim->active_ms))
            victim = c;
    if (!victim)
        return false;
    log_info("grpc", "connection closed", "reason=\"the longest idle, to make room for a new one\"");
    conn_close(victim);
    return true;
}

static void accept_cb(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    struct grpc_listener *ln = opaque;
    for (int i = 0; i < 16; i++) {
        int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) {
            if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                log_warn("grpc", "accept failed", "error=%s", strerror(errno));
            return;
        }
        struct conn *c = xcalloc(1, sizeof(*c));
        c->ln = ln;
        c->fd = cfd;
        c->accepted_ms = c->active_ms = now_ms();
        int r = grpc_session_new(ln->srv, session_wakeup, c, &c->sess);
        if (r == -EUSERS && make_room(ln))
            r = grpc_session_new(ln->srv, session_wakeup, c, &c->sess);
        if (r < 0) {
            log_warn("grpc", "connection refused", "reason=%s", strerror(-r));
            close(cfd);
            free(c);
            continue;
        }
        c->events = POLLIN | POLLOUT; /* our SETTINGS go out first */
        c->watch = loop_watch_fd(ln->loop, cfd, c->events, conn_io, c);
        c->next = ln->conns;
        if (ln->conns)
            ln->conns->prev = c;
        ln->conns = c;
        ln->n_conns++;
        sweep_arm(ln);
    }
}

static void deadline_fired(struct loop *l, void *opaque)
{
    struct grpc_listener *ln = opaque;
    ln->deadline_timer = NULL;
    ln->deadline_at = 0;
    grpc_server_expire(ln->srv, now_us());
    /* Wakeups already scheduled the writes. */
    listener_rearm_deadline(ln);
}

static void listener_rearm_deadline(struct grpc_listener *ln)
{
    uint64_t next = grpc_server_next_deadline(ln->srv);
    if (next == 0 || (ln->deadline_timer && ln->deadline_at <= next))
        return;
    loop_timer_cancel(ln->deadline_timer);
    uint64_t now = now_us();
    uint64_t ms = next > now ? (next - now + 999) / 1000 : 0;
    ln->deadline_timer = loop_timer_add(ln->loop, ms, deadline_fired, ln);
    ln->deadline_at = next;
}

int grpc_listener_new(struct loop *loop, struct grpc_server *srv, const char *path,
                      unsigned mode, struct grpc_listener **ret)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path))
        return -ENAMETOOLONG;
    strcpy(sa.sun_path, path);

    _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    /* A stale socket from a previous run is removed; a live one (another
     * plugin serving there) or anything that is not a socket is left alone. */
    struct stat stt;
    if (lstat(path, &stt) == 0) {
        if (!S_ISSOCK(stt.st_mode))
            return -EEXIST;
        if (probe_socket(path) == 0)
            return -EADDRINUSE;
        if (unlink(path) < 0)
            return -errno;
    }
    /* fchmod on an unbound socket does not set the file's mode: bind under
     * a restrictive umask instead, then set the exact mode. */
    mode_t old = umask(0777 & ~mode);
    int r = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    umask(old);
    if (r < 0)
        return -errno;
    if (chmod(path, mode) < 0 || listen(fd, 128) < 0) {
        r = -errno;
        unlink(path);
        return r;
    }

    struct grpc_listener *ln = xcalloc(1, sizeof(*ln));
    ln->loop = loop;
    ln->srv = srv;
    ln->path = xstrdup(path);
    ln->fd = TAKE_FD(fd);
    ln->watch = loop_watch_fd(loop, ln->fd, POLLIN, accept_cb, ln);
    *ret = ln;
    return 0;
}

static void listener_stop_accepting(struct grpc_listener *ln)
{
    if (ln->fd < 0)
        return;
    loop_watch_remove(ln->watch);
    ln->watch = NULL;
    close(ln->fd);
    ln->fd = -1;
    unlink(ln->path);
}

static void grace_expired(struct loop *l, void *opaque)
{
    struct grpc_listener *ln = opaque;
    ln->grace_timer = NULL;
    if (ln->n_conns > 0)
        log_warn("grpc", "shutdown grace period over", "closing=%u", ln->n_conns);
    while (ln->conns)
        conn_close(ln->conns);
    listener_check_drained(ln);
}

void grpc_listener_shutdown(struct grpc_listener *ln, uint64_t grace_ms, grpc_drained_fn cb,
                            void *opaque)
{
    if (ln->shutting_down)
        return;
    ln->shutting_down = true;
    ln->drained_cb = cb;
    ln->drained_opaque = opaque;
    listener_stop_accepting(ln);
    grpc_server_shutdown(ln->srv);
    ln->grace_timer = loop_timer_add(ln->loop, grace_ms, grace_expired, ln);
    /* Flush the GOAWAYs; idle connections finish right away. */
    for (struct conn *c = ln->conns, *next; c; c = next) {
        next = c->next;
        conn_flush(c);
    }
    listener_check_drained(ln);
}

void grpc_listener_free(struct grpc_listener *ln)
{
    if (!ln)
        return;
    listener_stop_accepting(ln);
    while (ln->conns)
        conn_close(ln->conns);
    loop_timer_cancel(ln->deadline_timer);
    loop_timer_cancel(ln->grace_timer);
    loop_timer_cancel(ln->sweep_timer);
    free(ln->path);
    free(ln);
}

unsigned grpc_listener_connections(const struct grpc_listener *ln) { return ln->n_conns; }
