# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# scripts/lib/pki.sh: the openssl steps that scripts/node-certs.sh and
# scripts/snapshot-metadata-certs.sh share, sourced by both (not run): a
# CA private to the driver and the leaf key pairs it signs, made in the
# caller's work directory.
#
#   pki_ca DIR CN
#       DIR/ca.key and the self-signed DIR/ca.crt: CN, basicConstraints
#       critical CA:TRUE pathlen 0, keyUsage critical keyCertSign/cRLSign,
#       subjectKeyIdentifier.
#   pki_leaf DIR NAME CN USAGE SAN
#       DIR/NAME.key and DIR/NAME.crt signed by DIR/ca: CN, basicConstraints
#       critical CA:FALSE, keyUsage critical digitalSignature,
#       extendedKeyUsage USAGE (serverAuth or clientAuth, the one purpose
#       it is then verified for), subjectAltName SAN ("DNS:a,DNS:b"),
#       subject and authority key identifiers.
#   pki_show PROG DIR NAME...
#       prints "PROG: NAME certificate sha256 FINGERPRINT, valid until
#       DATE" for each DIR/NAME.crt (never a key).
#
# Every key EC P-256, every certificate SHA-256, 10 years (PKI_DAYS), a
# random 128-bit serial.  The caller defines die MESSAGE (prints it, exits
# 1), which every failed openssl step calls with openssl's message, sets
# umask 077 and owns (and removes) the work directory.

PKI_DAYS=3650

pki_ossl() { # openssl ARGS, quiet unless it fails
    local err
    err=$(openssl "$@" 2>&1 >/dev/null) || die "openssl $1 failed: $err"
}
pki_serial() { echo "0x$(openssl rand -hex 16)"; }
pki_key() { # DIR NAME
    pki_ossl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1/$2.key"
}

pki_ca() { # DIR CN
    cat >"$1/ca.cnf" <<EOT
[req]
distinguished_name = dn
prompt = no
[dn]
CN = $2
[ca]
basicConstraints = critical,CA:TRUE,pathlen:0
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
EOT
    pki_key "$1" ca
    pki_ossl req -new -x509 -config "$1/ca.cnf" -extensions ca -key "$1/ca.key" \
        -set_serial "$(pki_serial)" -days "$PKI_DAYS" -sha256 -out "$1/ca.crt"
}

pki_leaf() { # DIR NAME CN USAGE SAN
    local purpose
    case $4 in
    serverAuth) purpose=sslserver ;;
    clientAuth) purpose=sslclient ;;
    *) die "pki_leaf $2: usage $4 is neither serverAuth nor clientAuth" ;;
    esac
    cat >"$1/$2.cnf" <<EOT
[req]
distinguished_name = dn
prompt = no
[dn]
CN = $3
[leaf]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = $4
subjectAltName = $5
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EOT
    pki_key "$1" "$2"
    pki_ossl req -new -config "$1/$2.cnf" -key "$1/$2.key" -subj "/CN=$3" -out "$1/$2.csr"
    pki_ossl x509 -req -in "$1/$2.csr" -CA "$1/ca.crt" -CAkey "$1/ca.key" \
        -set_serial "$(pki_serial)" -days "$PKI_DAYS" -sha256 -extfile "$1/$2.cnf" \
        -extensions leaf -out "$1/$2.crt"
    pki_ossl verify -CAfile "$1/ca.crt" -purpose "$purpose" "$1/$2.crt"
}

pki_show() { # PROG DIR NAME...
    local prog=$1 dir=$2 c fp end
    shift 2
    for c in "$@"; do
        fp=$(openssl x509 -in "$dir/$c.crt" -noout -fingerprint -sha256 | sed 's/^.*=//')
        end=$(openssl x509 -in "$dir/$c.crt" -noout -enddate | sed 's/^notAfter=//')
        echo "$prog: $c certificate sha256 $fp, valid until $end"
    done
}
