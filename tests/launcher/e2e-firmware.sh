#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# End-to-end: legacy-guest and firmware options boot a real TCG guest.
#   - "machine": "pc" with "pci_hole64": false: QEMU gets
#     i440FX-pcihost.pci-hole64-size=0 and the guest runs;
#   - "firmware": "uefi" with "pci_hole64": false on q35: OVMF boots the
#     kernel (the guest sees /sys/firmware/efi), q35-pcihost.pci-hole64-size=0.
SRC=$(cd "$(dirname "$0")" && pwd)
source "$SRC/e2e-lib.sh"
[[ -d /usr/share/OVMF ]] || e2e_skip "ovmf not installed (scripts/setup.sh)"
guest "$SRC/guest-idle.sh"
cp "$BUILD_CACHE/guest/initramfs.img" "$WORK/plain.img"

boot() { # NAME EXTRA_JSON CMD: boot, wait for the guest to power off, exit 0
    local name=$1 extra=$2 cmd=$3
    cat >"$WORK/vm.json" <<JSON
{"name": "$name", "memory_mib": 256, "accel": "tcg", "network": false, $extra,
 "boot": {"kernel": "$WORK/vmlinuz", "initrd": "$WORK/plain.img",
          "cmdline": "console=ttyS0 panic=-1 quiet guest.cmd=$cmd"},
 "console_log": "$WORK/console.log", "hotplug_slots": 1}
JSON
    rm -f "$WORK/console.log"
    local t0
    t0=$(now_ms)
    start_launcher --shutdown-timeout 5
    wait_launcher_exit 150
    ((EXIT_RC == 0)) || e2e_fail "$name: launcher exit $EXIT_RC"
    log "$name: booted and powered off in $(($(now_ms) - t0)) ms"
}

boot legacy '"machine": "pc", "pci_hole64": false' 'echo+LEGACY-OK'
grep -aq '^LEGACY-OK' <(tr -d '\r' <"$WORK/console.log") || e2e_fail "pc guest did not run"
grep -q 'i440FX-pcihost.pci-hole64-size=0K' "$ROOT/log/qemu/legacy.log" ||
    e2e_fail "no i440FX-pcihost.pci-hole64-size=0 on QEMU's command line"

boot uefi '"firmware": "uefi", "pci_hole64": false' 'echo+UEFI-OK+$(ls+/sys/firmware/efi+|+grep+-c+efivars)'
grep -aq '^UEFI-OK 1' <(tr -d '\r' <"$WORK/console.log") || e2e_fail "UEFI guest: $(tr -d '\r' <"$WORK/console.log" | tail -3)"
grep -q 'q35-pcihost.pci-hole64-size=0K' "$ROOT/log/qemu/uefi.log" ||
    e2e_fail "no q35-pcihost.pci-hole64-size=0 on QEMU's command line"
grep -q 'OVMF' "$ROOT/log/qemu/uefi.log" || e2e_fail "no OVMF firmware on QEMU's command line"
echo PASS
