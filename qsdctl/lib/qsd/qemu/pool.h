/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/pool.h: the volume pool, the bottom of qemu/'s storage side.
 *
 * One directory per pool (docs/thin-layers.md):
 *   volumes/<vol>.<format>  each volume's image (its chain's top)
 *   snapshots/<snap>.qcow2  snapshots: second names (hard links) of layers,
 *                           or standalone qcow2 copies (image.h)
 *   layers/<L>.qcow2        frozen qcow2 layers, referenced by backing file
 *                           name "../layers/<L>.qcow2" (layers.h)
 *   images/<sha256>         image names: symbolic links holding a layer's
 *                           reference (read, never followed), weak references
 *                           kept POOL_IMAGE_KEEP_S after their last use
 *                           (mtime); images/.<sha256>.part, .part.qcow2 and
 *                           .link: temporaries of a fetch (imagebase.h), which
 *                           holds a flock on the .part while it runs.
 * This module owns that layout, the pool lock (flock on the pool directory,
 * bounded wait), finding files, reading qcow2 headers and chains, naming
 * layers, publishing a file atomically and the garbage collection (the
 * graph's rule is layers.h).  Thin-layer operations (thin.h), image
 * operations (image.h) and image bases (imagebase.h) are built on it.
 * Every function blocks (small file operations); returns 0 or a negative
 * errno and, on failure, a message in *ret_msg (malloc'd) where it has one. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "qsd/qemu/layers.h"

#define POOL_LOCK_TIMEOUT_MS 30000u
/* An image name: the digest of the image's bytes in lowercase hex, a
 * SHA-256 (64 digits) or a SHA-512 (128); the length says which. */
#define POOL_IMAGE_NAME_LEN 64u       /* SHA-256 */
#define POOL_IMAGE_NAME_LEN_512 128u  /* SHA-512 */
#define POOL_IMAGE_KEEP_S 3600u   /* unused image bases stay this long */

struct pool {
    char *root, *volumes, *snapshots, *layers; /* layers/: thin.h */
    char *images;                              /* images/: imagebase.h */
};
/* Create the pool directories if needed (volumes/ and layers/ 0711,
 * snapshots/ and images/ 0700: qsdconf.h). */
int pool_open(const char *root, bool create, struct pool *ret, char **ret_msg);
void pool_close(struct pool *p);
/* Find a volume's image.  -ENOENT if it does not exist. */
int pool_find_volume(const struct pool *p, const char *name, char **ret_path, char **ret_format);
char *pool_snapshot_path(const struct pool *p, const char *name);
char *pool_layer_path(const struct pool *p, const char *layer);
char *pool_volume_path(const struct pool *p, const char *vol); /* the qcow2 one */
bool pool_layer_exists(const struct pool *p, const char *layer);
/* fsync a directory (after names in it changed); errors ignored. */
void pool_fsync_dir(const char *dir);
/* Rename tmp to final without replacing, fsync the directory (tmp is
 * removed on failure; -EEXIST when final exists). */
int pool_publish(const char *tmp, const char *final, char **ret_msg);

/* flock of the pool directory, waiting at most timeout_ms (-EBUSY). */
int pool_lock(const struct pool *p, uint64_t timeout_ms, int *ret_fd, char **ret_msg);

/* qcow2 facts of an image: its backing layer ("" if none) and virtual size.
 * -EXDEV: backed by something that is not a layer of the pool. */
int image_header(const char *path, char ret_backing[LAYER_NAME_LEN + 1], uint64_t *ret_size,
                 char **ret_msg);

struct chain_layer {
    char *path;
    char layer[LAYER_NAME_LEN + 1]; /* "" for the top */
    uint64_t alloc;                 /* bytes allocated on disk (st_blocks) */
    uint64_t size;                  /* virtual size */
    unsigned nlink;                 /* > 1: also a snapshot (or another name) */
};
struct chain {
    struct chain_layer *l;
    size_t n;                        /* depth: files, top included */
};
/* The chain of an image (a volume's top or a snapshot), top first.  A raw
 * image is a chain of one. */
int pool_chain(const struct pool *p, const char *path, const char *format, struct chain *ret,
               char **ret_msg);
void chain_clear(struct chain *c);
json_t *chain_to_json(const struct chain *c);

/* Give the file at path (in the pool's filesystem) a new layer name (a hard
 * link in layers/, a random name).  The caller holds the pool lock and
 * references the layer before releasing it (or the next garbage collection
 * removes it). */
int pool_link_layer(const struct pool *p, const char *path, char ret[LAYER_NAME_LEN + 1],
                    char **ret_msg);
/* Remove layer names that are only a second name of the file top (a crash
 * between a link and the step that references it).  The top's inode is the
 * truth. */
void pool_drop_extra_names(const struct pool *p, const char *top);

/* Whether name is an image name (POOL_IMAGE_NAME_LEN or
 * POOL_IMAGE_NAME_LEN_512 lowercase hex digits). */
bool pool_image_name_valid(const char *name);
/* The layer image name `name` (in images/, dirfd) refers to, without
 * following it; its lstat in *ret_st (may be NULL).  -ENOENT: no such name;
 * -EINVAL: not one of ours. */
int pool_image_layer(int dirfd, const char *name, char ret_layer[LAYER_NAME_LEN + 1],
                     struct stat *ret_st);

/* Under the pool lock: remove every layer nothing references (layers.h's
 * rule); image names count as references while used in the last
 * POOL_IMAGE_KEEP_S seconds.  Then remove image names whose layer is gone,
 * and fetch temporaries no fetch holds. */
int pool_gc(const struct pool *p, unsigned *ret_removed, uint64_t *ret_freed, char **ret_msg);
