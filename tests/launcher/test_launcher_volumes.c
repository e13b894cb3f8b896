/* SPDX-License-Identifier: Apache-2.0 */
/* Volume discovery on real directories: ready volumes, volumes not ready yet,
 * and everything that must be refused (symlinks out of the directory at each
 * level, wrong file types, bad names); several volumes directories scanned
 * together (each volume keeps its directory, a name in two of them is refused
 * in both, a missing directory fails the scan naming it). */
#include "qsd/base/util.h"
#include "volumes.h"

#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

static char base[] = "/tmp/qsd-launcher-volumes-XXXXXX";
static char vols[PATH_MAX], outside[PATH_MAX], bridge[PATH_MAX], third[PATH_MAX];

static const char meta[] = "{\"version\":1,\"volume\":\"pvc-1\",\"size\":1048576,"
                           "\"read_only\":true,\"num_queues\":2,\"socket\":\"vhost.sock\"}";

static void put(const char *path, const char *data)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(data, f);
    fclose(f);
}

static void make_socket(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    close(fd); /* the socket file stays */
}

static void mkvol_in(const char *dir, const char *name, bool with_json, bool with_socket)
{
    char p[PATH_MAX * 2];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    assert_int_equal(mkdir(p, 0755), 0);
    if (with_json) {
        snprintf(p, sizeof(p), "%s/%s/volume.json", dir, name);
        put(p, meta);
    }
    if (with_socket) {
        snprintf(p, sizeof(p), "%s/%s/vhost.sock", dir, name);
        make_socket(p);
    }
}

static void mkvol(const char *name, bool with_json, bool with_socket)
{
    mkvol_in(vols, name, with_json, with_socket);
}

static int setup(void **state)
{
    assert_non_null(mkdtemp(base));
    snprintf(vols, sizeof(vols), "%s/volumes", base);
    snprintf(outside, sizeof(outside), "%s/outside", base);
    snprintf(bridge, sizeof(bridge), "%s/bridge", base);
    snprintf(third, sizeof(third), "%s/third", base);
    assert_int_equal(mkdir(vols, 0755), 0);
    assert_int_equal(mkdir(outside, 0755), 0);
    assert_int_equal(mkdir(bridge, 0755), 0);
    assert_int_equal(mkdir(third, 0755), 0);
    /* The bridge: one volume of its own ("data"), one whose name is also in
     * vols ("good", ready in both), one also in third ("twice": a symlink
     * here, a ready volume there: refused in both all the same). */
    mkvol_in(bridge, "data", true, true);
    mkvol_in(bridge, "good", true, true);
    mkvol_in(third, "twice", true, true);
    char p[PATH_MAX * 2];
    /* A complete volume outside the volumes directory. */
    snprintf(p, sizeof(p), "%s/volume.json", outside);
    put(p, meta);
    snprintf(p, sizeof(p), "%s/vhost.sock", outside);
    make_socket(p);

    mkvol("good", true, true);
    mkvol("notready", false, false);
    mkvol("nosocket", true, false);
    /* Symlinked volume directory leading out. */
    snprintf(p, sizeof(p), "%s/dirlink", vols);
    assert_int_equal(symlink(outside, p), 0);
    /* Symlinked volume.json. */
    mkvol("jsonlink", false, true);
    snprintf(p, sizeof(p), "%s/jsonlink/volume.json", vols);
    char t[PATH_MAX * 2];
    snprintf(t, sizeof(t), "%s/volume.json", outside);
    assert_int_equal(symlink(t, p), 0);
    /* Symlinked socket. */
    mkvol("socklink", true, false);
    snprintf(p, sizeof(p), "%s/socklink/vhost.sock", vols);
    snprintf(t, sizeof(t), "%s/vhost.sock", outside);
    assert_int_equal(symlink(t, p), 0);
    /* Socket that is a regular file. */
    mkvol("sockfile", true, false);
    snprintf(p, sizeof(p), "%s/sockfile/vhost.sock", vols);
    put(p, "");
    /* Hostile metadata. */
    mkvol("hostile", false, true);
    snprintf(p, sizeof(p), "%s/hostile/volume.json", vols);
    put(p, "{\"version\":1,\"volume\":\"a<b>\",\"size\":1}");
    /* Not a directory, bad name, hidden. */
    snprintf(p, sizeof(p), "%s/plainfile", vols);
    put(p, "x");
    snprintf(p, sizeof(p), "%s/bad name'<x>", vols);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof(p), "%s/.staging", vols);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof(p), "%s/twice", bridge);
    assert_int_equal(symlink(outside, p), 0);
    return 0;
}

static int teardown(void **state)
{
    rm_rf(base);
    return 0;
}

static void test_scan(void **state)
{
    struct volume_scan s = {0};
    const char *dirs[] = {vols};
    assert_int_equal(volumes_scan(dirs, 1, 64, &s, NULL), 0);
    assert_int_equal(s.n, 10); /* everything but .staging */
    const struct volume_entry *e = volume_scan_find(&s, "good");
    assert_non_null(e);
    assert_non_null(e->vol);
    assert_string_equal(e->base, vols);
    assert_string_equal(e->vol->base, vols);
    assert_string_equal(e->vol->id, "pvc-1");
    assert_string_equal(e->vol->dir, "good");
    assert_true(e->vol->read_only);
    assert_int_equal(e->vol->num_queues, 2);
    assert_int_equal(e->vol->size, 1048576);

    struct {
        const char *name;
        int err;
    } refused[] = {
        {"notready", -ENOENT}, {"nosocket", -ENOENT}, {"dirlink", -ELOOP},
        {"jsonlink", -ELOOP},  {"socklink", -ELOOP},  {"sockfile", -ENOTSOCK},
        {"hostile", -EINVAL},  {"plainfile", -ENOTDIR}, {"bad name'<x>", -EINVAL},
    };
    for (size_t i = 0; i < ARRAY_SIZE(refused); i++) {
        e = volume_scan_find(&s, refused[i].name);
        assert_non_null(e);
        assert_null(e->vol);
        if (e->error != refused[i].err)
            fail_msg("%s: error %d (%s), want %d", refused[i].name, e->error,
                     e->message ? e->message : "", refused[i].err);
        assert_non_null(e->message);
    }
    assert_null(volume_scan_find(&s, ".staging"));
    volume_scan_clear(&s);
}

static void test_scan_limit(void **state)
{
    struct volume_scan s = {0};
    const char *dirs[] = {vols};
    assert_int_equal(volumes_scan(dirs, 1, 3, &s, NULL), -E2BIG);
    /* The bound is on all directories together. */
    const char *two[] = {bridge, third};
    assert_int_equal(volumes_scan(two, 2, 3, &s, NULL), -E2BIG);
    assert_int_equal(volumes_scan(two, 2, 4, &s, NULL), 0);
    assert_int_equal(s.n, 4);
    volume_scan_clear(&s);
}

static void test_socket_path(void **state)
{
    struct volume *v = NULL;
    assert_int_equal(volume_meta_parse(meta, strlen(meta), "d", &v, NULL), 0);
    assert_null(v->base); /* parsed alone: no directory, no socket path */
    v->base = xstrdup("/x");
    char *p = volume_socket_path(v);
    assert_string_equal(p, "/x/d/vhost.sock");
    free(p);
    struct volume *c = volume_dup(v);
    p = volume_socket_path(c);
    assert_string_equal(p, "/x/d/vhost.sock");
    free(p);
    volume_free(c);
    volume_free(v);
}

/* Two directories, no name in both: each volume is found in its own
 * directory and its socket path is built from that directory. */
static void test_two_dirs(void **state)
{
    char pvc[PATH_MAX * 2];
    snprintf(pvc, sizeof(pvc), "%s/pvcs", base);
    assert_int_equal(mkdir(pvc, 0755), 0);
    mkvol_in(pvc, "root", true, true);
    mkvol_in(pvc, "scratch", false, false); /* not ready: still listed */
    struct volume_scan s = {0};
    const char *dirs[] = {third, pvc};
    assert_int_equal(volumes_scan(dirs, 2, 64, &s, NULL), 0);
    assert_int_equal(s.n, 3);
    /* Sorted by name across directories. */
    assert_string_equal(s.entries[0].name, "root");
    assert_string_equal(s.entries[1].name, "scratch");
    assert_string_equal(s.entries[2].name, "twice");
    const struct volume_entry *e = volume_scan_find(&s, "root");
    assert_non_null(e);
    assert_non_null(e->vol);
    assert_string_equal(e->base, pvc);
    assert_int_equal(e->dir_index, 1);
    char *p = volume_socket_path(e->vol);
    char want[PATH_MAX * 3];
    snprintf(want, sizeof(want), "%s/root/vhost.sock", pvc);
    assert_string_equal(p, want);
    free(p);
    e = volume_scan_find(&s, "twice");
    assert_non_null(e->vol);
    assert_string_equal(e->base, third);
    assert_int_equal(e->dir_index, 0);
    p = volume_socket_path(e->vol);
    snprintf(want, sizeof(want), "%s/twice/vhost.sock", third);
    assert_string_equal(p, want);
    free(p);
    e = volume_scan_find(&s, "scratch");
    assert_null(e->vol);
    assert_int_equal(e->error, -ENOENT);
    assert_non_null(volume_scan_find_in(&s, pvc, "root"));
    assert_null(volume_scan_find_in(&s, third, "root"));
    volume_scan_clear(&s);
    rm_rf(pvc);
}

/* A name in two directories is refused in both, whatever each holds, and
 * each refusal names the other directory; other names are unaffected. */
static void test_duplicate_name(void **state)
{
    struct volume_scan s = {0};
    const char *dirs[] = {bridge, vols, third};
    assert_int_equal(volumes_scan(dirs, 3, 64, &s, NULL), 0);
    assert_int_equal(s.n, 3 + 10 + 1);
    const char *dup_names[] = {"good", "twice"};
    for (size_t k = 0; k < ARRAY_SIZE(dup_names); k++) {
        size_t found = 0;
        for (size_t i = 0; i < s.n; i++) {
            const struct volume_entry *e = &s.entries[i];
            if (!streq(e->name, dup_names[k]))
                continue;
            found++;
            assert_null(e->vol);
            assert_int_equal(e->error, -EEXIST);
            assert_non_null(e->message);
            assert_non_null(strstr(e->message, "also in "));
            /* Names the other directory, not its own. */
            const char *other = streq(e->base, bridge) ? (k == 0 ? vols : third) : bridge;
            if (!strstr(e->message, other) || strstr(e->message, e->base))
                fail_msg("%s in %s: message \"%s\" should name %s only", e->name, e->base,
                         e->message, other);
        }
        assert_int_equal(found, 2);
    }
    /* Not duplicated: found as usual, in its own directory. */
    const struct volume_entry *e = volume_scan_find(&s, "data");
    assert_non_null(e);
    assert_non_null(e->vol);
    assert_string_equal(e->base, bridge);
    e = volume_scan_find(&s, "dirlink");
    assert_int_equal(e->error, -ELOOP);
    volume_scan_clear(&s);

    /* The same directories one at a time: no conflict. */
    const char *one[] = {bridge};
    assert_int_equal(volumes_scan(one, 1, 64, &s, NULL), 0);
    e = volume_scan_find(&s, "good");
    assert_non_null(e->vol);
    volume_scan_clear(&s);
}

/* A directory that cannot be read fails the whole scan (nothing would be
 * known about its volumes) and is named. */
static void test_missing_dir(void **state)
{
    char absent[PATH_MAX * 2];
    snprintf(absent, sizeof(absent), "%s/absent", base);
    struct volume_scan s = {0};
    const char *dirs[] = {vols, absent};
    const char *failed = NULL;
    assert_int_equal(volumes_scan(dirs, 2, 64, &s, &failed), -ENOENT);
    assert_ptr_equal(failed, dirs[1]);
    assert_int_equal(s.n, 0);
    assert_null(s.entries);
    /* A symlinked volumes directory is the caller's choice (it resolves the
     * path once at start); a plain file is not a directory. */
    char file[PATH_MAX * 2];
    snprintf(file, sizeof(file), "%s/plainfile", vols);
    const char *f[] = {file};
    failed = NULL;
    assert_int_equal(volumes_scan(f, 1, 64, &s, &failed), -ENOTDIR);
    assert_ptr_equal(failed, f[0]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scan),
        cmocka_unit_test(test_scan_limit),
        cmocka_unit_test(test_socket_path),
        cmocka_unit_test(test_two_dirs),
        cmocka_unit_test(test_duplicate_name),
        cmocka_unit_test(test_missing_dir),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
