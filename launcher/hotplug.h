/* SPDX-License-Identifier: Apache-2.0 */
/* hotplug.h: keeps a live domain's disks in step with the volumes directories.
 *
 * Owns: the inotify watches on the volumes directories (one or more, scanned
 * together: a disk name in two of them is refused, volumes.h) and the
 * per-volume state machine, keyed by directory and name (pending ->
 * attaching -> attached -> detaching -> gone; or failed; stuck when the guest
 * does not release a disk).  A volume directory that appears is attached
 * once its metadata is valid and its socket accepts a connection (both
 * checked again on a short timer, up to ready_timeout_ms); one that
 * disappears is detached and then looked for in the live XML until the
 * guest released it (up to detach_timeout_ms, then a warning).  Each disk
 * goes to its slot (layout.h: a listed disk's own, an unlisted one's from
 * the ledger); the report file (disks, and the volumes that are not disks
 * with state and reason) is rewritten after each change.
 *
 * Every libvirt call goes through the virt thread (virt_thread.h), bounded
 * by call_timeout_ms; nothing here waits for libvirt.  An attach that passes
 * the bound is reported (log line, report state "attach-timed-out") and the
 * volume failed, its slot kept; if libvirt later completes it the disk is
 * adopted (logged late=1), if it fails the volume stays failed.  While a
 * call is stuck, attaches and detaches wait, with a warning naming the
 * stuck call (an attach still gets refused after ready_timeout_ms). */
#pragma once

#include "domain_xml.h"
#include "qsd/base/loop.h"
#include "virt_thread.h"
#include "vmspec.h"

#include <libvirt/libvirt.h>

struct hotplug;

struct hotplug_config {
    struct slot_ledger *ledger;      /* slots of unlisted volumes (layout.h), saved on change */
    const char *report_path;         /* volume -> guest address report, rewritten on change */
    bool cidata;                     /* the domain has a cidata disk (for the report) */
    const char *const *volumes_dirs; /* canonical paths */
    size_t n_volumes_dirs;
    unsigned ready_timeout_ms;
    unsigned detach_timeout_ms;
    unsigned call_timeout_ms;        /* bound of each libvirt call */
};

/* initial: the disks the domain was started with (volumes are copied). */
int hotplug_new(struct loop *l, struct virt_thread *vt, const struct vm_spec *spec,
                const struct hotplug_config *cfg, const struct domain_disk *initial,
                size_t n_initial, struct hotplug **ret);
/* Something may have changed (e.g. libvirt reported a removed device). */
void hotplug_kick(struct hotplug *h);
void hotplug_free(struct hotplug *h);
