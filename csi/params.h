/* SPDX-License-Identifier: Apache-2.0 */
/* params.h: StorageClass parameters (pure, unit-tested).
 *
 * Owns: the CreateVolume parameter keys the plugin understands and their
 * validation (a capacity_range becomes a size in capacity.h).  Keys with
 * the prefix "csi.storage.k8s.io/" (added by the external-provisioner) are
 * ignored; any other unknown key is an error. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "qsd/qemu/qsd.h"

/* Parameters and secrets the external-provisioner adds (never ours). */
#define K8S_PREFIX "csi.storage.k8s.io/"

struct vol_params {
    char *format;          /* qcow2 (default) | raw */
    char *preallocation;   /* off (default) | metadata (qcow2) | falloc | full */
    struct qsd_opts opts;  /* export options; image and format unset */
    char *image;           /* image class: URL the volume's content comes from, or NULL */
    char *image_digest;    /* its required digest, lowercase hex: imageSha256 (64
                            * digits) or imageSha512 (128), exactly one of them */
};

/* Parse n key/value pairs.  On failure *ret_msg names the parameter and says
 * what is accepted (-EINVAL). */
int vol_params_parse(size_t n, const char *const *keys, const char *const *values,
                     struct vol_params *ret, char **ret_msg);
void vol_params_clear(struct vol_params *p);

