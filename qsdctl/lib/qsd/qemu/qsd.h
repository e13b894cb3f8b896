/* qsd/qemu/qsd.h: one qemu-storage-daemon (QSD) per volume: options, paths, spawn,
 * readiness, supervision, graceful stop and adoption.
 *
 *   qsd_opts    the export's tunables, validated by qsd_opts_validate()
 *   qsd_paths   the per-volume runtime layout (docs/runtime-layout.md)
 *   qsd_argv    the QSD command line (pure; unit-tested)
 *   struct qsd  a live QSD on a loop: start (bounded wait until every export
 *               socket accepts, qsd/base/probe.h; spawned in its own session and, when
 *               configured, its own cgroup), pidfd watch, restart on death
 *               on the same socket path (with backoff, then a crash-loop
 *               state), stop (QMP quit, SIGKILL after a bound, and a bound
 *               on that too), adopt a QSD left running by an earlier
 *               controller (recorded, or found by its monitor socket).
 * The state file ctl/<volume>/qsd.json records the options, the pid and its
 * start time (so a recycled pid is never adopted) and the desired state.  The
 * export directories are handled through directory fds (fsat.h).  The state
 * file and volume.json are replaced atomically but never fsync'ed: they
 * describe processes, which a crash of the machine ends too, and they are
 * written on the caller's event loop. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "qsd/base/loop.h"

struct qsd_rbd;
struct qmp_sync;
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
 * every write (raw with cache none), io_uring for the others (why: qsd.c).
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
 * false for raw images, true for qcow2 (why: qsd.c). */
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
#define QSD_EXPORT_ID "exp0"
#define QSD_RO_EXPORT_ID "exp-ro"
#define QSD_EXPORT_FILES {"vhost.sock", "volume.json", NULL}

/* Open an export directory of volume beneath run_dir without following
 * symlinks (fsat.h): ro selects exports-ro/.  O_PATH descriptor. */
int qsd_export_dir_open(const char *run_dir, const char *volume, bool ro, int *ret_fd);
/* Remove what a volume's QSD leaves under run_dir: both export directories
 * (only the names the QSD and the plugin create there, never recursively)
 * and the private control directory. */
int qsd_remove_runtime(const char *run_dir, const char *volume);

/* ---- a live QSD ---- */
struct qsd;
enum qsd_event { QSD_EV_READY, QSD_EV_DIED, QSD_EV_RESTARTED, QSD_EV_START_FAILED, QSD_EV_STOPPED,
                 QSD_EV_CRASH_LOOP };
typedef void (*qsd_event_cb)(struct qsd *q, enum qsd_event ev, const char *detail, void *opaque);
/* status 0 or negative errno; msg says what happened (may be NULL on success). */
typedef void (*qsd_done_cb)(struct qsd *q, int status, const char *msg, void *opaque);

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

/* The vhost-user filter every export is served through (docs/security.md):
 * explicit (a flag) if given, else $QSD_VHOST_FILTER, else qsd-vhost-filter
 * beside the running executable.  "none" sets *ret NULL (tenants then talk to
 * the QSD directly: for measurements and debugging only).  -ENOENT with a
 * message when nothing is found or the file is not executable. */
int qsd_filter_resolve(const char *explicit, char **ret, char **ret_msg);

int qsd_new(struct loop *l, const struct qsd_config *cfg, const char *volume,
            const struct qsd_opts *opts, struct qsd **ret);
void qsd_free(struct qsd *q); /* does not stop the process */
const struct qsd_paths *qsd_get_paths(struct qsd *q);
const struct qsd_opts *qsd_get_opts(struct qsd *q);
const char *qsd_get_volume(struct qsd *q);
pid_t qsd_get_pid(struct qsd *q); /* the unit's head: the filter, or the QSD */
/* The qemu-storage-daemon process itself (the head's child when filtered),
 * for its I/O and CPU counters; 0 when there is none. */
pid_t qsd_get_qsd_pid(struct qsd *q);
bool qsd_running(struct qsd *q);
/* Died quickly several times in a row: retried only every 30 s. */
bool qsd_crash_looping(struct qsd *q);
/* "pid=N last_log=..." of its last unexpected exit, or NULL. */
const char *qsd_last_death(struct qsd *q);
/* Neither running nor on its way (never started, or stopped for good). */
bool qsd_idle(struct qsd *q);
unsigned qsd_restart_count(struct qsd *q);
/* Kill a running QSD that does not serve (SIGKILL by pidfd); reason goes
 * into the death's detail (QSD_EV_DIED, qsd_last_death).  Its exit is then
 * handled like any death: restarted when supervised.  -ESRCH when not
 * running, -EALREADY when already killed and not yet gone. */
int qsd_kill_hung(struct qsd *q, const char *reason);
/* Times qsd_kill_hung killed it. */
unsigned qsd_hung_kill_count(struct qsd *q);
void qsd_set_event_handler(struct qsd *q, qsd_event_cb cb, void *opaque);
/* Restart on death (true by default for started/adopted QSDs). */
void qsd_set_supervised(struct qsd *q, bool on);

/* Create the directories, write the state file (desired=running), spawn, and
 * call done when the export socket accepts (or on failure: the QSD's own
 * error message from its log is in msg). */
int qsd_start(struct qsd *q, qsd_done_cb done, void *opaque);
/* Adopt the running QSD of this volume: the one recorded in the state file
 * if it is alive and really ours, else any process serving this volume's
 * QMP socket path (found in /proc: a starter killed before it recorded the
 * pid), whatever the recorded desired state; a second one is killed.  One
 * still starting is probed like a restart.  0: adopted; -ESRCH: none. */
int qsd_adopt(struct qsd *q);
/* Stop (qsd_stop_sync) every running QSD of cfg->run_dir for which keep()
 * says false; returns how many were found. */
int qsd_stop_orphans(const struct qsd_config *cfg,
                     bool (*keep)(const char *volume, pid_t pid, void *arg), void *arg);
/* Mark desired=stopped, ask QSD to quit over QMP, SIGKILL after the bound,
 * remove the socket and the metadata.  done is called when the process is
 * gone, or with -ETIMEDOUT when it is still there 5 s after SIGKILL (stuck in
 * the kernel; calling qsd_stop again kills and waits again). */
int qsd_stop(struct qsd *q, qsd_done_cb done, void *opaque);

/* Change the group that may connect (export directory, socket, metadata)
 * of a started or adopted QSD, and record it so restarts and adoption keep
 * it.  gid -1: root only. */
int qsd_set_socket_group(struct qsd *q, int gid);

/* Bound the QSD's log while it runs (a tenant can make its QSD log at will:
 * malformed vhost-user messages): past 1 MiB it is cut to its last lines.
 * 1 when it was cut.  Call it periodically. */
int qsd_log_trim(struct qsd *q);

/* Write the exports' metadata files (volume.json, through directory fds)
 * with the given size. */
int qsd_write_meta(struct qsd *q, uint64_t size);
int qsd_meta_write(const struct qsd_paths *p, const char *volume, const struct qsd_opts *o,
                   uint64_t size);

/* Read the state file of a volume (NULL-safe).  ret_desired_running tells the
 * desired state; ret_pid and ret_starttime the recorded process. */
int qsd_read_state(const char *state_path, struct qsd_opts *ret_opts, bool *ret_desired_running,
                   pid_t *ret_pid, uint64_t *ret_starttime);
/* Is pid alive, started at starttime, and a QSD serving this qmp path? */
bool qsd_pid_is_ours(pid_t pid, uint64_t starttime, const char *qmp_path);

/* Synchronous helpers for the CLI: run the async operation on a private loop.
 * qsd_start_sync with ret_qmp also returns a connection to the new QSD's
 * monitor (qmp_sync_close() it: the monitor serves one client at a time),
 * made before the readiness probe's connections are closed.  QSD 10.0.2
 * closes the socket of a vhost-user client that disconnects twice (libvhost-
 * user's vu_deinit, then the channel's finalize; seen with strace); the
 * second close hits whatever descriptor another QSD thread got that number
 * in between: a monitor connection accepted just after the probe hung up
 * ("QMP connection broken" in qsdctl export).  A monitor connection already
 * accepted while the probe's is open cannot have that number.  When the
 * monitor does not answer, the start fails and the QSD is killed. */
int qsd_start_sync(const struct qsd_config *cfg, const char *volume, const struct qsd_opts *opts,
                   pid_t *ret_pid, struct qmp_sync **ret_qmp, char **ret_msg);
int qsd_stop_sync(const struct qsd_config *cfg, const char *volume, char **ret_msg);
