#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Check, in the running test cluster, what the container runtime's default
# seccomp profile does to io_uring (issue 22: the plugin's event loop uses
# it): one pod without a seccomp profile (kubelet's seccompDefault makes it
# RuntimeDefault), one Unconfined.  Owns the probe image and the two pods (deleted at the end).
#
#   tests/k8s/seccomp-probe.sh DIR
# Prints "SECCOMP RuntimeDefault <allowed|refused: ...>" and the same for
# Unconfined; exits 0 when RuntimeDefault refuses and Unconfined allows (what
# containerd 2.x does), 1 otherwise.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dir=${1:?usage: seccomp-probe.sh DIR}; dir=$(cd "$dir" && pwd)
bin=$(cat "$dir/bin")
export KUBECONFIG=$dir/admin.kubeconfig
k() { "$bin/kubectl" "$@"; }
work=$dir/seccomp-probe; mkdir -p "$work"
image=localhost/qsd-csi-test/uring-probe:1

gcc -std=gnu11 -O2 -Wall -Wextra -Werror -static -o "$work/uring-probe" "$here/images/uring-probe.c"
"$here/images/mkimage.py" --tag "$image" --out "$work/uring-probe.tar" \
    --entrypoint /uring-probe "$work/uring-probe=/uring-probe" >/dev/null
"$bin/ctr" -a "$dir/containerd/containerd.sock" -n k8s.io images import "$work/uring-probe.tar" 2>&1 >/dev/null |
    { grep -v 'DEPRECATION: The support for cgroup v1' >&2 || true; }

cleanup() { k delete pod --ignore-not-found --wait=false seccomp-default seccomp-unconfined >/dev/null 2>&1 || true; }
trap cleanup EXIT
for p in default:RuntimeDefault unconfined:Unconfined; do
    sc='{}'; [ "${p#*:}" = Unconfined ] && sc='{seccompProfile: {type: Unconfined}}'
    k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: seccomp-${p%%:*}, namespace: default}
spec:
  restartPolicy: Never
  securityContext: $sc
  containers:
    - {name: probe, image: "$image", imagePullPolicy: Never}
YAML
done
rc=0
for p in default:RuntimeDefault unconfined:Unconfined; do
    name=seccomp-${p%%:*}
    phase=; t0=$SECONDS
    while [ $((SECONDS - t0)) -lt 60 ]; do
        phase=$(k get pod "$name" -o jsonpath='{.status.phase}' 2>/dev/null || true)
        case $phase in Succeeded|Failed) break ;; esac
        sleep 1
    done
    case $phase in Succeeded|Failed) ;; *)
        echo "seccomp-probe.sh: pod $name did not finish in 60 s (phase: ${phase:-none})" >&2; rc=1; continue ;;
    esac
    out=$(k logs "$name" 2>&1 || true)
    echo "SECCOMP ${p#*:} ${out#io_uring_setup: }"
    case ${p#*:}:$out in
    RuntimeDefault:*refused*|Unconfined:*allowed*) ;;
    *) rc=1 ;;
    esac
done
exit $rc
