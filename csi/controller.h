/* SPDX-License-Identifier: Apache-2.0 */
/* controller.h: what the Controller service (controller.c) lends the
 * backends' controller code (local.c): a Volume message of a record and
 * the node's Topology, the StorageClass parameters as JSON.  The tokens of
 * paginated lists are ids.h's. */
#pragma once

#include "csi.pb-c.h"
#include "ids.h" /* CSI_ID_MAX */
#include "service.h"

#include <jansson.h>
#include <stdbool.h>

#include "params.h" /* K8S_PREFIX */

/* The StorageClass parameters (k8s = false) or the csi.storage.k8s.io/ keys
 * the provisioner adds (k8s = true; at most 8, kept as volume_context). */
json_t *params_json_k(size_t n, Csi__V1__CreateVolumeRequest__ParametersEntry **p, bool k8s);
json_t *params_json(size_t n, Csi__V1__CreateVolumeRequest__ParametersEntry **p);

/* The node's topology (one segment, topology.<driver>/node = the node id)
 * as a one-entry list of Topology messages: what a local volume or
 * snapshot is accessible from.  Points into *t and c. */
struct topomsg {
    Csi__V1__Topology topo;
    Csi__V1__Topology__SegmentsEntry seg;
    Csi__V1__Topology__SegmentsEntry *segs[1];
    Csi__V1__Topology *topos[1];
};
void topomsg_fill(const struct csi *c, struct topomsg *t);

/* A Volume message for a record; everything points into v or into *m. */
struct volmsg {
    Csi__V1__Volume vol;
    struct topomsg topo;
    Csi__V1__VolumeContentSource src;
    Csi__V1__VolumeContentSource__SnapshotSource ssrc;
    Csi__V1__VolumeContentSource__VolumeSource vsrc;
    Csi__V1__Volume__VolumeContextEntry ctx[8];
    Csi__V1__Volume__VolumeContextEntry *ctxp[8];
    char id[CSI_ID_MAX + 1], src_id[CSI_ID_MAX + 1];
};
void volmsg_fill(struct csi *c, const struct vol *v, struct volmsg *m);

