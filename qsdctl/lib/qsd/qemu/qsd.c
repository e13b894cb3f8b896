/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/qsd.c: the supervisor of a volume's QSD on an event loop: start
 * (spawn, confined, in its own session and cgroup; readiness), the pidfd
 * watch, restart on death with backoff, graceful stop, adoption, and the
 * synchronous wrappers for the CLI.  See qsd.h. */
#include "qsd/qemu/qsd.h"
#include "qsd/base/fsat.h"
#include "qsd/base/log.h"
#include "qsd/base/names.h"
#include "qsd/base/probe.h"
#include "qsd/base/proc.h"
#include "qsd/qemu/qmpcmd.h"
#include "qsd/qemu/qsdconf.h"
#include "qsd/qemu/qsdlog.h"
#include "qsd/base/util.h"
#include "qsd/vhost/vhost_user.h"

#include <fcntl.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* ----------------------------------------------------------- live QSD */

enum qsd_state { QS_IDLE, QS_STARTING, QS_RUNNING, QS_BACKOFF, QS_STOPPING, QS_STOPPED };

/* A QSD that died this many times within CRASH_WINDOW_MS of its start, in a
 * row, is in a crash loop: retried every CRASH_LOOP_RETRY_MS only. */
#define CRASH_LOOP_AFTER 5
#define CRASH_WINDOW_MS 10000
#define CRASH_LOOP_RETRY_MS 30000
/* After SIGKILL, how long a process may take to go (D state) before the stop
 * is reported as failed. */
#define KILL_WAIT_MS 5000

struct qsd {
    struct loop *loop;
    struct qsd_config cfg;
    char *volume;
    struct qsd_opts opts;
    struct qsd_paths paths;
    enum qsd_state state;
    pid_t pid;
    pid_t qsd_pid;              /* the filter head's QSD child (qsd_get_qsd_pid) */
    uint64_t starttime;
    int pidfd;
    struct loop_watch *pid_watch;
    struct loop_timer *timer;   /* probe, backoff or stop deadline */
    uint64_t deadline_ms;
    uint64_t started_at_ms;
    bool supervised;
    bool restarting;
    bool adopted;               /* the process was adopted, not spawned by us */
    unsigned restarts, recent_failures;
    struct qmp *qmp;            /* only while stopping */
    int fail_status;            /* start failed: reported once the process is gone */
    char *fail_msg;
    qsd_done_cb done;
    void *done_opaque;
    qsd_event_cb event_cb;
    void *event_opaque;
    int exec_fd;                /* exec error of the last spawn (proc_spawn), until ready */
    bool hold_probe;            /* keep the readiness probe's connections open (start_sync) */
    int probe_fds[2];           /* those connections (rw, ro export) or -1 */
    bool probe_settling;        /* a first start's probe closed: waiting for QSD's side */
    uint64_t settle_until_ms;   /* ... at most until then (PROBE_SETTLE_MS) */
    pid_t pgid;                 /* the spawned unit's process group (its own session) */
    struct qsdlog log;          /* the QSD's stdout/stderr into paths.log */
    char *last_death;           /* "pid=... last_log=..." of the last unexpected exit */
    bool killed;                /* SIGKILL sent by a stop */
    char *hung_kill;            /* why the running process was killed as hung (qsd_kill_hung) */
    unsigned hung_kills;
    int fuse_fd;                /* /dev/fuse for the next spawn only (qsd_set_fuse_fd) */
};

int qsd_new(struct loop *l, const struct qsd_config *cfg, const char *volume,
            const struct qsd_opts *opts, struct qsd **ret)
{
    struct qsd *q = xcalloc(1, sizeof(*q));
    q->loop = l;
    q->cfg = *cfg;
    q->cfg.run_dir = xstrdup(cfg->run_dir);
    q->cfg.binary = xstrdup(cfg->binary ? cfg->binary : "qemu-storage-daemon");
    q->cfg.filter = cfg->filter ? xstrdup(cfg->filter) : NULL;
    if (!q->cfg.start_timeout_ms)
        q->cfg.start_timeout_ms = 10000;
    if (!q->cfg.stop_timeout_ms)
        q->cfg.stop_timeout_ms = 5000;
    q->volume = xstrdup(volume);
    if (opts)
        qsd_opts_copy(&q->opts, opts);
    else
        qsd_opts_init(&q->opts);
    qsd_paths_init(cfg->run_dir, volume, &q->paths);
    qsdlog_init(&q->log, l, q->paths.log);
    q->pidfd = -1;
    q->exec_fd = -1;
    q->probe_fds[0] = q->probe_fds[1] = -1;
    q->fuse_fd = -1;
    q->supervised = true;
    *ret = q;
    return 0;
}

static void release_process(struct qsd *q)
{
    loop_watch_remove(q->pid_watch);
    q->pid_watch = NULL;
    if (q->pidfd >= 0)
        close(q->pidfd);
    q->pidfd = -1;
    closep(&q->exec_fd);
    q->exec_fd = -1;
    qsdlog_stop(&q->log);
}

static void release_probe(struct qsd *q)
{
    for (int i = 0; i < 2; i++) {
        closep(&q->probe_fds[i]);
        q->probe_fds[i] = -1;
    }
}

void qsd_set_fuse_fd(struct qsd *q, int fd)
{
    closep(&q->fuse_fd);
    q->fuse_fd = fd;
}

void qsd_free(struct qsd *q)
{
    if (!q)
        return;
    release_process(q);
    release_probe(q);
    loop_timer_cancel(q->timer);
    qmp_close(q->qmp);
    free(q->fail_msg);
    free(q->last_death);
    free(q->hung_kill);
    free((char *)q->cfg.run_dir);
    free((char *)q->cfg.binary);
    free((char *)q->cfg.filter);
    free(q->volume);
    qsd_opts_clear(&q->opts);
    closep(&q->fuse_fd);
    qsdlog_clear(&q->log);
    qsd_paths_clear(&q->paths);
    free(q);
}

const struct qsd_paths *qsd_get_paths(struct qsd *q) { return &q->paths; }
const struct qsd_opts *qsd_get_opts(struct qsd *q) { return &q->opts; }
const char *qsd_get_volume(struct qsd *q) { return q->volume; }
pid_t qsd_get_pid(struct qsd *q) { return q->pid; }
pid_t qsd_get_qsd_pid(struct qsd *q)
{
    if (!q->pid || !q->cfg.filter)
        return q->pid;
    /* The head's only child: remembered, checked again on every call. */
    uint64_t ppid;
    if (q->qsd_pid && proc_stat_fields(q->qsd_pid, 4, 1, &ppid) == 0 && ppid == (uint64_t)q->pid)
        return q->qsd_pid;
    q->qsd_pid = 0;
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        uint64_t pid;
        if (parse_uint(de->d_name, 2, INT32_MAX, &pid) == 0 &&
            proc_stat_fields((pid_t)pid, 4, 1, &ppid) == 0 && ppid == (uint64_t)q->pid) {
            q->qsd_pid = (pid_t)pid;
            break;
        }
    }
    closedir(d);
    return q->qsd_pid;
}
bool qsd_running(struct qsd *q) { return q->state == QS_RUNNING; }
bool qsd_crash_looping(struct qsd *q)
{
    return q->state == QS_BACKOFF && q->recent_failures >= CRASH_LOOP_AFTER;
}
const char *qsd_last_death(struct qsd *q) { return q->last_death; }
bool qsd_idle(struct qsd *q) { return q->state == QS_IDLE || q->state == QS_STOPPED; }
unsigned qsd_restart_count(struct qsd *q) { return q->restarts; }
unsigned qsd_hung_kill_count(struct qsd *q) { return q->hung_kills; }
void qsd_set_supervised(struct qsd *q, bool on) { q->supervised = on; }
void qsd_set_event_handler(struct qsd *q, qsd_event_cb cb, void *opaque)
{
    q->event_cb = cb;
    q->event_opaque = opaque;
}

static void emit(struct qsd *q, enum qsd_event ev, const char *detail)
{
    if (q->event_cb)
        q->event_cb(q, ev, detail, q->event_opaque);
}

static void finish(struct qsd *q, int status, const char *msg)
{
    qsd_done_cb done = q->done;
    void *opaque = q->done_opaque;
    q->done = NULL;
    q->done_opaque = NULL;
    if (done)
        done(q, status, msg, opaque);
}

int qsd_log_trim(struct qsd *q)
{
    return qsdlog_trim(q->paths.log);
}

static void on_process_exit(struct loop *l, int fd, uint32_t revents, void *opaque);
static void on_probe(struct loop *l, void *opaque);

/* Spawn the unit's argv with stdout and stderr on logfd.  Confined
 * (qsdconf.h): its own uid, no capabilities, no_new_privs, a mount namespace
 * of its own, the QSD seccomp profile.  Its own session, so the plugin's
 * signals and death do not reach it; sockets created rw for owner and group
 * only; its own cgroup when one is configured, joined before exec (never a
 * moment in the plugin's). */
static int spawn_unit(struct qsd *q, char **argv, int logfd, pid_t *ret_pid, int *ret_pidfd,
                      int *ret_execfd)
{
    struct qsd_confinement qc;
    _cleanup_free_ char *cmsg = NULL;
    int r = qsd_confine_for(&q->cfg, q->volume, &q->opts, &q->paths, &qc, &cmsg);
    if (r < 0) {
        log_warn("qsd", "cannot confine the QSD", "volume=%s error=\"%s\"", q->volume,
                 cmsg ? cmsg : strerror(-r));
        qsd_confinement_clear(&qc);
        return r;
    }
    struct proc_spawn sp = PROC_SPAWN_INIT;
    sp.argv = argv;
    sp.stdout_fd = logfd;
    sp.stderr_fd = logfd;
    sp.new_session = true;
    sp.umask = 0117;
    sp.join_fds = q->cfg.join_fds;
    sp.n_join = q->cfg.n_join;
    /* Behind the filter, the head is spawned with the volume's identity and
     * mount namespace; it installs the seccomp profiles itself after its
     * fork: QSD in the child, FILTER in itself (qsd-vhost-filter). */
    if (q->cfg.filter) {
        qc.c.profile = CONFINE_PROFILE_NONE;
        sp.program_fd3 = q->cfg.binary;
    }
    /* A cgroup of its own (its memory, tasks and CPU weight) when the QSDs'
     * parent group is configured; else (or if it cannot be made) the
     * parent's. */
    struct qsd_cgroup vcg = {0};
    _cleanup_free_ char *gmsg = NULL;
    int g = qsd_cgroup_for(&q->cfg, q->volume, &vcg, &gmsg);
    if (g == 0) {
        sp.join_fds = vcg.fds;
        sp.n_join = vcg.n;
    } else if (g != -ENOENT) {
        log_warn("qsd", "cannot make the QSD's own cgroup: it runs in the QSDs' group",
                 "volume=%s error=\"%s\"", q->volume, gmsg ? gmsg : strerror(-g));
    }
    sp.confine = q->cfg.uid_count ? &qc.c : NULL;
    if (q->opts.fuse_fd) {
        sp.keep_fd = q->fuse_fd;
        sp.keep_fd_at = (int)q->opts.fuse_fd;
    }
    r = proc_spawn(&sp, ret_pid, ret_pidfd, ret_execfd);
    qsd_cgroup_close(&vcg);
    qsd_confinement_clear(&qc);
    return r;
}

static int spawn(struct qsd *q)
{
    static const char *const sock[] = {"vhost.sock", NULL};
    qsd_export_unlink(&q->paths, q->volume, q->opts.read_only, sock);
    unlink(q->paths.qmp);
    unlink(q->paths.upstream);
    unlink(q->paths.ro_upstream);
    qsdlog_mark_spawn(q->paths.log);
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) < 0)
        return -errno;
    /* A FUSE export for this start only: a later one (a restart by the
     * supervisor) has no mounted /dev/fuse to serve (qsd_set_fuse_fd). */
    q->opts.fuse_fd = q->fuse_fd >= 0 ? QSD_FUSE_FD : 0;
    char **argv = qsd_unit_argv(q->cfg.filter, q->cfg.binary, &q->opts, &q->paths);
    pid_t pid;
    int pidfd, execfd;
    int r = spawn_unit(q, argv, pipefd[1], &pid, &pidfd, &execfd);
    q->opts.fuse_fd = 0;
    closep(&q->fuse_fd);
    q->fuse_fd = -1;
    close(pipefd[1]);
    qsd_argv_free(argv);
    if (r < 0) {
        close(pipefd[0]);
        return r;
    }
    qsdlog_watch(&q->log, pipefd[0]); /* closes a previous life's */
    q->exec_fd = execfd;
    q->adopted = false;
    q->pid = pid;
    q->pgid = pid; /* spawn_unit: a session (and process group) of its own */
    q->probe_settling = false;
    q->pidfd = pidfd;
    q->starttime = 0;
    proc_starttime(pid, &q->starttime);
    q->started_at_ms = now_ms();
    q->pid_watch = loop_watch_fd(q->loop, pidfd, POLLIN, on_process_exit, q);
    r = qsd_state_write(&q->paths, q->volume, &q->opts, true, pid, q->starttime);
    if (r < 0)
        log_warn("qsd", "cannot record state", "volume=%s err=%s", q->volume, strerror(-r));
    q->state = QS_STARTING;
    q->deadline_ms = now_ms() + q->cfg.start_timeout_ms;
    q->timer = loop_timer_add(q->loop, 2, on_probe, q);
    return 0;
}

struct access {
    int gid;
    unsigned mode;
};

static int set_socket_access_at(int dfd, bool ro, void *arg)
{
    const struct access *a = arg;
    return fsat_chown_mode(dfd, "vhost.sock", a->gid, a->mode);
}

static void set_socket_access(struct qsd *q)
{
    struct access a = {q->opts.socket_gid, q->opts.socket_mode};
    int r = qsd_each_export_dir(&q->paths, q->volume, q->opts.read_only, set_socket_access_at, &a);
    if (r < 0)
        log_warn("qsd", "cannot set the export socket's group and mode", "volume=%s error=\"%s\"",
                 q->volume, strerror(-r));
}

/* Every export of q is listening (no connection made: a client may be
 * reconnecting to it). */
static bool exports_listening(struct qsd *q)
{
    if (q->cfg.filter && (unix_socket_listening(q->paths.upstream) != 1 ||
                          (!q->opts.read_only && unix_socket_listening(q->paths.ro_upstream) != 1)))
        return false;
    return unix_socket_listening(q->paths.socket) == 1 &&
           (q->opts.read_only || unix_socket_listening(q->paths.ro_socket) == 1);
}

static int probe_export_at(int dfd, bool ro, void *arg)
{
    return probe_socket_at(dfd, "vhost.sock");
}

static int probe_hold_at(int dfd, bool ro, void *arg)
{
    struct qsd *q = arg;
    return probe_connect_at(dfd, "vhost.sock", &q->probe_fds[ro]);
}

/* Every export of q accepts a connection (probe.h; the export directories
 * are opened beneath the run directory and nothing in them is followed).
 * With hold_probe the connections stay open in probe_fds until
 * release_probe(): see qsd_start_sync() for why. */
static bool exports_accept(struct qsd *q)
{
    int (*probe)(int, bool, void *) = q->hold_probe ? probe_hold_at : probe_export_at;
    release_probe(q);
    /* Behind the filter, its sockets exist only once the QSD's listen
     * (qsd-vhost-filter's head waits for them), and the filter connects to
     * the QSD for each connection it accepts: this probe is the QSD's first
     * client too. */
    if (qsd_each_export_dir(&q->paths, q->volume, q->opts.read_only, probe, q) == 0)
        return true;
    release_probe(q);
    return false;
}

/* The QSD's own listening sockets (behind the filter, its upstream ones):
 * where the QSD's side of every connection shows in /proc/net/unix. */
static int qsd_side_connections(struct qsd *q)
{
    const char *rw = q->cfg.filter ? q->paths.upstream : q->paths.socket;
    const char *ro = q->cfg.filter ? q->paths.ro_upstream : q->paths.ro_socket;
    int n = unix_socket_connections(rw);
    int m = q->opts.read_only || n < 0 ? 0 : unix_socket_connections(ro);
    return n < 0 ? n : m < 0 ? m : n + m;
}

/* Has the back-end answered the GET_FEATURES sent on fd?  1 yes, 0 not yet,
 * negative errno when the connection was closed or answered otherwise. */
static int probe_answered(int fd)
{
    struct vhost_user_hdr h;
    ssize_t n = recv(fd, &h, sizeof(h), MSG_PEEK | MSG_DONTWAIT);
    if (n < 0)
        return errno == EAGAIN || errno == EINTR ? 0 : -errno;
    if (n == 0)
        return -ECONNRESET;
    if ((size_t)n < sizeof(h))
        return 0;
    return h.request == VHOST_USER_GET_FEATURES && (h.flags & VHOST_USER_REPLY_MASK) ? 1
                                                                                   : -EPROTO;
}

/* One step of a first start's readiness probe; true once the QSD is ready.
 * QSD 10.0.2 closes a hung-up vhost-user client's descriptor twice, the
 * second time from the export's thread, after its main loop may have given
 * the number to a new connection; when that lands between the accept and
 * its fcntl()s, QSD aborts ("qemu_socket_set_nonblock: Assertion `f == 0'
 * failed").  The old probe (connect and hang up the read-write export, then
 * the read-only one) did that to 2 of about 1,300 starts here, and to 16 of
 * 60 with close() and accept4() slowed by 3 ms (strace); this one to none
 * of 60 so slowed.  So the probe never hangs up while another connection
 * can be accepted:
 *  1. once every export listens, connect to each and send GET_FEATURES;
 *  2. every export answered: the QSD has accepted and serves each
 *     connection (it is also each export's first client: docs/qemu-11.md
 *     row 2).  With hold_probe the caller closes them (qsd_start_sync);
 *  3. else close them and wait until the QSD has closed its side of each,
 *     so that the caller's next connection (a status query's monitor, a VM)
 *     does not meet a hang-up in progress.  A QSD that keeps a side open
 *     past PROBE_SETTLE_MS is ready anyway (on_probe). */
/* How long step 3 waits for the QSD to close its side of the probe's
 * connections (it does in microseconds; other clients' sides stay open). */
#define PROBE_SETTLE_MS 500

static bool probe_step(struct qsd *q)
{
    if (q->probe_settling)
        return qsd_side_connections(q) <= 0;
    if (q->probe_fds[0] < 0) {
        if (!exports_listening(q))
            return false;
        struct vhost_user_hdr h = {VHOST_USER_GET_FEATURES, VHOST_USER_VERSION, 0};
        bool sent = qsd_each_export_dir(&q->paths, q->volume, q->opts.read_only,
                                        probe_hold_at, q) == 0;
        for (int i = 0; sent && i < 2; i++)
            sent = q->probe_fds[i] < 0 ||
                   send(q->probe_fds[i], &h, sizeof(h), MSG_NOSIGNAL | MSG_DONTWAIT) ==
                       (ssize_t)sizeof(h);
        if (!sent)
            release_probe(q);
        return false;
    }
    for (int i = 0; i < 2; i++) {
        int r = q->probe_fds[i] < 0 ? 1 : probe_answered(q->probe_fds[i]);
        if (r < 0)
            release_probe(q); /* refused or closed: again from step 1 */
        if (r <= 0)
            return false;
    }
    if (q->hold_probe)
        return true;
    release_probe(q);
    q->probe_settling = true;
    q->settle_until_ms = now_ms() + PROBE_SETTLE_MS;
    return qsd_side_connections(q) <= 0;
}

static void on_probe(struct loop *l, void *opaque)
{
    struct qsd *q = opaque;
    q->timer = NULL;
    /* Ready = every export serves a connection (probe_step).  This must be
     * a real connection, not just a look at /proc/net/unix: QSD 10.0.2
     * segfaults on block_resize (its config-change notification) when no
     * vhost-user client has ever connected to the export; the probe
     * connection initialises that state (measured: SIGSEGV every time
     * without it, never with it).  A restart's or an adoption's exports may
     * have a reconnecting VM as their client already, which the probe must
     * not wait for: a plain connection is the probe there. */
    bool ready = q->restarting ? exports_accept(q) : probe_step(q);
    /* It served every probe but keeps a side open (a client of its own,
     * such as a VM that reconnected as the plugin restarted it): ready all
     * the same once the probe's hang-ups had their time. */
    ready |= q->probe_settling && now_ms() >= MIN(q->settle_until_ms, q->deadline_ms);
    if (ready) {
        q->probe_settling = false;
        closep(&q->exec_fd);
        q->exec_fd = -1;
        set_socket_access(q);
        q->state = QS_RUNNING;
        q->recent_failures = 0;
        if (q->restarting && q->adopted) {
            /* Adopted before its exports were seen listening (its sockets
             * are in another network namespace's /proc/net/unix, e.g. a
             * new plugin pod's): the same process, not a restart. */
            q->restarting = false;
            emit(q, QSD_EV_READY, "adopted");
        } else if (q->restarting) {
            q->restarting = false;
            q->restarts++;
            char d[64];
            snprintf(d, sizeof(d), "pid=%d", (int)q->pid);
            emit(q, QSD_EV_RESTARTED, d);
        } else {
            emit(q, QSD_EV_READY, NULL);
        }
        finish(q, 0, NULL);
        return;
    }
    if (now_ms() >= q->deadline_ms) {
        /* Never became ready: kill it, the whole unit (a filter head's QSD
         * too): its process group, while its leader is our unreaped child. */
        pidfd_signal(q->pidfd, SIGKILL);
        if (!q->adopted && q->pgid > 0)
            kill(-q->pgid, SIGKILL);
        release_probe(q);
        _cleanup_free_ char *tail = qsdlog_tail(q->paths.log);
        char *msg =
            xasprintf("export socket %s did not accept connections within %llu ms (QSD log: %s)",
                      q->paths.socket, (unsigned long long)q->cfg.start_timeout_ms, tail);
        emit(q, QSD_EV_START_FAILED, msg);
        if (q->restarting) {
            /* A supervised restart: on_process_exit tries again, with backoff. */
            free(msg);
            return;
        }
        /* A first start: report once the process is really gone (on_process_exit). */
        q->state = QS_STOPPING;
        q->supervised = false;
        q->fail_status = -ETIMEDOUT;
        q->fail_msg = msg;
        return;
    }
    q->timer = loop_timer_add(q->loop, 5, on_probe, q);
}

static void restart_now(struct loop *l, void *opaque)
{
    struct qsd *q = opaque;
    q->timer = NULL;
    q->restarting = true;
    int r = spawn(q);
    if (r < 0) {
        char d[128];
        snprintf(d, sizeof(d), "cannot spawn %s: %s", q->cfg.binary, strerror(-r));
        emit(q, QSD_EV_START_FAILED, d);
        q->recent_failures++;
        q->state = QS_BACKOFF;
        q->timer = loop_timer_add(q->loop, 1000, restart_now, q);
    }
}

static void reap(struct qsd *q)
{
    /* Reap if it is our child; ECHILD for an adopted process is expected. */
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    waitid(P_PIDFD, (id_t)q->pidfd, &si, WEXITED | WNOHANG);
}

/* The process of a stop (or of a start that failed and was killed) is gone. */
static void stop_done(struct qsd *q)
{
    qmp_close(q->qmp);
    q->qmp = NULL;
    q->state = QS_STOPPED;
    qsd_cgroup_release(&q->cfg, q->volume);
    if (q->fail_status) {
        _cleanup_free_ char *msg = TAKE_PTR(q->fail_msg);
        int st = q->fail_status;
        q->fail_status = 0;
        finish(q, st, msg);
        return;
    }
    emit(q, QSD_EV_STOPPED, NULL);
    finish(q, 0, NULL);
}

/* A supervised QSD died (death: its detail): restart it.  Back off only when
 * it keeps dying quickly; past CRASH_LOOP_AFTER quick deaths in a row it is a
 * crash loop: reported, retried slowly. */
static void restart_later(struct qsd *q, const char *death)
{
    uint64_t delay = 0;
    if (now_ms() - q->started_at_ms < CRASH_WINDOW_MS) {
        if (q->recent_failures > 0)
            delay = MIN(100u << MIN(q->recent_failures - 1, 6u), 5000u);
        q->recent_failures++;
    } else {
        q->recent_failures = 0;
    }
    if (q->recent_failures >= CRASH_LOOP_AFTER) {
        delay = CRASH_LOOP_RETRY_MS;
        if (q->recent_failures == CRASH_LOOP_AFTER)
            emit(q, QSD_EV_CRASH_LOOP, death);
    }
    q->state = QS_BACKOFF;
    q->timer = loop_timer_add(q->loop, delay, restart_now, q);
}

static void on_process_exit(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    struct qsd *q = opaque;
    _cleanup_free_ char *hung = TAKE_PTR(q->hung_kill); /* qsd_kill_hung's reason */
    reap(q);
    qsdlog_drain(&q->log); /* its last words, for qsdlog_tail below */
    int exec_fd = TAKE_FD(q->exec_fd); /* read below, once the process is gone */
    release_process(q);
    q->exec_fd = exec_fd;
    loop_timer_cancel(q->timer);
    q->timer = NULL;
    pid_t dead = q->pid;
    q->pid = 0;

    if (q->state == QS_STOPPING) {
        stop_done(q);
        return;
    }

    int exec_err = proc_exec_error(q->exec_fd);
    _cleanup_free_ char *tail =
        exec_err ? xasprintf("cannot start qemu-storage-daemon: %s (executing %s, or joining "
                             "its cgroup, or confining it)", strerror(exec_err), q->cfg.binary)
                 : qsdlog_tail(q->paths.log);
    char d[900];
    if (hung)
        snprintf(d, sizeof(d), "pid=%d killed by the plugin, hung: %s; last_log=%s", (int)dead,
                 hung, tail);
    else
        snprintf(d, sizeof(d), "pid=%d last_log=%s", (int)dead, tail);
    free(q->last_death);
    q->last_death = xstrdup(d);
    bool was_starting = q->state == QS_STARTING;
    emit(q, QSD_EV_DIED, d);

    if (was_starting && q->done) {
        /* A first start failed: report, do not loop. */
        _cleanup_free_ char *msg =
            exec_err ? xstrdup(tail)
                     : xasprintf("qemu-storage-daemon exited during start-up: %s", tail);
        q->state = QS_STOPPED;
        qsd_cgroup_release(&q->cfg, q->volume);
        finish(q, exec_err ? -exec_err : -EIO, msg);
        return;
    }
    /* Respect the desired state: a stop by another process is not a crash. */
    bool desired = false;
    if (qsd_read_state(q->paths.state, NULL, &desired, NULL, NULL) < 0 || !desired ||
        !q->supervised) {
        q->state = QS_STOPPED;
        emit(q, QSD_EV_STOPPED, q->supervised ? "not restarted: desired state is stopped"
                                              : "not restarted: not supervised");
        return;
    }
    restart_later(q, d);
}

/* Health: a QSD that runs but no longer serves (its monitor does not
 * answer: a tenant's message can leave it so, e.g. SET_MEM_TABLE with 2^32-1
 * regions) is killed; its exit then takes the path of any death
 * (on_process_exit: restarted if supervised, reported QSD_EV_DIED with the
 * reason otherwise, which is how an RBD volume's QSD reaches the plugin's
 * checked restart).  The caller judges "hung" (csi/volstats.c: consecutive
 * probes); the kill is by pidfd, so never another process. */
int qsd_kill_hung(struct qsd *q, const char *reason)
{
    if (q->state != QS_RUNNING || q->pidfd < 0)
        return -ESRCH;
    if (q->hung_kill)
        return -EALREADY; /* killed, not yet gone (D state): its exit restarts it */
    int r = pidfd_signal(q->pidfd, SIGKILL);
    if (r < 0)
        return r;
    q->hung_kill = xstrdup(reason);
    q->hung_kills++;
    /* A hang is not a quick crash: it does not count towards a crash loop. */
    q->started_at_ms = 0;
    return 0;
}

int qsd_start(struct qsd *q, qsd_done_cb done, void *opaque)
{
    if (q->state == QS_STARTING || q->state == QS_RUNNING || q->state == QS_STOPPING)
        return -EBUSY;
    int r = qsd_runtime_prepare(q->cfg.run_dir, q->volume, &q->opts);
    if (r < 0)
        return r;
    r = qsd_state_write(&q->paths, q->volume, &q->opts, true, 0, 0);
    if (r < 0)
        return r;
    q->done = done;
    q->done_opaque = opaque;
    q->restarting = false;
    r = spawn(q);
    if (r < 0) {
        q->done = NULL;
        qsd_state_write(&q->paths, q->volume, &q->opts, false, 0, 0);
    }
    return r;
}

int qsd_adopt(struct qsd *q)
{
    pid_t pid = 0;
    uint64_t st = 0;
    struct qsd_opts opts;
    int r = qsd_read_state(q->paths.state, &opts, NULL, &pid, &st);
    if (r == 0) {
        qsd_opts_clear(&q->opts);
        q->opts = opts;
    } else if (r != -ENOENT) {
        return r;
    }
    /* The recorded pid, or whichever QSD serves this volume's monitor: a
     * plugin killed between spawn and record left it unrecorded.  A second
     * one (never wanted) is killed. */
    struct qsd_found f;
    qsd_find_units(q->cfg.run_dir, q->volume, &f);
    if (!qsd_pid_is_ours(pid, st, q->paths.qmp)) {
        pid = f.pid;
        st = f.starttime;
    }
    for (size_t i = 0; i < f.n_extra; i++) {
        if (f.extra[i] == pid)
            continue;
        int fd = pidfd_open_pid(f.extra[i]);
        if (fd >= 0) {
            log_warn("qsd", "killing a second QSD of a volume", "volume=%s pid=%d", q->volume,
                     (int)f.extra[i]);
            pidfd_signal(fd, SIGKILL);
            close(fd);
        }
    }
    qsd_found_clear(&f);
    if (!pid)
        return -ESRCH;
    int pidfd = pidfd_open_pid(pid);
    if (pidfd < 0)
        return -ESRCH;
    /* The pid could have been recycled between the check and pidfd_open. */
    if (!qsd_pid_is_ours(pid, st, q->paths.qmp)) {
        close(pidfd);
        return -ESRCH;
    }
    q->pid = pid;
    q->starttime = st;
    q->pidfd = pidfd;
    q->started_at_ms = now_ms();
    q->pid_watch = loop_watch_fd(q->loop, pidfd, POLLIN, on_process_exit, q);
    qsdlog_reopen(&q->log, pid);
    r = qsd_state_write(&q->paths, q->volume, &q->opts, true, pid, st);
    if (r < 0)
        log_warn("qsd", "cannot record state", "volume=%s err=%s", q->volume, strerror(-r));
    if (exports_listening(q)) {
        q->state = QS_RUNNING;
        return 0;
    }
    /* Adopted half-started: ready once its exports accept, like a restart
     * (killed and restarted if they never do). */
    q->state = QS_STARTING;
    q->restarting = true;
    q->adopted = true;
    q->deadline_ms = now_ms() + q->cfg.start_timeout_ms;
    q->timer = loop_timer_add(q->loop, 2, on_probe, q);
    return 0;
}

static void on_stop_deadline(struct loop *l, void *opaque)
{
    struct qsd *q = opaque;
    q->timer = NULL;
    if (!q->killed) {
        log_warn("qsd", "did not quit in time, killing", "volume=%s pid=%d", q->volume,
                 (int)q->pid);
        pidfd_signal(q->pidfd, SIGKILL);
        q->killed = true;
        /* Bound the wait for the kill too: a process in D state lingers. */
        q->timer = loop_timer_add(q->loop, KILL_WAIT_MS, on_stop_deadline, q);
        return;
    }
    /* Still there: stuck in the kernel.  The stop fails (the caller may try
     * again); the pidfd stays watched, its exit still finishes the stop. */
    _cleanup_free_ char *msg =
        xasprintf("qemu-storage-daemon pid %d of volume %s did not exit %u ms after SIGKILL "
                  "(stuck in the kernel: a hung disk or network storage?)",
                  (int)q->pid, q->volume, KILL_WAIT_MS);
    log_error("qsd", "did not die after SIGKILL", "volume=%s pid=%d", q->volume, (int)q->pid);
    finish(q, -ETIMEDOUT, msg);
}

static void on_stop_qmp(struct qmp *qmp, int status, const struct qmp_error *err, void *opaque)
{
    struct qsd *q = opaque;
    if (status == 0) {
        qmpc_quit_async(qmp, q->cfg.stop_timeout_ms); /* the exit (pidfd) ends the stop */
    } else if (q->state == QS_STOPPING && q->pidfd >= 0) {
        /* Monitor unusable: fall back to SIGTERM, which QSD also honours. */
        pidfd_signal(q->pidfd, SIGTERM);
    }
}

int qsd_stop(struct qsd *q, qsd_done_cb done, void *opaque)
{
    int r = qsd_state_write(&q->paths, q->volume, &q->opts, false, q->pid, q->starttime);
    if (r < 0 && r != -ENOENT)
        return r;
    loop_timer_cancel(q->timer);
    q->timer = NULL;
    static const char *const meta[] = {"volume.json", NULL}, *const all[] = QSD_EXPORT_FILES;
    qsd_export_unlink(&q->paths, q->volume, q->opts.read_only, meta);
    if (q->pidfd < 0) {
        q->state = QS_STOPPED;
        qsd_export_unlink(&q->paths, q->volume, q->opts.read_only, all);
        if (done)
            done(q, 0, NULL, opaque);
        return 0;
    }
    q->done = done;
    q->done_opaque = opaque;
    if (q->state == QS_STOPPING && q->killed) {
        /* A stop that already failed once: kill again, wait again. */
        pidfd_signal(q->pidfd, SIGKILL);
        q->timer = loop_timer_add(q->loop, KILL_WAIT_MS, on_stop_deadline, q);
        return 0;
    }
    q->state = QS_STOPPING;
    q->killed = false;
    qmp_close(q->qmp);
    q->qmp = NULL;
    r = qmp_connect(q->loop, q->paths.qmp, q->cfg.stop_timeout_ms, on_stop_qmp, q, &q->qmp);
    if (r < 0)
        pidfd_signal(q->pidfd, SIGTERM);
    q->timer = loop_timer_add(q->loop, q->cfg.stop_timeout_ms, on_stop_deadline, q);
    return 0;
}

static int regroup_at(int dfd, bool ro, void *arg)
{
    const struct access *a = arg;
    /* The socket is missing while a restart is under way: the restart
     * applies the new group (set_socket_access). */
    int r = fsat_chown_mode(dfd, "vhost.sock", a->gid, a->mode);
    if (r < 0 && r != -ENOENT)
        return r;
    r = fsat_chown_mode(dfd, "volume.json", a->gid, a->gid >= 0 ? 0640 : 0600);
    if (r < 0 && r != -ENOENT)
        return r;
    /* The directory itself: through its own descriptor. */
    if (fchownat(dfd, "", 0, a->gid >= 0 ? (gid_t)a->gid : 0, AT_EMPTY_PATH) < 0)
        return -errno;
    return 0;
}

int qsd_set_socket_group(struct qsd *q, int gid)
{
    q->opts.socket_gid = gid;
    int r = qsd_state_write(&q->paths, q->volume, &q->opts, true, q->pid, q->starttime);
    if (r < 0)
        return r;
    struct access a = {gid, q->opts.socket_mode};
    return qsd_each_export_dir(&q->paths, q->volume, q->opts.read_only, regroup_at, &a);
}


int qsd_write_meta(struct qsd *q, uint64_t size)
{
    return qsd_meta_write(&q->paths, q->volume, &q->opts, size);
}

int qsd_stop_orphans(const struct qsd_config *cfg,
                     bool (*keep)(const char *volume, pid_t pid, void *arg), void *arg)
{
    char **vols;
    size_t n = qsd_orphan_volumes(cfg->run_dir, keep, arg, &vols);
    for (size_t i = 0; i < n; i++) {
        _cleanup_free_ char *msg = NULL;
        int r = name_validate(vols[i], NULL) < 0 ? -EINVAL : qsd_stop_sync(cfg, vols[i], &msg);
        if (r < 0)
            log_warn("qsd", "cannot stop a QSD nobody wants", "volume=%s error=\"%s\"", vols[i],
                     msg ? msg : strerror(-r));
        else
            log_info("qsd", "stopped a QSD nobody wants (left by an interrupted operation)",
                     "volume=%s", vols[i]);
        free(vols[i]);
    }
    free(vols);
    qsd_uid_sweep(cfg->run_dir); /* uids and cgroups of volumes whose runtime is gone */
    qsd_cgroup_sweep(cfg);
    return (int)n;
}

/* ------------------------------------------------------------- sync */

struct sync_done {
    bool done;
    int status;
    char *msg;
};

static void sync_done_cb(struct qsd *q, int status, const char *msg, void *opaque)
{
    struct sync_done *d = opaque;
    d->done = true;
    d->status = status;
    d->msg = msg ? xstrdup(msg) : NULL;
}

static int run_until(struct loop *l, struct sync_done *d, uint64_t bound_ms)
{
    uint64_t deadline = now_ms() + bound_ms;
    while (!d->done) {
        if (now_ms() > deadline)
            return -ETIMEDOUT;
        int r = loop_run_once(l, 100);
        if (r < 0)
            return r;
    }
    return 0;
}

/* The caller's monitor connection, made while q's probe connections are
 * still open (qsd_start_sync). */
static int connect_monitor(struct qsd *q, struct qmp_sync **ret, char **ret_msg)
{
    _cleanup_free_ char *m = NULL;
    int r = qmpc_connect_volume(q->cfg.run_dir, q->volume, QMP_DEFAULT_TIMEOUT_MS, ret, &m);
    if (r < 0)
        *ret_msg = xasprintf("QSD serves its exports but its monitor does not answer: %s", m);
    return r;
}

int qsd_start_sync(const struct qsd_config *cfg, const char *volume, const struct qsd_opts *opts,
                   pid_t *ret_pid, struct qmp_sync **ret_qmp, char **ret_msg)
{
    struct loop *l;
    int r = loop_new(&l);
    if (r < 0) {
        *ret_msg = xasprintf("cannot create event loop: %s", strerror(-r));
        return r;
    }
    struct qsd *q;
    qsd_new(l, cfg, volume, opts, &q);
    qsd_set_supervised(q, false);
    q->hold_probe = ret_qmp != NULL;
    struct sync_done d = {0};
    r = qsd_start(q, sync_done_cb, &d);
    if (r < 0) {
        *ret_msg = xasprintf("cannot start qemu-storage-daemon: %s", strerror(-r));
    } else {
        /* The QSD bounds itself (start timeout); this outer bound is a backstop. */
        r = run_until(l, &d, q->cfg.start_timeout_ms + 5000);
        if (r == 0)
            r = d.status;
        if (r == 0 && ret_qmp)
            r = connect_monitor(q, ret_qmp, &d.msg);
        if (q->probe_fds[0] >= 0) {
            /* The held probe goes now: its hang-up done before we return
             * (probe_step, step 3), bounded like a start. */
            release_probe(q);
            uint64_t settle = now_ms() + q->cfg.start_timeout_ms;
            while (r == 0 && qsd_side_connections(q) > 0 && now_ms() < settle)
                sleep_ms(5);
        }
        if (r < 0) {
            *ret_msg = d.msg ? TAKE_PTR(d.msg) : xasprintf("start failed: %s", strerror(-r));
            /* Leave nothing behind (normally already reaped in on_process_exit). */
            if (q->pidfd >= 0) {
                pidfd_signal(q->pidfd, SIGKILL);
                if (!q->adopted && q->pgid > 0)
                    kill(-q->pgid, SIGKILL); /* our unreaped child leads it */
                struct pollfd pfd = {.fd = q->pidfd, .events = POLLIN};
                poll(&pfd, 1, 2000);
                reap(q);
            }
            /* The whole unit is gone (the head's QSD child too), bounded. */
            if (q->pgid > 0 && proc_group_wait(q->pgid, 2000) < 0)
                log_warn("qsd", "a process of the failed start is still there",
                         "volume=%s pgid=%d", q->volume, (int)q->pgid);
            qsd_state_write(&q->paths, q->volume, &q->opts, false, 0, 0);
        } else if (ret_pid) {
            *ret_pid = q->pid;
        }
    }
    free(d.msg);
    qsd_free(q);
    loop_free(l);
    return r;
}

int qsd_stop_sync(const struct qsd_config *cfg, const char *volume, char **ret_msg)
{
    struct loop *l;
    int r = loop_new(&l);
    if (r < 0) {
        *ret_msg = xasprintf("cannot create event loop: %s", strerror(-r));
        return r;
    }
    struct qsd *q;
    qsd_new(l, cfg, volume, NULL, &q);
    qsd_set_supervised(q, false);
    r = qsd_adopt(q);
    if (r < 0 && r != -ESRCH) {
        *ret_msg = xasprintf("cannot read the state of volume %s: %s", volume, strerror(-r));
        qsd_free(q);
        loop_free(l);
        return r;
    }
    struct sync_done d = {0};
    r = qsd_stop(q, sync_done_cb, &d);
    if (r == 0)
        r = run_until(l, &d, q->cfg.stop_timeout_ms + 5000);
    if (r == 0)
        r = d.status;
    if (r < 0)
        *ret_msg = d.msg ? TAKE_PTR(d.msg) : xasprintf("stop failed: %s", strerror(-r));
    free(d.msg);
    qsd_free(q);
    loop_free(l);
    return r;
}
