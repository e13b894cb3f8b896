#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Install the driver into the test cluster the way deploy/README.md tells a
# user to: the VolumeSnapshot and VolumeGroupSnapshot CRDs and the
# snapshot-controller (upstream external-snapshotter's, at the release
# sidecars.txt builds, as upstream ships it: the driver needs no change to
# it), then the driver
# with both optional pieces (snapshots and rbd, which the scenarios use),
# and changed-block tracking (components/snapshot-metadata with its CRD and
# scripts/snapshot-metadata-certs.sh; kustomize only):
#   QSD_INSTALL=kustomize (default)  the node endpoint's Secrets
#       (scripts/node-certs.sh --apply qsd-csi: made once, kept on a rerun),
#       then `kubectl apply -k` of a copy of deploy/kubernetes
#       (DIR/install/driver) whose components: list adds components/rbd,
#       nothing else changed;
#   QSD_INSTALL=helm  `helm upgrade --install qsd-csi deploy/helm/qsd-csi
#       --namespace kube-system --set rbd.enabled=true` (the same objects:
#       ctest deploy/helm_chart); run again, it is an upgrade.  helm is
#       tests/helm/run.sh's (built from the Go module proxy if missing).
# Then wait (bounded) for the node DaemonSet's pod to be Ready and print
# what the cluster says about every pod that is not.  Owns nothing in the
# cluster beyond what those manifests make.  DIR/install/mode records the
# way (e2e.sh's uninstall undoes it the same way).
#
#   tests/k8s/install.sh DIR [--timeout SECONDS]   (default 300)
# Prints "INSTALLED <seconds>" and exits 0 when the DaemonSet's pod is Ready;
# otherwise the pods' state, events and container logs, and exits 1.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo_root=$(cd "$here/../.." && pwd)
dir=${1:?usage: install.sh DIR [--timeout SECONDS]}; dir=$(cd "$dir" && pwd)
timeout=300; [ "${2:-}" = --timeout ] && timeout=$3
bin=$(cat "$dir/bin")
export KUBECONFIG=$dir/admin.kubeconfig
k() { "$bin/kubectl" "$@"; }
t0=$SECONDS

snap_ver=$(awk '$2 == "snapshot-controller" {print $4}' "$here/sidecars.txt")
snap_dir=$(cd /tmp && go mod download -json "github.com/kubernetes-csi/external-snapshotter/v8@$snap_ver" |
           sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
crd_dir=$(cd /tmp && go mod download -json "github.com/kubernetes-csi/external-snapshotter/client/v8@$snap_ver" |
          sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[ -d "$snap_dir/deploy/kubernetes/snapshot-controller" ] && [ -d "$crd_dir/config/crd" ] || {
    echo "install.sh: external-snapshotter $snap_ver's deploy files not found" >&2; exit 1; }

# 1. The CRDs, as upstream ships them.
k apply -k "$crd_dir/config/crd"
k wait --for=condition=Established --timeout=60s \
    crd/volumesnapshots.snapshot.storage.k8s.io crd/volumesnapshotcontents.snapshot.storage.k8s.io \
    crd/volumesnapshotclasses.snapshot.storage.k8s.io \
    crd/volumegroupsnapshots.groupsnapshot.storage.k8s.io \
    crd/volumegroupsnapshotcontents.groupsnapshot.storage.k8s.io \
    crd/volumegroupsnapshotclasses.groupsnapshot.storage.k8s.io

# 2. The snapshot-controller: upstream's deployment, the image at the
# release built here (upstream's file names an older tag).
sc=$dir/install/snapshot-controller; rm -rf "$sc"; mkdir -p "$sc"
cp "$snap_dir"/deploy/kubernetes/snapshot-controller/{rbac-snapshot-controller.yaml,setup-snapshot-controller.yaml} "$sc/"
cat >"$sc/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - rbac-snapshot-controller.yaml
  - setup-snapshot-controller.yaml
images:
  - name: registry.k8s.io/sig-storage/snapshot-controller
    newTag: $snap_ver
EOF
k apply -k "$sc"

# 2b. Changed-block tracking's CRD (SnapshotMetadataService), as upstream
# ships it: from the client module build.sh put in the csi-snapshot-metadata
# sidecar's tree (sidecars.txt "nested"); the driver gets
# components/snapshot-metadata.
cbt_ver=$(awk '$1 == "cbt" && $2 == "csi-snapshot-metadata" {print $4}' "$here/sidecars.txt")
cbt_crd=${QSD_K8S_CACHE:-/var/cache/qsd-csi/k8s}/src/github.com_kubernetes-csi_external-snapshot-metadata@$cbt_ver/client/config/crd/cbt.storage.k8s.io_snapshotmetadataservices.yaml
[ -f "$cbt_crd" ] || { echo "install.sh: no $cbt_crd (tests/k8s/build.sh cbt)" >&2; exit 1; }
k apply -f "$cbt_crd"
k wait --for=condition=Established --timeout=60s crd/snapshotmetadataservices.cbt.storage.k8s.io

# 3. The driver, with its optional pieces (deploy/README.md "Optional pieces").
mode=${QSD_INSTALL:-kustomize}
case $mode in
kustomize)
    drv=$dir/install/driver; rm -rf "$drv"; cp -r "$repo_root/deploy/kubernetes" "$drv"
    sed -i 's|^  # - components/rbd$|  - components/rbd|' "$drv/kustomization.yaml"
    grep -qx '  - components/snapshots' "$drv/kustomization.yaml" &&
    grep -qx '  - components/rbd' "$drv/kustomization.yaml" || {
        echo "install.sh: $drv/kustomization.yaml does not list both components" >&2; exit 1; }
    sed -i 's|^  # - components/snapshot-metadata$|  - components/snapshot-metadata|' "$drv/kustomization.yaml"
    grep -qx '  - components/snapshot-metadata' "$drv/kustomization.yaml" || {
        echo "install.sh: $drv/kustomization.yaml does not list components/snapshot-metadata" >&2; exit 1; }
    # deploy/README.md "Install": the node endpoint's certificates first
    # (and changed-block tracking's, with its SnapshotMetadataService).
    KUBECTL=$bin/kubectl "$repo_root/scripts/node-certs.sh" --apply qsd-csi
    KUBECTL=$bin/kubectl "$repo_root/scripts/snapshot-metadata-certs.sh" --apply qsd-csi
    k apply -k "$drv"
    ;;
helm)
    "$repo_root/tests/helm/run.sh" --build >&2 || { echo "install.sh: no helm" >&2; exit 1; }
    helm=${QSD_HELM_DIR:-/var/cache/qsd-csi/helm}/helm
    HELM_CACHE_HOME=$dir/install/helm HELM_CONFIG_HOME=$dir/install/helm HELM_DATA_HOME=$dir/install/helm \
        "$helm" upgrade --install qsd-csi "$repo_root/deploy/helm/qsd-csi" \
        --namespace kube-system --set rbd.enabled=true
    ;;
*) echo "install.sh: QSD_INSTALL=$mode: kustomize or helm" >&2; exit 1 ;;
esac
echo "$mode" >"$dir/install/mode"

# 4. Wait for the node plugin's pods (the DaemonSet's updateStrategy is
# OnDelete, which `kubectl rollout status` does not follow), the controller
# Deployment and the snapshot-controller.
ready() {
    local st
    st=$(k -n qsd-csi get daemonset qsd-csi-node \
         -o jsonpath='{.status.desiredNumberScheduled} {.status.numberReady} {.status.updatedNumberScheduled}')
    set -- $st
    [ "${1:-0}" -ge 1 ] && [ "$2" = "$1" ] && [ "$3" = "$1" ] || return 1
    k -n qsd-csi rollout status deployment/qsd-csi-controller --timeout=1s >/dev/null 2>&1 &&
    k -n kube-system rollout status deployment/snapshot-controller --timeout=1s >/dev/null 2>&1
}
until ready; do
    if [ $((SECONDS - t0)) -ge "$timeout" ]; then
        echo "install.sh: not every pod Ready after $timeout s" >&2
        k get pods -A -o wide >&2 || true
        k -n qsd-csi describe pods >&2 || true
        k get events -A --sort-by=.lastTimestamp >&2 || true
        for p in $(k -n qsd-csi get pods -o name); do
            k -n qsd-csi logs "$p" --all-containers --prefix --tail=30 >&2 || true
        done
        exit 1
    fi
    sleep 2
done
k get pods -A -o wide
echo "INSTALLED $((SECONDS - t0))"
