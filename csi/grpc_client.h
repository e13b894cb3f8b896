/* SPDX-License-Identifier: Apache-2.0 */
/* grpc_client.h: a blocking gRPC client (unary and server-streaming calls)
 * over a unix socket, on nghttp2.
 *
 * Owns: one client connection (struct grpc_client), its optional preamble,
 * its HTTP/2 session (cleartext, prior knowledge, as grpcio speaks on unix
 * sockets) and the calls made on it, one at a time.  Blocking by design: it
 * is for the plugin's forked workers (qsd/base/worker.h), never for the
 * event loop.  Every wait is a poll(2) bounded by the call's deadline.
 *
 * Every outcome is a gRPC status: the server's (grpc-status, and
 * grpc-message percent-decoded), or one decided here with a message that
 * says what happened: UNAVAILABLE for the connection (refused, closed, a
 * GOAWAY, the preamble's answer not the one expected), INTERNAL for what
 * the server got wrong (a malformed frame, a non-gRPC answer, no
 * grpc-status, a truncated message, a reset stream), DEADLINE_EXCEEDED,
 * RESOURCE_EXHAUSTED for a message over the limit, CANCELLED when the
 * streaming callback stopped the call.  After an UNAVAILABLE or INTERNAL
 * about the connection itself, later calls on it answer UNAVAILABLE at
 * once; a call ended by its deadline, its limit or its callback resets only
 * its stream, and the connection can be used again. */
#pragma once

#include "grpc.h"
#include "preamble.h"

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct grpc_client;

struct grpc_client_opts {
    /* Written on the raw connection before HTTP/2 starts (e.g. a gate's
     * "CONNECT host:port\n"); NULL: none.  Then one line is read (at most
     * GRPC_CLIENT_LINE_MAX bytes with its '\n'): it must be expect (without
     * its '\n'; NULL means "OK"), any other line is UNAVAILABLE quoting it. */
    const void *preamble;
    size_t preamble_len;
    const char *expect;
    size_t max_message; /* response message bytes; 0: 4 MiB; at most 1 GiB */
};
#define GRPC_CLIENT_LINE_MAX PREAMBLE_LINE_MAX
#define GRPC_CLIENT_HEADERS_MAX (64u << 10) /* response header bytes per call */

/* The outcome of a call: code and a message (malloc'd, never NULL, "" for
 * OK).  grpc_client_status_done frees the message. */
struct grpc_client_status {
    enum grpc_code code;
    char *message;
};
void grpc_client_status_done(struct grpc_client_status *st);

/* Connect to the unix socket path, write the preamble and check its answer,
 * start HTTP/2 (our preface and SETTINGS are sent with the first call).  By
 * deadline_us (CLOCK_MONOTONIC, now_us()).  Returns the code (GRPC_OK: *ret
 * set) and fills *ret_st. */
enum grpc_code grpc_client_connect(const char *path, const struct grpc_client_opts *opts,
                                   uint64_t deadline_us, struct grpc_client **ret,
                                   struct grpc_client_status *ret_st);
/* Closes the connection (a GOAWAY is sent when the socket takes it at once). */
void grpc_client_free(struct grpc_client *c);
/* False once the connection failed: every later call is UNAVAILABLE. */
bool grpc_client_usable(const struct grpc_client *c);

/* One unary call of method ("/csi.v1.Identity/GetPluginInfo") with the
 * packed request req, by deadline_us (sent as grpc-timeout, enforced here).
 * On GRPC_OK, *ret_resp (malloc'd; NULL when empty) and *ret_len hold the
 * response message.  The status is returned and put in *ret_st. */
enum grpc_code grpc_client_unary(struct grpc_client *c, const char *method, const uint8_t *req,
                                 size_t len, uint64_t deadline_us, uint8_t **ret_resp,
                                 size_t *ret_len, struct grpc_client_status *ret_st);
/* The same with protobuf-c messages: req packed, the response unpacked with
 * resp_desc into *ret_resp (free with protobuf_c_message_free_unpacked).  A
 * response that does not unpack is INTERNAL. */
enum grpc_code grpc_client_unary_pb(struct grpc_client *c, const char *method,
                                    const ProtobufCMessage *req,
                                    const ProtobufCMessageDescriptor *resp_desc,
                                    uint64_t deadline_us, ProtobufCMessage **ret_resp,
                                    struct grpc_client_status *ret_st);

/* Server streaming: fn is called once per received message (msg valid
 * during the call only; fn must not call into this client).  It returns 0 to go on; anything else stops the
 * call (RST_STREAM CANCEL is sent) and the call ends CANCELLED.  The
 * stream's final status is returned and put in *ret_st. */
typedef int (*grpc_client_msg_fn)(const uint8_t *msg, size_t len, void *opaque);
enum grpc_code grpc_client_stream(struct grpc_client *c, const char *method, const uint8_t *req,
                                  size_t len, uint64_t deadline_us, grpc_client_msg_fn fn,
                                  void *opaque, struct grpc_client_status *ret_st);

/* --- pure helpers (exposed for tests) --- */
/* A grpc-timeout value for us microseconds ("1*8DIGIT unit", rounded up to
 * the unit; grpc_parse_timeout reads it back as >= us).  buf of 16 bytes. */
void grpc_format_timeout(uint64_t us, char buf[static 16]);
/* Decode a percent-encoded grpc-message: %XX with two hex digits is the
 * byte, anything else (a lone '%', bad digits) is kept as it is, %00 too;
 * the result is malloc'd and NUL-terminated. */
char *grpc_percent_decode(const uint8_t *s, size_t len);
