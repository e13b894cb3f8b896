# SPDX-License-Identifier: Apache-2.0
"""Certificates for the tests of the node endpoint's TLS (qsd-node-gate and
what runs behind it), made by the openssl CLI in a directory of the test's
own: EC P-256 CAs and leaves with a CN, an optional DNS subjectAltName and
an extendedKeyUsage, one with a validity in the past, keys 0600."""
import os
import subprocess


class Pki:
    def __init__(self, root):
        self.root = root
        os.makedirs(root, exist_ok=True)

    def path(self, name):
        return os.path.join(self.root, name)

    def openssl(self, *args):
        r = subprocess.run(["openssl", *args], cwd=self.root, capture_output=True, text=True,
                           timeout=60)
        if r.returncode:
            raise RuntimeError("openssl %s: %s" % (" ".join(args), r.stderr))

    def ca(self, name, days=30):
        """NAME.key and NAME.pem: a self-signed CA."""
        self.openssl("req", "-x509", "-new", "-newkey", "ec", "-pkeyopt",
                     "ec_paramgen_curve:P-256", "-nodes", "-keyout", name + ".key", "-out",
                     name + ".pem", "-days", str(days), "-subj", "/CN=" + name, "-addext",
                     "basicConstraints=critical,CA:TRUE", "-addext",
                     "keyUsage=critical,keyCertSign,cRLSign")

    def leaf(self, name, ca, cn, san, eku, expired=False, days=30):
        """NAME.key and NAME.pem signed by CA: CN cn, DNS:san when given,
        extendedKeyUsage eku; expired: valid in January 2020 only."""
        self.openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                     "-nodes", "-keyout", name + ".key", "-out", name + ".csr", "-subj",
                     "/CN=" + cn)
        ext = ["basicConstraints=CA:FALSE", "extendedKeyUsage=" + eku]
        if san:
            ext.append("subjectAltName=DNS:" + san)
        with open(self.path(name + ".ext"), "w") as f:
            f.write("\n".join(ext) + "\n")
        if not expired:
            self.openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey",
                         ca + ".key", "-CAcreateserial", "-days", str(days), "-extfile",
                         name + ".ext", "-out", name + ".pem")
            return
        # A validity in the past: `openssl ca` takes explicit dates.
        db = self.path("ca-db")
        os.makedirs(db, exist_ok=True)
        open(os.path.join(db, "index.txt"), "a").close()
        with open(os.path.join(db, "serial"), "w") as f:
            f.write("1000\n")
        with open(self.path("ca.cnf"), "w") as f:
            f.write("[ca]\ndefault_ca=d\n[d]\ndatabase=%s/index.txt\nnew_certs_dir=%s\n"
                    "serial=%s/serial\ndefault_md=sha256\npolicy=p\nunique_subject=no\n"
                    "[p]\ncommonName=supplied\n" % (db, db, db))
        self.openssl("ca", "-batch", "-config", "ca.cnf", "-cert", ca + ".pem", "-keyfile",
                     ca + ".key", "-in", name + ".csr", "-out", name + ".pem", "-notext",
                     "-startdate", "20200101000000Z", "-enddate", "20200201000000Z",
                     "-extfile", name + ".ext")

    def lock_keys(self):
        """Keys 0600 (root's only: the gates read them before they drop
        privileges), the rest 0644."""
        for f in os.listdir(self.root):
            p = self.path(f)
            if os.path.isfile(p):
                os.chmod(p, 0o600 if f.endswith(".key") else 0o644)
