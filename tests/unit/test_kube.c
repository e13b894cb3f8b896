/* SPDX-License-Identifier: Apache-2.0 */
/* test_kube.c: the pure parts of the controller's node lookup (csi/kube.h):
 * which node names may enter the URL, reading an HTTP/1.x answer, and
 * picking the InternalIP out of a Node. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

#include "kube.h"

static void test_names(void **state)
{
    (void)state;
    static const char *const good[] = {"node-1", "a", "worker.example.com", "10.0.0.1",
                                       "ip-10-0-0-1.ec2.internal", "0a-b"};
    for (size_t i = 0; i < sizeof(good) / sizeof(*good); i++)
        if (!kube_name_ok(good[i]))
            fail_msg("%s refused", good[i]);
    static const char *const bad[] = {"", "Node", "node_1", "-node", "node-", ".node", "node.",
                                      "a..b", "a.-b", "a-.b", "node/../../secrets",
                                      "node?watch=1", "node%2f", "node 1", "node\n"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
        if (kube_name_ok(bad[i]))
            fail_msg("\"%s\" accepted", bad[i]);
    char longest[255];
    memset(longest, 'a', 253);
    longest[253] = '\0';
    assert_true(kube_name_ok(longest));
    longest[253] = 'a';
    longest[254] = '\0';
    assert_false(kube_name_ok(longest));
}

static void test_answer(void **state)
{
    (void)state;
    int status;
    json_t *body;
    static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"kind\":\"Node\"}";
    assert_int_equal(kube_parse_answer(ok, strlen(ok), &status, &body), 0);
    assert_int_equal(status, 200);
    assert_string_equal(json_string_value(json_object_get(body, "kind")), "Node");
    json_decref(body);
    static const char nf[] = "HTTP/1.0 404 Not Found\r\n\r\nnot json";
    assert_int_equal(kube_parse_answer(nf, strlen(nf), &status, &body), 0);
    assert_int_equal(status, 404);
    assert_null(body);
    static const char *const bad[] = {"", "HTTP/1.1", "HTTP/2 200 OK\r\n\r\n{}",
                                      "HTTP/1.1 2x0 OK\r\n\r\n{}", "HTTP/1.1 200 OK\r\n{}",
                                      "http/1.1 200 OK\r\n\r\n{}", "SSH-2.0-x\r\n\r\n"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
        if (kube_parse_answer(bad[i], strlen(bad[i]), &status, &body) != -EPROTO)
            fail_msg("\"%s\" read as an answer", bad[i]);
}

static int ip_of(const char *json, char ip[INET6_ADDRSTRLEN])
{
    json_t *n = json_loads(json, 0, NULL);
    assert_non_null(n);
    int r = kube_internal_ip(n, ip);
    json_decref(n);
    return r;
}

static void test_internal_ip(void **state)
{
    (void)state;
    char ip[INET6_ADDRSTRLEN];
    assert_int_equal(ip_of("{\"status\":{\"addresses\":[{\"type\":\"Hostname\",\"address\":\"n1\"},"
                           "{\"type\":\"ExternalIP\",\"address\":\"192.0.2.1\"},"
                           "{\"type\":\"InternalIP\",\"address\":\"10.0.0.5\"},"
                           "{\"type\":\"InternalIP\",\"address\":\"fd00::5\"}]}}", ip), 0);
    assert_string_equal(ip, "10.0.0.5");
    assert_int_equal(ip_of("{\"status\":{\"addresses\":[{\"type\":\"InternalIP\","
                           "\"address\":\"fd00::5\"}]}}", ip), 0);
    assert_string_equal(ip, "fd00::5");
    /* not an address, a name, a too long string, the wrong types: skipped */
    assert_int_equal(ip_of("{\"status\":{\"addresses\":[{\"type\":\"InternalIP\",\"address\":"
                           "\"node-1.example\"},{\"type\":\"InternalIP\",\"address\":"
                           "\"10.0.0.1:22\"},{\"type\":\"InternalIP\",\"address\":7},"
                           "{\"type\":\"InternalIP\",\"address\":\"" "1111111111111111111111"
                           "1111111111111111111111111111111111111111\"},"
                           "{\"type\":\"InternalIP\",\"address\":\"10.9.9.9\"}]}}", ip), 0);
    assert_string_equal(ip, "10.9.9.9");
    static const char *const none[] = {"{}", "{\"status\":{}}", "{\"status\":{\"addresses\":{}}}",
                                       "{\"status\":{\"addresses\":[]}}",
                                       "{\"status\":{\"addresses\":[{\"type\":\"ExternalIP\","
                                       "\"address\":\"192.0.2.1\"}]}}",
                                       "{\"status\":{\"addresses\":[\"10.0.0.1\"]}}"};
    for (size_t i = 0; i < sizeof(none) / sizeof(*none); i++)
        assert_int_equal(ip_of(none[i], ip), -EADDRNOTAVAIL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_answer),
        cmocka_unit_test(test_internal_ip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
