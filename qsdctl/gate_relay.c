/* SPDX-License-Identifier: Apache-2.0 */
/* gate_relay.c: qsd-node-gate's relay of one connection (see gate_relay.h). */
#include "gate_relay.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <openssl/err.h>

#include "qsd/base/util.h"

#define PUMP_ROUNDS 64 /* relay rounds per call, then other connections go */

void gate_relay_start(struct gate_relay *r)
{
    r->up = (struct gate_buf){.data = xmalloc(GATE_RELAY_BUF)};
    r->down = (struct gate_buf){.data = xmalloc(GATE_RELAY_BUF)};
}

void gate_relay_release(struct gate_relay *r)
{
    free(r->up.data);
    free(r->down.data);
    r->up.data = r->down.data = NULL;
}

static size_t buf_room(struct gate_buf *b)
{
    if (b->len == 0)
        b->head = 0;
    else if (b->head + b->len == GATE_RELAY_BUF && b->head > 0) {
        memmove(b->data, b->data + b->head, b->len);
        b->head = 0;
    }
    return GATE_RELAY_BUF - b->head - b->len;
}

/* What an SSL call that returned n <= 0 means: 0 blocked (want set),
 * 1 the peer ended (close_notify, or EOF without one), <0 an error. */
static int ssl_result(struct gate_side *s, int n)
{
    int e = SSL_get_error(s->ssl, n);
    switch (e) {
    case SSL_ERROR_WANT_READ:
        s->want |= GATE_WANT_IN;
        return 0;
    case SSL_ERROR_WANT_WRITE:
        s->want |= GATE_WANT_OUT;
        return 0;
    case SSL_ERROR_ZERO_RETURN:
        return 1;
    default:
        ERR_clear_error();
        return e == SSL_ERROR_SYSCALL && errno ? -errno : -ECONNRESET;
    }
}

/* >0 bytes read, 0 nothing (blocked, or the side ended: s->eof), <0 error. */
static ssize_t side_read(struct gate_side *s, uint8_t *p, size_t n)
{
    if (s->ssl) {
        int k = SSL_read(s->ssl, p, (int)n);
        if (k > 0)
            return k;
        int r = ssl_result(s, k);
        if (r == 1)
            s->eof = true;
        return r < 0 ? r : 0;
    }
    ssize_t k = recv(s->fd, p, n, MSG_DONTWAIT);
    if (k > 0)
        return k;
    if (k == 0)
        s->eof = true;
    else if (errno == EAGAIN || errno == EINTR)
        s->want |= GATE_WANT_IN;
    else
        return -errno;
    return 0;
}

/* >0 bytes written, 0 blocked, <0 error (-EPIPE: its side is closed). */
static ssize_t side_write(struct gate_side *s, const uint8_t *p, size_t n)
{
    if (s->ssl) {
        int k = SSL_write(s->ssl, p, (int)n);
        if (k > 0)
            return k;
        int r = ssl_result(s, k);
        return r == 1 ? -EPIPE : r;
    }
    ssize_t k = send(s->fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k > 0)
        return k;
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
        s->want |= GATE_WANT_OUT;
        return 0;
    }
    return k < 0 ? -errno : -EPIPE;
}

/* End s's write side: shutdown, or close_notify, which may block (want
 * set: the next round retries).  A failure is left for the next read or
 * write on that side to report. */
static void side_shut(struct gate_side *s)
{
    if (!s->ssl) {
        shutdown(s->fd, SHUT_WR);
        s->shut = true;
        return;
    }
    ERR_clear_error();
    int k = SSL_shutdown(s->ssl);
    if (k >= 0 || ssl_result(s, k) != 0)
        s->shut = true;
    ERR_clear_error();
}

void gate_side_end(struct gate_side *s)
{
    if (s->shut || s->fd < 0)
        return;
    if (s->ssl) {
        SSL_shutdown(s->ssl);
        ERR_clear_error();
    } else {
        shutdown(s->fd, SHUT_WR);
    }
    s->shut = true;
}

/* from -> b -> to.  >0 progress, 0 none, <0 error with *failed set. */
static int pump(struct gate_side *from, struct gate_buf *b, struct gate_side *to,
                uint64_t *count, struct gate_side **failed)
{
    int progress = 0;
    size_t room = buf_room(b);
    if (!from->eof && room) {
        ssize_t n = side_read(from, b->data + b->head + b->len, room);
        if (n < 0) {
            *failed = from;
            return (int)n;
        }
        b->len += (size_t)n;
        progress = n > 0 || from->eof;
    }
    if (b->len) {
        ssize_t n = side_write(to, b->data + b->head, b->len);
        if (n < 0) {
            *failed = to;
            return (int)n;
        }
        b->head += (size_t)n;
        b->len -= (size_t)n;
        *count += (uint64_t)n;
        progress |= n > 0;
    }
    if (from->eof && !b->len && !to->shut) {
        side_shut(to);
        progress |= to->shut;
    }
    return progress;
}

int gate_relay_step(struct gate_relay *r, struct gate_side **ret_failed, bool *ret_moved)
{
    *ret_moved = false;
    r->again = false;
    for (unsigned round = 0; round < PUMP_ROUNDS; round++) {
        r->client.want = r->server.want = 0;
        int a = pump(&r->client, &r->up, &r->server, &r->up_bytes, ret_failed);
        if (a < 0)
            return a;
        int b = pump(&r->server, &r->down, &r->client, &r->down_bytes, ret_failed);
        if (b < 0)
            return b;
        *ret_moved |= a || b;
        /* The server is done and everything it said was passed on (its
         * end too, when the client's side could take it). */
        if (r->server.eof && !r->down.len)
            return 1;
        if (!a && !b)
            return 0;
    }
    r->again = true;
    return 0;
}
