/* SPDX-License-Identifier: Apache-2.0 */
/* cidata.h: the cloud-init NoCloud disk.
 *
 * Owns: gathering user-data, meta-data and network-config from the VM
 * description (inline) and from a directory in the pod (--cloud-init-dir,
 * e.g. a mounted Secret: regular files, symlinks only beneath the
 * directory, each at most CIDATA_FILE_MAX bytes), the default meta-data
 * (instance-id and local-hostname from the VM name), and building the
 * read-only FAT image labelled "cidata" with dosfstools and mtools
 * (mkfs.vfat, mcopy: run through proc.h, without a shell, bounded in
 * time).  The tenant's text only ever goes into the image; the domain XML
 * names the image path, which the launcher chose. */
#pragma once

#include "vmspec.h"

#include <stddef.h>

#define CIDATA_FILE_MAX (1024 * 1024)

struct cidata_file {
    const char *name; /* "user-data", "meta-data", "network-config" */
    char *data;
    size_t len;
    const char *from; /* "description", the directory, or "default" */
};

struct cidata {
    struct cidata_file f[3];
};

/* *ret is NULL when neither the description nor dir (NULL: none) has any
 * NoCloud file.  A file given in both is refused. */
int cidata_gather(const struct vm_spec *spec, const char *dir, struct cidata **ret,
                  char **ret_error);
void cidata_free(struct cidata *c);
/* Build image_path (atomically, mode 0444).  Bounded: each tool gets 30 s. */
int cidata_build(const struct cidata *c, const char *image_path, char **ret_error);
