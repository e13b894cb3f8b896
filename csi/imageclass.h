/* SPDX-License-Identifier: Apache-2.0 */
/* imageclass.h: CreateVolume of an image class, a StorageClass whose
 * parameters image and imageSha256 or imageSha512 (params.h) name the
 * volumes' content.
 *
 * Owns the loop side of "each node downloads an image once": the first
 * CreateVolume of an image leads (its worker downloads the base when the pool
 * has none, imagebase.h, then creates its volume as a thin overlay on it);
 * other CreateVolumes of the same image wait for the lead, without a worker,
 * then create their overlays in parallel, or fail with the lead's error when
 * the download failed (one download, one error, whatever the number of
 * requests).  Worker errors name the parameter at fault.  A checksum
 * refusal is remembered (imagememo.h): the same image's CreateVolumes fail
 * with it, without a download, for IMAGEMEMO_TTL_MS. */
#pragma once

#include "op.h"
#include "service.h"

/* The context of a local CreateVolume (op.h, create_ctx_type): what its
 * worker and completion need.  local.c makes it; the image fields are
 * this module's. */
struct create_ctx {
    uint64_t size;
    bool live;           /* the source is read through its QSD (a clone) */
    char *image;         /* image class: digest of the base it needs */
    char *image_refusal; /* a remembered checksum refusal of it: the error to give
                          * instead of downloading (imagememo.h) */
    bool image_lead;     /* its worker may download the base; others wait for it */
};
extern const struct op_ctx_type create_ctx_type;

/* Create op->vol (record written, phase creating) of the size of op's
 * create_ctx from the image with this digest (SHA-256 or SHA-512, hex);
 * done(status, msg, result {"size"}, op) finishes it (the controller's
 * CreateVolume completion). */
void imageclass_create(struct op *op, const char *digest, worker_done done);

/* The gRPC code of an image volume's failure status, when it is one of
 * the image's (refused content, checksum, size, another download running):
 * true and *ret set; false for the codes every creation shares (NOT_FOUND
 * for a 404, UNAVAILABLE, OUT_OF_RANGE, RESOURCE_EXHAUSTED). */
bool imageclass_code(int status, enum grpc_code *ret);
