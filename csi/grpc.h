/* SPDX-License-Identifier: Apache-2.0 */
/* grpc.h: a small gRPC server (unary and server-streaming calls) on nghttp2.
 *
 * Owns: the HTTP/2 + gRPC session layer and its unix-socket transport.
 *
 * Layers:
 *  - struct grpc_server: the method table, the limits, and every session.  It
 *    decides each RPC's final status and logs each RPC exactly once (method,
 *    code, duration) at the point where that status is decided, where it
 *    also tells its observer (metrics.h).
 *  - struct grpc_session: one HTTP/2 connection.  Pure: no I/O.  Feed received
 *    bytes with grpc_session_recv(), collect bytes to send with
 *    grpc_session_output()/grpc_session_consume().  Cleartext HTTP/2 with prior
 *    knowledge, as grpcio speaks on unix sockets.
 *  - struct grpc_listener (grpc_unix.c): a unix socket on the event loop
 *    that owns one session per accepted connection.
 *
 * A handler gets the decoded request message (the gRPC 5-byte prefix already
 * removed) and a call handle.  It completes the call exactly once, either before
 * returning or later from the event loop (grpc_call_reply*, grpc_call_fail).
 * The handle stays valid until completed, even if the stream goes away first
 * (peer reset, deadline, connection closed, shutdown): the completion is then
 * discarded.  grpc_call_on_cancel() lets a handler hear about that early.
 *
 * Server streaming: the handler sends messages with grpc_call_send_pb()
 * (the first one sends the response headers) and ends the call with
 * grpc_call_end() (its status goes out in the trailers, after the messages
 * queued).  The messages wait in a per-call queue that nghttp2 drains as
 * the peer's flow-control window allows; the handler keeps that queue
 * short: it sends while grpc_call_writable() and otherwise waits for the
 * callback of grpc_call_on_writable(), so a slow reader stops the producer
 * instead of growing the plugin's memory (grpc_call_send_pb refuses to
 * queue more than GRPC_STREAM_MAX bytes).  A streaming answer is not held
 * by the durability barrier (its RPCs only read). */
#pragma once

#include "qsd/base/log.h"

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct loop;

enum grpc_code {
    GRPC_OK = 0,
    GRPC_CANCELLED = 1,
    GRPC_UNKNOWN = 2,
    GRPC_INVALID_ARGUMENT = 3,
    GRPC_DEADLINE_EXCEEDED = 4,
    GRPC_NOT_FOUND = 5,
    GRPC_ALREADY_EXISTS = 6,
    GRPC_PERMISSION_DENIED = 7,
    GRPC_RESOURCE_EXHAUSTED = 8,
    GRPC_FAILED_PRECONDITION = 9,
    GRPC_ABORTED = 10,
    GRPC_OUT_OF_RANGE = 11,
    GRPC_UNIMPLEMENTED = 12,
    GRPC_INTERNAL = 13,
    GRPC_UNAVAILABLE = 14,
    GRPC_DATA_LOSS = 15,
    GRPC_UNAUTHENTICATED = 16,
};
const char *grpc_code_name(enum grpc_code c);

struct grpc_server;
struct grpc_session;
struct grpc_call;

typedef void (*grpc_handler_fn)(struct grpc_call *call, const uint8_t *req, size_t len,
                                void *opaque);
typedef void (*grpc_cancel_fn)(struct grpc_call *call, void *opaque);

struct grpc_method {
    const char *path; /* "/csi.v1.Identity/Probe" */
    grpc_handler_fn handler;
    void *opaque;
    enum log_level log_level; /* level of the per-RPC line when it succeeds */
};

/* Everything a peer can make us allocate or wait for is bounded here. */
struct grpc_limits {
    size_t max_message;          /* request message bytes (default 4 MiB) */
    uint32_t max_streams;        /* concurrent streams per connection (default 128) */
    uint32_t max_connections;    /* sessions per server (default 64) */
    uint32_t max_header_list;    /* header bytes per request (default 16 KiB) */
    uint64_t max_deadline_ms;    /* cap on grpc-timeout and default deadline (10 min) */
    size_t max_output;           /* queued output per session before we stop reading (1 MiB) */
    size_t max_buffered;         /* request bytes buffered across every stream of every
                                    session (64 MiB): beyond, RESOURCE_EXHAUSTED */
};
void grpc_limits_default(struct grpc_limits *ret);

int grpc_server_new(const struct grpc_limits *lim, struct grpc_server **ret);
/* Frees every session (calls still running are detached and cancelled). */
void grpc_server_free(struct grpc_server *srv);
/* Register a table (not copied: it must outlive the server).  Paths must be
 * unique across tables. */
int grpc_server_add_methods(struct grpc_server *srv, const struct grpc_method *m, size_t n);
/* Called once per RPC when its final status is decided (where it is
 * logged): the registered method (NULL for an unknown path), its code and
 * how long it took.  For metrics; must not call back into the server. */
typedef void (*grpc_observer_fn)(const struct grpc_method *m, enum grpc_code code,
                                 uint64_t duration_us, void *opaque);
void grpc_server_set_observer(struct grpc_server *srv, grpc_observer_fn fn, void *opaque);
/* Start a graceful shutdown: GOAWAY on every session, refuse new sessions and
 * new streams, let calls in flight finish. */
void grpc_server_shutdown(struct grpc_server *srv);
bool grpc_server_draining(const struct grpc_server *srv);
unsigned grpc_server_sessions(const struct grpc_server *srv);
/* Request bytes buffered now, across every session (<= max_buffered). */
size_t grpc_server_buffered(const struct grpc_server *srv);
/* Durability barrier: fn returns the sequence number of the last change of
 * persistent state made so far (0: none).  An answer completed while that
 * number is above the last one passed to grpc_server_durable() is held (the
 * RPC is not answered yet) until grpc_server_durable() reaches it: a client
 * never hears "OK" before what the RPC changed is on disk.  err < 0: those
 * changes could not be made durable; the held answers become INTERNAL.  A
 * held answer still ends at its deadline (DEADLINE_EXCEEDED). */
typedef uint64_t (*grpc_barrier_fn)(void *opaque);
void grpc_server_set_barrier(struct grpc_server *srv, grpc_barrier_fn fn, void *opaque);
void grpc_server_durable(struct grpc_server *srv, uint64_t seq, int err);
/* Answer DEADLINE_EXCEEDED to every stream whose deadline is <= now_us. */
void grpc_server_expire(struct grpc_server *srv, uint64_t now_us);
/* Earliest pending deadline (CLOCK_MONOTONIC us), 0 if none. */
uint64_t grpc_server_next_deadline(const struct grpc_server *srv);

/* Called when a session has new output outside grpc_session_recv() (an
 * asynchronous completion, a deadline, a shutdown).  Must not call back into
 * the session: just schedule a write. */
typedef void (*grpc_wakeup_fn)(struct grpc_session *s, void *opaque);

/* nghttp2's options that both ends of ours set (grpc.c's server sessions,
 * grpc_client.c): bounds on what a peer makes it keep.  The caller frees it
 * (nghttp2_option_del). */
struct nghttp2_option;
struct nghttp2_option *grpc_h2_options(void);

/* -EUSERS when the server is at max_connections, -ESHUTDOWN when draining. */
int grpc_session_new(struct grpc_server *srv, grpc_wakeup_fn wakeup, void *opaque,
                     struct grpc_session **ret);
void grpc_session_free(struct grpc_session *s);
/* Feed received bytes.  Returns 0, or a negative errno when the connection
 * must be closed (protocol error: a GOAWAY may still be in the output). */
int grpc_session_recv(struct grpc_session *s, const uint8_t *data, size_t len);
/* Bytes ready to send (*ret_len 0 if none).  Valid until the next call into
 * the session.  Returns a negative errno on a fatal session error. */
int grpc_session_output(struct grpc_session *s, const uint8_t **ret_data, size_t *ret_len);
void grpc_session_consume(struct grpc_session *s, size_t n);
bool grpc_session_want_read(struct grpc_session *s);
/* False once the session is finished (GOAWAY exchanged, no streams, nothing
 * left to send): the transport closes the connection. */
bool grpc_session_alive(struct grpc_session *s);
size_t grpc_session_pending_output(struct grpc_session *s);
unsigned grpc_session_streams(const struct grpc_session *s);

/* Completing a call: exactly one of these, exactly once.  Return 0, or
 * -ECANCELED when the stream is gone (the completion is discarded; the handle
 * is freed either way). */
int grpc_call_reply(struct grpc_call *c, const void *msg, size_t len);
int grpc_call_reply_pb(struct grpc_call *c, const ProtobufCMessage *msg);
int grpc_call_fail(struct grpc_call *c, enum grpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Server streaming (see the top): queue one message.  0, -ECANCELED (the
 * stream is gone or ended: the handler still ends the call), -ENOBUFS (the
 * queue would pass GRPC_STREAM_MAX: nothing queued), -EIO. */
#define GRPC_STREAM_HIGH (256u << 10) /* grpc_call_writable() false from here */
#define GRPC_STREAM_MAX (4u << 20)    /* queued bytes a call may never pass */
int grpc_call_send_pb(struct grpc_call *c, const ProtobufCMessage *msg);
/* The same with a message already packed (len bytes). */
int grpc_call_send(struct grpc_call *c, const void *msg, size_t len);
/* End a call, streaming or not, with code (OK allowed: a stream of the
 * messages sent, maybe none).  Frees the handle like grpc_call_fail. */
int grpc_call_end(struct grpc_call *c, enum grpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The queue is below GRPC_STREAM_HIGH and the stream is open. */
bool grpc_call_writable(const struct grpc_call *c);
/* Bytes queued and not yet taken by nghttp2. */
size_t grpc_call_queued(const struct grpc_call *c);
/* cb runs from the session's output step (never from inside a grpc_call_*
 * function) when the queue of a stream that sent messages fell below half
 * of GRPC_STREAM_HIGH or ran empty: the handler sends more, or ends. */
typedef void (*grpc_writable_fn)(struct grpc_call *call, void *opaque);
void grpc_call_on_writable(struct grpc_call *c, grpc_writable_fn cb, void *opaque);

const char *grpc_call_method(const struct grpc_call *c);
/* Absolute deadline (CLOCK_MONOTONIC us); always set (bounded by max_deadline_ms). */
uint64_t grpc_call_deadline(const struct grpc_call *c);
bool grpc_call_cancelled(const struct grpc_call *c);
/* cb runs at most once, when the call is abandoned before completion; the
 * handler must still complete the call afterwards (which then frees it). */
void grpc_call_on_cancel(struct grpc_call *c, grpc_cancel_fn cb, void *opaque);

/* --- pure helpers (exposed for tests) --- */
/* Parse a grpc-timeout value ("1*8DIGIT unit", unit in H M S m u n) into
 * microseconds (rounded up).  -EINVAL on malformed input. */
int grpc_parse_timeout(const char *s, size_t len, uint64_t *ret_us);
/* Percent-encode a grpc-message (RFC 3986-ish as the gRPC spec says: bytes
 * outside 0x20..0x7e and '%' become %XX).  Returns a malloc'd string. */
char *grpc_percent_encode(const char *s);

/* --- unix socket transport (grpc_unix.c) --- */
struct grpc_listener;
typedef void (*grpc_drained_fn)(struct grpc_listener *ln, void *opaque);

/* Listen on path.  A stale socket is removed first; -EADDRINUSE when a live
 * server answers there, -EEXIST when the path is not a socket.  The socket is
 * created under a umask that gives it mode at most, then chmod'ed to mode
 * before listen(2): it is never reachable with a wider mode. */
int grpc_listener_new(struct loop *loop, struct grpc_server *srv, const char *path,
                      unsigned mode, struct grpc_listener **ret);
/* Stop accepting, remove the socket, GOAWAY every connection; cb runs once
 * every connection is gone, or after grace_ms when the rest are closed. */
void grpc_listener_shutdown(struct grpc_listener *ln, uint64_t grace_ms, grpc_drained_fn cb,
                            void *opaque);
void grpc_listener_free(struct grpc_listener *ln);
unsigned grpc_listener_connections(const struct grpc_listener *ln);
