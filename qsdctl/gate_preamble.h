/* SPDX-License-Identifier: Apache-2.0 */
/* gate_preamble.h: the dial mode's preamble, `CONNECT <host>\n` or
 * `API\n`.
 *
 * Owns: reading what a unix client sent before the relay: `CONNECT` with
 * an IPv4 or IPv6 literal (no name, no port, no brackets, not an
 * unspecified or multicast address) into a socket address with the gate's
 * fixed port, or `API` (the Kubernetes API server the gate was given);
 * nothing may follow the newline, the client waits for `OK\n`; the reason
 * for a refusal as the short text of the `ERR` line.  No I/O. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* "CONNECT " + the longest IPv6 literal (45) + "\n", with room to spare:
 * more than this without a newline is refused. */
#define GATE_PREAMBLE_MAX 64

#define GATE_PREAMBLE_CONNECT 1
#define GATE_PREAMBLE_API 2

/* buf holds the len bytes received so far.  GATE_PREAMBLE_CONNECT:
 * complete and good, *ret (port set) filled; GATE_PREAMBLE_API: `API`
 * (*ret untouched); 0: no newline yet, read on; -EINVAL: refused, *why the
 * reason (a static string, no newline). */
int gate_preamble_parse(const char *buf, size_t len, uint16_t port,
                        struct sockaddr_storage *ret, socklen_t *ret_len, const char **why);
