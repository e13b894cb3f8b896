#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# tests/cbt/build.sh: builds the SnapshotMetadata test client (main.go,
# its own go.mod) once into a cache directory.
#
#   tests/cbt/build.sh [CACHE_DIR]     (default $QSD_CBT_DIR, else
#                                      /var/cache/qsd-csi/cbt)
#
# CACHE_DIR/cbt-client, stamped (CACHE_DIR/cbt-client.version) with the
# SHA-256 of main.go, go.mod and go.sum: rebuilt only when they change.
# Builds hold CACHE_DIR/.lock (flock, waited for at most 10 minutes), so
# that scripts/test.sh's background build and the test build once.  A cold
# build fetches its modules from the Go module proxy (about 25 s on 2
# cores with the module cache warm).  Prints the binary's path.
# Exit 0: built or up to date; 1: Go missing or the build failed (the test
# fails rather than skips: it is part of the suite).
set -euo pipefail
src=$(cd "$(dirname "$0")" && pwd)
cache=${1:-${QSD_CBT_DIR:-/var/cache/qsd-csi/cbt}}
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock -w 600 9 || { echo "FAIL: $cache/.lock held for 10 minutes" >&2; exit 1; }
want=$(cat "$src/main.go" "$src/go.mod" "$src/go.sum" | sha256sum | cut -d' ' -f1)
bin=$cache/cbt-client
if [[ -x "$bin" && "$(cat "$bin.version" 2>/dev/null)" == "$want" ]]; then
    echo "$bin"
    exit 0
fi
go=${QSD_GO:-$(command -v go || echo /usr/local/go/bin/go)}
if [[ ! -x "$go" ]]; then
    echo "FAIL: Go is not installed (needed to build $bin from tests/cbt)" >&2
    exit 1
fi
tmp=$(mktemp "$cache/build.XXXXXX")
trap 'rm -f "$tmp"' EXIT
(cd "$src" && GOFLAGS=-modcacherw "$go" build -trimpath -o "$tmp" .) >&2 ||
    { echo "FAIL: go build of tests/cbt failed" >&2; exit 1; }
mv -f "$tmp" "$bin"
echo "$want" >"$bin.version"
echo "$bin"
