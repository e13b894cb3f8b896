/* SPDX-License-Identifier: Apache-2.0 */
/* ctlrole.h: the plugin's controller role (--role controller).
 *
 * Owns: what the binary serves when it runs as the cluster-wide controller
 * beside csi-provisioner, csi-resizer and csi-snapshotter in their central
 * (non-distributed) mode: the Controller service for RBD volumes, on a
 * struct csi that has no node state (no pool, no records, no QSD, no
 * kubelet directories, no cgroup).  Requests for local volumes are
 * refused, answered without work (expansion), or, with --node-dial,
 * passed whole to the volume's node (modify, snapshots, group snapshots,
 * snapshot metadata: docs/node-operations.md; docs/rbd.md "Deploying"). */
#pragma once

#include "grpc.h"
#include "plugin.h"

struct csi;
struct loop;

/* A struct csi for the controller role: an empty record store, nothing
 * opened on disk.  Freed with csi_free. */
struct csi *ctlrole_csi_new(const struct plugin_config *cfg, struct loop *loop);
/* The Controller method table of the controller role (valid while c lives). */
const struct grpc_method *ctlrole_methods(struct csi *c, size_t *ret_n);
