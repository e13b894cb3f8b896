/* SPDX-License-Identifier: Apache-2.0 */
/* domain_xml.c: see domain_xml.h. */
#include "domain_xml.h"
#include "qsd/base/util.h"

#include <libxml/tree.h>
#include <libxml/xmlsave.h>

#define X(s) ((const xmlChar *)(s))

void disk_target_name(unsigned i, char buf[DISK_TARGET_MAX])
{
    /* Bijective base 26, like libvirt's virDiskNameToIndex inverse. */
    char rev[8];
    int n = 0;
    unsigned v = i + 1;
    while (v && n < (int)sizeof(rev)) {
        v--;
        rev[n++] = (char)('a' + v % 26);
        v /= 26;
    }
    int o = 0;
    buf[o++] = 'v';
    buf[o++] = 'd';
    while (n)
        buf[o++] = rev[--n];
    buf[o] = 0;
}

char *domain_disk_alias(const char *volume_id)
{
    size_t n = strlen(volume_id);
    char *a = xmalloc(3 + 2 * n + 1), *o = a;
    o = stpcpy(o, "ua-");
    for (const char *c = volume_id; *c; c++) {
        if (*c == '_' || *c == '.') {
            *o++ = '_';
            *o++ = *c == '_' ? '_' : 'd';
        } else {
            *o++ = *c;
        }
    }
    *o = 0;
    return a;
}

char *domain_alias_volume_id(const char *alias)
{
    if (strncmp(alias, "ua-", 3) != 0)
        return NULL;
    char *id = xmalloc(strlen(alias)), *o = id;
    for (const char *c = alias + 3; *c; c++) {
        if (*c == '_') {
            c++;
            if (*c != '_' && *c != 'd') {
                free(id);
                return NULL;
            }
            *o++ = *c == '_' ? '_' : '.';
        } else if ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                   (*c >= '0' && *c <= '9') || *c == '-') {
            *o++ = *c;
        } else {
            free(id);
            return NULL;
        }
    }
    *o = 0;
    return id;
}

static void xml_doc_freep(xmlDocPtr *d)
{
    if (*d)
        xmlFreeDoc(*d);
}

static xmlNodePtr child(xmlNodePtr parent, const char *name)
{
    return xmlNewChild(parent, NULL, X(name), NULL);
}

/* Text child: xmlNewTextChild escapes the content (xmlNewChild would not). */
static xmlNodePtr text_child(xmlNodePtr parent, const char *name, const char *text)
{
    return xmlNewTextChild(parent, NULL, X(name), X(text));
}

static void prop(xmlNodePtr n, const char *name, const char *value)
{
    xmlNewProp(n, X(name), X(value));
}

static void prop_u(xmlNodePtr n, const char *name, unsigned long long value)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%llu", value);
    prop(n, name, buf);
}

static int node_to_string(xmlNodePtr node, char **ret)
{
    xmlBufferPtr buf = xmlBufferCreate();
    if (!buf)
        return -ENOMEM;
    xmlSaveCtxtPtr ctx = xmlSaveToBuffer(buf, "UTF-8", XML_SAVE_FORMAT | XML_SAVE_NO_DECL);
    if (!ctx) {
        xmlBufferFree(buf);
        return -ENOMEM;
    }
    long r = xmlSaveTree(ctx, node);
    xmlSaveClose(ctx);
    if (r < 0) {
        xmlBufferFree(buf);
        return -EIO;
    }
    const char *content = (const char *)xmlBufferContent(buf);
    size_t len = strlen(content);
    char *out = xmalloc(len + 2);
    memcpy(out, content, len);
    if (len == 0 || out[len - 1] != '\n')
        out[len++] = '\n';
    out[len] = 0;
    xmlBufferFree(buf);
    *ret = out;
    return 0;
}

static void add_addr(xmlNodePtr parent, const struct pci_addr *a)
{
    xmlNodePtr n = child(parent, "address");
    prop(n, "type", "pci");
    prop(n, "domain", "0x0000");
    char b[16];
    snprintf(b, sizeof(b), "0x%02x", a->bus);
    prop(n, "bus", b);
    snprintf(b, sizeof(b), "0x%02x", a->slot);
    prop(n, "slot", b);
    snprintf(b, sizeof(b), "0x%x", a->function);
    prop(n, "function", b);
    if (a->multifunction)
        prop(n, "multifunction", "on");
}

static void add_disk(xmlNodePtr devices, const struct vm_spec *spec, const struct volume *v,
                     const char *socket_path, unsigned slot, unsigned boot_order)
{
    char target[DISK_TARGET_MAX];
    disk_target_name(slot - 1, target);
    xmlNodePtr disk = child(devices, "disk");
    prop(disk, "type", "vhostuser");
    prop(disk, "device", "disk");
    xmlNodePtr drv = child(disk, "driver");
    prop(drv, "name", "qemu");
    prop(drv, "type", "raw");
    prop_u(drv, "queues", v->num_queues);
    xmlNodePtr src = child(disk, "source");
    prop(src, "type", "unix");
    prop(src, "path", socket_path);
    /* QEMU retries a lost vhost-user connection every `timeout` seconds: a
     * QSD restarted by the plugin (~25 ms) is picked up at the next try, so
     * the guest's longest write after a QSD kill is about this long
     * (measured in launcher/e2e-hotplug: 10 s -> 9.9 s, 1 s -> 0.9 s, with
     * 0 errors either way; docs/launcher.md).  1 is QEMU's smallest. */
    xmlNodePtr rc = child(src, "reconnect");
    prop(rc, "enabled", "yes");
    prop(rc, "timeout", "1");
    xmlNodePtr tgt = child(disk, "target");
    prop(tgt, "dev", target);
    prop(tgt, "bus", "virtio");
    /* libvirt refuses <serial> on vhostuser disks (the guest asks the
     * back-end, and QSD's vhost-user-blk export answers a fixed string), so
     * the volume id travels as the device's user alias instead. */
    _cleanup_free_ char *alias = domain_disk_alias(v->id);
    prop(child(disk, "alias"), "name", alias);
    /* No <readonly/> and no <blockio>: libvirt refuses both on vhostuser
     * disks.  The guest learns them from the export's virtio config space
     * (VIRTIO_BLK_F_RO, blk_size), so read-only is enforced by QSD itself
     * and the e2e test checks the guest sees it. */
    if (boot_order) {
        xmlNodePtr b = child(disk, "boot");
        prop_u(b, "order", boot_order);
    }
    /* The guest address is fixed by the slot (layout.h), whether the disk
     * is there at start or hot-plugged. */
    struct pci_addr a;
    char guest[GUEST_ADDR_MAX];
    layout_disk_addr(spec, slot, &a, guest);
    add_addr(disk, &a);
}

int domain_xml_disk(const struct vm_spec *spec, const struct volume *v, const char *socket_path,
                    unsigned slot, unsigned boot_order, char **ret_xml)
{
    _cleanup_(xml_doc_freep) xmlDocPtr doc = xmlNewDoc(X("1.0"));
    xmlNodePtr devices = xmlNewNode(NULL, X("devices"));
    xmlDocSetRootElement(doc, devices);
    add_disk(devices, spec, v, socket_path, slot, boot_order);
    return node_to_string(devices->children, ret_xml);
}

static struct volume *find_vol(struct volume *const *vols, size_t n, const char *dir)
{
    for (size_t i = 0; i < n; i++)
        if (streq(vols[i]->dir, dir))
            return vols[i];
    return NULL;
}

static int vol_ptr_cmp(const void *a, const void *b)
{
    return strcmp((*(struct volume *const *)a)->dir, (*(struct volume *const *)b)->dir);
}

int domain_plan_disks(const struct vm_spec *spec, struct slot_ledger *ledger,
                      struct volume *const *vols, size_t n_vols, struct domain_disk **ret,
                      size_t *ret_n, char **ret_error)
{
    /* Discovery refuses a name found in two directories; never pick one. */
    for (size_t i = 0; i < n_vols; i++)
        for (size_t j = i + 1; j < n_vols; j++)
            if (streq(vols[i]->dir, vols[j]->dir)) {
                if (ret_error)
                    *ret_error = xasprintf("disk name \"%s\" is in more than one volumes "
                                           "directory", vols[i]->dir);
                return -EEXIST;
            }
    if (spec->boot == VM_BOOT_VOLUME && !find_vol(vols, n_vols, spec->boot_volume)) {
        if (ret_error)
            *ret_error = xasprintf("boot volume \"%s\" is not in any volumes directory",
                                   spec->boot_volume);
        return -ENOENT;
    }
    for (size_t i = 0; i < spec->n_disks; i++)
        if (!spec->disks[i].hotplug && !find_vol(vols, n_vols, spec->disks[i].volume)) {
            if (ret_error)
                *ret_error = xasprintf("disk \"%s\" is not in any volumes directory",
                                       spec->disks[i].volume);
            return -ENOENT;
        }
    if (n_vols > VM_MAX_DISKS) {
        if (ret_error)
            *ret_error = xasprintf("%zu volumes, at most %d disks allowed", n_vols, VM_MAX_DISKS);
        return -E2BIG;
    }
    _cleanup_free_ struct domain_disk *out = xcalloc(n_vols ? n_vols : 1, sizeof(*out));
    _cleanup_free_ bool *in_use = xcalloc(vm_spec_disk_slots(spec) + 1, sizeof(*in_use));
    size_t n = 0;
    for (size_t i = 0; i < spec->n_disks; i++) {
        const struct volume *v = find_vol(vols, n_vols, spec->disks[i].volume);
        if (!v)
            continue; /* a "hotplug" disk not there yet */
        out[n].vol = v;
        out[n].boot_order = spec->disks[i].boot_order;
        out[n].slot = spec->disks[i].slot;
        in_use[out[n].slot] = true;
        n++;
    }
    _cleanup_free_ struct volume **rest = xcalloc(n_vols ? n_vols : 1, sizeof(*rest));
    size_t n_rest = 0;
    for (size_t i = 0; i < n_vols; i++)
        if (!vm_spec_find_disk(spec, vols[i]->dir))
            rest[n_rest++] = vols[i];
    if (n_rest)
        qsort(rest, n_rest, sizeof(*rest), vol_ptr_cmp);
    for (size_t i = 0; i < n_rest; i++) {
        unsigned slot = slot_ledger_pick(ledger, spec, rest[i]->dir, in_use);
        if (!slot)
            continue; /* no free slot: the hot-plug watcher will say so */
        in_use[slot] = true;
        out[n].slot = slot;
        out[n++].vol = rest[i];
    }
    for (size_t i = 0; i < n; i++) {
        disk_target_name(out[i].slot - 1, out[i].target);
        if (spec->boot == VM_BOOT_VOLUME && streq(out[i].vol->dir, spec->boot_volume))
            out[i].boot_order = 1;
    }
    *ret = TAKE_PTR(out);
    *ret_n = n;
    return 0;
}

/* Every vhost-user disk, cold- or hot-plugged, without the configurable
 * write-cache feature (VIRTIO_BLK_F_CONFIG_WCE).  QEMU 10.0's export
 * reports wce = 0 in its config space, so a guest that negotiates the
 * feature sees a write-through disk and never sends a flush; without it,
 * Linux (and the virtio spec) treats a disk that offers FLUSH as having a
 * write cache: the guest sends a flush for every fsync and the export
 * need not flush every write (qsd_argv: raw exports run write-back).  A
 * -global, not a <qemu:override> on each disk's alias: libvirt applies
 * overrides where it builds QEMU's command line, and a hot-plugged disk's
 * alias is not known when the domain starts; a -global holds for every
 * device of the type QEMU ever creates (e2e-durable checks both). */
static void add_write_back_global(xmlNodePtr dom)
{
    xmlNsPtr ns = xmlNewNs(dom, X("http://libvirt.org/schemas/domain/qemu/1.0"), X("qemu"));
    xmlNodePtr cl = xmlNewChild(dom, ns, X("commandline"), NULL);
    prop(xmlNewChild(cl, ns, X("arg"), NULL), "value", "-global");
    prop(xmlNewChild(cl, ns, X("arg"), NULL), "value", "vhost-user-blk-pci.config-wce=off");
}

int domain_xml_build(const struct vm_spec *spec, const struct domain_host *host,
                     struct slot_ledger *ledger, struct volume *const *vols, size_t n_vols,
                     char **ret_xml, char **ret_error)
{
    for (size_t i = 0; i < n_vols; i++)
        if (!vols[i]->base) {
            if (ret_error)
                *ret_error = xasprintf("volume \"%s\" was not found in a volumes directory",
                                       vols[i]->dir);
            return -EINVAL;
        }
    _cleanup_free_ struct domain_disk *disks = NULL;
    size_t n_disks;
    int r = domain_plan_disks(spec, ledger, vols, n_vols, &disks, &n_disks, ret_error);
    if (r < 0)
        return r;

    _cleanup_(xml_doc_freep) xmlDocPtr doc = xmlNewDoc(X("1.0"));
    xmlNodePtr dom = xmlNewNode(NULL, X("domain"));
    xmlDocSetRootElement(doc, dom);
    prop(dom, "type", streq(spec->accel, "kvm") ? "kvm" : "qemu");
    text_child(dom, "name", spec->name);
    char num[32];
    snprintf(num, sizeof(num), "%llu", (unsigned long long)spec->memory_mib);
    prop(text_child(dom, "memory", num), "unit", "MiB");
    snprintf(num, sizeof(num), "%u", spec->vcpus);
    text_child(dom, "vcpu", num);

    /* vhost-user needs guest RAM the back-end can map. */
    xmlNodePtr mb = child(dom, "memoryBacking");
    prop(child(mb, "source"), "type", "memfd");
    prop(child(mb, "access"), "mode", "shared");

    xmlNodePtr os = child(dom, "os");
    if (spec->firmware == VM_FIRMWARE_UEFI)
        prop(os, "firmware", "efi"); /* libvirt picks OVMF from QEMU's firmware descriptors */
    xmlNodePtr type = text_child(os, "type", "hvm");
    prop(type, "arch", "x86_64");
    prop(type, "machine", spec->machine);
    if (spec->firmware == VM_FIRMWARE_UEFI) {
        /* Secure boot needs SMM and signed guests: off unless asked for. */
        xmlNodePtr fw = child(os, "firmware");
        xmlNodePtr f = child(fw, "feature");
        prop(f, "enabled", "no");
        prop(f, "name", "secure-boot");
    }
    if (spec->boot == VM_BOOT_KERNEL) {
        text_child(os, "kernel", spec->kernel);
        if (spec->initrd)
            text_child(os, "initrd", spec->initrd);
        if (spec->cmdline)
            text_child(os, "cmdline", spec->cmdline);
    }
    /* Without ACPI, hot-plug is refused. */
    xmlNodePtr feat = child(dom, "features");
    child(feat, "acpi");
    child(feat, "apic");
    prop(child(dom, "clock"), "offset", "utc");
    text_child(dom, "on_poweroff", "destroy");
    text_child(dom, "on_reboot", "restart");
    text_child(dom, "on_crash", "destroy");

    xmlNodePtr devices = child(dom, "devices");
    struct pci_addr a;
    char guest[GUEST_ADDR_MAX];
    for (size_t i = 0; i < n_disks; i++) {
        _cleanup_free_ char *path = volume_socket_path(disks[i].vol);
        add_disk(devices, spec, disks[i].vol, path, disks[i].slot, disks[i].boot_order);
    }
    if (host->cidata_image) {
        /* NoCloud data: an image the launcher built in its own root (the
         * tenant's text is in the image, never in this XML). */
        xmlNodePtr disk = child(devices, "disk");
        prop(disk, "type", "file");
        prop(disk, "device", "disk");
        xmlNodePtr drv = child(disk, "driver");
        prop(drv, "name", "qemu");
        prop(drv, "type", "raw");
        prop(child(disk, "source"), "file", host->cidata_image);
        char target[DISK_TARGET_MAX];
        disk_target_name(vm_spec_disk_slots(spec), target);
        xmlNodePtr tgt = child(disk, "target");
        prop(tgt, "dev", target);
        prop(tgt, "bus", "virtio");
        child(disk, "readonly");
        prop(child(disk, "alias"), "name", "ua-cidata");
        layout_sys_addr(spec, LAYOUT_CIDATA, &a, guest);
        add_addr(disk, &a);
    }
    /* No USB controller and no balloon: they would take PCI slots. */
    xmlNodePtr usb = child(devices, "controller");
    prop(usb, "type", "usb");
    prop(usb, "model", "none");
    xmlNodePtr root = child(devices, "controller");
    prop(root, "type", "pci");
    prop(root, "index", "0");
    prop(root, "model", spec->family == VM_MACHINE_Q35 ? "pcie-root" : "pci-root");
    if (spec->pci_hole64_off) {
        /* Legacy guests (Windows XP / 2003) do not boot with a 64-bit PCI
         * hole: libvirt passes q35-pcihost / i440FX-pcihost
         * pci-hole64-size=0. */
        prop(text_child(root, "pcihole64", "0"), "unit", "KiB");
    }
    /* q35: every root port exists from the start, each at a fixed address,
     * so the firmware gives port i bus i: a disk's guest address depends on
     * its slot only (layout.h).  Empty ports take hot-plugged disks. */
    for (unsigned i = 1; i <= layout_root_ports(spec); i++) {
        xmlNodePtr c = child(devices, "controller");
        prop(c, "type", "pci");
        prop_u(c, "index", i);
        prop(c, "model", "pcie-root-port");
        layout_port_addr(i, &a);
        add_addr(c, &a);
    }
    xmlNodePtr vs = child(devices, "controller");
    prop(vs, "type", "virtio-serial");
    prop(vs, "index", "0");
    layout_sys_addr(spec, LAYOUT_SERIAL, &a, guest);
    add_addr(vs, &a);
    if (spec->net.enabled) {
        /* User-mode networking through passt (libvirt starts it): the guest
         * gets the pod's address by DHCP; port_forwards listen in the pod. */
        xmlNodePtr nic = child(devices, "interface");
        prop(nic, "type", "user");
        prop(child(nic, "mac"), "address", spec->net.mac);
        prop(child(nic, "model"), "type", "virtio");
        prop(child(nic, "backend"), "type", "passt");
        for (size_t i = 0; i < spec->net.n_forwards; i++) {
            const struct vm_port_forward *f = &spec->net.forwards[i];
            xmlNodePtr pf = child(nic, "portForward");
            prop(pf, "proto", f->proto);
            xmlNodePtr range = child(pf, "range");
            prop_u(range, "start", f->port);
            prop_u(range, "to", f->guest_port);
        }
        prop(child(nic, "alias"), "name", "ua-net0");
        layout_sys_addr(spec, LAYOUT_NET, &a, guest);
        add_addr(nic, &a);
    }
    /* The serial console: QEMU connects to the launcher, which keeps the
     * bounded log and serves `qsd-vm-launcher console` (console.h). */
    xmlNodePtr ser = child(devices, "serial");
    prop(ser, "type", "unix");
    xmlNodePtr src = child(ser, "source");
    prop(src, "mode", "connect");
    prop(src, "path", host->console_socket);
    xmlNodePtr rc = child(src, "reconnect");
    prop(rc, "enabled", "yes");
    prop(rc, "timeout", "1");
    prop(child(ser, "target"), "port", "0");
    /* The guest agent's channel (qemu-guest-agent in the guest). */
    xmlNodePtr ch = child(devices, "channel");
    prop(ch, "type", "unix");
    src = child(ch, "source");
    prop(src, "mode", "bind");
    prop(src, "path", host->qga_socket);
    xmlNodePtr t = child(ch, "target");
    prop(t, "type", "virtio");
    prop(t, "name", "org.qemu.guest_agent.0");
    xmlNodePtr bal = child(devices, "memballoon");
    prop(bal, "model", "none");
    add_write_back_global(dom);
    return node_to_string(dom, ret_xml);
}

int domain_xml_has_disk(const char *xml, const char *target, bool *ret)
{
    _cleanup_(xml_doc_freep) xmlDocPtr doc =
        xmlReadMemory(xml, (int)strlen(xml), "domain.xml", NULL, XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
    if (!doc)
        return -EINVAL;
    xmlNodePtr root = xmlDocGetRootElement(doc);
    if (!root)
        return -EINVAL;
    bool found = false;
    for (xmlNodePtr devs = root->children; devs; devs = devs->next) {
        if (devs->type != XML_ELEMENT_NODE || !xmlStrEqual(devs->name, X("devices")))
            continue;
        for (xmlNodePtr d = devs->children; d; d = d->next) {
            if (d->type != XML_ELEMENT_NODE || !xmlStrEqual(d->name, X("disk")))
                continue;
            for (xmlNodePtr t = d->children; t; t = t->next) {
                if (t->type != XML_ELEMENT_NODE || !xmlStrEqual(t->name, X("target")))
                    continue;
                xmlChar *dev = xmlGetProp(t, X("dev"));
                if (dev && xmlStrEqual(dev, X(target)))
                    found = true;
                xmlFree(dev);
            }
        }
    }
    *ret = found;
    return 0;
}
