/* SPDX-License-Identifier: Apache-2.0 */
/* test_gate_conf.c: qsd-node-gate's command line (qsdctl/gate_conf.c), no
 * I/O: listen addresses (IPv4, [IPv6], ports, what is refused), the
 * forward path's directory and name, defaults and bounds, the dial mode's
 * options (required there, refused in serve mode, and the serve mode's
 * refused with --dial), and that every refusal names its option. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

#include "gate_conf.h"
#include "qsd/base/util.h"

static void test_listen(void **state)
{
    (void)state;
    struct sockaddr_storage ss;
    socklen_t sl;
    char buf[80];
    assert_int_equal(gate_parse_listen("10.1.2.3:9830", &ss, &sl), 0);
    assert_int_equal(ss.ss_family, AF_INET);
    assert_int_equal(sl, sizeof(struct sockaddr_in));
    assert_string_equal(gate_format_addr((struct sockaddr *)&ss, buf, sizeof(buf)),
                        "10.1.2.3:9830");
    assert_int_equal(gate_parse_listen("[fd00::1]:9830", &ss, &sl), 0);
    assert_int_equal(ss.ss_family, AF_INET6);
    assert_int_equal(sl, sizeof(struct sockaddr_in6));
    assert_string_equal(gate_format_addr((struct sockaddr *)&ss, buf, sizeof(buf)),
                        "[fd00::1]:9830");
    /* IPv4 in brackets (a manifest's [$(HOST_IP)]:PORT on an IPv4 node) */
    assert_int_equal(gate_parse_listen("[10.1.2.3]:9830", &ss, &sl), 0);
    assert_int_equal(ss.ss_family, AF_INET);
    assert_int_equal(sl, sizeof(struct sockaddr_in));
    assert_string_equal(gate_format_addr((struct sockaddr *)&ss, buf, sizeof(buf)),
                        "10.1.2.3:9830");
    assert_int_equal(gate_parse_listen("0.0.0.0:0", &ss, &sl), 0);
    assert_int_equal(gate_parse_listen("[::]:65535", &ss, &sl), 0);
    static const char *const bad[] = {
        "", ":1", "1.2.3.4", "1.2.3.4:", "1.2.3.4:65536", "1.2.3.4:-1", "1.2.3.4:1x",
        "1.2.3:1", "host:1", "::1:1", "[::1]1", "[::1]:", "[]:1", "[1.2.3]:1", "[[1.2.3.4]]:1",
        "[fd00::1:1", "1.2.3.4:99999999999999999999",
    };
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
        if (gate_parse_listen(bad[i], &ss, &sl) == 0)
            fail_msg("accepted %s", bad[i]);
}

#define BASE "--listen", "127.0.0.1:9830", "--ca", "ca.pem", "--cert", "c.pem", "--key", \
             "c.key", "--peer-name", "qsd-csi-controller"

static int parse(struct gate_conf *c, char *err, size_t n, int argc, char **argv)
{
    err[0] = '\0';
    return gate_conf_parse(argc, argv, c, err, n);
}
#define PARSE(c, err, ...)                                                     \
    ({                                                                         \
        char *_argv[] = {"qsd-node-gate", __VA_ARGS__, NULL};                  \
        parse(c, err, sizeof(err), (int)ARRAY_SIZE(_argv) - 1, _argv);        \
    })

static void test_good(void **state)
{
    (void)state;
    struct gate_conf c;
    char err[256];
    assert_int_equal(PARSE(&c, err, BASE, "--forward", "/run/qsd-csi/node.sock"), 0);
    assert_string_equal(c.sock_dir, "/run/qsd-csi");
    assert_string_equal(c.sock_name, "node.sock");
    assert_int_equal(c.max_conns, GATE_DEFAULT_MAX_CONNS);
    assert_int_equal(c.handshake_ms, GATE_DEFAULT_HANDSHAKE_MS);
    assert_int_equal(c.idle_ms, GATE_DEFAULT_IDLE_MS);
    assert_true(c.uid == (uid_t)-1 && c.gid == (gid_t)-1);
    assert_string_equal(c.peer_name, "qsd-csi-controller");
    assert_int_equal(PARSE(&c, err, BASE, "--forward", "node.sock", "--uid", "0", "--gid",
                           "4294967294", "--max-conns", "1024", "--handshake-timeout-ms", "1",
                           "--idle-timeout-ms", "3600000"), 0);
    assert_string_equal(c.sock_dir, ".");
    assert_int_equal(c.uid, 0);
    assert_int_equal(c.gid, 4294967294u);
    assert_int_equal(c.max_conns, 1024);
    assert_int_equal(c.handshake_ms, 1);
    assert_int_equal(c.idle_ms, 3600000);
    assert_int_equal(PARSE(&c, err, BASE, "--forward", "/sock"), 0);
    assert_string_equal(c.sock_dir, "/");
    assert_string_equal(c.sock_name, "sock");
    /* a second parse starts afresh (getopt's state) */
    assert_int_equal(PARSE(&c, err, "--version"), 0);
    assert_true(c.version);
    assert_int_equal(PARSE(&c, err, "--help"), 0);
    assert_true(c.help);
}

/* Each refusal: -EINVAL and a message holding the option's name. */
static void refused(const char *opt, int argc, char **argv)
{
    struct gate_conf c;
    char err[256];
    if (parse(&c, err, sizeof(err), argc, argv) != -EINVAL)
        fail_msg("accepted (%s)", opt);
    if (!strstr(err, opt))
        fail_msg("message \"%s\" does not name %s", err, opt);
}
#define REFUSED(opt, ...)                                                      \
    do {                                                                       \
        char *_argv[] = {"qsd-node-gate", __VA_ARGS__, NULL};                  \
        refused(opt, (int)ARRAY_SIZE(_argv) - 1, _argv);                       \
    } while (0)

static void test_refused(void **state)
{
    (void)state;
    REFUSED("--forward", BASE);
    REFUSED("--listen", "--ca", "a", "--cert", "b", "--key", "c", "--peer-name", "p",
            "--forward", "f");
    REFUSED("--ca", "--listen", "1.2.3.4:1", "--cert", "b", "--key", "c", "--peer-name", "p",
            "--forward", "f");
    REFUSED("--peer-name", "--listen", "1.2.3.4:1", "--ca", "a", "--cert", "b", "--key", "c",
            "--forward", "f");
    REFUSED("--listen", "--listen", "localhost:1", "--ca", "a");
    REFUSED("--forward", BASE, "--forward", "/run/");
    REFUSED("--forward", BASE, "--forward", "/run/..");
    REFUSED("--forward", BASE, "--forward",
            "/run/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    REFUSED("--uid", BASE, "--forward", "s", "--uid", "5");
    REFUSED("--uid", BASE, "--forward", "s", "--uid", "-1", "--gid", "5");
    REFUSED("--uid", BASE, "--forward", "s", "--uid", "4294967295", "--gid", "5");
    REFUSED("--gid", BASE, "--forward", "s", "--uid", "5", "--gid", "x");
    REFUSED("--max-conns", BASE, "--forward", "s", "--max-conns", "0");
    REFUSED("--max-conns", BASE, "--forward", "s", "--max-conns", "1025");
    REFUSED("--handshake-timeout-ms", BASE, "--forward", "s", "--handshake-timeout-ms", "0");
    REFUSED("--idle-timeout-ms", BASE, "--forward", "s", "--idle-timeout-ms", "3600001");
    REFUSED("--log-level", BASE, "--forward", "s", "--log-level", "loud");
    REFUSED("--peer-name", "--listen", "1.2.3.4:1", "--ca", "a", "--cert", "b", "--key", "c",
            "--peer-name", "", "--forward", "f");
    REFUSED("--bogus", BASE, "--forward", "s", "--bogus");
    REFUSED("--max-conns", BASE, "--forward", "s", "--max-conns");
    REFUSED("stray", BASE, "--forward", "s", "stray");
}

#define DIAL "--dial", "--listen-unix", "/run/qsd-csi/dial.sock", "--port", "9830", "--ca", \
             "ca.pem", "--cert", "c.pem", "--key", "c.key", "--peer-name", "qsd-csi-node"

static void test_dial(void **state)
{
    (void)state;
    struct gate_conf c;
    char err[256];
    assert_int_equal(PARSE(&c, err, DIAL), 0);
    assert_true(c.dial);
    assert_int_equal(c.port, 9830);
    assert_string_equal(c.listen_unix, "/run/qsd-csi/dial.sock");
    assert_string_equal(c.sock_dir, "/run/qsd-csi");
    assert_string_equal(c.sock_name, "dial.sock");
    assert_null(c.forward);
    assert_int_equal(c.listen_len, 0);
    assert_int_equal(PARSE(&c, err, DIAL, "--uid", "5", "--gid", "6", "--max-conns", "2",
                           "--handshake-timeout-ms", "100", "--idle-timeout-ms", "200"), 0);
    assert_int_equal(c.max_conns, 2);
    assert_int_equal(c.handshake_ms, 100);
    /* serve mode is the default: a second parse forgets --dial */
    assert_int_equal(PARSE(&c, err, BASE, "--forward", "f"), 0);
    assert_false(c.dial);
}

static void test_dial_refused(void **state)
{
    (void)state;
    /* the other mode's options, each named */
    REFUSED("--listen", DIAL, "--listen", "127.0.0.1:1");
    REFUSED("--forward", DIAL, "--forward", "f");
    REFUSED("--listen-unix", BASE, "--forward", "f", "--listen-unix", "/run/x.sock");
    REFUSED("--port", BASE, "--forward", "f", "--port", "9830");
    /* what dial mode requires */
    REFUSED("--listen-unix", "--dial", "--port", "1", "--ca", "a", "--cert", "b", "--key", "c",
            "--peer-name", "p");
    REFUSED("--port", "--dial", "--listen-unix", "s", "--ca", "a", "--cert", "b", "--key", "c",
            "--peer-name", "p");
    REFUSED("--ca", "--dial", "--listen-unix", "s", "--port", "1", "--cert", "b", "--key", "c",
            "--peer-name", "p");
    REFUSED("--peer-name", "--dial", "--listen-unix", "s", "--port", "1", "--ca", "a", "--cert",
            "b", "--key", "c");
    REFUSED("--port", DIAL, "--port", "0");
    REFUSED("--port", DIAL, "--port", "65536");
    REFUSED("--port", DIAL, "--port", "98x");
    REFUSED("--listen-unix", DIAL, "--listen-unix", "/run/");
    REFUSED("--listen-unix", DIAL, "--listen-unix",
            "/run/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    REFUSED("--uid", DIAL, "--uid", "5");
    REFUSED("--dial", DIAL, "--dial=yes");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_listen),
        cmocka_unit_test(test_good),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_dial),
        cmocka_unit_test(test_dial_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
