/* vmspec.c: see vmspec.h. */
#include "vmspec.h"
#include "names.h"
#include "util.h"

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
        static const char *const keys[] = {"volume", "bus", "boot_order", NULL};
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
        for (size_t j = 0; j + 1 < s->n_disks; j++) {
            if (streq(s->disks[j].volume, disk->volume))
                return fail(ret_error, "%s: volume \"%s\" is listed twice", where, disk->volume);
            if (bo && s->disks[j].boot_order == bo)
                return fail(ret_error, "%s: boot_order %u is used twice", where, (unsigned)bo);
        }
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
    static const char *const keys[] = {"name",  "vcpus", "memory_mib",  "machine",       "accel",
                                       "boot",  "disks", "console_log", "hotplug_slots", NULL};
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
    }
    r = get_path(root, "description", "console_log", false, &s->console_log, ret_error);
    if (r < 0)
        goto out;
    r = get_uint(root, "description", "hotplug_slots", 0, VM_MAX_HOTPLUG_SLOTS, false, 4, &v,
                 ret_error);
    if (r < 0)
        goto out;
    s->hotplug_slots = (unsigned)v;
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
    int r = read_file(path, VM_SPEC_MAX_FILE, &data, &len);
    if (r < 0) {
        if (ret_error)
            *ret_error = xasprintf("cannot read %s: %s", path, strerror(-r));
        return r;
    }
    return vm_spec_parse(data, len, ret, ret_error);
}
