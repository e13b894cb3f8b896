/* SPDX-License-Identifier: Apache-2.0 */
/* console.c: see console.h (the launcher's side; the client is console_client.c). */
#include "console.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#define COMP "console"
#define CHUNK 4096

struct console {
    struct loop *loop;
    char *log_path;
    uint64_t log_max, log_size;
    int log_fd;
    int qemu_lfd, attach_lfd; /* listening */
    int qemu_fd, client_fd;   /* connected, or -1 */
    struct loop_watch *w_qemu_l, *w_attach_l, *w_qemu, *w_client;
    uint64_t dropped;         /* bytes a slow client did not get */
    char *attach_path, *qemu_path;
};

static int listen_at(const char *path, int *ret)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(a.sun_path))
        return -ENAMETOOLONG;
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            return -EEXIST; /* never remove anything but a stale socket */
        unlink(path);
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    mode_t old = umask(0077);
    int r = bind(fd, (struct sockaddr *)&a, sizeof(a));
    umask(old);
    if (r < 0 || listen(fd, 4) < 0) {
        r = -errno;
        close(fd);
        return r;
    }
    *ret = fd;
    return 0;
}

static int log_open(struct console *c)
{
    c->log_fd = open(c->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0640);
    if (c->log_fd < 0)
        return -errno;
    struct stat st;
    c->log_size = fstat(c->log_fd, &st) == 0 ? (uint64_t)st.st_size : 0;
    return 0;
}

/* Append, rotating first when the chunk would pass the bound. */
static void log_append(struct console *c, const char *buf, size_t n)
{
    if (c->log_fd < 0)
        return;
    if (c->log_size + n > c->log_max) {
        _cleanup_free_ char *old = xasprintf("%s.1", c->log_path);
        close(c->log_fd);
        c->log_fd = -1;
        if (rename(c->log_path, old) < 0)
            log_warn(COMP, "console log rotation failed", "file=%s error=\"%m\"", c->log_path);
        if (log_open(c) < 0) {
            log_error(COMP, "console log lost", "file=%s error=\"%m\"", c->log_path);
            return;
        }
        if (c->log_size) { /* rename failed: start over rather than grow */
            if (ftruncate(c->log_fd, 0) == 0)
                c->log_size = 0;
        }
    }
    if (write_all(c->log_fd, buf, n) == 0)
        c->log_size += n;
}

static void drop_client(struct console *c, const char *why)
{
    if (c->client_fd < 0)
        return;
    loop_watch_remove(c->w_client);
    c->w_client = NULL;
    close(c->client_fd);
    c->client_fd = -1;
    log_info(COMP, "console detached", "reason=%s dropped_bytes=%llu", why,
             (unsigned long long)c->dropped);
}

static void drop_qemu(struct console *c)
{
    if (c->qemu_fd < 0)
        return;
    loop_watch_remove(c->w_qemu);
    c->w_qemu = NULL;
    close(c->qemu_fd);
    c->qemu_fd = -1;
}

static void on_qemu(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    struct console *c = opaque;
    char buf[CHUNK];
    for (int i = 0; i < 16; i++) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n > 0) {
            log_append(c, buf, (size_t)n);
            if (c->client_fd >= 0) {
                ssize_t w = send(c->client_fd, buf, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL);
                if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
                    drop_client(c, "write-error");
                else if (w < n)
                    c->dropped += (uint64_t)(n - (w < 0 ? 0 : w));
            }
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            log_info(COMP, "serial port disconnected", "reason=%s", n == 0 ? "eof" : "error");
            drop_qemu(c);
        }
        return;
    }
}

static void on_client(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    struct console *c = opaque;
    char buf[CHUNK];
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        drop_client(c, "closed");
        return;
    }
    if (n > 0 && c->qemu_fd >= 0) {
        /* Typed input is small; the serial port's buffer takes it. */
        ssize_t w = send(c->qemu_fd, buf, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < n)
            log_warn(COMP, "console input dropped", "bytes=%zd", n - (w < 0 ? 0 : w));
    }
}

static void on_qemu_listen(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    struct console *c = opaque;
    int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (cfd < 0)
        return;
    drop_qemu(c); /* a reconnecting QEMU replaces its old connection */
    c->qemu_fd = cfd;
    c->w_qemu = loop_watch_fd(l, cfd, POLLIN, on_qemu, c);
    log_info(COMP, "serial port connected", "log=%s log_max=%llu", c->log_path,
             (unsigned long long)c->log_max);
}

static void on_attach_listen(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    struct console *c = opaque;
    int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (cfd < 0)
        return;
    if (c->client_fd >= 0) {
        static const char busy[] = "qsd-vm-launcher: the console is in use by another client\r\n";
        ssize_t w = send(cfd, busy, sizeof(busy) - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
        (void)w;
        close(cfd);
        log_info(COMP, "console attach refused", "reason=busy");
        return;
    }
    c->client_fd = cfd;
    c->dropped = 0;
    c->w_client = loop_watch_fd(l, cfd, POLLIN, on_client, c);
    log_info(COMP, "console attached", "socket=%s", c->attach_path);
}

int console_new(struct loop *l, const struct console_config *cfg, struct console **ret)
{
    struct console *c = xcalloc(1, sizeof(*c));
    c->loop = l;
    c->log_fd = c->qemu_lfd = c->attach_lfd = c->qemu_fd = c->client_fd = -1;
    c->log_path = xstrdup(cfg->log_path);
    c->log_max = cfg->log_max < CONSOLE_LOG_MIN ? CONSOLE_LOG_MIN : cfg->log_max;
    c->qemu_path = xstrdup(cfg->qemu_socket);
    c->attach_path = xstrdup(cfg->attach_socket);
    int r = log_open(c);
    if (r < 0) {
        log_error(COMP, "cannot open console log", "file=%s error=\"%s\"", cfg->log_path,
                  strerror(-r));
        console_free(c);
        return r;
    }
    r = listen_at(cfg->qemu_socket, &c->qemu_lfd);
    if (r >= 0)
        r = listen_at(cfg->attach_socket, &c->attach_lfd);
    if (r < 0) {
        log_error(COMP, "cannot listen", "socket=%s error=\"%s\"",
                  c->qemu_lfd < 0 ? cfg->qemu_socket : cfg->attach_socket, strerror(-r));
        console_free(c);
        return r;
    }
    c->w_qemu_l = loop_watch_fd(l, c->qemu_lfd, POLLIN, on_qemu_listen, c);
    c->w_attach_l = loop_watch_fd(l, c->attach_lfd, POLLIN, on_attach_listen, c);
    *ret = c;
    return 0;
}

void console_free(struct console *c)
{
    if (!c)
        return;
    /* Output QEMU wrote that the loop has not read yet (e.g. its last words). */
    if (c->qemu_fd >= 0) {
        char buf[CHUNK];
        ssize_t n;
        for (int i = 0; i < 64 && (n = read(c->qemu_fd, buf, sizeof(buf))) > 0; i++)
            log_append(c, buf, (size_t)n);
    }
    drop_client(c, "exit");
    drop_qemu(c);
    loop_watch_remove(c->w_qemu_l);
    loop_watch_remove(c->w_attach_l);
    if (c->qemu_lfd >= 0) {
        close(c->qemu_lfd);
        unlink(c->qemu_path);
    }
    if (c->attach_lfd >= 0) {
        close(c->attach_lfd);
        unlink(c->attach_path);
    }
    if (c->log_fd >= 0)
        close(c->log_fd);
    free(c->log_path);
    free(c->qemu_path);
    free(c->attach_path);
    free(c);
}
