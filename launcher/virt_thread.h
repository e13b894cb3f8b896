/* SPDX-License-Identifier: Apache-2.0 */
/* virt_thread.h: the one thread that makes the running launcher's libvirt
 * calls, so that none is made on the event loop.
 *
 * Owns: that thread, its bounded request queue (VIRT_QUEUE_MAX calls), the
 * eventfd through which replies reach the loop, and each call's deadline (a
 * loop timer).  Calls run one at a time, in submission order.
 *
 * A libvirt call cannot be cancelled: one that blocks (QEMU stuck in device
 * realize on a vhost-user server that accepted and then stopped answering,
 * docs/launcher.md "Hot-plug") holds the thread until libvirt returns.
 * When a call's deadline passes:
 *   - still queued: it is dropped and never runs; done gets -ETIMEDOUT with
 *     started = false, and nothing follows;
 *   - running: done gets -ETIMEDOUT with started = true at once, and again,
 *     with late = true and the real status, when libvirt returns (the
 *     caller's opaque must live until then).  Until it returns the call is
 *     "stuck" (virt_thread_stuck): callers do not submit more (it would only
 *     queue behind it) and say why.
 * Nothing here logs what it reports through done (the caller logs once),
 * only a call still inside libvirt when the launcher exits.
 * Used only on the loop's thread, except for what the thread itself touches
 * (queue and finished list, under a mutex). */
#pragma once

#include "qsd/base/loop.h"

#include <libvirt/libvirt.h>
#include <stdbool.h>
#include <stdint.h>

#define VIRT_QUEUE_MAX 32

struct virt_thread;

struct virt_reply {
    int status;        /* 0, -EIO (libvirt failed: error), -ETIMEDOUT (bound passed) */
    const char *error; /* libvirt's message when status is -EIO, else NULL */
    char *text;        /* what fn returned in *ret_text (e.g. an XML); borrowed */
    bool started;      /* -ETIMEDOUT: the call was running (a late reply follows) */
    bool late;         /* the real result of a call that timed out while running */
    uint64_t ms;       /* time spent inside libvirt (0 if it never ran) */
};

/* Runs on the thread: one libvirt call on dom.  Returns < 0 when libvirt
 * failed (its thread-local error is the reply's error).  May set *ret_text
 * (malloc'd). */
typedef int (*virt_fn)(virDomainPtr dom, const char *arg, char **ret_text);
/* Runs on the loop's thread. */
typedef void (*virt_done)(const struct virt_reply *r, void *opaque);

int virt_thread_new(struct loop *l, virDomainPtr dom, struct virt_thread **ret);
/* Queue fn(dom, arg) with a bound of timeout_ms from now.  what names the
 * call in messages ("attach volume=data").  -EBUSY: the queue is full. */
int virt_call(struct virt_thread *t, const char *what, virt_fn fn, const char *arg,
              uint64_t timeout_ms, virt_done done, void *opaque);
/* The call that passed its bound and is still inside libvirt: its `what`,
 * and *ret_ms how long it has been running; NULL when none. */
const char *virt_thread_stuck(const struct virt_thread *t, uint64_t *ret_ms);
/* After the loop has stopped: drop queued calls (done is not called for
 * anything any more), wait up to join_ms for the running call to return
 * and the thread to end.  -ETIMEDOUT: it did not (logged); the thread and t
 * are left alive (it still uses the domain: the caller must not free it). */
int virt_thread_free(struct virt_thread *t, unsigned join_ms);
