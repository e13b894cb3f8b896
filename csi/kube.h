/* SPDX-License-Identifier: Apache-2.0 */
/* kube.h: the controller's one question to the Kubernetes API server: the
 * address of a node.
 *
 * Owns: reading the ServiceAccount token (at each call: the kubelet
 * rotates it), checking the node's name before it enters a URL, the
 * request (a GET of /api/v1/nodes/NAME as HTTP/1.0, so the answer ends at
 * the connection's end and is never chunked) through the dial gate's API
 * route (`API\n`: the gate does the TLS and verifies the API server;
 * preamble.h), reading the answer within a size bound and a deadline, and
 * picking the node's InternalIP from it (the first, IPv4 or IPv6).  The
 * API server's refusals keep their HTTP status and its Status message.
 * Blocking: for forked workers, never the event loop. */
#pragma once

#include <arpa/inet.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define KUBE_ANSWER_MAX (8u << 20) /* a Node with many images is a few 100 KiB */

/* The InternalIP of node into ip, asking the API server through the dial
 * gate's unix socket dial_path with the bearer token read from token_file,
 * by deadline_us (now_us()).  0; on failure a negative errno and *ret_msg
 * (malloc'd) naming what failed: -EINVAL a name that is not a node's,
 * -ENOENT the API server has no such node (404), -EACCES it refused the
 * token (401, 403) or the token file cannot be read or is empty (never
 * -ENOENT: a caller maps that to NOT_FOUND, which a CO may take for "the
 * snapshot is gone"), -EADDRNOTAVAIL the node has no InternalIP,
 * -ETIMEDOUT, -EPROTO a malformed answer, others from the socket. */
int kube_node_ip(const char *dial_path, const char *token_file, const char *node,
                 uint64_t deadline_us, char ip[INET6_ADDRSTRLEN], char **ret_msg);

/* --- pure parts (exposed for tests) --- */
/* A node's name: a DNS subdomain (RFC 1123: 1..253 bytes of [a-z0-9.-],
 * labels starting and ending alphanumeric). */
int kube_name_ok(const char *name);
/* The HTTP status and the JSON body of a whole HTTP/1.x answer; -EPROTO
 * when it is not one.  *ret_body (a new reference) is NULL when the body
 * is not JSON. */
int kube_parse_answer(const char *buf, size_t len, int *ret_status, json_t **ret_body);
/* The first InternalIP of a Node object (checked to be an IP literal). */
int kube_internal_ip(json_t *node, char ip[INET6_ADDRSTRLEN]);
