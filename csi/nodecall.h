/* SPDX-License-Identifier: Apache-2.0 */
/* nodecall.h: the controller's calls to a volume's node
 * (docs/node-operations.md).
 *
 * Owns: forwarding one CSI call (unary, or server-streaming), as the
 * packed request it arrived with, to the node that holds the volume, and
 * answering it with what the node answered.  In a forked worker (never on the event loop): the node's
 * InternalIP from the API server (kube.h), then the dial gate's unix
 * socket (--node-dial) with `CONNECT <ip>`, which does the mutual TLS to
 * the node's gate and so to the node plugin's node-operations socket, then
 * the gRPC call there (grpc_client.h), all by the call's own deadline.
 * The node's status comes back as it is, its message prefixed with the
 * node; a failure to reach the node is UNAVAILABLE naming the node and
 * the step (the sidecars retry it with backoff), except a node the API
 * server does not know (NOT_FOUND: the volume's node is gone). */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct csi;
struct grpc_call;

/* Forward call (method: "/csi.v1.Controller/ControllerModifyVolume") with
 * its request req/len to node.  Answers call exactly once. */
void nodecall_forward(struct csi *c, struct grpc_call *call, const char *node,
                      const char *method, const uint8_t *req, size_t len);

/* The same for a server-streaming call ("/csi.v1.SnapshotMetadata/..."):
 * each message of the node's stream is passed on as it comes, at the pace
 * the caller takes them (the worker writes them into a pipe the loop reads
 * only while the call's queue is short), then the node's status.  A caller
 * that goes away ends the worker, so the node sees its stream cancelled. */
void nodecall_stream(struct csi *c, struct grpc_call *call, const char *node,
                     const char *method, const uint8_t *req, size_t len);
