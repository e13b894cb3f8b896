#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Guest side of e2e-durable.sh (runs as /test.sh in the test guest, busybox).
# vda: cold-plugged raw volume; vdb: hot-plugged qcow2 volume.  Reports each
# disk's cache mode, then writes fsync'ed blocks to both while the host kills
# both QSDs, then reads every block back.  Lines parsed by the host test.
wait_dev() { i=0; while [ ! -b /dev/$1 ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i + 1)); done; [ -b /dev/$1 ]; }
wait_dev vda || { echo "FAIL no vda"; exit 1; }
echo "READY-FOR-HOTPLUG"
wait_dev vdb || { echo "FAIL no vdb"; exit 1; }
for d in vda vdb; do
    echo "CACHE name=$d cache_type=$(cat /sys/block/$d/cache_type | tr ' ' _) write_cache=$(cat /sys/block/$d/queue/write_cache | tr ' ' _)"
done

# 40 x 256 KiB per disk, each written then fsync'ed (the guest sends a
# flush); the host kills both QSDs with SIGKILL after block 10.
blk() { head -c 262144 /dev/zero | tr '\000' "\\$(printf %03o $1)" > /tmp/b; }
errors=0
i=0
echo "WRITE-START"
while [ $i -lt 40 ]; do
    blk $((i % 250 + 1))
    for d in vda vdb; do
        dd if=/tmp/b of=/dev/$d bs=262144 seek=$i count=1 conv=fsync 2>/dev/null ||
            { errors=$((errors + 1)); echo "WRITE-ERROR disk=$d block=$i"; }
    done
    echo "W $i"
    sleep 0.1
    i=$((i + 1))
done
echo 3 > /proc/sys/vm/drop_caches
for d in vda vdb; do
    bad=0
    i=0
    while [ $i -lt 40 ]; do
        blk $((i % 250 + 1))
        dd if=/dev/$d of=/tmp/r bs=262144 skip=$i count=1 2>/dev/null
        cmp -s /tmp/b /tmp/r || { bad=$((bad + 1)); echo "MISMATCH disk=$d block=$i"; }
        i=$((i + 1))
    done
    echo "VERIFY disk=$d lost=$bad"
done
echo "DONE write_errors=$errors ioerr=$(dmesg | grep -c 'I/O error')"
