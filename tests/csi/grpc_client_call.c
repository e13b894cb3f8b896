/* SPDX-License-Identifier: Apache-2.0 */
/* grpc_client_call: one call of csi/grpc_client.h, for
 * tests/csi/test_grpc_client.py (which runs the servers and checks what
 * this prints).
 *
 *   grpc_client_call SOCKET MODE ARG... [options]
 *     create NAME BYTES    csi.v1.Controller/CreateVolume (protobuf-c both ways)
 *     unary METHOD REQ     a unary call, REQ sent as bytes
 *     stream METHOD REQ    a server-streaming call; every message is checked:
 *                          4 bytes big-endian index, then (index & 0xff) bytes
 *   options: --timeout-ms N (5000)  --max N (0: default)  --stop K (stream:
 *            stop after K messages)  --preamble STR (\n for a newline)
 *            --expect STR  --calls N (the same call N times on one connection)
 *
 * Prints one line per call:
 *   code=N name=NAME count=N bytes=N bad=N elapsed_ms=N [id=.. cap=..] msg=...
 * (msg last, raw, to the end of the line).  Exits 0 unless the arguments
 * are wrong: the outcome is in the line. */
#include "csi.pb-c.h"
#include "grpc_client.h"
#include "qsd/base/util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

struct counts {
    uint64_t count, bytes, bad, stop;
};

static int on_msg(const uint8_t *m, size_t len, void *opaque)
{
    struct counts *n = opaque;
    uint32_t idx = len >= 4 ? (uint32_t)m[0] << 24 | (uint32_t)m[1] << 16 |
                                  (uint32_t)m[2] << 8 | m[3]
                            : UINT32_MAX;
    bool ok = idx == n->count;
    for (size_t i = 4; ok && i < len; i++)
        ok = m[i] == (uint8_t)idx;
    n->bad += !ok;
    n->count++;
    n->bytes += len;
    return n->stop && n->count >= n->stop;
}

static char *unescape(const char *s)
{
    char *o = xstrdup(s), *w = o;
    for (; *s; s++) {
        if (s[0] == '\\' && s[1] == 'n') {
            *w++ = '\n';
            s++;
        } else {
            *w++ = *s;
        }
    }
    *w = '\0';
    return o;
}

static enum grpc_code do_create(struct grpc_client *c, const char *name, uint64_t bytes,
                                uint64_t deadline, struct grpc_client_status *st, char *extra,
                                size_t extra_len)
{
    Csi__V1__CreateVolumeRequest req = CSI__V1__CREATE_VOLUME_REQUEST__INIT;
    Csi__V1__CapacityRange range = CSI__V1__CAPACITY_RANGE__INIT;
    range.required_bytes = (int64_t)bytes;
    req.name = (char *)name;
    req.capacity_range = &range;
    ProtobufCMessage *resp = NULL;
    enum grpc_code code =
        grpc_client_unary_pb(c, "/csi.v1.Controller/CreateVolume", &req.base,
                             &csi__v1__create_volume_response__descriptor, deadline, &resp, st);
    if (code == GRPC_OK) {
        Csi__V1__CreateVolumeResponse *r = (Csi__V1__CreateVolumeResponse *)resp;
        snprintf(extra, extra_len, "id=%s cap=%" PRId64 " ", r->volume ? r->volume->volume_id : "",
                 r->volume ? r->volume->capacity_bytes : -1);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    return code;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s SOCKET create|unary|stream ARG ARG [options]\n", argv[0]);
        return 2;
    }
    const char *path = argv[1], *mode = argv[2], *a1 = argv[3], *a2 = argv[4];
    uint64_t timeout_ms = 5000, calls = 1;
    struct grpc_client_opts o = {0};
    struct counts n = {0};
    _cleanup_free_ char *preamble = NULL;
    for (int i = 5; i + 1 < argc; i += 2) {
        if (streq(argv[i], "--timeout-ms"))
            timeout_ms = strtoull(argv[i + 1], NULL, 10);
        else if (streq(argv[i], "--max"))
            o.max_message = strtoull(argv[i + 1], NULL, 10);
        else if (streq(argv[i], "--stop"))
            n.stop = strtoull(argv[i + 1], NULL, 10);
        else if (streq(argv[i], "--calls"))
            calls = strtoull(argv[i + 1], NULL, 10);
        else if (streq(argv[i], "--expect"))
            o.expect = argv[i + 1];
        else if (streq(argv[i], "--preamble")) {
            preamble = unescape(argv[i + 1]);
            o.preamble = preamble;
            o.preamble_len = strlen(preamble);
        } else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }

    uint64_t t0 = now_us();
    struct grpc_client *c = NULL;
    struct grpc_client_status st = {0};
    enum grpc_code code = grpc_client_connect(path, &o, t0 + timeout_ms * 1000, &c, &st);
    for (uint64_t i = 0; i < calls; i++) {
        char extra[512] = "";
        uint64_t start = i == 0 ? t0 : now_us(); /* the first includes the connect */
        if (c) {
            grpc_client_status_done(&st);
            uint64_t deadline = start + timeout_ms * 1000;
            n = (struct counts){.stop = n.stop};
            if (streq(mode, "create")) {
                code = do_create(c, a1, strtoull(a2, NULL, 10), deadline, &st, extra,
                                 sizeof(extra));
            } else if (streq(mode, "unary")) {
                uint8_t *resp = NULL;
                size_t len = 0;
                code = grpc_client_unary(c, a1, (const uint8_t *)a2, strlen(a2), deadline, &resp,
                                         &len, &st);
                if (code == GRPC_OK) {
                    n.count = 1;
                    n.bytes = len;
                }
                free(resp);
            } else if (streq(mode, "stream")) {
                code = grpc_client_stream(c, a1, (const uint8_t *)a2, strlen(a2), deadline,
                                          on_msg, &n, &st);
            } else {
                fprintf(stderr, "unknown mode %s\n", mode);
                grpc_client_status_done(&st);
                grpc_client_free(c);
                return 2;
            }
        }
        printf("code=%d name=%s count=%" PRIu64 " bytes=%" PRIu64 " bad=%" PRIu64
               " elapsed_ms=%" PRIu64 " usable=%d %smsg=%s\n",
               code, grpc_code_name(code), n.count, n.bytes, n.bad, (now_us() - start) / 1000,
               grpc_client_usable(c), extra, st.message);
        fflush(stdout);
        if (!c)
            break;
    }
    grpc_client_status_done(&st);
    grpc_client_free(c);
    return 0;
}
