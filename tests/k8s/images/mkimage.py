#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Write a one-layer container image as a docker-archive tar (what
`ctr images import` and `podman load` read), from files on this machine:
the pause image and the sidecar images of the test cluster, which have no
registry to come from.  Owns the archive's layout only.

    mkimage.py --tag NAME:TAG --out FILE.tar [--entrypoint PATH] [--user UID]
               SRC=DEST...

Each SRC is copied to DEST (an absolute path in the image) with its mode;
the layer also holds /tmp (1777).  Timestamps are 0, so the same inputs give
the same image ID."""
import argparse
import hashlib
import io
import json
import os
import sys
import tarfile


def layer(files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = {"tmp"}
        for _, dest in files:
            parts = dest.strip("/").split("/")[:-1]
            dirs.update("/".join(parts[:i + 1]) for i in range(len(parts)))
        for d in sorted(dirs):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        for src, dest in files:
            info = tarfile.TarInfo(dest.strip("/"))
            st = os.stat(src)
            info.size = st.st_size
            info.mode = st.st_mode & 0o7777
            with open(src, "rb") as f:
                tar.addfile(info, f)
    return buf.getvalue()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--entrypoint")
    ap.add_argument("--user")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    files = []
    for spec in a.files:
        src, sep, dest = spec.partition("=")
        if not sep or not dest.startswith("/") or not os.path.isfile(src):
            sys.exit(f"mkimage.py: bad file spec {spec!r} (SRC=/DEST, SRC a file)")
        files.append((src, dest))
    data = layer(files)
    diff_id = "sha256:" + hashlib.sha256(data).hexdigest()
    config = {
        "architecture": "amd64", "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Entrypoint": [a.entrypoint] if a.entrypoint else None,
                   "User": a.user or "", "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "tests/k8s/images/mkimage.py"}],
    }
    cfg = json.dumps(config, sort_keys=True).encode()
    cfg_name = hashlib.sha256(cfg).hexdigest() + ".json"
    manifest = json.dumps([{"Config": cfg_name, "RepoTags": [a.tag],
                            "Layers": ["layer.tar"]}]).encode()
    tmp = a.out + ".tmp"
    with tarfile.open(tmp, "w") as tar:
        for name, blob in ((cfg_name, cfg), ("layer.tar", data), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(blob))
    os.replace(tmp, a.out)
    print(f"IMAGE {a.tag} {hashlib.sha256(cfg).hexdigest()[:12]} {a.out}")


if __name__ == "__main__":
    main()
