#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# End-to-end durability with the shipped settings: volumes exported by qsdctl
# (the plugin's library and its options: no iothread, cache=none, Linux AIO)
# and kept alive by `qsdctl supervise` (the plugin's restart code); a TCG guest
# booted by qsd-vm-launcher with a raw volume cold-plugged (vda, the export
# runs write-back) and a qcow2 volume hot-plugged (vdb, write-through).
# Checks: both disks show a write-back cache in the guest (the launcher's
# config-wce=off: the guest sends flushes); the raw export's QSD runs
# write-back; kill -9 of both QSDs in the middle of fsync'ed writes, restart
# by the supervisor on the same sockets: no write error and 0 fsync'ed blocks
# lost on either disk.  About a minute under TCG.
SRC=$(cd "$(dirname "$0")" && pwd)
source "$SRC/e2e-lib.sh"
: "${QSDCTL:?QSDCTL (the qsdctl binary) must be set}"

# Two runtime directories: the cold-plugged volume's exports are the VM pod's
# PVC directory, the hot-plugged one's the bridge.
RUN1=$WORK/run1 RUN2=$WORK/run2 POOL=$WORK/pool
VOLS=$RUN1/exports BRIDGE=$RUN2/exports
mkdir -p "$VOLS" "$BRIDGE" "$POOL"
q1() { "$QSDCTL" --run-dir "$RUN1" --pool "$POOL" "$@"; }
q2() { "$QSDCTL" --run-dir "$RUN2" --pool "$POOL" "$@"; }
durable_cleanup() {
    for p in "${PIDS[@]}"; do stop_pid "$p" TERM 5; done # the supervisors first
    q1 unexport vraw >/dev/null 2>&1
    q2 unexport vq >/dev/null 2>&1
    return 0
}
trap 'rc=$?; set +e; durable_cleanup; (exit $rc); e2e_cleanup' EXIT

qsd_pid() { "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$1/ctl/$2/qsd.json"; }
volume_json() { # RUN VOLUME: what the plugin writes beside the socket at publish
    printf '{"version":1,"volume":"pvc-%s","size":67108864,"socket":"vhost.sock"}\n' "$2" \
        >"$1/exports/$2/.volume.json.tmp"
    mv "$1/exports/$2/.volume.json.tmp" "$1/exports/$2/volume.json"
}

guest "$SRC/guest-durable.sh"
q1 create vraw --size 64M --format raw >/dev/null
q2 create vq --size 64M --format qcow2 >/dev/null
q1 export vraw --no-iothread >/dev/null
volume_json "$RUN1" vraw
"$QSDCTL" --run-dir "$RUN1" --pool "$POOL" supervise >"$WORK/supervise1.log" 2>&1 &
PIDS+=($!)
"$QSDCTL" --run-dir "$RUN2" --pool "$POOL" supervise >"$WORK/supervise2.log" 2>&1 &
PIDS+=($!)
tr '\0' '\n' <"/proc/$(qsd_pid "$RUN1" vraw)/cmdline" | grep -q '"writethrough":false' ||
    e2e_fail "the raw volume's export is not write-back"

vm_json durable '[{"volume": "vraw"}]'
start_launcher --shutdown-timeout 5 --ready-timeout 3 --detach-timeout 30
wait_console '^READY-FOR-HOTPLUG' 1 180
q2 export vq --no-iothread >/dev/null
tr '\0' '\n' <"/proc/$(qsd_pid "$RUN2" vq)/cmdline" | grep -q '"writethrough":true' ||
    e2e_fail "the qcow2 volume's export is not write-through"
volume_json "$RUN2" vq
wait_console '^CACHE name=vdb' 1 60
for d in vda vdb; do
    [[ $(count_console "^CACHE name=$d cache_type=write_back write_cache=write_back$") -eq 1 ]] ||
        e2e_fail "$d: not a write-back disk in the guest: $(console "^CACHE name=$d")"
done
log "guest sees write back on vda (cold-plugged) and vdb (hot-plugged)"

wait_console '^W 10$' 1 120
old1=$(qsd_pid "$RUN1" vraw) old2=$(qsd_pid "$RUN2" vq)
kill -KILL "$old1" "$old2"
log "both QSDs killed after $(count_console '^W ') blocks"
wait_console '^DONE ' 1 300
new1=$(qsd_pid "$RUN1" vraw) new2=$(qsd_pid "$RUN2" vq)
[[ $new1 != "$old1" && $new2 != "$old2" ]] || e2e_fail "the supervisors did not restart the QSDs"
tr '\0' '\n' <"/proc/$new1/cmdline" | grep -q '"writethrough":false' ||
    e2e_fail "the restarted raw export is not write-back"
[[ $(count_console '^DONE write_errors=0 ioerr=0$') -eq 1 ]] ||
    e2e_fail "I/O errors: $(console '^DONE|WRITE-ERROR' | head)"
for d in vda vdb; do
    [[ $(count_console "^VERIFY disk=$d lost=0$") -eq 1 ]] ||
        e2e_fail "$d lost fsync'ed blocks: $(console "^VERIFY disk=$d|MISMATCH disk=$d" | head)"
done
log "40 fsync'ed blocks on each disk survived kill -9 of its QSD: $(console '^VERIFY' | tr '\n' ' ')"
echo "PASS"
