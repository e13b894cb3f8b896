/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/probe.h: the readiness probe: does a unix stream socket accept a
 * connection now?
 *
 * The one probe of the project: the plugin's QSD supervisor (export ready),
 * the launcher (volume ready before the domain starts or a disk is
 * hot-plugged) and the gRPC server (a live server at its endpoint).  The
 * socket is opened beneath a directory fd without following any symlink
 * (fsat_open: RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, O_PATH), checked to be
 * a socket, and connected to through /proc/self/fd/N of that descriptor:
 * the inode found is the one probed, never whatever a tenant puts at the
 * path in between (and sun_path's 108-byte limit does not apply).
 *
 * Never waits: a non-blocking connect to a unix stream socket completes or
 * fails at once (a full accept queue is -EAGAIN, nobody listening
 * -ECONNREFUSED); the connection is closed at once (probe_connect_at: when
 * the caller says).  A server that is
 * stopped (SIGSTOP) but listening still "accepts": the kernel queues the
 * connection.  The probe says a listener with room exists, not that it
 * answers; whoever then talks to the server bounds its own wait. */
#pragma once

/* 0: rel (beneath dfd) is a socket that accepted a connection; negative
 * errno otherwise (-ELOOP: a symlink on the way, -ENOTSOCK: not a socket). */
int probe_socket_at(int dfd, const char *rel);
/* The same, but the connection is left open in *ret_fd (close-on-exec,
 * non-blocking) for the caller to close when it chooses (qsd.h: a QSD's
 * start holds its probe connection until its own monitor connection is up). */
int probe_connect_at(int dfd, const char *rel, int *ret_fd);
/* The same for a path whose directory part is trusted (configuration, not
 * writable by tenants): the directory is opened as given, its last
 * component beneath it without following a symlink. */
int probe_socket(const char *path);
