/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the pure cores of NodeStageVolume, NodeUnstageVolume,
 * NodePublishVolume, NodeUnpublishVolume, NodeGetVolumeStats and
 * NodeExpandVolume (csi/node_plan.h): every refusal with its status code
 * and the field its message names, in the order a caller meets them; the
 * steps a plan leaves to the act (the path to resolve, the bridges first);
 * idempotent repeats; conflicts with the records (staged elsewhere, another
 * access mode or group, published read-write elsewhere, a path another
 * volume uses, busy); the QSD's state as the act hands it; and NUL bytes in
 * every request's strings (csi_request_decode).  No QSD, mount or call: the
 * records are in memory, and a plan must leave them as they were. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "backend.h"
#include "bridge.h"
#include "node_plan.h"
#include "plugin.h"
#include "qsd/state/state.h"
#include "qsd/base/util.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MiB (1024ll * 1024)
#define ROOT "/var/lib/kubelet"
#define STAGING ROOT "/plugins/kubernetes.io/csi/qsd/x/globalmount"
#define TARGET ROOT "/pods/p1/volumes/kubernetes.io~csi/pvc/mount"

struct fixture {
    char dir[32];
    char *run;
    struct plugin_config cfg;
    struct csi c;
};

static int setup(void **state)
{
    struct fixture *f = xcalloc(1, sizeof(*f));
    strcpy(f->dir, "/tmp/test-nplan-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    f->run = xasprintf("%s/run", f->dir);
    assert_int_equal(mkdir(f->run, 0700), 0);
    f->cfg.node_id = "n1";
    f->cfg.driver_name = "qsd.csi.qsd-csi.dev";
    f->cfg.kubelet_root = ROOT;
    f->cfg.state_dir = f->dir;
    f->cfg.run_dir = f->run;
    f->c.cfg = &f->cfg;
    f->c.topo_key = xstrdup("topology.qsd.csi.qsd-csi.dev/node");
    _cleanup_free_ char *msg = NULL;
    assert_int_equal(store_open(f->dir, NULL, &f->c.store, &msg), 0);
    assert_int_equal(bridges_open(&f->c, &msg), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    bridges_free(f->c.bridges);
    store_free(f->c.store);
    free(f->c.topo_key);
    _cleanup_free_ char *cmd = xasprintf("rm -rf '%s'", f->dir);
    assert_int_equal(system(cmd), 0);
    free(f->run);
    free(f);
    return 0;
}

/* A supported capability (mount, single writer), fields set by each test. */
struct cap {
    Csi__V1__VolumeCapability cap;
    Csi__V1__VolumeCapability__MountVolume mount;
    Csi__V1__VolumeCapability__AccessMode mode;
};

static Csi__V1__VolumeCapability *cap_init(struct cap *k)
{
    k->cap = (Csi__V1__VolumeCapability)CSI__V1__VOLUME_CAPABILITY__INIT;
    k->mount = (Csi__V1__VolumeCapability__MountVolume)
        CSI__V1__VOLUME_CAPABILITY__MOUNT_VOLUME__INIT;
    k->mode = (Csi__V1__VolumeCapability__AccessMode)CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__INIT;
    k->mode.mode = CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_WRITER;
    k->cap.access_type_case = CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_MOUNT;
    k->cap.mount = &k->mount;
    k->cap.access_mode = &k->mode;
    return &k->cap;
}

static void cap_ro(struct cap *k)
{
    k->mode.mode = CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_READER_ONLY;
}

/* Ids are cut in place by the plans: each request holds its own copy. */
struct ids {
    char id[160];
};

static char *id_of(struct ids *b, const char *id)
{
    snprintf(b->id, sizeof(b->id), "%s", id);
    return b->id;
}

static struct vol *ready_vol(struct fixture *f, const char *id)
{
    struct vol *v = vol_new(id);
    v->phase = PHASE_READY;
    v->size = v->image_size = 64 * MiB;
    store_add_vol(f->c.store, v);
    return v;
}

static struct vol *staged_vol(struct fixture *f, const char *id, const char *path)
{
    struct vol *v = ready_vol(f, id);
    v->staging_path = xstrdup(path);
    return v;
}

/* The record fields a plan must not change. */
struct snapshot {
    size_t n_vols;
    bool busy;
    char *staging;
    size_t n_pubs;
    int gid;
};

static void snap_take(struct fixture *f, const struct vol *v, struct snapshot *s)
{
    s->n_vols = f->c.store->n_vols;
    s->busy = v ? v->busy : false;
    s->staging = v && v->staging_path ? xstrdup(v->staging_path) : NULL;
    s->n_pubs = v ? v->n_pubs : 0;
    s->gid = v ? v->stage_gid : 0;
}

static void snap_check(struct fixture *f, const struct vol *v, struct snapshot *s)
{
    assert_int_equal(f->c.store->n_vols, s->n_vols);
    if (v) {
        assert_int_equal(v->busy, s->busy);
        if (s->staging)
            assert_string_equal(v->staging_path, s->staging);
        else
            assert_null(v->staging_path);
        assert_int_equal(v->n_pubs, s->n_pubs);
        assert_int_equal(v->stage_gid, s->gid);
    }
    free(s->staging);
}

/* A plan's outcome: kind, code, and a message that contains want. */
static void outcome(const char *what, const struct node_plan *pl, enum plan_kind kind,
                    enum grpc_code code, const char *want)
{
    if (pl->kind != kind || pl->refusal.code != code ||
        (want && (!pl->refusal.msg || !strstr(pl->refusal.msg, want))))
        fail_msg("%s: kind %d code %d (%s), wanted kind %d code %d \"%s\"", what, pl->kind,
                 pl->refusal.code, pl->refusal.msg ? pl->refusal.msg : "-", kind, code,
                 want ? want : "-");
}

static const struct qsd_state LIVE = {.exists = true, .live = true};
static const struct qsd_state STARTING = {.exists = true};
static const struct qsd_state IDLE = {.exists = true, .idle = true};
static const struct qsd_state NONE = {0};

/* ------------------------------------------------------------- paths */

static void test_path_check(void **state)
{
    struct fixture *f = *state;
    static const struct {
        const char *path, *want;
    } bad[] = {
        {NULL, "target_path is missing"},
        {"", "target_path is missing"},
        {"relative/x", "target_path "},
        {ROOT, "target_path "},
        {ROOT "/", "target_path "},
        {ROOT "/a/../b", "target_path "},
        {ROOT "/a/./b", "target_path "},
        {ROOT "//a", "target_path "},
        {"/var/lib/kubeletx/a", "target_path "},
        {"/etc/passwd", "(kubelet root " ROOT ")"},
    };
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        struct verdict v = {0};
        assert_false(node_path_check(&f->c, &v, "target_path", bad[i].path));
        assert_int_equal(v.code, GRPC_INVALID_ARGUMENT);
        if (!strstr(v.msg, bad[i].want))
            fail_msg("%s: \"%s\", wanted \"%s\"", bad[i].path ? bad[i].path : "NULL", v.msg,
                     bad[i].want);
        verdict_clear(&v);
    }
    struct verdict v = {0};
    assert_true(node_path_check(&f->c, &v, "target_path", TARGET));
    assert_int_equal(v.code, GRPC_OK);
}

/* ------------------------------------------------------------- stage */

struct stage_req {
    Csi__V1__NodeStageVolumeRequest in;
    struct cap k;
    struct ids id;
    char path[256];
};

static void stage_init(struct stage_req *r, const char *id, const char *path)
{
    r->in = (Csi__V1__NodeStageVolumeRequest)CSI__V1__NODE_STAGE_VOLUME_REQUEST__INIT;
    r->in.volume_id = id_of(&r->id, id);
    snprintf(r->path, sizeof(r->path), "%s", path ? path : "");
    r->in.staging_target_path = path ? r->path : NULL;
    r->in.volume_capability = cap_init(&r->k);
}

static void stage_is(struct fixture *f, struct stage_req *r, const struct qsd_state *q,
                     enum plan_kind kind, enum grpc_code code, const char *want,
                     struct node_plan *ret)
{
    struct vol *v = store_find_vol(f->c.store, r->id.id);
    struct snapshot s;
    snap_take(f, v, &s);
    struct node_plan pl;
    node_stage_plan(&f->c, &r->in, &pl);
    if (q)
        node_stage_served(&pl, q);
    outcome(r->id.id, &pl, kind, code, want);
    snap_check(f, store_find_vol(f->c.store, r->id.id), &s);
    if (ret)
        *ret = pl;
    else
        node_plan_clear(&pl);
}

static void test_stage_fields(void **state)
{
    struct fixture *f = *state;
    struct stage_req r;
    struct node_plan pl;
    stage_init(&r, "", STAGING);
    stage_is(f, &r, NULL, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "volume_id is missing", &pl);
    assert_null(pl.resolve_path); /* refused before the path is resolved */
    node_plan_clear(&pl);
    stage_init(&r, "a/b", STAGING);
    stage_is(f, &r, NULL, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "volume_id", NULL);
    stage_init(&r, "v1@n2", STAGING);
    stage_is(f, &r, NULL, PLAN_REFUSE, GRPC_NOT_FOUND, "lives on node n2", NULL);
    stage_init(&r, "v1", NULL);
    stage_is(f, &r, NULL, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "staging_target_path is missing",
             NULL);
    stage_init(&r, "v1", STAGING);
    r.in.volume_capability = NULL;
    stage_is(f, &r, NULL, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "volume_capability", NULL);
    stage_init(&r, "v1", STAGING);
    r.k.mount.fs_type = "btrfs";
    stage_is(f, &r, NULL, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "fs_type must be ext4 or xfs", NULL);
    stage_init(&r, "v1", STAGING);
    r.k.mount.volume_mount_group = "wheel";
    stage_is(f, &r, NULL, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "volume_mount_group", NULL);
    stage_init(&r, "v1", "/tmp/elsewhere");
    stage_is(f, &r, NULL, PLAN_REFUSE, GRPC_INVALID_ARGUMENT,
             "staging_target_path is not under", NULL);
    stage_init(&r, "v1", ROOT "/a/../../etc");
    stage_is(f, &r, NULL, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "staging_target_path ", &pl);
    assert_null(pl.resolve_path);
    node_plan_clear(&pl);
    /* Valid fields: the path is resolved first, then the record is missing. */
    stage_init(&r, "v1@n1", STAGING);
    stage_is(f, &r, NULL, PLAN_REFUSE, GRPC_NOT_FOUND, "volume v1 does not exist", &pl);
    assert_string_equal(pl.resolve_field, "staging_target_path");
    assert_string_equal(pl.resolve_path, STAGING);
    assert_string_equal(r.in.volume_id, "v1"); /* this node's suffix cut */
    node_plan_clear(&pl);
}

static void test_stage_records(void **state)
{
    struct fixture *f = *state;
    struct stage_req r;
    struct node_plan pl;
    struct vol *v = ready_vol(f, "v1");
    stage_init(&r, "v1", STAGING);
    /* Busy, or not ready: ABORTED, NOT_FOUND. */
    v->busy = true;
    stage_is(f, &r, NULL, PLAN_REFUSE, GRPC_ABORTED, "an operation on volume v1 is in progress",
             NULL);
    v->busy = false;
    v->phase = PHASE_CREATING;
    stage_is(f, &r, NULL, PLAN_REFUSE, GRPC_NOT_FOUND, "volume v1 does not exist", NULL);
    v->phase = PHASE_READY;
    /* A first staging. */
    r.k.mount.volume_mount_group = "107";
    cap_ro(&r.k);
    stage_is(f, &r, NULL, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_int_equal(pl.step, STAGE_NEW);
    assert_ptr_equal(pl.vol, v);
    assert_ptr_equal(pl.backend, &backend_local);
    assert_int_equal(pl.gid, 107);
    assert_true(pl.ro);
    node_plan_clear(&pl);
    /* The staging path is another volume's, or a publication of one. */
    struct vol *o = staged_vol(f, "v2", STAGING);
    stage_is(f, &r, NULL, PLAN_REFUSE, GRPC_FAILED_PRECONDITION,
             "staging_target_path " STAGING " is already used by the staging path of volume v2",
             NULL);
    free(o->staging_path);
    o->staging_path = xstrdup(ROOT "/other");
    vol_add_pub(o, STAGING, false);
    stage_is(f, &r, NULL, PLAN_REFUSE, GRPC_FAILED_PRECONDITION,
             "already used by a publication of volume v2", NULL);
    /* --max-volumes: v2 is staged, v1 would be the second. */
    f->cfg.max_volumes = 1;
    free(o->staging_path);
    o->staging_path = xstrdup(ROOT "/other");
    vol_del_pub(o, 0);
    stage_is(f, &r, NULL, PLAN_REFUSE, GRPC_RESOURCE_EXHAUSTED, "at most 1 volumes", NULL);
    f->cfg.max_volumes = 2;
    stage_is(f, &r, NULL, PLAN_ACT, GRPC_OK, NULL, NULL);
    /* A socket path longer than a unix address. */
    _cleanup_free_ char *long_run = xasprintf("/%0100d", 0);
    f->cfg.run_dir = long_run;
    stage_is(f, &r, NULL, PLAN_REFUSE, GRPC_INVALID_ARGUMENT,
             "volume id v1 is too long to be served under run directory", NULL);
    f->cfg.run_dir = f->run;
}

static void test_stage_again(void **state)
{
    struct fixture *f = *state;
    struct stage_req r;
    struct node_plan pl;
    struct vol *v = staged_vol(f, "v1", STAGING);
    /* Elsewhere, or with another mode: conflicts, whatever the QSD. */
    stage_init(&r, "v1", ROOT "/elsewhere");
    stage_is(f, &r, &LIVE, PLAN_REFUSE, GRPC_FAILED_PRECONDITION,
             "volume v1 is already staged at " STAGING, NULL);
    stage_init(&r, "v1", STAGING);
    cap_ro(&r.k);
    stage_is(f, &r, &LIVE, PLAN_REFUSE, GRPC_ALREADY_EXISTS,
             "volume v1 is staged with a different access mode (read-only no)", NULL);
    /* The same staging: the plan leaves the QSD's state to the act. */
    stage_init(&r, "v1", STAGING);
    stage_is(f, &r, NULL, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_int_equal(pl.step, STAGE_AGAIN);
    node_plan_clear(&pl);
    /* Served: an idempotent repeat, twice. */
    stage_is(f, &r, &LIVE, PLAN_DONE, GRPC_OK, NULL, NULL);
    stage_is(f, &r, &LIVE, PLAN_DONE, GRPC_OK, NULL, NULL);
    /* Starting: retry later.  Down (or no QSD): start it again. */
    stage_is(f, &r, &STARTING, PLAN_REFUSE, GRPC_UNAVAILABLE,
             "the QSD of volume v1 is being (re)started: retry", NULL);
    stage_is(f, &r, &IDLE, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_int_equal(pl.step, STAGE_REPAIR);
    node_plan_clear(&pl);
    stage_is(f, &r, &NONE, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_int_equal(pl.step, STAGE_REPAIR);
    node_plan_clear(&pl);
    /* Another group: the socket follows while nothing is published. */
    r.k.mount.volume_mount_group = "107";
    stage_is(f, &r, &LIVE, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_int_equal(pl.step, STAGE_REGROUP);
    assert_int_equal(pl.gid, 107);
    node_plan_clear(&pl);
    v->stage_gid = 107;
    stage_is(f, &r, &LIVE, PLAN_DONE, GRPC_OK, NULL, NULL);
    r.k.mount.volume_mount_group = "108";
    vol_add_pub(v, TARGET, false);
    stage_is(f, &r, &LIVE, PLAN_REFUSE, GRPC_FAILED_PRECONDITION,
             "volume v1 is published for group 107, not 108", NULL);
    vol_del_pub(v, 0);
    stage_is(f, &r, &(struct qsd_state){.live = true}, PLAN_REFUSE, GRPC_UNAVAILABLE,
             "the QSD of volume v1 is not running", NULL);
    /* Busy comes before all of it. */
    v->busy = true;
    stage_is(f, &r, &LIVE, PLAN_REFUSE, GRPC_ABORTED, "in progress", NULL);
    v->busy = false;
}

/* One kind of consumer at a time (docs/pod-volumes.md): a volume staged for
 * VM pods is not staged for other pods, nor the other way round; a pod
 * volume's repeat goes on to the act (it checks each piece). */
static void test_stage_kinds(void **state)
{
    struct fixture *f = *state;
    struct stage_req r;
    struct node_plan pl;
    struct vol *v = staged_vol(f, "v1", STAGING);
    stage_init(&r, "v1", STAGING);
    r.k.mount.fs_type = "ext4";
    stage_is(f, &r, &LIVE, PLAN_REFUSE, GRPC_FAILED_PRECONDITION,
             "volume v1 is staged for VM pods (vhost-user) at " STAGING ", not for pods as a "
             "filesystem ext4: one kind of consumer at a time", NULL);
    v->stage_kind = STAGE_KIND_FS;
    v->stage_fs = xstrdup("ext4");
    stage_init(&r, "v1", STAGING);
    stage_is(f, &r, &LIVE, PLAN_REFUSE, GRPC_FAILED_PRECONDITION,
             "volume v1 is staged for pods as a filesystem ext4", NULL);
    r.k.mount.fs_type = "xfs";
    stage_is(f, &r, &LIVE, PLAN_REFUSE, GRPC_FAILED_PRECONDITION,
             "not for pods as a filesystem xfs", NULL);
    r.k.mount.fs_type = "ext4";
    stage_is(f, &r, &LIVE, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_int_equal(pl.step, STAGE_ATTACH);
    node_plan_clear(&pl);
    stage_is(f, &r, &IDLE, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_int_equal(pl.step, STAGE_REPAIR);
    node_plan_clear(&pl);
    /* A new staging says what it is for. */
    ready_vol(f, "v2");
    stage_init(&r, "v2", ROOT "/plugins/kubernetes.io/csi/qsd/y/globalmount");
    r.k.cap.access_type_case = CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_BLOCK;
    stage_is(f, &r, NULL, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_int_equal(pl.step, STAGE_NEW);
    assert_int_equal(pl.use, STAGE_KIND_BLOCK);
    node_plan_clear(&pl);
}

static void test_stage_rbd(void **state)
{
    struct fixture *f = *state;
    struct stage_req r;
    struct node_plan pl;
    /* No record yet: the backend prepares it (credentials, the image). */
    stage_init(&r, "rbd:c1:p1::img", STAGING);
    stage_is(f, &r, NULL, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_int_equal(pl.step, STAGE_PREPARE);
    assert_ptr_equal(pl.backend, &backend_rbd);
    assert_null(pl.vol);
    node_plan_clear(&pl);
    stage_init(&r, "rbd:c1", STAGING);
    stage_is(f, &r, NULL, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "volume_id", NULL);
}

/* ----------------------------------------------------------- unstage */

static void unstage_is(struct fixture *f, const char *id, const char *path, enum plan_kind kind,
                       enum grpc_code code, const char *want)
{
    struct ids b;
    Csi__V1__NodeUnstageVolumeRequest in = CSI__V1__NODE_UNSTAGE_VOLUME_REQUEST__INIT;
    in.volume_id = id_of(&b, id);
    in.staging_target_path = (char *)path;
    struct vol *v = store_find_vol(f->c.store, b.id);
    struct snapshot s;
    snap_take(f, v, &s);
    struct node_plan pl;
    node_unstage_plan(&f->c, &in, &pl);
    outcome(id, &pl, kind, code, want);
    assert_null(pl.resolve_path);
    assert_false(pl.bridge_first);
    if (kind == PLAN_ACT)
        assert_ptr_equal(pl.vol, v);
    snap_check(f, v, &s);
    node_plan_clear(&pl);
}

static void test_unstage(void **state)
{
    struct fixture *f = *state;
    unstage_is(f, "", STAGING, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "volume_id is missing");
    unstage_is(f, "v1", "", PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "staging_target_path is missing");
    unstage_is(f, "v1", "x", PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "staging_target_path ");
    unstage_is(f, "v1", STAGING, PLAN_REFUSE, GRPC_NOT_FOUND, "volume v1 does not exist");
    struct vol *v = ready_vol(f, "v1");
    /* Not staged, or not there: unstaged already. */
    unstage_is(f, "v1", STAGING, PLAN_DONE, GRPC_OK, NULL);
    v->staging_path = xstrdup(ROOT "/elsewhere");
    unstage_is(f, "v1", STAGING, PLAN_DONE, GRPC_OK, NULL);
    free(v->staging_path);
    v->staging_path = xstrdup(STAGING);
    vol_add_pub(v, TARGET, true);
    unstage_is(f, "v1@n1", STAGING, PLAN_REFUSE, GRPC_FAILED_PRECONDITION,
               "volume v1 is still published at " TARGET ": unpublish it first");
    vol_del_pub(v, 0);
    v->busy = true;
    unstage_is(f, "v1", STAGING, PLAN_REFUSE, GRPC_ABORTED, "in progress");
    v->busy = false;
    unstage_is(f, "v1", STAGING, PLAN_ACT, GRPC_OK, NULL);
}

/* ----------------------------------------------------------- publish */

struct pub_req {
    Csi__V1__NodePublishVolumeRequest in;
    struct cap k;
    struct ids id;
    Csi__V1__NodePublishVolumeRequest__VolumeContextEntry ce[2], *cp[2];
};

static void pub_init(struct pub_req *r, const char *id, const char *target, const char *staging)
{
    memset(r, 0, sizeof(*r));
    r->in = (Csi__V1__NodePublishVolumeRequest)CSI__V1__NODE_PUBLISH_VOLUME_REQUEST__INIT;
    r->in.volume_id = id_of(&r->id, id);
    r->in.target_path = (char *)target;
    r->in.staging_target_path = (char *)staging;
    r->in.volume_capability = cap_init(&r->k);
}

static void pub_ctx(struct pub_req *r, const char *key, const char *value)
{
    size_t i = r->in.n_volume_context++;
    r->ce[i] = (Csi__V1__NodePublishVolumeRequest__VolumeContextEntry)
        CSI__V1__NODE_PUBLISH_VOLUME_REQUEST__VOLUME_CONTEXT_ENTRY__INIT;
    r->ce[i].key = (char *)key;
    r->ce[i].value = (char *)value;
    r->cp[i] = &r->ce[i];
    r->in.volume_context = r->cp;
}

/* Plan r; mounted < 0: the first step only, else the second with it. */
static void pub_is(struct fixture *f, struct pub_req *r, int mounted, const struct qsd_state *q,
                   enum plan_kind kind, enum grpc_code code, const char *want,
                   struct node_plan *ret)
{
    struct vol *v = store_find_vol(f->c.store, r->id.id);
    struct snapshot s;
    snap_take(f, v, &s);
    struct node_plan pl;
    node_publish_plan(&f->c, &r->in, &pl);
    if (mounted >= 0)
        node_publish_mounted(&pl, &r->in, mounted, q);
    outcome(r->id.id, &pl, kind, code, want);
    snap_check(f, store_find_vol(f->c.store, r->id.id), &s);
    if (ret)
        *ret = pl;
    else
        node_plan_clear(&pl);
}

static void test_publish_fields(void **state)
{
    struct fixture *f = *state;
    struct pub_req r;
    struct node_plan pl;
    pub_init(&r, "", TARGET, STAGING);
    pub_is(f, &r, -1, NULL, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "volume_id is missing", NULL);
    pub_init(&r, "v1", NULL, STAGING);
    pub_is(f, &r, -1, NULL, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "target_path is missing", NULL);
    pub_init(&r, "v1", TARGET, STAGING);
    r.in.volume_capability = NULL;
    pub_is(f, &r, -1, NULL, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "volume_capability", NULL);
    pub_init(&r, "v1", TARGET, "");
    pub_is(f, &r, -1, NULL, PLAN_REFUSE, GRPC_INVALID_ARGUMENT,
           "staging_target_path is missing (the plugin has STAGE_UNSTAGE_VOLUME)", NULL);
    pub_init(&r, "v1", "/tmp/t", STAGING);
    pub_is(f, &r, -1, NULL, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "target_path ", &pl);
    assert_null(pl.resolve_path); /* a lexical refusal comes before resolving */
    node_plan_clear(&pl);
    /* A bad staging path is answered after target_path is resolved. */
    pub_init(&r, "v1", TARGET, "/tmp/s");
    pub_is(f, &r, -1, NULL, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "staging_target_path ", &pl);
    assert_string_equal(pl.resolve_field, "target_path");
    assert_string_equal(pl.resolve_path, TARGET);
    node_plan_clear(&pl);
    pub_init(&r, "v1", TARGET, STAGING);
    pub_is(f, &r, -1, NULL, PLAN_REFUSE, GRPC_NOT_FOUND, "volume v1 does not exist", NULL);
}

/* A publication's capability must ask for what the volume is staged as;
 * pods share a filesystem or block device read-write, but for
 * SINGLE_NODE_SINGLE_WRITER; a read-only block publication is refused. */
static void test_publish_kinds(void **state)
{
    struct fixture *f = *state;
    struct pub_req r;
    struct vol *v = staged_vol(f, "v1", STAGING);
    pub_init(&r, "v1", TARGET, STAGING);
    r.k.mount.fs_type = "ext4";
    pub_is(f, &r, -1, NULL, PLAN_REFUSE, GRPC_FAILED_PRECONDITION,
           "volume v1 is staged for VM pods (vhost-user), not for pods as a filesystem", NULL);
    v->stage_kind = STAGE_KIND_FS;
    v->stage_fs = xstrdup("ext4");
    pub_init(&r, "v1", TARGET, STAGING);
    pub_is(f, &r, -1, NULL, PLAN_REFUSE, GRPC_FAILED_PRECONDITION,
           "volume v1 is staged for pods as a filesystem, not for VM pods", NULL);
    r.k.mount.fs_type = "ext4";
    vol_add_pub(v, ROOT "/pods/p2/volumes/kubernetes.io~csi/pvc/mount", false);
    pub_is(f, &r, 0, &LIVE, PLAN_ACT, GRPC_OK, NULL, NULL); /* a second writer pod */
    /* ReadWriteOncePod: published read-write once (CSI), readers still. */
    r.k.mode.mode = CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_SINGLE_WRITER;
    pub_is(f, &r, 0, &LIVE, PLAN_REFUSE, GRPC_FAILED_PRECONDITION,
           "volume v1 is already published read-write at " ROOT "/pods/p2/", NULL);
    r.in.readonly = true;
    pub_is(f, &r, 0, &LIVE, PLAN_ACT, GRPC_OK, NULL, NULL);
    r.in.readonly = false;
    r.k.mode.mode = CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_WRITER;
    vol_del_pub(v, 0);
    v->stage_kind = STAGE_KIND_BLOCK;
    free(v->stage_fs);
    v->stage_fs = NULL;
    pub_init(&r, "v1", TARGET, STAGING);
    r.k.cap.access_type_case = CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_BLOCK;
    pub_is(f, &r, 0, &LIVE, PLAN_ACT, GRPC_OK, NULL, NULL);
    r.in.readonly = true;
    pub_is(f, &r, -1, NULL, PLAN_REFUSE, GRPC_INVALID_ARGUMENT,
           "read-only block publications are not supported", NULL);
}

static void test_publish_records(void **state)
{
    struct fixture *f = *state;
    struct pub_req r;
    struct node_plan pl;
    struct vol *v = ready_vol(f, "v1");
    pub_init(&r, "v1", TARGET, STAGING);
    pub_is(f, &r, -1, NULL, PLAN_REFUSE, GRPC_FAILED_PRECONDITION,
           "volume v1 is not staged at " STAGING, NULL);
    v->staging_path = xstrdup(ROOT "/elsewhere");
    pub_is(f, &r, -1, NULL, PLAN_REFUSE, GRPC_FAILED_PRECONDITION,
           "volume v1 is not staged at " STAGING, NULL);
    free(v->staging_path);
    v->staging_path = xstrdup(STAGING);
    v->busy = true;
    pub_is(f, &r, -1, NULL, PLAN_REFUSE, GRPC_ABORTED, "in progress", NULL);
    v->busy = false;
    /* A first publication: not a mount yet. */
    pub_ctx(&r, "csi.storage.k8s.io/pod.uid", "0f1e2d3c-aaaa-bbbb-cccc-000000000001");
    pub_ctx(&r, "csi.storage.k8s.io/pod.namespace", "default");
    pub_is(f, &r, 0, &LIVE, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_int_equal(pl.pub, -1);
    assert_false(pl.ro);
    assert_false(pl.regroup);
    assert_string_equal(pl.pod_uid, "0f1e2d3c-aaaa-bbbb-cccc-000000000001");
    assert_string_equal(pl.pod_ns, "default");
    node_plan_clear(&pl);
    /* A pod uid without its namespace is no pod. */
    r.in.n_volume_context = 1;
    pub_is(f, &r, 0, &LIVE, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_null(pl.pod_uid);
    node_plan_clear(&pl);
    /* The target is a mount that is no publication of v1. */
    pub_is(f, &r, 1, &LIVE, PLAN_REFUSE, GRPC_FAILED_PRECONDITION,
           "target_path " TARGET " is already a mount that is not a publication of volume v1",
           NULL);
    /* Published there: a repeat when mounted, a mount again when not. */
    vol_add_pub(v, TARGET, false);
    pub_is(f, &r, 1, &LIVE, PLAN_DONE, GRPC_OK, NULL, NULL);
    pub_is(f, &r, 1, &LIVE, PLAN_DONE, GRPC_OK, NULL, NULL);
    pub_is(f, &r, 0, &LIVE, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_int_equal(pl.pub, 0);
    node_plan_clear(&pl);
    /* ... but read-only now, or for another group: ALREADY_EXISTS. */
    r.in.readonly = true;
    pub_is(f, &r, 1, &LIVE, PLAN_REFUSE, GRPC_ALREADY_EXISTS,
           "volume v1 is published at " TARGET " with readonly=false", NULL);
    r.in.readonly = false;
    r.k.mount.volume_mount_group = "107";
    pub_is(f, &r, 1, &LIVE, PLAN_REFUSE, GRPC_ALREADY_EXISTS,
           "volume v1 is published at " TARGET " for group -1", NULL);
    r.k.mount.volume_mount_group = NULL;
    /* A second read-write publication elsewhere: refused; read-only: fine. */
    pub_init(&r, "v1", TARGET "2", STAGING);
    pub_is(f, &r, 0, &LIVE, PLAN_REFUSE, GRPC_FAILED_PRECONDITION,
           "volume v1 is already published read-write at " TARGET, NULL);
    r.in.readonly = true;
    pub_is(f, &r, 0, &LIVE, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_true(pl.ro);
    node_plan_clear(&pl);
    /* Another group while published: refused; the QSD is needed for it. */
    r.k.mount.volume_mount_group = "107";
    pub_is(f, &r, 0, &LIVE, PLAN_REFUSE, GRPC_FAILED_PRECONDITION,
           "volume v1 is published for group -1, not 107", NULL);
    vol_del_pub(v, 0);
    pub_init(&r, "v1", TARGET, STAGING);
    r.k.mount.volume_mount_group = "107";
    pub_is(f, &r, 0, &NONE, PLAN_REFUSE, GRPC_UNAVAILABLE, "the QSD of volume v1 is not running",
           NULL);
    pub_is(f, &r, 0, &LIVE, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_true(pl.regroup);
    assert_int_equal(pl.gid, 107);
    node_plan_clear(&pl);
    /* A volume staged read-only is published read-only. */
    v->stage_ro = true;
    r.k.mount.volume_mount_group = NULL;
    pub_is(f, &r, 0, &LIVE, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_true(pl.ro);
    node_plan_clear(&pl);
    /* Onto another volume's staging path or publication: never. */
    struct vol *o = staged_vol(f, "v2", ROOT "/v2");
    vol_add_pub(o, TARGET, false);
    pub_is(f, &r, -1, NULL, PLAN_REFUSE, GRPC_FAILED_PRECONDITION,
           "target_path " TARGET " is already used by a publication of volume v2", NULL);
    pub_init(&r, "v1", ROOT "/v2", STAGING);
    pub_is(f, &r, -1, NULL, PLAN_REFUSE, GRPC_FAILED_PRECONDITION,
           "is already used by the staging path of volume v2", NULL);
}

/* --------------------------------------------------------- unpublish */

static void unpub_is(struct fixture *f, const char *id, const char *target, enum plan_kind kind,
                     enum grpc_code code, const char *want, bool bridge_first, ssize_t pub)
{
    struct ids b;
    Csi__V1__NodeUnpublishVolumeRequest in = CSI__V1__NODE_UNPUBLISH_VOLUME_REQUEST__INIT;
    in.volume_id = id_of(&b, id);
    in.target_path = (char *)target;
    struct vol *v = store_find_vol(f->c.store, b.id);
    struct snapshot s;
    snap_take(f, v, &s);
    struct node_plan pl;
    node_unpublish_plan(&f->c, &in, &pl);
    outcome(id, &pl, kind, code, want);
    assert_int_equal(pl.bridge_first, bridge_first);
    assert_null(pl.resolve_path);
    assert_int_equal(pl.pub, pub);
    snap_check(f, v, &s);
    node_plan_clear(&pl);
}

static void test_unpublish(void **state)
{
    struct fixture *f = *state;
    unpub_is(f, "", TARGET, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "volume_id is missing", false, -1);
    unpub_is(f, "v1", NULL, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "target_path is missing", false,
             -1);
    unpub_is(f, "v1", ROOT, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "target_path ", false, -1);
    /* Valid fields: the bridges may know the id (an ephemeral volume). */
    unpub_is(f, "csi-0123", TARGET, PLAN_REFUSE, GRPC_NOT_FOUND, "volume csi-0123 does not exist",
             true, -1);
    struct vol *v = staged_vol(f, "v1", STAGING);
    unpub_is(f, "v1", TARGET, PLAN_DONE, GRPC_OK, NULL, true, -1);
    vol_add_pub(v, TARGET "2", true);
    vol_add_pub(v, TARGET, false);
    unpub_is(f, "v1@n1", TARGET, PLAN_ACT, GRPC_OK, NULL, true, 1);
    v->busy = true;
    unpub_is(f, "v1", TARGET, PLAN_REFUSE, GRPC_ABORTED, "in progress", true, -1);
    v->busy = false;
}

/* ------------------------------------------------------ stats, expand */

static void stats_is(struct fixture *f, const char *id, const char *path, enum plan_kind kind,
                     enum grpc_code code, const char *want)
{
    struct ids b;
    Csi__V1__NodeGetVolumeStatsRequest in = CSI__V1__NODE_GET_VOLUME_STATS_REQUEST__INIT;
    in.volume_id = id_of(&b, id);
    in.volume_path = (char *)path;
    struct vol *v = store_find_vol(f->c.store, b.id);
    struct snapshot s;
    snap_take(f, v, &s);
    struct node_plan pl;
    node_stats_plan(&f->c, &in, &pl);
    outcome(id, &pl, kind, code, want);
    assert_int_equal(pl.bridge_first, code != GRPC_INVALID_ARGUMENT);
    if (kind == PLAN_ACT)
        assert_ptr_equal(pl.vol, v);
    snap_check(f, v, &s);
    node_plan_clear(&pl);
}

static void test_stats(void **state)
{
    struct fixture *f = *state;
    stats_is(f, "", TARGET, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "volume_id is missing");
    stats_is(f, "v1", "", PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "volume_path is missing");
    stats_is(f, "v1", TARGET, PLAN_REFUSE, GRPC_NOT_FOUND, "volume v1 does not exist");
    struct vol *v = ready_vol(f, "v1");
    stats_is(f, "v1", TARGET, PLAN_REFUSE, GRPC_NOT_FOUND,
             "volume v1 is not staged or published at " TARGET);
    v->staging_path = xstrdup(STAGING);
    stats_is(f, "v1", STAGING, PLAN_ACT, GRPC_OK, NULL);
    vol_add_pub(v, TARGET, false);
    v->busy = true; /* stats run beside any operation */
    stats_is(f, "v1", TARGET, PLAN_ACT, GRPC_OK, NULL);
    v->busy = false;
}

struct exp_req {
    Csi__V1__NodeExpandVolumeRequest in;
    Csi__V1__CapacityRange range;
    struct cap k;
    struct ids id;
};

static void exp_init(struct exp_req *r, const char *id, const char *path)
{
    r->in = (Csi__V1__NodeExpandVolumeRequest)CSI__V1__NODE_EXPAND_VOLUME_REQUEST__INIT;
    r->in.volume_id = id_of(&r->id, id);
    r->in.volume_path = (char *)path;
}

static void exp_range(struct exp_req *r, int64_t required, int64_t limit)
{
    r->range = (Csi__V1__CapacityRange)CSI__V1__CAPACITY_RANGE__INIT;
    r->range.required_bytes = required;
    r->range.limit_bytes = limit;
    r->in.capacity_range = &r->range;
}

static void exp_is(struct fixture *f, struct exp_req *r, unsigned align, bool live,
                   enum plan_kind kind, enum grpc_code code, const char *want,
                   struct node_plan *ret)
{
    struct vol *v = store_find_vol(f->c.store, r->id.id);
    struct snapshot s;
    snap_take(f, v, &s);
    uint64_t size = v ? v->size : 0;
    struct node_plan pl;
    node_expand_plan(&f->c, &r->in, &pl);
    node_expand_size(&pl, &r->in, align, live);
    outcome(r->id.id, &pl, kind, code, want);
    snap_check(f, v, &s);
    if (v)
        assert_int_equal(v->size, size);
    if (ret)
        *ret = pl;
    else
        node_plan_clear(&pl);
}

static void test_expand(void **state)
{
    struct fixture *f = *state;
    struct exp_req r;
    struct node_plan pl;
    exp_init(&r, "", TARGET);
    exp_is(f, &r, 512, true, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "volume_id is missing", NULL);
    exp_init(&r, "v1", NULL);
    exp_is(f, &r, 512, true, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "volume_path is missing", NULL);
    exp_init(&r, "v1", TARGET);
    r.in.volume_capability = cap_init(&r.k);
    r.k.mount.fs_type = "vfat";
    exp_is(f, &r, 512, true, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "fs_type", NULL);
    r.in.volume_capability = NULL; /* optional */
    exp_is(f, &r, 512, true, PLAN_REFUSE, GRPC_NOT_FOUND, "volume v1 does not exist", NULL);
    struct vol *v = staged_vol(f, "v1", STAGING);
    exp_is(f, &r, 512, true, PLAN_REFUSE, GRPC_NOT_FOUND,
           "volume v1 is not staged or published at " TARGET, NULL);
    vol_add_pub(v, TARGET, false);
    v->busy = true;
    exp_is(f, &r, 512, true, PLAN_REFUSE, GRPC_ABORTED, "in progress", NULL);
    v->busy = false;
    /* No range: the recorded size (ControllerExpandVolume's). */
    v->size = 96 * MiB;
    exp_is(f, &r, 512, true, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_int_equal(pl.size, 96 * MiB);
    assert_false(pl.grow);
    node_plan_clear(&pl);
    /* A range: malformed, above the maximum, or aligned to the block. */
    exp_range(&r, 2 * MiB, MiB);
    exp_is(f, &r, 512, true, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "capacity_range: required_bytes",
           NULL);
    exp_range(&r, -1, 0);
    exp_is(f, &r, 512, true, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "must not be negative", NULL);
    exp_range(&r, INT64_MAX, 0);
    exp_is(f, &r, 512, true, PLAN_REFUSE, GRPC_OUT_OF_RANGE, "above the maximum", NULL);
    exp_range(&r, 128 * MiB + 1, 0);
    exp_is(f, &r, 4096, true, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_int_equal(pl.size, 128 * MiB + 4096);
    assert_true(pl.grow);
    node_plan_clear(&pl);
    /* Never shrinks. */
    exp_range(&r, 32 * MiB, 0);
    exp_is(f, &r, 512, true, PLAN_ACT, GRPC_OK, NULL, &pl);
    assert_int_equal(pl.size, 96 * MiB);
    assert_false(pl.grow);
    node_plan_clear(&pl);
    /* Its QSD down: retry later (after the range's own checks). */
    exp_is(f, &r, 512, false, PLAN_REFUSE, GRPC_UNAVAILABLE,
           "the QSD of volume v1 is not running (being restarted): retry", NULL);
    exp_range(&r, -1, 0);
    exp_is(f, &r, 512, false, PLAN_REFUSE, GRPC_INVALID_ARGUMENT, "must not be negative", NULL);
}

/* ---------------------------------------------------------- NUL bytes */

/* Pack m, turn the first '#' of its wire bytes into a NUL, and decode:
 * refused with INVALID_ARGUMENT naming field, nothing decoded. */
static void nul_in(const ProtobufCMessage *m, const char *field)
{
    size_t len = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = xmalloc(len);
    assert_int_equal(protobuf_c_message_pack(m, buf), len);
    uint8_t *hash = memchr(buf, '#', len);
    assert_non_null(hash);
    /* As sent, the request decodes. */
    struct verdict v = {0};
    ProtobufCMessage *ok = csi_request_decode(m->descriptor, buf, len, &v);
    assert_non_null(ok);
    assert_int_equal(v.code, GRPC_OK);
    protobuf_c_message_free_unpacked(ok, NULL);
    *hash = '\0';
    assert_null(csi_request_decode(m->descriptor, buf, len, &v));
    assert_int_equal(v.code, GRPC_INVALID_ARGUMENT);
    _cleanup_free_ char *want = xasprintf("%s contains a NUL byte", field);
    assert_string_equal(v.msg, want);
    verdict_clear(&v);
    free(buf);
}

static void test_nul_bytes(void **state)
{
    (void)state;
    struct stage_req st;
    stage_init(&st, "v1", STAGING "/#/../../x");
    nul_in(&st.in.base, "staging_target_path");
    stage_init(&st, "v1#", STAGING);
    nul_in(&st.in.base, "volume_id");
    stage_init(&st, "v1", STAGING);
    st.k.mount.volume_mount_group = "107#";
    nul_in(&st.in.base, "volume_capability.mount.volume_mount_group");
    Csi__V1__NodeUnstageVolumeRequest un = CSI__V1__NODE_UNSTAGE_VOLUME_REQUEST__INIT;
    un.volume_id = "v1";
    un.staging_target_path = STAGING "#";
    nul_in(&un.base, "staging_target_path");
    struct pub_req pb;
    pub_init(&pb, "v1", TARGET "#", STAGING);
    nul_in(&pb.in.base, "target_path");
    pub_init(&pb, "v1", TARGET, STAGING);
    pub_ctx(&pb, "csi.storage.k8s.io/pod.uid", "u#");
    nul_in(&pb.in.base, "volume_context.value");
    Csi__V1__NodeUnpublishVolumeRequest upb = CSI__V1__NODE_UNPUBLISH_VOLUME_REQUEST__INIT;
    upb.volume_id = "v1#";
    upb.target_path = TARGET;
    nul_in(&upb.base, "volume_id");
    Csi__V1__NodeGetVolumeStatsRequest sr = CSI__V1__NODE_GET_VOLUME_STATS_REQUEST__INIT;
    sr.volume_id = "v1";
    sr.volume_path = TARGET "#";
    nul_in(&sr.base, "volume_path");
    struct exp_req er;
    exp_init(&er, "v1", TARGET);
    er.in.staging_target_path = STAGING "#";
    nul_in(&er.in.base, "staging_target_path");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_path_check, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stage_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stage_records, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stage_again, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stage_kinds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_publish_kinds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stage_rbd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unstage, setup, teardown),
        cmocka_unit_test_setup_teardown(test_publish_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_publish_records, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unpublish, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stats, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expand, setup, teardown),
        cmocka_unit_test(test_nul_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
