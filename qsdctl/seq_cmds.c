/* SPDX-License-Identifier: Apache-2.0 */
/* seq_cmds.c: `qsdctl seqwrite`, a writer of one ordered sequence across
 * several vhost-user-blk sockets (lib/vublk.h): write k goes to socket
 * k mod N at block k div N, and is acknowledged before write k+1 is
 * submitted.  Each 4096-byte block holds SEQ_MAGIC and k, so a copy of the
 * disks taken at any instant (a group snapshot) can be checked: the writes
 * it holds must be a prefix 0..K of the sequence (tests/csi/test_csi_group.py). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "qsd/base/util.h"
#include "qsd/vhost/vublk.h"

#define SEQ_BLOCK 4096u
#define SEQ_MAGIC "QSDSEQ01"
#define SEQ_MAX_DISKS 8

/* SIGTERM is blocked and looked for between writes: a write is never cut
 * short by it. */
static bool term_pending(void)
{
    sigset_t p;
    return sigpending(&p) == 0 && sigismember(&p, SIGTERM) == 1;
}

static void seq_usage(FILE *f)
{
    fprintf(f, "Usage: qsdctl seqwrite [--count N] [--interval-us U] [--start K] SOCKET...\n"
               "Write blocks 0, 1, 2... in turn to each vhost-user-blk SOCKET (write k: socket\n"
               "k mod N, block k div N, holding \"" SEQ_MAGIC "\" and k), each acknowledged before\n"
               "the next, from write K (0), until N writes, a full disk or SIGTERM.  Prints the\n"
               "next write's number.\n");
}

int cmd_seqwrite(int argc, char **argv)
{
    static const struct option opts[] = {{"count", required_argument, NULL, 'n'},
                                         {"interval-us", required_argument, NULL, 'i'},
                                         {"start", required_argument, NULL, 's'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    uint64_t count = UINT64_MAX, interval = 0, start = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "+n:i:s:h", opts, NULL)) != -1) {
        if (c == 'h') {
            seq_usage(stdout);
            return EXIT_OK;
        }
        if ((c == 'n' && parse_uint(optarg, 1, UINT64_MAX, &count) < 0) ||
            (c == 'i' && parse_uint(optarg, 0, 1000000, &interval) < 0) ||
            (c == 's' && parse_uint(optarg, 0, UINT64_MAX / 2, &start) < 0) ||
            (c != 'n' && c != 'i' && c != 's')) {
            seq_usage(stderr);
            return EXIT_USAGE;
        }
    }
    int n = argc - optind;
    if (n < 1 || n > SEQ_MAX_DISKS) {
        seq_usage(stderr);
        return EXIT_USAGE;
    }
    struct vublk *d[SEQ_MAX_DISKS] = {0};
    uint8_t *buf[SEQ_MAX_DISKS];
    uint64_t blocks = UINT64_MAX;
    int rc = EXIT_OK;
    for (int i = 0; i < n && rc == EXIT_OK; i++) {
        struct vublk_opts o = {.data_size = SEQ_BLOCK};
        int r = vublk_connect(argv[optind + i], &o, &d[i]);
        if (r < 0) {
            fprintf(stderr, "qsdctl seqwrite: cannot connect to %s: %s\n", argv[optind + i],
                    strerror(-r));
            rc = r == -ENOENT || r == -ECONNREFUSED ? EXIT_NOT_FOUND : EXIT_FAILURE_GENERIC;
            break;
        }
        buf[i] = vublk_alloc(d[i], SEQ_BLOCK);
        blocks = MIN(blocks, vublk_capacity(d[i]) / SEQ_BLOCK);
    }
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigprocmask(SIG_BLOCK, &term, NULL);
    uint64_t k = start;
    while (rc == EXIT_OK && !term_pending() && k - start < count && k / (uint64_t)n < blocks) {
        int i = (int)(k % (uint64_t)n);
        memset(buf[i], 0, SEQ_BLOCK);
        memcpy(buf[i], SEQ_MAGIC, 8);
        memcpy(buf[i] + 8, &k, sizeof(k));
        struct vublk_io io = {.type = VIRTIO_BLK_T_OUT, .buf = buf[i], .len = SEQ_BLOCK,
                              .sector = k / (uint64_t)n * (SEQ_BLOCK / VIRTIO_BLK_SECTOR)};
        uint8_t st = 0;
        int r = vublk_request_sync(d[i], 0, &io, &st);
        if (r < 0 || st != VIRTIO_BLK_S_OK) {
            fprintf(stderr, "qsdctl seqwrite: write %" PRIu64 " to %s failed: %s\n", k,
                    argv[optind + i], r < 0 ? strerror(-r) : vublk_status_name(st));
            rc = EXIT_FAILURE_GENERIC;
            break;
        }
        k++;
        if (interval)
            usleep((useconds_t)interval);
    }
    for (int i = 0; i < n; i++)
        vublk_free(d[i]);
    printf("{\"next\": %" PRIu64 "}\n", k);
    return rc;
}
