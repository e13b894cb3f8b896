/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/loop_epoll.c: the epoll backend of the event loop (loop.c,
 * loop_backend.h), for where io_uring_setup is refused (the default seccomp
 * profiles of containerd 2.x, Docker 25+ and podman; kernel.io_uring_disabled).
 *
 * Level-triggered epoll gives the loop's semantics directly: a ready watch's
 * callback runs once per iteration until it is removed or no longer ready.
 * Each watch registers a private duplicate of its fd (CLOEXEC), so that two
 * watches of one fd are two registrations and a registration never outlives
 * its watch, whatever the owner closes, as io_uring's poll holds its own
 * reference to the file.  A watch removed while a batch of events is being
 * dispatched stays allocated (dead, skipped) until the batch ends, as a later
 * event of the batch may name it.
 *
 * An fd epoll refuses (EPERM: a regular file or a directory, always ready for
 * poll(2)) or cannot take (the duplicate or the registration failed) is
 * reported every iteration, with POLLIN/POLLOUT as poll(2) reports regular
 * files, or with POLLERR, as a failed io_uring poll is. */
#include "qsd/base/loop_backend.h"
#include "qsd/base/util.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/epoll.h>

#define LOOP_EVENTS 256
#define EPOLL_FLAGS (EPOLLET | EPOLLONESHOT | EPOLLEXCLUSIVE | EPOLLWAKEUP)

struct epoll_watch {
    struct loop_watch w;
    int regfd;          /* the duplicate registered; -1 if none */
    uint32_t unwatched; /* not registered: revents reported every iteration */
};

struct epoll_loop {
    struct loop l;
    int epfd;
    bool dispatching; /* a batch is being dispatched: removed watches wait */
    unsigned ndead;   /* removed watches left for the end of the batch */
    unsigned nunwatched;
};

static struct epoll_loop *ep_of(struct loop *l) { return (struct epoll_loop *)l; }

static int ep_init(struct loop *l)
{
    ep_of(l)->epfd = epoll_create1(EPOLL_CLOEXEC);
    return ep_of(l)->epfd < 0 ? -errno : 0;
}

static void ep_fini(struct loop *l)
{
    for (struct loop_watch *w = l->watches; w; w = w->next)
        if (((struct epoll_watch *)w)->regfd >= 0)
            close(((struct epoll_watch *)w)->regfd);
    close(ep_of(l)->epfd);
}

static struct epoll_event ev_of(struct epoll_watch *e)
{
    return (struct epoll_event){.events = e->w.events & ~(uint32_t)EPOLL_FLAGS, .data.ptr = e};
}

static void set_unwatched(struct epoll_watch *e, uint32_t revents)
{
    struct epoll_loop *ep = ep_of(e->w.loop);
    ep->nunwatched += !e->unwatched;
    e->unwatched = revents;
}

static void ep_watch_add(struct loop_watch *w)
{
    struct epoll_watch *e = (struct epoll_watch *)w;
    e->regfd = fcntl(w->fd, F_DUPFD_CLOEXEC, 3);
    if (e->regfd < 0) {
        set_unwatched(e, POLLERR | (errno == EBADF ? POLLNVAL : 0));
        return;
    }
    struct epoll_event ev = ev_of(e);
    if (epoll_ctl(ep_of(w->loop)->epfd, EPOLL_CTL_ADD, e->regfd, &ev) < 0) {
        set_unwatched(e, errno == EPERM ? POLLIN | POLLOUT | POLLRDNORM | POLLWRNORM : POLLERR);
        close(e->regfd);
        e->regfd = -1;
    }
}

static void ep_watch_update(struct loop_watch *w)
{
    struct epoll_watch *e = (struct epoll_watch *)w;
    struct epoll_event ev = ev_of(e);
    if (e->regfd >= 0 && epoll_ctl(ep_of(w->loop)->epfd, EPOLL_CTL_MOD, e->regfd, &ev) < 0)
        set_unwatched(e, POLLERR);
}

static bool ep_watch_remove(struct loop_watch *w)
{
    struct epoll_watch *e = (struct epoll_watch *)w;
    struct epoll_loop *ep = ep_of(w->loop);
    if (e->regfd >= 0) {
        epoll_ctl(ep->epfd, EPOLL_CTL_DEL, e->regfd, NULL);
        close(e->regfd);
        e->regfd = -1;
    }
    if (e->unwatched) {
        ep->nunwatched--;
        e->unwatched = 0;
    }
    if (!ep->dispatching)
        return true;
    ep->ndead++;
    return false;
}

static int run_watch(struct epoll_watch *e, uint32_t revents)
{
    struct loop_watch *w = &e->w;
    if (w->dead)
        return 0;
    /* What poll(2) reports: the events asked for, errors and hangups always. */
    revents &= w->events | POLLERR | POLLHUP | POLLNVAL;
    if (!revents)
        return 0;
    w->cb(w->loop, w->fd, revents, w->opaque);
    return 1;
}

static int dispatch(struct loop *l, const struct epoll_event *evs, int nev)
{
    struct epoll_loop *ep = ep_of(l);
    int n = 0;
    ep->dispatching = true;
    for (int i = 0; i < nev; i++)
        n += run_watch(evs[i].data.ptr, evs[i].events);
    if (ep->nunwatched)
        for (struct loop_watch *w = l->watches; w; w = w->next)
            if (((struct epoll_watch *)w)->unwatched)
                n += run_watch((struct epoll_watch *)w, ((struct epoll_watch *)w)->unwatched);
    ep->dispatching = false;
    for (struct loop_watch *w = l->watches, *next; w && ep->ndead; w = next) {
        next = w->next;
        if (w->dead) {
            ep->ndead--;
            loop_watch_free(w);
        }
    }
    return n;
}

static int ep_wait(struct loop *l, int64_t wait_us)
{
    struct epoll_loop *ep = ep_of(l);
    struct epoll_event evs[LOOP_EVENTS];
    int ms = -1;
    if (ep->nunwatched)
        ms = 0; /* always ready: look, do not wait */
    else if (wait_us >= 0) /* rounded up: a timer due in 0.5 ms must not spin */
        ms = wait_us >= (int64_t)INT_MAX * 1000 ? INT_MAX : (int)((wait_us + 999) / 1000);
    int nev = epoll_wait(ep->epfd, evs, LOOP_EVENTS, ms);
    if (nev < 0)
        return errno == EINTR ? 0 : -errno;
    return dispatch(l, evs, nev);
}

const struct loop_ops loop_epoll_ops = {
    .name = "epoll",
    .loop_size = sizeof(struct epoll_loop),
    .watch_size = sizeof(struct epoll_watch),
    .init = ep_init,
    .fini = ep_fini,
    .watch_add = ep_watch_add,
    .watch_update = ep_watch_update,
    .watch_remove = ep_watch_remove,
    .wait = ep_wait,
};
