#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest fixture (container/images): build the plugin and launcher images once
# per ctest run with scripts/build-images.sh (layer cache reused), and write
# their names to OUT_DIR/images.env for the container tests.
#   images.sh SOURCE_DIR OUT_DIR TAG [--sanitize]
# Exit 77 (skip) only when podman cannot run here, saying why.
set -euo pipefail
src=$1 out=$2 tag=$3
shift 3
skip() { echo "SKIP: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root (rootful podman)"
command -v podman >/dev/null || skip "podman not installed (scripts/setup.sh installs it)"
info=$(timeout 60 podman info --format '{{.Host.OCIRuntime.Name}}' 2>&1) ||
    skip "'podman info' fails: $info"
mkdir -p "$out"
rm -f "$out/images.env"
t0=$(date +%s.%N)
res=$(bash "$src/scripts/build-images.sh" --quiet --tag "$tag" "$@")
echo "$res"
plugin=$(awk '$1 == "IMAGE" && $2 == "plugin" { print $3 }' <<<"$res")
launcher=$(awk '$1 == "IMAGE" && $2 == "launcher" { print $3 }' <<<"$res")
[[ -n $plugin && -n $launcher ]] || { echo "FAIL: no image names from build-images.sh"; exit 1; }
printf 'PLUGIN_IMAGE=%s\nLAUNCHER_IMAGE=%s\n' "$plugin" "$launcher" >"$out/images.env"
secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -F -e "$plugin" -e "$launcher" || true
echo "FIGURES container/images build_s=$secs" | tee -a "$out/figures.txt"
