#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What changed-block tracking needs besides the manifests
# (deploy/kubernetes/components/snapshot-metadata, docs/changed-blocks.md
# "In the cluster"): the csi-snapshot-metadata sidecar's TLS server key
# pair, from a CA made here, and the SnapshotMetadataService object that
# tells backup tools where the sidecar is, which CA to trust and which
# audience to mint their tokens for.  The object holds the CA, which only
# exists here, so it is made here and not by `kubectl apply -k`.  The
# sibling of scripts/node-certs.sh (the node endpoint's certificates).
#
#   scripts/snapshot-metadata-certs.sh --apply NAMESPACE [--rotate]
#       [--driver NAME] [--audience AUDIENCE]
#       creates the Secret qsd-csi-snapshot-metadata-tls (type
#       kubernetes.io/tls: tls.crt, tls.key, ca.crt) in NAMESPACE (and the
#       Namespace itself when missing, labelled as
#       deploy/kubernetes/00-namespace.yaml), then applies the cluster-scoped
#       SnapshotMetadataService named after the driver (default
#       qsd.csi.qsd-csi.dev): address qsd-csi-snapshot-metadata.NAMESPACE:9829
#       (the Service of the component), caCert the CA, audience AUDIENCE
#       (default qsd-csi-snapshot-metadata).  The Secret there already:
#       kept, and the object applied from its ca.crt (so an install may run
#       this every time).  --rotate: a new CA and pair replace both (the
#       sidecar re-reads its files when the Secret's volume changes).
#
# What is made: CA EC P-256, CN "qsd-csi snapshot metadata CA", CA:TRUE
# pathlen 0, 10 years (its key is not kept anywhere); the server EC P-256,
# serverAuth, 10 years, DNS SANs qsd-csi-snapshot-metadata,
# qsd-csi-snapshot-metadata.NAMESPACE, ...NAMESPACE.svc and
# ...NAMESPACE.svc.cluster.local (the openssl steps: scripts/lib/pki.sh,
# shared with node-certs.sh).
#
# Needs bash, the openssl CLI, base64, and kubectl (KUBECTL=path to use
# another) with a context that may create Secrets in NAMESPACE and
# SnapshotMetadataService objects (their CRD installed first:
# deploy/README.md "Changed-block tracking").  Never prints a key.
# Exit 0: done; 1: failed; 2: usage.
set -euo pipefail

SECRET=qsd-csi-snapshot-metadata-tls
SERVICE=qsd-csi-snapshot-metadata
PORT=9829
KUBECTL=${KUBECTL:-kubectl}

usage() {
    sed -n '3,/^# Exit 0/s/^# \{0,1\}//p' "$0" >&2
    exit 2
}
die() { echo "snapshot-metadata-certs.sh: $*" >&2; exit 1; }
lib=$(dirname "${BASH_SOURCE[0]}")/lib/pki.sh
[ -r "$lib" ] || die "cannot read $lib (the script runs from its source tree)"
# shellcheck source-path=SCRIPTDIR source=lib/pki.sh
. "$lib"

ns= rotate=0 driver=qsd.csi.qsd-csi.dev audience=qsd-csi-snapshot-metadata
while [ $# -gt 0 ]; do
    case $1 in
    --apply) [ $# -ge 2 ] || usage; ns=$2; shift 2 ;;
    --apply=*) ns=${1#--apply=}; shift ;;
    --driver) [ $# -ge 2 ] || usage; driver=$2; shift 2 ;;
    --audience) [ $# -ge 2 ] || usage; audience=$2; shift 2 ;;
    --rotate) rotate=1; shift ;;
    -h|--help) usage ;;
    *) echo "snapshot-metadata-certs.sh: unknown argument $1" >&2; usage ;;
    esac
done
[ -n "$ns" ] || usage
[[ $ns =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]] || die "--apply $ns: not a namespace name"
[[ $driver =~ ^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$ ]] || die "--driver $driver: not a driver name"
[[ $audience =~ ^[A-Za-z0-9][-A-Za-z0-9._:/]{0,252}$ ]] || die "--audience $audience: not an audience"
command -v openssl >/dev/null || die "no openssl CLI"
command -v base64 >/dev/null || die "no base64"

umask 077
work=$(mktemp -d "${TMPDIR:-/tmp}/qsd-snapmeta-certs.XXXXXX")
trap 'rm -rf "$work"' EXIT

have_secret() {
    local o
    o=$("$KUBECTL" get secret "$SECRET" --namespace "$ns" --ignore-not-found -o name) ||
        die "kubectl get secret $SECRET in $ns failed (no cluster access?)"
    [ -n "$o" ]
}

if [ $rotate = 0 ] && have_secret; then
    echo "snapshot-metadata-certs.sh: Secret $SECRET exists in $ns: kept (--rotate replaces it)"
    "$KUBECTL" get secret "$SECRET" --namespace "$ns" -o 'jsonpath={.data.ca\.crt}' |
        base64 -d >"$work/ca.crt" || die "cannot read ca.crt of Secret $SECRET"
    openssl x509 -in "$work/ca.crt" -noout 2>/dev/null || die "Secret $SECRET: ca.crt is not a certificate"
else
    pki_ca "$work" "qsd-csi snapshot metadata CA"
    pki_leaf "$work" server "$SERVICE.$ns" serverAuth \
        "DNS:$SERVICE,DNS:$SERVICE.$ns,DNS:$SERVICE.$ns.svc,DNS:$SERVICE.$ns.svc.cluster.local"
    pki_show snapshot-metadata-certs.sh "$work" ca server
    if ! "$KUBECTL" get namespace "$ns" --ignore-not-found -o name | grep -q .; then
        printf '%s\n' 'apiVersion: v1' 'kind: Namespace' 'metadata:' "  name: $ns" '  labels:' \
            '    app.kubernetes.io/part-of: qsd-csi' \
            '    pod-security.kubernetes.io/enforce: privileged' |
            "$KUBECTL" apply -f - || die "cannot create the namespace $ns"
    fi
    verb=create
    if [ $rotate = 1 ] && have_secret; then verb=replace; fi
    # create/replace, not apply: apply would copy the key into the
    # last-applied-configuration annotation.
    cat <<EOT | "$KUBECTL" "$verb" -f - || die "kubectl $verb of Secret $SECRET failed"
apiVersion: v1
kind: Secret
metadata:
  name: $SECRET
  namespace: $ns
  labels:
    app.kubernetes.io/part-of: qsd-csi
type: kubernetes.io/tls
data:
  ca.crt: $(base64 -w0 <"$work/ca.crt")
  tls.crt: $(base64 -w0 <"$work/server.crt")
  tls.key: $(base64 -w0 <"$work/server.key")
EOT
fi

# The object backup tools read (cluster-scoped, named after the driver).
cat <<EOT | "$KUBECTL" apply -f - || die "kubectl apply of SnapshotMetadataService $driver failed (its CRD installed?)"
apiVersion: cbt.storage.k8s.io/v1beta1
kind: SnapshotMetadataService
metadata:
  name: $driver
  labels:
    app.kubernetes.io/part-of: qsd-csi
spec:
  address: $SERVICE.$ns:$PORT
  caCert: $(base64 -w0 <"$work/ca.crt")
  audience: $audience
EOT
