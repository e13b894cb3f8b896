/* SPDX-License-Identifier: Apache-2.0 */
/* init.h: the launcher as PID 1 of its PID namespace (init.c). */
#pragma once

/* If this process is PID 1, fork: PID 1 stays a minimal init (forwards
 * SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to the launcher,
 * reaps every process re-parented to it, exits with the launcher's status)
 * and never returns; the child, the launcher proper, returns 0.  Not PID 1:
 * returns 0 at once.  A negative errno if the fork failed.  Call it before
 * any thread or child exists. */
int init_front(void);
