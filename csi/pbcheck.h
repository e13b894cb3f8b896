/* SPDX-License-Identifier: Apache-2.0 */
/* pbcheck.h: checks on a request's wire bytes before it is decoded.
 *
 * Owns: the rule that no string a caller sends contains a NUL byte, and the
 * bound on how many fields a request may carry (protobuf-c allocates per
 * field and sub-message: a 4 MiB message of tiny sub-messages would decode
 * into ~40 times its size).
 * protobuf-c decodes a proto3 string into a C string and keeps no length,
 * so "pvc-victim\0/../x" would silently become "pvc-victim".  The check walks
 * the encoded message with its descriptor (nested messages and map entries
 * included, up to a bounded depth) and names the first offending field.
 * Pure: no I/O, no allocation but the returned field path. */
#pragma once

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

#define PBCHECK_MAX_DEPTH 32
#define PBCHECK_MAX_FIELDS 65536

/* 0: every string field is free of NUL bytes (or the bytes are malformed:
 * the decoder reports that).  -EINVAL: *ret_field is the dotted path of the
 * first string with a NUL, e.g. "parameters.value" or
 * "volume_capability.mount.volume_mount_group" (to free).  -E2BIG: more
 * than PBCHECK_MAX_FIELDS fields in all (*ret_field untouched). */
int pb_check_strings(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len,
                     char **ret_field);
