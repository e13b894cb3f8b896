#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Guest side of e2e-hotplug.sh (runs as /test.sh in the test guest, busybox).
# Reports on the serial console; the host test parses these lines.
wait_dev() { i=0; while [ ! -b /dev/$1 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done; [ -b /dev/$1 ]; }
wait_dev vda || { echo "FAIL no vda"; exit 1; }
echo "DISK name=vda serial=$(cat /sys/block/vda/serial) size=$(cat /sys/block/vda/size)"

# Phase 1: 48 x 1 MiB blocks, each fsync'ed; the host kills QSD in the middle.
blk() { head -c 1048576 /dev/zero | tr '\000' "\\$(printf %03o $1)" > /tmp/b; }
# Each write is timed (/proc/uptime, 10 ms steps): the longest one is the
# stall the guest saw while the QSD was down and QEMU reconnected.
cs() { read up rest < /proc/uptime; echo "${up%.*}${up#*.}"; }
errors=0
stall=0
echo "WRITE-START"
i=0
while [ $i -lt 48 ]; do
    blk $((i % 250 + 1))
    t0=$(cs)
    dd if=/tmp/b of=/dev/vda bs=1048576 seek=$i count=1 conv=fsync 2>/dev/null ||
        { errors=$((errors + 1)); echo "WRITE-ERROR block=$i"; }
    t=$(( ($(cs) - t0) * 10 ))
    [ $t -gt $stall ] && stall=$t
    echo "W $i"
    sleep 0.2  # spread the writes so the host's kill lands in the middle
    i=$((i + 1))
done
echo 3 > /proc/sys/vm/drop_caches
bad=0
i=0
while [ $i -lt 48 ]; do
    blk $((i % 250 + 1))
    dd if=/dev/vda of=/tmp/r bs=1048576 skip=$i count=1 2>/dev/null
    cmp -s /tmp/b /tmp/r || { bad=$((bad + 1)); echo "MISMATCH block=$i"; }
    i=$((i + 1))
done
ioerr=$(dmesg | grep -c 'I/O error')
echo "VERIFY write_errors=$errors mismatches=$bad ioerr=$ioerr"
echo "STALL max_write_ms=$stall"

# Phase 2: report every disk that appears, disappears or changes size, until
# vda goes away (the host's last step) or 10 minutes pass.
echo "MONITOR-START"
: > /tmp/prev
n=0
while [ $n -lt 6000 ]; do
    : > /tmp/cur
    for d in /sys/block/vd*; do
        [ -e "$d" ] || continue
        echo "$(basename $d) $(cat $d/size 2>/dev/null) $(cat $d/serial 2>/dev/null) $(cat $d/ro 2>/dev/null) $(cat $d/queue/logical_block_size 2>/dev/null) $(ls $d/mq 2>/dev/null | wc -l)" >> /tmp/cur
    done
    if ! cmp -s /tmp/prev /tmp/cur; then
        while read name size serial ro lbs mq; do
            old=$(grep "^$name " /tmp/prev)
            if [ -z "$old" ]; then
                echo "ADD name=$name size=$size serial=$serial ro=$ro lbs=$lbs queues=$mq"
            elif [ "$old" != "$name $size $serial $ro $lbs $mq" ]; then
                echo "SIZE name=$name size=$size"
            fi
        done < /tmp/cur
        while read name rest; do
            grep -q "^$name " /tmp/cur || echo "DEL name=$name"
        done < /tmp/prev
        cp /tmp/cur /tmp/prev
    fi
    grep -q '^vda ' /tmp/cur || { echo "BYE"; exit 0; }
    sleep 0.1
    n=$((n + 1))
done
echo "MONITOR-TIMEOUT"
