/* SPDX-License-Identifier: Apache-2.0 */
/* podvol.h: a volume served to ordinary pods (docs/pod-volumes.md).
 *
 * Owns the data path between a volume's QSD and a pod that is not a VM:
 * the FUSE file RUN/fuse/<vol> (a /dev/fuse the plugin mounts there as
 * root and hands to the confined QSD, which cannot mount), the loop device
 * on that file, the filesystem made on first use and mounted at the staging
 * path, and taking all of it down again.  The QSD side (the FUSE export on
 * the handed descriptor) is qsd.h's qsd_set_fuse_fd; the publications are
 * mounts.h's mounts_bind_pod.
 *
 * podvol_fuse_mount, podvol_served and podvol_loop_open run on the loop (no
 * call waits for the QSD); podvol_attach and podvol_detach wait for programs and the
 * kernel and run in a worker (op.h). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct csi;
struct vol;

/* RUN/fuse/<id> (malloc'd). */
char *podvol_fuse_path(const struct csi *c, const char *id);

/* Open /dev/fuse and mount it (type fuse.qsd-csi, owner root, nosuid,
 * nodev, noexec) on RUN/fuse/<id>, a regular file made for it; a mount
 * left there by a dead QSD goes first.  *ret_fd: the descriptor for the
 * QSD (qsd_set_fuse_fd). */
int podvol_fuse_mount(struct csi *c, const char *id, int *ret_fd, char **ret_msg);

/* A first stage that failed before any loop device: the FUSE file of id
 * unmounted (detached) and removed. */
void podvol_fuse_unmount(struct csi *c, const char *id);

/* Whether v's FUSE file is mounted and its QSD holds the /dev/fuse behind
 * it (its export serves): read from /proc, never through the FUSE file. */
bool podvol_served(struct csi *c, const struct vol *v);

/* In a worker: the loop device on v's FUSE file (made when missing;
 * buffered, docs/pod-volumes.md); for a filesystem volume, a filesystem
 * made when the device is empty (blkid finds no signature at all) and its
 * bytes were never a tenant's block device (a VM's disk, a Block-mode
 * pod's); an existing one checked (fsck -n) when they were; an ext4 the
 * device outgrew grown offline; mounted at the staging path (nosuid,
 * nodev) when it is not yet, and fsGroup applied (the staging group, to
 * every file when the root is not the group's yet, as kubelet would).
 * -EUCLEAN with a message: refused (another signature, no
 * filesystem on a tenant's bytes or where one was made (fs_made), a check
 * that fails): FAILED_PRECONDITION.
 * *ret_loop (on success): the loop device found backed by the FUSE export,
 * which the caller records (v->stage_loop) for podvol_loop_open.
 * Idempotent. */
struct podvol_loop {
    char name[32];     /* loopN */
    uint64_t diskseq;  /* /sys/block/loopN/diskseq: new at every attach */
};
int podvol_attach(struct csi *c, const struct vol *v, struct podvol_loop *ret_loop,
                  char **ret_msg);

/* In a worker, after v's QSD grew the volume to size (NodeExpandVolume):
 * its loop device takes the new size, and a filesystem grows online
 * (resize2fs, xfs_growfs). */
int podvol_grow(struct csi *c, const struct vol *v, uint64_t size, char **ret_msg);

/* In a worker: the filesystem at the staging path unmounted, every loop
 * device on v's FUSE file detached, the FUSE file unmounted and removed.
 * What is already gone is skipped. */
int podvol_detach(struct csi *c, const struct vol *v, char **ret_msg);

/* The loop device (/dev/loopN, malloc'd) whose backing file is path: named
 * so in /sys and backed by the FUSE mount at path (LOOP_GET_STATUS64; never
 * touching path itself).  -ENOENT when none, or nothing is mounted there. */
int podvol_loop_of(const char *path, char **ret_dev);

/* On the loop: an O_PATH descriptor of staged v's loop device as its stage
 * recorded it (v->stage_loop, v->stage_loop_diskseq), checked without
 * asking the FUSE export (whose QSD may hang): the same disk sequence
 * number (any detach or rebinding since, by a pod too, gives a new one)
 * and /sys still naming v's FUSE file.  A record without the device
 * (staged by an older plugin), or a kernel without diskseq:
 * podvol_loop_of.  -ENOENT when there is none. */
int podvol_loop_open(struct csi *c, const struct vol *v, int *ret_fd);
