#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build the project twice (normal with -Werror, and ASan+UBSan) and run the whole
# test suite in both builds, the fuzzers, then the Kubernetes end-to-end run
# (tests/k8s/e2e.sh: a one-node cluster built from the Go module proxy).
# The cluster's Go binaries build in the background, at the lowest CPU
# priority, while the C suite runs.  Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=$(nproc)
command -v go >/dev/null || export PATH=$PATH:/usr/local/go/bin

# The cluster's binaries (cached by the pins; a cold build takes tens of
# minutes on 2 cores): started first in a process group of its own, stopped
# by that group's id if this script ends early.
# promtool and the Prometheus server (tests/monitoring/run.sh, ctests
# deploy/monitoring_rules and deploy/monitoring_load) and helm
# (tests/helm/run.sh, ctest deploy/helm_chart) first: cold builds take
# about 9, 2 and 3 minutes, and those tests wait for them (a lock, in
# tests/gotool.sh) rather than building them in the middle of the suite;
# before them the SnapshotMetadata test's Go client (tests/cbt/build.sh,
# about 25 s; ctest integration/csi_snapmeta waits for it the same way) and
# csi-sanity for the host's sanity runs (about 50 s; ctests
# integration/csi_sanity_group and csi_sanity_pods, csilib.csi_sanity()).
k8s_log=$(mktemp /tmp/qsd-k8s-build.XXXXXX)
setsid nice -n 19 sh -c 'tests/cbt/build.sh >/dev/null &&
                         bash tests/gotool.sh /var/cache/qsd-csi/csi-sanity \
                             $(awk '"'"'$1 == "sanity" {print $4, $3 "/cmd/csi-sanity"}'"'"' tests/k8s/sidecars.txt) \
                             >/dev/null &&
                         tests/monitoring/run.sh --build &&
                         tests/helm/run.sh --build &&
                         exec tests/k8s/build.sh --jobs "$1"' \
    sh "$jobs" >"$k8s_log" 2>&1 &
k8s_build=$!
trap 'kill -- -$k8s_build 2>/dev/null || true; rm -f "$k8s_log"' EXIT
# The QEMU the tests run (qemu-storage-daemon and qemu-img, found in PATH):
# the normal build runs what ships, QEMU 11.1.3 of the images' Debian 13
# (scripts/trixie-bin.sh, cached in /var/cache/qsd-csi); the sanitizer
# build runs the host's QEMU 10.0.2 from bookworm-backports, the older
# version a Debian 12 host of the demo and of development has.
qemu_ships=$(scripts/trixie-bin.sh | tail -1)
run_build() {
    local dir=$1 path=$PATH; shift
    [ -z "$1" ] || path=$1:$PATH
    shift
    echo "=== build $dir ($*)"
    cmake -S . -B "$dir" -DWERROR=ON "$@" >/dev/null
    cmake --build "$dir" -j"$jobs"
    echo "=== test $dir (qemu-storage-daemon: $(PATH=$path qemu-storage-daemon --version | head -1))"
    PATH=$path ctest --test-dir "$dir" --output-on-failure -j"$jobs" --timeout 900
}

# Sanitizer runtime options: any leak or UB report fails the test.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

run_build build "$qemu_ships"
run_build build-asan "" -DSANITIZE=ON -DCMAKE_BUILD_TYPE=Debug

# Fuzzers (libFuzzer, clang): each harness runs for a short time on its seeds.
echo "=== build build-fuzz (clang, FUZZ=ON)"
CC=clang cmake -S . -B build-fuzz -DFUZZ=ON -DWERROR=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-fuzz -j"$jobs" --target fuzz_grpc_session fuzz_csi_decode fuzz_vufilter \
    fuzz_qcow2map
echo "=== fuzz"
ctest --test-dir build-fuzz -L fuzz --output-on-failure

# Kubernetes: wait for the binaries, then the whole end-to-end run.
echo "=== k8s build (started in the background)"
# Bounded: a cold build took 17 min here beside the C suite; 45 min means
# something hangs (the module proxy, a stuck compiler).
for _ in $(seq 2700); do kill -0 $k8s_build 2>/dev/null || break; sleep 1; done
if kill -0 $k8s_build 2>/dev/null; then
    tail -20 "$k8s_log"; echo "k8s build still running after 45 min: stopped"; exit 1
fi
if ! wait $k8s_build; then
    tail -20 "$k8s_log"; echo "k8s build failed"; exit 1
fi
grep -E '^(TIME|STANDIN|BIN)' "$k8s_log" | tr '\n' ' '; echo
echo "=== k8s end-to-end"
tests/k8s/e2e.sh
