# SPDX-License-Identifier: Apache-2.0
"""Shared start of every reproducer: argument parsing and the import of
vuattack.py (one directory up).  usage of a reproducer:
    repro_<name>.py SOCKET [QSD_PID]
SOCKET: a qemu-storage-daemon vhost-user-blk export's unix socket.
QSD_PID: only repro_postcopy.py needs it (see there)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import vuattack  # noqa: E402,F401


def args(n=1):
    if len(sys.argv) < 1 + n:
        print(sys.modules["__main__"].__doc__)
        sys.exit(2)
    return sys.argv[1:1 + n]


def say(*a):
    print("repro:", *a, flush=True)


def _hook(typ, value, tb):
    """A closed connection or no answer ends a reproducer with one line: the
    back-end (or a filter in front of it) refused the attack there."""
    if issubclass(typ, (vuattack.Closed, vuattack.Timeout)):
        import traceback
        where = traceback.extract_tb(tb)
        line = next((f for f in reversed(where) if "repro_" in f.filename), where[-1])
        say("%s at line %d (%s): %s" % (typ.__name__, line.lineno, line.line, value))
        sys.exit(0)
    sys.__excepthook__(typ, value, tb)


sys.excepthook = _hook
