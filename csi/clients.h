/* SPDX-License-Identifier: Apache-2.0 */
/* clients.h: who is connected to a volume's export, and since when nobody.
 *
 * Owns: counting the connected vhost-user clients of an export (the QSD's
 * accepted connections on its socket, found through its descriptors with
 * pidfd_getfd: the accepted end lives in the client's network namespace, so
 * /proc/net/unix and sock_diag in ours do not show it), and the wall clock
 * that times a volume's release (vol->released_ms, NodeUnstage's wait for
 * the guest).  Non-blocking: a zero-timeout poll per socket. */
#pragma once

#include <stdint.h>
#include <sys/types.h>

/* Connected clients of the export at socket_path of the QSD qsd_pid: >= 0,
 * or a negative errno. */
int export_clients(pid_t qsd_pid, const char *socket_path);

/* CLOCK_REALTIME in milliseconds. */
int64_t realtime_ms(void);
