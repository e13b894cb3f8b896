/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/util.c: see util.h. */
#include "qsd/base/util.h"
#include "qsd/base/fsat.h"

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>

static void oom(void)
{
    fputs("fatal: out of memory\n", stderr);
    abort();
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        oom();
    return p;
}

void *xcalloc(size_t n, size_t m)
{
    void *p = calloc(n ? n : 1, m ? m : 1);
    if (!p)
        oom();
    return p;
}

void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p)
        oom();
    return p;
}

char *xstrdup(const char *s)
{
    char *p = strdup(s);
    if (!p)
        oom();
    return p;
}

char *xstrndup(const char *s, size_t n)
{
    char *p = strndup(s, n);
    if (!p)
        oom();
    return p;
}

char *xstrdup_or_null(const char *s)
{
    return s ? xstrdup(s) : NULL;
}

char *xasprintf(const char *fmt, ...)
{
    va_list ap;
    char *p;
    va_start(ap, fmt);
    int r = vasprintf(&p, fmt, ap);
    va_end(ap);
    if (r < 0)
        oom();
    return p;
}

bool streq_ptr(const char *a, const char *b)
{
    if (!a || !b)
        return a == b;
    return strcmp(a, b) == 0;
}

uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t now_ms(void) { return now_us() / 1000u; }

void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int write_file_atomic(const char *path, const void *data, size_t len, unsigned mode)
{
    _cleanup_free_ char *dir = xstrdup(path);
    char *slash = strrchr(dir, '/');
    const char *base = path;
    if (!slash)
        strcpy(dir, ".");
    else {
        base = path + (slash - dir) + 1;
        if (slash == dir)
            dir[1] = '\0';
        else
            *slash = '\0';
    }
    _cleanup_close_ int dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return -errno;
    return fsat_write_atomic(dfd, base, data, len, mode, -1);
}

static int read_fd(int fd, size_t max, char **ret_data, size_t *ret_len);

int read_file(const char *path, size_t max, char **ret_data, size_t *ret_len)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -errno;
    return read_fd(fd, max, ret_data, ret_len);
}

int read_file_follow(const char *path, size_t max, char **ret_data, size_t *ret_len)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        return -errno;
    if (!S_ISREG(st.st_mode))
        return -EINVAL;
    return read_fd(fd, max, ret_data, ret_len);
}

static int read_fd(int fd, size_t max, char **ret_data, size_t *ret_len)
{
    size_t cap = 4096, len = 0;
    _cleanup_free_ char *buf = xmalloc(cap + 1);
    for (;;) {
        if (len == cap) {
            if (cap >= max)
                return -EFBIG;
            cap = MIN(cap * 2, max);
            buf = xrealloc(buf, cap + 1);
        }
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    if (len > max)
        return -EFBIG;
    buf[len] = '\0';
    if (ret_len)
        *ret_len = len;
    *ret_data = TAKE_PTR(buf);
    return 0;
}

int mkdir_p(const char *path, unsigned mode)
{
    _cleanup_free_ char *p = xstrdup(path);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, mode) < 0 && errno != EEXIST)
            return -errno;
        *s = '/';
    }
    if (mkdir(p, mode) < 0 && errno != EEXIST)
        return -errno;
    struct stat st;
    if (stat(p, &st) < 0)
        return -errno;
    if (!S_ISDIR(st.st_mode))
        return -ENOTDIR;
    return 0;
}

static int rm_rf_at(int dfd, const char *name)
{
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (!S_ISDIR(st.st_mode))
        return unlinkat(dfd, name, 0) < 0 && errno != ENOENT ? -errno : 0;
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return -errno;
    }
    int r = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (streq(de->d_name, ".") || streq(de->d_name, ".."))
            continue;
        int q = rm_rf_at(dirfd(d), de->d_name);
        if (q < 0 && r == 0)
            r = q;
    }
    closedir(d);
    if (unlinkat(dfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT && r == 0)
        r = -errno;
    return r;
}

int rm_rf(const char *path) { return rm_rf_at(AT_FDCWD, path); }

int parse_uint(const char *s, uint64_t min, uint64_t max, uint64_t *ret)
{
    if (!s || !*s || *s == '-' || *s == '+' || *s == ' ')
        return -EINVAL;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno == ERANGE)
        return -ERANGE;
    if (*end)
        return -EINVAL;
    if (v < min || v > max)
        return -ERANGE;
    *ret = v;
    return 0;
}

int errno_from_text(int r, const char *text)
{
    if (text && strstr(text, strerror(ENOSPC)))
        return -ENOSPC;
    if (text && strstr(text, strerror(EDQUOT)))
        return -EDQUOT;
    return r;
}

int parse_size(const char *s, uint64_t *ret)
{
    if (!s || !*s || !(*s >= '0' && *s <= '9'))
        return -EINVAL;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno == ERANGE)
        return -ERANGE;
    unsigned shift = 0;
    switch (*end) {
    case '\0': break;
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    case 'p': case 'P': shift = 50; end++; break;
    case 'b': case 'B': break;
    default: return -EINVAL;
    }
    if (shift && *end == 'i')
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end)
        return -EINVAL;
    if (shift && v > (UINT64_MAX >> shift))
        return -ERANGE;
    *ret = (uint64_t)v << shift;
    return 0;
}

const char *format_size(uint64_t v, char *buf, size_t len)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    unsigned u = 0;
    double d = (double)v;
    while (d >= 1024.0 && u + 1 < ARRAY_SIZE(units)) {
        d /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%" PRIu64 " B", v);
    else
        snprintf(buf, len, "%.1f %s", d, units[u]);
    return buf;
}

int unix_connect(const char *path, bool nonblock, int *ret_fd)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path))
        return -ENAMETOOLONG;
    strcpy(sa.sun_path, path);
    _cleanup_close_ int fd =
        socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS)
        return -errno;
    *ret_fd = TAKE_FD(fd);
    return 0;
}

/* The stream sockets of /proc/net/unix whose address is path: listeners
 * (__SO_ACCEPTCON) or the others (accepted connections and those waiting in
 * a backlog, which carry the listener's path); stops at the first when
 * first is set. */
static int unix_sockets_count(const char *path, bool listeners, bool first)
{
    _cleanup_fclose_ FILE *f = fopen("/proc/net/unix", "re");
    if (!f)
        return -errno;
    char *line = NULL;
    size_t cap = 0;
    int n = 0;
    size_t plen = strlen(path);
    while (!(first && n) && getline(&line, &cap, f) > 0) {
        unsigned long flags = 0;
        unsigned type = 0, st = 0;
        int off = 0;
        /* Num: RefCount Protocol Flags Type St Inode Path */
        if (sscanf(line, "%*s %*s %*s %lx %x %x %*u %n", &flags, &type, &st, &off) != 3 || !off)
            continue;
        const char *p = line + off;
        size_t len = strcspn(p, "\n");
        if (!!(flags & 0x10000) == listeners && type == 1 /* SOCK_STREAM */ && len == plen &&
            memcmp(p, path, plen) == 0)
            n++;
    }
    free(line);
    return n;
}

int unix_socket_listening(const char *path) { return unix_sockets_count(path, true, true); }

int unix_socket_connections(const char *path) { return unix_sockets_count(path, false, false); }
