/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/layers.h: the pool's graph of qcow2 layers, as pure logic (no I/O).
 *
 * A qcow2 volume is a chain of files: its active top volumes/<id>.qcow2 and
 * read-only layers layers/<L>.qcow2 below it, each naming the next in its
 * qcow2 header as "../layers/<L>.qcow2" (relative, so the pool can move;
 * volumes/, snapshots/ and layers/ are siblings, so the same string resolves
 * from each).  A snapshot is a second name (hard link) snapshots/<id>.qcow2
 * of a layer.  Nothing else records the graph: references are backing names
 * in headers and hard links, so reference counting is the filesystem's and
 * a crash can leave only what the rules below recognise.
 *
 * Owns: qcow2 header parsing, the format probe of an untrusted image
 * (image_probe), layer names and backing references, the
 * temporary overlay name of a snapshot in flight, the garbage rule (which
 * layers nothing references) and the chain-depth policy (when and how much
 * to merge).  pool.c (chains, garbage collection) and thin.c do the I/O. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Chain depth = files in a volume's chain, its top included.  Never more
 * than LAYER_MAX_DEPTH: a snapshot or clone that would pass it merges first.
 * A live volume deeper than LAYER_MERGE_AT is merged in the background
 * (block-stream into the top) down to LAYER_MERGE_TO. */
#define LAYER_MAX_DEPTH 16u
#define LAYER_MERGE_AT 8u
#define LAYER_MERGE_TO 4u

#define QCOW2_HEADER_MIN 32u       /* bytes needed by qcow2_header_parse */
#define QCOW2_BACKING_MAX 1023u    /* QEMU's limit on a backing file name */

struct qcow2_header {
    uint32_t version;
    uint64_t backing_offset;       /* 0: no backing file */
    uint32_t backing_size;
    uint64_t size;                 /* virtual size */
};
/* Parse the fixed part of a qcow2 header.  -EINVAL: not qcow2 (magic,
 * version) or a backing name out of bounds. */
int qcow2_header_parse(const uint8_t *buf, size_t len, struct qcow2_header *ret);

/* The format of an untrusted image from its first IMAGE_PROBE_LEN bytes (a
 * shorter file: all of it), decided here and never by QEMU: "qcow2" (magic
 * QFI\xfb) or "raw" (anything without a known magic).  -EMEDIUMTYPE with a
 * static reason in *ret_why for what must not be opened: a qcow2 image with a
 * backing file, an external data file or encryption (QEMU would open another
 * file or ask for a key), a truncated qcow2 header, or another format's magic
 * (vmdk, vhdx, vpc, vdi, qed, luks: only raw and qcow2 are accepted).
 * ret->size: the qcow2 virtual size (0 for raw: the file's size). */
#define IMAGE_PROBE_LEN 512u
struct image_probe {
    const char *format;    /* "qcow2" | "raw" (static) */
    uint64_t size;
};
int image_probe(const uint8_t *buf, size_t len, struct image_probe *ret, const char **ret_why);

/* Layer names: "L" followed by 16 lowercase hex digits. */
#define LAYER_NAME_LEN 17u
bool layer_name_valid(const char *name);
/* Name from a 64-bit value (e.g. time and a counter mixed by the caller). */
void layer_name_from(uint64_t v, char ret[LAYER_NAME_LEN + 1]);
/* "../layers/<L>.qcow2" */
char *layer_ref(const char *layer);
/* The layer a backing name refers to; -EINVAL if it is not of our form. */
int layer_from_ref(const char *ref, char ret[LAYER_NAME_LEN + 1]);

/* The overlay of a snapshot in flight: volumes/.<vol>.qcow2.<L>; L is new
 * for every snapshot, so a name QEMU once opened is never reused. */
char *layer_tmp_name(const char *vol, const char *layer);
/* Is fname the in-flight overlay of vol?  Then its layer is written. */
bool layer_tmp_parse(const char *fname, const char *vol, char ret_layer[LAYER_NAME_LEN + 1]);

/* One file of the pool, as the garbage rule sees it. */
enum pool_file_kind { PF_VOLUME, PF_SNAPSHOT, PF_LAYER, PF_IMAGE /* a base in use (imagebase.h) */ };
struct pool_file {
    enum pool_file_kind kind;
    const char *layer;     /* PF_LAYER: its name */
    unsigned nlink;
    const char *backing;   /* layer it is backed by, or NULL */
    bool unreadable;       /* header could not be read: kept, never followed */
};
/* Mark garbage[i] for each layer nothing references: not linked under
 * another name (nlink 1), not reachable through backing names from any
 * volume, snapshot, temporary overlay or such a linked layer.  Unreadable
 * layers are kept.  Returns how many are garbage. */
size_t layers_garbage(const struct pool_file *f, size_t n, bool *garbage);

/* How many backing layers to stream into the top of a chain of this depth
 * so that it ends at `to` (0: nothing to do).  Only past `at`. */
unsigned layers_merge_count(unsigned depth, unsigned at, unsigned to);
/* Must a chain of this depth be merged before it gains a layer? */
bool layers_full(unsigned depth);

/* QEMU's block graph (x-debug-query-block-graph, the one query that names
 * each node's backing child; QEMU is pinned at 10.0 here) -> the node names
 * of the chain below top, top first.  -ENOENT if top is not in the graph,
 * -ELOOP past LAYER_MAX_DEPTH * 2 nodes.  *ret_names is a NULL-terminated
 * array of borrowed strings (free the array only). */
#include <jansson.h>
int layers_qemu_chain(json_t *graph, const char *top, const char ***ret_names, size_t *ret_n);
