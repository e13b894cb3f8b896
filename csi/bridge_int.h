/* SPDX-License-Identifier: Apache-2.0 */
/* bridge_int.h: what the bridge files share (bridge.c: publish and hooks;
 * bridge_store.c: records and tables; bridge_place.c: directories, mounts,
 * placements, recovery).  Not for the rest of the plugin: bridge.h is. */
#pragma once

#include "bridge.h"

#define COMP "bridge"
#define CTX_PREFIX "csi.storage.k8s.io/"
#define CTX_EPHEMERAL CTX_PREFIX "ephemeral"
#define CTX_POD_NAME CTX_PREFIX "pod.name"
#define CTX_POD_NS CTX_PREFIX "pod.namespace"
#define CTX_POD_UID CTX_PREFIX "pod.uid"

/* bridge_store.c */
bool k8s_name_ok(const char *s, size_t max, bool dots);
bool uid_ok(const char *s);
void placement_clear(struct placement *p);
void bridge_free(struct bridge *b);
void req_free(struct hp_request *r);
json_t *req_to_json(const struct hp_request *r);
int save_rec(struct bridges *bs, const char *dir, const char *name, json_t *j);
int save_bridge(struct bridges *bs, const struct bridge *b);
void add_bridge(struct bridges *bs, struct bridge *b);
void add_req(struct bridges *bs, struct hp_request *q);
void del_bridge(struct bridges *bs, struct bridge *b);
void del_req(struct bridges *bs, struct hp_request *q);
struct bridge *find_bridge_uid(struct bridges *bs, const char *uid);
struct bridge *find_bridge_vid(struct bridges *bs, const char *vid);
struct hp_request *find_req_vid(struct bridges *bs, const char *vid);
struct hp_request *find_req_pod(struct bridges *bs, const char *uid);

/* bridge_place.c */
int bridge_dir_open(struct bridges *bs, const struct bridge *b, int *ret_fd);
int bridge_dir_make(struct bridges *bs, const struct bridge *b, int join_fd,
                    char **ret_msg);
void remove_bridge_dir(struct bridges *bs, const struct bridge *b);
int can_place(struct csi *c, struct bridge *b, const char *disk, const struct vol *v,
              const char *pod_uid, int gid, enum grpc_code *code, char **msg);
int do_place(struct csi *c, struct bridge *b, const char *disk, struct vol *v,
             const char *pod_uid, bool ro, char **ret_msg);
void do_unplace(struct csi *c, struct bridge *b, size_t i);
