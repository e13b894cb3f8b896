/* SPDX-License-Identifier: Apache-2.0 */
/* verdict.h: a refusal decided by code that touches no call: the gRPC
 * status and its message, kept until the caller sends it.  Pure checks
 * (ids, capabilities, the plans of plan.h) fill one instead of failing a
 * call themselves, so that unit tests can read what they decided. */
#pragma once

#include "grpc.h"

#include <stdbool.h>

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
