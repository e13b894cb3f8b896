/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/worker.h: run a blocking operation in a forked child, off the event loop.
 *
 * Long operations (qemu-img convert of a big snapshot, a live backup job) are
 * written once, as plain blocking code (image.c, qmp_sync).  An event-loop
 * program such as the CSI plugin runs them through worker_start(): the child
 * runs fn and sends back its status, message and JSON result over a pipe; the
 * parent watches the pipe and the child's pidfd on its loop and calls done
 * exactly once (unless cancelled).  Every worker has a deadline after which
 * it is killed and done gets -ETIMEDOUT, once the child is gone (or 5 s
 * after the kill if it is stuck in the kernel): nothing the child does lands
 * after done.  The child's stderr is the parent's: what it logs (log.h, e.g.
 * a download's progress) is in the program's log.  The child first closes
 * every socket it inherited (a copy of the parent's QMP or client connection
 * would keep it open after the parent closed it).  No threads. */
#pragma once

#include <jansson.h>
#include <stdint.h>

#include "qsd/base/loop.h"

/* Runs in the child.  Returns 0 or a negative errno; may set *ret_msg
 * (malloc'd) and *ret_result (a new reference). */
typedef int (*worker_fn)(void *arg, char **ret_msg, json_t **ret_result);
/* Runs in the parent, on the loop.  result is borrowed (may be NULL). */
typedef void (*worker_done)(int status, const char *msg, json_t *result, void *opaque);

struct worker;
int worker_start(struct loop *l, worker_fn fn, void *arg, uint64_t timeout_ms, worker_done done,
                 void *opaque, struct worker **ret);
/* Kill the child (if still running) and free the worker; done is not called.
 * Must not be called from inside done (the worker is freed after done). */
void worker_cancel(struct worker *w);
