#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# End-to-end: a libvirt call that does not return is bounded and the
# launcher stays responsive (docs/launcher.md "When libvirt does not
# return").  A TCG guest watches its disks (guest-bridge.sh).
#   1. The QSD of volume "slow" is stopped (SIGSTOP) just before its directory
#      appears in the bridge: the probe still connects (the kernel queues it),
#      QEMU blocks in device realize and libvirt's attach does not return.
#      Within --libvirt-timeout (+ slack) the launcher logs "attach timed out",
#      and the report shows slow as attach-timed-out.
#   2. Meanwhile the launcher serves: a console client attaches and detaches;
#      volume "other" (id with '.' and '_') that appears is deferred with a
#      reason naming the stuck call (log and report), not lost.
#   3. SIGCONT: the stuck attach completes; the launcher adopts it ("disk
#      attached volume=slow ... late=1"), then attaches the deferred volume;
#      the guest sees both disks; the report lists both, nothing else.
#   4. Unplug of "other" (its alias escapes '.' and '_') completes in the guest.
#   5. A second stuck attach (slow2), then SIGTERM: the shutdown request is
#      not sent (libvirt busy), the guest is destroyed after
#      --shutdown-timeout, the launcher exits 3 and no QEMU is left.
SRC=$(cd "$(dirname "$0")" && pwd)
source "$SRC/e2e-lib.sh"
BOUND_S=3

report() { # python expression over the report r: must be true
    "$PY" - "$ROOT/guest-disks.json" "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
na = {v["volume"]: v for v in r["not_attached"]}
disks = {d["volume"]: d for d in r["disks"]}
sys.exit(0 if eval(sys.argv[2]) else 1)
PY
}
wait_report() { # EXPR TIMEOUT_S
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        report "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    e2e_fail "report: not ($1) within $2 s: $(cat "$ROOT/guest-disks.json")"
}

guest "$SRC/guest-bridge.sh"
start_qsd vol1 16M "$VOLS/vol1"
vm_json stuck '[{"volume": "vol1"}]'
start_launcher --libvirt-timeout $BOUND_S --ready-timeout 60 --shutdown-timeout 3 --detach-timeout 20
wait_console '^MONITOR-START' 1 180
log "guest up"

# 1. A stuck attach is bounded and reported.
start_qsd slow 16M "$BRIDGE/.slow"
kill -STOP "${QSD_PID[slow]}"
t0=$(now_ms)
mv "$BRIDGE/.slow" "$BRIDGE/slow"
wait_log 'msg="attach timed out" volume=slow bound_ms=3000' $((BOUND_S + 10))
elapsed=$(($(now_ms) - t0))
((elapsed >= BOUND_S * 1000 && elapsed < (BOUND_S + 10) * 1000)) ||
    e2e_fail "attach timed out after $elapsed ms, bound $BOUND_S s"
wait_report 'na["slow"]["state"] == "attach-timed-out" and "slow" not in disks' 5
log "stuck attach reported after $elapsed ms (bound ${BOUND_S} s)"

# 2. Responsive: the console, and a new volume deferred with a reason.
attached=$(grep -c 'msg="console attached"' "$WORK/launcher.log" || true)
(sleep 0.5) | timeout 10 "$LAUNCHER" console --root "$ROOT" >"$WORK/console-client.out" 2>&1 ||
    e2e_fail "console client failed: $(cat "$WORK/console-client.out")"
(($(grep -c 'msg="console attached"' "$WORK/launcher.log") == attached + 1)) ||
    e2e_fail "console did not attach while libvirt was stuck"
wait_log 'msg="console detached"' 5
VOLUME_ID=pvc.e2e.other_1 start_qsd other 16M "$BRIDGE/.other"
mv "$BRIDGE/.other" "$BRIDGE/other"
wait_log 'msg="attach deferred" volume=other reason="libvirt busy: \\"attach volume=slow\\" has not returned' 10
wait_report 'na["other"]["state"] == "pending" and "attach volume=slow" in na["other"]["reason"]' 5
! grep -q 'msg="disk attached" volume=\(slow\|other\)' "$WORK/launcher.log" ||
    e2e_fail "attached while libvirt was stuck?"
(($(count_console '^ADD name=vd[b-z]') == 0)) || e2e_fail "the guest saw a disk already"
log "console served and 'other' deferred while libvirt was stuck"

# 3. SIGCONT: the late attach is adopted, the deferred one follows.
kill -CONT "${QSD_PID[slow]}"
wait_log 'msg="disk attached" volume=slow serial=pvc-e2e-slow .* late=1 ' 30
wait_log 'msg="disk attached" volume=other serial=pvc.e2e.other_1 ' 30
wait_console '^ADD name=vd[b-z]' 2 60
wait_report '"slow" in disks and "other" in disks and not na' 5
grep -q "<alias name='ua-pvc_de2e_dother__1'/>" "$ROOT/run/qemu/stuck.xml" ||
    e2e_fail "the live XML lacks other's alias: $(grep -o "<alias name='[^']*'/>" "$ROOT/run/qemu/stuck.xml" | tr '\n' ' ')"
log "after SIGCONT: slow adopted (late), other attached; the guest sees both"

# 4. Unplug of the volume whose id holds '.' and '_' (by its escaped alias).
dels=$(count_console '^DEL ')
mv "$BRIDGE/other" "$WORK/other.removed"
wait_log 'msg="disk detached" volume=other' 30
wait_console '^DEL name=vd[b-z]' $((dels + 1)) 30
wait_report '"other" not in disks and "slow" in disks' 5
log "'other' (id pvc.e2e.other_1) unplugged"

# 5. Stop while a libvirt call is stuck: destroyed after --shutdown-timeout.
start_qsd slow2 16M "$BRIDGE/.slow2"
kill -STOP "${QSD_PID[slow2]}"
mv "$BRIDGE/.slow2" "$BRIDGE/slow2"
wait_log 'msg="attach timed out" volume=slow2' $((BOUND_S + 10))
stop_destroyed stuck 3 \
    'msg="shutdown request not sent" reason="libvirt busy: attach volume=slow2 has not returned"'
kill -CONT "${QSD_PID[slow2]}"
log "SIGTERM while libvirt was stuck -> destroyed after $ELAPSED_MS ms, exit 3"
# The only errors expected: the two timed-out attaches, once each.
unexpected=$(grep 'level=error' "$WORK/launcher.log" | grep -v 'msg="attach timed out" volume=slow2\? ' || true)
[[ -z $unexpected ]] || e2e_fail "errors logged: $unexpected"
echo PASS
