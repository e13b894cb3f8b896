/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for image names in the pool (qsd/qemu/pool.h) and the digest
 * checks of image classes (qsd/qemu/imagebase.h): a name is a SHA-256 (64
 * hex digits) or a SHA-512 (128); the garbage collection of images/ treats
 * both alike (names whose layer is gone, fetch temporaries no fetch holds)
 * and leaves anything else alone. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "qsd/base/util.h"
#include "qsd/qemu/imagebase.h"
#include "qsd/qemu/pool.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define H64 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define H128 H64 "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"

static void test_names_and_digests(void **state)
{
    assert_true(pool_image_name_valid(H64));
    assert_true(pool_image_name_valid(H128));
    assert_false(pool_image_name_valid(H64 "0"));
    assert_false(pool_image_name_valid(H128 "0"));
    assert_false(pool_image_name_valid("0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef"));
    assert_false(pool_image_name_valid(""));
    assert_false(pool_image_name_valid(NULL));

    assert_string_equal(imagebase_digest_algo(H64), "sha256");
    assert_string_equal(imagebase_digest_algo(H128), "sha512");
    assert_null(imagebase_digest_algo(H64 "00"));
    assert_null(imagebase_digest_algo(NULL));

    assert_null(imagebase_digest_problem("sha256", H64));
    assert_null(imagebase_digest_problem("sha512", H128));
    assert_non_null(strstr(imagebase_digest_problem("sha256", H128), "64 hexadecimal"));
    assert_non_null(strstr(imagebase_digest_problem("sha512", H64), "128 hexadecimal"));
    assert_non_null(strstr(imagebase_digest_problem("sha512", NULL), "128 hexadecimal"));
    char upper[] = H128;
    upper[5] = 'A';
    assert_non_null(strstr(imagebase_digest_problem("sha512", upper), "lowercase"));
    char g[] = H128;
    g[127] = 'g';
    assert_non_null(strstr(imagebase_digest_problem("sha512", g), "lowercase"));
}

static void put(const char *dir, const char *name)
{
    _cleanup_free_ char *p = xasprintf("%s/%s", dir, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    close(fd);
}

static bool there(const char *dir, const char *name)
{
    _cleanup_free_ char *p = xasprintf("%s/%s", dir, name);
    struct stat st;
    return lstat(p, &st) == 0;
}

static void test_gc_both_lengths(void **state)
{
    char root[] = "/tmp/qsd-test-pool-images.XXXXXX";
    assert_non_null(mkdtemp(root));
    struct pool p;
    _cleanup_free_ char *msg = NULL;
    assert_int_equal(pool_open(root, true, &p, &msg), 0);
    const char *d = p.images;
    /* names whose layer is gone: removed, either length */
    _cleanup_free_ char *l64 = xasprintf("%s/" H64, d), *l128 = xasprintf("%s/" H128, d);
    assert_int_equal(symlink("../layers/L0123456789abcdef.qcow2", l64), 0);
    assert_int_equal(symlink("../layers/L0123456789abcdef.qcow2", l128), 0);
    /* temporaries of a dead fetch: removed */
    put(d, "." H128 ".part");
    put(d, "." H128 ".part.qcow2");
    put(d, "." H128 ".link");
    /* a fetch in progress (its .part locked): kept */
    put(d, "." H64 ".part");
    put(d, "." H64 ".part.qcow2");
    _cleanup_free_ char *held = xasprintf("%s/." H64 ".part", d);
    int fd = open(held, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), 0);
    /* not ours: kept */
    put(d, "." H64 "0.part");
    put(d, "README");
    put(d, ".nodot");

    unsigned removed = 0;
    uint64_t freed = 0;
    free(msg);
    msg = NULL;
    assert_int_equal(pool_gc(&p, &removed, &freed, &msg), 0);
    assert_false(there(d, H64));
    assert_false(there(d, H128));
    assert_false(there(d, "." H128 ".part"));
    assert_false(there(d, "." H128 ".part.qcow2"));
    assert_false(there(d, "." H128 ".link"));
    assert_true(there(d, "." H64 ".part"));
    assert_true(there(d, "." H64 ".part.qcow2"));
    assert_true(there(d, "." H64 "0.part"));
    assert_true(there(d, "README"));
    assert_true(there(d, ".nodot"));
    close(fd);

    _cleanup_free_ char *cmd = xasprintf("rm -rf '%s'", root);
    assert_int_equal(system(cmd), 0);
    pool_close(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_digests),
        cmocka_unit_test(test_gc_both_lengths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
