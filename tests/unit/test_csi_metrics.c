/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the pure parts of the plugin's metrics: label escaping,
 * a volume's labels (the ones that join with kube-state-metrics), sample
 * and histogram rendering (text format 0.0.4), the parsing of
 * --http-endpoint, qsd_csi_build_info and the QEMU version it names, and
 * its listener: ":PORT" takes IPv4 and IPv6 clients,
 * and IPv4 ones when the kernel has no IPv6 (a seccomp filter makes
 * socket(AF_INET6) fail with EAFNOSUPPORT, as a kernel booted with
 * ipv6.disable=1 does), also where net.ipv6.bindv6only is 1 (in a
 * network namespace of the test's own); an explicit host only its own. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "http.h"
#include "metrics.h"
#include "qsd/base/loop.h"
#include "qsd/base/util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

static char *render(void (*fn)(FILE *f, void *arg), void *arg)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    fn(f, arg);
    fclose(f);
    return out;
}

static void test_labels(void **state)
{
    _cleanup_free_ char *l = metrics_labels("volume_id", "a\"b\\c\nd", "state", "hung", NULL);
    assert_string_equal(l, "volume_id=\"a\\\"b\\\\c\\nd\",state=\"hung\"");
    _cleanup_free_ char *e = metrics_labels("k", "", NULL);
    assert_string_equal(e, "k=\"\"");
}

static void test_volume_labels(void **state)
{
    json_t *ctx = json_pack("{s:s, s:s, s:s}", "csi.storage.k8s.io/pvc/name", "disk-a",
                            "csi.storage.k8s.io/pvc/namespace", "vms",
                            "csi.storage.k8s.io/pv/name", "pvc-1");
    _cleanup_free_ char *l = metrics_volume_labels("pvc-1", "pvc-1@node-a", ctx);
    assert_string_equal(l, "volume_id=\"pvc-1\",volume_handle=\"pvc-1@node-a\","
                           "namespace=\"vms\",persistentvolumeclaim=\"disk-a\"");
    json_decref(ctx);
    /* A record made before the context was kept, or without the
     * provisioner's metadata: empty, never missing. */
    _cleanup_free_ char *none = metrics_volume_labels("pvc-2", NULL, NULL);
    assert_string_equal(none, "volume_id=\"pvc-2\",volume_handle=\"\",namespace=\"\","
                              "persistentvolumeclaim=\"\"");
    json_t *odd = json_pack("{s:i, s:s}", "csi.storage.k8s.io/pvc/name", 7,
                            "csi.storage.k8s.io/pvc/namespace", "a\"b");
    _cleanup_free_ char *e = metrics_volume_labels("v", "v@n", odd);
    assert_string_equal(e, "volume_id=\"v\",volume_handle=\"v@n\",namespace=\"a\\\"b\","
                           "persistentvolumeclaim=\"\"");
    json_decref(odd);
}

static void samples(FILE *f, void *arg)
{
    metrics_family(f, "qsd_csi_x", "gauge", "An x.");
    metrics_sample(f, "qsd_csi_x", NULL, 3);
    metrics_sample(f, "qsd_csi_x", "a=\"b\"", 0.5);
    metrics_sample(f, "qsd_csi_x", "", 1e20);
    metrics_sample(f, "qsd_csi_x", NULL, 0.1 + 0.2); /* needs 17 digits */
}

static void test_samples(void **state)
{
    _cleanup_free_ char *s = render(samples, NULL);
    assert_string_equal(s, "# HELP qsd_csi_x An x.\n# TYPE qsd_csi_x gauge\n"
                           "qsd_csi_x 3\nqsd_csi_x{a=\"b\"} 0.5\nqsd_csi_x 1e+20\n"
                           "qsd_csi_x 0.30000000000000004\n");
}

static void histo(FILE *f, void *arg) { metrics_histogram(f, "qsd_csi_h", "m=\"x\"", arg); }

static void test_histogram(void **state)
{
    static const double b[] = {0.1, 1};
    struct histogram h;
    histogram_init(&h, b, 2);
    histogram_observe(&h, 0.05);
    histogram_observe(&h, 0.1); /* le is inclusive */
    histogram_observe(&h, 0.5);
    histogram_observe(&h, 7);
    _cleanup_free_ char *s = render(histo, &h);
    assert_string_equal(s, "qsd_csi_h_bucket{m=\"x\",le=\"0.1\"} 2\n"
                           "qsd_csi_h_bucket{m=\"x\",le=\"1\"} 3\n"
                           "qsd_csi_h_bucket{m=\"x\",le=\"+Inf\"} 4\n"
                           "qsd_csi_h_sum{m=\"x\"} 7.65\n"
                           "qsd_csi_h_count{m=\"x\"} 4\n");
    histogram_clear(&h);
}

static void build_info(FILE *f, void *arg)
{
    metrics_build_info(f, "0.2.0-3-gabc1234", "abc1234", arg);
}

static void test_build_info(void **state)
{
    _cleanup_free_ char *s = render(build_info, "10.0.2");
    assert_non_null(strstr(s, "# TYPE qsd_csi_build_info gauge\n"));
    assert_non_null(strstr(s, "\nqsd_csi_build_info{version=\"0.2.0-3-gabc1234\","
                              "revision=\"abc1234\",qemu_version=\"10.0.2\"} 1\n"));
    _cleanup_free_ char *u = render(build_info, NULL);
    assert_non_null(strstr(u, "qemu_version=\"unknown\"} 1\n"));
}

static void test_qemu_version_parse(void **state)
{
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"qemu-storage-daemon version 10.0.2 (Debian 1:10.0.2+ds-1)\nCopyright (c) 2003-2025 "
         "Fabrice Bellard and the QEMU Project developers\n", "10.0.2"},
        {"qemu-storage-daemon version 11.1.3\n", "11.1.3"},
        {"qemu-storage-daemon version 9.2\n", "9.2"},
        {"qemu-storage-daemon version \n", NULL},
        {"qemu-storage-daemon version 10.\n", NULL},
        {"qemu-storage-daemon version .1\n", NULL},
        {"qemu-storage-daemon version 10\n", NULL},
        {"no such option\n", NULL},
        {"", NULL},
        {NULL, NULL},
    };
    for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
        _cleanup_free_ char *v = metrics_qemu_version_parse(cases[i].in);
        if (cases[i].want)
            assert_string_equal(v, cases[i].want);
        else
            assert_null(v);
    }
}

static void test_endpoint(void **state)
{
    struct sockaddr_storage ss;
    unsigned len;
    assert_int_equal(http_parse_endpoint("127.0.0.1:9810", &ss, &len), 0);
    assert_int_equal(ss.ss_family, AF_INET);
    assert_int_equal(ntohs(((struct sockaddr_in *)&ss)->sin_port), 9810);
    /* Every address: [::], which the server makes dual-stack. */
    assert_int_equal(http_parse_endpoint(":9810", &ss, &len), 0);
    assert_int_equal(ss.ss_family, AF_INET6);
    assert_int_equal(len, sizeof(struct sockaddr_in6));
    assert_memory_equal(&((struct sockaddr_in6 *)&ss)->sin6_addr, &in6addr_any,
                        sizeof(in6addr_any));
    assert_int_equal(ntohs(((struct sockaddr_in6 *)&ss)->sin6_port), 9810);
    assert_int_equal(http_parse_endpoint("0.0.0.0:9810", &ss, &len), 0);
    assert_int_equal(ss.ss_family, AF_INET);
    assert_int_equal(((struct sockaddr_in *)&ss)->sin_addr.s_addr, htonl(INADDR_ANY));
    assert_int_equal(http_parse_endpoint("[::1]:80", &ss, &len), 0);
    assert_int_equal(ss.ss_family, AF_INET6);
    assert_int_equal(len, sizeof(struct sockaddr_in6));
    static const char *const bad[] = {"", "9810", "127.0.0.1", "127.0.0.1:", "127.0.0.1:0",
                                      "127.0.0.1:65536", "localhost:9810", "::1:80",
                                      "[::1]", "[nope]:80", "1.2.3.4:80x", "[::1:80"};
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
        assert_int_equal(http_parse_endpoint(bad[i], &ss, &len), -EINVAL);
}

/* ---- the listener ---- */

static void no_page(const char *path, int *ret_status, const char **ret_type, char **ret_body,
                    size_t *ret_len, void *opaque)
{
    *ret_status = 404;
    *ret_type = "text/plain";
    *ret_body = xstrdup("");
    *ret_len = 0;
}

/* A TCP port free on 127.0.0.1 (the kernel's pick), or -1. */
static int free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    _cleanup_close_ int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) < 0)
        return -1;
    return ntohs(a.sin_port);
}

/* Whether a TCP connection to addr:port is accepted (by the kernel: the
 * server's loop need not run), within 2 s. */
static bool connects(int family, const char *addr, int port)
{
    struct sockaddr_storage ss = {0};
    socklen_t len;
    if (family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        inet_pton(AF_INET, addr, &a->sin_addr);
        len = sizeof(*a);
    } else {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        inet_pton(AF_INET6, addr, &a->sin6_addr);
        len = sizeof(*a);
    }
    _cleanup_close_ int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct timeval tv = {.tv_sec = 2};
    return fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) == 0 &&
           connect(fd, (struct sockaddr *)&ss, len) == 0;
}

/* NULL when ::1 can be bound here, else why not. */
static const char *no_ipv6_loopback(void)
{
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    _cleanup_close_ int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return "no IPv6 in this kernel";
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
        return "::1 is not configured on this machine";
    return NULL;
}

/* --http-endpoint HOST:PORT ("" for every address). */
static void listen_on(struct loop *l, const char *host, int port, struct http_server **ret)
{
    char ep[64];
    snprintf(ep, sizeof(ep), "%s:%d", host, port);
    assert_int_equal(http_server_new(l, ep, no_page, NULL, ret), 0);
}

static void test_listener(void **state)
{
    const char *no6 = no_ipv6_loopback();
    struct loop *l;
    assert_int_equal(loop_new(&l), 0);
    int port = free_port();
    assert_true(port > 0);
    struct http_server *s;
    /* Every address: IPv4 and IPv6 clients. */
    listen_on(l, "", port, &s);
    assert_true(connects(AF_INET, "127.0.0.1", port));
    if (!no6)
        assert_true(connects(AF_INET6, "::1", port));
    http_server_free(s);
    /* An explicit host: that address only. */
    listen_on(l, "127.0.0.1", port, &s);
    assert_true(connects(AF_INET, "127.0.0.1", port));
    if (!no6)
        assert_false(connects(AF_INET6, "::1", port));
    http_server_free(s);
    if (!no6) {
        listen_on(l, "[::1]", port, &s);
        assert_true(connects(AF_INET6, "::1", port));
        assert_false(connects(AF_INET, "127.0.0.1", port));
        http_server_free(s);
    }
    loop_free(l);
    if (no6)
        print_message("the IPv6 half was not run: %s\n", no6);
}

/* In a network namespace of its own whose net.ipv6.bindv6only is 1 (an
 * [::] socket takes IPv6 clients only unless it says otherwise): 0 if
 * ":PORT" still takes IPv4 clients, 77 if the namespace cannot be made,
 * else the step that failed. */
static int bindv6only_child(void)
{
    if (unshare(CLONE_NEWNET) < 0)
        return 77;
    struct ifreq ifr = {.ifr_name = "lo"};
    _cleanup_close_ int ctl = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (ctl < 0 || ioctl(ctl, SIOCGIFFLAGS, &ifr) < 0)
        return 10;
    ifr.ifr_flags |= IFF_UP;
    if (ioctl(ctl, SIOCSIFFLAGS, &ifr) < 0)
        return 11;
    if (no_ipv6_loopback())
        return 77;
    _cleanup_close_ int sys = open("/proc/sys/net/ipv6/bindv6only", O_WRONLY | O_CLOEXEC);
    if (sys < 0 || write(sys, "1", 1) != 1)
        return 77;
    struct loop *l;
    if (loop_new(&l) < 0)
        return 12;
    int port = free_port();
    char ep[64];
    snprintf(ep, sizeof(ep), ":%d", port);
    struct http_server *s;
    if (port <= 0 || http_server_new(l, ep, no_page, NULL, &s) < 0)
        return 13;
    if (!connects(AF_INET, "127.0.0.1", port))
        return 14; /* IPV6_V6ONLY was left to the sysctl */
    if (!connects(AF_INET6, "::1", port))
        return 15;
    http_server_free(s);
    loop_free(l);
    return 0;
}

/* Run fn in a child, bounded; its exit code. */
static int in_child(int (*fn)(void))
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(fn());
    int status = -1;
    uint64_t end = now_ms() + 10000;
    pid_t r;
    while ((r = waitpid(pid, &status, WNOHANG)) == 0 && now_ms() < end)
        usleep(10000);
    if (r == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("the child hung");
    }
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static void test_listener_bindv6only(void **state)
{
    int r = in_child(bindv6only_child);
    if (r == 77) {
        print_message("no network namespace with IPv6 here (not root?): not run\n");
        skip();
    }
    assert_int_equal(r, 0);
}

/* What a kernel without IPv6 answers: socket(AF_INET6) fails with
 * EAFNOSUPPORT. */
static int refuse_ipv6(void)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW), /* another arch: not tested */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_socket, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_INET6, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EAFNOSUPPORT & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = ARRAY_SIZE(f), .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) < 0)
        return -errno;
    return 0;
}

/* In the child under the filter: 0 if all is as expected, else the step
 * that failed. */
static int no_ipv6_child(void)
{
    if (refuse_ipv6() < 0)
        return 10;
    if (socket(AF_INET6, SOCK_STREAM, 0) != -1 || errno != EAFNOSUPPORT)
        return 11; /* the filter does not refuse */
    struct loop *l;
    if (loop_new(&l) < 0)
        return 12;
    int port = free_port();
    char ep[64];
    snprintf(ep, sizeof(ep), ":%d", port);
    struct http_server *s, *s6;
    if (port <= 0 || http_server_new(l, ep, no_page, NULL, &s) < 0)
        return 13; /* ":PORT" falls back to 0.0.0.0 */
    if (!connects(AF_INET, "127.0.0.1", port))
        return 14;
    snprintf(ep, sizeof(ep), "[::1]:%d", port);
    if (http_server_new(l, ep, no_page, NULL, &s6) != -EAFNOSUPPORT)
        return 15; /* an explicit IPv6 host: no fallback */
    http_server_free(s);
    loop_free(l);
    return 0;
}

static void test_listener_without_ipv6(void **state)
{
#ifndef __x86_64__
    skip();
#endif
    assert_int_equal(in_child(no_ipv6_child), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_labels),
        cmocka_unit_test(test_volume_labels),
        cmocka_unit_test(test_samples),
        cmocka_unit_test(test_histogram),
        cmocka_unit_test(test_endpoint),
        cmocka_unit_test(test_build_info),
        cmocka_unit_test(test_qemu_version_parse),
        cmocka_unit_test(test_listener),
        cmocka_unit_test(test_listener_bindv6only),
        cmocka_unit_test(test_listener_without_ipv6),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
