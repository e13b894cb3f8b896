/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/qsdrun.h: a volume's QSD runtime, on disk and in /proc.
 *
 * Under the run directory (docs/runtime-layout.md; paths from qsdopts.h):
 * the export directories exports/<vol> and exports-ro/<vol>, handled through
 * directory fds beneath the run directory, nothing in them followed
 * (fsat.h); the private ctl/<vol> with the state file qsd.json (the options,
 * the pid and its start time, so a recycled pid is never adopted, and the
 * desired state) and the exports' metadata volume.json.  The state file and
 * volume.json are replaced atomically but never fsync'ed: they describe
 * processes, which a crash of the machine ends too, and they are written on
 * the caller's event loop.  In /proc: the scan that finds every running QSD
 * unit (the QSD, or the filter head in front of it) of a run directory by
 * the monitor socket its command line names, recorded or not (adoption,
 * orphans).  The supervisor (qsd.h) is the one that starts and stops. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "qsd/qemu/qsdopts.h"

/* ---- the state file (ctl/<vol>/qsd.json) ---- */
int qsd_state_write(const struct qsd_paths *p, const char *volume, const struct qsd_opts *o,
                    bool running, pid_t pid, uint64_t starttime);
/* Read the state file of a volume (NULL-safe).  ret_desired_running tells the
 * desired state; ret_pid and ret_starttime the recorded process. */
int qsd_read_state(const char *state_path, struct qsd_opts *ret_opts, bool *ret_desired_running,
                   pid_t *ret_pid, uint64_t *ret_starttime);
/* Is pid alive, started at starttime, and a QSD serving this qmp path? */
bool qsd_pid_is_ours(pid_t pid, uint64_t starttime, const char *qmp_path);

/* ---- running units, found in /proc ---- */
struct qsd_found {
    pid_t pid;            /* the oldest unit serving the volume's monitor, or 0 */
    uint64_t starttime;
    pid_t *extra;         /* the others (never wanted) */
    size_t n_extra;
};
void qsd_find_units(const char *run_dir, const char *volume, struct qsd_found *ret);
void qsd_found_clear(struct qsd_found *f);
/* The volumes (malloc'd array of malloc'd names, each once) with a running
 * unit under run_dir for which keep() says false; returns their number. */
size_t qsd_orphan_volumes(const char *run_dir,
                          bool (*keep)(const char *volume, pid_t pid, void *arg), void *arg,
                          char ***ret_vols);

/* The vhost-user filter every export is served through (docs/security.md):
 * explicit (a flag) if given, else $QSD_VHOST_FILTER, else qsd-vhost-filter
 * beside the running executable.  "none" sets *ret NULL (tenants then talk to
 * the QSD directly: for measurements and debugging only).  -ENOENT with a
 * message when nothing is found or the file is not executable. */
int qsd_filter_resolve(const char *explicit, char **ret, char **ret_msg);

/* ---- directories ---- */
/* Make ctl/<vol> (0700) and the export directories (0750, group
 * o->socket_gid) with the names the QSD and the plugin use free (anything
 * else there is moved aside), and ctl/<vol>/rbd.conf of an RBD volume. */
int qsd_runtime_prepare(const char *run_dir, const char *volume, const struct qsd_opts *o);
/* Open an export directory of volume beneath run_dir without following
 * symlinks (fsat.h): ro selects exports-ro/.  O_PATH descriptor. */
int qsd_export_dir_open(const char *run_dir, const char *volume, bool ro, int *ret_fd);
/* Call fn with each export directory of the volume (one when read_only),
 * opened by qsd_export_dir_open; the first error is returned. */
int qsd_each_export_dir(const struct qsd_paths *p, const char *volume, bool read_only,
                        int (*fn)(int dfd, bool ro, void *arg), void *arg);
/* Unlink names (NULL-terminated) in each export directory. */
int qsd_export_unlink(const struct qsd_paths *p, const char *volume, bool read_only,
                      const char *const *names);
/* Remove what a volume's QSD leaves under run_dir: both export directories
 * (only the names the QSD and the plugin create there, never recursively)
 * and the private control directory. */
int qsd_remove_runtime(const char *run_dir, const char *volume);
/* Write the exports' metadata files (volume.json) with the given size. */
int qsd_meta_write(const struct qsd_paths *p, const char *volume, const struct qsd_opts *o,
                   uint64_t size);
