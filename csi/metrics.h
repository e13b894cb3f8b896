/* metrics.h: the plugin's metrics registry and its Prometheus rendering.
 *
 * Owns: the RPC registry (count and duration histogram per registered
 * method and gRPC code, fed by the gRPC server's observer), and the
 * /metrics page: RPC
 * series, then the pool and per-volume series read from the collector's
 * cache (volstats.h).  Rendering never waits: it reads what is cached.
 * Every series name starts with qsd_csi_ (docs/observability.md); every
 * per-volume series carries metrics_volume_labels'.  The text format's
 * helpers are exposition.h's. */
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
