/* SPDX-License-Identifier: Apache-2.0 */
/* state.h: the plugin's volumes and snapshots: one JSON record per volume
 * (STATE/volumes/<id>.json) and per snapshot (STATE/snapshots/<id>.json),
 * kept in the record store (records.h: replaced atomically on the loop, made
 * durable by its flusher before the RPC is answered).
 *
 * Owns: the in-memory tables loaded at start, their JSON form (pure
 * vol_to_json/vol_from_json, unit-tested) and saving/removing records.
 * Phases make half-done work visible after a crash: a record is written with
 * phase "creating" before the image exists and "deleting" before the image is
 * removed; the plugin finishes or undoes such records when it starts. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum rec_phase { PHASE_CREATING, PHASE_READY, PHASE_DELETING };

/* What a staged volume is served as (docs/pod-volumes.md): a vhost-user
 * socket directory for VM pods, a filesystem or a block device for other
 * pods.  One kind at a time. */
enum stage_kind { STAGE_KIND_VHOST, STAGE_KIND_FS, STAGE_KIND_BLOCK };
const char *stage_kind_name(enum stage_kind k);

struct publication {
    char *target;
    bool read_only;
    char *pod_uid;         /* podInfoOnMount of the publishing pod, or NULL */
    char *pod_ns;
};

struct vol {
    char *id;
    enum rec_phase phase;
    char *format;          /* qcow2 | raw */
    char *preallocation;
    json_t *parameters;    /* StorageClass parameters as received (object) */
    json_t *context;       /* volume_context: the csi.storage.k8s.io/ keys (object) */
    json_t *mutable_params; /* VolumeAttributesClass parameters, validated (qos.h);
                              NULL: none */
    uint64_t size;         /* capacity promised to the CO */
    uint64_t image_size;   /* size of the image as last grown (<= size while an
                              expansion waits for NodeExpandVolume/NodeStage) */
    char *src_type;        /* "snapshot" | "volume" | NULL */
    char *src_id;
    int64_t created;       /* unix seconds */
    /* node side */
    char *staging_path;    /* NULL: not staged */
    int stage_gid;         /* socket group, -1: root */
    bool stage_ro;         /* staged with a read-only access mode */
    enum stage_kind stage_kind;
    char *stage_fs;        /* STAGE_KIND_FS: ext4 | xfs */
    char *stage_loop;      /* a pod volume's loop device (loopN) as the stage's
                              worker found it backed by the FUSE export; NULL:
                              none recorded (not attached yet) */
    uint64_t stage_loop_diskseq; /* its disk sequence number then (the kernel
                              gives each attach of a backing file a new one) */
    bool raw_exposed;      /* its bytes were ever a tenant's block device (a VM's
                              disk or a Block-mode pod's): a filesystem on it is
                              checked before the kernel mounts it */
    bool fs_made;          /* a pod filesystem was made on it: a device found
                              empty later is never formatted again */
    struct publication *pubs;
    size_t n_pubs;
    int64_t released_ms;   /* wall clock (ms) when it last left a pod or a bridge;
                              0: never.  Bounds NodeUnstage's wait for the guest */
    /* runtime only (not persisted) */
    struct qsd *qsd;
    void *start_ctx;       /* pending qsd_start completion (service.c) */
    struct rbd_guard *rbd_guard; /* an RBD volume's restarts (rbd_guard.h) */
    bool busy;             /* an operation is in flight */
};

struct snap {
    char *id;
    enum rec_phase phase;
    char *source;          /* source volume id */
    uint64_t size;
    int64_t created_sec;
    int32_t created_nsec;
    json_t *layers;        /* thin snapshots: the layer names of its chain, its own
                              first, base last (layers.h); NULL for a full copy.
                              Frozen layers never change, so the chain recorded at
                              creation stays true (docs/changed-blocks.md) */
    char *group;           /* the group snapshot it is a member of, or NULL */
    bool busy;
    unsigned readers;      /* volumes being restored from it now (not deleted meanwhile) */
};

struct records;
struct store {
    struct records *rec;   /* where records are written (records.h); NULL: synchronously */
    char *dir, *vol_dir, *snap_dir;
    struct vol **vols;
    size_t n_vols;
    struct snap **snaps;
    size_t n_snaps;
};

/* Create the directories if needed and load every record (invalid files are
 * skipped with a warning).  rec (borrowed, may be NULL) writes the changes. */
int store_open(const char *dir, struct records *rec, struct store **ret, char **ret_msg);
void store_free(struct store *s);

struct vol *store_find_vol(struct store *s, const char *id);
struct snap *store_find_snap(struct store *s, const char *id);
/* Take ownership of a new record (not saved). */
void store_add_vol(struct store *s, struct vol *v);
void store_add_snap(struct store *s, struct snap *sn);
int store_save_vol(struct store *s, const struct vol *v);
int store_save_snap(struct store *s, const struct snap *sn);
/* Remove the record file and free the record. */
int store_remove_vol(struct store *s, struct vol *v);
int store_remove_snap(struct store *s, struct snap *sn);
/* Sorted by id (for pagination). */
void store_sort(struct store *s);

struct vol *vol_new(const char *id);
void vol_free(struct vol *v);
struct snap *snap_new(const char *id);
void snap_free(struct snap *sn);
void vol_clear_staging(struct vol *v);
void vol_add_pub(struct vol *v, const char *target, bool ro);
/* Set the publishing pod of publication i (NULLs: unknown). */
void vol_pub_set_pod(struct vol *v, size_t i, const char *uid, const char *ns);
void vol_del_pub(struct vol *v, size_t i);
/* Index of the publication at target, or -1. */
ssize_t vol_find_pub(const struct vol *v, const char *target);

json_t *vol_to_json(const struct vol *v);
int vol_from_json(json_t *j, struct vol **ret, char **ret_msg);
json_t *snap_to_json(const struct snap *sn);
int snap_from_json(json_t *j, struct snap **ret, char **ret_msg);
