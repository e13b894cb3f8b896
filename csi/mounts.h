/* SPDX-License-Identifier: Apache-2.0 */
/* mounts.h: the mounts the plugin makes on paths kubelet names.
 *
 * Owns: the kubelet root's descriptor (opened once at start: the only path
 * of the kubelet tree the plugin resolves normally), and every operation on
 * a target path (publications, bridges, hot-plug requests): created,
 * opened, mounted, unmounted and removed beneath that descriptor, one
 * component at a time, never following a symlink (fsat.h).  What pods get is
 * always a bind that is read-only, nosuid, nodev and noexec from the start;
 * whether the disk behind it is writable is decided by which export
 * directory is bound (qsd.h), not by the pod.  A target that is already a
 * mount is never mounted over.  A mount that is not reachable at its target
 * right after it was made (a rename raced it) is undone; every mount made
 * since start is tracked by a descriptor of the mount itself, so that
 * unmounting it works wherever a later rename moved it.
 *
 * Targets must have passed path_check_lexical (paths.h) first.  Functions
 * return 0 or a negative errno with a message in *ret_msg that names the
 * path; -ELOOP/-EXDEV mean a symlink or an escape was met on the way. */
#pragma once

#include <stdbool.h>

struct csi;

void mounts_open(struct csi *c);
void mounts_close(struct csi *c);

/* Create target's missing directories (0750) and bind src_fd (a directory
 * descriptor; O_PATH is enough) onto it read-only.  -EEXIST when target is
 * already the root of a mount. */
int mounts_bind(struct csi *c, int src_fd, const char *target, char **ret_msg);

/* A pod volume's publication (docs/pod-volumes.md): src_fd, the mounted
 * filesystem's root (nosuid, nodev) or, with device, the loop device's node
 * (nosuid, noexec; target is then a file, created 0600), bound onto
 * target, read-only when ro.  Tracked and checked like mounts_bind. */
int mounts_bind_pod(struct csi *c, int src_fd, const char *target, bool device, bool ro,
                    char **ret_msg);

/* Unmount everything stacked on target, never lazily (-EBUSY while in use
 * for 2 s: it waits, so a worker's); the directory stays (a staging path
 * is kubelet's).  Missing is success. */
int mounts_unmount(struct csi *c, const char *target, char **ret_msg);

/* 1 when target is the root of a mount, 0 when it is not or does not exist,
 * negative errno when it cannot be resolved safely. */
int mounts_is_mounted(struct csi *c, const char *target, char **ret_msg);

/* An O_PATH descriptor of the directory target. */
int mounts_open_target(struct csi *c, const char *target, int *ret_fd);

/* Unmount everything stacked on target and remove the directory.  Missing
 * is success. */
int mounts_unbind(struct csi *c, const char *target, char **ret_msg);

/* The part of path (under the kubelet root) that exists resolves beneath
 * the kubelet root without meeting a symlink.  -ELOOP/-EXDEV otherwise. */
int mounts_check(struct csi *c, const char *path, char **ret_msg);

/* Create target (an empty directory, no mount) beneath the kubelet root. */
int mounts_mkdir(struct csi *c, const char *target, char **ret_msg);

/* gRPC code for an error of the functions above: INVALID_ARGUMENT for a
 * symlink or escape, FAILED_PRECONDITION for an existing mount, INTERNAL
 * otherwise. */
int mounts_grpc_code(int err);
