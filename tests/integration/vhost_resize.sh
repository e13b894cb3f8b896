#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# block_resize over QMP: a client that connects afterwards sees the new size,
# and a client connected during the resize gets the config-change notification.
. "$(dirname "$0")/vhost_lib.sh"

qemu-img create -q -f qcow2 "$T/v.qcow2" 32M
start_qsd v "$T/v.qcow2" qcow2 ",writable=on"
out=$(timeout 30 "$QSDCTL" vhost-info --json "$T/v.sock")
[ "$(json_field "$out" capacity)" = $((32 << 20)) ] || fail "initial capacity: $out"

# a connected client waiting for the notification (bounded: 10 s)
timeout 30 "$QSDCTL" vhost-info --json --wait-config-change-ms 10000 "$T/v.sock" \
    >"$T/waiter.out" 2>"$T/waiter.err" &
W=$!
for i in $(seq 100); do grep -q "waiting for a config change" "$T/waiter.err" && break; sleep 0.05; done
grep -q "waiting for a config change" "$T/waiter.err" || fail "waiting client did not connect"
# QSD serves one client at a time: a second one fails within its bound
# (exit 5: no answer; exit 1: connection queue full), it does not hang.
t0=$(date +%s%N)
rc=0; timeout 10 "$QSDCTL" vhost-info --timeout-ms 500 "$T/v.sock" 2>"$T/busy.err" || rc=$?
t1=$(date +%s%N)
[ $rc -eq 5 ] || [ $rc -eq 1 ] || fail "second client: exit $rc: $(cat "$T/busy.err")"
grep -q "one client at a time" "$T/busy.err" || fail "second client: unclear message: $(cat "$T/busy.err")"
[ $(( (t1 - t0) / 1000000 )) -lt 3000 ] || fail "second client was not bounded by --timeout-ms"
qmp "$T/v.qmp" '{"execute":"block_resize","arguments":{"node-name":"v","size":100663296}}' >/dev/null ||
    fail "block_resize failed"
rc=0; wait "$W" || rc=$?
[ $rc -eq 0 ] || fail "connected client: exit $rc: $(cat "$T/waiter.err")"
out=$(cat "$T/waiter.out")
[ "$(json_field "$out" capacity)" = 100663296 ] || fail "connected client did not see 96M: $out"
[ "$(json_field "$out" config_changes)" -ge 1 ] || fail "no config change counted: $out"

# a client that connects after the resize
out=$(timeout 30 "$QSDCTL" vhost-info --json "$T/v.sock")
[ "$(json_field "$out" capacity)" = 100663296 ] || fail "new client did not see 96M: $out"
# and the whole new size is usable
timeout 60 "$QSDCTL" verify --size 96M "$T/v.sock" || fail "verify after resize"

# no notification: the bounded wait expires with exit 5
expect_rc 5 "$QSDCTL" vhost-info --wait-config-change-ms 300 "$T/v.sock"
echo PASS
