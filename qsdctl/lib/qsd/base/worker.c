/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/worker.c: see worker.h. */
#include "qsd/base/worker.h"
#include "qsd/base/proc.h"
#include "qsd/base/util.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define WORKER_MAX_REPLY (1u << 20)

struct worker {
    struct loop *loop;
    pid_t pid;
    int pidfd, pipefd;
    struct loop_watch *pid_watch, *pipe_watch;
    struct loop_timer *timer;
    char *buf;
    size_t len;
    bool pipe_eof, exited, timed_out, kill_expired;
    worker_done done;
    void *opaque;
};

/* Killed workers not reaped yet (a child stuck in the kernel, e.g. fsync on
 * a dead disk, dies only when it leaves it): reaped without waiting, at the
 * next worker event.  Fixed-size: nothing to free at exit. */
static int g_unreaped[64];
static size_t g_n_unreaped;

static bool reaped(int pidfd)
{
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    return waitid(P_PIDFD, (id_t)pidfd, &si, WEXITED | WNOHANG) < 0 || si.si_pid != 0;
}

static void reap_pending(void)
{
    for (size_t i = 0; i < g_n_unreaped;) {
        if (reaped(g_unreaped[i])) {
            close(g_unreaped[i]);
            g_unreaped[i] = g_unreaped[--g_n_unreaped];
        } else {
            i++;
        }
    }
}

static void worker_free(struct worker *w)
{
    loop_watch_remove(w->pid_watch);
    loop_watch_remove(w->pipe_watch);
    loop_timer_cancel(w->timer);
    if (w->pidfd >= 0) {
        if (!w->exited) {
            pidfd_signal(w->pidfd, SIGKILL);
            if (!reaped(w->pidfd) && g_n_unreaped < ARRAY_SIZE(g_unreaped)) {
                g_unreaped[g_n_unreaped++] = w->pidfd;
                w->pidfd = -1;
            }
        }
        if (w->pidfd >= 0)
            close(w->pidfd); /* a zombie left (table full) goes with the program */
    }
    reap_pending();
    if (w->pipefd >= 0)
        close(w->pipefd);
    free(w->buf);
    free(w);
}

/* After a timeout's SIGKILL, how long the child may take to go before the
 * operation is reported anyway (a child stuck in the kernel). */
#define KILL_WAIT_MS 5000

static void maybe_finish(struct worker *w)
{
    /* A timed-out child is reported only once it is gone (or the bound
     * after SIGKILL passed): a late rename of its would land after done. */
    if (w->timed_out ? !(w->exited || w->kill_expired) : !(w->exited && w->pipe_eof))
        return;
    int status = -EIO;
    const char *msg = NULL;
    json_t *reply = NULL, *result = NULL;
    if (w->timed_out) {
        status = -ETIMEDOUT;
        msg = "operation did not finish within its time limit";
    } else {
        reply = w->len ? json_loadb(w->buf, w->len, 0, NULL) : NULL;
        json_int_t st = 0;
        const char *m = NULL;
        if (reply && json_unpack(reply, "{s:I, s?s, s?o}", "status", &st, "msg", &m, "result",
                                 &result) == 0) {
            status = (int)st;
            msg = m;
        } else {
            msg = "worker process died without reporting a result";
        }
    }
    worker_done done = w->done;
    void *opaque = w->opaque;
    w->done = NULL;
    if (done)
        done(status, msg, result, opaque);
    json_decref(reply);
    worker_free(w);
}

static void on_pipe(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    struct worker *w = opaque;
    char tmp[8192];
    ssize_t n = read(fd, tmp, sizeof(tmp));
    if (n > 0) {
        size_t keep = MIN((size_t)n, WORKER_MAX_REPLY - w->len);
        w->buf = xrealloc(w->buf, w->len + keep + 1);
        memcpy(w->buf + w->len, tmp, keep);
        w->len += keep;
        return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    w->pipe_eof = true;
    loop_watch_remove(w->pipe_watch);
    w->pipe_watch = NULL;
    maybe_finish(w);
}

static void on_exit_(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    struct worker *w = opaque;
    reaped(w->pidfd);
    w->exited = true;
    loop_watch_remove(w->pid_watch);
    w->pid_watch = NULL;
    maybe_finish(w);
}

static void on_timeout(struct loop *l, void *opaque)
{
    struct worker *w = opaque;
    w->timer = NULL;
    if (w->timed_out) {
        w->kill_expired = true;
    } else {
        w->timed_out = true;
        pidfd_signal(w->pidfd, SIGKILL);
        w->timer = loop_timer_add(l, KILL_WAIT_MS, on_timeout, w);
    }
    maybe_finish(w); /* worker_free reaps the child, or parks it */
}

struct child {
    worker_fn fn;
    void *arg;
    int fd; /* write end of the reply pipe */
};

/* In the worker process: close the sockets inherited from the parent.  A
 * copy of a connection the parent holds keeps it open after the parent
 * closes it: a QSD monitor serves one client at a time, so a worker holding
 * the parent's (closed) QMP connection would lock every later client out,
 * itself included, and a kept copy of a CSI client's connection would
 * outlive the parent's answer.  Workers open what they need themselves. */
static void close_inherited_sockets(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return;
    int self = dirfd(d);
    struct dirent *de;
    while ((de = readdir(d))) {
        char *end;
        long fd = strtol(de->d_name, &end, 10);
        struct stat st;
        if (*end || fd <= STDERR_FILENO || fd == self)
            continue;
        if (fstat((int)fd, &st) == 0 && S_ISSOCK(st.st_mode))
            close((int)fd);
    }
    closedir(d);
}

/* In the worker process: run fn, write its reply as JSON. */
static int child_main(void *opaque)
{
    struct child *c = opaque;
    close_inherited_sockets();
    char *msg = NULL;
    json_t *result = NULL;
    int r = c->fn(c->arg, &msg, &result);
    json_t *reply = json_pack("{s:i, s:s*, s:o*}", "status", r, "msg", msg, "result", result);
    char *s = json_dumps(reply, JSON_COMPACT);
    if (s)
        write_all(c->fd, s, strlen(s));
    return 0;
}

int worker_start(struct loop *l, worker_fn fn, void *arg, uint64_t timeout_ms, worker_done done,
                 void *opaque, struct worker **ret)
{
    reap_pending();
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return -errno;
    /* The worker dies with the program that started it (kill -9 included):
     * its result would have nobody to go to. */
    struct child c = {fn, arg, p[1]};
    struct proc_spawn sp = PROC_SPAWN_INIT;
    sp.fn = child_main;
    sp.arg = &c;
    sp.die_with_parent = true;
    sp.stderr_fd = STDERR_FILENO; /* its log lines (progress) go where the parent's go */
    pid_t pid;
    int pidfd;
    int r = proc_spawn(&sp, &pid, &pidfd, NULL);
    close(p[1]);
    if (r < 0) {
        close(p[0]);
        return r;
    }
    struct worker *w = xcalloc(1, sizeof(*w));
    w->loop = l;
    w->pid = pid;
    w->pipefd = p[0];
    w->pidfd = pidfd;
    w->done = done;
    w->opaque = opaque;
    fcntl(w->pipefd, F_SETFL, O_NONBLOCK);
    w->pipe_watch = loop_watch_fd(l, w->pipefd, POLLIN, on_pipe, w);
    w->pid_watch = loop_watch_fd(l, w->pidfd, POLLIN, on_exit_, w);
    w->timer = loop_timer_add(l, timeout_ms, on_timeout, w);
    if (ret)
        *ret = w;
    return 0;
}

void worker_cancel(struct worker *w)
{
    if (!w)
        return;
    w->done = NULL;
    worker_free(w);
}
