#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The Ceph of tests/k8s/e2e.sh's RBD step: the tests' single-node cluster
(tests/ceph/cephlib.py) bound to the host's address, which the cluster's
pods reach (its loopback they do not).

    tests/k8s/ceph.py ADDR ENV-FILE

Starts it, writes ENV-FILE (shell assignments: CEPH_MONITORS, CEPH_USER,
CEPH_KEY, CEPH_POOL, CEPH_NAMESPACE, CEPH_CONF for the admin CLI), then
runs until SIGTERM or SIGINT and stops the cluster (its daemons by PID, its
directory removed).  Owns that cluster; exits 1 if it did not start."""
import os
import shlex
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ceph"))
import cephlib  # noqa: E402


def main():
    addr, env_file = sys.argv[1], sys.argv[2]
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    with cephlib.Cluster(prefix="qsd-k8s-ceph-", addr=addr) as c:
        env = {"CEPH_MONITORS": c.monitors, "CEPH_USER": c.user, "CEPH_KEY": c.key,
               "CEPH_POOL": c.pool, "CEPH_NAMESPACE": c.namespace,
               "CEPH_CONF": c.env["CEPH_CONF"]}
        with open(env_file + ".tmp", "w") as f:
            f.writelines("%s=%s\n" % (k, shlex.quote(v)) for k, v in env.items())
        os.rename(env_file + ".tmp", env_file)
        print("ceph.py: up in %.1f s at %s" % (c.start_seconds, c.monitors), flush=True)
        while not stop:
            time.sleep(0.5)
    print("ceph.py: stopped", flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - one line for the caller's log
        print("ceph.py: %s" % e, file=sys.stderr)
        sys.exit(1)
