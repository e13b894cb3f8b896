/* params.h: StorageClass parameters and capacity ranges (pure, unit-tested).
 *
 * Owns: the CreateVolume parameter keys the plugin understands, their
 * validation, and how a CSI capacity_range becomes an image size.  Keys with
 * the prefix "csi.storage.k8s.io/" (added by the external-provisioner) are
 * ignored; any other unknown key is an error. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "qsd/qemu/qsd.h"

#define VOLUME_DEFAULT_SIZE (1ull << 30) /* when capacity_range says nothing */
/* Parameters and secrets the external-provisioner adds (never ours). */
#define K8S_PREFIX "csi.storage.k8s.io/"

struct vol_params {
    char *format;          /* qcow2 (default) | raw */
    char *preallocation;   /* off (default) | metadata (qcow2) | falloc | full */
    struct qsd_opts opts;  /* export options; image and format unset */
    char *image;           /* image class: URL the volume's content comes from, or NULL */
    char *image_sha256;    /* its required sha256 (64 lowercase hex) */
};

/* Parse n key/value pairs.  On failure *ret_msg names the parameter and says
 * what is accepted (-EINVAL). */
int vol_params_parse(size_t n, const char *const *keys, const char *const *values,
                     struct vol_params *ret, char **ret_msg);
void vol_params_clear(struct vol_params *p);

/* The size to provision for capacity_range (required, limit; 0 = unset),
 * at least min_size (a content source's size; 0 if none), rounded up to align.
 * -EINVAL: malformed range (negative, limit < required); -ERANGE: no size in
 * the range can be provided (spec: OUT_OF_RANGE). */
int capacity_pick(int64_t required, int64_t limit, uint64_t min_size, unsigned align,
                  uint64_t *ret, char **ret_msg);
