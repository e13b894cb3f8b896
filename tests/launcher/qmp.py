#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Tiny QMP client and socket helpers for the launcher's end-to-end tests.

  qmp.py cmd SOCK COMMAND [JSON-ARGS]   run one QMP command, print the reply
  qmp.py wait-socket SOCK TIMEOUT       wait until SOCK accepts a connection
Every wait is bounded (socket timeouts and deadlines)."""
import json
import socket
import sys
import time


def qmp(path, command, args=None, timeout=10.0):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    f = s.makefile("rwb")

    def recv():
        while True:
            line = f.readline()
            if not line:
                raise RuntimeError("QMP connection closed")
            msg = json.loads(line)
            if "event" not in msg:
                return msg

    recv()  # greeting
    for cmd in ({"execute": "qmp_capabilities"},
                {"execute": command, **({"arguments": args} if args else {})}):
        f.write(json.dumps(cmd).encode() + b"\n")
        f.flush()
        reply = recv()
        if "error" in reply:
            raise RuntimeError(f"{cmd['execute']}: {reply['error'].get('desc')}")
    s.close()
    return reply.get("return")


def wait_socket(path, timeout):
    deadline = time.monotonic() + timeout
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(1.0)
        try:
            s.connect(path)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        finally:
            s.close()


if __name__ == "__main__":
    if sys.argv[1] == "cmd":
        args = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
        print(json.dumps(qmp(sys.argv[2], sys.argv[3], args)))
    elif sys.argv[1] == "wait-socket":
        sys.exit(0 if wait_socket(sys.argv[2], float(sys.argv[3])) else 1)
    else:
        sys.exit(2)
