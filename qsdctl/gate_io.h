/* SPDX-License-Identifier: Apache-2.0 */
/* gate_io.h: qsd-node-gate's connections, in both modes.
 *
 * Owns: the listening socket (serve: TCP; dial: the unix socket, created
 * 0660 by name in the working directory, a stale one of a previous gate
 * removed), accepting (beyond --max-conns a connection is closed at once),
 * each connection's stages under their deadlines (serve: the TLS
 * handshake on the accepted socket, then the forward unix socket, by name
 * from the working directory; dial: the preamble, the non-blocking TCP
 * connect to the node, or with `API` to the API server, the TLS client
 * handshake, then `OK\n`, or `ERR <reason>\n` and
 * the close), handing the two sides to the relay (gate_relay.c) and the
 * idle deadline.  One thread, one epoll set, nothing blocks.  Logs one
 * line per connection event (refusals rate-limited), bytes each way at
 * close. */
#pragma once

#include <stdint.h>
#include <openssl/ssl.h>

#include "gate_conf.h"

struct gate_server;

/* Bind and listen on c->listen, or with c->dial on c->sock_name in the
 * working directory (close-on-exec, non-blocking); nothing is accepted
 * before gate_server_run.  Takes no ownership of ctx (a server context, or
 * with c->dial a client one) nor of api_ctx (dial: the API server route's
 * client context, NULL without one: `API` is then refused). */
int gate_server_new(const struct gate_conf *c, SSL_CTX *ctx, SSL_CTX *api_ctx,
                    struct gate_server **ret);
void gate_server_free(struct gate_server *s);
/* The bound address (the port the kernel picked for port 0), or
 * "unix:PATH". */
const char *gate_server_addr(struct gate_server *s, char *buf, size_t len);

/* Run until on_extra (called when extra_fd is readable) returns nonzero and
 * return that value; negative errno on a loop failure. */
int gate_server_run(struct gate_server *s, int extra_fd, int (*on_extra)(void *opaque),
                    void *opaque);

struct gate_stats {
    uint64_t accepted, relayed, refused, busy, log_suppressed;
};
void gate_server_stats(const struct gate_server *s, struct gate_stats *ret);
