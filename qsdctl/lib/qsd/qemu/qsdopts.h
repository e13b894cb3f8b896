/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/qsdopts.h: what a volume's QSD is given, built without I/O (pure,
 * unit-tested without a QSD: tests/unit/test_qsd_opts.c).
 *
 *   qsd_opts    the export's tunables: set from their command-line or
 *               StorageClass spelling, validated, recorded as JSON
 *   qsd_paths   the per-volume runtime layout (docs/runtime-layout.md)
 *   qsd_argv    the QSD command line, and the unit's (behind the filter)
 *   node JSON   the image's file and format nodes (--blockdev or blockdev-add)
 *   qsd_config  the node's settings for every QSD (binary, filter, bounds,
 *               confinement, cgroups), read by the supervisor and qsdconf.h
 * Nothing here opens a file or starts a process (the one lookup: a
 * socket-group given by name, getgrnam): qsdrun.h makes the directories
 * these paths name, qsd.h starts what this argv says. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct qsd_rbd;
/* I/O limits of a volume's throttle group (QEMU's ThrottleLimits): per
 * second, 0 = unlimited; the bursts (`...-max`, for 1 s) at least their
 * base.  Indices as QSD_LIMIT_KEYS. */
enum {
    QSD_LIM_IOPS_READ,
    QSD_LIM_IOPS_WRITE,
    QSD_LIM_BPS_READ,
    QSD_LIM_BPS_WRITE,
    QSD_LIM_IOPS_READ_MAX,
    QSD_LIM_IOPS_WRITE_MAX,
    QSD_LIM_BPS_READ_MAX,
    QSD_LIM_BPS_WRITE_MAX,
    QSD_LIM_N,
};
/* QEMU's names of the limits, in the order above. */
extern const char *const QSD_LIMIT_KEYS[QSD_LIM_N];
/* QEMU's THROTTLE_VALUE_MAX: larger limits are refused. */
#define QSD_LIMIT_MAX 1000000000000000ull
struct qsd_limits {
    uint64_t v[QSD_LIM_N];
};
/* The "limits" object of throttle-group (qom-set and --object): every
 * limit, 0 for unlimited, so a change also clears what it leaves out. */
json_t *qsd_limits_json(const struct qsd_limits *l);

struct qsd_opts {
    char *image;          /* absolute path of the image; NULL with rbd */
    char *format;         /* "qcow2" | "raw" (always raw with rbd) */
    struct qsd_rbd *rbd;  /* an RBD image instead of a file (rbdsrc.h), or NULL */
    unsigned num_queues;  /* 1..16, default 1 */
    unsigned logical_block_size; /* 512 | 4096, default 512 */
    bool read_only;
    char *cache;          /* none (default) | writeback | writethrough | directsync | unsafe */
    char *aio;            /* io_uring | native | threads; NULL: qsd_opts_aio()'s default */
    char *discard;        /* unmap (default) | ignore */
    char *detect_zeroes;  /* off (default) | on | unmap */
    bool iothread;        /* run the export in its own iothread (default true) */
    int socket_gid;       /* group owning the export dir and socket; -1: keep root */
    unsigned socket_mode; /* export socket mode, default 0660; never world bits */
    /* >0: also a FUSE export of the node (pod volumes, docs/pod-volumes.md)
     * on /dev/fuse open at this descriptor in the QSD, already mounted by
     * its starter (mountpoint /dev/fd/<n>: libfuse takes the descriptor as
     * is).  One start only: never recorded (qsd_opts_to_json). 0: none. */
    unsigned fuse_fd;
    struct qsd_limits limits; /* of the throttle group QSD_THROTTLE_GROUP */
};

void qsd_opts_init(struct qsd_opts *o); /* defaults; image/format unset */
void qsd_opts_clear(struct qsd_opts *o);
void qsd_opts_copy(struct qsd_opts *dst, const struct qsd_opts *src);
/* Set one option from its command-line/StorageClass spelling, e.g.
 * ("num-queues", "2"); the rbd- options are rbdsrc.h's.  Unknown keys and bad values: -EINVAL with a message. */
int qsd_opts_set(struct qsd_opts *o, const char *key, const char *value, char **ret_msg);
int qsd_opts_validate(const struct qsd_opts *o, char **ret_msg);
/* Whether the file is opened with O_DIRECT (cache none or directsync). */
bool qsd_opts_direct(const struct qsd_opts *o);
/* The I/O engine the file nodes use: the aio option if set, else native
 * (Linux AIO; it needs O_DIRECT) for O_DIRECT exports that do not flush
 * every write (raw with cache none), io_uring for the others (why: qsdopts.c).
 * The options record (qsd_opts_to_json) holds this resolved value. */
const char *qsd_opts_aio(const struct qsd_opts *o);
json_t *qsd_opts_to_json(const struct qsd_opts *o);
int qsd_opts_from_json(json_t *j, struct qsd_opts *ret, char **ret_msg);

struct qsd_paths {
    char *run_dir;
    char *export_dir; /* run/exports/<vol>: bind-mounted (read-only) into pods */
    char *socket;     /* export_dir/vhost.sock */
    char *meta;       /* export_dir/volume.json */
    char *ro_dir;     /* run/exports-ro/<vol>: the read-only export of a
                         read-write volume (for read-only publications) */
    char *ro_socket;  /* ro_dir/vhost.sock */
    char *ctl_dir;    /* run/ctl/<vol>: private */
    char *qmp;        /* ctl_dir/qmp.sock */
    char *state;      /* ctl_dir/qsd.json */
    char *log;        /* ctl_dir/qsd.log */
    char *lock;       /* ctl_dir/lock */
    char *rbd_key;    /* ctl_dir/rbd.key: an RBD volume's key (rbdsrc.h) */
    char *rbd_conf;   /* ctl_dir/rbd.conf: its Ceph configuration (rbdsrc.h) */
    char *upstream;    /* ctl_dir/vhost.sock: the QSD's own export socket when the
                          vhost-user filter serves `socket` (private) */
    char *ro_upstream; /* ctl_dir/vhost-ro.sock: the same for `ro_socket` */
};
/* volume must already be validated (names.h). */
void qsd_paths_init(const char *run_dir, const char *volume, struct qsd_paths *ret);
void qsd_paths_clear(struct qsd_paths *p);

/* Whether the export flushes every write (its "writethrough" option):
 * false for raw images, true for qcow2 (why: qsdopts.c). */
bool qsd_export_writethrough(const struct qsd_opts *o);
/* NULL-terminated argv for the QSD (free with qsd_argv_free): its exports
 * serve the tenant-facing sockets directly. */
char **qsd_argv(const char *binary, const struct qsd_opts *o, const struct qsd_paths *p);
/* The argv of a volume's process unit: with filter (qsd-vhost-filter) the
 * filter's head serving the tenant-facing sockets, which forks the QSD whose
 * exports listen on the private upstream sockets (`filter ... -- qsd-argv`);
 * with filter NULL, qsd_argv(). */
char **qsd_unit_argv(const char *filter, const char *binary, const struct qsd_opts *o,
                     const struct qsd_paths *p);
void qsd_argv_free(char **argv);
/* The image's two nodes as QSD is given them (--blockdev or blockdev-add). */
json_t *qsd_file_node_json(const struct qsd_opts *o, const char *node, const char *filename);
json_t *qsd_format_node_json(const struct qsd_opts *o, const char *node, const char *format,
                             const char *file_node);

/* Node names inside every QSD we start.  A read-write volume has two
 * vhost-user-blk exports of its node: QSD_EXPORT_ID (writable) and
 * QSD_RO_EXPORT_ID (writable=false, the guest gets VIRTIO_BLK_F_RO), each in
 * a directory of its own, so that a read-only publication is read-only
 * whatever the consuming pod does.  A read-only volume has only the first. */
#define QSD_NODE "vol"
/* Every export serves QSD_THROTTLE_NODE, a throttle filter over the top
 * layer (QSD_NODE at start, an overlay after a thin snapshot:
 * blockdev-snapshot moves the filter's child with the rest of the top's
 * parents), in the throttle group QSD_THROTTLE_GROUP whose limits are
 * changed live (qom-set). */
#define QSD_THROTTLE_NODE "qos"
#define QSD_THROTTLE_GROUP "tg0"
#define QSD_EXPORT_ID "exp0"
#define QSD_RO_EXPORT_ID "exp-ro"
#define QSD_EXPORT_FILES {"vhost.sock", "volume.json", NULL}
#define QSD_FUSE_EXPORT_ID "fuse0"
/* The descriptor a pod volume's QSD gets its /dev/fuse at (proc_spawn's
 * keep_fd): above the program at 3 (qsd-vhost-filter). */
#define QSD_FUSE_FD 4

/* s with every ',' doubled: QEMU's comma-separated option syntax (the
 * monitor's socket path on the command line).  Malloc'd. */
char *qsd_opt_escape(const char *s);

/* The node's settings for every volume's QSD. */
struct qsd_config {
    const char *run_dir;
    const char *binary;        /* qemu-storage-daemon (PATH searched) */
    const char *filter;        /* qsd-vhost-filter in front of every export, or
                                  NULL: tenants talk to the QSD directly */
    uint64_t start_timeout_ms; /* spawn -> socket accepting; default 10 s */
    uint64_t stop_timeout_ms;  /* QMP quit -> exit, then SIGKILL; default 5 s */
    const int *join_fds;       /* cgroup.procs files a QSD joins before exec (cgroup.h) */
    size_t n_join;
    /* Confinement (qsdconf.h): each volume's QSD runs as a uid of its own
     * from [uid_base, uid_base + uid_count); uid_count 0: unconfined. */
    uint32_t uid_base, uid_count;
    const char *const *hidden; /* more paths QSDs must not see (NULL-terminated) */
    /* A cgroup per QSD (qsdconf.h): <cgroup>/vol-<volume> under cgroup_root
     * with these limits (0: leave), joined instead of join_fds; NULL: none. */
    const char *cgroup_root, *cgroup;
    unsigned vol_cpu_weight;
    uint64_t vol_memory_max, vol_pids_max;
};
