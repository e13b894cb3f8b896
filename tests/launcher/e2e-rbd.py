#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""End-to-end on Ceph: a TCG guest whose disks are RBD volumes, served by the
real plugin's QSDs (QEMU's rbd driver, cephx), on a throwaway single-node
Ceph (tests/ceph/cephlib.py); the plugin driven like kubelet and the
external-provisioner/resizer/snapshotter (python3-grpcio), the VM pod's
layout and the launcher as in e2e-bridge.py.

- CreateVolume (backend rbd, with the provisioner secret) of root (64 MiB)
  and data (32 MiB).  root gets a bootable FAT image (EFI/BOOT/BOOTX64.EFI: a
  unified kernel image of the test guest's kernel, initramfs and command
  line, systemd-boot's stub), written into the image with qemu-img as the
  Ceph admin, like an image import.
- Both staged (node-stage secret) and root published for the VM pod; the
  launcher starts the VM with "firmware": "uefi", "boot": {"volume": "root"}:
  OVMF reads the kernel from the RBD image through QSD and vhost-user-blk,
  so the guest boots from RBD; it writes 8 MiB past the boot filesystem and
  reads it back (ROOT ok).
- data is hot-plugged (an attachment pod, through the bridge): the guest
  writes pattern A and reads it back (DATA ok).
- CreateSnapshot of data (snapshotter secret) while the guest has it.
- ControllerExpandVolume + NodeExpandVolume to 48 MiB: the guest sees the
  new size, A still there, writes pattern B over it and pattern E in the
  new last MiB, reads them back (RESIZED ok).
- CreateVolume from the snapshot (restore), staged and hot-plugged: the
  guest reads pattern A on it, not B (RESTORED ok).
- The Ceph key (the secrets' userKey): on no process's command line
  (plugin, QSDs, QEMU, launcher, libvirt: every process of the machine),
  in no log (plugin, launcher, QEMU's, console), in no file under the test's
  root (kubelet's pod directories, the VM pod's volume directories, the
  launcher's root) except the plugin's private key files (0600, in a 0700
  directory pods never see), and in none at all after unstage.
- Hot-plugged disks unplugged, root's mount removed: the guest powers off,
  the launcher exits 0; everything unpublished and unstaged; on the host, the
  images hold what the guest wrote (rbd export: root's boot filesystem and
  blocks, data's B and E, the restore's A); every volume deleted, no image
  left, none in the trash.

Processes are stopped by PID, mounts and directories removed, the cluster
stopped, also on failure.

usage: e2e-rbd.py PLUGIN PROTO_DIR   (env: LAUNCHER, BUILD_CACHE)
"""
import importlib.util
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "csi"))
sys.path.insert(0, os.path.join(HERE, "..", "ceph"))
_spec = importlib.util.spec_from_file_location("e2e_bridge", os.path.join(HERE, "e2e-bridge.py"))
bridge = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bridge)   # exits 77 itself when QSD_E2E=0
import cephlib  # noqa: E402
import csilib  # noqa: E402

MiB = 1 << 20
T = csilib.CALL_TIMEOUT
log, Fail = bridge.log, bridge.Fail
STUB = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"
ESP_MIB = 32          # the boot filesystem at the start of root
CMDLINE = "console=ttyS0 panic=-1 quiet"


def pe_layout(path):
    """(ImageBase, SectionAlignment, end of the loaded image as an offset
    from ImageBase) of a PE32/PE32+ file, from its headers."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] != b"MZ":
        raise Fail("%s: not a PE file (no MZ header)" % path)
    pe = struct.unpack_from("<I", data, 0x3c)[0]
    if data[pe:pe + 4] != b"PE\0\0":
        raise Fail("%s: no PE signature" % path)
    _, nsect, _, _, _, optsize, _ = struct.unpack_from("<HHIIIHH", data, pe + 4)
    opt = pe + 24
    magic = struct.unpack_from("<H", data, opt)[0]
    if magic == 0x20b:
        base = struct.unpack_from("<Q", data, opt + 24)[0]
    elif magic == 0x10b:
        base = struct.unpack_from("<I", data, opt + 28)[0]
    else:
        raise Fail("%s: unknown optional header magic 0x%x" % (path, magic))
    align, = struct.unpack_from("<I", data, opt + 32)
    end, = struct.unpack_from("<I", data, opt + 56)   # SizeOfImage
    for i in range(nsect):
        vsize, va = struct.unpack_from("<II", data, opt + optsize + 40 * i + 8)
        end = max(end, va + vsize)
    if not align or align & (align - 1):
        raise Fail("%s: SectionAlignment 0x%x" % (path, align))
    return base, align, end


def uki_layout(stub, parts):
    """[(section, file, VMA)] for a unified kernel image: as systemd's ukify
    places them, each added section at the next SectionAlignment boundary
    after the end of the stub's image (then of the previous section), as an
    absolute address (ImageBase + offset: objcopy's VMAs include it).  The
    stub's ImageBase and size differ between systemd versions (254's is
    0x14df90000): fixed addresses below it make objcopy warn "section below
    image base" and OVMF refuse the image."""
    base, align, off = pe_layout(stub)
    out = []
    for name, path in parts:
        off = (off + align - 1) & ~(align - 1)
        out.append((name, path, base + off))
        off += os.path.getsize(path)
    return out


class RbdE2E(bridge.E2E):
    GUEST_SCRIPT = "guest-rbd.sh"

    def __init__(self, plugin, proto):
        why = cephlib.have_ceph()
        if why:
            csilib.skip("Ceph " + why + " (scripts/setup.sh installs it)")
        for path, pkg in ((STUB, "systemd-boot-efi"), ("/usr/share/OVMF", "ovmf")):
            if not os.path.exists(path):
                csilib.skip("%s missing (%s, scripts/setup.sh)" % (path, pkg))
        for tool, pkg in (("objcopy", "binutils"), ("mkfs.vfat", "dosfstools"),
                          ("mcopy", "mtools")):
            if not shutil.which(tool):
                csilib.skip("%s not installed (%s, scripts/setup.sh)" % (tool, pkg))
        super().__init__(plugin, proto, prefix="qsd-e2e-rbd-")
        self.ceph = cephlib.Cluster()
        self.secrets = None
        self.params = None

    # ------------------------------------------------------------ CSI, RBD
    def vid(self, name):
        return "rbd:c1:%s:%s:%s" % (self.ceph.pool, self.ceph.namespace, name)

    def image(self, name):
        return "%s/%s/%s" % (self.ceph.pool, self.ceph.namespace, name)

    def create(self, name, size, source=None):
        req = self.pb.CreateVolumeRequest(
            name=name, capacity_range=self.pb.CapacityRange(required_bytes=size),
            volume_capabilities=[self.cap], parameters=self.params, secrets=self.secrets)
        if source:
            req.volume_content_source.snapshot.snapshot_id = source
        vol = self.c.CreateVolume(req, timeout=T).volume
        if vol.volume_id != self.vid(name) or vol.capacity_bytes != size:
            raise Fail("CreateVolume %s: %s" % (name, vol))
        return vol.volume_id

    def stage(self, vid):
        os.makedirs(self.staging(vid), exist_ok=True)
        self.c.NodeStageVolume(self.pb.NodeStageVolumeRequest(
            volume_id=vid, staging_target_path=self.staging(vid), volume_capability=self.cap,
            secrets=self.secrets), timeout=T)

    def export(self, name, size):
        """The image's content, read on the host as the Ceph admin."""
        out = os.path.join(self.work, name + ".export")
        self.ceph.rbd("export", "--no-progress", self.image(name), out)
        with open(out, "rb") as f:
            data = f.read()
        os.unlink(out)
        if len(data) != size:
            raise Fail("image %s: %d bytes, want %d" % (name, len(data), size))
        return data

    def expect_blocks(self, what, data, first, count, base):
        for i in range(count):
            blk = data[(first + i) * MiB:(first + i + 1) * MiB]
            if blk != bytes([base + i]) * MiB:
                raise Fail("%s: block %d does not hold byte %d" % (what, first + i, base + i))

    # ------------------------------------------------------------ guest
    def vm_spec(self):
        return {"name": "rbd", "memory_mib": 256, "accel": "tcg", "firmware": "uefi",
                "boot": {"volume": "root"}, "disks": [{"volume": "root"}],
                "network": False, "console_log": self.console, "hotplug_slots": 2}

    def boot_image(self):
        """A FAT filesystem (no partition table: OVMF reads a whole-disk
        one) with the guest as a unified kernel image at the removable-media
        path."""
        w = self.work
        with open(os.path.join(w, "cmdline.txt"), "w") as f:
            f.write(CMDLINE)
        uki = os.path.join(w, "bootx64.efi")
        parts = [(".cmdline", os.path.join(w, "cmdline.txt")),
                 (".linux", os.path.join(w, "vmlinuz")),
                 (".initrd", os.path.join(w, "initrd.img"))]
        args = ["objcopy"]
        for name, path, vma in uki_layout(STUB, parts):
            args += ["--add-section", "%s=%s" % (name, path),
                     "--change-section-vma", "%s=0x%x" % (name, vma)]
        r = subprocess.run(args + [STUB, uki], check=True, capture_output=True, text=True,
                           timeout=60)
        if r.stderr.strip():   # "section below image base": OVMF would refuse it
            raise Fail("objcopy, building the UKI: %s" % r.stderr.strip())
        esp = os.path.join(w, "esp.img")
        subprocess.run(["mkfs.vfat", "-C", "-n", "QSDBOOT", esp, str(ESP_MIB * 1024)],
                       check=True, capture_output=True, timeout=60)
        subprocess.run(["mmd", "-i", esp, "::/EFI", "::/EFI/BOOT"], check=True, timeout=60)
        subprocess.run(["mcopy", "-i", esp, uki, "::/EFI/BOOT/BOOTX64.EFI"], check=True,
                       timeout=60)
        os.unlink(uki)
        return esp

    # ------------------------------------------------------------ the key
    def key_checks(self, expect_key_files):
        """The key on no command line, in no log, in no file under our root
        but the plugin's private key files (expect_key_files of them)."""
        with open(os.path.join(self.work, "plugin.log"), errors="replace") as f:
            cephlib.assert_key_hidden(self.ceph.key, f.read())   # and every command line
        key = self.ceph.key.encode()
        allowed = os.path.join(self.env.run, "ctl")
        found, files = [], 0
        for top, dirs, names in os.walk(self.work):
            for n in names:
                p = os.path.join(top, n)
                try:
                    st = os.lstat(p)
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    with open(p, "rb") as f:
                        hit = key in f.read()
                except OSError:
                    continue
                files += 1
                if not hit:
                    continue
                # Private: root's, readable by the volume's own QSD group
                # only (its ctl directory: root and that group, sticky;
                # docs/security.md), or root's alone (unconfined).
                d = os.stat(os.path.dirname(p))
                private = (os.path.dirname(os.path.dirname(p)) == allowed and n == "rbd.key" and
                           st.st_uid == 0 and d.st_uid == 0 and
                           ((stat.S_IMODE(st.st_mode) == 0o600 and
                             stat.S_IMODE(d.st_mode) == 0o700) or
                            (stat.S_IMODE(st.st_mode) == 0o640 and st.st_gid == d.st_gid != 0 and
                             stat.S_IMODE(d.st_mode) == 0o1770)))
                if not private:
                    raise Fail("the key is in %s (mode %o)" % (p, stat.S_IMODE(st.st_mode)))
                found.append(p)
        if len(found) != expect_key_files:
            raise Fail("key files: %s, want %d" % (found, expect_key_files))
        for lg in (os.path.join(self.work, "plugin.log"), self.llog, self.console):
            if not os.path.getsize(lg):
                raise Fail("%s is empty: the key check read nothing" % lg)
        return files

    def cleanup(self, ok):
        super().cleanup(ok)
        self.ceph.stop()

    # ------------------------------------------------------------ the test
    def run(self):
        t_start = time.monotonic()
        self.build_guest()
        esp = self.boot_image()
        self.ceph.start()
        log("ceph up in %.1f s" % self.ceph.start_seconds)
        clusters = self.ceph.write_clusters(self.work)
        self.c = self.env.start(["--unplug-timeout", "60", "--rbd-clusters", clusters])
        self.secrets = self.ceph.secrets
        self.params = {"backend": "rbd", "clusterID": "c1", "pool": self.ceph.pool,
                       "radosNamespace": self.ceph.namespace}
        root = self.create("root", 64 * MiB)
        data = self.create("data", 32 * MiB)
        # The boot image goes into root as an import would (the admin, on the
        # host), before the volume is staged.
        target = {"driver": "raw", "file": {
            "driver": "rbd", "pool": self.ceph.pool, "namespace": self.ceph.namespace,
            "image": "root", "conf": os.path.join(self.ceph.dir, "ceph.conf"), "user": "admin"}}
        subprocess.run(["qemu-img", "convert", "-n", "-f", "raw", esp,
                        "json:" + json.dumps(target)], env=self.ceph.env, check=True,
                       capture_output=True, timeout=120)
        with open(esp, "rb") as f:
            esp_data = f.read()
        log("root (%s) holds the boot image" % root)
        for vid in (root, data):
            self.stage(vid)
        pod = self.vm_pod(root)
        self.start_launcher()
        t0 = time.monotonic()
        self.wait_console("DISK name=vda size=%d" % (64 * MiB // 512), 1, 240)
        boot_s = time.monotonic() - t0
        self.wait_console("ROOT ok", 1, 60)
        self.wait_console("MONITOR-START", 1, 60)
        if not self.console_lines("GUEST-UP"):
            raise Fail("no GUEST-UP: the guest's init did not run")
        log("guest booted from the RBD volume (UEFI, %.0f s) and wrote to it" % boot_s)
        files = self.key_checks(expect_key_files=2)
        log("key: on no command line, in none of %d files but the 2 private key files" % files)

        # Hot-plug data: pattern A.
        data_req, data_pvc = self.attach_pod(1, data, "data", request_first=True)
        self.wait_console("ADD name=vdb size=%d" % (32 * MiB // 512), 1, 60)
        self.wait_console("DATA name=vdb ok", 1, 60)
        log("data hot-plugged (vdb), pattern A written and read back")

        snap = self.c.CreateSnapshot(self.pb.CreateSnapshotRequest(
            source_volume_id=data, name="snap-data", secrets=self.secrets), timeout=T).snapshot
        if not snap.ready_to_use or snap.source_volume_id != data:
            raise Fail("CreateSnapshot: %s" % snap)
        log("snapshot of data: %s" % snap.snapshot_id)

        # Online resize: the controller grows the image, the node's QSD tells
        # the guest (block_resize); the guest writes B and E.
        r = self.c.ControllerExpandVolume(self.pb.ControllerExpandVolumeRequest(
            volume_id=data, capacity_range=self.pb.CapacityRange(required_bytes=48 * MiB),
            secrets=self.secrets), timeout=T)
        if r.capacity_bytes != 48 * MiB or not r.node_expansion_required:
            raise Fail("ControllerExpandVolume: %s" % r)
        t0 = time.monotonic()
        ne = self.c.NodeExpandVolume(self.pb.NodeExpandVolumeRequest(
            volume_id=data, volume_path=data_pvc, staging_target_path=self.staging(data),
            capacity_range=self.pb.CapacityRange(required_bytes=48 * MiB),
            volume_capability=self.cap), timeout=T)
        if ne.capacity_bytes != 48 * MiB:
            raise Fail("NodeExpandVolume: %s" % ne)
        self.wait_console("SIZE name=vdb size=%d" % (48 * MiB // 512), 1, 60)
        resize_ms = (time.monotonic() - t0) * 1000
        self.wait_console("RESIZED name=vdb size=%d ok" % (48 * MiB // 512), 1, 60)
        log("data grown online to 48 MiB, seen by the guest in %.0f ms; B and E written" %
            resize_ms)

        restore = self.create("restore", 32 * MiB, source=snap.snapshot_id)
        self.stage(restore)
        rest_req, rest_pvc = self.attach_pod(2, restore, "restore", request_first=False)
        self.wait_console("ADD name=vdc size=%d" % (32 * MiB // 512), 1, 60)
        self.wait_console("RESTORED name=vdc size=%d ok" % (32 * MiB // 512), 1, 60)
        log("restore from the snapshot hot-plugged (vdc): pattern A, as at the snapshot")
        files = self.key_checks(expect_key_files=3)
        log("key: on no command line, in none of %d files but the private key files" % files)

        # Unplug, power off, unpublish, unstage.
        for k, (vid, req, pvc) in enumerate([(data, data_req, data_pvc),
                                             (restore, rest_req, rest_pvc)], 1):
            self.unplug(vid, pvc, time.monotonic())
            self.wait_console("DEL name=", k, 30)
            self.unpublish(*req)
        self.vm_pod_end(root, *pod)
        self.key_checks(expect_key_files=0)
        log("guest powered off, launcher exited 0, all unstaged; the key is in no file")

        # What the guest wrote is in Ceph.
        img = self.export("root", 64 * MiB)
        if img[:ESP_MIB * MiB] != esp_data:
            raise Fail("root: the boot filesystem changed")
        self.expect_blocks("root", img, 48, 8, 201)
        img = self.export("data", 48 * MiB)
        self.expect_blocks("data", img, 0, 8, 101)
        self.expect_blocks("data", img, 47, 1, 238)
        self.expect_blocks("restore", self.export("restore", 32 * MiB), 0, 8, 1)
        log("rbd export: the images hold the guest's data")

        for vid in (restore, data, root):
            self.c.DeleteVolume(self.pb.DeleteVolumeRequest(volume_id=vid, secrets=self.secrets),
                                timeout=T)
        self.c.DeleteSnapshot(self.pb.DeleteSnapshotRequest(
            snapshot_id=snap.snapshot_id, secrets=self.secrets), timeout=T)
        ns = "%s/%s" % (self.ceph.pool, self.ceph.namespace)
        left = self.ceph.rbd("ls", ns).split() + self.ceph.rbd("trash", "ls", ns).split()
        if left:
            raise Fail("images left after DeleteVolume / DeleteSnapshot: %s" % left)
        errors = [ln for ln in open(self.llog) if "level=error" in ln]
        if errors:
            raise Fail("launcher errors: %s" % errors)
        line = "FIGURES rbd_uefi_boot_s=%.0f rbd_resize_seen_ms=%.0f total_s=%.0f\n" % (
            boot_s, resize_ms, time.monotonic() - t_start)
        print(line, end="")
        with open(os.path.join(self.cache, "figures.txt"), "a") as f:
            f.write("# %s %s (rbd)\n%s" % (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                          self.launcher_bin, line))
        print("PASS")


if __name__ == "__main__":
    sys.exit(bridge.main(RbdE2E))
