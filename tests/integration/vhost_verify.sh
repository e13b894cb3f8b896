#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# qsdctl verify against real QSD exports: raw and qcow2 pass; a QSD serving a
# different image fails with a precise message; a read-only export passes its
# read-only checks and refuses --write; a dead socket fails fast.
. "$(dirname "$0")/vhost_lib.sh"

qemu-img create -q -f raw "$T/a.raw" 64M
qemu-img create -q -f qcow2 "$T/b.qcow2" 80M

# raw: full check, then leave a seeded pattern and check it.
start_qsd a "$T/a.raw" raw ",writable=on"; A=$QSD_PID
expect_rc 0 "$QSDCTL" verify --size 64M --serial vhost_user_blk "$T/a.sock"
expect_rc 0 "$QSDCTL" verify --write --seed 42 "$T/a.sock"
expect_rc 0 "$QSDCTL" verify --check --seed 42 "$T/a.sock"
# the wrong seed and the wrong expectations are mismatches (exit 7)
expect_rc 7 "$QSDCTL" verify --check --seed 43 "$T/a.sock"
expect_rc 7 "$QSDCTL" verify --check --seed 42 --size 80M "$T/a.sock"
expect_rc 7 "$QSDCTL" verify --check --seed 42 --serial other "$T/a.sock"
# two queues, JSON output
out=$(timeout 60 "$QSDCTL" verify --json --check --seed 42 --queues 2 "$T/a.sock")
[ "$(json_field "$out" queues)" = 2 ] || fail "verify did not use 2 queues: $out"
stop_pid "$A"

# qcow2: full check
start_qsd b "$T/b.qcow2" qcow2 ",writable=on"; B=$QSD_PID
expect_rc 0 "$QSDCTL" verify --size 80M "$T/b.sock"
# a QSD serving a different image: the pattern of a.raw must not be found
rc=0
timeout 60 "$QSDCTL" verify --check --seed 42 "$T/b.sock" 2>"$T/wrong.err" || rc=$?
[ "$rc" -eq 7 ] || fail "verify against a different image: exit $rc, want 7"
grep -q "MISMATCH (chunk 0 of 64) at byte offset 8 (sector 0, byte 8" "$T/wrong.err" ||
    fail "imprecise mismatch message: $(cat "$T/wrong.err")"
grep -q "expected verify pattern of seed 42 for sector 0, found verify pattern of seed 1 for sector 0" "$T/wrong.err" ||
    fail "mismatch message does not say what was found: $(cat "$T/wrong.err")"
stop_pid "$B"

# the same image again (restart): pattern still there after QSD restart
start_qsd a "$T/a.raw" raw ",writable=on"; A=$QSD_PID
expect_rc 0 "$QSDCTL" verify --check --seed 42 "$T/a.sock"
# corrupt one sector behind the QSD's back (other process writing the file):
# verify names the offset.
stop_pid "$A"
off=$((64 * 1024 * 1024 - 65536 + 4096 + 1000))  # inside the last chunk
printf 'XXXX' | dd of="$T/a.raw" bs=1 seek=$off conv=notrunc status=none
start_qsd a "$T/a.raw" raw ",writable=on"; A=$QSD_PID
rc=0
timeout 60 "$QSDCTL" verify --check --seed 42 "$T/a.sock" 2>"$T/corrupt.err" || rc=$?
[ "$rc" -eq 7 ] || fail "verify of a corrupted sector: exit $rc, want 7"
grep -q "chunk 63 of 64) at byte offset $off " "$T/corrupt.err" ||
    fail "mismatch message does not give offset $off: $(cat "$T/corrupt.err")"
grep -q "1 of 128 sectors" "$T/corrupt.err" || fail "wrong bad-sector count: $(cat "$T/corrupt.err")"
stop_pid "$A"

# read-only export
start_qsd r "$T/a.raw" raw ""; R=$QSD_PID
out=$(timeout 30 "$QSDCTL" vhost-info --json "$T/r.sock")
[ "$(json_field "$out" read_only)" = True ] || fail "read-only export not reported: $out"
expect_rc 0 "$QSDCTL" verify "$T/r.sock"
expect_rc 2 "$QSDCTL" verify --write "$T/r.sock"
stop_pid "$R"

# a dead socket (nobody listening) fails at once with exit 3
start_qsd d "$T/a.raw" raw ""; D=$QSD_PID
kill -KILL "$D"; wait "$D" 2>/dev/null || true
t0=$(date +%s%N)
expect_rc 3 "$QSDCTL" verify "$T/d.sock"
expect_rc 3 "$QSDCTL" vhost-info "$T/missing.sock"
t1=$(date +%s%N)
[ $(( (t1 - t0) / 1000000 )) -lt 2000 ] || fail "connect to a dead socket was not fast"
echo PASS
