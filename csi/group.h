/* SPDX-License-Identifier: Apache-2.0 */
/* group.h: the CSI GroupController service of the node plugin
 * (VolumeGroupSnapshot of the volumes of its node; group.c). */
#pragma once

#include "grpc.h"

#include <stddef.h>

struct csi;

/* The GroupController method table (opaque: c).  The node role serves
 * it; the controller role does not (its volumes' nodes are elsewhere). */
const struct grpc_method *group_methods(struct csi *c, size_t *ret_n);
