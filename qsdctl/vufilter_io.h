/* SPDX-License-Identifier: Apache-2.0 */
/* vufilter_io.h: the vhost-user filter's sockets (qsd-vhost-filter).
 *
 * Owns: the listening sockets tenants connect to, one connection per export
 * at a time, the connection to the QSD's socket (bounded retries while the
 * QSD starts), reading whole messages with their SCM_RIGHTS descriptors,
 * asking the pure core (qsd/vhost/vufilter.h) about each, checking that
 * guest memory comes as regular files (memfds), forwarding what passes, the
 * interposed back-end request channel, and the rate-limited log
 * of refusals.  One thread, poll(), fixed buffers per connection, every wait
 * bounded.  A refusal or an I/O error closes the tenant's and the QSD's
 * connection (the front-end reconnects). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct vf_export_spec {
    const char *tenant;   /* "fd:N" (a listening socket) or a path to create */
    const char *upstream; /* the QSD's socket path */
};

struct vf_options {
    unsigned queues;
    bool allow_adjacent;
    unsigned connect_timeout_ms; /* upstream connect retries, default 5000 */
    unsigned msg_timeout_ms;     /* a started message must complete, default 5000 */
};

struct vf_server;

/* Opens (or adopts) every listening socket; all-or-nothing.  The sockets
 * are close-on-exec. */
int vf_server_new(const struct vf_export_spec *specs, unsigned n, const struct vf_options *o,
                  struct vf_server **ret);
void vf_server_free(struct vf_server *s);

/* Run until on_extra (called when extra_fd is readable) returns nonzero, and
 * return that value; negative errno on a loop failure. */
int vf_server_run(struct vf_server *s, int extra_fd, int (*on_extra)(void *opaque),
                  void *opaque);

/* Counters for the final log line. */
struct vf_stats {
    uint64_t connections, refused, passed, modified, log_suppressed;
};
void vf_server_stats(const struct vf_server *s, struct vf_stats *ret);
