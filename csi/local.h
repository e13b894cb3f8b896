/* SPDX-License-Identifier: Apache-2.0 */
/* local.h: what the local backend's files share (local.c: volumes and
 * snapshots; local_group.c: group snapshots, their records, their start-up
 * recovery). */
#pragma once

#include "csi.pb-c.h"
#include "grpc.h"
#include "ids.h"

struct csi;
struct snap;

/* The Snapshot message of record sn; everything points into sn or *m.
 * No accessible_topology: the plugin does not advertise
 * SNAPSHOT_ACCESSIBILITY_CONSTRAINTS (docs/csi-plugin.md). */
struct snapmsg {
    Csi__V1__Snapshot snap;
    Google__Protobuf__Timestamp ts;
    char ids[3][CSI_ID_MAX + 1];
};
void local_snapmsg_fill(struct csi *c, const struct snap *sn, struct snapmsg *m);

/* The GroupController RPCs of local volumes (backend.h). */
void local_create_group(struct csi *c, struct grpc_call *call,
                        Csi__V1__CreateVolumeGroupSnapshotRequest *in);
void local_delete_group(struct csi *c, struct grpc_call *call,
                        Csi__V1__DeleteVolumeGroupSnapshotRequest *in);
void local_get_group(struct csi *c, struct grpc_call *call, Csi__V1__GetVolumeGroupSnapshotRequest *in);

/* Start-up (recover.c), before the snapshots' own recovery: continue the
 * consumers a killed group snapshot left stopped (barrier.h), load the
 * group records, and delete the groups (and their members) left creating
 * or deleting, and members whose group has no record. */
void local_group_recover(struct csi *c);
/* The loaded group records are freed (plugin exit). */
void local_group_free(struct csi *c);
