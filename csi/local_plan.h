/* SPDX-License-Identifier: Apache-2.0 */
/* local_plan.h: what a CreateVolume, CreateSnapshot, DeleteVolume,
 * DeleteSnapshot or ControllerExpandVolume of the local backend does, decided from the request and the node's records alone (the
 * pure cores of local.c's handlers).  A plan touches no file, process or
 * call: it refuses (a status and a message naming the field), answers with
 * the volume or snapshot that already exists (an idempotent repeat), or
 * says what to create.  What it cannot decide without the node (a foreign
 * image in the pool, the pool's free space) is the act's, in local.c. */
#pragma once

#include "csi.pb-c.h"
#include "params.h"
#include "service.h"
#include "verdict.h"

#include <jansson.h>
#include <stdint.h>

struct create_plan {
    enum plan_kind kind;
    struct verdict refusal;
    struct vol *existing; /* PLAN_DONE */
    json_t *params;     /* the request's parameters (owned) */
    struct vol_params p; /* parsed from them (owned) */
    uint64_t size;      /* the capacity to create, aligned */
    const char *src_type; /* "snapshot", "volume", or NULL (static) */
    const char *src_id;   /* the source's record name (into the request) */
    struct vol *src;      /* the source volume (a clone) */
    struct snap *ssrc;    /* the source snapshot (a restore) */
};

/* Decide for in (whose source id is cut to its record name in place).
 * Every outcome is cleared with create_plan_clear. */
void create_plan_make(struct csi *c, Csi__V1__CreateVolumeRequest *in, struct create_plan *pl);
void create_plan_clear(struct create_plan *pl);

struct snapshot_plan {
    enum plan_kind kind;
    struct verdict refusal;
    struct snap *existing; /* PLAN_DONE */
    struct vol *src;       /* PLAN_ACT: the volume to snapshot */
};

/* Decide for in (source_volume_id cut to its record name in place); clear
 * with snapshot_plan_clear. */
void snapshot_plan_make(struct csi *c, Csi__V1__CreateSnapshotRequest *in,
                        struct snapshot_plan *pl);
void snapshot_plan_clear(struct snapshot_plan *pl);

/* A deletion: PLAN_DONE when there is no such record (deleted already, or
 * never made: the same answer), PLAN_ACT with the record to delete. */
struct delete_plan {
    enum plan_kind kind;
    struct verdict refusal;
    struct vol *vol;
    struct snap *snap;
};

/* The id is cut to its record name in place; clear with delete_plan_clear. */
void delete_volume_plan(struct csi *c, Csi__V1__DeleteVolumeRequest *in, struct delete_plan *pl);
void delete_snapshot_plan(struct csi *c, Csi__V1__DeleteSnapshotRequest *in,
                          struct delete_plan *pl);
void delete_plan_clear(struct delete_plan *pl);

/* ControllerExpandVolume: PLAN_DONE when the volume is already that large
 * (answer size and node), PLAN_ACT to grow vol to size (the act checks the
 * pool's room; a staged volume's record only, the node grows it). */
struct expand_plan {
    enum plan_kind kind;
    struct verdict refusal;
    struct vol *vol;
    uint64_t size;
    bool node; /* PLAN_DONE: node_expansion_required */
};

void expand_plan_make(struct csi *c, Csi__V1__ControllerExpandVolumeRequest *in,
                      struct expand_plan *pl);
void expand_plan_clear(struct expand_plan *pl);
