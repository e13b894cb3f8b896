/* SPDX-License-Identifier: Apache-2.0 */
/* paths.h: checks of the filesystem paths kubelet hands the plugin
 * (staging_target_path, target_path).
 *
 * Owns: the lexical rule that every such path is absolute, normalized and
 * strictly under the kubelet root (pure, unit-tested).  Returns 0 or -EINVAL
 * with a static reason.  Resolving such paths (never through a symlink) is
 * mounts.h's job. */
#pragma once

#define CSI_PATH_MAX 4096

/* Pure: path is absolute, has no empty, "." or ".." component and no trailing
 * '/', is at most CSI_PATH_MAX bytes and lies strictly under root (itself
 * absolute and normalized; "/" allowed). */
int path_check_lexical(const char *root, const char *path, const char **ret_reason);
