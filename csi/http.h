/* SPDX-License-Identifier: Apache-2.0 */
/* http.h: a small HTTP/1.1 server for /metrics and /healthz on the loop.
 *
 * Owns: the TCP listener of --http-endpoint (dual-stack for ":PORT") and
 * its connections.  It is reachable from the network (the node's, for the
 * DaemonSet), so every caller is treated as hostile and everything it can
 * make us hold is bounded: HTTP_MAX_CONNECTIONS at once (a
 * new one past that closes the oldest connection of the peer address that
 * holds the most, so slow clients displace their own, never a scraper from
 * elsewhere), a request head of at most HTTP_MAX_REQUEST bytes (431 beyond),
 * the whole head within HTTP_HEADER_TIMEOUT_MS of the connection
 * (slowloris: 408 and close), the answer written within
 * HTTP_WRITE_TIMEOUT_MS.  The listener defers accept until the client has
 * sent something (TCP_DEFER_ACCEPT), and a request already there is answered
 * at accept.  GET only (405 otherwise), strict framing: a request line or
 * header field that is not well-formed, a Content-Length that is not digits
 * or not 0, or a second one: 400; any Transfer-Encoding: 501.  No keep-alive:
 * one request per connection, then close.  Never blocks: non-blocking
 * sockets, fd watches and timers. */
#pragma once

#include <stddef.h>
#include <sys/socket.h>

#include "qsd/base/loop.h"

#define HTTP_MAX_CONNECTIONS 16
#define HTTP_MAX_REQUEST 8192
#define HTTP_HEADER_TIMEOUT_MS 2000
#define HTTP_WRITE_TIMEOUT_MS 5000
#define HTTP_DEFER_ACCEPT_S 1

/* Answer a GET of path (the query string removed).  Set *ret_status (200,
 * 404...), *ret_type (static) and *ret_body (malloc'd, *ret_len bytes). */
typedef void (*http_handler_fn)(const char *path, int *ret_status, const char **ret_type,
                                char **ret_body, size_t *ret_len, void *opaque);

/* "HOST:PORT" with a numeric IPv4 host, "[IPv6]:PORT", or ":PORT": every
 * address, IPv4 and IPv6 ([::], which http_server_new listens on with
 * IPV6_V6ONLY off, or 0.0.0.0 when the kernel has no IPv6).  -EINVAL when
 * malformed. */
int http_parse_endpoint(const char *endpoint, struct sockaddr_storage *ret, unsigned *ret_len);

struct http_server;
int http_server_new(struct loop *l, const char *endpoint, http_handler_fn fn, void *opaque,
                    struct http_server **ret);
void http_server_free(struct http_server *s); /* closes every connection; NULL accepted */
