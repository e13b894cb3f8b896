/* SPDX-License-Identifier: Apache-2.0 */
/* test_launcher_alias.c: volume id <-> libvirt user alias (domain_xml.h).
 * Every alias is "ua-" + [A-Za-z0-9_-] (what libvirt keeps), the mapping is
 * undone exactly, and it is injective: checked on every id of up to four
 * characters over an alphabet holding both escaped characters, the escape
 * sequences' letters and an ordinary one.  Strings no id maps to are
 * refused by the inverse. */
#include "domain_xml.h"
#include "qsd/base/util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

static bool alias_chars_ok(const char *a)
{
    if (strncmp(a, "ua-", 3) != 0)
        return false;
    for (const char *c = a + 3; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_' || *c == '-'))
            return false;
    return true;
}

static int str_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void test_examples(void **state)
{
    static const char *const cases[][2] = {
        {"pvc-0002", "ua-pvc-0002"}, /* the common case is unchanged */
        {"pvc.a_b", "ua-pvc_da__b"},
        {"a..b", "ua-a_d_db"},
        {"x_d", "ua-x__d"},
        {"1.2.3", "ua-1_d2_d3"},
    };
    for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
        _cleanup_free_ char *a = domain_disk_alias(cases[i][0]);
        assert_string_equal(a, cases[i][1]);
        _cleanup_free_ char *id = domain_alias_volume_id(a);
        assert_string_equal(id, cases[i][0]);
    }
    static const char *const not_ours[] = {"ua-a_", "ua-a_x", "ua-a.b", "net0", "ua-a b", "ub-a"};
    for (size_t i = 0; i < ARRAY_SIZE(not_ours); i++)
        assert_null(domain_alias_volume_id(not_ours[i]));
}

static void test_injective_exhaustive(void **state)
{
    static const char alpha[] = "._da-";
    const size_t k = sizeof(alpha) - 1;
    size_t total = 0;
    for (size_t len = 1; len <= 4; len++)
        total += (size_t)1 << (3 * len); /* upper bound: k <= 8 */
    char **seen = xcalloc(total, sizeof(*seen));
    size_t n = 0;
    for (size_t len = 1; len <= 4; len++) {
        size_t count = 1;
        for (size_t i = 0; i < len; i++)
            count *= k;
        for (size_t m = 0; m < count; m++) {
            char id[8];
            size_t x = m;
            for (size_t i = 0; i < len; i++, x /= k)
                id[i] = alpha[x % k];
            id[len] = 0;
            char *a = domain_disk_alias(id);
            assert_true(alias_chars_ok(a));
            _cleanup_free_ char *back = domain_alias_volume_id(a);
            assert_non_null(back);
            assert_string_equal(back, id);
            seen[n++] = a;
        }
    }
    qsort(seen, n, sizeof(*seen), str_cmp);
    for (size_t i = 1; i < n; i++)
        assert_string_not_equal(seen[i - 1], seen[i]);
    for (size_t i = 0; i < n; i++)
        free(seen[i]);
    free(seen);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_examples),
        cmocka_unit_test(test_injective_exhaustive),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
