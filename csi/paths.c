/* SPDX-License-Identifier: Apache-2.0 */
/* paths.c: see paths.h. */
#include "paths.h"
#include "qsd/base/util.h"


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
