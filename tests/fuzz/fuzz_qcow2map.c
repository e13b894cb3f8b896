/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_qcow2map.c: libFuzzer harness for the qcow2 allocation maps of
 * changed-block tracking (qsdctl/lib/qsd/qemu/qcow2map.c): the input is a
 * layer file (after one byte choosing the walk); it is opened from a memfd,
 * and when accepted walked as a chain of itself twice (allocated) or as a
 * set (changed), a bounded number of steps.  The extents returned must be
 * in order, apart, non-empty and inside the size. */
#include "qsd/qemu/qcow2map.h"
#include "qsd/base/util.h"

#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int fd = memfd_create("layer", MFD_CLOEXEC);
    if (fd < 0)
        abort();
    if (size > 1 && write(fd, data + 1, size - 1) != (ssize_t)(size - 1))
        abort();
    struct qcow2_map *m = NULL;
    char *msg = NULL;
    if (qcow2_map_open_fd(fd, "fuzz", &m, &msg) < 0) {
        if (!msg)
            abort(); /* every refusal says why */
        free(msg);
        return 0;
    }
    struct qcow2_map *const layers[2] = {m, m};
    bool alloc = data[0] & 1;
    uint64_t vsize = qcow2_map_size(m), start = vsize ? (data[0] >> 1) * (vsize / 128) : 0;
    struct qcow2_walk *w = NULL;
    if (vsize && qcow2_walk_new(alloc ? QCOW2_WALK_ALLOCATED : QCOW2_WALK_CHANGED, layers,
                                alloc ? 2 : 1, vsize, start, &w) == 0) {
        struct qcow2_extent ext[7];
        uint64_t last_end = 0;
        bool first = true;
        for (int i = 0; i < 64; i++) {
            size_t n = 0;
            int r = qcow2_walk_next(w, ext, ARRAY_SIZE(ext), 2, &n, &msg);
            if (n > ARRAY_SIZE(ext))
                abort();
            for (size_t j = 0; j < n; j++) {
                if (ext[j].len == 0 || ext[j].off + ext[j].len > vsize ||
                    (!first && ext[j].off <= last_end))
                    abort(); /* empty, past the end, or not apart from the last */
                first = false;
                last_end = ext[j].off + ext[j].len;
            }
            if (r < 0) {
                if (!msg)
                    abort();
                free(msg);
                msg = NULL;
                break;
            }
            if (r == 1)
                break;
        }
        qcow2_walk_free(w);
    }
    qcow2_map_free(m);
    return 0;
}
