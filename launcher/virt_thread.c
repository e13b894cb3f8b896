/* SPDX-License-Identifier: Apache-2.0 */
/* virt_thread.c: see virt_thread.h. */
#include "virt_thread.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"

#include <libvirt/virterror.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <time.h>

#define COMP "libvirt"

enum call_state { C_QUEUED, C_RUNNING, C_FINISHED };

struct vcall {
    struct virt_thread *t;
    char *what;
    virt_fn fn;
    char *arg;
    virt_done done;
    void *opaque;
    struct loop_timer *timer; /* the deadline; NULL once fired */
    bool overdue;             /* done already got -ETIMEDOUT (started) */
    /* Under t->mu: */
    enum call_state state;
    uint64_t started_ms;
    /* Set by the thread before it finishes the call: */
    int status;
    char *error, *text;
    uint64_t ms;
    struct vcall *next;
};

struct virt_thread {
    struct loop *loop;
    virDomainPtr dom;
    int efd;
    struct loop_watch *watch;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    /* Under mu: */
    struct vcall *queue, **queue_tail;
    size_t queued;
    struct vcall *finished; /* in any order */
    struct vcall *running;
    bool quit;
    /* Loop side: the running call that passed its bound, if any. */
    struct vcall *stuck;
};

static void vcall_free(struct vcall *c)
{
    if (!c)
        return;
    free(c->what);
    free(c->arg);
    free(c->error);
    free(c->text);
    free(c);
}

static void *thread_main(void *opaque)
{
    struct virt_thread *t = opaque;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->queue && !t->quit)
            pthread_cond_wait(&t->cond, &t->mu);
        if (t->quit)
            break;
        struct vcall *c = t->queue;
        t->queue = c->next;
        if (!t->queue)
            t->queue_tail = &t->queue;
        t->queued--;
        c->next = NULL;
        c->state = C_RUNNING;
        c->started_ms = now_ms();
        t->running = c;
        pthread_mutex_unlock(&t->mu);

        char *text = NULL;
        int r = c->fn(t->dom, c->arg, &text);
        c->ms = now_ms() - c->started_ms;
        c->text = text;
        if (r < 0) {
            const char *m = virGetLastErrorMessage();
            c->status = -EIO;
            c->error = xstrdup(m ? m : "unknown libvirt error");
        }

        pthread_mutex_lock(&t->mu);
        c->state = C_FINISHED;
        t->running = NULL;
        c->next = t->finished;
        t->finished = c;
        uint64_t one = 1;
        ssize_t n = write(t->efd, &one, sizeof(one)); /* cannot fill: counter */
        (void)n;
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

static void deliver(struct vcall *c)
{
    struct virt_reply r = {.status = c->status, .error = c->error, .text = c->text,
                           .started = true, .late = c->overdue, .ms = c->ms};
    c->done(&r, c->opaque);
}

static void on_finished(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    struct virt_thread *t = opaque;
    uint64_t v;
    ssize_t n = read(fd, &v, sizeof(v));
    (void)n;
    pthread_mutex_lock(&t->mu);
    struct vcall *list = t->finished;
    t->finished = NULL;
    pthread_mutex_unlock(&t->mu);
    while (list) {
        struct vcall *c = list;
        list = c->next;
        if (c->timer)
            loop_timer_cancel(c->timer);
        c->timer = NULL;
        if (t->stuck == c)
            t->stuck = NULL;
        deliver(c);
        vcall_free(c);
    }
}

static void on_deadline(struct loop *l, void *opaque)
{
    struct vcall *c = opaque;
    struct virt_thread *t = c->t;
    c->timer = NULL;
    pthread_mutex_lock(&t->mu);
    enum call_state st = c->state;
    if (st == C_QUEUED) {
        for (struct vcall **p = &t->queue; *p; p = &(*p)->next)
            if (*p == c) {
                *p = c->next;
                break;
            }
        t->queue_tail = &t->queue;
        while (*t->queue_tail)
            t->queue_tail = &(*t->queue_tail)->next;
        t->queued--;
    }
    uint64_t running_ms = st == C_RUNNING ? now_ms() - c->started_ms : 0;
    pthread_mutex_unlock(&t->mu);
    if (st == C_FINISHED)
        return; /* its reply is on the way: delivered as an ordinary one */
    struct virt_reply r = {.status = -ETIMEDOUT, .started = st == C_RUNNING, .ms = running_ms};
    if (st == C_QUEUED) {
        c->done(&r, c->opaque);
        vcall_free(c);
        return;
    }
    c->overdue = true;
    t->stuck = c;
    c->done(&r, c->opaque);
}

int virt_thread_new(struct loop *l, virDomainPtr dom, struct virt_thread **ret)
{
    struct virt_thread *t = xcalloc(1, sizeof(*t));
    t->loop = l;
    t->dom = dom;
    t->queue_tail = &t->queue;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cond, NULL);
    t->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->efd < 0) {
        int e = errno;
        pthread_cond_destroy(&t->cond);
        pthread_mutex_destroy(&t->mu);
        free(t);
        return -e;
    }
    int e = pthread_create(&t->thread, NULL, thread_main, t);
    if (e != 0) {
        close(t->efd);
        pthread_cond_destroy(&t->cond);
        pthread_mutex_destroy(&t->mu);
        free(t);
        return -e;
    }
    t->watch = loop_watch_fd(l, t->efd, POLLIN, on_finished, t);
    *ret = t;
    return 0;
}

int virt_call(struct virt_thread *t, const char *what, virt_fn fn, const char *arg,
              uint64_t timeout_ms, virt_done done, void *opaque)
{
    pthread_mutex_lock(&t->mu);
    bool full = t->queued >= VIRT_QUEUE_MAX;
    pthread_mutex_unlock(&t->mu);
    if (full)
        return -EBUSY;
    struct vcall *c = xcalloc(1, sizeof(*c));
    c->t = t;
    c->what = xstrdup(what);
    c->fn = fn;
    c->arg = arg ? xstrdup(arg) : NULL;
    c->done = done;
    c->opaque = opaque;
    c->timer = loop_timer_add(t->loop, timeout_ms, on_deadline, c);
    pthread_mutex_lock(&t->mu);
    c->state = C_QUEUED;
    *t->queue_tail = c;
    t->queue_tail = &c->next;
    t->queued++;
    pthread_cond_signal(&t->cond);
    pthread_mutex_unlock(&t->mu);
    return 0;
}

const char *virt_thread_stuck(const struct virt_thread *t, uint64_t *ret_ms)
{
    if (!t || !t->stuck)
        return NULL;
    if (ret_ms) /* started_ms no longer changes once the call runs */
        *ret_ms = now_ms() - t->stuck->started_ms;
    return t->stuck->what;
}

int virt_thread_free(struct virt_thread *t, unsigned join_ms)
{
    if (!t)
        return 0;
    loop_watch_remove(t->watch);
    t->watch = NULL;
    pthread_mutex_lock(&t->mu);
    t->quit = true;
    struct vcall *queued = t->queue;
    t->queue = NULL;
    t->queue_tail = &t->queue;
    t->queued = 0;
    struct vcall *running = t->running;
    _cleanup_free_ char *what = running ? xstrdup(running->what) : NULL;
    pthread_cond_signal(&t->cond);
    pthread_mutex_unlock(&t->mu);
    while (queued) {
        struct vcall *c = queued;
        queued = c->next;
        if (c->timer)
            loop_timer_cancel(c->timer);
        vcall_free(c);
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += join_ms / 1000;
    until.tv_nsec += (long)(join_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    if (pthread_timedjoin_np(t->thread, NULL, &until) != 0) {
        log_error(COMP, "call still inside libvirt at exit, not waiting for it",
                  "call=\"%s\" waited_ms=%u", what ? what : "-", join_ms);
        return -ETIMEDOUT;
    }
    /* The thread is gone: whatever it finished was not delivered. */
    while (t->finished) {
        struct vcall *c = t->finished;
        t->finished = c->next;
        if (c->timer)
            loop_timer_cancel(c->timer);
        vcall_free(c);
    }
    /* A stuck call that never came back through the eventfd was freed just
     * above (it is on the finished list once the thread ended). */
    close(t->efd);
    pthread_cond_destroy(&t->cond);
    pthread_mutex_destroy(&t->mu);
    free(t);
    return 0;
}
