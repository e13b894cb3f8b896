/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/util.h: small helpers shared by every part of the project.
 *
 * Owns: cleanup attributes (_cleanup_free_, _cleanup_close_, TAKE_PTR/TAKE_FD),
 * checked allocation, monotonic time, atomic file writes, size parsing and
 * formatting.  Functions return 0 or a negative errno; outputs named ret_* are
 * written only on success. */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

static inline void freep(void *p) { free(*(void **)p); }
static inline void closep(int *fd)
{
    if (*fd >= 0) {
        int saved = errno;
        close(*fd);
        errno = saved;
    }
}
static inline void fclosep(FILE **f)
{
    if (*f)
        fclose(*f);
}

#define _cleanup_(f) __attribute__((cleanup(f)))
#define _cleanup_free_ _cleanup_(freep)
#define _cleanup_close_ _cleanup_(closep)
#define _cleanup_fclose_ _cleanup_(fclosep)

/* Hand ownership out of a cleanup variable. */
#define TAKE_PTR(p)                                                            \
    ({                                                                         \
        typeof(p) _tp = (p);                                                   \
        (p) = NULL;                                                            \
        _tp;                                                                   \
    })
#define TAKE_FD(fd)                                                            \
    ({                                                                         \
        int _tf = (fd);                                                        \
        (fd) = -1;                                                             \
        _tf;                                                                   \
    })

/* Allocation that aborts on failure: running out of memory in a storage
 * control plane is not recoverable in any useful way. */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t m);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);
char *xstrdup_or_null(const char *s); /* NULL stays NULL */
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

uint64_t now_ms(void);   /* CLOCK_MONOTONIC in milliseconds */
uint64_t now_us(void);

/* Write data to path atomically: fsat_write_atomic in path's directory
 * (random temporary name, fsync, rename, fsync of the directory).  mode is
 * the new file's permission.  For the plugin's own directories: path itself
 * is resolved normally. */
int write_file_atomic(const char *path, const void *data, size_t len, unsigned mode);
/* Read a whole (small) file; *ret_data is NUL-terminated.  Refuses files
 * larger than max bytes with -EFBIG, and a symlink as the last component
 * (O_NOFOLLOW: -ELOOP). */
int read_file(const char *path, size_t max, char **ret_data, size_t *ret_len);
/* The same, following symlinks, for a file a pod's own runtime places for
 * the caller (Kubernetes mounts ConfigMap and Secret files as symlinks into
 * a ..data directory); anything but a regular file is -EINVAL (never blocks
 * on a FIFO or a device). */
int read_file_follow(const char *path, size_t max, char **ret_data, size_t *ret_len);

/* mkdir -p with the given mode for directories it creates. */
int mkdir_p(const char *path, unsigned mode);
/* Remove a directory tree (no symlink following). Missing is not an error. */
int rm_rf(const char *path);

/* Parse "10G", "512M", "4096", "1.5G" is refused (integers only).  Binary
 * suffixes K, M, G, T, P (powers of 1024), optional "i"/"iB"/"B".  Overflow and
 * empty input are -EINVAL / -ERANGE. */
int parse_size(const char *s, uint64_t *ret);
/* Human-readable size into buf (e.g. "1.5 GiB"). */
const char *format_size(uint64_t v, char *buf, size_t len);

/* -ENOSPC or -EDQUOT when text (a tool's or QEMU's error message) says the
 * disk is full or the quota exceeded (strerror's words), else r: out of
 * space keeps its meaning across qemu-img and QMP. */
int errno_from_text(int r, const char *text);

/* Parse a decimal unsigned integer in [min, max]. */
int parse_uint(const char *s, uint64_t min, uint64_t max, uint64_t *ret);

/* Is a unix stream socket listening at path in this network namespace?  Reads
 * /proc/net/unix: unlike a probe connection it never touches the server (a
 * vhost-user back-end serves one client at a time: a status query must not
 * take a reconnecting VM's place).  1 yes, 0 no, negative errno when
 * /proc/net/unix cannot be read. */
int unix_socket_listening(const char *path);
/* How many stream connections carry path as their address (accepted by its
 * listener, or waiting in its backlog): the server's side of each, until the
 * server closes it.  -errno when /proc/net/unix cannot be read. */
int unix_socket_connections(const char *path);
/* Connect to a unix stream socket, non-blocking, close-on-exec. */
int unix_connect(const char *path, bool nonblock, int *ret_fd);

/* Write all of buf to a blocking fd (retrying on EINTR / short writes). */
int write_all(int fd, const void *buf, size_t len);

/* Sleep for ms milliseconds (only for command-line tools, never in a loop). */
void sleep_ms(unsigned ms);

bool streq_ptr(const char *a, const char *b);
static inline bool streq(const char *a, const char *b) { return strcmp(a, b) == 0; }
static inline bool startswith(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}
