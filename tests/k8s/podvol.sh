# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# The cluster scenario of docs/pod-volumes.md (issue 26): a pod writes a
# file to an ext4 PVC of this driver and is deleted; a second pod reads it
# back; then a block PVC is written by one pod and read by another; then
# the import pattern: an importer pod writes a VM disk's blocks to a Block
# PVC, the claim is snapshotted and restored as a VM claim (volumeMode is a
# PVC's for life, so the VM gets the same bytes through a thin snapshot,
# the volume-mode change allowed on the snapshot's content), and a VM
# pod's guest finds every block the importer wrote.
#
# Sourced by tests/k8s/e2e.sh (step podvol, after the VM scenarios: the
# namespace $ns exists, the launcher image is loaded and its shell is the
# pods' program), which provides $ns, say, wait_for and phase_is.  It makes
# the StorageClass below and leaves nothing behind.

podvol_pod() { # NAME CLAIM SCRIPT [block]: a pod running SCRIPT with CLAIM at /data (or /dev/xvda)
    local vol
    if [ "${4:-}" = block ]; then
        vol="volumeDevices: [{name: d, devicePath: /dev/xvda}]"
    else
        vol="volumeMounts: [{name: d, mountPath: /data}]"
    fi
    kubectl -n "$ns" apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  restartPolicy: Never
  securityContext: {fsGroup: 107}
  containers:
    - name: c
      image: localhost/qsd-csi/qsd-vm-launcher:0.1.0
      imagePullPolicy: Never
      command: [sh, -c, "$3"]
      $vol
  volumes: [{name: d, persistentVolumeClaim: {claimName: $2}}]
EOF
}

podvol_claim() { # NAME STORAGECLASS MODE
    kubectl -n "$ns" apply -f - <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $1}
spec:
  accessModes: [ReadWriteOnce]
  volumeMode: $3
  storageClassName: $2
  resources: {requests: {storage: 64Mi}}
EOF
}

# An importer's script: marker blocks 0..K-1 of guest-writer.sh's format
# (64 KiB, a header naming the block, then "M"), each with fsync.
podvol_marks_script() { # K
    echo "k=0; while [ \$k -lt $1 ]; do { printf 'QSD-K8S-MARK %010d\\n' \$k;" \
         "head -c 65512 /dev/zero | tr '\\\\000' M; } |" \
         "dd of=/dev/xvda bs=65536 seek=\$k count=1 iflag=fullblock conv=fsync 2>/dev/null" \
         "|| exit 1; k=\$((k + 1)); done; echo wrote \$k"
}

podvol_done() { # POD: Succeeded, its log
    wait_for 180 "pod $1 done" phase_is "$1" Succeeded || return 1
    kubectl -n "$ns" logs "$1"
}

podvol_scenario() {
    kubectl apply -f - <<EOF || return 1
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: qsd-pod-ext4}
provisioner: qsd.csi.qsd-csi.dev
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
parameters: {csi.storage.k8s.io/fstype: ext4}
EOF
    podvol_claim pv-fs qsd-pod-ext4 Filesystem || return 1
    podvol_pod pv-writer pv-fs 'echo hello-from-writer > /data/f && sync && ls -ln /data' &&
        podvol_done pv-writer || return 1
    kubectl -n "$ns" delete pod pv-writer --wait=true --timeout=120s || return 1
    podvol_pod pv-reader pv-fs 'cat /data/f' || return 1
    [ "$(podvol_done pv-reader)" = hello-from-writer ] || { say "reader saw no file"; return 1; }
    kubectl -n "$ns" delete pod pv-reader --wait=true --timeout=120s || return 1

    podvol_claim pv-blk qsd-vm Block || return 1
    podvol_pod pv-bw pv-blk 'echo block-bytes | dd of=/dev/xvda bs=512 seek=8 conv=fsync' block &&
        podvol_done pv-bw >/dev/null || return 1
    kubectl -n "$ns" delete pod pv-bw --wait=true --timeout=120s || return 1
    podvol_pod pv-br pv-blk 'dd if=/dev/xvda bs=512 skip=8 count=1 2>/dev/null | head -c 11' block ||
        return 1
    [ "$(podvol_done pv-br)" = block-bytes ] || { say "block reader saw other bytes"; return 1; }
    kubectl -n "$ns" delete pod pv-br --wait=true --timeout=120s
    kubectl -n "$ns" delete pvc pv-fs pv-blk --wait=true --timeout=120s
    kubectl delete storageclass qsd-pod-ext4
    podvol_import_vm
}

podvol_snap_ready() { [ "$(kubectl -n "$ns" get volumesnapshot "$1" -o jsonpath='{.status.readyToUse}')" = true ]; }

# The import pattern: a Block PVC filled by a pod, a VM booted on its bytes.
podvol_import_vm() {
    local content t0=$SECONDS
    podvol_claim pv-imp qsd-vm Block || return 1
    podvol_pod pv-importer pv-imp "$(podvol_marks_script 8)" block || return 1
    [ "$(podvol_done pv-importer)" = "wrote 8" ] || { say "the importer did not write 8 blocks"; return 1; }
    kubectl -n "$ns" delete pod pv-importer --wait=true --timeout=120s || return 1
    vm_snapshot "$ns" pv-imp-snap qsd-vm-snapshot pv-imp | kubectl apply -f - || return 1
    wait_for 120 "VolumeSnapshot pv-imp-snap readyToUse" podvol_snap_ready pv-imp-snap || return 1
    content=$(kubectl -n "$ns" get volumesnapshot pv-imp-snap -o jsonpath='{.status.boundVolumeSnapshotContentName}')
    kubectl annotate volumesnapshotcontent "$content" \
        snapshot.storage.kubernetes.io/allow-volume-mode-change=true || return 1
    { vm_claim "$ns" vm-imp-disk 64Mi qsd-vm VolumeSnapshot pv-imp-snap; echo ---
      vm_pod "$ns" vm-imp "$dir/guest" "writer.verify=8 writer.hold=15" vm-imp-disk
    } | kubectl apply -f - >/dev/null || return 1
    wait_vm vm-imp 240 "VERIFY-DONE on vm-imp's console" console_has vm-imp '^VERIFY-DONE' || return 1
    echo "podvol: vm-imp console: $(console_line vm-imp '^VERIFY dev=vda') after $((SECONDS - t0)) s"
    console_has vm-imp '^VERIFY dev=vda ok' || { say "the VM did not find the importer's blocks"; return 1; }
    wait_for 150 "vm-imp Succeeded" phase_is vm-imp Succeeded || return 1
    kubectl -n "$ns" delete pod vm-imp --wait=true --timeout=120s
    kubectl -n "$ns" delete configmap vm-imp
    kubectl -n "$ns" delete volumesnapshot pv-imp-snap --wait=true --timeout=120s
    kubectl -n "$ns" delete pvc vm-imp-disk pv-imp --wait=true --timeout=120s
}
