/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/imagebase.h: image bases, the shared read-only layers that volumes
 * of an image class (a StorageClass naming an image URL) are made from.
 *
 * A base is an image downloaded once per pool (curl), verified against its
 * digest (imageSha256 or imageSha512: sha256sum or sha512sum), probed by us (layers.h image_probe: raw, or a self-contained qcow2;
 * nothing QEMU would follow) and converted into a fresh qcow2 layer of the
 * pool.  Its name images/<digest> (pool.h: 64 or 128 hex digits) is a symbolic link holding the layer's
 * reference "../layers/<L>.qcow2" (read with readlinkat, never followed).  A
 * volume of the image is a thin overlay on that layer (thin_create).  The
 * name is a weak reference: the garbage collection (pool_gc) keeps the layer
 * while a volume or snapshot uses it or while the name was used (by a fetch
 * or a volume creation: its mtime) in the last POOL_IMAGE_KEEP_S seconds, and
 * removes the name once its layer is gone.
 *
 * A fetch works in images/.<digest>.part (the download) and
 * images/.<digest>.part.qcow2 (the conversion), holding a flock on the
 * first: two fetches of one image never run at once (-EBUSY), and the
 * garbage collection removes temporaries no fetch holds (a killed plugin's).
 *
 * Owns: the fetch into the images/ directory (its layout and garbage
 * collection are pool.h's), the download (curl: bounded, retried, with
 * progress logs, hop by hop through redirects, to addresses fetchaddr.h
 * allows), the checksum (sha256sum or sha512sum), the conversion and
 * publication.
 * Every function but the pure checks blocks: for workers and the CLI. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "qsd/qemu/fetchaddr.h"
#include "qsd/qemu/pool.h"
#include "qsd/qemu/layers.h"

#define IMAGEBASE_MAX_BYTES (64ull << 30)    /* largest download */
#define IMAGEBASE_URL_MAX 2048u

/* Pure checks (the StorageClass parameters).  NULL when fine, else why. */
const char *imagebase_url_problem(const char *url);
/* A digest of algo ("sha256": 64 lowercase hex digits, "sha512": 128). */
const char *imagebase_digest_problem(const char *algo, const char *digest);
/* "sha256" or "sha512" for a digest of 64 or 128 characters, else NULL. */
const char *imagebase_digest_algo(const char *digest);
#define IMAGEBASE_DIGEST_MAX POOL_IMAGE_NAME_LEN_512

struct imagebase_fetch {
    const char *url;       /* http:// or https:// */
    const char *digest;    /* SHA-256 or SHA-512, lowercase hex (its length says which) */
    uint64_t max_bytes;    /* 0: IMAGEBASE_MAX_BYTES */
    uint64_t timeout_ms;   /* the whole fetch, retries included */
    unsigned attempts;     /* downloads tried on transient failures (>= 1) */
    uint64_t keep_free;    /* bytes of the pool's filesystem the base must leave free */
    const struct imagebase_net *allow; /* refused ranges allowed anyway (tests) */
    size_t n_allow;
    /* out: on -EBADMSG, the digest the content has (IMAGEBASE_DIGEST_MAX + 1
     * bytes; NULL: not wanted) */
    char *ret_got;
};

/* Download, verify, probe, convert and publish the base of f->digest.
 *
 * The download: curl, http(s) only, no proxy, to an address resolved and
 * checked by fetchaddr_resolve (it blocks: call from a worker) and pinned
 * (--resolve), never to loopback, link-local (cloud metadata), unspecified,
 * multicast or one of this node's own addresses unless f->allow names it;
 * redirects are followed by us, each hop checked the same way (at most 5).  Its size is bounded by
 * max_bytes and by the pool's free space above keep_free, before (curl
 * --max-filesize on Content-Length) and during the transfer (RLIMIT_FSIZE on
 * curl, and a check of free space every second).  Errors and logs show the
 * URL redacted (imagebase_url_redact) and nothing of what was fetched.
 *
 * Errors: -ENOENT the server has no such file (HTTP 404, 410); -EACCES it
 * refuses (other 4xx, TLS verification); -ECONNREFUSED unreachable or
 * failing after every attempt (connection, DNS, 5xx, timeouts, stalls);
 * -EINVAL a URL curl refuses; -EADDRNOTAVAIL the URL (or a redirect) leads
 * to a refused address; -EFBIG larger than max_bytes; -EBADMSG the checksum
 * differs; -EMEDIUMTYPE content that is not accepted (image_probe); -ENOSPC
 * no room in the pool above keep_free, for the download or for its virtual
 * size; -EBUSY another fetch of the same image runs.  Nothing is left behind
 * on failure. */
int imagebase_fetch(const struct pool *p, const struct imagebase_fetch *f, char **ret_msg);

/* Create volume vol (qcow2, virtual size size) as an overlay on the base of
 * sha256.  -ENOLINK: no base (fetch it); -ERANGE: the image is larger than
 * size; -EEXIST: the volume exists. */
int imagebase_create_volume(const struct pool *p, const char *vol, const char *sha256,
                            uint64_t size, char **ret_msg);

/* qemu-img on a download runs as this uid and gid (between the QSDs' default
 * range 60000..61023 and systemd's DynamicUser range), with at most this
 * much address space and CPU time (OpenStack bounds `qemu-img info` on
 * untrusted images the same way: 1 GiB, 30 s; a convert does more work). */
#define IMAGEBASE_UID 61100u
#define IMAGEBASE_QEMU_IMG_AS (1ull << 30)
#define IMAGEBASE_QEMU_IMG_CPU_S 600u
