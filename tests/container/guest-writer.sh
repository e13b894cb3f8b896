#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Guest side of the container tests (runs as /test.sh in the test guest, busybox).
# Writes patterned blocks to /dev/vda, each with fsync (dd conv=fsync), in a
# loop for writer.secs seconds over a ring of writer.blocks blocks of
# writer.bs bytes (kernel command line), times every write,
# then reads every block back and checks its pattern.  Console lines:
#   DISK size=SECTORS                  the disk is there
#   W i                                every 10th write done (progress)
#   STALL i=I ms=MS                    a write that took >= 200 ms
#   T i START MS                       writer.trace=1: every write, its start
#                                      (centiseconds since boot) and time
#   WRITE-ERROR i=I                    dd failed
#   MISMATCH block=B                   read-back differs from the last write
#   SUMMARY writes=N write_errors=E mismatches=M ioerr=X max_stall_ms=S max_stall_i=I bs=BS blocks=NB
# Times come from /proc/uptime (10 ms resolution).
# Options for the Kubernetes scenarios (tests/k8s), all off by default:
#   writer.marks=K    first write K marker blocks (block k says which) at
#                     the start of vda with fsync, read them back
#                     (MARK-DONE k=K, or MARK-FAIL) and keep the ring after them
#   writer.hotplug=1  while writing, watch for a hot-plugged vdb: HOTPLUG
#                     size=SECTORS, one patterned block written with fsync
#                     and read back (HOTPLUG-IO ok|FAIL), UNPLUG when it goes
#   writer.verify=K   write nothing: check K marker blocks on every virtio
#                     disk (VERIFY dev=vdX ok|FAIL bad=N), VERIFY-DONE, exit
#   writer.seq=1      instead of the ring: for writer.secs seconds, write
#                     record i ("QSD-SEQ <i>", one 4 KiB block, fsync) to
#                     block i/2 of vda for even i, of vdb for odd i, each
#                     after the previous one was acknowledged (SEQ-START,
#                     SEQ n every 100, SEQ-DONE n=N); a crash-consistent
#                     copy of the two disks holds a prefix of the records
#   writer.seqcheck=B check writer.seq's records in the first B blocks of
#                     vda and vdb: each disk's records are its own from 0
#                     on, without a gap, and together a prefix of the
#                     sequence (vdb has as many as vda, or one fewer):
#                     SEQCHECK vda=A vdb=B ok|FAIL, then exit
#   writer.trace=1    a T line per write of the ring (when it began and
#                     how long it took): tests/k8s times a limit's change
#                     on it (the write the new limit first slowed)
#   writer.hold=S     wait S seconds after the last line before exiting (the
#                     guest then powers off): a test reading the console from
#                     a VM pod's volume, which kubelet removes once the pod
#                     ended, gets time to see it
arg() { sed -n "s/.*$1=\([0-9]*\).*/\1/p" /proc/cmdline; }
secs=$(arg writer.secs); secs=${secs:-20}
bs=$(arg writer.bs); bs=${bs:-65536}
maxb=$(arg writer.blocks); maxb=${maxb:-64}   # blocks written in a ring (read-back time)
wait_dev() { i=0; while [ ! -b /dev/$1 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done; [ -b /dev/$1 ]; }
marks=$(arg writer.marks); marks=${marks:-0}
hotplug=$(arg writer.hotplug)
verify=$(arg writer.verify)
hold=$(arg writer.hold); hold=${hold:-0}
seq=$(arg writer.seq)
trace=$(arg writer.trace)
seqcheck=$(arg writer.seqcheck)
wait_dev vda || { echo "FAIL no vda"; exit 1; }
size=$(cat /sys/block/vda/size)
echo "DISK size=$size"
# Marker block K: a header naming it, then one byte repeated.
mark() {
    { printf 'QSD-K8S-MARK %010d\n' $1
      head -c $((bs - 24)) /dev/zero | tr '\000' M; } > /tmp/m
}
check_marks() { # DEV COUNT: prints how many marker blocks differ
    k=0 bad=0
    while [ $k -lt $2 ]; do
        mark $k
        dd if=/dev/$1 of=/tmp/r bs=$bs skip=$k count=1 2>/dev/null
        cmp -s /tmp/m /tmp/r || bad=$((bad + 1))
        k=$((k + 1))
    done
    echo $bad
}
if [ -n "$verify" ]; then
    for d in /sys/block/vd*; do
        d=${d##*/}; bad=$(check_marks $d $verify)
        if [ $bad = 0 ]; then echo "VERIFY dev=$d ok"; else echo "VERIFY dev=$d FAIL bad=$bad"; fi
    done
    echo "VERIFY-DONE"; sleep $hold
    exit 0
fi
cs() { read u _ < /proc/uptime; echo "${u%.*}${u#*.}"; }   # centiseconds since boot
# writer.seqcheck: how many records DEV holds from block 0 on, each the
# next of its parity P (vda: 0, 2, 4...; vdb: 1, 3, 5...); -1 when a block
# holds anything else (a gap shows as the wrong next record).
seq_count() { # DEV P BLOCKS
    dd if=/dev/$1 bs=4096 count=$3 2>/dev/null | tr -d '\000' > /tmp/seq.$1
    k=0
    while read t v; do
        n=${v#"${v%%[!0]*}"}
        if [ "$t" != QSD-SEQ ] || [ "${n:-0}" != $((2 * k + $2)) ]; then echo -1; return; fi
        k=$((k + 1))
    done < /tmp/seq.$1
    echo $k
}
if [ -n "$seqcheck" ]; then
    wait_dev vdb || { echo "SEQCHECK FAIL no vdb"; exit 1; }
    a=$(seq_count vda 0 $seqcheck) b=$(seq_count vdb 1 $seqcheck)
    if [ $a -ge 0 ] && [ $b -ge 0 ] && { [ $b = $a ] || [ $b = $((a - 1)) ]; }; then r=ok; else r=FAIL; fi
    echo "SEQCHECK vda=$a vdb=$b $r"; sleep $hold
    exit 0
fi
if [ "$seq" = 1 ]; then
    wait_dev vdb || { echo "FAIL no vdb"; exit 1; }
    i=0 errors=0 end=$(($(cs) + secs * 100))
    echo "SEQ-START"
    while [ $(cs) -lt $end ]; do
        d=vda; [ $((i % 2)) = 1 ] && d=vdb
        { printf 'QSD-SEQ %010d\n' $i; head -c $((4096 - 19)) /dev/zero; } > /tmp/s
        dd if=/tmp/s of=/dev/$d bs=4096 seek=$((i / 2)) count=1 conv=fsync 2>/dev/null ||
            { errors=$((errors + 1)); echo "WRITE-ERROR i=$i"; break; }
        i=$((i + 1))
        [ $((i % 100)) = 0 ] && echo "SEQ $i"
    done
    echo "SEQ-DONE n=$i write_errors=$errors"; sleep $hold
    exit 0
fi
k=0
while [ $k -lt $marks ]; do
    mark $k; dd if=/tmp/m of=/dev/vda bs=$bs seek=$k count=1 conv=fsync 2>/dev/null
    k=$((k + 1))
done
if [ $marks -gt 0 ]; then
    echo 3 > /proc/sys/vm/drop_caches
    bad=$(check_marks vda $marks)
    if [ $bad = 0 ]; then echo "MARK-DONE k=$marks"; else echo "MARK-FAIL bad=$bad"; fi
fi
nb=$((size * 512 / bs - marks))
[ $nb -gt $maxb ] && nb=$maxb
[ $nb -gt 0 ] || { echo "FAIL disk smaller than one block"; exit 1; }
# Block content of write I: a header naming I, then one byte repeated.
blk() {
    { printf 'QSD-CTR-BLOCK %010d\n' $1
      head -c $((bs - 25)) /dev/zero | tr '\000' "\\$(printf %03o $(($1 % 251 + 1)))"; } > /tmp/b
}
# A hot-plugged vdb: seen, one block written and read back, seen going.
watch_hotplug() {
    while [ ! -b /dev/vdb ]; do sleep 0.5; done
    echo "HOTPLUG size=$(cat /sys/block/vdb/size)"
    printf 'QSD-K8S-HOTPLUG\n' > /tmp/h; head -c $((bs - 16)) /dev/zero | tr '\000' H >> /tmp/h
    if dd if=/tmp/h of=/dev/vdb bs=$bs count=1 conv=fsync 2>/dev/null &&
       dd if=/dev/vdb of=/tmp/hr bs=$bs count=1 iflag=direct 2>/dev/null && cmp -s /tmp/h /tmp/hr
    then echo "HOTPLUG-IO ok"; else echo "HOTPLUG-IO FAIL"; fi
    while [ -b /dev/vdb ]; do sleep 0.5; done
    echo "UNPLUG"
}
[ "$hotplug" = 1 ] && watch_hotplug &
errors=0 n=0 max=0 maxi=-1
start=$(cs); end=$((start + secs * 100))
echo "WRITE-START blocks=$nb bs=$bs secs=$secs"
while [ $(cs) -lt $end ]; do
    blk $n
    t0=$(cs)
    dd if=/tmp/b of=/dev/vda bs=$bs seek=$((marks + n % nb)) count=1 conv=fsync 2>/dev/null ||
        { errors=$((errors + 1)); echo "WRITE-ERROR i=$n"; }
    d=$((($(cs) - t0) * 10))
    [ $d -gt $max ] && { max=$d; maxi=$n; }
    [ $d -ge 200 ] && echo "STALL i=$n ms=$d"
    [ "$trace" = 1 ] && echo "T $n $t0 $d"
    n=$((n + 1))
    [ $((n % 10)) -eq 0 ] && echo "W $n"
done
echo 3 > /proc/sys/vm/drop_caches
bad=0 b=0
while [ $b -lt $nb ] && [ $b -lt $n ]; do
    # The last write to block b: the largest i < n with i % nb == b.
    last=$(((n - 1 - b) / nb * nb + b))
    blk $last
    dd if=/dev/vda of=/tmp/r bs=$bs skip=$((marks + b)) count=1 2>/dev/null
    cmp -s /tmp/b /tmp/r || { bad=$((bad + 1)); echo "MISMATCH block=$b write=$last"; }
    b=$((b + 1))
done
ioerr=$(dmesg | grep -c 'I/O error')
echo "SUMMARY writes=$n write_errors=$errors mismatches=$bad ioerr=$ioerr max_stall_ms=$max max_stall_i=$maxi bs=$bs blocks=$nb"
sleep $hold
