/* SPDX-License-Identifier: Apache-2.0 */
/* nodecall.c: forwarding a call to the volume's node (nodecall.h). */
#include "nodecall.h"
#include "grpc_client.h"
#include "kube.h"
#include "op.h"
#include "service.h"
#include "qsd/base/log.h"
#include "qsd/base/util.h"

#include <errno.h>
#include <string.h>

#define LOOKUP_MAX_US (10ull * 1000 * 1000) /* the API server's share of the deadline */
#define MARGIN_US (200ull * 1000)            /* to answer before the caller gives up */

struct nodecall {
    char *node, *method;
    uint8_t *req;
    size_t len;
    uint64_t deadline_us;
};

static void nodecall_free(void *p)
{
    struct nodecall *x = p;
    free(x->node);
    free(x->method);
    free(x->req);
    free(x);
}

static const struct op_ctx_type nodecall_type = {"nodecall", nodecall_free};

static char *hex(const uint8_t *p, size_t n)
{
    char *s = xmalloc(2 * n + 1);
    for (size_t i = 0; i < n; i++)
        snprintf(s + 2 * i, 3, "%02x", p[i]);
    s[2 * n] = '\0';
    return s;
}

static int unhex(const char *s, uint8_t **ret, size_t *ret_len)
{
    size_t n = strlen(s);
    if (n % 2)
        return -EINVAL;
    uint8_t *p = xmalloc(n / 2 + 1);
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) {
            free(p);
            return -EINVAL;
        }
        p[i] = (uint8_t)v;
    }
    *ret = p;
    *ret_len = n / 2;
    return 0;
}

/* In the worker: look the node up, dial it, call.  The outcome is always a
 * gRPC status in the result ({code, message, response}). */
static int nodecall_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    (void)ret_msg;
    struct op *op = arg;
    struct nodecall *x = op_ctx(op, &nodecall_type);
    const struct plugin_config *cfg = op->csi->cfg;
    char ip[INET6_ADDRSTRLEN];
    char *why = NULL;
    enum grpc_code code = GRPC_OK;
    _cleanup_free_ char *msg = NULL, *resp_hex = NULL;
    uint64_t lookup_by = MIN(x->deadline_us, now_us() + LOOKUP_MAX_US);
    int r = kube_node_ip(cfg->node_dial_path, cfg->api_token_file, x->node, lookup_by, ip, &why);
    if (r < 0) {
        code = r == -ENOENT || r == -EINVAL ? GRPC_NOT_FOUND
               : r == -ETIMEDOUT ? GRPC_DEADLINE_EXCEEDED : GRPC_UNAVAILABLE;
        msg = xasprintf("cannot find node %s: %s", x->node, why);
        free(why);
    } else {
        _cleanup_free_ char *pre = xasprintf("CONNECT %s\n", ip);
        struct grpc_client_opts o = {.preamble = pre, .preamble_len = strlen(pre)};
        struct grpc_client *gc = NULL;
        struct grpc_client_status st = {0};
        uint8_t *resp = NULL;
        size_t rlen = 0;
        code = grpc_client_connect(cfg->node_dial_path, &o, x->deadline_us, &gc, &st);
        if (code == GRPC_OK) {
            grpc_client_status_done(&st);
            code = grpc_client_unary(gc, x->method, x->req, x->len, x->deadline_us, &resp,
                                     &rlen, &st);
        }
        msg = xasprintf("node %s (%s)%s%s", x->node, ip, *st.message ? ": " : "", st.message);
        if (code == GRPC_OK)
            resp_hex = hex(resp, rlen);
        free(resp);
        grpc_client_status_done(&st);
        grpc_client_free(gc);
    }
    *ret_result = json_pack("{s:i, s:s, s:s}", "code", (int)code, "message", msg, "response",
                            resp_hex ? resp_hex : "");
    return 0;
}

static void nodecall_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    struct nodecall *x = op_ctx(op, &nodecall_type);
    op->worker = NULL;
    json_int_t code = json_integer_value(json_object_get(result, "code"));
    const char *m = json_string_value(json_object_get(result, "message"));
    const char *h = json_string_value(json_object_get(result, "response"));
    uint8_t *resp = NULL;
    size_t rlen = 0;
    if (status < 0 || !result || !m || !h) {
        grpc_call_fail(op->call, status == -ETIMEDOUT ? GRPC_DEADLINE_EXCEEDED : GRPC_UNAVAILABLE,
                       "the call to node %s did not finish: %s", x->node,
                       msg ? msg : strerror(status < 0 ? -status : EIO));
    } else if (code != GRPC_OK) {
        log_warn("nodecall", "the node refused or was not reached", "node=%s method=%s code=%d",
                 x->node, x->method, (int)code);
        grpc_call_fail(op->call, (enum grpc_code)code, "%s", m);
    } else if (unhex(h, &resp, &rlen) < 0) {
        grpc_call_fail(op->call, GRPC_INTERNAL, "node %s: a garbled answer", x->node);
    } else {
        log_info("nodecall", "forwarded", "node=%s method=%s", x->node, x->method);
        grpc_call_reply(op->call, resp, rlen);
    }
    free(resp);
    op_end(op);
}

void nodecall_forward(struct csi *c, struct grpc_call *call, const char *node,
                      const char *method, const uint8_t *req, size_t len)
{
    uint64_t now = now_us(), deadline = grpc_call_deadline(call);
    if (deadline <= now + MARGIN_US) {
        grpc_call_fail(call, GRPC_DEADLINE_EXCEEDED, "no time left to reach node %s", node);
        return;
    }
    struct op *op = op_begin(c, call);
    struct nodecall *x = op_set_ctx(op, &nodecall_type, xcalloc(1, sizeof(*x)));
    x->node = xstrdup(node);
    x->method = xstrdup(method);
    x->req = xmalloc(len ? len : 1);
    memcpy(x->req, req, len);
    x->len = len;
    x->deadline_us = deadline - MARGIN_US;
    /* the worker's own bound: the call's, and a little for it to report */
    op_worker(op, nodecall_fn, (deadline - now) / 1000 + 1000, nodecall_done);
}
