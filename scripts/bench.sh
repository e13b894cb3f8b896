#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench.sh: the data path's benchmark (scripts/bench.py does the work; see
# its header and docs/bench/README.md).  The QSDs measured are started with
# the command line the plugin itself prints (qsd-csi-plugin
# --print-qsd-command), alternatives with one change each; QEMU's block layer
# in one process (qemu-img bench) and the io_uring O_DIRECT limit (the best
# of qsdctl bench and fio on the file) run interleaved in one run; the other
# tenants' CPU pressure is measured before every run (busy runs marked, a
# mostly busy run refused); --compare-qsd BINARY runs a second QSD beside.
#
#   scripts/bench.sh [--size-mib 1024] [--runtime-ms 1000] [--ramp-ms 300]
#                    [--rounds 3] [--out docs/bench] [--workdir build/bench]
#                    [--compare-qsd BINARY] [--max-pressure 20] [--allow-busy]
#
# Needs a build (build/csi/qsd-csi-plugin, build/qsdctl/qsdctl), root (the
# Debian 13 root of the QEMU that ships is made on first use),
# gnuplot-nox for the plot; fio optional.  About 4 GiB x 2 of scratch files in
# the work directory, removed at the end.  Only ratios mean anything on a
# shared machine: the tables give the spread over rounds and the CPU pressure.
set -euo pipefail
cd "$(dirname "$0")/.."
for b in build/csi/qsd-csi-plugin build/qsdctl/qsdctl; do
    [[ -x $b ]] || { echo "bench.sh: build first ($b missing)" >&2; exit 1; }
done
# What ships: QEMU 11.1.3 of the images (scripts/trixie-bin.sh) first in
# PATH, for the QSDs and `qemu-img bench` (bench.py --qsd overrides).
PATH=$(scripts/trixie-bin.sh | tail -1):$PATH
export PATH
exec /usr/bin/python3 scripts/bench.py "$@"
