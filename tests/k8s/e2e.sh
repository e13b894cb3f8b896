#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Everything tests/k8s proves, in one cluster, in order, torn down at the end
# whatever happened (tests/k8s/README.md lists what each step asserts):
#   build        the Go binaries (build.sh, cached) and the project's images
#                (scripts/build-images.sh, podman's layer cache), the guest
#   up, images   cluster.sh up, every image into its containerd
#   seccomp-probe  RuntimeDefault refuses io_uring (seccomp-probe.sh)
#   install      CRDs, snapshot-controller, `kubectl apply -k deploy/kubernetes`
#                with components/rbd (QSD_INSTALL=helm: the Helm chart; install.sh)
#   examples     every deploy/examples/ file accepted by the API server
#   csi-sanity   through kubelet's socket of the node plugin
#   quick-start  docs/quick-start.md's sections 3-5 as a user follows them
#   vm-boot, snapshot, modify, hotplug, plugin-restart, rollout, expand, cbt,
#   vm-data, restore-clone, group-snapshot   the VM scenarios (VM pods of
#                vmpod.sh); cbt: changed-block tracking through upstream's
#                sidecar and client library (cbt.sh)
#   podvol       volumes for ordinary pods: ext4 and block claims written by
#                one pod and read by the next (podvol.sh)
#   rbd          an RBD class on the tests' single-node Ceph (ceph.py)
#                through the controller Deployment: provision, boot, snapshot
#   no-restarts  no container of the driver restarted during the run
#   uninstall    deploy/README.md's uninstall, then what is left on the node
#   reap         the cluster killed (-9) with a pod running; the next
#                cluster.sh up takes the leftover down and starts
#   down         cluster.sh down
# Owns its cluster directory, the namespace vm-e2e, its Ceph (ceph.py) and
# podman's images tagged with its name (k8s-qsd-k8s-...); the machine's caches (build.sh, tests/guest) stay.
#
#   tests/k8s/e2e.sh [--keep]     --keep: leave the cluster up (prints DIR)
# Prints "STEP <name> <seconds> ok|FAIL" per step and "E2E <n> passed <m>
# failed"; exits 1 if any step failed.  Environment: QSD_K8S_GIT_DIR
# (build.sh), QSD_K8S_JOBS (go build -p, default 1), QSD_K8S_WRITER_SECS
# (how long the first guest writes, default 210: vm-boot to
# expand must end before it does); QSD_K8S_CACHE (build.sh);
# QSD_K8S_ONLY=vm|rbd: only those scenarios (debugging; CI runs all).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo_root=$(cd "$here/../.." && pwd)
. "$here/vmpod.sh"
. "$here/podvol.sh"
. "$here/cbt.sh"
keep=0; [ "${1:-}" = --keep ] && keep=1
locked=0  # 1 once this run holds the machine's cluster lock (step lock)
secs=${QSD_K8S_WRITER_SECS:-210}
dir=$(mktemp -d /tmp/qsd-k8s.XXXXXX)
# This run's tag of podman's images (two runs on one machine must not
# remove each other's).
ptag=k8s-$(basename "$dir" | tr 'A-Z.' 'a-z-')
echo "$ptag" >"$dir/ptag"
ns=vm-e2e
vm=vm-first
passed=0 failed=0

step() { # NAME CMD...
    local name=$1 t0=$SECONDS rc=0; shift
    echo "---- $name" >&2
    "$@" || rc=$?
    if [ $rc = 0 ]; then echo "STEP $name $((SECONDS - t0)) ok"; passed=$((passed + 1))
    else echo "STEP $name $((SECONDS - t0)) FAIL ($rc)"; failed=$((failed + 1)); fi
    return $rc
}
say() { echo "e2e: $*" >&2; }

report() { # what the cluster says, after a failure
    kubectl get pods -A -o wide 2>&1
    kubectl -n $ns get pod,pvc,volumesnapshot -o wide 2>&1
    kubectl get events -A --sort-by=.lastTimestamp 2>&1 | tail -30
    local p
    for p in $(kubectl -n $ns get pods -o name 2>/dev/null); do
        echo "---- $p"; kubectl -n $ns logs "$p" --tail=20 2>&1
    done
    for p in $vm vm-verify; do
        echo "---- console of $p (tail)"; tail -30 "$dir/$p.console" 2>/dev/null ||
            tail -30 "$(console_of $p)" 2>/dev/null
    done
    echo "---- plugin (tail)"
    kubectl -n qsd-csi logs daemonset/qsd-csi-node -c qsd-csi-plugin --tail=40 2>&1
}

finish() {
    if [ $locked = 1 ] && [ -n "${KUBECONFIG:-}" ] && [ $keep = 0 ]; then
        [ $failed -gt 0 ] && report
        # Bounded: a VM pod's grace period is 90 s (guest power-off).
        timeout 200 kubectl delete ns $ns --wait=true >/dev/null 2>&1
    fi
    stop_ceph
    # Before the lock this run has no cluster, and cluster.sh down would
    # unmount the machine's kubelet directory and delete the bridge of the
    # run that holds the lock.
    if [ $locked = 0 ]; then rm -rf "$dir"
    elif [ $keep = 1 ]; then echo "cluster left up: $dir (tests/k8s/cluster.sh down $dir)"
    elif [ $failed -gt 0 ]; then
        QSD_K8S_DEBUG=1 step down "$here/cluster.sh" down "$dir"; echo "logs kept in $dir/logs"
    else step down "$here/cluster.sh" down "$dir" && rm -rf "$dir"; fi
    podman rmi -f "localhost/qsd-csi/qsd-csi-plugin:$ptag" "localhost/qsd-csi/qsd-vm-launcher:$ptag" \
        "localhost/qsd-csi/qsd-csi-build:$ptag" >/dev/null 2>&1
    echo "E2E $passed passed $failed failed"
    [ $failed = 0 ] && exit 0
    exit 1
}
trap finish EXIT

# ---------------------------------------------------------------- helpers
# podman's tags of runs whose directory is gone: a run killed before its
# finish (cluster.sh's `up` removed its directory with its cluster).
remove_stale_tags() {
    local live t
    live=$(cat /tmp/qsd-k8s.*/ptag 2>/dev/null)
    for t in $(podman images --format '{{.Repository}}:{{.Tag}}' |
               grep -E '^localhost/qsd-csi/[a-z-]+:k8s-qsd-k8s-'); do
        grep -qxF "${t##*:}" <<<"$live" && continue
        say "removing $t (a killed run's)"; podman rmi -f "$t" >/dev/null || return 1
    done
}

wait_for() { # SECONDS DESCRIPTION CMD...: CMD until it succeeds, bounded
    local t=$1 what=$2 end=$((SECONDS + $1)); shift 2
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $end ] || { say "no $what within $t s"; return 1; }
        sleep 2
    done
}
phase() { kubectl -n $ns get pod "$1" -o jsonpath='{.status.phase}' 2>/dev/null; }
phase_is() { [ "$(phase "$1")" = "$2" ]; }
# wait_for, giving up at once when POD has ended (its launcher exited).
wait_vm() { # POD SECONDS DESCRIPTION CMD...
    local pod=$1 t=$2 what=$3 end=$((SECONDS + $2)) ph; shift 3
    until "$@" >/dev/null 2>&1; do
        ph=$(phase "$pod")
        case $ph in Failed|Succeeded) say "no $what: $pod ended ($ph)"
                                      kubectl -n $ns logs "$pod" --tail=5 >&2; return 1 ;; esac
        [ $SECONDS -lt $end ] || { say "no $what within $t s"; return 1; }
        sleep 2
    done
}
# The launcher's root is the pod's emptyDir; its console.log is the guest's
# serial console (lines end in CRLF).
console_of() {
    local uid; uid=$(kubectl -n $ns get pod "$1" -o jsonpath='{.metadata.uid}' 2>/dev/null)
    echo "/var/lib/kubelet/pods/$uid/volumes/kubernetes.io~empty-dir/launcher-root/console.log"
}
console_has() { grep -qE "$2" "$(console_of "$1")" 2>/dev/null; }
console_line() { grep -m1 -E "$2" "$(console_of "$1")" | tr -d '\r'; }
keep_console() { cp "$(console_of "$1")" "$dir/$1.console" 2>/dev/null; }
pvc_field() { kubectl -n $ns get pvc "$1" -o jsonpath="$2" 2>/dev/null; }
pvc_bound() { [ "$(pvc_field "$1" '{.status.phase}')" = Bound ]; }
vol_name() { # CLAIM: the volume's name in RUN/ctl/ (the handle before @node)
    local h
    h=$(kubectl get pv "$(pvc_field "$1" '{.spec.volumeName}')" -o jsonpath='{.spec.csi.volumeHandle}') &&
    echo "${h%@*}"
}
qsd_pid() { # VOLUME
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' \
        "/run/qsd-csi/ctl/$1/qsd.json" 2>/dev/null
}
plugin_pod() { kubectl -n qsd-csi get pod -l app.kubernetes.io/name=qsd-csi-node -o jsonpath='{.items[0].metadata.name}'; }
plugin_ready() { # OLD-POD [IMAGE]: a pod other than OLD-POD is Ready (and runs IMAGE)
    local p; p=$(plugin_pod) && [ -n "$p" ] && [ "$p" != "$1" ] &&
    kubectl -n qsd-csi get pod "$p" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -qx True &&
    { [ -z "${2:-}" ] || kubectl -n qsd-csi get pod "$p" \
        -o jsonpath='{.spec.containers[?(@.name=="qsd-csi-plugin")].image}' | grep -qx "$2"; }
}
tag_of() {
    awk -v n="$1" '$0 ~ "- name: " n "$" {f=1; next} f && /newTag:/ {print $2; exit}' \
        "$repo_root/deploy/kubernetes/kustomization.yaml"
}
ctr_() { "$(cat "$dir/bin")/ctr" -a "$dir/containerd/containerd.sock" -n k8s.io "$@" 2>&1 |
             grep -v 'DEPRECATION: The support for cgroup v1' || true; }

# ---------------------------------------------------------------- build
build() {
    local out
    out=$("$here/build.sh" --jobs "${QSD_K8S_JOBS:-1}" | tee "$dir/build.log") || {
        tail -5 "$dir/build.log"; return 1; }
    grep -E '^(TIME|STANDIN)' <<<"$out" | tr '\n' ' '; echo
    QSD_K8S_BIN=$(sed -n 's/^BIN //p' <<<"$out"); export QSD_K8S_BIN
    [ -n "$QSD_K8S_BIN" ] || return 1
    # The tree's own images, under a tag of this run (podman's layer cache
    # makes a rebuild of unchanged sources quick).
    "$repo_root/scripts/build-images.sh" --tag $ptag --quiet || return 1
    mkdir -p "$dir/guest"
    bash "$repo_root/tests/guest/build-guest.sh" ${QSD_K8S_CACHE:-/var/cache/qsd-csi/k8s}/guest \
        "$repo_root/tests/container/guest-writer.sh" "$dir/guest/initrd.img" &&
    cp ${QSD_K8S_CACHE:-/var/cache/qsd-csi/k8s}/guest/vmlinuz "$dir/guest/vmlinuz"
}

# podman's NAME:$ptag into the cluster's containerd as NAME:TAG.
load_image() { # NAME TAG
    local name=$1 tag=$2 tar=$dir/images/$(basename "$1").tar
    rm -f "$tar"
    podman save --format docker-archive -o "$tar" "$name:$ptag" >/dev/null || return 1
    ctr_ images import "$tar" >/dev/null
    ctr_ images tag --force "$name:$ptag" "$name:$tag" >/dev/null
    rm -f "$tar"
    ctr_ images ls -q | grep -qx "$name:$tag" || { say "$name:$tag not in containerd"; return 1; }
    echo "IMAGE $name:$tag (podman $name:$ptag)"
}

images() {
    "$here/images.sh" "$dir" --no-plugin || return 1
    # The example's attachment pod names pause 3.10.
    ctr_ images tag --force registry.k8s.io/pause:3.10.2 registry.k8s.io/pause:3.10 >/dev/null
    load_image localhost/qsd-csi/qsd-csi-plugin "$(tag_of qsd-csi-plugin)" &&
    load_image localhost/qsd-csi/qsd-vm-launcher 0.1.0 &&
    # The same plugin under a second tag, for the DaemonSet rollout.
    ctr_ images tag --force "localhost/qsd-csi/qsd-csi-plugin:$ptag" \
        "localhost/qsd-csi/qsd-csi-plugin:$(tag_of qsd-csi-plugin)-rollout" >/dev/null
}

# Every example accepted by the API server (dry run).  A dry run cannot
# make the namespace the objects go into, so the examples' namespaces are
# made first (and deleted after).
examples() {
    local f n bad=0 made
    made=""
    for n in $(grep -h '^  namespace:' "$repo_root"/deploy/examples/*.yaml | awk '{print $2}' | sort -u); do
        kubectl get namespace "$n" >/dev/null 2>&1 && continue
        kubectl create namespace "$n" >/dev/null && made+=" $n"
    done
    for f in "$repo_root"/deploy/examples/*.yaml; do
        if kubectl apply --dry-run=server -f "$f" >"$dir/dry.out" 2>&1; then
            echo "examples: $(basename "$f"): accepted ($(wc -l <"$dir/dry.out") objects)"
        else
            say "$(basename "$f") refused:"; cat "$dir/dry.out" >&2; bad=1
        fi
    done
    for n in $made; do kubectl delete namespace "$n" --wait=false >/dev/null; done
    return $bad
}

# ---------------------------------------------------------------- the quick start
# docs/quick-start.md as a user follows it, after section 3's install (the
# install step): what section 3's checks say they show, then the sh blocks
# of sections 4 and 5 taken from the file and run as written (the example
# VM pod with its hot-plugged disk, a live snapshot, an online resize), then
# what their comments say they show.  The example's namespace is deleted
# after (its claims and snapshot with it), before the VM scenarios.
demo_attached() { # the example VM's launcher log: JSON lines, "disk attached" for data
    kubectl -n vm-demo logs demo-vm | /usr/bin/python3 -c '
import json, sys
lines = [json.loads(l) for l in sys.stdin if l.strip()]
sys.exit(0 if any("disk attached" in json.dumps(l) and "data" in json.dumps(l) for l in lines) else 1)'
}
quick_start() {
    local doc=$repo_root/docs/quick-start.md out=$dir/logs/quick-start.out rc=0 node ready
    # The examples step made and deleted the example's namespace.
    wait_for 120 "namespace vm-demo gone (examples step)" gone get namespace vm-demo || return 1
    node=$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')
    # Section 3: "one qsd-csi-node pod per node (6/6) and two qsd-csi-controller
    # pods (5/5; 8/8 with rbd)"; both driver names on the CSINode; capacities.
    ready=$(kubectl -n qsd-csi get pods --no-headers | awk '{print $1, $2}')
    echo "$ready" | grep -qE '^qsd-csi-node-[a-z0-9]+ 6/6$' ||
        { say "section 3: the node pod is not 6/6: $ready"; return 1; }
    # 9/9: components/rbd and components/snapshot-metadata (install.sh).
    [ "$(echo "$ready" | grep -cE '^qsd-csi-controller-[a-z0-9-]+ 9/9$')" = 2 ] ||
        { say "section 3: not two controller pods 9/9 (components/rbd, snapshot-metadata): $ready"; return 1; }
    kubectl get csidriver qsd.csi.qsd-csi.dev rbd.qsd-csi.dev >/dev/null || return 1
    [ "$(kubectl get csinode "$node" -o jsonpath='{.spec.drivers[*].name}' | tr ' ' '\n' | sort | tr '\n' ' ')" = \
      "qsd.csi.qsd-csi.dev rbd.qsd-csi.dev " ] || { say "section 3: CSINode drivers: $(kubectl get csinode "$node" -o jsonpath='{.spec.drivers[*].name}')"; return 1; }
    kubectl get csinode "$node" -o jsonpath='{.spec.drivers[?(@.name=="qsd.csi.qsd-csi.dev")].topologyKeys}' |
        grep -q 'topology.qsd.csi.qsd-csi.dev/node' || { say "section 3: no topology key on the CSINode"; return 1; }
    [ "$(kubectl -n qsd-csi get csistoragecapacities --no-headers 2>/dev/null | wc -l)" -ge 1 ] ||
        { say "section 3: no CSIStorageCapacity"; return 1; }
    echo "quick-start: section 3: node pod 6/6, two controller pods 9/9, CSINode with both drivers, $(kubectl -n qsd-csi get csistoragecapacities --no-headers | wc -l) capacities"
    # Sections 4 and 5, as written.
    awk '/^## 4\./ {on = 1} /^## Upgrading/ {on = 0}
         on && /^```sh$/ {b = 1; next} on && b && /^```$/ {b = 0; next} on && b' "$doc" >"$dir/quick-start.sh"
    [ "$(grep -c '^kubectl' "$dir/quick-start.sh")" -ge 6 ] ||
        { say "sections 4 and 5 of quick-start.md: no commands found"; return 1; }
    (cd "$repo_root" && timeout 900 bash -e -o pipefail "$dir/quick-start.sh") >"$out" 2>&1 || rc=$?
    if [ $rc != 0 ]; then say "the guide's commands failed ($rc):"; tail -20 "$out" >&2; fi
    if [ $rc = 0 ]; then
        [ "$(kubectl -n vm-demo get pvc demo-vm-root demo-vm-data -o jsonpath='{.items[*].status.phase}')" = "Bound Bound" ] ||
            { say "section 4: the claims are not both Bound"; rc=1; }
        wait_for 60 'a "disk attached" JSON line for data in the launcher log' demo_attached ||
            { kubectl -n vm-demo logs demo-vm 2>&1 | tail -5 >&2; rc=1; }
        [ $rc != 0 ] || echo "quick-start: sections 4 and 5 ran as written: claims Bound," \
            "demo-vm and its attachment pod Ready, data attached, snapshot ready, root 20Gi"
    fi
    kubectl delete namespace vm-demo --wait=false >/dev/null 2>&1
    wait_for 240 "namespace vm-demo deleted" gone get namespace vm-demo || rc=1
    return $rc
}

# ---------------------------------------------------------------- VM scenarios
vm_boot() {
    { vm_namespace $ns; echo ---; vm_claim $ns root 1Gi qsd-vm; echo ---
      vm_pod $ns $vm "$dir/guest" "writer.secs=$secs writer.marks=8 writer.hotplug=1 writer.trace=1 writer.hold=15" root
    } >"$dir/vm-first.yaml"
    kubectl apply -f "$dir/vm-first.yaml" >/dev/null || return 1
    local t0=$SECONDS
    wait_for 180 "$vm Running" phase_is $vm Running || return 1
    echo "vm-boot: $vm Running after $((SECONDS - t0)) s"
    pvc_bound root || { say "PVC root not Bound while the pod runs"; return 1; }
    echo "vm-boot: PVC root Bound, volume $(vol_name root)"
    wait_vm $vm 240 "DISK line" console_has $vm '^DISK size=' || return 1
    echo "vm-boot: console: $(console_line $vm '^DISK size=') after $((SECONDS - t0)) s"
    wait_vm $vm 120 "MARK-DONE" console_has $vm '^MARK-(DONE|FAIL)' || return 1
    console_has $vm '^MARK-DONE' || { say "$(console_line $vm '^MARK-FAIL')"; return 1; }
    wait_vm $vm 60 "WRITE-START" console_has $vm '^WRITE-START' || return 1
    echo "vm-boot: console: $(console_line $vm '^WRITE-START') after $((SECONDS - t0)) s"
}

snap_ready() { [ "$(kubectl -n $ns get volumesnapshot root-snap -o jsonpath='{.status.readyToUse}')" = true ]; }
# A VolumeSnapshot of the live disk after the guest wrote its markers; the
# restored and cloned claims are made now (the clone at the size root will
# have after the expansion: a clone is at least its source) and provisioned when the
# verifying VM pod is scheduled (WaitForFirstConsumer).
snapshot() {
    local t0=$SECONDS
    vm_snapshot $ns root-snap qsd-vm-snapshot root | kubectl apply -f - >/dev/null || return 1
    wait_for 120 "VolumeSnapshot readyToUse" snap_ready || return 1
    echo "snapshot: root-snap readyToUse after $((SECONDS - t0)) s, size" \
         "$(kubectl -n $ns get volumesnapshot root-snap -o jsonpath='{.status.restoreSize}')"
    { vm_claim $ns restored 1Gi qsd-vm VolumeSnapshot root-snap; echo ---
      vm_claim $ns clone 2Gi qsd-vm PersistentVolumeClaim root; } | kubectl apply -f - >/dev/null
}

hotplug() {
    local t0=$SECONDS vol pid
    { vm_claim $ns data 1Gi qsd-vm; echo ---; attach_pod $ns attach-data $vm data data; } |
        kubectl apply -f - >/dev/null || return 1
    wait_vm $vm 180 "HOTPLUG on the console" console_has $vm '^HOTPLUG size=' || return 1
    echo "hotplug: console: $(console_line $vm '^HOTPLUG size=') after $((SECONDS - t0)) s"
    wait_vm $vm 60 "HOTPLUG-IO" console_has $vm '^HOTPLUG-IO' || return 1
    echo "hotplug: console: $(console_line $vm '^HOTPLUG-IO')"
    console_has $vm '^HOTPLUG-IO ok' || return 1
    vol=$(vol_name data) && pid=$(qsd_pid "$vol") || { say "no QSD for claim data"; return 1; }
    t0=$SECONDS
    timeout 120 kubectl -n $ns delete pod attach-data --wait=true >/dev/null ||
        { say "attach-data not deleted within 120 s"; return 1; }
    wait_vm $vm 60 "UNPLUG on the console" console_has $vm '^UNPLUG' || return 1
    echo "hotplug: unplugged after $((SECONDS - t0)) s (the attachment pod deleted)"
    wait_for 60 "QSD $pid of claim data stopped" eval "! kill -0 $pid" || return 1
    echo "hotplug: the data volume's QSD $pid stopped"
    phase_is $vm Running || { say "$vm not Running after the unplug"; return 1; }
}

restart_plugin() { # HOW (delete|rollout): the QSD of root is the same process after it
    local how=$1 vol pid old image="" t0=$SECONDS
    vol=$(vol_name root) && pid=$(qsd_pid "$vol") || { say "no QSD pid for root"; return 1; }
    kill -0 "$pid" || { say "QSD $pid not running"; return 1; }
    wait_vm $vm 60 "progress (W n)" console_has $vm '^W [0-9]+' || return 1
    old=$(plugin_pod)
    if [ "$how" = rollout ]; then
        image=localhost/qsd-csi/qsd-csi-plugin:$(tag_of qsd-csi-plugin)-rollout
        kubectl -n qsd-csi set image daemonset/qsd-csi-node "qsd-csi-plugin=$image" >/dev/null || return 1
        echo "rollout: DaemonSet set to $image; updateStrategy OnDelete: deleting $old"
    else
        echo "plugin-restart: QSD pid $pid; deleting $old while the guest writes"
    fi
    timeout 120 kubectl -n qsd-csi delete pod "$old" --wait=true >/dev/null ||
        { say "plugin pod $old not deleted within 120 s"; return 1; }
    wait_for 120 "new plugin pod Ready" plugin_ready "$old" "$image" || return 1
    echo "$how: $(plugin_pod) Ready $((SECONDS - t0)) s after the delete${image:+, running $image}"
    kill -0 "$pid" || { say "QSD $pid is gone"; return 1; }
    [ "$(qsd_pid "$vol")" = "$pid" ] || { say "qsd.json names pid $(qsd_pid "$vol"), was $pid"; return 1; }
    phase_is $vm Running || { say "$vm not Running after the plugin's restart"; return 1; }
    # The QSD keeps the node's network (hostNetwork: a pod's own namespace
    # loses its interface with the pod).
    [ "$(readlink /proc/$pid/ns/net)" = "$(readlink /proc/self/ns/net)" ] ||
        { say "QSD $pid is not in the node's network namespace"; return 1; }
    # An adopted QSD is not a restarted one.
    if kubectl -n qsd-csi logs "$(plugin_pod)" -c qsd-csi-plugin 2>/dev/null |
       grep '"msg":"restarted"' | grep -q "$vol"; then
        say "the new plugin says it restarted the QSD of $vol"; return 1
    fi
    echo "$how: QSD pid $pid unchanged and alive, in the node's network namespace, adopted (not restarted)"
}

pvc_capacity_is() { [ "$(pvc_field "$1" '{.status.capacity.storage}')" = "$2" ]; }
expand() {
    local t0=$SECONDS
    kubectl -n $ns patch pvc root --type merge \
        -p '{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}' >/dev/null || return 1
    wait_for 150 "PVC capacity 2Gi" pvc_capacity_is root 2Gi || return 1
    echo "expand: PVC capacity 2Gi after $((SECONDS - t0)) s"
    # virtio_blk's notice on a config change (4194304 sectors of 512 bytes).
    wait_vm $vm 60 "new size on the console" console_has $vm 'new size: 4194304 ' || return 1
    echo "expand: console: $(console_line $vm 'new size: 4194304 ') after $((SECONDS - t0)) s"
}

# ---------------------------------------------------------------- ModifyVolume
# The claim root's I/O limits changed through VolumeAttributesClasses while
# the VM runs: csi-resizer (controller Deployment) -> the controller plugin
# (--node-dial) -> the dial gate (the node's InternalIP from the API
# server) -> mutual TLS -> the node's serve gate -> the node plugin's
# node-operations socket -> qom-set of the live QSD's throttle group
# (docs/node-operations.md).
vac_apply() {
    kubectl apply -f - <<'EOF'
apiVersion: storage.k8s.io/v1
kind: VolumeAttributesClass
metadata: {name: e2e-slow}
driverName: qsd.csi.qsd-csi.dev
parameters: {readIops: "300", writeIops: "300"}
---
apiVersion: storage.k8s.io/v1
kind: VolumeAttributesClass
metadata: {name: e2e-fast}
driverName: qsd.csi.qsd-csi.dev
parameters: {readIops: "3000", writeIops: "3000"}
---
apiVersion: storage.k8s.io/v1
kind: VolumeAttributesClass
metadata: {name: e2e-crawl}
driverName: qsd.csi.qsd-csi.dev
parameters: {readIops: "3000", writeIops: "4"}
EOF
}
limit_is() { # VOLUME KEY VALUE: the live QSD's throttle group has KEY = VALUE
    kubectl -n qsd-csi exec "$(plugin_pod)" -c qsd-csi-plugin -- qsdctl --run-dir /run/qsd-csi \
        qmp "$1" qom-get '{"path": "tg0", "property": "limits"}' 2>/dev/null |
        /usr/bin/python3 -c 'import json, sys
d = json.load(sys.stdin); d = d.get("return", d)
sys.exit(0 if d.get(sys.argv[1]) == int(sys.argv[2]) else 1)' "$2" "$3"
}
vac_is() { [ "$(pvc_field "$1" '{.status.currentVolumeAttributesClassName}')" = "$2" ]; }
# What the guest sees, and where the time goes.  The guest's writer (one
# 64 KiB write and a flush per dd, unthrottled about 20 a second) prints a
# T line per write (writer.trace=1: its number, start in the guest's
# centiseconds since boot, and duration); its console's lines are stamped
# with the host's clock as they arrive, and the guest's clock is mapped onto
# the host's by the line that arrived soonest after its write ended.  The
# guest saw the new limit (4 writes a second) at the first write that began
# after the PVC's patch, took 50 ms more than the median of the writes of
# the 3 s before it (unthrottled: about 30-50 ms; the next ones about 200),
# and from which on the writes keep the slow pace: the m-th after it starts
# at least m x 0.2 s later, for 19 writes (so 10 writes take >= 2 s and the
# next 10 too; unthrottled: about 0.5 s, 1.2 s on a loaded machine).  QEMU sets a throttle group's
# buckets to empty when its limits change, so the first write after the
# qom-set passes at once and the next ones wait: the first the guest sees
# slowed is the second or the third.
# The hops, on the same clock (one machine): a watch of the PVC (stamped
# as its events arrive): the API server's copy of the patch, csi-resizer's
# ModifyVolumeStatus InProgress (just before its call), the current class
# (after the call); the controller plugin's "forwarded" line (its time
# minus ms: the call's arrival; lookup_ms: the node's address from the API
# server; dial_ms: the dial gate's mutual TLS to the node; call_ms: the
# node's call); the node plugin's rpc line of the call (its time minus
# duration_ms: the arrival), "volume limits recorded" and "volume limits
# set live" (the qom-set answered); the guest's first write after that
# (it passes on the emptied bucket) and the first one slowed.  csi-resizer
# at --v=4/5 adds its own lines (PVC update seen, CSI call sent).
guest_sees_crawl() { # VM VOLUME
    local con t0 t1 follower out since
    con=$(console_of "$1")
    console_has "$1" '^SUMMARY' && { say "the writer of $1 has finished: no guest to measure"; return 1; }
    # Followers, bounded (90 s), stopped by their pid when done (the
    # watch's kubectl with them): the console from its end, and a watch of
    # the PVC; each line with its arrival time.
    /usr/bin/python3 -c 'import os, signal, subprocess, sys, threading, time
con, out_con, out_pvc, ns = sys.argv[1:5]
end = time.monotonic() + 90
def follow():
    f = open(con, "rb"); f.seek(0, 2); out = open(out_con, "w", buffering=1); buf = b""
    while time.monotonic() < end:
        d = f.readline()
        if not d:
            time.sleep(0.01); continue
        buf += d
        if buf.endswith(b"\n"):
            out.write("%.3f %s\n" % (time.time(), buf.decode(errors="replace").strip())); buf = b""
threading.Thread(target=follow, daemon=True).start()
w = subprocess.Popen(["kubectl", "-n", ns, "get", "pvc", "root", "-w", "-o",
                      "jsonpath={.spec.volumeAttributesClassName} {.status.modifyVolumeStatus.status}"
                      "/{.status.modifyVolumeStatus.targetVolumeAttributesClassName} "
                      "{.status.currentVolumeAttributesClassName}{\"\\n\"}"],
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
signal.signal(signal.SIGTERM, lambda *_: (w.kill(), os._exit(0)))  # the kill below
threading.Timer(max(0, end - time.monotonic()), w.kill).start()
out = open(out_pvc, "w", buffering=1)
try:
    for line in w.stdout:
        out.write("%.3f %s\n" % (time.time(), line.decode(errors="replace").strip()))
finally:
    w.kill()
' "$con" "$dir/crawl.console" "$dir/crawl.pvc" $ns &
    follower=$!
    sleep 2
    since=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    t0=$EPOCHREALTIME
    kubectl -n $ns patch pvc root --type merge \
        -p '{"spec":{"volumeAttributesClassName":"e2e-crawl"}}' >/dev/null || { kill $follower; return 1; }
    t1=$EPOCHREALTIME
    out=
    for _ in $(seq 40); do
        out=$(/usr/bin/python3 - "$dir/crawl.console" "$t0" "$dir/crawl.writes" <<'PY'
import re, sys
t0 = float(sys.argv[2])
T = []  # (write, guest start s, duration s, arrival)
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"(\S+) T (\d+) (\d+) (\d+)$", line.strip())
    if m:
        T.append((int(m.group(2)), int(m.group(3)) / 100.0, int(m.group(4)) / 1000.0, float(m.group(1))))
if len(T) < 22:
    sys.exit(0)
off = min(a - (s + d) for i, s, d, a in T)
w = [(i, s + off, d) for i, s, d, a in T]
span = lambda k: w[k + 9][1] + w[k + 9][2] - w[k][1]
base = sorted(x[2] for x in w if t0 - 3 <= x[1] <= t0)
base = base[len(base) // 2] if base else 0.05
for k in range(len(w) - 19):
    i, s, d = w[k]
    if s <= t0 or d < base + 0.05 or w[k + 19][0] != i + 19:
        continue
    # and paced from it: the m-th write after it starts at least m x 0.2 s
    # later (4 a second, 20 % slack).  A lone slow write of a loaded
    # machine before the limit (seen: +171 ms, the qom-set at +328) is
    # followed by fast ones.
    if any(w[k + m][1] - s < 0.2 * m for m in range(1, 20)):
        continue
    if span(k) >= 2.0 and span(k + 10) >= 2.0:
        near = " ".join("%d" % round(x[2] * 1000) for x in w[max(0, k - 4):k + 5])
        with open(sys.argv[3], "w") as f:
            f.writelines("%d %.3f %.3f\n" % x for x in w)
        print("%.3f %d %d %.1f %.1f %d %s" % (s - t0, i, round(d * 1000), span(k), span(k + 10),
              round(base * 1000), near.replace(" ", ",")))
        break
PY
)
        [ -n "$out" ] && break
        sleep 1
    done
    sleep 2 # the watch's event of the current class
    kill $follower 2>/dev/null; wait $follower 2>/dev/null
    [ -n "$out" ] || { say "the guest's writes did not slow within 40 s of the patch"; tail -12 "$dir/crawl.console" >&2; return 1; }
    set -- $out "$2"
    echo "modify: e2e-crawl (4 writes/s): the guest's first slowed write (#$2, $3 ms; unthrottled" \
         "$6 ms) began $1 s after the PVC's patch; from it 10 writes took $4 s and the next 10 $5 s" \
         "(writes around it, ms: $7)"
    echo "modify: cpu pressure: $(head -1 /proc/pressure/cpu)"
    # Where the time went (the hops above; ms after the patch began).  The
    # plugins log JSON or key=value lines (--log-format); a hop whose line
    # is missing is printed as not seen (the step measures the guest).
    { kubectl -n qsd-csi logs -l app.kubernetes.io/name=qsd-csi-controller -c qsd-csi-plugin \
          --since-time="$since" --tail=-1 2>/dev/null | grep 'ControllerModifyVolume' | sed 's/^/CTL /'
      # csi-resizer's own lines, when its --v is 4 or more (the deploy's is 2)
      kubectl -n qsd-csi logs -l app.kubernetes.io/name=qsd-csi-controller -c csi-resizer \
          --since-time="$since" --tail=-1 2>/dev/null | sed 's/^/RSZ /'
      kubectl -n qsd-csi logs "$(plugin_pod)" -c qsd-csi-plugin --since-time="$since" 2>/dev/null |
          grep -E "ControllerModifyVolume|$8" | sed 's/^/NODE /'
    } | /usr/bin/python3 -c 'import datetime, json, re, sys
t0, t1, pvc, writes, first = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5])
def ts(s):
    return datetime.datetime.strptime(s.rstrip("Z"), "%Y-%m-%dT%H:%M:%S.%f").replace(
        tzinfo=datetime.timezone.utc).timestamp()
def kv(line):
    line = line.strip()
    if line.startswith("{"):
        return {k: str(v) for k, v in json.loads(line).items()}
    return {m.group(1): m.group(2) if m.group(2) is not None else m.group(3)
            for m in re.finditer(r"(\w+)=(?:\"((?:[^\"\\\\]|\\\\.)*)\"|(\S+))", line)}
hops = {"kubectl patch returned": t1}
def hop(name, t):
    if t is not None and t >= t0 and name not in hops:
        hops[name] = t
for line in open(pvc, errors="replace"):
    p = (line.rstrip("\n").split(" ") + ["", "", ""])[:4]
    t = float(p[0])
    if p[1] == "e2e-crawl":
        hop("API server: the patch (PVC watch)", t)
    if p[2] == "InProgress/e2e-crawl":
        hop("resizer: InProgress (PVC watch)", t)
    if p[3] == "e2e-crawl":
        hop("resizer: current class (PVC watch)", t)
day = datetime.datetime.fromtimestamp(t0, datetime.timezone.utc)
rsz = {"Enqueueing PVC for modify": "resizer: PVC update seen (its v4)",
       "Started PVC processing for modify": "resizer: worker took it (its v4)",
       "GRPC call": "resizer: CSI call sent (its v5)"}
for line in sys.stdin:
    src, _, rest = line.partition(" ")
    m = re.match(r"[IWE](\d\d)(\d\d) (\d\d):(\d\d):(\d\d\.\d+) .*?\] (.*)", rest)
    if src == "RSZ":
        if m:
            t = day.replace(month=int(m.group(1)), day=int(m.group(2)), hour=int(m.group(3)),
                            minute=int(m.group(4)), second=0, microsecond=0).timestamp() + float(m.group(5))
            for k, name in rsz.items():
                if k in m.group(6) and ("GRPC" not in k or "ModifyVolume" in m.group(6)):
                    hop(name, t)
        continue
    try:
        d = kv(rest)
        t = ts(d["ts"])
    except (KeyError, ValueError):
        continue
    msg, ms = d.get("msg"), lambda k: float(d.get(k, "nan")) / 1000
    if src == "CTL" and msg == "forwarded":
        a = t - ms("ms")
        hop("controller: call arrived", a)
        hop("controller: node address (lookup %s ms)" % d.get("lookup_ms"), a + ms("lookup_ms"))
        hop("controller: connected (mutual TLS, %s ms)" % d.get("dial_ms"),
            a + ms("lookup_ms") + ms("dial_ms"))
        hop("controller: answered", t)
    if src == "NODE" and msg == "rpc" and "ControllerModifyVolume" in d.get("method", ""):
        hop("node: call arrived", t - ms("duration_ms"))
    if src == "NODE" and msg == "volume limits recorded":
        hop("node: limits recorded", t)
    if src == "NODE" and msg == "volume limits set live":
        hop("node: qom-set answered", t)
w = [tuple(float(x) for x in l.split()) for l in open(writes)]
live = hops.get("node: qom-set answered", hops.get("controller: answered"))
if live:
    hop("guest: first write after the qom-set began", next((s for i, s, d in w if s > live), None))
hop("guest: first slowed write began", first)
names = ["API server: the patch (PVC watch)", "resizer: InProgress (PVC watch)",
         "controller: call arrived", "controller: answered", "node: call arrived",
         "node: qom-set answered", "resizer: current class (PVC watch)"]
for name in names:
    if name not in hops:
        print("modify: hop: %-48s not seen" % name)
for name, t in sorted(hops.items(), key=lambda h: h[1]):
    print("modify: hop: %-48s %+6d ms" % (name, round((t - t0) * 1000)))
' "$t0" "$t1" "$dir/crawl.pvc" "$dir/crawl.writes" "$(echo "$t0 + $1" | bc -l)"
    return 0
}

modify() {
    local v c want t0 pid
    v=$(vol_name root) || return 1
    pid=$(qsd_pid "$v")
    vac_apply >/dev/null || return 1
    guest_sees_crawl $vm "$v" || return 1
    wait_for 120 "PVC root's current class e2e-crawl" vac_is root e2e-crawl || return 1
    wait_for 10 "writeIops 4 on root's QSD" limit_is "$v" iops-write 4 || return 1
    for c in e2e-slow e2e-fast; do
        want=$([ $c = e2e-slow ] && echo 300 || echo 3000)
        t0=$SECONDS
        kubectl -n $ns patch pvc root --type merge \
            -p "{\"spec\":{\"volumeAttributesClassName\":\"$c\"}}" >/dev/null || return 1
        wait_for 120 "PVC root's current class $c" vac_is root $c || return 1
        wait_for 10 "iops-read $want on root's QSD" limit_is "$v" iops-read $want || return 1
        echo "modify: $c: the PVC's current class after $((SECONDS - t0)) s, root's QSD iops-read $want"
    done
    [ "$(qsd_pid "$v")" = "$pid" ] || { say "root's QSD was restarted ($pid -> $(qsd_pid "$v"))"; return 1; }
    echo "modify: root's QSD the same process ($pid)"
}

vm_data() {
    local s
    wait_vm $vm $((secs + 300)) "SUMMARY on the console" console_has $vm '^SUMMARY' || return 1
    keep_console $vm
    s=$(console_line $vm '^SUMMARY')
    echo "vm-data: console: $s"
    grep '^STALL' "$dir/$vm.console" | tail -5
    [[ $s =~ write_errors=0\ mismatches=0\ ioerr=0 ]] || { say "the guest saw errors"; return 1; }
    [[ $s =~ writes=([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -ge 20 ] ||
        { say "the guest wrote too few blocks"; return 1; }
    wait_for 150 "$vm Succeeded (guest powered off, launcher exit 0)" phase_is $vm Succeeded || return 1
    echo "vm-data: $vm Succeeded"
}

# A second VM pod with the claim restored from the snapshot (vda) and the
# clone of the first VM's disk (vdb): both hold the 8 marker blocks.
restore_clone() {
    local t0=$SECONDS
    vm_pod $ns vm-verify "$dir/guest" "writer.verify=8 writer.hold=15" restored clone | kubectl apply -f - >/dev/null || return 1
    wait_for 180 "vm-verify Running" phase_is vm-verify Running || return 1
    wait_vm vm-verify 180 "VERIFY-DONE on the console" console_has vm-verify '^VERIFY-DONE' || return 1
    keep_console vm-verify
    echo "restore-clone: VERIFY-DONE after $((SECONDS - t0)) s;" \
         "claims restored $(pvc_field restored '{.status.phase}'), clone $(pvc_field clone '{.status.phase}')"
    grep -E '^VERIFY' "$dir/vm-verify.console" | tr -d '\r'
    grep -q '^VERIFY dev=vda ok' "$dir/vm-verify.console" &&
    grep -q '^VERIFY dev=vdb ok' "$dir/vm-verify.console" &&
    ! grep -q '^VERIFY.*FAIL' "$dir/vm-verify.console" || return 1
    wait_for 120 "vm-verify Succeeded" phase_is vm-verify Succeeded || return 1
    echo "restore-clone: vm-verify Succeeded"
}

# ---------------------------------------------------------------- group snapshots
# A VolumeGroupSnapshot (deploy/examples/volumegroupsnapshotclass.yaml, a
# label selector) of the two claims of a VM whose guest writes a sequence
# alternating between them, each write acknowledged (fsync) before the next
# (writer.seq): csi-snapshotter's group controller (controller Deployment)
# -> the controller plugin (--node-dial) -> the gates -> the node plugin,
# which stops the VM's QEMU for the instant.  It becomes readyToUse while
# the guest writes; its two member VolumeSnapshots (one per claim) are
# ready, their snapshot files are in the node's pool; both are restored
# into new claims, which a second VM checks (writer.seqcheck): each disk
# holds its records from the first on without a gap, and together they are
# a prefix of the sequence (a record acknowledged after another is never
# there without it), cut while the guest wrote.  Then the group snapshot is
# deleted: its members, their contents and their files go.
grp_field() { kubectl -n $ns get volumegroupsnapshot grp -o jsonpath="$1" 2>/dev/null; }
grp_members() { # "VOLUMESNAPSHOT CLAIM READY HANDLE" of each member (owned by grp)
    kubectl -n $ns get volumesnapshot -o json | /usr/bin/python3 -c '
import json, subprocess, sys
for s in json.load(sys.stdin)["items"]:
    if not any(o.get("kind") == "VolumeGroupSnapshot" and o.get("name") == "grp"
               for o in s["metadata"].get("ownerReferences", [])):
        continue
    st = s.get("status") or {}
    h = ""
    if st.get("boundVolumeSnapshotContentName"):
        h = subprocess.run(["kubectl", "get", "volumesnapshotcontent",
                            st["boundVolumeSnapshotContentName"], "-o",
                            "jsonpath={.status.snapshotHandle}"],
                           capture_output=True, text=True).stdout
    print(s["metadata"]["name"], s["spec"]["source"].get("persistentVolumeClaimName") or "-",
          str(st.get("readyToUse")).lower(), h or "-")'
}
grp_members_ready() { [ "$(grp_members | awk '$3 == "true" && $4 != "-"' | wc -l)" = 2 ]; }
files_gone() { local f; for f in "$@"; do [ ! -e "$f" ] || return 1; done; }
members_gone() { [ -z "$(grp_members)" ] && ! kubectl -n $ns get volumesnapshot "$@" >/dev/null 2>&1; }
group_snapshot() {
    local t0=$SECONDS pool=/var/lib/qsd-csi/pool m a b files f s n out
    kubectl apply -f "$repo_root/deploy/examples/volumegroupsnapshotclass.yaml" >/dev/null || return 1
    { vm_claim $ns g-a 256Mi qsd-vm; echo ---; vm_claim $ns g-b 256Mi qsd-vm; echo ---
      vm_pod $ns vm-group "$dir/guest" "writer.seq=1 writer.secs=90 writer.hold=15" g-a g-b
    } | kubectl apply -f - >/dev/null || return 1
    kubectl -n $ns label pvc g-a g-b e2e-group=grp >/dev/null || return 1
    wait_for 180 "vm-group Running" phase_is vm-group Running || return 1
    wait_vm vm-group 240 "SEQ 100 on vm-group's console" console_has vm-group '^SEQ 100' || return 1
    echo "group-snapshot: vm-group writes alternately to g-a and g-b ($((SECONDS - t0)) s)"
    t0=$SECONDS
    printf '%s\n' "apiVersion: groupsnapshot.storage.k8s.io/v1" "kind: VolumeGroupSnapshot" \
        "metadata: {name: grp, namespace: $ns}" "spec:" \
        "  volumeGroupSnapshotClassName: qsd-vm-group-snapshot" \
        "  source: {selector: {matchLabels: {e2e-group: grp}}}" | kubectl apply -f - >/dev/null || return 1
    wait_for 120 "VolumeGroupSnapshot grp readyToUse" eval '[ "$(grp_field {.status.readyToUse})" = true ]' ||
        { kubectl -n $ns describe volumegroupsnapshot grp >&2; return 1; }
    echo "group-snapshot: grp readyToUse after $((SECONDS - t0)) s, content $(grp_field {.status.boundVolumeGroupSnapshotContentName})"
    # The instant's pause, from the node plugin's line (stop sent to
    # continue sent, csi/local_group.c): the consumer is the VM's QEMU.
    out=$(kubectl -n qsd-csi logs daemonset/qsd-csi-node -c qsd-csi-plugin 2>/dev/null |
          /usr/bin/python3 -c 'import json, sys
last = None
for line in sys.stdin:
    try:
        j = json.loads(line)
    except ValueError:
        continue
    if isinstance(j, dict) and j.get("msg") == "group snapshot created":
        last = j
if last:
    print(int(last["consumers"]), int(last["pause_us"]), last.get("members"))')
    [ -n "$out" ] || { say "no 'group snapshot created' line in the node plugin's log"; return 1; }
    set -- $out
    [ "$1" -ge 1 ] || { say "the group snapshot stopped no consumer (the VM's QEMU): $out"; return 1; }
    echo "group-snapshot: the disks' consumers ($1, the VM's QEMU) paused $(( $2 / 1000 )).$(( $2 % 1000 / 100 )) ms" \
         "for $3 members (the node plugin's pause_us=$2; CPU pressure: $(cut -d' ' -f2,3 /proc/pressure/cpu | head -1))"
    console_has vm-group '^SEQ-DONE' && { say "the guest had finished writing: no cut under writes"; return 1; }
    wait_for 60 "two ready member VolumeSnapshots" grp_members_ready || { grp_members >&2; return 1; }
    grp_members | while read -r s m _ f; do echo "group-snapshot: member $s of claim $m: $f"; done
    a=$(grp_members | awk '$2 == "g-a" {print $1}'); b=$(grp_members | awk '$2 == "g-b" {print $1}')
    [ -n "$a" ] && [ -n "$b" ] || { say "no member for g-a or g-b"; grp_members >&2; return 1; }
    files=$(grp_members | awk -v p=$pool '{h = $4; sub(/@.*/, "", h); print p "/snapshots/" h ".qcow2"}')
    for f in $files; do [ -f "$f" ] || { say "no snapshot file $f on the node"; return 1; }; done
    echo "group-snapshot: the members' files are in the node's pool:" $files
    { vm_claim $ns g-a-r 256Mi qsd-vm VolumeSnapshot "$a"; echo ---
      vm_claim $ns g-b-r 256Mi qsd-vm VolumeSnapshot "$b"; } | kubectl apply -f - >/dev/null || return 1
    wait_vm vm-group 210 "SEQ-DONE on vm-group's console" console_has vm-group '^SEQ-DONE' || return 1
    keep_console vm-group
    n=$(console_line vm-group '^SEQ-DONE'); echo "group-snapshot: vm-group: $n"
    [[ $n =~ n=([0-9]+)\ write_errors=0 ]] || { say "vm-group saw write errors"; return 1; }
    n=${BASH_REMATCH[1]}
    # Each disk's records are in its first n/2 + 1 blocks; a few more are read.
    vm_pod $ns vm-gverify "$dir/guest" "writer.seqcheck=$((n / 2 + 16)) writer.hold=15" g-a-r g-b-r |
        kubectl apply -f - >/dev/null || return 1
    wait_for 180 "vm-gverify Running" phase_is vm-gverify Running || return 1
    wait_vm vm-gverify 300 "SEQCHECK on vm-gverify's console" console_has vm-gverify '^SEQCHECK' || return 1
    keep_console vm-gverify
    m=$(console_line vm-gverify '^SEQCHECK')
    echo "group-snapshot: restored claims: $m (the guest wrote $n records)"
    [[ $m =~ vda=([0-9]+)\ vdb=([0-9]+)\ ok$ ]] || { say "not a consistent prefix: $m"; return 1; }
    s=$((BASH_REMATCH[1] + BASH_REMATCH[2]))
    [ $s -ge 100 ] && [ $s -lt "$n" ] ||
        { say "the group holds $s records: not between 100 (before it) and $n (all)"; return 1; }
    echo "group-snapshot: the restored pair holds records 0..$((s - 1)) of $n, a prefix on both disks"
    wait_for 120 "vm-gverify Succeeded" phase_is vm-gverify Succeeded || return 1
    timeout 120 kubectl -n $ns delete pod vm-gverify vm-group --wait=true >/dev/null || return 1
    timeout 120 kubectl -n $ns delete pvc g-a-r g-b-r --wait=true >/dev/null || return 1
    t0=$SECONDS
    timeout 120 kubectl -n $ns delete volumegroupsnapshot grp --wait=true >/dev/null ||
        { say "grp not deleted within 120 s"; return 1; }
    wait_for 120 "the member VolumeSnapshots gone" members_gone "$a" "$b" || return 1
    wait_for 60 "the members' files gone" files_gone $files || return 1
    echo "group-snapshot: grp deleted after $((SECONDS - t0)) s: members, contents and files gone"
}

# The VM CLI (launcher/kubectl-qsd, as `kubectl qsd`): a VM made by
# `create` boots and writes; `list` shows it Running with its disk; `attach`
# hot-plugs a claim (the guest sees it and reads it back), `snapshot` makes
# a ready VolumeSnapshot of each of its claims, `detach` unplugs (the guest
# sees it go), `console --log` shows the guest's lines, `delete` removes the
# pod and its description and keeps the claims.
qsd_cli() { KUBECTL=$(command -v kubectl) /usr/bin/python3 "$repo_root/launcher/kubectl-qsd" -n $ns "$@"; }
cli_snaps_ready() { # SUFFIX CLAIM...
    local s=$1 c; shift
    for c in "$@"; do
        [ "$(kubectl -n $ns get volumesnapshot "$c-$s" -o jsonpath='{.status.readyToUse}')" = true ] || return 1
    done
}
cli() {
    local v=cli-vm t0=$SECONDS out
    qsd_cli create $v --disk cli-root:1Gi:qsd-vm --accel tcg --memory 256 --cpu-request 300m \
        --no-network --kernel /guest/vmlinuz --initrd /guest/initrd.img --host-dir "$dir/guest" \
        --cmdline "console=ttyS0 panic=-1 loglevel=6 writer.secs=150 writer.marks=4 writer.hotplug=1 writer.hold=5" ||
        return 1
    vm_claim $ns cli-data 1Gi qsd-vm | kubectl apply -f - >/dev/null || return 1
    wait_for 180 "$v Running" phase_is $v Running || return 1
    wait_vm $v 240 "WRITE-START on $v's console" console_has $v '^WRITE-START' || return 1
    echo "cli: $v created and writing after $((SECONDS - t0)) s"
    out=$(qsd_cli list) || return 1
    echo "$out"
    grep -qE "^$v +Running +[^ ]+ +cli-root +-$" <<<"$out" || { say "list does not show $v Running with cli-root"; return 1; }
    out=$(qsd_cli console $v --log --lines 400) || return 1
    grep -q '^WRITE-START' <<<"$out" || { say "console --log lacks WRITE-START"; return 1; }
    qsd_cli attach $v cli-data >/dev/null || return 1
    wait_vm $v 180 "HOTPLUG on $v's console" console_has $v '^HOTPLUG-IO' || return 1
    console_has $v '^HOTPLUG-IO ok' || { say "$(console_line $v '^HOTPLUG-IO')"; return 1; }
    echo "cli: attach: $(console_line $v '^HOTPLUG size=')"
    out=$(qsd_cli list) && grep -qE "^$v +Running .* cli-data$" <<<"$out" || { say "list lacks the attached claim: $out"; return 1; }
    out=$(qsd_cli attach $v cli-data 2>&1) && { say "a second attach was accepted: $out"; return 1; }
    grep -q 'already a disk' <<<"$out" || { say "a second attach failed otherwise: $out"; return 1; }
    echo "cli: a second attach refused: $out"
    qsd_cli snapshot $v --class qsd-vm-snapshot --suffix s1 || return 1
    wait_for 120 "cli-root-s1 and cli-data-s1 readyToUse" cli_snaps_ready s1 cli-root cli-data || return 1
    echo "cli: snapshot: cli-root-s1 and cli-data-s1 readyToUse"
    qsd_cli detach $v cli-data || return 1
    wait_vm $v 60 "UNPLUG on $v's console" console_has $v '^UNPLUG' || return 1
    echo "cli: detach: the guest saw the disk go"
    qsd_cli delete $v || return 1
    kubectl -n $ns get pod $v >/dev/null 2>&1 && { say "$v still exists after delete"; return 1; }
    kubectl -n $ns get configmap $v >/dev/null 2>&1 && { say "$v's ConfigMap still exists"; return 1; }
    pvc_bound cli-root || { say "cli-root not kept by delete"; return 1; }
    echo "cli: delete: pod and description gone, claims kept, $((SECONDS - t0)) s in all"
}

# No warning event on a normal local claim, snapshot or deletion (the
# central provisioner serves the RBD driver name only; the local name's
# snapshotter forwards local snapshots to the node): a
# local snapshot and claim are deleted (their VolumeSnapshotContent and PV
# gone, bounded), then every Warning event about a claim, volume or
# snapshot that is not the RBD scenario's is counted: 0 expected.  Not
# counted: the snapshot-controller's own SnapshotDeletePending "... belongs
# to group snapshot ..." on a group's member while that group is deleted
# (external-snapshotter v8.7, pkg/common-controller/snapshot_controller.go:
# the member's deletion is tried while the group object is still there,
# then retried; the group-snapshot step saw it once per member).
pv_of() { pvc_field "$1" '{.spec.volumeName}'; }
gone() { ! kubectl "$@" >/dev/null 2>&1; }
volume_warnings() {
    kubectl get events -A --field-selector type=Warning -o json | /usr/bin/python3 -c '
import json, sys
kinds = {"PersistentVolumeClaim", "PersistentVolume", "VolumeSnapshot", "VolumeSnapshotContent"}
rbd = set(sys.argv[1:])
for e in json.load(sys.stdin)["items"]:
    o = e["involvedObject"]
    if e.get("reason") == "SnapshotDeletePending" and "belongs to group snapshot" in e.get("message", ""):
        continue
    if o.get("kind") in kinds and o.get("name") not in rbd:
        print("%s %s/%s %s x%s: %s" % (e["metadata"]["namespace"], o["kind"], o["name"], e.get("reason"),
                                        e.get("count", 1), e.get("message", "")[:200]))
' demo-rbd-disk rbd-snap "$@"
}
no_warnings() {
    local pv content out t0=$SECONDS
    # The count must be able to fail: a planted Warning about a claim is seen.
    printf '%s\n' 'apiVersion: v1' 'kind: Event' 'metadata: {name: e2e-planted, namespace: '$ns'}' \
        'involvedObject: {kind: PersistentVolumeClaim, name: planted, namespace: '$ns'}' \
        'type: Warning' 'reason: Planted' 'message: the no-warnings self-check' 'source: {component: e2e}' |
        kubectl apply -f - >/dev/null || return 1
    volume_warnings | grep -q 'PersistentVolumeClaim/planted Planted' || { say "a planted warning was not seen"; return 1; }
    kubectl -n $ns delete event e2e-planted >/dev/null || return 1
    pv=$(pv_of cli-data)
    content=$(kubectl -n $ns get volumesnapshot cli-data-s1 -o jsonpath='{.status.boundVolumeSnapshotContentName}')
    [ -n "$pv" ] && [ -n "$content" ] || { say "no PV or content for cli-data"; return 1; }
    kubectl get pv "$pv" >/dev/null && kubectl get volumesnapshotcontent "$content" >/dev/null ||
        { say "PV $pv or content $content not there before the deletion"; return 1; }
    kubectl -n $ns delete volumesnapshot cli-data-s1 --wait=false >/dev/null || return 1
    wait_for 120 "VolumeSnapshotContent $content deleted" gone get volumesnapshotcontent "$content" || return 1
    kubectl -n $ns delete pvc cli-data --wait=false >/dev/null || return 1
    wait_for 120 "PV $pv deleted" gone get pv "$pv" || return 1
    echo "no-warnings: a local snapshot and claim deleted, their content and PV gone after $((SECONDS - t0)) s"
    out=$(volume_warnings) || return 1
    if [ -n "$out" ]; then say "warning events on local volumes:"; echo "$out" >&2; return 1; fi
    echo "no-warnings: Warning events in the cluster: $(kubectl get events -A --field-selector type=Warning --no-headers 2>/dev/null | wc -l) (none about a local claim, volume or snapshot)"
    echo "no-warnings: 0 Warning events on local claims, volumes and snapshots" \
         "($(kubectl -n $ns get pvc --no-headers | wc -l) claims, $(kubectl -n $ns get volumesnapshot --no-headers | wc -l) snapshots in $ns)"
}

# No container of the driver restarted during the run: the sidecars exit
# when the plugin closes their CSI connection ("Lost connection to CSI
# driver"), which a plugin closing idle connections did every few idle
# minutes (csi/grpc_unix.c keeps them now); the controller pods and the
# node pod the rollout made have been up for many minutes by now, through
# idle stretches.  Any restart fails the step, naming the container and its
# last termination.
no_restarts() {
    local out
    out=$(kubectl -n qsd-csi get pods -o json | /usr/bin/python3 -c 'import json, sys
pods = json.load(sys.stdin)["items"]
n = 0
for p in pods:
    for c in p["status"].get("containerStatuses") or []:
        n += 1
        if c.get("restartCount", 0):
            t = (c.get("lastState") or {}).get("terminated") or {}
            print("%s/%s restarted %d times: last %s, exit %s, %s" % (
                p["metadata"]["name"], c["name"], c["restartCount"], t.get("reason"),
                t.get("exitCode"), (t.get("message") or "").strip()[-200:]))
print("COUNT %d %d" % (len(pods), n))') || return 1
    if grep -qv '^COUNT' <<<"$out"; then
        say "containers of the driver restarted:"; grep -v '^COUNT' <<<"$out" >&2; return 1
    fi
    set -- $out
    [ "$3" -ge 6 ] || { say "only $3 containers in qsd-csi: $out"; return 1; }
    echo "no-restarts: $2 pods, $3 containers in qsd-csi, none restarted"
}

# RBD: the tests' single-node Ceph on the host's address (ceph.py), the
# cluster ConfigMap pointed at it, deploy/examples/rbd.yaml applied with its
# user's key and namespace (the claim in this test's namespace, 1Gi): the
# claim provisioned by the controller Deployment (Immediate binding), a VM
# pod booting from it and writing, a VolumeSnapshot of the live disk.
ceph_pid=""
ceph_env=""
rbd_images() { # the RBD images in the test user's namespace (admin CLI)
    (. "$ceph_env" && rbd -c "$CEPH_CONF" ls -p "$CEPH_POOL" --namespace "$CEPH_NAMESPACE")
}
snap_ready_of() { [ "$(kubectl -n $ns get volumesnapshot "$1" -o jsonpath='{.status.readyToUse}')" = true ]; }
rbd_step() {
    local host_ip t0=$SECONDS img s
    host_ip=$(ip -4 route get 1.1.1.1 | sed -n 's/.* src \([0-9.]*\).*/\1/p')
    ceph_env=$dir/ceph.env
    /usr/bin/python3 "$here/ceph.py" "$host_ip" "$ceph_env" >"$dir/ceph.log" 2>&1 8>&- &
    ceph_pid=$!
    wait_for 120 "Ceph up (ceph.py)" test -s "$ceph_env" || { cat "$dir/ceph.log" >&2; return 1; }
    . "$ceph_env"
    echo "rbd: $(head -1 "$dir/ceph.log")"
    vm_namespace $ns | kubectl apply -f - >/dev/null || return 1
    kubectl -n qsd-csi patch configmap qsd-csi-rbd-clusters --type merge -p "$(python3 -c '
import json, sys
print(json.dumps({"data": {"clusters.json": json.dumps(
    [{"clusterID": "ceph-a", "monitors": [sys.argv[1]]}])}}))' "$CEPH_MONITORS")" >/dev/null || return 1
    # The plugins read the file per request; the ConfigMap reaches it at
    # kubelet's next sync of the pods (up to a minute or two).  Waiting for
    # it here keeps the provisioner's retries from backing off for minutes.
    local p
    for p in $(kubectl -n qsd-csi get pod -o name -l 'app.kubernetes.io/name in (qsd-csi-controller,qsd-csi-node)'); do
        wait_for 240 "the new clusters file in $p" eval \
            "kubectl -n qsd-csi exec $p -c qsd-csi-plugin -- cat /etc/qsd-csi/rbd/clusters.json | grep -qF '$CEPH_MONITORS'" ||
            return 1
    done
    echo "rbd: the clusters file names $CEPH_MONITORS in every plugin pod after $((SECONDS - t0)) s"
    sed -e "s|REPLACE-with-the-output-of-ceph-auth-get-key-client.csi|$CEPH_KEY|" \
        -e "s|userID: csi|userID: $CEPH_USER|" -e "s|radosNamespace: vms|radosNamespace: $CEPH_NAMESPACE|" \
        -e "s|pool: rbd|pool: $CEPH_POOL|" -e "s|namespace: default|namespace: $ns|" -e "s|storage: 10Gi|storage: 1Gi|" \
        "$repo_root/deploy/examples/rbd.yaml" | kubectl apply -f - >/dev/null || return 1
    wait_for 180 "RBD claim Bound" pvc_bound demo-rbd-disk || {
        kubectl -n $ns describe pvc demo-rbd-disk | sed -n '/^Events:/,$p' >&2
        kubectl -n qsd-csi logs deployment/qsd-csi-controller -c qsd-csi-plugin --tail=20 >&2
        return 1; }
    img=$(rbd_images)
    echo "rbd: claim Bound after $((SECONDS - t0)) s (controller Deployment); RBD images: $img"
    [ -n "$img" ] || { say "no RBD image in the pool"; return 1; }
    vm_pod $ns vm-rbd "$dir/guest" "writer.secs=20 writer.marks=8 writer.hold=15" demo-rbd-disk |
        kubectl apply -f - >/dev/null || return 1
    wait_vm vm-rbd 240 "MARK-DONE on vm-rbd's console" console_has vm-rbd '^MARK-(DONE|FAIL)' || return 1
    console_has vm-rbd '^MARK-DONE' || { say "$(console_line vm-rbd '^MARK-FAIL')"; return 1; }
    echo "rbd: vm-rbd booted from the RBD claim: $(console_line vm-rbd '^DISK size='), $(console_line vm-rbd '^MARK-DONE')"
    vm_snapshot $ns rbd-snap qsd-rbd-snapshot demo-rbd-disk | kubectl apply -f - >/dev/null || return 1
    wait_for 120 "RBD VolumeSnapshot readyToUse" snap_ready_of rbd-snap || return 1
    # docs/rbd.md: a snapshot is an image of its own, csi-snap.<name>,
    # carrying the RBD snapshot csi-snap.
    local simg
    simg=$(rbd_images | grep '^csi-snap\.' | head -1)
    [ -n "$simg" ] || { say "no csi-snap.* image in the pool: $(rbd_images | tr '\n' ' ')"; return 1; }
    (. "$ceph_env" && rbd -c "$CEPH_CONF" snap ls "$CEPH_POOL/$CEPH_NAMESPACE/$simg") | grep -qw csi-snap ||
        { say "$simg has no snapshot csi-snap"; return 1; }
    echo "rbd: rbd-snap readyToUse: image $simg with its snapshot csi-snap"
    wait_vm vm-rbd 180 "SUMMARY on vm-rbd's console" console_has vm-rbd '^SUMMARY' || return 1
    keep_console vm-rbd
    s=$(console_line vm-rbd '^SUMMARY')
    echo "rbd: console: $s"
    [[ $s =~ write_errors=0\ mismatches=0\ ioerr=0 ]] || { say "vm-rbd saw errors"; return 1; }
    wait_for 150 "vm-rbd Succeeded" phase_is vm-rbd Succeeded || return 1
    echo "rbd: vm-rbd Succeeded"
}
stop_ceph() {
    [ -n "$ceph_pid" ] || return 0
    kill "$ceph_pid" 2>/dev/null
    local i; for i in $(seq 60); do kill -0 "$ceph_pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$ceph_pid" 2>/dev/null; wait "$ceph_pid" 2>/dev/null; ceph_pid=""
}

# deploy/README.md's uninstall, in its order, then what the node keeps.
qsds_left() { # the driver's QSDs (and filter heads) still running: their
    # sockets are below /run/qsd-csi (other QSDs on the machine are not counted)
    local p n=0
    for p in /proc/[0-9]*; do
        case $({ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null) in
        *qemu-storage-daemon*/run/qsd-csi/*|*qsd-vhost-filter*/run/qsd-csi/*) n=$((n + 1)) ;; esac
    done
    echo $n
}
uninstall() {
    local t0=$SECONDS left
    timeout 200 kubectl -n $ns delete pod --all --wait=true >/dev/null || { say "pods not deleted"; return 1; }
    # A group's member snapshots go with their group (a finalizer holds them).
    timeout 120 kubectl -n $ns delete volumegroupsnapshot --all --wait=true >/dev/null || return 1
    timeout 120 kubectl -n $ns delete volumesnapshot --all --wait=true >/dev/null || return 1
    wait_for 120 "no VolumeSnapshotContent of the driver" eval \
        '[ -z "$(kubectl get volumesnapshotcontent -o jsonpath="{.items[?(@.spec.driver==\"qsd.csi.qsd-csi.dev\")].metadata.name}")" ]' || return 1
    timeout 120 kubectl -n $ns delete pvc --all --wait=true >/dev/null || return 1
    wait_for 120 "no PV of the driver" eval \
        '[ -z "$(kubectl get pv -o jsonpath="{.items[?(@.spec.csi.driver==\"qsd.csi.qsd-csi.dev\")].metadata.name}")" ]' || return 1
    if [ -n "$ceph_env" ] && [ -s "$ceph_env" ]; then
        [ -z "$(rbd_images)" ] || { say "RBD images left: $(rbd_images)"; return 1; }
        echo "uninstall: no RBD image left in the pool"
        kubectl delete -f "$repo_root/deploy/examples/rbd.yaml" --ignore-not-found >/dev/null || return 1
    fi
    timeout 200 kubectl delete ns $ns --wait=true --ignore-not-found >/dev/null || return 1
    # As install.sh installed it (DIR/install/mode): both optional pieces.
    if [ "$(cat "$dir/install/mode" 2>/dev/null)" = helm ]; then
        HELM_CACHE_HOME=$dir/install/helm HELM_CONFIG_HOME=$dir/install/helm HELM_DATA_HOME=$dir/install/helm \
            timeout 200 "${QSD_HELM_DIR:-/var/cache/qsd-csi/helm}/helm" uninstall qsd-csi \
            --namespace kube-system --wait --timeout 180s >/dev/null || return 1
    else
        timeout 200 kubectl delete -k "$dir/install/driver" --wait=true >/dev/null || return 1
    fi
    # deploy/README.md "Changed-block tracking": the object
    # scripts/snapshot-metadata-certs.sh made (cluster-scoped).
    if kubectl get crd snapshotmetadataservices.cbt.storage.k8s.io >/dev/null 2>&1; then
        kubectl delete snapshotmetadataservice qsd.csi.qsd-csi.dev --ignore-not-found >/dev/null || return 1
    fi
    echo "uninstall: driver deleted after $((SECONDS - t0)) s"
    wait_for 60 "no QSD left" eval '[ "$(qsds_left)" = 0 ]' || return 1
    left=$(find /var/lib/qsd-csi/pool -type f 2>/dev/null | grep -v '/\.' | head -5)
    [ -z "$left" ] || { say "files left in the pool: $left"; return 1; }
    if grep -qE ' /run/qsd-csi/| /var/lib/kubelet/plugins/qsd' /proc/self/mountinfo; then
        say "mounts left:"; grep -E ' /run/qsd-csi/| /var/lib/kubelet/plugins/qsd' /proc/self/mountinfo >&2
        return 1
    fi
    echo "uninstall: no QSD, no file in the pool, no mount below /run/qsd-csi or the plugin's directory"
    [ -s /var/lib/kubelet/seccomp/qsd-csi/vm-launcher.json ] ||
        { say "no VM pod seccomp profile on the node (the init container installs it)"; return 1; }
    echo "uninstall: left as the docs say: $(ls -d /var/lib/qsd-csi /run/qsd-csi \
        /var/lib/kubelet/plugins/qsd.csi.qsd-csi.dev /var/lib/kubelet/seccomp/qsd-csi 2>/dev/null | tr '\n' ' ')"
}

# The Helm chart in the real cluster, after the kustomize install is gone:
# install (both optional pieces), a local claim used by a pod, an upgrade
# that changes the plugins' log level (the node DaemonSet is OnDelete: its
# pod and the volume's QSD stay), the claim deleted, uninstall: no QSD, no
# CSIDriver, no object of the chart left.
helm_() {
    HELM_CACHE_HOME=$dir/install/helm HELM_CONFIG_HOME=$dir/install/helm HELM_DATA_HOME=$dir/install/helm \
        timeout 300 "${QSD_HELM_DIR:-/var/cache/qsd-csi/helm}/helm" "$@"
}
helm_pod() {
    cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: user
  namespace: helm-e2e
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 5
  securityContext: {fsGroup: 107, runAsNonRoot: true, runAsUser: 65535}
  containers:
    - name: pause
      image: registry.k8s.io/pause:3.10
      volumeMounts: [{name: data, mountPath: /data, readOnly: true}]
  volumes:
    - name: data
      persistentVolumeClaim: {claimName: data}
EOF
}
helm_rev() { helm_ list -n kube-system -o json | /usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin); print(r[0]["revision"] if r else 0)'; }
helm_step() {
    local t0=$SECONDS pv vol pid
    QSD_INSTALL=helm "$here/install.sh" "$dir" >"$dir/helm-install.log" 2>&1 ||
        { tail -20 "$dir/helm-install.log" >&2; return 1; }
    [ "$(helm_rev)" = 1 ] || { say "helm release revision $(helm_rev) after install"; return 1; }
    echo "helm: installed, revision 1, Ready after $((SECONDS - t0)) s"
    kubectl get csidriver qsd.csi.qsd-csi.dev rbd.qsd-csi.dev >/dev/null || { say "CSIDrivers missing"; return 1; }
    { printf 'apiVersion: v1\nkind: Namespace\nmetadata: {name: helm-e2e}\n---\n'
      vm_claim helm-e2e data 64Mi qsd-vm; echo ---; helm_pod; } | kubectl apply -f - >/dev/null || return 1
    wait_for 120 "pod user Running" eval '[ "$(kubectl -n helm-e2e get pod user -o jsonpath={.status.phase})" = Running ]' ||
        return 1
    pv=$(kubectl -n helm-e2e get pvc data -o jsonpath='{.spec.volumeName}')
    vol=$(kubectl get pv "$pv" -o jsonpath='{.spec.csi.volumeHandle}'); vol=${vol%@*}
    pid=$(qsd_pid "$vol") && kill -0 "$pid" || { say "no QSD for the Helm install's claim"; return 1; }
    echo "helm: a local claim provisioned and published to a pod (QSD $pid)"
    helm_ upgrade qsd-csi "$repo_root/deploy/helm/qsd-csi" --namespace kube-system --reuse-values \
        --set logLevel=debug --wait --timeout 240s >/dev/null || { say "helm upgrade failed"; return 1; }
    [ "$(helm_rev)" = 2 ] || { say "revision $(helm_rev) after the upgrade"; return 1; }
    kubectl -n qsd-csi get deployment qsd-csi-controller -o jsonpath='{.spec.template.spec.containers[0].args}' |
        grep -q -- '--log-level=debug' || { say "the upgrade did not reach the controller"; return 1; }
    kill -0 "$pid" && [ "$(qsd_pid "$vol")" = "$pid" ] || { say "the upgrade stopped QSD $pid"; return 1; }
    echo "helm: upgraded to revision 2 (--log-level=debug in the controller); QSD $pid untouched"
    timeout 120 kubectl delete ns helm-e2e --wait=true >/dev/null || { say "namespace helm-e2e not deleted"; return 1; }
    wait_for 120 "PV $pv deleted" gone get pv "$pv" || return 1
    helm_ uninstall qsd-csi --namespace kube-system --wait --timeout 180s >/dev/null || return 1
    wait_for 60 "no QSD left" eval '[ "$(qsds_left)" = 0 ]' || return 1
    kubectl get csidriver qsd.csi.qsd-csi.dev >/dev/null 2>&1 && { say "CSIDriver left after helm uninstall"; return 1; }
    [ -z "$(kubectl get all -n qsd-csi --no-headers 2>/dev/null)" ] || { say "objects left in qsd-csi"; return 1; }
    echo "helm: uninstalled after $((SECONDS - t0)) s in all: no QSD, no CSIDriver, nothing in qsd-csi"
}

# A run killed with its cluster up (kill -9 of every process, as the end of
# a CI job or a session does) must not stop the next run: a pod runs (its
# sandbox, rootfs and token mounts), every process of the cluster and its
# shims is killed, and a new `up` in a new directory must take the leftover
# down and start.  From here on the new cluster is the run's.
pids_gone() { # PID...: none of them runs (missing, or a zombie)
    local p
    for p in "$@"; do
        [ -z "$({ tr -d '\0' <"/proc/$p/cmdline"; } 2>/dev/null)" ] || return 1
    done
}

reap_killed() {
    local new old p pids
    kubectl -n default run reap-probe --image=registry.k8s.io/pause:3.10.2 --restart=Never \
        >/dev/null || return 1
    wait_for 60 "pod reap-probe running" eval '[ "$(kubectl -n default get pod reap-probe -o jsonpath={.status.phase})" = Running ]' || return 1
    pids=$(cat "$dir"/pids/*)
    for p in /proc/[0-9]*; do
        { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -q -- "-address $dir/containerd/containerd.sock" &&
            pids="$pids ${p#/proc/}"
    done
    say "killing the cluster: $(echo $pids)"
    kill -KILL $pids
    # Gone (or zombies: an empty command line) before the next `up` looks:
    # SIGKILL is delivered at once but a process takes a moment to go (one in
    # D state longer), and `up` takes one still there for a cluster that
    # runs ("run 'down' first").  A later run finds them gone; so does this
    # one, bounded.
    wait_for 30 "the killed cluster's processes gone" pids_gone $pids || return 1
    grep -q " $dir/containerd/" /proc/self/mountinfo || { say "no pod mount to leave behind"; return 1; }
    new=$(mktemp -d /tmp/qsd-k8s.XXXXXX); echo "$ptag" >"$new/ptag"
    "$here/cluster.sh" up "$new" 8>&- 2>"$new/up.log" || { cat "$new/up.log" >&2; return 1; }
    grep -q "a killed run left a cluster in $dir" "$new/up.log" || { say "the leftover was not seen"; return 1; }
    old=$dir; dir=$new
    eval "$("$here/cluster.sh" env "$dir")"
    ! grep -q " $old/" /proc/self/mountinfo || { say "mounts of the killed cluster remain"; return 1; }
    [ ! -e "$old" ] || { say "$old remains"; return 1; }
    echo "reap: a cluster killed with a pod running was taken down by the next up"
}

# ---------------------------------------------------------------- sequence
step build build || exit 1
# One such cluster per machine (kubelet's root is fixed): a second run
# waits for the first (bounded), instead of failing at `up`.  fd 8 is closed
# for the cluster's processes, so only this script holds the lock.
exec 8>/run/qsd-k8s-e2e.lock
step lock flock -w 2400 8 || exit 1
locked=1
step up "$here/cluster.sh" up "$dir" 8>&- || exit 1
remove_stale_tags
eval "$("$here/cluster.sh" env "$dir")"
step images images || exit 1
step seccomp-probe "$here/seccomp-probe.sh" "$dir"
step install "$here/install.sh" "$dir" || exit 1
step examples examples
step csi-sanity "$here/sanity.sh" "$dir"
step quick-start quick_start
# QSD_K8S_ONLY=rbd (or vm): only that part of the scenarios (debugging).
if [ "${QSD_K8S_ONLY:-vm}" = vm ] && step vm-boot vm_boot; then
    step snapshot snapshot
    step modify modify
    step hotplug hotplug
    step plugin-restart restart_plugin delete
    step rollout restart_plugin rollout
    step expand expand
    # Changed-block tracking: its own claim and pods, after expand (the last
    # step that needs the first guest writing) and while that guest finishes
    # its writing time, which vm-data then waits out.
    step cbt cbt_step
    step vm-data vm_data
    step restore-clone restore_clone
    step group-snapshot group_snapshot
    step cli cli
    step no-warnings no_warnings
    step podvol podvol_scenario
fi
[ "${QSD_K8S_ONLY:-rbd}" = rbd ] && step rbd rbd_step
step no-restarts no_restarts
step uninstall uninstall
step helm helm_step
step reap reap_killed
