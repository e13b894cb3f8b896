/* SPDX-License-Identifier: Apache-2.0 */
/* test_launcher_virt_thread.c: the libvirt call thread (virt_thread.h) with
 * calls that block on a pipe instead of libvirt (the thread's logic does not
 * depend on what the call does).  Checked: a normal reply; a running call
 * past its bound gets -ETIMEDOUT (started) at once and its real result
 * later (late), and is "stuck" in between; a call queued behind it is
 * dropped at its own bound and never runs; the queue is bounded (-EBUSY);
 * freeing waits for a running call (bounded) and delivers nothing more. */
#include "virt_thread.h"
#include "qsd/base/util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

static int gate[2]; /* a call "inside libvirt" waits for a byte here */
static atomic_int ran; /* calls that ran (counted on the thread) */

static int call_wait(virDomainPtr dom, const char *arg, char **ret_text)
{
    char c;
    ran++;
    if (read(gate[0], &c, 1) != 1)
        return -1;
    *ret_text = xstrdup(arg);
    return 0;
}

static int call_quick(virDomainPtr dom, const char *arg, char **ret_text)
{
    ran++;
    *ret_text = xstrdup(arg);
    return 0;
}

struct seen {
    int n;
    struct virt_reply last;
    char text[32];
};

static void on_done(const struct virt_reply *r, void *opaque)
{
    struct seen *s = opaque;
    s->n++;
    s->last = *r;
    s->last.error = NULL;
    snprintf(s->text, sizeof(s->text), "%s", r->text ? r->text : "");
    s->last.text = NULL;
}

/* Run the loop until cond or 5 s. */
#define RUN_UNTIL(l, cond)                                                                         \
    do {                                                                                           \
        uint64_t end_ = now_ms() + 5000;                                                           \
        while (!(cond) && now_ms() < end_)                                                         \
            loop_run_once(l, 20);                                                                  \
        assert_true(cond);                                                                         \
    } while (0)

static void open_gate(void)
{
    assert_int_equal(write(gate[1], "x", 1), 1);
}

static void test_reply(void **state)
{
    struct loop *l;
    struct virt_thread *t;
    assert_int_equal(loop_new(&l), 0);
    assert_int_equal(virt_thread_new(l, NULL, &t), 0);
    struct seen s = {0};
    assert_int_equal(virt_call(t, "quick", call_quick, "hello", 5000, on_done, &s), 0);
    RUN_UNTIL(l, s.n == 1);
    assert_int_equal(s.last.status, 0);
    assert_false(s.last.late);
    assert_string_equal(s.text, "hello");
    assert_null(virt_thread_stuck(t, NULL));
    assert_int_equal(virt_thread_free(t, 1000), 0);
    loop_free(l);
}

static void test_stuck_late_and_dropped(void **state)
{
    struct loop *l;
    struct virt_thread *t;
    assert_int_equal(loop_new(&l), 0);
    assert_int_equal(virt_thread_new(l, NULL, &t), 0);
    ran = 0;
    struct seen a = {0}, b = {0}, c = {0};
    assert_int_equal(virt_call(t, "attach volume=a", call_wait, "a", 50, on_done, &a), 0);
    assert_int_equal(virt_call(t, "quick b", call_quick, "b", 150, on_done, &b), 0);
    RUN_UNTIL(l, a.n == 1);
    assert_int_equal(a.last.status, -ETIMEDOUT);
    assert_true(a.last.started);
    assert_false(a.last.late);
    uint64_t ms = 0;
    assert_string_equal(virt_thread_stuck(t, &ms), "attach volume=a");
    /* Running since it left the queue (its bound counted from submission). */
    assert_true(ms < 5000);
    /* b waits behind a: dropped at its own bound, never run. */
    RUN_UNTIL(l, b.n == 1);
    assert_int_equal(b.last.status, -ETIMEDOUT);
    assert_false(b.last.started);
    assert_int_equal(ran, 1);
    /* a returns: its real result, marked late; nothing is stuck any more. */
    open_gate();
    RUN_UNTIL(l, a.n == 2);
    assert_int_equal(a.last.status, 0);
    assert_true(a.last.late);
    assert_string_equal(a.text, "a");
    assert_null(virt_thread_stuck(t, NULL));
    assert_int_equal(b.n, 1);
    /* The thread serves the next call. */
    assert_int_equal(virt_call(t, "quick c", call_quick, "c", 5000, on_done, &c), 0);
    RUN_UNTIL(l, c.n == 1);
    assert_int_equal(c.last.status, 0);
    assert_int_equal(ran, 2);
    assert_int_equal(virt_thread_free(t, 1000), 0);
    loop_free(l);
}

static void test_queue_bound(void **state)
{
    struct loop *l;
    struct virt_thread *t;
    assert_int_equal(loop_new(&l), 0);
    assert_int_equal(virt_thread_new(l, NULL, &t), 0);
    ran = 0;
    struct seen first = {0}, q[VIRT_QUEUE_MAX] = {{0}}, over = {0};
    assert_int_equal(virt_call(t, "wait", call_wait, "w", 5000, on_done, &first), 0);
    RUN_UNTIL(l, ran == 1); /* running, so no longer queued */
    for (int i = 0; i < VIRT_QUEUE_MAX; i++)
        assert_int_equal(virt_call(t, "quick", call_quick, "q", 5000, on_done, &q[i]), 0);
    assert_int_equal(virt_call(t, "one more", call_quick, "x", 5000, on_done, &over), -EBUSY);
    open_gate();
    RUN_UNTIL(l, q[VIRT_QUEUE_MAX - 1].n == 1);
    assert_int_equal(first.n, 1);
    assert_int_equal(first.last.status, 0);
    for (int i = 0; i < VIRT_QUEUE_MAX; i++)
        assert_int_equal(q[i].last.status, 0);
    assert_int_equal(over.n, 0);
    assert_int_equal(virt_thread_free(t, 1000), 0);
    loop_free(l);
}

static void *open_gate_later(void *arg)
{
    usleep(100 * 1000);
    open_gate();
    return NULL;
}

static void test_free_waits_bounded(void **state)
{
    struct loop *l;
    struct virt_thread *t;
    assert_int_equal(loop_new(&l), 0);
    assert_int_equal(virt_thread_new(l, NULL, &t), 0);
    ran = 0;
    struct seen a = {0}, b = {0};
    assert_int_equal(virt_call(t, "wait", call_wait, "a", 5000, on_done, &a), 0);
    assert_int_equal(virt_call(t, "queued", call_quick, "b", 5000, on_done, &b), 0);
    RUN_UNTIL(l, ran == 1);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, open_gate_later, NULL), 0);
    uint64_t t0 = now_ms();
    assert_int_equal(virt_thread_free(t, 5000), 0); /* returns once a is back */
    assert_true(now_ms() - t0 < 5000);
    pthread_join(th, NULL);
    assert_int_equal(ran, 1); /* b was dropped, never ran */
    assert_int_equal(a.n, 0);
    assert_int_equal(b.n, 0);
    loop_free(l);
}

int main(void)
{
    if (pipe(gate) < 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reply),
        cmocka_unit_test(test_stuck_late_and_dropped),
        cmocka_unit_test(test_queue_bound),
        cmocka_unit_test(test_free_waits_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
