#!/usr/bin/env bash
# qsd-vm-launcher without a guest: bad input is refused with a clear error
# before anything starts (no libvirt root created), waits are bounded, and
# --dry-run prints XML that libvirt's schema accepts.
set -euo pipefail
L=${1:?usage: cli.sh LAUNCHER}
PY=$(command -v /usr/bin/python3 || command -v python3) || { echo "SKIP: python3"; exit 77; }
T=$(mktemp -d)
PIDS=()
cleanup() {
    local rc=$?
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null || true; done
    rm -rf "$T"
    exit $rc
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [[ -f $T/out ]] && cat "$T/out"; exit 1; }

mkdir -p "$T/vols" "$T/outside"
listen() { # PATH: a socket that accepts connections (bounded life)
    "$PY" -c 'import socket,sys,time
s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(8); s.settimeout(1)
end = time.monotonic() + 60
while time.monotonic() < end:
    try: s.accept()[0].close()
    except OSError: pass' "$1" </dev/null >/dev/null 2>&1 &
    PIDS+=($!)
    for _ in $(seq 100); do [[ -S $1 ]] && return; sleep 0.05; done
    fail "listener $1"
}
meta() { printf '{"version":1,"volume":"%s","size":1048576,"socket":"vhost.sock"}\n' "$1"; }

mkdir "$T/vols/good"; meta pvc-good >"$T/vols/good/volume.json"; listen "$T/vols/good/vhost.sock"
mkdir "$T/vols/dead"; meta pvc-dead >"$T/vols/dead/volume.json"
"$PY" -c 'import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$T/vols/dead/vhost.sock"
meta pvc-out >"$T/outside/volume.json"; listen "$T/outside/vhost.sock"
ln -s "$T/outside" "$T/vols/escape"
mkdir "$T/vols/hostile"; echo '{"version":1,"volume":"x</serial><evil/>","size":1}' >"$T/vols/hostile/volume.json"
listen "$T/vols/hostile/vhost.sock"

spec() { # DISKS-JSON [EXTRA-KEYS]
    printf '{"name":"cli","memory_mib":64,"accel":"tcg","boot":{"kernel":"/vm/vmlinuz"},"disks":%s%s}\n' "$1" "${2:-}" >"$T/vm.json"
}
# expect RC PATTERN MAX_SECONDS ARGS...: exit status, stderr pattern, time bound
expect() {
    local want=$1 pat=$2 max=$3; shift 3
    local t0=$SECONDS rc=0
    timeout 60 "$L" --spec "$T/vm.json" --volumes "$T/vols" --root "$T/root" "$@" >"$T/out" 2>&1 || rc=$?
    ((rc == want)) || fail "exit $rc, want $want ($*)"
    grep -qE -- "$pat" "$T/out" || fail "no '$pat' in output"
    ((SECONDS - t0 <= max)) || fail "took $((SECONDS - t0)) s, bound $max s"
    [[ ! -e $T/root ]] || fail "libvirt root created: something started"
}

spec '[]' ',"devices":[]'
expect 1 'bad VM description.*unknown key \\"devices\\"' 2
spec '[{"volume":"../outside"}]'
expect 1 'is not a valid name' 2
spec '[{"volume":"escape"}]'
expect 1 'volume \\"escape\\": is a symlink \(symlinks are refused\)' 2 --wait-volumes 10
spec '[{"volume":"hostile"}]'
expect 1 'volume \\"hostile\\": volume.json: \\"volume\\" is not a valid name' 2 --wait-volumes 10
spec '[{"volume":"dead"}]'
expect 1 'volume \\"dead\\": socket does not accept connections: Connection refused' 4 --wait-volumes 2
spec '[{"volume":"absent"}]'
expect 1 'volume \\"absent\\" is not in' 4 --wait-volumes 2
expect 1 'Usage' 2 extra-argument

# SIGTERM while waiting for volumes: stop at once, nothing started.
spec '[{"volume":"absent"}]'
"$L" --spec "$T/vm.json" --volumes "$T/vols" --root "$T/root" --wait-volumes 30 >"$T/out" 2>&1 &
lp=$!
sleep 0.5
t0=$SECONDS
kill -TERM $lp
rc=0; wait $lp || rc=$?
((rc == 1 && SECONDS - t0 <= 2)) || fail "SIGTERM while waiting: exit $rc after $((SECONDS - t0)) s"
grep -q 'stop requested while waiting' "$T/out" || fail "no stop message"
[[ ! -e $T/root ]] || fail "libvirt root created"

# Dry run: only the ready volumes become disks; the rest are skipped (logged).
spec '[{"volume":"good","boot_order":1}]'
expect 0 '<domain type="qemu">' 2 --dry-run
grep -c '<disk type="vhostuser"' "$T/out" | grep -qx 1 || fail "want exactly one disk"
grep -q 'path="'"$T"'/vols/good/vhost.sock"' "$T/out" || fail "socket path"
grep -q 'msg="volume skipped" volume=escape' "$T/out" || fail "escape not reported"
sed -n '/^<domain/,/^<\/domain>/p' "$T/out" >"$T/dom.xml"
if command -v virt-xml-validate >/dev/null; then
    virt-xml-validate "$T/dom.xml" domain >/dev/null 2>&1 || fail "dry-run XML invalid"
fi
echo PASS
