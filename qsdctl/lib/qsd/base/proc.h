/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/proc.h: starting child processes, running helper programs (qemu-img) with
 * a bound, and process facts.
 *
 * proc_spawn() is the one way the project starts a child program (QSDs,
 * workers, helpers such as qemu-img, mkfs.vfat and mcopy) or worker
 * process.  Two forks stay outside it, neither a program started on
 * someone's behalf: the launcher as PID 1 splits itself in two (init.c, no
 * exec), and the vhost-user filter's head forks the QSD it fronts
 * (vufilter_main.c), applying only the QSD's seccomp profile there.
 * The child always starts from the same state (empty signal mask,
 * default signal actions, chosen stdio, optional session, umask, parent-death
 * signal and cgroups, then optional confinement: confine.h), then execs or
 * runs a function.  It never waits for
 * the child: an exec failure is left in a pipe, read once the child exited.
 *
 * proc_run() spawns, captures stdout and stderr (each bounded to 1 MiB) and
 * waits at most timeout_ms, then SIGKILLs the child.  It is for command-line
 * code paths and worker processes; it waits with poll(2). */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct confine;

struct proc_spawn {
    char *const *argv;        /* exec this (PATH searched)... */
    int (*fn)(void *arg);     /* ...or run this in the child, exit with its value */
    void *arg;
    int stdin_fd, stdout_fd, stderr_fd; /* -1: /dev/null */
    bool die_with_parent;     /* PR_SET_PDEATHSIG(SIGKILL): helpers, workers */
    bool new_session;         /* setsid(): daemons that outlive their starter */
    int umask;                /* -1: inherit */
    const int *join_fds;      /* cgroup.procs files the child joins before exec
                                 (argv only; a failure is its exec error) */
    size_t n_join;
    const struct confine *confine; /* applied last, just before exec or fn
                                      (confine.h); a failure is the exec
                                      error and the child exits 126 */
    char *const *envp;        /* argv only: the environment (NULL: the parent's) */
    const char *program_fd3;  /* a program (PATH searched) opened O_PATH before
                                 confinement and left at descriptor 3: the
                                 child execs it later (the vhost-user filter's
                                 head and its QSD), whatever it can see then */
    int keep_fd, keep_fd_at;  /* keep_fd >= 0: the child gets it at keep_fd_at
                                 (> 3, not close-on-exec): a pod volume's
                                 /dev/fuse for its QSD */
};
#define PROC_SPAWN_INIT                                                                         \
    {.stdin_fd = -1, .stdout_fd = -1, .stderr_fd = -1, .umask = -1, .keep_fd = -1}

/* Start a child.  *ret_pidfd: a pidfd of it (close-on-exec).  ret_exec_fd
 * (argv only, optional): read end of a close-on-exec pipe holding the exec
 * errno if exec failed; read it with proc_exec_error() after the child
 * exited (it never blocks).  A child whose exec failed exits 127. */
int proc_spawn(const struct proc_spawn *s, pid_t *ret_pid, int *ret_pidfd, int *ret_exec_fd);
/* The errno of a failed exec (0: exec succeeded or nothing to read). */
int proc_exec_error(int exec_fd);

struct proc_result {
    int exit_code;   /* exit status, or 128+signal */
    char *out;       /* captured stdout, NUL-terminated */
    char *err;       /* captured stderr, NUL-terminated */
};
void proc_result_clear(struct proc_result *r);

/* 0 when the program ran to completion (whatever its exit code); -ETIMEDOUT
 * when it was killed at the bound; -ENOENT when it could not be executed. */
int proc_run(char *const argv[], uint64_t timeout_ms, struct proc_result *ret);
/* The same with the environment envp (a full one: nothing is inherited). */
int proc_run_env(char *const argv[], char *const envp[], uint64_t timeout_ms,
                 struct proc_result *ret);
/* The same, calling tick(arg) about once a second while the program runs
 * (progress, a size bound); a negative return kills the program and is
 * returned. */
int proc_run_watch(char *const argv[], uint64_t timeout_ms, int (*tick)(void *arg), void *arg,
                   struct proc_result *ret);

/* proc_run with the child confined (confine.h) before exec: qemu-img on
 * images nobody vouches for.  A failure to confine is -errno of it. */
int proc_run_confined(char *const argv[], uint64_t timeout_ms, const struct confine *confine,
                      struct proc_result *ret);

/* Last non-empty line of a program's stderr, trimmed (for error messages). */
const char *proc_last_line(const char *text, char *buf, size_t len);

int pidfd_open_pid(pid_t pid);
int pidfd_signal(int pidfd, int sig);
/* Fields first..first+n-1 (numbered as in proc(5), first >= 4: numeric fields) of
 * /proc/PID/stat, as unsigned numbers. */
int proc_stat_fields(pid_t pid, int first, int n, uint64_t *ret);
/* Process start time (clock ticks since boot, field 22 of /proc/PID/stat). */
int proc_starttime(pid_t pid, uint64_t *ret);
/* Wait (at most timeout_ms) until no live process is left in process group
 * pgid (zombies count as gone).  0, or -ETIMEDOUT.  Only waits: a caller
 * that kills the group does so while the group's leader is its unreaped
 * child, so that the id names no other group. */
int proc_group_wait(pid_t pgid, uint64_t timeout_ms);
/* A process's I/O accounting (/proc/PID/io: bytes it made the storage
 * layer read and write, read/write system calls) and CPU time (user +
 * system, /proc/PID/stat). */
struct proc_io {
    uint64_t read_bytes, write_bytes, syscr, syscw;
    double cpu_seconds;
};
int proc_io(pid_t pid, struct proc_io *ret);
/* Read /proc/PID/cmdline with NULs replaced by spaces... kept as NUL-separated
 * with total length in *ret_len. */
int proc_cmdline(pid_t pid, char **ret, size_t *ret_len);
