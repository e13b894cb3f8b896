/* hotplug.h: keeps a live domain's disks in step with the volumes directories.
 *
 * Owns: the inotify watches on the volumes directories (one or more, scanned
 * together: a disk name in two of them is refused, volumes.h) and the
 * per-volume state machine (keyed by directory and name) (pending -> attached -> detaching -> gone, or failed/stuck).  A
 * volume directory that appears is attached once its metadata is valid and
 * its socket accepts a connection (both checked again on a short timer, up to
 * ready_timeout_ms); one that disappears is detached and then polled in the
 * live XML until the guest released it (up to detach_timeout_ms, then a
 * warning).  Each disk goes to its slot (layout.h: a listed disk's own, an
 * unlisted one's from the ledger); the report file is rewritten after each
 * change.  The libvirt calls block, so each is made only when it cannot
 * hang on the socket (probed just before). */
#pragma once

#include "domain_xml.h"
#include "qsd/base/loop.h"
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
};

/* initial: the disks the domain was started with (volumes are copied). */
int hotplug_new(struct loop *l, virDomainPtr dom, const struct vm_spec *spec,
                const struct hotplug_config *cfg, const struct domain_disk *initial,
                size_t n_initial, struct hotplug **ret);
/* Something may have changed (e.g. libvirt reported a removed device). */
void hotplug_kick(struct hotplug *h);
void hotplug_free(struct hotplug *h);
