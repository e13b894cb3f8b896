#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# qsd-vm-launcher without a guest: bad input is refused with a clear error
# before anything starts (no libvirt root created), waits are bounded, and
# --dry-run prints XML that libvirt's schema accepts.  Several volumes
# directories (--volumes-dir, repeated; --volumes is the same flag): disks
# found in each, a disk name in two of them refused, a missing, repeated or
# nested directory refused at start; read-only bind mounts of the volumes
# directories (as in a VM pod) are enough.
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
# expect RC PATTERN MAX_SECONDS ARGS...: exit status, stderr pattern, time bound.
# The volumes directories are in DIRS (default: --volumes, the single-directory form).
DIRS=(--volumes "$T/vols")
expect() {
    local want=$1 pat=$2 max=$3; shift 3
    local t0=$SECONDS rc=0
    timeout 60 "$L" --spec "$T/vm.json" "${DIRS[@]}" --root "$T/root" "$@" >"$T/out" 2>&1 || rc=$?
    ((rc == want)) || fail "exit $rc, want $want ($*)"
    grep -qE -- "$pat" "$T/out" || fail "no '$pat' in output"
    ((SECONDS - t0 <= max)) || fail "took $((SECONDS - t0)) s, bound $max s"
    [[ ! -e $T/root ]] || fail "libvirt root created: something started"
}

spec '[]' ',"devices":[]'
expect 1 'bad VM description.*unknown key \\"devices\\"' 2
spec '[]'
expect 1 'libvirt-timeout must be at least 1 second' 2 --libvirt-timeout 0
expect 1 'bad number of seconds: 3601' 2 --libvirt-timeout 3601
spec '[{"volume":"../outside"}]'
expect 1 'is not a valid name' 2
spec '[{"volume":"escape"}]'
expect 1 'volume \\"escape\\" in [^ ]*/vols: is a symlink \(symlinks are refused\)' 2 --wait-volumes 10
spec '[{"volume":"hostile"}]'
expect 1 'volume \\"hostile\\" in [^ ]*/vols: volume.json: \\"volume\\" is not a valid name' 2 --wait-volumes 10
spec '[{"volume":"dead"}]'
expect 1 'volume \\"dead\\" in [^ ]*/vols: socket does not accept connections: Connection refused' 4 --wait-volumes 2
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
expect 0 'type="qemu">' 2 --dry-run
grep -c '<disk type="vhostuser"' "$T/out" | grep -qx 1 || fail "want exactly one disk"
grep -q 'path="'"$T"'/vols/good/vhost.sock"' "$T/out" || fail "socket path"
grep -q 'msg="volume skipped" volume=escape' "$T/out" || fail "escape not reported"
sed -n '/^<domain/,/^<\/domain>/p' "$T/out" >"$T/dom.xml"
if command -v virt-xml-validate >/dev/null; then
    virt-xml-validate "$T/dom.xml" domain >/dev/null 2>&1 || fail "dry-run XML invalid"
fi

# Several volumes directories, as in a VM pod: the bridge (hot-plugged
# volumes) and the PVCs' directory.  Each disk's socket path is in the
# directory it was found in.
mkdir -p "$T/bridge/data" "$T/dup/good" "$T/dup/data2"
meta pvc-data >"$T/bridge/data/volume.json"; listen "$T/bridge/data/vhost.sock"
meta pvc-dup >"$T/dup/good/volume.json"; listen "$T/dup/good/vhost.sock"
DIRS=(--volumes-dir "$T/bridge" --volumes-dir "$T/vols")
spec '[{"volume":"good","boot_order":1},{"volume":"data"}]'
expect 0 'type="qemu">' 2 --dry-run
grep -c '<disk type="vhostuser"' "$T/out" | grep -qx 2 || fail "two dirs: want exactly two disks"
grep -q 'path="'"$T"'/vols/good/vhost.sock"' "$T/out" || fail "two dirs: good's socket path"
grep -q 'path="'"$T"'/bridge/data/vhost.sock"' "$T/out" || fail "two dirs: data's socket path"
# An unlisted volume in the second directory becomes a disk too.
spec '[{"volume":"good"}]'
expect 0 'type="qemu">' 2 --dry-run
grep -q 'path="'"$T"'/bridge/data/vhost.sock"' "$T/out" || fail "two dirs: unlisted data not a disk"

# A disk name in two directories: refused at once when the description
# names it (no waiting: it will not resolve itself)...
DIRS=(--volumes-dir "$T/bridge" --volumes-dir "$T/vols" --volumes-dir "$T/dup")
spec '[{"volume":"good"}]'
expect 1 'volume \\"good\\" in [^ ]*/vols: also in [^ ]*/dup: a disk name must be in one volumes directory only' 2 --wait-volumes 20
# ...and logged and left out when it does not: never a silent pick.
spec '[{"volume":"data"}]'
expect 0 'type="qemu">' 2 --dry-run
grep -c '<disk type="vhostuser"' "$T/out" | grep -qx 1 || fail "duplicate: want only data as a disk"
! grep -q '/good/vhost.sock' "$T/out" || fail "duplicate: good became a disk"
(($(grep -c 'msg="volume skipped" volume=good reason="also in ' "$T/out") == 2)) ||
    fail "duplicate: want good skipped in both directories"

# cloud-init (--cloud-init-dir, e.g. a mounted Secret: symlinks into
# ..data are fine): the data never reaches the XML, only the image path;
# a symlink out of the directory, a file over 1 MiB, a file given both in
# the description and the directory are refused before anything starts.
DIRS=(--volumes-dir "$T/vols")
mkdir -p "$T/ci/..data" "$T/ci-out" "$T/ci-big"
printf '#cloud-config\n# </disk><evil/>\n' >"$T/ci/..data/user-data"
ln -s ..data/user-data "$T/ci/user-data"
spec '[{"volume":"good"}]'
expect 0 'type="qemu">' 2 --dry-run --cloud-init-dir "$T/ci"
grep -q "<source file=\"$T/root/cidata.img\"/>" "$T/out" || fail "cidata disk not in the XML"
! grep -q 'evil' "$T/out" || fail "cloud-init text reached the XML"
ln -s /etc/passwd "$T/ci-out/user-data"
expect 1 'bad cloud-init data.*user-data: leads out of the directory' 2 --dry-run --cloud-init-dir "$T/ci-out"
head -c $((1024 * 1024 + 1)) /dev/zero >"$T/ci-big/meta-data"
expect 1 'bad cloud-init data.*meta-data: larger than 1 MiB' 2 --dry-run --cloud-init-dir "$T/ci-big"
spec '[{"volume":"good"}]' ',"cloud_init":{"user_data":"#cloud-config\n"}'
expect 1 'user-data is given both in the description and in' 2 --dry-run --cloud-init-dir "$T/ci"

# The VM description from a ConfigMap volume: vm.json -> ..data/vm.json ->
# ..<timestamp>/vm.json (seen in a real cluster: O_NOFOLLOW refused it); a
# FIFO in its place is refused at once, not read.
mkdir -p "$T/cm/..2026_11_26" && spec '[{"volume":"good"}]' && cp "$T/vm.json" "$T/cm/..2026_11_26/"
ln -s ..2026_11_26 "$T/cm/..data" && ln -s ..data/vm.json "$T/cm/vm.json" && mkfifo "$T/cm/fifo.json"
rc=0; timeout 60 "$L" --spec "$T/cm/vm.json" "${DIRS[@]}" --root "$T/root" --dry-run >"$T/out" 2>&1 || rc=$?
((rc == 0)) && grep -q 'type="qemu">' "$T/out" || fail "a description through ConfigMap symlinks: exit $rc: $(tail -2 "$T/out")"
rc=0; timeout 10 "$L" --spec "$T/cm/fifo.json" "${DIRS[@]}" --root "$T/root" --dry-run >"$T/out" 2>&1 || rc=$?
((rc == 1)) && grep -q 'not a regular file' "$T/out" || fail "a FIFO as the description: exit $rc: $(tail -2 "$T/out")"
[[ ! -e $T/root ]] || fail "libvirt root created: something started"

# The console client without a running VM: a clear error, exit 1.
rc=0
"$L" console --root "$T/no-such-root" >"$T/out" 2>&1 </dev/null || rc=$?
((rc == 1)) && grep -q 'cannot connect to .*/no-such-root/console.sock' "$T/out" ||
    fail "console without a VM: exit $rc"

# The console client against a stand-in console: input goes through until
# Ctrl-] (0x1d), which detaches at once (exit 0); nothing after it is sent.
"$PY" -c 'import socket,sys
s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(1); s.settimeout(20)
c,_=s.accept(); c.sendall(b"guest says hi\r\n"); c.settimeout(5)
got=b""
try:
    while True:
        d=c.recv(100)
        if not d: break
        got+=d
except OSError: pass
open(sys.argv[2],"wb").write(got)' "$T/fake-console.sock" "$T/fake-console.got" &
fake=$!
for _ in $(seq 100); do [[ -S $T/fake-console.sock ]] && break; sleep 0.05; done
rc=0
{ sleep 0.5; printf 'typed\x1dnot-sent'; sleep 10; } |
    timeout 8 "$L" console --socket "$T/fake-console.sock" >"$T/out" 2>&1 || rc=$?
wait $fake || true
((rc == 0)) || fail "console detach: exit $rc"
[[ $(cat "$T/fake-console.got") == typed ]] || fail "console detach: the console got '$(cat "$T/fake-console.got")'"
grep -q 'guest says hi' "$T/out" || fail "console: the guest's output not shown"
echo "console client: detaches on Ctrl-]"

# Volumes directories refused at start: missing, given twice, nested.
spec '[{"volume":"good"}]'
DIRS=(--volumes-dir "$T/vols" --volumes-dir "$T/missing")
expect 1 'msg="bad volumes directory" dir=[^ ]*/missing error="No such file or directory"' 2
DIRS=(--volumes-dir "$T/vols" --volumes-dir "$T/bridge/../vols")
expect 1 'msg="bad volumes directory" dir=[^ ]*/vols error="given twice' 2
DIRS=(--volumes-dir "$T/vols" --volumes-dir "$T/vols/good")
expect 1 'msg="bad volumes directory" dir=[^ ]*/vols/good error="inside another volumes directory' 2
DIRS=(--volumes-dir "$T/vols/good/volume.json")
expect 1 'msg="bad volumes directory" dir=[^ ]*/volume.json error="not a directory"' 2

# Read-only volumes directories (read-only, nosuid, nodev, noexec bind
# mounts in a mount namespace of its own, as a VM pod gets them): the launcher
# reads everything it needs.  The write check proves the mounts are read-only.
# A slave of the host's (e2e-lib.sh start_launcher says why not private).
if [[ $(id -u) -eq 0 ]] && command -v unshare >/dev/null &&
    unshare -m true 2>/dev/null; then
    spec '[{"volume":"good","boot_order":1},{"volume":"data"}]'
    rc=0
    timeout 60 unshare -m --propagation slave bash -c '
        for d in "$1" "$2"; do
            mount --bind "$d" "$d" && mount -o remount,bind,ro,nosuid,nodev,noexec "$d" || exit 90
            ! touch "$d/written" 2>/dev/null || exit 91
        done
        exec "$3" --spec "$4" --volumes-dir "$1" --volumes-dir "$2" --root "$5" --dry-run' \
        sh "$T/bridge" "$T/vols" "$L" "$T/vm.json" "$T/root" >"$T/out" 2>&1 || rc=$?
    ((rc == 0)) || fail "read-only volumes directories: exit $rc"
    grep -c '<disk type="vhostuser"' "$T/out" | grep -qx 2 || fail "read-only: want two disks"
    [[ ! -e $T/bridge/written && ! -e $T/vols/written ]] || fail "wrote into a volumes directory"
    grep -q "$T/vols" /proc/self/mountinfo && fail "read-only bind leaked out of its namespace"
    echo "read-only volumes directories: ok"
else
    echo "NOTE: read-only bind-mount check skipped (needs root and unshare -m)"
fi
echo PASS
