/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/qmp.h: QMP transport to qemu-storage-daemon, on the project loop.
 *
 * Layers (as in libvirt's qemu_monitor_json.c):
 *   framing   qmp_parser_*: bytes -> one JSON message per line (pure, no I/O)
 *   transport struct qmp: non-blocking unix socket on a struct loop; greeting,
 *             capabilities negotiation, commands with an id and a callback,
 *             replies matched by id, events dispatched to one handler
 *   sync      struct qmp_sync: a private loop driving the same code until the
 *             reply arrives; for code that may block: the CLI, the CSI
 *             plugin's worker processes and its start-up (before its loop
 *             runs), and tests
 * The commands themselves (their JSON, their replies) are qmpcmd.h's: no
 * other file calls qmp_send(), qmp_send_owned() or qmp_sync_call() (the
 * ctest unit/qmp_layer checks it).
 * Every command has a deadline; a connection that breaks fails every pending
 * command with -ECONNRESET (-ETIMEDOUT when it never became ready in time).
 * QEMU errors carry QEMU's class and description. */
#pragma once

#include <sys/types.h>

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qsd/base/loop.h"

#define QMP_MAX_LINE (16u << 20) /* a message longer than this breaks the connection */
#define QMP_DEFAULT_TIMEOUT_MS 10000

/* ---- framing (pure) ---- */
enum qmp_msg_kind { QMP_MSG_GREETING, QMP_MSG_RETURN, QMP_MSG_ERROR, QMP_MSG_EVENT, QMP_MSG_UNKNOWN };

struct qmp_parser {
    char *buf;
    size_t len, cap;
};
typedef void (*qmp_msg_fn)(json_t *msg, void *opaque); /* msg is borrowed */
/* Feed bytes; calls fn for each complete line that holds a JSON object.
 * Returns 0, -EMSGSIZE (line too long) or -EBADMSG (not a JSON object). */
int qmp_parser_feed(struct qmp_parser *p, const char *data, size_t len, qmp_msg_fn fn, void *opaque);
void qmp_parser_free(struct qmp_parser *p);
enum qmp_msg_kind qmp_classify(json_t *msg);
/* Serialise a command: {"execute":..., "arguments":..., "id":...}\n. args may be NULL. */
char *qmp_format_command(const char *cmd, json_t *args, const char *id);

/* ---- errors ---- */
struct qmp_error {
    char *klass; /* QEMU's error class ("GenericError"...), or ours ("Timeout"...) */
    char *desc;
};
void qmp_error_clear(struct qmp_error *e);
void qmp_error_set(struct qmp_error *e, const char *klass, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- asynchronous client ---- */
struct qmp;

struct qmp_reply {
    int status;       /* 0; -EREMOTEIO (QEMU error, see err); -ETIMEDOUT; -ECONNRESET */
    json_t *ret;      /* borrowed: the "return" member on success */
    const struct qmp_error *err; /* set when status != 0 */
};
typedef void (*qmp_reply_cb)(struct qmp *q, const struct qmp_reply *r, void *opaque);
typedef void (*qmp_event_cb)(struct qmp *q, const char *event, json_t *data, void *opaque);
/* status 0: negotiated and ready; < 0: connect/negotiation failed or the
 * connection closed later (err says why). */
typedef void (*qmp_state_cb)(struct qmp *q, int status, const struct qmp_error *err, void *opaque);

/* Connect and negotiate capabilities within timeout_ms.  state_cb is called
 * once with 0 when ready, and once more with < 0 if the connection later
 * fails (or with < 0 instead of 0 if it never became ready). */
int qmp_connect(struct loop *l, const char *path, uint64_t timeout_ms, qmp_state_cb state_cb,
                void *opaque, struct qmp **ret);
void qmp_set_event_handler(struct qmp *q, qmp_event_cb cb, void *opaque);
/* Send cmd with args (reference stolen, may be NULL).  cb is called exactly
 * once, unless the client is closed first. */
int qmp_send(struct qmp *q, const char *cmd, json_t *args, uint64_t timeout_ms, qmp_reply_cb cb,
             void *opaque);
/* The same; release(opaque) is called instead of cb if the client is
 * closed before the reply (a wrapper that allocated opaque frees it). */
int qmp_send_owned(struct qmp *q, const char *cmd, json_t *args, uint64_t timeout_ms,
                   qmp_reply_cb cb, void *opaque, void (*release)(void *opaque));
bool qmp_ready(struct qmp *q);
/* Close the connection; pending callbacks are dropped without being called. */
void qmp_close(struct qmp *q);

/* ---- synchronous client (code that may block; see the top) ---- */
struct qmp_sync;
int qmp_sync_connect(const char *path, uint64_t timeout_ms, struct qmp_sync **ret,
                     struct qmp_error *err);
/* Run one command; on success *ret_return (may be NULL) gets a new reference.
 * The transport's own tests use it; the project's code runs typed commands
 * with qmpc_call() (qmpcmd.h). */
int qmp_sync_call(struct qmp_sync *s, const char *cmd, json_t *args, uint64_t timeout_ms,
                  json_t **ret_return, struct qmp_error *err);
/* Wait for an event named `event` whose data matches (match may be NULL).
 * Events received since connect are kept (bounded) and searched first. */
int qmp_sync_wait_event(struct qmp_sync *s, const char *event,
                        bool (*match)(json_t *data, void *opaque), void *opaque,
                        uint64_t timeout_ms, json_t **ret_data, struct qmp_error *err);
void qmp_sync_close(struct qmp_sync *s);
/* The asynchronous client under s (NULL once closed), to send the same
 * commands (qmpcmd.h), and its private loop run until *done is set (every
 * command has a deadline, so this is bounded).  A failure of the loop
 * itself closes the client (pending callbacks are dropped). */
struct qmp *qmp_sync_client(struct qmp_sync *s);
int qmp_sync_run(struct qmp_sync *s, const bool *done);
/* The uid and gid of the process serving the monitor (SO_PEERCRED): the
 * QSD's own identity (qsdconf.h), to hand it a file it must open. */
int qmp_sync_peer(struct qmp_sync *s, uid_t *ret_uid, gid_t *ret_gid);
