#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""qsd-csi-plugin's numeric and size flags: each accepts its bounds and
refuses one past them and a non-number, with exit status 2 and a message
naming the flag and its range (csi/main.c's option tables).

usage: test_plugin_flags.py PLUGIN_BINARY
Exit 0 on success, 1 on failure.  Runs in about a second.
"""
import subprocess
import sys

# flag, smallest, largest accepted (None: sizes have no largest)
INTEGERS = [("unplug-timeout", 1, 86400), ("qsd-volume-pids-max", 16, 1 << 22),
            ("qsd-volume-cpu-weight", 1, 10000), ("qsd-uid-base", 1, 0xfffe0000),
            ("qsd-uid-count", 0, 65536), ("qsd-cpu-weight", 1, 10000),
            ("image-timeout", 1, 86400), ("metrics-interval", 1, 3600),
            ("max-volumes", 1, 100000)]
SIZES = [("qsd-volume-memory-max", 16 << 20), ("image-max-size", 1), ("qsd-memory-max", 16 << 20)]


def run(plugin, flag, value):
    return subprocess.run([plugin, "--nodeid", "n", "--%s=%s" % (flag, value), "--version"],
                          capture_output=True, text=True, timeout=10)


def main():
    plugin = sys.argv[1]
    fails = []
    cases = 0

    def accepted(flag, value):
        r = run(plugin, flag, value)
        if r.returncode != 0:
            fails.append("--%s=%s refused (%d): %s" % (flag, value, r.returncode, r.stderr[:200]))

    def refused(flag, value, word):
        r = run(plugin, flag, value)
        first = r.stderr.splitlines()[0] if r.stderr else ""
        if r.returncode != 2 or "--" + flag not in first or word not in first:
            fails.append("--%s=%s: exit %d, %r (want 2, naming the flag and %r)"
                         % (flag, value, r.returncode, first, word))

    for flag, lo, hi in INTEGERS:
        rng = "%d-%d" % (lo, hi)
        accepted(flag, lo)
        accepted(flag, hi)
        refused(flag, hi + 1, rng)
        if lo > 0:
            refused(flag, lo - 1, rng)
        refused(flag, "ten", rng)
        refused(flag, "-1", rng)
        cases += 6
    for flag, lo in SIZES:
        accepted(flag, lo)
        accepted(flag, "64G")
        if lo > 1:
            refused(flag, lo - 1, "at least")
        refused(flag, "0", "at least")
        refused(flag, "lots", "at least")
        cases += 5
    for f in fails:
        print("FAIL: " + f)
    if fails:
        return 1
    print("ok: %d flag cases" % cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
