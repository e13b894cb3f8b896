/* SPDX-License-Identifier: Apache-2.0 */
/* test_gate_preamble.c: the dial mode's preamble (qsdctl/gate_preamble.c),
 * no I/O: good lines for IPv4 and IPv6 with the fixed port; partial lines
 * read on; and each refusal with its reason: another verb, a name, a port,
 * brackets, unspecified and multicast hosts, bytes after the newline, too
 * long, a NUL inside. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

#include "gate_conf.h"
#include "gate_preamble.h"
#include "qsd/base/util.h"

static int parse(const char *s, size_t len, struct sockaddr_storage *ss, const char **why)
{
    socklen_t sl = 0;
    *why = NULL;
    return gate_preamble_parse(s, len, 9830, ss, &sl, why);
}

static void test_good(void **state)
{
    (void)state;
    struct sockaddr_storage ss;
    const char *why;
    char buf[80];
    assert_int_equal(parse("CONNECT 10.1.2.3\n", 17, &ss, &why), GATE_PREAMBLE_CONNECT);
    assert_string_equal(gate_format_addr((struct sockaddr *)&ss, buf, sizeof(buf)),
                        "10.1.2.3:9830");
    const char *v6 = "CONNECT fd00::1\n";
    assert_int_equal(parse(v6, strlen(v6), &ss, &why), 1);
    assert_string_equal(gate_format_addr((struct sockaddr *)&ss, buf, sizeof(buf)),
                        "[fd00::1]:9830");
    const char *lo = "CONNECT ::1\n";
    assert_int_equal(parse(lo, strlen(lo), &ss, &why), 1);
    const char *longest = "CONNECT fdff:ffff:ffff:ffff:ffff:ffff:255.255.255.255\n";
    assert_true(strlen(longest) <= GATE_PREAMBLE_MAX);
    assert_int_equal(parse(longest, strlen(longest), &ss, &why), 1);
    /* the API server's route: the port and address untouched */
    memset(&ss, 0xa5, sizeof(ss));
    assert_int_equal(parse("API\n", 4, &ss, &why), GATE_PREAMBLE_API);
    assert_int_equal(ss.ss_family, (sa_family_t)0xa5a5);
    /* not complete yet: read on */
    static const char *const partial[] = {"C", "CONN", "CONNECT ", "CONNECT 10.1", "CONNECT x",
                                          "A", "AP", "API"};
    for (size_t i = 0; i < ARRAY_SIZE(partial); i++)
        if (parse(partial[i], strlen(partial[i]), &ss, &why) != 0)
            fail_msg("%s: not read on (%s)", partial[i], why ? why : "");
}

static void test_refused(void **state)
{
    (void)state;
    static const struct {
        const char *line, *why;
    } bad[] = {
        {"GET / HTTP/1.1\r\n", "expected CONNECT <ip> or API"},
        {"connect 10.1.2.3\n", "expected CONNECT <ip> or API"},
        {"CONNECT\n", "expected CONNECT <ip> or API"},
        {"CONNECT 10.1.2.3", NULL}, /* (read on: not a refusal) */
        {"CONNECT \n", "host is not an IP address"},
        {"CONNECT localhost\n", "host is not an IP address"},
        {"CONNECT node-1.example.com\n", "host is not an IP address"},
        {"CONNECT 10.1.2.3:22\n", "host is not an IP address"},
        {"CONNECT [::1]\n", "host is not an IP address"},
        {"CONNECT [::1]:22\n", "host is not an IP address"},
        {"CONNECT  10.1.2.3\n", "host is not an IP address"},
        {"CONNECT 10.1.2.3\r\n", "host is not an IP address"},
        {"CONNECT 10.1.2.3 \n", "host is not an IP address"},
        {"CONNECT fe80::1%eth0\n", "host is not an IP address"},
        {"CONNECT 010.1.2.3\n", "host is not an IP address"},
        {"CONNECT 0.0.0.0\n", "host is not a unicast address"},
        {"CONNECT 255.255.255.255\n", "host is not a unicast address"},
        {"CONNECT 224.0.0.1\n", "host is not a unicast address"},
        {"CONNECT ::\n", "host is not a unicast address"},
        {"CONNECT ff02::1\n", "host is not a unicast address"},
        {"API\nGET", "bytes before OK"},
        {"API\n\n", "bytes before OK"},
        {"API \n", "expected CONNECT <ip> or API"},
        {"APIS\n", "expected CONNECT <ip> or API"},
        {"api\n", "expected CONNECT <ip> or API"},
        {"API\r\n", "expected CONNECT <ip> or API"},
        {"ACONNECT 1.2.3.4\n", "expected CONNECT <ip> or API"},
        {"CONNECT 10.1.2.3\nGET", "bytes before OK"},
        {"CONNECT 10.1.2.3\n\n", "bytes before OK"},
        {"CONNECT 1111111111111111111111111111111111111111111111111111111111111", "preamble too long"},
        {"CONNECT 1111111111111111111111111111111111111111111111111111111111\n", "host is not an IP address"},
    };
    struct sockaddr_storage ss;
    const char *why;
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        int r = parse(bad[i].line, strlen(bad[i].line), &ss, &why);
        if (!bad[i].why) {
            assert_int_equal(r, 0);
            continue;
        }
        if (r != -EINVAL)
            fail_msg("%s: accepted (%d)", bad[i].line, r);
        if (!why || strcmp(why, bad[i].why) != 0)
            fail_msg("%s: reason \"%s\", wanted \"%s\"", bad[i].line, why ? why : "",
                     bad[i].why);
        assert_null(strchr(why, '\n'));
    }
    /* a NUL inside the host */
    static const char nul[] = "CONNECT 10.1\0.2.3\n";
    assert_int_equal(parse(nul, sizeof(nul) - 1, &ss, &why), -EINVAL);
    assert_string_equal(why, "host is not an IP address");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
