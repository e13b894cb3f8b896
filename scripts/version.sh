#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The project's version, the one mechanism behind every binary's --version,
# qsd_csi_build_info and the image tags (README.md, "Versions and releases").
# CMakeLists.txt runs it at configure time; scripts/build-images.sh runs it
# for its tags and passes the result into the build image (which has no .git).
#
#   scripts/version.sh              VERSION and REVISION, one per line
#   scripts/version.sh --image-tag  VERSION as an image tag ('+' -> '-': a
#                                   tag may not hold '+')
#
# VERSION, from `git describe --tags --dirty --always --match 'v[0-9]*'`:
#   on a release tag vX.Y.Z   X.Y.Z
#   N commits after it        X.Y.Z-N-gHASH
#   before any release tag    P+gHASH (P: the project() version of CMakeLists.txt)
#   outside git (a tarball)   P+unknown
#   uncommitted changes       the same, then -dirty
# REVISION: the full commit, or "unknown" outside git.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
project=$(sed -n 's/^project(qsd-csi VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
[ -n "$project" ] || { echo "version.sh: no project() version in CMakeLists.txt" >&2; exit 1; }

if d=$(git -C "$root" describe --tags --dirty --always --match 'v[0-9]*' 2>/dev/null) &&
    rev=$(git -C "$root" rev-parse HEAD 2>/dev/null); then
    case $d in
    v[0-9]*.[0-9]*.[0-9]*) version=${d#v} ;;
    *) version=$project+g$d ;;   # no release tag: describe printed the commit
    esac
else
    version=$project+unknown
    rev=unknown
fi

case ${1:-} in
"") printf '%s\n%s\n' "$version" "$rev" ;;
--image-tag) printf '%s\n' "$version" | tr + - ;;
*) echo "version.sh: unknown argument $1 (none, or --image-tag)" >&2; exit 2 ;;
esac
