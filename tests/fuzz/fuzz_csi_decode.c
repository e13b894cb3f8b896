/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_csi_decode.c: libFuzzer harness for protobuf-c decoding of every CSI
 * request message the plugin serves (the bytes a CO controls).  The first
 * byte picks the message type.  A message that decodes must pass
 * protobuf_c_message_check, re-encode to the size protobuf-c predicts, and
 * (when it decodes again) survive a second round trip byte for byte.  Unpacking happens in
 * csi/ handlers on every request, so this is the attack surface we expose
 * through protobuf-c. */
#include "csi.pb-c.h"
#include "qsd/base/util.h"

#include <stdlib.h>

static const ProtobufCMessageDescriptor *const descs[] = {
    &csi__v1__get_plugin_info_request__descriptor,
    &csi__v1__get_plugin_capabilities_request__descriptor,
    &csi__v1__probe_request__descriptor,
    &csi__v1__create_volume_request__descriptor,
    &csi__v1__delete_volume_request__descriptor,
    &csi__v1__controller_publish_volume_request__descriptor,
    &csi__v1__controller_unpublish_volume_request__descriptor,
    &csi__v1__validate_volume_capabilities_request__descriptor,
    &csi__v1__list_volumes_request__descriptor,
    &csi__v1__get_capacity_request__descriptor,
    &csi__v1__controller_get_capabilities_request__descriptor,
    &csi__v1__create_snapshot_request__descriptor,
    &csi__v1__delete_snapshot_request__descriptor,
    &csi__v1__list_snapshots_request__descriptor,
    &csi__v1__controller_expand_volume_request__descriptor,
    &csi__v1__controller_get_volume_request__descriptor,
    &csi__v1__node_stage_volume_request__descriptor,
    &csi__v1__node_unstage_volume_request__descriptor,
    &csi__v1__node_publish_volume_request__descriptor,
    &csi__v1__node_unpublish_volume_request__descriptor,
    &csi__v1__node_get_volume_stats_request__descriptor,
    &csi__v1__node_expand_volume_request__descriptor,
    &csi__v1__node_get_capabilities_request__descriptor,
    &csi__v1__node_get_info_request__descriptor,
    &csi__v1__get_metadata_allocated_request__descriptor,
    &csi__v1__get_metadata_delta_request__descriptor,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const ProtobufCMessageDescriptor *d = descs[data[0] % ARRAY_SIZE(descs)];
    ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, size - 1, data + 1);
    if (!m)
        return 0;
    if (!protobuf_c_message_check(m))
        abort();
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = xmalloc(n ? n : 1);
    if (protobuf_c_message_pack(m, buf) != n)
        abort();
    ProtobufCMessage *m2 = protobuf_c_message_unpack(d, NULL, n, buf);
    if (!m2) {
        /* protobuf-c 1.4 keeps an unknown field numbered 0 (at any depth)
         * when its tag was a non-canonical varint, and refuses it once
         * re-encoded canonically.  Its quirk, harmless to us. */
        free(buf);
        protobuf_c_message_free_unpacked(m, NULL);
        return 0;
    }
    uint8_t *buf2 = xmalloc(n ? n : 1);
    if (protobuf_c_message_get_packed_size(m2) != n || protobuf_c_message_pack(m2, buf2) != n ||
        memcmp(buf, buf2, n) != 0)
        abort();
    free(buf);
    free(buf2);
    protobuf_c_message_free_unpacked(m2, NULL);
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}
