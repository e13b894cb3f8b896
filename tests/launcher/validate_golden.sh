#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Validate every golden domain XML against libvirt's own schema
# (virt-xml-validate, libvirt-clients).  A hot-plug disk fragment is validated
# inside a minimal domain.  Exits 77 (skip) only when the validator is absent.
set -euo pipefail
dir=${1:?usage: validate_golden.sh GOLDEN_DIR}
command -v virt-xml-validate >/dev/null || { echo "virt-xml-validate missing (libvirt-clients)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
for f in "$dir"/*.xml; do
    if head -c 5 "$f" | grep -q '^<disk'; then
        { echo "<domain type='qemu'><name>frag</name><memory>65536</memory>"
          echo "<os><type arch='x86_64' machine='q35'>hvm</type></os><devices>"
          cat "$f"
          echo "</devices></domain>"; } > "$tmp/frag.xml"
        virt-xml-validate "$tmp/frag.xml" domain >/dev/null || { echo "INVALID $f"; exit 1; }
    else
        virt-xml-validate "$f" domain >/dev/null || { echo "INVALID $f"; exit 1; }
    fi
    n=$((n + 1))
done
((n > 0)) || { echo "no golden XML in $dir"; exit 1; }
echo "$n golden XML files valid"
