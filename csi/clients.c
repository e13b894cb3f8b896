/* SPDX-License-Identifier: Apache-2.0 */
/* clients.c: see clients.h. */
#include "clients.h"
#include "qsd/base/proc.h"
#include "qsd/base/util.h"

#include <dirent.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>

int64_t realtime_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int export_clients(pid_t pid, const char *socket_path)
{
    _cleanup_close_ int pidfd = pidfd_open_pid(pid);
    if (pidfd < 0)
        return pidfd;
    _cleanup_free_ char *fddir = xasprintf("/proc/%d/fd", (int)pid);
    DIR *d = opendir(fddir);
    if (!d)
        return -errno;
    int n = 0, err = 0, seen = 0;
    struct dirent *de;
    while ((de = readdir(d)) && seen++ < 4096) {
        uint64_t fdn;
        if (parse_uint(de->d_name, 0, INT32_MAX, &fdn) < 0)
            continue;
        char link[64];
        ssize_t len = readlinkat(dirfd(d), de->d_name, link, sizeof(link) - 1);
        if (len < 0)
            continue;
        link[len] = '\0';
        if (!startswith(link, "socket:"))
            continue;
        _cleanup_close_ int fd = (int)syscall(SYS_pidfd_getfd, pidfd, (int)fdn, 0);
        if (fd < 0) {
            if (errno != EBADF)
                err = -errno;
            continue;
        }
        int dom = 0, type = 0, acc = 0;
        socklen_t sl = sizeof(int);
        if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &sl) < 0 || dom != AF_UNIX)
            continue;
        sl = sizeof(int);
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &sl) < 0 || type != SOCK_STREAM)
            continue;
        sl = sizeof(int);
        if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &sl) < 0 || acc)
            continue;
        struct sockaddr_un a = {0};
        socklen_t al = sizeof(a);
        if (getsockname(fd, (struct sockaddr *)&a, &al) < 0 || al <= offsetof(struct sockaddr_un, sun_path))
            continue;
        size_t pl = al - offsetof(struct sockaddr_un, sun_path);
        if (pl >= sizeof(a.sun_path))
            pl = sizeof(a.sun_path) - 1;
        a.sun_path[pl] = '\0';
        if (!streq(a.sun_path, socket_path))
            continue;
        /* An accepted connection whose peer has hung up is on its way out. */
        struct pollfd pfd = {.fd = fd, .events = POLLRDHUP};
        if (poll(&pfd, 1, 0) == 1 && (pfd.revents & (POLLHUP | POLLRDHUP)))
            continue;
        n++;
    }
    closedir(d);
    return n > 0 || !err ? n : err;
}
