/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/probe.c: see probe.h. */
#include "qsd/base/probe.h"
#include "qsd/base/fsat.h"
#include "qsd/base/util.h"

#include <fcntl.h>
#include <sys/stat.h>

int probe_socket_at(int dfd, const char *rel)
{
    int s;
    int r = probe_connect_at(dfd, rel, &s);
    if (r < 0)
        return r;
    close(s);
    return 0;
}

int probe_connect_at(int dfd, const char *rel, int *ret_fd)
{
    _cleanup_close_ int fd = -1;
    int r = fsat_open(dfd, rel, O_PATH, &fd);
    if (r < 0)
        return r;
    struct stat st;
    if (fstat(fd, &st) < 0)
        return -errno;
    if (!S_ISSOCK(st.st_mode))
        return -ENOTSOCK;
    char magic[32];
    snprintf(magic, sizeof(magic), "/proc/self/fd/%d", fd);
    int s;
    r = unix_connect(magic, true, &s);
    if (r < 0)
        return r;
    *ret_fd = s;
    return 0;
}

int probe_socket(const char *path)
{
    const char *slash = strrchr(path, '/');
    _cleanup_free_ char *dir = slash ? xstrndup(path, (size_t)(slash - path)) : xstrdup(".");
    const char *name = slash ? slash + 1 : path;
    _cleanup_close_ int dfd = open(*dir ? dir : "/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return -errno;
    return probe_socket_at(dfd, name);
}
