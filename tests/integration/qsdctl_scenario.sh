#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The qsdctl scenario against a real qemu-storage-daemon (issue 2, part 6):
# bad input -> nothing created; create -> export -> connect -> resize (QSD and a
# new client see it) -> live snapshot -> restore with the same content -> stop;
# kill -9 of the QSD -> restarted on the same socket within 2 s; restart of the
# supervisor -> the running QSD is adopted, not duplicated.
source "$(dirname "$0")/lib.sh"
require_qsd
q() { "$QSDCTL" "$@"; }

echo "# bad input: clear error, nothing created"
long=$(printf 'a%.0s' {1..129})
expect_fail 2 "is empty"              -- q create "" --size 1M
expect_fail 2 "contains '/'"          -- q create a/b --size 1M
expect_fail 2 "contains '..'"         -- q create a..b --size 1M
expect_fail 2 "must start with"       -- q create .x --size 1M
expect_fail 2 "control character"     -- q create "$(printf 'a\001b')" --size 1M
expect_fail 2 "longer than 128"       -- q create "$long" --size 1M
expect_fail 2 "invalid size 0"        -- q create v0 --size 0
expect_fail 2 "multiple of the logical block size" -- q create v0 --size 1000
expect_fail 2 "too large"             -- q create v0 --size 99999999999999999999
expect_fail 2 "too large"             -- q create v0 --size 16777216T
expect_fail 2 "maximum of 1 PiB"      -- q create v0 --size 2P
expect_fail 2 "invalid format"        -- q create v0 --size 1M --format vmdk
expect_fail 2 "invalid preallocation" -- q create v0 --size 1M --format raw --preallocation metadata
expect_fail 2 "unrecognized option"   -- q create v0 --size 1M --colour blue
expect_fail 2 "unknown command"       -- q frobnicate
expect_fail 3 "does not exist"        -- q export nosuch
expect_fail 2 "invalid snapshot name" -- q snapshot v0 "x/y"
check "nothing left in the pool after bad input" \
    test -z "$(find "$T/pool" -type f 2>/dev/null)"

echo "# create and export"
q create v1 --size 64M >/dev/null || bad "create v1"
qemu-io -f qcow2 -c 'write -P 0xab 0 1M' -c 'write -P 0xcd 60M 1M' "$T/pool/volumes/v1.qcow2" >/dev/null \
    || bad "write pattern into v1"
expect_fail 2 "num-queues"      -- q export v1 --num-queues 0
expect_fail 2 "aio=native needs O_DIRECT" -- q export v1 --aio native --cache writeback
check "a refused export leaves no runtime state" test ! -e "$T/run/ctl/v1/qsd.json"
out=$(q --json export v1 --num-queues 2) || bad "export v1"
sock=$(json_get socket <<<"$out"); pid1=$(json_get pid <<<"$out")
check "socket is where the layout says" test "$sock" = "$T/run/exports/v1/vhost.sock"
check "socket is a socket, mode 0660" test "$(stat -c %A "$sock")" = "srw-rw----"
check "export dir is 0750 (not world-accessible)" test "$(stat -c %a "$T/run/exports/v1")" = 750
check "QMP socket is not in the exported directory" test -S "$T/run/ctl/v1/qmp.sock"
check "ctl dir is private to the plugin and the volume's QSD (sticky, its group)" \
    test "$(stat -c %a:%u "$T/run/ctl/v1")" = 1770:0 -a "$(stat -c %g "$T/run/ctl/v1")" != 0
check "volume.json describes the export" \
    test "$(json_get size <"$T/run/exports/v1/volume.json"):$(json_get num_queues <"$T/run/exports/v1/volume.json")" = "67108864:2"
check "status shows the QSD accepting" test "$(q --json status v1 | json_get socket_accepts)" = true
check "a vhost-user client connects and sees 64 MiB" \
    test "$(q --json vhost-info "$sock" | json_get capacity)" = 67108864
out=$(q --json export v1); check "export is idempotent" test "$(json_get already_exported <<<"$out")" = true

echo "# online resize"
expect_fail 2 "refusing to shrink" -- q resize v1 --size 32M
q resize v1 --size 128M >/dev/null || bad "resize v1"
check "QSD reports the new size" test "$(q --json status v1 | json_get size)" = 134217728
check "volume.json follows the resize" test "$(json_get size <"$T/run/exports/v1/volume.json")" = 134217728
check "a client connecting after the resize sees 128 MiB" \
    test "$(q --json vhost-info "$sock" | json_get capacity)" = 134217728

echo "# live snapshot and restore"
out=$(q --json snapshot v1 s1) || bad "snapshot v1 s1"
check "snapshot was taken through the live QSD" test "$(json_get live <<<"$out")" = true
expect_fail 4 "already exists" -- q snapshot v1 s1
q create v2 --from-snapshot s1 >/dev/null || bad "create v2 from s1"
check "restored volume has the snapshot's size" test "$(q --json status v2 | json_get size)" = 134217728
check "restored volume has the same content (qemu-img compare)" \
    qemu-img compare -q -f qcow2 -F qcow2 "$T/pool/snapshots/s1.qcow2" "$T/pool/volumes/v2.qcow2"
check "pattern survives in the restored volume" \
    sh -c "qemu-io -f qcow2 -c 'read -P 0xab 0 1M' -c 'read -P 0xcd 60M 1M' '$T/pool/volumes/v2.qcow2' | grep -c '^read' | grep -qx 2"
out=$(q --json export v2 --read-only) || bad "export v2 read-only"
check "read-only export recorded" test "$(q --json status v2 | json_get options.read-only)" = true
q unexport v2 >/dev/null || bad "unexport v2"

echo "# offline operations"
out=$(q --json resize v2 --size 192M) || bad "offline resize v2"
check "offline resize" test "$(json_get online <<<"$out"):$(q --json status v2 | json_get size)" = "false:201326592"
out=$(q --json snapshot v2 s2) || bad "offline snapshot v2"
check "offline snapshot" test "$(json_get live <<<"$out")" = false
check "offline snapshot content" \
    qemu-img compare -q -f qcow2 -F qcow2 "$T/pool/volumes/v2.qcow2" "$T/pool/snapshots/s2.qcow2"
q snapshot-delete s2 >/dev/null || bad "snapshot-delete s2"
expect_fail 3 "does not exist" -- q snapshot-delete s2

echo "# a QSD that cannot start or hangs: its own error / a bounded wait, nothing left"
printf '#!/bin/sh\necho "qemu-storage-daemon: fake failure for the test" >&2\nexit 1\n' >"$T/failing-qsd"
# The fake runs confined (its own uid, /tmp hidden): it can write nowhere of
# ours, so it names its PID in its log, whose last line the error quotes.
printf '#!/bin/sh\necho "fake qsd pid=$$" >&2\nexec sleep 30\n' >"$T/hanging-qsd"
chmod +x "$T/failing-qsd" "$T/hanging-qsd"
expect_fail 6 "fake failure for the test" -- q --qsd-binary "$T/failing-qsd" export v2
check "failed start leaves no runtime state" test ! -e "$T/run/ctl/v2" -a ! -e "$T/run/exports/v2"
out=$(q --qsd-binary "$T/hanging-qsd" export v2 --timeout 300 2>&1); rc=$?
check "a hung start times out (exit $rc): $(head -1 <<<"$out")" \
    test "$rc:$(grep -c 'did not accept connections within 300 ms' <<<"$out")" = 5:1
hung=$(sed -n 's/.*fake qsd pid=\([0-9][0-9]*\).*/\1/p' <<<"$out" | head -1)
# gone = no such process, or a zombie its new parent has not reaped yet
gone() { [[ ! -e /proc/$1 ]] || [[ $(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1) == [ZX] ]]; }
check "the hung QSD named its pid in the error (${hung:-none})" test -n "$hung"
check "the hung QSD (the filter head's child) is gone when qsdctl returns" gone "$hung"
check "timed-out start leaves no runtime state" test ! -e "$T/run/ctl/v2"
expect_fail 3 "cannot start qemu-storage-daemon: No such file" -- q --qsd-binary "$T/nonexistent-qsd" export v2

echo "# a resize right after export (no VM ever connected) must not crash QSD 10.0.2"
q export v2 >/dev/null || bad "export v2"
pidv2=$(q --json status v2 | json_get pid)
q resize v2 --size 200M >/dev/null || bad "resize v2 right after export"
check "QSD alive after a resize with no client ever connected" kill -0 "$pidv2"
q unexport v2 >/dev/null || bad "unexport v2"

echo "# the readiness probe never brings a QSD down (QSD 10.0.2's double close: qsd.c probe_step)"
# An export used to abort QSD about once in 100 (the probe of the read-only
# export accepted while the read-write one's probe hung up): 30 in a row, each
# QSD still running and serving right after its export returned.
lost=0
for i in $(seq 30); do
    q export v2 >/dev/null || { lost=$((lost + 1)); continue; }
    st=$(q --json status v2)
    [[ $(json_get exported <<<"$st") == true && $(json_get socket_accepts <<<"$st") == true ]] ||
        { lost=$((lost + 1)); tail -n 5 "$T/run/ctl/v2/qsd.log"; }
    q unexport v2 >/dev/null || lost=$((lost + 1))
done
check "30 exports in a row: every QSD alive and serving right after (lost: $lost)" test "$lost" = 0

echo "# supervision: kill -9 -> restart on the same socket within 2 s"
"$QSDCTL" supervise --scan-interval 200 >"$T/sup.log" 2>&1 &
sup=$!; BG_PIDS+=("$sup")
wait_until 5 grep -q "adopted volume=v1" "$T/sup.log" || bad "supervisor adopted v1"
kill -9 "$pid1"
t0=$(date +%s%N)
restarted() { local p; p=$(q --json status v1 | json_get pid) && [[ $p != "$pid1" ]] &&
              [[ $(q --json status v1 | json_get socket_accepts) == true ]]; }
if wait_until 2 restarted; then
    ok "restarted and accepting in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
else
    bad "QSD not restarted within 2 s"; cat "$T/sup.log"
fi
pid2=$(q --json status v1 | json_get pid)
check "same socket path after restart" test -S "$sock"
check "the data is still there after the crash" \
    test "$(q --json status v1 | json_get size)" = 134217728

echo "# restart of the controlling process: adopt, never duplicate"
kill "$sup"; wait "$sup"; rc=$?
check "supervisor exits 0 on SIGTERM" test "$rc" = 0
check "QSD survives its supervisor" kill -0 "$pid2"
"$QSDCTL" supervise --scan-interval 200 >"$T/sup2.log" 2>&1 &
sup=$!; BG_PIDS+=("$sup")
wait_until 5 grep -q "adopted volume=v1 pid=$pid2" "$T/sup2.log" || bad "second supervisor adopted pid $pid2"
sleep 0.5
check "exactly one QSD serves v1" test "$(qsd_pids_under "$T/run/ctl/v1/" | wc -l)" = 1

echo "# stop while supervised: not restarted"
q unexport v1 >/dev/null || bad "unexport v1"
sleep 1
check "no QSD left for v1" test -z "$(qsd_pids_under "$T/run/ctl/v1/")"
check "runtime dirs removed" test ! -e "$T/run/exports/v1" -a ! -e "$T/run/ctl/v1"
check "supervisor did not restart it" sh -c "! grep -q 'restarts=2' '$T/sup2.log'"

echo "# cleanup"
q delete v1 >/dev/null && q delete v2 >/dev/null && q snapshot-delete s1 >/dev/null || bad "delete"
check "pool is empty" test -z "$(find "$T/pool" -type f)"
finish
