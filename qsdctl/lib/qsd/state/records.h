/* SPDX-License-Identifier: Apache-2.0 */
/* records.h: the plugin's record files, one store for every kind of record
 * (volumes and snapshots, state.h; bridges and hot-plug requests, bridge.h):
 * DIR/<id>.json, loaded at start, replaced atomically, made durable off the
 * event loop.
 *
 * A change is made on the loop without waiting for the disk: the new text
 * goes to a temporary file renamed over the record (or the record is
 * unlinked), so a crash of the plugin sees the old or the new record, never
 * a mix.  Each change gets the next sequence number; a flusher thread then
 * fsyncs the file and its directory and tells the loop (eventfd) up to which
 * number the disk holds the changes.  Two users of that number make the
 * whole CSI contract hold across a crash of the machine:
 *  - the gRPC server holds every answer until the changes made before it are
 *    durable (grpc_server_set_barrier(records_queued), records_on_durable);
 *  - a worker makes the pending changes durable itself, in the child, before
 *    its operation touches an image (records_flush_pending): a record says
 *    "creating" or "deleting" on disk before the image is made or removed.
 * The memory tables of the callers stay the one source of truth while the
 * plugin runs; the files are read back only at start. */
#pragma once

#include <jansson.h>
#include <stdint.h>

struct loop;
struct records;

/* Start the flusher on loop.  A NULL store (tests, tools) is accepted by
 * every function below: changes are then made durable before returning. */
int records_new(struct loop *l, struct records **ret);
/* Waits (at most 10 s: a hung disk must not keep the plugin from exiting)
 * for the changes made so far to be durable, then stops the flusher. */
void records_free(struct records *r);

/* Replace DIR/<id>.json with j (taken) written as indented JSON. */
int records_save(struct records *r, const char *dir, const char *id, json_t *j);
/* Remove DIR/<id>.json (missing is fine). */
int records_remove(struct records *r, const char *dir, const char *id);

/* Sequence number of the last change (0: none yet). */
uint64_t records_queued(const struct records *r);
/* cb runs on the loop whenever the disk holds every change up to seq; err
 * < 0 when some change up to seq could not be made durable. */
typedef void (*records_durable_fn)(uint64_t seq, int err, void *opaque);
void records_on_durable(struct records *r, records_durable_fn cb, void *opaque);
/* In a forked worker child only: fsync every change the flusher has not
 * confirmed yet (blocking).  Returns 0 or the first error. */
int records_flush_pending(const struct records *r);

/* Remove from dir the temporary files of record writes (fsat_write_*) that a
 * kill -9 cut short, and log how many.  Start-up only, before anything
 * writes in dir; records_load does it first. */
void records_sweep(const char *dir);
/* Call fn for every DIR/<id>.json whose id is a valid name (names.h), whose
 * content is a JSON object (j borrowed) and, when id_key is not NULL, whose
 * member id_key is the string id.  A record fn refuses (returns < 0, may set
 * *msg) or that cannot be read is skipped with a warning naming it. */
typedef int (*records_load_fn)(json_t *j, void *opaque, char **msg);
void records_load(const char *dir, const char *id_key, records_load_fn fn, void *opaque);
/* One record, read as records_load reads each (at most RECORD_MAX bytes,
 * duplicate keys refused): DIR/<id>.json into *ret (a new reference).
 * -EINVAL for an id that is not a valid name, -errno when unreadable,
 * -EBADMSG when not a JSON object (whose id_key member, when id_key is not
 * NULL, is the string id).  qsdctl reads the plugin's records with it. */
int records_read(const char *dir, const char *id, const char *id_key, json_t **ret);
