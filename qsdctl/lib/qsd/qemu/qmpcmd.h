/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/qmpcmd.h: the QMP commands the project sends, one typed wrapper each.
 *
 * Owns every QMP command the project sends (qmp.c only negotiates
 * capabilities, frames, sends and matches replies): its JSON is written in exactly one builder here, its reply is
 * read by one parser here into a typed result, and errors become one
 * message, "<what> failed: <QEMU's desc> (<class>)".  No file outside
 * qmp.c and this one sends a QMP command (the ctest unit/qmp_layer greps
 * for it).
 *
 * Layers, as in libvirt's qemu_monitor_json.c:
 *   builders  qmpc_<command>(): a struct qmpc (pure, no I/O)
 *   parsers   qmpc_parse_<result>(): a reply's "return" -> a typed result
 *             (pure; replies from a QSD are checked as untrusted input:
 *             wrong types, missing fields, negative or non-integer numbers,
 *             strings with NUL bytes are refused, never trusted)
 *   runners   qmpc_send() on an asynchronous client (the CSI plugin's
 *             loop), qmpc_call() on a synchronous one, which runs the same
 *             qmpc_send() on its private loop (qmp_sync_run)
 *   typed     qmpc_export_node(), qmpc_node_size(), qmpc_grow()... : one
 *             builder + one parser + a runner; the resize sequence exists
 *             once (qmpc_grow, asynchronous) and the CLI runs it on its
 *             private loop (qmpc_grow_sync).
 * Every function returns 0 or a negative errno; ret_* outputs are set on
 * success only, *ret_msg (malloc'd) on failure only. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "qsd/qemu/qmp.h"
#include "qsd/qemu/qsdopts.h"

/* A command: its name, its arguments (owned, may be NULL) and what error
 * messages call it (the name unless the caller says better). */
struct qmpc {
    const char *cmd;
    json_t *args;
    const char *what;
};
void qmpc_clear(struct qmpc *c);
/* The same command under another name in messages ("blockdev-add of the
 * overlay"). */
struct qmpc qmpc_named(struct qmpc c, const char *what);

/* ---- builders (pure) ---- */
struct qmpc qmpc_quit(void);
struct qmpc qmpc_query_block_exports(void);
struct qmpc qmpc_query_named_block_nodes(void); /* flat */
struct qmpc qmpc_query_blockstats(void);        /* query-nodes */
struct qmpc qmpc_query_block_jobs(void);
struct qmpc qmpc_qom_list(const char *path);
struct qmpc qmpc_query_block_graph(void); /* x-debug-query-block-graph */
struct qmpc qmpc_block_resize(const char *node, uint64_t size);
/* node: a node description (qsd_file_node_json...), reference stolen. */
struct qmpc qmpc_blockdev_add(json_t *node);
/* A qcow2 node over a file node of filename (a snapshot's copy target). */
struct qmpc qmpc_blockdev_add_qcow2_file(const char *node, const char *filename);
struct qmpc qmpc_blockdev_del(const char *node);
struct qmpc qmpc_blockdev_snapshot(const char *node, const char *overlay);
/* sync=full copy of device into target. */
struct qmpc qmpc_blockdev_backup(const char *job, const char *device, const char *target);
/* Stream into device from base_node's child up (base_node NULL: everything;
 * backing_file then NULL too). */
struct qmpc qmpc_block_stream(const char *job, const char *device, const char *base_node,
                              const char *backing_file);
struct qmpc qmpc_block_job_cancel(const char *job); /* force */
/* qom-set of the volume's throttle group's limits (qsdopts.h), and its
 * qom-get. */
struct qmpc qmpc_set_limits(const struct qsd_limits *l);
struct qmpc qmpc_get_limits(void);
/* An operator's command, as typed (qsdctl qmp); args stolen. */
struct qmpc qmpc_raw(const char *cmd, json_t *args);

/* ---- parsers (pure) ---- */
/* query-block-exports: the node export id serves.  -ENOENT: no such
 * export; -EBADMSG: malformed. */
int qmpc_parse_export_node(json_t *ret, const char *export_id, char **ret_node);
/* query-named-block-nodes: node's virtual size.  -ENOENT / -EBADMSG. */
int qmpc_parse_node_size(json_t *ret, const char *node, uint64_t *ret_size);
/* query-block-jobs: is job among them? */
int qmpc_parse_job_listed(json_t *ret, const char *job, bool *ret_listed);
/* qom-list: how many iothread objects. */
int qmpc_parse_iothreads(json_t *ret, unsigned *ret_n);
/* query-blockstats (query-nodes): the discard figures of the file driver
 * summed over nodes (the only I/O accounting QSD 10.0 keeps for an
 * exported node). */
struct qmpc_discard {
    uint64_t ops, bytes;
};
int qmpc_parse_discard(json_t *ret, struct qmpc_discard *ret_stats);
/* x-debug-query-block-graph: the graph (an object with "nodes" and
 * "edges" arrays, layers.h reads it), a new reference. */
int qmpc_parse_block_graph(json_t *ret, json_t **ret_graph);
/* x-debug-query-block-graph's graph: the child (its "file" edge) of
 * filter node, borrowed from graph.  -ENOENT: no such node or edge. */
int qmpc_parse_filter_child(json_t *graph, const char *filter, const char **ret_child);
/* qom-get of a throttle group's limits: the eight of qsdopts.h (absent
 * ones 0).  -EBADMSG: not an object, a limit not a non-negative integer. */
int qmpc_parse_limits(json_t *ret, struct qsd_limits *ret_limits);
/* Does a BLOCK_JOB_* event's data name job (its "device" or "id")? */
bool qmpc_event_is_job(json_t *data, const char *job);
/* A BLOCK_JOB_COMPLETED event's error text, NULL when the job succeeded. */
const char *qmpc_job_error(json_t *data);

/* ---- runners ---- */
/* "<what> failed: <desc> (<class>)" for a failed reply, and the errno its
 * text implies (util.h errno_from_text), or status. */
int qmpc_fail_msg(const struct qmpc *c, int status, const struct qmp_error *e, char **ret_msg);
/* Send c (consumed) on an asynchronous client. */
int qmpc_send(struct qmp *q, struct qmpc c, uint64_t timeout_ms, qmp_reply_cb cb, void *opaque);
/* Run c (consumed) on a synchronous client; *ret_return (may be NULL) gets a
 * new reference.  ret_refused (may be NULL): true when QEMU answered with
 * an error (nothing changed), false when the outcome is unknown (no reply:
 * timeout, connection lost). */
int qmpc_call(struct qmp_sync *s, struct qmpc c, json_t **ret_return, bool *ret_refused,
              char **ret_msg);

/* ---- typed, synchronous (the CLI, workers, start-up) ---- */
/* Connect to the monitor of volume's QSD under run_dir. */
int qmpc_connect_volume(const char *run_dir, const char *volume, uint64_t timeout_ms,
                        struct qmp_sync **ret, char **ret_msg);
/* The top layer of the volume: the node the writable export
 * (QSD_EXPORT_ID) serves, or under the throttle filter QSD_THROTTLE_NODE
 * its child (a QSD started before the filter serves the layer itself). */
int qmpc_export_node(struct qmp_sync *s, char **ret_node, char **ret_msg);
int qmpc_node_size(struct qmp_sync *s, const char *node, uint64_t *ret_size, char **ret_msg);
/* Is job listed by query-block-jobs? 1 yes, 0 no. */
int qmpc_job_listed(struct qmp_sync *s, const char *job, char **ret_msg);
int qmpc_iothreads(struct qmp_sync *s, unsigned *ret_n, char **ret_msg);
int qmpc_block_graph(struct qmp_sync *s, json_t **ret_graph, char **ret_msg);
/* Wait at most timeout_ms for job's BLOCK_JOB_COMPLETED: "waiting for the
 * <what> failed: ..." when it does not come, "<what> failed: <error>" when
 * the job failed.  *ret_ended: the job reported its end (failed or not). */
int qmpc_job_wait(struct qmp_sync *s, const char *job, const char *what, uint64_t timeout_ms,
                  bool *ret_ended, char **ret_msg);
/* Cancel job (force) and give it at most wait_ms to report
 * BLOCK_JOB_CANCELLED; errors are ignored (it may have finished). */
void qmpc_job_cancel(struct qmp_sync *s, const char *job, uint64_t wait_ms);

/* ---- the resize sequence ---- */
/* Grow the export's node to size: query-block-exports, then
 * query-named-block-nodes, then block_resize unless it is already that
 * large.  A node larger than size is left alone (*size is what it has) or,
 * with refuse_shrink, refused (-EINVAL, "refusing to shrink ...").
 * cb gets status, the node's size afterwards, and a message when status < 0
 * (borrowed); it is called exactly once unless q is closed first. */
typedef void (*qmpc_grow_cb)(int status, uint64_t size, const char *msg, void *opaque);
int qmpc_grow(struct qmp *q, uint64_t size, bool refuse_shrink, uint64_t timeout_ms,
              qmpc_grow_cb cb, void *opaque);
int qmpc_grow_sync(struct qmp_sync *s, uint64_t size, bool refuse_shrink, uint64_t *ret_size,
                   char **ret_msg);
/* The export node's size (query-block-exports + query-named-block-nodes). */
int qmpc_export_size(struct qmp_sync *s, uint64_t *ret_size, char **ret_msg);

/* ---- typed, asynchronous (the CSI plugin's loop, QSD supervision) ---- */
/* query-blockstats: cb gets status (-ETIMEDOUT: no answer in time) and the
 * figures on success. */
typedef void (*qmpc_discard_cb)(int status, const struct qmpc_discard *st, void *opaque);
int qmpc_discard_stats(struct qmp *q, uint64_t timeout_ms, qmpc_discard_cb cb, void *opaque);
/* qom-set of the throttle group's limits: cb gets status and, on failure,
 * a message (borrowed); called exactly once unless q is closed first. */
typedef void (*qmpc_done_cb)(int status, const char *msg, void *opaque);
int qmpc_set_limits_async(struct qmp *q, const struct qsd_limits *l, uint64_t timeout_ms,
                          qmpc_done_cb cb, void *opaque);
/* quit: the QSD's exit is the answer that matters; the reply is ignored. */
int qmpc_quit_async(struct qmp *q, uint64_t timeout_ms);
