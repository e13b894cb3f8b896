/* Unit tests for loop.c (timers, fd watches, removal inside callbacks) and
 * worker.c (blocking work in a child, results, deadlines). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <sys/socket.h>

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

static void run_for(struct loop *l, uint64_t ms)
{
    uint64_t end = now_ms() + ms;
    while (now_ms() < end)
        loop_run_once(l, 10);
}

static void test_timers_order_and_cancel(void **state)
{
    struct loop *l;
    assert_int_equal(loop_new(&l), 0);
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
    struct loop *l;
    assert_int_equal(loop_new(&l), 0);
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

static void test_watch_set_events(void **state)
{
    struct loop *l;
    assert_int_equal(loop_new(&l), 0);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    struct fctx c = {0};
    c.w = loop_watch_fd(l, sv[0], POLLIN, on_readable, &c);
    run_for(l, 10);
    /* Switch to POLLOUT (always ready): the callback starts firing. */
    loop_watch_set_events(c.w, POLLOUT);
    loop_run_once(l, 50);
    loop_run_once(l, 50);
    loop_watch_remove(c.w);
    run_for(l, 10);
    close(sv[0]);
    close(sv[1]);
    loop_free(l);
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

static void run_worker(worker_fn fn, void *arg, uint64_t timeout, struct wres *r)
{
    struct loop *l;
    assert_int_equal(loop_new(&l), 0);
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
    run_worker(work_ok, (void *)21, 5000, &r);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.value, 42);

    memset(&r, 0, sizeof(r));
    run_worker(work_fail, NULL, 5000, &r);
    assert_int_equal(r.status, -ENOSPC);
    assert_string_equal(r.msg, "qemu-img convert failed: no space");

    memset(&r, 0, sizeof(r));
    uint64_t t0 = now_ms();
    run_worker(work_hang, NULL, 200, &r);
    assert_int_equal(r.status, -ETIMEDOUT);
    assert_true(now_ms() - t0 < 3000);

    /* A timed-out child is gone (a zombie until reaped) when done runs:
     * nothing it does can land after its operation was reported. */
    memset(&r, 0, sizeof(r));
    int p[2];
    assert_int_equal(pipe(p), 0);
    struct loop *l;
    assert_int_equal(loop_new(&l), 0);
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
    run_worker(work_crash, NULL, 5000, &r);
    assert_int_equal(r.status, -EIO);
    assert_non_null(strstr(r.msg, "died"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_timers_order_and_cancel),
        cmocka_unit_test(test_fd_watch),
        cmocka_unit_test(test_watch_set_events),
        cmocka_unit_test(test_worker),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
