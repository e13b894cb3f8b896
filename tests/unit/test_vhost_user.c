/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for vhost_user.c (message encoding, reply checks, fd passing
 * over a socketpair) and vublk.c's config-space decoding. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "qsd/vhost/vhost_user.h"
#include "qsd/vhost/vublk.h"

static void test_encode_header(void **state)
{
    struct vhost_user_msg m;
    struct vhost_vring_state s = {.index = 1, .num = 256};
    assert_int_equal(vhost_user_msg_init(&m, VHOST_USER_SET_VRING_NUM, VHOST_USER_NEED_REPLY_MASK,
                                         &s, sizeof(s)), 0);
    const uint8_t *b = (const uint8_t *)&m.hdr;
    /* request 8, flags version 1 | need_reply 0x8, size 8: all little-endian */
    static const uint8_t want[12] = {8, 0, 0, 0, 0x9, 0, 0, 0, 8, 0, 0, 0};
    assert_memory_equal(b, want, 12);
    static const uint8_t payload[8] = {1, 0, 0, 0, 0, 1, 0, 0};
    assert_memory_equal(m.p.raw, payload, 8);
    assert_int_equal(vhost_user_msg_init(&m, 1, 0, NULL, VHOST_USER_PAYLOAD_MAX + 1), -EINVAL);
    assert_int_equal(vhost_user_msg_init(&m, 1, 0, NULL, 4), -EINVAL);
}

static void test_payload_layouts(void **state)
{
    /* Offsets the back-end expects (vhost-user.rst). */
    assert_int_equal(offsetof(struct vhost_vring_addr, desc_user_addr), 8);
    assert_int_equal(offsetof(struct vhost_vring_addr, used_user_addr), 16);
    assert_int_equal(offsetof(struct vhost_vring_addr, avail_user_addr), 24);
    assert_int_equal(offsetof(struct vhost_user_mem_table, regions), 8);
    assert_int_equal(sizeof(struct vhost_user_config_hdr), 12);
    struct vhost_user_msg m;
    assert_int_equal((char *)&m.p.cfg_data - (char *)&m.p, 12);
}

static void test_check_reply(void **state)
{
    struct vhost_user_hdr h = {VHOST_USER_GET_FEATURES, VHOST_USER_VERSION | VHOST_USER_REPLY_MASK, 8};
    assert_int_equal(vhost_user_check_reply(&h, VHOST_USER_GET_FEATURES, 8), 0);
    assert_int_equal(vhost_user_check_reply(&h, VHOST_USER_GET_FEATURES, 0), 0);
    assert_int_equal(vhost_user_check_reply(&h, VHOST_USER_GET_PROTOCOL_FEATURES, 8), -EPROTO);
    assert_int_equal(vhost_user_check_reply(&h, VHOST_USER_GET_FEATURES, 12), -EMSGSIZE);
    h.flags = VHOST_USER_VERSION; /* not a reply */
    assert_int_equal(vhost_user_check_reply(&h, VHOST_USER_GET_FEATURES, 8), -EPROTO);
    h.flags = 2 | VHOST_USER_REPLY_MASK; /* wrong version */
    assert_int_equal(vhost_user_check_reply(&h, VHOST_USER_GET_FEATURES, 8), -EPROTO);
    h.flags = VHOST_USER_VERSION | VHOST_USER_REPLY_MASK;
    h.size = VHOST_USER_PAYLOAD_MAX + 1;
    assert_int_equal(vhost_user_check_reply(&h, VHOST_USER_GET_FEATURES, 0), -EMSGSIZE);
    assert_string_equal(vhost_user_request_name(VHOST_USER_GET_CONFIG), "GET_CONFIG");
    assert_string_equal(vhost_user_request_name(999), "UNKNOWN");
}

static void test_send_recv_fds(void **state)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    struct vhost_user_msg m;
    uint64_t v = 3;
    vhost_user_msg_init(&m, VHOST_USER_SET_VRING_KICK, 0, &v, sizeof(v));
    m.fds[0] = pipefd[1];
    m.nfds = 1;
    assert_int_equal(vhost_user_send(sv[0], &m, 1000), 0);
    struct vhost_user_msg in;
    assert_int_equal(vhost_user_recv(sv[1], &in, 1000), 0);
    assert_int_equal(in.hdr.request, VHOST_USER_SET_VRING_KICK);
    assert_int_equal(in.hdr.size, 8);
    assert_int_equal(in.p.u64, 3);
    assert_int_equal(in.nfds, 1);
    /* the received fd is the pipe's write end */
    assert_int_equal(write(in.fds[0], "x", 1), 1);
    char c;
    assert_int_equal(read(pipefd[0], &c, 1), 1);
    vhost_user_msg_close_fds(&in);
    assert_int_equal(in.nfds, 0);

    /* nothing to read: bounded wait */
    assert_int_equal(vhost_user_recv(sv[1], &in, 50), -ETIMEDOUT);
    /* a header promising a payload that never comes: bounded too */
    struct vhost_user_hdr h = {1, 1, 8};
    assert_int_equal(write(sv[0], &h, sizeof(h)), (ssize_t)sizeof(h));
    assert_int_equal(vhost_user_recv(sv[1], &in, 50), -ETIMEDOUT);
    /* oversize payload refused */
    h.size = VHOST_USER_PAYLOAD_MAX + 1;
    assert_int_equal(write(sv[0], &h, sizeof(h)), (ssize_t)sizeof(h));
    assert_int_equal(vhost_user_recv(sv[1], &in, 50), -EMSGSIZE);
    /* peer closed */
    close(sv[0]);
    assert_int_equal(vhost_user_recv(sv[1], &in, 50), -ECONNRESET);
    close(sv[1]);
    close(pipefd[0]);
    close(pipefd[1]);
}

static void test_config_decode(void **state)
{
    uint8_t raw[VIRTIO_BLK_CONFIG_SIZE] = {0};
    raw[0] = 0x00; raw[1] = 0x00; raw[2] = 0x03; /* 0x30000 sectors = 96 MiB */
    raw[20] = 0x00; raw[21] = 0x10;               /* blk_size 4096 */
    raw[24] = 1;                                  /* physical_block_exp */
    raw[34] = 2;                                  /* num_queues */
    raw[56] = 1;                                  /* write_zeroes_may_unmap */
    uint64_t f = 1ull << VIRTIO_BLK_F_BLK_SIZE | 1ull << VIRTIO_BLK_F_MQ |
                 1ull << VIRTIO_BLK_F_TOPOLOGY | 1ull << VIRTIO_BLK_F_WRITE_ZEROES;
    struct vublk_config c;
    assert_int_equal(vublk_config_decode(raw, sizeof(raw), f, &c), 0);
    assert_int_equal(c.capacity_sectors * 512, 96ull << 20);
    assert_int_equal(c.blk_size, 4096);
    assert_int_equal(c.physical_block_exp, 1);
    assert_int_equal(c.num_queues, 2);
    assert_int_equal(c.write_zeroes_may_unmap, 1);
    /* fields of features not negotiated are ignored */
    assert_int_equal(vublk_config_decode(raw, sizeof(raw), 0, &c), 0);
    assert_int_equal(c.blk_size, 512);
    assert_int_equal(c.num_queues, 1);
    assert_int_equal(c.write_zeroes_may_unmap, 0);
    /* nonsense block size rejected; short buffer rejected */
    raw[20] = 0x01; raw[21] = 0x10;
    assert_int_equal(vublk_config_decode(raw, sizeof(raw), f, &c), -EPROTO);
    assert_int_equal(vublk_config_decode(raw, 10, f, &c), -EINVAL);
}

static void test_connect_dead_socket(void **state)
{
    struct vublk *d = NULL;
    assert_int_equal(vublk_connect("/nonexistent/qsd-test.sock", NULL, &d), -ENOENT);
    assert_null(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encode_header),
        cmocka_unit_test(test_payload_layouts),
        cmocka_unit_test(test_check_reply),
        cmocka_unit_test(test_send_recv_fds),
        cmocka_unit_test(test_config_decode),
        cmocka_unit_test(test_connect_dead_socket),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
