/* proc.h: running helper programs (qemu-img) with a bound, and process facts.
 *
 * proc_run() forks, execs argv (PATH searched), captures stdout and stderr
 * (each bounded to 1 MiB) and waits at most timeout_ms, then SIGKILLs the
 * child.  It is for command-line code paths; it waits with poll(2). */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct proc_result {
    int exit_code;   /* exit status, or 128+signal */
    char *out;       /* captured stdout, NUL-terminated */
    char *err;       /* captured stderr, NUL-terminated */
};
void proc_result_clear(struct proc_result *r);

/* 0 when the program ran to completion (whatever its exit code); -ETIMEDOUT
 * when it was killed at the bound; -ENOENT when it could not be executed. */
int proc_run(char *const argv[], uint64_t timeout_ms, struct proc_result *ret);

/* Last non-empty line of a program's stderr, trimmed (for error messages). */
const char *proc_last_line(const char *text, char *buf, size_t len);

int pidfd_open_pid(pid_t pid);
int pidfd_signal(int pidfd, int sig);
/* Process start time (clock ticks since boot, field 22 of /proc/PID/stat). */
int proc_starttime(pid_t pid, uint64_t *ret);
/* Read /proc/PID/cmdline with NULs replaced by spaces... kept as NUL-separated
 * with total length in *ret_len. */
int proc_cmdline(pid_t pid, char **ret, size_t *ret_len);
