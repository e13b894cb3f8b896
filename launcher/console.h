/* SPDX-License-Identifier: Apache-2.0 */
/* console.h: the VM's serial console, in the launcher.
 *
 * Owns: the socket QEMU's serial port connects to (in the launcher's root),
 * the bounded console log (written by the launcher, rotated to <log>.1 when
 * it would exceed its bound, so at most twice the bound is kept), and the
 * attach socket that `qsd-vm-launcher console` (console_client.c) connects
 * to: one client at a time; it gets the guest's output from the moment it
 * attaches and its input goes to the guest.  Everything runs in the main
 * loop with non-blocking I/O: a client that does not read loses output, the
 * guest never waits for it. */
#pragma once

#include "qsd/base/loop.h"

#include <stdint.h>

#define CONSOLE_LOG_MIN (4 * 1024)
#define CONSOLE_DETACH_CHAR 0x1d /* Ctrl-] */

struct console_config {
    const char *qemu_socket;   /* QEMU connects here */
    const char *attach_socket; /* qsd-vm-launcher console connects here */
    const char *log_path;
    uint64_t log_max;          /* bytes, >= CONSOLE_LOG_MIN */
};

struct console;

/* Creates both listening sockets (replacing stale ones) and opens the log;
 * call before starting the domain, so no output is lost. */
int console_new(struct loop *l, const struct console_config *cfg, struct console **ret);
void console_free(struct console *c);

/* `qsd-vm-launcher console`: argv[0] is "console". */
int console_client_main(int argc, char **argv);
