/* qsd/base/loop.c: io_uring event loop.  See loop.h.
 *
 * Each fd watch is a one-shot IORING_OP_POLL_ADD whose user_data points to the
 * watch; it is re-armed after its callback.  A removed watch whose poll is still
 * in the kernel is marked dead and freed when its completion arrives (the
 * cancellation completion or the real one).  Timers live in user space, in a
 * list sorted by deadline; the nearest deadline bounds the wait. */
#include "qsd/base/loop.h"
#include "qsd/base/util.h"

#include <liburing.h>

#define LOOP_ENTRIES 256
#define CANCEL_TAG 1 /* user_data of poll_remove requests: ignored on completion */

struct loop_watch {
    struct loop *loop;
    int fd;
    uint32_t events;
    loop_fd_cb cb;
    void *opaque;
    bool armed; /* a POLL_ADD is in the kernel */
    bool dead;  /* removed by the owner: free on completion */
    bool rearm; /* events changed while armed */
    struct loop_watch *next, *prev; /* all watches, for loop_free */
};

struct loop_timer {
    struct loop *loop;
    uint64_t deadline_us;
    loop_timer_cb cb;
    void *opaque;
    struct loop_timer *next;
};

struct loop {
    struct io_uring ring;
    struct loop_watch *watches;
    struct loop_timer *timers; /* sorted by deadline */
    bool stop;
};

int loop_new(struct loop **ret)
{
    struct loop *l = xcalloc(1, sizeof(*l));
    int r = io_uring_queue_init(LOOP_ENTRIES, &l->ring, 0);
    if (r < 0) {
        free(l);
        return r;
    }
    *ret = l;
    return 0;
}

static void watch_unlink(struct loop_watch *w)
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
    io_uring_queue_exit(&l->ring);
    while (l->watches)
        watch_unlink(l->watches);
    while (l->timers) {
        struct loop_timer *t = l->timers;
        l->timers = t->next;
        free(t);
    }
    free(l);
}

static struct io_uring_sqe *get_sqe(struct loop *l)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&l->ring);
    if (!sqe) {
        /* Submission queue full: flush it and try again. */
        io_uring_submit(&l->ring);
        sqe = io_uring_get_sqe(&l->ring);
    }
    if (!sqe)
        abort(); /* cannot happen after a submit with an empty queue */
    return sqe;
}

static void watch_arm(struct loop_watch *w)
{
    struct io_uring_sqe *sqe = get_sqe(w->loop);
    io_uring_prep_poll_add(sqe, w->fd, w->events);
    io_uring_sqe_set_data(sqe, w);
    w->armed = true;
}

static void watch_cancel(struct loop_watch *w)
{
    struct io_uring_sqe *sqe = get_sqe(w->loop);
    io_uring_prep_poll_remove(sqe, (__u64)(uintptr_t)w);
    io_uring_sqe_set_data64(sqe, CANCEL_TAG);
}

struct loop_watch *loop_watch_fd(struct loop *l, int fd, uint32_t events, loop_fd_cb cb,
                                 void *opaque)
{
    struct loop_watch *w = xcalloc(1, sizeof(*w));
    w->loop = l;
    w->fd = fd;
    w->events = events;
    w->cb = cb;
    w->opaque = opaque;
    w->next = l->watches;
    if (l->watches)
        l->watches->prev = w;
    l->watches = w;
    watch_arm(w);
    return w;
}

void loop_watch_set_events(struct loop_watch *w, uint32_t events)
{
    if (w->events == events)
        return;
    w->events = events;
    if (w->armed && !w->rearm) {
        w->rearm = true;
        watch_cancel(w);
    }
}

void loop_watch_remove(struct loop_watch *w)
{
    if (!w)
        return;
    if (!w->armed) {
        /* Inside its own callback (not re-armed yet) or never armed. */
        w->dead = true;
        return;
    }
    w->dead = true;
    if (!w->rearm)
        watch_cancel(w);
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

static int dispatch(struct loop *l, struct io_uring_cqe *cqe)
{
    uint64_t tag = io_uring_cqe_get_data64(cqe);
    if (tag == CANCEL_TAG)
        return 0;
    struct loop_watch *w = io_uring_cqe_get_data(cqe);
    int res = cqe->res;
    w->armed = false;
    if (w->dead) {
        watch_unlink(w);
        return 0;
    }
    if (w->rearm) {
        w->rearm = false;
        if (res == -ECANCELED) {
            watch_arm(w);
            return 0;
        }
    }
    if (res == -ECANCELED) {
        watch_arm(w);
        return 0;
    }
    uint32_t revents = res < 0 ? POLLERR : (uint32_t)res;
    w->cb(l, w->fd, revents, w->opaque);
    if (w->dead)
        watch_unlink(w);
    else if (!w->armed)
        watch_arm(w);
    return 1;
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

    struct io_uring_cqe *cqe;
    int r;
    if (wait_us < 0) {
        r = io_uring_submit_and_wait(&l->ring, 1);
        if (r >= 0)
            r = io_uring_peek_cqe(&l->ring, &cqe);
    } else {
        struct __kernel_timespec ts = {.tv_sec = wait_us / 1000000,
                                       .tv_nsec = (wait_us % 1000000) * 1000};
        r = io_uring_submit_and_wait_timeout(&l->ring, &cqe, 1, &ts, NULL);
    }
    if (r < 0 && r != -ETIME && r != -EINTR && r != -EAGAIN)
        return r;

    unsigned head, count = 0;
    /* Dispatch everything completed so far; callbacks may queue new SQEs. */
    io_uring_for_each_cqe(&l->ring, head, cqe)
    {
        struct io_uring_cqe copy = *cqe;
        count++;
        io_uring_cq_advance(&l->ring, 1);
        n += dispatch(l, &copy);
        if (count >= LOOP_ENTRIES)
            break;
    }
    n += run_timers(l);
    io_uring_submit(&l->ring);
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
