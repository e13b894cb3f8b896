/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for loop.c (timers, fd watches, removal inside callbacks,
 * revents), run once per backend (io_uring, epoll); the choice of backend
 * (QSD_CSI_LOOP, a seccomp filter refusing io_uring_setup as container
 * runtimes' default profiles do); and worker.c (blocking work in a child,
 * results, deadlines), on both backends too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "qsd/base/loop.h"
#include "qsd/base/util.h"
#include "qsd/base/worker.h"

struct tctx {
    char order[16];
    int n;
};

static void tick(struct loop *l, void *opaque)
{
    struct tctx *c = opaque;
    c->order[c->n++] = 'x';
}

static void tick_a(struct loop *l, void *o) { ((struct tctx *)o)->order[((struct tctx *)o)->n++] = 'a'; }
static void tick_b(struct loop *l, void *o) { ((struct tctx *)o)->order[((struct tctx *)o)->n++] = 'b'; }
static void tick_c(struct loop *l, void *o) { ((struct tctx *)o)->order[((struct tctx *)o)->n++] = 'c'; }

/* The backend a test runs on: its cmocka state ("io_uring" or "epoll"). */
static struct loop *new_loop(void **state)
{
    struct loop *l = NULL;
    assert_int_equal(loop_new_backend(&l, *state), 0);
    assert_string_equal(loop_backend(l), *state);
    return l;
}

static void run_for(struct loop *l, uint64_t ms)
{
    uint64_t end = now_ms() + ms;
    while (now_ms() < end)
        loop_run_once(l, 10);
}

static void test_timers_order_and_cancel(void **state)
{
    struct loop *l = new_loop(state);
    struct tctx c = {0};
    loop_timer_add(l, 30, tick_c, &c);
    loop_timer_add(l, 10, tick_a, &c);
    struct loop_timer *t = loop_timer_add(l, 20, tick, &c);
    loop_timer_add(l, 20, tick_b, &c);
    loop_timer_cancel(t);
    uint64_t t0 = now_ms();
    run_for(l, 80);
    assert_string_equal(c.order, "abc");
    assert_true(now_ms() - t0 >= 30);
    loop_free(l);
}

struct fctx {
    int reads;
    struct loop_watch *w;
    bool remove_in_cb;
};

static void on_readable(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    struct fctx *c = opaque;
    char b[64];
    if (read(fd, b, sizeof(b)) > 0)
        c->reads++;
    if (c->remove_in_cb) {
        loop_watch_remove(c->w);
        c->w = NULL;
    }
}

static void test_fd_watch(void **state)
{
    struct loop *l = new_loop(state);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    struct fctx c = {0};
    c.w = loop_watch_fd(l, sv[0], POLLIN, on_readable, &c);
    run_for(l, 20);
    assert_int_equal(c.reads, 0); /* nothing to read: no callback */
    assert_int_equal(write(sv[1], "a", 1), 1);
    run_for(l, 20);
    assert_int_equal(c.reads, 1);
    assert_int_equal(write(sv[1], "b", 1), 1);
    run_for(l, 20);
    assert_int_equal(c.reads, 2); /* re-armed after each callback */
    /* Removed from inside its own callback: no more calls, no leak. */
    c.remove_in_cb = true;
    assert_int_equal(write(sv[1], "c", 1), 1);
    run_for(l, 20);
    assert_int_equal(write(sv[1], "d", 1), 1);
    run_for(l, 20);
    assert_int_equal(c.reads, 3);
    /* Removed while armed in the kernel: freed on its cancellation. */
    struct fctx d = {0};
    d.w = loop_watch_fd(l, sv[0], POLLIN, on_readable, &d);
    run_for(l, 10);
    assert_int_equal(d.reads, 1); /* the "d" left unread above */
    loop_watch_remove(d.w);
    assert_int_equal(write(sv[1], "e", 1), 1);
    run_for(l, 20);
    assert_int_equal(d.reads, 1);
    close(sv[0]);
    close(sv[1]);
    loop_free(l);
}

struct rctx {
    int calls;
    uint32_t revents;
};

static void on_revents(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    struct rctx *c = opaque;
    c->calls++;
    c->revents |= revents;
}

static void test_watch_set_events(void **state)
{
    struct loop *l = new_loop(state);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    struct rctx c = {0};
    struct loop_watch *w = loop_watch_fd(l, sv[0], POLLIN, on_revents, &c);
    run_for(l, 10);
    assert_int_equal(c.calls, 0);
    /* Switch to POLLOUT (always ready): the callback fires each iteration
     * (level-triggered), with POLLOUT and without POLLIN. */
    loop_watch_set_events(w, POLLOUT);
    for (int i = 0; i < 5; i++) /* io_uring takes an iteration to re-arm */
        loop_run_once(l, 50);
    assert_true(c.calls >= 4);
    assert_true(c.revents & POLLOUT);
    assert_false(c.revents & POLLIN);
    /* Back to POLLIN with nothing to read: silent again. */
    loop_watch_set_events(w, POLLIN);
    run_for(l, 10);
    int calls = c.calls;
    run_for(l, 20);
    assert_int_equal(c.calls, calls);
    loop_watch_remove(w);
    run_for(l, 10);
    close(sv[0]);
    close(sv[1]);
    loop_free(l);
}

/* The peer's close: POLLHUP (with POLLIN: EOF is readable), level-triggered
 * until removed. */
static void test_hangup(void **state)
{
    struct loop *l = new_loop(state);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    struct rctx c = {0};
    struct loop_watch *w = loop_watch_fd(l, sv[0], POLLIN, on_revents, &c);
    close(sv[1]);
    assert_int_equal(loop_run_once(l, 1000), 1);
    assert_true(c.revents & POLLHUP);
    assert_int_equal(loop_run_once(l, 1000), 1);
    assert_int_equal(c.calls, 2);
    loop_watch_remove(w);
    run_for(l, 10);
    assert_int_equal(c.calls, 2);
    close(sv[0]);
    loop_free(l);
}

/* Two ready watches in one iteration, the first to run removes the other: the
 * other's callback does not run (and nothing touches freed memory: ASan). */
struct pair {
    struct loop_watch *w[2];
    int calls[2];
};

static struct pair g_pair;

static void on_pair_0(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    g_pair.calls[0]++;
    loop_watch_remove(g_pair.w[1]);
    g_pair.w[1] = NULL;
}

static void on_pair_1(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    g_pair.calls[1]++;
    loop_watch_remove(g_pair.w[0]);
    g_pair.w[0] = NULL;
}

static void test_remove_other_in_batch(void **state)
{
    struct loop *l = new_loop(state);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    memset(&g_pair, 0, sizeof(g_pair));
    /* Two watches of one fd (both always writable). */
    g_pair.w[0] = loop_watch_fd(l, sv[0], POLLOUT, on_pair_0, NULL);
    g_pair.w[1] = loop_watch_fd(l, sv[0], POLLOUT, on_pair_1, NULL);
    run_for(l, 30);
    /* Exactly one ran (once per iteration), the other never. */
    assert_true((g_pair.calls[0] > 0) != (g_pair.calls[1] > 0));
    loop_watch_remove(g_pair.w[0]);
    loop_watch_remove(g_pair.w[1]);
    close(sv[0]);
    close(sv[1]);
    loop_free(l);
}

/* A watch outlives its owner's close of the fd (the loop holds its own
 * reference): removing it afterwards is safe, and a new fd with the same
 * number is watched on its own. */
static void test_close_before_remove(void **state)
{
    struct loop *l = new_loop(state);
    int sv[2], sv2[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    struct rctx a = {0}, b = {0};
    struct loop_watch *wa = loop_watch_fd(l, sv[0], POLLIN, on_revents, &a);
    run_for(l, 10);
    int num = sv[0];
    close(sv[0]);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv2), 0);
    assert_int_equal(sv2[0], num); /* the number is reused */
    struct loop_watch *wb = loop_watch_fd(l, sv2[0], POLLIN, on_revents, &b);
    loop_watch_remove(wa);
    assert_int_equal(write(sv2[1], "x", 1), 1);
    run_for(l, 20);
    assert_true(b.calls > 0); /* removing wa did not remove wb */
    assert_int_equal(a.calls, 0);
    loop_watch_remove(wb);
    close(sv[1]), close(sv2[0]), close(sv2[1]);
    loop_free(l);
}

/* A regular file is always ready (poll(2)'s answer), on either backend. */
static void test_regular_file(void **state)
{
    struct loop *l = new_loop(state);
    char path[] = "/tmp/test_loop.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    struct rctx c = {0};
    struct loop_watch *w = loop_watch_fd(l, fd, POLLIN, on_revents, &c);
    assert_int_equal(loop_run_once(l, 1000), 1);
    assert_true(c.revents & POLLIN);
    loop_watch_remove(w);
    close(fd);
    loop_free(l);
}

/* ---- the choice of backend ---- */

static void test_backend_env(void **state)
{
    struct loop *l;
    assert_int_equal(setenv("QSD_CSI_LOOP", "epoll", 1), 0);
    assert_int_equal(loop_new(&l), 0);
    assert_string_equal(loop_backend(l), "epoll");
    loop_free(l);
    assert_int_equal(setenv("QSD_CSI_LOOP", "io_uring", 1), 0);
    assert_int_equal(loop_new(&l), 0);
    assert_string_equal(loop_backend(l), "io_uring");
    loop_free(l);
    assert_int_equal(setenv("QSD_CSI_LOOP", "kqueue", 1), 0);
    l = NULL;
    assert_int_equal(loop_new(&l), -EINVAL);
    assert_null(l);
    assert_int_equal(loop_new_backend(&l, "uring"), -EINVAL);
    assert_int_equal(setenv("QSD_CSI_LOOP", "", 1), 0);
    assert_int_equal(loop_new(&l), 0);
    assert_string_equal(loop_backend(l), "io_uring"); /* allowed here */
    loop_free(l);
    assert_int_equal(unsetenv("QSD_CSI_LOOP"), 0);
}

/* What a container runtime's default seccomp profile does to io_uring:
 * io_uring_setup fails with EPERM (containerd 2.x, Docker 25+, podman). */
static int refuse_io_uring(void)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW), /* another arch: not tested */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof(f) / sizeof(f[0]), .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return -errno;
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) < 0)
        return -errno;
    return 0;
}

/* In the child under the filter: exit code 0 if all is as expected, else the
 * step that failed. */
static int seccomp_child(void)
{
    if (refuse_io_uring() < 0)
        return 10;
    if (syscall(__NR_io_uring_setup, 4, &(char[120]){0}) != -1 || errno != EPERM)
        return 11; /* the filter does not refuse */
    unsetenv("QSD_CSI_LOOP");
    struct loop *l;
    if (loop_new_backend(&l, "io_uring") != -EPERM)
        return 12; /* io_uring asked for explicitly: the refusal is reported */
    if (loop_new(&l) < 0)
        return 13;
    if (strcmp(loop_backend(l), "epoll") != 0)
        return 14;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) < 0)
        return 15;
    struct fctx c = {0};
    struct tctx t = {0};
    c.w = loop_watch_fd(l, sv[0], POLLIN, on_readable, &c);
    loop_timer_add(l, 10, tick, &t);
    if (write(sv[1], "a", 1) != 1)
        return 16;
    uint64_t end = now_ms() + 2000;
    while ((c.reads < 1 || t.n < 1) && now_ms() < end)
        loop_run_once(l, 50);
    if (c.reads != 1 || t.n != 1)
        return 17;
    loop_watch_remove(c.w);
    loop_free(l);
    close(sv[0]), close(sv[1]);
    return 0;
}

static void test_seccomp_refuses_io_uring(void **state)
{
#ifndef __x86_64__
    skip();
#endif
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(seccomp_child());
    int status = -1;
    uint64_t end = now_ms() + 10000;
    pid_t r;
    while ((r = waitpid(pid, &status, WNOHANG)) == 0 && now_ms() < end)
        usleep(10000);
    if (r == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("the child under the seccomp filter hung");
    }
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* ---- worker ---- */

struct wres {
    bool done;
    int status;
    char msg[128];
    json_int_t value;
    char child_state; /* of the busy child when done ran ('Z' or 0: gone) */
};

static pid_t g_busy_pid;

static void on_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct wres *r = opaque;
    if (g_busy_pid) {
        char p[64];
        _cleanup_free_ char *st = NULL;
        snprintf(p, sizeof(p), "/proc/%d/stat", (int)g_busy_pid);
        if (read_file(p, 4096, &st, NULL) == 0 && strrchr(st, ')'))
            r->child_state = strrchr(st, ')')[2];
    }
    r->done = true;
    r->status = status;
    snprintf(r->msg, sizeof(r->msg), "%s", msg ? msg : "");
    r->value = json_integer_value(json_object_get(result, "value"));
}

static int work_ok(void *arg, char **ret_msg, json_t **ret_result)
{
    *ret_result = json_pack("{s:I}", "value", (json_int_t)(intptr_t)arg * 2);
    return 0;
}

static int work_fail(void *arg, char **ret_msg, json_t **ret_result)
{
    *ret_msg = xstrdup("qemu-img convert failed: no space");
    return -ENOSPC;
}

static int work_hang(void *arg, char **ret_msg, json_t **ret_result)
{
    sleep(30);
    return 0;
}

static int work_crash(void *arg, char **ret_msg, json_t **ret_result)
{
    _exit(3);
}

/* Busy, not sleeping: tells its pid through a pipe, then spins. */
static int work_busy(void *arg, char **ret_msg, json_t **ret_result)
{
    pid_t me = getpid();
    (void)!write((int)(intptr_t)arg, &me, sizeof(me));
    volatile int spin = 1;
    while (spin)
        ;
    return 0;
}

static void run_worker(void **state, worker_fn fn, void *arg, uint64_t timeout, struct wres *r)
{
    struct loop *l = new_loop(state);
    assert_int_equal(worker_start(l, fn, arg, timeout, on_done, r, NULL), 0);
    uint64_t end = now_ms() + 5000;
    while (!r->done && now_ms() < end)
        loop_run_once(l, 50);
    loop_free(l);
    assert_true(r->done);
}

static void test_worker(void **state)
{
    struct wres r = {0};
    run_worker(state, work_ok, (void *)21, 5000, &r);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.value, 42);

    memset(&r, 0, sizeof(r));
    run_worker(state, work_fail, NULL, 5000, &r);
    assert_int_equal(r.status, -ENOSPC);
    assert_string_equal(r.msg, "qemu-img convert failed: no space");

    memset(&r, 0, sizeof(r));
    uint64_t t0 = now_ms();
    run_worker(state, work_hang, NULL, 200, &r);
    assert_int_equal(r.status, -ETIMEDOUT);
    assert_true(now_ms() - t0 < 3000);

    /* A timed-out child is gone (a zombie until reaped) when done runs:
     * nothing it does can land after its operation was reported. */
    memset(&r, 0, sizeof(r));
    int p[2];
    assert_int_equal(pipe(p), 0);
    struct loop *l = new_loop(state);
    assert_int_equal(worker_start(l, work_busy, (void *)(intptr_t)p[1], 200, on_done, &r, NULL),
                     0);
    assert_int_equal(read(p[0], &g_busy_pid, sizeof(g_busy_pid)), (ssize_t)sizeof(g_busy_pid));
    uint64_t end = now_ms() + 5000;
    while (!r.done && now_ms() < end)
        loop_run_once(l, 50);
    loop_free(l);
    close(p[0]), close(p[1]);
    g_busy_pid = 0;
    assert_true(r.done);
    assert_int_equal(r.status, -ETIMEDOUT);
    assert_true(r.child_state == 'Z' || r.child_state == 0);

    memset(&r, 0, sizeof(r));
    run_worker(state, work_crash, NULL, 5000, &r);
    assert_int_equal(r.status, -EIO);
    assert_non_null(strstr(r.msg, "died"));
}

int main(void)
{
#define BOTH(t)                                                                              \
    {#t "/io_uring", t, NULL, NULL, "io_uring"}, {#t "/epoll", t, NULL, NULL, "epoll"}
    const struct CMUnitTest tests[] = {
        BOTH(test_timers_order_and_cancel),
        BOTH(test_fd_watch),
        BOTH(test_watch_set_events),
        BOTH(test_hangup),
        BOTH(test_remove_other_in_batch),
        BOTH(test_close_before_remove),
        BOTH(test_regular_file),
        BOTH(test_worker),
        cmocka_unit_test(test_backend_env),
        cmocka_unit_test(test_seccomp_refuses_io_uring),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
