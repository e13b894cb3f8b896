/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/vhost/vhost_user.h: the vhost-user protocol, front-end side (QEMU
 * docs/interop/vhost-user.rst).
 *
 * Owns: message numbers and payload layouts, encoding a message into bytes
 * (pure, unit-tested), sending a message with file descriptors (SCM_RIGHTS),
 * receiving a reply with a bounded wait, and reading requests from the
 * back-end request channel (SET_BACKEND_REQ_FD).  Knows nothing of block
 * devices: vublk.c builds on it. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Front-end -> back-end requests. */
enum vhost_user_request {
    VHOST_USER_GET_FEATURES = 1,
    VHOST_USER_SET_FEATURES = 2,
    VHOST_USER_SET_OWNER = 3,
    VHOST_USER_RESET_OWNER = 4,
    VHOST_USER_SET_MEM_TABLE = 5,
    VHOST_USER_SET_LOG_BASE = 6,
    VHOST_USER_SET_LOG_FD = 7,
    VHOST_USER_SET_VRING_NUM = 8,
    VHOST_USER_SET_VRING_ADDR = 9,
    VHOST_USER_SET_VRING_BASE = 10,
    VHOST_USER_GET_VRING_BASE = 11,
    VHOST_USER_SET_VRING_KICK = 12,
    VHOST_USER_SET_VRING_CALL = 13,
    VHOST_USER_SET_VRING_ERR = 14,
    VHOST_USER_GET_PROTOCOL_FEATURES = 15,
    VHOST_USER_SET_PROTOCOL_FEATURES = 16,
    VHOST_USER_GET_QUEUE_NUM = 17,
    VHOST_USER_SET_VRING_ENABLE = 18,
    VHOST_USER_SET_BACKEND_REQ_FD = 21,
    VHOST_USER_GET_CONFIG = 24,
    VHOST_USER_SET_CONFIG = 25,
};

/* Back-end -> front-end requests (on the back-end request channel). */
enum vhost_user_backend_request {
    VHOST_USER_BACKEND_IOTLB_MSG = 1,
    VHOST_USER_BACKEND_CONFIG_CHANGE_MSG = 2,
    VHOST_USER_BACKEND_VRING_HOST_NOTIFIER_MSG = 3,
};

/* Header flags. */
#define VHOST_USER_VERSION 0x1u
#define VHOST_USER_VERSION_MASK 0x3u
#define VHOST_USER_REPLY_MASK (1u << 2)
#define VHOST_USER_NEED_REPLY_MASK (1u << 3)

/* Feature bits. */
#define VHOST_USER_F_PROTOCOL_FEATURES 30
#define VHOST_USER_PROTOCOL_F_MQ 0
#define VHOST_USER_PROTOCOL_F_LOG_SHMFD 1
#define VHOST_USER_PROTOCOL_F_REPLY_ACK 3
#define VHOST_USER_PROTOCOL_F_BACKEND_REQ 5
#define VHOST_USER_PROTOCOL_F_CONFIG 9
#define VHOST_USER_PROTOCOL_F_BACKEND_SEND_FD 10
#define VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD 12

/* SET_VRING_KICK/CALL/ERR payload: index in bits 0-7, bit 8 = no fd. */
#define VHOST_USER_VRING_IDX_MASK 0xffu
#define VHOST_USER_VRING_NOFD_MASK (1u << 8)

#define VHOST_USER_MAX_FDS 8           /* VHOST_MEMORY_BASELINE_NREGIONS */
#define VHOST_USER_CONFIG_MAX 256
#define VHOST_USER_HDR_SIZE 12
#define VHOST_USER_PAYLOAD_MAX 4096    /* we never send or accept more */

struct vhost_user_hdr {
    uint32_t request;
    uint32_t flags;
    uint32_t size;
} __attribute__((packed));

struct vhost_vring_state {
    uint32_t index;
    uint32_t num;
} __attribute__((packed));

struct vhost_vring_addr {
    uint32_t index;
    uint32_t flags;
    uint64_t desc_user_addr;
    uint64_t used_user_addr;
    uint64_t avail_user_addr;
    uint64_t log_guest_addr;
} __attribute__((packed));

struct vhost_user_mem_region {
    uint64_t guest_phys_addr;
    uint64_t memory_size;
    uint64_t userspace_addr;
    uint64_t mmap_offset;
} __attribute__((packed));

struct vhost_user_mem_table {
    uint32_t nregions;
    uint32_t padding;
    struct vhost_user_mem_region regions[VHOST_USER_MAX_FDS];
} __attribute__((packed));

struct vhost_user_config_hdr {
    uint32_t offset;
    uint32_t size;
    uint32_t flags;
} __attribute__((packed));

/* A message: header + payload + file descriptors to pass. */
struct vhost_user_msg {
    struct vhost_user_hdr hdr;
    union {
        uint64_t u64;
        struct vhost_vring_state state;
        struct vhost_vring_addr addr;
        struct vhost_user_mem_table mem;
        struct {
            struct vhost_user_config_hdr cfg;
            uint8_t cfg_data[VHOST_USER_CONFIG_MAX];
        } __attribute__((packed));
        uint8_t raw[VHOST_USER_PAYLOAD_MAX];
    } __attribute__((packed)) p;
    int fds[VHOST_USER_MAX_FDS];
    unsigned nfds;
};

const char *vhost_user_request_name(uint32_t request);

/* Fill a message (pure).  payload may be NULL when size is 0. */
int vhost_user_msg_init(struct vhost_user_msg *m, uint32_t request, uint32_t flags,
                        const void *payload, uint32_t size);
/* Check a received header against what we asked (pure): version, the reply
 * bit, the request number and the payload size (exact when want_size != 0,
 * otherwise <= VHOST_USER_PAYLOAD_MAX).  Returns 0 or -EPROTO / -EMSGSIZE. */
int vhost_user_check_reply(const struct vhost_user_hdr *h, uint32_t request, uint32_t want_size);

/* Send m (header, payload, m->fds) in one sendmsg.  Blocking with a bound:
 * waits at most timeout_ms for the socket to accept it. */
int vhost_user_send(int fd, const struct vhost_user_msg *m, int timeout_ms);
/* Receive one message (header, then its payload) within timeout_ms.  Any fds
 * that arrive are stored in m->fds (caller closes them).  -ETIMEDOUT on
 * expiry, -ECONNRESET when the peer closed. */
int vhost_user_recv(int fd, struct vhost_user_msg *m, int timeout_ms);
/* Close received fds. */
void vhost_user_msg_close_fds(struct vhost_user_msg *m);
