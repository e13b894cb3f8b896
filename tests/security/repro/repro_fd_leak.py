#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""File descriptors attached to a message whose handler takes none stay
open in the back-end for its whole life.

The server's read_msg (util/vhost-user-server.c vu_message_read()) collects
up to 8 SCM_RIGHTS fds with any message; vu_dispatch() closes them only in
the handlers that expect fds (and in the default case of
vu_process_message()).  GET_FEATURES, GET_CONFIG, SET_OWNER, ... with fds
attached: the fds are neither used nor closed, not even by vu_deinit() when
the connection ends.  Here 50 GET_FEATURES with 8 fds each: 400 fds stay in
the back-end after the front-end disconnects (its RLIMIT_NOFILE is the
bound; then every open() of the back-end fails).

usage: repro_fd_leak.py SOCKET QSD_PID
"""
import os
import time

from _common import args, say, vuattack as vu

sock, pid = args(2)
pid = int(pid)
before = vu.proc_fds(pid)
fds = [os.memfd_create("leak%d" % i, os.MFD_CLOEXEC) for i in range(8)]
with vu.Conn(sock, timeout=3) as c:
    for _ in range(50):
        c.send(vu.GET_FEATURES, fds=fds)
        c.recv()
    say("50 GET_FEATURES with 8 fds each: back-end fds %d -> %d" % (before, vu.proc_fds(pid)))
for fd in fds:
    os.close(fd)
time.sleep(1)
say("1 s after the front-end disconnected: back-end fds %d (before: %d)" % (
    vu.proc_fds(pid), before))
