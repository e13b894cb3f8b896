/* SPDX-License-Identifier: Apache-2.0 */
/* gate_io.h: qsd-node-gate's connections.
 *
 * Owns: the listening TCP socket, accepting (beyond --max-conns a
 * connection is closed at once), the TLS handshake on non-blocking sockets
 * under its deadline, the connection to the forward unix socket (by name,
 * from the working directory: the socket's directory, opened before
 * confinement), and the relay: two bounded buffers per connection, each
 * filled only while it has room (backpressure), an end on either side
 * passed on (TLS close_notify or EOF -> shutdown of the unix socket's
 * write side; the unix side's EOF -> close_notify, then close), the idle
 * deadline.  One thread, one epoll set, nothing blocks.  Logs one line per
 * connection event (refusals rate-limited), bytes each way at close. */
#pragma once

#include <stdint.h>
#include <openssl/ssl.h>

#include "gate_conf.h"

struct gate_server;

/* Bind and listen on c->listen (close-on-exec, non-blocking); nothing is
 * accepted before gate_server_run.  Takes no ownership of ctx. */
int gate_server_new(const struct gate_conf *c, SSL_CTX *ctx, struct gate_server **ret);
void gate_server_free(struct gate_server *s);
/* The bound address (the port the kernel picked for port 0). */
const char *gate_server_addr(struct gate_server *s, char *buf, size_t len);

/* Run until on_extra (called when extra_fd is readable) returns nonzero and
 * return that value; negative errno on a loop failure. */
int gate_server_run(struct gate_server *s, int extra_fd, int (*on_extra)(void *opaque),
                    void *opaque);

struct gate_stats {
    uint64_t accepted, relayed, refused, busy, log_suppressed;
};
void gate_server_stats(const struct gate_server *s, struct gate_stats *ret);
