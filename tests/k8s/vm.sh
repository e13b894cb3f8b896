#!/usr/bin/env bash
# VM scenarios of issue 22 in the test cluster: a cluster with the driver
# installed (cluster.sh up, images.sh, install.sh), the launcher image
# loaded, then tests/k8s/vm-pod.yaml (the example VM pod with a PVC of the
# WaitForFirstConsumer class, booting the test guest running
# tests/container/guest-writer.sh), and:
#   vm-boot         pod Running, PVC Bound, the guest's console shows its
#                   disk (DISK size=) and starts writing (WRITE-START)
#   plugin-restart  `kubectl delete pod` of the node plugin while the guest
#                   writes: the DaemonSet's new pod Ready, the volume's QSD
#                   the same process (pid in RUN/ctl/<vol>/qsd.json, alive)
#   expand          the PVC patched from 1Gi to 2Gi while the guest writes:
#                   its capacity 2Gi, the guest's kernel logs the new size
#   vm-data         the guest's SUMMARY: 0 write errors, 0 mismatches, no
#                   kernel I/O errors; the pod Succeeded (launcher exit 0)
# then deletes what it made and tears the cluster down.  Owns its cluster
# directory and the namespace vm-demo; not the images (podman's).
#
#   tests/k8s/vm.sh [--keep]     --keep: leave the cluster up (prints DIR)
# Prints "STEP <name> <seconds> ok|FAIL" per step; exits 1 if any failed.
# Environment: QSD_K8S_GIT_DIR (build.sh); QSD_K8S_VM_TAG: the podman tag
# of the plugin and launcher images to load (default 0.1.0; built with
# scripts/build-images.sh --tag when absent), loaded into containerd under
# the tag the manifests use (0.1.0); QSD_K8S_WRITER_SECS (default 90).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo_root=$(cd "$here/../.." && pwd)
keep=0; [ "${1:-}" = --keep ] && keep=1
vtag=${QSD_K8S_VM_TAG:-0.1.0}
secs=${QSD_K8S_WRITER_SECS:-90}
dir=$(mktemp -d /tmp/qsd-k8s-vm.XXXXXX)
failed=0
ns=vm-demo

step() { # NAME CMD...
    local name=$1 t0=$SECONDS rc=0; shift
    "$@" || rc=$?
    if [ $rc = 0 ]; then echo "STEP $name $((SECONDS - t0)) ok"
    else echo "STEP $name $((SECONDS - t0)) FAIL ($rc)"; failed=1; fi
    return $rc
}
say() { echo "vm.sh: $*" >&2; }

# What the cluster says about the VM pod and the plugin, on failure.
report() {
    kubectl -n $ns get pod,pvc -o wide 2>&1
    kubectl -n $ns describe pod demo-vm 2>&1 | sed -n '/^Events:/,$p'
    kubectl -n $ns logs demo-vm --tail=40 2>&1
    echo "---- console (tail)"; tail -40 "$(console_path)" 2>/dev/null || tail -40 "$dir/console.log" 2>/dev/null
    echo "---- plugin (tail)"
    kubectl -n qsd-csi logs daemonset/qsd-csi-node -c qsd-csi-plugin --tail=40 2>&1
}

finish() {
    if [ -n "${KUBECONFIG:-}" ] && [ $keep = 0 ]; then
        [ $failed = 1 ] && report
        # Bounded: the pod's grace period is 90 s (guest power-off).
        timeout 150 kubectl delete ns $ns --wait=true >/dev/null 2>&1 ||
            say "namespace $ns not deleted within 150 s"
    fi
    if [ $keep = 1 ]; then echo "cluster left up: $dir (tests/k8s/cluster.sh down $dir)"
    elif [ $failed = 1 ]; then
        QSD_K8S_DEBUG=1 step down "$here/cluster.sh" down "$dir"; echo "logs kept in $dir/logs"
    else step down "$here/cluster.sh" down "$dir"; fi
}
trap finish EXIT

# ---------------------------------------------------------------- helpers
tag_of() {
    awk -v n="$1" '$0 ~ "- name: " n "$" {f=1; next} f && /newTag:/ {print $2; exit}' \
        "$repo_root/deploy/kubernetes/kustomization.yaml"
}
ctr_() { "$(cat "$dir/bin")/ctr" -a "$dir/containerd/containerd.sock" -n k8s.io "$@" 2>&1 |
             grep -v 'DEPRECATION: The support for cgroup v1' || true; }

# podman's NAME:$vtag into the cluster's containerd as NAME:TAG.
load_image() { # NAME TAG
    local name=$1 tag=$2 tar=$dir/images/$(basename "$1").tar
    mkdir -p "$dir/images"; rm -f "$tar"
    podman save --format docker-archive -o "$tar" "$name:$vtag" >/dev/null || return 1
    ctr_ images import "$tar" >/dev/null
    [ "$vtag" = "$tag" ] || ctr_ images tag --force "$name:$vtag" "$name:$tag" >/dev/null
    ctr_ images ls -q | grep -qx "$name:$tag" || { say "$name:$tag not in containerd"; return 1; }
    echo "IMAGE $name:$tag (podman $name:$vtag)"
}

images() {
    "$here/images.sh" "$dir" --no-plugin || return 1
    load_image localhost/qsd-csi/qsd-csi-plugin "$(tag_of qsd-csi-plugin)" &&
    load_image localhost/qsd-csi/qsd-vm-launcher \
        "$(sed -n 's|.*image: localhost/qsd-csi/qsd-vm-launcher:||p' "$here/vm-pod.yaml")"
}

guest() {
    mkdir -p "$dir/guest"
    bash "$repo_root/tests/guest/build-guest.sh" /var/cache/qsd-csi/k8s/guest \
        "$repo_root/tests/container/guest-writer.sh" "$dir/guest/initrd.img" &&
    cp /var/cache/qsd-csi/k8s/guest/vmlinuz "$dir/guest/vmlinuz"
}

wait_for() { # SECONDS DESCRIPTION CMD...: CMD until it succeeds, bounded
    local t=$1 what=$2 end=$((SECONDS + $1)); shift 2
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $end ] || { say "no $what within $t s"; return 1; }
        sleep 2
    done
}

# wait_for, but giving up at once when the VM pod has ended (its launcher
# exited): then its log says why.
wait_vm() { # SECONDS DESCRIPTION CMD...
    local t=$1 what=$2 end=$((SECONDS + $1)) ph; shift 2
    until "$@" >/dev/null 2>&1; do
        ph=$(kubectl -n $ns get pod demo-vm -o jsonpath='{.status.phase}' 2>/dev/null)
        case $ph in Failed|Succeeded) say "no $what: the VM pod ended ($ph)"
                                      kubectl -n $ns logs demo-vm --tail=5 >&2; return 1 ;; esac
        [ $SECONDS -lt $end ] || { say "no $what within $t s"; return 1; }
        sleep 2
    done
}

pod_uid() { kubectl -n $ns get pod demo-vm -o jsonpath='{.metadata.uid}'; }
# The launcher's root is the pod's emptyDir; its console.log is the guest's
# serial console.
console_path() {
    echo "/var/lib/kubelet/pods/$(pod_uid 2>/dev/null)/volumes/kubernetes.io~empty-dir/launcher-root/console.log"
}
console_has() { grep -qE "$1" "$(console_path)" 2>/dev/null; }
phase_is() { [ "$(kubectl -n $ns get pod demo-vm -o jsonpath='{.status.phase}')" = "$1" ]; }
pvc_bound() { [ "$(kubectl -n $ns get pvc demo-vm-root -o jsonpath='{.status.phase}')" = Bound ]; }
plugin_pod() { kubectl -n qsd-csi get pod -l app.kubernetes.io/name=qsd-csi-node -o jsonpath='{.items[0].metadata.name}'; }
plugin_ready() {
    local p; p=$(plugin_pod) && [ -n "$p" ] && [ "$p" != "$1" ] &&
    kubectl -n qsd-csi get pod "$p" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -qx True
}
vol_handle() {
    kubectl get pv "$(kubectl -n $ns get pvc demo-vm-root -o jsonpath='{.spec.volumeName}')" \
        -o jsonpath='{.spec.csi.volumeHandle}'
}
qsd_pid() { # VOLUME-HANDLE (name@node; RUN/ctl/ has the name)
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' \
        "/run/qsd-csi/ctl/${1%@*}/qsd.json"
}

# ---------------------------------------------------------------- scenarios
vm_boot() {
    sed -e "s|@GUEST_DIR@|$dir/guest|" -e "s|@WRITER_SECS@|$secs|" "$here/vm-pod.yaml" \
        > "$dir/vm-pod.yaml"
    kubectl apply -f "$dir/vm-pod.yaml" >/dev/null || return 1
    local t0=$SECONDS
    wait_for 180 "pod Running" phase_is Running || return 1
    echo "vm-boot: pod Running after $((SECONDS - t0)) s"
    pvc_bound || { say "PVC not Bound while the pod runs"; return 1; }
    echo "vm-boot: PVC Bound, volume $(vol_handle)"
    wait_vm 240 "DISK line on the console" console_has '^DISK size=' || return 1
    echo "vm-boot: console: $(grep -m1 '^DISK size=' "$(console_path)") after $((SECONDS - t0)) s"
    wait_vm 60 "WRITE-START on the console" console_has '^WRITE-START' || return 1
    echo "vm-boot: console: $(grep -m1 '^WRITE-START' "$(console_path)") after $((SECONDS - t0)) s"
}

plugin_restart() {
    local vol pid old new
    vol=$(vol_handle) && pid=$(qsd_pid "$vol") || { say "no QSD pid for $vol"; return 1; }
    kill -0 "$pid" || { say "QSD $pid of $vol not running"; return 1; }
    wait_vm 60 "progress (W N) on the console" console_has '^W [0-9]+' || return 1
    old=$(plugin_pod)
    echo "plugin-restart: QSD pid $pid; deleting $old while the guest writes"
    local t0=$SECONDS
    timeout 120 kubectl -n qsd-csi delete pod "$old" --wait=true >/dev/null ||
        { say "plugin pod $old not deleted within 120 s"; return 1; }
    echo "plugin-restart: $old gone after $((SECONDS - t0)) s"
    wait_for 120 "new plugin pod Ready" plugin_ready "$old" || return 1
    new=$(plugin_pod)
    echo "plugin-restart: $new Ready $((SECONDS - t0)) s after the delete"
    kill -0 "$pid" || { say "QSD $pid is gone"; return 1; }
    [ "$(qsd_pid "$vol")" = "$pid" ] ||
        { say "qsd.json names pid $(qsd_pid "$vol"), was $pid"; return 1; }
    phase_is Running || { say "VM pod not Running after the plugin restart"; return 1; }
    echo "plugin-restart: QSD pid $pid unchanged and alive"
}

expand() {
    local t0=$SECONDS
    kubectl -n $ns patch pvc demo-vm-root --type merge \
        -p '{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}' >/dev/null || return 1
    wait_for 90 "PVC capacity 2Gi" pvc_capacity_is 2Gi || return 1
    echo "expand: PVC capacity 2Gi after $((SECONDS - t0)) s"
    # virtio_blk's notice on a config change (4194304 sectors of 512 bytes).
    wait_vm 60 "new size on the guest's console" console_has 'new size: 4194304 ' || return 1
    echo "expand: console: $(grep -m1 'new size: 4194304 ' "$(console_path)" | tr -d '\r') after $((SECONDS - t0)) s"
}
pvc_capacity_is() { [ "$(kubectl -n $ns get pvc demo-vm-root -o jsonpath='{.status.capacity.storage}')" = "$1" ]; }

vm_data() {
    local s
    wait_for $((secs + 240)) "SUMMARY on the console" console_has '^SUMMARY' || return 1
    # Kept in DIR: the emptyDir goes with the pod.
    cp "$(console_path)" "$dir/console.log"
    s=$(grep -m1 '^SUMMARY' "$dir/console.log")
    echo "vm-data: console: $s"
    grep '^STALL' "$dir/console.log" | tail -5
    [[ $s =~ write_errors=0\ mismatches=0\ ioerr=0 ]] || { say "guest saw errors"; return 1; }
    [[ $s =~ writes=([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -ge 20 ] ||
        { say "guest wrote too few blocks"; return 1; }
    wait_for 120 "pod Succeeded (guest powered off, launcher exit 0)" phase_is Succeeded || return 1
    echo "vm-data: pod Succeeded"
}

# ---------------------------------------------------------------- sequence
bin=$("$here/build.sh" | tee "$dir/build.log" | sed -n 's/^BIN //p')
[ -n "$bin" ] || { echo "STEP build 0 FAIL"; tail -5 "$dir/build.log"; exit 1; }
export QSD_K8S_BIN=$bin
if ! podman image exists "localhost/qsd-csi/qsd-csi-plugin:$vtag" ||
   ! podman image exists "localhost/qsd-csi/qsd-vm-launcher:$vtag"; then
    step build-images "$repo_root/scripts/build-images.sh" --tag "$vtag" --quiet || exit 1
fi
step guest guest || exit 1
step up "$here/cluster.sh" up "$dir" || exit 1
eval "$("$here/cluster.sh" env "$dir")"
step images images || exit 1
step install "$here/install.sh" "$dir" || exit 1
step vm-boot vm_boot || exit 1
step plugin-restart plugin_restart
step expand expand
step vm-data vm_data
[ $failed = 0 ]
