#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# End-to-end: a VM a user can use (docs/launcher.md).  A TCG guest booted by
# qsd-vm-launcher, driven only through its serial console (`qsd-vm-launcher
# console` on the attach socket):
#   - network: the guest gets an address by DHCP (passt) and fetches a file
#     from an HTTP server on the pod side (127.0.0.1, reached through the
#     gateway address); a forwarded port in the pod reaches a guest server
#     and its answers come back (client speaks first, as SSH does);
#     the NIC has the MAC and PCI address the launcher reported;
#   - cloud-init: the guest mounts its read-only cidata disk (at the address
#     in the report) and finds the user-data from the description and the
#     meta-data from --cloud-init-dir (a Secret-like directory of symlinks);
#   - console: commands and answers go through the attach socket; the log is
#     bounded (rotated at --console-log-max); the guest-agent port exists;
#   - stable guest hardware: listed disks at their slots, two unlisted ones
#     hot-plugged in the order opposite to their names, all at the promised
#     PCI addresses (guest view = report file = log); the VM is powered off
#     and started again with every disk present: same addresses; an unlisted
#     disk unplugged and plugged again comes back to its address.
SRC=$(cd "$(dirname "$0")" && pwd)
source "$SRC/e2e-lib.sh"
for t in mkfs.vfat mcopy passt; do
    command -v "$t" >/dev/null || e2e_skip "$t not installed (scripts/setup.sh)"
done
T0=$(now_ms)

# The test guest plus the modules this test needs (network, FAT, virtio
# console), from the same Debian kernel package (cached).
guest "$SRC/guest-usable.sh"
EXTRA=$BUILD_CACHE/guest-extra
MODS="failover net_failover virtio_net fat vfat nls_cp437 nls_utf8 nls_ascii virtio_console"
kpkg=$(cat "$BUILD_CACHE/guest/kernel-package")
if [[ ! -f $EXTRA/$kpkg.done ]]; then
    rm -rf "$EXTRA"
    mkdir -p "$EXTRA/dl" "$EXTRA/modules2"
    (cd "$EXTRA/dl" && timeout 300 apt-get download -q "$kpkg" >/dev/null 2>&1) ||
        e2e_skip "apt-get download $kpkg failed"
    dpkg-deb -x "$EXTRA"/dl/*.deb "$EXTRA/dl/x"
    for m in $MODS; do
        f=$(find "$EXTRA/dl/x/lib/modules" -name "$m.ko*" | head -1)
        [[ -n $f ]] || e2e_fail "module $m not in $kpkg"
        case $f in
            *.ko) cp "$f" "$EXTRA/modules2/$m.ko" ;;
            *.ko.xz) xz -dc "$f" >"$EXTRA/modules2/$m.ko" ;;
            *.ko.zst) zstd -dcq "$f" >"$EXTRA/modules2/$m.ko" ;;
        esac
    done
    rm -rf "$EXTRA/dl"
    touch "$EXTRA/$kpkg.done"
fi
(cd "$EXTRA" && find modules2 | cpio -o -H newc --quiet | gzip -1) >>"$WORK/initrd.img"

# The pod side: an HTTP server on 127.0.0.1 only, and a free port for the
# forward to the guest.
TOKEN=tok-$RANDOM$RANDOM
mkdir -p "$WORK/www"
echo "$TOKEN" >"$WORK/www/token.txt"
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
HTTP_PORT=$(free_port)
FWD_PORT=$(free_port)
(cd "$WORK/www" && exec "$PY" -m http.server "$HTTP_PORT" --bind 127.0.0.1 >"$WORK/http.log" 2>&1) &
PIDS+=($!)

# cloud-init: user-data inline in the description, meta-data from a
# directory laid out like a mounted Secret (file -> ..data/file).
mkdir -p "$WORK/ci/..2026_01_01/" && ln -s ..2026_01_01 "$WORK/ci/..data"
printf 'instance-id: iid-%s\nlocal-hostname: usable\n' "$TOKEN" >"$WORK/ci/..data/meta-data"
ln -s ..data/meta-data "$WORK/ci/meta-data"
USER_DATA="#cloud-config\n# $TOKEN\nssh_pwauth: false\n"
printf "$USER_DATA" >"$WORK/user-data.expected"
want_md5=$(md5sum <"$WORK/user-data.expected" | cut -d' ' -f1)

# Volumes: root (listed, slot 1) and data (listed, slot 2, hot-plugged
# later) in the PVCs' directory; zz and aa (unlisted) hot-plugged through
# the bridge.  Sizes tell them apart in the guest (sectors).
declare -A SECTORS=([root]=131072 [data]=98304 [zz]=81920 [aa]=65536)
declare -A ADDR=([root]=0000:01:00.0 [data]=0000:02:00.0 [zz]=0000:03:00.0 [aa]=0000:04:00.0)
NIC_ADDR=0000:05:00.0 CIDATA_ADDR=0000:07:00.0 MAC=52:54:00:0e:2e:01
start_qsd root 64M "$VOLS/root"
cat >"$WORK/vm.json" <<JSON
{"name": "usable", "memory_mib": 256, "accel": "tcg",
 "boot": {"kernel": "$WORK/vmlinuz", "initrd": "$WORK/initrd.img",
          "cmdline": "console=ttyS0 panic=-1 quiet"},
 "disks": [{"volume": "root"}, {"volume": "data", "slot": 2, "hotplug": true}],
 "hotplug_slots": 2, "console_log": "$WORK/console.log",
 "network": {"mac": "$MAC", "port_forwards": [{"port": $FWD_PORT, "guest_port": 2222}]},
 "cloud_init": {"user_data": "$USER_DATA"}}
JSON
LOG_MAX=16384
CIN=$WORK/console.in
mkfifo "$CIN"
CONSOLE_PID=
attach_console() { # a console client fed from a FIFO, its output in console-client.out
    exec 7<>"$CIN"
    "$LAUNCHER" console --root "$ROOT" <&7 >"$WORK/console-client.out" 2>&1 &
    CONSOLE_PID=$!
    PIDS+=($!)
    local i
    for ((i = 0; i < 100; i++)); do
        grep -q 'msg="console attached"' "$WORK/launcher.log" && return 0
        sleep 0.05
    done
    e2e_fail "console client did not attach"
}
send() { echo "$*" >&7; }
# client_wait REGEX TIMEOUT_S: the answer came back through the attach socket
client_wait() {
    local i
    for ((i = 0; i < $2 * 20; i++)); do
        tr -d '\r' <"$WORK/console-client.out" | grep -qE "$1" && return 0
        sleep 0.05
    done
    e2e_fail "console client: no '$1' within $2 s"
}
# disks_at: the guest's last DISKS line has every NAME at ADDR[NAME] with its size.
# The line need not start the console's line: the guest prints it when its
# disks change, which can fall inside the echo of a command the test is
# typing ("ping tok-12DISKS vda=... " was seen), and it is not printed again.
disks_at() {
    local want=("$@") i line n
    for ((i = 0; i < 60 * 20; i++)); do
        line=$(console 'DISKS ' | tail -1 | sed 's/.*DISKS /DISKS /')
        n=0
        for v in "${want[@]}"; do
            [[ $line == *"=${ADDR[$v]}:${SECTORS[$v]} "* ]] && n=$((n + 1))
        done
        ((n == ${#want[@]})) && { log "guest: $line"; return 0; }
        sleep 0.05
    done
    e2e_fail "guest disks: want ${want[*]} at ${ADDR[*]}, last: $line"
}
report_has() { # NAME: the report file maps NAME to ADDR[NAME]
    "$PY" - "$ROOT/guest-disks.json" "$1" "${ADDR[$1]}" <<'PY' || e2e_fail "report: $1 not at ${ADDR[$1]}: $(cat "$ROOT/guest-disks.json")"
import json, sys
r = json.load(open(sys.argv[1]))
d = [x for x in r["disks"] if x["volume"] == sys.argv[2]]
assert len(d) == 1 and d[0]["pci_address"] == sys.argv[3], d
assert d[0]["by_path"] == "/dev/disk/by-path/pci-" + sys.argv[3], d
PY
}
plug() { # NAME SIZE DIR: a ready volume renamed into place
    start_qsd "$1" "$2" "$3/.$1"
    mv "$3/.$1" "$3/$1"
    wait_log "msg=\"disk attached\" volume=$1 .*guest_address=${ADDR[$1]} " 30
}

# ---- first boot ------------------------------------------------------------
start_launcher --shutdown-timeout 10 --ready-timeout 10 --detach-timeout 30 \
    --console-log-max $LOG_MAX --cloud-init-dir "$WORK/ci"
wait_log 'msg="serial port connected"' 30
attach_console
wait_console '^READY' 1 120
boot1_ms=$(($(now_ms) - T0))
log "guest up ($boot1_ms ms since the test started)"

send "ping $TOKEN"
client_wait "^PONG $TOKEN" 20
# One client at a time: a second one is told so and let go.
sleep 5 | timeout 10 "$LAUNCHER" console --root "$ROOT" >"$WORK/console2.out" 2>&1 || true
grep -q 'the console is in use by another client' "$WORK/console2.out" ||
    e2e_fail "second console client: $(cat "$WORK/console2.out")"
log "console: reached through the attach socket; a second client refused"

send "net $HTTP_PORT"
wait_console "^FETCH " 1 60
[[ $(console '^FETCH ' | tail -1) == "FETCH $TOKEN" ]] || e2e_fail "fetch from the pod side: $(console '^FETCH |^NET|^DHCP')"
[[ $(console '^MAC ' | tail -1) == "MAC $MAC pci=$NIC_ADDR" ]] || e2e_fail "NIC: $(console '^MAC ')"
log "network: $(console '^NET ' | tail -1), fetched the pod's file, NIC $MAC at $NIC_ADDR"

send "listen 2222"
wait_console '^LISTENING 2222' 1 20
# Through the forward, the way SSH talks: the client sends its line at
# once, the guest sends a banner and answers.  (With Debian 12's passt,
# what the guest sends before the client has sent anything is held back
# until the client does: docs/launcher.md "Known limits".)
got=$("$PY" - "$FWD_PORT" "DATA-$TOKEN" <<'PY'
import socket, sys, time
end = time.monotonic() + 20
while True:
    try:
        s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
        break
    except OSError:
        if time.monotonic() > end:
            raise
        time.sleep(0.2)
s.sendall((sys.argv[2] + "\n").encode())
buf = b""
while b"REPLY" not in buf or not buf.endswith(b"\n"):
    d = s.recv(200)
    if not d:
        break
    buf += d
print(buf.decode().replace("\n", "|"))
PY
) || e2e_fail "port forward 127.0.0.1:$FWD_PORT: no connection"
[[ $got == "BANNER-FROM-GUEST|REPLY DATA-$TOKEN|" ]] || e2e_fail "port forward 127.0.0.1:$FWD_PORT -> guest 2222: got '$got'"
wait_console "^FWD-GOT DATA-$TOKEN\$" 1 20
log "port forward: pod 127.0.0.1:$FWD_PORT <-> guest :2222, both ways ($got)"

send "cidata $CIDATA_ADDR"
wait_console '^CIDATA-(END|FAIL)' 1 30
console '^CIDATA' >"$WORK/cidata.seen"
grep -q "^CIDATA dev=vd[a-z]* ro=1 files=meta-data,user-data,$" "$WORK/cidata.seen" || e2e_fail "cidata: $(cat "$WORK/cidata.seen")"
grep -qx "CIDATA-USER $want_md5" "$WORK/cidata.seen" || e2e_fail "cidata user-data: $(cat "$WORK/cidata.seen")"
grep -qx "CIDATA-META instance-id: iid-$TOKEN local-hostname: usable " "$WORK/cidata.seen" || e2e_fail "cidata meta-data: $(cat "$WORK/cidata.seen")"
! grep -q CIDATA-WRITABLE "$WORK/cidata.seen" || e2e_fail "cidata disk writable"
log "cidata: read-only, user-data from the description, meta-data from the Secret-like directory"

send "vport"
wait_console '^VPORT ' 1 20
[[ $(console '^VPORT ' | tail -1) == "VPORT org.qemu.guest_agent.0 " ]] || e2e_fail "guest agent port: $(console '^VPORT ')"

# Disks: root at start; zz, then data, then aa hot-plugged (names and plug
# order disagree: the old layout swapped such disks on restart).
disks_at root
plug zz 40M "$BRIDGE"
plug data 48M "$VOLS"
plug aa 32M "$BRIDGE"
disks_at root data zz aa
for v in root data zz aa; do report_has $v; done
log "disks at their slots: root ${ADDR[root]}, data ${ADDR[data]}, zz ${ADDR[zz]}, aa ${ADDR[aa]} (guest, log, report agree)"

# The console log stays bounded: ~45 KB of output, bound 16 KiB.
send "spam 400"
wait_console '^SPAM-DONE' 1 60
sz=$(stat -c %s "$WORK/console.log") sz1=$(stat -c %s "$WORK/console.log.1" 2>/dev/null || echo 0)
((sz <= LOG_MAX && sz1 > 0 && sz1 <= LOG_MAX)) || e2e_fail "console log: $sz + $sz1 bytes, bound $LOG_MAX"
log "console log bounded: console.log $sz B, console.log.1 $sz1 B (bound $LOG_MAX)"

send "off"
wait_launcher_exit 60
((EXIT_RC == 0)) || e2e_fail "first boot: launcher exit $EXIT_RC, want 0"
stop_pid "$CONSOLE_PID" TERM 5
exec 7>&-
cp "$WORK/launcher.log" "$WORK/launcher.1.log"

# ---- restart: every disk there at start --------------------------------------
T1=$(now_ms)
: >"$WORK/console-client.out"
start_launcher --shutdown-timeout 10 --ready-timeout 10 --detach-timeout 30 \
    --console-log-max $LOG_MAX --cloud-init-dir "$WORK/ci"
wait_log 'msg="serial port connected"' 30
attach_console
for v in root data zz aa; do
    grep -q "msg=\"disk attached\" volume=$v .*guest_address=${ADDR[$v]} at_start=1 " "$WORK/launcher.log" ||
        e2e_fail "restart: $v not at ${ADDR[$v]}: $(grep 'disk attached' "$WORK/launcher.log")"
done
disks_at root data zz aa
restart_ms=$(($(now_ms) - T1))
for v in root data zz aa; do report_has $v; done
log "after restart: same addresses ($restart_ms ms to the guest's disk list)"

# Unplug zz (aa stays), plug it again: back at its address.
mv "$BRIDGE/zz" "$WORK/zz.away"
wait_log 'msg="disk detached" volume=zz' 60
mv "$WORK/zz.away" "$BRIDGE/zz"
wait_log "msg=\"disk attached\" volume=zz .*guest_address=${ADDR[zz]} .*since_seen" 30
disks_at root data zz aa
log "zz unplugged and plugged again: back at ${ADDR[zz]}, aa kept ${ADDR[aa]}"

send "ping again-$TOKEN"
client_wait "^PONG again-$TOKEN" 20
send "off"
wait_launcher_exit 60
((EXIT_RC == 0)) || e2e_fail "second boot: launcher exit $EXIT_RC, want 0"
unexpected=$(cat "$WORK/launcher.1.log" "$WORK/launcher.log" | grep 'level=error' || true)
[[ -z $unexpected ]] || e2e_fail "errors logged: $unexpected"
total_ms=$(($(now_ms) - T0))
{
    echo "# $(date -u +%FT%TZ) $LAUNCHER"
    echo "FIGURES usable_vm_first_boot_ms=$boot1_ms restart_to_disks_ms=$restart_ms total_ms=$total_ms"
} | tee -a "$BUILD_CACHE/figures.txt"
echo PASS
