/* SPDX-License-Identifier: Apache-2.0 */
/* layout.c: see layout.h. */
#include "layout.h"
#include "qsd/base/log.h"
#include "qsd/base/names.h"
#include "qsd/base/util.h"

#include <jansson.h>

#define COMP "layout"
#define LEDGER_MAX_FILE (64 * 1024)
#define PC_DISK_SLOT0 0x0a

unsigned layout_root_ports(const struct vm_spec *s)
{
    return s->family == VM_MACHINE_Q35 ? vm_spec_disk_slots(s) + 3 : 0;
}

void layout_port_addr(unsigned index, struct pci_addr *ret)
{
    *ret = (struct pci_addr){.bus = 0,
                             .slot = 1 + (index - 1) / 8,
                             .function = (index - 1) % 8,
                             .multifunction = (index - 1) % 8 == 0};
}

static void guest_fmt(unsigned bus, unsigned slot, unsigned fn, char out[GUEST_ADDR_MAX])
{
    snprintf(out, GUEST_ADDR_MAX, "0000:%02x:%02x.%x", bus & 0xff, slot & 0x1f, fn & 7);
}

void layout_disk_addr(const struct vm_spec *s, unsigned slot, struct pci_addr *ret,
                      char guest[GUEST_ADDR_MAX])
{
    if (s->family == VM_MACHINE_Q35) {
        *ret = (struct pci_addr){.bus = slot};
        guest_fmt(slot, 0, 0, guest);
    } else {
        *ret = (struct pci_addr){.bus = 0, .slot = PC_DISK_SLOT0 + slot - 1};
        guest_fmt(0, ret->slot, 0, guest);
    }
}

void layout_sys_addr(const struct vm_spec *s, enum layout_sys which, struct pci_addr *ret,
                     char guest[GUEST_ADDR_MAX])
{
    if (s->family == VM_MACHINE_Q35) {
        unsigned port = vm_spec_disk_slots(s) + (unsigned)which;
        *ret = (struct pci_addr){.bus = port};
        guest_fmt(port, 0, 0, guest);
    } else {
        *ret = (struct pci_addr){.bus = 0, .slot = 2 + (unsigned)which};
        guest_fmt(0, ret->slot, 0, guest);
    }
}

struct ledger_entry {
    char *name;
    unsigned slot;
};

struct slot_ledger {
    char *path;
    struct ledger_entry *e;
    size_t n;
};

void slot_ledger_free(struct slot_ledger *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++)
        free(l->e[i].name);
    free(l->e);
    free(l->path);
    free(l);
}

static struct ledger_entry *ledger_find(struct slot_ledger *l, const char *name)
{
    for (size_t i = 0; i < l->n; i++)
        if (streq(l->e[i].name, name))
            return &l->e[i];
    return NULL;
}

static void ledger_set(struct slot_ledger *l, const char *name, unsigned slot)
{
    struct ledger_entry *e = ledger_find(l, name);
    if (!e) {
        l->e = xrealloc(l->e, (l->n + 1) * sizeof(*l->e));
        e = &l->e[l->n++];
        e->name = xstrdup(name);
    }
    e->slot = slot;
}

/* {"version": 1, "slots": {"name": slot, ...}} */
struct slot_ledger *slot_ledger_load(const char *path, const struct vm_spec *spec)
{
    struct slot_ledger *l = xcalloc(1, sizeof(*l));
    if (!path)
        return l;
    l->path = xstrdup(path);
    _cleanup_free_ char *data = NULL;
    size_t len;
    int r = read_file(path, LEDGER_MAX_FILE, &data, &len);
    if (r == -ENOENT)
        return l;
    if (r < 0) {
        log_warn(COMP, "slot ledger ignored", "file=%s error=\"%s\"", path, strerror(-r));
        return l;
    }
    json_t *root = json_loadb(data, len, JSON_REJECT_DUPLICATES, NULL);
    json_t *slots = root ? json_object_get(root, "slots") : NULL;
    if (!json_is_object(slots)) {
        log_warn(COMP, "slot ledger ignored", "file=%s error=\"not a ledger\"", path);
        json_decref(root);
        return l;
    }
    const char *name;
    json_t *v;
    unsigned max = vm_spec_disk_slots(spec);
    json_object_foreach(slots, name, v) {
        const char *why;
        if (name_validate(name, &why) < 0 || !json_is_integer(v))
            continue;
        json_int_t s = json_integer_value(v);
        /* Records outside today's hot-plug range (the description changed)
         * are dropped: those slots belong to listed disks now. */
        if (s > (json_int_t)spec->listed_slots && s <= (json_int_t)max &&
            !vm_spec_find_disk(spec, name))
            ledger_set(l, name, (unsigned)s);
    }
    json_decref(root);
    return l;
}

unsigned slot_ledger_pick(struct slot_ledger *l, const struct vm_spec *spec, const char *name,
                          const bool *in_use)
{
    unsigned lo = spec->listed_slots + 1, hi = vm_spec_disk_slots(spec);
    struct ledger_entry *mine = ledger_find(l, name);
    unsigned pick = 0;
    if (mine && mine->slot >= lo && mine->slot <= hi && !in_use[mine->slot])
        pick = mine->slot;
    for (unsigned s = lo; !pick && s <= hi; s++) {
        bool reserved = false;
        for (size_t i = 0; i < l->n; i++)
            if (l->e[i].slot == s && !streq(l->e[i].name, name))
                reserved = true;
        if (!in_use[s] && !reserved)
            pick = s;
    }
    for (unsigned s = lo; !pick && s <= hi; s++)
        if (!in_use[s])
            pick = s;
    if (!pick)
        return 0;
    /* A slot taken over from another name is no longer that name's. */
    for (size_t i = 0; i < l->n; i++)
        if (l->e[i].slot == pick && !streq(l->e[i].name, name))
            l->e[i].slot = 0;
    ledger_set(l, name, pick);
    return pick;
}

int slot_ledger_save(struct slot_ledger *l)
{
    if (!l->path)
        return 0;
    json_t *slots = json_object();
    for (size_t i = 0; i < l->n; i++)
        if (l->e[i].slot)
            json_object_set_new(slots, l->e[i].name, json_integer(l->e[i].slot));
    json_t *root = json_pack("{s:i, s:o}", "version", 1, "slots", slots);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    if (!text)
        return -ENOMEM;
    int r = write_file_atomic(l->path, text, strlen(text), 0600);
    free(text);
    return r;
}

int layout_report_write(const char *path, const struct vm_spec *spec, const struct report_disk *d,
                        size_t n, const struct report_volume *w, size_t nw, bool cidata)
{
    json_t *disks = json_array();
    char guest[GUEST_ADDR_MAX];
    struct pci_addr a;
    for (size_t i = 0; i < n; i++) {
        layout_disk_addr(spec, d[i].slot, &a, guest);
        _cleanup_free_ char *by_path = xasprintf("/dev/disk/by-path/pci-%s", guest);
        json_array_append_new(disks, json_pack("{s:s, s:s, s:s, s:i, s:s, s:s, s:b}", "volume",
                                               d[i].volume, "volume_id", d[i].id, "volumes_dir",
                                               d[i].dir, "slot", (int)d[i].slot, "pci_address",
                                               guest, "by_path", by_path, "at_start",
                                               d[i].at_start));
    }
    json_t *others = json_array();
    for (size_t i = 0; i < nw; i++)
        json_array_append_new(others, json_pack("{s:s, s:s, s:s, s:s?}", "volume", w[i].volume,
                                                "volumes_dir", w[i].dir, "state", w[i].state,
                                                "reason", w[i].reason));
    json_t *root = json_pack("{s:i, s:s, s:s, s:o, s:o}", "version", 1, "vm", spec->name,
                             "machine", spec->machine, "disks", disks, "not_attached", others);
    if (spec->net.enabled) {
        layout_sys_addr(spec, LAYOUT_NET, &a, guest);
        json_object_set_new(root, "network",
                            json_pack("{s:s, s:s}", "mac", spec->net.mac, "pci_address", guest));
    }
    layout_sys_addr(spec, LAYOUT_SERIAL, &a, guest);
    json_object_set_new(root, "guest_agent",
                        json_pack("{s:s, s:s}", "channel", "org.qemu.guest_agent.0",
                                  "pci_address", guest));
    if (cidata) {
        layout_sys_addr(spec, LAYOUT_CIDATA, &a, guest);
        json_object_set_new(root, "cidata", json_pack("{s:s, s:s}", "pci_address", guest,
                                                      "label", "cidata"));
    }
    char *text = json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    if (!text)
        return -ENOMEM;
    size_t len = strlen(text);
    text = xrealloc(text, len + 2);
    text[len++] = '\n';
    text[len] = 0;
    int r = write_file_atomic(path, text, len, 0644);
    free(text);
    return r;
}
