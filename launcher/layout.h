/* SPDX-License-Identifier: Apache-2.0 */
/* layout.h: the guest's PCI layout, deterministic from the description.
 *
 * Owns: where every device sits on the guest's PCI buses (disk slots, the
 * NIC, the virtio-serial controller, the cidata disk), the address the guest
 * sees for each (what /dev/disk/by-path names), the ledger that keeps the
 * slots of volumes the description does not list across hot-unplug and VM
 * restarts (a small JSON file in the launcher's root), and the report file
 * mapping volume -> guest address (plus the volumes that are not disks,
 * with state and reason).  The rule (docs/launcher.md):
 *
 *   - disk slots 1..listed_slots belong to the description's disks (their
 *     "slot", or the lowest free one in list order); slots above, up to
 *     listed_slots + hotplug_slots, take other volumes: the slot the ledger
 *     recorded for that name if free, else the lowest free one not recorded
 *     for another name, else the lowest free one;
 *   - q35: disk slot s is the device on PCIe root port s (controller index
 *     s, at 00:SS.F with SS = 1 + (s-1)/8, F = (s-1)%8); every port exists
 *     from the start, so the firmware numbers port s's bus s and the guest
 *     sees the disk at 0000:ss:00.0.  The NIC, the virtio-serial controller
 *     and the cidata disk sit on the three ports after the disk slots.
 *   - pc: disk slot s is the device at 0000:00:(0x0a+s-1).0; the NIC,
 *     virtio-serial and cidata are at slots 3, 4 and 5. */
#pragma once

#include "vmspec.h"

#include <stdbool.h>
#include <stddef.h>

enum layout_sys { LAYOUT_NET = 1, LAYOUT_SERIAL = 2, LAYOUT_CIDATA = 3 };

/* A libvirt <address type='pci'>: bus is the controller index. */
struct pci_addr {
    unsigned bus, slot, function;
    bool multifunction;
};

#define GUEST_ADDR_MAX 16 /* "0000:bb:ss.f" */

/* Number of pcie-root-ports (q35; 0 on pc). */
unsigned layout_root_ports(const struct vm_spec *s);
/* Address of root port `index` (1..) on bus 0. */
void layout_port_addr(unsigned index, struct pci_addr *ret);
/* Disk slot -> its libvirt address and the guest's PCI address. */
void layout_disk_addr(const struct vm_spec *s, unsigned slot, struct pci_addr *ret,
                      char guest[GUEST_ADDR_MAX]);
void layout_sys_addr(const struct vm_spec *s, enum layout_sys which, struct pci_addr *ret,
                     char guest[GUEST_ADDR_MAX]);

/* Slots of volumes the description does not list, by disk name. */
struct slot_ledger;
/* path NULL: an empty ledger that is never saved.  A missing file is an
 * empty ledger; an unreadable or invalid one is logged and ignored. */
struct slot_ledger *slot_ledger_load(const char *path, const struct vm_spec *spec);
void slot_ledger_free(struct slot_ledger *l);
/* The slot for an unlisted volume `name`, given the slots in use
 * (in_use[1..vm_spec_disk_slots]); 0 when every slot is taken.  Records it
 * (saved by slot_ledger_save). */
unsigned slot_ledger_pick(struct slot_ledger *l, const struct vm_spec *spec, const char *name,
                          const bool *in_use);
int slot_ledger_save(struct slot_ledger *l);

/* One line of the report. */
struct report_disk {
    const char *volume;  /* disk name */
    const char *id;      /* volume id */
    const char *dir;     /* volumes directory */
    unsigned slot;
    bool at_start;
};
/* A volume found in a volumes directory that is not a disk (yet). */
struct report_volume {
    const char *volume; /* disk name */
    const char *dir;    /* volumes directory */
    const char *state;  /* "pending", "attaching", "failed", "attach-timed-out" */
    const char *reason; /* why (NULL: none known) */
};
/* Write path atomically: JSON with the VM name, each disk's volume, slot,
 * guest PCI address and /dev/disk/by-path name, the NIC's MAC and address,
 * the cidata disk's address (when there is one), and every volume that is
 * not a disk with its state and reason ("not_attached"). */
int layout_report_write(const char *path, const struct vm_spec *spec, const struct report_disk *d,
                        size_t n, const struct report_volume *w, size_t nw, bool cidata);
