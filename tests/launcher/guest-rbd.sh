#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Guest side of e2e-rbd.py (runs as /test.sh in the test guest, busybox; the
# guest booted from vda, an RBD volume whose first 32 MiB are a FAT EFI
# system partition holding this kernel, initramfs and script).
# Reports on the serial console; the host test parses these lines:
#   ROOT ok|bad=N               8 MiB written past the ESP of vda, read back
#   ADD/DEL/SIZE name=...       disks appearing, going, changing size
#   DATA name=X ok|bad=N        the first hot-plugged disk: pattern A written
#   RESIZED name=X size=S ok|bad=N   it grew: A still there, then pattern B
#                               over it and pattern E in its last MiB
#   RESTORED name=Y size=S ok|bad=N  the second hot-plugged disk (restored
#                               from a snapshot taken after DATA): pattern A
# Patterns: 1 MiB blocks of one byte; A = block i holds i+1, B = i+101,
# E = 0xee.  Every write is fsync'ed; reads come after dropping the caches.
wait_dev() { i=0; while [ ! -b /dev/$1 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done; [ -b /dev/$1 ]; }
blk() { head -c 1048576 /dev/zero | tr '\000' "\\$(printf %03o $1)" > /tmp/b; }
# put DEV FIRST_BLOCK COUNT BASE: blocks FIRST.. get bytes BASE, BASE+1, ...
put() {
    i=0
    while [ $i -lt $3 ]; do
        blk $(($4 + i))
        dd if=/tmp/b of=/dev/$1 bs=1048576 seek=$(($2 + i)) count=1 conv=fsync 2>/dev/null
        i=$((i + 1))
    done
}
# check DEV FIRST_BLOCK COUNT BASE: prints the number of blocks that differ
check() {
    echo 3 > /proc/sys/vm/drop_caches
    i=0 bad=0
    while [ $i -lt $3 ]; do
        blk $(($4 + i))
        dd if=/dev/$1 of=/tmp/r bs=1048576 skip=$(($2 + i)) count=1 2>/dev/null
        cmp -s /tmp/b /tmp/r || bad=$((bad + 1))
        i=$((i + 1))
    done
    echo $bad
}
verdict() { [ "$1" = 0 ] && echo ok || echo "bad=$1"; }

wait_dev vda || { echo "FAIL no vda"; exit 1; }
echo "DISK name=vda size=$(cat /sys/block/vda/size)"
put vda 48 8 201
echo "ROOT $(verdict $(check vda 48 8 201))"

echo "MONITOR-START"
# Each disk's last seen size in /tmp/size.NAME: new -> ADD, changed -> SIZE,
# gone -> DEL; vda gone -> BYE (the host's last step).
n=0 adds=0 data=
while [ $n -lt 6000 ]; do
    for d in /sys/block/vd*; do
        [ -e "$d" ] || continue
        name=${d##*/}
        size=$(cat $d/size 2>/dev/null)
        if [ ! -e /tmp/size.$name ]; then
            echo $size > /tmp/size.$name
            echo "ADD name=$name size=$size"
            [ $name = vda ] && continue
            adds=$((adds + 1))
            if [ $adds = 1 ]; then
                data=$name
                put $name 0 8 1
                echo "DATA name=$name $(verdict $(check $name 0 8 1))"
            elif [ $adds = 2 ]; then
                echo "RESTORED name=$name size=$size $(verdict $(check $name 0 8 1))"
            fi
        elif [ "$(cat /tmp/size.$name)" != "$size" ]; then
            echo $size > /tmp/size.$name
            echo "SIZE name=$name size=$size"
            if [ $name = "$data" ]; then
                bad=$(check $name 0 8 1)
                put $name 0 8 101
                last=$((size / 2048 - 1))
                put $name $last 1 238
                bad=$((bad + $(check $name 0 8 101) + $(check $name $last 1 238)))
                echo "RESIZED name=$name size=$size $(verdict $bad)"
            fi
        fi
    done
    for f in /tmp/size.*; do
        [ -e "$f" ] || continue
        name=${f#/tmp/size.}
        [ -e /sys/block/$name ] || { rm -f $f; echo "DEL name=$name"; }
    done
    [ -e /sys/block/vda ] || { echo "BYE"; exit 0; }
    sleep 0.1
    n=$((n + 1))
done
echo "MONITOR-TIMEOUT"
