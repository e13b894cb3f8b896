/* SPDX-License-Identifier: Apache-2.0 */
/* bridge.h: the hot-plug bridge (docs/hotplug-bridge.md).
 *
 * A VM pod declares an inline ephemeral volume of this driver with
 * volumeAttributes {bridge: "true"}: its NodePublishVolume creates
 * RUN/bridges/<pod-uid>/ (0750 root:<fsGroup>), makes it a shared mount and
 * binds it onto the target, so later mounts inside it reach the pod.  An
 * attachment pod in the same namespace mounts PVCs and an inline volume
 * {hotplugInto: <vm pod name>, disk: <name>}; the two publishes are matched
 * by pod uid (either order) and each PVC's export directory is bind-mounted
 * into the bridge as <disk>/ ("placed").  Unpublishing the PVC or the request
 * removes the placement; NodeUnstageVolume then waits (refuses, kubelet
 * retries) while the guest still holds the socket, up to --unplug-timeout.
 *
 * Owns: bridge and hot-plug request records (STATE/bridges/<pod-uid>.json,
 * STATE/hotplug/<volume-id>.json, in the record store records.h), the bridge
 * mounts, the placements and their re-creation at start.  Everything comes
 * from NodePublish: no Kubernetes API access.  Three files: bridge.c
 * (publish, unpublish, the PVC hooks), bridge_store.c (records and tables),
 * bridge_place.c (directories, mounts, placement policy, recovery). */
#pragma once

#include "service.h"

struct placement {
    char *disk;            /* directory name in the bridge = the disk's name */
    char *volume;          /* volume id of the PVC */
    char *pod_uid;         /* the attachment pod that asked */
    bool read_only;
};

struct bridge {
    char *volume_id;       /* kubelet's id of the inline ephemeral volume */
    char *target;
    char *pod_uid, *ns, *pod;
    int gid;               /* fsGroup of the VM pod (-1: none) */
    struct placement *pl;
    size_t n_pl;
};

struct hp_request {
    char *volume_id, *target;
    char *pod_uid, *ns, *pod;  /* the attachment pod */
    char *into;            /* VM pod name, same namespace */
    char *disk;            /* NULL: the volume id */
    char *bridge_uid;      /* the VM pod's uid, resolved at publish */
    int gid;
};

struct bridges {
    struct records *rec;   /* the record store (records.h), the volumes' one */
    char *bridge_rec_dir, *req_rec_dir, *run_dir;
    int run_fd;            /* O_PATH of run_dir (RUN/bridges) */
    struct bridge **b;
    size_t n_b;
    struct hp_request **r;
    size_t n_r;
};

int bridges_open(struct csi *c, char **ret_msg);
void bridges_free(struct bridges *bs);
/* At start: re-create missing bridge and placement mounts of the records. */
void bridges_recover(struct csi *c);

/* volume_context says csi.storage.k8s.io/ephemeral=true. */
bool bridge_is_ephemeral(const Csi__V1__NodePublishVolumeRequest *in);
/* NodePublishVolume of an inline ephemeral volume (bridge or request). */
void bridge_publish_ephemeral(struct csi *c, struct grpc_call *call,
                              const Csi__V1__NodePublishVolumeRequest *in);
/* NodeUnpublishVolume of an ephemeral volume id: true when it was one of
 * ours (the call is then completed). */
bool bridge_unpublish_ephemeral(struct csi *c, struct grpc_call *call, const char *id,
                                const char *target);
/* "the bridge of pod ns/name" or "the hot-plug request of pod ns/name"
 * when path is the target of one (other than ephemeral volume id except;
 * to free), else NULL. */
char *bridge_path_owner(struct csi *c, const char *path, const char *except);

/* NodeGetVolumeStats of an ephemeral volume: true when handled. */
bool bridge_stats(struct csi *c, struct grpc_call *call, const char *id, const char *path);

/* A PVC published for pod_uid: can it be placed as that pod's request asks?
 * 0 (also when the pod asked nothing), or <0 with *ret_code and *ret_msg. */
int bridge_pvc_check(struct csi *c, const struct vol *v, const char *pod_uid, int gid,
                     enum grpc_code *ret_code, char **ret_msg);
/* After the PVC's own mount: place it (no-op without a request). */
int bridge_pvc_place(struct csi *c, struct vol *v, const char *pod_uid, bool ro, char **ret_msg);
/* The PVC's publication for pod_uid went: remove its placements. */
void bridge_pvc_unplace(struct csi *c, struct vol *v, const char *pod_uid);

/* Who else uses path (absolute) as a target or staging path: "a
 * publication of volume X", "the bridge of pod Y"... (to free), or NULL.
 * Records of the volume or ephemeral volume id `except` are not counted. */
char *csi_path_owner(struct csi *c, const char *path, const char *except);
