#!/usr/bin/env bash
# bench.sh: the data path's benchmark, every configuration side by side in
# one run on the same fully written file, each compared with the physical
# limit measured in the same run (io_uring, O_DIRECT, on the file itself).
#
#   scripts/bench.sh [--size 1G] [--runtime-ms 3000] [--ramp-ms 500]
#                    [--out docs/bench] [--workdir build/bench]
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
# The machine is shared and drifts: the limit is measured again right before
# each configuration, and each ratio uses that paired limit.
# Writes OUT/results.json (every number), OUT/results.md (ratio table and
# the machine) and OUT/bench.png (needs gnuplot: Debian package gnuplot-nox).
# Needs: a built qsdctl (QSDCTL=, default build/qsdctl/qsdctl), QEMU >= 8.1.
set -euo pipefail
cd "$(dirname "$0")/.."

size=1G runtime=3000 ramp=500 out=docs/bench work=build/bench
while [ $# -gt 0 ]; do
    case $1 in
    --size) size=$2; shift 2 ;;
    --runtime-ms) runtime=$2; shift 2 ;;
    --ramp-ms) ramp=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --workdir) work=$2; shift 2 ;;
    *) echo "usage: $0 [--size S] [--runtime-ms MS] [--ramp-ms MS] [--out DIR] [--workdir DIR]" >&2; exit 2 ;;
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

bench() { # NAME TARGET [ARGS...]
    local name=$1 target=$2; shift 2
    echo "bench.sh: === $name" >&2
    timeout 600 "$QSDCTL" bench --json --label "$name" --runtime-ms "$runtime" --ramp-ms "$ramp" \
        "$@" "$target" >"$run/$name.json" 2>"$run/$name.log" ||
        { cat "$run/$name.log" >&2; echo "bench.sh: $name failed" >&2; exit 1; }
}

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

paired() { # NAME FORMAT AIO QUEUES [mainloop]
    bench "limit@$1" "$work/data.raw"
    start_qsd "$2" "$3" "$4" "${5:-}"
    bench "$1" "$run/vhost.sock" --queues "$4"
    bench "$1+poll" "$run/vhost.sock" --queues "$4" --poll-us 200
    stop_qsd
}
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
    echo "runtime: ${runtime} ms per test after ${ramp} ms ramp"
    echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
} >"$run/machine.txt"

"$PY" - "$run" "$out" <<'PYEOF'
import glob, json, os, sys
run, out = sys.argv[1], sys.argv[2]
runs = {}
for f in sorted(glob.glob(os.path.join(run, "*.json"))):
    j = json.load(open(f))
    runs[j["label"]] = j
machine = open(os.path.join(run, "machine.txt")).read().strip().splitlines()
configs = sorted(l for l in runs if l.startswith("qsd-") and "null" not in l) + \
          sorted(l for l in runs if l.startswith("qsd-null"))
tests = [r["test"] for r in runs[configs[0]]["results"]]
def res(label, test):
    return next(r for r in runs[label]["results"] if r["test"] == test)
def lim(config, test):
    return res("limit@" + config.split("+")[0], test)
order = []
for c in configs:
    if "+" not in c:
        order.append("limit@" + c)
    order.append(c)
json.dump({"machine": machine, "runs": [runs[l] for l in order]},
          open(os.path.join(out, "results.json"), "w"), indent=1)
short = {"randread-4k-qd1": "rr4k qd1", "randread-4k-qd32": "rr4k qd32", "randwrite-4k-qd1": "rw4k qd1",
         "randwrite-4k-qd32": "rw4k qd32", "seqread-128k-qd8": "sr128k qd8"}
L = []
L.append("# Data-path benchmark: QSD vhost-user-blk against the io_uring limit\n")
L.append("Generated by `scripts/bench.sh`; every number in one run on this machine:\n")
L += ["    " + m for m in machine]
L.append("\nRatio of IOPS to the limit (io_uring, O_DIRECT, same file, measured right before "
         "each configuration), depth-1 mean latency above that limit, and CPU time per I/O at "
         "4k random read depth 32 (QSD: all its threads; client: qsdctl, user+kernel). "
         "`+poll`: the client polls the used ring up to 200 us before sleeping. "
         "Targets: rr4k qd32 >= 0.95, rr4k qd1 mean latency <= limit + 15 us.\n")
hdr = "| configuration | " + " | ".join(short[t] for t in tests) + \
      " | rr qd1 mean +us | rw qd1 mean +us | QSD CPU us/IO (rr qd32) | client CPU us/IO (rr qd32) |"
L.append(hdr)
L.append("|" + "---|" * (len(tests) + 5))
for l in configs:
    cells = ["%.2f" % (res(l, t)["iops"] / lim(l, t)["iops"]) for t in tests]
    d1 = res(l, "randread-4k-qd1")["mean_us"] - lim(l, "randread-4k-qd1")["mean_us"]
    w1 = res(l, "randwrite-4k-qd1")["mean_us"] - lim(l, "randwrite-4k-qd1")["mean_us"]
    q = res(l, "randread-4k-qd32")["qsd_cpu_us_per_io"]
    c = res(l, "randread-4k-qd32")["client_cpu_us_per_io"]
    L.append("| %s | %s | %+.1f | %+.1f | %s | %.1f |" % (l, " | ".join(cells), d1, w1,
             "-" if q is None else "%.1f" % q, c))
L.append("\nAbsolute numbers (IOPS / mean us / p99 us), each configuration after its paired limit:\n")
L.append("| run | " + " | ".join(short[t] for t in tests) + " |")
L.append("|" + "---|" * (len(tests) + 1))
for l in order:
    L.append("| %s | %s |" % (l, " | ".join("%.0f / %.0f / %.0f" % (res(l, t)["iops"], res(l, t)["mean_us"],
             res(l, t)["p99_us"]) for t in tests)))
lims = [runs["limit@" + c] for c in configs if "+" not in c]
L.append("\nSpread of the limit over the run (min-max IOPS): " + ", ".join(
    "%s %.0f-%.0f" % (short[t], min(next(r for r in j["results"] if r["test"] == t)["iops"] for j in lims),
                      max(next(r for r in j["results"] if r["test"] == t)["iops"] for j in lims))
    for t in tests) + "\n")
open(os.path.join(out, "results.md"), "w").write("\n".join(L) + "\n")
print("\n".join(L))

# gnuplot data: ratios of the disk configurations; QD1 mean latencies of all.
with open(os.path.join(run, "ratio.dat"), "w") as f:
    f.write("config " + " ".join('"%s"' % short[t] for t in tests) + "\n")
    for l in configs:
        if "null" in l:
            continue
        f.write(l.replace("qsd-", "") + " " + " ".join("%.3f" % (res(l, t)["iops"] / lim(l, t)["iops"])
                for t in tests) + "\n")
with open(os.path.join(run, "lat.dat"), "w") as f:
    f.write('config "limit (paired)" "QSD, client sleeps" "QSD, client polls"\n')
    for l in configs:
        if "+" in l:
            continue
        f.write("%s %.1f %.1f %.1f\n" % (l.replace("qsd-", ""), lim(l, "randread-4k-qd1")["mean_us"],
                res(l, "randread-4k-qd1")["mean_us"], res(l + "+poll", "randread-4k-qd1")["mean_us"]))
PYEOF

if command -v gnuplot >/dev/null; then
    gnuplot <<GP
set terminal png size 1800,700 font ",10" noenhanced
set output "$out/bench.png"
set multiplot layout 1,2 title "QSD vhost-user-blk vs the io_uring O_DIRECT limit (same file, same run; limit measured before each configuration)"
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set key top left
set xtics rotate by -30
set grid ytics
set title "IOPS / limit"
set yrange [0:1.3]
set arrow 1 from graph 0, first 0.95 to graph 1, first 0.95 nohead dt 2 lc rgb "red"
plot for [i=2:6] "$run/ratio.dat" using i:xtic(1) title columnheader(i)
unset arrow 1
set title "4k random read, depth 1: mean latency (us)"
set yrange [0:*]
plot for [i=2:4] "$run/lat.dat" using i:xtic(1) title columnheader(i)
unset multiplot
GP
    echo "bench.sh: wrote $out/results.md, $out/results.json, $out/bench.png" >&2
else
    echo "bench.sh: gnuplot not installed (Debian: gnuplot-nox): no plot" >&2
fi
