# SPDX-License-Identifier: Apache-2.0
# Sourced by tests/k8s/e2e.sh: the YAML of the test VM pods, shaped like
# deploy/examples/vm-pod.yaml (its securityContext, the driver's seccomp profile,
# fsGroup 107, the bridge inline volume, each claim mounted read-only beside
# it, the launcher's arguments, the ConfigMap mounted as a directory).  What
# differs from the example, and why:
#   - the VM boots the project's test guest (tests/guest: a Debian kernel and
#     a busybox initramfs running tests/container/guest-writer.sh), 256 MiB,
#     no network, kernel notices on the console (loglevel=6: virtio_blk's
#     "new size" after an expansion), the writer's options on its command
#     line;
#   - the guest's kernel and initramfs come from a read-only hostPath, so
#     the namespace is `privileged` for Pod Security (baseline refuses
#     hostPath volumes);
#   - cpu request 300m and memory 600Mi instead of 200m and 1400Mi: a
#     smaller guest, and a share of the test node's 2 cores that does not
#     depend on the example's;
#   - restartPolicy Never: the guest powers off after its test, the launcher
#     then exits 0 and the pod ends Succeeded (not restarted).
# Owns no state.

# vm_namespace NS: the namespace of the VM pods.
vm_namespace() {
    cat <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: $1
  labels:
    pod-security.kubernetes.io/enforce: privileged
EOF
}

# vm_claim NS NAME SIZE CLASS [SOURCE-KIND SOURCE-NAME]: a PVC of CLASS,
# empty or from a VolumeSnapshot or PVC.
vm_claim() {
    cat <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: $2
  namespace: $1
spec:
  storageClassName: $4
  accessModes: ["ReadWriteOncePod"]
  resources:
    requests:
      storage: $3
EOF
    case ${5:-} in
    VolumeSnapshot) printf '  dataSource:\n    apiGroup: snapshot.storage.k8s.io\n    kind: VolumeSnapshot\n    name: %s\n' "$6" ;;
    PersistentVolumeClaim) printf '  dataSource:\n    kind: PersistentVolumeClaim\n    name: %s\n' "$6" ;;
    esac
}

# vm_snapshot NS NAME CLASS CLAIM: a VolumeSnapshot of CLAIM.
vm_snapshot() {
    cat <<EOF
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata:
  name: $2
  namespace: $1
spec:
  volumeSnapshotClassName: $3
  source:
    persistentVolumeClaimName: $4
EOF
}

# vm_pod NS NAME GUEST-DIR CMDLINE CLAIM...: the VM description (a
# ConfigMap) and the VM pod, one virtio disk per claim, named after it, in
# that order (vda, vdb, ...).
vm_pod() {
    local ns=$1 name=$2 guest=$3 cmdline=$4 c disks="" sep=""; shift 4
    for c in "$@"; do disks+="$sep{\"volume\": \"$c\", \"bus\": \"virtio\"}"; sep=", "; done
    cat <<EOF
apiVersion: v1
kind: ConfigMap
metadata:
  name: $name
  namespace: $ns
data:
  vm.json: |
    {
      "name": "$name",
      "vcpus": 1,
      "memory_mib": 256,
      "machine": "q35",
      "accel": "tcg",
      "boot": {"kernel": "/guest/vmlinuz", "initrd": "/guest/initrd.img",
               "cmdline": "console=ttyS0 panic=-1 loglevel=6 $cmdline"},
      "disks": [$disks],
      "network": false,
      "hotplug_slots": 4
    }
---
apiVersion: v1
kind: Pod
metadata:
  name: $name
  namespace: $ns
  labels:
    app.kubernetes.io/name: $name
spec:
  automountServiceAccountToken: false
  enableServiceLinks: false
  restartPolicy: Never
  terminationGracePeriodSeconds: 90
  securityContext:
    fsGroup: 107
    seccompProfile:
      type: Localhost
      localhostProfile: qsd-csi/vm-launcher.json
  containers:
    - name: launcher
      image: localhost/qsd-csi/qsd-vm-launcher:0.1.0
      imagePullPolicy: IfNotPresent
      command: ["/usr/local/bin/qsd-vm-launcher"]
      args:
        - --spec=/etc/qsd-vm/vm.json
        - --volumes-dir=/run/qsd-vm/bridge
        - --volumes-dir=/run/qsd-vm/volumes
        - --root=/var/lib/qsd-vm-launcher
        - --shutdown-timeout=60
        - --wait-volumes=120
        - --log-format=json
      securityContext:
        privileged: false
        allowPrivilegeEscalation: false
        runAsUser: 0
        runAsGroup: 107
      resources:
        requests:
          cpu: 300m
          memory: 600Mi
        limits:
          memory: 600Mi
      volumeMounts:
        - name: vm-description
          mountPath: /etc/qsd-vm
          readOnly: true
        - name: bridge
          mountPath: /run/qsd-vm/bridge
          mountPropagation: HostToContainer
          readOnly: true
        - name: launcher-root
          mountPath: /var/lib/qsd-vm-launcher
        - name: guest
          mountPath: /guest
          readOnly: true
EOF
    for c in "$@"; do
        printf '        - name: disk-%s\n          mountPath: /run/qsd-vm/volumes/%s\n          readOnly: true\n' "$c" "$c"
    done
    cat <<EOF
  volumes:
    - name: vm-description
      configMap:
        name: $name
    - name: bridge
      csi:
        driver: qsd.csi.qsd-csi.dev
        volumeAttributes:
          bridge: "true"
    - name: launcher-root
      emptyDir: {}
    - name: guest
      hostPath:
        path: $guest
        type: Directory
EOF
    for c in "$@"; do
        printf '    - name: disk-%s\n      persistentVolumeClaim:\n        claimName: %s\n' "$c" "$c"
    done
}

# attach_pod NS NAME VM-POD CLAIM DISK: the example's attachment pod, which
# hot-plugs CLAIM into VM-POD as DISK (deploy/examples/vm-pod.yaml).
attach_pod() {
    cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $2
  namespace: $1
spec:
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: 5
  affinity:
    podAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        - labelSelector:
            matchLabels:
              app.kubernetes.io/name: $3
          topologyKey: kubernetes.io/hostname
  securityContext:
    fsGroup: 107
    runAsNonRoot: true
    runAsUser: 65535
    seccompProfile:
      type: RuntimeDefault
  containers:
    - name: pause
      image: registry.k8s.io/pause:3.10
      securityContext:
        privileged: false
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities:
          drop: ["ALL"]
      resources:
        requests:
          cpu: 1m
          memory: 8Mi
        limits:
          memory: 16Mi
      volumeMounts:
        - name: data
          mountPath: /hotplug/data
          readOnly: true
        - name: hotplug
          mountPath: /hotplug/request
          readOnly: true
  volumes:
    - name: data
      persistentVolumeClaim:
        claimName: $4
    - name: hotplug
      csi:
        driver: qsd.csi.qsd-csi.dev
        volumeAttributes:
          hotplugInto: $3
          disk: $5
EOF
}
