/* SPDX-License-Identifier: Apache-2.0 */
/* barrier.h: the instant of a group snapshot.  The processes that consume
 * a set of vhost-user sockets (the peers of the connections the vhost-user
 * filter, or a QSD, accepted on them: a VM's QEMU) are found through the
 * kernel's unix socket table (NETLINK_SOCK_DIAG: the accepted sockets whose
 * file is the export socket, and their peers, in every network namespace a
 * process is in: an accepted socket lives in its connector's, a VM pod's)
 * and /proc/PID/fd; they are
 * stopped (SIGSTOP by pidfd, then waited for, bounded, until every thread
 * is stopped) and continued.  Stopped, a consumer neither submits a request
 * nor sees a completion, so what its disks hold at any moment while it is
 * stopped is one cut of its I/O (docs/node-operations.md "Group
 * snapshots").
 *
 * A journal (DIR/NAME.json: pid and start time of each process) is written
 * before the first stop and removed after the last continue, so a plugin
 * killed in between continues them at its next start (barrier_recover),
 * only when the pid still names the same process (its start time). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct consumer {
    pid_t pid;
    uint64_t starttime; /* /proc/PID/stat field 22 */
    size_t member;      /* the socket (index) it was found on */
    int pidfd;
    bool already;       /* stopped by someone else when found: left alone */
    bool stopped;       /* SIGSTOP sent */
};

/* The distinct processes holding the peer of a connection accepted on one
 * of sockets[0..n) (missing sockets have none), never this process nor
 * pid 1.  *ret is malloc'd (pidfd -1 until barrier_stop).  One found
 * stopped already (a debugger's, an operator's) is marked so: neither
 * journalled nor signalled, so never continued by us. */
int barrier_find(const char *const *sockets, size_t n, struct consumer **ret, size_t *ret_n,
                 char **ret_msg);
/* Write DIR/NAME.json durably (before stopping), remove it (after). */
int barrier_journal(const char *dir, const char *name, const struct consumer *cs, size_t n,
                    char **ret_msg);
void barrier_journal_remove(const char *dir, const char *name);
/* Stop every consumer and wait (at most timeout_ms in all) until all their
 * threads are stopped.  On failure *ret_failed is the index of the one
 * that did not stop (or could not be signalled), and the caller continues
 * them all (barrier_cont). */
int barrier_stop(struct consumer *cs, size_t n, unsigned timeout_ms, size_t *ret_failed,
                 char **ret_msg);
/* SIGCONT each one stopped; close the pidfds. */
void barrier_cont(struct consumer *cs, size_t n);
/* Start-up: continue the processes of every journal in dir (when their
 * start time still matches), remove the journals.  Returns how many. */
int barrier_recover(const char *dir);
