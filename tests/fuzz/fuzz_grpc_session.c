/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_grpc_session.c: libFuzzer harness for the HTTP/2 + gRPC session layer.
 *
 * The input is what a peer sends on one connection.  When the first byte is
 * even, the HTTP/2 client preface is sent first so the fuzzer spends its time
 * on frames rather than on guessing the preface.  The input is fed in chunks
 * whose sizes come from the input itself, output is drained after each chunk,
 * asynchronous calls are completed, deadlines are expired, and everything is
 * freed: leaks and UB are findings. */
#include "grpc.h"
#include "qsd/base/util.h"

static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

static struct grpc_call *pending[256];
static size_t n_pending;

static void h_echo(struct grpc_call *c, const uint8_t *req, size_t len, void *opaque)
{
    grpc_call_reply(c, req, len);
}

static void h_later(struct grpc_call *c, const uint8_t *req, size_t len, void *opaque)
{
    if (n_pending < 256)
        pending[n_pending++] = c;
    else
        grpc_call_fail(c, GRPC_UNAVAILABLE, "busy");
}

static void h_fail(struct grpc_call *c, const uint8_t *req, size_t len, void *opaque)
{
    grpc_call_fail(c, GRPC_INVALID_ARGUMENT, "bad %.*s", (int)MIN(len, 16), (const char *)req);
}

static const struct grpc_method methods[] = {
    {"/f.F/Echo", h_echo, NULL, LOG_INFO},
    {"/f.F/Later", h_later, NULL, LOG_INFO},
    {"/f.F/Fail", h_fail, NULL, LOG_INFO},
};

static void drain(struct grpc_session *s)
{
    const uint8_t *p;
    size_t n;
    for (int i = 0; i < 64; i++) {
        if (grpc_session_output(s, &p, &n) < 0 || n == 0)
            return;
        grpc_session_consume(s, n);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool init;
    if (!init) {
        log_set_level(LOG_ERROR + 1); /* silence */
        init = true;
    }
    if (size < 1)
        return 0;
    struct grpc_limits lim;
    grpc_limits_default(&lim);
    lim.max_message = 4096;
    lim.max_streams = 16;
    lim.max_header_list = 2048;
    lim.max_output = 1 << 16;
    struct grpc_server *srv;
    struct grpc_session *s;
    if (grpc_server_new(&lim, &srv) < 0)
        abort();
    grpc_server_add_methods(srv, methods, ARRAY_SIZE(methods));
    if (grpc_session_new(srv, NULL, NULL, &s) < 0)
        abort();
    n_pending = 0;

    uint8_t mode = data[0];
    data++;
    size--;
    int r = 0;
    if (!(mode & 1))
        r = grpc_session_recv(s, (const uint8_t *)preface, sizeof(preface) - 1);
    /* Chunk sizes 1..64 from the mode byte: exercises partial frames. */
    size_t chunk = (size_t)(mode >> 2) + 1;
    for (size_t off = 0; off < size && r == 0; off += chunk) {
        r = grpc_session_recv(s, data + off, MIN(chunk, size - off));
        drain(s);
        if (mode & 2) {
            /* Complete half the calls as they come. */
            while (n_pending > 0) {
                struct grpc_call *c = pending[--n_pending];
                grpc_call_reply(c, "ok", 2);
                if (n_pending % 2)
                    break;
            }
        }
    }
    drain(s);
    if (mode & 2)
        grpc_server_shutdown(srv);
    grpc_server_expire(srv, now_us() + 3600ull * 1000000);
    drain(s);
    (void)grpc_session_alive(s);
    (void)grpc_server_next_deadline(srv);
    grpc_server_free(srv);
    /* Calls still pending were detached by the free: completing frees them. */
    while (n_pending > 0)
        grpc_call_fail(pending[--n_pending], GRPC_INTERNAL, "late");
    return 0;
}
