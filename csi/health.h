/* SPDX-License-Identifier: Apache-2.0 */
/* health.h: a volume's condition, and the health RPCs that report it.
 *
 * Owns: the one verdict on whether a volume is served as it should be
 * (health_of), which NodeGetVolumeStats' volume_condition (node.c) and the
 * volume health RPCs of CSI 1.13 answer with; those RPCs themselves:
 * ControllerGetVolumeHealth and ControllerListVolumeHealth (in controller.c's
 * method table), NodeGetVolumeHealth and NodeGetStorageHealth (in node.c's).
 * The verdict reads what the loop knows (the volume's QSD), asks the
 * filesystem for its socket and its image in the pool (a stat, at most two
 * lstat: what NodeStageVolume already does on the loop) and takes the
 * figures volstats.h collected in the background; it waits for nothing
 * else. */
#pragma once

#include "csi.pb-c.h"
#include "grpc.h"

#include <stdbool.h>
#include <stdint.h>

struct csi;
struct vol;

/* What the caller read of the volume's allocation (bytes its chain of
 * layers holds): known, not known (no figure yet: not adverse), or the read
 * did not finish in time (a hung disk?). */
enum health_used { HEALTH_USED_KNOWN, HEALTH_USED_UNKNOWN, HEALTH_USED_TIMED_OUT };

struct vol_health {
    /* 0: nothing adverse; else a CSI__V1__VOLUME_HEALTH_ERROR_TYPE__ value. */
    Csi__V1__VolumeHealthErrorType status;
    const char *reason; /* CamelCase, static; NULL when status is 0 */
    char *message;      /* what is wrong, or how the volume is served (malloc'd) */
};

/* The condition of record v (ready).  used: see enum health_used; bytes,
 * when known. */
void health_of(struct csi *c, const struct vol *v, enum health_used known, uint64_t used,
               struct vol_health *ret);
void vol_health_clear(struct vol_health *h);

/* The RPCs (the method's opaque is the struct csi). */
void health_controller_get(struct grpc_call *call, const uint8_t *req, size_t len, void *opaque);
void health_controller_list(struct grpc_call *call, const uint8_t *req, size_t len, void *opaque);
void health_node_get(struct grpc_call *call, const uint8_t *req, size_t len, void *opaque);
void health_node_storage(struct grpc_call *call, const uint8_t *req, size_t len, void *opaque);
