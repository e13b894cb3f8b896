# SPDX-License-Identifier: Apache-2.0
# vhost_lib.sh: helpers for the vhost-user-blk integration tests (sourced).
# Each test gets a private temp dir, removed by an EXIT trap together with any
# QSD it started (stopped by PID, never by name).  Every wait is bounded.
set -euo pipefail

QSDCTL=${QSDCTL:?QSDCTL must point at the qsdctl binary}
QSD_BIN=${QSD_BIN:-/usr/bin/qemu-storage-daemon}
PY=/usr/bin/python3
[ -x "$QSD_BIN" ] || { echo "SKIP: $QSD_BIN not installed"; exit 77; }
command -v qemu-img >/dev/null || { echo "SKIP: qemu-img not installed"; exit 77; }
[ -x "$PY" ] || { echo "SKIP: $PY not installed"; exit 77; }

T=$(mktemp -d /tmp/qsd-vt.XXXXXX)
if [[ -n ${QSD_CSI_CTEST_ROOTS:-} ]]; then echo "$$ $T" >>"$QSD_CSI_CTEST_ROOTS"; fi  # tests/strays.py
QSD_PIDS=()
cleanup() {
    local rc=$?
    for p in "${QSD_PIDS[@]}"; do stop_pid "$p"; done
    if [ $rc -ne 0 ] && ls "$T"/*.log >/dev/null 2>&1; then
        for f in "$T"/*.log; do echo "--- $f"; cat "$f"; done
    fi
    rm -rf "$T"
    exit $rc
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
# PATH is a unix socket with a listener (/proc/net/unix, __SO_ACCEPTCON):
# the file exists from bind(), and a client connecting before listen() is
# refused, which a loaded or a fast machine hits.
listening() { awk -v p="$1" '$8 == p && $4 == "00010000" { f = 1 } END { exit !f }' /proc/net/unix; }

# stop_pid PID: SIGTERM, wait up to 5 s, then SIGKILL.
stop_pid() {
    local p=$1 i
    kill -TERM "$p" 2>/dev/null || return 0
    for i in $(seq 100); do
        kill -0 "$p" 2>/dev/null || { wait "$p" 2>/dev/null || true; return 0; }
        sleep 0.05
    done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
}

# start_qsd NAME IMAGE FORMAT EXPORT_OPTS: serves IMAGE on $T/NAME.sock with
# QMP on $T/NAME.qmp; sets QSD_PID.  Waits (bounded) for the socket.
start_qsd() {
    local name=$1 img=$2 fmt=$3 eopts=$4 i
    rm -f "$T/$name.sock" "$T/$name.qmp"
    "$QSD_BIN" \
        --blockdev "driver=file,node-name=${name}-file,filename=$img,cache.direct=on,aio=io_uring,discard=unmap" \
        --blockdev "driver=$fmt,node-name=$name,file=${name}-file,discard=unmap" \
        --export "type=vhost-user-blk,id=${name}-exp,node-name=$name,addr.type=unix,addr.path=$T/$name.sock,num-queues=2$eopts" \
        --chardev "socket,id=${name}-mon,path=$T/$name.qmp,server=on,wait=off" \
        --monitor "chardev=${name}-mon" >"$T/$name.log" 2>&1 &
    QSD_PID=$!
    QSD_PIDS+=("$QSD_PID")
    for i in $(seq 100); do
        listening "$T/$name.sock" && listening "$T/$name.qmp" && return 0
        kill -0 "$QSD_PID" 2>/dev/null || fail "QSD $name exited at start"
        sleep 0.05
    done
    fail "QSD $name: socket did not appear within 5 s"
}

# qmp SOCKET JSON: run one QMP command (10 s bound); prints the reply.
qmp() {
    "$PY" - "$1" "$2" <<'PYEOF'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
f = s.makefile("rw")
def reply():
    while True:
        line = f.readline()
        if not line:
            sys.exit("QMP connection closed")
        m = json.loads(line)
        if "event" not in m:
            return m
reply()
f.write(json.dumps({"execute": "qmp_capabilities"}) + "\n"); f.flush(); reply()
f.write(sys.argv[2] + "\n"); f.flush()
r = reply()
print(json.dumps(r))
sys.exit(0 if "return" in r else 1)
PYEOF
}

# json_field JSON KEY
json_field() { "$PY" -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

# expect_rc WANT CMD...: run CMD (bounded by timeout 60), check its status.
expect_rc() {
    local want=$1 rc=0; shift
    timeout 60 "$@" || rc=$?
    [ "$rc" -eq "$want" ] || fail "expected exit $want, got $rc: $*"
}
