/* SPDX-License-Identifier: Apache-2.0 */
/* main.c: qsd-csi-plugin, the CSI node/controller plugin binary.
 *
 * Parses flags, sets up the role's services (--role node: Identity,
 * Controller, Node on the node's state; --role controller: Identity and the
 * RBD Controller, ctlrole.h), serves gRPC on a unix socket from one event loop
 * (and the same methods on a second one under the RBD volumes' driver name
 * with --rbd-endpoint: struct endpoint; the node operations the controller
 * forwards, only those, on a third one with --node-ops-endpoint:
 * NODE_OPS_METHODS), and on SIGTERM/SIGINT (read through
 * a signalfd in the loop) shuts down gracefully: GOAWAY, calls in flight
 * finish within a bounded grace period, exit 0. */
#include "capacity.h"
#include "config.h"
#include "ctlrole.h"
#include "group.h"
#include "grpc.h"
#include "http.h"
#include "metrics.h"
#include "volstats.h"
#include "qsd/base/log.h"
#include "qsd/base/loop.h"
#include "qsd/base/proc.h"
#include "qsd/qemu/qsdconf.h"
#include "plugin.h"
#include "paths.h"
#include "service.h"
#include "snapmeta.h"
#include "startup.h"
#include "qsd/base/util.h"
#include "volqsd.h"
#include "op.h"

#include <getopt.h>
#include <inttypes.h>
#include <libgen.h>
#include <stddef.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/utsname.h>

#define SHUTDOWN_GRACE_MS 5000
#define SOCKET_MODE 0660
#define DEFAULT_API_TOKEN "/var/run/secrets/kubernetes.io/serviceaccount/token"

/* What the node-operations endpoint serves besides Identity: the calls that
 * arrive at the central controller but must run on the volume's node
 * (docs/node-operations.md): snapshots, nothing that creates or deletes a
 * volume, stages or publishes.  Every one refuses a volume of another node. */
static const char *const NODE_OPS_METHODS[] = {
    "/csi.v1.Controller/ControllerGetCapabilities",
    "/csi.v1.Controller/ControllerModifyVolume",
    "/csi.v1.Controller/CreateSnapshot",
    "/csi.v1.Controller/DeleteSnapshot",
    "/csi.v1.Controller/ListSnapshots",
    "/csi.v1.GroupController/",
    "/csi.v1.SnapshotMetadata/",
    NULL,
};

/* One gRPC endpoint: its server, listener and Identity (the driver name
 * GetPluginInfo answers).  The plugin serves the same Controller and Node
 * methods on each, but the node-operations endpoint (node_ops) only
 * NODE_OPS_METHODS. */
struct endpoint {
    struct plugin_config cfg; /* the plugin's, with this endpoint's name and socket */
    bool node_ops;
    struct grpc_server *srv;
    struct grpc_listener *ln;
    struct identity *identity;
};

struct plugin {
    struct plugin_config cfg;
    struct loop *loop;
    struct endpoint ep[3]; /* --endpoint/--driver-name, then --rbd-endpoint/--rbd-driver-name,
                              then --node-ops-endpoint, those given */
    size_t n_ep;
    size_t draining;       /* endpoints not yet drained at shutdown */
    struct csi *csi;
    struct volstats *vstats;
    struct metrics *metrics;
    struct worker *qsd_version; /* asks the QSD binary its version (build_info) */
    struct http_server *http;
    int sigfd;
    struct loop_watch *sigwatch;
    bool stopping;
};

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: qsd-csi-plugin [OPTIONS]\n"
            "CSI plugin serving volumes through qemu-storage-daemon (vhost-user-blk).\n\n"
            "  --role ROLE           node (default): Identity, Node, and the Controller for\n"
            "                        the node's local volumes (and RBD ones); controller:\n"
            "                        Identity and the Controller for RBD volumes only, no\n"
            "                        node state, no privileges (docs/rbd.md \"Deploying\")\n"
            "  --endpoint URL        gRPC endpoint (default unix:///run/qsd-csi/csi.sock)\n"
            "  --nodeid ID           node id (default: hostname)\n"
            "  --driver-name NAME    CSI driver name (default qsd.csi.qsd-csi.dev); the\n"
            "                        topology key is topology.NAME/node (by default\n"
            "                        topology.qsd.csi.qsd-csi.dev/node)\n"
            "  --rbd-endpoint URL, --rbd-driver-name NAME  a second endpoint serving the\n"
            "                        same methods under NAME, the driver name of RBD\n"
            "                        StorageClasses (rbd.qsd-csi.dev in deploy/): the\n"
            "                        central provisioner and snapshotter then see RBD\n"
            "                        claims only (docs/rbd.md)\n"
            "  --node-ops-endpoint URL  (node role) a socket serving only what the\n"
            "                        controller forwards to a volume's node: ModifyVolume,\n"
            "                        group snapshots, snapshot metadata (for the node\n"
            "                        endpoint's TLS front end; docs/node-operations.md)\n"
            "  --node-ops-group GID  (node role) the node-operations socket's group (mode\n"
            "                        0660), so that the TLS front end's gid reaches it\n"
            "  --node-dial URL       (controller role) the socket of qsd-node-gate --dial:\n"
            "                        ControllerModifyVolume of a local volume goes to the\n"
            "                        volume's node through it, found by the API server\n"
            "  --api-token-file PATH (controller role) the ServiceAccount token for the\n"
            "                        API server (default " DEFAULT_API_TOKEN ")\n"
            "  --state-dir DIR       plugin state (default /var/lib/qsd-csi/state)\n"
            "  --pool DIR            image pool (default /var/lib/qsd-csi/pool)\n"
            "  --run-dir DIR         runtime root (default /run/qsd-csi)\n"
            "  --kubelet-root DIR    kubelet root (default /var/lib/kubelet)\n"
            "  --qsd-binary PATH     qemu-storage-daemon (default: found in PATH)\n"
            "  --vhost-filter PATH   the vhost-user filter between each VM pod and its QSD\n"
            "                        (default: $QSD_VHOST_FILTER, else qsd-vhost-filter\n"
            "                        beside this program; \"none\" lets tenants talk to the\n"
            "                        QSD directly: measurements only, docs/security.md)\n"
            "  --max-volumes N       volumes this node serves at most (default 128)\n"
            "  --controller-expansion  no effect (kept for old manifests: the node role\n"
            "                        always advertises ControllerExpandVolume)\n"
            "  --unplug-timeout S    NodeUnstageVolume waits (answers FAILED_PRECONDITION)\n"
            "                        while a client still holds the volume's socket, at\n"
            "                        most S seconds after it left its last pod or hot-plug\n"
            "                        bridge; then it stops the QSD anyway (default 600)\n"
            "  --qsd-cgroup PATH     run every QSD in this cgroup (e.g. /qsd-csi, created in\n"
            "                        every hierarchy under /sys/fs/cgroup), outside the\n"
            "                        plugin's own: QSDs then outlive the plugin's container\n"
            "                        (default: none, QSDs stay in the plugin's cgroup)\n"
            "  --qsd-cpu-weight N    CPU weight of that cgroup, 1-10000 (cgroup v2 scale)\n"
            "  --qsd-memory-max SIZE memory limit of that cgroup (e.g. 4G)\n"
            "  --qsd-volume-memory-max SIZE  with --qsd-cgroup, each QSD runs in a group\n"
            "                        of its own under it (vol-<volume>) with this memory\n"
            "                        limit (default 256M; docs/security.md)\n"
            "  --qsd-volume-pids-max N  ...and at most N tasks (default 256)\n"
            "  --qsd-volume-cpu-weight N  ...and this CPU weight, 1-10000 (default 100)\n"
            "  --qsd-uid-base N      each volume's QSD runs as a uid (and gid) of its own\n"
            "                        from N..N+COUNT-1 (default 60000; docs/security.md)\n"
            "  --qsd-uid-count COUNT size of that range, 0 runs QSDs unconfined as root\n"
            "                        (default 1024)\n"
            "  --http-endpoint HOST:PORT  serve /metrics (Prometheus) and /healthz over\n"
            "                        HTTP on this TCP address (numeric IPv4, [IPv6], or\n"
            "                        :PORT for every IPv4 and IPv6 address; default:\n"
            "                        none)\n"
            "  --metrics-interval S  seconds between statistics rounds and QSD monitor\n"
            "                        probes, 1-3600 (default 10)\n"
            "  --capacity-reserve SIZE|PCT%%  space kept free on the pool's filesystem:\n"
            "                        nothing is created, grown or snapshotted into it\n"
            "                        (default 10%% of the filesystem's size)\n"
            "  --overcommit-ratio R  the volumes' virtual sizes add up to at most R times\n"
            "                        the filesystem's size less the reserve (0.01-1000,\n"
            "                        e.g. 1.5; default: no limit)\n"
            "  --image-max-size SIZE largest image an image class may download (default 64G)\n"
            "  --image-timeout S     bound of one image download, retries included, 1-86400\n"
            "                        (default 3600)\n"
            "  --image-download-allow-cidr CIDR  FOR TESTS: let image downloads reach this\n"
            "                        range although it is refused (loopback, link-local,\n"
            "                        this node's addresses); repeatable, at most 8\n"
            "  --rbd-clusters FILE   RBD backend: JSON list of {clusterID, monitors:\n"
            "                        [\"host:port\", ...]} (docs/rbd.md; read per request)\n"
            "  --log-level LEVEL     debug|info|warn|error (default info)\n"
            "  --log-format FORMAT   text|json (default text)\n"
            "  --version             print the version and exit\n"
            "  --help                this text\n"
            "  --print-qsd-command IMAGE [PARAMETERS]  print, as a JSON array, the command\n"
            "                        line of the QSD this plugin would start for the image\n"
            "                        (raw or qcow2, by its name) with these StorageClass\n"
            "                        parameters (a JSON object of strings), its sockets in\n"
            "                        --run-dir; put it last (benchmarks run exactly this)\n");
}

/* "unix:///abs/path" (or a bare absolute path) -> "/abs/path". */
static int endpoint_path(const char *endpoint, const char **ret)
{
    const char *p = endpoint;
    if (startswith(p, "unix://"))
        p += strlen("unix://");
    else if (startswith(p, "unix:"))
        p += strlen("unix:");
    if (p[0] != '/' || p[1] == '\0')
        return -EINVAL;
    *ret = p;
    return 0;
}

static void drained(struct grpc_listener *ln, void *opaque)
{
    struct plugin *pl = opaque;
    if (pl->draining > 0 && --pl->draining > 0)
        return;
    log_info("plugin", "stopped", "endpoint=%s", pl->cfg.endpoint);
    loop_stop(pl->loop);
}

static void on_signal(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    struct plugin *pl = opaque;
    struct signalfd_siginfo si;
    while (read(fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (pl->stopping) {
            log_warn("plugin", "second signal, stopping now", "signal=%s",
                     strsignal((int)si.ssi_signo));
            loop_stop(pl->loop);
            return;
        }
        pl->stopping = true;
        unsigned conns = 0;
        for (size_t i = 0; i < pl->n_ep; i++)
            conns += grpc_listener_connections(pl->ep[i].ln);
        log_info("plugin", "shutting down", "signal=%s connections=%u grace_ms=%d",
                 strsignal((int)si.ssi_signo), conns, SHUTDOWN_GRACE_MS);
        pl->draining = pl->n_ep;
        size_t n = pl->n_ep;
        for (size_t i = 0; i < n; i++)
            grpc_listener_shutdown(pl->ep[i].ln, SHUTDOWN_GRACE_MS, drained, pl);
        return; /* a listener may have called drained() already */
    }
}

/* The QSD command line the plugin would run for IMAGE and PARAMETERS: the
 * same code as a NodeStage (export_opts_from, qsd_argv), volume name from
 * the image's file name.  Exit status 0, or 2 with a message. */
static int print_qsd_command(const struct plugin_config *cfg, const char *image,
                             const char *parameters)
{
    _cleanup_free_ char *base = xstrdup(basename((char *)image));
    char *dot = strrchr(base, '.');
    if (!dot || (!streq(dot, ".raw") && !streq(dot, ".qcow2"))) {
        fprintf(stderr, "qsd-csi-plugin: --print-qsd-command: image '%s' is not .raw or .qcow2\n",
                image);
        return 2;
    }
    *dot = 0;
    json_error_t jerr;
    json_t *params = json_loads(parameters, 0, &jerr);
    if (!params) {
        fprintf(stderr, "qsd-csi-plugin: --print-qsd-command: parameters: %s\n", jerr.text);
        return 2;
    }
    struct qsd_opts o;
    _cleanup_free_ char *msg = NULL;
    int r = export_opts_from(params, xstrdup(image), xstrdup(dot + 1), false, -1, &o, &msg);
    json_decref(params);
    if (r < 0 || qsd_opts_validate(&o, &msg) < 0) {
        fprintf(stderr, "qsd-csi-plugin: --print-qsd-command: %s\n", msg ? msg : strerror(-r));
        if (r >= 0)
            qsd_opts_clear(&o);
        return 2;
    }
    /* The QSD's own command line, its exports on the pod-facing sockets:
     * the data path a benchmark measures (the vhost-user filter in front of
     * it passes control messages only, docs/security.md). */
    struct qsd_paths p;
    qsd_paths_init(cfg->run_dir, base, &p);
    char **argv = qsd_argv(cfg->qsd_binary, &o, &p);
    json_t *out = json_array();
    for (char **a = argv; *a; a++)
        json_array_append_new(out, json_string(*a));
    char *s = json_dumps(out, JSON_COMPACT);
    printf("%s\n", s);
    free(s);
    json_decref(out);
    qsd_argv_free(argv);
    qsd_paths_clear(&p);
    qsd_opts_clear(&o);
    return 0;
}

/* The QEMU version of the configured qemu-storage-daemon for
 * qsd_csi_build_info: `QSD --version`, run once at start-up in a worker
 * (the loop never waits for a child), bounded by QSD_VERSION_TIMEOUT_MS;
 * unknown until it answers, and when it cannot run (the controller's image
 * has no QSD) or names no version. */
#define QSD_VERSION_TIMEOUT_MS 5000
static int qsd_version_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    char *argv[] = {(char *)arg, "--version", NULL};
    struct proc_result res = {0};
    char *v = NULL;
    if (proc_run(argv, QSD_VERSION_TIMEOUT_MS, &res) == 0 && res.exit_code == 0)
        v = metrics_qemu_version_parse(res.out);
    proc_result_clear(&res);
    if (!v) {
        *ret_msg = xstrdup("qemu-storage-daemon --version named no version");
        return -ENOENT;
    }
    *ret_result = json_pack("{s:s}", "version", v);
    free(v);
    return 0;
}

static void qsd_version_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct plugin *pl = opaque;
    pl->qsd_version = NULL;
    if (status == 0)
        metrics_set_qemu_version(pl->metrics, json_string_value(json_object_get(result, "version")));
    else
        log_info("plugin", "QEMU version unknown", "reason=\"%s\"", msg ? msg : strerror(-status));
}

/* An integer flag in [min, max]; on failure says so on stderr. */
static int uint_flag(const char *flag, const char *arg, uint64_t min, uint64_t max, uint64_t *ret)
{
    if (parse_uint(arg, min, max, ret) == 0)
        return 0;
    fprintf(stderr, "qsd-csi-plugin: invalid --%s '%s' (%" PRIu64 "-%" PRIu64 ")\n", flag, arg, min,
            max);
    return -EINVAL;
}

/* A size flag (bytes or with a K/M/G/T suffix) of at least min. */
static int size_flag(const char *flag, const char *arg, uint64_t min, uint64_t *ret)
{
    uint64_t v;
    if (parse_size(arg, &v) == 0 && v >= min) {
        *ret = v;
        return 0;
    }
    char b[32];
    fprintf(stderr, "qsd-csi-plugin: invalid --%s '%s' (a size of at least %s)\n", flag, arg,
            format_size(min, b, sizeof(b)));
    return -EINVAL;
}

/* The options (parse_args's getopt table). */
enum { O_ENDPOINT = 256, O_NODEID, O_DRIVER, O_STATE, O_POOL, O_RUN, O_KUBELET, O_QSD,
       O_LEVEL, O_FORMAT, O_VERSION, O_HELP, O_MAXVOL, O_CEXP, O_UNPLUG, O_CGROUP,
       O_CPUW, O_MEMMAX, O_HTTP, O_MINTERVAL, O_RESERVE, O_OVERCOMMIT, O_IMGMAX, O_IMGTIME,
       O_PRINT, O_RBDCLUSTERS, O_ROLE, O_FILTER, O_IMGALLOW, O_UIDBASE, O_UIDCOUNT, O_VMEM,
       O_VPIDS, O_VCPUW, O_RBDEP, O_RBDDRIVER, O_NODEOPS, O_NODEOPSGID, O_NODEDIAL,
       O_APITOKEN };

/* The integer options: the flag, its bounds, the factor into the field's
 * unit (seconds into milliseconds), and the field of struct plugin_config
 * with its type. */
enum field_type { F_U64, F_I64, F_U32, F_UINT };
#define CFG(f) offsetof(struct plugin_config, f)
static const struct uint_option {
    int opt;
    const char *flag;
    uint64_t min, max, factor;
    size_t offset;
    enum field_type type;
} uint_options[] = {
    {O_UNPLUG, "unplug-timeout", 1, 86400, 1000, CFG(unplug_timeout_ms), F_I64},
    {O_VPIDS, "qsd-volume-pids-max", 16, 1u << 22, 1, CFG(qsd_vol_pids_max), F_U64},
    {O_VCPUW, "qsd-volume-cpu-weight", 1, 10000, 1, CFG(qsd_vol_cpu_weight), F_UINT},
    {O_UIDBASE, "qsd-uid-base", 1, 0xfffe0000u, 1, CFG(qsd_uid_base), F_U32},
    {O_UIDCOUNT, "qsd-uid-count", 0, 65536, 1, CFG(qsd_uid_count), F_U32},
    {O_CPUW, "qsd-cpu-weight", 1, 10000, 1, CFG(qsd_cpu_weight), F_UINT},
    {O_IMGTIME, "image-timeout", 1, 86400, 1000, CFG(image_timeout_ms), F_U64},
    {O_MINTERVAL, "metrics-interval", 1, 3600, 1000, CFG(metrics_interval_ms), F_U64},
    {O_MAXVOL, "max-volumes", 1, 100000, 1, CFG(max_volumes), F_I64},
    {O_NODEOPSGID, "node-ops-group", 0, 0xfffffffeu, 1, CFG(node_ops_gid), F_I64},
};

/* The size options (uint64_t fields, bytes): the flag and its minimum. */
static const struct size_option {
    int opt;
    const char *flag;
    uint64_t min;
    size_t offset;
} size_options[] = {
    {O_VMEM, "qsd-volume-memory-max", 16ull << 20, CFG(qsd_vol_memory_max)},
    {O_IMGMAX, "image-max-size", 1, CFG(image_max_bytes)},
    {O_MEMMAX, "qsd-memory-max", 16ull << 20, CFG(qsd_memory_max)},
};
#undef CFG

/* A numeric or size option into cfg: -1 to go on, or the exit status.  No
 * value overflows its field: every max times its factor fits the type. */
static int numeric_option(int c, const char *arg, struct plugin_config *cfg)
{
    char *base = (char *)cfg;
    for (size_t i = 0; i < ARRAY_SIZE(uint_options); i++) {
        const struct uint_option *o = &uint_options[i];
        uint64_t v;
        if (o->opt != c)
            continue;
        if (uint_flag(o->flag, arg, o->min, o->max, &v) < 0)
            return 2;
        v *= o->factor;
        switch (o->type) {
        case F_U64: *(uint64_t *)(void *)(base + o->offset) = v; break;
        case F_I64: *(int64_t *)(void *)(base + o->offset) = (int64_t)v; break;
        case F_U32: *(uint32_t *)(void *)(base + o->offset) = (uint32_t)v; break;
        case F_UINT: *(unsigned *)(void *)(base + o->offset) = (unsigned)v; break;
        }
        return -1;
    }
    for (size_t i = 0; i < ARRAY_SIZE(size_options); i++) {
        const struct size_option *o = &size_options[i];
        if (o->opt == c && size_flag(o->flag, arg, o->min, (uint64_t *)(void *)(base + o->offset)) < 0)
            return 2;
    }
    return -1;
}

/* Option c (with its argument) into cfg: -1 to go on, or the exit status
 * (--version, --help and --print-qsd-command end here with 0). */
static int parse_option(int c, char *arg, int argc, char **argv, struct plugin_config *cfg)
{
    switch (c) {
    case O_ENDPOINT: cfg->endpoint = arg; break;
    case O_NODEID: cfg->node_id = arg; break;
    case O_DRIVER: cfg->driver_name = arg; break;
    case O_RBDEP: cfg->rbd_endpoint = arg; break;
    case O_RBDDRIVER: cfg->rbd_driver_name = arg; break;
    case O_NODEOPS: cfg->node_ops_endpoint = arg; break;
    case O_NODEDIAL: cfg->node_dial = arg; break;
    case O_APITOKEN:
        if (arg[0] != '/') {
            fprintf(stderr, "qsd-csi-plugin: --api-token-file must be an absolute path\n");
            return 2;
        }
        cfg->api_token_file = arg;
        break;
    case O_STATE: cfg->state_dir = arg; break;
    case O_RBDCLUSTERS:
        if (arg[0] != '/') {
            fprintf(stderr, "qsd-csi-plugin: --rbd-clusters must be an absolute path\n");
            return 2;
        }
        cfg->rbd_clusters = arg;
        break;
    case O_ROLE:
        if (streq(arg, "node")) {
            cfg->role = PLUGIN_ROLE_NODE;
        } else if (streq(arg, "controller")) {
            cfg->role = PLUGIN_ROLE_CONTROLLER;
        } else {
            fprintf(stderr, "qsd-csi-plugin: invalid --role '%s' (node or controller)\n",
                    arg);
            return 2;
        }
        break;
    case O_POOL: cfg->pool_dir = arg; break;
    case O_RUN: cfg->run_dir = arg; break;
    case O_KUBELET: cfg->kubelet_root = arg; break;
    case O_QSD: cfg->qsd_binary = arg; break;
    case O_FILTER: cfg->vhost_filter = arg; break;
    case O_CEXP: cfg->controller_expansion = true; break;
    case O_CGROUP: {
        const char *why;
        if (arg[0] && path_check_lexical("/", arg, &why) < 0) {
            fprintf(stderr, "qsd-csi-plugin: --qsd-cgroup '%s' %s\n", arg, why);
            return 2;
        }
        cfg->qsd_cgroup = arg[0] ? arg : NULL;
        break;
    }
    case O_IMGALLOW:
        if (cfg->n_image_allow == PLUGIN_MAX_ALLOW ||
            imagebase_parse_net(arg, &cfg->image_allow[cfg->n_image_allow]) < 0) {
            fprintf(stderr, "qsd-csi-plugin: invalid --image-download-allow-cidr '%s' "
                            "(ADDRESS/PREFIX, at most %d)\n", arg, PLUGIN_MAX_ALLOW);
            return 2;
        }
        cfg->n_image_allow++;
        break;
    case O_HTTP: {
        struct sockaddr_storage ss;
        unsigned sl;
        if (http_parse_endpoint(arg, &ss, &sl) < 0) {
            fprintf(stderr, "qsd-csi-plugin: invalid --http-endpoint '%s' (HOST:PORT with a "
                            "numeric host, [IPv6]:PORT or :PORT)\n", arg);
            return 2;
        }
        cfg->http_endpoint = arg;
        break;
    }
    case O_RESERVE:
        if (capacity_parse_reserve(arg, &cfg->capacity) < 0) {
            fprintf(stderr, "qsd-csi-plugin: invalid --capacity-reserve '%s' (a size such "
                            "as 20G, or a percentage 0%%-99%%)\n", arg);
            return 2;
        }
        break;
    case O_OVERCOMMIT:
        if (capacity_parse_ratio(arg, &cfg->capacity) < 0) {
            fprintf(stderr, "qsd-csi-plugin: invalid --overcommit-ratio '%s' (0.01-1000, "
                            "at most two decimals)\n", arg);
            return 2;
        }
        break;
    case O_LEVEL: {
        enum log_level l;
        if (log_parse_level(arg, &l) < 0) {
            fprintf(stderr, "qsd-csi-plugin: invalid --log-level '%s'\n", arg);
            return 2;
        }
        log_set_level(l);
        break;
    }
    case O_FORMAT: {
        enum log_format f;
        if (log_parse_format(arg, &f) < 0) {
            fprintf(stderr, "qsd-csi-plugin: invalid --log-format '%s'\n", arg);
            return 2;
        }
        log_set_format(f);
        break;
    }
    case O_VERSION: printf("qsd-csi-plugin %s\n", QSD_CSI_VERSION); return 0;
    case O_HELP: usage(stdout); return 0;
    case O_PRINT: return print_qsd_command(cfg, arg, optind < argc ? argv[optind] : "{}");
    default:
        if (c >= O_ENDPOINT)
            return numeric_option(c, arg, cfg);
        usage(stderr);
        return 2;
    }
    return -1;
}

/* What no single option can check: the endpoints, names and directories
 * together, the node id.  -1 to go on, or the exit status. */
static int check_config(struct plugin_config *cfg, char **hostname)
{
    if (endpoint_path(cfg->endpoint, &cfg->socket_path) < 0) {
        fprintf(stderr, "qsd-csi-plugin: --endpoint must be unix:///absolute/path\n");
        return 2;
    }
    if (!driver_name_valid(cfg->driver_name)) {
        fprintf(stderr, "qsd-csi-plugin: invalid --driver-name '%s'\n", cfg->driver_name);
        return 2;
    }
    if (!cfg->rbd_endpoint != !cfg->rbd_driver_name) {
        fprintf(stderr, "qsd-csi-plugin: --rbd-endpoint and --rbd-driver-name go together\n");
        return 2;
    }
    if (cfg->rbd_endpoint) {
        if (endpoint_path(cfg->rbd_endpoint, &cfg->rbd_socket_path) < 0) {
            fprintf(stderr, "qsd-csi-plugin: --rbd-endpoint must be unix:///absolute/path\n");
            return 2;
        }
        if (streq(cfg->rbd_socket_path, cfg->socket_path)) {
            fprintf(stderr, "qsd-csi-plugin: --rbd-endpoint is --endpoint's socket\n");
            return 2;
        }
        if (!driver_name_valid(cfg->rbd_driver_name) ||
            streq(cfg->rbd_driver_name, cfg->driver_name)) {
            fprintf(stderr, "qsd-csi-plugin: invalid --rbd-driver-name '%s' (a driver name, "
                            "not --driver-name's)\n", cfg->rbd_driver_name);
            return 2;
        }
    }
    if (cfg->node_ops_endpoint) {
        if (endpoint_path(cfg->node_ops_endpoint, &cfg->node_ops_socket_path) < 0) {
            fprintf(stderr, "qsd-csi-plugin: --node-ops-endpoint must be unix:///absolute/path\n");
            return 2;
        }
        if (streq(cfg->node_ops_socket_path, cfg->socket_path) ||
            (cfg->rbd_socket_path && streq(cfg->node_ops_socket_path, cfg->rbd_socket_path))) {
            fprintf(stderr, "qsd-csi-plugin: --node-ops-endpoint is another endpoint's socket\n");
            return 2;
        }
        if (cfg->role == PLUGIN_ROLE_CONTROLLER) {
            fprintf(stderr, "qsd-csi-plugin: --node-ops-endpoint is for the node role\n");
            return 2;
        }
    } else if (cfg->node_ops_gid >= 0) {
        fprintf(stderr, "qsd-csi-plugin: --node-ops-group needs --node-ops-endpoint\n");
        return 2;
    }
    if (cfg->node_dial) {
        if (endpoint_path(cfg->node_dial, &cfg->node_dial_path) < 0) {
            fprintf(stderr, "qsd-csi-plugin: --node-dial must be unix:///absolute/path\n");
            return 2;
        }
        if (cfg->role != PLUGIN_ROLE_CONTROLLER) {
            fprintf(stderr, "qsd-csi-plugin: --node-dial is for the controller role\n");
            return 2;
        }
    }
    if (!cfg->node_id) {
        char buf[256] = "";
        if (gethostname(buf, sizeof(buf) - 1) < 0 || !buf[0]) {
            fprintf(stderr, "qsd-csi-plugin: no --nodeid and no hostname\n");
            return 2;
        }
        *hostname = xstrdup(buf);
        cfg->node_id = *hostname;
    }
    for (const char **d = (const char *[]){cfg->state_dir, cfg->pool_dir, cfg->run_dir,
                                          cfg->kubelet_root, NULL};
         *d; d++) {
        const char *why;
        if (!streq(*d, "/") && path_check_lexical("/", *d, &why) < 0) {
            fprintf(stderr, "qsd-csi-plugin: directory '%s' %s\n", *d, why);
            return 2;
        }
    }
    if ((cfg->qsd_cpu_weight || cfg->qsd_memory_max) && !cfg->qsd_cgroup) {
        fprintf(stderr, "qsd-csi-plugin: --qsd-cpu-weight and --qsd-memory-max need --qsd-cgroup\n");
        return 2;
    }
    if (cfg->role == PLUGIN_ROLE_CONTROLLER && !cfg->rbd_clusters) {
        fprintf(stderr, "qsd-csi-plugin: --role controller needs --rbd-clusters\n");
        return 2;
    }
    if (strlen(cfg->node_id) > 192) {
        fprintf(stderr, "qsd-csi-plugin: --nodeid longer than 192 bytes\n");
        return 2;
    }
    return -1;
}

static int parse_args(int argc, char **argv, struct plugin_config *cfg, char **hostname)
{
    static const struct option opts[] = {
        {"endpoint", required_argument, NULL, O_ENDPOINT},
        {"nodeid", required_argument, NULL, O_NODEID},
        {"driver-name", required_argument, NULL, O_DRIVER},
        {"state-dir", required_argument, NULL, O_STATE},
        {"pool", required_argument, NULL, O_POOL},
        {"run-dir", required_argument, NULL, O_RUN},
        {"kubelet-root", required_argument, NULL, O_KUBELET},
        {"qsd-binary", required_argument, NULL, O_QSD},
        {"vhost-filter", required_argument, NULL, O_FILTER},
        {"max-volumes", required_argument, NULL, O_MAXVOL},
        {"controller-expansion", no_argument, NULL, O_CEXP},
        {"unplug-timeout", required_argument, NULL, O_UNPLUG},
        {"qsd-cgroup", required_argument, NULL, O_CGROUP},
        {"qsd-cpu-weight", required_argument, NULL, O_CPUW},
        {"qsd-memory-max", required_argument, NULL, O_MEMMAX},
        {"qsd-uid-base", required_argument, NULL, O_UIDBASE},
        {"qsd-volume-memory-max", required_argument, NULL, O_VMEM},
        {"qsd-volume-pids-max", required_argument, NULL, O_VPIDS},
        {"qsd-volume-cpu-weight", required_argument, NULL, O_VCPUW},
        {"qsd-uid-count", required_argument, NULL, O_UIDCOUNT},
        {"http-endpoint", required_argument, NULL, O_HTTP},
        {"metrics-interval", required_argument, NULL, O_MINTERVAL},
        {"capacity-reserve", required_argument, NULL, O_RESERVE},
        {"overcommit-ratio", required_argument, NULL, O_OVERCOMMIT},
        {"image-max-size", required_argument, NULL, O_IMGMAX},
        {"image-timeout", required_argument, NULL, O_IMGTIME},
        {"image-download-allow-cidr", required_argument, NULL, O_IMGALLOW},
        {"rbd-clusters", required_argument, NULL, O_RBDCLUSTERS},
        {"rbd-endpoint", required_argument, NULL, O_RBDEP},
        {"node-ops-endpoint", required_argument, NULL, O_NODEOPS},
        {"node-ops-group", required_argument, NULL, O_NODEOPSGID},
        {"node-dial", required_argument, NULL, O_NODEDIAL},
        {"api-token-file", required_argument, NULL, O_APITOKEN},
        {"rbd-driver-name", required_argument, NULL, O_RBDDRIVER},
        {"role", required_argument, NULL, O_ROLE},
        {"log-level", required_argument, NULL, O_LEVEL},
        {"log-format", required_argument, NULL, O_FORMAT},
        {"version", no_argument, NULL, O_VERSION},
        {"help", no_argument, NULL, O_HELP},
        {"print-qsd-command", required_argument, NULL, O_PRINT},
        {},
    };
    *cfg = (struct plugin_config){
        .endpoint = "unix:///run/qsd-csi/csi.sock",
        .node_ops_gid = -1,
        .api_token_file = DEFAULT_API_TOKEN,
        .driver_name = "qsd.csi.qsd-csi.dev",
        .state_dir = "/var/lib/qsd-csi/state",
        .pool_dir = "/var/lib/qsd-csi/pool",
        .run_dir = "/run/qsd-csi",
        .kubelet_root = "/var/lib/kubelet",
        .qsd_binary = QSD_BINARY_DEFAULT,
        .max_volumes = 128,
        .unplug_timeout_ms = 600 * 1000,
        .metrics_interval_ms = 10 * 1000,
        .capacity = {.reserve_pct = CAPACITY_DEFAULT_RESERVE_PCT},
        .image_max_bytes = 64ull << 30,
        .image_timeout_ms = 3600 * 1000,
        .qsd_uid_base = QSD_UID_BASE_DEFAULT,
        .qsd_vol_memory_max = QSD_VOL_MEMORY_MAX_DEFAULT,
        .qsd_vol_pids_max = QSD_VOL_PIDS_MAX_DEFAULT,
        .qsd_vol_cpu_weight = 100,
        .qsd_uid_count = QSD_UID_COUNT_DEFAULT,
    };
    int c, r;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1)
        if ((r = parse_option(c, optarg, argc, argv, cfg)) >= 0)
            return r;
    if (optind < argc) {
        fprintf(stderr, "qsd-csi-plugin: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    return check_config(cfg, hostname);
}

/* The kernel features the plugin's safety rests on: openat2 (5.6) and
 * mount_setattr (5.12; STATX_ATTR_MOUNT_ROOT came in 5.8).  Probed with
 * calls that fail at once (bad fd) where the syscall exists. */
static int kernel_check(void)
{
    struct utsname u;
    if (syscall(SYS_openat2, -1, "", NULL, 0) < 0 && errno == ENOSYS)
        goto old;
    if (syscall(SYS_mount_setattr, -1, "", 0, NULL, 0) < 0 && errno == ENOSYS)
        goto old;
    return 0;
old:
    uname(&u);
    fprintf(stderr, "qsd-csi-plugin: needs Linux 5.12 or later (openat2, mount_setattr); this "
                    "kernel is %s\n", u.release);
    return -ENOSYS;
}

/* /healthz is answered from the event loop: an answer means the loop turns. */
static void on_http(const char *path, int *ret_status, const char **ret_type, char **ret_body,
                    size_t *ret_len, void *opaque)
{
    struct plugin *pl = opaque;
    if (streq(path, "/metrics")) {
        if (metrics_render(pl->metrics, ret_body, ret_len) == 0) {
            *ret_status = 200;
            *ret_type = "text/plain; version=0.0.4; charset=utf-8";
        }
    } else if (streq(path, "/healthz")) {
        *ret_status = 200;
        *ret_body = xstrdup("ok\n");
        *ret_len = 3;
    } else {
        *ret_status = 404;
    }
}

/* Of m, the methods NODE_OPS_METHODS names (a path, or a prefix ending in
 * '/' for a whole service) added to srv. */
static int add_node_ops(struct grpc_server *srv, const struct grpc_method *m, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (const char *const *a = NODE_OPS_METHODS; *a; a++) {
            size_t l = strlen(*a);
            if ((*a)[l - 1] == '/' ? strncmp(m[i].path, *a, l) == 0 : streq(m[i].path, *a)) {
                int r = grpc_server_add_methods(srv, &m[i], 1);
                if (r < 0)
                    return r;
                break;
            }
        }
    return 0;
}

/* EP's server (Identity under EP's driver name, then the role's Controller
 * and Node methods, or the node operations only) and its listener. */
static int endpoint_serve(struct plugin *pl, struct endpoint *ep)
{
    size_t n;
    const struct grpc_method *m;
    int r;
    if ((r = identity_new(&ep->cfg, &ep->identity)) < 0 || (r = grpc_server_new(NULL, &ep->srv)) < 0) {
        log_error("plugin", "setup failed", "endpoint=%s error=\"%s\"", ep->cfg.endpoint, strerror(-r));
        return r;
    }
    m = identity_methods(ep->identity, &n);
    r = grpc_server_add_methods(ep->srv, m, n);
    if (r == 0 && ep->node_ops) {
        csi_hold_answers(pl->csi, ep->srv);
        const struct grpc_method *(*const tables[])(struct csi *, size_t *) = {
            controller_methods, group_methods, snapmeta_methods};
        for (size_t t = 0; r == 0 && t < sizeof(tables) / sizeof(*tables); t++) {
            m = tables[t](pl->csi, &n);
            r = add_node_ops(ep->srv, m, n);
        }
    } else if (r == 0 && pl->cfg.role == PLUGIN_ROLE_CONTROLLER) {
        m = ctlrole_methods(pl->csi, &n);
        r = grpc_server_add_methods(ep->srv, m, n);
    } else if (r == 0) {
        csi_hold_answers(pl->csi, ep->srv);
        m = controller_methods(pl->csi, &n);
        if ((r = grpc_server_add_methods(ep->srv, m, n)) == 0) {
            m = node_methods(pl->csi, &n);
            r = grpc_server_add_methods(ep->srv, m, n);
        }
        if (r == 0) {
            m = snapmeta_methods(pl->csi, &n);
            r = grpc_server_add_methods(ep->srv, m, n);
        }
        if (r == 0) {
            m = group_methods(pl->csi, &n);
            r = grpc_server_add_methods(ep->srv, m, n);
        }
    }
    if (r < 0) {
        log_error("plugin", "method table rejected", "error=\"%s\"", strerror(-r));
        return r;
    }
    grpc_server_set_observer(ep->srv, metrics_rpc_observe, pl->metrics);
    _cleanup_free_ char *dir = xstrdup(ep->cfg.socket_path);
    if ((r = mkdir_p(dirname(dir), 0711)) < 0) {
        log_error("plugin", "cannot create the socket directory", "path=%s error=\"%s\"",
                  ep->cfg.socket_path, strerror(-r));
        return r;
    }
    r = grpc_listener_new(pl->loop, ep->srv, ep->cfg.socket_path, SOCKET_MODE, &ep->ln);
    if (r < 0)
        log_error("plugin", "cannot listen", "path=%s error=\"%s\"", ep->cfg.socket_path,
                  strerror(-r));
    /* the TLS front end's gid reaches the node-operations socket, no one else's */
    if (r == 0 && ep->node_ops && pl->cfg.node_ops_gid >= 0 &&
        chown(ep->cfg.socket_path, (uid_t)-1, (gid_t)pl->cfg.node_ops_gid) < 0) {
        r = -errno;
        log_error("plugin", "cannot give the node-operations socket its group",
                  "path=%s gid=%lld error=\"%s\"", ep->cfg.socket_path,
                  (long long)pl->cfg.node_ops_gid, strerror(-r));
    }
    return r;
}

static void plugin_free(struct plugin *pl)
{
    free(pl->cfg.filter_path);
    http_server_free(pl->http);
    for (size_t i = 0; i < pl->n_ep; i++)
        grpc_listener_free(pl->ep[i].ln);
    volstats_free(pl->vstats);
    if (pl->csi)
        pl->csi->vstats = NULL;
    csi_free(pl->csi);
    for (size_t i = 0; i < pl->n_ep; i++) {
        grpc_server_free(pl->ep[i].srv);
        identity_free(pl->ep[i].identity);
    }
    worker_cancel(pl->qsd_version);
    metrics_free(pl->metrics);
    loop_watch_remove(pl->sigwatch);
    loop_free(pl->loop);
    if (pl->sigfd >= 0)
        close(pl->sigfd);
}

int main(int argc, char **argv)
{
    struct plugin pl = {.sigfd = -1};
    _cleanup_free_ char *hostname = NULL;
    int r = parse_args(argc, argv, &pl.cfg, &hostname);
    if (r >= 0)
        return r;
    /* The controller role opens, mounts and spawns nothing of the node's. */
    if (pl.cfg.role == PLUGIN_ROLE_NODE && kernel_check() < 0)
        return 1;
    if (pl.cfg.role == PLUGIN_ROLE_NODE) {
        _cleanup_free_ char *msg = NULL;
        if (qsd_filter_resolve(pl.cfg.vhost_filter, &pl.cfg.filter_path, &msg) < 0) {
            log_error("plugin", "no vhost-user filter", "error=\"%s\"", msg);
            return 1;
        }
        if (!pl.cfg.filter_path)
            log_warn("plugin", "tenants talk to their QSDs directly (--vhost-filter none): "
                     "a VM pod can reach QEMU's vhost-user parser", "filter=none");
    }

    int ret = 1;
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0) {
        log_error("plugin", "sigprocmask failed", "error=\"%s\"", strerror(errno));
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);

    pl.sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (pl.sigfd < 0) {
        log_error("plugin", "signalfd failed", "error=\"%s\"", strerror(errno));
        goto out;
    }
    if ((r = loop_new(&pl.loop)) < 0) {
        log_error("plugin", "event loop setup failed", "error=\"%s\" " LOOP_BACKEND_ENV "=%s",
                  strerror(-r), getenv(LOOP_BACKEND_ENV) ?: "");
        goto out;
    }
    log_info("plugin", "event loop", "backend=%s", loop_backend(pl.loop));
    if (pl.cfg.role == PLUGIN_ROLE_CONTROLLER) {
        pl.csi = ctlrole_csi_new(&pl.cfg, pl.loop);
        log_info("plugin", "controller role: RBD volumes only", "clusters=%s",
                 pl.cfg.rbd_clusters);
    } else {
        _cleanup_free_ char *msg = NULL;
        if ((r = csi_new(&pl.cfg, pl.loop, &pl.csi, &msg)) < 0) {
            _cleanup_free_ char *q = log_quote(msg);
            log_error("plugin", "cannot open the state or the pool", "error=%s", q);
            goto out;
        }
        volstats_new(pl.csi, pl.cfg.metrics_interval_ms, &pl.vstats);
        pl.csi->vstats = pl.vstats;
    }
    metrics_new(pl.csi, &pl.metrics);
    if (worker_start(pl.loop, qsd_version_fn, (void *)pl.cfg.qsd_binary, QSD_VERSION_TIMEOUT_MS + 1000,
                     qsd_version_done, &pl, &pl.qsd_version) < 0)
        pl.qsd_version = NULL;
    pl.ep[0].cfg = pl.cfg;
    pl.n_ep = 1;
    if (pl.cfg.rbd_endpoint) {
        pl.ep[1].cfg = pl.cfg;
        pl.ep[1].cfg.driver_name = pl.cfg.rbd_driver_name;
        pl.ep[1].cfg.endpoint = pl.cfg.rbd_endpoint;
        pl.ep[1].cfg.socket_path = pl.cfg.rbd_socket_path;
        pl.n_ep = 2;
    }
    if (pl.cfg.node_ops_endpoint) {
        struct endpoint *ep = &pl.ep[pl.n_ep++];
        ep->cfg = pl.cfg;
        ep->cfg.endpoint = pl.cfg.node_ops_endpoint;
        ep->cfg.socket_path = pl.cfg.node_ops_socket_path;
        ep->node_ops = true;
    }
    for (size_t i = 0; i < pl.n_ep; i++)
        if ((r = endpoint_serve(&pl, &pl.ep[i])) < 0)
            goto out;
    if (pl.cfg.http_endpoint) {
        r = http_server_new(pl.loop, pl.cfg.http_endpoint, on_http, &pl, &pl.http);
        if (r < 0) {
            log_error("plugin", "cannot listen for HTTP", "endpoint=%s error=\"%s\"",
                      pl.cfg.http_endpoint, strerror(-r));
            goto out;
        }
    }
    pl.sigwatch = loop_watch_fd(pl.loop, pl.sigfd, POLLIN, on_signal, &pl);

    log_info("plugin", "serving",
             "role=%s endpoint=%s http=%s driver=%s rbd_endpoint=%s rbd_driver=%s "
             "node_ops_endpoint=%s node_dial=%s node=%s version=%s revision=%s",
             pl.cfg.role == PLUGIN_ROLE_CONTROLLER ? "controller" : "node", pl.cfg.endpoint,
             pl.cfg.http_endpoint ? pl.cfg.http_endpoint : "none", pl.cfg.driver_name,
             pl.cfg.rbd_endpoint ?: "none", pl.cfg.rbd_endpoint ? pl.cfg.rbd_driver_name : "none",
             pl.cfg.node_ops_endpoint ?: "none", pl.cfg.node_dial ?: "none", pl.cfg.node_id,
             QSD_CSI_VERSION, QSD_CSI_REVISION);
    r = loop_run(pl.loop);
    if (r < 0) {
        log_error("plugin", "event loop failed", "error=\"%s\"", strerror(-r));
        goto out;
    }
    ret = 0;
out:
    plugin_free(&pl);
    return ret;
}
