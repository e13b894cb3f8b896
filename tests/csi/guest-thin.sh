#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Guest side of test_csi_thin_guest.py (runs as /test.sh in the test guest,
# busybox): 1 MiB blocks, block i filled with byte i%250+1, each written with
# fsync; "W i" on the console once block i is durable.  The host takes
# snapshots and merges the chain meanwhile.
wait_dev() { i=0; while [ ! -b /dev/$1 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done; [ -b /dev/$1 ]; }
wait_dev vda || { echo "FAIL no vda"; exit 1; }
n=$(sed -n 's/.*thin\.blocks=\([0-9]*\).*/\1/p' /proc/cmdline)
blk() { head -c 1048576 /dev/zero | tr '\000' "\\$(printf %03o $1)" > /tmp/b; }
errors=0
echo "WRITE-START blocks=$n"
i=0
while [ $i -lt "$n" ]; do
    blk $((i % 250 + 1))
    dd if=/tmp/b of=/dev/vda bs=1048576 seek=$i count=1 conv=fsync 2>/dev/null ||
        { errors=$((errors + 1)); echo "WRITE-ERROR block=$i"; }
    echo "W $i"
    i=$((i + 1))
done
echo 3 > /proc/sys/vm/drop_caches
bad=0
i=0
while [ $i -lt "$n" ]; do
    blk $((i % 250 + 1))
    dd if=/dev/vda of=/tmp/r bs=1048576 skip=$i count=1 2>/dev/null
    cmp -s /tmp/b /tmp/r || { bad=$((bad + 1)); echo "MISMATCH block=$i"; }
    i=$((i + 1))
done
ioerr=$(dmesg | grep -c 'I/O error')
echo "VERIFY write_errors=$errors mismatches=$bad ioerr=$ioerr"
