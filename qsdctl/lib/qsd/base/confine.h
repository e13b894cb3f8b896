/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/confine.h: confining a process that handles what tenants send
 * (QSDs, the vhost-user filter, qemu-img on downloaded images, the node
 * endpoint's TLS gate).
 *
 * Owns: dropping to an unprivileged uid/gid with no supplementary groups and
 * no capabilities (effective, permitted, inheritable, ambient and bounding),
 * no_new_privs, resource limits, a private mount namespace in which the host
 * is read-only and only the named paths are writable or visible, and the
 * seccomp allow-lists, one per profile.  Everything here runs in a forked
 * child before exec (or in a process about to handle untrusted input) and is
 * all-or-nothing: a failure is returned and the caller must not go on.
 *
 * This header is the interface agreed between the spawn path (proc_spawn's
 * `confine` option, the QSD supervisor) and the vhost-user filter's head
 * process, which forks the QSD and then confines itself. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

enum confine_profile {
    CONFINE_PROFILE_NONE = 0, /* no seccomp filter */
    CONFINE_PROFILE_QSD,      /* qemu-storage-daemon (file, qcow2, raw, rbd) */
    CONFINE_PROFILE_FILTER,   /* the vhost-user filter: sockets, poll, memory */
    CONFINE_PROFILE_IMAGE,    /* qemu-img and workers reading untrusted images */
    CONFINE_PROFILE_GATE,     /* the node endpoint's TLS gate: sockets, epoll,
                               * memory; no open, no exec */
};

struct confine {
    uid_t uid;                  /* (uid_t)-1: keep the caller's */
    gid_t gid;                  /* (gid_t)-1: keep the caller's */
    bool mount_ns;              /* a private mount namespace, host read-only */
    const char *const *writable; /* NULL-terminated: stay writable there */
    const char *const *hidden;   /* NULL-terminated: an empty tmpfs there (what was
                                  * mounted at or beneath it detached first) */
    uint64_t rlimit_as;         /* bytes, 0: unchanged */
    uint64_t rlimit_cpu;        /* seconds, 0: unchanged */
    uint64_t rlimit_nofile;     /* 0: unchanged */
    uint64_t rlimit_nproc;      /* 0: unchanged */
    enum confine_profile profile; /* seccomp allow-list applied last */
    /* >0 (with mount_ns): /dev becomes a tmpfs of its own holding only null,
     * zero, full, random and urandom (bound from the host's) and an empty
     * regular file fd/<n>: what QEMU's FUSE export wants to see at its
     * mountpoint /dev/fd/<n> while libfuse uses descriptor n
     * (docs/pod-volumes.md); fd/0 to fd/3 (but n) link to /proc/self/fd as
     * usual (an interpreted QSD wrapper is read through /dev/fd/3).  0: /dev
     * as the host's. */
    unsigned dev_fd_file;
};
#define CONFINE_INIT {.uid = (uid_t)-1, .gid = (gid_t)-1}

/* All of the above, in this order: mount namespace, rlimits, groups and
 * ids, capabilities, no_new_privs, seccomp.  Async-signal-safe (it runs
 * between fork and exec).  Negative errno. */
int confine_self(const struct confine *c);

/* Only no_new_privs plus the profile's seccomp filter (for a process that is
 * already unprivileged, e.g. each half of the filter's head after its fork).
 * Filters stack: a child forked after this call keeps the filter. */
int confine_seccomp(enum confine_profile profile);
