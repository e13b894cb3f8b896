#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# csi-sanity (the release sidecars.txt builds) against the node plugin of
# the driver installed in the test cluster, through the socket kubelet uses
# (the plugin's Controller and Node services in the DaemonSet's pod), with
# target and staging paths of kubelet's shape below /var/lib/kubelet.  The
# target path is in the directory of a running pause pod (csi-sanity-anchor):
# kubelet removes directories under pods/ that belong to no pod within
# seconds.  Owns that pod and the staging directory.
#
#   tests/k8s/sanity.sh DIR [csi-sanity arguments...]
# Prints csi-sanity's summary line and every skipped spec with csi-test's
# reason (--ginkgo.v reports each); exits with csi-sanity's status, or 1
# when it passed but skipped a spec for a reason other than those of
# ALLOWED_SKIPS (tests/csi/csilib.py SANITY_SKIPS_ALLOWED holds the same
# list, and says why).  The full log is DIR/logs/csi-sanity.log.
set -euo pipefail

dir=${1:?usage: sanity.sh DIR [csi-sanity arguments...]}; dir=$(cd "$dir" && pwd); shift
bin=$(cat "$dir/bin")
root=/var/lib/kubelet
sock=$root/plugins/qsd.csi.qsd-csi.dev/csi.sock
staging=$root/plugins/kubernetes.io/csi/qsd.csi.qsd-csi.dev/csi-sanity
[ -S "$sock" ] || { echo "sanity.sh: no plugin socket $sock (install.sh)" >&2; exit 1; }
k() { "$bin/kubectl" --kubeconfig "$dir/admin.kubeconfig" "$@"; }
pods=
cleanup() {
    k -n default delete pod csi-sanity-anchor --ignore-not-found --wait=false >/dev/null 2>&1 || true
    if grep -q -e " ${pods:-/nonexistent}/volumes/kubernetes.io~csi/sanity" -e " $staging/" /proc/self/mountinfo; then
        echo "sanity.sh: mounts left below $pods or $staging: kept" >&2; return
    fi
    rm -rf "$staging"
}
trap cleanup EXIT
k -n default apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: csi-sanity-anchor}
spec:
  containers:
    - {name: pause, image: "registry.k8s.io/pause:3.10.2", imagePullPolicy: Never}
YAML
k -n default wait --for=condition=Ready --timeout=60s pod/csi-sanity-anchor >/dev/null
pods=$root/pods/$(k -n default get pod csi-sanity-anchor -o jsonpath='{.metadata.uid}')
# csi-sanity makes the last path component only.
mkdir -p "$pods/volumes/kubernetes.io~csi/sanity" "$staging"
rc=0
# Mutable parameters (VolumeAttributesClass keys, docs/storageclass.md): the
# ModifyVolume specs run with them.
printf 'readIops: "1000"\nwriteIops: "1000"\n' >"$dir/sanity-mutable.yaml"
"$bin/csi-sanity" --csi.endpoint="unix://$sock" \
    --csi.testvolumemutableparameters="$dir/sanity-mutable.yaml" \
    --csi.mountdir="$pods/volumes/kubernetes.io~csi/sanity/mount" \
    --csi.stagingdir="$staging/globalmount" \
    --csi.testvolumesize=67108864 --ginkgo.timeout=10m --ginkgo.no-color --ginkgo.v "$@" \
    >"$dir/logs/csi-sanity.log" 2>&1 || rc=$?
log=$dir/logs/csi-sanity.log
grep -E '^(SUCCESS|FAIL)!' "$log" || tail -5 "$log"
# The reason line of each skipped spec: "  [SKIPPED] <reason>" ("  [SKIPPED]
# in [BeforeEach] - file:line" says where).
ALLOWED_SKIPS=(
    "ControllerPublishVolume not supported"
    "ControllerUnpublishVolume not supported"
    "Controller Publish, UnpublishVolume not supported"
    "SNAPSHOT_ACCESSIBILITY_CONSTRAINTS not supported"
)
reasons=$(grep -E '^  \[SKIPPED\] ' "$log" | grep -v '^  \[SKIPPED\] in \[' |
          sed 's/^  \[SKIPPED\] //' | sort | uniq -c || true)
unexpected=0
while read -r n r; do
    [ -n "$r" ] || continue
    ok=0
    for a in "${ALLOWED_SKIPS[@]}"; do [ "$r" = "$a" ] && ok=1; done
    if (( ok )); then
        echo "skipped $n (allowed): $r"
    else
        echo "skipped $n, NOT allowed: $r" >&2
        unexpected=1
    fi
done <<<"$reasons"
if (( rc == 0 && unexpected )); then
    echo "sanity.sh: csi-sanity skipped specs it should run (see above, $log)" >&2
    exit 1
fi
exit $rc
