/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/qsd.h: the supervisor of one qemu-storage-daemon (QSD) per volume.
 *
 *   struct qsd  a live QSD on a loop: start (bounded wait until every export
 *               socket accepts, qsd/base/probe.h; spawned in its own session and, when
 *               configured, its own cgroup), pidfd watch, restart on death
 *               on the same socket path (with backoff, then a crash-loop
 *               state), stop (QMP quit, SIGKILL after a bound, and a bound
 *               on that too), adopt a QSD left running by an earlier
 *               controller (recorded, or found by its monitor socket).
 *   sync        qsd_start_sync, qsd_stop_sync: the same on a private loop
 *               (the CLI, and qsd_stop_orphans for QSDs nobody wants).
 * What the QSD is given (options, paths, command line) is qsdopts.h, pure;
 * its directories, state file and the /proc scan are qsdrun.h; its log is
 * qsdlog.h.  This header includes the first two, so callers of the QSD need
 * only this one. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "qsd/base/loop.h"
#include "qsd/qemu/qsdopts.h"
#include "qsd/qemu/qsdrun.h"

struct qmp_sync;

struct qsd;
enum qsd_event { QSD_EV_READY, QSD_EV_DIED, QSD_EV_RESTARTED, QSD_EV_START_FAILED, QSD_EV_STOPPED,
                 QSD_EV_CRASH_LOOP };
typedef void (*qsd_event_cb)(struct qsd *q, enum qsd_event ev, const char *detail, void *opaque);
/* status 0 or negative errno; msg says what happened (may be NULL on success). */
typedef void (*qsd_done_cb)(struct qsd *q, int status, const char *msg, void *opaque);

/* cfg: qsdopts.h (the node's settings for every QSD). */
int qsd_new(struct loop *l, const struct qsd_config *cfg, const char *volume,
            const struct qsd_opts *opts, struct qsd **ret);
void qsd_free(struct qsd *q); /* does not stop the process */
const struct qsd_paths *qsd_get_paths(struct qsd *q);
const struct qsd_opts *qsd_get_opts(struct qsd *q);
const char *qsd_get_volume(struct qsd *q);
pid_t qsd_get_pid(struct qsd *q); /* the unit's head: the filter, or the QSD */
/* The qemu-storage-daemon process itself (the head's child when filtered),
 * for its I/O and CPU counters; 0 when there is none. */
pid_t qsd_get_qsd_pid(struct qsd *q);
bool qsd_running(struct qsd *q);
/* Died quickly several times in a row: retried only every 30 s. */
bool qsd_crash_looping(struct qsd *q);
/* "pid=N last_log=..." of its last unexpected exit, or NULL. */
const char *qsd_last_death(struct qsd *q);
/* Neither running nor on its way (never started, or stopped for good). */
bool qsd_idle(struct qsd *q);
unsigned qsd_restart_count(struct qsd *q);
/* Kill a running QSD that does not serve (SIGKILL by pidfd); reason goes
 * into the death's detail (QSD_EV_DIED, qsd_last_death).  Its exit is then
 * handled like any death: restarted when supervised.  -ESRCH when not
 * running, -EALREADY when already killed and not yet gone. */
int qsd_kill_hung(struct qsd *q, const char *reason);
/* Times qsd_kill_hung killed it. */
unsigned qsd_hung_kill_count(struct qsd *q);
void qsd_set_event_handler(struct qsd *q, qsd_event_cb cb, void *opaque);
/* Restart on death (true by default for started/adopted QSDs). */
void qsd_set_supervised(struct qsd *q, bool on);

/* Create the directories, write the state file (desired=running), spawn, and
 * call done when the export socket accepts (or on failure: the QSD's own
 * error message from its log is in msg). */
/* The next spawn (only) also exports the volume through FUSE on fd, a
 * /dev/fuse the caller has mounted (qsdopts.h fuse_fd); taken over (closed
 * after that spawn or by qsd_free). */
void qsd_set_fuse_fd(struct qsd *q, int fd);
int qsd_start(struct qsd *q, qsd_done_cb done, void *opaque);
/* Adopt the running QSD of this volume: the one recorded in the state file
 * if it is alive and really ours, else any process serving this volume's
 * QMP socket path (found in /proc: a starter killed before it recorded the
 * pid), whatever the recorded desired state; a second one is killed.  One
 * still starting is probed like a restart.  0: adopted; -ESRCH: none. */
int qsd_adopt(struct qsd *q);
/* Stop (qsd_stop_sync) every running QSD of cfg->run_dir for which keep()
 * says false; returns how many were found. */
int qsd_stop_orphans(const struct qsd_config *cfg,
                     bool (*keep)(const char *volume, pid_t pid, void *arg), void *arg);
/* Mark desired=stopped, ask QSD to quit over QMP, SIGKILL after the bound,
 * remove the socket and the metadata.  done is called when the process is
 * gone, or with -ETIMEDOUT when it is still there 5 s after SIGKILL (stuck in
 * the kernel; calling qsd_stop again kills and waits again). */
int qsd_stop(struct qsd *q, qsd_done_cb done, void *opaque);

/* Change the group that may connect (export directory, socket, metadata)
 * of a started or adopted QSD, and record it so restarts and adoption keep
 * it.  gid -1: root only. */
int qsd_set_socket_group(struct qsd *q, int gid);

/* Bound the QSD's log while it runs (a tenant can make its QSD log at will:
 * malformed vhost-user messages): past 1 MiB it is cut to its last lines.
 * 1 when it was cut.  Call it periodically. */
int qsd_log_trim(struct qsd *q);

/* Write the exports' metadata files (volume.json, through directory fds)
 * with the given size. */
int qsd_write_meta(struct qsd *q, uint64_t size);

/* Synchronous helpers for the CLI: run the async operation on a private loop.
 * qsd_start_sync with ret_qmp also returns a connection to the new QSD's
 * monitor (qmp_sync_close() it: the monitor serves one client at a time),
 * made before the readiness probe's connections are closed.  QSD 10.0.2
 * closes the socket of a vhost-user client that disconnects twice (libvhost-
 * user's vu_deinit, then the channel's finalize; seen with strace); the
 * second close hits whatever descriptor another QSD thread got that number
 * in between: a monitor connection accepted just after the probe hung up
 * ("QMP connection broken" in qsdctl export).  A monitor connection already
 * accepted while the probe's is open cannot have that number.  When the
 * monitor does not answer, the start fails and the QSD is killed.  Either
 * way the probe's hang-up is over (the QSD closed its side) when this
 * returns, and a start that failed leaves no process of its unit. */
int qsd_start_sync(const struct qsd_config *cfg, const char *volume, const struct qsd_opts *opts,
                   pid_t *ret_pid, struct qmp_sync **ret_qmp, char **ret_msg);
int qsd_stop_sync(const struct qsd_config *cfg, const char *volume, char **ret_msg);
