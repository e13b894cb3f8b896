#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# End-to-end: a TCG guest booted by qsd-vm-launcher with a volume served by a
# real qemu-storage-daemon.  Checks, in the guest: the disk with its size; data
# written lands in the image; kill -9 of QSD during fsync'ed writes, restart on
# the same path: no I/O error and all data verifies; a dead socket and a
# symlink out of the volumes directory are refused; a volume directory that
# appears in the bridge is hot-plugged and one that goes away is unplugged
# (x5, latency); a disk name already attached from the PVCs' directory that
# appears in the bridge too is refused and the attached disk stays;
# every free hot-plug slot can be filled (read-only, 4 KiB, 2 queues) and one
# more is refused; block_resize on QSD reaches the guest (x5, latency);
# removing the last disk lets the guest power off (exit 0).  The VM pod's
# layout: vol1 (the "PVC") in VOLS, hot-plugged volumes in BRIDGE, both
# read-only bind mounts in the launcher's mount namespace (e2e-lib.sh).
SRC=$(cd "$(dirname "$0")" && pwd)
source "$SRC/e2e-lib.sh"

guest "$SRC/guest-e2e.sh"
start_qsd vol1 64M "$VOLS/vol1"
vm_json e2e '[{"volume": "vol1"}]'
start_launcher --shutdown-timeout 5 --ready-timeout 3 --detach-timeout 30
log "launcher pid $LAUNCHER_PID"

wait_console '^DISK name=vda' 1 180
[[ $(count_console '^DISK name=vda serial=vhost_user_blk size=131072$') -eq 1 ]] ||
    e2e_fail "vda: unexpected serial/size: $(console '^DISK')"
grep -q "msg=\"disk attached\" volume=vol1 serial=pvc-e2e-vol1 target=vda size=67108864 .*at_start=1 dir=$VOLS$" "$WORK/launcher.log" ||
    e2e_fail "launcher did not report vol1 as vda"
log "vda present, 64 MiB"

# Crash survival: kill -9 QSD after block 10, restart at once on the same
# path (as the plugin's supervisor does, ~25 ms).  The longest single write
# in the guest is how long QEMU took to reconnect (<reconnect timeout>).
wait_console '^W 10$' 1 120
kill -KILL "${QSD_PID[vol1]}"
log "QSD killed after $(count_console '^W ') blocks"
start_qsd vol1 64M "$VOLS/vol1"
log "QSD restarted"
wait_console '^VERIFY ' 1 240
[[ $(count_console '^VERIFY write_errors=0 mismatches=0 ioerr=0$') -eq 1 ]] ||
    e2e_fail "data after QSD crash: $(console '^VERIFY|MISMATCH|WRITE-ERROR' | head)"
(($(count_console '^W ') == 48)) || e2e_fail "guest wrote $(count_console '^W ') blocks"
log "48 blocks verified after QSD kill -9 during writes: $(console '^VERIFY')"
wait_console '^STALL ' 1 10
stall_ms=$(console '^STALL ' | sed 's/.*max_write_ms=//')

# The data is in the image (read beside the running QSD: -U).
qemu-io -r -U -f qcow2 -c 'read -P 0x01 0 1M' -c 'read -P 0x0b 10M 1M' -c 'read -P 0x30 47M 1M' \
    "$WORK/vol1.qcow2" >"$WORK/qemu-io.out" 2>&1 || e2e_fail "qemu-io failed: $(cat "$WORK/qemu-io.out")"
! grep -q 'Pattern verification failed' "$WORK/qemu-io.out" || e2e_fail "image content: $(cat "$WORK/qemu-io.out")"
log "image holds the guest's data"

wait_console '^MONITOR-START' 1 60

# A socket nobody serves: refused after --ready-timeout, nothing hangs.
mkdir "$BRIDGE/.dead"
"$PY" -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])' "$BRIDGE/.dead/vhost.sock"
echo '{"version":1,"volume":"pvc-dead","size":1048576,"socket":"vhost.sock"}' >"$BRIDGE/.dead/volume.json"
mv "$BRIDGE/.dead" "$BRIDGE/dead"
wait_log 'msg="volume refused" volume=dead reason="socket does not accept connections' 10
rm -rf "$BRIDGE/dead"
log "dead socket refused"

# A symlink leading out of the volumes directory (to a volume that is
# otherwise perfectly ready): refused, never attached.
start_qsd outside 16M "$WORK/outside"
ln -s "$WORK/outside" "$BRIDGE/escape"
wait_log 'msg="volume refused" volume=escape reason="is a symlink \(symlinks are refused\)"' 10
rm "$BRIDGE/escape"
stop_pid "${QSD_PID[outside]}" TERM 10
log "symlink out of the volumes directory refused"

# The disk name of the attached vol1 (from VOLS) appearing in the bridge too
# (a perfectly ready volume): refused, logged, never attached; vda stays.
start_qsd twin 16M "$BRIDGE/.vol1"
dels=$(count_console '^DEL ')
mv "$BRIDGE/.vol1" "$BRIDGE/vol1"
wait_log "msg=\"volume refused\" volume=vol1 reason=\"also in $VOLS: a disk name must be in one volumes directory only\" dir=$BRIDGE" 10
sleep 1
(($(count_console '^DEL ') == dels)) || e2e_fail "vda went away when its name appeared in the bridge"
# (The guest's monitor reports vda itself once as ADD when it starts.)
(($(count_console '^ADD name=vd[b-z]') == 0)) || e2e_fail "the duplicate was attached: $(console '^ADD ')"
mv "$BRIDGE/vol1" "$WORK/twin.removed"
stop_pid "${QSD_PID[twin]}" TERM 10
log "duplicate disk name refused, vda kept"

# Hot-plug x5: the directory appears (atomic rename of a ready one) -> guest
# sees vdb; it goes away -> guest loses vdb.
plug=() unplug=()
for k in 1 2 3 4 5; do
    start_qsd vol2 32M "$BRIDGE/.vol2"
    t0=$(now_ms)
    mv "$BRIDGE/.vol2" "$BRIDGE/vol2"
    wait_console '^ADD name=vdb size=65536 serial=vhost_user_blk ro=0 lbs=512 queues=1$' "$k" 60
    plug+=($(($(now_ms) - t0)))
    t0=$(now_ms)
    mv "$BRIDGE/vol2" "$WORK/vol2.removed"
    wait_console '^DEL name=vdb' "$k" 60
    unplug+=($(($(now_ms) - t0)))
    stop_pid "${QSD_PID[vol2]}" TERM 10
    rm -rf "$WORK/vol2.removed"
    log "cycle $k: plug ${plug[-1]} ms, unplug ${unplug[-1]} ms"
done
grep -q "msg=\"disk attached\" volume=vol2 serial=pvc-e2e-vol2 target=vdb .* dir=$BRIDGE\$" "$WORK/launcher.log" ||
    e2e_fail "launcher did not report vol2 (bridge) as vdb"
(($(grep -c 'msg="disk detached" volume=vol2' "$WORK/launcher.log") == 5)) ||
    e2e_fail "launcher did not report 5 detaches"

# Fill every free hot-plug slot at once (hotplug_slots = 4; vol1 has its
# own root port), each volume with other properties: read-only, 4 KiB
# blocks, 2 queues.  One more is refused by libvirt (no free slot), logged,
# and nothing hangs.
start_qsd ro 16M "$BRIDGE/.ro" true
start_qsd lbs 16M "$BRIDGE/.lbs" false 1 4096
start_qsd mq 16M "$BRIDGE/.mq" false 2
start_qsd plain 16M "$BRIDGE/.plain"
start_qsd extra 16M "$BRIDGE/.extra"
adds=$(count_console '^ADD ')
for v in ro lbs mq plain; do mv "$BRIDGE/.$v" "$BRIDGE/$v"; done
wait_console '^ADD ' $((adds + 4)) 60
console '^ADD ' | tail -4 >"$WORK/adds"
grep -q 'size=32768 serial=vhost_user_blk ro=1 lbs=512 queues=1' "$WORK/adds" || e2e_fail "read-only disk: $(cat "$WORK/adds")"
grep -q 'size=32768 serial=vhost_user_blk ro=0 lbs=4096 queues=1' "$WORK/adds" || e2e_fail "4k disk: $(cat "$WORK/adds")"
# The guest (1 vCPU) uses one queue whatever is offered: check the domain.
grep -q "queues='2'" "$ROOT/run/qemu/e2e.xml" || e2e_fail "no 2-queue disk in the live XML"
mv "$BRIDGE/.extra" "$BRIDGE/extra"
wait_log 'msg="attach failed" volume=extra' 30
log "4 free slots filled (ro, 4k, 2 queues, plain); a 5th refused: $(grep -o 'msg="attach failed" volume=extra.*' "$WORK/launcher.log" | cut -c1-160)"
for v in ro lbs mq plain extra; do mv "$BRIDGE/$v" "$WORK/$v.removed"; done
wait_console '^DEL ' $((5 + 4)) 60
for v in ro lbs mq plain extra; do stop_pid "${QSD_PID[$v]}" TERM 10; done

# Online resize x5 through QSD's QMP; no libvirt call involved.
resize=()
for k in 1 2 3 4 5; do
    mib=$((64 + 16 * k))
    t0=$(now_ms)
    qmp vol1 block_resize "{\"node-name\": \"vol-vol1\", \"size\": $((mib * 1048576))}" >/dev/null
    wait_console "^SIZE name=vda size=$((mib * 2048))\$" 1 60
    resize+=($(($(now_ms) - t0)))
    log "resize to $mib MiB seen in ${resize[-1]} ms"
done

# Last disk removed -> the guest script ends -> guest powers off -> exit 0.
mv "$VOLS/vol1" "$WORK/vol1.removed"
wait_console '^BYE' 1 60
wait_launcher_exit 60
((EXIT_RC == 0)) || e2e_fail "launcher exit status $EXIT_RC, want 0 (poweroff)"
grep -q 'msg="vm ended" how=poweroff exit_status=0' "$WORK/launcher.log" || e2e_fail "no vm ended line"
# The only error expected is the dead socket's refusal.
unexpected=$(grep 'level=error' "$WORK/launcher.log" |
    grep -v 'msg="volume refused" volume=\(dead\|escape\|vol1\) \|msg="attach failed" volume=extra ' || true)
[[ -z $unexpected ]] || e2e_fail "errors logged: $unexpected"

# Closing figures, also kept in the build tree (ctest hides passing output).
{
    echo "# $(date -u +%FT%TZ) $LAUNCHER"
    echo "FIGURES hotplug_ms median=$(printf '%s\n' "${plug[@]}" | median) all=${plug[*]}"
    echo "FIGURES unplug_ms median=$(printf '%s\n' "${unplug[@]}" | median) all=${unplug[*]}"
    echo "FIGURES resize_ms median=$(printf '%s\n' "${resize[@]}" | median) all=${resize[*]}"
    echo "FIGURES qsd_kill_longest_write_ms=$stall_ms"
} | tee -a "$BUILD_CACHE/figures.txt"
echo "PASS"
