/* SPDX-License-Identifier: Apache-2.0 */
/* verdict.c: a refusal kept until it is sent (verdict.h). */
#include "verdict.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

bool verdict_fail(struct verdict *v, enum grpc_code code, const char *fmt, ...)
{
    if (v->code != GRPC_OK)
        return false;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&v->msg, fmt, ap) < 0)
        abort();
    va_end(ap);
    v->code = code == GRPC_OK ? GRPC_UNKNOWN : code;
    return false;
}

void verdict_send(struct verdict *v, struct grpc_call *call)
{
    grpc_call_fail(call, v->code, "%s", v->msg ? v->msg : "");
    verdict_clear(v);
}

void verdict_clear(struct verdict *v)
{
    free(v->msg);
    *v = (struct verdict){0};
}
