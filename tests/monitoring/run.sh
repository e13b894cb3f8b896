#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# tests/monitoring/run.sh: checks deploy/monitoring with promtool; with
# --load, in a real Prometheus (load.py).
#
#   1. every qsd_csi_ series named by the PrometheusRule, the dashboard and
#      this directory's test is one the plugin exports (csi/metrics.c);
#   2. `promtool check rules` on the PrometheusRule's groups;
#   3. the dashboard's queries parse as PromQL (`promtool check rules` on a
#      rules file made of them, Grafana's variables replaced);
#   4. `promtool test rules qsd-csi-rules.test.yaml`: each alert against
#      recorded series, firing where it must and not where it must not;
#   5. self-check: the same test on a copy of the rules whose alerts never
#      fire must fail.
#
# promtool comes from the Go module proxy (github.com/prometheus/prometheus
# at PROMTOOL_VERSION), built once into $QSD_PROMTOOL_DIR (default
# /var/cache/qsd-csi/promtool) and kept there with a stamp of its version,
# by tests/gotool.sh; the Prometheus server of the same version beside it
# (for load.py, ctest deploy/monitoring_load), built with -tags
# remove_all_sd (the module's plugins/ tags: no service-discovery plugin;
# the test scrapes a static target).  A cold build of promtool took 510 s
# on a 2-core machine (downloads ~1.8 GB of modules into GOMODCACHE and
# ~1.8 GB of build cache).  The server after it, 2026-11-27: 100 s (nice
# 10, load average about 5; 33 more modules downloaded; a 75 MB binary,
# promtool with every plugin is 123 MB).
# Exit 0: all good; 1: a problem; 77: skipped, only when there is no Go
# (and no promtool of that version built before).
#   --build: build promtool and prometheus if needed, and stop there
#            (scripts/test.sh does it in the background before the suite,
#            at the lowest CPU priority).
#   --load PLUGIN PROTO_DIR: build prometheus if needed and run load.py
#            (the rules and the dashboard in a real Prometheus).
#   --dashboard: load the dashboard into Grafana's own schema types
#            (dashcheck/, on Grafana's foundation SDK: the Grafana server is
#            AGPL and not in Debian, so it does not run here), and check
#            that a copy with a field Grafana does not know is refused.
set -euo pipefail

PROMTOOL_VERSION=v0.316.0  # the Prometheus 3.x module; see go-partial's list
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CACHE=${QSD_PROMTOOL_DIR:-/var/cache/qsd-csi/promtool}
PROMTOOL=$CACHE/promtool
MODULE=github.com/prometheus/prometheus
SERVER_TAGS=remove_all_sd  # the plugins/ build tags of the module

build_server() {
    /bin/bash "$ROOT/tests/gotool.sh" --tags "$SERVER_TAGS" "$CACHE" "$PROMTOOL_VERSION" \
        "$MODULE/cmd/prometheus"
}

# dashcheck, our own module (dashcheck/go.mod), built into $CACHE under
# gotool.sh's lock, stamped with the hash of its sources.
build_dashcheck() {
    local src=$HERE/dashcheck bin=$CACHE/dashcheck stamp tmp go
    stamp=$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-16)
    mkdir -p "$CACHE"
    exec 8>"$CACHE/.lock"
    flock -w 1800 8 || { echo "FAIL: $CACHE/.lock held for 30 minutes"; exit 1; }
    if [[ -x "$bin" && "$(cat "$bin.version" 2>/dev/null)" == "$stamp" ]]; then
        exec 8>&-
        return 0
    fi
    go=${QSD_GO:-$(command -v go || echo /usr/local/go/bin/go)}
    if [[ ! -x "$go" ]]; then
        echo "SKIP: Go is not installed (needed once to build dashcheck into $CACHE)"
        exit 77
    fi
    tmp=$(mktemp -d "$CACHE/build.XXXXXX")
    if ! (cd "$src" && GOFLAGS=-modcacherw "$go" build -o "$tmp/dashcheck" .); then
        rm -rf "$tmp"
        echo "FAIL: go build of dashcheck failed"
        exit 1
    fi
    mv -f "$tmp/dashcheck" "$bin"
    rm -rf "$tmp"
    echo "$stamp" >"$bin.version"
    exec 8>&-
}

case ${1:-} in
--build)
    /bin/bash "$ROOT/tests/gotool.sh" "$CACHE" "$PROMTOOL_VERSION" "$MODULE/cmd/promtool"
    build_server
    build_dashcheck
    exit 0;;
--dashboard)
    build_dashcheck
    dash=$ROOT/deploy/monitoring/qsd-csi-dashboard.json
    "$CACHE/dashcheck" "$dash"
    WORK=$(mktemp -d /tmp/qsd-dashcheck.XXXXXX)
    trap 'rm -rf "$WORK"' EXIT
    # Self-check: a field the schema does not know, in one panel.
    /usr/bin/python3 -c 'import json, sys
d = json.load(open(sys.argv[1])); d["panels"][1]["legendz"] = 1
json.dump(d, open(sys.argv[2], "w"))' "$dash" "$WORK/planted.json"
    if out=$("$CACHE/dashcheck" "$WORK/planted.json"); then
        echo "FAIL: a dashboard with an unknown panel field was accepted"
        exit 1
    fi
    grep -q "unexpected field 'legendz'" <<<"$out" ||
        { echo "FAIL: the planted field was not the one reported: $out"; exit 1; }
    echo "ok: the planted unknown field was refused"
    exit 0;;
--load)
    build_server
    exec /usr/bin/python3 "$HERE/load.py" "$CACHE/prometheus" "${@:2}";;
esac
/bin/bash "$ROOT/tests/gotool.sh" "$CACHE" "$PROMTOOL_VERSION" "$MODULE/cmd/promtool"

WORK=$(mktemp -d /tmp/qsd-monitoring.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# The rule groups of the PrometheusRule as a plain rules file, the
# dashboard's queries as another; the test beside them.
/usr/bin/python3 - "$ROOT" "$WORK" <<'EOF'
import json, re, sys, yaml
root, work = sys.argv[1], sys.argv[2]
with open(root + "/deploy/monitoring/prometheusrule.yaml") as f:
    rule = yaml.safe_load(f)
with open(work + "/qsd-csi.rules.yaml", "w") as f:
    yaml.safe_dump({"groups": rule["spec"]["groups"]}, f, sort_keys=False)
with open(root + "/deploy/monitoring/qsd-csi-dashboard.json") as f:
    dash = json.load(f)
exprs = []
for p in dash["panels"]:
    for t in p.get("targets", []):
        e = t["expr"].replace("$__rate_interval", "5m")
        exprs.append(re.sub(r"\$[a-z_]+", ".*", e))
for v in dash["templating"]["list"]:
    m = re.match(r"label_values\((.*), *\w+\)$", v.get("definition", ""))
    if m:
        exprs.append(re.sub(r"\$[a-z_]+", ".*", m.group(1)))
with open(work + "/dashboard.rules.yaml", "w") as f:
    yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
        {"record": "dashboard:query_%d" % i, "expr": e} for i, e in enumerate(exprs)]}]}, f)
print("dashboard: %d queries" % len(exprs))

# 1. Only series the plugin exports.
with open(root + "/csi/metrics.c") as f:
    exported = set(re.findall(r'"(qsd_csi_[a-z_]+)"', f.read()))
bad = []
for src in ("deploy/monitoring/prometheusrule.yaml", "deploy/monitoring/qsd-csi-dashboard.json",
            "tests/monitoring/qsd-csi-rules.test.yaml"):
    with open(root + "/" + src) as f:
        for name in sorted(set(re.findall(r"qsd_csi_[a-z_]+", f.read()))):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if name not in exported and base not in exported:
                bad.append("%s: %s is not a series of csi/metrics.c" % (src, name))
if bad:
    print("FAIL " + "\nFAIL ".join(bad))
    sys.exit(1)
print("ok   every qsd_csi_ series named is exported (%d families)" % len(exported))

# 5's copy: every alert's expression replaced by one that never fires.
for g in rule["spec"]["groups"]:
    for r in g["rules"]:
        if "alert" in r:
            r["expr"] = "vector(1) == 0"
with open(work + "/never.rules.yaml", "w") as f:
    yaml.safe_dump({"groups": rule["spec"]["groups"]}, f, sort_keys=False)
EOF
cp "$HERE/qsd-csi-rules.test.yaml" "$WORK/"

echo "== promtool check rules (the PrometheusRule's groups)"
"$PROMTOOL" check rules "$WORK/qsd-csi.rules.yaml"
echo "== promtool check rules (the dashboard's queries)"
"$PROMTOOL" check rules "$WORK/dashboard.rules.yaml"
echo "== promtool test rules"
"$PROMTOOL" test rules "$WORK/qsd-csi-rules.test.yaml"

echo "== self-check: alerts that never fire must fail the test"
mkdir "$WORK/never"
cp "$WORK/qsd-csi-rules.test.yaml" "$WORK/never/"
cp "$WORK/never.rules.yaml" "$WORK/never/qsd-csi.rules.yaml"
if "$PROMTOOL" test rules "$WORK/never/qsd-csi-rules.test.yaml" >"$WORK/never.out" 2>&1; then
    echo "FAIL: the test passes with rules that never fire"
    exit 1
fi
n=$(grep -c "alertname: Qsd" "$WORK/never.out" || true)
echo "ok   rejected ($n failed alert cases)"
