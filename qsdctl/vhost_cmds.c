/* SPDX-License-Identifier: Apache-2.0 */
/* vhost_cmds.c: the data-path commands built on the vhost-user-blk client
 * (lib/vublk.h): `vhost-info`, `verify` and `bench`. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <dirent.h>
#include <liburing.h>
#include <math.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

#include "commands.h"
#include "qsd/base/util.h"
#include "qsd/vhost/vublk.h"

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
    if (r == -ETIMEDOUT || r == -EBUSY)
        fprintf(stderr, "qsdctl %s: vhost-user-blk socket %s: %s (the back-end serves one "
                "client at a time: is another one connected?)\n", cmd, path,
                r == -EBUSY ? "connection queue full" : "no answer in time");
    else if (r < 0)
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

/* ======================================================================
 * verify
 * ====================================================================== */

/* Every 512-byte sector written by verify carries a header saying which run
 * (seed) and which sector it belongs to, followed by a pseudo-random body
 * derived from both: a sector read from the wrong place, an old run, another
 * image or never written is told apart in the error message. */
#define PATTERN_MAGIC 0x7173642d76726679ull /* "qsd-vrfy" */

struct sector_hdr {
    uint64_t magic;
    uint64_t seed;
    uint64_t sector;
};

static void fill_sector(uint8_t *p, uint64_t seed, uint64_t sector)
{
    struct sector_hdr h = {PATTERN_MAGIC, seed, sector};
    memcpy(p, &h, sizeof(h));
    uint64_t x = seed * 0x9e3779b97f4a7c15ull ^ (sector + 1) * 0xbf58476d1ce4e5b9ull;
    for (size_t i = sizeof(h); i < VIRTIO_BLK_SECTOR; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
}

static void fill_pattern(uint8_t *buf, size_t len, uint64_t seed, uint64_t first_sector)
{
    for (size_t off = 0; off < len; off += VIRTIO_BLK_SECTOR)
        fill_sector(buf + off, seed, first_sector + off / VIRTIO_BLK_SECTOR);
}

static bool all_zero(const uint8_t *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i])
            return false;
    return true;
}

/* Describe what a wrong sector holds, for the error message. */
static void describe_sector(const uint8_t *p, char *out, size_t len)
{
    struct sector_hdr h;
    memcpy(&h, p, sizeof(h));
    if (all_zero(p, VIRTIO_BLK_SECTOR))
        snprintf(out, len, "zeros");
    else if (h.magic == PATTERN_MAGIC)
        snprintf(out, len, "verify pattern of seed %" PRIu64 " for sector %" PRIu64,
                 h.seed, h.sector);
    else
        snprintf(out, len, "foreign data (first bytes %02x %02x %02x %02x %02x %02x %02x %02x)",
                 p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]);
}

/* Compare buf (read from first_sector) with the expected pattern, or zeros
 * when seed is 0.  Reports the first bad sector and how many are bad. */
static bool check_pattern(const uint8_t *buf, size_t len, uint64_t seed, uint64_t first_sector,
                          const char *what)
{
    uint8_t want[VIRTIO_BLK_SECTOR];
    size_t bad = 0, first_bad = 0;
    for (size_t off = 0; off < len; off += VIRTIO_BLK_SECTOR) {
        if (seed)
            fill_sector(want, seed, first_sector + off / VIRTIO_BLK_SECTOR);
        else
            memset(want, 0, sizeof(want));
        if (memcmp(want, buf + off, VIRTIO_BLK_SECTOR) != 0) {
            if (bad++ == 0)
                first_bad = off;
        }
    }
    if (!bad)
        return true;
    const uint8_t *p = buf + first_bad;
    size_t byte = 0;
    if (seed)
        fill_sector(want, seed, first_sector + first_bad / VIRTIO_BLK_SECTOR);
    else
        memset(want, 0, sizeof(want));
    while (byte < VIRTIO_BLK_SECTOR && p[byte] == want[byte])
        byte++;
    char found[160], expected[96];
    describe_sector(p, found, sizeof(found));
    uint64_t sector = first_sector + first_bad / VIRTIO_BLK_SECTOR;
    if (seed)
        snprintf(expected, sizeof(expected), "verify pattern of seed %" PRIu64
                 " for sector %" PRIu64, seed, sector);
    else
        snprintf(expected, sizeof(expected), "zeros");
    fprintf(stderr,
            "qsdctl verify: MISMATCH (%s) at byte offset %" PRIu64 " (sector %" PRIu64
            ", byte %zu of the sector): expected %s, found %s; %zu of %zu sectors in "
            "[%" PRIu64 ", +%zu bytes) differ\n",
            what, sector * VIRTIO_BLK_SECTOR + byte, sector, byte, expected, found, bad,
            len / VIRTIO_BLK_SECTOR, first_sector * VIRTIO_BLK_SECTOR, len);
    return false;
}

/* Run a batch of requests spread over the device's queues, waiting for all.
 * Returns 0, or a negative errno; *ret_bad is the index of the first request
 * whose status was not OK (or -1). */
static int run_batch(struct vublk *d, struct vublk_io *ios, size_t n, int timeout_ms,
                     uint8_t *statuses, long *ret_bad)
{
    unsigned nq = vublk_num_queues(d);
    size_t next = 0, done = 0;
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    for (size_t i = 0; i < n; i++) {
        ios[i].opaque = (void *)(uintptr_t)i;
        statuses[i] = 0xff;
    }
    while (done < n) {
        /* Fill every queue up to a modest depth. */
        for (unsigned q = 0; q < nq && next < n; q++) {
            bool added = false;
            while (next < n && vublk_inflight(d, q) < 16) {
                int r = vublk_submit(d, q, &ios[next]);
                if (r == -ENOSPC)
                    break;
                if (r < 0)
                    return r;
                next++;
                added = true;
            }
            if (added) {
                int r = vublk_kick(d, q);
                if (r < 0)
                    return r;
            }
        }
        for (unsigned q = 0; q < nq; q++) {
            struct vublk_done c[32];
            if (vublk_inflight(d, q) == 0)
                continue;
            uint64_t now = now_ms();
            if (now >= deadline)
                return -ETIMEDOUT;
            int r = vublk_wait(d, q, (int)(deadline - now), 0);
            if (r < 0)
                return r;
            unsigned k = vublk_reap(d, q, c, ARRAY_SIZE(c));
            for (unsigned i = 0; i < k; i++) {
                statuses[(uintptr_t)c[i].opaque] = c[i].status;
                done++;
            }
        }
    }
    long bad = -1;
    for (size_t i = 0; i < n && bad < 0; i++)
        if (statuses[i] != VIRTIO_BLK_S_OK)
            bad = (long)i;
    *ret_bad = bad;
    return 0;
}

static const char *io_name(uint32_t type)
{
    switch (type) {
    case VIRTIO_BLK_T_IN: return "read";
    case VIRTIO_BLK_T_OUT: return "write";
    case VIRTIO_BLK_T_FLUSH: return "flush";
    case VIRTIO_BLK_T_GET_ID: return "get-id";
    case VIRTIO_BLK_T_DISCARD: return "discard";
    case VIRTIO_BLK_T_WRITE_ZEROES: return "write-zeroes";
    default: return "?";
    }
}

struct verify_ctx {
    struct vublk *d;
    uint64_t seed;
    size_t nchunks, chunk;
    uint64_t *offsets; /* byte offsets of chunks */
    uint8_t **bufs;
    int timeout_ms;
};

/* One request kind over every chunk; statuses must all be OK. */
static int chunks_io(struct verify_ctx *v, uint32_t type)
{
    _cleanup_free_ struct vublk_io *ios = xcalloc(v->nchunks, sizeof(*ios));
    _cleanup_free_ uint8_t *st = xcalloc(v->nchunks, 1);
    for (size_t i = 0; i < v->nchunks; i++)
        ios[i] = (struct vublk_io){.type = type, .sector = v->offsets[i] / VIRTIO_BLK_SECTOR,
                                   .buf = v->bufs[i], .len = (uint32_t)v->chunk};
    long bad;
    int r = run_batch(v->d, ios, v->nchunks, v->timeout_ms, st, &bad);
    if (r < 0) {
        fprintf(stderr, "qsdctl verify: %s of %zu chunks failed: %s\n", io_name(type),
                v->nchunks, strerror(-r));
        return exit_for_errno(r);
    }
    if (bad >= 0) {
        fprintf(stderr, "qsdctl verify: %s at byte offset %" PRIu64 " (%zu bytes) returned "
                "status %s\n", io_name(type), v->offsets[bad], v->chunk,
                vublk_status_name(st[bad]));
        return EXIT_FAILURE_GENERIC;
    }
    return EXIT_OK;
}

static int write_chunks(struct verify_ctx *v)
{
    for (size_t i = 0; i < v->nchunks; i++)
        fill_pattern(v->bufs[i], v->chunk, v->seed, v->offsets[i] / VIRTIO_BLK_SECTOR);
    return chunks_io(v, VIRTIO_BLK_T_OUT);
}

static int check_chunks(struct verify_ctx *v)
{
    for (size_t i = 0; i < v->nchunks; i++)
        memset(v->bufs[i], 0xa5, v->chunk);
    int r = chunks_io(v, VIRTIO_BLK_T_IN);
    if (r != EXIT_OK)
        return r;
    for (size_t i = 0; i < v->nchunks; i++) {
        char what[64];
        snprintf(what, sizeof(what), "chunk %zu of %zu", i, v->nchunks);
        if (!check_pattern(v->bufs[i], v->chunk, v->seed, v->offsets[i] / VIRTIO_BLK_SECTOR,
                           what))
            return EXIT_MISMATCH;
    }
    return EXIT_OK;
}

static int sync_io(struct verify_ctx *v, uint32_t type, uint64_t off, void *buf, uint32_t len,
                   uint32_t flags, uint8_t *ret_status)
{
    struct vublk_io io = {.type = type, .sector = off / VIRTIO_BLK_SECTOR, .buf = buf,
                          .len = len, .flags = flags};
    int r = vublk_request_sync(v->d, 0, &io, ret_status);
    if (r < 0) {
        fprintf(stderr, "qsdctl verify: %s at byte offset %" PRIu64 " (%u bytes) failed: %s\n",
                io_name(type), off, len, strerror(-r));
        return exit_for_errno(r);
    }
    return EXIT_OK;
}

static int expect_ok(struct verify_ctx *v, uint32_t type, uint64_t off, void *buf, uint32_t len,
                     uint32_t flags)
{
    uint8_t st;
    int r = sync_io(v, type, off, buf, len, flags, &st);
    if (r != EXIT_OK)
        return r;
    if (st != VIRTIO_BLK_S_OK) {
        fprintf(stderr, "qsdctl verify: %s at byte offset %" PRIu64 " (%u bytes) returned "
                "status %s\n", io_name(type), off, len, vublk_status_name(st));
        return EXIT_FAILURE_GENERIC;
    }
    return EXIT_OK;
}

/* write-zeroes (and discard) inside chunk 0: the middle must read as zeros
 * (write-zeroes) and the rest keep the pattern; afterwards restore the pattern. */
static int check_zeroing(struct verify_ctx *v, uint32_t type, uint32_t flags, bool *ran)
{
    *ran = false;
    unsigned bit = type == VIRTIO_BLK_T_DISCARD ? VIRTIO_BLK_F_DISCARD : VIRTIO_BLK_F_WRITE_ZEROES;
    if (!vublk_has_feature(v->d, bit) || v->chunk < 3 * 4096)
        return EXIT_OK;
    size_t c = v->nchunks > 1 ? 1 : 0;
    uint64_t base = v->offsets[c];
    uint32_t zlen = (uint32_t)(v->chunk - 2 * 4096) & ~4095u;
    uint64_t zoff = base + 4096;
    uint8_t *buf = v->bufs[c];
    int r = expect_ok(v, type, zoff, NULL, zlen, flags);
    if (r != EXIT_OK)
        return r;
    memset(buf, 0xa5, v->chunk);
    r = expect_ok(v, VIRTIO_BLK_T_IN, base, buf, (uint32_t)v->chunk, 0);
    if (r != EXIT_OK)
        return r;
    char what[64];
    snprintf(what, sizeof(what), "data beside a %s", io_name(type));
    if (!check_pattern(buf, 4096, v->seed, base / VIRTIO_BLK_SECTOR, what) ||
        !check_pattern(buf + 4096 + zlen, v->chunk - 4096 - zlen, v->seed,
                       (zoff + zlen) / VIRTIO_BLK_SECTOR, what))
        return EXIT_MISMATCH;
    /* After a discard the content is unspecified; after write-zeroes, zeros. */
    if (type == VIRTIO_BLK_T_WRITE_ZEROES &&
        !check_pattern(buf + 4096, zlen, 0, zoff / VIRTIO_BLK_SECTOR,
                       flags ? "write-zeroes with unmap" : "write-zeroes"))
        return EXIT_MISMATCH;
    fill_pattern(buf, v->chunk, v->seed, base / VIRTIO_BLK_SECTOR);
    r = expect_ok(v, VIRTIO_BLK_T_OUT, base, buf, (uint32_t)v->chunk, 0);
    if (r != EXIT_OK)
        return r;
    *ran = true;
    return EXIT_OK;
}

static void verify_usage(void)
{
    printf("usage: qsdctl verify [--write | --check] [--seed N] [--size BYTES]\n"
           "                     [--serial S] [--chunks N] [--chunk-size BYTES]\n"
           "                     [--queues N] [--timeout-ms MS] SOCKET\n"
           "Checks the data path of a vhost-user-blk export.  Without --write/--check\n"
           "(writable export): writes a seeded pattern into N chunks spread across the\n"
           "whole disk (first and last included), flushes, reads it back, checks\n"
           "write-zeroes and discard beside the pattern, and that a read past the end\n"
           "fails.  Read-only export: reads the chunks and checks a write is refused.\n"
           "  --write   only write the pattern (and flush): a later --check with the same\n"
           "            seed, chunks and chunk size must find it\n"
           "  --check   only read and compare (works on read-only exports)\n"
           "  --rounds N  with --write: N rounds on one connection, seeds SEED, SEED+1...;\n"
           "            after each, a line 'round SEED START_US END_US' (CLOCK_MONOTONIC)\n"
           "  --stop-file PATH  with --rounds: stop before a round once PATH exists\n"
           "  --size    expected capacity in bytes;  --serial  expected serial (get-id)\n"
           "Exit status: 0 ok, %d mismatch (data, capacity or serial: the message says\n"
           "where), 3 socket missing or refused, 5 timeout, 1 other failure.\n",
           EXIT_MISMATCH);
}

int cmd_verify(int argc, char **argv)
{
    static const struct option lopts[] = {
        {"write", no_argument, NULL, 'W'},
        {"check", no_argument, NULL, 'C'},
        {"seed", required_argument, NULL, 's'},
        {"size", required_argument, NULL, 'S'},
        {"serial", required_argument, NULL, 'i'},
        {"chunks", required_argument, NULL, 'n'},
        {"chunk-size", required_argument, NULL, 'c'},
        {"queues", required_argument, NULL, 'q'},
        {"timeout-ms", required_argument, NULL, 't'},
        {"json", no_argument, NULL, 'j'},
        {"rounds", required_argument, NULL, 'R'},
        {"stop-file", required_argument, NULL, 'F'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    bool do_write = false, do_check = false, json = g_opts.json;
    uint64_t rounds = 1;
    const char *stop_file = NULL;
    uint64_t seed = 1, want_size = 0, nchunks = 64, chunk = 64 * 1024, queues = 0;
    const char *want_serial = NULL;
    int timeout_ms = 30000;
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "+WCs:S:i:n:c:q:t:jh", lopts, NULL)) != -1;) {
        int r = 0;
        switch (c) {
        case 'W': do_write = true; break;
        case 'C': do_check = true; break;
        case 'j': json = true; break;
        case 's': r = parse_uint(optarg, 1, UINT64_MAX, &seed); break;
        case 'S': r = parse_size(optarg, &want_size); break;
        case 'i': want_serial = optarg; break;
        case 'n': r = parse_uint(optarg, 1, 4096, &nchunks); break;
        case 'c': r = parse_size(optarg, &chunk); break;
        case 'q': r = parse_uint(optarg, 1, 64, &queues); break;
        case 't': r = parse_timeout(argv[0], optarg, &timeout_ms); break;
        case 'R': r = parse_uint(optarg, 1, 1000000, &rounds); break;
        case 'F': stop_file = optarg; break;
        case 'h': verify_usage(); return EXIT_OK;
        default: return EXIT_USAGE;
        }
        if (r < 0) {
            fprintf(stderr, "qsdctl verify: invalid value '%s'\n", optarg);
            return EXIT_USAGE;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "qsdctl verify: expected one SOCKET argument\n");
        return EXIT_USAGE;
    }
    if (do_write && do_check) {
        fprintf(stderr, "qsdctl verify: --write and --check exclude each other\n");
        return EXIT_USAGE;
    }
    if ((rounds > 1 || stop_file) && !do_write) {
        fprintf(stderr, "qsdctl verify: --rounds and --stop-file need --write\n");
        return EXIT_USAGE;
    }
    if (chunk < 4096 || chunk % 4096 || chunk > (4u << 20) || nchunks * chunk > (256u << 20)) {
        fprintf(stderr, "qsdctl verify: --chunk-size must be a multiple of 4096 up to 4 MiB, "
                "and chunks x chunk-size at most 256 MiB\n");
        return EXIT_USAGE;
    }
    const char *path = argv[optind];
    struct vublk_opts o = {.num_queues = queues ? (unsigned)queues : 64,
                           .data_size = nchunks * chunk + 2 * 4096,
                           .timeout_ms = MIN(timeout_ms, 10000)};
    _cleanup_vublk_ struct vublk *d = NULL;
    int r = connect_or_complain("verify", path, &o, &d);
    if (r < 0)
        return exit_for_errno(r);
    uint64_t cap = vublk_capacity(d);
    bool ro = vublk_read_only(d);

    /* Capacity and serial first: they are the cheapest way to notice the wrong disk. */
    if (want_size && cap != want_size) {
        fprintf(stderr, "qsdctl verify: MISMATCH capacity: expected %" PRIu64 " bytes, "
                "device reports %" PRIu64 "\n", want_size, cap);
        return EXIT_MISMATCH;
    }
    char serial[VIRTIO_BLK_ID_BYTES + 1] = "";
    r = vublk_get_serial(d, serial);
    if (r < 0 && r != -ENOTSUP) {
        fprintf(stderr, "qsdctl verify: get-id failed: %s\n", strerror(-r));
        return exit_for_errno(r);
    }
    if (want_serial && strncmp(serial, want_serial, VIRTIO_BLK_ID_BYTES) != 0) {
        fprintf(stderr, "qsdctl verify: MISMATCH serial: expected '%s', device reports '%s'\n",
                want_serial, serial);
        return EXIT_MISMATCH;
    }
    if (ro && do_write) {
        fprintf(stderr, "qsdctl verify: --write on a read-only export\n");
        return EXIT_USAGE;
    }
    if (cap < chunk) {
        fprintf(stderr, "qsdctl verify: capacity %" PRIu64 " is smaller than one chunk\n", cap);
        return EXIT_FAILURE_GENERIC;
    }

    /* Chunk placement: evenly spread, 4 KiB aligned, first at 0 and last
     * ending at the last full 4 KiB of the disk. */
    uint64_t last = ((cap - chunk) / 4096) * 4096;
    if (nchunks > last / chunk + 1)
        nchunks = last / chunk + 1;
    _cleanup_free_ uint64_t *offsets = xcalloc(nchunks, sizeof(uint64_t));
    _cleanup_free_ uint8_t **bufs = xcalloc(nchunks, sizeof(uint8_t *));
    for (uint64_t i = 0; i < nchunks; i++) {
        offsets[i] = nchunks == 1 ? 0 : (last * i / (nchunks - 1)) / 4096 * 4096;
        bufs[i] = vublk_alloc(d, chunk);
        if (!bufs[i])
            return EXIT_FAILURE_GENERIC;
    }
    struct verify_ctx v = {.d = d, .seed = seed, .nchunks = nchunks, .chunk = chunk,
                           .offsets = offsets, .bufs = bufs, .timeout_ms = timeout_ms};
    const char *mode = do_write ? "write" : do_check ? "check" : ro ? "read-only" : "full";
    fprintf(stderr, "verify: %s, capacity=%" PRIu64 " chunks=%" PRIu64 "x%" PRIu64
            " queues=%u seed=%" PRIu64 "%s\n", mode, cap, nchunks, chunk,
            vublk_num_queues(d), seed, ro ? " read-only" : "");

    bool flush_ok = false, wz_ok = false, wzu_ok = false, discard_ok = false, ro_ok = false,
         eod_ok = false;
    uint8_t st;
    if (do_check) {
        r = check_chunks(&v);
        if (r != EXIT_OK)
            return r;
    } else if (ro) {
        r = chunks_io(&v, VIRTIO_BLK_T_IN);
        if (r != EXIT_OK)
            return r;
        r = sync_io(&v, VIRTIO_BLK_T_OUT, 0, bufs[0], 4096, 0, &st);
        if (r != EXIT_OK)
            return r;
        if (st == VIRTIO_BLK_S_OK) {
            fprintf(stderr, "qsdctl verify: a write to a read-only export succeeded\n");
            return EXIT_MISMATCH;
        }
        ro_ok = true;
    } else if (rounds > 1 || stop_file) {
        /* A client that stays connected and keeps writing, as a VM does;
         * each completed (flushed) round is reported with its times. */
        for (uint64_t i = 0; i < rounds; i++) {
            if (stop_file && access(stop_file, F_OK) == 0)
                break;
            v.seed = seed + i;
            uint64_t t0 = now_us();
            r = write_chunks(&v);
            if (r == EXIT_OK && vublk_has_feature(d, VIRTIO_BLK_F_FLUSH))
                r = expect_ok(&v, VIRTIO_BLK_T_FLUSH, 0, NULL, 0, 0);
            if (r != EXIT_OK)
                return r;
            printf("round %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", v.seed, t0, now_us());
            fflush(stdout);
        }
        return EXIT_OK;
    } else {
        r = write_chunks(&v);
        if (r != EXIT_OK)
            return r;
        if (vublk_has_feature(d, VIRTIO_BLK_F_FLUSH)) {
            r = expect_ok(&v, VIRTIO_BLK_T_FLUSH, 0, NULL, 0, 0);
            if (r != EXIT_OK)
                return r;
            flush_ok = true;
        }
        if (!do_write) {
            r = check_chunks(&v);
            if (r != EXIT_OK)
                return r;
            r = check_zeroing(&v, VIRTIO_BLK_T_WRITE_ZEROES, 0, &wz_ok);
            if (r != EXIT_OK)
                return r;
            if (vublk_config(d)->write_zeroes_may_unmap) {
                r = check_zeroing(&v, VIRTIO_BLK_T_WRITE_ZEROES,
                                  VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP, &wzu_ok);
                if (r != EXIT_OK)
                    return r;
            }
            r = check_zeroing(&v, VIRTIO_BLK_T_DISCARD, 0, &discard_ok);
            if (r != EXIT_OK)
                return r;
            if (flush_ok) {
                r = expect_ok(&v, VIRTIO_BLK_T_FLUSH, 0, NULL, 0, 0);
                if (r != EXIT_OK)
                    return r;
            }
            r = check_chunks(&v);
            if (r != EXIT_OK)
                return r;
        }
    }
    if (!do_write && !do_check) {
        /* Capacity is honoured: a read straddling the end must fail. */
        r = sync_io(&v, VIRTIO_BLK_T_IN, cap - 4096, bufs[0], 8192, 0, &st);
        if (r != EXIT_OK)
            return r;
        if (st == VIRTIO_BLK_S_OK) {
            fprintf(stderr, "qsdctl verify: a read past the capacity (%" PRIu64 ") succeeded\n",
                    cap);
            return EXIT_MISMATCH;
        }
        eod_ok = true;
    }
    if (json) {
        json_t *j = json_pack("{s:s, s:I, s:s, s:b, s:I, s:I, s:I, s:i, s:b, s:b, s:b, s:b, "
                              "s:b, s:b}",
                              "result", "ok", "capacity", (json_int_t)cap, "serial", serial,
                              "read_only", ro, "seed", (json_int_t)seed,
                              "chunks", (json_int_t)nchunks, "chunk_size", (json_int_t)chunk,
                              "queues", (int)vublk_num_queues(d), "flush", flush_ok,
                              "write_zeroes", wz_ok, "write_zeroes_unmap", wzu_ok,
                              "discard", discard_ok, "write_refused", ro_ok,
                              "end_of_disk", eod_ok);
        if (!j)
            return EXIT_FAILURE_GENERIC;
        json_object_set_new(j, "mode", json_string(mode));
        print_json(j);
        json_decref(j);
    } else {
        printf("verify %s: ok: capacity %" PRIu64 ", serial '%s', %" PRIu64 " chunks of %" PRIu64
               " bytes, %u queue(s)%s%s%s%s%s%s\n",
               mode, cap, serial, nchunks, chunk, vublk_num_queues(d),
               flush_ok ? ", flush" : "", wz_ok ? ", write-zeroes" : "",
               wzu_ok ? ", write-zeroes+unmap" : "", discard_ok ? ", discard" : "",
               ro_ok ? ", write refused" : "", eod_ok ? ", end of disk" : "");
    }
    return EXIT_OK;
}

/* ======================================================================
 * bench
 * ====================================================================== */

/* Two engines behind one small interface: a vhost-user-blk device (our
 * client, queues driven round-robin from this one thread) and a file or
 * block device through io_uring with O_DIRECT, the physical limit. */
struct engine {
    const char *kind;
    int (*submit)(struct engine *e, unsigned slot, bool write, uint64_t off, uint32_t len);
    int (*commit)(struct engine *e);
    /* Collect completions into slots[]; wait (bounded) for at least one when
     * wait is set.  Returns the count or a negative errno (also for a failed I/O). */
    int (*reap)(struct engine *e, unsigned *slots, unsigned max, bool wait);
    uint8_t **bufs;   /* per slot */
    uint64_t capacity;
    /* vhost */
    struct vublk *d;
    unsigned poll_us; /* spin on the used rings this long before sleeping */
    /* io_uring */
    struct io_uring ring;
    bool ring_ok;
    int fd;
    unsigned pending;
};

static int vh_submit(struct engine *e, unsigned slot, bool write, uint64_t off, uint32_t len)
{
    unsigned q = slot % vublk_num_queues(e->d);
    struct vublk_io io = {.type = write ? VIRTIO_BLK_T_OUT : VIRTIO_BLK_T_IN,
                          .sector = off / VIRTIO_BLK_SECTOR, .buf = e->bufs[slot], .len = len,
                          .opaque = (void *)(uintptr_t)slot};
    return vublk_submit(e->d, q, &io);
}

static int vh_commit(struct engine *e)
{
    for (unsigned q = 0; q < vublk_num_queues(e->d); q++) {
        int r = vublk_kick(e->d, q);
        if (r < 0)
            return r;
    }
    return 0;
}

static int vh_reap(struct engine *e, unsigned *slots, unsigned max, bool wait)
{
    unsigned nq = vublk_num_queues(e->d), n = 0;
    for (;;) {
        for (unsigned q = 0; q < nq && n < max; q++) {
            struct vublk_done c[64];
            unsigned k = vublk_reap(e->d, q, c, MIN(max - n, (unsigned)ARRAY_SIZE(c)));
            for (unsigned i = 0; i < k; i++) {
                if (c[i].status != VIRTIO_BLK_S_OK)
                    return -EIO;
                slots[n++] = (unsigned)(uintptr_t)c[i].opaque;
            }
        }
        if (n || !wait)
            return (int)n;
        if (e->poll_us) {
            uint64_t end = now_us() + e->poll_us;
            bool any = false;
            while (!any && now_us() < end)
                for (unsigned q = 0; q < nq && !any; q++)
                    any = vublk_has_completions(e->d, q);
            if (any)
                continue;
        }
        int r = vublk_wait_any(e->d, 10000);
        if (r < 0)
            return r;
    }
}

static int ur_submit(struct engine *e, unsigned slot, bool write, uint64_t off, uint32_t len)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);
    if (!sqe)
        return -ENOSPC;
    if (write)
        io_uring_prep_write(sqe, e->fd, e->bufs[slot], len, off);
    else
        io_uring_prep_read(sqe, e->fd, e->bufs[slot], len, off);
    io_uring_sqe_set_data64(sqe, slot);
    e->pending++;
    return 0;
}

static int ur_commit(struct engine *e)
{
    if (!e->pending)
        return 0;
    int r = io_uring_submit(&e->ring);
    if (r < 0)
        return r;
    e->pending = 0;
    return 0;
}

static int ur_reap(struct engine *e, unsigned *slots, unsigned max, bool wait)
{
    unsigned n = 0;
    struct io_uring_cqe *cqe;
    if (wait) {
        struct __kernel_timespec ts = {.tv_sec = 10};
        int r = io_uring_wait_cqe_timeout(&e->ring, &cqe, &ts);
        if (r < 0)
            return r == -ETIME ? -ETIMEDOUT : r;
    }
    while (n < max && io_uring_peek_cqe(&e->ring, &cqe) == 0) {
        int res = cqe->res;
        slots[n++] = (unsigned)io_uring_cqe_get_data64(cqe);
        io_uring_cqe_seen(&e->ring, cqe);
        if (res < 0)
            return res;
    }
    return (int)n;
}

static void engine_close(struct engine *e)
{
    if (e->bufs && !e->d)
        free(e->bufs[0]); /* io_uring: one aligned block; vhost: shared memory */
    free(e->bufs);
    e->bufs = NULL;
    vublk_free(e->d);
    e->d = NULL;
    if (e->ring_ok)
        io_uring_queue_exit(&e->ring);
    e->ring_ok = false;
    if (e->fd >= 0)
        close(e->fd);
    e->fd = -1;
}

#define BENCH_MAX_DEPTH 32
#define BENCH_MAX_BS (128 * 1024)

struct bench_test {
    const char *name;
    bool write, seq;
    uint32_t bs;
    unsigned depth;
};

static const struct bench_test bench_tests[] = {
    {"randread-4k-qd1", false, false, 4096, 1},
    {"randread-4k-qd32", false, false, 4096, 32},
    {"randwrite-4k-qd1", true, false, 4096, 1},
    {"randwrite-4k-qd32", true, false, 4096, 32},
    {"seqread-128k-qd8", false, true, 128 * 1024, 8},
};

struct bench_result {
    const struct bench_test *t;
    uint64_t ops, bytes;
    double seconds, iops, mbps, mean_us, p50_us, p99_us;
    double qsd_cpu_us_per_io;    /* NAN when unknown */
    double client_cpu_us_per_io;
    double kicks_per_io, sleeps_per_io; /* vhost only, NAN otherwise */
};

/* CPU time (ns) of all threads of pid, from /proc/PID/task/<tid>/schedstat
 * (first field: time on CPU).  Threads that exited are missed: QSD's
 * threads live as long as it does. */
static int64_t proc_cpu_ns(int pid)
{
    if (pid <= 0)
        return -1;
    char dir[64];
    snprintf(dir, sizeof(dir), "/proc/%d/task", pid);
    DIR *dp = opendir(dir);
    if (!dp)
        return -1;
    int64_t total = 0;
    for (struct dirent *de; (de = readdir(dp));) {
        if (de->d_name[0] == '.')
            continue;
        _cleanup_free_ char *p = xasprintf("%s/%s/schedstat", dir, de->d_name);
        _cleanup_fclose_ FILE *f = fopen(p, "re");
        unsigned long long ns;
        if (f && fscanf(f, "%llu", &ns) == 1)
            total += (int64_t)ns;
    }
    closedir(dp);
    return total;
}

static int64_t self_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static int run_test(struct engine *e, const struct bench_test *t, uint64_t region,
                    unsigned ramp_ms, unsigned runtime_ms, int qsd_pid, struct bench_result *res)
{
    uint64_t blocks = region / t->bs;
    if (blocks == 0)
        return -EINVAL;
    uint64_t rng = 0x2545f4914f6cdd1dull ^ (uint64_t)t->bs ^ t->depth;
    uint64_t seq_next = 0;
    uint64_t start_ns[BENCH_MAX_DEPTH];
    size_t lat_cap = 1u << 16, nlat = 0;
    _cleanup_free_ uint32_t *lat = xmalloc(lat_cap * sizeof(uint32_t));
    double lat_sum = 0;

    uint64_t t0 = now_ns();
    uint64_t t_measure = t0 + (uint64_t)ramp_ms * 1000000u;
    uint64_t t_end = t_measure + (uint64_t)runtime_ms * 1000000u;
    bool measuring = false;
    int64_t qsd0 = -1, self0 = 0;
    struct vublk_stats st0 = {0}, st1 = {0};
    uint64_t ops = 0, m0 = 0;

#define NEXT_OFF()                                                                             \
    (t->seq ? (seq_next = (seq_next + 1) % blocks, ((seq_next + blocks - 1) % blocks) * t->bs)  \
            : (rng_next(&rng) % blocks) * t->bs)

    for (unsigned s = 0; s < t->depth; s++) {
        start_ns[s] = now_ns();
        int r = e->submit(e, s, t->write, NEXT_OFF(), t->bs);
        if (r < 0)
            return r;
    }
    int r = e->commit(e);
    if (r < 0)
        return r;
    unsigned inflight = t->depth;
    fprintf(stderr, "bench: %s: %u ms ramp + %u ms measured\n", t->name, ramp_ms, runtime_ms);
    uint64_t last_progress = t0;
    while (inflight) {
        unsigned slots[BENCH_MAX_DEPTH];
        int n = e->reap(e, slots, ARRAY_SIZE(slots), true);
        if (n < 0)
            return n;
        uint64_t now = now_ns();
        if (!measuring && now >= t_measure) {
            measuring = true;
            m0 = now;
            qsd0 = proc_cpu_ns(qsd_pid);
            self0 = self_cpu_ns();
            if (e->d)
                vublk_get_stats(e->d, &st0);
            ops = 0;
        }
        bool stop = now >= t_end;
        for (int i = 0; i < n; i++) {
            unsigned s = slots[i];
            inflight--;
            if (measuring && !stop) {
                uint64_t l = now - start_ns[s];
                if (nlat == lat_cap) {
                    lat_cap *= 2;
                    lat = xrealloc(lat, lat_cap * sizeof(uint32_t));
                }
                lat[nlat++] = l > UINT32_MAX ? UINT32_MAX : (uint32_t)l;
                lat_sum += (double)l;
                ops++;
            }
            if (!stop) {
                start_ns[s] = now_ns();
                r = e->submit(e, s, t->write, NEXT_OFF(), t->bs);
                if (r < 0)
                    return r;
                inflight++;
            }
        }
        if (stop && !res->seconds) {
            res->seconds = (double)(now - m0) / 1e9;
            int64_t q1 = proc_cpu_ns(qsd_pid);
            int64_t s1 = self_cpu_ns();
            res->qsd_cpu_us_per_io = qsd0 >= 0 && q1 >= 0 && ops
                                         ? (double)(q1 - qsd0) / 1e3 / (double)ops : NAN;
            res->client_cpu_us_per_io = ops ? (double)(s1 - self0) / 1e3 / (double)ops : NAN;
            res->kicks_per_io = res->sleeps_per_io = NAN;
            if (e->d && ops) {
                vublk_get_stats(e->d, &st1);
                res->kicks_per_io = (double)(st1.kicks - st0.kicks) / (double)ops;
                res->sleeps_per_io = (double)(st1.sleeps - st0.sleeps) / (double)ops;
            }
        }
        r = e->commit(e);
        if (r < 0)
            return r;
        if (now - last_progress > 2000000000ull) {
            fprintf(stderr, "bench: %s: %.0f s\n", t->name, (double)(now - t0) / 1e9);
            last_progress = now;
        }
    }
#undef NEXT_OFF
    fprintf(stderr, "bench: %s: done, %" PRIu64 " I/Os measured\n", t->name, ops);
    qsort(lat, nlat, sizeof(uint32_t), cmp_u32);
    res->t = t;
    res->ops = ops;
    res->bytes = ops * t->bs;
    res->iops = res->seconds > 0 ? (double)ops / res->seconds : 0;
    res->mbps = res->seconds > 0 ? (double)res->bytes / res->seconds / 1e6 : 0;
    res->mean_us = nlat ? lat_sum / (double)nlat / 1e3 : 0;
    res->p50_us = nlat ? lat[(nlat - 1) * 50 / 100] / 1e3 : 0;
    res->p99_us = nlat ? lat[(nlat - 1) * 99 / 100] / 1e3 : 0;
    return 0;
}

static int open_engine(const char *target, unsigned queues, int timeout_ms, struct engine *e,
                       int *ret_pid)
{
    struct stat st;
    if (stat(target, &st) < 0)
        return -errno;
    *e = (struct engine){.fd = -1};
    if (S_ISSOCK(st.st_mode)) {
        struct vublk_opts o = {.num_queues = queues ? queues : 1,
                               .data_size = BENCH_MAX_DEPTH * (size_t)BENCH_MAX_BS,
                               .queue_size = 128, .timeout_ms = timeout_ms};
        int r = vublk_connect(target, &o, &e->d);
        if (r < 0)
            return r;
        e->kind = "vhost-user-blk";
        e->submit = vh_submit;
        e->commit = vh_commit;
        e->reap = vh_reap;
        e->capacity = vublk_capacity(e->d);
        e->bufs = xcalloc(BENCH_MAX_DEPTH, sizeof(uint8_t *));
        for (unsigned s = 0; s < BENCH_MAX_DEPTH; s++) {
            e->bufs[s] = vublk_alloc(e->d, BENCH_MAX_BS);
            memset(e->bufs[s], 0x5a, BENCH_MAX_BS);
        }
        if (*ret_pid == 0)
            *ret_pid = vublk_peer_pid(e->d);
        return 0;
    }
    e->fd = open(target, O_RDWR | O_DIRECT | O_CLOEXEC);
    if (e->fd < 0)
        return -errno;
    if (S_ISBLK(st.st_mode)) {
        off_t end = lseek(e->fd, 0, SEEK_END);
        if (end < 0)
            return -errno;
        e->capacity = (uint64_t)end;
    } else {
        e->capacity = (uint64_t)st.st_size;
    }
    int r = io_uring_queue_init(BENCH_MAX_DEPTH * 2, &e->ring, 0);
    if (r < 0)
        return r;
    e->ring_ok = true;
    e->kind = "io_uring";
    e->submit = ur_submit;
    e->commit = ur_commit;
    e->reap = ur_reap;
    e->bufs = xcalloc(BENCH_MAX_DEPTH, sizeof(uint8_t *));
    void *mem;
    if (posix_memalign(&mem, 4096, BENCH_MAX_DEPTH * (size_t)BENCH_MAX_BS))
        return -ENOMEM;
    memset(mem, 0x5a, BENCH_MAX_DEPTH * (size_t)BENCH_MAX_BS);
    for (unsigned s = 0; s < BENCH_MAX_DEPTH; s++)
        e->bufs[s] = (uint8_t *)mem + (size_t)s * BENCH_MAX_BS;
    return 0;
}

static json_t *num_or_null(double v)
{
    return isnan(v) ? json_null() : json_real(round(v * 1000) / 1000);
}

int cmd_bench(int argc, char **argv)
{
    static const struct option lopts[] = {
        {"json", no_argument, NULL, 'j'},
        {"runtime-ms", required_argument, NULL, 'r'},
        {"ramp-ms", required_argument, NULL, 'R'},
        {"size", required_argument, NULL, 'S'},
        {"queues", required_argument, NULL, 'q'},
        {"tests", required_argument, NULL, 'T'},
        {"qsd-pid", required_argument, NULL, 'p'},
        {"label", required_argument, NULL, 'l'},
        {"poll-us", required_argument, NULL, 'P'},
        {"timeout-ms", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    bool json = g_opts.json;
    uint64_t runtime = 3000, ramp = 500, size = 0, queues = 1, pid = 0, poll_us = 0;
    const char *tests = NULL, *label = NULL;
    int timeout_ms = 5000;
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "+jr:R:S:q:T:p:l:P:t:h", lopts, NULL)) != -1;) {
        int r = 0;
        switch (c) {
        case 'j': json = true; break;
        case 'r': r = parse_uint(optarg, 100, 3600000, &runtime); break;
        case 'R': r = parse_uint(optarg, 0, 60000, &ramp); break;
        case 'S': r = parse_size(optarg, &size); break;
        case 'q': r = parse_uint(optarg, 1, 16, &queues); break;
        case 'T': tests = optarg; break;
        case 'p': r = parse_uint(optarg, 1, INT32_MAX, &pid); break;
        case 'l': label = optarg; break;
        case 'P': r = parse_uint(optarg, 0, 1000000, &poll_us); break;
        case 't': r = parse_timeout(argv[0], optarg, &timeout_ms); break;
        case 'h':
            printf("usage: qsdctl bench [--json] [--runtime-ms MS] [--ramp-ms MS] [--size BYTES]\n"
                   "                    [--queues N] [--tests LIST] [--qsd-pid PID]\n"
                   "                    [--label TEXT] [--poll-us US] TARGET\n"
                   "TARGET is a vhost-user-blk socket (our client) or a file / block device\n"
                   "(io_uring, O_DIRECT: the physical limit).  Tests (comma list, default all):\n");
            for (size_t i = 0; i < ARRAY_SIZE(bench_tests); i++)
                printf("  %s\n", bench_tests[i].name);
            printf("Each test runs --ramp-ms unmeasured, then --runtime-ms measured (defaults\n"
                   "500 and 3000).  Write tests OVERWRITE the target's data.  The QSD's CPU\n"
                   "time per I/O is read from /proc for the socket's peer (or --qsd-pid).\n"
                   "--poll-us (vhost only): spin on the used rings before sleeping on the\n"
                   "call eventfds, to measure what the wake-ups cost.\n"
                   "Progress on stderr; a table (or --json) on stdout.\n");
            return EXIT_OK;
        default: return EXIT_USAGE;
        }
        if (r < 0) {
            fprintf(stderr, "qsdctl bench: invalid value '%s'\n", optarg);
            return EXIT_USAGE;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "qsdctl bench: expected one TARGET argument\n");
        return EXIT_USAGE;
    }
    const char *target = argv[optind];
    bool selected[ARRAY_SIZE(bench_tests)];
    for (size_t i = 0; i < ARRAY_SIZE(bench_tests); i++)
        selected[i] = tests == NULL;
    if (tests) {
        _cleanup_free_ char *copy = xstrdup(tests);
        char *save = NULL;
        for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            size_t i = 0;
            while (i < ARRAY_SIZE(bench_tests) && !streq(tok, bench_tests[i].name))
                i++;
            if (i == ARRAY_SIZE(bench_tests)) {
                fprintf(stderr, "qsdctl bench: unknown test '%s'\n", tok);
                return EXIT_USAGE;
            }
            selected[i] = true;
        }
    }

    struct engine e;
    int qsd_pid = (int)pid;
    int r = open_engine(target, (unsigned)queues, timeout_ms, &e, &qsd_pid);
    e.poll_us = (unsigned)poll_us;
    if (r < 0) {
        fprintf(stderr, "qsdctl bench: cannot open %s: %s\n", target, strerror(-r));
        engine_close(&e);
        return exit_for_errno(r);
    }
    uint64_t region = size ? MIN(size, e.capacity) : e.capacity;
    region -= region % BENCH_MAX_BS;
    unsigned nq = e.d ? vublk_num_queues(e.d) : 1;
    fprintf(stderr, "bench: %s %s, region %" PRIu64 " bytes, %u queue(s), qsd pid %d\n",
            e.kind, target, region, nq, qsd_pid);
    struct bench_result results[ARRAY_SIZE(bench_tests)];
    memset(results, 0, sizeof(results));
    int rc = EXIT_OK;
    for (size_t i = 0; i < ARRAY_SIZE(bench_tests); i++) {
        if (!selected[i])
            continue;
        r = run_test(&e, &bench_tests[i], region, (unsigned)ramp, (unsigned)runtime,
                     e.d ? qsd_pid : 0, &results[i]);
        if (r < 0) {
            fprintf(stderr, "\nqsdctl bench: %s failed: %s\n", bench_tests[i].name, strerror(-r));
            rc = exit_for_errno(r);
            break;
        }
    }
    engine_close(&e);
    if (rc != EXIT_OK)
        return rc;

    if (json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < ARRAY_SIZE(bench_tests); i++) {
            struct bench_result *b = &results[i];
            if (!selected[i])
                continue;
            json_t *o = json_pack("{s:s, s:s, s:i, s:i, s:I}", "test", b->t->name,
                                  "rw", b->t->write ? "write" : "read", "bs", (int)b->t->bs,
                                  "depth", (int)b->t->depth, "ops", (json_int_t)b->ops);
            json_object_set_new(o, "seconds", num_or_null(b->seconds));
            json_object_set_new(o, "iops", num_or_null(b->iops));
            json_object_set_new(o, "mb_per_s", num_or_null(b->mbps));
            json_object_set_new(o, "mean_us", num_or_null(b->mean_us));
            json_object_set_new(o, "p50_us", num_or_null(b->p50_us));
            json_object_set_new(o, "p99_us", num_or_null(b->p99_us));
            json_object_set_new(o, "qsd_cpu_us_per_io", num_or_null(b->qsd_cpu_us_per_io));
            json_object_set_new(o, "client_cpu_us_per_io", num_or_null(b->client_cpu_us_per_io));
            json_object_set_new(o, "kicks_per_io", num_or_null(b->kicks_per_io));
            json_object_set_new(o, "sleeps_per_io", num_or_null(b->sleeps_per_io));
            json_array_append_new(arr, o);
        }
        json_t *j = json_pack("{s:s, s:s, s:I, s:i, s:i, s:o}", "target", target, "engine",
                              e.kind, "region", (json_int_t)region, "queues", (int)nq,
                              "poll_us", (int)poll_us, "results", arr);
        if (label)
            json_object_set_new(j, "label", json_string(label));
        print_json(j);
        json_decref(j);
    } else {
        printf("%s%s%s (%s, %u queue(s))\n", label ? label : "", label ? ": " : "", target,
               e.kind, nq);
        printf("%-18s %10s %9s %9s %9s %9s %12s %13s %8s %8s\n", "test", "IOPS", "MB/s",
               "mean_us", "p50_us", "p99_us", "qsd_cpu/io", "client_cpu/io", "kicks/io",
               "sleeps/io");
        for (size_t i = 0; i < ARRAY_SIZE(bench_tests); i++) {
            struct bench_result *b = &results[i];
            if (!selected[i])
                continue;
            char q[32] = "-";
            if (!isnan(b->qsd_cpu_us_per_io))
                snprintf(q, sizeof(q), "%.2f us", b->qsd_cpu_us_per_io);
            printf("%-18s %10.0f %9.1f %9.1f %9.1f %9.1f %12s %10.2f us %8.2f %8.2f\n",
                   b->t->name, b->iops, b->mbps, b->mean_us, b->p50_us, b->p99_us, q,
                   b->client_cpu_us_per_io, b->kicks_per_io, b->sleeps_per_io);
        }
    }
    return EXIT_OK;
}
