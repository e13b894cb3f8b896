#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""A QSD serving a Ceph RBD image over vhost-user-blk, started as the plugin
starts its QSDs (qsd.h, rbdsrc.h; here through `qsdctl export --rbd-*`),
against a real single-node Ceph (cephlib.py) with cephx and a user confined
to one pool namespace:

  - the export serves the image at its size; a vhost-user client (qsdctl
    verify) writes a pattern and reads it back, also after the QSD was
    stopped and started again (the data is in Ceph, not in the QSD);
  - QSD holds the image's exclusive lock while it serves (rbd lock owner);
  - the user's key is on no command line (only the path of a 0600 file);
  - a wrong key fails the export at once with QSD's "Permission denied"
    (monitors in the QSD's own configuration file, v2: prefixed), leaving
    nothing running;
  - an image whose size is no use (0 bytes) fails the export, which stops
    its QSD: the size read over the monitor is checked, never taken as 0.

usage: test_qsd_rbd.py QSDCTL
~20 s (of which ~10 s Ceph start)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cephlib  # noqa: E402

MiB = 1 << 20


def main():
    qsdctl = sys.argv[1]
    why = cephlib.have_ceph()
    if why:
        print("SKIP: Ceph " + why + " (scripts/setup.sh installs it)")
        return 77
    if os.geteuid() != 0:
        print("SKIP: needs root (QSD run directory)")
        return 77
    root = tempfile.mkdtemp(prefix="qsd-rbd-test-")
    ceph = cephlib.Cluster()
    run, pool = os.path.join(root, "run"), os.path.join(root, "pool")
    os.mkdir(pool)

    def ctl(*args, check=True):
        r = subprocess.run([qsdctl, "--run-dir", run, "--pool", pool, "--json", *args],
                           capture_output=True, text=True, timeout=60)
        if check and r.returncode != 0:
            raise AssertionError("qsdctl %s: exit %d: %s" % (args[0], r.returncode, r.stderr))
        return r

    exported = []
    try:
        ceph.start()
        print("ceph up in %.1f s" % ceph.start_seconds)
        spec = "%s/%s/disk" % (ceph.pool, ceph.namespace)
        ceph.rbd("create", "--size", "64M", spec)
        keyfile = os.path.join(root, "key")
        fd = os.open(keyfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, ceph.key.encode())
        os.close(fd)
        rbd_args = ["--rbd-image", spec, "--rbd-monitors", ceph.monitors, "--rbd-user",
                    ceph.user, "--rbd-key-file", keyfile]

        out = json.loads(ctl("export", "vol", *rbd_args).stdout)
        exported.append("vol")
        assert out["size"] == 64 * MiB, out
        sock = out["socket"]
        with open("/proc/%d/cmdline" % out["pid"], "rb") as f:
            cmdline = f.read()
        assert ceph.key.encode() not in cmdline and keyfile.encode() in cmdline, cmdline
        subprocess.run([qsdctl, "verify", "--size", "64M", "--write", "--seed", "5", sock],
                       check=True, timeout=120)
        lock = json.loads(ceph.rbd("lock", "ls", "--format", "json", spec))
        assert lock, "QSD holds no lock on the image: %s" % lock
        ctl("unexport", "vol")
        exported.remove("vol")
        # Again: what was written is in Ceph.
        out = json.loads(ctl("export", "vol", *rbd_args).stdout)
        exported.append("vol")
        subprocess.run([qsdctl, "verify", "--check", "--seed", "5", out["socket"]], check=True,
                       timeout=120)
        ctl("unexport", "vol")
        exported.remove("vol")

        # A size of 0 is refused and the QSD it started is stopped again.
        empty = "%s/%s/empty" % (ceph.pool, ceph.namespace)
        ceph.rbd("create", "--size", "0", empty)
        r = ctl("export", "empty", *(rbd_args[:1] + [empty] + rbd_args[2:]), check=False)
        if r.returncode == 0:
            exported.append("empty")   # stopped in finally
        assert r.returncode != 0 and "0 bytes" in r.stderr, (r.returncode, r.stderr)
        st = json.loads(ctl("list").stdout)
        assert not any(v.get("exported") for v in st.get("volumes", [])), st
        assert not os.path.exists(os.path.join(run, "ctl", "empty")), os.listdir(run)

        # A wrong key: the QSD cannot open the image and exits, saying why (its
        # monitors carry their protocol in its configuration file: librados
        # does not keep hunting until --timeout, which would say "did not
        # accept connections").
        with open(keyfile, "w") as f:
            f.write(ceph.key[:-6] + ("AAAA==" if not ceph.key.endswith("AAAA==") else "BBBB=="))
        t0 = time.monotonic()
        r = ctl("export", "bad", "--timeout", "60000", *rbd_args, check=False)
        assert r.returncode != 0, "an export with a wrong key succeeded"
        print("wrong key refused in %.1f s: %s" % (time.monotonic() - t0, r.stderr.strip()[-300:]))
        assert "Permission denied" in r.stderr, r.stderr
        st = json.loads(ctl("list").stdout)
        assert not any(v.get("exported") for v in st.get("volumes", [])), st
        print("PASS")
        return 0
    finally:
        for v in exported:
            ctl("unexport", v, check=False)
        ceph.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
