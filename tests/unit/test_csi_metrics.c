/* Unit tests for the pure parts of the plugin's metrics: label escaping,
 * a volume's labels (the ones that join with kube-state-metrics), sample
 * and histogram rendering (text format 0.0.4), and the parsing of
 * --http-endpoint. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "http.h"
#include "metrics.h"
#include "qsd/base/util.h"

#include <netinet/in.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_labels),
        cmocka_unit_test(test_volume_labels),
        cmocka_unit_test(test_samples),
        cmocka_unit_test(test_histogram),
        cmocka_unit_test(test_endpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
