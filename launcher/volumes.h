/* SPDX-License-Identifier: Apache-2.0 */
/* volumes.h: discovery of exported volumes in the launcher's volumes directories.
 *
 * Owns: reading one volume directory (<name>/ holding volume.json and the
 * vhost-user socket, per docs/runtime-layout.md), scanning one or more
 * volumes directories into one list, the rule that a disk name found in
 * more than one of them is refused (in every one: never a silent pick), and
 * the check that a volume's socket is usable now (volume_socket_probe).
 * Everything read is validated: names are plain identifiers, numbers are in
 * range, the socket is a socket in that directory.  Symlinks are refused at
 * every level (the volume directory, volume.json, the socket), so nothing can
 * lead out of a volumes directory.  Read-only: nothing here creates, changes
 * or removes anything (the directories are mounted read-only in a VM pod). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define VOLUME_JSON "volume.json"
#define VOLUME_JSON_MAX (64 * 1024)
#define VOLUME_MAX_QUEUES 64
#define VOLUME_MAX_SIZE (UINT64_C(1) << 50) /* 1 PiB */

struct volume {
    char *base;   /* the volumes directory it was found in (set by volumes_scan;
                   * NULL for metadata parsed alone) */
    char *dir;    /* directory name under base: the disk name */
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

/* Full socket path of a volume: base/dir/socket (malloc'd).  v->base must be
 * set: socket paths only ever come from a directory that was scanned. */
char *volume_socket_path(const struct volume *v);
/* Is v's socket usable now: its full path short enough for QEMU
 * (-ENAMETOOLONG) and the socket accepting a connection (the readiness
 * probe, qsd/base/probe.h, beneath v->base: nothing below it is followed)?
 * *ret_why (malloc'd) says why not. */
int volume_socket_probe(const struct volume *v, char **ret_why);

struct volume_entry {
    char *base;          /* the volumes directory it is in */
    unsigned dir_index;  /* index of base in the list given to volumes_scan */
    char *name;          /* directory entry name (validated) */
    struct volume *vol;  /* NULL when not ready or invalid */
    int error;           /* negative errno when vol is NULL */
    char *message;       /* why, when vol is NULL */
};

struct volume_scan {
    struct volume_entry *entries; /* sorted by name, then directory index */
    size_t n;
};

/* Scan the n_dirs volumes directories: one entry per directory entry other
 * than dot files, in any of them.  Entries that are not plain directories, or
 * have invalid names, are returned with an error so the caller can log them.
 * A name present in more than one directory is returned once per directory,
 * each with vol NULL, error -EEXIST and a message naming the other
 * directories.  At most max entries in all.  Fails (-errno) if a directory
 * cannot be read; *ret_failed (if not NULL) is then that directory. */
int volumes_scan(const char *const *dirs, size_t n_dirs, size_t max, struct volume_scan *ret,
                 const char **ret_failed);
void volume_scan_clear(struct volume_scan *s);
/* The first entry called name (in any directory). */
const struct volume_entry *volume_scan_find(const struct volume_scan *s, const char *name);
/* The entry called name in directory base. */
const struct volume_entry *volume_scan_find_in(const struct volume_scan *s, const char *base,
                                               const char *name);
struct volume *volume_dup(const struct volume *v);
