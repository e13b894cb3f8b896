#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A one-node Kubernetes cluster as plain processes (no systemd): etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, containerd and
# kubelet, started from the binaries tests/k8s/build.sh made, with their
# state, logs and PIDs in one directory; and its teardown.  Owns: the
# cluster's certificates and configuration, the processes it starts, the CNI
# bridge, one DNAT rule and the directories below; not the images
# (images.sh) nor what is installed into the cluster.
#
#   tests/k8s/cluster.sh up DIR     start; prints "READY <seconds>" once the
#                                   node is Ready (bounded: 300 s), or tears
#                                   everything down and exits 1
#   tests/k8s/cluster.sh down DIR   stop everything it started (by PID), undo
#                                   the mounts kubelet and containerd made, and
#                                   remove DIR's state, /var/lib/kubelet and the
#                                   bridge; idempotent
#   tests/k8s/cluster.sh env DIR    print the exports for kubectl (KUBECONFIG)
#
# Fixed by the manifests: kubelet's root is /var/lib/kubelet (kustomization
# kubeletRoot), so only one such cluster runs per machine: `up` refuses while
# another one runs, takes down what a killed run left (reap_leftover), and
# refuses a /var/lib/kubelet it did not make.  No kube-proxy: the one Service pods need (the API
# server's, 10.96.0.1:443) is a DNAT rule (PREROUTING for pods on the
# bridge, OUTPUT for pods on the host's network).
# Environment: QSD_K8S_BIN (the binary directory; default: build.sh's),
# QSD_K8S_NODE (node name, default qsd-node), QSD_K8S_DEBUG=1 (keep DIR on
# `down`, for the logs).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { sed -n '3,26p' "$0" >&2; exit 2; }
mkdir -p "$dir"; dir=$(cd "$dir" && pwd)

node=${QSD_K8S_NODE:-qsd-node}
kubelet_root=/var/lib/kubelet
bridge=qsdk8s0
pod_cidr=10.244.0.0/24
service_cidr=10.96.0.0/16
service_ip=10.96.0.1
etcd_port=23790
etcd_peer_port=23800
api_port=6443
pause_image=registry.k8s.io/pause:3.10.2
# Host paths the installed driver makes (deploy/kubernetes hostPath volumes
# of type DirectoryOrCreate): a killed run's removed by `up`
# (remove_driver_leftovers), this run's by `down`.
driver_paths="/run/qsd-csi /var/lib/qsd-csi"
# Of those, the ones mounted with Bidirectional propagation outside kubelet's
# root: containerd refuses that unless the host path is on a shared mount
# ("path "/run/qsd-csi" is mounted on "/" but it is not a shared mount").
# systemd makes / shared on every usual node; here / is private (no
# systemd), so `up` gives each its own shared bind mount instead of
# changing / for the whole machine.
shared_paths="/run/qsd-csi"
# The cgroup the plugin moves its QSDs to (--qsd-cgroup), in every v1
# hierarchy: removed by `down` when `up` did not find it.
driver_cgroup=qsd-csi
cni_bin=/usr/lib/cni
# Which DIR holds the machine's cluster (see reap_leftover).
owner_file=/run/qsd-k8s-cluster
host_ip=$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')

log() { echo "cluster.sh: $*" >&2; }

bin_dir() {
    if [ -n "${QSD_K8S_BIN:-}" ]; then echo "$QSD_K8S_BIN"; return; fi
    "$here/build.sh" kube etcd containerd | sed -n 's/^BIN //p'
}

# --- processes -------------------------------------------------------------

start() { # NAME CMD...: start in the background, log and PID file in DIR
    local name=$1; shift
    setsid "$@" >"$dir/logs/$name.log" 2>&1 </dev/null &
    echo $! >"$dir/pids/$name"
}

# NAME's PID when that process still runs: the PID file's process, if its
# command line still names the binary (a PID file of a killed run may name a
# PID reused since).
pid_of() {
    local pid
    pid=$(cat "$dir/pids/$1" 2>/dev/null) && [ -n "$pid" ] || return 1
    { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -qF "/$1 " || return 1
    echo "$pid"
}
alive() { pid_of "$1" >/dev/null; }

# How NAME ended, for the message that it did (once alive says it does not
# run): its exit status or signal when this shell started it (up: a
# process that "exits" with nothing in its log was killed, by whom the
# status at least says), or that it still runs (its command line no longer
# names it).  Never blocks: wait only for a process that is gone.
how_it_ended() {
    local pid rc=0
    pid=$(cat "$dir/pids/$1" 2>/dev/null) && [ -n "$pid" ] || { echo "no PID file"; return; }
    if kill -0 "$pid" 2>/dev/null && [ -n "$({ tr -d '\0' <"/proc/$pid/cmdline"; } 2>/dev/null)" ]; then
        echo "pid $pid still runs: $({ tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | cut -c1-120)"
        return
    fi
    wait "$pid" 2>/dev/null || rc=$?
    if [ "$rc" = 127 ]; then echo "pid $pid, not this shell's child: status unknown"
    elif [ "$rc" -gt 128 ]; then echo "pid $pid killed by SIG$(kill -l $((rc - 128)))"
    else echo "pid $pid exited with status $rc"; fi
}

stop() { # NAME: SIGTERM, then SIGKILL after 15 s
    local name=$1 pid i
    [ -f "$dir/pids/$name" ] || return 0
    if pid=$(pid_of "$name"); then
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && { log "$name ($pid) ignored SIGTERM: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; }
    fi
    rm -f "$dir/pids/$name"
}

wait_for() { # SECONDS WHAT CMD...: poll CMD until it succeeds; fail early
    local bound=$1 what=$2 t0=$SECONDS p; shift 2   # when a process died
    until "$@" >/dev/null 2>&1; do
        if [ $((SECONDS - t0)) -ge "$bound" ]; then log "no $what after ${bound} s"; return 1; fi
        for p in "$dir"/pids/*; do
            [ -e "$p" ] || continue
            alive "${p##*/}" || { log "${p##*/} exited while waiting for $what ($(how_it_ended "${p##*/}"))"; return 1; }
        done
        sleep 0.5
    done
}

# --- certificates ----------------------------------------------------------

cert() { # NAME CN [O] [SAN]: a key and a certificate signed by the CA
    local name=$1 cn=$2 o=${3:-} san=${4:-} subj
    subj="/CN=$cn"; [ -z "$o" ] || subj="/O=$o$subj"
    openssl ecparam -name prime256v1 -genkey -noout -out "$pki/$name.key" 2>/dev/null
    openssl req -new -key "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
    {
        echo "basicConstraints=CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        if [ -n "$san" ]; then echo "extendedKeyUsage=serverAuth,clientAuth"; echo "subjectAltName=$san"
        else echo "extendedKeyUsage=clientAuth"; fi
    } >"$pki/$name.ext"
    openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
        -CAcreateserial -days 2 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
    rm -f "$pki/$name.csr" "$pki/$name.ext"
}

kubeconfig() { # NAME USER-CERT
    cat >"$dir/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: qsd-k8s
  cluster:
    certificate-authority: $pki/ca.crt
    server: https://$host_ip:$api_port
users:
- name: $2
  user:
    client-certificate: $pki/$2.crt
    client-key: $pki/$2.key
contexts:
- name: qsd-k8s
  context: {cluster: qsd-k8s, user: $2}
current-context: qsd-k8s
EOF
}

make_pki() {
    pki=$dir/pki; mkdir -p "$pki"
    openssl ecparam -name prime256v1 -genkey -noout -out "$pki/ca.key" 2>/dev/null
    openssl req -x509 -new -key "$pki/ca.key" -subj "/CN=qsd-k8s-ca" -days 2 \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" -out "$pki/ca.crt" 2>/dev/null
    cert apiserver kube-apiserver "" \
        "IP:$host_ip,IP:127.0.0.1,IP:$service_ip,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    cert admin kubernetes-admin system:masters
    cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
    cert controller-manager system:kube-controller-manager
    cert scheduler system:kube-scheduler
    cert kubelet "system:node:$node" system:nodes
    openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
    openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
    kubeconfig admin admin
    kubeconfig controller-manager controller-manager
    kubeconfig scheduler scheduler
    kubeconfig kubelet kubelet
}

# --- configuration files ---------------------------------------------------

write_containerd_config() {
    mkdir -p "$dir/containerd" "$dir/cni/net.d"
    cat >"$dir/containerd/config.toml" <<EOF
# containerd 2.x (tests/k8s/containerd/go.mod says why not Debian's 1.6).
version = 3
root = "$dir/containerd/root"
state = "$dir/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.nri.v1.nri"]
[grpc]
  address = "$dir/containerd/containerd.sock"
[ttrpc]
  address = "$dir/containerd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$pause_image"
[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  # The sandboxes' network namespaces below DIR, not in /run/netns.
  netns_mounts_under_state_dir = true
  # No CAP_SYS_RESOURCE on these machines: the sandboxes' oom_score_adj of
  # -998 cannot be set ("can't get final child's PID from pipe: EOF" from
  # runc); keep scores at or above containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "$(command -v runc)"
        Root = "$dir/containerd/runc"
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$cni_bin"]
    conf_dir = "$dir/cni/net.d"
EOF
    cat >"$dir/cni/net.d/10-qsd-k8s.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "qsd-k8s",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$pod_cidr"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$dir/cni/ipam"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

write_kubelet_config() {
    cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 here (KEP-5573: refused from 1.35 unless this is false).
failCgroupV1: false
cgroupDriver: cgroupfs
# The default of current runtimes: every container without a seccomp
# profile of its own runs under RuntimeDefault (--seccomp-default).
seccompDefault: true
containerRuntimeEndpoint: unix://$dir/containerd/containerd.sock
imageServiceEndpoint: unix://$dir/containerd/containerd.sock
podLogsDir: $dir/pod-logs
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
failSwapOn: false
# A shared disk of a test machine: do not evict or collect images for space.
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
EOF
}

# --- up / down -------------------------------------------------------------

# A run killed with its cluster up (kill -9, a session's end) leaves mounts,
# /var/lib/kubelet, a bridge and rules behind, and the next `up` would refuse
# for ever.  `up` names its DIR in $owner_file before it makes anything, and
# a clean `down` removes it; an owner none of whose processes runs is a
# leftover, taken down here (its DIR included) before a new cluster starts.
reap_leftover() {
    local old p
    [ -f "$owner_file" ] || return 0
    old=$(cat "$owner_file")
    [ "$old" != "$dir" ] || { log "$dir already holds a cluster"; return 1; }
    if [ -d "$old/pids" ]; then
        for p in "$old"/pids/*; do
            [ -e "$p" ] || continue
            if dir=$old alive "${p##*/}"; then
                log "the cluster of $old runs (${p##*/}): run 'down $old' first"; return 1
            fi
        done
    fi
    log "a killed run left a cluster in $old: taking it down"
    QSD_K8S_DEBUG=0 "$0" down "$old" || { log "cannot take down $old"; return 1; }
    [ ! -f "$owner_file" ] || { log "$owner_file remains"; return 1; }
}

up() {
    local t0=$SECONDS bin
    reap_leftover || exit 1
    if [ -e "$kubelet_root" ]; then
        log "$kubelet_root exists, made by no cluster of this script: remove it first"; exit 1
    fi
    echo "$dir" >"$owner_file"
    [ -n "$host_ip" ] || { log "no IPv4 source address for the API server"; exit 1; }
    bin=$(bin_dir)
    for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl \
             containerd containerd-shim-runc-v2 ctr; do
        [ -x "$bin/$b" ] || { log "missing $bin/$b (tests/k8s/build.sh)"; exit 1; }
    done
    mkdir -p "$dir/logs" "$dir/pids" "$dir/pod-logs"
    echo "$bin" >"$dir/bin"
    # From here on, any failure tears down what was started.
    trap 'rc=$?; if [ $rc != 0 ]; then log "up failed ($rc): tearing down; logs were in $dir/logs"; tail -n 20 "$dir"/logs/*.log >&2 || true; QSD_K8S_DEBUG=${QSD_K8S_DEBUG:-1} down; fi' EXIT
    [ -e /var/log/containers ] || { mkdir -p /var/log/containers; touch "$dir/made-var-log-containers"; }
    remove_driver_leftovers
    for p in $driver_paths; do [ -e "$p" ] || echo "$p"; done >"$dir/made-driver-paths"
    ls -d /sys/fs/cgroup/*/"$driver_cgroup" >/dev/null 2>&1 || touch "$dir/made-driver-cgroup"
    for p in $shared_paths; do
        mkdir -p "$p"
        mount --bind "$p" "$p"; mount --make-rshared "$p"
        echo "$p" >>"$dir/made-shared-mounts"
    done
    # containerd 1.6 puts its shims' sockets in /run/containerd/s, whatever
    # its state directory.
    [ -e /run/containerd ] || touch "$dir/made-run-containerd"
    make_pki
    write_containerd_config
    write_kubelet_config

    start etcd "$bin/etcd" --name qsd-k8s --data-dir "$dir/etcd" --unsafe-no-fsync \
        --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
        --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
        --initial-cluster "qsd-k8s=http://127.0.0.1:$etcd_peer_port" --listen-metrics-urls ""
    # Its runc shim is looked up in PATH.
    start containerd env PATH="$bin:$PATH" "$bin/containerd" --config "$dir/containerd/config.toml"
    start kube-apiserver "$bin/kube-apiserver" \
        --etcd-servers "http://127.0.0.1:$etcd_port" \
        --advertise-address "$host_ip" --secure-port "$api_port" \
        --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
        --client-ca-file "$pki/ca.crt" \
        --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
        --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
        --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
        --service-account-issuer https://kubernetes.default.svc.cluster.local \
        --service-cluster-ip-range "$service_cidr" \
        --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
        --kubelet-preferred-address-types InternalIP,Hostname \
        --allow-privileged=true --profiling=false
    wait_for 60 "etcd" "$bin/etcd" --version   # binary sanity only
    wait_for 120 "API server readiness" \
        "$bin/kubectl" --kubeconfig "$dir/admin.kubeconfig" get --raw /readyz
    log "API server ready after $((SECONDS - t0)) s"
    start kube-controller-manager "$bin/kube-controller-manager" \
        --kubeconfig "$dir/controller-manager.kubeconfig" \
        --authentication-kubeconfig "$dir/controller-manager.kubeconfig" \
        --authorization-kubeconfig "$dir/controller-manager.kubeconfig" \
        --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
        --use-service-account-credentials=true --leader-elect=false \
        --bind-address 127.0.0.1 --controllers '*'
    start kube-scheduler "$bin/kube-scheduler" --kubeconfig "$dir/scheduler.kubeconfig" \
        --authentication-kubeconfig "$dir/scheduler.kubeconfig" \
        --authorization-kubeconfig "$dir/scheduler.kubeconfig" \
        --leader-elect=false --bind-address 127.0.0.1
    wait_for 60 "containerd socket" test -S "$dir/containerd/containerd.sock"
    mkdir -p "$kubelet_root"; touch "$dir/made-kubelet-root"
    start kubelet "$bin/kubelet" --config "$dir/kubelet.yaml" --kubeconfig "$dir/kubelet.kubeconfig" \
        --root-dir "$kubelet_root" --hostname-override "$node" --node-ip "$host_ip" --v 2
    # Pods reach the API server's Service address through these rules
    # (OUTPUT: pods on the host's network, the node plugin's).
    for chain in PREROUTING OUTPUT; do
        iptables -t nat -A $chain -d "$service_ip/32" -p tcp --dport 443 \
            -m comment --comment "qsd-k8s $dir" -j DNAT --to-destination "$host_ip:$api_port"
    done
    touch "$dir/made-dnat"
    wait_for 240 "node $node Ready" "$bin/kubectl" --kubeconfig "$dir/admin.kubeconfig" \
        wait --for=condition=Ready "node/$node" --timeout=2s
    # Pods are refused until the controller-manager made this account.
    wait_for 60 "service account default/default" "$bin/kubectl" \
        --kubeconfig "$dir/admin.kubeconfig" -n default get serviceaccount default
    for p in etcd containerd kube-apiserver kube-controller-manager kube-scheduler kubelet; do
        alive "$p" || { log "$p exited ($(how_it_ended "$p"))"; exit 1; }
    done
    trap - EXIT
    echo "READY $((SECONDS - t0))"
}

# The CRI's sandboxes and containers: what kubelet leaves when it stops.
remove_containers() {
    local sock=$dir/containerd/containerd.sock id ctr
    ctr=$(cat "$dir/bin" 2>/dev/null)/ctr; [ -x "$ctr" ] || ctr=ctr
    [ -S "$sock" ] && alive containerd || return 0
    for id in $("$ctr" -a "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
        "$ctr" -a "$sock" -n k8s.io tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
    sleep 1
    for id in $("$ctr" -a "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
        "$ctr" -a "$sock" -n k8s.io tasks delete -f "$id" >/dev/null 2>&1 || true
    done
    for id in $("$ctr" -a "$sock" -n k8s.io containers ls -q 2>/dev/null); do
        "$ctr" -a "$sock" -n k8s.io containers delete "$id" >/dev/null 2>&1 || true
    done
}

# containerd-shim-runc-v2 processes of this containerd (they outlive it).
stop_shims() {
    local p
    for p in /proc/[0-9]*; do
        { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -q -- "-address $dir/containerd/containerd.sock" || continue
        kill -KILL "${p#/proc/}" 2>/dev/null || true
    done
}

# The QSDs (and their vhost-user filters) the installed plugin started:
# they outlive it by design, so an uninstall that never ran leaves them.
# Found by PID, by their command line naming the driver's runtime directory
# (/run/qsd-csi, a hostPath only this cluster's plugin uses: the container
# tests map their own directories there).
driver_qsds() {
    local p
    for p in /proc/[0-9]*; do
        case $({ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null) in
        *qemu-storage-daemon*/run/qsd-csi/*|*qsd-vhost-filter*/run/qsd-csi/*) echo "${p#/proc/}" ;;
        esac
    done
}
stop_driver_qsds() {
    local pids i
    pids=$(driver_qsds)
    [ -n "$pids" ] || return 0
    log "stopping the driver's QSDs left running: $(echo $pids)"
    kill -KILL $pids 2>/dev/null || true
    for i in $(seq 50); do
        [ -z "$(driver_qsds)" ] && return 0
        sleep 0.1
    done
    log "QSDs remain: $(driver_qsds | tr '\n' ' ')"; return 1
}

# The driver's host directories found at `up`: what a killed run's plugin
# left (its records would make the new plugin restart QSDs of volumes no
# claim of the new cluster names).  No cluster runs at this point and no
# kubelet is on the machine, so no driver uses them.
remove_driver_leftovers() {
    local p
    for p in $driver_paths; do
        [ -e "$p" ] || continue
        stop_driver_qsds || return 1
        log "removing $p, left by an earlier cluster"
        unmount_below "$p"
        if grep -qE " $p[ /]" /proc/self/mountinfo; then log "mounts remain below $p"; return 1; fi
        rm -rf "$p"
    done
}

unmount_below() { # PATH: every mount at or below PATH, deepest first
    local m
    for m in $(awk -v p="$1" '$5 == p || index($5, p "/") == 1 {print $5}' /proc/self/mountinfo | sort -r); do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "cannot unmount $m"
    done
}

down() {
    local bin p
    bin=$(cat "$dir/bin" 2>/dev/null || true)
    if [ -n "$bin" ] && alive kube-apiserver && alive kubelet; then
        # Let kubelet unmount the volumes of the pods it runs (bounded).
        "$bin/kubectl" --kubeconfig "$dir/admin.kubeconfig" delete pods --all -A \
            --grace-period=5 --timeout=60s >/dev/null 2>&1 || log "pods not all gone in 60 s"
    fi
    stop kubelet
    remove_containers
    stop kube-scheduler; stop kube-controller-manager; stop kube-apiserver
    stop containerd
    stop_shims
    stop etcd
    unmount_below "$kubelet_root"
    if [ -f "$dir/made-shared-mounts" ]; then
        for p in $(cat "$dir/made-shared-mounts"); do unmount_below "$p"; done
        rm -f "$dir/made-shared-mounts"
    fi
    unmount_below "$dir/containerd"
    if [ -f "$dir/made-run-containerd" ]; then rm -rf /run/containerd; rm -f "$dir/made-run-containerd"; fi
    if [ -f "$dir/made-dnat" ]; then
        for chain in PREROUTING OUTPUT; do
            iptables -t nat -D $chain -d "$service_ip/32" -p tcp --dport 443 \
                -m comment --comment "qsd-k8s $dir" -j DNAT --to-destination "$host_ip:$api_port" 2>/dev/null || true
        done
        rm -f "$dir/made-dnat"
    fi
    ip link del "$bridge" 2>/dev/null || true
    # The pod cgroups kubelet made (cgroupfs driver), empty once the shims died.
    for p in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/*/kubepods.slice; do
        [ -d "$p" ] && find "$p" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
    if [ -f "$dir/made-var-log-containers" ]; then rm -rf /var/log/containers; fi
    stop_driver_qsds || true
    if [ -f "$dir/made-driver-cgroup" ]; then
        for p in /sys/fs/cgroup/*/"$driver_cgroup"; do
            [ -d "$p" ] && { find "$p" -depth -type d -exec rmdir {} + 2>/dev/null || log "cannot remove $p (processes left?)"; }
        done
    fi
    # Never remove a tree with something still mounted in it.
    if awk -v a="$kubelet_root" -v b="$dir" '$5 == a || index($5, a "/") == 1 || index($5, b "/") == 1 {f=1} END {exit !f}' \
            /proc/self/mountinfo; then
        log "mounts remain below $kubelet_root or $dir: not removing them"; return 1
    fi
    if [ -f "$dir/made-kubelet-root" ]; then rm -rf "$kubelet_root"; fi
    if [ -f "$dir/made-driver-paths" ]; then
        for p in $(cat "$dir/made-driver-paths"); do
            if grep -q " $p[ /]" /proc/self/mountinfo; then log "mounts remain below $p: kept"; else rm -rf "$p"; fi
        done
    fi
    rm -rf "$dir/containerd" "$dir/etcd" "$dir/cni" "$dir/pod-logs"
    if [ "$(cat "$owner_file" 2>/dev/null)" = "$dir" ]; then rm -f "$owner_file"; fi
    if [ "${QSD_K8S_DEBUG:-0}" = 0 ]; then rm -rf "$dir"; fi
    return 0
}

case $cmd in
up) up ;;
down) down ;;
env) echo "export KUBECONFIG=$dir/admin.kubeconfig PATH=$(cat "$dir/bin"):\$PATH" ;;
*) log "unknown command $cmd"; exit 2 ;;
esac
