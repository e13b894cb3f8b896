#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# unit/qmp_layer: QMP commands are built and sent by the command layer only
# (qsdctl/lib/qsd/qemu/qmpcmd.[ch] on the transport qmp.[ch]).  Fails naming
# every other source file under csi/, qsdctl/ or launcher/ that writes a QMP
# "execute" or calls the transport's send functions itself.
# Usage: qmp_layer.sh SOURCE_ROOT
set -u
root=${1:?usage: qmp_layer.sh SOURCE_ROOT}
LAYER='qsdctl/lib/qsd/qemu/(qmp|qmpcmd)\.[ch]$'
PATTERN='"execute"|\bqmp_send(_owned)?[[:space:]]*\(|\bqmp_sync_call[[:space:]]*\('

# Print "file:line: text" for every offending line under dir $1.
offenders() {
    (cd "$1" && find csi qsdctl launcher -type f \( -name '*.c' -o -name '*.h' \) 2>/dev/null |
        LC_ALL=C sort | grep -Ev "$LAYER" | while read -r f; do
            grep -nE "$PATTERN" "$f" | sed "s|^|$f:|"
        done)
}

# The check must be able to fail: a planted offender is found, and the
# layer itself does call the transport (else the pattern matches nothing).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/csi"
printf 'static void f(struct qmp *q)\n{\n    qmp_send(q, "quit", NULL, 1, NULL, NULL);\n}\n' >"$tmp/csi/planted.c"
if [ -z "$(offenders "$tmp")" ]; then
    echo "FAIL: the check does not see a planted qmp_send() call" >&2
    exit 1
fi
if ! grep -qE "$PATTERN" "$root/qsdctl/lib/qsd/qemu/qmpcmd.c"; then
    echo "FAIL: qmpcmd.c does not call the transport: is the pattern still right?" >&2
    exit 1
fi

found=$(offenders "$root")
if [ -n "$found" ]; then
    echo "FAIL: QMP commands built or sent outside qsdctl/lib/qsd/qemu/qmpcmd.c (use a typed wrapper of qmpcmd.h):" >&2
    echo "$found" >&2
    exit 1
fi
echo "ok: only the command layer sends QMP commands"
