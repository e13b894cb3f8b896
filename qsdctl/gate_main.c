/* SPDX-License-Identifier: Apache-2.0 */
/* gate_main.c: qsd-node-gate, the node endpoint's mutual-TLS front end
 * (docs/node-operations.md, "The endpoint"; docs/security.md, "The node
 * endpoint's TLS gate").
 *
 * Owns: the order of start-up in both modes (command line; key material
 * read; the unix socket's directory (serve: --forward's, dial:
 * --listen-unix's) made the working directory; the listening socket bound
 * while still privileged; then confinement), signals, and the first and
 * last log lines.  The policy is gate_tls.c's, the sockets gate_io.c's, the
 * relay gate_relay.c's, the command line gate_conf.c's. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "gate_conf.h"
#include "gate_io.h"
#include "gate_tls.h"
#include "qsd/base/confine.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"

#define COMP "gate"

/* LeakSanitizer stops the process's threads with ptrace at exit: a
 * sanitizer build keeps no_new_privs, the identity and the mount namespace,
 * but no seccomp filter (the same exception as qsd-vhost-filter's,
 * docs/security.md). */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GATE_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define GATE_SANITIZED 1
#endif
#ifdef GATE_SANITIZED
#define GATE_PROFILE CONFINE_PROFILE_NONE
#else
#define GATE_PROFILE CONFINE_PROFILE_GATE
#endif

/* The top of the tree is covered by empty tmpfs (what was mounted beneath
 * detached first): after confinement the gate needs no path (serve mode
 * connects by name from its working directory, which keeps the forward
 * socket's directory reachable; dial mode accepts on a socket bound
 * before), and its seccomp profile has no open call anyway.
 * /proc stays (read-only): hiding it first would keep confine.c from
 * reading the mount table for the paths after it. */
static const char *const HIDDEN[] = {
    "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media",
    "/mnt", "/opt", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", NULL,
};

static int on_signal(void *opaque)
{
    int sfd = *(int *)opaque;
    struct signalfd_siginfo si;
    while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
        if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT)
            return 1;
    return 0;
}

static int confine(const struct gate_conf *c)
{
    struct confine cf = CONFINE_INIT;
    cf.uid = c->uid;
    cf.gid = c->gid;
    cf.mount_ns = true;
    cf.hidden = HIDDEN;
    /* two sockets per connection, the listener, epoll, signalfd, stdio */
    cf.rlimit_nofile = 2ull * c->max_conns + 16;
#ifndef GATE_SANITIZED
    cf.rlimit_as = 1ull << 30; /* 1024 connections need some 200 MiB */
#endif
    cf.profile = GATE_PROFILE;
    int r = confine_self(&cf);
#ifdef GATE_SANITIZED
    /* setresuid made the process non-dumpable, which LeakSanitizer's
     * ptrace of its own threads needs. */
    if (r == 0)
        prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
#endif
    return r;
}

/* The unix socket's directory becomes the working directory: serve mode
 * reaches the forward socket by name from there whatever confinement
 * hides; dial mode binds its socket there by name (a path longer than a
 * socket address holds works). */
static int enter_sock_dir(const struct gate_conf *c)
{
    _cleanup_close_ int fd = open(c->sock_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fchdir(fd) < 0)
        return -errno;
    return 0;
}

/* Everything before confinement; 0 or the exit status. */
static int start(const struct gate_conf *c, SSL_CTX **ctx, SSL_CTX **api_ctx,
                 struct gate_server **s, int *sfd)
{
    char err[512];
    int r = gate_tls_ctx_new(c, false, ctx, err, sizeof(err));
    if (r == 0 && c->api_len)
        r = gate_tls_ctx_new(c, true, api_ctx, err, sizeof(err));
    if (r < 0) {
        fprintf(stderr, "qsd-node-gate: %s\n", err);
        return 1;
    }
    const char *opt = c->dial ? "--listen-unix" : "--forward";
    if ((r = enter_sock_dir(c)) < 0) {
        fprintf(stderr, "qsd-node-gate: %s: directory %s: %s\n", opt, c->sock_dir,
                strerror(-r));
        return 1;
    }
    if ((r = gate_server_new(c, *ctx, *api_ctx, s)) < 0) {
        const char *why = r == -EADDRINUSE && c->dial ? "a server answers there"
                          : r == -EEXIST             ? "something not a socket is there"
                                                     : strerror(-r);
        fprintf(stderr, "qsd-node-gate: %s: cannot listen: %s\n",
                c->dial ? "--listen-unix" : "--listen", why);
        return 1;
    }
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_IGN);
    *sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (*sfd < 0) {
        fprintf(stderr, "qsd-node-gate: signalfd: %s\n", strerror(errno));
        return 1;
    }
    /* The log's strftime sets the time zone once, reading /etc/localtime:
     * now, while there is one and open is allowed. */
    tzset();
    if ((r = confine(c)) < 0) {
        fprintf(stderr, "qsd-node-gate: cannot confine itself: %s\n", strerror(-r));
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct gate_conf c;
    char err[512];
    if (gate_conf_parse(argc, argv, &c, err, sizeof(err)) < 0) {
        fprintf(stderr, "qsd-node-gate: %s (--help for usage)\n", err);
        return 2;
    }
    if (c.help) {
        fputs(gate_usage, stdout);
        return 0;
    }
    if (c.version) {
        printf("qsd-node-gate %s\n", QSD_CSI_VERSION);
        return 0;
    }
    if (c.log_level >= 0)
        log_set_level((enum log_level)c.log_level);

    SSL_CTX *ctx = NULL, *api_ctx = NULL;
    struct gate_server *s = NULL;
    int sfd = -1;
    int r = start(&c, &ctx, &api_ctx, &s, &sfd);
    if (r == 0) {
        char addr[80];
        /* (no getuid here: not in the gate's seccomp profile) */
        if (c.dial)
            log_info(COMP, "listening", "mode=dial socket=%s port=%u peer_name=%s api=%s "
                     "max_conns=%u uid=%lld seccomp=%s", c.listen_unix, c.port, c.peer_name,
                     c.api_len ? gate_format_addr((const struct sockaddr *)&c.api, addr,
                                                  sizeof(addr))
                               : "none",
                     c.max_conns,
                     c.uid == (uid_t)-1 ? -1LL : (long long)c.uid,
                     GATE_PROFILE == CONFINE_PROFILE_NONE ? "off" : "gate");
        else
            log_info(COMP, "listening", "addr=%s forward=%s peer_name=%s max_conns=%u uid=%lld "
                     "seccomp=%s", gate_server_addr(s, addr, sizeof(addr)), c.forward,
                     c.peer_name, c.max_conns, c.uid == (uid_t)-1 ? -1LL : (long long)c.uid,
                     GATE_PROFILE == CONFINE_PROFILE_NONE ? "off" : "gate");
        r = gate_server_run(s, sfd, on_signal, &sfd);
        struct gate_stats st;
        gate_server_stats(s, &st);
        if (r < 0)
            log_error(COMP, "loop failed", "error=\"%s\"", strerror(-r));
        gate_server_free(s); /* closes every connection, logged */
        s = NULL;
        log_info(COMP, "exiting", "accepted=%llu relayed=%llu refused=%llu busy=%llu "
                 "log_suppressed=%llu", (unsigned long long)st.accepted,
                 (unsigned long long)st.relayed, (unsigned long long)st.refused,
                 (unsigned long long)st.busy, (unsigned long long)st.log_suppressed);
        r = r < 0 ? 1 : 0;
    }
    gate_server_free(s);
    SSL_CTX_free(ctx);
    SSL_CTX_free(api_ctx);
    if (sfd >= 0)
        close(sfd);
    return r;
}
