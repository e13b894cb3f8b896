/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/qsdlog.c: a volume's QSD log: the pump from its pipe into
 * ctl/<vol>/qsd.log, the file's bound, its last words.  See qsdlog.h. */
#include "qsd/qemu/qsdlog.h"
#include "qsd/base/util.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#define LOG_MAX (1u << 20)

/* The last line the current QSD logged (after the last spawn marker): its own
 * error message when it fails to start. */
#define LOG_TAIL_READ 8192

char *qsdlog_tail(const char *path)
{
    /* Only the end of the file: one bounded read, whatever its size. */
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        return xstrdup("(no log)");
    off_t off = st.st_size > LOG_TAIL_READ ? st.st_size - LOG_TAIL_READ : 0;
    char data[LOG_TAIL_READ + 1];
    ssize_t n = pread(fd, data, LOG_TAIL_READ, off);
    if (n < 0)
        return xstrdup("(no log)");
    data[n] = '\0';
    const char *start = data, *m;
    while ((m = strstr(start, QSDLOG_SPAWN_MARK)))
        start = m + strlen(QSDLOG_SPAWN_MARK);
    /* The QSD's last words, not its filter head's own lines ("qsd exited"):
     * the last line that is not the filter's, else the last line. */
    const char *last = NULL;
    char *end = data + n;
    while (end > start) {
        char *eol = end;
        while (end > start && end[-1] != '\n')
            end--;
        *eol = '\0';
        if (strspn(end, " \t\r") != strlen(end)) {
            if (!strstr(end, "comp=vufilter"))
                return xstrndup(end, 511);
            if (!last)
                last = end;
        }
        if (end > start)
            end--; /* the newline before this line */
    }
    return xstrndup(last ? last : "(nothing logged)", 511);
}

int qsdlog_trim(const char *path)
{
    /* QSD appends (O_APPEND, inherited): after ftruncate its next line goes
     * to the new end.  A few lines written between the read and the
     * truncation may be lost; the bound holds. */
    _cleanup_close_ int fd =
        open(path, O_RDWR | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        return -errno;
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size <= LOG_MAX)
        return 0;
    char tail[LOG_TAIL_READ];
    ssize_t n = pread(fd, tail, sizeof(tail), st.st_size - (off_t)sizeof(tail));
    if (n < 0)
        return -errno;
    const char *nl = memchr(tail, '\n', (size_t)n);
    size_t keep = nl ? (size_t)(tail + n - (nl + 1)) : 0;
    if (ftruncate(fd, 0) < 0)
        return -errno;
    static const char mark[] = "=== qsd-csi: log truncated (over its bound) ===\n";
    (void)!write(fd, mark, sizeof(mark) - 1);
    if (keep)
        (void)!write(fd, nl + 1, keep);
    return 1;
}

/* The QSD writes its log into a pipe, never into a file: a pipe holds at
 * most 64 KiB whoever reads it, its write end is non-blocking (a full pipe
 * drops the QSD's lines, it never stops the QSD) and, with no reader (the
 * plugin is down), the QSD's writes fail at once (EPIPE; QSD ignores
 * SIGPIPE).  So nothing the QSD logs grows without a reader.  The reader
 * (this process's loop, or the next one's: qsd_adopt reopens the pipe
 * through /proc/PID/fd/2) appends what it reads to ctl/<vol>/qsd.log and
 * keeps that file under LOG_MAX, whose last lines log_tail reads. */
#define LOG_PUMP_MAX (256u << 10) /* bytes moved per wake-up */

void qsdlog_append(const char *path, const char *buf, size_t n)
{
    _cleanup_close_ int fd =
        open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
    if (fd < 0)
        return;
    (void)!write(fd, buf, n);
    struct stat st;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size > LOG_MAX)
        qsdlog_trim(path);
}

/* Move what the pipe holds into the log file; false at end of file. */
static bool drain(struct qsdlog *lg)
{
    char buf[16384];
    size_t moved = 0;
    while (moved < LOG_PUMP_MAX) {
        ssize_t n = read(lg->pipe, buf, sizeof(buf));
        if (n > 0) {
            qsdlog_append(lg->path, buf, (size_t)n);
            moved += (size_t)n;
            continue;
        }
        return n < 0 && (errno == EAGAIN || errno == EINTR);
    }
    return true;
}

void qsdlog_init(struct qsdlog *lg, struct loop *l, const char *path)
{
    *lg = (struct qsdlog){.loop = l, .path = xstrdup(path), .pipe = -1};
}

void qsdlog_stop(struct qsdlog *lg)
{
    loop_watch_remove(lg->watch);
    lg->watch = NULL;
    closep(&lg->pipe);
    lg->pipe = -1;
}

void qsdlog_clear(struct qsdlog *lg)
{
    qsdlog_stop(lg);
    free(lg->path);
    lg->path = NULL;
}

void qsdlog_drain(struct qsdlog *lg)
{
    if (lg->pipe >= 0 && !drain(lg))
        qsdlog_stop(lg);
}

static void on_log(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    qsdlog_drain(opaque);
}

void qsdlog_watch(struct qsdlog *lg, int fd)
{
    qsdlog_stop(lg); /* a previous life's, if any */
    lg->pipe = fd;
    lg->watch = loop_watch_fd(lg->loop, fd, POLLIN, on_log, lg);
}

void qsdlog_reopen(struct qsdlog *lg, pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/2", (int)pid);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0)
        return;
    if (fstat(fd, &st) < 0 || !S_ISFIFO(st.st_mode)) {
        close(fd); /* a QSD started with a log file (before pipes) */
        return;
    }
    qsdlog_watch(lg, fd);
}

void qsdlog_mark_spawn(const char *path)
{
    qsdlog_append(path, QSDLOG_SPAWN_MARK, strlen(QSDLOG_SPAWN_MARK));
}
