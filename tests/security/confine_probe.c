/* SPDX-License-Identifier: Apache-2.0 */
/* confine_probe.c: what a compromised QSD could do, tried from the QSD's own
 * context.  The probe enters the mount namespace of a live QSD (PID), takes
 * its uid and gid, and confines itself as the QSD was (confine_self: no
 * capabilities, no_new_privs, the QSD seccomp profile), then tries each
 * CHECK and prints one line per check:
 *   "<check> <target> ok|refused <detail>"
 * where ok means the action succeeded.  Checks:
 *   open PATH        open(2) read-only
 *   openrw PATH      open(2) read-write
 *   list DIR         opendir + readdir
 *   connect PATH     connect(2) to a unix socket
 *   call NAME        userfaultfd | ptrace | mount | unshare | bpf, in a child
 *                    ("refused" with the errno, or "killed" by a signal)
 * Run as root.  usage: qsd-confine-probe PID CHECK ARG [CHECK ARG...] */
#include "qsd/base/confine.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static int status_ids(int pid, uid_t *uid, gid_t *gid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int found = 0;
    while (fgets(line, sizeof(line), f)) {
        unsigned a;
        if (sscanf(line, "Uid: %u", &a) == 1)
            *uid = a, found++;
        else if (sscanf(line, "Gid: %u", &a) == 1)
            *gid = a, found++;
    }
    fclose(f);
    return found == 2 ? 0 : -1;
}

static void call(const char *name)
{
    pid_t c = fork();
    if (c == 0) {
        long r = -1;
        if (!strcmp(name, "userfaultfd"))
            r = syscall(SYS_userfaultfd, 0);
        else if (!strcmp(name, "ptrace"))
            r = syscall(SYS_ptrace, PTRACE_ATTACH, getppid(), 0, 0);
        else if (!strcmp(name, "mount"))
            r = syscall(SYS_mount, "none", "/", "tmpfs", 0, NULL);
        else if (!strcmp(name, "unshare"))
            r = syscall(SYS_unshare, CLONE_NEWUSER);
        else if (!strcmp(name, "bpf"))
            r = syscall(SYS_bpf, 0, NULL, 0);
        _exit(r < 0 ? (errno & 0x7f) : 0);
    }
    int st = 0;
    waitpid(c, &st, 0);
    if (WIFSIGNALED(st))
        printf("call %s refused killed-by-signal-%d\n", name, WTERMSIG(st));
    else if (WEXITSTATUS(st))
        printf("call %s refused %s\n", name, strerror(WEXITSTATUS(st)));
    else
        printf("call %s ok\n", name);
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc % 2 != 0) {
        fprintf(stderr, "usage: %s PID CHECK ARG [CHECK ARG...]\n", argv[0]);
        return 2;
    }
    int pid = atoi(argv[1]);
    uid_t uid;
    gid_t gid;
    if (status_ids(pid, &uid, &gid) < 0) {
        fprintf(stderr, "cannot read the ids of %d\n", pid);
        return 1;
    }
    char ns[64];
    snprintf(ns, sizeof(ns), "/proc/%d/ns/mnt", pid);
    int fd = open(ns, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNS) < 0 || chdir("/") < 0) {
        fprintf(stderr, "cannot enter the mount namespace of %d: %s\n", pid, strerror(errno));
        return 1;
    }
    close(fd);
    struct confine c = CONFINE_INIT;
    c.uid = uid;
    c.gid = gid;
    c.profile = CONFINE_PROFILE_QSD;
    int r = confine_self(&c);
    if (r < 0) {
        fprintf(stderr, "cannot confine: %s\n", strerror(-r));
        return 1;
    }
    printf("identity uid=%u gid=%u\n", (unsigned)getuid(), (unsigned)getgid());
    for (int i = 2; i + 1 < argc; i += 2) {
        const char *what = argv[i], *arg = argv[i + 1];
        if (!strcmp(what, "open") || !strcmp(what, "openrw")) {
            int f = open(arg, (what[4] ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NONBLOCK);
            printf("%s %s %s %s\n", what, arg, f >= 0 ? "ok" : "refused", f >= 0 ? "" : strerror(errno));
            if (f >= 0)
                close(f);
        } else if (!strcmp(what, "list")) {
            DIR *d = opendir(arg);
            int n = 0;
            if (d) {
                struct dirent *de;
                while ((de = readdir(d)))
                    n += de->d_name[0] != '.';
                closedir(d);
            }
            printf("list %s %s %d\n", arg, d ? "ok" : "refused", d ? n : errno);
        } else if (!strcmp(what, "connect")) {
            int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            struct sockaddr_un a = {.sun_family = AF_UNIX};
            snprintf(a.sun_path, sizeof(a.sun_path), "%s", arg);
            int cr = connect(s, (struct sockaddr *)&a, sizeof(a));
            printf("connect %s %s %s\n", arg, cr == 0 ? "ok" : "refused", cr == 0 ? "" : strerror(errno));
            close(s);
        } else if (!strcmp(what, "call")) {
            call(arg);
        } else {
            printf("%s %s unknown\n", what, arg);
        }
        fflush(stdout);
    }
    /* _exit: no atexit handlers (LeakSanitizer's leak check traces the
     * process, which the filter refuses). */
    _exit(0);
}
