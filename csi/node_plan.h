/* SPDX-License-Identifier: Apache-2.0 */
/* node_plan.h: what a NodeStageVolume, NodeUnstageVolume,
 * NodePublishVolume (of a PVC), NodeUnpublishVolume, NodeExpandVolume or
 * NodeGetVolumeStats does, decided from the request and what the plugin
 * holds in memory (the node's records, the bridges, the QSDs' states as
 * the loop knows them): the pure cores of node.c's handlers.  A plan
 * touches no file, mount, process or call: it refuses (a status and a
 * message naming the field), answers that what was asked already holds
 * (an idempotent repeat), or says what to do.
 *
 * What it cannot decide without the node comes in two ways.  A step the
 * act takes before the plan's outcome holds, because a caller sees its
 * answer first: resolving a path through the filesystem (resolve_*), the
 * bridges answering an ephemeral volume's id (bridge_first).  And a fact
 * the act reads and hands to a second pure step: the state of a staged
 * volume's QSD (node_stage_served, node_expand_size), whether the target is
 * a mount already (node_publish_mounted), the volume's block size
 * (node_expand_size). */
#pragma once

#include "csi.pb-c.h"
#include "service.h"
#include "verdict.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct backend;

/* What a NodeStageVolume does (PLAN_ACT). */
enum stage_step {
    STAGE_PREPARE, /* the backend's stage_prepare: no record yet (backend.h) */
    STAGE_NEW,     /* record the staging of vol, start its QSD */
    STAGE_AGAIN,   /* staged there already: node_stage_served decides */
    STAGE_REPAIR,  /* staged, its QSD not running: start it again */
    STAGE_RESTART, /* staged, not supervised and down: the refusal is the
                    * answer; the backend restarts it (backend.h restart) */
    STAGE_REGROUP, /* staged and served: its socket's group becomes gid */
    STAGE_ATTACH,  /* a pod volume staged, its QSD running: make sure its FUSE
                    * export, loop device and filesystem are there (podvol.h) */
};

struct node_plan {
    enum plan_kind kind;
    struct verdict refusal;
    /* Before the outcome, in this order (each may answer the call instead):
     * resolve resolve_path (mounts_check: never through a symlink, under the
     * kubelet root), failing with INVALID_ARGUMENT naming resolve_field;
     * let the bridges answer an ephemeral volume's id. */
    const char *resolve_field, *resolve_path;
    bool bridge_first;
    struct vol *vol;
    const struct backend *backend; /* stage */
    enum stage_step step;          /* stage */
    int gid;                       /* stage, publish: volume_mount_group (-1: none) */
    bool ro;                       /* stage, publish: read-only */
    ssize_t pub;                   /* publish, unpublish: the publication at target_path, or -1 */
    bool regroup;                  /* publish: the socket's group becomes gid first */
    const char *pod_uid, *pod_ns;  /* publish: podInfoOnMount (into the request), or NULL */
    uint64_t size;                 /* expand: the size to grow to */
    bool grow;                     /* expand: above the recorded size (the capacity policy) */
    int use;                       /* stage, publish: what the capability asks for
                                      (enum stage_kind) */
    const char *fs;                /* stage: its fs_type (STAGE_KIND_FS) */
};

/* The pure part of a path kubelet hands the plugin: present, and
 * path_check_lexical's rule under the kubelet root (INVALID_ARGUMENT naming
 * field).  Resolving it is mounts.h's. */
bool node_path_check(const struct csi *c, struct verdict *v, const char *field,
                     const char *path);

/* The checks of a first staging of record v at path, before anything is
 * recorded: the path is no other volume's or bridge's
 * (FAILED_PRECONDITION), the volume's socket paths fit a unix socket address
 * (INVALID_ARGUMENT), the node's --max-volumes (RESOURCE_EXHAUSTED).  Also
 * run for a volume its backend prepared (stage_new_fn). */
bool node_stage_new_check(struct csi *c, struct verdict *v, const struct vol *vol,
                          const char *path);

/* What the loop knows of a staged volume's QSD (the act reads it). */
struct qsd_state {
    bool exists; /* the volume has one (vol->qsd) */
    bool live;   /* running: it serves (vol_live) */
    bool idle;   /* neither running nor on its way (qsd_idle) */
};

/* Every plan's ids are cut to their record names in place (csi_id_check);
 * every outcome is cleared with node_plan_clear. */
void node_stage_plan(struct csi *c, Csi__V1__NodeStageVolumeRequest *in, struct node_plan *pl);
/* After STAGE_AGAIN: a repeat (PLAN_DONE, or STAGE_REGROUP), a QSD to start
 * again (STAGE_REPAIR, STAGE_RESTART), or UNAVAILABLE while it starts. */
void node_stage_served(struct node_plan *pl, const struct qsd_state *q);
/* PLAN_DONE: not staged there (unstaged already); PLAN_ACT: stop vol's QSD
 * (once no guest holds the disk: the act's) and drop the staging. */
void node_unstage_plan(struct csi *c, Csi__V1__NodeUnstageVolumeRequest *in,
                       struct node_plan *pl);
/* A PVC's publication (bridge_is_ephemeral false).  PLAN_ACT here means
 * "go on": the act finds whether target_path is a mount and hands it to
 * node_publish_mounted, which decides. */
void node_publish_plan(struct csi *c, Csi__V1__NodePublishVolumeRequest *in,
                       struct node_plan *pl);
/* PLAN_DONE: published there already (answer, placing it in a bridge if
 * asked); PLAN_ACT: publish at target_path (pub >= 0: the publication is
 * recorded but not mounted: mount it again), after the group (regroup:
 * which needs the QSD, q). */
void node_publish_mounted(struct node_plan *pl, const Csi__V1__NodePublishVolumeRequest *in,
                          bool mounted, const struct qsd_state *q);
/* PLAN_DONE: not published there; PLAN_ACT: unmount publication pub. */
void node_unpublish_plan(struct csi *c, Csi__V1__NodeUnpublishVolumeRequest *in,
                         struct node_plan *pl);
/* PLAN_ACT: read vol's allocation and answer its stats and condition. */
void node_stats_plan(struct csi *c, Csi__V1__NodeGetVolumeStatsRequest *in, struct node_plan *pl);
/* PLAN_ACT here means "go on": the act reads vol's block size (its export
 * options; IMAGE_SIZE_ALIGN when unknown) and whether its QSD runs, and hands
 * them to node_expand_size, which decides: PLAN_ACT, grow vol's QSD to size
 * (grow: after the capacity policy's admission). */
void node_expand_plan(struct csi *c, Csi__V1__NodeExpandVolumeRequest *in, struct node_plan *pl);
void node_expand_size(struct node_plan *pl, const Csi__V1__NodeExpandVolumeRequest *in,
                      unsigned align, bool live);
void node_plan_clear(struct node_plan *pl);
