/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/layers.c: pure graph logic of the layer pool.  See layers.h. */
#include "qsd/qemu/layers.h"
#include "qsd/base/util.h"

#include <inttypes.h>

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t be64(const uint8_t *p) { return (uint64_t)be32(p) << 32 | be32(p + 4); }

int qcow2_header_parse(const uint8_t *buf, size_t len, struct qcow2_header *ret)
{
    if (len < QCOW2_HEADER_MIN || memcmp(buf, "QFI\xfb", 4) != 0)
        return -EINVAL;
    struct qcow2_header h = {
        .version = be32(buf + 4),
        .backing_offset = be64(buf + 8),
        .backing_size = be32(buf + 16),
        .size = be64(buf + 24),
    };
    if (h.version != 2 && h.version != 3)
        return -EINVAL;
    if (h.backing_offset == 0)
        h.backing_size = 0;
    if (h.backing_size > QCOW2_BACKING_MAX || (h.backing_offset && h.backing_size == 0) ||
        h.backing_offset > (1ull << 40))
        return -EINVAL;
    *ret = h;
    return 0;
}

int image_probe(const uint8_t *buf, size_t len, struct image_probe *ret, const char **ret_why)
{
    static const struct {
        size_t off, len;
        const char *magic, *why;
    } other[] = {
#define OTHER(off, magic, fmt) {off, sizeof(magic) - 1, magic, \
        "an image in " fmt " format (only raw and qcow2 images are accepted)"}
        OTHER(0, "KDMV", "vmdk"), OTHER(0, "# Disk DescriptorFile", "vmdk"),
        OTHER(0, "vhdxfile", "vhdx"), OTHER(0, "conectix", "vpc"),
        OTHER(64, "\x7f\x10\xda\xbe", "vdi"), OTHER(0, "QED\0", "qed"),
        OTHER(0, "LUKS\xba\xbe", "luks"),
#undef OTHER
    };
    if (len >= 4 && memcmp(buf, "QFI\xfb", 4) == 0) {
        struct qcow2_header h;
        /* version 3 headers are at least 104 bytes: the incompatible
         * features are at 72 */
        if (len < 104 || qcow2_header_parse(buf, len, &h) < 0) {
            *ret_why = "a qcow2 image with a truncated or invalid header";
            return -EMEDIUMTYPE;
        }
        if (h.backing_offset) {
            *ret_why = "a qcow2 image with a backing file (only self-contained images are accepted)";
            return -EMEDIUMTYPE;
        }
        if (be32(buf + 32) != 0) {
            *ret_why = "an encrypted qcow2 image";
            return -EMEDIUMTYPE;
        }
        if (h.version == 3 && (be64(buf + 72) & (1u << 2))) {
            *ret_why = "a qcow2 image with an external data file";
            return -EMEDIUMTYPE;
        }
        *ret = (struct image_probe){.format = "qcow2", .size = h.size};
        return 0;
    }
    for (size_t i = 0; i < ARRAY_SIZE(other); i++)
        if (len >= other[i].off + other[i].len &&
            memcmp(buf + other[i].off, other[i].magic, other[i].len) == 0) {
            *ret_why = other[i].why;
            return -EMEDIUMTYPE;
        }
    *ret = (struct image_probe){.format = "raw", .size = 0};
    return 0;
}

bool layer_name_valid(const char *name)
{
    if (!name || strlen(name) != LAYER_NAME_LEN || name[0] != 'L')
        return false;
    for (size_t i = 1; i < LAYER_NAME_LEN; i++)
        if (!strchr("0123456789abcdef", name[i]))
            return false;
    return true;
}

void layer_name_from(uint64_t v, char ret[LAYER_NAME_LEN + 1])
{
    snprintf(ret, LAYER_NAME_LEN + 1, "L%016" PRIx64, v);
}

char *layer_ref(const char *layer) { return xasprintf("../layers/%s.qcow2", layer); }

int layer_from_ref(const char *ref, char ret[LAYER_NAME_LEN + 1])
{
    static const char pre[] = "../layers/", suf[] = ".qcow2";
    size_t n = ref ? strlen(ref) : 0;
    if (n != strlen(pre) + LAYER_NAME_LEN + strlen(suf) || !startswith(ref, pre) ||
        !streq(ref + n - strlen(suf), suf))
        return -EINVAL;
    char name[LAYER_NAME_LEN + 1];
    memcpy(name, ref + strlen(pre), LAYER_NAME_LEN);
    name[LAYER_NAME_LEN] = '\0';
    if (!layer_name_valid(name))
        return -EINVAL;
    memcpy(ret, name, sizeof(name));
    return 0;
}

char *layer_tmp_name(const char *vol, const char *layer)
{
    return xasprintf(".%s.qcow2.%s", vol, layer);
}

bool layer_tmp_parse(const char *fname, const char *vol, char ret_layer[LAYER_NAME_LEN + 1])
{
    size_t vn = strlen(vol);
    if (fname[0] != '.' || strncmp(fname + 1, vol, vn) != 0 || !startswith(fname + 1 + vn, ".qcow2."))
        return false;
    const char *l = fname + 1 + vn + strlen(".qcow2.");
    if (!layer_name_valid(l))
        return false;
    memcpy(ret_layer, l, LAYER_NAME_LEN + 1);
    return true;
}

static ssize_t find_layer(const struct pool_file *f, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (f[i].kind == PF_LAYER && f[i].layer && streq(f[i].layer, name))
            return (ssize_t)i;
    return -1;
}

size_t layers_garbage(const struct pool_file *f, size_t n, bool *garbage)
{
    bool *live = xcalloc(n + 1, sizeof(bool));
    /* Roots: every volume, snapshot and temporary file; layers linked under
     * another name or unreadable.  Follow backing names; each step marks a
     * new layer, so at most n passes. */
    for (size_t i = 0; i < n; i++)
        live[i] = f[i].kind != PF_LAYER || f[i].nlink > 1 || f[i].unreadable;
    bool changed = true;
    while (changed) {
        changed = false;
        for (size_t i = 0; i < n; i++) {
            if (!live[i] || f[i].unreadable || !f[i].backing)
                continue;
            ssize_t b = find_layer(f, n, f[i].backing);
            if (b >= 0 && !live[b]) {
                live[b] = true;
                changed = true;
            }
        }
    }
    size_t g = 0;
    for (size_t i = 0; i < n; i++) {
        garbage[i] = f[i].kind == PF_LAYER && !live[i];
        g += garbage[i];
    }
    free(live);
    return g;
}

unsigned layers_merge_count(unsigned depth, unsigned at, unsigned to)
{
    if (to < 2)
        to = 2; /* the top and at least its base stay */
    if (depth <= at || depth <= to)
        return 0;
    return depth - to;
}

bool layers_full(unsigned depth) { return depth + 1 > LAYER_MAX_DEPTH; }

static json_t *graph_node_by(json_t *nodes, const char *key, json_t *val)
{
    size_t i;
    json_t *n;
    json_array_foreach(nodes, i, n)
    {
        json_t *v = json_object_get(n, key);
        if (v && json_equal(v, val))
            return n;
    }
    return NULL;
}

int layers_qemu_chain(json_t *graph, const char *top, const char ***ret_names, size_t *ret_n)
{
    json_t *nodes = json_object_get(graph, "nodes"), *edges = json_object_get(graph, "edges");
    if (!json_is_array(nodes) || !json_is_array(edges))
        return -EBADMSG;
    json_t *name = json_string(top);
    json_t *cur = graph_node_by(nodes, "name", name);
    json_decref(name);
    if (!cur)
        return -ENOENT;
    size_t cap = LAYER_MAX_DEPTH * 2, n = 0;
    const char **out = xcalloc(cap + 1, sizeof(char *));
    while (cur) {
        if (n == cap) {
            free(out);
            return -ELOOP;
        }
        out[n++] = json_string_value(json_object_get(cur, "name"));
        json_t *id = json_object_get(cur, "id"), *next = NULL;
        size_t i;
        json_t *e;
        json_array_foreach(edges, i, e)
        {
            const char *en = json_string_value(json_object_get(e, "name"));
            if (en && streq(en, "backing") && json_equal(json_object_get(e, "parent"), id)) {
                next = graph_node_by(nodes, "id", json_object_get(e, "child"));
                break;
            }
        }
        cur = next;
    }
    for (size_t i = 0; i < n; i++)
        if (!out[i]) {
            free(out);
            return -EBADMSG;
        }
    *ret_names = out;
    *ret_n = n;
    return 0;
}
