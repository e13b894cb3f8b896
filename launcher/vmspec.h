/* SPDX-License-Identifier: Apache-2.0 */
/* vmspec.h: the VM description file (JSON), parsed and validated strictly.
 *
 * Owns: the schema of the description (see docs/launcher.md), its limits and
 * the struct the rest of the launcher consumes.  No I/O beyond reading the
 * file.  Unknown keys, wrong types, absurd sizes, names that are not plain
 * identifiers and paths that are not clean absolute paths are refused with a
 * human-readable message. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define VM_MAX_VCPUS 256
#define VM_MIN_MEMORY_MIB 16
#define VM_MAX_MEMORY_MIB (1024u * 1024u) /* 1 TiB */
#define VM_MAX_DISKS 64
#define VM_MAX_HOTPLUG_SLOTS 64
#define VM_MAX_BOOT_ORDER 64
#define VM_MAX_PATH 1024
#define VM_MAX_CMDLINE 2048
#define VM_SPEC_MAX_FILE (256 * 1024)
#define VM_MAX_SLOT 64            /* a listed disk's "slot" */
#define VM_MAX_DISK_SLOTS_PC 22   /* pc: disks on the root bus, slots 0x0a..0x1f */
#define VM_MAX_PORT_FORWARDS 32
#define VM_CLOUD_INIT_MAX (64 * 1024) /* each inline NoCloud file */

enum vm_boot { VM_BOOT_KERNEL, VM_BOOT_VOLUME };
enum vm_machine_family { VM_MACHINE_Q35, VM_MACHINE_PC };
enum vm_firmware { VM_FIRMWARE_BIOS, VM_FIRMWARE_UEFI };

struct vm_disk {
    char *volume;        /* directory name under the volumes directory */
    char *bus;           /* "virtio" (the only bus a vhost-user disk has) */
    unsigned boot_order; /* 0: none */
    unsigned slot;       /* guest PCI slot (1..), explicit or by list order */
    bool hotplug;        /* not needed at start: attached when it appears */
};

struct vm_port_forward {
    char proto[4];       /* "tcp" or "udp" */
    unsigned port;       /* in the pod (1..65535) */
    unsigned guest_port; /* in the guest */
};

struct vm_network {
    bool enabled;        /* default true: one virtio NIC on user-mode networking */
    char mac[18];        /* given, or derived from the VM name */
    bool mac_given;
    struct vm_port_forward *forwards;
    size_t n_forwards;
};

/* NoCloud files given inline in the description (NULL: not given). */
struct vm_cloud_init {
    char *user_data, *meta_data, *network_config;
};

struct vm_spec {
    char *name;
    unsigned vcpus;
    uint64_t memory_mib;
    char *machine; /* "q35" (default), "pc-q35-X.Y", "pc", "pc-i440fx-X.Y" */
    enum vm_machine_family family;
    char *accel; /* "kvm" (default) or "tcg" */
    enum vm_boot boot;
    char *kernel, *initrd, *cmdline; /* VM_BOOT_KERNEL (initrd, cmdline optional) */
    char *boot_volume;               /* VM_BOOT_VOLUME */
    struct vm_disk *disks;
    size_t n_disks;
    char *console_log; /* NULL: the launcher's default log file */
    unsigned hotplug_slots;
    unsigned listed_slots; /* highest slot of a listed disk (0: none) */
    struct vm_network net;
    struct vm_cloud_init cloud_init;
    enum vm_firmware firmware;
    bool pci_hole64_off; /* "pci_hole64": false: <pcihole64>0</pcihole64> */
};

/* Disk slots of the layout: listed_slots + hotplug_slots (slots above
 * listed_slots take unlisted and hot-plugged volumes). */
unsigned vm_spec_disk_slots(const struct vm_spec *s);

/* Parse and validate a description held in memory.  On failure returns a
 * negative errno and, when ret_error is not NULL, a malloc'd message. */
int vm_spec_parse(const char *text, size_t len, struct vm_spec **ret, char **ret_error);
/* Read path (at most VM_SPEC_MAX_FILE bytes) and parse it. */
int vm_spec_load(const char *path, struct vm_spec **ret, char **ret_error);
void vm_spec_free(struct vm_spec *s);
/* The disk entry naming volume, or NULL. */
const struct vm_disk *vm_spec_find_disk(const struct vm_spec *s, const char *volume);
/* Clean absolute path: starts with '/', printable ASCII, no "." or ".."
 * components, no empty components, at most VM_MAX_PATH bytes. */
bool vm_path_is_clean(const char *p);
