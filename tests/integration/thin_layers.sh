#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Thin layers through qsdctl (real qemu-img and QSD): offline snapshots up to
# the chain bound (the one that would pass 16 merges first, with qemu-img
# rebase), each snapshot and restore holding its data; an explicit offline
# flatten; a live snapshot into a QSD without iothread, and a copy (not a
# graph change) for an export with one; garbage collection in every order.
. "$(dirname "$0")/lib.sh"

q() { timeout 120 "$QSDCTL" "$@"; }
sock() { echo "$T/run/exports/$1/vhost.sock"; }
depth() { q --json list | python3 -c 'import json,sys
print([v["depth"] for v in json.load(sys.stdin)["volumes"] if v["volume"] == sys.argv[1]][0])' "$1"; }
vcheck() { local v=$1 seed=$2 out; out=$(q export "$v" --no-iothread 2>&1) || { echo "$out"; return 1; }
    timeout 60 "$QSDCTL" verify --check --seed "$seed" --chunks 16 --chunk-size 65536 "$(sock "$v")" >/dev/null 2>&1
    local rc=$?; q unexport "$v" >/dev/null; return $rc; }
vwrite() { q export "$1" --no-iothread >/dev/null &&
    timeout 60 "$QSDCTL" verify --write --seed "$2" --chunks 16 --chunk-size 65536 "$(sock "$1")" >/dev/null 2>&1
    local rc=$?; q unexport "$1" >/dev/null; return $rc; }

echo "# offline snapshots up to the bound"
q create v --size 64M >/dev/null || bad "create"
for i in $(seq 1 17); do
    vwrite v "$i" || bad "write round $i"
    q snapshot v "s$i" >/dev/null || bad "snapshot s$i"
done
d=$(depth v)
check "chain depth stays within 16 after 17 offline snapshots (now $d)" test "$d" -le 16
check "the snapshot that would pass 16 merged first (depth fell)" test "$d" -lt 16
for i in 1 9 17; do
    q create "r$i" --from-snapshot "s$i" >/dev/null || bad "restore s$i"
    check "restore of s$i holds round $i" vcheck "r$i" "$i"
done
check "the volume still holds round 17" vcheck v 17

echo "# offline flatten"
q merge v --depth 1 >/dev/null || bad "merge --depth 1"
check "flattened: depth 1" test "$(depth v)" = 1
check "flattened volume holds round 17" vcheck v 17
check "a restore still reads its snapshot after the flatten" vcheck r9 9

echo "# live: no iothread = thin, iothread = a full copy"
q export v --no-iothread >/dev/null || bad "export"
out=$(q snapshot v live1) || bad "live snapshot"
grep -q "layer L" <<<"$out" && ok "live thin snapshot: $out" || bad "not thin: $out"
q unexport v >/dev/null
q export v >/dev/null || bad "export with iothread"
out=$(q snapshot v live2) || bad "live snapshot with iothread"
grep -q "layer L" <<<"$out" && bad "thin in an iothread: $out" || ok "iothread export: a copy: $out"
check "the copy is standalone (one link)" test "$(stat -c %h "$T/pool/snapshots/live2.qcow2")" = 1
q unexport v >/dev/null

echo "# garbage collection"
n=$(ls "$T/pool/layers" | wc -l)
for i in $(seq 1 17); do q snapshot-delete "s$i" >/dev/null || bad "delete s$i"; done
check "restores keep their layers after their snapshots are deleted" vcheck r1 1
q delete v >/dev/null || bad "delete v"
check "r17 still reads round 17" vcheck r17 17
for v in r1 r9 r17; do q delete "$v" >/dev/null || bad "delete $v"; done
q snapshot-delete live1 >/dev/null; q snapshot-delete live2 >/dev/null
check "no layer left (there were $n)" test -z "$(ls "$T/pool/layers")"
check "pool is empty" test -z "$(find "$T/pool" -type f)"

echo "$((CHECKS - FAILURES)) passed, $FAILURES failed"
[[ $FAILURES -eq 0 ]]
