#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Put every image the test cluster runs into its containerd, built on this
# machine (no registry is reachable): the pod sandbox (images/pause.c, under
# the name containerd's sandbox_image and kubelet expect), one minimal image
# per sidecar holding its go-built binary (names and tags as
# deploy/kubernetes/kustomization.yaml sets them), and the project's plugin
# image from podman's store (scripts/build-images.sh).  Owns the image
# archives in DIR/images; not the binaries (build.sh) nor podman's images.
#
#   tests/k8s/images.sh DIR [--no-plugin]
#     DIR is the cluster directory of `cluster.sh up DIR` (its containerd is
#     the one imported into).  Prints one "IMAGE name" line per image.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo_root=$(cd "$here/../.." && pwd)
dir=${1:?usage: images.sh DIR [--no-plugin]}; dir=$(cd "$dir" && pwd)
plugin=1; [ "${2:-}" = --no-plugin ] && plugin=0
sock=$dir/containerd/containerd.sock
[ -S "$sock" ] || { echo "images.sh: no containerd at $sock (cluster.sh up $dir)" >&2; exit 1; }
bin=$(cat "$dir/bin")
out=$dir/images; mkdir -p "$out"

import() { # ARCHIVE
    "$bin/ctr" -a "$sock" -n k8s.io images import "$1" 2>&1 >/dev/null | { grep -v 'DEPRECATION: The support for cgroup v1' >&2 || true; }
}

# The tag a kustomization `images:` entry gives NAME.
tag_of() {
    awk -v n="$1" '$0 ~ "- name: " n "$" {f=1; next} f && /newTag:/ {print $2; exit}' \
        "$repo_root/deploy/kubernetes/kustomization.yaml"
}

gcc -std=gnu11 -O2 -Wall -Wextra -Werror -static -o "$out/pause" "$here/images/pause.c"
strip "$out/pause"
"$here/images/mkimage.py" --tag registry.k8s.io/pause:3.10.2 --out "$out/pause.tar" \
    --entrypoint /pause --user 65535 "$out/pause=/pause" >/dev/null
import "$out/pause.tar"; echo "IMAGE registry.k8s.io/pause:3.10.2"

# The image a sidecar's release publishes runs its binary as the entrypoint
# from a distroless base; here the base is empty.
for pair in csi-provisioner:csi-provisioner csi-resizer:csi-resizer \
            csi-snapshotter:csi-snapshotter snapshot-controller:snapshot-controller \
            node-driver-registrar:csi-node-driver-registrar livenessprobe:livenessprobe \
            csi-snapshot-metadata:csi-snapshot-metadata; do
    b=${pair%%:*}; name=registry.k8s.io/sig-storage/${pair#*:}
    [ -x "$bin/$b" ] || { echo "images.sh: no $bin/$b (tests/k8s/build.sh)" >&2; exit 1; }
    if [ "$b" = snapshot-controller ]; then
        # Not in deploy/ (a prerequisite): the release sidecars.txt builds.
        tag=$(awk '$2 == "snapshot-controller" {print $4}' "$here/sidecars.txt")
    else
        tag=$(tag_of "$name")
    fi
    [ -n "$tag" ] || { echo "images.sh: no tag for $name in deploy/" >&2; exit 1; }
    "$here/images/mkimage.py" --tag "$name:$tag" --out "$out/$b.tar" \
        --entrypoint "/$b" "$bin/$b=/$b" >/dev/null
    import "$out/$b.tar"; echo "IMAGE $name:$tag"
done

# The changed-block tracking client (cbt-lister/, e2e.sh's cbt step runs
# it in a pod), tagged with the release of upstream's client library it
# wraps; not part of deploy/.
[ -x "$bin/cbt-lister" ] || { echo "images.sh: no $bin/cbt-lister (tests/k8s/build.sh)" >&2; exit 1; }
tag=$(awk '$1 == "cbt" && $2 == "csi-snapshot-metadata" {print $4}' "$here/sidecars.txt")
name=localhost/qsd-csi-test/cbt-lister:$tag
# /etc/hosts before DNS (the cbt step's pods resolve the Service's name
# with hostAliases: the harness has no cluster DNS).
echo 'hosts: files dns' >"$out/nsswitch.conf"
"$here/images/mkimage.py" --tag "$name" --out "$out/cbt-lister.tar" \
    --entrypoint /cbt-lister "$bin/cbt-lister=/cbt-lister" \
    "$out/nsswitch.conf=/etc/nsswitch.conf" >/dev/null
import "$out/cbt-lister.tar"; echo "IMAGE $name"

if [ $plugin = 1 ]; then
    ptag=$(tag_of qsd-csi-plugin)
    pname=$(awk '/- name: qsd-csi-plugin$/ {f=1; next} f && /newName:/ {print $2; exit}' \
            "$repo_root/deploy/kubernetes/kustomization.yaml")
    podman image exists "$pname:$ptag" || {
        echo "images.sh: no $pname:$ptag in podman (scripts/build-images.sh --only plugin)" >&2; exit 1; }
    rm -f "$out/plugin.tar"
    podman save --format docker-archive -o "$out/plugin.tar" "$pname:$ptag" >/dev/null
    import "$out/plugin.tar"; echo "IMAGE $pname:$ptag"
fi
