/* SPDX-License-Identifier: Apache-2.0 */
/* launcher/cidata: the NoCloud image is built by mkfs.vfat and mcopy run
 * through proc.h (bounded, no shell): the files land in the image, the
 * image is published read-only, and a missing or failing tool is a clear
 * error that leaves nothing behind. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <sys/stat.h>

#include "cidata.h"
#include "qsd/base/proc.h"
#include "qsd/base/util.h"

static char g_dir[64];

static int setup(void **state)
{
    strcpy(g_dir, "/tmp/cidata-test-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    rm_rf(g_dir);
    return 0;
}

static struct cidata two_files(void)
{
    struct cidata c = {0};
    c.f[0] = (struct cidata_file){"user-data", "#cloud-config\nhostname: a\n", 26, "description"};
    c.f[1] = (struct cidata_file){"meta-data", "instance-id: i\n", 15, "default"};
    return c;
}

/* Entries of g_dir, "." and ".." excluded. */
static int entries(void)
{
    DIR *d = opendir(g_dir);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    closedir(d);
    return n;
}

static void test_build(void **state)
{
    struct proc_result pr = {0};
    char *probe[] = {"mcopy", "--version", NULL};
    if (proc_run(probe, 5000, &pr) < 0) {
        print_message("mtools missing: skipped\n");
        skip();
    }
    proc_result_clear(&pr);
    struct cidata c = two_files();
    _cleanup_free_ char *img = xasprintf("%s/cidata.img", g_dir);
    char *err = NULL;
    assert_int_equal(cidata_build(&c, img, &err), 0);
    assert_null(err);
    struct stat st;
    assert_int_equal(stat(img, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0444);
    assert_int_equal(entries(), 1); /* the build directory is gone */
    char *type[] = {"mtype", "-i", img, "::user-data", NULL};
    char *env[] = {"MTOOLS_SKIP_CHECK=1", "PATH=/usr/bin:/bin", NULL};
    assert_int_equal(proc_run_env(type, env, 5000, &pr), 0);
    assert_int_equal(pr.exit_code, 0);
    assert_string_equal(pr.out, "#cloud-config\nhostname: a\n");
    proc_result_clear(&pr);
    char *label[] = {"mlabel", "-s", "-i", img, "::", NULL};
    assert_int_equal(proc_run_env(label, env, 5000, &pr), 0);
    assert_non_null(strstr(pr.out, "CIDATA"));
    proc_result_clear(&pr);
}

static void with_path(const char *path, const char *want_error)
{
    const char *old = getenv("PATH");
    _cleanup_free_ char *saved = old ? xstrdup(old) : NULL;
    setenv("PATH", path, 1);
    struct cidata c = two_files();
    _cleanup_free_ char *img = xasprintf("%s/cidata.img", g_dir);
    char *err = NULL;
    int r = cidata_build(&c, img, &err);
    if (saved)
        setenv("PATH", saved, 1);
    assert_int_equal(r, -EIO);
    assert_non_null(err);
    if (!strstr(err, want_error))
        fail_msg("error '%s', expected '%s'", err, want_error);
    free(err);
    assert_int_equal(access(img, F_OK), -1);
}

static void test_missing_tool(void **state)
{
    _cleanup_free_ char *empty = xasprintf("%s/empty", g_dir);
    assert_int_equal(mkdir(empty, 0700), 0);
    with_path(empty, "mkfs.vfat not found (install dosfstools and mtools)");
    assert_int_equal(entries(), 1); /* only empty/: no image, no build directory */
}

static void test_failing_tool(void **state)
{
    _cleanup_free_ char *bin = xasprintf("%s/bin", g_dir);
    assert_int_equal(mkdir(bin, 0700), 0);
    _cleanup_free_ char *tool = xasprintf("%s/mkfs.vfat", bin);
    const char *script = "#!/bin/sh\necho progress\necho \"mkfs.vfat: disk full\" >&2\nexit 1\n";
    assert_int_equal(write_file_atomic(tool, script, strlen(script), 0700), 0);
    _cleanup_free_ char *path = xasprintf("%s:/usr/bin:/bin", bin);
    with_path(path, "mkfs.vfat failed: mkfs.vfat: disk full");
    assert_int_equal(entries(), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_build, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_tool, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failing_tool, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
