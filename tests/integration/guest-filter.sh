#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Guest side of vhost_filter_guest.sh (runs as /test.sh in the test guest,
# busybox).  vda is a vhost-user-blk disk behind qsd-vhost-filter.  Writes
# 40 fsync'ed blocks of 256 KiB (the host kills the QSD with SIGKILL after
# block 10 and restarts it), reads every block back, then turns the write
# cache on (SET_CONFIG through the filter).  Lines parsed by the host test.
i=0; while [ ! -b /dev/vda ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i + 1)); done
[ -b /dev/vda ] || { echo "FAIL no vda"; exit 1; }
echo "DISK size=$(cat /sys/block/vda/size) queues=$(ls /sys/block/vda/mq | wc -l)"
blk() { head -c 262144 /dev/zero | tr '\000' "\\$(printf %03o $1)" > /tmp/b; }
errors=0
i=0
while [ $i -lt 40 ]; do
    blk $((i % 250 + 1))
    dd if=/tmp/b of=/dev/vda bs=262144 seek=$i count=1 conv=fsync 2>/dev/null ||
        { errors=$((errors + 1)); echo "WRITE-ERROR block=$i"; }
    echo "W $i"
    sleep 0.1
    i=$((i + 1))
done
echo 3 > /proc/sys/vm/drop_caches
bad=0
i=0
while [ $i -lt 40 ]; do
    blk $((i % 250 + 1))
    dd if=/dev/vda of=/tmp/r bs=262144 skip=$i count=1 2>/dev/null
    cmp -s /tmp/b /tmp/r || { bad=$((bad + 1)); echo "MISMATCH block=$i"; }
    i=$((i + 1))
done
echo "write back" > /sys/block/vda/cache_type
echo "CACHE $(cat /sys/block/vda/cache_type | tr ' ' _)"
echo "DONE write_errors=$errors lost=$bad ioerr=$(dmesg | grep -c 'I/O error')"
