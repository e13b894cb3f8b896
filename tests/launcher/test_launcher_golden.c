/* SPDX-License-Identifier: Apache-2.0 */
/* Golden tests for the launcher's pure cores: each tests/launcher/golden/<case>.json
 * holds a VM description ("vm") and the volumes' metadata, either "volumes":
 * directory name -> volume.json (all in one volumes directory, /run/vm/volumes)
 * or "volume_dirs": volumes directory -> {directory name -> volume.json} (the
 * launcher given several --volumes-dir), optionally "hotplug": {"volume",
 * "slot"} to render one hot-plug disk instead of the domain, "ledger":
 * {disk name -> slot} (the slots recorded for unlisted volumes by an
 * earlier run, layout.h).  A description with "cloud_init" gets the cidata
 * disk at the launcher's image path.  The expected output is
 * <case>.xml, or <case>.err for input that must be refused (the error text).
 * QSD_GOLDEN_REGENERATE=1 rewrites the expected files: review them by eye. */
#include "domain_xml.h"
#include "qsd/base/util.h"
#include "vmspec.h"
#include "volumes.h"

#include <assert.h>
#include <dirent.h>
#include <jansson.h>

#define VOLUMES_DIR "/run/vm/volumes"

static bool regenerate;
static int failures;

/* Output of one case: XML, or an error message. */
static int run_case(const char *json_text, size_t len, char **ret_out, bool *ret_is_error)
{
    json_error_t jerr;
    json_t *root = json_loadb(json_text, len, 0, &jerr);
    if (!root) {
        *ret_out = xasprintf("case file: %s\n", jerr.text);
        *ret_is_error = true;
        return 0;
    }
    char *out = NULL, *err = NULL;
    struct vm_spec *spec = NULL;
    struct volume *vols[64] = {0};
    size_t n = 0;
    json_t *vm = json_object_get(root, "vm");
    char *vm_text = json_dumps(vm, JSON_COMPACT | JSON_ENCODE_ANY);
    /* The raw description may be a string (to test malformed JSON). */
    if (json_is_string(vm)) {
        free(vm_text);
        vm_text = xstrdup(json_string_value(vm));
    }
    int r = vm_spec_parse(vm_text, strlen(vm_text), &spec, &err);
    free(vm_text);
    if (r < 0)
        goto done;
    json_t *dirs = json_object_get(root, "volume_dirs");
    if (!dirs) {
        json_t *flat = json_object_get(root, "volumes");
        dirs = json_object();
        json_object_set_new(dirs, VOLUMES_DIR, flat ? json_incref(flat) : json_object());
    } else {
        json_incref(dirs);
    }
    const char *base;
    json_t *in_dir;
    json_object_foreach(dirs, base, in_dir) {
        const char *name;
        json_t *meta;
        json_object_foreach(in_dir, name, meta) {
            assert(n < ARRAY_SIZE(vols));
            char *t = json_dumps(meta, JSON_COMPACT | JSON_ENCODE_ANY);
            if (json_is_string(meta)) {
                free(t);
                t = xstrdup(json_string_value(meta));
            }
            r = volume_meta_parse(t, strlen(t), name, &vols[n], &err);
            free(t);
            if (r < 0)
                break;
            vols[n++]->base = xstrdup(base);
        }
        if (r < 0)
            break;
    }
    json_decref(dirs);
    if (r < 0)
        goto done;
    json_t *hp = json_object_get(root, "hotplug");
    if (hp) {
        const char *vname = json_string_value(json_object_get(hp, "volume"));
        json_int_t slot = json_integer_value(json_object_get(hp, "slot"));
        struct volume *v = NULL;
        for (size_t i = 0; i < n; i++)
            if (streq(vols[i]->dir, vname))
                v = vols[i];
        assert(v && slot > 0);
        char *path = volume_socket_path(v);
        r = domain_xml_disk(spec, v, path, (unsigned)slot, 0, &out);
        free(path);
    } else {
        char ledger_path[] = "/tmp/golden-ledger.XXXXXX";
        json_t *lj = json_object_get(root, "ledger");
        bool have_ledger = false;
        if (lj) {
            int fd = mkstemp(ledger_path);
            if (fd < 0)
                abort();
            json_t *doc = json_pack("{s:i, s:O}", "version", 1, "slots", lj);
            char *t = json_dumps(doc, JSON_COMPACT);
            if (write(fd, t, strlen(t)) != (ssize_t)strlen(t))
                abort();
            close(fd);
            free(t);
            json_decref(doc);
            have_ledger = true;
        }
        struct slot_ledger *ledger = slot_ledger_load(have_ledger ? ledger_path : NULL, spec);
        bool ci = spec->cloud_init.user_data || spec->cloud_init.meta_data ||
                  spec->cloud_init.network_config;
        struct domain_host host = {
            .console_socket = "/var/lib/qsd-vm-launcher/console/serial.sock",
            .qga_socket = "/var/lib/qsd-vm-launcher/qga.sock",
            .cidata_image = ci ? "/var/lib/qsd-vm-launcher/cidata.img" : NULL};
        r = domain_xml_build(spec, &host, ledger, vols, n, &out, &err);
        slot_ledger_free(ledger);
        if (have_ledger)
            unlink(ledger_path);
    }
done:
    if (r < 0) {
        *ret_out = xasprintf("%s\n", err ? err : strerror(-r));
        *ret_is_error = true;
        free(out);
    } else {
        *ret_out = out;
        *ret_is_error = false;
    }
    free(err);
    for (size_t i = 0; i < n; i++)
        volume_free(vols[i]);
    vm_spec_free(spec);
    json_decref(root);
    return 0;
}

static void check(const char *dir, const char *base)
{
    _cleanup_free_ char *in = xasprintf("%s/%s.json", dir, base);
    _cleanup_free_ char *xml_path = xasprintf("%s/%s.xml", dir, base);
    _cleanup_free_ char *err_path = xasprintf("%s/%s.err", dir, base);
    _cleanup_free_ char *text = NULL, *out = NULL, *expected = NULL;
    size_t len;
    if (read_file(in, 1 << 20, &text, &len) < 0) {
        printf("FAIL %s: cannot read\n", base);
        failures++;
        return;
    }
    bool is_error;
    run_case(text, len, &out, &is_error);
    const char *want = is_error ? err_path : xml_path;
    const char *other = is_error ? xml_path : err_path;
    if (regenerate) {
        write_file_atomic(want, out, strlen(out), 0644);
        unlink(other);
        printf("regenerated %s\n", want);
        return;
    }
    if (read_file(want, 1 << 20, &expected, &len) < 0) {
        printf("FAIL %s: no %s (output was %s):\n%s", base, want, is_error ? "an error" : "XML", out);
        failures++;
        return;
    }
    if (!streq(expected, out)) {
        printf("FAIL %s: output differs from %s; got:\n%s", base, want, out);
        failures++;
        return;
    }
    printf("ok   %s\n", base);
}

static int cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s GOLDEN_DIR\n", argv[0]);
        return 2;
    }
    regenerate = getenv("QSD_GOLDEN_REGENERATE") && streq(getenv("QSD_GOLDEN_REGENERATE"), "1");
    DIR *d = opendir(argv[1]);
    if (!d)
        return 2;
    char *names[512];
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < ARRAY_SIZE(names)) {
        size_t l = strlen(de->d_name);
        if (l > 5 && streq(de->d_name + l - 5, ".json"))
            names[n++] = xstrndup(de->d_name, l - 5);
    }
    closedir(d);
    qsort(names, n, sizeof(*names), cmp);
    for (size_t i = 0; i < n; i++) {
        check(argv[1], names[i]);
        free(names[i]);
    }
    if (n == 0) {
        printf("FAIL: no cases in %s\n", argv[1]);
        return 1;
    }
    printf("%zu cases, %d failures\n", n, failures);
    return failures ? 1 : 0;
}
