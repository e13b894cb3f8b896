#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# unit/versions: every installed binary prints the build's version with
# --version, exits 0, and prints nothing else; the version is the one CMake
# computed (CMakeLists.txt: git describe, or the project() version +unknown).
# Usage: versions.sh EXPECTED_VERSION BINARY...
set -u
want=${1:?usage: versions.sh EXPECTED_VERSION BINARY...}
shift
[ $# -gt 0 ] || { echo "FAIL: no binary given" >&2; exit 1; }
# the shape CMakeLists.txt promises: X.Y.Z, then -N-gHASH or +gHASH or
# +unknown, then optionally -dirty
re='^[0-9]+\.[0-9]+\.[0-9]+((-[0-9]+-g[0-9a-f]+)|(\+g[0-9a-f]+)|(\+unknown))?(-dirty)?$'
if ! [[ $want =~ $re ]]; then
    echo "FAIL: the build's version '$want' does not have the documented shape" >&2
    exit 1
fi
fail=0
for b in "$@"; do
    name=$(basename "$b")
    out=$("$b" --version 2>&1)
    rc=$?
    if [ $rc -ne 0 ] || [ "$out" != "$name $want" ]; then
        echo "FAIL: $name --version: exit $rc, printed '$out' (want '$name $want')" >&2
        fail=1
    else
        echo "ok: $out"
    fi
done
exit $fail
