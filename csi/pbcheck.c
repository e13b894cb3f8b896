/* SPDX-License-Identifier: Apache-2.0 */
/* pbcheck.c: see pbcheck.h. */
#include "pbcheck.h"
#include "qsd/base/util.h"

static int varint(const uint8_t **p, const uint8_t *end, uint64_t *ret)
{
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        if (*p >= end)
            return -1;
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *ret = v;
            return 0;
        }
    }
    return -1;
}

/* 1: found (path in *ret_field), 2: too many fields, 0: clean, -1:
 * malformed (left to the decoder). */
static int walk(const ProtobufCMessageDescriptor *d, const uint8_t *p, const uint8_t *end,
                unsigned depth, size_t *fields, char **ret_field)
{
    if (depth > PBCHECK_MAX_DEPTH)
        return -1;
    while (p < end) {
        uint64_t tag, n;
        if (varint(&p, end, &tag) < 0)
            return -1;
        if (++*fields > PBCHECK_MAX_FIELDS)
            return 2;
        switch (tag & 7) {
        case 0: /* varint */
            if (varint(&p, end, &n) < 0)
                return -1;
            continue;
        case 1: /* 64-bit */
            if (end - p < 8)
                return -1;
            p += 8;
            continue;
        case 5: /* 32-bit */
            if (end - p < 4)
                return -1;
            p += 4;
            continue;
        case 2: /* length-delimited */
            break;
        default: /* groups: not in proto3 */
            return -1;
        }
        if (varint(&p, end, &n) < 0 || n > (uint64_t)(end - p))
            return -1;
        const uint8_t *v = p;
        p += n;
        if (tag >> 3 > UINT32_MAX)
            return -1;
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3));
        if (!f)
            continue; /* unknown field: never reaches a handler */
        if (f->type == PROTOBUF_C_TYPE_STRING && memchr(v, 0, n)) {
            *ret_field = xstrdup(f->name);
            return 1;
        }
        if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            char *sub = NULL;
            int r = walk(f->descriptor, v, v + n, depth + 1, fields, &sub);
            if (r == 1) {
                *ret_field = xasprintf("%s.%s", f->name, sub);
                free(sub);
            }
            if (r != 0)
                return r;
        }
    }
    return 0;
}

int pb_check_strings(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len,
                     char **ret_field)
{
    char *field = NULL;
    size_t fields = 0;
    int r = walk(d, buf, buf + len, 0, &fields, &field);
    if (r == 1) {
        *ret_field = field;
        return -EINVAL;
    }
    return r == 2 ? -E2BIG : 0;
}
