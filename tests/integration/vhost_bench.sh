#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# qsdctl bench smoke test: both engines run every test briefly and produce
# JSON with sane numbers (the measurement itself is scripts/bench.sh's job).
. "$(dirname "$0")/vhost_lib.sh"

dd if=/dev/zero of="$T/b.raw" bs=1M count=16 status=none
check() {
    "$PY" - "$1" "$2" <<'PYEOF'
import json, sys
j = json.loads(open(sys.argv[1]).read())
assert j["engine"] == sys.argv[2], j
assert len(j["results"]) == 5, j
for r in j["results"]:
    assert r["ops"] > 0 and r["iops"] > 0 and r["p99_us"] >= r["p50_us"] > 0, r
    if sys.argv[2] == "vhost-user-blk":
        assert r["qsd_cpu_us_per_io"] is not None and r["qsd_cpu_us_per_io"] > 0, r
PYEOF
}
timeout 60 "$QSDCTL" bench --json --runtime-ms 200 --ramp-ms 50 "$T/b.raw" >"$T/file.json" 2>"$T/file.log" ||
    fail "bench on a file: $(cat "$T/file.log")"
check "$T/file.json" io_uring || fail "bad file result: $(cat "$T/file.json")"

start_qsd v "$T/b.raw" raw ",writable=on"
timeout 60 "$QSDCTL" bench --json --queues 2 --runtime-ms 200 --ramp-ms 50 "$T/v.sock" \
    >"$T/vhost.json" 2>"$T/vhost.log" || fail "bench on vhost: $(cat "$T/vhost.log")"
check "$T/vhost.json" vhost-user-blk || fail "bad vhost result: $(cat "$T/vhost.json")"
# the data path is still sound after the benchmark's writes
timeout 60 "$QSDCTL" verify --queues 2 "$T/v.sock" || fail "verify after bench"
expect_rc 2 "$QSDCTL" bench --tests nosuchtest "$T/v.sock"
echo PASS
