#!/usr/bin/env bash
# Everything tests/k8s does, once, in order, with the cluster torn down at
# the end whatever happened: build (cached), the plugin image if podman has
# none, cluster up, images, the seccomp probe, the install, csi-sanity,
# cluster down.  Owns only the sequence and a temporary cluster directory.
#
#   tests/k8s/run.sh [--keep]    --keep: leave the cluster up (prints DIR)
# Prints "STEP <name> <seconds> <ok|FAIL>" per step; exits 1 if any failed.
# Environment: QSD_K8S_GIT_DIR (build.sh).  After a failure DIR's logs are
# kept (its path is printed).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo_root=$(cd "$here/../.." && pwd)
keep=0; [ "${1:-}" = --keep ] && keep=1
dir=$(mktemp -d /tmp/qsd-k8s.XXXXXX)
failed=0

step() { # NAME CMD...
    local name=$1 t0=$SECONDS rc=0; shift
    "$@" || rc=$?
    if [ $rc = 0 ]; then echo "STEP $name $((SECONDS - t0)) ok"
    else echo "STEP $name $((SECONDS - t0)) FAIL ($rc)"; failed=1; fi
    return $rc
}

finish() {
    if [ $keep = 1 ]; then echo "cluster left up: $dir (tests/k8s/cluster.sh down $dir)"
    elif [ $failed = 1 ]; then
        QSD_K8S_DEBUG=1 step down "$here/cluster.sh" down "$dir"; echo "logs kept in $dir/logs"
    else step down "$here/cluster.sh" down "$dir"; fi
}
trap finish EXIT

bin=$("$here/build.sh" | tee "$dir/build.log" | sed -n 's/^BIN //p')
[ -n "$bin" ] || { echo "STEP build 0 FAIL"; tail -5 "$dir/build.log"; exit 1; }
export QSD_K8S_BIN=$bin
tag=$(awk '/- name: qsd-csi-plugin$/ {f=1; next} f && /newTag:/ {print $2; exit}' \
      "$repo_root/deploy/kubernetes/kustomization.yaml")
if ! podman image exists "localhost/qsd-csi/qsd-csi-plugin:$tag"; then
    step plugin-image "$repo_root/scripts/build-images.sh" --only plugin --quiet || exit 1
fi
step up "$here/cluster.sh" up "$dir" || exit 1
step images "$here/images.sh" "$dir" || exit 1
step seccomp-probe "$here/seccomp-probe.sh" "$dir"
step install "$here/install.sh" "$dir" && step csi-sanity "$here/sanity.sh" "$dir"
[ $failed = 0 ]
