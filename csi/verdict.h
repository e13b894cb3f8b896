/* SPDX-License-Identifier: Apache-2.0 */
/* verdict.h: a refusal decided by code that touches no call: the gRPC
 * status and its message, kept until the caller sends it.  Pure checks
 * (ids, capabilities, the plans of local_plan.h and node_plan.h) fill one
 * instead of failing a call themselves, so that unit tests can read what
 * they decided; a plan's outcome is one of enum plan_kind. */
#pragma once

#include "grpc.h"

#include <stdbool.h>

enum plan_kind {
    PLAN_REFUSE, /* the verdict says why */
    PLAN_DONE,   /* what was asked already holds (a repeat): answer it */
    PLAN_ACT,    /* the plan's other fields say what to do */
};

struct verdict {
    enum grpc_code code; /* GRPC_OK: nothing refused */
    char *msg;
};

/* Record a refusal (the first one wins) and return false, for
 * `return verdict_fail(v, ...)` in checks that answer true when all is
 * well. */
bool verdict_fail(struct verdict *v, enum grpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Fail call with v's status and message, and clear v. */
void verdict_send(struct verdict *v, struct grpc_call *call);
void verdict_clear(struct verdict *v);
