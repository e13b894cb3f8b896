/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/names.h: validation of tenant-supplied identifiers (volume and snapshot names).
 *
 * A valid name is 1..128 bytes of [A-Za-z0-9._-], starts with a letter or a
 * digit, and contains no "..".  Names become file and directory names, so
 * nothing else is ever accepted.  On failure a static, human-readable reason is
 * returned through ret_reason. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#define NAME_MAX_LEN 128

/* len is the byte length (so embedded NULs are caught for protobuf strings). */
int name_validate_n(const char *name, size_t len, const char **ret_reason);
int name_validate(const char *name, const char **ret_reason);
