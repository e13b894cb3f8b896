/* vhost_cmds.c: the data-path commands built on the vhost-user-blk client
 * (lib/vublk.h): `vhost-info`, `verify` and `bench`. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "util.h"
#include "vublk.h"

static int exit_for_errno(int r)
{
    switch (-r) {
    case ENOENT:
    case ECONNREFUSED:
        return EXIT_NOT_FOUND;
    case ETIMEDOUT:
        return EXIT_TIMEOUT;
    case EINVAL:
        return EXIT_USAGE;
    default:
        return EXIT_FAILURE_GENERIC;
    }
}

static void vublk_freep(struct vublk **d) { vublk_free(*d); }
#define _cleanup_vublk_ _cleanup_(vublk_freep)

static int connect_or_complain(const char *cmd, const char *path, const struct vublk_opts *o,
                               struct vublk **ret)
{
    int r = vublk_connect(path, o, ret);
    if (r < 0)
        fprintf(stderr, "qsdctl %s: cannot connect to vhost-user-blk socket %s: %s\n", cmd,
                path, strerror(-r));
    return r;
}

static int parse_timeout(const char *cmd, const char *arg, int *ret)
{
    uint64_t v;
    if (parse_uint(arg, 1, 3600000, &v) < 0) {
        fprintf(stderr, "qsdctl %s: invalid --timeout-ms '%s'\n", cmd, arg);
        return -EINVAL;
    }
    *ret = (int)v;
    return 0;
}

/* ======================================================================
 * vhost-info
 * ====================================================================== */

static void print_json(json_t *j)
{
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (s) {
        puts(s);
        free(s);
    }
}

int cmd_vhost_info(int argc, char **argv)
{
    static const struct option lopts[] = {
        {"json", no_argument, NULL, 'j'},
        {"timeout-ms", required_argument, NULL, 't'},
        {"wait-config-change-ms", required_argument, NULL, 'w'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    bool json = g_opts.json;
    struct vublk_opts o = {.data_size = 4096};
    int wait_change = 0;
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "+jt:w:h", lopts, NULL)) != -1;) {
        switch (c) {
        case 'j':
            json = true;
            break;
        case 't':
            if (parse_timeout(argv[0], optarg, &o.timeout_ms) < 0)
                return EXIT_USAGE;
            break;
        case 'w':
            if (parse_timeout(argv[0], optarg, &wait_change) < 0)
                return EXIT_USAGE;
            break;
        case 'h':
            printf("usage: qsdctl vhost-info [--json] [--timeout-ms MS]\n"
                   "                          [--wait-config-change-ms MS] SOCKET\n"
                   "Connects to a vhost-user-blk export and prints capacity (bytes), logical\n"
                   "block size, number of queues, serial and read-only.  With\n"
                   "--wait-config-change-ms, first waits (bounded) for a configuration change\n"
                   "notification (e.g. a resize) and prints the device as it is afterwards;\n"
                   "exits %d if none arrives in time.\n", EXIT_TIMEOUT);
            return EXIT_OK;
        default:
            return EXIT_USAGE;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "qsdctl vhost-info: expected one SOCKET argument\n");
        return EXIT_USAGE;
    }
    const char *path = argv[optind];
    _cleanup_vublk_ struct vublk *d = NULL;
    int r = connect_or_complain("vhost-info", path, &o, &d);
    if (r < 0)
        return exit_for_errno(r);

    uint64_t size_before = vublk_capacity(d);
    if (wait_change) {
        /* Announce readiness so a test can resize only once we are connected. */
        fprintf(stderr, "connected capacity=%" PRIu64 ", waiting for a config change\n",
                size_before);
        uint64_t deadline = now_ms() + (uint64_t)wait_change;
        while (vublk_config_changes(d) == 0) {
            uint64_t now = now_ms();
            if (now >= deadline) {
                fprintf(stderr, "qsdctl vhost-info: no config change notification within %d ms\n",
                        wait_change);
                return EXIT_TIMEOUT;
            }
            r = vublk_process_backend(d, (int)(deadline - now));
            if (r < 0) {
                fprintf(stderr, "qsdctl vhost-info: back-end channel: %s\n", strerror(-r));
                return exit_for_errno(r);
            }
        }
    }

    char serial[VIRTIO_BLK_ID_BYTES + 1] = "";
    r = vublk_get_serial(d, serial);
    if (r < 0 && r != -ENOTSUP) {
        fprintf(stderr, "qsdctl vhost-info: get-id request failed: %s\n", strerror(-r));
        return exit_for_errno(r);
    }
    const struct vublk_config *c = vublk_config(d);
    if (json) {
        json_t *j = json_pack("{s:I, s:i, s:i, s:s, s:b, s:i, s:b, s:b, s:b, s:i}",
                              "capacity", (json_int_t)vublk_capacity(d),
                              "logical_block_size", (int)c->blk_size,
                              "num_queues", (int)c->num_queues,
                              "serial", serial,
                              "read_only", vublk_read_only(d),
                              "config_changes", (int)vublk_config_changes(d),
                              "flush", vublk_has_feature(d, VIRTIO_BLK_F_FLUSH),
                              "discard", vublk_has_feature(d, VIRTIO_BLK_F_DISCARD),
                              "write_zeroes", vublk_has_feature(d, VIRTIO_BLK_F_WRITE_ZEROES),
                              "physical_block_size", (int)(c->blk_size << c->physical_block_exp));
        if (!j)
            return EXIT_FAILURE_GENERIC;
        print_json(j);
        json_decref(j);
    } else {
        printf("capacity: %" PRIu64 "\n", vublk_capacity(d));
        printf("logical_block_size: %u\n", c->blk_size);
        printf("num_queues: %u\n", c->num_queues);
        printf("serial: %s\n", serial);
        printf("read_only: %s\n", vublk_read_only(d) ? "yes" : "no");
        if (wait_change)
            printf("config_changes: %u\n", vublk_config_changes(d));
    }
    return EXIT_OK;
}

int cmd_verify(int argc, char **argv)
{
    fprintf(stderr, "qsdctl verify: not implemented yet\n");
    return EXIT_FAILURE_GENERIC;
}

int cmd_bench(int argc, char **argv)
{
    fprintf(stderr, "qsdctl bench: not implemented yet\n");
    return EXIT_FAILURE_GENERIC;
}
