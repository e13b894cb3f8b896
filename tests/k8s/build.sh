#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build the test cluster's Go binaries from the module proxy at the versions
# pinned here, into a cache directory keyed by the pins, and print how long
# each piece took.  Owns: the go build invocations and the binary cache; not
# the images (images.sh) nor the cluster (cluster.sh).
#
#   tests/k8s/build.sh [--out DIR] [--jobs N] [PIECE...]
#     PIECE    kube (the five Kubernetes binaries), etcd, containerd (with its
#              runc shim and ctr), sidecars, cbt (the changed-block
#              tracking sidecar and client alone; sidecars includes them),
#              csi-sanity;
#              default: all of them
#     --out    cache root (default $QSD_K8S_CACHE, else /var/cache/qsd-csi/k8s); binaries land in
#              ROOT/bin/<hash of the pins>/ and the last line printed is
#              "BIN <that directory>"
#     --jobs   go build -p (default 1: these machines are shared; raise it
#              only when /proc/pressure/cpu is low)
#
# The two sidecars the module proxy refuses are built from git clones
# (QSD_K8S_GIT_DIR) when there are any, else from standin/ (build_standin).
# Changed-block tracking (cbt): the csi-snapshot-metadata sidecar from the
# proxy (sidecars.txt "cbt" and "nested" lines) and cbt-lister/, our command
# line around upstream's client library (its README says why not upstream's
# snapshot-metadata-lister).
#
# Pins: go.mod/go.sum here (k8s.io/kubernetes and its staging modules),
# containerd/go.mod (containerd 2.x: containerd/go.mod says why not
# Debian's), etcd/go.mod (etcd's server, the release Kubernetes' build/dependencies.yaml
# names), sidecars.txt (module@version of each sidecar and csi-sanity, with
# the module zip's go.sum hash checked before building).  Go's build cache
# stays where go puts it (~/.cache/go-build), so a second run only links.
# A piece already in the cache directory is not rebuilt; --force rebuilds.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${QSD_K8S_CACHE:-/var/cache/qsd-csi/k8s}
jobs=1
force=0
pieces=()
while [ $# -gt 0 ]; do
    case $1 in
    --out) out=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --force) force=1; shift ;;
    kube|etcd|containerd|sidecars|cbt|csi-sanity) pieces+=("$1"); shift ;;
    *) echo "build.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
done
[ ${#pieces[@]} -gt 0 ] || pieces=(kube etcd containerd sidecars csi-sanity)

key=$(cat "$here/go.mod" "$here/go.sum" "$here/etcd/go.mod" "$here/etcd/go.sum" \
          "$here/containerd/go.mod" "$here/containerd/go.sum" "$here/sidecars.txt" \
          "$here/cbt-lister/go.mod" "$here/cbt-lister/go.sum" |
      sha256sum | cut -c1-16)
bin=$out/bin/$key
mkdir -p "$bin" "$out/src"
export CGO_ENABLED=0
export GOFLAGS="-buildvcs=false -p=$jobs -trimpath"

kube_pins=$(cat "$here/go.mod" "$here/go.sum")
kube_version=$(sed -n 's/^require k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$here/go.mod")
[ -n "$kube_version" ] || { echo "build.sh: no k8s.io/kubernetes pin in go.mod" >&2; exit 1; }
major=${kube_version#v}; minor=${major#*.}; minor=${minor%%.*}; major=${major%%.*}
# What hack/lib/version.sh stamps: without it every binary says v0.0.0 and
# kubectl and the sidecars' version checks see a server of v0.0.0.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=$major"
    ldflags+=" -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
    ldflags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

# Each binary is built into pieces/<name>-<hash of its pins>/ and linked into
# the directory of the whole set, so that changing one pin rebuilds one piece.
piece_of() { # NAME PIN-TEXT: the piece's directory
    echo "$out/pieces/$1-$(printf '%s' "$2" | sha256sum | cut -c1-16)"
}

cached() { # NAME PIN-TEXT: link and say so if the piece is there
    local piece
    piece=$(piece_of "$1" "$2")
    [ $force = 0 ] && [ -x "$piece/$1" ] || return 1
    ln -sfn "$piece/$1" "$bin/$1"; echo "TIME $1 cached 0"
}

timed() { # NAME PIN-TEXT CMD...: build (CMD's @OUT@ is the output) unless cached
    local name=$1 piece
    piece=$(piece_of "$1" "$2"); shift 2
    if [ $force = 1 ] || [ ! -x "$piece/$name" ]; then
        local t0=$SECONDS
        mkdir -p "$piece"
        nice -n 15 "${@/#@OUT@/$piece/$name.tmp}"
        mv "$piece/$name.tmp" "$piece/$name"
        echo "TIME $name built $((SECONDS - t0))"
    else
        echo "TIME $name cached 0"
    fi
    ln -sfn "$piece/$name" "$bin/$name"
}

build_kube() {
    local cmd
    for cmd in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
        (cd "$here" && timed "$cmd" "$kube_pins$ldflags" \
            go build -ldflags "$ldflags" -o @OUT@ "k8s.io/kubernetes/cmd/$cmd")
    done
}

build_etcd() {
    (cd "$here/etcd" && timed etcd "$(cat go.mod go.sum)" \
        go build -ldflags "-s -w" -o @OUT@ go.etcd.io/etcd/server/v3)
}

build_containerd() {
    local ver cmd
    ver=$(sed -n 's/^\tgithub.com\/containerd\/containerd\/v2 \(v[0-9.]*\).*/\1/p' "$here/containerd/go.mod")
    for cmd in containerd containerd-shim-runc-v2 ctr; do
        (cd "$here/containerd" && timed "$cmd" "$(cat go.mod go.sum)" \
            go build -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$ver" \
            -o @OUT@ "github.com/containerd/containerd/v2/cmd/$cmd")
    done
}

# A module from the proxy, its go.sum hash checked: prints its directory
# in the module cache.
download() { # MODULE VERSION SUM
    local info got
    info=$(cd /tmp && go mod download -json "$1@$2") || {
        echo "build.sh: $1@$2 cannot be had from the module proxy:" >&2
        echo "$info" >&2; return 1; }
    got=$(sed -n 's/^\t"Sum": "\(.*\)",$/\1/p' <<<"$info")
    [ "$got" = "$3" ] || { echo "build.sh: $1@$2: sum $got, pinned $3" >&2; return 1; }
    sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$info"
}

# The "nested" lines of sidecars.txt for sidecar NAME: MODULE VERSION SUM PATH.
nested_of() { awk -v n="$1" '$1 == "nested" && $2 == n {print $3, $4, $5, $6}' "$here/sidecars.txt"; }

# A sidecar module is built from its own go.mod and go.sum (the pins its
# release was tested with), in a copy of the module's tree.  The module zip
# has no vendor/ and none of the nested modules its go.mod replaces by a
# path (./client):
#   - a "nested" line of sidecars.txt names the module and version that
#     fill that path (external-snapshot-metadata v1.1.0's ./client is
#     client/v1.0.0 on the proxy: the same tree, client/v1.1.0 is not
#     served);
#   - otherwise the replace becomes the same version from the proxy (the
#     snapshotter's client/v8).
build_module() { # NAME MODULE VERSION SUM PACKAGE...
    local name=$1 mod=$2 ver=$3 sum=$4; shift 4
    local dir src=$out/src/${mod//\//_}@$ver nested pins nmod nver nsum npath
    nested=$(nested_of "$name")
    pins="$mod $ver $sum $*${nested:+ $nested}"
    cached "$name" "$pins" && return 0
    dir=$(download "$mod" "$ver" "$sum") || return 1
    rm -rf "$src"; cp -r "$dir" "$src"; chmod -R u+w "$src"
    while read -r nmod nver nsum npath; do
        [ -n "$nmod" ] || continue
        dir=$(download "$nmod" "$nver" "$nsum") || return 1
        rm -rf "${src:?}/$npath"; cp -r "$dir" "$src/$npath"; chmod -R u+w "$src/$npath"
    done <<<"$nested"
    local r
    for r in $(cd "$src" && go mod edit -json | python3 -c '
import json, os, sys
for r in json.load(sys.stdin).get("Replace") or []:
    p = r["New"]["Path"]
    if p.startswith("./") and not os.path.isfile(os.path.join(p, "go.mod")): print(r["Old"]["Path"])'); do
        (cd "$src" && go mod edit -dropreplace "$r" && go mod edit -require "$r@$ver")
    done
    (cd "$src" && timed "$name" "$pins" \
        env GOFLAGS="$GOFLAGS -mod=mod" go build -ldflags "-s -w -X main.version=$ver" -o @OUT@ "$@")
}

# A release built from a git clone (the repository is not on the module
# proxy): QSD_K8S_GIT_DIR/<owner>+<name>/repo or QSD_K8S_GIT_DIR/<name>, a
# clone holding TAG at COMMIT; built with the tag's vendor/ tree.
build_git() { # NAME REPOSITORY TAG COMMIT PACKAGE
    local name=$1 repo=$2 tag=$3 commit=$4 pkg=$5 owner_name git got src
    cached "$name" "$repo $tag $commit $pkg" && return 0
    owner_name=${repo#github.com/}
    for git in "${QSD_K8S_GIT_DIR:-/nonexistent}/${owner_name/\//+}/repo" \
               "${QSD_K8S_GIT_DIR:-/nonexistent}/${owner_name#*/}"; do
        [ -d "$git" ] && break
    done
    if [ ! -d "$git" ]; then
        echo "build.sh: $name: no clone of $repo in QSD_K8S_GIT_DIR: building the stand-in standin/$name" >&2
        build_standin "$name"; return
    fi
    got=$(git -C "$git" rev-parse "$tag^{commit}" 2>/dev/null) || got=none
    [ "$got" = "$commit" ] || { echo "build.sh: $repo $tag is $got, pinned $commit" >&2; return 1; }
    src=$out/src/${repo//\//_}@$tag
    rm -rf "$src"; mkdir -p "$src"
    git -C "$git" archive "$commit" | tar -x -C "$src"
    (cd "$src" && timed "$name" "$repo $tag $commit $pkg" \
        env GOFLAGS="$GOFLAGS -mod=vendor" GOPROXY=off go build \
        -ldflags "-s -w -X main.version=$tag" -o @OUT@ "$pkg")
}

# Where a clone is not at hand (the module proxy refuses both repositories,
# so CI machines have none), standin/<name>/ is built in its place: a small
# program of ours doing what kubelet and the manifests need of that sidecar
# (README.md says what each does and does not do).  build.sh says so with a
# STANDIN line.
build_standin() { # NAME
    local name=$1
    (cd "$here" && timed "$name" "$kube_pins$(cat "standin/$name/main.go")" \
        go build -ldflags "-s -w" -o @OUT@ "./standin/$name")
    echo "STANDIN $name"
}

# The changed-block tracking client (cbt-lister/: its own module, pinned
# by its go.mod and go.sum).
build_cbt_lister() {
    (cd "$here/cbt-lister" && timed cbt-lister "$(cat go.mod go.sum main.go)" \
        go build -ldflags "-s -w" -o @OUT@ .)
}

build_list() { # KIND: build the lines of sidecars.txt of that kind
    local kind=$1 k name mod ver sum pkg
    while read -r k name mod ver sum pkg; do
        case $k in ''|'#'*) continue ;; esac
        [ "$k" = "$kind" ] || continue
        if [ "$k" = git ]; then build_git "$name" "$mod" "$ver" "$sum" "$pkg"
        else build_module "$name" "$mod" "$ver" "$sum" "$pkg"; fi
    done <"$here/sidecars.txt"
}

for p in "${pieces[@]}"; do
    case $p in
    kube) build_kube ;;
    etcd) build_etcd ;;
    containerd) build_containerd ;;
    sidecars) build_list sidecar; build_list git; build_list cbt; build_cbt_lister ;;
    cbt) build_list cbt; build_cbt_lister ;;
    csi-sanity) build_list sanity ;;
    esac
done
echo "BIN $bin"
