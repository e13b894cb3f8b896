#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""qsd-csi-plugin --print-qsd-command: the QSD command line NodeStageVolume
would run (what scripts/bench.sh measures), and its refusals.

usage: test_print_qsd_command.py PLUGIN_BINARY
Exit 0 on success, 1 on failure.  Runs in well under a second.
"""
import json
import subprocess
import sys


def run(plugin, *args):
    return subprocess.run([plugin, "--run-dir", "/run/x", "--qsd-binary", "/q/qsd",
                           "--print-qsd-command", *args], capture_output=True, text=True, timeout=10)


def exports(argv):
    return [json.loads(argv[i + 1]) for i, a in enumerate(argv) if a == "--export"]


def main():
    plugin = sys.argv[1]
    fails = []

    def check(cond, what):
        if not cond:
            fails.append(what)

    # Defaults, raw: write-back export, no iothread, the image and sockets.
    r = run(plugin, "/pool/volumes/pvc-1.raw")
    check(r.returncode == 0, "raw: exit %d: %s" % (r.returncode, r.stderr))
    argv = json.loads(r.stdout)
    check(argv[0] == "/q/qsd", "raw: binary %s" % argv[0])
    check("iothread" not in r.stdout, "raw: an iothread in the shipped command line")
    ex = exports(argv)
    check([e["writethrough"] for e in ex] == [False, False], "raw: writethrough %s" % ex)
    check(ex[0]["addr"]["path"] == "/run/x/exports/pvc-1/vhost.sock", "raw: socket %s" % ex[0])
    check(ex[1]["addr"]["path"] == "/run/x/exports-ro/pvc-1/vhost.sock", "raw: ro socket %s" % ex[1])
    # The throttle group (unlimited until ControllerModifyVolume) and the
    # filter the exports serve, over the format node.
    objs = [json.loads(argv[i + 1]) for i, a in enumerate(argv) if a == "--object"]
    tg = [o for o in objs if o.get("qom-type") == "throttle-group"]
    check(len(tg) == 1 and tg[0]["id"] == "tg0" and len(tg[0]["limits"]) == 8 and
          set(tg[0]["limits"].values()) == {0}, "raw: throttle group %s" % objs)
    devs = [json.loads(argv[i + 1]) for i, a in enumerate(argv) if a == "--blockdev"]
    check(devs[-1] == {"driver": "throttle", "node-name": "qos", "throttle-group": "tg0",
                       "file": "vol"}, "raw: throttle node %s" % devs)
    check([e["node-name"] for e in ex] == ["qos", "qos"], "raw: exported node %s" % ex)
    node = json.loads(argv[2])
    check(node["filename"] == "/pool/volumes/pvc-1.raw" and node["aio"] == "native" and
          node["cache"] == {"direct": True, "no-flush": False}, "raw: file node %s" % node)

    # qcow2 with parameters: write-through, the parameters applied.
    r = run(plugin, "/pool/volumes/pvc-2.qcow2", '{"aio": "io_uring", "numQueues": "2"}')
    check(r.returncode == 0, "qcow2: exit %d: %s" % (r.returncode, r.stderr))
    argv = json.loads(r.stdout)
    ex = exports(argv)
    check([e["writethrough"] for e in ex] == [True, True], "qcow2: writethrough %s" % ex)
    check(ex[0]["num-queues"] == 2, "qcow2: num-queues %s" % ex[0])
    check(json.loads(argv[2])["aio"] == "io_uring", "qcow2: aio %s" % argv[2])
    r = run(plugin, "/pool/volumes/pvc-2.qcow2")  # write-through, O_DIRECT: Linux AIO by default
    check(r.returncode == 0 and json.loads(json.loads(r.stdout)[2])["aio"] == "native",
          "qcow2 default: %s %s" % (r.stdout, r.stderr))
    check(json.loads(argv[4])["driver"] == "qcow2", "qcow2: format node %s" % argv[4])

    # Without O_DIRECT Linux AIO is not valid: the default is io_uring there.
    # (Defaults: raw above, write-back with O_DIRECT: native; qcow2 below.)
    r = run(plugin, "/pool/volumes/pvc-3.raw", '{"cache": "writeback"}')
    check(r.returncode == 0, "writeback: exit %d: %s" % (r.returncode, r.stderr))
    node = json.loads(json.loads(r.stdout)[2])
    check(node["aio"] == "io_uring" and node["cache"]["direct"] is False,
          "writeback: file node %s" % node)

    # Refusals: exit 2, a message naming what is wrong, nothing on stdout.
    for args, word in ((["/p/v.raw", '{"aio": "bogus"}'], "aio"),
                       (["/p/v.raw", '{"cache": "none", "nope": "1"}'], "nope"),
                       (["/p/v.raw", "{not json"], "parameters"),
                       (["/p/v.img"], ".raw or .qcow2")):
        r = run(plugin, *args)
        check(r.returncode == 2 and word in r.stderr and not r.stdout,
              "%s: exit %d, stderr %r" % (args, r.returncode, r.stderr))

    for f in fails:
        print("FAIL: " + f)
    if fails:
        return 1
    print("PASS: --print-qsd-command: raw write-back, qcow2 write-through, no iothread, a throttle "
          "group and filter under the exports; 4 refusals")
    return 0


if __name__ == "__main__":
    sys.exit(main())
