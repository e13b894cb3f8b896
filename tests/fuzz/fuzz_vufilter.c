/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_vufilter.c: libFuzzer harness for the vhost-user filter's core
 * (qsd/vhost/vufilter.c), the boundary between a tenant and its QSD.
 *
 * Input: byte 0 picks the export's queue count (1 + b % VUF_MAX_QUEUES) and
 * bit 7 allows adjacent regions; then records of
 *   [who: bit 0 side (tenant/QSD), bit 1 channel (main/back-end)]
 *   [nfds] [12-byte vhost-user header] [payload of the header's size]
 * fed in order, as a tenant and a QSD would interleave them.  Besides
 * crashes and UB, the harness checks what the filter promises after every
 * message it passes: the table of regions is bounded, has no empty,
 * wrapping, overlapping (or, unless allowed, adjacent) regions, every ring
 * whose start is in a region ends in it, feature offers are masked, queue
 * bounds never grow, and a refusal is final and says why. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qsd/vhost/vufilter.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_state(const struct vufilter *f, unsigned nq0)
{
    if (f->nregions > VUF_MAX_REGIONS || f->npending > VUF_MAX_PENDING ||
        f->nbackend_pending > VUF_MAX_PENDING || f->nq > nq0 || f->nq < 1 ||
        f->max_slots > VUF_MAX_REGIONS)
        abort();
    if ((f->features_offered & ~vufilter_safe_features) ||
        (f->proto_offered & ~vufilter_safe_protocol_features))
        abort();
    for (unsigned i = 0; i < f->nregions; i++) {
        const struct vuf_region *a = &f->regions[i];
        uint64_t e;
        if (!a->size || __builtin_add_overflow(a->gpa, a->size, &e) ||
            __builtin_add_overflow(a->uva, a->size, &e) ||
            __builtin_add_overflow(a->offset, a->size, &e))
            abort();
        for (unsigned k = 0; k < i; k++) {
            const struct vuf_region *b = &f->regions[k];
            if (a->gpa < b->gpa + b->size && b->gpa < a->gpa + a->size)
                abort();
            if (!f->allow_adjacent && (a->gpa + a->size == b->gpa || b->gpa + b->size == a->gpa))
                abort();
        }
    }
    for (unsigned q = 0; q < f->nq; q++) {
        const struct vuf_ring *g = &f->rings[q];
        if (!g->has_addr)
            continue;
        if (g->num > VUF_MAX_VRING)
            abort();
        const uint64_t parts[3][2] = {{g->desc, 16ull * g->num},
                                      {g->avail, 6 + 2ull * g->num},
                                      {g->used, 6 + 8ull * g->num}};
        for (unsigned p = 0; p < 3; p++)
            for (unsigned i = 0; i < f->nregions; i++) {
                const struct vuf_region *r = &f->regions[i];
                if (parts[p][0] >= r->uva && parts[p][0] - r->uva < r->size &&
                    parts[p][1] > r->uva + r->size - parts[p][0])
                    abort();
            }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    struct vufilter f;
    unsigned nq0 = 1 + data[0] % VUF_MAX_QUEUES;
    if (vufilter_init(&f, nq0, data[0] & 0x80) < 0)
        abort();
    size_t at = 1;
    uint8_t msg[VUF_MSG_MAX];
    while (size - at >= 2 + VUF_HDR_SIZE) {
        enum vuf_side side = data[at] & 1 ? VUF_FROM_QSD : VUF_FROM_TENANT;
        enum vuf_chan ch = data[at] & 2 ? VUF_BACKEND : VUF_MAIN;
        unsigned nfds = data[at + 1] % (VUF_MAX_FDS + 2);
        at += 2;
        memcpy(msg, data + at, VUF_HDR_SIZE);
        at += VUF_HDR_SIZE;
        uint32_t len;
        memcpy(&len, msg + 8, 4);
        enum vuf_verdict v = vufilter_check_header(&f, ch, side, msg);
        if (v == VUF_REFUSE) {
            if (!f.dead || !f.reason[0])
                abort();
            break;
        }
        if (len > VUF_PAYLOAD_MAX)
            abort(); /* check_header must have refused it */
        if (len > size - at)
            break;
        memcpy(msg + VUF_HDR_SIZE, data + at, len);
        at += len;
        uint8_t before[VUF_MSG_MAX];
        memcpy(before, msg, VUF_HDR_SIZE + len);
        v = vufilter_feed(&f, ch, side, msg, VUF_HDR_SIZE + len, nfds);
        if (v == VUF_REFUSE) {
            if (!f.dead || !f.reason[0] || memchr(f.reason, 0, sizeof(f.reason)) == NULL)
                abort();
            /* final: the next message is refused too */
            if (vufilter_feed(&f, VUF_MAIN, VUF_FROM_TENANT, before, VUF_HDR_SIZE + len, 0) !=
                VUF_REFUSE)
                abort();
            break;
        }
        /* only replies from the QSD are rewritten, and only the payload */
        if (memcmp(before, msg, VUF_HDR_SIZE) != 0 ||
            (v == VUF_PASS && memcmp(before, msg, VUF_HDR_SIZE + len) != 0) ||
            (v == VUF_MODIFIED && side != VUF_FROM_QSD))
            abort();
        check_state(&f, nq0);
    }
    return 0;
}
