/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/qsdlog.h: the log of a volume's QSD (ctl/<vol>/qsd.log).
 *
 * The QSD writes into a pipe, never into a file (qsdlog.c says why); a
 * struct qsdlog on the caller's loop moves what the pipe holds into the file
 * and keeps the file under 1 MiB.  After a plugin restart the new loop reads
 * the same pipe again through /proc/PID/fd/2 (qsdlog_reopen).  Each spawn
 * writes a marker first, so qsdlog_tail finds the current process's last
 * words (the start-failure message).  Nothing here blocks. */
#pragma once

#include <stddef.h>
#include <sys/types.h>

#include "qsd/base/loop.h"

#define QSDLOG_SPAWN_MARK "=== qsd-csi: spawning qemu-storage-daemon ===\n"

struct qsdlog {
    struct loop *loop;
    char *path;               /* ctl/<vol>/qsd.log */
    int pipe;                 /* read end of the QSD's stdout/stderr, or -1 */
    struct loop_watch *watch;
};
void qsdlog_init(struct qsdlog *lg, struct loop *l, const char *path);
void qsdlog_clear(struct qsdlog *lg); /* qsdlog_stop, and the path freed */
/* Read fd (a pipe's non-blocking read end, taken) from now on; a previous
 * pipe is closed. */
void qsdlog_watch(struct qsdlog *lg, int fd);
/* Watch the stderr pipe of a running (adopted) QSD, if it is a pipe. */
void qsdlog_reopen(struct qsdlog *lg, pid_t pid);
/* Move what the pipe holds now into the file (a dead QSD's last words);
 * at end of file the pipe is closed. */
void qsdlog_drain(struct qsdlog *lg);
void qsdlog_stop(struct qsdlog *lg); /* no more reading; the pipe closed */

/* Append to the file (created 0600, never through a symlink), trimmed past
 * its bound. */
void qsdlog_append(const char *path, const char *buf, size_t n);
void qsdlog_mark_spawn(const char *path);
/* Past 1 MiB, cut the file to its last lines; 1 when it was cut. */
int qsdlog_trim(const char *path);
/* The last line the current QSD logged (after the last spawn marker) that
 * is not its filter head's, at most 511 bytes; malloc'd, never NULL. */
char *qsdlog_tail(const char *path);
