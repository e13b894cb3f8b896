/* SPDX-License-Identifier: Apache-2.0 */
/* gate_preamble.h: the dial mode's preamble, `CONNECT <host>\n`.
 *
 * Owns: reading what a unix client sent before the relay (the host is an
 * IPv4 or IPv6 literal: no name, no port, no brackets, not an unspecified
 * or multicast address; nothing may follow the newline, the client waits
 * for `OK\n`) into a socket address with the gate's fixed port, and the
 * reason for a refusal as the short text of the `ERR` line.  No I/O. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* "CONNECT " + the longest IPv6 literal (45) + "\n", with room to spare:
 * more than this without a newline is refused. */
#define GATE_PREAMBLE_MAX 64

/* buf holds the len bytes received so far.  1: complete and good, *ret
 * (port set) filled; 0: no newline yet, read on; -EINVAL: refused, *why
 * the reason (a static string, no newline). */
int gate_preamble_parse(const char *buf, size_t len, uint16_t port,
                        struct sockaddr_storage *ret, socklen_t *ret_len, const char **why);
