/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/loop_backend.h: the interface between loop.c (the API of loop.h,
 * timers, stopping, the choice of backend) and the two fd-readiness backends,
 * loop_uring.c (io_uring) and loop_epoll.c (epoll).  Internal to loop*.c.
 *
 * loop.c allocates a loop of ops->loop_size bytes and a watch of
 * ops->watch_size bytes (zeroed, the common part first), keeps every watch on
 * the loop's list and frees a watch with loop_watch_free(); a backend keeps its
 * own state after the common part and decides when a removed watch may be
 * freed (never while the kernel or the current batch may still name it). */
#pragma once

#include "qsd/base/loop.h"

#include <stddef.h>

struct loop_ops;

struct loop {
    const struct loop_ops *ops;
    struct loop_watch *watches; /* all watches, removed ones until freed */
    struct loop_timer *timers;  /* sorted by deadline */
    bool stop;
};

struct loop_watch {
    struct loop *loop;
    int fd;
    uint32_t events;
    loop_fd_cb cb;
    void *opaque;
    bool dead; /* removed by the owner: no more callbacks; freed by the backend */
    struct loop_watch *next, *prev;
};

struct loop_ops {
    const char *name;
    size_t loop_size, watch_size;
    /* Set up the backend's part of a zeroed loop.  0 or a negative errno. */
    int (*init)(struct loop *l);
    /* Release the backend's resources (the watches are freed after it). */
    void (*fini)(struct loop *l);
    /* Start watching a new watch (already on the list). */
    void (*watch_add)(struct loop_watch *w);
    /* w->events changed. */
    void (*watch_update)(struct loop_watch *w);
    /* w->dead was just set: stop watching.  True: loop.c may free w now. */
    bool (*watch_remove)(struct loop_watch *w);
    /* Wait at most wait_us (-1: no limit) for readiness and run the ready
     * watches' callbacks.  Returns the number of callbacks run or a negative
     * errno (EINTR is not an error). */
    int (*wait)(struct loop *l, int64_t wait_us);
};

extern const struct loop_ops loop_uring_ops, loop_epoll_ops;

/* Unlink w from its loop's list and free it. */
void loop_watch_free(struct loop_watch *w);
