/* SPDX-License-Identifier: Apache-2.0 */
/* test_fsat.c: directory-fd file operations (fsat.h) against the hostile
 * cases they exist for: symlinks at every component, a FIFO or a symlink at
 * the name being written, escapes with "..", and read-only binds that are
 * read-only at once.  Mount cases run in a private mount namespace (root
 * only; skipped otherwise, with the reason).  Also the readiness probe built
 * on fsat_open (probe.h), on real sockets: a listener accepts, a full accept
 * queue is -EAGAIN, a socket file nobody listens on is refused, nothing is
 * followed (a symlink to a live socket, last or on the way, is -ELOOP), a
 * non-socket is -ENOTSOCK, a path longer than sun_path is still probed. */
#include "qsd/base/fsat.h"
#include "qsd/base/probe.h"
#include "qsd/base/util.h"

#include <fcntl.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <cmocka.h>

static char root[64];
static int rfd = -1;

static int setup(void **state)
{
    strcpy(root, "/tmp/test-fsat-XXXXXX");
    if (!mkdtemp(root))
        return -1;
    rfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    return rfd < 0 ? -1 : 0;
}

static int teardown(void **state)
{
    close(rfd);
    _cleanup_free_ char *cmd = xasprintf("umount -R %s/* 2>/dev/null; rm -rf %s", root, root);
    return system(cmd) == 0 ? 0 : -1;
}

static char *at(const char *rel) { return xasprintf("%s/%s", root, rel); }

static void test_rel(void **state)
{
    assert_string_equal(fsat_rel("/r", "/r/a/b"), "a/b");
    assert_null(fsat_rel("/r", "/r"));
    assert_null(fsat_rel("/r", "/r/"));
    assert_null(fsat_rel("/r", "/rx/a"));
    assert_string_equal(fsat_rel("/", "/a"), "a");
    assert_null(fsat_rel("/", "/"));
}

static void test_mkdirs_refuses_symlink_component(void **state)
{
    _cleanup_free_ char *outside = at("outside"), *link = at("k/link");
    assert_int_equal(mkdir(outside, 0700), 0);
    assert_int_equal(fsat_mkdirs(rfd, "k", 0750, NULL), 0);
    assert_int_equal(symlink(outside, link), 0);
    int fd = -1;
    assert_int_equal(fsat_mkdirs(rfd, "k/link/a/b", 0750, &fd), -ELOOP);
    _cleanup_free_ char *made = at("outside/a");
    struct stat st;
    assert_int_not_equal(stat(made, &st), 0); /* nothing created through the link */
    assert_int_equal(fsat_mkdirs(rfd, "k/real/a/b", 0750, &fd), 0);
    assert_true(fd >= 0);
    close(fd);
    /* ".." cannot leave the root */
    assert_int_equal(fsat_open(rfd, "k/../../etc", O_PATH | O_DIRECTORY, &fd), -EXDEV);
}

static void test_write_atomic_replaces_hostile_names(void **state)
{
    _cleanup_close_ int dfd = -1;
    assert_int_equal(fsat_mkdirs(rfd, "w", 0750, &dfd), 0);
    _cleanup_free_ char *decoy = at("decoy"), *fifo = at("w/fifo"), *lnk = at("w/link");
    _cleanup_free_ char *dir = at("w/dir");
    assert_int_equal(write_file_atomic(decoy, "secret", 6, 0600), 0);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(symlink(decoy, lnk), 0);
    _cleanup_free_ char *edir = at("w/edir"), *inner = at("w/dir/x");
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(mkdir(inner, 0700), 0);
    assert_int_equal(mkdir(edir, 0700), 0);
    /* a FIFO is replaced, not opened (opening it would block) */
    assert_int_equal(fsat_write_atomic(dfd, "fifo", "x", 1, 0640, 1234), 0);
    /* a symlink is replaced; its target is untouched */
    assert_int_equal(fsat_write_atomic(dfd, "link", "new", 3, 0640, 1234), 0);
    struct stat st;
    assert_int_equal(lstat(lnk, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_gid, 1234);
    assert_int_equal(st.st_mode & 07777, 0640);
    assert_int_equal(stat(decoy, &st), 0);
    assert_int_equal(st.st_gid, 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    _cleanup_free_ char *data = NULL;
    assert_int_equal(read_file(decoy, 64, &data, NULL), 0);
    assert_string_equal(data, "secret");
    /* a non-empty directory is left alone; an empty one is replaced */
    assert_int_equal(fsat_write_atomic(dfd, "dir", "x", 1, 0640, -1), -EISDIR);
    assert_int_equal(fsat_write_atomic(dfd, "edir", "x", 1, 0640, -1), 0);
    assert_int_equal(lstat(edir, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(fsat_unlink(dfd, "edir"), 0);
    assert_int_equal(fsat_unlink(dfd, "dir"), -ENOTEMPTY);
    assert_int_equal(fsat_unlink(dfd, "missing"), 0);
    /* no temporary file is left behind */
    _cleanup_free_ char *cmd = xasprintf("test $(ls -A %s/w | wc -l) -eq 3", root);
    assert_int_equal(system(cmd), 0);
}

/* What a kill -9 inside fsat_write_* leaves (".tmp-" and 16 hex digits) is
 * removed; nothing else is, whatever it looks like. */
static void test_remove_tmp_only_leftovers(void **state)
{
    _cleanup_close_ int dfd = -1;
    assert_int_equal(fsat_mkdirs(rfd, "t", 0700, &dfd), 0);
    _cleanup_free_ char *decoy = at("decoy3");
    assert_int_equal(write_file_atomic(decoy, "x", 1, 0600), 0);
    const char *left[] = {".tmp-0123456789abcdef", ".tmp-fedcba9876543210"};
    const char *kept[] = {"a.json", ".tmp-0123", ".tmp-0123456789abcdef0", ".tmp-0123456789ABCDEF",
                          "x.tmp-0123456789abcdef"};
    for (size_t i = 0; i < 2; i++)
        assert_int_equal(fsat_write_replace(dfd, left[i], "x", 1, 0600, -1), 0);
    for (size_t i = 0; i < 5; i++)
        assert_int_equal(fsat_write_replace(dfd, kept[i], "x", 1, 0600, -1), 0);
    assert_int_equal(mkdirat(dfd, ".tmp-00000000000000aa", 0700), 0);          /* not a file */
    assert_int_equal(symlinkat(decoy, dfd, ".tmp-00000000000000bb"), 0);         /* nor this */
    assert_int_equal(fsat_remove_tmp(dfd), 2);
    struct stat st;
    for (size_t i = 0; i < 2; i++)
        assert_int_equal(fstatat(dfd, left[i], &st, AT_SYMLINK_NOFOLLOW), -1);
    for (size_t i = 0; i < 5; i++)
        assert_int_equal(fstatat(dfd, kept[i], &st, AT_SYMLINK_NOFOLLOW), 0);
    assert_int_equal(fstatat(dfd, ".tmp-00000000000000aa", &st, AT_SYMLINK_NOFOLLOW), 0);
    assert_int_equal(fstatat(dfd, ".tmp-00000000000000bb", &st, AT_SYMLINK_NOFOLLOW), 0);
    assert_int_equal(stat(decoy, &st), 0);
    assert_int_equal(fsat_remove_tmp(dfd), 0);
}

static void test_chown_mode_refuses_symlink(void **state)
{
    _cleanup_close_ int dfd = -1;
    assert_int_equal(fsat_mkdirs(rfd, "c", 0750, &dfd), 0);
    _cleanup_free_ char *decoy = at("decoy2"), *lnk = at("c/link"), *f = at("c/file");
    assert_int_equal(write_file_atomic(decoy, "x", 1, 0600), 0);
    assert_int_equal(symlink(decoy, lnk), 0);
    assert_int_equal(fsat_chown_mode(dfd, "link", 4321, 0660), -ELOOP);
    struct stat st;
    assert_int_equal(stat(decoy, &st), 0);
    assert_int_equal(st.st_gid, 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(write_file_atomic(f, "x", 1, 0600), 0);
    assert_int_equal(fsat_chown_mode(dfd, "file", 4321, 0640), 0);
    assert_int_equal(stat(f, &st), 0);
    assert_int_equal(st.st_gid, 4321);
    assert_int_equal(st.st_mode & 07777, 0640);
    assert_int_equal(fsat_chown_mode(dfd, "missing", 1, 0600), -ENOENT);
}

static void test_bind_ro_and_unmount(void **state)
{
    /* The host's slave: nothing made here leaks out, and the host's
     * unmounts reach this namespace (a private copy would keep another
     * test's filesystem mounted while this process lives). */
    if (geteuid() != 0 || unshare(CLONE_NEWNS) < 0 ||
        mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0)
        skip(); /* needs root and a mount namespace of its own */
    /* descriptors opened before unshare() name the old namespace's mounts */
    close(rfd);
    rfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    _cleanup_close_ int src = -1, tgt = -1;
    assert_int_equal(fsat_mkdirs(rfd, "src", 0750, &src), 0);
    assert_int_equal(fsat_mkdirs(rfd, "a/target", 0750, &tgt), 0);
    assert_int_equal(fsat_is_mount_root(tgt), 0);
    assert_int_equal(fsat_bind(src, tgt, FSAT_BIND_RO), 0);
    _cleanup_close_ int t2 = -1;
    assert_int_equal(fsat_open(rfd, "a/target", O_PATH | O_DIRECTORY, &t2), 0);
    assert_int_equal(fsat_is_mount_root(t2), 1);
    _cleanup_free_ char *f = at("a/target/x");
    assert_true(open(f, O_CREAT | O_WRONLY, 0600) < 0);
    assert_int_equal(errno, EROFS);
    /* two stacked mounts are both removed, then the directory */
    assert_int_equal(fsat_bind(src, t2, 0), 0);
    assert_int_equal(fsat_unmount_rmdir(rfd, "a/target"), 0);
    _cleanup_free_ char *t = at("a/target");
    struct stat st;
    assert_int_not_equal(lstat(t, &st), 0);
    assert_int_equal(fsat_unmount_rmdir(rfd, "a/target"), 0); /* idempotent */
    /* a symlinked parent: nothing is done */
    _cleanup_free_ char *lnk = at("l");
    assert_int_equal(symlink(root, lnk), 0);
    assert_int_equal(fsat_unmount_rmdir(rfd, "l/src"), -ELOOP);
}

static void test_remove_dir_known_names_only(void **state)
{
    _cleanup_close_ int dfd = -1;
    assert_int_equal(fsat_mkdirs(rfd, "e/x", 0750, &dfd), 0);
    assert_int_equal(fsat_write_atomic(dfd, "volume.json", "{}", 2, 0640, -1), 0);
    static const char *const names[] = {"volume.json", "vhost.sock", NULL};
    assert_int_equal(fsat_remove_dir(rfd, "e/x", names), 0);
    assert_int_equal(fsat_mkdirs(rfd, "e/y/deep", 0750, NULL), 0);
    assert_int_equal(fsat_remove_dir(rfd, "e/y", names), -ENOTEMPTY);
    assert_int_equal(fsat_remove_dir(rfd, "e/missing", names), 0);
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

static void test_probe_accepts_and_refuses(void **state)
{
    int l = listener(rfd, "s.sock", 1);
    assert_int_equal(probe_socket_at(rfd, "s.sock"), 0);
    _cleanup_free_ char *abs = at("s.sock");
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

static void test_probe_follows_nothing(void **state)
{
    int l = listener(rfd, "live.sock", 8);
    assert_int_equal(probe_socket_at(rfd, "live.sock"), 0);
    assert_int_equal(symlinkat("live.sock", rfd, "link.sock"), 0);
    assert_int_equal(probe_socket_at(rfd, "link.sock"), -ELOOP);
    assert_int_equal(mkdirat(rfd, "d", 0700), 0);
    assert_int_equal(symlinkat(".", rfd, "d/up"), 0);
    assert_int_equal(probe_socket_at(rfd, "d/up/live.sock"), -ELOOP);
    assert_int_equal(probe_socket_at(rfd, "../x.sock"), -EXDEV);
    _cleanup_free_ char *abs_link = at("link.sock");
    assert_int_equal(probe_socket(abs_link), -ELOOP);
    int f = openat(rfd, "plain", O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    assert_true(f >= 0);
    close(f);
    assert_int_equal(probe_socket_at(rfd, "plain"), -ENOTSOCK);
    close(l);
}

static void test_probe_long_path(void **state)
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
        cmocka_unit_test(test_rel),
        cmocka_unit_test_setup_teardown(test_mkdirs_refuses_symlink_component, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_atomic_replaces_hostile_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove_tmp_only_leftovers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chown_mode_refuses_symlink, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove_dir_known_names_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bind_ro_and_unmount, setup, teardown),
        cmocka_unit_test_setup_teardown(test_probe_accepts_and_refuses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_probe_follows_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_probe_long_path, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
