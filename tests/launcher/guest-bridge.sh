#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Guest side of e2e-bridge.py and e2e-stuck.sh (runs as /test.sh in the test
# guest, busybox).
# Reports vda, then every disk that appears, disappears or changes size,
# until vda goes away (the host's last step) or 10 minutes pass.  Each new
# disk gets one 4 KiB write attempt (WRITE ... ok|refused): a read-only
# publication must be refused here, whatever the guest tries.
wait_dev() { i=0; while [ ! -b /dev/$1 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done; [ -b /dev/$1 ]; }
wait_dev vda || { echo "FAIL no vda"; exit 1; }
echo "DISK name=vda size=$(cat /sys/block/vda/size)"
echo "MONITOR-START"
: > /tmp/prev
n=0
while [ $n -lt 6000 ]; do
    : > /tmp/cur
    for d in /sys/block/vd*; do
        [ -e "$d" ] || continue
        echo "$(basename $d) $(cat $d/size 2>/dev/null) $(cat $d/ro 2>/dev/null)" >> /tmp/cur
    done
    if ! cmp -s /tmp/prev /tmp/cur; then
        while read name size ro; do
            old=$(grep "^$name " /tmp/prev)
            if [ -z "$old" ]; then
                echo "ADD name=$name size=$size ro=$ro"
                if dd if=/dev/zero of=/dev/$name bs=4096 count=1 conv=fsync 2>/dev/null; then
                    echo "WRITE name=$name ok"
                else
                    echo "WRITE name=$name refused"
                fi
            elif [ "$old" != "$name $size $ro" ]; then
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
