/* SPDX-License-Identifier: Apache-2.0 */
/* volqsd.h: the QSD side of a staged volume: its export options (from
 * the StorageClass parameters and the staging flags), its start, the
 * events of its supervisor, its runtime directories. */
#pragma once

#include "qsd/qemu/qsd.h"

#include <jansson.h>
#include <stdbool.h>

struct csi;
struct vol;

/* Export options for a volume from its StorageClass parameters (a JSON
 * object of strings), image and format (both taken over, freed on error),
 * and staging flags: what every QSD the plugin starts runs with. */
int export_opts_from(json_t *parameters, char *image, char *format, bool read_only, int gid,
                     struct qsd_opts *ret, char **ret_msg);
/* Export options for a volume (its parameters, image, staging flags). */
int vol_export_opts(struct csi *c, const struct vol *v, struct qsd_opts *ret, char **ret_msg);
/* Parse StorageClass parameters kept as a JSON object of strings (params.h). */
struct vol_params;
int vol_params_from_json(json_t *params, struct vol_params *ret, char **ret_msg);
/* v's QSD object (not started), with the plugin's event handler and its
 * backend's supervision: for a start, or to adopt a running QSD. */
void vol_qsd_new(struct csi *c, struct vol *v, const struct qsd_opts *o);
/* Start the QSD of a staged volume; done(status, msg) on the loop. */
typedef void (*vol_started_fn)(struct csi *c, struct vol *v, int status, const char *msg,
                               void *opaque);
/* fuse_fd >= 0 (taken over): a pod volume's mounted /dev/fuse, which this
 * start (only) also exports the volume on (qsd_set_fuse_fd, podvol.h). */
int vol_qsd_start(struct csi *c, struct vol *v, int fuse_fd, vol_started_fn done, void *opaque,
                  char **ret_msg);
bool vol_live(const struct vol *v);


/* Remove a volume's export and control directories (qsd_remove_runtime),
 * logging a failure. */
void csi_remove_runtime(struct csi *c, const char *id);

