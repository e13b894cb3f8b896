#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# tests/helm/run.sh: checks the Helm chart deploy/helm/qsd-csi against the
# kustomize base deploy/kubernetes.
#
#   1. Chart.yaml's version and appVersion are CMakeLists.txt's project();
#   2. `helm lint --strict` of the chart (default values, and with every
#      optional piece on);
#   3. `helm template` equals `kubectl kustomize` for the same selection:
#      the defaults (snapshots on, rbd off), everything on (components/rbd
#      added), changed-block tracking (components/snapshot-metadata,
#      snapshotMetadata.enabled; its Secret and SnapshotMetadataService are
#      the chart's own and checked for their shape), everything off;
#      objects compared by kind/namespace/name (compare.py);
#   4. with rbd.enabled=false and snapshots.enabled=false the chart renders
#      no VolumeSnapshotClass, no csi-provisioner, csi-snapshotter-rbd or csi-resizer-rbd
#      and no Secrets role; with nodeEndpoint.enabled=false no gate, no
#      node-endpoint flag, volume or Secret, no Nodes role.  The node
#      endpoint's Secrets (the chart makes them, scripts/node-certs.sh for
#      kustomize) are checked for their shape instead of compared;
#   5. self-check first: a planted difference (one value changed in a copy
#      of the chart) must be reported.
#
# helm comes from the Go module proxy (helm.sh/helm/v3 at HELM_VERSION),
# built once into $QSD_HELM_DIR (default /var/cache/qsd-csi/helm) with a
# stamp of its version, by tests/gotool.sh.  Cold builds of v3.22.0 on a
# 2-core machine, 2026-11-26: 200 s with empty module and build caches
# (nice 19, load average about 5; downloads 413 MB of modules, leaves
# 719 MB of build cache), 81 s with the module cache already holding tests/k8s/build.sh's
# k8s.io modules.
# kubectl: PATH, else the one tests/k8s/build.sh built.
# Exit 0: all good; 1: a problem; 77: skipped (no Go and no helm built
# before, or no kubectl).  With --build: build helm if needed, and stop.
set -euo pipefail

HELM_VERSION=v3.22.0  # go-partial's list: v3.18.4 ... v3.22.0
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CACHE=${QSD_HELM_DIR:-/var/cache/qsd-csi/helm}
HELM=$CACHE/helm

/bin/bash "$ROOT/tests/gotool.sh" "$CACHE" "$HELM_VERSION" helm.sh/helm/v3/cmd/helm
[[ ${1:-} != --build ]] || exit 0

KUBECTL=$(command -v kubectl || ls /var/cache/qsd-csi/k8s/bin/*/kubectl 2>/dev/null | head -1 || true)
[[ -n "$KUBECTL" && -x "$KUBECTL" ]] || { echo "SKIP: no kubectl (it renders the kustomization)"; exit 77; }

WORK=$(mktemp -d /tmp/qsd-helm.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
# Helm's own state (repositories, cache) in the work directory.
export HELM_CACHE_HOME=$WORK/hc HELM_CONFIG_HOME=$WORK/hcfg HELM_DATA_HOME=$WORK/hd
CHART=$ROOT/deploy/helm/qsd-csi
fail=0

# 1. The chart's versions.
project=$(sed -n 's/^project(qsd-csi VERSION \([0-9.]*\).*/\1/p' "$ROOT/CMakeLists.txt")
cv=$(sed -n 's/^version: *//p' "$CHART/Chart.yaml")
av=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$CHART/Chart.yaml")
if [[ "$cv" == "$project" && "$av" == "$project" ]]; then
    echo "ok   Chart.yaml version $cv, appVersion $av: project() $project"
else
    echo "FAIL Chart.yaml version '$cv', appVersion '$av'; CMakeLists.txt project() is '$project'"
    fail=1
fi

# 2. Lint.
for set in "" "--set rbd.enabled=true,monitoring.enabled=true,snapshotMetadata.enabled=true" "--set nodeEndpoint.enabled=false"; do
    # shellcheck disable=SC2086
    if out=$("$HELM" lint --strict "$CHART" $set 2>&1); then
        echo "ok   helm lint --strict $set"
    else
        echo "FAIL helm lint --strict $set:"; echo "$out"; fail=1
    fi
done

# 3. and 4.  kustomize selections: a copy of deploy/kubernetes whose
# components: list is the one given.
kustomize_with() { # OUT COMPONENT...
    local out=$1; shift
    rm -rf "$WORK/k"; cp -r "$ROOT/deploy/kubernetes" "$WORK/k"
    /usr/bin/python3 - "$WORK/k/kustomization.yaml" "$@" <<'PY'
import os, sys, yaml
p = sys.argv[1]
k = yaml.safe_load(open(p))
k["components"] = ["components/" + c for c in sys.argv[2:]]
if not k["components"]:
    del k["components"]
# KNS, KROOT: the namespace and kubeletRoot settings of kustomization.yaml.
if os.environ.get("KNS"):
    k["namespace"] = os.environ["KNS"]
if os.environ.get("KROOT"):
    k["configMapGenerator"][0]["literals"] = ["kubeletRoot=" + os.environ["KROOT"]]
yaml.safe_dump(k, open(p, "w"), sort_keys=False)
PY
    "$KUBECTL" kustomize "$WORK/k" >"$out"
}
render_pair() { # NAME "COMPONENTS" HELM-SET [CHART]
    kustomize_with "$WORK/$1.kustomize.yaml" $2
    # shellcheck disable=SC2086
    "$HELM" template qsd-csi "${4:-$CHART}" $3 >"$WORK/$1.helm.yaml"
}
compare() { # NAME [extra kustomize file]
    /usr/bin/python3 "$HERE/compare.py" "$WORK/$1.kustomize.yaml" "$WORK/$1.helm.yaml" "${@:2}"
}

# 5. Self-check: a copy of the chart with a planted difference (the node
# plugin's --qsd-memory-max) must be reported.
cp -r "$CHART" "$WORK/planted"
sed -i 's/^  qsdMemoryMax: 8G$/  qsdMemoryMax: 9G/' "$WORK/planted/values.yaml"
grep -q 'qsdMemoryMax: 9G' "$WORK/planted/values.yaml" || { echo "FAIL self-check: nothing planted"; exit 1; }
render_pair planted "snapshots" "" "$WORK/planted"
if out=$(compare planted); then
    echo "FAIL self-check: a planted difference (qsdMemoryMax 9G) was not reported"; exit 1
elif grep -q -- "--qsd-memory-max" <<<"$out"; then
    echo "ok   self-check: a planted difference is reported ($(grep -m1 -- '--qsd-memory-max' <<<"$out" | sed 's/^ *//'))"
else
    echo "FAIL self-check: the planted difference was reported without its value:"; echo "$out"; exit 1
fi

render_pair default "snapshots" ""
if out=$(compare default); then echo "ok   default values: $out"; else echo "FAIL default values:"; echo "$out"; fail=1; fi
render_pair all "snapshots rbd" "--set rbd.enabled=true"
if out=$(compare all); then echo "ok   rbd.enabled=true: $out"; else echo "FAIL rbd.enabled=true:"; echo "$out"; fail=1; fi
render_pair cbt "snapshots snapshot-metadata" "--set snapshotMetadata.enabled=true"
if out=$(compare cbt) && grep -q "changed-block tracking's Secret" <<<"$out"; then
    echo "ok   snapshotMetadata.enabled=true: $out"
else echo "FAIL snapshotMetadata.enabled=true:"; echo "$out"; fail=1; fi
render_pair none "" "--set rbd.enabled=false,snapshots.enabled=false"
if out=$(compare none); then echo "ok   snapshots.enabled=false: $out"; else echo "FAIL snapshots.enabled=false:"; echo "$out"; fail=1; fi
# The settings: another namespace and kubelet root, everything on.
KNS=storage-qsd KROOT=/var/lib/k0s/kubelet render_pair settings "snapshots rbd" \
    "--set rbd.enabled=true,namespace=storage-qsd,kubeletDir=/var/lib/k0s/kubelet"
if grep -q '/var/lib/kubelet\|namespace: qsd-csi$' "$WORK/settings.helm.yaml"; then
    echo "FAIL namespace=storage-qsd, kubeletDir=/var/lib/k0s/kubelet: a default is left:"
    grep -n '/var/lib/kubelet\|namespace: qsd-csi$' "$WORK/settings.helm.yaml" | head -5; fail=1
elif out=$(compare settings); then echo "ok   namespace=storage-qsd, kubeletDir=/var/lib/k0s/kubelet: $out"
else echo "FAIL namespace=storage-qsd, kubeletDir=/var/lib/k0s/kubelet:"; echo "$out"; fail=1; fi
# Monitoring: deploy/kubernetes and deploy/monitoring together.
"$KUBECTL" kustomize "$ROOT/deploy/monitoring" >"$WORK/monitoring.yaml"
render_pair mon "snapshots" "--set monitoring.enabled=true"
if out=$(compare mon "$WORK/monitoring.yaml"); then echo "ok   monitoring.enabled=true (with deploy/monitoring): $out"
else echo "FAIL monitoring.enabled=true:"; echo "$out"; fail=1; fi

# 4. What the optional pieces must not leave behind.
if out=$(/usr/bin/python3 "$HERE/compare.py" --absent "$WORK/none.helm.yaml"); then
    echo "ok   rbd and snapshots off: $out"
else
    echo "FAIL rbd and snapshots off:"; echo "$out"; fail=1
fi
"$HELM" template qsd-csi "$CHART" --set nodeEndpoint.enabled=false >"$WORK/noep.helm.yaml"
if out=$(/usr/bin/python3 "$HERE/compare.py" --no-node-endpoint "$WORK/noep.helm.yaml"); then
    echo "ok   nodeEndpoint.enabled=false: $out"
else
    echo "FAIL nodeEndpoint.enabled=false:"; echo "$out"; fail=1
fi
# ...and the check sees them when they are there.
if /usr/bin/python3 "$HERE/compare.py" --no-node-endpoint "$WORK/default.helm.yaml" >/dev/null; then
    echo "FAIL self-check: --no-node-endpoint finds nothing in the default render"; fail=1
fi
exit $fail
