#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Guest side of e2e-usable-vm.sh (runs as /test.sh in the test guest,
# busybox).  Loads the extra modules (network, FAT, virtio console) the host
# test appended, reports its disks with their PCI addresses whenever they
# change, then obeys commands read from the serial console (sent through
# `qsd-vm-launcher console`), one per line, answering on the console.
for m in failover net_failover virtio_net fat vfat nls_cp437 nls_utf8 nls_ascii virtio_console; do
    insmod /modules2/$m.ko 2>/dev/null || echo "INSMOD-FAIL $m"
done
# No echo of what the host types: it would interleave with the lines below.
stty -echo 2>/dev/null
# Disks: name=PCI address (the device's parent in sysfs):size in sectors.
(
    prev=
    while :; do
        cur=$(for b in /sys/block/vd*; do
            [ -e "$b" ] || continue
            echo "$(basename $b)=$(basename $(readlink -f $b/device/..)):$(cat $b/size)"
        done | tr '\n' ' ')
        [ "$cur" != "$prev" ] && echo "DISKS $cur"
        prev=$cur
        sleep 0.2
    done
) &
cat > /tmp/dhcp.sh <<'S'
#!/bin/sh
case $1 in
bound|renew)
    ip addr add $ip/${mask:-24} dev $interface
    ip route add default via $router
    echo "NET ip=$ip router=$router"
    ;;
esac
S
chmod +x /tmp/dhcp.sh
echo "READY"
while read -r cmd arg; do
    case $cmd in
    ping) echo "PONG $arg" ;;
    net)
        ip link set lo up
        ip link set eth0 up
        echo "MAC $(cat /sys/class/net/eth0/address) pci=$(basename $(readlink -f /sys/class/net/eth0/device/..))"
        udhcpc -i eth0 -s /tmp/dhcp.sh -q -n -t 10 -T 1 2>/dev/null || echo "DHCP-FAIL"
        gw=$(ip route | awk '/^default/ { print $3 }')
        echo "FETCH $(wget -q -O - "http://$gw:$arg/token.txt" 2>&1)"
        ;;
    listen)
        # A one-connection server on the forwarded port: like sshd, it
        # sends its banner at once, then answers the client's line.
        cat > /tmp/fwd.sh <<'S'
#!/bin/sh
echo "BANNER-FROM-GUEST"
read -r line
echo "REPLY $line"
echo "FWD-GOT $line" > /dev/console
S
        chmod +x /tmp/fwd.sh
        (nc -l -p "$arg" -e /tmp/fwd.sh 2>/dev/null) &
        sleep 0.2
        echo "LISTENING $arg"
        ;;
    vport) echo "VPORT $(cat /sys/class/virtio-ports/*/name 2>/dev/null | tr '\n' ' ')" ;;
    cidata)
        dev=
        for b in /sys/block/vd*; do
            [ "$(basename $(readlink -f $b/device/..))" = "$arg" ] && dev=$(basename $b)
        done
        mkdir -p /mnt/ci
        if [ -n "$dev" ] && mount -t vfat -o ro "/dev/$dev" /mnt/ci; then
            echo "CIDATA dev=$dev ro=$(cat /sys/block/$dev/ro) files=$(ls /mnt/ci | tr '\n' ',')"
            echo "CIDATA-USER $(md5sum /mnt/ci/user-data | cut -d' ' -f1)"
            echo "CIDATA-META $(tr '\n' ' ' < /mnt/ci/meta-data)"
            touch /mnt/ci/x 2>/dev/null && echo "CIDATA-WRITABLE"
            umount /mnt/ci
            echo "CIDATA-END"
        else
            echo "CIDATA-FAIL dev=$dev"
        fi
        ;;
    spam)
        i=0
        while [ $i -lt "$arg" ]; do
            echo "SPAM $i ................................................................................"
            i=$((i + 1))
        done
        echo "SPAM-DONE"
        ;;
    off) echo "BYE"; exit 0 ;;
    *) echo "UNKNOWN $cmd" ;;
    esac
done
echo "CONSOLE-EOF"
