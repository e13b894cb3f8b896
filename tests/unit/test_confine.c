/* SPDX-License-Identifier: Apache-2.0 */
/* test_confine.c: the confinement of processes that handle tenants' input
 * (confine.h), in forked children: each seccomp profile refuses or kills
 * what it must (ptrace and mount killed with SIGSYS, userfaultfd EPERM, an
 * unlisted call ENOSYS, clone with a namespace flag killed) and lets through
 * what the program needs (the gate's profile: no open, no exec);
 * confine_self drops to another uid with every
 * capability set empty, no_new_privs and seccomp mode 2, and in its mount
 * namespace the host is read-only, a hidden directory is empty and a
 * writable one beneath it is writable.  Root only (skipped otherwise). */
#include "qsd/base/confine.h"
#include "qsd/base/util.h"

#include <fcntl.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <cmocka.h>

/* Run fn in a child; its wait status. */
static int in_child(int (*fn)(void *), void *arg)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(fn(arg));
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return status;
}

static int status_field(const char *name, char *buf, size_t len)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    size_t n = strlen(name);
    int r = -1;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, name, n) == 0 && line[n] == ':') {
            snprintf(buf, len, "%s", line + n + 1 + strspn(line + n + 1, " \t"));
            buf[strcspn(buf, "\n")] = '\0';
            r = 0;
        }
    }
    fclose(f);
    return r;
}

static const enum confine_profile PROFILES[] = {CONFINE_PROFILE_QSD, CONFINE_PROFILE_FILTER,
                                                CONFINE_PROFILE_IMAGE, CONFINE_PROFILE_GATE};

struct call {
    enum confine_profile profile;
    int what;
};

enum { DO_GETPID, DO_PTRACE, DO_MOUNT, DO_UFFD, DO_UNLISTED, DO_CLONE_NS, DO_KEYCTL, DO_BPF,
       DO_OPEN_EXEC };

static int apply_and_call(void *arg)
{
    const struct call *c = arg;
    if (confine_seccomp(c->profile) < 0)
        return 100;
    long r;
    switch (c->what) {
    case DO_GETPID:
        return syscall(SYS_getpid) == getpid() ? 0 : 1;
    case DO_PTRACE:
        r = syscall(SYS_ptrace, PTRACE_TRACEME, 0, 0, 0);
        return 2;
    case DO_MOUNT:
        r = syscall(SYS_mount, "none", "/mnt", "tmpfs", 0, NULL);
        return 2;
    case DO_KEYCTL:
        r = syscall(SYS_keyctl, 0, 0, 0, 0, 0);
        return 2;
    case DO_BPF:
        r = syscall(SYS_bpf, 0, NULL, 0);
        return 2;
    case DO_UFFD:
        r = syscall(SYS_userfaultfd, 0);
        return r < 0 && errno == EPERM ? 0 : 3;
    case DO_UNLISTED:
        r = syscall(SYS_chown, "/nonexistent", 0, 0); /* in no profile */
        return r < 0 && errno == ENOSYS ? 0 : 4;
    case DO_OPEN_EXEC: /* the gate's profile: no file opened, nothing executed */
        if (syscall(SYS_openat, AT_FDCWD, "/", O_RDONLY | O_CLOEXEC) >= 0 || errno != ENOSYS)
            return 6;
        r = syscall(SYS_execve, "/bin/true", (char *[]){"true", NULL}, (char *[]){NULL});
        return r < 0 && errno == ENOSYS ? 0 : 7;
    case DO_CLONE_NS:
        r = syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
        if (r == 0)
            _exit(0);
        return 5;
    }
    (void)r;
    return 99;
}

static void test_profiles(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_SIZE(PROFILES); i++) {
        struct call c = {PROFILES[i], DO_GETPID};
        int st = in_child(apply_and_call, &c);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
        c.what = DO_UFFD;
        st = in_child(apply_and_call, &c);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
        c.what = DO_UNLISTED;
        st = in_child(apply_and_call, &c);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
        int killed[] = {DO_PTRACE, DO_MOUNT, DO_KEYCTL, DO_BPF, DO_CLONE_NS};
        for (size_t k = 0; k < ARRAY_SIZE(killed); k++) {
            c.what = killed[k];
            st = in_child(apply_and_call, &c);
            if (!WIFSIGNALED(st))
                fail_msg("profile %d call %d: not killed (status 0x%x)", (int)PROFILES[i],
                         killed[k], st);
            assert_int_equal(WTERMSIG(st), SIGSYS);
        }
    }
    struct call g = {CONFINE_PROFILE_GATE, DO_OPEN_EXEC};
    int st = in_child(apply_and_call, &g);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_int_equal(confine_seccomp((enum confine_profile)42), -EINVAL);
}

static char hidden_dir[64], writable_dir[128];

static int confined(void *arg)
{
    (void)arg;
    const char *const writable[] = {writable_dir, NULL};
    const char *const hidden[] = {hidden_dir, "/root", NULL};
    struct confine c = CONFINE_INIT;
    c.uid = 65534;
    c.gid = 65534;
    c.mount_ns = true;
    c.writable = writable;
    c.hidden = hidden;
    c.rlimit_nofile = 256;
    c.profile = CONFINE_PROFILE_QSD;
    int r = confine_self(&c);
    if (r < 0)
        return 10;
    if (getuid() != 65534 || geteuid() != 65534 || getgid() != 65534 || getegid() != 65534)
        return 11;
    char v[128];
    const char *zero[] = {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"};
    for (size_t i = 0; i < ARRAY_SIZE(zero); i++)
        if (status_field(zero[i], v, sizeof(v)) < 0 || strcmp(v, "0000000000000000") != 0)
            return 12;
    if (status_field("NoNewPrivs", v, sizeof(v)) < 0 || strcmp(v, "1") != 0)
        return 13;
    if (status_field("Seccomp", v, sizeof(v)) < 0 || strcmp(v, "2") != 0)
        return 14;
    if (status_field("Groups", v, sizeof(v)) < 0 || v[0] != '\0')
        return 15;
    /* The hidden directory is an empty tmpfs except for the writable
     * path's mount point; what was there is gone. */
    char p[256];
    snprintf(p, sizeof(p), "%s/secret", hidden_dir);
    if (open(p, O_RDONLY | O_CLOEXEC) >= 0 || errno != ENOENT)
        return 16;
    /* Writable where asked, read-only elsewhere (even where the mode lets us). */
    snprintf(p, sizeof(p), "%s/new", writable_dir);
    int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return 17;
    close(fd);
    snprintf(p, sizeof(p), "%s/open/new", hidden_dir);
    if (open("/tmp/.confine-test-ro", O_WRONLY | O_CREAT | O_CLOEXEC, 0600) >= 0)
        return 18;
    if (open("/root/.bashrc", O_RDONLY | O_CLOEXEC) >= 0)
        return 19;
    return 0;
}

static void test_confine_self(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip();
    strcpy(hidden_dir, "/tmp/test-confine-XXXXXX");
    assert_non_null(mkdtemp(hidden_dir));
    chmod(hidden_dir, 0777);
    char p[256];
    snprintf(p, sizeof(p), "%s/secret", hidden_dir);
    int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    assert_true(fd >= 0);
    close(fd);
    snprintf(writable_dir, sizeof(writable_dir), "%s/open", hidden_dir);
    assert_int_equal(mkdir(writable_dir, 0777), 0);
    chmod(writable_dir, 0777);
    int st = in_child(confined, NULL);
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", hidden_dir);
    snprintf(p, sizeof(p), "%s/new", writable_dir);
    bool made = access(p, F_OK) == 0;
    assert_int_equal(system(cmd), 0);
    if (!WIFEXITED(st))
        fail_msg("confined child died: status 0x%x", st);
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_true(made); /* written through the namespace's writable bind */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_profiles),
        cmocka_unit_test(test_confine_self),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
