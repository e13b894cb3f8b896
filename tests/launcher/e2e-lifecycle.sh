#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# End-to-end lifecycle: a guest that does not release an unplugged disk is
# reported after --detach-timeout; SIGTERM asks the guest to shut down; a
# guest that does not (this one ignores the power button) is destroyed after
# --shutdown-timeout, the launcher exits 3, and no QEMU is left behind.
SRC=$(cd "$(dirname "$0")" && pwd)
source "$SRC/e2e-lib.sh"

guest "$SRC/guest-idle.sh"
start_qsd vol1 16M "$VOLS/vol1"
# The fast data-path check before the VM takes the socket (one client at a time).
if [[ -n ${QSDCTL:-} ]]; then
    "$QSDCTL" verify --size $((16 << 20)) "$VOLS/vol1/vhost.sock" >"$WORK/verify.log" 2>&1 ||
        { cat "$WORK/verify.log"; e2e_fail "qsdctl verify of vol1 failed"; }
    log "qsdctl verify: $(tail -1 "$WORK/verify.log")"
fi
# acpiphp.disable=1: the guest ignores unplug requests (QEMU's q35 uses ACPI
# hot-plug), so a detach is never completed.
vm_json life '[{"volume": "vol1"}]' acpiphp.disable=1
start_launcher --shutdown-timeout 3 --detach-timeout 3
wait_console '^IDLE-READY' 1 180

# A disk the guest does not release: reported after --detach-timeout.
mv "$VOLS/vol1" "$WORK/vol1.removed"
wait_log 'msg="detach requested" volume=vol1 target=vda' 20
wait_log 'msg="guest did not release disk" volume=vol1 target=vda' 20
log "unreleased disk reported"
stop_destroyed life 3 'msg="stop requested, asking guest to shut down" signal=15 timeout_s=3'
log "SIGTERM -> destroyed after $ELAPSED_MS ms, exit 3"
echo PASS
