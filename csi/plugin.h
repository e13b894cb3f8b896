/* SPDX-License-Identifier: Apache-2.0 */
/* plugin.h: the CSI plugin's configuration and its service tables.
 *
 * Owns: struct plugin_config (filled from the command line by main.c; its
 * capacity policy is applied by capacity.h) and the entry points each
 * service file exports: a method table for grpc.h. */
#pragma once

#include "grpc.h"
#include "qsd/qemu/imagebase.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* --role: node (default) serves Identity, Node and the Controller for
 * local volumes (and RBD ones); controller serves Identity and the
 * Controller for RBD volumes only, with no node state (ctlrole.h). */
enum plugin_role { PLUGIN_ROLE_NODE, PLUGIN_ROLE_CONTROLLER };

/* The pool's capacity policy (--capacity-reserve, --overcommit-ratio),
 * applied by capacity.h. */
struct capacity_policy {
    uint64_t reserve_bytes;   /* fixed reserve, or */
    unsigned reserve_pct;     /* percent of the filesystem's size (0-99) */
    unsigned overcommit_x100; /* ratio times 100; 0: no limit */
};

#define CAPACITY_DEFAULT_RESERVE_PCT 10

#define PLUGIN_MAX_ALLOW 8 /* --image-download-allow-cidr ranges */

struct plugin_config {
    enum plugin_role role;
    const char *endpoint;     /* unix:///run/qsd-csi/csi.sock */
    const char *socket_path;  /* endpoint without the scheme */
    const char *node_id;
    const char *driver_name;
    const char *rbd_endpoint;    /* a second endpoint (--rbd-endpoint), NULL: none */
    const char *rbd_socket_path; /* rbd_endpoint without the scheme */
    const char *rbd_driver_name; /* the name GetPluginInfo answers there */
    const char *node_ops_endpoint;    /* --node-ops-endpoint (node role), NULL: none */
    const char *node_ops_socket_path; /* node_ops_endpoint without the scheme */
    int64_t node_ops_gid;     /* --node-ops-group: that socket's group, -1: unchanged */
    const char *node_dial;    /* --node-dial (controller role): the dial gate's socket,
                                 NULL: volumes of nodes are not reached */
    const char *node_dial_path; /* node_dial without the scheme */
    const char *api_token_file; /* the ServiceAccount token for the API server */
    const char *state_dir;
    const char *pool_dir;
    const char *run_dir;
    const char *kubelet_root;
    const char *qsd_binary;   /* name (looked up in PATH) or absolute path */
    const char *vhost_filter; /* --vhost-filter as given, NULL: the default (qsd.h
                                 qsd_filter_resolve) */
    char *filter_path;        /* resolved at start (node role): the filter every
                                 export is served through, NULL: none */
    int64_t max_volumes;      /* NodeGetInfo max_volumes_per_node; staged volumes at most */
    bool controller_expansion; /* --controller-expansion given: no effect any more */
    int64_t unplug_timeout_ms; /* NodeUnstage stops a QSD with a connected client after this
                                  long since the volume left its last pod or bridge */
    const char *qsd_cgroup;   /* cgroup of the QSDs ("/qsd-csi"), NULL: the plugin's own */
    unsigned qsd_cpu_weight;  /* 0: leave */
    uint64_t qsd_memory_max;  /* 0: leave */
    uint64_t qsd_vol_memory_max; /* each QSD's own group under qsd_cgroup (qsdconf.h) */
    uint64_t qsd_vol_pids_max;
    unsigned qsd_vol_cpu_weight;
    uint32_t qsd_uid_base;    /* QSDs' uids: [base, base + count) (qsdconf.h) */
    uint32_t qsd_uid_count;   /* 0: QSDs unconfined */
    const char *http_endpoint; /* HOST:PORT of /metrics and /healthz, NULL: none */
    uint64_t metrics_interval_ms; /* statistics and QSD probes (volstats.h) */
    struct capacity_policy capacity; /* --capacity-reserve, --overcommit-ratio */
    uint64_t image_max_bytes; /* image classes: largest download (imageclass.h) */
    uint64_t image_timeout_ms; /* ...and the bound of one download, retries included */
    /* --image-download-allow-cidr (tests only): refused addresses a download
     * may reach anyway (imagebase.h) */
    struct imagebase_net image_allow[PLUGIN_MAX_ALLOW];
    size_t n_image_allow;
    const char *rbd_clusters; /* RBD backend: cluster id -> monitors file (rbd.h), or NULL */
};

struct identity;

int identity_new(const struct plugin_config *cfg, struct identity **ret);
void identity_free(struct identity *id);
/* The Identity service's method table (valid while id lives). */
const struct grpc_method *identity_methods(struct identity *id, size_t *ret_n);

/* Readiness: 0 when the plugin can serve, else a negative errno and a static
 * reason.  Checks, node role: state and pool directories exist and are
 * writable, the qemu-storage-daemon binary is executable; controller role:
 * the cluster file (--rbd-clusters) is readable.  Extend here. */
int plugin_check_ready(const struct plugin_config *cfg, const char **ret_reason);

/* Validate a CSI driver name: 1..63 chars of [A-Za-z0-9.-], alphanumeric at
 * both ends (the spec's GetPluginInfo rule). */
bool driver_name_valid(const char *name);
