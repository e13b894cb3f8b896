#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build the node plugin and launcher images from deploy/images/ with podman,
# offline-capable: without a registry, the base image is a Debian 13 (trixie)
# made by debootstrap from Debian's archive (minbase; trixie, -updates,
# -security and -backports sources: QEMU 11.1 comes from trixie-backports),
# imported as localhost/qsd-csi/debian:trixie when missing and reused when
# present.  Layer caches are kept between runs.
#
#   scripts/build-images.sh [options]
#     --tag TAG           image tag, the only one (default: the version,
#                         scripts/version.sh --image-tag, e.g. 0.2.0 on a release
#                         tag, 0.2.0-3-gabc1234 after it, 0.1.0-gabc1234 before
#                         any; and also the project() version of CMakeLists.txt,
#                         the tag deploy/ names, e.g. 0.1.0)
#     --sanitize          CMake -DSANITIZE=ON -DCMAKE_BUILD_TYPE=Debug, the ASan/UBSan
#                         runtime libraries in the images, tag suffix -asan
#     --cmake-args ARGS   extra CMake arguments for the build stage
#     --base IMAGE        base image, Debian 13 (default localhost/qsd-csi/debian:trixie;
#                         a missing localhost/ image is made here with debootstrap;
#                         with a registry: docker.io/library/debian:trixie)
#     --repo PREFIX       image name prefix (default localhost/qsd-csi)
#     --only plugin|launcher   build one image
#     --revision STR      org.opencontainers.image.revision label (default: git HEAD)
#     --build-arg K=V     passed to podman build (repeatable)
#     --quiet             podman build output to a log file, not the terminal
#
# Prints, at the end, one line per image:  IMAGE <kind> <name> <id> <seconds>
# and, without --tag, one per second tag:  ALSO <kind> <name>
# A cluster pulls a new build only under a new tag (the manifests say
# IfNotPresent): deploy the version tag (deploy/README.md, "Upgrade").
# The build image is PREFIX/qsd-csi-build:TAG (deploy/images/builder/: the
# compile step, whose binaries both runtime images copy; the one it replaces
# is removed).
# Needs root and podman configured for this machine (scripts/setup.sh writes
# /etc/containers/containers.conf: runc, cgroupfs, explicit ulimits).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo_root=$(cd "$here/.." && pwd)

project=$(sed -n 's/^project(qsd-csi VERSION \([0-9.]*\).*/\1/p' "$repo_root/CMakeLists.txt")
{ read -r version && read -r version_rev; } < <("$here/version.sh")
tag=$(printf '%s\n' "$version" | tr + -)
also=$project    # the tag deploy/ names; none with --tag
sanitize=0
cmake_args=
base=localhost/qsd-csi/debian:trixie
prefix=localhost/qsd-csi
only=
revision=
quiet=0
extra=()

while (($#)); do
    case $1 in
        --tag) tag=$2; also=; shift 2 ;;
        --sanitize) sanitize=1; shift ;;
        --cmake-args) cmake_args=$2; shift 2 ;;
        --base) base=$2; shift 2 ;;
        --repo) prefix=$2; shift 2 ;;
        --only) only=$2; shift 2 ;;
        --revision) revision=$2; shift 2 ;;
        --build-arg) extra+=(--build-arg "$2"); shift 2 ;;
        --quiet) quiet=1; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-images.sh: unknown option $1 (--help)" >&2; exit 2 ;;
    esac
done
case $only in "" | plugin | launcher) ;; *) echo "build-images.sh: --only plugin|launcher" >&2; exit 2 ;; esac

command -v podman >/dev/null || { echo "build-images.sh: podman not installed (scripts/setup.sh)" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || { echo "build-images.sh: run as root (rootful podman, debootstrap)" >&2; exit 1; }

runtime_pkgs=
if ((sanitize)); then
    cmake_args="-DSANITIZE=ON -DCMAKE_BUILD_TYPE=Debug${cmake_args:+ $cmake_args}"
    runtime_pkgs="libasan8 libubsan1"
    tag=$tag-asan
    [[ -z $also ]] || also=$also-asan
fi
[[ $also != "$tag" ]] || also=
if [[ -z $revision ]]; then
    revision=$(git -C "$repo_root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
    git -C "$repo_root" diff --quiet HEAD -- 2>/dev/null || revision=$revision-dirty
fi

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
log() { echo "build-images: $*" >&2; }

# One build at a time on this machine (a second caller waits, then finds the
# base image and the layer cache ready).
lock=${QSD_BUILD_IMAGES_LOCK:-/tmp/qsd-csi-build-images.lock}
exec 9>>"$lock"
flock -w 3600 9 || { echo "build-images.sh: lock $lock busy for an hour" >&2; exit 1; }

# ---- base image -------------------------------------------------------------------
# A missing localhost/ base is made here (a registry's image is pulled).
if [[ $base == localhost/* ]] && ! podman image exists "$base"; then
    command -v debootstrap >/dev/null || { echo "build-images.sh: debootstrap not installed (scripts/setup.sh)" >&2; exit 1; }
    t0=$(now)
    work=$(mktemp -d "${TMPDIR:-/tmp}/qsd-images.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    log "making $base with debootstrap (minbase) in $work"
    debootstrap --variant=minbase trixie "$work/rootfs" http://deb.debian.org/debian \
        >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
    rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/cache/apt/*.bin \
        "$work"/rootfs/var/lib/apt/lists/*
    mkdir -p "$work/rootfs/var/lib/apt/lists/partial"
    cat >"$work/rootfs/etc/apt/sources.list" <<'EOF'
deb http://deb.debian.org/debian trixie main
deb http://deb.debian.org/debian trixie-updates main
deb http://deb.debian.org/debian-security trixie-security main
deb http://deb.debian.org/debian trixie-backports main
EOF
    tar --numeric-owner --xattrs -C "$work/rootfs" --exclude='./dev/*' --exclude='./proc/*' \
        --exclude='./sys/*' -cf "$work/rootfs.tar" .
    podman import --change 'CMD ["/bin/bash"]' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        "$work/rootfs.tar" "$base" >"$work/import.log" 2>&1 || { cat "$work/import.log" >&2; exit 1; }
    rm -rf "$work"
    trap - EXIT
    log "base image $base made in $(secs "$t0") s"
fi
podman image exists "$base" || podman pull "$base" >/dev/null ||
    { echo "build-images.sh: base image $base unavailable" >&2; exit 1; }

# ---- images -------------------------------------------------------------------------
results=()
build() { # KIND NAME
    local kind=$1 name=$2 t0 logf id
    local dir=$repo_root/deploy/images/$kind
    t0=$(now)
    old_id=$(podman image inspect -f '{{.Id}}' "$name" 2>/dev/null || true)
    log "building $name (base $base${cmake_args:+, CMake: $cmake_args})"
    local args=(build --layers -f "$dir/Containerfile"
        --build-arg "BUILD_IMAGE=$stage" --build-arg "BASE_IMAGE=$base"
        --build-arg "RUNTIME_EXTRA_PKGS=$runtime_pkgs" --build-arg "IMAGE_REVISION=$revision"
        --label "org.opencontainers.image.revision=$revision"
        "${extra[@]}" -t "$name" "$dir")
    if ((quiet)); then
        logf=$(mktemp "${TMPDIR:-/tmp}/qsd-images-$kind.XXXXXX.log")
        podman "${args[@]}" >"$logf" 2>&1 || { tail -40 "$logf" >&2; echo "build-images.sh: $name failed (log $logf)" >&2; exit 1; }
        rm -f "$logf"
    else
        podman "${args[@]}" >&2
    fi
    id=$(podman image inspect -f '{{.Id}}' "$name")
    # The image this tag named before, now untagged: remove it (only that one;
    # the layer cache stays, and an image still in use is kept).
    if [[ -n $old_id && $old_id != "$id" ]] &&
        [[ $(podman image inspect -f '{{len .RepoTags}}' "$old_id" 2>/dev/null) == 0 ]]; then
        podman rmi "$old_id" >/dev/null 2>&1 || true
    fi
    id=${id:0:12}
    results+=("IMAGE $kind $name $id $(secs "$t0")")
    if [[ -n $also ]]; then
        # the manifests' tag too (their image, where nodes load images
        # locally); the image it named before is removed as above
        local second=${name%:*}:$also old2
        old2=$(podman image inspect -f '{{.Id}}' "$second" 2>/dev/null || true)
        podman tag "$name" "$second"
        if [[ -n $old2 && ${old2:0:12} != "$id" ]] &&
            [[ $(podman image inspect -f '{{len .RepoTags}}' "$old2" 2>/dev/null) == 0 ]]; then
            podman rmi "$old2" >/dev/null 2>&1 || true
        fi
        results+=("ALSO $kind $second")
    fi
}
# The build image (deploy/images/builder/Containerfile), which both runtime
# images copy their binaries from; the one built from older sources for
# this tag is removed: each holds a whole build tree (~0.7 GB) that would
# otherwise pile up as an untagged image on every source change.
# Named by the stable tag (the project() version without --tag), so the
# build of the previous commit is the one replaced.
stage="$prefix/qsd-csi-build:${also:-$tag}"
old_stage=$(podman image inspect -f '{{.Id}}' "$stage" 2>/dev/null || true)
t0=$(now)
log "build stage $stage"
stage_args=(build --layers -f "$repo_root/deploy/images/builder/Containerfile"
    --ignorefile "$repo_root/deploy/images/builder/Containerfile.dockerignore"
    --build-arg "BASE_IMAGE=$base" --build-arg "CMAKE_ARGS=$cmake_args"
    --build-arg "QSD_CSI_VERSION=$version" --build-arg "QSD_CSI_REVISION=$version_rev" "${extra[@]}"
    -t "$stage" "$repo_root")
if ((quiet)); then
    logf=$(mktemp "${TMPDIR:-/tmp}/qsd-images-build.XXXXXX.log")
    podman "${stage_args[@]}" >"$logf" 2>&1 || { tail -40 "$logf" >&2; echo "build-images.sh: build stage failed (log $logf)" >&2; exit 1; }
    rm -f "$logf"
else
    podman "${stage_args[@]}" >&2
fi
new_stage=$(podman image inspect -f '{{.Id}}' "$stage")
if [[ -n $old_stage && $old_stage != "$new_stage" ]] &&
    [[ $(podman image inspect -f '{{len .RepoTags}}' "$old_stage" 2>/dev/null) == 0 ]]; then
    podman rmi "$old_stage" >/dev/null 2>&1 || true
fi
log "build stage ready in $(secs "$t0") s"

[[ $only == launcher ]] || build plugin "$prefix/qsd-csi-plugin:$tag"
[[ $only == plugin ]] || build launcher "$prefix/qsd-vm-launcher:$tag"
printf '%s\n' "${results[@]}"
