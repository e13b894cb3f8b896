#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The vhost-user filter's cost, measured: the same QSD export read and written
# by qsdctl's vhost-user-blk client directly and through qsd-vhost-filter,
# interleaved (direct, filter, direct, ...), ROUNDS rounds, with the CPU
# pressure (/proc/pressure/cpu, some avg10) before each run.  Also the
# connection setup (qsdctl vhost-info: connect, negotiate, GET_CONFIG), the
# only part that crosses the filter, and the filter's CPU time (clock ticks)
# during each benchmark through it.  Prints a table; nothing is kept.
# usage: scripts/bench-vufilter.sh BUILD_DIR [ROUNDS] [RUNTIME_MS]
set -euo pipefail
B=$(cd "${1:?usage: bench-vufilter.sh BUILD_DIR [ROUNDS] [RUNTIME_MS]}" && pwd)
ROUNDS=${2:-3} RUNTIME=${3:-2000}
QSDCTL=$B/qsdctl/qsdctl FILTER=$B/qsdctl/qsd-vhost-filter
T=$(mktemp -d /tmp/qsd-vfbench.XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$T"' EXIT
dd if=/dev/urandom of="$T/d.raw" bs=1M count=256 status=none
/usr/bin/qemu-storage-daemon \
    --blockdev "driver=file,node-name=f,filename=$T/d.raw,cache.direct=on,aio=io_uring" \
    --blockdev "driver=raw,node-name=d,file=f" \
    --export "type=vhost-user-blk,id=e,node-name=d,addr.type=unix,addr.path=$T/d.sock,num-queues=2,writable=on" \
    >"$T/qsd.log" 2>&1 &
QSD=$!; PIDS+=($QSD)
"$FILTER" --export "$T/f.sock=$T/d.sock" --queues 2 >"$T/filter.log" 2>&1 &
FPID=$!; PIDS+=($FPID)
for i in $(seq 100); do [ -S "$T/d.sock" ] && [ -S "$T/f.sock" ] && break; sleep 0.05; done
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; } # utime + stime
psi() { sed -n 's/^some avg10=\([0-9.]*\).*/\1/p' /proc/pressure/cpu 2>/dev/null || echo n/a; }
setup_ms() { # median of 21 connects
    for i in $(seq 21); do
        s=$(date +%s%N); "$QSDCTL" vhost-info "$1" >/dev/null; e=$(date +%s%N)
        echo $(( (e - s) / 1000 ))
    done | sort -n | sed -n 11p
}
printf '%-6s %-6s %-9s %-18s %10s %9s %9s\n' round path psi_avg10 test iops p50_us p99_us
for r in $(seq "$ROUNDS"); do
    for path in direct filter; do
        sock=$T/d.sock; [ $path = filter ] && sock=$T/f.sock
        p=$(psi) c0=$(cpu_ticks "$FPID")
        "$QSDCTL" bench --json --queues 2 --runtime-ms "$RUNTIME" --ramp-ms 300 --qsd-pid "$QSD" \
            "$sock" 2>/dev/null >"$T/r.json"
        /usr/bin/python3 - "$T/r.json" "$r" "$path" "$p" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for t in j["results"]:
    print(f"{sys.argv[2]:<6} {sys.argv[3]:<6} {sys.argv[4]:<9} {t['test']:<18} "
          f"{t['iops']:>10.0f} {t['p50_us']:>9.1f} {t['p99_us']:>9.1f}")
PY
        [ $path = filter ] && echo "$r filter_cpu_ticks_during_bench=$(( $(cpu_ticks "$FPID") - c0 ))"
    done
    echo "$r setup_us direct=$(setup_ms "$T/d.sock") filter=$(setup_ms "$T/f.sock") psi=$(psi)"
done
