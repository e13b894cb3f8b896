/* SPDX-License-Identifier: Apache-2.0 */
/* modify.h: ControllerModifyVolume, and CreateVolume's mutable_parameters
 * (qos.h: the keys). */
#pragma once

#include "csi.pb-c.h"
#include "grpc.h"

#include <jansson.h>

struct csi;

/* CreateVolume's (or any request's) mutable_parameters entries, validated
 * (qos_merge over nothing): *ret the record's object, NULL when there are
 * none.  -EINVAL with a message naming the key. */
int modify_params_of(size_t n, Csi__V1__CreateVolumeRequest__MutableParametersEntry **e,
                     json_t **ret, char **ret_msg);
/* ControllerModifyVolume of a local volume (backend_local's
 * modify_volume; volume_id given): the record first, then the live QSD's
 * throttle group (qom-set).  Another node's volume: UNAVAILABLE naming it
 * (the controller plugin with --node-dial is what forwards to a node,
 * nodecall.h). */
void modify_volume_local(struct csi *c, struct grpc_call *call,
                         Csi__V1__ControllerModifyVolumeRequest *in);
