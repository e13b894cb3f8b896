#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run one libFuzzer binary for a bounded time on a copy of its seed corpus.
# usage: run-fuzzer.sh FUZZER SEED_DIR SECONDS [ARTIFACT_DIR]
# Exit status is the fuzzer's: non-zero when it found a crash, leak or UB;
# the reproducer is left in ARTIFACT_DIR (default: the current directory).
set -euo pipefail
fuzzer=$1 seeds=$2 secs=$3 artifacts=${4:-$PWD}
work=$(mktemp -d "${TMPDIR:-/tmp}/qsd-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$artifacts"
# -timeout: one input taking 10 s is a finding; -rss_limit_mb bounds memory.
"$fuzzer" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" "$work" "$seeds"
