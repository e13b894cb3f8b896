/* volumes.h: discovery of exported volumes in the launcher's volumes directory.
 *
 * Owns: reading one volume directory (<name>/ holding volume.json and the
 * vhost-user socket, per docs/runtime-layout.md) and scanning the whole
 * volumes directory.  Everything read is validated: names are plain
 * identifiers, numbers are in range, the socket is a socket in that directory.
 * Symlinks are refused at every level (the volume directory, volume.json, the
 * socket), so nothing can lead out of the volumes directory. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define VOLUME_JSON "volume.json"
#define VOLUME_JSON_MAX (64 * 1024)
#define VOLUME_MAX_QUEUES 64
#define VOLUME_MAX_SIZE (UINT64_C(1) << 50) /* 1 PiB */

struct volume {
    char *dir;    /* directory name under the volumes directory */
    char *id;     /* volume id from volume.json: the disk serial */
    uint64_t size;
    bool read_only;
    unsigned num_queues;
    unsigned logical_block_size;
    char *socket; /* file name inside dir */
};

void volume_free(struct volume *v);
void volume_freep(struct volume **v);

/* Parse volume.json held in memory for directory dir.  Pure. */
int volume_meta_parse(const char *text, size_t len, const char *dir, struct volume **ret,
                      char **ret_error);

/* Read volume dir `name` below the directory open as dirfd.  Fails with
 * -ENOENT while something is missing (not ready yet), -ELOOP/-ENOTDIR for
 * symlinks and other file types, -EINVAL for bad metadata. */
int volume_load(int dirfd, const char *name, struct volume **ret, char **ret_error);

/* Full socket path of a volume under volumes_dir (malloc'd). */
char *volume_socket_path(const char *volumes_dir, const struct volume *v);

struct volume_entry {
    char *name;          /* directory entry name (validated) */
    struct volume *vol;  /* NULL when not ready or invalid */
    int error;           /* negative errno when vol is NULL */
    char *message;       /* why, when vol is NULL */
};

struct volume_scan {
    struct volume_entry *entries; /* sorted by name */
    size_t n;
};

/* Scan volumes_dir: one entry per directory entry other than dot files.
 * Entries that are not plain directories, or have invalid names, are returned
 * with an error so the caller can log them.  At most max entries. */
int volumes_scan(const char *volumes_dir, size_t max, struct volume_scan *ret);
void volume_scan_clear(struct volume_scan *s);
const struct volume_entry *volume_scan_find(const struct volume_scan *s, const char *name);
struct volume *volume_dup(const struct volume *v);
