/* SPDX-License-Identifier: Apache-2.0 */
/* startup.h: the node plugin's state made and unmade.
 *
 * Owns: csi_new (configuration taken, the kubelet root, the QSDs' cgroup,
 * the pool, the record store and the bridges opened, then start-up
 * recovery: csi_recover, bridges_recover, the layer GC) and csi_free, and
 * the periodic bound on the QSDs' logs.  The top of the plugin's service
 * modules: nothing but main.c includes it. */
#pragma once

#include "plugin.h"

struct csi;
struct loop;

int csi_new(const struct plugin_config *cfg, struct loop *loop, struct csi **ret, char **ret_msg);
/* Fails every call in flight with UNAVAILABLE, cancels workers, forgets the
 * QSDs (their processes keep running, to be adopted by the next start). */
void csi_free(struct csi *c);
