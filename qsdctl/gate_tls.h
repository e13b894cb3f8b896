/* SPDX-License-Identifier: Apache-2.0 */
/* gate_tls.h: qsd-node-gate's TLS policy on OpenSSL.
 *
 * Owns: the context of either mode (TLS 1.3 only, this side's certificate
 * and key; the peer's certificate required, verified against --ca, with
 * the purpose of the peer's role (serve: a client's; dial: a server's),
 * and checked by OpenSSL's host-name check to name --peer-name; no session
 * tickets, no session cache, so every connection verifies a certificate),
 * loading the files with errors that name the option, and the reason a
 * handshake failed, as a short text for the log and the dial mode's ERR
 * line.  The dial mode's API server route has a context of its own: TLS
 * 1.2 or 1.3, the server verified against --api-ca for --api-name, no
 * certificate of ours. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <openssl/ssl.h>

#include "gate_conf.h"

/* A server context, or with c->dial a client context; with api (dial mode
 * with --api-host), the client context of the API server route instead.
 * All-or-nothing; on failure a message naming the option in err. */
int gate_tls_ctx_new(const struct gate_conf *c, bool api, SSL_CTX **ret, char *err,
                     size_t errlen);

/* Why the handshake of ssl failed (after SSL_accept or SSL_connect
 * returned <= 0 with
 * error ssl_err): the certificate verification result when that failed,
 * else OpenSSL's first queued error, else the system error.  Clears
 * OpenSSL's error queue. */
const char *gate_tls_failure(SSL *ssl, int ssl_err, char *buf, size_t len);
