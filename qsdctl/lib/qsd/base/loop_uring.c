/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/loop_uring.c: the io_uring backend of the event loop (loop.c,
 * loop_backend.h).  The only file that knows io_uring.
 *
 * Each fd watch is a one-shot IORING_OP_POLL_ADD whose user_data points to the
 * watch; it is re-armed after its callback.  A removed watch whose poll is still
 * in the kernel is marked dead and freed when its completion arrives (the
 * cancellation completion or the real one). */
#include "qsd/base/loop_backend.h"
#include "qsd/base/util.h"

#include <liburing.h>

#define LOOP_ENTRIES 256
#define CANCEL_TAG 1 /* user_data of poll_remove requests: ignored on completion */

struct uring_watch {
    struct loop_watch w;
    bool armed; /* a POLL_ADD is in the kernel */
    bool rearm; /* events changed while armed */
};

struct uring_loop {
    struct loop l;
    struct io_uring ring;
};

static struct io_uring *ring_of(struct loop *l) { return &((struct uring_loop *)l)->ring; }

static int uring_init(struct loop *l) { return io_uring_queue_init(LOOP_ENTRIES, ring_of(l), 0); }

static void uring_fini(struct loop *l) { io_uring_queue_exit(ring_of(l)); }

static struct io_uring_sqe *get_sqe(struct loop *l)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring_of(l));
    if (!sqe) {
        /* Submission queue full: flush it and try again. */
        io_uring_submit(ring_of(l));
        sqe = io_uring_get_sqe(ring_of(l));
    }
    if (!sqe)
        abort(); /* cannot happen after a submit with an empty queue */
    return sqe;
}

static void watch_arm(struct uring_watch *u)
{
    struct io_uring_sqe *sqe = get_sqe(u->w.loop);
    io_uring_prep_poll_add(sqe, u->w.fd, u->w.events);
    io_uring_sqe_set_data(sqe, u);
    u->armed = true;
}

static void watch_cancel(struct uring_watch *u)
{
    struct io_uring_sqe *sqe = get_sqe(u->w.loop);
    io_uring_prep_poll_remove(sqe, (__u64)(uintptr_t)u);
    io_uring_sqe_set_data64(sqe, CANCEL_TAG);
}

static void uring_watch_add(struct loop_watch *w) { watch_arm((struct uring_watch *)w); }

static void uring_watch_update(struct loop_watch *w)
{
    struct uring_watch *u = (struct uring_watch *)w;
    if (u->armed && !u->rearm) {
        u->rearm = true;
        watch_cancel(u);
    }
}

static bool uring_watch_remove(struct loop_watch *w)
{
    struct uring_watch *u = (struct uring_watch *)w;
    /* Not armed: inside its own callback, which frees it when it returns.
     * Armed: freed when the poll's completion arrives. */
    if (u->armed && !u->rearm)
        watch_cancel(u);
    return false;
}

static int dispatch(struct loop *l, struct io_uring_cqe *cqe)
{
    if (io_uring_cqe_get_data64(cqe) == CANCEL_TAG)
        return 0;
    struct uring_watch *u = io_uring_cqe_get_data(cqe);
    struct loop_watch *w = &u->w;
    int res = cqe->res;
    u->armed = false;
    if (w->dead) {
        loop_watch_free(w);
        return 0;
    }
    u->rearm = false;
    if (res == -ECANCELED) { /* cancelled for new events, or by the kernel */
        watch_arm(u);
        return 0;
    }
    uint32_t revents = res < 0 ? POLLERR : (uint32_t)res;
    w->cb(l, w->fd, revents, w->opaque);
    if (w->dead)
        loop_watch_free(w);
    else if (!u->armed)
        watch_arm(u);
    return 1;
}

static int uring_wait(struct loop *l, int64_t wait_us)
{
    struct io_uring *ring = ring_of(l);
    struct io_uring_cqe *cqe;
    int r;
    if (wait_us < 0) {
        r = io_uring_submit_and_wait(ring, 1);
        if (r >= 0)
            r = io_uring_peek_cqe(ring, &cqe);
    } else {
        struct __kernel_timespec ts = {.tv_sec = wait_us / 1000000,
                                       .tv_nsec = (wait_us % 1000000) * 1000};
        r = io_uring_submit_and_wait_timeout(ring, &cqe, 1, &ts, NULL);
    }
    if (r < 0 && r != -ETIME && r != -EINTR && r != -EAGAIN)
        return r;

    unsigned head, count = 0;
    int n = 0;
    /* Dispatch everything completed so far; callbacks may queue new SQEs. */
    io_uring_for_each_cqe(ring, head, cqe)
    {
        struct io_uring_cqe copy = *cqe;
        count++;
        io_uring_cq_advance(ring, 1);
        n += dispatch(l, &copy);
        if (count >= LOOP_ENTRIES)
            break;
    }
    io_uring_submit(ring);
    return n;
}

const struct loop_ops loop_uring_ops = {
    .name = "io_uring",
    .loop_size = sizeof(struct uring_loop),
    .watch_size = sizeof(struct uring_watch),
    .init = uring_init,
    .fini = uring_fini,
    .watch_add = uring_watch_add,
    .watch_update = uring_watch_update,
    .watch_remove = uring_watch_remove,
    .wait = uring_wait,
};
