#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A qsdctl walk-through (the library alone, no CSI, no VM): build, then drive a
# real qemu-storage-daemon through qsdctl and
# narrate what happens.  Everything lives in a temporary directory that is
# removed at the end (also on failure or Ctrl-C).
set -euo pipefail
cd "$(dirname "$0")/.."

say()  { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run()  { printf '$ %s\n' "$*"; "$@"; }

say "Building (cmake, build/)"
cmake -S . -B build >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
export PATH=$PWD/build/qsdctl:$PATH

T=$(mktemp -d /tmp/qsd-demo-XXXXXX)
export QSDCTL_RUN_DIR=$T/run QSDCTL_POOL=$T/pool
SUP=
cleanup() {
    [[ -n $SUP ]] && kill "$SUP" 2>/dev/null && wait "$SUP" 2>/dev/null
    for v in demo restored; do qsdctl unexport "$v" >/dev/null 2>&1 || true; done
    rm -rf "$T"
}
trap cleanup EXIT
echo "pool: $QSDCTL_POOL   run dir: $QSDCTL_RUN_DIR"

say "1. Create a 256 MiB qcow2 volume and put some data in it"
run qsdctl create demo --size 256M
run qemu-io -f qcow2 -c 'write -P 0x5a 0 4M' "$T/pool/volumes/demo.qcow2" | head -1

say "2. Export it: one qemu-storage-daemon, a vhost-user-blk socket for a VM"
run qsdctl export demo --num-queues 2
run ls -l "$T/run/exports/demo"
run qsdctl vhost-info "$T/run/exports/demo/vhost.sock"

say "3. Keep it alive: a supervisor adopts the running QSD"
qsdctl supervise >"$T/supervise.log" 2>&1 &
SUP=$!
sleep 0.5
cat "$T/supervise.log"

say "4. Grow it while it is being served (block_resize inside the QSD)"
run qsdctl resize demo --size 512M
run qsdctl status demo

say "5. Snapshot it live, then restore the snapshot into a new volume"
run qsdctl snapshot demo snap1
run qsdctl create restored --from-snapshot snap1
run qemu-img compare -f qcow2 -F qcow2 "$T/pool/snapshots/snap1.qcow2" "$T/pool/volumes/restored.qcow2"

say "6. Crash: kill -9 the QSD; the supervisor restarts it on the same socket"
pid=$(qsdctl --json status demo | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
run kill -9 "$pid"
for _ in $(seq 200); do
    new=$(qsdctl --json status demo | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("pid", 0) if d.get("socket_accepts") else 0)')
    [[ $new != 0 && $new != "$pid" ]] && break
    sleep 0.01
done
tail -n 2 "$T/supervise.log"
echo "QSD pid $pid -> $new, socket $(test -S "$T/run/exports/demo/vhost.sock" && echo present)"

say "7. Stop and clean up"
run qsdctl unexport demo
run qsdctl list
kill "$SUP"; wait "$SUP" || true; SUP=
run qsdctl delete demo
run qsdctl delete restored
run qsdctl snapshot-delete snap1

say "Summary"
echo "created, exported (socket ready), resized online, snapshotted live, restored,"
echo "survived kill -9 (pid $pid -> $new on the same socket), stopped and cleaned up."
