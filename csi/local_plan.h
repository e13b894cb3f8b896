/* local_plan.h: what a CreateVolume or CreateSnapshot of the local
 * backend does, decided from the request and the node's records alone (the
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

enum plan_kind {
    PLAN_REFUSE, /* refusal says why */
    PLAN_EXISTS, /* existing answers (the same request again) */
    PLAN_NEW,    /* the other fields say what to make */
};

struct create_plan {
    enum plan_kind kind;
    struct verdict refusal;
    struct vol *existing;
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
    struct snap *existing;
    struct vol *src; /* PLAN_NEW: the volume to snapshot */
};

/* Decide for in (source_volume_id cut to its record name in place); clear
 * with snapshot_plan_clear. */
void snapshot_plan_make(struct csi *c, Csi__V1__CreateSnapshotRequest *in,
                        struct snapshot_plan *pl);
void snapshot_plan_clear(struct snapshot_plan *pl);
