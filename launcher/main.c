/* SPDX-License-Identifier: Apache-2.0 */
/* main.c: qsd-vm-launcher.  VM description + volumes directories -> domain
 * XML -> libvirt (embedded QEMU driver by default), then keep the domain's
 * disks in step with the volumes directories and handle its lifecycle.
 * Also owns the command line, including the checks on the volumes
 * directories at start (each exists, none given twice or inside another).
 * Nothing is ever written into a volumes directory (they are read-only in a
 * VM pod).  Also: the paths of everything the launcher creates in its root
 * (console sockets and log, guest-agent socket, cidata image, slot ledger,
 * disk report), the start-up order (console listening and cidata built
 * before the domain starts), passt's directory (passt runs as nobody), and
 * dispatching `qsd-vm-launcher console` to console_client.c.
 *
 * Threads: libvirt needs an event loop of its own (the embedded driver talks
 * to QEMU's monitor through it); it runs in one helper thread and forwards
 * domain events through a pipe to the main event loop, where everything
 * else happens.  Once the domain runs, every libvirt call is made on a
 * third thread, each with a bound (virt_thread.h, --libvirt-timeout): the
 * loop never waits for libvirt.  Before the loop runs (connect, domain
 * start) and after it stopped (destroy, close) calls are made directly; the
 * destroy that ends a VM which did not shut down in time is one of those
 * (libvirt kills QEMU before it waits for any stuck call).  Exit status:
 * see docs/launcher.md. */
#include "cidata.h"
#include "config.h"
#include "console.h"
#include "domain_xml.h"
#include "hotplug.h"
#include "init.h"
#include "layout.h"
#include "qsd/base/log.h"
#include "qsd/base/loop.h"
#include "qsd/base/util.h"
#include "virt_thread.h"
#include "vmspec.h"
#include "volumes.h"

#include <fcntl.h>
#include <getopt.h>
#include <pwd.h>
#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/signalfd.h>
#include <sys/stat.h>

#define COMP "launcher"
#define VOLUMES_DIRS_MAX 16

enum exit_status {
    EXIT_POWEROFF = 0,  /* the guest powered off (by itself or when asked) */
    EXIT_ERROR = 1,     /* bad input or a launcher/libvirt failure */
    EXIT_CRASHED = 2,   /* QEMU failed or the guest crashed */
    EXIT_KILLED = 3,    /* asked to stop, guest did not shut down in time: destroyed */
    EXIT_EXTERNAL = 4,  /* the domain was destroyed by someone else */
};

struct opts {
    const char *spec_path;
    const char *volumes_dirs[VOLUMES_DIRS_MAX]; /* as given */
    size_t n_volumes_dirs;
    const char *connect_uri;
    const char *root;
    unsigned shutdown_timeout_s;
    unsigned wait_volumes_s;
    unsigned ready_timeout_s;
    unsigned detach_timeout_s;
    unsigned libvirt_timeout_s;
    const char *console_socket; /* NULL: ROOT/console.sock */
    uint64_t console_log_max;
    const char *cloud_init_dir;
    bool dry_run;
};

struct launcher {
    struct opts o;
    struct loop *loop;
    virConnectPtr conn;
    virDomainPtr dom;
    int cb_lifecycle, cb_removed;
    int evpipe[2];
    int sigfd;
    struct loop_watch *ev_watch, *sig_watch;
    struct loop_timer *shutdown_timer;
    struct hotplug *hp;
    struct virt_thread *vt;
    struct console *console;
    struct slot_ledger *ledger;
    bool stopping;
    int exit_status;
    pthread_t ev_thread;
    bool ev_thread_started;
};

/* Records sent from libvirt's event thread to the main loop. */
struct ev_msg {
    int kind; /* 0 lifecycle, 1 device removed */
    int event, detail;
};

static atomic_bool ev_quit;

static void *event_thread(void *arg)
{
    while (!atomic_load(&ev_quit))
        if (virEventRunDefaultImpl() < 0)
            break;
    return NULL;
}

static void ev_wake(int timer, void *opaque) { virEventRemoveTimeout(timer); }

static void ev_send(struct launcher *L, struct ev_msg m)
{
    /* The pipe is non-blocking; a full pipe (thousands of events) drops one. */
    ssize_t n = write(L->evpipe[1], &m, sizeof(m));
    (void)n;
}

static int on_lifecycle(virConnectPtr c, virDomainPtr d, int event, int detail, void *opaque)
{
    ev_send(opaque, (struct ev_msg){0, event, detail});
    return 0;
}

static void on_device_removed(virConnectPtr c, virDomainPtr d, const char *alias, void *opaque)
{
    ev_send(opaque, (struct ev_msg){1, 0, 0});
}

static void silent_error(void *u, virErrorPtr e) {}

static const char *virt_err(void)
{
    const char *m = virGetLastErrorMessage();
    return m ? m : "unknown libvirt error";
}

static void finish(struct launcher *L, int status, const char *how)
{
    if (L->exit_status < 0) {
        L->exit_status = status;
        log_info(COMP, "vm ended", "how=%s exit_status=%d", how, status);
    }
    loop_stop(L->loop);
}

static void on_lifecycle_msg(struct launcher *L, const struct ev_msg *m)
{
    switch (m->event) {
    case VIR_DOMAIN_EVENT_STOPPED:
        switch (m->detail) {
        case VIR_DOMAIN_EVENT_STOPPED_SHUTDOWN:
            finish(L, EXIT_POWEROFF, "poweroff");
            break;
        case VIR_DOMAIN_EVENT_STOPPED_DESTROYED:
            finish(L, L->stopping ? EXIT_KILLED : EXIT_EXTERNAL, "destroyed");
            break;
        case VIR_DOMAIN_EVENT_STOPPED_CRASHED:
            finish(L, EXIT_CRASHED, "crashed");
            break;
        default:
            finish(L, EXIT_CRASHED, "failed");
            break;
        }
        break;
    case VIR_DOMAIN_EVENT_CRASHED:
        log_error(COMP, "guest crashed", "detail=%d", m->detail);
        break;
    case VIR_DOMAIN_EVENT_SHUTDOWN:
        log_info(COMP, "guest shutting down", "detail=%d", m->detail);
        break;
    default:
        log_debug(COMP, "domain event", "event=%d detail=%d", m->event, m->detail);
        break;
    }
}

static void on_evpipe(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    struct launcher *L = opaque;
    struct ev_msg m;
    while (read(fd, &m, sizeof(m)) == (ssize_t)sizeof(m)) {
        if (m.kind == 0)
            on_lifecycle_msg(L, &m);
        else if (!L->stopping)
            hotplug_kick(L->hp);
    }
}

/* The loop stops; teardown() destroys the domain, off the loop. */
static void on_shutdown_timeout(struct loop *l, void *opaque)
{
    struct launcher *L = opaque;
    L->shutdown_timer = NULL;
    log_warn(COMP, "guest did not shut down in time, destroying", "timeout_s=%u",
             L->o.shutdown_timeout_s);
    finish(L, EXIT_KILLED, "destroyed-after-timeout");
}

static int call_shutdown(virDomainPtr dom, const char *unused, char **ret_text)
{
    return virDomainShutdownFlags(dom, VIR_DOMAIN_SHUTDOWN_ACPI_POWER_BTN);
}

static void on_shutdown_sent(const struct virt_reply *r, void *opaque)
{
    if (r->status == 0)
        return;
    _cleanup_free_ char *q =
        log_quote(r->status == -EIO ? r->error : "libvirt did not return in time");
    log_warn(COMP, "shutdown request failed", "error=%s%s", q, r->late ? " late=1" : "");
}

static void on_signal(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    struct launcher *L = opaque;
    struct signalfd_siginfo si;
    while (read(fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (L->stopping) {
            log_info(COMP, "signal while stopping, destroying now", "signal=%u", si.ssi_signo);
            if (L->shutdown_timer) {
                loop_timer_cancel(L->shutdown_timer);
                L->shutdown_timer = NULL;
            }
            on_shutdown_timeout(l, L);
            return;
        }
        L->stopping = true;
        log_info(COMP, "stop requested, asking guest to shut down", "signal=%u timeout_s=%u",
                 si.ssi_signo, L->o.shutdown_timeout_s);
        /* A stuck libvirt call would hold the request: the guest is
         * destroyed after the timeout instead. */
        const char *stuck = virt_thread_stuck(L->vt, NULL);
        if (stuck)
            log_warn(COMP, "shutdown request not sent", "reason=\"libvirt busy: %s has not "
                     "returned\"", stuck);
        else if (virt_call(L->vt, "shutdown", call_shutdown, NULL,
                           (uint64_t)L->o.libvirt_timeout_s * 1000, on_shutdown_sent, L) < 0)
            log_warn(COMP, "shutdown request not sent", "reason=\"libvirt queue full\"");
        L->shutdown_timer =
            loop_timer_add(l, (uint64_t)L->o.shutdown_timeout_s * 1000, on_shutdown_timeout, L);
    }
}

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: qsd-vm-launcher --spec FILE --volumes-dir DIR [--volumes-dir DIR...] [options]\n"
            "       qsd-vm-launcher console [--root DIR | --socket PATH]\n"
            "Start a VM whose disks are the vhost-user-blk volumes found in the DIRs;\n"
            "`console` attaches to a running VM's serial console (Ctrl-] detaches).\n\n"
            "  -s, --spec FILE            VM description (JSON, see docs/launcher.md)\n"
            "  -v, --volumes-dir DIR      a volumes directory (one subdirectory per volume);\n"
            "                             repeat for several (at most 16), all scanned and\n"
            "                             watched; a disk name in two of them is refused\n"
            "      --volumes DIR          the same as --volumes-dir\n"
            "  -c, --connect URI          libvirt URI (default: qemu:///embed?root=ROOT)\n"
            "  -r, --root DIR             embedded driver root (default /var/lib/qsd-vm-launcher)\n"
            "      --shutdown-timeout S   seconds the guest gets to shut down on SIGTERM (30)\n"
            "      --wait-volumes S       seconds to wait at start for listed volumes (30)\n"
            "      --ready-timeout S      seconds a new volume may take to become ready (60)\n"
            "      --detach-timeout S     seconds the guest gets to release a disk (60)\n"
            "      --libvirt-timeout S    seconds a libvirt call may take while the VM runs;\n"
            "                             past it the call is reported and abandoned (30)\n"
            "      --console-socket PATH  where `qsd-vm-launcher console` attaches\n"
            "                             (default ROOT/console.sock)\n"
            "      --console-log-max SIZE console log bound, rotated to .1 (default 1M)\n"
            "      --cloud-init-dir DIR   NoCloud files (user-data, meta-data, network-config),\n"
            "                             e.g. a mounted Secret; the guest gets a cidata disk\n"
            "  -n, --dry-run              print the domain XML and exit\n"
            "      --log-level LEVEL      debug, info, warn, error (info)\n"
            "      --log-format FMT       text or json (text)\n"
            "  -h, --help                 this help\n"
            "      --version              print the version\n");
}

static int parse_seconds(const char *s, unsigned *ret)
{
    uint64_t v;
    if (parse_uint(s, 0, 3600, &v) < 0)
        return -EINVAL;
    *ret = (unsigned)v;
    return 0;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
    enum { O_SHUT = 256, O_WAIT, O_READY, O_DETACH, O_VIRT, O_LEVEL, O_FORMAT, O_VERSION, O_CSOCK,
           O_CLOGMAX, O_CIDIR };
    static const struct option longopts[] = {
        {"spec", required_argument, NULL, 's'},
        {"volumes-dir", required_argument, NULL, 'v'},
        {"volumes", required_argument, NULL, 'v'},
        {"connect", required_argument, NULL, 'c'},
        {"root", required_argument, NULL, 'r'},
        {"shutdown-timeout", required_argument, NULL, O_SHUT},
        {"wait-volumes", required_argument, NULL, O_WAIT},
        {"ready-timeout", required_argument, NULL, O_READY},
        {"detach-timeout", required_argument, NULL, O_DETACH},
        {"libvirt-timeout", required_argument, NULL, O_VIRT},
        {"dry-run", no_argument, NULL, 'n'},
        {"console-socket", required_argument, NULL, O_CSOCK},
        {"console-log-max", required_argument, NULL, O_CLOGMAX},
        {"cloud-init-dir", required_argument, NULL, O_CIDIR},
        {"log-level", required_argument, NULL, O_LEVEL},
        {"log-format", required_argument, NULL, O_FORMAT},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, O_VERSION},
        {0},
    };
    *o = (struct opts){.root = "/var/lib/qsd-vm-launcher",
                       .shutdown_timeout_s = 30,
                       .wait_volumes_s = 30,
                       .ready_timeout_s = 60,
                       .detach_timeout_s = 60,
                       .libvirt_timeout_s = 30,
                       .console_log_max = 1024 * 1024};
    int c;
    while ((c = getopt_long(argc, argv, "s:v:c:r:nh", longopts, NULL)) != -1) {
        unsigned *sec = NULL;
        switch (c) {
        case 's': o->spec_path = optarg; break;
        case 'v':
            if (o->n_volumes_dirs == VOLUMES_DIRS_MAX) {
                fprintf(stderr, "qsd-vm-launcher: at most %d volumes directories\n",
                        VOLUMES_DIRS_MAX);
                return -EINVAL;
            }
            o->volumes_dirs[o->n_volumes_dirs++] = optarg;
            break;
        case 'c': o->connect_uri = optarg; break;
        case 'r': o->root = optarg; break;
        case 'n': o->dry_run = true; break;
        case O_CSOCK: o->console_socket = optarg; break;
        case O_CIDIR: o->cloud_init_dir = optarg; break;
        case O_CLOGMAX:
            if (parse_size(optarg, &o->console_log_max) < 0 ||
                o->console_log_max < CONSOLE_LOG_MIN || o->console_log_max > (1ull << 40)) {
                fprintf(stderr, "qsd-vm-launcher: bad --console-log-max (4K..1T)\n");
                return -EINVAL;
            }
            break;
        case O_SHUT: sec = &o->shutdown_timeout_s; break;
        case O_WAIT: sec = &o->wait_volumes_s; break;
        case O_READY: sec = &o->ready_timeout_s; break;
        case O_DETACH: sec = &o->detach_timeout_s; break;
        case O_VIRT: sec = &o->libvirt_timeout_s; break;
        case O_LEVEL: {
            enum log_level lv;
            if (log_parse_level(optarg, &lv) < 0) {
                fprintf(stderr, "qsd-vm-launcher: bad --log-level\n");
                return -EINVAL;
            }
            log_set_level(lv);
            break;
        }
        case O_FORMAT: {
            enum log_format f;
            if (log_parse_format(optarg, &f) < 0) {
                fprintf(stderr, "qsd-vm-launcher: bad --log-format\n");
                return -EINVAL;
            }
            log_set_format(f);
            break;
        }
        case 'h': usage(stdout); exit(0);
        case O_VERSION: printf("qsd-vm-launcher %s\n", QSD_CSI_VERSION); exit(0);
        default: usage(stderr); return -EINVAL;
        }
        if (sec && parse_seconds(optarg, sec) < 0) {
            fprintf(stderr, "qsd-vm-launcher: bad number of seconds: %s\n", optarg);
            return -EINVAL;
        }
    }
    if (!o->libvirt_timeout_s) {
        fprintf(stderr, "qsd-vm-launcher: --libvirt-timeout must be at least 1 second\n");
        return -EINVAL;
    }
    if (optind != argc || !o->spec_path || !o->n_volumes_dirs) {
        usage(stderr);
        return -EINVAL;
    }
    return 0;
}

/* A stop signal arrived before the loop runs (they are blocked and read
 * through the signalfd later): do not start, or stop waiting. */
static bool stop_pending(void)
{
    sigset_t p;
    return sigpending(&p) == 0 &&
           (sigismember(&p, SIGTERM) == 1 || sigismember(&p, SIGINT) == 1 ||
            sigismember(&p, SIGHUP) == 1);
}

static bool wanted_at_start(const struct vm_spec *spec, const char *name)
{
    const struct vm_disk *d = vm_spec_find_disk(spec, name);
    return (d && !d->hotplug) ||
           (spec->boot == VM_BOOT_VOLUME && streq(name, spec->boot_volume));
}

/* Ready = valid metadata, socket path short enough, socket accepting now. */
static int volume_ready(const struct volume_entry *e, char **ret_why)
{
    if (!e->vol) {
        *ret_why = xstrdup(e->message ? e->message : strerror(-e->error));
        return e->error ? e->error : -EINVAL;
    }
    return volume_socket_probe(e->vol, ret_why);
}

/* Bounded wait at start: every volume the description names must be ready.
 * Missing volumes and sockets not accepting yet are retried until
 * --wait-volumes; invalid ones fail at once.  Other volumes are probed once
 * at the end: ready ones become disks too, the rest are logged and left to
 * the hot-plug watcher.  Runs before the loop exists, so sleeping is fine. */
static int collect_volumes(const struct opts *o, const struct vm_spec *spec,
                           const char *const *dirs, size_t n_dirs, struct volume_scan *ret_scan,
                           char **ret_error)
{
    uint64_t deadline = now_ms() + (uint64_t)o->wait_volumes_s * 1000;
    _cleanup_free_ char *dir_list = NULL;
    for (size_t i = 0; i < n_dirs; i++) {
        char *l = xasprintf("%s%s%s", dir_list ? dir_list : "", dir_list ? ", " : "", dirs[i]);
        free(dir_list);
        dir_list = l;
    }
    for (;;) {
        struct volume_scan scan = {0};
        const char *failed = NULL;
        int r = volumes_scan(dirs, n_dirs, 256, &scan, &failed);
        if (r < 0) {
            *ret_error = xasprintf("cannot scan %s: %s", failed ? failed : "-", strerror(-r));
            return r;
        }
        _cleanup_free_ char *why = NULL;
        bool hard = false;
        for (size_t i = 0; i < scan.n && !why; i++) {
            struct volume_entry *e = &scan.entries[i];
            if (!wanted_at_start(spec, e->name))
                continue;
            _cleanup_free_ char *reason = NULL;
            r = volume_ready(e, &reason);
            if (r < 0) {
                why = xasprintf("volume \"%s\" in %s: %s", e->name, e->base, reason);
                /* Not there yet or not accepting yet: worth waiting for. */
                hard = !(r == -ENOENT || r == -ECONNREFUSED || r == -EAGAIN);
            }
        }
        if (!why) {
            const char *missing = NULL;
            if (spec->boot == VM_BOOT_VOLUME && !volume_scan_find(&scan, spec->boot_volume))
                missing = spec->boot_volume;
            for (size_t i = 0; i < spec->n_disks && !missing; i++)
                if (!spec->disks[i].hotplug && !volume_scan_find(&scan, spec->disks[i].volume))
                    missing = spec->disks[i].volume;
            if (missing)
                why = xasprintf("volume \"%s\" is not in %s", missing, dir_list);
        }
        if (!why) {
            for (size_t i = 0; i < scan.n; i++) {
                struct volume_entry *e = &scan.entries[i];
                if (wanted_at_start(spec, e->name))
                    continue;
                _cleanup_free_ char *reason = NULL;
                if (volume_ready(e, &reason) < 0) {
                    _cleanup_free_ char *qn = log_quote(e->name);
                    _cleanup_free_ char *qr = log_quote(reason);
                    log_warn(COMP, "volume skipped", "volume=%s reason=%s dir=%s", qn, qr,
                             e->base);
                    volume_free(e->vol);
                    e->vol = NULL; /* the hot-plug watcher retries it later */
                }
            }
            *ret_scan = scan;
            return 0;
        }
        volume_scan_clear(&scan);
        if (stop_pending()) {
            *ret_error = xasprintf("stop requested while waiting: %s", why);
            return -EINTR;
        }
        if (hard || now_ms() >= deadline) {
            *ret_error = TAKE_PTR(why);
            return -ENOENT;
        }
        sleep_ms(100);
    }
}

static int uri_safe_root(const char *root)
{
    if (!vm_path_is_clean(root))
        return -EINVAL;
    for (const char *c = root; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              strchr("/._-", *c)))
            return -EINVAL;
    return 0;
}

/* The embedded driver reads ROOT/etc/qemu.conf.  Write a default one when
 * there is none: QEMU's output to a file (no virtlogd in a pod), no cgroup,
 * namespace or security-label setup (the pod is the sandbox), and no owner
 * remembering in xattrs (files are shared with other drivers in tests). */
static int embed_root_prepare(const char *root)
{
    _cleanup_free_ char *etc = xasprintf("%s/etc", root);
    int r = mkdir_p(etc, 0700);
    if (r < 0)
        return r;
    _cleanup_free_ char *conf = xasprintf("%s/qemu.conf", etc);
    if (access(conf, F_OK) == 0)
        return 0;
    static const char text[] =
        "# Written by qsd-vm-launcher (edit freely: it is only written when absent).\n"
        "stdio_handler = \"file\"\n"
        "security_driver = \"none\"\n"
        "cgroup_controllers = [ ]\n"
        "namespaces = [ ]\n"
        "remember_owner = 0\n"
        "user = \"root\"\n"
        "group = \"root\"\n";
    return write_file_atomic(conf, text, strlen(text), 0600);
}

/* libvirt starts passt as QEMU's user (root here), with its socket and pid
 * file in ROOT/run/qemu/passt, which libvirt made root's (0755) at connect
 * time.  passt then gives up root, in one of two ways: Debian 12's passt
 * (2023-03-09) becomes "nobody" before it writes its pid file ("PID file
 * open: Permission denied" in a root-owned directory); Debian 13's
 * (2025-05-03, the launcher image's) binds its socket in a root-owned 0755
 * directory but not in one of nobody's ("Failed to bind UNIX domain socket:
 * Permission denied", seen in the image and in a cluster).  A root-owned
 * directory that anyone may write to, sticky as /tmp, suits both (both
 * seen); it is in the pod's own launcher root,
 * which only the pod's processes see.  Others may search the launcher's own
 * directories above it; a directory above ROOT that nobody cannot search is
 * reported (it is not ours). */
static void passt_dir_prepare(const char *root)
{
    if (geteuid() != 0)
        return;
    struct passwd *pw = getpwnam("nobody");
    uid_t uid = pw ? pw->pw_uid : 65534;
    _cleanup_free_ char *dir = xasprintf("%s/run/qemu/passt", root);
    if (mkdir_p(dir, 0755) < 0 || chown(dir, 0, 0) < 0 || chmod(dir, 01777) < 0)
        log_warn(COMP, "cannot prepare passt's directory", "dir=%s error=\"%m\"", dir);
    const char *ours[] = {"", "/run", "/run/qemu"};
    for (size_t i = 0; i < ARRAY_SIZE(ours); i++) {
        _cleanup_free_ char *p = xasprintf("%s%s", root, ours[i]);
        struct stat st;
        if (stat(p, &st) == 0 && !(st.st_mode & S_IXOTH))
            chmod(p, (st.st_mode & 07777) | S_IXOTH);
    }
    _cleanup_free_ char *up = xstrdup(root);
    for (char *slash = strrchr(up, '/'); slash && slash > up; slash = strrchr(up, '/')) {
        *slash = 0;
        struct stat st;
        if (stat(up, &st) == 0 && !(st.st_mode & S_IXOTH) && st.st_uid != uid)
            log_warn(COMP, "passt cannot reach its directory", "dir=%s blocked_by=%s "
                     "hint=\"passt runs as nobody: make it searchable (o+x)\"", dir, up);
    }
}

static int run(struct launcher *L, const struct vm_spec *spec, const char *const *dirs,
               size_t n_dirs)
{
    struct volume_scan scan = {0};
    _cleanup_free_ char *err = NULL;
    int r = collect_volumes(&L->o, spec, dirs, n_dirs, &scan, &err);
    if (r < 0) {
        _cleanup_free_ char *q = log_quote(err);
        log_error(COMP, "volumes not ready", "error=%s", q);
        return EXIT_ERROR;
    }
    size_t n_vols = 0;
    _cleanup_free_ struct volume **vols = xcalloc(scan.n + 1, sizeof(*vols));
    for (size_t i = 0; i < scan.n; i++)
        if (scan.entries[i].vol)
            vols[n_vols++] = scan.entries[i].vol;
    /* Everything the launcher creates is in its root, never at a path the
     * description names (except the legacy console_log). */
    _cleanup_free_ char *console_qemu = xasprintf("%s/console/serial.sock", L->o.root);
    _cleanup_free_ char *console_attach = L->o.console_socket
                                              ? xstrdup(L->o.console_socket)
                                              : xasprintf("%s/console.sock", L->o.root);
    _cleanup_free_ char *console_log = spec->console_log ? xstrdup(spec->console_log)
                                                          : xasprintf("%s/console.log", L->o.root);
    _cleanup_free_ char *qga = xasprintf("%s/qga.sock", L->o.root);
    _cleanup_free_ char *cidata_img = xasprintf("%s/cidata.img", L->o.root);
    _cleanup_free_ char *ledger_path = xasprintf("%s/disk-slots.json", L->o.root);
    _cleanup_free_ char *report_path = xasprintf("%s/guest-disks.json", L->o.root);
    struct cidata *ci = NULL;
    r = cidata_gather(spec, L->o.cloud_init_dir, &ci, &err);
    if (r < 0) {
        _cleanup_free_ char *q = log_quote(err ? err : strerror(-r));
        log_error(COMP, "bad cloud-init data", "error=%s", q);
        volume_scan_clear(&scan);
        return EXIT_ERROR;
    }
    bool has_cidata = ci != NULL;
    L->ledger = slot_ledger_load(L->o.dry_run ? NULL : ledger_path, spec);
    struct domain_host host = {.console_socket = console_qemu,
                               .qga_socket = qga,
                               .cidata_image = ci ? cidata_img : NULL};
    _cleanup_free_ char *xml = NULL;
    _cleanup_free_ struct domain_disk *disks = NULL;
    size_t n_disks = 0;
    r = domain_xml_build(spec, &host, L->ledger, vols, n_vols, &xml, &err);
    if (r >= 0)
        r = domain_plan_disks(spec, L->ledger, vols, n_vols, &disks, &n_disks, &err);
    if (r < 0) {
        _cleanup_free_ char *q = log_quote(err ? err : strerror(-r));
        log_error(COMP, "cannot build domain", "error=%s", q);
        volume_scan_clear(&scan);
        cidata_free(ci);
        return EXIT_ERROR;
    }
    if (L->o.dry_run) {
        fputs(xml, stdout);
        volume_scan_clear(&scan);
        cidata_free(ci);
        return 0;
    }

    _cleanup_free_ char *uri = NULL;
    if (L->o.connect_uri) {
        uri = xstrdup(L->o.connect_uri);
    } else {
        if (uri_safe_root(L->o.root) < 0) {
            log_error(COMP, "bad --root", "error=\"must be a clean absolute path of [A-Za-z0-9/._-]\"");
            volume_scan_clear(&scan);
            return EXIT_ERROR;
        }
        r = embed_root_prepare(L->o.root);
        if (r < 0) {
            log_error(COMP, "cannot prepare embedded driver root", "root=%s error=\"%s\"",
                      L->o.root, strerror(-r));
            volume_scan_clear(&scan);
            cidata_free(ci);
            return EXIT_ERROR;
        }
        uri = xasprintf("qemu:///embed?root=%s", L->o.root);
    }
    _cleanup_free_ char *console_dir = xasprintf("%s/console", L->o.root);
    r = mkdir_p(console_dir, 0700);
    if (r >= 0) {
        struct console_config cc = {.qemu_socket = console_qemu,
                                    .attach_socket = console_attach,
                                    .log_path = console_log,
                                    .log_max = L->o.console_log_max};
        r = console_new(L->loop, &cc, &L->console);
    }
    if (r < 0) {
        volume_scan_clear(&scan);
        cidata_free(ci);
        return EXIT_ERROR;
    }
    if (ci) {
        uint64_t tc = now_ms();
        r = cidata_build(ci, cidata_img, &err);
        if (r < 0) {
            _cleanup_free_ char *q = log_quote(err ? err : strerror(-r));
            log_error(COMP, "cannot build the cidata disk", "error=%s", q);
            volume_scan_clear(&scan);
            cidata_free(ci);
            return EXIT_ERROR;
        }
        log_info(COMP, "cidata disk built", "image=%s user_data=%s meta_data=%s network_config=%s "
                 "ms=%llu", cidata_img, ci->f[0].from ? ci->f[0].from : "-",
                 ci->f[1].from ? ci->f[1].from : "-", ci->f[2].from ? ci->f[2].from : "-",
                 (unsigned long long)(now_ms() - tc));
        cidata_free(ci);
        ci = NULL;
    }
    if (slot_ledger_save(L->ledger) < 0)
        log_warn(COMP, "cannot save the slot ledger", "file=%s", ledger_path);

    /* libvirt logs to stderr by default, including errors it recovers from
     * itself.  Ours are logged once, in logfmt; libvirt's own warnings and
     * errors go to ROOT/libvirt.log (embedded) unless the user chose. */
    _cleanup_free_ char *vlog = L->o.connect_uri ? xstrdup("4:stderr")
                                                   : xasprintf("3:file:%s/libvirt.log", L->o.root);
    setenv("LIBVIRT_LOG_OUTPUTS", vlog, 0);
    virSetErrorFunc(NULL, silent_error);
    if (virEventRegisterDefaultImpl() < 0) {
        log_error(COMP, "libvirt event loop", "error=\"cannot register\"");
        volume_scan_clear(&scan);
        return EXIT_ERROR;
    }
    if (pthread_create(&L->ev_thread, NULL, event_thread, NULL) != 0) {
        volume_scan_clear(&scan);
        return EXIT_ERROR;
    }
    L->ev_thread_started = true;

    uint64_t t0 = now_ms();
    L->conn = virConnectOpen(uri);
    if (!L->conn) {
        _cleanup_free_ char *q = log_quote(virt_err());
        log_error(COMP, "cannot connect to libvirt", "uri=%s error=%s", uri, q);
        volume_scan_clear(&scan);
        return EXIT_ERROR;
    }
    log_info(COMP, "connected", "uri=%s ms=%llu", uri, (unsigned long long)(now_ms() - t0));
    if (!L->o.connect_uri && spec->net.enabled)
        passt_dir_prepare(L->o.root);
    L->cb_lifecycle = virConnectDomainEventRegisterAny(
        L->conn, NULL, VIR_DOMAIN_EVENT_ID_LIFECYCLE, VIR_DOMAIN_EVENT_CALLBACK(on_lifecycle), L,
        NULL);
    L->cb_removed = virConnectDomainEventRegisterAny(
        L->conn, NULL, VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED,
        VIR_DOMAIN_EVENT_CALLBACK(on_device_removed), L, NULL);

    if (stop_pending()) {
        log_info(COMP, "stop requested before start", "name=%s", spec->name);
        volume_scan_clear(&scan);
        return EXIT_ERROR;
    }
    t0 = now_ms();
    /* No VIR_DOMAIN_START_AUTODESTROY: the embedded driver does not support
     * it; teardown() destroys the domain instead. */
    L->dom = virDomainCreateXML(L->conn, xml, 0);
    if (!L->dom) {
        _cleanup_free_ char *q = log_quote(virt_err());
        log_error(COMP, "cannot start domain", "name=%s error=%s", spec->name, q);
        volume_scan_clear(&scan);
        return EXIT_ERROR;
    }
    log_info(COMP, "domain started", "name=%s disks=%zu hotplug_slots=%u ms=%llu", spec->name,
             n_disks, spec->hotplug_slots, (unsigned long long)(now_ms() - t0));
    for (size_t i = 0; i < n_disks; i++) {
        struct pci_addr a;
        char guest[GUEST_ADDR_MAX];
        layout_disk_addr(spec, disks[i].slot, &a, guest);
        log_info(COMP, "disk attached", "volume=%s serial=%s target=%s size=%llu read_only=%d "
                 "queues=%u slot=%u guest_address=%s at_start=1 dir=%s",
                 disks[i].vol->dir, disks[i].vol->id, disks[i].target,
                 (unsigned long long)disks[i].vol->size, disks[i].vol->read_only,
                 disks[i].vol->num_queues, disks[i].slot, guest, disks[i].vol->base);
    }
    {
        struct pci_addr a;
        char net[GUEST_ADDR_MAX], ser[GUEST_ADDR_MAX], cid[GUEST_ADDR_MAX];
        layout_sys_addr(spec, LAYOUT_NET, &a, net);
        layout_sys_addr(spec, LAYOUT_SERIAL, &a, ser);
        layout_sys_addr(spec, LAYOUT_CIDATA, &a, cid);
        log_info(COMP, "guest hardware", "mac=%s nic_address=%s guest_agent_address=%s "
                 "cidata_address=%s console=%s report=%s",
                 spec->net.enabled ? spec->net.mac : "-", spec->net.enabled ? net : "-", ser,
                 has_cidata ? cid : "-", console_attach, report_path);
    }

    struct hotplug_config hc = {
        .ledger = L->ledger,
        .report_path = report_path,
        .cidata = has_cidata,
        .volumes_dirs = dirs,
        .n_volumes_dirs = n_dirs,
        .ready_timeout_ms = L->o.ready_timeout_s * 1000,
        .detach_timeout_ms = L->o.detach_timeout_s * 1000,
        .call_timeout_ms = L->o.libvirt_timeout_s * 1000,
    };
    r = virt_thread_new(L->loop, L->dom, &L->vt);
    if (r < 0) {
        log_error(COMP, "cannot start the libvirt thread", "error=\"%s\"", strerror(-r));
        volume_scan_clear(&scan);
        return EXIT_ERROR;
    }
    L->ev_watch = loop_watch_fd(L->loop, L->evpipe[0], POLLIN, on_evpipe, L);
    L->sig_watch = loop_watch_fd(L->loop, L->sigfd, POLLIN, on_signal, L);
    r = hotplug_new(L->loop, L->vt, spec, &hc, disks, n_disks, &L->hp);
    volume_scan_clear(&scan);
    if (r < 0) {
        log_error(COMP, "cannot watch volumes", "error=\"%s\"", strerror(-r));
        return EXIT_ERROR;
    }
    /* A domain that stopped before the callbacks were in place. */
    int state, reason;
    if (virDomainGetState(L->dom, &state, &reason, 0) == 0 && state == VIR_DOMAIN_SHUTOFF) {
        finish(L, EXIT_CRASHED, "stopped-at-start");
        return L->exit_status;
    }
    r = loop_run(L->loop);
    if (r < 0) {
        log_error(COMP, "event loop failed", "error=\"%s\"", strerror(-r));
        return EXIT_ERROR;
    }
    return L->exit_status < 0 ? EXIT_ERROR : L->exit_status;
}

/* After the loop: the domain is destroyed first if it still runs (libvirt
 * kills QEMU before it waits for anything, so this also ends a libvirt call
 * stuck on QEMU), then the libvirt thread is joined (bounded). */
static void teardown(struct launcher *L)
{
    loop_timer_cancel(L->shutdown_timer);
    loop_watch_remove(L->ev_watch);
    loop_watch_remove(L->sig_watch);
    if (L->dom) {
        int state, reason;
        if (virDomainGetState(L->dom, &state, &reason, 0) == 0 && state != VIR_DOMAIN_SHUTOFF) {
            if (L->exit_status != EXIT_KILLED)
                log_warn(COMP, "destroying domain on exit", "state=%d", state);
            if (virDomainDestroy(L->dom) < 0) {
                _cleanup_free_ char *q = log_quote(virt_err());
                log_error(COMP, "destroy failed", "error=%s", q);
            }
        }
    }
    if (virt_thread_free(L->vt, 20000) < 0) {
        /* Still inside libvirt with the domain and connection: leave them
         * (the process exits next). */
        hotplug_free(L->hp);
        L->hp = NULL;
        L->dom = NULL;
        L->conn = NULL;
        L->ev_thread_started = false;
    }
    L->vt = NULL;
    hotplug_free(L->hp);
    L->hp = NULL;
    if (L->dom)
        virDomainFree(L->dom);
    if (L->conn) {
        if (L->cb_lifecycle >= 0)
            virConnectDomainEventDeregisterAny(L->conn, L->cb_lifecycle);
        if (L->cb_removed >= 0)
            virConnectDomainEventDeregisterAny(L->conn, L->cb_removed);
        virConnectClose(L->conn);
    }
    if (L->ev_thread_started) {
        atomic_store(&ev_quit, true);
        virEventAddTimeout(0, ev_wake, NULL, NULL);
        pthread_join(L->ev_thread, NULL);
    }
    console_free(L->console);
    L->console = NULL;
    slot_ledger_free(L->ledger);
    L->ledger = NULL;
}

static void free_dirs(char **dirs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(dirs[i]);
}

/* Canonical path of each --volumes-dir.  Refused at start, before anything
 * runs: a directory that does not exist (or is not one), the same directory
 * given twice, and one inside another (its volumes would be entries of the
 * outer one, and the outer one would have to hold a mount point). */
static int resolve_volumes_dirs(const struct opts *o, char **dirs)
{
    for (size_t i = 0; i < o->n_volumes_dirs; i++) {
        dirs[i] = realpath(o->volumes_dirs[i], NULL);
        if (!dirs[i]) {
            log_error(COMP, "bad volumes directory", "dir=%s error=\"%m\"", o->volumes_dirs[i]);
            return -EINVAL;
        }
        struct stat st;
        if (stat(dirs[i], &st) < 0 || !S_ISDIR(st.st_mode)) {
            log_error(COMP, "bad volumes directory", "dir=%s error=\"not a directory\"",
                      o->volumes_dirs[i]);
            return -EINVAL;
        }
        for (size_t j = 0; j < i; j++) {
            size_t li = strlen(dirs[i]), lj = strlen(dirs[j]);
            if (streq(dirs[i], dirs[j])) {
                log_error(COMP, "bad volumes directory",
                          "dir=%s error=\"given twice (as %s and %s)\"", dirs[i],
                          o->volumes_dirs[j], o->volumes_dirs[i]);
                return -EINVAL;
            }
            const char *inner = li > lj ? dirs[i] : dirs[j], *outer = li > lj ? dirs[j] : dirs[i];
            size_t lo = strlen(outer);
            if (strncmp(inner, outer, lo) == 0 && (inner[lo] == '/' || streq(outer, "/"))) {
                log_error(COMP, "bad volumes directory",
                          "dir=%s error=\"inside another volumes directory, %s\"", inner,
                          outer);
                return -EINVAL;
            }
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && streq(argv[1], "console"))
        return console_client_main(argc - 1, argv + 1);
    struct launcher L = {.exit_status = -1, .cb_lifecycle = -1, .cb_removed = -1,
                         .evpipe = {-1, -1}, .sigfd = -1};
    if (parse_opts(argc, argv, &L.o) < 0)
        return EXIT_ERROR;
    /* PID 1 (a VM pod without shareProcessNamespace): an init stays in
     * front and reaps the orphans (init.c); this process goes on. */
    int r = init_front();
    if (r < 0) {
        log_error(COMP, "pid 1: cannot fork the launcher", "error=\"%s\"", strerror(-r));
        return EXIT_ERROR;
    }

    _cleanup_free_ char *err = NULL;
    struct vm_spec *spec = NULL;
    r = vm_spec_load(L.o.spec_path, &spec, &err);
    if (r < 0) {
        _cleanup_free_ char *q = log_quote(err ? err : strerror(-r));
        log_error(COMP, "bad VM description", "file=%s error=%s", L.o.spec_path, q);
        return EXIT_ERROR;
    }
    char *dirs[VOLUMES_DIRS_MAX] = {0};
    size_t n_dirs = L.o.n_volumes_dirs;
    if (resolve_volumes_dirs(&L.o, dirs) < 0) {
        free_dirs(dirs, n_dirs);
        vm_spec_free(spec);
        return EXIT_ERROR;
    }

    /* Signals are handled in the loop; block them before any thread exists. */
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_IGN);
    L.sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    r = 0;
    if (L.sigfd < 0 || pipe2(L.evpipe, O_NONBLOCK | O_CLOEXEC) < 0 || (r = loop_new(&L.loop)) < 0) {
        if (r < 0)
            log_error(COMP, "event loop setup failed", "error=\"%s\" " LOOP_BACKEND_ENV "=%s",
                      strerror(-r), getenv(LOOP_BACKEND_ENV) ?: "");
        else
            log_error(COMP, "setup failed", "error=\"%m\"");
        free_dirs(dirs, n_dirs);
        vm_spec_free(spec);
        return EXIT_ERROR;
    }
    log_info(COMP, "event loop", "backend=%s", loop_backend(L.loop));
    int status = run(&L, spec, (const char *const *)dirs, n_dirs);
    teardown(&L);
    loop_free(L.loop);
    close(L.sigfd);
    close(L.evpipe[0]);
    close(L.evpipe[1]);
    free_dirs(dirs, n_dirs);
    vm_spec_free(spec);
    log_info(COMP, "exit", "status=%d", status);
    return status;
}
