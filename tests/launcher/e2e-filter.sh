#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# End-to-end through qsd-vhost-filter: a TCG guest booted by qsd-vm-launcher
# (libvirt, memfd shared memory, reconnect as the launcher configures it)
# whose disk is a QSD export reached through the filter (the QSD's socket in
# a private directory, the filter's in the VM pod's volume directory).  The
# guest writes 40 fsync'ed blocks; the QSD is killed with SIGKILL after block
# 10 and restarted on its socket; QEMU reconnects through the filter; no
# write error, no lost block, the write cache can be turned on (SET_CONFIG);
# nothing refused; the guest memory regions libvirt's QEMU announced are
# logged (the filter refuses adjacent ones).
SRC=$(cd "$(dirname "$0")" && pwd)
source "$SRC/e2e-lib.sh"
: "${FILTER:?FILTER (the qsd-vhost-filter binary) must be set}"

guest "$SRC/../integration/guest-filter.sh"
PRIV=$WORK/private
mkdir -m 700 "$PRIV"
start_qsd vol1 64M "$PRIV/vol1" false 2
mkdir -p "$VOLS/vol1"
"$FILTER" --export "$VOLS/vol1/vhost.sock=$PRIV/vol1/vhost.sock" --queues 2 --log-level debug \
    >"$WORK/filter.log" 2>&1 &
PIDS+=($!)
"$PY" "$SRC/qmp.py" wait-socket "$VOLS/vol1/vhost.sock" 10 || e2e_fail "the filter did not listen"
cp "$PRIV/vol1/volume.json" "$VOLS/vol1/.volume.json.tmp"
mv "$VOLS/vol1/.volume.json.tmp" "$VOLS/vol1/volume.json"

vm_json filt '[{"volume": "vol1"}]'
start_launcher --shutdown-timeout 5
wait_console '^W 10$' 1 240
kill -KILL "${QSD_PID[vol1]}"
t_kill=$(now_ms)
log "QSD killed after $(count_console '^W ') blocks"
sleep 1
start_qsd vol1 64M "$PRIV/vol1" false 2
wait_console '^W 11$' 1 120
log "guest stall after kill -9 (QSD back after 1 s): $(( $(now_ms) - t_kill )) ms"
wait_console '^DONE ' 1 300
[[ $(count_console '^DONE write_errors=0 lost=0 ioerr=0$') -eq 1 ]] ||
    e2e_fail "I/O errors or lost blocks: $(console '^DONE|WRITE-ERROR|MISMATCH' | head)"
[[ $(count_console '^CACHE write_back$') -eq 1 ]] || e2e_fail "write cache: $(console '^CACHE')"
! grep -q 'msg=refused' "$WORK/filter.log" || e2e_fail "refused: $(grep msg=refused "$WORK/filter.log")"
n=$(grep -c 'msg=connected' "$WORK/filter.log" || true)
((n >= 2)) || e2e_fail "QEMU did not reconnect through the filter ($n connections)"
log "front-end requests: $(grep -o 'from=tenant channel=main request=[A-Z_]*' "$WORK/filter.log" |
    sed 's/.*request=//' | sort | uniq -c | tr -s ' \n' ' ')"
log "memory regions: $(grep -o 'request=\(SET_MEM_TABLE\|ADD_MEM_REG\).*regions=.*' "$WORK/filter.log" |
    sed 's/.*regions=//' | sort -u | tr '\n' ' ')"
echo PASS
