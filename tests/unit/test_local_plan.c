/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the pure cores of a local CreateVolume, CreateSnapshot,
 * DeleteVolume, DeleteSnapshot and ControllerExpandVolume
 * (csi/local_plan.h):
 * every refusal with its status code and the field its message names,
 * in the order a caller meets them; idempotent repeats; conflicts with
 * the records (busy, different, a source that is gone, busy or down);
 * sizes against the source; every content source.  No QSD, file or call:
 * the records are in memory, and a plan must leave them as they were. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "local_plan.h"
#include "plugin.h"
#include "qsd/state/state.h"
#include "qsd/base/util.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GiB (1024ll * 1024 * 1024)

struct fixture {
    char dir[32];
    struct plugin_config cfg;
    struct csi c;
};

static int setup(void **state)
{
    struct fixture *f = xcalloc(1, sizeof(*f));
    strcpy(f->dir, "/tmp/test-plan-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    f->cfg.node_id = "n1";
    f->cfg.driver_name = "qsd.csi.qsd-csi.dev";
    f->c.cfg = &f->cfg;
    f->c.topo_key = xstrdup("topology.qsd.csi.qsd-csi.dev/node");
    _cleanup_free_ char *msg = NULL;
    assert_int_equal(store_open(f->dir, NULL, &f->c.store, &msg), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    store_free(f->c.store);
    free(f->c.topo_key);
    _cleanup_free_ char *cmd = xasprintf("rm -rf '%s'", f->dir);
    assert_int_equal(system(cmd), 0);
    free(f);
    return 0;
}

/* A request with one supported capability; fields are set by each test. */
struct req {
    Csi__V1__CreateVolumeRequest in;
    Csi__V1__VolumeCapability cap, *caps[1];
    Csi__V1__VolumeCapability__MountVolume mount;
    Csi__V1__VolumeCapability__AccessMode mode;
    Csi__V1__CapacityRange range;
    Csi__V1__CreateVolumeRequest__ParametersEntry pe[2], *pp[2];
    Csi__V1__VolumeContentSource cs;
    Csi__V1__VolumeContentSource__SnapshotSource ss;
    Csi__V1__VolumeContentSource__VolumeSource vs;
    char name[64], sid[64];
};

static void req_init(struct req *r, const char *name)
{
    memset(r, 0, sizeof(*r));
    r->in = (Csi__V1__CreateVolumeRequest)CSI__V1__CREATE_VOLUME_REQUEST__INIT;
    r->cap = (Csi__V1__VolumeCapability)CSI__V1__VOLUME_CAPABILITY__INIT;
    r->mount = (Csi__V1__VolumeCapability__MountVolume)CSI__V1__VOLUME_CAPABILITY__MOUNT_VOLUME__INIT;
    r->mode = (Csi__V1__VolumeCapability__AccessMode)CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__INIT;
    r->mode.mode = CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_WRITER;
    r->cap.access_type_case = CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_MOUNT;
    r->cap.mount = &r->mount;
    r->cap.access_mode = &r->mode;
    r->caps[0] = &r->cap;
    r->in.n_volume_capabilities = 1;
    r->in.volume_capabilities = r->caps;
    snprintf(r->name, sizeof(r->name), "%s", name);
    r->in.name = r->name;
}

static void req_range(struct req *r, int64_t required, int64_t limit)
{
    r->range = (Csi__V1__CapacityRange)CSI__V1__CAPACITY_RANGE__INIT;
    r->range.required_bytes = required;
    r->range.limit_bytes = limit;
    r->in.capacity_range = &r->range;
}

static void req_param(struct req *r, const char *k, const char *v)
{
    size_t i = r->in.n_parameters++;
    r->pe[i] = (Csi__V1__CreateVolumeRequest__ParametersEntry)
        CSI__V1__CREATE_VOLUME_REQUEST__PARAMETERS_ENTRY__INIT;
    r->pe[i].key = (char *)k;
    r->pe[i].value = (char *)v;
    r->pp[i] = &r->pe[i];
    r->in.parameters = r->pp;
}

static void req_source(struct req *r, const char *type, const char *id)
{
    r->cs = (Csi__V1__VolumeContentSource)CSI__V1__VOLUME_CONTENT_SOURCE__INIT;
    snprintf(r->sid, sizeof(r->sid), "%s", id);
    if (streq(type, "snapshot")) {
        r->ss = (Csi__V1__VolumeContentSource__SnapshotSource)
            CSI__V1__VOLUME_CONTENT_SOURCE__SNAPSHOT_SOURCE__INIT;
        r->ss.snapshot_id = r->sid;
        r->cs.type_case = CSI__V1__VOLUME_CONTENT_SOURCE__TYPE_SNAPSHOT;
        r->cs.snapshot = &r->ss;
    } else if (streq(type, "volume")) {
        r->vs = (Csi__V1__VolumeContentSource__VolumeSource)
            CSI__V1__VOLUME_CONTENT_SOURCE__VOLUME_SOURCE__INIT;
        r->vs.volume_id = r->sid;
        r->cs.type_case = CSI__V1__VOLUME_CONTENT_SOURCE__TYPE_VOLUME;
        r->cs.volume = &r->vs;
    }
    r->in.volume_content_source = &r->cs;
}

static size_t files_in(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Plan r; expect a refusal with code whose message contains want. */
static void refused(struct fixture *f, struct req *r, enum grpc_code code, const char *want)
{
    size_t nv = f->c.store->n_vols, ns = f->c.store->n_snaps;
    struct create_plan pl;
    create_plan_make(&f->c, &r->in, &pl);
    if (pl.kind != PLAN_REFUSE || pl.refusal.code != code || !strstr(pl.refusal.msg, want))
        fail_msg("%s: kind %d code %d (%s), wanted code %d and \"%s\"", r->name, pl.kind,
                 pl.refusal.code, pl.refusal.msg ? pl.refusal.msg : "-", code, want);
    assert_int_equal(f->c.store->n_vols, nv);
    assert_int_equal(f->c.store->n_snaps, ns);
    assert_int_equal(files_in(f->c.store->vol_dir), 0);
    create_plan_clear(&pl);
}

static struct vol *ready_vol(struct fixture *f, const char *id, uint64_t size)
{
    struct vol *v = vol_new(id);
    v->phase = PHASE_READY;
    v->size = v->image_size = size;
    store_add_vol(f->c.store, v);
    return v;
}

static void test_request_fields(void **state)
{
    struct fixture *f = *state;
    struct req r;
    req_init(&r, "");
    refused(f, &r, GRPC_INVALID_ARGUMENT, "name is missing");
    req_init(&r, "a/b");
    refused(f, &r, GRPC_INVALID_ARGUMENT, "name ");
    req_init(&r, "..");
    refused(f, &r, GRPC_INVALID_ARGUMENT, "name ");
    req_init(&r, "rbd_x");
    refused(f, &r, GRPC_INVALID_ARGUMENT, "names starting with rbd_ are reserved");
    req_init(&r, "v1");
    r.in.n_volume_capabilities = 0;
    refused(f, &r, GRPC_INVALID_ARGUMENT, "volume_capabilities is missing");
    req_init(&r, "v1");
    r.mount.fs_type = "ntfs";
    refused(f, &r, GRPC_INVALID_ARGUMENT, "volume_capabilities[0]: volume_capability.mount.fs_type");
    req_init(&r, "v1");
    r.mode.mode = CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__MULTI_NODE_MULTI_WRITER;
    refused(f, &r, GRPC_INVALID_ARGUMENT, "access mode not supported");
    req_init(&r, "v1");
    req_param(&r, "format", "vmdk");
    refused(f, &r, GRPC_INVALID_ARGUMENT, "format=vmdk");
    req_init(&r, "v1");
    req_range(&r, 2 * GiB, GiB);
    refused(f, &r, GRPC_INVALID_ARGUMENT, "limit");
    req_init(&r, "v1");
    req_range(&r, -1, 0);
    refused(f, &r, GRPC_INVALID_ARGUMENT, "required_bytes");
    req_init(&r, "v1");
    req_source(&r, "none", "");
    refused(f, &r, GRPC_INVALID_ARGUMENT, "volume_content_source has no type");
    req_init(&r, "v1");
    req_source(&r, "snapshot", "s1@n2");
    refused(f, &r, GRPC_RESOURCE_EXHAUSTED, "lives on node n2");
    req_init(&r, "v1");
    req_source(&r, "volume", "../x");
    refused(f, &r, GRPC_INVALID_ARGUMENT, "volume_content_source.volume.volume_id");
    req_init(&r, "v1");
    req_source(&r, "snapshot", "");
    refused(f, &r, GRPC_INVALID_ARGUMENT, "snapshot_id is missing");
    req_init(&r, "v1");
    req_param(&r, "image", "https://example.org/a.qcow2");
    req_param(&r, "imageSha256", "0000000000000000000000000000000000000000000000000000000000000000");
    req_source(&r, "volume", "v0");
    refused(f, &r, GRPC_INVALID_ARGUMENT, "parameter image: a volume of an image class");
}

static void test_topology(void **state)
{
    struct fixture *f = *state;
    struct req r;
    req_init(&r, "v1");
    Csi__V1__TopologyRequirement tr = CSI__V1__TOPOLOGY_REQUIREMENT__INIT;
    Csi__V1__Topology t = CSI__V1__TOPOLOGY__INIT, *tl[1] = {&t};
    Csi__V1__Topology__SegmentsEntry se = CSI__V1__TOPOLOGY__SEGMENTS_ENTRY__INIT, *sl[1] = {&se};
    se.key = "topology.qsd.csi.qsd-csi.dev/node";
    se.value = "n2";
    t.n_segments = 1;
    t.segments = sl;
    tr.n_requisite = 1;
    tr.requisite = tl;
    r.in.accessibility_requirements = &tr;
    refused(f, &r, GRPC_RESOURCE_EXHAUSTED, "does not include topology.qsd.csi.qsd-csi.dev/node=n1");
    se.value = "n1";
    struct create_plan pl;
    create_plan_make(&f->c, &r.in, &pl);
    assert_int_equal(pl.kind, PLAN_ACT);
    create_plan_clear(&pl);
}

static void test_new_and_repeat(void **state)
{
    struct fixture *f = *state;
    struct req r;
    req_init(&r, "v1");
    req_range(&r, 1000, 0);
    struct create_plan pl;
    create_plan_make(&f->c, &r.in, &pl);
    assert_int_equal(pl.kind, PLAN_ACT);
    assert_int_equal(pl.size, 1024); /* aligned up to the logical block */
    assert_string_equal(pl.p.format, "qcow2");
    assert_null(pl.src_type);
    create_plan_clear(&pl);
    /* The same request once the volume exists: the volume again. */
    struct vol *v = ready_vol(f, "v1", 1024);
    free(v->format);
    v->format = xstrdup("qcow2");
    free(v->preallocation);
    v->preallocation = xstrdup("off");
    create_plan_make(&f->c, &r.in, &pl);
    assert_int_equal(pl.kind, PLAN_DONE);
    assert_ptr_equal(pl.existing, v);
    create_plan_clear(&pl);
    /* Different: another format, a size out of the range, parameters. */
    req_param(&r, "format", "raw");
    refused(f, &r, GRPC_ALREADY_EXISTS, "volume v1 exists with a different");
    req_init(&r, "v1");
    req_range(&r, 4096, 0);
    refused(f, &r, GRPC_ALREADY_EXISTS, "volume v1 exists with a different");
    req_init(&r, "v1");
    req_param(&r, "numQueues", "2");
    refused(f, &r, GRPC_ALREADY_EXISTS, "volume v1 exists with a different");
    /* Busy, or still being created: ABORTED, before any comparison. */
    req_init(&r, "v1");
    v->busy = true;
    refused(f, &r, GRPC_ABORTED, "an operation on volume v1 is in progress");
    v->busy = false;
    v->phase = PHASE_CREATING;
    refused(f, &r, GRPC_ABORTED, "an operation on volume v1 is in progress");
    /* Bad fields are refused before the record is looked at. */
    req_param(&r, "format", "vmdk");
    refused(f, &r, GRPC_INVALID_ARGUMENT, "format=vmdk");
}

static void test_sources(void **state)
{
    struct fixture *f = *state;
    struct req r;
    struct create_plan pl;
    /* A snapshot source: gone, not ready, then its size is the minimum. */
    req_init(&r, "v2");
    req_source(&r, "snapshot", "s1");
    refused(f, &r, GRPC_NOT_FOUND, "snapshot s1 does not exist");
    struct snap *sn = snap_new("s1");
    sn->phase = PHASE_CREATING;
    sn->size = 2 * GiB;
    store_add_snap(f->c.store, sn);
    refused(f, &r, GRPC_NOT_FOUND, "snapshot s1 does not exist");
    sn->phase = PHASE_READY;
    req_range(&r, GiB, GiB);
    refused(f, &r, GRPC_OUT_OF_RANGE, "");
    req_init(&r, "v2");
    req_source(&r, "snapshot", "s1@n1"); /* this node's suffix is cut */
    req_range(&r, GiB, 0);
    create_plan_make(&f->c, &r.in, &pl);
    assert_int_equal(pl.kind, PLAN_ACT);
    assert_int_equal(pl.size, 2 * GiB);
    assert_string_equal(pl.src_type, "snapshot");
    assert_string_equal(pl.src_id, "s1");
    assert_ptr_equal(pl.ssrc, sn);
    assert_int_equal(sn->readers, 0); /* the plan takes nothing */
    create_plan_clear(&pl);
    /* A volume source: gone, busy, staged with its QSD down, then ok. */
    req_init(&r, "v3");
    req_source(&r, "volume", "v0");
    refused(f, &r, GRPC_NOT_FOUND, "source volume v0 does not exist");
    struct vol *src = ready_vol(f, "v0", 3 * GiB);
    src->busy = true;
    refused(f, &r, GRPC_ABORTED, "an operation on source volume v0 is in progress");
    src->busy = false;
    src->staging_path = xstrdup("/k/staging/v0");
    refused(f, &r, GRPC_UNAVAILABLE, "source volume v0 is staged but its QSD is not running");
    free(src->staging_path);
    src->staging_path = NULL;
    create_plan_make(&f->c, &r.in, &pl);
    assert_int_equal(pl.kind, PLAN_ACT);
    assert_int_equal(pl.size, 3 * GiB);
    assert_ptr_equal(pl.src, src);
    assert_false(src->busy);
    create_plan_clear(&pl);
    /* An RBD id as the source of a local volume. */
    req_init(&r, "v4");
    req_source(&r, "volume", "rbd:c1:p1:img");
    refused(f, &r, GRPC_INVALID_ARGUMENT, "volume_content_source.volume.volume_id: rbd:c1:p1:img "
                                          "is an RBD volume");
}

/* CreateSnapshot: name, source id, a repeat, conflicts, the source. */
static void snap_refused(struct fixture *f, const char *name, const char *src, enum grpc_code code,
                         const char *want)
{
    char n[64], sid[64];
    snprintf(n, sizeof(n), "%s", name);
    snprintf(sid, sizeof(sid), "%s", src);
    Csi__V1__CreateSnapshotRequest in = CSI__V1__CREATE_SNAPSHOT_REQUEST__INIT;
    in.name = n;
    in.source_volume_id = sid;
    size_t ns = f->c.store->n_snaps;
    struct snapshot_plan pl;
    snapshot_plan_make(&f->c, &in, &pl);
    if (pl.kind != PLAN_REFUSE || pl.refusal.code != code || !strstr(pl.refusal.msg, want))
        fail_msg("%s of %s: kind %d code %d (%s), wanted code %d and \"%s\"", name, src, pl.kind,
                 pl.refusal.code, pl.refusal.msg ? pl.refusal.msg : "-", code, want);
    assert_int_equal(f->c.store->n_snaps, ns);
    assert_int_equal(files_in(f->c.store->snap_dir), 0);
    snapshot_plan_clear(&pl);
}

static void test_snapshot(void **state)
{
    struct fixture *f = *state;
    snap_refused(f, "", "v0", GRPC_INVALID_ARGUMENT, "name is missing");
    snap_refused(f, "a b", "v0", GRPC_INVALID_ARGUMENT, "name ");
    snap_refused(f, "s1", "", GRPC_INVALID_ARGUMENT, "source_volume_id is missing");
    snap_refused(f, "s1", "v0@n2", GRPC_NOT_FOUND, "lives on node n2");
    snap_refused(f, "s1", "v0@bad/node", GRPC_INVALID_ARGUMENT, "the node after '@'");
    snap_refused(f, "s1", "v0", GRPC_NOT_FOUND, "volume v0 does not exist");
    struct vol *v = ready_vol(f, "v0", GiB);
    v->busy = true;
    snap_refused(f, "s1", "v0", GRPC_ABORTED, "an operation on volume v0 is in progress");
    v->busy = false;
    v->staging_path = xstrdup("/k/staging/v0");
    snap_refused(f, "s1", "v0", GRPC_UNAVAILABLE, "volume v0 is staged but its QSD is not");
    free(v->staging_path);
    v->staging_path = NULL;
    char n[] = "s1", sid[] = "v0@n1";
    Csi__V1__CreateSnapshotRequest in = CSI__V1__CREATE_SNAPSHOT_REQUEST__INIT;
    in.name = n;
    in.source_volume_id = sid;
    struct snapshot_plan pl;
    snapshot_plan_make(&f->c, &in, &pl);
    assert_int_equal(pl.kind, PLAN_ACT);
    assert_ptr_equal(pl.src, v);
    assert_false(v->busy);
    snapshot_plan_clear(&pl);
    /* Once it exists: the same request answers it; another source conflicts. */
    struct snap *sn = snap_new("s1");
    sn->phase = PHASE_READY;
    sn->source = xstrdup("v0");
    store_add_snap(f->c.store, sn);
    snapshot_plan_make(&f->c, &in, &pl);
    assert_int_equal(pl.kind, PLAN_DONE);
    assert_ptr_equal(pl.existing, sn);
    snapshot_plan_clear(&pl);
    ready_vol(f, "v9", GiB);
    snap_refused(f, "s1", "v9", GRPC_ALREADY_EXISTS, "snapshot s1 exists with a different source");
    sn->busy = true;
    snap_refused(f, "s1", "v0", GRPC_ABORTED, "an operation on snapshot s1 is in progress");
}

/* DeleteVolume of id: expect kind, and for a refusal its code and text. */
static void delete_is(struct fixture *f, const char *id, enum plan_kind kind, enum grpc_code code,
                      const char *want)
{
    char buf[64];
    snprintf(buf, sizeof(buf), "%s", id);
    Csi__V1__DeleteVolumeRequest dv = CSI__V1__DELETE_VOLUME_REQUEST__INIT;
    dv.volume_id = buf;
    struct delete_plan pl;
    delete_volume_plan(&f->c, &dv, &pl);
    if (pl.kind != kind || pl.refusal.code != code || (want && !strstr(pl.refusal.msg, want)))
        fail_msg("DeleteVolume %s: kind %d code %d (%s), wanted kind %d code %d \"%s\"", id,
                 pl.kind, pl.refusal.code, pl.refusal.msg ? pl.refusal.msg : "-", kind, code,
                 want ? want : "-");
    delete_plan_clear(&pl);
}

static void test_delete(void **state)
{
    struct fixture *f = *state;
    struct delete_plan pl;
    char id[64];
    Csi__V1__DeleteVolumeRequest dv = CSI__V1__DELETE_VOLUME_REQUEST__INIT;
    Csi__V1__DeleteSnapshotRequest ds = CSI__V1__DELETE_SNAPSHOT_REQUEST__INIT;
    dv.volume_id = id;
    ds.snapshot_id = id;
    delete_is(f, "", PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "volume_id is missing");
    delete_is(f, "v0@n2", PLAN_REFUSE, GRPC_NOT_FOUND, "lives on node n2");
    delete_is(f, "v0", PLAN_DONE, GRPC_OK, NULL); /* never made, or deleted already */
    struct vol *v = ready_vol(f, "v0", GiB);
    v->busy = true;
    delete_is(f, "v0", PLAN_REFUSE, GRPC_ABORTED, "an operation on volume v0 is in progress");
    v->busy = false;
    vol_add_pub(v, "/k/pods/t1", false);
    delete_is(f, "v0@n1", PLAN_REFUSE, GRPC_FAILED_PRECONDITION, "published at /k/pods/t1");
    vol_del_pub(v, 0);
    v->staging_path = xstrdup("/k/staging/v0");
    delete_is(f, "v0", PLAN_REFUSE, GRPC_FAILED_PRECONDITION, "staged at /k/staging/v0");
    free(v->staging_path);
    v->staging_path = NULL;
    snprintf(id, sizeof(id), "v0");
    delete_volume_plan(&f->c, &dv, &pl);
    assert_int_equal(pl.kind, PLAN_ACT);
    assert_ptr_equal(pl.vol, v);
    assert_int_equal(v->phase, PHASE_READY); /* the plan changes nothing */
    delete_plan_clear(&pl);
    /* DeleteSnapshot: gone is done; busy or read (a restore) is ABORTED. */
    snprintf(id, sizeof(id), "s1");
    delete_snapshot_plan(&f->c, &ds, &pl);
    assert_int_equal(pl.kind, PLAN_DONE);
    delete_plan_clear(&pl);
    struct snap *sn = snap_new("s1");
    sn->phase = PHASE_READY;
    sn->source = xstrdup("v0");
    sn->readers = 1;
    store_add_snap(f->c.store, sn);
    delete_snapshot_plan(&f->c, &ds, &pl);
    assert_int_equal(pl.kind, PLAN_REFUSE);
    assert_int_equal(pl.refusal.code, GRPC_ABORTED);
    delete_plan_clear(&pl);
    sn->readers = 0;
    delete_snapshot_plan(&f->c, &ds, &pl);
    assert_int_equal(pl.kind, PLAN_ACT);
    assert_ptr_equal(pl.snap, sn);
    delete_plan_clear(&pl);
    snprintf(id, sizeof(id), "s1@");
    delete_snapshot_plan(&f->c, &ds, &pl);
    assert_int_equal(pl.kind, PLAN_REFUSE);
    assert_int_equal(pl.refusal.code, GRPC_INVALID_ARGUMENT);
    delete_plan_clear(&pl);
}

/* ControllerExpandVolume of id to [required, limit] (limit -1: no range). */
static void expand_is(struct fixture *f, const char *id, int64_t required, int64_t limit,
                      enum plan_kind kind, enum grpc_code code, const char *want,
                      struct expand_plan *ret)
{
    char buf[64];
    snprintf(buf, sizeof(buf), "%s", id);
    Csi__V1__ControllerExpandVolumeRequest in = CSI__V1__CONTROLLER_EXPAND_VOLUME_REQUEST__INIT;
    Csi__V1__CapacityRange cr = CSI__V1__CAPACITY_RANGE__INIT;
    in.volume_id = buf;
    cr.required_bytes = required;
    cr.limit_bytes = limit;
    if (limit >= 0)
        in.capacity_range = &cr;
    struct expand_plan pl;
    expand_plan_make(&f->c, &in, &pl);
    if (pl.kind != kind || pl.refusal.code != code || (want && !strstr(pl.refusal.msg, want)))
        fail_msg("expand %s: kind %d code %d (%s), wanted kind %d code %d \"%s\"", id, pl.kind,
                 pl.refusal.code, pl.refusal.msg ? pl.refusal.msg : "-", kind, code,
                 want ? want : "-");
    if (ret)
        *ret = pl;
    else
        expand_plan_clear(&pl);
}

static void test_expand(void **state)
{
    struct fixture *f = *state;
    struct expand_plan pl;
    expand_is(f, "", GiB, 0, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "volume_id is missing", NULL);
    expand_is(f, "v0", GiB, -1, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "capacity_range is missing",
              NULL);
    expand_is(f, "v0", GiB, 0, PLAN_REFUSE, GRPC_NOT_FOUND, "volume v0 does not exist", NULL);
    struct vol *v = ready_vol(f, "v0", GiB);
    json_object_set_new(v->parameters, "logicalBlockSize", json_string("4096"));
    v->busy = true;
    expand_is(f, "v0", 2 * GiB, 0, PLAN_REFUSE, GRPC_ABORTED, "in progress", NULL);
    v->busy = false;
    expand_is(f, "v0", 2 * GiB, GiB, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "", NULL);
    /* No shrinking below what the volume is. */
    expand_is(f, "v0", GiB / 2, GiB / 2, PLAN_REFUSE, GRPC_OUT_OF_RANGE, "above limit_bytes", NULL);
    /* Already that large: the size it has, no node step when not staged. */
    expand_is(f, "v0", GiB / 2, 0, PLAN_DONE, GRPC_OK, NULL, &pl);
    assert_int_equal(pl.size, GiB);
    assert_false(pl.node);
    expand_plan_clear(&pl);
    /* Grow, aligned to the volume's 4096-byte blocks. */
    expand_is(f, "v0@n1", GiB + 1, 0, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_int_equal(pl.size, GiB + 4096);
    assert_ptr_equal(pl.vol, v);
    assert_int_equal(v->size, GiB); /* the plan changes nothing */
    expand_plan_clear(&pl);
    /* Recorded larger while staged, not yet grown by the node: node step. */
    v->staging_path = xstrdup("/k/staging/v0");
    v->size = 2 * GiB;
    expand_is(f, "v0", 2 * GiB, 0, PLAN_DONE, GRPC_OK, NULL, &pl);
    assert_true(pl.node);
    expand_plan_clear(&pl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_request_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_topology, setup, teardown),
        cmocka_unit_test_setup_teardown(test_new_and_repeat, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sources, setup, teardown),
        cmocka_unit_test_setup_teardown(test_snapshot, setup, teardown),
        cmocka_unit_test_setup_teardown(test_delete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expand, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
