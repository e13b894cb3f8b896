/* SPDX-License-Identifier: Apache-2.0 */
/* qos.h: a volume's mutable parameters (VolumeAttributesClass, CSI's
 * mutable_parameters): the I/O limits of its QSD's throttle group.
 *
 * Keys (per second, 0 = unlimited):
 *   readIops, writeIops, readBps, writeBps            the sustained limits
 *   readIopsBurst, writeIopsBurst, readBpsBurst,
 *   writeBpsBurst                                     for up to 1 s, >= base
 * Pure: no I/O, nothing changed on a refusal. */
#pragma once

#include <jansson.h>
#include <stddef.h>

#include "qsd/qemu/qsdopts.h"

/* Merge the n keys/vals over current (the record's, may be NULL: none) and
 * validate the result: *ret_params (new object of strings; keys given as
 * "0" are dropped), *ret_limits.  -EINVAL with a message naming the key:
 * an unknown key, a value that is not a decimal integer, negative or above
 * QSD_LIMIT_MAX, a burst below its base or without one. */
int qos_merge(json_t *current, size_t n, const char *const *keys, const char *const *vals,
              json_t **ret_params, struct qsd_limits *ret_limits, char **ret_msg);
/* The keys and values alone, as qos_merge checks them, without the burst
 * rules (which need the set they are merged into). */
int qos_check(size_t n, const char *const *keys, const char *const *vals, char **ret_msg);
/* The limits of a stored object (qos_merge with nothing to merge). */
int qos_limits(json_t *params, struct qsd_limits *ret, char **ret_msg);
