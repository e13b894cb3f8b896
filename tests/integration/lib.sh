# SPDX-License-Identifier: Apache-2.0
# Shared helpers for the integration tests (sourced).  Every test gets a
# private temp dir with its own pool and run dir; the EXIT trap stops every
# QSD recorded there and every background PID the test registered, by PID.
set -uo pipefail

QSDCTL=${QSDCTL:-qsdctl}
T=$(mktemp -d /tmp/qsd-it-XXXXXX)
if [[ -n ${QSD_CSI_CTEST_ROOTS:-} ]]; then echo "$$ $T" >>"$QSD_CSI_CTEST_ROOTS"; fi  # tests/strays.py
export QSDCTL_RUN_DIR=$T/run QSDCTL_POOL=$T/pool
BG_PIDS=()
FAILURES=0
CHECKS=0

cleanup() {
    local pid f
    if [[ $FAILURES -gt 0 ]]; then
        # Evidence for the failure: every QSD's log and every supervisor log.
        for f in "$T"/run/ctl/*/qsd.log "$T"/*.log; do
            [[ -f $f ]] && { echo "--- $f"; tail -n 20 "$f"; }
        done
    fi
    for pid in "${BG_PIDS[@]}"; do kill "$pid" 2>/dev/null; done
    for pid in "${BG_PIDS[@]}"; do wait "$pid" 2>/dev/null; done
    # Stop every QSD whose state file is under our run dir (by its recorded PID).
    local st
    for st in "$T"/run/ctl/*/qsd.json; do
        [[ -f $st ]] || continue
        pid=$(sed -n 's/.*"pid": \([0-9]*\).*/\1/p' "$st")
        [[ -n $pid && $pid != 0 ]] && grep -qs "$T" "/proc/$pid/cmdline" && kill -9 "$pid" 2>/dev/null
    done
    for pid in $(qsd_pids_under "$T"); do kill -9 "$pid" 2>/dev/null; done
    rm -rf "$T"
}
trap cleanup EXIT

# PIDs of the QSD units whose command line mentions $1 (our own QSDs only):
# a QSD, or the vhost-user filter's head in front of one (whose QSD child,
# naming the same things, is part of the unit and not listed).
qsd_pids_under() {
    local p all=()
    for p in /proc/[0-9]*; do
        { tr '\0' ' ' < "$p/cmdline"; } 2>/dev/null | grep -q -- "qemu-storage-daemon.*$1" && all+=("${p#/proc/}")
    done
    for p in "${all[@]}"; do
        local ppid
        ppid=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null) || continue
        [[ " ${all[*]} " == *" $ppid "* ]] || echo "$p"
    done
}

ok()   { CHECKS=$((CHECKS + 1)); echo "ok   - $*"; }
bad()  { CHECKS=$((CHECKS + 1)); FAILURES=$((FAILURES + 1)); echo "FAIL - $*"; }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }

# expect_fail CODE PATTERN -- command...: exit code and a message naming the problem.
expect_fail() {
    local code=$1 pattern=$2; shift 3
    local out rc
    out=$("$@" 2>&1); rc=$?
    if [[ $rc -eq $code ]] && grep -q -- "$pattern" <<<"$out"; then
        ok "rejected ($rc): $* -> $(head -1 <<<"$out")"
    else
        bad "expected exit $code and '$pattern' from: $* ; got $rc: $out"
    fi
}

json_get() { python3 -c 'import json,sys; d=json.load(sys.stdin)
for k in sys.argv[1].split("."): d=d[k]
print(str(d).lower() if isinstance(d,bool) else d)' "$1"; }

# wait_until SECONDS command...: poll (10 ms) until the command succeeds.
wait_until() {
    local limit=$1; shift
    local end=$(( $(date +%s%N) + limit * 1000000000 ))
    until "$@" 2>/dev/null; do
        (( $(date +%s%N) > end )) && return 1
        sleep 0.01
    done
}

finish() {
    echo "$((CHECKS - FAILURES)) passed, $FAILURES failed"
    [[ $FAILURES -eq 0 ]]
}

require_qsd() {
    if ! command -v qemu-storage-daemon >/dev/null; then
        echo "SKIP: qemu-storage-daemon is not installed (run scripts/setup.sh)"
        exit 77
    fi
}
