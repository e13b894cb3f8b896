/* SPDX-License-Identifier: Apache-2.0 */
/* preamble.c: the line exchange with the local TLS gate (preamble.h). */
#include "preamble.h"
#include "qsd/base/util.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

#define READ_CHUNK 4096

int preamble_wait(int fd, short events, uint64_t deadline_us)
{
    uint64_t now = now_us();
    if (now >= deadline_us)
        return -ETIMEDOUT;
    uint64_t ms = (deadline_us - now + 999) / 1000;
    struct pollfd pfd = {.fd = fd, .events = events};
    int r = poll(&pfd, 1, (int)MIN(ms, (uint64_t)INT32_MAX));
    if (r < 0 && errno != EINTR)
        return -errno;
    return 0;
}

static int write_preamble(int fd, const uint8_t *p, size_t len, uint64_t deadline_us,
                          char **ret_msg)
{
    size_t off = 0;
    while (off < len) {
        ssize_t w = send(fd, p + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno != EAGAIN && errno != EINTR) {
            int e = errno;
            *ret_msg = xasprintf("writing the preamble failed: %s", strerror(e));
            return -e;
        }
        if (w > 0) {
            off += (size_t)w;
            continue;
        }
        int r = preamble_wait(fd, POLLOUT, deadline_us);
        if (r < 0) {
            *ret_msg = r == -ETIMEDOUT ? xstrdup("deadline exceeded writing the preamble")
                                       : xasprintf("poll failed: %s", strerror(-r));
            return r;
        }
    }
    return 0;
}

int preamble_exchange(int fd, const void *preamble, size_t len, const char *expect,
                      uint64_t deadline_us, uint8_t **ret_rest, size_t *ret_rest_len,
                      char **ret_msg)
{
    int r = write_preamble(fd, preamble, len, deadline_us, ret_msg);
    if (r < 0)
        return r;
    uint8_t buf[READ_CHUNK];
    size_t got = 0;
    uint8_t *nl = NULL;
    while (!(nl = memchr(buf, '\n', got))) {
        if (got >= PREAMBLE_LINE_MAX) {
            *ret_msg = xasprintf("the answer to the preamble is over %d bytes", PREAMBLE_LINE_MAX);
            return -EPROTO;
        }
        ssize_t n = recv(fd, buf + got, sizeof(buf) - got, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            *ret_msg = xasprintf("the connection closed before the preamble's answer%s%s",
                                 n < 0 ? ": " : "", n < 0 ? strerror(errno) : "");
            return -EPROTO;
        }
        if (n > 0) {
            got += (size_t)n;
            continue;
        }
        if ((r = preamble_wait(fd, POLLIN, deadline_us)) < 0) {
            *ret_msg = r == -ETIMEDOUT
                           ? xstrdup("deadline exceeded waiting for the preamble's answer")
                           : xasprintf("poll failed: %s", strerror(-r));
            return r;
        }
    }
    size_t line = (size_t)(nl - buf);
    if (line >= PREAMBLE_LINE_MAX) {
        *ret_msg = xasprintf("the answer to the preamble is over %d bytes", PREAMBLE_LINE_MAX);
        return -EPROTO;
    }
    if (line != strlen(expect) || memcmp(buf, expect, line) != 0) {
        char shown[PREAMBLE_LINE_MAX];
        for (size_t i = 0; i < line; i++)
            shown[i] = buf[i] >= 0x20 && buf[i] < 0x7f ? (char)buf[i] : '?';
        *ret_msg = xasprintf("the preamble was refused: \"%.*s\"", (int)line, shown);
        return -EPROTO;
    }
    *ret_rest_len = got - line - 1;
    *ret_rest = *ret_rest_len ? xmalloc(*ret_rest_len) : NULL;
    if (*ret_rest_len)
        memcpy(*ret_rest, nl + 1, *ret_rest_len);
    return 0;
}
