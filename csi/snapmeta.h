/* SPDX-License-Identifier: Apache-2.0 */
/* snapmeta.h: the SnapshotMetadata service (changed-block tracking, CSI
 * v1.10): GetMetadataAllocated and GetMetadataDelta, server-streaming,
 * answered on the node that holds the snapshots from their layers' qcow2
 * maps (docs/changed-blocks.md). */
#pragma once

#include "backend.h"
#include "grpc.h"

struct csi;

/* The service's method table (the node role's endpoint). */
const struct grpc_method *snapmeta_methods(struct csi *c, size_t *ret_n);
/* backend_local's snapshot_metadata. */
void snapmeta_local(struct csi *c, struct grpc_call *call, const struct snapmeta_req *r);
