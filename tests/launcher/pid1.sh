#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# qsd-vm-launcher as PID 1 of a new PID namespace (a VM pod without
# shareProcessNamespace; unshare --pid --fork --mount-proc): its init
# (launcher/init.c) reaps the orphans re-parented to it, here a shell's
# background children left by a process entering the namespace as
# `kubectl exec` does, while the launcher waits for a volume; no zombie is
# left in the namespace (/proc/*/stat of its own /proc), SIGTERM reaches the
# launcher (it stops as it does outside a namespace) and PID 1 exits with
# the launcher's status.  --dry-run as PID 1 prints the XML and exits 0.
# Then libvirt's own orphans: the embedded driver probes QEMU's capabilities
# with daemonized QEMUs (re-parented to PID 1) before it refuses a domain
# whose kernel is missing; without reaping, libvirt waits for each zombie to
# vanish (161 s measured here instead of 1.4 s), so the bound is 60 s.
set -euo pipefail
L=${1:?usage: pid1.sh LAUNCHER}
[[ $(id -u) == 0 ]] || { echo "SKIP: needs root (unshare --pid)"; exit 77; }
for c in unshare nsenter; do
    command -v $c >/dev/null || { echo "SKIP: $c not installed"; exit 77; }
done
T=$(mktemp -d)
chmod 755 "$T" # passt, run by libvirt as nobody, writes its pid file under the root
U= I=
cleanup() {
    local rc=$?
    # Killing the namespace's PID 1 kills everything in the namespace.
    if [[ -n $U ]]; then
        [[ -n $I ]] && kill -KILL "$I" 2>/dev/null
        kill -KILL "$U" 2>/dev/null
        wait "$U" 2>/dev/null || true
    fi
    rm -rf "$T"
    exit $rc
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [[ -f $T/out ]] && cat "$T/out"; exit 1; }
mkdir "$T/vols"
printf '{"name":"pid1","memory_mib":64,"accel":"tcg","boot":{"kernel":"/vm/vmlinuz"},"disks":%s}\n' \
    '[]' >"$T/none.json"
printf '{"name":"pid1","memory_mib":64,"accel":"tcg","boot":{"kernel":"/vm/vmlinuz"},"disks":%s}\n' \
    '[{"volume":"absent"}]' >"$T/absent.json"

# --dry-run as PID 1: the XML, exit 0 through the init.  (Each namespace here
# is the host's mount slave, not a private copy: e2e-lib.sh start_launcher.)
rc=0
timeout 20 unshare --pid --fork --mount-proc --propagation slave "$L" --spec "$T/none.json" --volumes "$T/vols" \
    --root "$T/root" --dry-run >"$T/xml" 2>"$T/out" || rc=$?
((rc == 0)) || fail "--dry-run as PID 1: exit $rc"
grep -q 'type="qemu">' "$T/xml" || fail "--dry-run as PID 1: no domain XML"
grep -q 'comp=init msg="pid 1: the launcher runs as a child' "$T/out" || fail "no init message"
grep -q 'comp=init msg="launcher exited" status=0' "$T/out" || fail "init did not report exit 0"

# Waiting for a volume (30 s at most) as PID 1.
unshare --pid --fork --mount-proc --propagation slave "$L" --spec "$T/absent.json" --volumes "$T/vols" \
    --root "$T/root" --wait-volumes 30 >"$T/out" 2>&1 &
U=$!
for _ in $(seq 200); do grep -q 'msg="event loop"' "$T/out" 2>/dev/null && break; sleep 0.05; done
grep -q 'msg="event loop"' "$T/out" || fail "the launcher did not start"
# The namespace's PID 1: the descendant of $U whose pid in its own namespace is 1.
I=
p=$U
for _ in 1 2 3; do
    c=$(cat "/proc/$p/task/$p/children" 2>/dev/null || true)
    c=${c// }
    [[ $c =~ ^[0-9]+$ ]] || break
    if awk '/^NSpid:/ { exit !(NF == 3 && $3 == 1) }' "/proc/$c/status"; then I=$c; break; fi
    p=$c
done
[[ -n $I ]] || fail "no PID 1 of a new namespace under unshare ($U)"
inside() { timeout 10 nsenter -t "$I" -p -m "$@"; }
# state and parent of every process in the namespace: "PID STATE PPID COMM"
states() {
    inside sh -c 'for f in /proc/[0-9]*/stat; do
        s=$(cat "$f" 2>/dev/null) || continue
        c=${s#*(}; c=${c%)*}; r=${s##*) }
        echo "${s%% *} ${r%% *} $(echo "$r" | cut -d" " -f2) $c"
    done'
}
# A process entering the namespace leaves two orphans (1.5 s each).
inside sh -c 'sleep 1.5 & sleep 1.5 & exit 0'
sleep 0.5
states >"$T/during"
n=$(awk '$4 == "sleep" && $3 == 1' "$T/during" | wc -l)
((n == 2)) || fail "the orphans are not PID 1's children: $(cat "$T/during")"
sleep 2.5
states >"$T/after"
awk '$4 == "sleep"' "$T/after" | grep -q . && fail "orphans left: $(cat "$T/after")"
awk '$2 == "Z"' "$T/after" | grep -q . && fail "zombies left: $(cat "$T/after")"
awk '$1 == 2 && $3 == 1 && $4 == "qsd-vm-launcher" && $2 != "Z"' "$T/after" | grep -q . ||
    fail "the launcher (PID 2, PID 1's child) is gone: $(cat "$T/after")"
echo "ok orphans re-parented to PID 1 and reaped; the namespace: $(tr '\n' ';' <"$T/after")"

# SIGTERM to PID 1 reaches the launcher, which stops; PID 1 exits with its status.
t0=$SECONDS
kill -TERM "$I"
rc=0; wait "$U" || rc=$?
U= I=
((rc == 1 && SECONDS - t0 <= 3)) || fail "SIGTERM to PID 1: exit $rc after $((SECONDS - t0)) s"
grep -q 'stop requested while waiting' "$T/out" || fail "the launcher did not get SIGTERM"
grep -q 'comp=init msg="launcher exited" status=1 orphans_reaped=2' "$T/out" ||
    fail "init's exit line"
[[ ! -e $T/root ]] || fail "libvirt root created"
echo "ok SIGTERM forwarded, exit status 1 passed on"

command -v qemu-system-x86_64 >/dev/null || { echo "SKIP: no QEMU for libvirt's probe"; exit 0; }
t0=$SECONDS rc=0
timeout 90 unshare --pid --fork --mount-proc --propagation slave "$L" --spec "$T/none.json" --volumes "$T/vols" \
    --root "$T/root" >"$T/out" 2>&1 || rc=$?
((rc == 1)) || fail "a domain without its kernel as PID 1: exit $rc, want 1"
grep -q 'msg="cannot start domain".*/vm/vmlinuz' "$T/out" || fail "not refused for its kernel"
grep -qE 'comp=init msg="launcher exited" status=1 orphans_reaped=[1-9]' "$T/out" ||
    fail "no orphan of libvirt's reaped"
((SECONDS - t0 <= 60)) || fail "took $((SECONDS - t0)) s (libvirt waited for zombies?)"
echo "ok libvirt's orphans (daemonized QEMUs, passt) reaped: $(grep -o 'orphans_reaped=[0-9]*' "$T/out"), $((SECONDS - t0)) s"
