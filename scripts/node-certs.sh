#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The key material of the node endpoint (docs/node-operations.md, "The
# endpoint"): a CA private to the driver, the nodes' shared server pair and
# the controller's client pair, for the qsd-node-gate processes of the node
# DaemonSet and the controller Deployment (deploy/README.md, "The node
# endpoint's certificates").  The Helm chart makes the same itself.
#
#   scripts/node-certs.sh --out DIR [--rotate]
#       writes DIR/ca.crt ca.key node.crt node.key controller.crt
#       controller.key (PEM; keys 0600, DIR made 0700); refuses when one of
#       them exists, unless --rotate.
#   scripts/node-certs.sh --apply NAMESPACE [--out DIR] [--rotate]
#       creates the Secrets qsd-csi-node-tls and qsd-csi-controller-tls
#       (keys ca.crt, tls.crt, tls.key) in NAMESPACE, and the Namespace
#       itself when missing (labelled as deploy/kubernetes/00-namespace.yaml).
#       Both there already: nothing is made or changed (exit 0), so an
#       install may run it every time.  One of them only: refused (they come
#       from one CA).  --rotate: a new CA and new pairs replace both (then
#       restart the gates: deploy/README.md).  Without --out the CA key is
#       not kept anywhere (nothing in the cluster can sign a new identity).
#
# What is made:
#   CA          EC P-256, CN "qsd-csi node endpoint CA", CA:TRUE pathlen 0,
#               keyCertSign/cRLSign, 10 years
#   node        CN and DNS SAN qsd-csi-node (the dial gate's --peer-name),
#               extendedKeyUsage serverAuth only
#   controller  CN and DNS SAN qsd-csi-controller (the serve gate's
#               --peer-name), extendedKeyUsage clientAuth only
# Leaves: EC P-256, digitalSignature, 10 years, random 128-bit serials
# (the openssl steps: scripts/lib/pki.sh, shared with
# snapshot-metadata-certs.sh).
#
# Needs bash, the openssl CLI (1.1.1 or 3.x), base64; --apply needs
# kubectl (KUBECTL=path to use another) with a context that may create
# Secrets in NAMESPACE.  Never prints a key: the Secrets go to kubectl on
# its standard input; what is printed is kubectl's "created" lines and the
# certificates' fingerprints and end dates.
# Exit 0: done (or the Secrets were there); 1: refused or failed; 2: usage.
set -euo pipefail

NODE_SECRET=qsd-csi-node-tls
CONTROLLER_SECRET=qsd-csi-controller-tls
NODE_NAME=qsd-csi-node
CONTROLLER_NAME=qsd-csi-controller
FILES=(ca.crt ca.key node.crt node.key controller.crt controller.key)
KUBECTL=${KUBECTL:-kubectl}

usage() {
    sed -n '3,/^# Exit 0/s/^# \{0,1\}//p' "$0" >&2
    exit 2
}
die() { echo "node-certs.sh: $*" >&2; exit 1; }
lib=$(dirname "${BASH_SOURCE[0]}")/lib/pki.sh
[ -r "$lib" ] || die "cannot read $lib (the script runs from its source tree)"
# shellcheck source-path=SCRIPTDIR source=lib/pki.sh
. "$lib"

out= ns= rotate=0
while [ $# -gt 0 ]; do
    case $1 in
    --out) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
    --out=*) out=${1#--out=}; shift ;;
    --apply) [ $# -ge 2 ] || usage; ns=$2; shift 2 ;;
    --apply=*) ns=${1#--apply=}; shift ;;
    --rotate) rotate=1; shift ;;
    -h|--help) usage ;;
    *) echo "node-certs.sh: unknown argument $1" >&2; usage ;;
    esac
done
[ -n "$out$ns" ] || usage
if [ -n "$ns" ] && ! [[ $ns =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]]; then
    die "--apply $ns: not a namespace name"
fi
command -v openssl >/dev/null || die "no openssl CLI"
command -v base64 >/dev/null || die "no base64"

umask 077
work=$(mktemp -d "${TMPDIR:-/tmp}/qsd-node-certs.XXXXXX")
trap 'rm -rf "$work"' EXIT

# --- what is there ---------------------------------------------------------
if [ -n "$out" ] && [ $rotate = 0 ]; then
    for f in "${FILES[@]}"; do
        [ ! -e "$out/$f" ] || die "$out/$f exists: --rotate replaces the files"
    done
fi
# kubectl get --ignore-not-found: exit 0 and no output when absent, an error
# (exit non-zero) when the API cannot be asked.
exists() { # KIND NAME [NAMESPACE]
    local o
    o=$("$KUBECTL" get "$1" "$2" ${3:+--namespace "$3"} --ignore-not-found -o name) ||
        die "kubectl get $1 $2${3:+ in $3} failed (no cluster access?)"
    [ -n "$o" ]
}
if [ -n "$ns" ]; then
    have=()
    for s in "$NODE_SECRET" "$CONTROLLER_SECRET"; do
        if exists secret "$s" "$ns"; then have+=("$s"); fi
    done
    if [ $rotate = 0 ] && [ ${#have[@]} = 2 ]; then
        echo "node-certs.sh: Secrets $NODE_SECRET and $CONTROLLER_SECRET exist in $ns: kept" \
             "(--rotate replaces them)"
        [ -z "$out" ] || echo "node-certs.sh: nothing written to $out"
        exit 0
    fi
    if [ $rotate = 0 ] && [ ${#have[@]} = 1 ]; then
        die "only ${have[0]} exists in $ns; both Secrets come from one CA: --rotate makes both anew"
    fi
fi

# --- the key material --------------------------------------------------------
pki_ca "$work" "qsd-csi node endpoint CA"
pki_leaf "$work" node "$NODE_NAME" serverAuth "DNS:$NODE_NAME"
pki_leaf "$work" controller "$CONTROLLER_NAME" clientAuth "DNS:$CONTROLLER_NAME"
chmod 0644 "$work"/*.crt
chmod 0600 "$work"/*.key
pki_show node-certs.sh "$work" ca node controller

# --- --out -----------------------------------------------------------------
if [ -n "$out" ]; then
    mkdir -p -m 0700 "$out"
    for f in "${FILES[@]}"; do
        # A fresh file, then rename: never a moment with a wider mode.
        cp "$work/$f" "$out/.$f.tmp"
        chmod "$([ "${f##*.}" = key ] && echo 0600 || echo 0644)" "$out/.$f.tmp"
        mv -f "$out/.$f.tmp" "$out/$f"
    done
    echo "node-certs.sh: wrote ${FILES[*]} to $out"
fi

# --- --apply -----------------------------------------------------------------
[ -n "$ns" ] || exit 0
b64() { base64 -w0 <"$work/$1"; }
secret_yaml() { # NAME LEAF
    cat <<EOF
apiVersion: v1
kind: Secret
metadata:
  name: $1
  namespace: $ns
  labels:
    app.kubernetes.io/part-of: qsd-csi
type: Opaque
data:
  ca.crt: $(b64 ca.crt)
  tls.crt: $(b64 "$2.crt")
  tls.key: $(b64 "$2.key")
EOF
}
if ! exists namespace "$ns"; then
    # As deploy/kubernetes/00-namespace.yaml (apply: `kubectl apply -k`
    # later finds its own object).
    printf '%s\n' 'apiVersion: v1' 'kind: Namespace' 'metadata:' "  name: $ns" '  labels:' \
        '    app.kubernetes.io/part-of: qsd-csi' \
        '    pod-security.kubernetes.io/enforce: privileged' |
        "$KUBECTL" apply -f - || die "cannot create the namespace $ns"
fi
for pair in "$NODE_SECRET node" "$CONTROLLER_SECRET controller"; do
    set -- $pair
    verb=create
    if [ $rotate = 1 ] && exists secret "$1" "$ns"; then verb=replace; fi
    # create/replace, not apply: apply would copy the key into the
    # last-applied-configuration annotation.
    secret_yaml "$1" "$2" | "$KUBECTL" "$verb" -f - || die "kubectl $verb of Secret $1 failed"
done
if [ $rotate = 1 ]; then
    echo "node-certs.sh: rotated; the gates read their keys at start: restart the controller" \
         "Deployment and, node by node, the node pods (deploy/README.md)"
fi
