/* SPDX-License-Identifier: Apache-2.0 */
/* service.c: see service.h. */
#include "service.h"
#include "backend.h"
#include "qsd/base/log.h"
#include "qsd/base/names.h"
#include "params.h"
#include "qsd/state/records.h"
#include "qsd/qemu/qmpcmd.h"
#include "qsd/qemu/thin.h"
#include "pbcheck.h"
#include "qsd/base/util.h"

#include <dirent.h>
#include <inttypes.h>
#include <sys/stat.h>

ProtobufCMessage *csi_request_decode(const ProtobufCMessageDescriptor *d, const uint8_t *req,
                                     size_t len, struct verdict *v)
{
    _cleanup_free_ char *field = NULL;
    int r = pb_check_strings(d, req, len, &field);
    if (r == -E2BIG) {
        verdict_fail(v, GRPC_RESOURCE_EXHAUSTED, "the request has more than %d fields",
                     PBCHECK_MAX_FIELDS);
        return NULL;
    }
    if (r < 0) {
        verdict_fail(v, GRPC_INVALID_ARGUMENT, "%s contains a NUL byte", field);
        return NULL;
    }
    ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, len, req);
    if (!m)
        verdict_fail(v, GRPC_INVALID_ARGUMENT, "cannot decode the request (%s)", d->name);
    return m;
}

ProtobufCMessage *csi_request_unpack(struct grpc_call *call, const ProtobufCMessageDescriptor *d,
                                     const uint8_t *req, size_t len)
{
    struct verdict v = {0};
    ProtobufCMessage *m = csi_request_decode(d, req, len, &v);
    if (!m)
        verdict_send(&v, call);
    return m;
}

void reply_controller_caps(struct grpc_call *call,
                           const Csi__V1__ControllerServiceCapability__RPC__Type *types, size_t n)
{
    Csi__V1__ControllerServiceCapability__RPC rpc[16];
    Csi__V1__ControllerServiceCapability caps[16], *list[16];
    n = MIN(n, ARRAY_SIZE(rpc));
    for (size_t i = 0; i < n; i++) {
        rpc[i] = (Csi__V1__ControllerServiceCapability__RPC)
            CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__INIT;
        rpc[i].type = types[i];
        caps[i] = (Csi__V1__ControllerServiceCapability)CSI__V1__CONTROLLER_SERVICE_CAPABILITY__INIT;
        caps[i].type_case = CSI__V1__CONTROLLER_SERVICE_CAPABILITY__TYPE_RPC;
        caps[i].rpc = &rpc[i];
        list[i] = &caps[i];
    }
    Csi__V1__ControllerGetCapabilitiesResponse out =
        CSI__V1__CONTROLLER_GET_CAPABILITIES_RESPONSE__INIT;
    out.n_capabilities = n;
    out.capabilities = list;
    grpc_call_reply_pb(call, &out.base);
}
