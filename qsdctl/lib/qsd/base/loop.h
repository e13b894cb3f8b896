/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/loop.h: the single-threaded event loop, on io_uring (liburing) or,
 * where io_uring is refused (container runtimes' default seccomp profiles), on
 * epoll: same semantics either way (loop.c).
 *
 * The API is deliberately as small as redis's ae.h: watch an fd for readiness,
 * arm a one-shot timer, run.  A child process is watched through its pidfd
 * (readable when the process exits), so "children" are just fd watches.
 * Nothing in callbacks may block: they do non-blocking I/O and return.
 *
 * Ownership: a watch or timer belongs to its creator until removed; removing
 * from inside its own callback is allowed.  loop_free() releases everything. */
#pragma once

#include <poll.h>
#include <stdbool.h>
#include <stdint.h>

struct loop;
struct loop_watch;
struct loop_timer;

typedef void (*loop_fd_cb)(struct loop *l, int fd, uint32_t revents, void *opaque);
typedef void (*loop_timer_cb)(struct loop *l, void *opaque);

/* The environment variable that forces a backend ("io_uring" or "epoll"). */
#define LOOP_BACKEND_ENV "QSD_CSI_LOOP"

/* A loop on io_uring, or on epoll if io_uring_setup fails with EPERM, EACCES
 * or ENOSYS; $QSD_CSI_LOOP, if set and not empty, names the backend instead
 * (-EINVAL if it names none). */
int loop_new(struct loop **ret);
/* The same with the backend named by backend (NULL or "": chosen as above,
 * without looking at the environment). */
int loop_new_backend(struct loop **ret, const char *backend);
/* "io_uring" or "epoll". */
const char *loop_backend(struct loop *l);
void loop_free(struct loop *l);

/* Watch fd for events (POLLIN, POLLOUT...).  The callback runs each time the
 * fd is ready, until loop_watch_remove().  revents may include POLLERR/POLLHUP. */
struct loop_watch *loop_watch_fd(struct loop *l, int fd, uint32_t events, loop_fd_cb cb,
                                 void *opaque);
void loop_watch_set_events(struct loop_watch *w, uint32_t events);
/* Stop watching.  Does not close the fd.  NULL is accepted. */
void loop_watch_remove(struct loop_watch *w);

/* One-shot timer firing after ms milliseconds. */
struct loop_timer *loop_timer_add(struct loop *l, uint64_t ms, loop_timer_cb cb, void *opaque);
/* Cancel a pending timer (NULL accepted).  Must not be called after it fired. */
void loop_timer_cancel(struct loop_timer *t);

/* Run one iteration: wait at most timeout_ms (-1: until the next timer or
 * event) and dispatch what is ready.  Returns the number of callbacks run or a
 * negative errno. */
int loop_run_once(struct loop *l, int timeout_ms);
/* Run until loop_stop() is called.  Returns 0 or a negative errno. */
int loop_run(struct loop *l);
void loop_stop(struct loop *l);
bool loop_stopping(struct loop *l);
