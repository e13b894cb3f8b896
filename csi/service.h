/* SPDX-License-Identifier: Apache-2.0 */
/* service.h: what the Controller and Node services share.
 *
 * Owns: struct csi (configuration, loop, record store and state, pool, the
 * QSD of every staged volume; made and unmade by startup.h), the decoding
 * of every request (CSI_HANDLER: NUL and size checks first), and the
 * method tables.  Beside it: operations in flight (op.h), ids and
 * capabilities (ids.h), a staged volume's QSD (volqsd.h), start-up
 * recovery (recover.h). */
#pragma once

#include "csi.pb-c.h"
#include "grpc.h"
#include "qsd/base/cgroup.h"
#include "qsd/qemu/image.h"
#include "plugin.h"
#include "qsd/qemu/qsd.h"
#include "qsd/state/state.h"
#include "verdict.h"
#include "qsd/base/worker.h"

#include <stdbool.h>
#include <stdint.h>

struct op;
struct bridges;
struct rbd_req;
struct csi {
    const struct plugin_config *cfg;
    struct loop *loop;
    struct records *records; /* the record store's writer (records.h) */
    struct store *store;
    struct pool pool;
    struct qsd_config qcfg;
    char *topo_key;        /* "<driver-name>/node" */
    struct op *ops;        /* in flight */
    struct bridges *bridges; /* hot-plug bridges and requests (bridge.h) */
    struct groups *groups; /* group snapshot records (local_group.c) */
    struct worker *gc;     /* removal of unused layers in flight (csi_gc) */
    bool gc_again;         /* another removal asked for meanwhile */
    int kubelet_fd;        /* O_PATH of the kubelet root (mounts.h) */
    struct tracked *tracked; /* mounts made since start (mounts.c) */
    size_t n_tracked;
    struct qsd_cgroup cgroup; /* where QSDs run (--qsd-cgroup), joined at spawn */
    const char *qsd_hidden[3]; /* paths hidden from QSDs (qsd_config.hidden) */
    struct loop_timer *log_timer; /* bounds the QSDs' logs (qsd_log_trim) */
    struct volstats *vstats; /* health and I/O figures, cached (volstats.h; set by main) */
    struct imagememo *image_refusals; /* checksum refusals remembered (imagememo.h) */
    struct grpc_server *held[3]; /* servers whose answers wait for durable records
                                  * (csi_hold_answers: one per endpoint) */
    size_t n_held;
};

/* Decode a request.  Undecodable bytes, or a string field with a NUL byte
 * (pbcheck.h), fail the call with INVALID_ARGUMENT naming the field, and
 * NULL is returned; more than PBCHECK_MAX_FIELDS fields, RESOURCE_EXHAUSTED.
 * csi_request_decode decides the same without a call (v, verdict.h). */
ProtobufCMessage *csi_request_decode(const ProtobufCMessageDescriptor *d, const uint8_t *req,
                                     size_t len, struct verdict *v);
ProtobufCMessage *csi_request_unpack(struct grpc_call *call, const ProtobufCMessageDescriptor *d,
                                     const uint8_t *req, size_t len);

/* The gRPC handler of one RPC: decode, impl(c, call, in), free.  The
 * method's opaque is the struct csi. */
#define CSI_HANDLER(fname, impl, Type, type)                                                   \
    static void fname(struct grpc_call *call, const uint8_t *req, size_t len, void *opaque)  \
    {                                                                                       \
        Type *in = (Type *)csi_request_unpack(call, &type##__descriptor, req, len);          \
        if (!in)                                                                            \
            return;                                                                         \
        impl(opaque, call, in);                                                             \
        protobuf_c_message_free_unpacked(&in->base, NULL);                                  \
    }

/* Answer ControllerGetCapabilities with these RPC capabilities (at most 16). */
void reply_controller_caps(struct grpc_call *call,
                           const Csi__V1__ControllerServiceCapability__RPC__Type *types, size_t n);
const struct grpc_method *controller_methods(struct csi *c, size_t *ret_n);
const struct grpc_method *node_methods(struct csi *c, size_t *ret_n);
