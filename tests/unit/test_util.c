/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for util.c and names.c: size parsing, name validation, atomic writes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "qsd/base/names.h"
#include "qsd/base/util.h"

static void test_parse_size(void **state)
{
    uint64_t v;
    assert_int_equal(parse_size("4096", &v), 0);
    assert_int_equal(v, 4096);
    assert_int_equal(parse_size("1G", &v), 0);
    assert_int_equal(v, 1ull << 30);
    assert_int_equal(parse_size("64MiB", &v), 0);
    assert_int_equal(v, 64ull << 20);
    assert_int_equal(parse_size("2k", &v), 0);
    assert_int_equal(v, 2048);
    assert_int_equal(parse_size("", &v), -EINVAL);
    assert_int_equal(parse_size("-1", &v), -EINVAL);
    assert_int_equal(parse_size("1.5G", &v), -EINVAL);
    assert_int_equal(parse_size("12X", &v), -EINVAL);
    assert_int_equal(parse_size("99999999999999999999", &v), -ERANGE);
    assert_int_equal(parse_size("16777216T", &v), -ERANGE);
    assert_int_equal(parse_size("16777215T", &v), 0);
}

static void test_parse_uint(void **state)
{
    uint64_t v;
    assert_int_equal(parse_uint("8", 1, 16, &v), 0);
    assert_int_equal(v, 8);
    assert_int_equal(parse_uint("0", 1, 16, &v), -ERANGE);
    assert_int_equal(parse_uint("17", 1, 16, &v), -ERANGE);
    assert_int_equal(parse_uint("1x", 1, 16, &v), -EINVAL);
    assert_int_equal(parse_uint(" 1", 1, 16, &v), -EINVAL);
}

static void test_names(void **state)
{
    const char *why = NULL;
    assert_int_equal(name_validate("pvc-1234", &why), 0);
    assert_int_equal(name_validate("a", &why), 0);
    assert_int_equal(name_validate("", &why), -EINVAL);
    assert_string_equal(why, "is empty");
    assert_int_equal(name_validate("a/b", &why), -EINVAL);
    assert_string_equal(why, "contains '/'");
    assert_int_equal(name_validate("a..b", &why), -EINVAL);
    assert_string_equal(why, "contains '..'");
    assert_int_equal(name_validate("..", &why), -EINVAL);
    assert_int_equal(name_validate(".hidden", &why), -EINVAL);
    assert_int_equal(name_validate("a\nb", &why), -EINVAL);
    assert_string_equal(why, "contains a control character");
    assert_int_equal(name_validate("a b", &why), -EINVAL);
    assert_int_equal(name_validate("a<b>", &why), -EINVAL);
    assert_int_equal(name_validate_n("ab\0c", 4, &why), -EINVAL);
    assert_string_equal(why, "contains a NUL byte");
    char longname[130];
    memset(longname, 'a', 129);
    longname[129] = '\0';
    assert_int_equal(name_validate(longname, &why), -EINVAL);
    assert_string_equal(why, "is longer than 128 bytes");
    longname[128] = '\0';
    assert_int_equal(name_validate(longname, &why), 0);
}

static void test_atomic_write(void **state)
{
    char dir[] = "/tmp/qsd-test-XXXXXX";
    assert_non_null(mkdtemp(dir));
    _cleanup_free_ char *path = xasprintf("%s/state.json", dir);
    assert_int_equal(write_file_atomic(path, "hello", 5, 0600), 0);
    assert_int_equal(write_file_atomic(path, "world!", 6, 0600), 0);
    _cleanup_free_ char *data = NULL;
    size_t len;
    assert_int_equal(read_file(path, 1024, &data, &len), 0);
    assert_int_equal(len, 6);
    assert_string_equal(data, "world!");
    free(data);
    data = NULL;
    assert_int_equal(read_file(path, 3, &data, &len), -EFBIG);
    _cleanup_free_ char *sub = xasprintf("%s/a/b/c", dir);
    assert_int_equal(mkdir_p(sub, 0700), 0);
    assert_int_equal(rm_rf(dir), 0);
    assert_int_equal(access(dir, F_OK), -1);
}

/* A ConfigMap's layout: vm.json -> ..data/vm.json, ..data -> ..2026_x.
 * read_file refuses the symlink, read_file_follow reads through it and
 * refuses what is not a regular file (a FIFO would block a plain read). */
static void test_read_follow(void **state)
{
    char dir[] = "/tmp/qsd-test-XXXXXX";
    assert_non_null(mkdtemp(dir));
    _cleanup_free_ char *real = xasprintf("%s/..2026_x", dir);
    _cleanup_free_ char *file = xasprintf("%s/..2026_x/vm.json", dir);
    _cleanup_free_ char *data_link = xasprintf("%s/..data", dir);
    _cleanup_free_ char *link = xasprintf("%s/vm.json", dir);
    _cleanup_free_ char *fifo = xasprintf("%s/fifo", dir);
    assert_int_equal(mkdir_p(real, 0700), 0);
    assert_int_equal(write_file_atomic(file, "{}", 2, 0600), 0);
    assert_int_equal(symlink("..2026_x", data_link), 0);
    assert_int_equal(symlink("..data/vm.json", link), 0);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    char *data = NULL;
    size_t len;
    assert_int_equal(read_file(link, 1024, &data, &len), -ELOOP);
    assert_int_equal(read_file_follow(link, 1024, &data, &len), 0);
    assert_int_equal(len, 2);
    assert_string_equal(data, "{}");
    free(data);
    data = NULL;
    assert_int_equal(read_file_follow(link, 1, &data, &len), -EFBIG);
    assert_int_equal(read_file_follow(fifo, 1024, &data, &len), -EINVAL);
    assert_int_equal(read_file_follow(dir, 1024, &data, &len), -EINVAL);
    assert_null(data);
    assert_int_equal(rm_rf(dir), 0);
}

static void test_socket_listening(void **state)
{
    char dir[] = "/tmp/qsd-test-XXXXXX";
    assert_non_null(mkdtemp(dir));
    _cleanup_free_ char *path = xasprintf("%s/s.sock", dir);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(unix_socket_listening(path), 0); /* bound, not listening */
    assert_int_equal(listen(fd, 1), 0);
    assert_int_equal(unix_socket_listening(path), 1);
    _cleanup_free_ char *other = xasprintf("%s/s.soc", dir);
    assert_int_equal(unix_socket_listening(other), 0); /* prefix of nothing */
    close(fd);
    assert_int_equal(unix_socket_listening(path), 0); /* file left, nobody listens */
    assert_int_equal(rm_rf(dir), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_size),
        cmocka_unit_test(test_parse_uint),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_atomic_write),
        cmocka_unit_test(test_read_follow),
        cmocka_unit_test(test_socket_listening),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
