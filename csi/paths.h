/* paths.h: checks of the filesystem paths kubelet hands the plugin
 * (staging_target_path, target_path).
 *
 * Owns: the rule that every such path is absolute, normalized and strictly
 * under the kubelet root, lexically (pure, unit-tested) and after resolving
 * symlinks in the part that exists.  Each check returns 0 or -EINVAL with a
 * static reason. */
#pragma once

#define CSI_PATH_MAX 4096

/* Pure: path is absolute, has no empty, "." or ".." component and no trailing
 * '/', is at most CSI_PATH_MAX bytes and lies strictly under root (itself
 * absolute and normalized; "/" allowed). */
int path_check_lexical(const char *root, const char *path, const char **ret_reason);

/* Lexical check, then: the deepest existing prefix of path, with symlinks
 * resolved, is still strictly under root (with root's own symlinks resolved),
 * and path itself, when it exists, is not a symlink. */
int path_check_resolved(const char *root, const char *path, const char **ret_reason);

/* Is path the root of a mount?  1 yes, 0 no, negative errno. */
int path_is_mount_point(const char *path);
