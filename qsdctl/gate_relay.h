/* SPDX-License-Identifier: Apache-2.0 */
/* gate_relay.h: qsd-node-gate's relay of one connection, in both modes.
 *
 * Owns: moving bytes between two sides, one of them a TLS session and the
 * other a plain socket (serve mode: the TLS client and the forward unix
 * socket; dial mode: the unix client and the TLS server), through two
 * bounded buffers, each filled only while it has room (backpressure); the
 * ends: the client's end (EOF, or TLS close_notify) ends the server's
 * write side (shutdown, or close_notify) and the relay goes on; the
 * server's end, once everything it said has reached the client, ends the
 * relay.  It does socket and TLS I/O, non-blocking, and says what it
 * blocked on; the caller owns the descriptors, the TLS session and the
 * waiting (epoll). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <openssl/ssl.h>

enum { GATE_WANT_IN = 1, GATE_WANT_OUT = 2 };

struct gate_side {
    int fd;
    SSL *ssl;      /* NULL: a plain socket */
    bool eof;      /* it said all it will say */
    bool shut;     /* its write side was ended */
    unsigned want; /* GATE_WANT_*: what the last round blocked on */
};

struct gate_buf {
    uint8_t *data;
    size_t head, len;
};

struct gate_relay {
    struct gate_side client, server; /* who connected, who answers */
    struct gate_buf up, down;        /* client -> server, server -> client */
    uint64_t up_bytes, down_bytes;   /* passed on */
    bool again;                      /* stopped after its rounds with work left */
};

#define GATE_RELAY_BUF (64 * 1024) /* per direction */

/* The two buffers (aborts on out of memory, as xmalloc). */
void gate_relay_start(struct gate_relay *r);
void gate_relay_release(struct gate_relay *r);

/* Move bytes until nothing moves or a bound of rounds is reached (then
 * r->again).  0: blocked (each side's want says on what), 1: over (the
 * server ended and everything reached the client: end the client's side
 * and close), negative errno: failed, *ret_failed the side that failed.
 * *ret_moved: whether anything moved. */
int gate_relay_step(struct gate_relay *r, struct gate_side **ret_failed, bool *ret_moved);

/* Best effort, non-blocking: end side's write side (close_notify or
 * shutdown) before a close. */
void gate_side_end(struct gate_side *s);
