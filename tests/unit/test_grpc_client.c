/* SPDX-License-Identifier: Apache-2.0 */
/* test_grpc_client.c: the pure parts of csi/grpc_client.h (grpc-timeout
 * written, grpc-message decoded), each checked against the server's
 * reading of them (grpc_parse_timeout, grpc_percent_encode), and the
 * client's refusals that need no server.  The client against real servers:
 * tests/csi/test_grpc_client.py. */
#include "grpc_client.h"
#include "qsd/base/util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

static void test_format_timeout(void **state)
{
    static const uint64_t t[] = {
        0, 1, 999, 99999999, 100000000, 100000001, 3600ull * 1000000 * 24,
        99999999ull * 1000, 99999999ull * 1000000 + 1, UINT64_MAX / 2,
    };
    for (size_t i = 0; i < ARRAY_SIZE(t); i++) {
        char buf[16];
        grpc_format_timeout(t[i], buf);
        uint64_t us = 0;
        assert_int_equal(grpc_parse_timeout(buf, strlen(buf), &us), 0);
        /* Never shorter than asked (the server must not end the call
         * first), at most one unit longer; past 99999999H, clamped. */
        uint64_t unit = 1;
        switch (buf[strlen(buf) - 1]) {
        case 'm': unit = 1000; break;
        case 'S': unit = 1000000; break;
        case 'M': unit = 60000000; break;
        case 'H': unit = 3600000000ull; break;
        }
        if (t[i] < 99999999ull * 3600000000ull) {
            assert_true(us >= t[i]);
            assert_true(us < t[i] + unit + (t[i] == 0));
        } else {
            assert_string_equal(buf, "99999999H");
        }
    }
    char buf[16];
    grpc_format_timeout(1500, buf);
    assert_string_equal(buf, "1500u");
    grpc_format_timeout(123456789, buf);
    assert_string_equal(buf, "123457m");
    grpc_format_timeout(0, buf);
    assert_string_equal(buf, "1u");
}

static void test_percent_decode(void **state)
{
    static const struct { const char *in, *out; } t[] = {
        {"", ""},
        {"plain", "plain"},
        {"100%25 done", "100% done"},
        {"%C3%BC", "\xc3\xbc"},
        {"%c3%bc", "\xc3\xbc"},
        {"lone %", "lone %"},
        {"short %4", "short %4"},
        {"bad %G1 digits", "bad %G1 digits"},
        {"%00 stays", "%00 stays"},
        {"%%41", "%A"},
    };
    for (size_t i = 0; i < ARRAY_SIZE(t); i++) {
        char *d = grpc_percent_decode((const uint8_t *)t[i].in, strlen(t[i].in));
        assert_string_equal(d, t[i].out);
        free(d);
    }
    /* What the server encodes, the client reads back, byte for byte. */
    static const char *const rt[] = {"ünïcödé 100% done %41", "tab\there\nnewline", "~!@#$^&*()"};
    for (size_t i = 0; i < ARRAY_SIZE(rt); i++) {
        char *e = grpc_percent_encode(rt[i]);
        char *d = grpc_percent_decode((const uint8_t *)e, strlen(e));
        assert_string_equal(d, rt[i]);
        free(e);
        free(d);
    }
}

static void test_connect_refusals(void **state)
{
    struct grpc_client *c = NULL;
    struct grpc_client_status st = {0};
    /* No server there. */
    assert_int_equal(grpc_client_connect("/nonexistent/qsd-csi-grpc-client.sock", NULL,
                                         now_us() + 1000000, &c, &st),
                     GRPC_UNAVAILABLE);
    assert_null(c);
    assert_non_null(strstr(st.message, "/nonexistent/qsd-csi-grpc-client.sock"));
    grpc_client_status_done(&st);
    /* A path longer than a unix socket address holds. */
    char longp[200];
    memset(longp, 'a', sizeof(longp) - 1);
    longp[sizeof(longp) - 1] = '\0';
    assert_int_equal(grpc_client_connect(longp, NULL, now_us() + 1000000, &c, &st),
                     GRPC_UNAVAILABLE);
    assert_null(c);
    grpc_client_status_done(&st);
    /* A limit beyond 1 GiB. */
    struct grpc_client_opts o = {.max_message = (1u << 30) + 1};
    assert_int_equal(grpc_client_connect("/x", &o, now_us() + 1000000, &c, &st),
                     GRPC_INVALID_ARGUMENT);
    assert_null(c);
    grpc_client_status_done(&st);
    grpc_client_status_done(NULL);
    grpc_client_free(NULL);
    assert_false(grpc_client_usable(NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format_timeout),
        cmocka_unit_test(test_percent_decode),
        cmocka_unit_test(test_connect_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
