/* SPDX-License-Identifier: Apache-2.0 */
/* ids.h: the ids a request names (and the list tokens made of them) and
 * the volume capabilities it asks for.  Each check exists twice: *_check fills a verdict (verdict.h: pure,
 * for plans and unit tests) and *_ok fails the call with it. */
#pragma once

#include "csi.pb-c.h"
#include "grpc.h"
#include "verdict.h"

#include <stdbool.h>
#include <stdint.h>

struct csi;

/* Validate an id field: non-empty and valid per names.h.  On failure the
 * call is failed (id_ok) or v filled (id_check) with INVALID_ARGUMENT and
 * false returned.  The *_check forms below decide the same way without a
 * call (verdict.h). */
bool id_ok(struct grpc_call *call, const char *field, const char *id);
bool id_check(struct verdict *v, const char *field, const char *id);

/* Volume and snapshot ids as the CO sees them carry the node that holds
 * them ("<name>@<node id>": both are node-local, so a node handed another
 * node's id can say where it lives); plain names, as issued before, and ids
 * that would pass CSI's 128 bytes are this node's.  csi_id_out gives the
 * CO's form of a record's name (in buf); csi_id_node the node an id names
 * when it is another one (pointer into id), else NULL; csi_id_ok validates
 * like id_ok and cuts this node's suffix off in place (id is then the
 * record's name), failing another node's id with NOT_FOUND naming it. */
#define CSI_ID_MAX 128
const char *csi_id_out(const struct csi *c, const char *name, char buf[CSI_ID_MAX + 1]);
const char *csi_id_node(const struct csi *c, const char *id);
bool csi_id_ok(struct csi *c, struct grpc_call *call, const char *field, char *id);
bool csi_id_check(struct csi *c, struct verdict *v, const char *field, char *id);

/* A paginated list's starting_token (ListVolumes, ListSnapshots,
 * ControllerListVolumeHealth): "<prefix><last id>" over the id order, so
 * deleting the last entry of a page does not invalidate it.  "" -> NULL
 * (from the start); "<prefix><name>" -> name; else -EINVAL. */
int list_token_parse(const char *tok, const char *prefix, const char **ret);
/* The start of such a list, the same for each: max_entries not negative
 * (INVALID_ARGUMENT naming it), then starting_token parsed as above
 * (ABORTED naming it, as CSI asks of a token the plugin cannot use);
 * *ret_after set only on success. */
bool list_start_check(struct verdict *v, int32_t max_entries, const char *tok, const char *prefix,
                      const char **ret_after);
bool list_start_ok(struct grpc_call *call, int32_t max_entries, const char *tok,
                   const char *prefix, const char **ret_after);

/* NULL when the capability is supported, else why (INVALID_ARGUMENT). */
const char *cap_problem(const Csi__V1__VolumeCapability *cap);
/* CreateVolume's volume_capabilities: present and each supported; else
 * the call is failed with INVALID_ARGUMENT naming the entry. */
bool caps_ok(struct grpc_call *call, size_t n, Csi__V1__VolumeCapability **caps);
bool caps_check(struct verdict *v, size_t n, Csi__V1__VolumeCapability **caps);
bool cap_read_only(const Csi__V1__VolumeCapability *cap);
/* What a supported capability asks for (state.h enum stage_kind): block ->
 * a block device, mount with fs_type ext4 or xfs -> a filesystem (*ret_fs
 * set), mount without fs_type -> the vhost-user socket directory of VM
 * pods (docs/pod-volumes.md). */
int cap_kind(const Csi__V1__VolumeCapability *cap, const char **ret_fs);
/* volume_mount_group -> gid (-1 when empty); -EINVAL if not a number. */
int cap_group(const Csi__V1__VolumeCapability *cap, int *ret_gid);

