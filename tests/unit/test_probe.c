/* test_probe.c: the readiness probe (qsd/base/probe.h) on real sockets: a
 * listener accepts, a full accept queue is -EAGAIN, a socket file nobody
 * listens on is refused, and nothing is followed: a symlink to a live
 * socket (as the last component or on the way) is -ELOOP, a non-socket is
 * -ENOTSOCK; a socket whose path is longer than sun_path is still probed. */
#include "qsd/base/probe.h"
#include "qsd/base/util.h"

#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <cmocka.h>

static char root[64];
static int rfd = -1;

static int setup(void **state)
{
    strcpy(root, "/tmp/test-probe-XXXXXX");
    if (!mkdtemp(root))
        return -1;
    rfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    return rfd < 0 ? -1 : 0;
}

static int teardown(void **state)
{
    close(rfd);
    return rm_rf(root);
}

/* A socket bound at rel beneath dir fd dfd (through /proc, so any length),
 * listening with backlog `backlog` (< 0: bound only). */
static int listener(int dfd, const char *rel, int backlog)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "/proc/self/fd/%d/%s", dfd, rel);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    if (backlog >= 0)
        assert_int_equal(listen(fd, backlog), 0);
    return fd;
}

static void test_accepts_and_refuses(void **state)
{
    int l = listener(rfd, "s.sock", 1);
    assert_int_equal(probe_socket_at(rfd, "s.sock"), 0);
    _cleanup_free_ char *abs = xasprintf("%s/s.sock", root);
    assert_int_equal(probe_socket(abs), 0);
    /* Backlog 1: two connections wait in the queue (nobody accepts), the
     * next is refused at once instead of waiting. */
    assert_int_equal(probe_socket_at(rfd, "s.sock"), -EAGAIN);
    close(l);
    assert_int_equal(probe_socket_at(rfd, "s.sock"), -ECONNREFUSED); /* file left */
    int b = listener(rfd, "bound.sock", -1);
    assert_int_equal(probe_socket_at(rfd, "bound.sock"), -ECONNREFUSED);
    close(b);
    assert_int_equal(probe_socket_at(rfd, "missing.sock"), -ENOENT);
}

static void test_nothing_followed(void **state)
{
    int l = listener(rfd, "live.sock", 8);
    assert_int_equal(probe_socket_at(rfd, "live.sock"), 0);
    assert_int_equal(symlinkat("live.sock", rfd, "link.sock"), 0);
    assert_int_equal(probe_socket_at(rfd, "link.sock"), -ELOOP);
    assert_int_equal(mkdirat(rfd, "d", 0700), 0);
    assert_int_equal(symlinkat(".", rfd, "d/up"), 0);
    assert_int_equal(probe_socket_at(rfd, "d/up/live.sock"), -ELOOP);
    assert_int_equal(probe_socket_at(rfd, "../x.sock"), -EXDEV);
    _cleanup_free_ char *abs_link = xasprintf("%s/link.sock", root);
    assert_int_equal(probe_socket(abs_link), -ELOOP);
    int f = openat(rfd, "plain", O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    assert_true(f >= 0);
    close(f);
    assert_int_equal(probe_socket_at(rfd, "plain"), -ENOTSOCK);
    close(l);
}

static void test_long_path(void **state)
{
    /* A path longer than sun_path (108 bytes): connect() by path could not
     * even name it; the probe goes through the descriptor. */
    static const char part[] = "dddddddddddddddddddddddddddddddddddddddd"; /* 40 */
    char rel[200] = "";
    for (int i = 0; i < 4; i++) {
        if (i)
            strcat(rel, "/");
        strcat(rel, part);
        assert_int_equal(mkdirat(rfd, rel, 0700), 0);
    }
    _cleanup_close_ int deep = openat(rfd, rel, O_PATH | O_DIRECTORY | O_CLOEXEC);
    assert_true(deep >= 0);
    int l = listener(deep, "s.sock", 4);
    strcat(rel, "/s.sock");
    assert_true(strlen(root) + 1 + strlen(rel) >= sizeof(((struct sockaddr_un *)0)->sun_path));
    assert_int_equal(probe_socket_at(rfd, rel), 0);
    close(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_accepts_and_refuses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nothing_followed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_long_path, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
