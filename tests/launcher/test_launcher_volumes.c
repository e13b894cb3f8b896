/* Volume discovery on a real directory: ready volumes, volumes not ready yet,
 * and everything that must be refused (symlinks out of the directory at each
 * level, wrong file types, bad names). */
#include "util.h"
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
static char vols[PATH_MAX], outside[PATH_MAX];

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

static void mkvol(const char *name, bool with_json, bool with_socket)
{
    char p[PATH_MAX * 2];
    snprintf(p, sizeof(p), "%s/%s", vols, name);
    assert_int_equal(mkdir(p, 0755), 0);
    if (with_json) {
        snprintf(p, sizeof(p), "%s/%s/volume.json", vols, name);
        put(p, meta);
    }
    if (with_socket) {
        snprintf(p, sizeof(p), "%s/%s/vhost.sock", vols, name);
        make_socket(p);
    }
}

static int setup(void **state)
{
    assert_non_null(mkdtemp(base));
    snprintf(vols, sizeof(vols), "%s/volumes", base);
    snprintf(outside, sizeof(outside), "%s/outside", base);
    assert_int_equal(mkdir(vols, 0755), 0);
    assert_int_equal(mkdir(outside, 0755), 0);
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
    assert_int_equal(volumes_scan(vols, 64, &s), 0);
    assert_int_equal(s.n, 10); /* everything but .staging */
    const struct volume_entry *e = volume_scan_find(&s, "good");
    assert_non_null(e);
    assert_non_null(e->vol);
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
    assert_int_equal(volumes_scan(vols, 3, &s), -E2BIG);
}

static void test_socket_path(void **state)
{
    struct volume *v = NULL;
    assert_int_equal(volume_meta_parse(meta, strlen(meta), "d", &v, NULL), 0);
    char *p = volume_socket_path("/x", v);
    assert_string_equal(p, "/x/d/vhost.sock");
    free(p);
    volume_free(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scan),
        cmocka_unit_test(test_scan_limit),
        cmocka_unit_test(test_socket_path),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
