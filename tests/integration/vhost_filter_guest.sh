#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A real QEMU front-end (vhost-user-blk-pci, memfd shared memory as libvirt
# configures it for our VMs, reconnect on) in a TCG guest, through
# qsd-vhost-filter to a QSD: the guest writes fsync'ed blocks while the QSD
# is killed with SIGKILL and restarted on its socket; QEMU reconnects through
# the filter; no write error, no lost block.  The filter logs every message
# it passed (debug): the test checks that the front-end used nothing outside
# the allow-list and records the memory regions it announced (adjacency).
# The guest's stall (the kill to the next block written) is printed; with
# VIA=direct the same run goes without the filter, for comparison.
. "$(dirname "$0")/vhost_lib.sh"
FILTER=${FILTER:?FILTER must point at qsd-vhost-filter}
[ -x "$FILTER" ] || { echo "SKIP: qsd-vhost-filter not built"; exit 77; }
QEMU=${QEMU_BIN:-/usr/bin/qemu-system-x86_64}
[ -x "$QEMU" ] || { echo "SKIP: $QEMU not installed"; exit 77; }
CACHE=${BUILD_CACHE:?BUILD_CACHE (the guest cache dir) must be set}
rc=0; bash "$(dirname "$0")/../guest/build-guest.sh" "$CACHE" \
    "$(dirname "$0")/guest-filter.sh" "$T/initrd.img" >"$T/build-guest.log" 2>&1 || rc=$?
[ $rc -eq 77 ] && { echo "SKIP: no guest: $(cat "$T/build-guest.log")"; exit 77; }
[ $rc -eq 0 ] || fail "build-guest: $(cat "$T/build-guest.log")"

mkdir -m 700 "$T/private"
qemu-img create -q -f raw "$T/d.raw" 64M
run_qsd() {
    "$QSD_BIN" \
        --blockdev "driver=file,node-name=f,filename=$T/d.raw,cache.direct=on,aio=io_uring" \
        --blockdev "driver=raw,node-name=d,file=f" \
        --export "type=vhost-user-blk,id=e,node-name=d,addr.type=unix,addr.path=$T/private/d.sock,num-queues=2,writable=on" \
        >>"$T/qsd.log" 2>&1 &
    QSD_PID=$!
    QSD_PIDS+=("$QSD_PID")
}
run_qsd
"$FILTER" --export "$T/vm.sock=$T/private/d.sock" --queues 2 --log-level debug >"$T/filter.log" 2>&1 &
FILTER_PID=$!
QSD_PIDS+=("$FILTER_PID")
for i in $(seq 100); do listening "$T/vm.sock" && listening "$T/private/d.sock" && break; sleep 0.05; done

VM_SOCK=$T/vm.sock
[ "${VIA:-filter}" = direct ] && VM_SOCK=$T/private/d.sock
"$QEMU" -machine q35,accel=tcg,memory-backend=mem -m ${VM_MEM:-256M} -smp 2 \
    -object memory-backend-memfd,id=mem,size=${VM_MEM:-256M},share=on \
    -kernel "$CACHE/vmlinuz" -initrd "$T/initrd.img" \
    -append "console=ttyS0 panic=-1 quiet" -no-reboot \
    -display none -monitor none -serial "file:$T/console.log" \
    -chardev "socket,id=vu,path=$VM_SOCK,reconnect-ms=1000" \
    -device vhost-user-blk-pci,chardev=vu,num-queues=2 >"$T/qemu.log" 2>&1 &
VM=$!
QSD_PIDS+=("$VM")
t0=$(date +%s)
killed=0
while kill -0 "$VM" 2>/dev/null; do
    [ $(( $(date +%s) - t0 )) -lt 400 ] || fail "guest did not finish in 400 s: $(tail -5 "$T/console.log")"
    if [ $killed -eq 0 ] && grep -q '^W 10' "$T/console.log" 2>/dev/null; then
        kill -KILL "$QSD_PID"; wait "$QSD_PID" 2>/dev/null || true
        kill_ns=$(date +%s%N)
        sleep 1
        run_qsd
        killed=1
        echo "killed the QSD after block 10 and restarted it"
    fi
    if [ $killed -eq 1 ] && [ -z "${stall_ms:-}" ] && grep -q '^W 11' "$T/console.log"; then
        stall_ms=$(( ($(date +%s%N) - kill_ns) / 1000000 ))
    fi
    sleep 0.2
done
grep -E '^(DISK|CACHE|DONE|MISMATCH|WRITE-ERROR|FAIL)' "$T/console.log" || true
echo "stall after kill -9 (kill to the next block written, 0.2 s resolution, QSD restarted after 1 s): ${stall_ms:-?} ms via ${VIA:-filter}"
[ $killed -eq 1 ] || fail "the guest never reached block 10: $(tail -5 "$T/console.log")"
grep -q '^DONE write_errors=0 lost=0 ioerr=0' "$T/console.log" || fail "data lost or I/O errors"
grep -q '^CACHE write_back' "$T/console.log" || fail "the guest could not turn the write cache on"
grep -q '^DISK size=131072 queues=2' "$T/console.log" || fail "disk size or queues wrong"
if [ "${VIA:-filter}" = direct ]; then echo PASS; exit 0; fi
grep -q 'msg=refused' "$T/filter.log" && fail "the filter refused the real front-end: $(grep msg=refused "$T/filter.log")"
echo "front-end requests seen:"
grep -o 'from=tenant channel=main request=[A-Z_]*' "$T/filter.log" | sort | uniq -c
echo "memory regions announced:"
grep -o 'request=\(SET_MEM_TABLE\|ADD_MEM_REG\).*regions=.*' "$T/filter.log" | sort | uniq -c
n=$(grep -c 'msg=connected' "$T/filter.log")
[ "$n" -ge 2 ] || fail "QEMU did not reconnect through the filter ($n connections)"
echo "connections through the filter: $n"
echo PASS
