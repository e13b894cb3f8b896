# SPDX-License-Identifier: Apache-2.0
# Shared helpers for the launcher's end-to-end tests (sourced, bash).
# Every process a test starts is recorded by PID and stopped by the EXIT trap;
# every wait is bounded.  Needs: LAUNCHER (binary), BUILD_CACHE (cache dir in
# the build tree), SRC (tests/launcher).
set -euo pipefail

e2e_skip() { echo "SKIP: $*"; exit 77; }
[[ ${QSD_E2E:-1} != 0 ]] || e2e_skip "end-to-end guest tests disabled (QSD_E2E=0)"
e2e_fail() { echo "FAIL: $*" >&2; e2e_dump; exit 1; }
log() { echo "[$(date +%T.%3N)] $*"; }

[[ $(id -u) -eq 0 ]] || e2e_skip "needs root (QSD sockets are root-only, see NOTES.md)"
for t in qemu-storage-daemon qemu-system-x86_64 qemu-img qemu-io python3 unshare; do
    command -v "$t" >/dev/null || e2e_skip "$t not installed (scripts/setup.sh)"
done
PY=$(command -v /usr/bin/python3 || command -v python3)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/qsd-e2e.XXXXXX")
if [[ -n ${QSD_CSI_CTEST_ROOTS:-} ]]; then echo "$$ $WORK" >>"$QSD_CSI_CTEST_ROOTS"; fi  # tests/strays.py
# passt (the guest's network, started by libvirt) drops to "nobody": it must
# be able to reach its directory inside ROOT (docs/launcher.md).
chmod 755 "$WORK"
# The VM pod's layout: VOLS holds the pod's own PVCs (/run/qsd-vm/volumes/<disk>
# in a pod), BRIDGE the volumes hot-plugged later (/run/qsd-vm/bridge).  The
# launcher gets both, read-only (start_launcher).
VOLS=$WORK/volumes
BRIDGE=$WORK/bridge
ROOT=$WORK/root
mkdir -p "$VOLS" "$BRIDGE" "$WORK/ctl" "$ROOT"
PIDS=()
LAUNCHER_PID=

stop_pid() { # PID [signal] [timeout_s]: stop one process we started, bounded
    local pid=$1 sig=${2:-TERM} t=${3:-10}
    kill -0 "$pid" 2>/dev/null || return 0
    kill -"$sig" "$pid" 2>/dev/null || true
    kill -CONT "$pid" 2>/dev/null || true # one a test stopped (SIGSTOP) handles it too
    for ((i = 0; i < t * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}

e2e_dump() {
    [[ -f $WORK/launcher.log ]] && { echo "--- launcher log"; tail -40 "$WORK/launcher.log"; }
    [[ -f $WORK/console.log ]] && { echo "--- console"; tail -40 "$WORK/console.log"; }
    for f in "$WORK"/ctl/*/qsd.log; do [[ -s $f ]] && { echo "--- $f"; tail -5 "$f"; }; done
    return 0
}

e2e_cleanup() {
    local rc=$?
    set +e
    # The launcher first: it destroys its domain (SIGTERM twice = destroy now).
    if [[ -n $LAUNCHER_PID ]] && kill -0 "$LAUNCHER_PID" 2>/dev/null; then
        kill -TERM "$LAUNCHER_PID"; sleep 0.2; stop_pid "$LAUNCHER_PID" TERM 20
    fi
    # A QEMU left behind by a launcher killed hard: its pid file in the root.
    for p in "$ROOT"/run/qemu/*.pid; do
        [[ -f $p && $(basename "$p") != driver.pid ]] && stop_pid "$(cat "$p")" TERM 5
    done
    for p in "${PIDS[@]}"; do stop_pid "$p" TERM 5; done
    # Keep the embedded driver's capability cache for the next test.
    if [[ -d $ROOT/cache/qemu && ! -d $BUILD_CACHE/embed-cache/qemu ]]; then
        mkdir -p "$BUILD_CACHE/embed-cache"
        cp -a "$ROOT/cache/qemu" "$BUILD_CACHE/embed-cache/qemu.tmp.$$" &&
            mv -T "$BUILD_CACHE/embed-cache/qemu.tmp.$$" "$BUILD_CACHE/embed-cache/qemu" 2>/dev/null ||
            rm -rf "$BUILD_CACHE/embed-cache/qemu.tmp.$$"
    fi
    [[ $rc -ne 0 && $rc -ne 77 ]] && e2e_dump
    rm -rf "$WORK"
    exit $rc
}
trap e2e_cleanup EXIT
trap 'exit 130' INT TERM

# Seed the capability cache (saves probing QEMU under TCG on every test).
if [[ -d $BUILD_CACHE/embed-cache/qemu ]]; then
    mkdir -p "$ROOT/cache"
    cp -a "$BUILD_CACHE/embed-cache/qemu" "$ROOT/cache/qemu"
fi

# start_qsd NAME SIZE DIR [RO QUEUES LBS]: image $WORK/NAME.qcow2, socket
# DIR/vhost.sock, QMP $WORK/ctl/NAME/qmp.sock, volume.json written atomically
# with volume id pvc-e2e-NAME (or $VOLUME_ID when set).
# Sets QSD_PID[NAME].  RO: true/false, QUEUES: num-queues, LBS: logical block size.
declare -A QSD_PID
start_qsd() {
    local name=$1 size=$2 dir=$3 img=$WORK/$1.qcow2 ro=${4:-false} queues=${5:-1} lbs=${6:-512}
    local writable=on
    [[ $ro == true ]] && writable=off
    mkdir -p "$dir" "$WORK/ctl/$name"
    [[ -f $img ]] || qemu-img create -q -f qcow2 "$img" "$size"
    rm -f "$dir/vhost.sock"
    qemu-storage-daemon \
        --blockdev "driver=file,node-name=file-$name,filename=$img" \
        --blockdev "driver=qcow2,node-name=vol-$name,file=file-$name" \
        --export "type=vhost-user-blk,id=exp-$name,node-name=vol-$name,addr.type=unix,addr.path=$dir/vhost.sock,writable=$writable,writethrough=on,num-queues=$queues,logical-block-size=$lbs" \
        --chardev "socket,id=qmp,path=$WORK/ctl/$name/qmp.sock,server=on,wait=off" \
        --monitor chardev=qmp >"$WORK/ctl/$name/qsd.log" 2>&1 &
    QSD_PID[$name]=$!
    PIDS+=($!)
    "$PY" "$SRC/qmp.py" wait-socket "$dir/vhost.sock" 10 || e2e_fail "QSD $name did not come up"
    local bytes
    bytes=$(qemu-img info -U --output=json "$img" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["virtual-size"])')
    printf '{"version":1,"volume":"%s","size":%s,"read_only":%s,"num_queues":%s,"logical_block_size":%s,"socket":"vhost.sock"}\n' \
        "${VOLUME_ID:-pvc-e2e-$name}" "$bytes" "$ro" "$queues" "$lbs" >"$dir/.volume.json.tmp"
    mv "$dir/.volume.json.tmp" "$dir/volume.json"
}

qmp() { "$PY" "$SRC/qmp.py" cmd "$WORK/ctl/$1/qmp.sock" "${@:2}"; }

# count_console REGEX: number of console lines matching
count_console() {
    [[ -f $WORK/console.log ]] || { echo 0; return; }
    tr -d '\r' <"$WORK/console.log" | grep -cE "$1" || true
}
console() { tr -d '\r' <"$WORK/console.log" 2>/dev/null | grep -E "$1" || true; }
# wait_console REGEX MIN_COUNT TIMEOUT_S: until MIN_COUNT lines match (50 ms polls)
wait_console() {
    local re=$1 min=$2 t=$3 i
    for ((i = 0; i < t * 20; i++)); do
        (($(count_console "$re") >= min)) && return 0
        [[ -n $LAUNCHER_PID ]] && ! kill -0 "$LAUNCHER_PID" 2>/dev/null && break
        sleep 0.05
    done
    e2e_fail "console: no '$re' (x$min) within ${t}s"
}
wait_log() { # REGEX TIMEOUT_S: a launcher log line
    local re=$1 t=$2 i
    for ((i = 0; i < t * 20; i++)); do
        grep -qE "$re" "$WORK/launcher.log" 2>/dev/null && return 0
        sleep 0.05
    done
    e2e_fail "launcher log: no '$re' within ${t}s"
}

# guest SCRIPT: kernel + initramfs with SCRIPT as /test.sh, copied into WORK
guest() {
    bash "$SRC/../guest/build-guest.sh" "$BUILD_CACHE/guest" "$1" "$WORK/initrd.img" >/dev/null ||
        { rc=$?; [[ $rc -eq 77 ]] && e2e_skip "cannot build the guest"; e2e_fail "guest build failed"; }
    cp "$BUILD_CACHE/guest/vmlinuz" "$WORK/vmlinuz"
}

# vm_json NAME DISKS_JSON [EXTRA_CMDLINE]: the VM description (TCG, console to a file)
vm_json() {
    cat >"$WORK/vm.json" <<JSON
{"name": "$1", "memory_mib": 256, "accel": "tcg",
 "boot": {"kernel": "$WORK/vmlinuz", "initrd": "$WORK/initrd.img",
          "cmdline": "console=ttyS0 panic=-1 quiet${3:+ $3}"},
 "disks": $2, "console_log": "$WORK/console.log", "hotplug_slots": 4}
JSON
}

# start_launcher [ARGS...]: the launcher with both volumes directories, as a
# VM pod runs it: in its own mount namespace where BRIDGE and VOLS are
# read-only, nosuid, nodev, noexec bind mounts (a write there is checked to
# fail first).  Files placed in them from outside (this script, QSD) are seen
# through the binds.  LAUNCHER_PID is the launcher itself (unshare and bash exec).
# A slave namespace, not a private one: a private copy of the host's mounts
# would keep every filesystem mounted at that moment busy while the VM runs
# (a pod volume's of a test running beside this one: its unstage then found
# its loop device still open).
start_launcher() {
    unshare -m --propagation slave bash -c '
        for d in "$1" "$2"; do
            mount --bind "$d" "$d" && mount -o remount,bind,ro,nosuid,nodev,noexec "$d" || exit 90
            ! touch "$d/.written" 2>/dev/null || exit 91
        done
        shift 2
        exec "$@"' sh "$BRIDGE" "$VOLS" \
        "$LAUNCHER" --spec "$WORK/vm.json" --volumes-dir "$BRIDGE" --volumes-dir "$VOLS" \
        --root "$ROOT" "$@" >"$WORK/launcher.log" 2>&1 &
    LAUNCHER_PID=$!
    # The launcher's view: both directories mounted read-only.
    local i ok=0
    for ((i = 0; i < 100; i++)); do
        kill -0 "$LAUNCHER_PID" 2>/dev/null || break
        if [[ $(readlink "/proc/$LAUNCHER_PID/exe" 2>/dev/null) == "$(readlink -f "$LAUNCHER")" ]]; then
            ok=$(awk -v b="$BRIDGE" -v v="$VOLS" '($5 == b || $5 == v) && $6 ~ /^ro,nosuid,nodev,noexec/ { n++ } END { print n + 0 }' \
                "/proc/$LAUNCHER_PID/mountinfo")
            break
        fi
        sleep 0.05
    done
    ((ok == 2)) || e2e_fail "launcher not running with read-only volumes directories (found $ok)"
    [[ ! -e $BRIDGE/.written && ! -e $VOLS/.written ]] || e2e_fail "a volumes directory was writable"
}

# wait_exit PID TIMEOUT_S -> sets EXIT_RC
wait_launcher_exit() {
    local t=$1 i
    for ((i = 0; i < t * 10; i++)); do
        kill -0 "$LAUNCHER_PID" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$LAUNCHER_PID" 2>/dev/null && e2e_fail "launcher still running after ${t}s"
    set +e; wait "$LAUNCHER_PID"; EXIT_RC=$?; set -e
    LAUNCHER_PID=
}

# stop_destroyed NAME SHUTDOWN_S [LOG_LINE...]: SIGTERM the launcher of VM NAME
# whose guest will not power off: it must exit 3 after SHUTDOWN_S (bounded:
# at most 27 s more, which covers libvirt's SIGTERM-then-SIGKILL of a QEMU
# that ignores SIGTERM), log the given lines and the destroy's, and leave no
# QEMU.  Sets ELAPSED_MS.
stop_destroyed() {
    local name=$1 t=$2 qemu_pid t0 l i
    shift 2
    qemu_pid=$(cat "$ROOT/run/qemu/$name.pid")
    kill -0 "$qemu_pid" || e2e_fail "no QEMU pid"
    t0=$(now_ms)
    kill -TERM "$LAUNCHER_PID"
    wait_launcher_exit $((t + 30))
    ELAPSED_MS=$(($(now_ms) - t0))
    ((EXIT_RC == 3)) || e2e_fail "exit status $EXIT_RC, want 3 (destroyed after timeout)"
    ((ELAPSED_MS >= t * 1000 && ELAPSED_MS < (t + 27) * 1000)) ||
        e2e_fail "stopped after $ELAPSED_MS ms, bound $t s"
    for l in "$@" 'msg="guest did not shut down in time, destroying"' \
             'msg="vm ended" how=destroyed-after-timeout exit_status=3' 'msg=exit status=3'; do
        grep -qF "$l" "$WORK/launcher.log" || e2e_fail "log line missing: $l"
    done
    for ((i = 0; i < 50; i++)); do kill -0 "$qemu_pid" 2>/dev/null || break; sleep 0.1; done
    ! kill -0 "$qemu_pid" 2>/dev/null || e2e_fail "QEMU $qemu_pid still running"
}

median() { sort -n | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print int((a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }
