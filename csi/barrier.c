/* SPDX-License-Identifier: Apache-2.0 */
/* barrier.c: see barrier.h (consumers of vhost-user sockets, stopped and
 * continued around a group snapshot). */
#include "barrier.h"
#include "qsd/base/log.h"
#include "qsd/base/proc.h"
#include "qsd/base/util.h"
#include "qsd/state/records.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <jansson.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define DIAG_BUF 32768
#define DIAG_TIMEOUT_S 2

/* r, with *ret_msg "what: strerror(-r)". */
static int fail(int r, char **ret_msg, const char *what)
{
    *ret_msg = xasprintf("%s: %s", what, strerror(-r));
    return r;
}

/* The socket file a unix socket is bound to (accepted sockets share their
 * listener's), in the kernel's dev_t encoding (major << 20 | minor). */
struct sockfile {
    uint32_t dev;
    uint64_t ino;
};

/* Add the peer inode of every connected unix socket of fd's network
 * namespace (fd: a NETLINK_SOCK_DIAG socket) whose file is one of
 * files[0..nf) to *peers (with the file's index). */
static int diag_dump(int fd, const struct sockfile *files, size_t nf, uint32_t **peers,
                     size_t **which, size_t *np, char **ret_msg)
{
    struct timeval tv = {.tv_sec = DIAG_TIMEOUT_S};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    struct {
        struct nlmsghdr nh;
        struct unix_diag_req r;
    } req = {
        .nh = {.nlmsg_len = sizeof(req), .nlmsg_type = SOCK_DIAG_BY_FAMILY,
               .nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP},
        .r = {.sdiag_family = AF_UNIX, .udiag_states = ~0u,
              .udiag_show = UDIAG_SHOW_VFS | UDIAG_SHOW_PEER},
    };
    if (send(fd, &req, sizeof(req), 0) < 0)
        return fail(-errno, ret_msg, "cannot query the unix socket table");
    _cleanup_free_ char *buf = xmalloc(DIAG_BUF);
    for (;;) {
        ssize_t len = recv(fd, buf, DIAG_BUF, 0);
        if (len < 0)
            return fail(-errno, ret_msg, "cannot read the unix socket table");
        for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)len);
             h = NLMSG_NEXT(h, len)) {
            if (h->nlmsg_type == NLMSG_DONE)
                return 0;
            if (h->nlmsg_type == NLMSG_ERROR) {
                *ret_msg = xstrdup("the unix socket table answered an error");
                return -EIO;
            }
            struct unix_diag_msg *m = NLMSG_DATA(h);
            int rlen = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof(*m)));
            const struct unix_diag_vfs *vfs = NULL;
            uint32_t peer = 0;
            for (struct rtattr *a = (struct rtattr *)(m + 1); RTA_OK(a, rlen);
                 a = RTA_NEXT(a, rlen)) {
                if (a->rta_type == UNIX_DIAG_VFS && RTA_PAYLOAD(a) >= (int)sizeof(*vfs))
                    vfs = RTA_DATA(a);
                else if (a->rta_type == UNIX_DIAG_PEER && RTA_PAYLOAD(a) >= (int)sizeof(peer))
                    memcpy(&peer, RTA_DATA(a), sizeof(peer));
            }
            if (!vfs || !peer)
                continue;
            for (size_t i = 0; i < nf; i++)
                if (files[i].ino == vfs->udiag_vfs_ino && files[i].dev == vfs->udiag_vfs_dev) {
                    *peers = xrealloc(*peers, (*np + 1) * sizeof(**peers));
                    *which = xrealloc(*which, (*np + 1) * sizeof(**which));
                    (*peers)[*np] = peer;
                    (*which)[(*np)++] = i;
                }
        }
    }
}

/* A NETLINK_SOCK_DIAG socket of the network namespace nsfd names (-1:
 * this thread's own); the thread returns to its own (selffd) at once.  A
 * socket keeps the namespace it was made in. */
static int diag_socket(int nsfd, int selffd)
{
    if (nsfd >= 0 && setns(nsfd, CLONE_NEWNET) < 0)
        return -errno;
    int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    int e = fd < 0 ? -errno : 0;
    if (nsfd >= 0 && setns(selffd, CLONE_NEWNET) < 0) {
        /* never left in another namespace: the worker cannot go on */
        log_error("barrier", "cannot return to the plugin's network namespace", "errno=%d", errno);
        abort();
    }
    return fd < 0 ? e : fd;
}

/* The peers of the connections accepted on files[0..nf), in every network
 * namespace a process is in.  An accepted unix socket is made in the
 * connecting socket's namespace (the kernel's unix_stream_connect), so a
 * VM pod's connection to an export socket is listed in the pod's
 * namespace, not in the plugin's (the host's): each namespace is asked.
 * The plugin's own must answer; another that cannot be entered or asked
 * (gone meanwhile) is skipped. */
static int diag_peers(const struct sockfile *files, size_t nf, uint32_t **peers, size_t **which,
                      size_t *np, char **ret_msg)
{
    _cleanup_close_ int selffd = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    struct stat self;
    if (selffd < 0 || fstat(selffd, &self) < 0)
        return fail(-errno, ret_msg, "cannot open this process's network namespace");
    {
        _cleanup_close_ int fd = diag_socket(-1, selffd);
        if (fd < 0)
            return fail(fd, ret_msg, "cannot open NETLINK_SOCK_DIAG");
        int r = diag_dump(fd, files, nf, peers, which, np, ret_msg);
        if (r < 0)
            return r;
    }
    DIR *d = opendir("/proc");
    if (!d)
        return fail(-errno, ret_msg, "cannot read /proc");
    ino_t *seen = NULL;
    size_t nseen = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        uint64_t pid;
        if (parse_uint(de->d_name, 1, INT32_MAX, &pid) < 0)
            continue;
        _cleanup_free_ char *p = xasprintf("%s/ns/net", de->d_name);
        _cleanup_close_ int nsfd = openat(dirfd(d), p, O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (nsfd < 0 || fstat(nsfd, &st) < 0 || st.st_ino == self.st_ino)
            continue;
        bool dup = false;
        for (size_t i = 0; i < nseen && !dup; i++)
            dup = seen[i] == st.st_ino;
        if (dup)
            continue;
        seen = xrealloc(seen, (nseen + 1) * sizeof(*seen));
        seen[nseen++] = st.st_ino;
        _cleanup_close_ int fd = diag_socket(nsfd, selffd);
        _cleanup_free_ char *why = NULL;
        if (fd >= 0 && diag_dump(fd, files, nf, peers, which, np, &why) < 0)
            log_debug("barrier", "a network namespace's unix sockets not read", "pid=%s why=\"%s\"",
                      de->d_name, why ? why : "");
    }
    free(seen);
    closedir(d);
    return 0;
}

static int all_stopped(pid_t pid);

/* Does process pid hold one of the socket inodes peers[0..np)?  Index or -1. */
static ssize_t holds_peer(int procfd, const char *pid, const uint32_t *peers, size_t np)
{
    _cleanup_free_ char *p = xasprintf("%s/fd", pid);
    int dfd = openat(procfd, p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return -1;
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return -1;
    }
    ssize_t found = -1;
    struct dirent *de;
    char link[64];
    while (found < 0 && (de = readdir(d))) {
        ssize_t n = readlinkat(dirfd(d), de->d_name, link, sizeof(link) - 1);
        unsigned long ino;
        if (n <= 0)
            continue;
        link[n] = '\0';
        if (sscanf(link, "socket:[%lu]", &ino) != 1)
            continue;
        for (size_t i = 0; i < np; i++)
            if (peers[i] == ino)
                found = (ssize_t)i;
    }
    closedir(d);
    return found;
}

int barrier_find(const char *const *sockets, size_t n, struct consumer **ret, size_t *ret_n,
                 char **ret_msg)
{
    *ret = NULL;
    *ret_n = 0;
    struct sockfile *files = xcalloc(n ? n : 1, sizeof(*files));
    size_t nf = 0;
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (!sockets[i] || stat(sockets[i], &st) < 0 || !S_ISSOCK(st.st_mode))
            files[i] = (struct sockfile){0};
        else
            files[i] = (struct sockfile){major(st.st_dev) << 20 | minor(st.st_dev), st.st_ino};
        nf = i + 1;
    }
    _cleanup_free_ uint32_t *peers = NULL;
    _cleanup_free_ size_t *which = NULL;
    size_t np = 0;
    int r = diag_peers(files, nf, &peers, &which, &np, ret_msg);
    free(files);
    if (r < 0 || np == 0)
        return r;
    DIR *d = opendir("/proc");
    if (!d)
        return fail(-errno, ret_msg, "cannot read /proc");
    struct dirent *de;
    pid_t self = getpid();
    while ((de = readdir(d))) {
        uint64_t pid;
        if (parse_uint(de->d_name, 2, INT32_MAX, &pid) < 0 || (pid_t)pid == self)
            continue;
        ssize_t k = holds_peer(dirfd(d), de->d_name, peers, np);
        if (k < 0)
            continue;
        bool dup = false;
        for (size_t i = 0; i < *ret_n; i++)
            dup |= (*ret)[i].pid == (pid_t)pid;
        uint64_t st;
        if (dup || proc_starttime((pid_t)pid, &st) < 0)
            continue;
        *ret = xrealloc(*ret, (*ret_n + 1) * sizeof(**ret));
        (*ret)[(*ret_n)++] = (struct consumer){.pid = (pid_t)pid, .starttime = st,
                                               .member = which[k], .pidfd = -1,
                                               .already = all_stopped((pid_t)pid) == 1};
    }
    closedir(d);
    return 0;
}

int barrier_journal(const char *dir, const char *name, const struct consumer *cs, size_t n,
                    char **ret_msg)
{
    int r = mkdir_p(dir, 0700);
    if (r < 0)
        return fail(r, ret_msg, dir);
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        if (!cs[i].already)
            json_array_append_new(a, json_pack("{s:i, s:I}", "pid", (int)cs[i].pid,
                                               "starttime", (json_int_t)cs[i].starttime));
    json_t *j = json_pack("{s:i, s:o}", "version", 1, "stopped", a);
    _cleanup_free_ char *text = json_dumps(j, JSON_INDENT(2));
    json_decref(j);
    _cleanup_free_ char *path = xasprintf("%s/%s.json", dir, name);
    if ((r = write_file_atomic(path, text, strlen(text), 0600)) < 0)
        return fail(r, ret_msg, path);
    return 0;
}

void barrier_journal_remove(const char *dir, const char *name)
{
    _cleanup_free_ char *path = xasprintf("%s/%s.json", dir, name);
    unlink(path);
}

/* 1 when every thread of pid is stopped (or gone), 0 when not yet. */
static int all_stopped(pid_t pid)
{
    _cleanup_free_ char *tdir = xasprintf("/proc/%d/task", (int)pid);
    DIR *d = opendir(tdir);
    if (!d)
        return 1; /* gone */
    int ok = 1;
    struct dirent *de;
    while (ok && (de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        _cleanup_free_ char *p = xasprintf("%s/%s/stat", tdir, de->d_name), *text = NULL;
        size_t len;
        if (read_file(p, 4096, &text, &len) < 0)
            continue; /* the thread ended */
        const char *e = strrchr(text, ')');
        char state = e && e[1] == ' ' ? e[2] : '?';
        if (state != 'T' && state != 't' && state != 'Z' && state != 'X')
            ok = 0;
    }
    closedir(d);
    return ok;
}

int barrier_stop(struct consumer *cs, size_t n, unsigned timeout_ms, size_t *ret_failed,
                 char **ret_msg)
{
    uint64_t until = now_ms() + timeout_ms;
    for (size_t i = 0; i < n; i++) {
        uint64_t st;
        if (cs[i].already)
            continue;
        cs[i].pidfd = pidfd_open_pid(cs[i].pid);
        /* The pidfd pins the process: its start time proves it is the one found. */
        if (cs[i].pidfd < 0 || proc_starttime(cs[i].pid, &st) < 0 || st != cs[i].starttime) {
            *ret_failed = i;
            *ret_msg = xasprintf("consumer process %d is gone", (int)cs[i].pid);
            return -ESRCH;
        }
        int r = pidfd_signal(cs[i].pidfd, SIGSTOP);
        if (r < 0) {
            *ret_failed = i;
            *ret_msg = xasprintf("cannot stop consumer process %d: %s", (int)cs[i].pid,
                                 strerror(-r));
            return r;
        }
        cs[i].stopped = true;
    }
    for (size_t i = 0; i < n; i++)
        while (!all_stopped(cs[i].pid)) {
            if (now_ms() >= until) {
                *ret_failed = i;
                *ret_msg = xasprintf("consumer process %d did not stop within %u ms",
                                     (int)cs[i].pid, timeout_ms);
                return -ETIMEDOUT;
            }
            usleep(200);
        }
    return 0;
}

void barrier_cont(struct consumer *cs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (cs[i].stopped && pidfd_signal(cs[i].pidfd, SIGCONT) < 0)
            log_warn("controller", "cannot continue a consumer process", "pid=%d", (int)cs[i].pid);
        cs[i].stopped = false;
        if (cs[i].pidfd >= 0)
            close(cs[i].pidfd);
        cs[i].pidfd = -1;
    }
}

static void recover_one(const char *path)
{
    _cleanup_free_ char *text = NULL;
    size_t len;
    if (read_file(path, 1 << 20, &text, &len) < 0)
        return;
    json_t *j = json_loadb(text, len, 0, NULL), *a = json_object_get(j, "stopped"), *e;
    size_t i;
    json_array_foreach(a, i, e) {
        json_int_t pid = json_integer_value(json_object_get(e, "pid"));
        json_int_t st = json_integer_value(json_object_get(e, "starttime"));
        uint64_t now_st;
        if (pid < 2 || proc_starttime((pid_t)pid, &now_st) < 0 || now_st != (uint64_t)st)
            continue;
        _cleanup_close_ int pfd = pidfd_open_pid((pid_t)pid);
        if (pfd >= 0 && proc_starttime((pid_t)pid, &now_st) == 0 && now_st == (uint64_t)st &&
            pidfd_signal(pfd, SIGCONT) == 0)
            log_info("plugin", "continued a consumer stopped by a group snapshot cut short",
                     "pid=%d", (int)pid);
    }
    json_decref(j);
}

int barrier_recover(const char *dir)
{
    records_sweep(dir); /* a journal never written: nobody stopped yet */
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l < 6 || strcmp(de->d_name + l - 5, ".json") != 0)
            continue;
        _cleanup_free_ char *p = xasprintf("%s/%s", dir, de->d_name);
        recover_one(p);
        unlink(p);
        n++;
    }
    closedir(d);
    return n;
}
