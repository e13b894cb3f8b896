/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the pure cores of the RBD backend's controller RPCs
 * (csi/rbd_int.h struct rbd_plan): CreateVolume (empty, from a snapshot,
 * a clone), DeleteVolume, ControllerExpandVolume, CreateSnapshot,
 * DeleteSnapshot and ListSnapshots.  Every refusal with its status code
 * and the field or parameter its message names, in the order a caller
 * meets them, and the request a worker would get.  No cluster: the
 * plans parse and check only. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "rbd_int.h"
#include "qsd/base/util.h"

#include <string.h>

#define MiB (1024ll * 1024)
#define KEY "AQBzZXNzaW9ua2V5c2Vzc2lvbmtleXNlc3Npb24="

static void outcome(const char *what, const struct rbd_plan *pl, enum plan_kind kind,
                    enum grpc_code code, const char *want)
{
    if (pl->kind != kind || pl->refusal.code != code ||
        (want && (!pl->refusal.msg || !strstr(pl->refusal.msg, want))))
        fail_msg("%s: kind %d code %d (%s), wanted kind %d code %d \"%s\"", what, pl->kind,
                 pl->refusal.code, pl->refusal.msg ? pl->refusal.msg : "-", kind, code,
                 want ? want : "-");
    if (kind == PLAN_ACT)
        assert_non_null(pl->q);
}

/* ------------------------------------------------------- CreateVolume */

struct create_req {
    Csi__V1__CreateVolumeRequest in;
    Csi__V1__VolumeCapability cap, *caps[1];
    Csi__V1__VolumeCapability__MountVolume mount;
    Csi__V1__VolumeCapability__AccessMode mode;
    Csi__V1__CapacityRange range;
    Csi__V1__CreateVolumeRequest__ParametersEntry pe[4], *pp[4];
    Csi__V1__CreateVolumeRequest__SecretsEntry se[2], *sp[2];
    Csi__V1__VolumeContentSource cs;
    Csi__V1__VolumeContentSource__SnapshotSource ss;
    Csi__V1__VolumeContentSource__VolumeSource vs;
};

static void param(struct create_req *r, const char *k, const char *v)
{
    size_t i = r->in.n_parameters++;
    r->pe[i] = (Csi__V1__CreateVolumeRequest__ParametersEntry)
        CSI__V1__CREATE_VOLUME_REQUEST__PARAMETERS_ENTRY__INIT;
    r->pe[i].key = (char *)k;
    r->pe[i].value = (char *)v;
    r->pp[i] = &r->pe[i];
    r->in.parameters = r->pp;
}

static void secret(struct create_req *r, const char *k, const char *v)
{
    size_t i = r->in.n_secrets++;
    r->se[i] = (Csi__V1__CreateVolumeRequest__SecretsEntry)
        CSI__V1__CREATE_VOLUME_REQUEST__SECRETS_ENTRY__INIT;
    r->se[i].key = (char *)k;
    r->se[i].value = (char *)v;
    r->sp[i] = &r->se[i];
    r->in.secrets = r->sp;
}

/* A valid request: name, one capability, backend rbd in c1/p1, secrets. */
static void create_init(struct create_req *r, const char *name)
{
    memset(r, 0, sizeof(*r));
    r->in = (Csi__V1__CreateVolumeRequest)CSI__V1__CREATE_VOLUME_REQUEST__INIT;
    r->in.name = (char *)name;
    r->cap = (Csi__V1__VolumeCapability)CSI__V1__VOLUME_CAPABILITY__INIT;
    r->mount = (Csi__V1__VolumeCapability__MountVolume)
        CSI__V1__VOLUME_CAPABILITY__MOUNT_VOLUME__INIT;
    r->mode = (Csi__V1__VolumeCapability__AccessMode)CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__INIT;
    r->mode.mode = CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_WRITER;
    r->cap.access_type_case = CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_MOUNT;
    r->cap.mount = &r->mount;
    r->cap.access_mode = &r->mode;
    r->caps[0] = &r->cap;
    r->in.n_volume_capabilities = 1;
    r->in.volume_capabilities = r->caps;
    param(r, "backend", "rbd");
    param(r, "clusterID", "c1");
    param(r, "pool", "p1");
    secret(r, RBD_USER_KEY, "csi");
    secret(r, RBD_KEY_KEY, KEY);
}

static void create_range(struct create_req *r, int64_t required, int64_t limit)
{
    r->range = (Csi__V1__CapacityRange)CSI__V1__CAPACITY_RANGE__INIT;
    r->range.required_bytes = required;
    r->range.limit_bytes = limit;
    r->in.capacity_range = &r->range;
}

static void create_source(struct create_req *r, bool snap, const char *id)
{
    r->cs = (Csi__V1__VolumeContentSource)CSI__V1__VOLUME_CONTENT_SOURCE__INIT;
    if (snap) {
        r->ss = (Csi__V1__VolumeContentSource__SnapshotSource)
            CSI__V1__VOLUME_CONTENT_SOURCE__SNAPSHOT_SOURCE__INIT;
        r->ss.snapshot_id = (char *)id;
        r->cs.type_case = CSI__V1__VOLUME_CONTENT_SOURCE__TYPE_SNAPSHOT;
        r->cs.snapshot = &r->ss;
    } else if (id) {
        r->vs = (Csi__V1__VolumeContentSource__VolumeSource)
            CSI__V1__VOLUME_CONTENT_SOURCE__VOLUME_SOURCE__INIT;
        r->vs.volume_id = (char *)id;
        r->cs.type_case = CSI__V1__VOLUME_CONTENT_SOURCE__TYPE_VOLUME;
        r->cs.volume = &r->vs;
    }
    r->in.volume_content_source = &r->cs;
}

static void create_is(struct create_req *r, enum plan_kind kind, enum grpc_code code,
                      const char *want, struct rbd_plan *ret)
{
    struct rbd_plan pl;
    rbd_create_plan(&r->in, &pl);
    outcome(r->in.name ? r->in.name : "NULL", &pl, kind, code, want);
    if (ret)
        *ret = pl;
    else
        rbd_plan_clear(&pl);
}

static void test_create(void **state)
{
    (void)state;
    struct create_req r;
    struct rbd_plan pl;
    create_init(&r, "");
    create_is(&r, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "name is missing", NULL);
    create_init(&r, "a/b");
    create_is(&r, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "name ", NULL);
    create_init(&r, "v1");
    r.in.n_volume_capabilities = 0;
    create_is(&r, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "volume_capabilities is missing", NULL);
    create_init(&r, "v1");
    param(&r, "format", "raw");
    create_is(&r, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "unknown parameter 'format'", NULL);
    create_init(&r, "v1");
    r.in.n_parameters = 2; /* no pool */
    create_is(&r, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "parameter pool is missing", NULL);
    create_init(&r, "v_1");
    create_is(&r, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "name must not contain '_'", NULL);
    create_init(&r, "v1");
    r.in.n_secrets = 1;
    create_is(&r, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "secrets: " RBD_KEY_KEY " is missing (the "
              "provisioner secret", NULL);
    create_init(&r, "v1");
    r.se[1].value = "not a key!";
    create_is(&r, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "is not a cephx key", &pl);
    assert_null(strstr(pl.refusal.msg, "not a key!")); /* never the key's value */
    rbd_plan_clear(&pl);
    /* Sizes: a malformed range, one above the maximum. */
    create_init(&r, "v1");
    create_range(&r, 2 * MiB, MiB);
    create_is(&r, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "capacity_range", NULL);
    create_range(&r, INT64_MAX, 0);
    create_is(&r, PLAN_REFUSE, GRPC_OUT_OF_RANGE, "above the maximum", NULL);
    /* A bad parameter is refused before the size. */
    param(&r, "pool2", "x");
    create_is(&r, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "unknown parameter 'pool2'", NULL);
    /* The request a worker gets. */
    create_init(&r, "v1");
    param(&r, "radosNamespace", "ns1");
    create_range(&r, 100 * MiB, 0);
    create_is(&r, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_int_equal(pl.size, 100 * MiB);
    assert_string_equal(pl.q->loc.cluster, "c1");
    assert_string_equal(pl.q->loc.pool, "p1");
    assert_string_equal(pl.q->loc.ns, "ns1");
    assert_string_equal(pl.q->loc.image, "v1");
    assert_string_equal(pl.q->cred.user, "csi");
    assert_int_equal(pl.q->required, 100 * MiB);
    rbd_plan_clear(&pl);
    assert_null(pl.q);
}

static void test_create_sources(void **state)
{
    (void)state;
    struct create_req r;
    struct rbd_plan pl;
    create_init(&r, "v2");
    create_source(&r, false, NULL);
    create_is(&r, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "volume_content_source has no type", NULL);
    create_source(&r, true, "s1@n1");
    create_is(&r, PLAN_REFUSE, GRPC_INVALID_ARGUMENT,
              "volume_content_source.snapshot.snapshot_id: s1@n1 is not an RBD snapshot", NULL);
    create_source(&r, false, "v1@n1");
    create_is(&r, PLAN_REFUSE, GRPC_INVALID_ARGUMENT,
              "volume_content_source.volume.volume_id: v1@n1 is not an RBD volume", NULL);
    create_source(&r, false, "rbd:c1:p9::v1");
    create_is(&r, PLAN_REFUSE, GRPC_INVALID_ARGUMENT,
              "the source is in cluster c1 pool p9 namespace ''", NULL);
    create_source(&r, true, "rbdsnap:c1");
    create_is(&r, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "volume_content_source.snapshot.snapshot_id",
              NULL);
    /* The size is checked before the source. */
    create_range(&r, INT64_MAX, 0);
    create_is(&r, PLAN_REFUSE, GRPC_OUT_OF_RANGE, "", NULL);
    r.in.capacity_range = NULL;
    create_source(&r, false, "rbd:c1:p1::v1");
    create_is(&r, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_false(pl.q->src_snap);
    assert_string_equal(pl.q->src.image, "v1");
    rbd_plan_clear(&pl);
    create_source(&r, true, "rbdsnap:c1:p1::s1");
    create_is(&r, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_true(pl.q->src_snap);
    assert_string_equal(pl.q->src.image, "s1");
    rbd_plan_clear(&pl);
}

/* ------------------------------------------------ delete, expand */

static void test_delete(void **state)
{
    (void)state;
    Csi__V1__DeleteVolumeRequest in = CSI__V1__DELETE_VOLUME_REQUEST__INIT;
    Csi__V1__DeleteVolumeRequest__SecretsEntry se[2], *sp[2] = {&se[0], &se[1]};
    se[0] = (Csi__V1__DeleteVolumeRequest__SecretsEntry)
        CSI__V1__DELETE_VOLUME_REQUEST__SECRETS_ENTRY__INIT;
    se[1] = se[0];
    se[0].key = RBD_USER_KEY;
    se[0].value = "csi";
    se[1].key = RBD_KEY_KEY;
    se[1].value = KEY;
    struct rbd_plan pl;
    in.volume_id = "rbd:c1";
    rbd_delete_plan(&in, &pl);
    outcome("delete", &pl, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "volume_id");
    rbd_plan_clear(&pl);
    in.volume_id = "rbd:c1:p1::v1";
    rbd_delete_plan(&in, &pl);
    outcome("delete", &pl, PLAN_REFUSE, GRPC_INVALID_ARGUMENT,
            "secrets: " RBD_USER_KEY " is missing (the provisioner secret");
    rbd_plan_clear(&pl);
    in.n_secrets = 2;
    in.secrets = sp;
    rbd_delete_plan(&in, &pl);
    outcome("delete", &pl, PLAN_ACT, GRPC_OK, NULL);
    assert_string_equal(pl.q->loc.image, "v1");
    rbd_plan_clear(&pl);
}

static void test_expand(void **state)
{
    (void)state;
    Csi__V1__ControllerExpandVolumeRequest in = CSI__V1__CONTROLLER_EXPAND_VOLUME_REQUEST__INIT;
    Csi__V1__ControllerExpandVolumeRequest__SecretsEntry se[2], *sp[2] = {&se[0], &se[1]};
    se[0] = (Csi__V1__ControllerExpandVolumeRequest__SecretsEntry)
        CSI__V1__CONTROLLER_EXPAND_VOLUME_REQUEST__SECRETS_ENTRY__INIT;
    se[1] = se[0];
    se[0].key = RBD_USER_KEY;
    se[0].value = "csi";
    se[1].key = RBD_KEY_KEY;
    se[1].value = KEY;
    Csi__V1__CapacityRange range = CSI__V1__CAPACITY_RANGE__INIT;
    Csi__V1__VolumeCapability cap = CSI__V1__VOLUME_CAPABILITY__INIT;
    struct rbd_plan pl;
    in.volume_id = "rbd:c1:p1::v1";
    rbd_expand_plan(&in, &pl);
    outcome("expand", &pl, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "capacity_range is missing");
    rbd_plan_clear(&pl);
    in.capacity_range = &range;
    in.volume_capability = &cap; /* no access type */
    rbd_expand_plan(&in, &pl);
    outcome("expand", &pl, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "");
    rbd_plan_clear(&pl);
    in.volume_capability = NULL;
    rbd_expand_plan(&in, &pl);
    outcome("expand", &pl, PLAN_REFUSE, GRPC_INVALID_ARGUMENT,
            "(the controller-expand secret");
    rbd_plan_clear(&pl);
    in.n_secrets = 2;
    in.secrets = sp;
    range.required_bytes = INT64_MAX;
    rbd_expand_plan(&in, &pl);
    outcome("expand", &pl, PLAN_REFUSE, GRPC_OUT_OF_RANGE, "above the maximum");
    rbd_plan_clear(&pl);
    range.required_bytes = 200 * MiB;
    rbd_expand_plan(&in, &pl);
    outcome("expand", &pl, PLAN_ACT, GRPC_OK, NULL);
    assert_int_equal(pl.size, 200 * MiB);
    assert_int_equal(pl.q->required, 200 * MiB);
    rbd_plan_clear(&pl);
}

/* ------------------------------------------------------------ snapshots */

static void test_snapshots(void **state)
{
    (void)state;
    Csi__V1__CreateSnapshotRequest in = CSI__V1__CREATE_SNAPSHOT_REQUEST__INIT;
    Csi__V1__CreateSnapshotRequest__SecretsEntry se[2], *sp[2] = {&se[0], &se[1]};
    se[0] = (Csi__V1__CreateSnapshotRequest__SecretsEntry)
        CSI__V1__CREATE_SNAPSHOT_REQUEST__SECRETS_ENTRY__INIT;
    se[1] = se[0];
    se[0].key = RBD_USER_KEY;
    se[0].value = "csi";
    se[1].key = RBD_KEY_KEY;
    se[1].value = KEY;
    struct rbd_plan pl;
    static const struct {
        const char *name, *want;
    } bad[] = {
        {NULL, "name is missing"},
        {"", "name is missing"},
        {"s_1", "name must not contain '_'"},
        {"a/b", "name "},
    };
    in.source_volume_id = "rbd:c1:p1::v1";
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        in.name = (char *)bad[i].name;
        rbd_snapshot_plan(&in, &pl);
        outcome("snapshot", &pl, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, bad[i].want);
        rbd_plan_clear(&pl);
    }
    in.name = "s1";
    in.source_volume_id = "v1@n1";
    rbd_snapshot_plan(&in, &pl);
    outcome("snapshot", &pl, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "source_volume_id");
    rbd_plan_clear(&pl);
    in.source_volume_id = "rbd:c1:p1::v1";
    rbd_snapshot_plan(&in, &pl);
    outcome("snapshot", &pl, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "(the snapshotter secret");
    rbd_plan_clear(&pl);
    in.n_secrets = 2;
    in.secrets = sp;
    rbd_snapshot_plan(&in, &pl);
    outcome("snapshot", &pl, PLAN_ACT, GRPC_OK, NULL);
    assert_string_equal(pl.q->name, "s1");
    assert_string_equal(pl.q->loc.image, "v1");
    rbd_plan_clear(&pl);
    /* An id that would pass 128 bytes. */
    char longname[121];
    memset(longname, 'a', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    in.name = longname;
    rbd_snapshot_plan(&in, &pl);
    outcome("snapshot", &pl, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "use a shorter name");
    rbd_plan_clear(&pl);

    Csi__V1__DeleteSnapshotRequest din = CSI__V1__DELETE_SNAPSHOT_REQUEST__INIT;
    din.snapshot_id = "rbd:c1:p1::v1";
    rbd_delete_snapshot_plan(&din, &pl);
    outcome("delete snapshot", &pl, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "snapshot_id");
    rbd_plan_clear(&pl);
    din.snapshot_id = "rbdsnap:c1:p1::s1";
    rbd_delete_snapshot_plan(&din, &pl);
    outcome("delete snapshot", &pl, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "secrets: ");
    rbd_plan_clear(&pl);
}

static void test_list(void **state)
{
    (void)state;
    Csi__V1__ListSnapshotsRequest in = CSI__V1__LIST_SNAPSHOTS_REQUEST__INIT;
    Csi__V1__ListSnapshotsRequest__SecretsEntry se[2], *sp[2] = {&se[0], &se[1]};
    se[0] = (Csi__V1__ListSnapshotsRequest__SecretsEntry)
        CSI__V1__LIST_SNAPSHOTS_REQUEST__SECRETS_ENTRY__INIT;
    se[1] = se[0];
    se[0].key = RBD_USER_KEY;
    se[0].value = "csi";
    se[1].key = RBD_KEY_KEY;
    se[1].value = KEY;
    in.n_secrets = 2;
    in.secrets = sp;
    struct rbd_plan pl;
    in.max_entries = -1;
    rbd_list_plan(&in, &pl);
    outcome("list", &pl, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "max_entries must not be negative");
    rbd_plan_clear(&pl);
    in.max_entries = 2;
    in.starting_token = "v1:x";
    rbd_list_plan(&in, &pl);
    outcome("list", &pl, PLAN_REFUSE, GRPC_ABORTED, "starting_token is not a token");
    rbd_plan_clear(&pl);
    in.starting_token = "r1:s1";
    in.source_volume_id = "rbd:c1:p1::v1";
    rbd_list_plan(&in, &pl);
    outcome("list", &pl, PLAN_ACT, GRPC_OK, NULL);
    assert_string_equal(pl.q->path, "s1");
    assert_int_equal(pl.q->limit, 2);
    assert_null(pl.q->name);
    rbd_plan_clear(&pl);
    in.snapshot_id = "rbdsnap:c1:p1::s2";
    rbd_list_plan(&in, &pl);
    outcome("list", &pl, PLAN_ACT, GRPC_OK, NULL);
    assert_string_equal(pl.q->name, "s2");
    rbd_plan_clear(&pl);
    in.starting_token = "r1:"; /* the prefix without a name */
    rbd_list_plan(&in, &pl);
    outcome("list", &pl, PLAN_REFUSE, GRPC_ABORTED, "starting_token is not a token");
    rbd_plan_clear(&pl);
    in.starting_token = ""; /* from the start */
    rbd_list_plan(&in, &pl);
    outcome("list", &pl, PLAN_ACT, GRPC_OK, NULL);
    assert_null(pl.q->path);
    rbd_plan_clear(&pl);
    in.snapshot_id = "rbdsnap:";
    rbd_list_plan(&in, &pl);
    outcome("list", &pl, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "snapshot_id");
    rbd_plan_clear(&pl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create),
        cmocka_unit_test(test_create_sources),
        cmocka_unit_test(test_delete),
        cmocka_unit_test(test_expand),
        cmocka_unit_test(test_snapshots),
        cmocka_unit_test(test_list),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
