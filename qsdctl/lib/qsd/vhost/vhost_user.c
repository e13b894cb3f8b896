/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/vhost/vhost_user.c: vhost-user message encoding and transport (see vhost_user.h). */
#include "qsd/vhost/vhost_user.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "qsd/base/util.h"

_Static_assert(sizeof(struct vhost_user_hdr) == VHOST_USER_HDR_SIZE, "header layout");
_Static_assert(sizeof(struct vhost_vring_addr) == 40, "vring addr layout");
_Static_assert(sizeof(struct vhost_user_mem_region) == 32, "mem region layout");

const char *vhost_user_request_name(uint32_t request)
{
    static const char *const names[] = {
        [VHOST_USER_GET_FEATURES] = "GET_FEATURES",
        [VHOST_USER_SET_FEATURES] = "SET_FEATURES",
        [VHOST_USER_SET_OWNER] = "SET_OWNER",
        [VHOST_USER_RESET_OWNER] = "RESET_OWNER",
        [VHOST_USER_SET_MEM_TABLE] = "SET_MEM_TABLE",
        [VHOST_USER_SET_LOG_BASE] = "SET_LOG_BASE",
        [VHOST_USER_SET_LOG_FD] = "SET_LOG_FD",
        [VHOST_USER_SET_VRING_NUM] = "SET_VRING_NUM",
        [VHOST_USER_SET_VRING_ADDR] = "SET_VRING_ADDR",
        [VHOST_USER_SET_VRING_BASE] = "SET_VRING_BASE",
        [VHOST_USER_GET_VRING_BASE] = "GET_VRING_BASE",
        [VHOST_USER_SET_VRING_KICK] = "SET_VRING_KICK",
        [VHOST_USER_SET_VRING_CALL] = "SET_VRING_CALL",
        [VHOST_USER_SET_VRING_ERR] = "SET_VRING_ERR",
        [VHOST_USER_GET_PROTOCOL_FEATURES] = "GET_PROTOCOL_FEATURES",
        [VHOST_USER_SET_PROTOCOL_FEATURES] = "SET_PROTOCOL_FEATURES",
        [VHOST_USER_GET_QUEUE_NUM] = "GET_QUEUE_NUM",
        [VHOST_USER_SET_VRING_ENABLE] = "SET_VRING_ENABLE",
        [VHOST_USER_SET_BACKEND_REQ_FD] = "SET_BACKEND_REQ_FD",
        [VHOST_USER_GET_CONFIG] = "GET_CONFIG",
        [VHOST_USER_SET_CONFIG] = "SET_CONFIG",
    };
    if (request < ARRAY_SIZE(names) && names[request])
        return names[request];
    return "UNKNOWN";
}

int vhost_user_msg_init(struct vhost_user_msg *m, uint32_t request, uint32_t flags,
                        const void *payload, uint32_t size)
{
    if (size > VHOST_USER_PAYLOAD_MAX || (size && !payload))
        return -EINVAL;
    memset(&m->hdr, 0, sizeof(m->hdr));
    m->hdr.request = request;
    m->hdr.flags = VHOST_USER_VERSION | flags;
    m->hdr.size = size;
    if (size)
        memcpy(m->p.raw, payload, size);
    m->nfds = 0;
    return 0;
}

int vhost_user_check_reply(const struct vhost_user_hdr *h, uint32_t request, uint32_t want_size)
{
    if ((h->flags & VHOST_USER_VERSION_MASK) != VHOST_USER_VERSION)
        return -EPROTO;
    if (!(h->flags & VHOST_USER_REPLY_MASK))
        return -EPROTO;
    if (h->request != request)
        return -EPROTO;
    if (h->size > VHOST_USER_PAYLOAD_MAX)
        return -EMSGSIZE;
    if (want_size && h->size != want_size)
        return -EMSGSIZE;
    return 0;
}

static int wait_fd(int fd, short events, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = events};
    for (;;) {
        int r = poll(&p, 1, timeout_ms);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            return -ETIMEDOUT;
        return 0;
    }
}

int vhost_user_send(int fd, const struct vhost_user_msg *m, int timeout_ms)
{
    if (m->nfds > VHOST_USER_MAX_FDS || m->hdr.size > VHOST_USER_PAYLOAD_MAX)
        return -EINVAL;
    struct iovec iov[2] = {
        {.iov_base = (void *)&m->hdr, .iov_len = sizeof(m->hdr)},
        {.iov_base = (void *)m->p.raw, .iov_len = m->hdr.size},
    };
    union {
        char buf[CMSG_SPACE(sizeof(int) * VHOST_USER_MAX_FDS)];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof(ctl));
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = m->hdr.size ? 2 : 1};
    if (m->nfds) {
        mh.msg_control = ctl.buf;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * m->nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * m->nfds);
        memcpy(CMSG_DATA(c), m->fds, sizeof(int) * m->nfds);
    }
    size_t total = sizeof(m->hdr) + m->hdr.size;
    for (;;) {
        int r = wait_fd(fd, POLLOUT, timeout_ms);
        if (r < 0)
            return r;
        ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n < 0)
            return -errno;
        /* Messages are small; a unix stream socket takes them whole. */
        if ((size_t)n != total)
            return -EIO;
        return 0;
    }
}

/* Read exactly len bytes, collecting fds from the first chunk's ancillary data. */
static int recv_exact(int fd, void *buf, size_t len, struct vhost_user_msg *m, uint64_t deadline)
{
    size_t got = 0;
    while (got < len) {
        uint64_t now = now_ms();
        if (now >= deadline)
            return -ETIMEDOUT;
        int r = wait_fd(fd, POLLIN, (int)(deadline - now));
        if (r < 0)
            return r;
        struct iovec iov = {.iov_base = (char *)buf + got, .iov_len = len - got};
        union {
            char buf[CMSG_SPACE(sizeof(int) * VHOST_USER_MAX_FDS)];
            struct cmsghdr align;
        } ctl;
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1,
                            .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf)};
        ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return -ECONNRESET;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            int fds[VHOST_USER_MAX_FDS];
            nfd = MIN(nfd, (size_t)VHOST_USER_MAX_FDS);
            memcpy(fds, CMSG_DATA(c), nfd * sizeof(int));
            for (size_t i = 0; i < nfd; i++) {
                if (m->nfds < VHOST_USER_MAX_FDS)
                    m->fds[m->nfds++] = fds[i];
                else
                    close(fds[i]);
            }
        }
        got += (size_t)n;
    }
    return 0;
}

int vhost_user_recv(int fd, struct vhost_user_msg *m, int timeout_ms)
{
    uint64_t deadline = now_ms() + (uint64_t)(timeout_ms < 0 ? 0 : timeout_ms);
    m->nfds = 0;
    int r = recv_exact(fd, &m->hdr, sizeof(m->hdr), m, deadline);
    if (r < 0)
        goto fail;
    if (m->hdr.size > VHOST_USER_PAYLOAD_MAX) {
        r = -EMSGSIZE;
        goto fail;
    }
    r = recv_exact(fd, m->p.raw, m->hdr.size, m, deadline);
    if (r < 0)
        goto fail;
    return 0;
fail:
    vhost_user_msg_close_fds(m);
    return r;
}

void vhost_user_msg_close_fds(struct vhost_user_msg *m)
{
    for (unsigned i = 0; i < m->nfds; i++)
        if (m->fds[i] >= 0)
            close(m->fds[i]);
    m->nfds = 0;
}
