/* domain_xml.h: libvirt domain XML for a VM description and its volumes.
 *
 * Owns: the mapping VM description + discovered volumes -> <domain>, and the
 * <disk> element used both in the full domain and for hot-plug.  Pure: no
 * I/O; built with libxml2's tree API, so every value is escaped by libxml2. */
#pragma once

#include "vmspec.h"
#include "volumes.h"

#include <stddef.h>

#define DISK_TARGET_MAX 16

/* "vda", "vdb", ... "vdz", "vdaa", ...: the target of disk index i. */
void disk_target_name(unsigned i, char buf[DISK_TARGET_MAX]);

/* One disk.  socket_path is the full socket path; boot_order 0 = none. */
int domain_xml_disk(const struct volume *v, const char *socket_path, const char *target,
                    unsigned boot_order, char **ret_xml);

/* The disks of a domain, in the order they appear: the description's disks
 * first (in its order), then every other ready volume sorted by name.  Two
 * volumes with the same disk name (dir) are refused with -EEXIST. */
struct domain_disk {
    const struct volume *vol;
    char target[DISK_TARGET_MAX];
    unsigned boot_order;
};
int domain_plan_disks(const struct vm_spec *spec, struct volume *const *vols, size_t n_vols,
                      struct domain_disk **ret, size_t *ret_n, char **ret_error);

/* The full domain.  Each volume's socket path is built from the volumes
 * directory it was found in (v->base, which must be set); two volumes with
 * the same disk name are refused (-EEXIST). */
int domain_xml_build(const struct vm_spec *spec, struct volume *const *vols, size_t n_vols,
                     char **ret_xml, char **ret_error);

/* Whether a (live) domain XML has a disk with target dev `target`. */
int domain_xml_has_disk(const char *xml, const char *target, bool *ret);
