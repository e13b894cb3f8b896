/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/image.c: image operations on the pool (pool.h): create, delete,
 * resize, info, standalone snapshots (qemu-img, bounded), and the live
 * full-copy snapshot over QMP.  See image.h. */
#include "qsd/qemu/image.h"
#include "qsd/base/names.h"
#include "qsd/base/proc.h"
#include "qsd/qemu/qemuimg.h"
#include "qsd/qemu/qmpcmd.h"
#include "qsd/qemu/qsdopts.h"
#include "qsd/qemu/thin.h"
#include "qsd/base/util.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <sys/stat.h>

#define QEMU_IMG_TIMEOUT_MS (30u * 60u * 1000u) /* copies of big images take time */

int image_check_size(uint64_t size, unsigned align, char **ret_msg)
{
    if (size == 0) {
        *ret_msg = xstrdup("invalid size 0: a volume needs at least one block");
        return -EINVAL;
    }
    if (size % align) {
        *ret_msg = xasprintf("invalid size %" PRIu64 ": not a multiple of the logical block size %u",
                             size, align);
        return -EINVAL;
    }
    if (size > IMAGE_MAX_SIZE) {
        *ret_msg = xasprintf("invalid size %" PRIu64 ": larger than the maximum of 1 PiB", size);
        return -ERANGE;
    }
    return 0;
}

int image_check_prealloc(const char *format, const char *prealloc, char **ret_msg)
{
    static const char *const raw[] = {"off", "falloc", "full", NULL};
    static const char *const qcow2[] = {"off", "metadata", "falloc", "full", NULL};
    const char *const *ok = streq(format, "raw") ? raw : qcow2;
    for (; *ok; ok++)
        if (streq(*ok, prealloc))
            return 0;
    *ret_msg = xasprintf("invalid preallocation '%s' for %s: expected %s", prealloc, format,
                         streq(format, "raw") ? "off, falloc or full" : "off, metadata, falloc or full");
    return -EINVAL;
}



int image_info(const char *path, const char *format, uint64_t *ret_size, uint64_t *ret_alloc,
               char **ret_msg)
{
    char *argv[] = {"qemu-img", "info", "-U", "--output=json", "-f", (char *)format, (char *)path, NULL};
    _cleanup_free_ char *out = NULL;
    int r = qemu_img_run(argv, QEMU_IMG_QUICK_MS, &out, ret_msg);
    if (r < 0)
        return r;
    json_t *j = json_loads(out, 0, NULL);
    json_int_t vs = 0, as = 0;
    if (!j || json_unpack(j, "{s:I, s?I}", "virtual-size", &vs, "actual-size", &as) < 0) {
        json_decref(j);
        *ret_msg = xstrdup("qemu-img info returned unexpected output");
        return -EBADMSG;
    }
    json_decref(j);
    if (ret_size)
        *ret_size = (uint64_t)vs;
    if (ret_alloc)
        *ret_alloc = (uint64_t)as;
    return 0;
}

int image_resize_offline(const char *path, const char *format, uint64_t size, char **ret_msg)
{
    uint64_t cur;
    int r = image_info(path, format, &cur, NULL, ret_msg);
    if (r < 0)
        return r;
    if (size < cur) {
        *ret_msg = xasprintf("refusing to shrink from %" PRIu64 " to %" PRIu64 " bytes", cur, size);
        return -EINVAL;
    }
    if (size == cur)
        return 0;
    char sz[32];
    snprintf(sz, sizeof(sz), "%" PRIu64, size);
    char *argv[] = {"qemu-img", "resize", "-q", "-f", (char *)format, (char *)path, sz, NULL};
    return qemu_img_run(argv, QEMU_IMG_QUICK_MS, NULL, ret_msg);
}

int image_create(const struct pool *p, const char *name, const char *format, uint64_t size,
                 const char *prealloc, const char *from_snapshot, char **ret_msg)
{
    if (pool_find_volume(p, name, NULL, NULL) == 0) {
        *ret_msg = xasprintf("volume %s already exists", name);
        return -EEXIST;
    }
    _cleanup_free_ char *final = xasprintf("%s/%s.%s", p->volumes, name, format);
    _cleanup_free_ char *tmp = xasprintf("%s/.%s.%s.tmp-%d", p->volumes, name, format, (int)getpid());
    int r;
    if (from_snapshot) {
        _cleanup_free_ char *snap = pool_snapshot_path(p, from_snapshot);
        if (access(snap, F_OK) < 0) {
            *ret_msg = xasprintf("snapshot %s does not exist", from_snapshot);
            return -ENOENT;
        }
        uint64_t snap_size;
        if ((r = image_info(snap, "qcow2", &snap_size, NULL, ret_msg)) < 0)
            return r;
        if (size && size < snap_size) {
            *ret_msg = xasprintf("requested size %" PRIu64 " is smaller than snapshot %s (%" PRIu64 " bytes)",
                                 size, from_snapshot, snap_size);
            return -EINVAL;
        }
        if (streq(format, "qcow2") && streq(prealloc, "off")) {
            /* Thin: an empty overlay on the snapshot's layer (thin.h). */
            char layer[LAYER_NAME_LEN + 1];
            if ((r = thin_snapshot_layer(p, from_snapshot, layer, ret_msg)) < 0)
                return r;
            return thin_create(p, name, layer, size ? size : snap_size, ret_msg);
        }
        /* raw, or space reserved up front: a full, independent copy */
        char *argv[] = {"qemu-img", "convert", "-q", "-f", "qcow2", "-O", (char *)format,
                        "-o", NULL, snap, tmp, NULL};
        _cleanup_free_ char *o = xasprintf("preallocation=%s", prealloc);
        argv[8] = o;
        r = qemu_img_run(argv, QEMU_IMG_TIMEOUT_MS, NULL, ret_msg);
        if (r == 0 && size > snap_size)
            r = image_resize_offline(tmp, format, size, ret_msg);
    } else {
        char sz[32];
        snprintf(sz, sizeof(sz), "%" PRIu64, size);
        _cleanup_free_ char *o = xasprintf("preallocation=%s", prealloc);
        char *argv[] = {"qemu-img", "create", "-q", "-f", (char *)format, "-o", o, tmp, sz, NULL};
        r = qemu_img_run(argv, QEMU_IMG_TIMEOUT_MS, NULL, ret_msg);
    }
    if (r < 0) {
        unlink(tmp);
        return r;
    }
    chmod(tmp, 0600);
    return pool_publish(tmp, final, ret_msg);
}

int image_delete(const struct pool *p, const char *name, char **ret_msg)
{
    _cleanup_free_ char *path = NULL;
    if (pool_find_volume(p, name, &path, NULL) < 0) {
        *ret_msg = xasprintf("volume %s does not exist", name);
        return -ENOENT;
    }
    if (unlink(path) < 0) {
        int e = -errno;
        *ret_msg = xasprintf("cannot delete %s: %s", path, strerror(-e));
        return e;
    }
    return 0;
}

int snapshot_create_offline(const struct pool *p, const char *src, const char *src_format,
                            const char *snap, char **ret_msg)
{
    _cleanup_free_ char *final = pool_snapshot_path(p, snap);
    if (access(final, F_OK) == 0) {
        *ret_msg = xasprintf("snapshot %s already exists", snap);
        return -EEXIST;
    }
    _cleanup_free_ char *tmp = xasprintf("%s/.%s.tmp-%d", p->snapshots, snap, (int)getpid());
    char *argv[] = {"qemu-img", "convert", "-q", "-f", (char *)src_format, "-O", "qcow2",
                    (char *)src, tmp, NULL};
    int r = qemu_img_run(argv, QEMU_IMG_TIMEOUT_MS, NULL, ret_msg);
    if (r < 0) {
        unlink(tmp);
        return r;
    }
    chmod(tmp, 0400);
    return pool_publish(tmp, final, ret_msg);
}

int snapshot_delete(const struct pool *p, const char *snap, char **ret_msg)
{
    _cleanup_free_ char *path = pool_snapshot_path(p, snap);
    if (unlink(path) < 0) {
        int e = -errno;
        *ret_msg = e == -ENOENT ? xasprintf("snapshot %s does not exist", snap)
                                : xasprintf("cannot delete snapshot %s: %s", snap, strerror(-e));
        return e;
    }
    return 0;
}

/* ------------------------------------------------------------ online */

int live_snapshot(struct qmp_sync *s, const struct pool *p, const char *snap, uint64_t timeout_ms,
                  char **ret_msg)
{
    _cleanup_free_ char *final = pool_snapshot_path(p, snap);
    if (access(final, F_OK) == 0) {
        *ret_msg = xasprintf("snapshot %s already exists", snap);
        return -EEXIST;
    }
    uint64_t size;
    _cleanup_free_ char *exp = NULL;
    int r = qmpc_export_node(s, &exp, ret_msg);
    if (r < 0 || (r = qmpc_node_size(s, exp, &size, ret_msg)) < 0)
        return r;
    /* The QSD writes the copy: it runs as the volume's own uid and sees
     * neither snapshots/ nor images/ (qsdconf.h), so the target is made in
     * copies/ (searchable, not listable), handed to the monitor's peer, and
     * moved into snapshots/ as root's once complete. */
    uid_t quid;
    gid_t qgid;
    if ((r = qmp_sync_peer(s, &quid, &qgid)) < 0) {
        *ret_msg = xasprintf("cannot tell the QSD's identity: %s", strerror(-r));
        return r;
    }
    _cleanup_free_ char *copies = xasprintf("%s/copies", p->root);
    if ((r = mkdir_p(copies, 0711)) < 0) {
        *ret_msg = xasprintf("cannot create %s: %s", copies, strerror(-r));
        return r;
    }
    _cleanup_free_ char *tmp = xasprintf("%s/.%s.tmp-%d", copies, snap, (int)getpid());
    char sz[32];
    snprintf(sz, sizeof(sz), "%" PRIu64, size);
    char *argv[] = {"qemu-img", "create", "-q", "-f", "qcow2", tmp, sz, NULL};
    if ((r = qemu_img_run(argv, QEMU_IMG_QUICK_MS, NULL, ret_msg)) < 0)
        return r;
    if (chown(tmp, quid, qgid) < 0 || chmod(tmp, 0600) < 0) {
        r = -errno;
        unlink(tmp);
        *ret_msg = xasprintf("cannot hand %s to the QSD: %s", tmp, strerror(-r));
        return r;
    }

    /* Work around a QEMU 10.0 abort (block.c bdrv_insert_node: AioContext
     * assertion) when blockdev-backup inserts its filter above a node that
     * lives in an iothread and was never drained since QSD started: a
     * same-size block_resize (a drained section, no change) settles it.
     * Measured: without it the first live snapshot kills the QSD. */
    _cleanup_free_ char *ignored = NULL;
    qmpc_call(s, qmpc_block_resize(exp, size), NULL, NULL, &ignored);

    _cleanup_free_ char *node = xasprintf("snap-%d", (int)getpid());
    _cleanup_free_ char *job = xasprintf("backup-%d", (int)getpid());
    r = qmpc_call(s, qmpc_named(qmpc_blockdev_add_qcow2_file(node, tmp),
                                "blockdev-add of the snapshot target"), NULL, NULL, ret_msg);
    if (r < 0) {
        unlink(tmp);
        return r;
    }
    r = qmpc_call(s, qmpc_blockdev_backup(job, exp, node), NULL, NULL, ret_msg);
    if (r == 0) {
        bool ended = false;
        r = qmpc_job_wait(s, job, "snapshot copy", timeout_ms, &ended, ret_msg);
        /* Not completed in time: cancel, with a bounded moment to settle
         * before blockdev-del. */
        if (r < 0 && !ended)
            qmpc_job_cancel(s, job, 5000);
    }
    _cleanup_free_ char *m = NULL;
    int r2 = qmpc_call(s, qmpc_named(qmpc_blockdev_del(node), "blockdev-del of the snapshot target"),
                       NULL, NULL, &m);
    if (r2 < 0 && r == 0) {
        r = r2;
        *ret_msg = TAKE_PTR(m);
    }
    if (r < 0) {
        unlink(tmp);
        return r;
    }
    if (chown(tmp, 0, 0) < 0 || chmod(tmp, 0400) < 0) {
        r = -errno;
        unlink(tmp);
        *ret_msg = xasprintf("cannot take %s back from the QSD: %s", tmp, strerror(-r));
        return r;
    }
    return pool_publish(tmp, final, ret_msg);
}

