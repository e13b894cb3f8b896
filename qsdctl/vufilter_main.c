/* SPDX-License-Identifier: Apache-2.0 */
/* vufilter_main.c: qsd-vhost-filter, the vhost-user message filter between
 * tenants (VM pods) and qemu-storage-daemon.
 *
 * Owns: the command line, the head mode (fork the QSD, confine both halves,
 * live and die as one), signals, and the final log line.  The sockets are
 * vufilter_io.c's, the decisions qsd/vhost/vufilter.c's. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <fcntl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "qsd/base/confine.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"
#include "qsd/vhost/vufilter.h"
#include "vufilter_io.h"

#define COMP "vufilter"

/* LeakSanitizer walks /proc and stops the process's threads with ptrace at
 * exit, which the filter's seccomp profile refuses: a sanitizer build keeps
 * no_new_privs but no seccomp filter for the filter itself (its QSD child
 * is confined either way). */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define VF_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define VF_SANITIZED 1
#endif
#ifdef VF_SANITIZED
#define FILTER_PROFILE CONFINE_PROFILE_NONE
#else
#define FILTER_PROFILE CONFINE_PROFILE_FILTER
#endif
#define MAX_EXPORTS 16
#define TERM_GRACE_MS 10000
#define READY_TIMEOUT_MS 30000 /* the plugin's own start bound is 10 s */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: qsd-vhost-filter --export TENANT=UPSTREAM [--export ...] --queues N\n"
            "                        [--max-conns 1] [--allow-adjacent-regions]\n"
            "                        [--connect-timeout-ms MS] [--log-level L]\n"
            "                        [-- QSD_ARGV...]\n"
            "       qsd-vhost-filter --version | --help\n"
            "\n"
            "Passes only the vhost-user control messages a virtio-blk front-end needs\n"
            "between tenants and a qemu-storage-daemon, each checked (docs/security.md,\n"
            "\"The vhost-user filter\").\n"
            "  TENANT    fd:N (an inherited listening socket) or a socket path to create\n"
            "  UPSTREAM  the QSD's vhost-user socket path\n"
            "  --queues N               the export's queue count (1..%d)\n"
            "  --max-conns 1            one tenant connection per export (QSD's rule)\n"
            "  --qsd-fd N               head mode: exec the QSD program open at\n"
            "                           descriptor N (its starter opened it: the\n"
            "                           head may not see its directory)\n"
            "  --allow-adjacent-regions accept memory regions that touch in\n"
            "                           guest-physical space (refused by default)\n"
            "  -- QSD_ARGV              head mode: run the QSD as a child, confined;\n"
            "                           exit with its status\n",
            VUF_MAX_QUEUES);
}

struct head {
    pid_t child;   /* -1 without head mode */
    int sfd;
    int status;    /* exit status to return */
};

static int exit_status_of(int wstatus)
{
    if (WIFEXITED(wstatus))
        return WEXITSTATUS(wstatus);
    if (WIFSIGNALED(wstatus))
        return 128 + WTERMSIG(wstatus);
    return 1;
}

/* The signalfd is readable: SIGCHLD, SIGTERM, SIGINT.  Nonzero ends the
 * loop: 1000 + the QSD's exit status, or STOP_TERM. */
#define STOP_TERM 2000
static int on_signal(void *opaque)
{
    struct head *h = opaque;
    struct signalfd_siginfo si;
    while (read(h->sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT)
            return STOP_TERM;
        if (si.ssi_signo == SIGCHLD && h->child > 0) {
            int ws;
            if (waitpid(h->child, &ws, WNOHANG) == h->child) {
                h->child = -1;
                h->status = exit_status_of(ws);
                log_info(COMP, "qsd exited", "status=%d", h->status);
                return 1000 + h->status;
            }
        }
    }
    return 0;
}

/* SIGTERM to the head: forward it, wait (bounded), then SIGKILL. */
static int stop_qsd(struct head *h)
{
    if (h->child <= 0)
        return 0;
    log_info(COMP, "terminating", "qsd_pid=%d", (int)h->child);
    kill(h->child, SIGTERM);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    uint64_t deadline = now_ms() + TERM_GRACE_MS;
    for (;;) {
        int ws;
        pid_t p = waitpid(h->child, &ws, WNOHANG);
        if (p == h->child)
            return exit_status_of(ws);
        uint64_t now = now_ms();
        if (now >= deadline)
            break;
        uint64_t left = MIN(deadline - now, 100u);
        struct timespec ts = {0, (long)left * 1000000L};
        sigtimedwait(&chld, NULL, &ts);
    }
    log_warn(COMP, "qsd did not stop, killing", "qsd_pid=%d", (int)h->child);
    kill(h->child, SIGKILL);
    int ws;
    waitpid(h->child, &ws, 0);
    return exit_status_of(ws);
}

/* The QSD child: dies with the head, confined, then exec. */
static void __attribute__((noreturn)) run_qsd(pid_t parent, char **argv, int prog_fd)
{
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
        _exit(127);
    int r = confine_seccomp(CONFINE_PROFILE_QSD);
    if (r < 0) {
        fprintf(stderr, "qsd-vhost-filter: confining the QSD: %s\n", strerror(-r));
        _exit(127);
    }
    if (prog_fd > 0)
        syscall(SYS_execveat, prog_fd, "", argv, environ, AT_EMPTY_PATH);
    else
        execvp(argv[0], argv);
    fprintf(stderr, "qsd-vhost-filter: exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

struct args {
    struct vf_export_spec ex[MAX_EXPORTS];
    unsigned nex;
    struct vf_options o;
    char **qsd_argv;
    int qsd_fd;   /* --qsd-fd: the QSD program, opened by our starter; 0: by name */
};

static void args_free(struct args *a)
{
    for (unsigned i = 0; i < a->nex; i++)
        free((char *)a->ex[i].tenant);
}

static int parse_args(int argc, char **argv, struct args *a)
{
    static const struct option opts[] = {
        {"export", required_argument, NULL, 'e'},
        {"queues", required_argument, NULL, 'q'},
        {"max-conns", required_argument, NULL, 'm'},
        {"allow-adjacent-regions", no_argument, NULL, 'a'},
        {"qsd-fd", required_argument, NULL, 'f'},
        {"connect-timeout-ms", required_argument, NULL, 't'},
        {"log-level", required_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {0},
    };
    uint64_t v;
    int c;
    while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        switch (c) {
        case 'e': {
            char *eq = strchr(optarg, '=');
            if (!eq || eq == optarg || !eq[1] || a->nex == MAX_EXPORTS) {
                fprintf(stderr, "qsd-vhost-filter: bad --export %s (TENANT=UPSTREAM)\n", optarg);
                return 2;
            }
            /* a copy: argv stays as given (/proc/PID/cmdline is read by
             * whoever adopts this process) */
            a->ex[a->nex++] =
                (struct vf_export_spec){xstrndup(optarg, (size_t)(eq - optarg)), eq + 1};
            break;
        }
        case 'q':
            if (parse_uint(optarg, 1, VUF_MAX_QUEUES, &v) < 0) {
                fprintf(stderr, "qsd-vhost-filter: --queues must be 1..%d\n", VUF_MAX_QUEUES);
                return 2;
            }
            a->o.queues = (unsigned)v;
            break;
        case 'f':
            if (parse_uint(optarg, 3, 1024, &v) < 0) {
                fprintf(stderr, "qsd-vhost-filter: bad --qsd-fd\n");
                return 2;
            }
            a->qsd_fd = (int)v;
            break;
        case 'm':
            if (parse_uint(optarg, 1, 1, &v) < 0) {
                fprintf(stderr, "qsd-vhost-filter: --max-conns: only 1 (a QSD serves one "
                                "client per export)\n");
                return 2;
            }
            break;
        case 'a':
            a->o.allow_adjacent = true;
            break;
        case 't':
            if (parse_uint(optarg, 1, 600000, &v) < 0) {
                fprintf(stderr, "qsd-vhost-filter: bad --connect-timeout-ms\n");
                return 2;
            }
            a->o.connect_timeout_ms = (unsigned)v;
            break;
        case 'l': {
            enum log_level l;
            if (log_parse_level(optarg, &l) < 0) {
                fprintf(stderr, "qsd-vhost-filter: bad --log-level\n");
                return 2;
            }
            log_set_level(l);
            break;
        }
        case 'h':
            usage(stdout);
            exit(0);
        case 'V':
            printf("qsd-vhost-filter %s\n", QSD_CSI_VERSION);
            exit(0);
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!a->nex || !a->o.queues) {
        usage(stderr);
        return 2;
    }
    if (optind < argc)
        a->qsd_argv = argv + optind;
    return 0;
}

/* Head mode: the tenant-facing sockets appear only once the QSD's own
 * listen, so whoever watches them (the plugin's readiness probe) knows the
 * unit serves.  Looked up in /proc/net/unix, without connecting: QSD 10.0.2
 * closes a vhost-user client's descriptor twice when it hangs up, which can
 * cut a monitor connection made at that moment (docs/rbd.md).  Bounded by
 * READY_TIMEOUT_MS; the QSD's death or SIGTERM end the wait.  0 when ready,
 * else the head's exit status. */
static int wait_upstreams(struct head *h, const struct args *a)
{
    uint64_t deadline = now_ms() + READY_TIMEOUT_MS;
    for (;;) {
        unsigned ready = 0;
        for (unsigned i = 0; i < a->nex; i++)
            ready += startswith(a->ex[i].tenant, "fd:") ||
                     unix_socket_listening(a->ex[i].upstream) == 1;
        if (ready == a->nex)
            return 0;
        int r = on_signal(h);
        if (r == STOP_TERM)
            return stop_qsd(h);
        if (r)
            return r - 1000;
        if (now_ms() >= deadline) {
            log_error(COMP, "the QSD's sockets do not listen", "timeout_ms=%u",
                      READY_TIMEOUT_MS);
            kill(h->child, SIGKILL);
            waitpid(h->child, NULL, 0);
            return 1;
        }
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

int main(int argc, char **argv)
{
    _cleanup_(args_free) struct args a = {0};
    int r = parse_args(argc, argv, &a);
    if (r)
        return r;

    struct vf_server *s = NULL;
    if (!a.qsd_argv) {
        r = vf_server_new(a.ex, a.nex, &a.o, &s);
        if (r < 0) {
            log_error(COMP, "cannot listen", "error=\"%s\"", strerror(-r));
            return 1;
        }
    }
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct head h = {.child = -1};
    h.sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (h.sfd < 0) {
        log_error(COMP, "signalfd", "error=\"%s\"", strerror(errno));
        vf_server_free(s);
        return 1;
    }
    if (a.qsd_argv) {
        pid_t parent = getpid();
        h.child = fork();
        if (h.child < 0) {
            log_error(COMP, "fork", "error=\"%s\"", strerror(errno));
            vf_server_free(s);
            return 1;
        }
        if (h.child == 0)
            run_qsd(parent, a.qsd_argv, a.qsd_fd);
        log_info(COMP, "qsd started", "qsd_pid=%d", (int)h.child);
        if ((r = wait_upstreams(&h, &a)) != 0) {
            close(h.sfd);
            return r;
        }
        r = vf_server_new(a.ex, a.nex, &a.o, &s);
        if (r < 0) {
            log_error(COMP, "cannot listen", "error=\"%s\"", strerror(-r));
            kill(h.child, SIGKILL);
            waitpid(h.child, NULL, 0);
            close(h.sfd);
            return 1;
        }
    }
    r = confine_seccomp(FILTER_PROFILE);
    if (r < 0) {
        log_error(COMP, "cannot confine", "error=\"%s\"", strerror(-r));
        if (h.child > 0) {
            kill(h.child, SIGKILL);
            waitpid(h.child, NULL, 0);
        }
        vf_server_free(s);
        return 1;
    }
    log_info(COMP, "listening", "exports=%u queues=%u head=%s seccomp=%s", a.nex, a.o.queues,
             a.qsd_argv ? "yes" : "no", FILTER_PROFILE == CONFINE_PROFILE_NONE ? "off" : "filter");

    r = vf_server_run(s, h.sfd, on_signal, &h);
    struct vf_stats st;
    vf_server_stats(s, &st);
    vf_server_free(s); /* closes every socket before we report the QSD's end */
    log_info(COMP, "exiting", "connections=%llu passed=%llu modified=%llu refused=%llu "
             "log_suppressed=%llu", (unsigned long long)st.connections,
             (unsigned long long)st.passed, (unsigned long long)st.modified,
             (unsigned long long)st.refused, (unsigned long long)st.log_suppressed);
    close(h.sfd);
    if (r < 0) {
        log_error(COMP, "loop failed", "error=\"%s\"", strerror(-r));
        if (h.child > 0) {
            kill(h.child, SIGKILL);
            waitpid(h.child, NULL, 0);
        }
        return 1;
    }
    if (r == STOP_TERM)
        return stop_qsd(&h);
    return r - 1000;
}
