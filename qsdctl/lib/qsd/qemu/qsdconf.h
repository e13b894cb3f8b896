/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/qsdconf.h: the confinement of one volume's QSD (issue 21).
 *
 * Owns: the per-volume uid/gid (a slot of a configured range, recorded as
 * RUN/uids/<uid> files naming the volume: created with link(2), so a kill -9
 * at any point leaves either no record or a whole one; the same volume gets
 * the same uid again while its record lives, two volumes never share one),
 * handing the files a QSD opens to that uid (its top image, its ctl
 * directory, export directories, RBD key and configuration; the layers of
 * its chain readable), and the struct confine a QSD is spawned with (mount
 * namespace with the host read-only, only its own paths writable, the
 * plugin's other places hidden; no capabilities; no_new_privs; the QSD
 * seccomp profile), and its cgroup (<parent>/vol-<volume>: memory, pids and
 * CPU weight of its own).  The spawn site only calls qsd_confine_for() and
 * qsd_cgroup_for(). */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "qsd/base/cgroup.h"
#include "qsd/base/confine.h"

struct qsd_config;
struct qsd_opts;
struct qsd_paths;

/* Default uid/gid range of QSDs: 60000..61023.  Below 65536, where kubelet
 * never maps pods' user namespaces (it hands out 65536-sized ranges above
 * 65535), above Debian's ordinary users (1000..59999) and below systemd's
 * DynamicUser range (61184..65519). */
#define QSD_UID_BASE_DEFAULT 60000u
#define QSD_UID_COUNT_DEFAULT 1024u

/* Default limits of each QSD's own cgroup (docs/security.md: a qcow2 QSD
 * under load peaked at 11 MiB RSS and 10 tasks; librbd adds its cache and
 * messenger threads). */
#define QSD_VOL_MEMORY_MAX_DEFAULT (256ull << 20)
#define QSD_VOL_PIDS_MAX_DEFAULT 256u

#define QSD_CONFINE_MAX_PATHS 24

/* What a QSD is spawned with; the strings are owned here. */
struct qsd_confinement {
    struct confine c;
    char *strs[2 * QSD_CONFINE_MAX_PATHS];
    size_t n_strs;
    const char *writable[QSD_CONFINE_MAX_PATHS + 1];
    const char *hidden[QSD_CONFINE_MAX_PATHS + 1];
};
void qsd_confinement_clear(struct qsd_confinement *qc);

/* The uid of volume's QSDs: the one recorded for it, else a free slot of
 * [base, base + count) recorded now.  -ENOSPC: every slot is taken. */
int qsd_uid_acquire(const char *run_dir, uint32_t base, uint32_t count, const char *volume,
                    uid_t *ret);
/* The recorded uid of volume, -ENOENT if none. */
int qsd_uid_lookup(const char *run_dir, const char *volume, uid_t *ret);
/* Free volume's slot (unstage). */
void qsd_uid_release(const char *run_dir, const char *volume);
/* Free the slots of volumes that have no runtime left (no RUN/ctl/<vol>)
 * and temporary files left by a killed acquire; the number freed. */
int qsd_uid_sweep(const char *run_dir);

/* Everything the QSD of volume needs before its spawn (acquire its uid,
 * hand it its files) and the struct confine to spawn it with.  *ret need
 * not be initialised; clear it with qsd_confinement_clear in every case.
 * cfg->uid_count 0: confinement off (*ret is then unconfined: uid -1, no
 * mount namespace, no seccomp). */
int qsd_confine_for(const struct qsd_config *cfg, const char *volume, const struct qsd_opts *o,
                    const struct qsd_paths *p, struct qsd_confinement *ret, char **ret_msg);

/* The cgroup of volume's QSD: <cfg->cgroup>/vol-<volume>, created with the
 * per-volume limits in every hierarchy; *ret holds the cgroup.procs files
 * to join (qsd_cgroup_close them after the spawn).  -ENOENT: no cgroup
 * configured. */
int qsd_cgroup_for(const struct qsd_config *cfg, const char *volume, struct qsd_cgroup *ret,
                   char **ret_msg);
/* Remove volume's group (its QSD gone); 0 when none configured. */
int qsd_cgroup_release(const struct qsd_config *cfg, const char *volume);
/* Remove the groups of volumes with no runtime left (no RUN/ctl/<vol>). */
void qsd_cgroup_sweep(const struct qsd_config *cfg);

/* A new file that replaces (or sits beside) `like` for the same QSD, e.g. a
 * live snapshot's overlay: the same owner as `like`, mode 0600. */
int qsd_give_like(const char *path, const char *like);
/* A frozen layer: root's, readable by every QSD (mode 0444); its name is
 * random and its directory unlistable to QSDs. */
int qsd_freeze_layer(const char *path);
