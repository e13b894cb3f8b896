#!/usr/bin/env bash
# Build the project twice (normal with -Werror, and ASan+UBSan) and run the whole
# test suite in both builds.  Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=$(nproc)
run_build() {
    local dir=$1; shift
    echo "=== build $dir ($*)"
    cmake -S . -B "$dir" -DWERROR=ON "$@" >/dev/null
    cmake --build "$dir" -j"$jobs"
    echo "=== test $dir"
    ctest --test-dir "$dir" --output-on-failure -j"$jobs" --timeout 900
}

# Sanitizer runtime options: any leak or UB report fails the test.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

run_build build
run_build build-asan -DSANITIZE=ON -DCMAKE_BUILD_TYPE=Debug

# Fuzzers (libFuzzer, clang): each harness runs for a short time on its seeds.
echo "=== build build-fuzz (clang, FUZZ=ON)"
CC=clang cmake -S . -B build-fuzz -DFUZZ=ON -DWERROR=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-fuzz -j"$jobs" --target fuzz_grpc_session fuzz_csi_decode fuzz_vufilter
echo "=== fuzz"
ctest --test-dir build-fuzz -L fuzz --output-on-failure
