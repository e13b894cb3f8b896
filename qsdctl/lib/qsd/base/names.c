/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/names.c: see names.h. */
#include "qsd/base/names.h"
#include "qsd/base/util.h"

static bool allowed(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '-';
}

int name_validate_n(const char *name, size_t len, const char **ret_reason)
{
    const char *why = NULL;
    if (!name || len == 0)
        why = "is empty";
    else if (len > NAME_MAX_LEN)
        why = "is longer than 128 bytes";
    else if (memchr(name, '\0', len))
        why = "contains a NUL byte";
    else if (memchr(name, '/', len))
        why = "contains '/'";
    else {
        for (size_t i = 0; i < len && !why; i++) {
            unsigned char c = (unsigned char)name[i];
            if (c < 0x20 || c == 0x7f)
                why = "contains a control character";
            else if (!allowed((char)c))
                why = "contains a character outside [A-Za-z0-9._-]";
        }
        if (!why && (len >= 2 && memmem(name, len, "..", 2)))
            why = "contains '..'";
        if (!why && !((name[0] >= 'a' && name[0] <= 'z') || (name[0] >= 'A' && name[0] <= 'Z') ||
                      (name[0] >= '0' && name[0] <= '9')))
            why = "must start with a letter or a digit";
    }
    if (why) {
        if (ret_reason)
            *ret_reason = why;
        return -EINVAL;
    }
    return 0;
}

int name_validate(const char *name, const char **ret_reason)
{
    return name_validate_n(name, name ? strlen(name) : 0, ret_reason);
}
