/* SPDX-License-Identifier: Apache-2.0 */
/* domain_xml.h: libvirt domain XML for a VM description and its volumes.
 *
 * Owns: the mapping VM description + discovered volumes -> <domain>, and the
 * <disk> element used both in the full domain and for hot-plug.  Pure: no
 * I/O; built with libxml2's tree API, so every value is escaped by libxml2. */
#pragma once

#include "layout.h"
#include "vmspec.h"
#include "volumes.h"

#include <stddef.h>

#define DISK_TARGET_MAX 16

/* "vda", "vdb", ... "vdz", "vdaa", ...: the target of disk index i. */
void disk_target_name(unsigned i, char buf[DISK_TARGET_MAX]);

/* The user alias of a volume's disk (malloc'd).  libvirt keeps a user alias
 * only when it is "ua-" followed by [A-Za-z0-9_-]; volume ids are
 * [A-Za-z0-9._-] (names.h), so '_' is written "__" and '.' "_d" (nothing
 * else changes): "ua-" + "pvc.a_b" -> "ua-pvc_da__b".  Injective, and
 * domain_alias_volume_id undoes it (NULL for an alias it cannot have made). */
char *domain_disk_alias(const char *volume_id);
char *domain_alias_volume_id(const char *alias);

/* One disk in disk slot `slot` (layout.h: its PCI address; its target is
 * disk_target_name(slot - 1)).  socket_path is the full socket path;
 * boot_order 0 = none. */
int domain_xml_disk(const struct vm_spec *spec, const struct volume *v, const char *socket_path,
                    unsigned slot, unsigned boot_order, char **ret_xml);

/* The disks of a domain at start: the description's disks first (in its
 * order; "hotplug" ones only when present), then every other ready volume
 * sorted by name, each in its slot (layout.h; other volumes' slots come from
 * the ledger, which records them).  Other volumes for which no slot is free
 * are left out (the hot-plug watcher reports them).  Two volumes with the
 * same disk name (dir) are refused with -EEXIST. */
struct domain_disk {
    const struct volume *vol;
    char target[DISK_TARGET_MAX];
    unsigned boot_order;
    unsigned slot;
};
int domain_plan_disks(const struct vm_spec *spec, struct slot_ledger *ledger,
                      struct volume *const *vols, size_t n_vols, struct domain_disk **ret,
                      size_t *ret_n, char **ret_error);

/* Paths the launcher chose in its own root (never from the description). */
struct domain_host {
    const char *console_socket; /* the serial console: QEMU connects, the launcher listens */
    const char *qga_socket;     /* the guest agent's virtio-serial channel */
    const char *cidata_image;   /* the NoCloud image, read-only; NULL: none */
};

/* The full domain.  Each volume's socket path is built from the volumes
 * directory it was found in (v->base, which must be set); two volumes with
 * the same disk name are refused (-EEXIST). */
int domain_xml_build(const struct vm_spec *spec, const struct domain_host *host,
                     struct slot_ledger *ledger, struct volume *const *vols, size_t n_vols,
                     char **ret_xml, char **ret_error);

/* Whether a (live) domain XML has a disk with target dev `target`. */
int domain_xml_has_disk(const char *xml, const char *target, bool *ret);
