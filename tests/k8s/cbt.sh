# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# The cluster scenario of changed-block tracking (docs/changed-blocks.md "In
# the cluster", issue 25): upstream's csi-snapshot-metadata sidecar in the
# controller Deployment (deploy/kubernetes/components/snapshot-metadata)
# answering upstream's client library (tests/k8s/cbt-lister: a command line
# around its package iterator, with the flags of upstream's
# snapshot-metadata-lister), run in pods:
#   - a pod fills the first 16 MiB of a 64 MiB Block claim with random
#     bytes and stays (its volume live in its QSD); VolumeSnapshot cbt-a;
#     three 64 KiB blocks written through `kubectl exec` at 20 MiB,
#     33 MiB + 64 KiB and 60 MiB; VolumeSnapshot cbt-b;
#   - allocated(cbt-b) covers the 16 MiB and the three blocks, at the
#     claim's capacity;
#   - delta(cbt-a, cbt-b) covers each of the three blocks (a superset is
#     allowed, a missing changed block never) and is at most an eighth of
#     the allocated bytes;
#   - refused: a ServiceAccount without the client role (the API server
#     refuses its lister the VolumeSnapshot), and a token of such an account
#     minted by an authorised one (the sidecar refuses it: PermissionDenied,
#     its SubjectAccessReview).
# The harness has no cluster DNS and no kube-proxy (tests/k8s/README.md),
# so the lister pods resolve the SnapshotMetadataService address (the
# Service's name) to a ready controller pod with hostAliases: the port is
# the same on the Service and the pod, and the certificate's name is the
# Service's, as a real cluster sees it.
#
# Sourced by tests/k8s/e2e.sh (step cbt, in the VM scenario after the
# snapshot step: $ns exists, the launcher image is loaded and is the
# writer's program), which provides $ns, $dir, say, wait_for and phase_is.
# Removes what it made (pods, snapshots, claim, ServiceAccounts, the
# ClusterRoleBinding) at its end, also after a failure.

cbt_lister_image() {
    echo "localhost/qsd-csi-test/cbt-lister:$(awk '$1 == "cbt" && $2 == "csi-snapshot-metadata" {print $4}' "$here/sidecars.txt")"
}
cbt_service_ip() { # a ready endpoint of the sidecar's Service (else a Ready controller pod's IP)
    local ip
    ip=$(kubectl -n qsd-csi get endpointslices -l kubernetes.io/service-name=qsd-csi-snapshot-metadata \
        -o jsonpath='{range .items[*].endpoints[?(@.conditions.ready==true)]}{.addresses[0]}{"\n"}{end}' |
        head -1)
    [ -n "$ip" ] || ip=$(kubectl -n qsd-csi get pods -l app.kubernetes.io/name=qsd-csi-controller -o json |
        /usr/bin/python3 -c 'import json, sys
for p in json.load(sys.stdin)["items"]:
    if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])):
        print(p["status"]["podIP"]); break')
    echo "$ip"
}
cbt_handle() { # SNAPSHOT: its content's CSI snapshot handle
    kubectl get volumesnapshotcontent -o jsonpath='{.status.snapshotHandle}' \
        "$(kubectl -n "$ns" get volumesnapshot "$1" -o jsonpath='{.status.boundVolumeSnapshotContentName}')"
}
cbt_snap_ready() { [ "$(kubectl -n "$ns" get volumesnapshot "$1" -o jsonpath='{.status.readyToUse}')" = true ]; }
cbt_ended() { case $(phase "$1") in Succeeded|Failed) return 0 ;; esac; return 1; }

# A lister pod: NAME SERVICEACCOUNT ARG...; waits for its end, keeps its
# log in $dir/NAME.log, returns 0 when it Succeeded.
cbt_lister() {
    local name=$1 sa=$2 ip a args=""; shift 2
    ip=$(cbt_service_ip)
    [ -n "$ip" ] || { say "no ready endpoint of the Service qsd-csi-snapshot-metadata"; return 2; }
    for a in "$@"; do args+="\"$a\", "; done
    kubectl -n "$ns" apply -f - >/dev/null <<EOF || return 2
apiVersion: v1
kind: Pod
metadata: {name: $name}
spec:
  restartPolicy: Never
  serviceAccountName: $sa
  hostAliases:
    - ip: "$ip"
      hostnames: [qsd-csi-snapshot-metadata.qsd-csi, qsd-csi-snapshot-metadata.qsd-csi.svc]
  securityContext: {runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532}
  containers:
    - name: lister
      image: $(cbt_lister_image)
      imagePullPolicy: Never
      args: [${args%, }]
      securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
EOF
    wait_for 120 "lister pod $name ended" cbt_ended "$name" || return 2
    kubectl -n "$ns" logs "$name" >"$dir/$name.log" 2>&1
    [ "$(phase "$name")" = Succeeded ]
}

# The lister's JSON (one line, a list of responses) checked against what was
# written: cbt_check MODE LOG, MODE allocated or delta.
cbt_check() {
    /usr/bin/python3 - "$@" <<'EOF'
import json, sys
mode, log = sys.argv[1], sys.argv[2]
MiB, K64 = 1 << 20, 64 << 10
written = [20 * MiB, 33 * MiB + K64, 60 * MiB]
lines = [l for l in open(log) if l.startswith("[")]
if len(lines) != 1:
    sys.exit(f"{log}: no JSON list in the lister's output")
records = json.loads(lines[0])
ext = []
for r in records:
    if r.get("volume_capacity_bytes") != 64 * MiB:
        sys.exit(f"{mode}: volume_capacity_bytes {r.get('volume_capacity_bytes')}, want {64 * MiB}")
    for b in r.get("block_metadata") or []:
        ext.append((b.get("byte_offset", 0), b["size_bytes"]))
ext.sort()
total = sum(s for _, s in ext)
def covered(lo, hi):  # is [lo, hi) inside the union of the extents?
    for o, s in ext:
        if o <= lo < o + s:
            lo = o + s
            if lo >= hi:
                return True
    return lo >= hi
want = [(o, o + K64) for o in written]
if mode == "allocated":
    want.append((0, 16 * MiB))
missing = [f"[{lo}, {hi})" for lo, hi in want if not covered(lo, hi)]
types = sorted({r.get("block_metadata_type") for r in records})
print(f"{mode}: {len(records)} messages, {len(ext)} extents, {total} bytes, "
      f"block_metadata_type {types}, extents {ext[:6]}{' ...' if len(ext) > 6 else ''}")
if missing:
    sys.exit(f"{mode}: written ranges not listed: {', '.join(missing)}")
open(log + ".bytes", "w").write(str(total))
EOF
}

cbt_cleanup() {
    kubectl -n "$ns" delete pod cbt-writer cbt-alloc cbt-delta cbt-nobody cbt-minted \
        --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1
    kubectl -n "$ns" delete volumesnapshot cbt-a cbt-b --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1
    kubectl -n "$ns" delete pvc cbt-disk --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1
    kubectl -n "$ns" delete serviceaccount cbt-client cbt-nobody --ignore-not-found >/dev/null 2>&1
    kubectl delete clusterrolebinding cbt-e2e-client --ignore-not-found >/dev/null 2>&1
}

cbt_writer_filled() { kubectl -n "$ns" logs cbt-writer 2>/dev/null | grep -qx filled; }

cbt_run() {
    local t0=$SECONDS o alloc delta rc
    kubectl get snapshotmetadataservice qsd.csi.qsd-csi.dev -o jsonpath='{.spec.address} {.spec.audience}{"\n"}' ||
        { say "no SnapshotMetadataService qsd.csi.qsd-csi.dev"; return 1; }
    kubectl -n "$ns" create serviceaccount cbt-client >/dev/null &&
    kubectl -n "$ns" create serviceaccount cbt-nobody >/dev/null &&
    kubectl create clusterrolebinding cbt-e2e-client --clusterrole=qsd-csi-snapshot-metadata-client \
        --serviceaccount="$ns:cbt-client" >/dev/null || return 1
    podvol_claim cbt-disk qsd-vm Block >/dev/null || return 1
    kubectl -n "$ns" apply -f - >/dev/null <<EOF || return 1
apiVersion: v1
kind: Pod
metadata: {name: cbt-writer}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 5
  containers:
    - name: c
      image: localhost/qsd-csi/qsd-vm-launcher:0.1.0
      imagePullPolicy: Never
      command: [sh, -c, "dd if=/dev/urandom of=/dev/xvda bs=65536 count=256 iflag=fullblock conv=fsync 2>/dev/null && echo filled && trap 'exit 0' TERM && while :; do sleep 1; done"]
      volumeDevices: [{name: d, devicePath: /dev/xvda}]
  volumes: [{name: d, persistentVolumeClaim: {claimName: cbt-disk}}]
EOF
    wait_for 180 "cbt-writer's 16 MiB written" cbt_writer_filled || return 1
    vm_snapshot "$ns" cbt-a qsd-vm-snapshot cbt-disk | kubectl apply -f - >/dev/null || return 1
    wait_for 120 "VolumeSnapshot cbt-a readyToUse" cbt_snap_ready cbt-a || return 1
    # 64 KiB blocks 320, 529 and 960: 20 MiB, 33 MiB + 64 KiB, 60 MiB.
    for o in 320 529 960; do
        kubectl -n "$ns" exec cbt-writer -- \
            dd if=/dev/urandom of=/dev/xvda bs=65536 seek=$o count=1 iflag=fullblock conv=fsync 2>/dev/null ||
            return 1
    done
    vm_snapshot "$ns" cbt-b qsd-vm-snapshot cbt-disk | kubectl apply -f - >/dev/null || return 1
    wait_for 120 "VolumeSnapshot cbt-b readyToUse" cbt_snap_ready cbt-b || return 1
    echo "cbt: 16 MiB, snapshot cbt-a, 3 blocks, snapshot cbt-b after $((SECONDS - t0)) s;" \
         "handles $(cbt_handle cbt-a) $(cbt_handle cbt-b)"

    cbt_lister cbt-alloc cbt-client -n "$ns" -s cbt-b -o json ||
        { say "allocated(cbt-b) failed:"; tail -5 "$dir/cbt-alloc.log" >&2; return 1; }
    cbt_check allocated "$dir/cbt-alloc.log" || return 1
    cbt_lister cbt-delta cbt-client -n "$ns" -s cbt-b -p cbt-a -o json ||
        { say "delta(cbt-a, cbt-b) failed:"; tail -5 "$dir/cbt-delta.log" >&2; return 1; }
    cbt_check delta "$dir/cbt-delta.log" || return 1
    alloc=$(cat "$dir/cbt-alloc.log.bytes") delta=$(cat "$dir/cbt-delta.log.bytes")
    [ $((delta * 8)) -le "$alloc" ] ||
        { say "delta $delta bytes is not much smaller than allocated $alloc bytes"; return 1; }
    echo "cbt: delta $delta bytes, allocated $alloc bytes"

    # Refused: an account without the role (by the API server: its lister
    # may not read the VolumeSnapshot) ...
    rc=0; cbt_lister cbt-nobody cbt-nobody -n "$ns" -s cbt-b -o json || rc=$?
    [ $rc != 0 ] || { say "a ServiceAccount without the client role got an answer"; return 1; }
    [ $rc = 1 ] || return 1
    grep -qi forbidden "$dir/cbt-nobody.log" ||
        { say "cbt-nobody failed otherwise:"; tail -3 "$dir/cbt-nobody.log" >&2; return 1; }
    echo "cbt: refused without the role: $(grep -io 'volumesnapshots.*forbidden[^"]*' "$dir/cbt-nobody.log" | head -1 | cut -c1-160)"
    # ... and by the sidecar: a token of that account, minted by an
    # authorised one (the client role may mint tokens), reaches the sidecar,
    # whose SubjectAccessReview says no.
    rc=0; cbt_lister cbt-minted cbt-client -n "$ns" -s cbt-b -o json \
        --service-account cbt-nobody --service-account-namespace "$ns" || rc=$?
    [ $rc != 0 ] || { say "the sidecar answered a token of a ServiceAccount without the role"; return 1; }
    [ $rc = 1 ] || return 1
    grep -q 'PermissionDenied' "$dir/cbt-minted.log" ||
        { say "cbt-minted failed otherwise:"; tail -3 "$dir/cbt-minted.log" >&2; return 1; }
    echo "cbt: the sidecar refused the other account's token: $(grep -o 'code = PermissionDenied.*' "$dir/cbt-minted.log" | head -1 | cut -c1-160)"
    echo "cbt: done after $((SECONDS - t0)) s"
}

cbt_step() {
    local rc=0
    cbt_run || rc=1
    if [ $rc != 0 ]; then
        kubectl -n qsd-csi logs deployment/qsd-csi-controller -c csi-snapshot-metadata --tail=20 >&2 2>&1
    fi
    cbt_cleanup
    [ -z "$(kubectl -n "$ns" get volumesnapshot cbt-a cbt-b --ignore-not-found -o name 2>/dev/null)" ] ||
        { say "cbt snapshots left"; rc=1; }
    return $rc
}
