/* SPDX-License-Identifier: Apache-2.0 */
/* preamble.h: the line exchange that opens a connection to the local TLS
 * gate (qsd-node-gate --dial: `CONNECT <ip>\n` or `API\n`, answered `OK\n`
 * or `ERR <reason>\n`).
 *
 * Owns: writing the preamble on a fresh non-blocking socket and reading
 * back one answer line, both by a deadline (every wait a bounded poll),
 * the expected line checked, what came after the line handed back (it
 * belongs to the protocol that follows), and the message that says what
 * went wrong.  Blocking by design: for forked workers (grpc_client.c,
 * kube.c), never the event loop. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define PREAMBLE_LINE_MAX 256 /* the answer line, with its '\n' */

/* Write len bytes of preamble on fd (non-blocking), then read one line by
 * deadline_us (CLOCK_MONOTONIC, now_us()); it must be expect (without its
 * '\n').  Bytes received after the line go to *ret_rest (malloc'd; NULL
 * and 0 when none).  0; -ETIMEDOUT when the deadline passed; -EPROTO for
 * another line (quoted in the message, unprintable bytes as '?'), a line
 * over PREAMBLE_LINE_MAX or the connection closed before it; another
 * -errno from the socket.  On failure *ret_msg (malloc'd) says what
 * happened. */
int preamble_exchange(int fd, const void *preamble, size_t len, const char *expect,
                      uint64_t deadline_us, uint8_t **ret_rest, size_t *ret_rest_len,
                      char **ret_msg);

/* Wait for events on fd until deadline_us: 0 when the poll returned (ready
 * or interrupted: the caller tries again), -ETIMEDOUT once the deadline
 * has passed, -errno if poll failed. */
int preamble_wait(int fd, short events, uint64_t deadline_us);
