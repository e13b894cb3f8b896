# SPDX-License-Identifier: Apache-2.0
"""The Ceph test harness (cephlib.py) itself: a cluster comes up within its
bound with cephx enforced and a client user confined to one pool namespace,
and goes away completely (daemons gone by PID, directory removed), also when
the test body fails.  Prints the start and stop times.  ~12 s."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cephlib  # noqa: E402


def user_rbd(c, *args):
    """rbd as the restricted user, with its key passed on stdin-free keyfile
    (a test-private file in the cluster's directory)."""
    keyfile = os.path.join(c.dir, "csi.key")
    with open(keyfile, "w") as f:
        f.write(c.key)
    return subprocess.run(["rbd", "--id", c.user, "--keyfile", keyfile, *args], env=c.env,
                          capture_output=True, text=True, timeout=cephlib.CMD_TIMEOUT)


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def main():
    why = cephlib.have_ceph()
    if why:
        print("SKIP: Ceph " + why + " (scripts/setup.sh installs it)")
        return 77
    c = cephlib.Cluster()
    with c:
        pids = [p.pid for p in c.procs]
        d = c.dir
        assert len(pids) == 2 and all(alive(p) for p in pids), pids
        print("cluster up in %.1f s at %s" % (c.start_seconds, c.monitors))
        # cephx is on: a wrong key is refused.
        r = subprocess.run(["rbd", "--id", c.user, "--key", "AQBAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==",
                            "ls", "%s/%s" % (c.pool, c.namespace)], env=c.env,
                           capture_output=True, text=True, timeout=cephlib.CMD_TIMEOUT)
        assert r.returncode != 0, "a wrong key was accepted"
        # The user works in its namespace, nowhere else.
        spec = "%s/%s/img" % (c.pool, c.namespace)
        r = user_rbd(c, "create", "--size", "16M", spec)
        assert r.returncode == 0, r.stderr
        r = user_rbd(c, "create", "--size", "16M", "%s/outside" % c.pool)
        assert r.returncode != 0, "the user created an image outside its namespace"
        assert "img" in c.rbd("ls", "%s/%s" % (c.pool, c.namespace))
    assert c.dir is None and not os.path.exists(d), d
    assert not any(alive(p) for p in pids), pids
    print("cluster down in %.2f s" % c.stop_seconds)

    # A failing test body still stops everything.
    c2 = cephlib.Cluster()
    try:
        with c2:
            pids2, d2 = [p.pid for p in c2.procs], c2.dir
            raise KeyError("test body failed")
    except KeyError:
        pass
    assert not os.path.exists(d2) and not any(alive(p) for p in pids2), (d2, pids2)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
