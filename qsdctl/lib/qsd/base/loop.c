/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/loop.c: the event loop's API (loop.h) over two backends.
 *
 * Owns what both share: the choice of backend at loop_new(), the list of
 * watches, the timers (in user space, a list sorted by deadline whose nearest
 * deadline bounds the wait) and stopping.  Readiness of fds is the backend's
 * (loop_backend.h): io_uring (loop_uring.c) where the kernel and the seccomp
 * profile allow it, epoll (loop_epoll.c) where io_uring_setup is refused, as
 * the default seccomp profiles of containerd 2.x, Docker 25+ and podman do. */
#include "qsd/base/loop_backend.h"
#include "qsd/base/util.h"

struct loop_timer {
    struct loop *loop;
    uint64_t deadline_us;
    loop_timer_cb cb;
    void *opaque;
    struct loop_timer *next;
};

static int loop_create(const struct loop_ops *ops, struct loop **ret)
{
    struct loop *l = xcalloc(1, ops->loop_size);
    l->ops = ops;
    int r = ops->init(l);
    if (r < 0) {
        free(l);
        return r;
    }
    *ret = l;
    return 0;
}

/* io_uring_setup refused by a seccomp profile or a sysctl
 * (kernel.io_uring_disabled), or a kernel without io_uring. */
static bool uring_refused(int r) { return r == -EPERM || r == -ENOSYS || r == -EACCES; }

int loop_new_backend(struct loop **ret, const char *backend)
{
    if (!backend || !*backend) {
        int r = loop_create(&loop_uring_ops, ret);
        if (r < 0 && uring_refused(r))
            r = loop_create(&loop_epoll_ops, ret);
        return r;
    }
    if (streq(backend, loop_uring_ops.name))
        return loop_create(&loop_uring_ops, ret);
    if (streq(backend, loop_epoll_ops.name))
        return loop_create(&loop_epoll_ops, ret);
    return -EINVAL;
}

int loop_new(struct loop **ret) { return loop_new_backend(ret, getenv(LOOP_BACKEND_ENV)); }

const char *loop_backend(struct loop *l) { return l->ops->name; }

void loop_watch_free(struct loop_watch *w)
{
    struct loop *l = w->loop;
    if (w->prev)
        w->prev->next = w->next;
    else
        l->watches = w->next;
    if (w->next)
        w->next->prev = w->prev;
    free(w);
}

void loop_free(struct loop *l)
{
    if (!l)
        return;
    l->ops->fini(l);
    while (l->watches)
        loop_watch_free(l->watches);
    while (l->timers) {
        struct loop_timer *t = l->timers;
        l->timers = t->next;
        free(t);
    }
    free(l);
}

struct loop_watch *loop_watch_fd(struct loop *l, int fd, uint32_t events, loop_fd_cb cb,
                                 void *opaque)
{
    struct loop_watch *w = xcalloc(1, l->ops->watch_size);
    w->loop = l;
    w->fd = fd;
    w->events = events;
    w->cb = cb;
    w->opaque = opaque;
    w->next = l->watches;
    if (l->watches)
        l->watches->prev = w;
    l->watches = w;
    l->ops->watch_add(w);
    return w;
}

void loop_watch_set_events(struct loop_watch *w, uint32_t events)
{
    if (w->events == events || w->dead)
        return;
    w->events = events;
    w->loop->ops->watch_update(w);
}

void loop_watch_remove(struct loop_watch *w)
{
    if (!w || w->dead)
        return;
    w->dead = true;
    if (w->loop->ops->watch_remove(w))
        loop_watch_free(w);
}

struct loop_timer *loop_timer_add(struct loop *l, uint64_t ms, loop_timer_cb cb, void *opaque)
{
    struct loop_timer *t = xcalloc(1, sizeof(*t));
    t->loop = l;
    t->deadline_us = now_us() + ms * 1000u;
    t->cb = cb;
    t->opaque = opaque;
    struct loop_timer **pp = &l->timers;
    while (*pp && (*pp)->deadline_us <= t->deadline_us)
        pp = &(*pp)->next;
    t->next = *pp;
    *pp = t;
    return t;
}

void loop_timer_cancel(struct loop_timer *t)
{
    if (!t)
        return;
    for (struct loop_timer **pp = &t->loop->timers; *pp; pp = &(*pp)->next)
        if (*pp == t) {
            *pp = t->next;
            free(t);
            return;
        }
}

static int run_timers(struct loop *l)
{
    int n = 0;
    uint64_t now = now_us();
    while (l->timers && l->timers->deadline_us <= now) {
        struct loop_timer *t = l->timers;
        l->timers = t->next;
        loop_timer_cb cb = t->cb;
        void *opaque = t->opaque;
        free(t);
        cb(l, opaque);
        n++;
    }
    return n;
}

int loop_run_once(struct loop *l, int timeout_ms)
{
    int n = run_timers(l);
    if (l->stop)
        return n;

    int64_t wait_us = timeout_ms < 0 ? -1 : (int64_t)timeout_ms * 1000;
    if (n > 0)
        wait_us = 0; /* timers ran: do not sleep before looking at fds */
    if (l->timers) {
        uint64_t now = now_us();
        int64_t until = l->timers->deadline_us > now ? (int64_t)(l->timers->deadline_us - now) : 0;
        if (wait_us < 0 || until < wait_us)
            wait_us = until;
    }
    int r = l->ops->wait(l, wait_us);
    if (r < 0)
        return r;
    n += r;
    n += run_timers(l);
    return n;
}

int loop_run(struct loop *l)
{
    l->stop = false;
    while (!l->stop) {
        int r = loop_run_once(l, -1);
        if (r < 0)
            return r;
    }
    return 0;
}

void loop_stop(struct loop *l) { l->stop = true; }
bool loop_stopping(struct loop *l) { return l->stop; }
