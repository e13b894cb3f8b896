#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# unit/spdx: every source file (C, headers, shell, Python, CMake) in git
# names its license (SPDX-License-Identifier) in its first three lines.
# Usage: spdx.sh SOURCE_ROOT
set -u
root=${1:?usage: spdx.sh SOURCE_ROOT}

# missing DIR FILE...: print each FILE (relative to DIR) without the tag.
missing() {
    local dir=$1 f; shift
    for f in "$@"; do
        head -3 "$dir/$f" | grep -q 'SPDX-License-Identifier: Apache-2.0' || echo "$f"
    done
}

# The check must be able to fail.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '/* SPDX-License-Identifier: Apache-2.0 */\n' >"$tmp/a.c"
printf '#!/bin/sh\n# no license\n' >"$tmp/b.sh"
if [ "$(missing "$tmp" a.c b.sh)" != b.sh ]; then
    echo "FAIL: the check itself is broken on planted files"; exit 1
fi

cd "$root" || exit 1
mapfile -t files < <(git ls-files '*.c' '*.h' '*.sh' '*.py' 'CMakeLists.txt' '*/CMakeLists.txt' 2>/dev/null)
[ ${#files[@]} -gt 100 ] || { echo "FAIL: only ${#files[@]} source files found in $root (not a git tree?)"; exit 1; }
bad=$(missing . "${files[@]}")
if [ -n "$bad" ]; then
    echo "FAIL: no SPDX-License-Identifier in the first 3 lines of:"; echo "$bad" | sed 's/^/  /'; exit 1
fi
echo "ok: ${#files[@]} source files carry SPDX-License-Identifier: Apache-2.0"
