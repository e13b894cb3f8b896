/* create_plan.h: what a CreateVolume of a local volume does, decided from
 * the request and the node's records alone (the pure core of local.c's
 * create_volume).  The plan touches no file, process or call: it refuses
 * (a status and a message naming the field), answers with the volume that
 * already exists (an idempotent repeat), or says what to create.  What it
 * cannot decide without the node (a foreign image in the pool, the pool's
 * free space) is the act's, in local.c. */
#pragma once

#include "csi.pb-c.h"
#include "params.h"
#include "service.h"
#include "verdict.h"

#include <jansson.h>
#include <stdint.h>

enum create_kind {
    CREATE_REFUSE, /* refusal says why */
    CREATE_EXISTS, /* existing answers (the same request again) */
    CREATE_NEW,    /* the fields below say what to make */
};

struct create_plan {
    enum create_kind kind;
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
