#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# unit/files_doc: docs/files.md maps every source file to what it owns.
# Fails naming each .c/.h file under csi/, qsdctl/ or launcher/ that the page
# does not name (as `path`), and each file the page names that does not exist.
# Usage: files_doc.sh SOURCE_ROOT
set -u
root=${1:?usage: files_doc.sh SOURCE_ROOT}

# check DIR: print the problems of DIR's tree against DIR/docs/files.md.
check() {
    local dir=$1 doc=$1/docs/files.md
    [ -f "$doc" ] || { echo "docs/files.md is missing"; return; }
    (cd "$dir" && find csi qsdctl launcher -type f \( -name '*.c' -o -name '*.h' \) 2>/dev/null) |
        LC_ALL=C sort | while read -r f; do
            grep -qF "\`$f\`" "$doc" || echo "not in docs/files.md: $f"
        done
    grep -oE '`(csi|qsdctl|launcher)/[^`]*\.[ch]`' "$doc" | tr -d '`' | LC_ALL=C sort -u |
        while read -r f; do
            [ -f "$dir/$f" ] || echo "docs/files.md names a file that does not exist: $f"
        done
}

# The check must be able to fail, both ways.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/csi" "$tmp/docs"
touch "$tmp/csi/a.c" "$tmp/csi/b.h"
printf '| `csi/a.c` | a |\n| `csi/gone.c` | gone |\n' >"$tmp/docs/files.md"
got=$(check "$tmp")
if ! grep -q 'not in docs/files.md: csi/b.h' <<<"$got" ||
   ! grep -q 'does not exist: csi/gone.c' <<<"$got" || grep -q 'csi/a.c' <<<"$got"; then
    echo "FAIL: the check itself is broken on a planted tree: $got" >&2
    exit 1
fi

problems=$(check "$root")
if [ -n "$problems" ]; then
    echo "FAIL: docs/files.md is out of date (add each file with what it owns):" >&2
    echo "$problems" >&2
    exit 1
fi
echo "ok: docs/files.md names every source file under csi/, qsdctl/, launcher/"
