/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/fsat.h: filesystem operations through directory file descriptors.
 *
 * Owns: the rule that the privileged plugin never follows a symbolic link
 * and never leaves the directory it starts from when it opens, creates,
 * writes, chowns, mounts or removes something in a tree that another party
 * (kubelet, a tenant pod) can change.  Paths are resolved beneath a
 * directory fd with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
 * RESOLVE_NO_MAGICLINKS); files are created O_EXCL | O_NOFOLLOW |
 * O_NONBLOCK under an unpredictable name and renamed into place; owners and
 * modes are set on the open file (fchown, fchmod); bind mounts are made with
 * the mount API on descriptors (open_tree, mount_setattr, move_mount), so a
 * read-only bind is never writable, not even for an instant.
 *
 * Every function returns 0 (or the documented positive value) or a negative
 * errno: -ELOOP when a symlink was met, -EXDEV when a path would leave its
 * starting directory. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Relative part of the absolute path `path` under the absolute, normalized
 * directory `root` ("/" allowed): "a/b" for root "/r" and path "/r/a/b".
 * NULL when path is not strictly under root. */
const char *fsat_rel(const char *root, const char *path);

/* openat2(dfd, rel, flags | O_CLOEXEC) beneath dfd, no symlinks, no magic
 * links.  rel is relative, without "." or ".." components (not checked
 * here: RESOLVE_BENEATH refuses an escape anyway). */
int fsat_open(int dfd, const char *rel, int flags, int *ret_fd);

/* mkdir -p of rel beneath dfd: each missing component is created with mode
 * (umask applies), each one opened beneath the previous one without
 * following symlinks.  *ret_fd (optional): an O_PATH descriptor of the last
 * directory. */
int fsat_mkdirs(int dfd, const char *rel, unsigned mode, int *ret_fd);

/* Replace name in dfd with data: a new file under a random temporary name
 * (O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK), fchown to (0, gid) when
 * gid >= 0, fchmod mode, write, fsync, renameat, fsync of dfd.  A
 * pre-existing name of any type (symlink, FIFO, empty directory) is replaced,
 * never opened; a non-empty directory there is -EISDIR and left alone. */
int fsat_write_atomic(int dfd, const char *name, const void *data, size_t len, unsigned mode,
                      int gid);
/* The same without either fsync: atomic against a crash of the process (the
 * old or the new content, never a mix), not of the machine.  For files of a
 * runtime directory (gone after a reboot anyway) and for records that are
 * made durable afterwards, off the event loop (the CSI plugin's records). */
int fsat_write_replace(int dfd, const char *name, const void *data, size_t len, unsigned mode,
                       int gid);
/* Remove the temporary files of the two above that a killed process left in
 * dfd (".tmp-" and 16 hex digits, regular files only).  Only while nothing
 * else writes in dfd: at the start of the directory's one owner.  Returns how
 * many were removed. */
int fsat_remove_tmp(int dfd);

/* Set owner (0, gid) and mode of name in dfd without following a symlink;
 * -ELOOP when name is a symlink.  Missing is -ENOENT. */
int fsat_chown_mode(int dfd, const char *name, int gid, unsigned mode);

/* Bind-mount the directory src_fd (any descriptor of it, O_PATH is enough)
 * onto the directory target_fd.  FSAT_BIND_RO: the new mount is read-only,
 * nosuid, nodev and noexec from the moment it appears; without it the new
 * mount is writable even when src's is not.  FSAT_BIND_REC: with the mounts
 * under src (MS_REC).  The clone keeps src's propagation peer group, like
 * mount(MS_BIND). */
enum { FSAT_BIND_RO = 1, FSAT_BIND_REC = 2, FSAT_BIND_POD = 4, FSAT_BIND_DEV = 8 };
/* FSAT_BIND_POD (a pod volume's filesystem or device, docs/pod-volumes.md):
 * nosuid and nodev, writable unless FSAT_BIND_RO (then read-only only);
 * with FSAT_BIND_DEV (a block device node onto a file) noexec instead of
 * nodev.  target_fd may then be a file. */
int fsat_bind(int src_fd, int target_fd, unsigned flags);
/* The same; *ret_mnt_fd: a descriptor of the new mount itself, which finds
 * it wherever its mount point is moved (fsat_mnt_id, fsat_detach). */
int fsat_bind_fd(int src_fd, int target_fd, unsigned flags, int *ret_mnt_fd);

/* The mount id fd is on (statx STATX_MNT_ID). */
int fsat_mnt_id(int fd, uint64_t *ret);
/* Detach (MNT_DETACH) the mount fd is the root of, wherever it is now. */
int fsat_detach(int fd);

/* Make the mount whose root fd is shared (MS_SHARED). */
int fsat_make_shared(int fd);

/* Is fd the root of a mount?  1 yes, 0 no. */
int fsat_is_mount_root(int fd);

/* Unmount every mount stacked on rel (a directory or a file) beneath dfd (at
 * most 8; a busy one is detached); the directory stays.  Missing is not an error. */
int fsat_unmount(int dfd, const char *rel);

/* Unmount every mount stacked on rel beneath dfd (at most 8; a busy one is
 * detached) and remove the directory (or file) rel.  Missing is not an error;
 * a symlink anywhere in rel is -ELOOP and nothing is done. */
int fsat_unmount_rmdir(int dfd, const char *rel);

/* Remove name from dfd whatever it is (file, socket, FIFO, symlink, or an
 * EMPTY directory), never following and never recursing.  Missing is 0. */
int fsat_unlink(int dfd, const char *name);

/* Remove the listed names (fsat_unlink: never followed, never recursed
 * into) from directory rel beneath dfd, then the directory itself.
 * Missing entries are not errors; anything else left inside makes it
 * -ENOTEMPTY (the directory stays). */
int fsat_remove_dir(int dfd, const char *rel, const char *const *names);
