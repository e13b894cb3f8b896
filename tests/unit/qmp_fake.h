/* SPDX-License-Identifier: Apache-2.0 */
/* tests/unit/qmp_fake.h: a fake QMP monitor for unit tests (test_qmp,
 * test_qmpcmd): a thread on a unix socket replays a transcript ("<" lines
 * it sends, ">" lines the client must send, compared as JSON without "id")
 * and records the first unexpected command. */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

struct fake {
    char dir[64];
    char path[128];
    int listen_fd;
    pthread_t thread;
    char *script;      /* transcript text */
    bool close_after;  /* hang up after the script */
    bool stay_silent;  /* at the end, keep the connection open without replying */
    char error[512];   /* first mismatch, empty if none */
};

/* One line from fd without its newline; -1 at EOF. */
int read_line(int fd, char *buf, size_t len);
/* transcript: a file name under QMP_TRANSCRIPT_DIR (ends in .replay) or
 * the transcript's text. */
void fake_start(struct fake *f, const char *transcript);
/* Join the thread, clean up, fail the test on a mismatch. */
void fake_finish(struct fake *f);
