/* SPDX-License-Identifier: Apache-2.0 */
/* modify.h: ControllerModifyVolume, and CreateVolume's mutable_parameters
 * (qos.h: the keys). */
#pragma once

#include "csi.pb-c.h"
#include "grpc.h"

#include <jansson.h>

struct csi;
struct vol;
struct qsd_limits;

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
/* The request's mutable_parameters alone (keys, values: qos_check), before
 * the current limits are known; -EINVAL with a message naming the key. */
int modify_check(Csi__V1__ControllerModifyVolumeRequest *in, char **ret_msg);
/* The request's mutable_parameters merged over current (qos_merge):
 * *ret the new object, *ret_limits its limits; -EINVAL with a message
 * naming the key, nothing allocated. */
int modify_merge(json_t *current, Csi__V1__ControllerModifyVolumeRequest *in, json_t **ret,
                 struct qsd_limits *ret_limits, char **ret_msg);
/* np (taken; its limits l) becomes record v's limits: saved, then set on
 * v's running QSD (qom-set of its throttle group), if it runs; answers
 * call (ABORTED while v is busy, UNAVAILABLE when the QSD cannot be told:
 * the record has them, a retry sets them).  The one live path of every
 * backend (an RBD volume's node: rbd_qos.c). */
void modify_apply(struct csi *c, struct grpc_call *call, struct vol *v, json_t *np,
                  const struct qsd_limits *l);
