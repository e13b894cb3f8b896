#!/usr/bin/env bash
# bench.sh: the data path's benchmark, every configuration side by side in
# one run on the same fully written file, each compared with the physical
# limit measured in the same run (io_uring, O_DIRECT, on the file itself).
#
#   scripts/bench.sh [--size 1G] [--runtime-ms 1000] [--ramp-ms 300]
#                    [--rounds 3] [--out docs/bench] [--workdir build/bench]
#
# Configurations: QSD vhost-user-blk with raw and qcow2 images, aio=io_uring
# and aio=native, one and two queues; QSD with a null-co backend (the cost of
# vhost-user and QSD alone).  All QSD block nodes use cache.direct=on.
# Each export runs in its own iothread (as QSD should be run); one extra row
# runs raw/io_uring/1q in QSD's main loop for comparison.  Every QSD
# configuration is measured twice: with the client sleeping on the call
# eventfd until QSD signals (like a guest that halts), and with the client
# polling the used ring up to 200 us first ("+poll", like a KVM guest with
# halt polling): the difference is what the wake-ups cost on this machine.
# The machine is shared and drifts by 2x within minutes: for each test the
# limit, the sleeping client and the polling client run one right after the
# other, in several rounds; a ratio is the median over rounds of QSD divided
# by the limit run just before it.  CPU pressure (PSI) is recorded.
# Writes OUT/results.json (every number), OUT/results.md (ratio table and
# the machine) and OUT/bench.png (needs gnuplot: Debian package gnuplot-nox).
# Needs: a built qsdctl (QSDCTL=, default build/qsdctl/qsdctl), QEMU >= 8.1.
set -euo pipefail
cd "$(dirname "$0")/.."

size=1G runtime=1000 ramp=300 rounds=3 out=docs/bench work=build/bench
while [ $# -gt 0 ]; do
    case $1 in
    --size) size=$2; shift 2 ;;
    --runtime-ms) runtime=$2; shift 2 ;;
    --ramp-ms) ramp=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --workdir) work=$2; shift 2 ;;
    *) echo "usage: $0 [--size S] [--runtime-ms MS] [--ramp-ms MS] [--rounds N] [--out DIR] [--workdir DIR]" >&2; exit 2 ;;
    esac
done
QSDCTL=${QSDCTL:-build/qsdctl/qsdctl}
QSD_BIN=${QSD_BIN:-/usr/bin/qemu-storage-daemon}
PY=/usr/bin/python3
[ -x "$QSDCTL" ] || { echo "bench.sh: build qsdctl first ($QSDCTL)" >&2; exit 1; }

mkdir -p "$work" "$out"
work=$(cd "$work" && pwd)
run=$(mktemp -d "$work/run.XXXXXX")
QSD_PID=
cleanup() {
    if [ -n "$QSD_PID" ]; then
        kill -TERM "$QSD_PID" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$QSD_PID" 2>/dev/null || break; sleep 0.05; done
        kill -KILL "$QSD_PID" 2>/dev/null || true
        wait "$QSD_PID" 2>/dev/null || true
    fi
    rm -rf "$run" "$work/data.raw" "$work/data.qcow2"
}
trap cleanup EXIT

bytes=$("$PY" -c '
import sys; s = sys.argv[1].upper(); m = {"K": 1, "M": 2, "G": 3, "T": 4}
print(int(s[:-1]) * 1024 ** m[s[-1]] if s[-1] in m else int(s))' "$size")

echo "bench.sh: writing $size of random data to $work/data.raw (every block written)" >&2
dd if=/dev/urandom of="$work/data.raw" bs=1M count=$((bytes >> 20)) oflag=direct conv=fsync status=none
echo "bench.sh: converting to qcow2 (fully allocated: random data has no zero clusters)" >&2
qemu-img convert -f raw -O qcow2 -t none -T none "$work/data.raw" "$work/data.qcow2"
sync

start_qsd() { # FORMAT AIO QUEUES [mainloop]
    local fmt=$1 aio=$2 nq=$3 i
    local iot=(--object iothread,id=iot0) eiot=",iothread=iot0"
    if [ "${4:-}" = mainloop ]; then iot=(); eiot=; fi
    rm -f "$run/vhost.sock"
    local nodes
    if [ "$fmt" = null ]; then
        nodes=(--blockdev "driver=null-co,node-name=disk,size=$bytes,read-zeroes=off")
    else
        nodes=(--blockdev "driver=file,node-name=file,filename=$work/data.$fmt,cache.direct=on,aio=$aio"
               --blockdev "driver=$fmt,node-name=disk,file=file")
    fi
    "$QSD_BIN" "${iot[@]}" "${nodes[@]}" \
        --export "type=vhost-user-blk,id=exp,node-name=disk,addr.type=unix,addr.path=$run/vhost.sock,writable=on,num-queues=$nq$eiot" \
        >"$run/qsd.log" 2>&1 &
    QSD_PID=$!
    for i in $(seq 200); do
        [ -S "$run/vhost.sock" ] && return 0
        kill -0 "$QSD_PID" 2>/dev/null || { cat "$run/qsd.log" >&2; exit 1; }
        sleep 0.05
    done
    echo "bench.sh: QSD socket did not appear" >&2
    exit 1
}

stop_qsd() {
    kill -TERM "$QSD_PID"
    for _ in $(seq 100); do kill -0 "$QSD_PID" 2>/dev/null || break; sleep 0.05; done
    kill -KILL "$QSD_PID" 2>/dev/null || true
    wait "$QSD_PID" 2>/dev/null || true
    QSD_PID=
}

tests=(randread-4k-qd1 randread-4k-qd32 randwrite-4k-qd1 randwrite-4k-qd32 seqread-128k-qd8)

bench() { # LABEL ROUND TEST TARGET [ARGS...]
    local label=$1 round=$2 test=$3 target=$4; shift 4
    local f="$run/$label#$round#$test"
    timeout 600 "$QSDCTL" bench --json --label "$label" --runtime-ms "$runtime" --ramp-ms "$ramp" \
        --tests "$test" "$@" "$target" >"$f.json" 2>"$f.log" ||
        { cat "$f.log" >&2; echo "bench.sh: $label $test failed" >&2; exit 1; }
}

paired() { # NAME FORMAT AIO QUEUES [mainloop]
    local r t
    echo "bench.sh: === $1 and its limit, $rounds rounds" >&2
    start_qsd "$2" "$3" "$4" "${5:-}"
    for r in $(seq "$rounds"); do
        for t in "${tests[@]}"; do
            bench "limit@$1" "$r" "$t" "$work/data.raw"
            bench "$1" "$r" "$t" "$run/vhost.sock" --queues "$4"
            bench "$1+poll" "$r" "$t" "$run/vhost.sock" --queues "$4" --poll-us 200
        done
    done
    stop_qsd
}

psi() { sed -n 's/^some //p' /proc/pressure/cpu 2>/dev/null || echo '?'; }
psi_start=$(psi)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
for fmt in raw qcow2; do
    for aio in io_uring native; do
        for nq in 1 2; do
            paired "qsd-$fmt-$aio-${nq}q" $fmt $aio $nq
        done
    done
done
for nq in 1 2; do
    paired "qsd-null-${nq}q" null - $nq
done
paired "qsd-raw-io_uring-1q-mainloop" raw io_uring 1 mainloop

# Machine description, then the report.
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "kernel: $(uname -r)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') x $(nproc)"
    echo "memory: $(free -m | awk '/Mem:/ {print $2}') MiB"
    echo "disk: $(df --output=source "$work" | tail -1) ($(findmnt -no FSTYPE -T "$work"))"
    echo "qemu: $("$QSD_BIN" --version | head -1)"
    echo "liburing: $(pkg-config --modversion liburing 2>/dev/null || echo '?')"
    echo "file: $size, random data, fully written; qcow2 converted from it"
    echo "runtime: ${runtime} ms per test after ${ramp} ms ramp, $rounds rounds"
    echo "cpu pressure (PSI some) at start: $psi_start; load $load_start"
    echo "cpu pressure (PSI some) at end:   $(psi); load $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
} >"$run/machine.txt"

"$PY" - "$run" "$out" <<'PYEOF'
import glob, json, os, statistics, sys
run, out = sys.argv[1], sys.argv[2]
data = {}  # label -> test -> round -> result
for f in glob.glob(os.path.join(run, "*.json")):
    label, rnd, test = os.path.basename(f)[:-5].split("#")
    j = json.load(open(f))
    data.setdefault(label, {}).setdefault(test, {})[int(rnd)] = j["results"][0]
machine = open(os.path.join(run, "machine.txt")).read().strip().splitlines()
tests = ["randread-4k-qd1", "randread-4k-qd32", "randwrite-4k-qd1", "randwrite-4k-qd32", "seqread-128k-qd8"]
short = dict(zip(tests, ["rr4k qd1", "rr4k qd32", "rw4k qd1", "rw4k qd32", "sr128k qd8"]))
configs = sorted(l for l in data if l.startswith("qsd-") and "null" not in l) + \
          sorted(l for l in data if l.startswith("qsd-null"))
med = statistics.median
def limit_of(c):
    return "limit@" + c.split("+")[0]
def ratio(c, t):
    return med(data[c][t][r]["iops"] / data[limit_of(c)][t][r]["iops"] for r in data[c][t])
def lat_delta(c, t):
    return med(data[c][t][r]["mean_us"] - data[limit_of(c)][t][r]["mean_us"] for r in data[c][t])
def m(label, t, key):
    v = [x[key] for x in data[label][t].values() if x[key] is not None]
    return med(v) if v else None

summary = []
for c in configs:
    summary.append({"config": c, "ratio": {t: ratio(c, t) for t in tests},
                    "qd1_mean_delta_us": {t: lat_delta(c, t) for t in ("randread-4k-qd1", "randwrite-4k-qd1")},
                    "qsd_cpu_us_per_io": {t: m(c, t, "qsd_cpu_us_per_io") for t in tests},
                    "client_cpu_us_per_io": {t: m(c, t, "client_cpu_us_per_io") for t in tests},
                    "sleeps_per_io": {t: m(c, t, "sleeps_per_io") for t in tests},
                    "kicks_per_io": {t: m(c, t, "kicks_per_io") for t in tests}})
json.dump({"machine": machine, "summary": summary, "runs": data},
          open(os.path.join(out, "results.json"), "w"), indent=1, sort_keys=True)

L = ["# Data-path benchmark: QSD vhost-user-blk against the io_uring limit", "",
     "Generated by `scripts/bench.sh`; every number from one run on this machine:", ""]
L += ["    " + x for x in machine]
L += ["", "Median over rounds of IOPS / limit (io_uring, O_DIRECT, same file, run just before), "
      "depth-1 mean latency above the limit, CPU time per I/O at 4k random read depth 32 "
      "(QSD: all its threads; client: qsdctl, user+kernel) and client sleeps per I/O. "
      "`+poll`: the client polls the used ring up to 200 us before sleeping on the call eventfd. "
      "Targets: rr4k qd32 >= 0.95; rr4k qd1 mean <= limit + 15 us.", ""]
L.append("| configuration | " + " | ".join(short[t] for t in tests) +
         " | rr qd1 mean +us | rw qd1 mean +us | QSD CPU us/IO | client CPU us/IO | sleeps/IO qd1 |")
L.append("|" + "---|" * (len(tests) + 6))
for s in summary:
    c = s["config"]
    q = s["qsd_cpu_us_per_io"]["randread-4k-qd32"]
    L.append("| %s | %s | %+.1f | %+.1f | %s | %.1f | %.2f |" % (
        c, " | ".join("%.2f" % s["ratio"][t] for t in tests),
        s["qd1_mean_delta_us"]["randread-4k-qd1"], s["qd1_mean_delta_us"]["randwrite-4k-qd1"],
        "-" if q is None else "%.1f" % q, s["client_cpu_us_per_io"]["randread-4k-qd32"],
        s["sleeps_per_io"]["randread-4k-qd1"]))
L += ["", "Medians of absolute numbers (IOPS / mean us / p99 us):", ""]
L.append("| run | " + " | ".join(short[t] for t in tests) + " |")
L.append("|" + "---|" * (len(tests) + 1))
for c in configs:
    rows = ([limit_of(c)] if "+" not in c else []) + [c]
    for l in rows:
        L.append("| %s | %s |" % (l, " | ".join("%.0f / %.0f / %.0f" % (m(l, t, "iops"), m(l, t, "mean_us"),
                 m(l, t, "p99_us")) for t in tests)))
lims = [l for l in data if l.startswith("limit@")]
L += ["", "Spread of the limit over the whole run (min-max IOPS): " + ", ".join(
    "%s %.0f-%.0f" % (short[t], min(x["iops"] for l in lims for x in data[l][t].values()),
                      max(x["iops"] for l in lims for x in data[l][t].values())) for t in tests), ""]
open(os.path.join(out, "results.md"), "w").write("\n".join(L) + "\n")
print("\n".join(L))

with open(os.path.join(run, "ratio.dat"), "w") as f:
    f.write("config " + " ".join('"%s"' % short[t] for t in tests) + "\n")
    for s in summary:
        if "null" not in s["config"]:
            f.write(s["config"].replace("qsd-", "") + " " +
                    " ".join("%.3f" % s["ratio"][t] for t in tests) + "\n")
with open(os.path.join(run, "lat.dat"), "w") as f:
    f.write('config "limit" "QSD, client sleeps" "QSD, client polls"\n')
    for c in configs:
        if "+" in c:
            continue
        t = "randread-4k-qd1"
        f.write("%s %.1f %.1f %.1f\n" % (c.replace("qsd-", ""), m(limit_of(c), t, "mean_us"),
                                         m(c, t, "mean_us"), m(c + "+poll", t, "mean_us")))
PYEOF

if command -v gnuplot >/dev/null; then
    gnuplot <<GP
set terminal png size 1800,700 font ",10" noenhanced
set output "$out/bench.png"
set multiplot layout 1,2 title "QSD vhost-user-blk vs the io_uring O_DIRECT limit (same file, one run, median of $rounds rounds; +poll: client polls)"
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set key top left
set xtics rotate by -30
set grid ytics
set title "IOPS / limit"
set yrange [0:1.4]
set arrow 1 from graph 0, first 0.95 to graph 1, first 0.95 nohead dt 2 lc rgb "red"
plot for [i=2:6] "$run/ratio.dat" using i:xtic(1) title columnheader(i)
unset arrow 1
set title "4k random read, depth 1: mean latency (us), median of rounds"
set yrange [0:*]
plot for [i=2:4] "$run/lat.dat" using i:xtic(1) title columnheader(i)
unset multiplot
GP
    echo "bench.sh: wrote $out/results.md, $out/results.json, $out/bench.png" >&2
else
    echo "bench.sh: gnuplot not installed (Debian: gnuplot-nox): no plot" >&2
fi
