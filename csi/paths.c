/* paths.c: see paths.h. */
#include "paths.h"
#include "util.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>

int path_check_lexical(const char *root, const char *path, const char **ret_reason)
{
    const char *why = NULL;
    size_t n = path ? strlen(path) : 0, rn = strlen(root);
    if (n == 0)
        why = "is empty";
    else if (path[0] != '/')
        why = "is not absolute";
    else if (n > CSI_PATH_MAX)
        why = "is too long";
    else if (n > 1 && path[n - 1] == '/')
        why = "ends with '/'";
    else {
        /* Walk the components after each '/'. */
        for (const char *c = path + 1; !why; ) {
            const char *e = strchr(c, '/');
            size_t len = e ? (size_t)(e - c) : strlen(c);
            if (len == 0)
                why = "contains an empty component ('//')";
            else if (len == 1 && c[0] == '.')
                why = "contains a '.' component";
            else if (len == 2 && c[0] == '.' && c[1] == '.')
                why = "contains a '..' component";
            for (size_t i = 0; i < len && !why; i++)
                if ((unsigned char)c[i] < 0x20 || c[i] == 0x7f)
                    why = "contains a control character";
            if (!e)
                break;
            c = e + 1;
        }
    }
    if (!why) {
        if (rn == 1 && root[0] == '/') {
            if (n == 1)
                why = "is the kubelet root itself";
        } else if (n <= rn || strncmp(path, root, rn) != 0 || path[rn] != '/') {
            why = "is not under the kubelet root";
        }
    }
    if (why) {
        *ret_reason = why;
        return -EINVAL;
    }
    return 0;
}

static bool under(const char *root, const char *p)
{
    size_t rn = strlen(root);
    if (rn == 1)
        return p[0] == '/';
    return strncmp(p, root, rn) == 0 && (p[rn] == '/' || p[rn] == '\0');
}

int path_check_resolved(const char *root, const char *path, const char **ret_reason)
{
    int r = path_check_lexical(root, path, ret_reason);
    if (r < 0)
        return r;
    char rroot[PATH_MAX];
    if (!realpath(root, rroot)) {
        *ret_reason = "kubelet root does not exist";
        return -EINVAL;
    }
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) {
        *ret_reason = "is a symbolic link";
        return -EINVAL;
    }
    /* Deepest existing prefix. */
    _cleanup_free_ char *p = xstrdup(path);
    for (;;) {
        char real[PATH_MAX];
        if (realpath(p, real)) {
            if (!under(rroot, real)) {
                *ret_reason = "resolves (through a symbolic link) outside the kubelet root";
                return -EINVAL;
            }
            return 0;
        }
        if (errno != ENOENT && errno != ENOTDIR) {
            *ret_reason = "cannot be resolved";
            return -EINVAL;
        }
        char *slash = strrchr(p, '/');
        if (!slash || slash == p) {
            *ret_reason = "cannot be resolved";
            return -EINVAL;
        }
        *slash = '\0';
    }
}

int path_is_mount_point(const char *path)
{
    struct statx sx;
    if (statx(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT, STATX_BASIC_STATS, &sx) < 0)
        return -errno;
    if (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT)
        return (sx.stx_attributes & STATX_ATTR_MOUNT_ROOT) ? 1 : 0;
    return -EOPNOTSUPP;
}
