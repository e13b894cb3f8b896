/* SPDX-License-Identifier: Apache-2.0 */
/* metrics.h: the plugin's metrics registry and its Prometheus rendering.
 *
 * Owns: the RPC registry (count and duration histogram per registered
 * method and gRPC code, fed by the gRPC server's observer), and the
 * /metrics page: RPC
 * series, then the pool and per-volume series read from the collector's
 * cache (volstats.h).  Rendering never waits: it reads what is cached.
 * Every series name starts with qsd_csi_ (docs/observability.md); every
 * per-volume series carries metrics_volume_labels'.  The page opens with
 * qsd_csi_build_info (the plugin's version and revision, the QEMU version
 * of the qemu-storage-daemon it runs).  The text format's helpers are
 * exposition.h's. */
#pragma once

#include "exposition.h"
#include "grpc.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

struct csi;

/* ---- the plugin's registry ---- */
struct metrics;
int metrics_new(struct csi *c, struct metrics **ret);
void metrics_free(struct metrics *m);
/* A grpc_observer_fn (opaque: the struct metrics). */
void metrics_rpc_observe(const struct grpc_method *method, enum grpc_code code,
                         uint64_t duration_us, void *opaque);
/* The QEMU version the page names in qsd_csi_build_info (copied; NULL or
 * never set: "unknown"). */
void metrics_set_qemu_version(struct metrics *m, const char *qemu_version);
/* The version in a `qemu-storage-daemon --version` output ("...version
 * 10.0.2 (Debian ...)" -> "10.0.2"), malloc'd; NULL when it names none. */
char *metrics_qemu_version_parse(const char *version_output);
/* The qsd_csi_build_info family (pure: the tests render it). */
void metrics_build_info(FILE *f, const char *version, const char *revision,
                        const char *qemu_version);
/* The whole page (malloc'd, *ret_len bytes). */
int metrics_render(struct metrics *m, char **ret, size_t *ret_len);

/* The labels of a volume's series: volume_id (the record's name, as
 * before), volume_handle (the id the CO has: the PV's
 * spec.csi.volumeHandle, which kube-state-metrics exports), namespace and
 * persistentvolumeclaim (CreateVolume's csi.storage.k8s.io/pvc/namespace
 * and .../pvc/name, kept in the record's volume_context, the keys
 * csi-provisioner adds with --extra-create-metadata).  Unknown ones are
 * "" (context may be NULL).  malloc'd. */
char *metrics_volume_labels(const char *volume_id, const char *handle, const json_t *context);
