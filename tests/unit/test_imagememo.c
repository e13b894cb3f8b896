/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for csi/imagememo.c: checksum refusals remembered for
 * IMAGEMEMO_TTL_MS, keyed by URL and expected digest, bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "imagememo.h"
#include "qsd/base/util.h"

#include <stdio.h>

#define U "https://example.org/debian.qcow2"
#define E "aaaa"
#define G "bbbb"

static void test_find_within_ttl(void **state)
{
    struct imagememo *m = imagememo_new();
    const char *got = NULL;
    uint64_t left = 0;
    assert_false(imagememo_find(m, U, E, 1000, &got, &left));
    imagememo_note(m, U, E, G, 1000);
    assert_true(imagememo_find(m, U, E, 1000, &got, &left));
    assert_string_equal(got, G);
    assert_int_equal(left, IMAGEMEMO_TTL_MS);
    assert_true(imagememo_find(m, U, E, 1000 + IMAGEMEMO_TTL_MS - 1, &got, &left));
    assert_int_equal(left, 1);
    /* the key is the pair: another digest or another URL is not refused */
    assert_false(imagememo_find(m, U, "cccc", 2000, &got, &left));
    assert_false(imagememo_find(m, U "?x", E, 2000, &got, &left));
    /* expired: gone, and dropped */
    assert_false(imagememo_find(m, U, E, 1000 + IMAGEMEMO_TTL_MS, &got, &left));
    assert_int_equal(imagememo_count(m), 0);
    imagememo_free(m);
}

static void test_note_again_and_forget(void **state)
{
    struct imagememo *m = imagememo_new();
    const char *got;
    uint64_t left;
    imagememo_note(m, U, E, G, 0);
    imagememo_note(m, U, E, "dddd", 5000); /* a second refusal: new digest, new time */
    assert_int_equal(imagememo_count(m), 1);
    assert_true(imagememo_find(m, U, E, 6000, &got, &left));
    assert_string_equal(got, "dddd");
    assert_int_equal(left, IMAGEMEMO_TTL_MS - 1000);
    imagememo_forget(m, U, E); /* a later download succeeded */
    assert_false(imagememo_find(m, U, E, 6000, &got, &left));
    imagememo_forget(m, U, E); /* forgetting nothing is fine */
    imagememo_free(m);
    imagememo_free(NULL);
}

static void test_bounded(void **state)
{
    struct imagememo *m = imagememo_new();
    char url[64];
    const char *got;
    uint64_t left;
    for (unsigned i = 0; i < IMAGEMEMO_MAX + 10; i++) {
        snprintf(url, sizeof(url), "http://h/%u", i);
        imagememo_note(m, url, E, G, 100 + i);
    }
    assert_int_equal(imagememo_count(m), IMAGEMEMO_MAX);
    /* the oldest went, the newest stay */
    assert_false(imagememo_find(m, "http://h/0", E, 200, &got, &left));
    assert_false(imagememo_find(m, "http://h/9", E, 200, &got, &left));
    assert_true(imagememo_find(m, "http://h/10", E, 200, &got, &left));
    snprintf(url, sizeof(url), "http://h/%u", IMAGEMEMO_MAX + 9);
    assert_true(imagememo_find(m, url, E, 200, &got, &left));
    /* all expire together later */
    assert_false(imagememo_find(m, url, E, 200 + IMAGEMEMO_MAX + IMAGEMEMO_TTL_MS, &got, &left));
    assert_int_equal(imagememo_count(m), 0);
    imagememo_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_find_within_ttl),
        cmocka_unit_test(test_note_again_and_forget),
        cmocka_unit_test(test_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
