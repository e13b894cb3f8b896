#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# tests/gotool.sh: builds Go tools the tests need (helm, promtool,
# prometheus) from the Go module proxy, once, into a cache directory.
#
#   tests/gotool.sh [--tags TAGS] CACHE_DIR VERSION PKG...
#
# For each PKG (a main package, e.g. helm.sh/helm/v3/cmd/helm), the binary
# CACHE_DIR/NAME (NAME: the last element of PKG) is `go install PKG@VERSION`,
# built with -tags TAGS when given, and CACHE_DIR/NAME.version its stamp:
# VERSION, followed by " tags=TAGS" when built with tags.  A binary whose
# stamp is not the one asked for is built again.  Builds hold
# CACHE_DIR/.lock (flock, waited for at most 30 minutes), so that two tests
# started together build once; a build goes to a temporary directory in
# CACHE_DIR and is moved into place only when it succeeded.
# Go: QSD_GO, else PATH, else /usr/local/go/bin/go (the official tarball's).
# Exit 0: every binary is there; 1: a build failed, or the lock stayed held;
# 77 (ctest's skip): one is missing and there is no Go to build it.
set -euo pipefail

tags=
if [[ ${1:-} == --tags ]]; then
    tags=$2
    shift 2
fi
if (( $# < 3 )); then
    echo "usage: $0 [--tags TAGS] CACHE_DIR VERSION PKG..." >&2
    exit 1
fi
cache=$1 version=$2
shift 2
want=$version${tags:+ tags=$tags}

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock -w 1800 9 || { echo "FAIL: $cache/.lock held for 30 minutes"; exit 1; }

for pkg in "$@"; do
    name=${pkg##*/}
    bin=$cache/$name
    stamp=$cache/$name.version
    if [[ -x "$bin" && "$(cat "$stamp" 2>/dev/null)" == "$want" ]]; then
        continue
    fi
    go=${QSD_GO:-$(command -v go || echo /usr/local/go/bin/go)}
    if [[ ! -x "$go" ]]; then
        echo "SKIP: Go is not installed (needed once to build $name $want" \
             "from the Go module proxy into $cache)"
        exit 77
    fi
    tmp=$(mktemp -d "$cache/build.XXXXXX")
    start=$(date +%s)
    echo "building $name $want with $("$go" version) (a cold build takes minutes)"
    if ! GOBIN=$tmp GOFLAGS=-modcacherw "$go" install ${tags:+-tags "$tags"} "$pkg@$version"; then
        rm -rf "$tmp"
        echo "FAIL: go install of $name $want failed"
        exit 1
    fi
    mv -f "$tmp/$name" "$bin"
    rm -rf "$tmp"
    echo "$want" >"$stamp"
    echo "built $name $want in $(( $(date +%s) - start )) s"
done
