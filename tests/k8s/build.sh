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
# The changed-block tracking pieces (sidecars.txt "gitonly": the
# csi-snapshot-metadata sidecar and its snapshot-metadata-lister client)
# have no stand-in: without a clone they are not built ("NOTBUILT <name>"),
# and the cluster runs without them (install.sh, e2e.sh's cbt step).
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
          "$here/containerd/go.mod" "$here/containerd/go.sum" "$here/sidecars.txt" |
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

# A sidecar module is built from its own go.mod and go.sum (the pins its
# release was tested with), in a copy of the module's tree: the module zip
# has no vendor/ and, for the snapshotter, not its nested client module, which
# its go.mod replaces by a path; that replace becomes the same version from
# the proxy.
build_module() { # NAME MODULE VERSION SUM PACKAGE...
    local name=$1 mod=$2 ver=$3 sum=$4; shift 4
    local info dir got src=$out/src/${mod//\//_}@$ver
    cached "$name" "$mod $ver $sum $*" && return 0
    info=$(cd /tmp && go mod download -json "$mod@$ver") || {
        echo "build.sh: $mod@$ver cannot be had from the module proxy:" >&2
        echo "$info" >&2; return 1; }
    dir=$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$info")
    got=$(sed -n 's/^\t"Sum": "\(.*\)",$/\1/p' <<<"$info")
    [ "$got" = "$sum" ] || { echo "build.sh: $mod@$ver: sum $got, pinned $sum" >&2; return 1; }
    rm -rf "$src"; cp -r "$dir" "$src"; chmod -R u+w "$src"
    local r
    for r in $(cd "$src" && go mod edit -json | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    if r["New"]["Path"].startswith("./"): print(r["Old"]["Path"])'); do
        (cd "$src" && go mod edit -dropreplace "$r" && go mod edit -require "$r@$ver")
    done
    (cd "$src" && timed "$name" "$mod $ver $sum $*" \
        env GOFLAGS="$GOFLAGS -mod=mod" go build -ldflags "-s -w -X main.version=$ver" -o @OUT@ "$@")
}

# A release built from a git clone (the repository is not on the module
# proxy): QSD_K8S_GIT_DIR/<owner>+<name>/repo or QSD_K8S_GIT_DIR/<name>, a
# clone holding TAG at COMMIT; built with the tag's vendor/ tree.
build_git() { # NAME REPOSITORY TAG COMMIT PACKAGE [KIND]
    local name=$1 repo=$2 tag=$3 commit=$4 pkg=$5 kind=${6:-git} owner_name git got src
    cached "$name" "$repo $tag $commit $pkg" && return 0
    owner_name=${repo#github.com/}
    for git in "${QSD_K8S_GIT_DIR:-/nonexistent}/${owner_name/\//+}/repo" \
               "${QSD_K8S_GIT_DIR:-/nonexistent}/${owner_name#*/}"; do
        [ -d "$git" ] && break
    done
    if [ ! -d "$git" ] && [ "$kind" = gitonly ]; then
        echo "build.sh: $name: no clone of $repo in QSD_K8S_GIT_DIR: not built" >&2
        echo "NOTBUILT $name"; return 0
    fi
    if [ ! -d "$git" ]; then
        echo "build.sh: $name: no clone of $repo in QSD_K8S_GIT_DIR: building the stand-in standin/$name" >&2
        build_standin "$name"; return
    fi
    got=$(git -C "$git" rev-parse "$tag^{commit}" 2>/dev/null) || got=none
    [ "$got" = "$commit" ] || { echo "build.sh: $repo $tag is $got, pinned $commit" >&2; return 1; }
    src=$out/src/${repo//\//_}@$tag
    rm -rf "$src"; mkdir -p "$src"
    git -C "$git" archive "$commit" | tar -x -C "$src"
    # A package that is a nested module of its own (external-snapshot-metadata's
    # tools/snapshot-metadata-lister) is built as a package of the tag's
    # outer module: with the outer vendor/ tree, so with the code of the same
    # tag (its own go.mod pins an older release of the outer module).
    rm -f "$src/$pkg/go.mod" "$src/$pkg/go.sum"
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

build_list() { # KIND: build the lines of sidecars.txt of that kind
    local kind=$1 k name mod ver sum pkg
    while read -r k name mod ver sum pkg; do
        case $k in ''|'#'*) continue ;; esac
        [ "$k" = "$kind" ] || continue
        if [ "$k" = git ] || [ "$k" = gitonly ]; then build_git "$name" "$mod" "$ver" "$sum" "$pkg" "$k"
        else build_module "$name" "$mod" "$ver" "$sum" "$pkg"; fi
    done <"$here/sidecars.txt"
}

for p in "${pieces[@]}"; do
    case $p in
    kube) build_kube ;;
    etcd) build_etcd ;;
    containerd) build_containerd ;;
    sidecars) build_list sidecar; build_list git; build_list gitonly ;;
    cbt) build_list gitonly ;;
    csi-sanity) build_list sanity ;;
    esac
done
echo "BIN $bin"
