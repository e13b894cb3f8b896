/* SPDX-License-Identifier: Apache-2.0 */
/* vmspec.c: see vmspec.h. */
#include "vmspec.h"
#include "qsd/base/names.h"
#include "qsd/base/util.h"

#include <ctype.h>
#include <jansson.h>
#include <stdarg.h>

static void vm_disk_clear(struct vm_disk *d)
{
    free(d->volume);
    free(d->bus);
}

void vm_spec_free(struct vm_spec *s)
{
    if (!s)
        return;
    free(s->name);
    free(s->machine);
    free(s->accel);
    free(s->kernel);
    free(s->initrd);
    free(s->cmdline);
    free(s->boot_volume);
    for (size_t i = 0; i < s->n_disks; i++)
        vm_disk_clear(&s->disks[i]);
    free(s->disks);
    free(s->console_log);
    free(s->net.forwards);
    free(s->cloud_init.user_data);
    free(s->cloud_init.meta_data);
    free(s->cloud_init.network_config);
    free(s);
}
static void vm_spec_freep(struct vm_spec **s) { vm_spec_free(*s); }

static int fail(char **ret_error, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(char **ret_error, const char *fmt, ...)
{
    if (ret_error) {
        va_list ap;
        va_start(ap, fmt);
        char *m = NULL;
        if (vasprintf(&m, fmt, ap) < 0)
            abort();
        va_end(ap);
        *ret_error = m;
    }
    return -EINVAL;
}

bool vm_path_is_clean(const char *p)
{
    size_t n = strlen(p);
    if (n < 2 || n > VM_MAX_PATH || p[0] != '/')
        return false;
    for (const char *c = p; *c; c++)
        if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f)
            return false;
    /* Walk components. */
    const char *c = p;
    while (*c) {
        c++; /* skip '/' */
        const char *e = strchrnul(c, '/');
        size_t len = (size_t)(e - c);
        if (len == 0)
            return false; /* "//" or trailing '/' */
        if ((len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
            return false;
        c = e;
    }
    return true;
}

static bool printable_ascii(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
            return false;
    return true;
}

/* Keys allowed in an object; anything else is an error naming the key. */
static int check_keys(json_t *obj, const char *where, const char *const *allowed, char **ret_error)
{
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        bool ok = false;
        for (const char *const *a = allowed; *a; a++)
            if (streq(key, *a))
                ok = true;
        if (!ok) {
            _cleanup_free_ char *q = NULL;
            /* The key is tenant input: show it escaped. */
            json_t *js = json_string(key);
            q = json_dumps(js, JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
            json_decref(js);
            return fail(ret_error, "%s: unknown key %s", where, q ? q : "?");
        }
    }
    return 0;
}

static int get_uint(json_t *obj, const char *where, const char *key, uint64_t min, uint64_t max,
                    bool required, uint64_t def, uint64_t *ret, char **ret_error)
{
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required)
            return fail(ret_error, "%s: missing required key \"%s\"", where, key);
        *ret = def;
        return 0;
    }
    if (!json_is_integer(v))
        return fail(ret_error, "%s: \"%s\" must be an integer", where, key);
    json_int_t i = json_integer_value(v);
    if (i < 0 || (uint64_t)i < min || (uint64_t)i > max)
        return fail(ret_error, "%s: \"%s\" = %lld is out of range [%llu, %llu]", where, key,
                    (long long)i, (unsigned long long)min, (unsigned long long)max);
    *ret = (uint64_t)i;
    return 0;
}

static int get_string(json_t *obj, const char *where, const char *key, bool required,
                      const char **ret, char **ret_error)
{
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required)
            return fail(ret_error, "%s: missing required key \"%s\"", where, key);
        *ret = NULL;
        return 0;
    }
    if (!json_is_string(v))
        return fail(ret_error, "%s: \"%s\" must be a string", where, key);
    if (strlen(json_string_value(v)) != json_string_length(v))
        return fail(ret_error, "%s: \"%s\" contains a NUL byte", where, key);
    *ret = json_string_value(v);
    return 0;
}

static int get_name(json_t *obj, const char *where, const char *key, bool required, char **ret,
                    char **ret_error)
{
    const char *s;
    int r = get_string(obj, where, key, required, &s, ret_error);
    if (r < 0)
        return r;
    if (!s) {
        *ret = NULL;
        return 0;
    }
    const char *reason;
    if (name_validate(s, &reason) < 0)
        return fail(ret_error, "%s: \"%s\" is not a valid name: %s", where, key, reason);
    *ret = xstrdup(s);
    return 0;
}

static int get_path(json_t *obj, const char *where, const char *key, bool required, char **ret,
                    char **ret_error)
{
    const char *s;
    int r = get_string(obj, where, key, required, &s, ret_error);
    if (r < 0)
        return r;
    if (!s) {
        *ret = NULL;
        return 0;
    }
    if (!vm_path_is_clean(s))
        return fail(ret_error,
                    "%s: \"%s\" must be a clean absolute path (printable ASCII, no '.', '..' or "
                    "empty components, at most %d bytes)",
                    where, key, VM_MAX_PATH);
    *ret = xstrdup(s);
    return 0;
}

static bool machine_valid(const char *m, enum vm_machine_family *ret)
{
    const char *ver = NULL;
    enum vm_machine_family f;
    if (streq(m, "q35")) {
        f = VM_MACHINE_Q35;
    } else if (streq(m, "pc")) {
        f = VM_MACHINE_PC;
    } else if (startswith(m, "pc-q35-")) {
        f = VM_MACHINE_Q35;
        ver = m + strlen("pc-q35-");
    } else if (startswith(m, "pc-i440fx-")) {
        f = VM_MACHINE_PC;
        ver = m + strlen("pc-i440fx-");
    } else {
        return false;
    }
    if (ver) {
        /* digits and dots, starting with a digit, short */
        if (!*ver || strlen(ver) > 8 || *ver < '0' || *ver > '9')
            return false;
        for (const char *c = ver; *c; c++)
            if (!((*c >= '0' && *c <= '9') || *c == '.'))
                return false;
    }
    *ret = f;
    return true;
}

static int parse_boot(struct vm_spec *s, json_t *boot, char **ret_error)
{
    if (!json_is_object(boot))
        return fail(ret_error, "boot: must be an object");
    static const char *const keys[] = {"kernel", "initrd", "cmdline", "volume", NULL};
    int r = check_keys(boot, "boot", keys, ret_error);
    if (r < 0)
        return r;
    bool has_kernel = json_object_get(boot, "kernel") != NULL;
    bool has_volume = json_object_get(boot, "volume") != NULL;
    if (has_kernel == has_volume)
        return fail(ret_error, "boot: exactly one of \"kernel\" or \"volume\" is required");
    if (has_volume) {
        if (json_object_get(boot, "initrd") || json_object_get(boot, "cmdline"))
            return fail(ret_error, "boot: \"initrd\" and \"cmdline\" need \"kernel\"");
        s->boot = VM_BOOT_VOLUME;
        return get_name(boot, "boot", "volume", true, &s->boot_volume, ret_error);
    }
    s->boot = VM_BOOT_KERNEL;
    r = get_path(boot, "boot", "kernel", true, &s->kernel, ret_error);
    if (r < 0)
        return r;
    r = get_path(boot, "boot", "initrd", false, &s->initrd, ret_error);
    if (r < 0)
        return r;
    const char *cmdline;
    r = get_string(boot, "boot", "cmdline", false, &cmdline, ret_error);
    if (r < 0)
        return r;
    if (cmdline) {
        if (strlen(cmdline) > VM_MAX_CMDLINE || !printable_ascii(cmdline))
            return fail(ret_error, "boot: \"cmdline\" must be printable ASCII of at most %d bytes",
                        VM_MAX_CMDLINE);
        s->cmdline = xstrdup(cmdline);
    }
    return 0;
}

static int parse_disks(struct vm_spec *s, json_t *disks, char **ret_error)
{
    if (!json_is_array(disks))
        return fail(ret_error, "disks: must be an array");
    size_t n = json_array_size(disks);
    if (n > VM_MAX_DISKS)
        return fail(ret_error, "disks: %zu entries, at most %d allowed", n, VM_MAX_DISKS);
    s->disks = xcalloc(n ? n : 1, sizeof(*s->disks));
    for (size_t i = 0; i < n; i++) {
        json_t *d = json_array_get(disks, i);
        char where[32];
        snprintf(where, sizeof(where), "disks[%zu]", i);
        if (!json_is_object(d))
            return fail(ret_error, "%s: must be an object", where);
        static const char *const keys[] = {"volume", "bus", "boot_order", "slot", "hotplug",
                                           NULL};
        int r = check_keys(d, where, keys, ret_error);
        if (r < 0)
            return r;
        struct vm_disk *disk = &s->disks[s->n_disks++];
        r = get_name(d, where, "volume", true, &disk->volume, ret_error);
        if (r < 0)
            return r;
        const char *bus;
        r = get_string(d, where, "bus", false, &bus, ret_error);
        if (r < 0)
            return r;
        if (bus && !streq(bus, "virtio"))
            return fail(ret_error, "%s: \"bus\" must be \"virtio\" (vhost-user disks have no other bus)",
                        where);
        disk->bus = xstrdup("virtio");
        uint64_t bo;
        r = get_uint(d, where, "boot_order", 1, VM_MAX_BOOT_ORDER, false, 0, &bo, ret_error);
        if (r < 0)
            return r;
        disk->boot_order = (unsigned)bo;
        uint64_t slot;
        r = get_uint(d, where, "slot", 1, VM_MAX_SLOT, false, 0, &slot, ret_error);
        if (r < 0)
            return r;
        disk->slot = (unsigned)slot;
        json_t *hp = json_object_get(d, "hotplug");
        if (hp && !json_is_boolean(hp))
            return fail(ret_error, "%s: \"hotplug\" must be true or false", where);
        disk->hotplug = hp && json_is_true(hp);
        for (size_t j = 0; j + 1 < s->n_disks; j++) {
            if (slot && s->disks[j].slot == slot)
                return fail(ret_error, "%s: slot %u is used twice", where, (unsigned)slot);
            if (streq(s->disks[j].volume, disk->volume))
                return fail(ret_error, "%s: volume \"%s\" is listed twice", where, disk->volume);
            if (bo && s->disks[j].boot_order == bo)
                return fail(ret_error, "%s: boot_order %u is used twice", where, (unsigned)bo);
        }
    }
    /* Disks without a "slot" take the lowest free ones, in list order: the
     * layout depends on the description alone (docs/launcher.md). */
    for (size_t i = 0; i < s->n_disks; i++) {
        if (s->disks[i].slot)
            continue;
        for (unsigned c = 1;; c++) {
            bool used = false;
            for (size_t j = 0; j < s->n_disks; j++)
                if (s->disks[j].slot == c)
                    used = true;
            if (!used) {
                s->disks[i].slot = c;
                break;
            }
        }
    }
    for (size_t i = 0; i < s->n_disks; i++)
        if (s->disks[i].slot > s->listed_slots)
            s->listed_slots = s->disks[i].slot;
    return 0;
}

unsigned vm_spec_disk_slots(const struct vm_spec *s)
{
    return s->listed_slots + s->hotplug_slots;
}

/* "52:54:00:xx:xx:xx", the last three bytes from FNV-1a of the name: the
 * same VM name gives the same MAC on every start, in every pod. */
static void derive_mac(const char *name, char out[18])
{
    uint32_t h = 2166136261u;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++) {
        h ^= *c;
        h *= 16777619u;
    }
    snprintf(out, 18, "52:54:00:%02x:%02x:%02x", (unsigned char)(h >> 16), (unsigned char)(h >> 8),
             (unsigned char)h);
}

static bool mac_valid(const char *m, char out[18])
{
    if (strlen(m) != 17)
        return false;
    unsigned b[6];
    for (int i = 0; i < 6; i++) {
        const char *p = m + 3 * i;
        if (!isxdigit((unsigned char)p[0]) || !isxdigit((unsigned char)p[1]) ||
            (i < 5 && p[2] != ':'))
            return false;
        sscanf(p, "%2x", &b[i]);
    }
    /* Unicast, not all zero. */
    if ((b[0] & 1) || !(b[0] | b[1] | b[2] | b[3] | b[4] | b[5]))
        return false;
    snprintf(out, 18, "%02x:%02x:%02x:%02x:%02x:%02x", (unsigned char)b[0], (unsigned char)b[1],
             (unsigned char)b[2], (unsigned char)b[3], (unsigned char)b[4], (unsigned char)b[5]);
    return true;
}

static int parse_network(struct vm_spec *s, json_t *net, char **ret_error)
{
    s->net.enabled = true;
    derive_mac(s->name, s->net.mac);
    if (!net)
        return 0;
    if (json_is_false(net)) {
        s->net.enabled = false;
        return 0;
    }
    if (!json_is_object(net))
        return fail(ret_error, "network: must be an object or false");
    static const char *const keys[] = {"mac", "port_forwards", NULL};
    int r = check_keys(net, "network", keys, ret_error);
    if (r < 0)
        return r;
    const char *mac;
    r = get_string(net, "network", "mac", false, &mac, ret_error);
    if (r < 0)
        return r;
    if (mac) {
        if (!mac_valid(mac, s->net.mac))
            return fail(ret_error, "network: \"mac\" must be a unicast MAC address "
                                   "xx:xx:xx:xx:xx:xx (hex), not all zeroes");
        s->net.mac_given = true;
    }
    json_t *fw = json_object_get(net, "port_forwards");
    if (!fw)
        return 0;
    if (!json_is_array(fw))
        return fail(ret_error, "network: \"port_forwards\" must be an array");
    size_t n = json_array_size(fw);
    if (n > VM_MAX_PORT_FORWARDS)
        return fail(ret_error, "network: %zu port_forwards, at most %d allowed", n,
                    VM_MAX_PORT_FORWARDS);
    s->net.forwards = xcalloc(n ? n : 1, sizeof(*s->net.forwards));
    for (size_t i = 0; i < n; i++) {
        json_t *f = json_array_get(fw, i);
        char where[48];
        snprintf(where, sizeof(where), "network.port_forwards[%zu]", i);
        if (!json_is_object(f))
            return fail(ret_error, "%s: must be an object", where);
        static const char *const fkeys[] = {"protocol", "port", "guest_port", NULL};
        r = check_keys(f, where, fkeys, ret_error);
        if (r < 0)
            return r;
        struct vm_port_forward *pf = &s->net.forwards[s->net.n_forwards++];
        const char *proto;
        r = get_string(f, where, "protocol", false, &proto, ret_error);
        if (r < 0)
            return r;
        if (proto && !streq(proto, "tcp") && !streq(proto, "udp"))
            return fail(ret_error, "%s: \"protocol\" must be \"tcp\" or \"udp\"", where);
        snprintf(pf->proto, sizeof(pf->proto), "%s", proto ? proto : "tcp");
        uint64_t v;
        r = get_uint(f, where, "port", 1, 65535, true, 0, &v, ret_error);
        if (r < 0)
            return r;
        pf->port = (unsigned)v;
        r = get_uint(f, where, "guest_port", 1, 65535, false, pf->port, &v, ret_error);
        if (r < 0)
            return r;
        pf->guest_port = (unsigned)v;
        for (size_t j = 0; j + 1 < s->net.n_forwards; j++)
            if (s->net.forwards[j].port == pf->port && streq(s->net.forwards[j].proto, pf->proto))
                return fail(ret_error, "%s: %s port %u is forwarded twice", where, pf->proto,
                            pf->port);
    }
    return 0;
}

/* Inline NoCloud files: any bytes but NUL (they go into the cidata image,
 * never into the XML), each at most VM_CLOUD_INIT_MAX bytes. */
static int parse_cloud_init(struct vm_spec *s, json_t *ci, char **ret_error)
{
    if (!json_is_object(ci))
        return fail(ret_error, "cloud_init: must be an object");
    static const char *const keys[] = {"user_data", "meta_data", "network_config", NULL};
    int r = check_keys(ci, "cloud_init", keys, ret_error);
    if (r < 0)
        return r;
    char **dst[] = {&s->cloud_init.user_data, &s->cloud_init.meta_data,
                    &s->cloud_init.network_config};
    for (size_t i = 0; i < 3; i++) {
        const char *v;
        r = get_string(ci, "cloud_init", keys[i], false, &v, ret_error);
        if (r < 0)
            return r;
        if (!v)
            continue;
        if (strlen(v) > VM_CLOUD_INIT_MAX)
            return fail(ret_error, "cloud_init: \"%s\" is %zu bytes, at most %d allowed", keys[i],
                        strlen(v), VM_CLOUD_INIT_MAX);
        *dst[i] = xstrdup(v);
    }
    return 0;
}

const struct vm_disk *vm_spec_find_disk(const struct vm_spec *s, const char *volume)
{
    for (size_t i = 0; i < s->n_disks; i++)
        if (streq(s->disks[i].volume, volume))
            return &s->disks[i];
    return NULL;
}

int vm_spec_parse(const char *text, size_t len, struct vm_spec **ret, char **ret_error)
{
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return fail(ret_error, "invalid JSON at line %d column %d: %s", jerr.line, jerr.column,
                    jerr.text);
    _cleanup_(vm_spec_freep) struct vm_spec *s = xcalloc(1, sizeof(*s));
    int r;
    if (!json_is_object(root)) {
        r = fail(ret_error, "the VM description must be a JSON object");
        goto out;
    }
    static const char *const keys[] = {"name",       "vcpus",     "memory_mib",  "machine",
                                       "accel",      "boot",      "disks",       "console_log",
                                       "hotplug_slots", "network", "cloud_init", "firmware",
                                       "pci_hole64", NULL};
    r = check_keys(root, "description", keys, ret_error);
    if (r < 0)
        goto out;
    r = get_name(root, "description", "name", true, &s->name, ret_error);
    if (r < 0)
        goto out;
    uint64_t v;
    r = get_uint(root, "description", "vcpus", 1, VM_MAX_VCPUS, false, 1, &v, ret_error);
    if (r < 0)
        goto out;
    s->vcpus = (unsigned)v;
    r = get_uint(root, "description", "memory_mib", VM_MIN_MEMORY_MIB, VM_MAX_MEMORY_MIB, true, 0,
                 &s->memory_mib, ret_error);
    if (r < 0)
        goto out;
    const char *str;
    r = get_string(root, "description", "machine", false, &str, ret_error);
    if (r < 0)
        goto out;
    s->machine = xstrdup(str ? str : "q35");
    if (!machine_valid(s->machine, &s->family)) {
        r = fail(ret_error,
                 "description: \"machine\" must be q35, pc-q35-<version>, pc or pc-i440fx-<version>");
        goto out;
    }
    r = get_string(root, "description", "accel", false, &str, ret_error);
    if (r < 0)
        goto out;
    s->accel = xstrdup(str ? str : "kvm");
    if (!streq(s->accel, "kvm") && !streq(s->accel, "tcg")) {
        r = fail(ret_error, "description: \"accel\" must be \"kvm\" or \"tcg\"");
        goto out;
    }
    json_t *boot = json_object_get(root, "boot");
    if (!boot) {
        r = fail(ret_error, "description: missing required key \"boot\"");
        goto out;
    }
    r = parse_boot(s, boot, ret_error);
    if (r < 0)
        goto out;
    json_t *disks = json_object_get(root, "disks");
    if (disks) {
        r = parse_disks(s, disks, ret_error);
        if (r < 0)
            goto out;
    }
    if (s->boot == VM_BOOT_VOLUME) {
        const struct vm_disk *d = vm_spec_find_disk(s, s->boot_volume);
        if (d && d->boot_order && d->boot_order != 1) {
            r = fail(ret_error, "boot: volume \"%s\" boots first, its disk cannot have boot_order %u",
                     s->boot_volume, d->boot_order);
            goto out;
        }
        for (size_t i = 0; i < s->n_disks; i++)
            if (s->disks[i].boot_order == 1 && !streq(s->disks[i].volume, s->boot_volume)) {
                r = fail(ret_error, "disks[%zu]: boot_order 1 is taken by the boot volume", i);
                goto out;
            }
        if (d && d->hotplug) {
            r = fail(ret_error, "boot: volume \"%s\" boots the VM, its disk cannot be \"hotplug\"",
                     s->boot_volume);
            goto out;
        }
    }
    r = get_path(root, "description", "console_log", false, &s->console_log, ret_error);
    if (r < 0)
        goto out;
    r = get_uint(root, "description", "hotplug_slots", 0, VM_MAX_HOTPLUG_SLOTS, false, 4, &v,
                 ret_error);
    if (r < 0)
        goto out;
    s->hotplug_slots = (unsigned)v;
    if (s->family == VM_MACHINE_PC && vm_spec_disk_slots(s) > VM_MAX_DISK_SLOTS_PC) {
        r = fail(ret_error,
                 "description: %u disk slots (highest listed slot %u + hotplug_slots %u): a pc "
                 "machine has room for %d on its root bus",
                 vm_spec_disk_slots(s), s->listed_slots, s->hotplug_slots, VM_MAX_DISK_SLOTS_PC);
        goto out;
    }
    r = parse_network(s, json_object_get(root, "network"), ret_error);
    if (r < 0)
        goto out;
    json_t *ci = json_object_get(root, "cloud_init");
    if (ci) {
        r = parse_cloud_init(s, ci, ret_error);
        if (r < 0)
            goto out;
    }
    r = get_string(root, "description", "firmware", false, &str, ret_error);
    if (r < 0)
        goto out;
    if (!str || streq(str, "bios")) {
        s->firmware = VM_FIRMWARE_BIOS;
    } else if (streq(str, "uefi")) {
        s->firmware = VM_FIRMWARE_UEFI;
    } else {
        r = fail(ret_error, "description: \"firmware\" must be \"bios\" or \"uefi\"");
        goto out;
    }
    json_t *hole = json_object_get(root, "pci_hole64");
    if (hole) {
        if (!json_is_boolean(hole)) {
            r = fail(ret_error, "description: \"pci_hole64\" must be true or false");
            goto out;
        }
        s->pci_hole64_off = json_is_false(hole);
    }
    *ret = TAKE_PTR(s);
    r = 0;
out:
    json_decref(root);
    return r;
}

int vm_spec_load(const char *path, struct vm_spec **ret, char **ret_error)
{
    _cleanup_free_ char *data = NULL;
    size_t len;
    /* Followed: a ConfigMap's file is a symlink into its ..data directory;
     * this is the pod's own file, read by the pod's own launcher. */
    int r = read_file_follow(path, VM_SPEC_MAX_FILE, &data, &len);
    if (r < 0) {
        if (ret_error)
            *ret_error = xasprintf("cannot read %s: %s", path,
                                   r == -EINVAL ? "not a regular file" : strerror(-r));
        return r;
    }
    return vm_spec_parse(data, len, ret, ret_error);
}
