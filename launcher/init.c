/* SPDX-License-Identifier: Apache-2.0 */
/* init.c: a minimal init in front of the launcher when the launcher is PID 1
 * of its PID namespace, as in a VM pod without shareProcessNamespace.  See
 * init.h.
 *
 * Orphans are re-parented to PID 1: the QEMU processes libvirt's embedded
 * driver daemonizes (capability probes, the guest) and helpers that detach
 * (passt), and whatever a `kubectl exec` leaves behind.  Unreaped, they stay
 * zombies, and libvirt, which waits for a killed QEMU to vanish, then waits
 * for ever (deploy/README.md).  The launcher cannot reap them itself with
 * waitpid(-1): libvirt waits for the children it forks by pid
 * (virProcessWait), from its own threads, as cidata.c does, and a
 * waitpid(-1) in the same process would steal those statuses; nor can it
 * tell an adopted orphan from a child libvirt is about to wait for.  So PID 1
 * forks and stays behind as an init of a few lines, like tini: its only
 * children are the launcher and the orphans, none of which anybody else
 * waits for, so it reaps them all; the launcher and libvirt keep their own
 * children and statuses.  When the launcher exits, PID 1 exits with its
 * status (128 + the signal if it was killed); the kernel then kills what is
 * left in the namespace, as after any PID 1's exit. */
#include "init.h"
#include "qsd/base/log.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define COMP "init"

static const int forwarded[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

/* Reap every exited child; the launcher's exit status if it was one of them,
 * else -1. */
static int reap(pid_t launcher, unsigned *reaped)
{
    int status, ret = -1;
    pid_t p;
    while ((p = waitpid(-1, &status, WNOHANG)) > 0) {
        if (p == launcher)
            ret = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        else
            (*reaped)++;
    }
    return ret;
}

static _Noreturn void run_init(pid_t launcher, const sigset_t *set)
{
    unsigned reaped = 0;
    for (;;) {
        /* The timeout only bounds how long a lost SIGCHLD could go unseen. */
        siginfo_t si;
        struct timespec ts = {.tv_sec = 1};
        int sig = sigtimedwait(set, &si, &ts);
        if (sig > 0 && sig != SIGCHLD)
            kill(launcher, sig);
        int status = reap(launcher, &reaped);
        if (status >= 0) {
            log_info(COMP, "launcher exited", "status=%d orphans_reaped=%u", status, reaped);
            exit(status);
        }
    }
}

int init_front(void)
{
    if (getpid() != 1)
        return 0;
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    for (size_t i = 0; i < sizeof(forwarded) / sizeof(forwarded[0]); i++)
        sigaddset(&set, forwarded[i]);
    /* Blocked before the fork: a signal that arrives in between waits. */
    if (sigprocmask(SIG_BLOCK, &set, &old) < 0)
        return -errno;
    pid_t pid = fork();
    if (pid < 0) {
        int r = -errno;
        sigprocmask(SIG_SETMASK, &old, NULL);
        return r;
    }
    if (pid == 0) {
        sigprocmask(SIG_SETMASK, &old, NULL);
        return 0;
    }
    log_info(COMP, "pid 1: the launcher runs as a child, orphans are reaped", "launcher_pid=%d",
             (int)pid);
    run_init(pid, &set);
}
