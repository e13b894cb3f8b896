/* SPDX-License-Identifier: Apache-2.0 */
/* imagememo.h: checksum refusals of image classes, remembered for a while.
 *
 * Owns: the memory of downloads whose content did not have the digest the
 * StorageClass names, keyed by (URL, expected digest), with the digest the
 * content had and when it was seen.  A CreateVolume of that image within
 * IMAGEMEMO_TTL_MS fails at once with the same error and the time left,
 * instead of downloading the whole image again on every provisioner retry
 * (imageclass.c).  In memory only (a plugin restart forgets), at most
 * IMAGEMEMO_MAX entries (the oldest goes).  Pure: the caller passes the time. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#define IMAGEMEMO_TTL_MS (10ull * 60 * 1000)
#define IMAGEMEMO_MAX 64u

struct imagememo;
struct imagememo *imagememo_new(void);
void imagememo_free(struct imagememo *m);

/* Remember that the content at url had digest got, not expected (now_ms: a
 * monotonic clock).  A second note of the same key replaces the first. */
void imagememo_note(struct imagememo *m, const char *url, const char *expected, const char *got,
                    uint64_t now_ms);
/* The refusal of (url, expected) noted less than IMAGEMEMO_TTL_MS before
 * now_ms: true, with the digest seen (valid until the next call) and the
 * milliseconds left (>= 1); false when there is none (expired ones are
 * dropped). */
bool imagememo_find(struct imagememo *m, const char *url, const char *expected, uint64_t now_ms,
                    const char **ret_got, uint64_t *ret_left_ms);
/* Forget (url, expected): a download of it succeeded. */
void imagememo_forget(struct imagememo *m, const char *url, const char *expected);
/* How many refusals are remembered (expired ones included until dropped). */
unsigned imagememo_count(const struct imagememo *m);
