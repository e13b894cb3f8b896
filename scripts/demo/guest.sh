#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The demo VM's program (runs as /test.sh in the busybox test guest).  It
# reports on the serial console, which the demo prints as it goes.
wait_dev() { i=0; while [ ! -b /dev/$1 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done; [ -b /dev/$1 ]; }
wait_dev vda || { echo "DEMO no disk"; exit 1; }
echo "DEMO booted: disk vda, $(( $(cat /sys/block/vda/size) / 2048 )) MiB"
# Data for the snapshot step: 4 MiB of 0x5a, synced to the disk.
head -c 4194304 /dev/zero | tr '\000' '\132' | dd of=/dev/vda bs=1048576 conv=fsync 2>/dev/null &&
    echo "DEMO wrote 4 MiB of 0x5a to vda"
# Report disks that appear, grow or disappear; stop once a hot-plugged disk is gone.
: > /tmp/prev
seen_del=0
n=0
while [ $n -lt 3000 ] && [ $seen_del -eq 0 ]; do
    : > /tmp/cur
    for d in /sys/block/vd*; do
        [ -e "$d" ] && echo "$(basename $d) $(cat $d/size 2>/dev/null)" >> /tmp/cur
    done
    if ! cmp -s /tmp/prev /tmp/cur; then
        while read name size; do
            old=$(grep "^$name " /tmp/prev)
            if [ -z "$old" ]; then
                [ -s /tmp/prev ] && echo "DEMO disk $name appeared: $((size / 2048)) MiB"
            elif [ "$old" != "$name $size" ]; then
                echo "DEMO disk $name is now $((size / 2048)) MiB"
            fi
        done < /tmp/cur
        while read name rest; do
            grep -q "^$name " /tmp/cur || { echo "DEMO disk $name disappeared"; seen_del=1; }
        done < /tmp/prev
        cp /tmp/cur /tmp/prev
    fi
    sleep 0.1
    n=$((n + 1))
done
echo "DEMO powering off"
