/* SPDX-License-Identifier: Apache-2.0 */
/* rbd.c: see rbd.h.
 *
 * Every RPC validates on the loop (INVALID_ARGUMENT, naming the field or
 * the parameter, never a secret's value: the controller RPCs by their pure
 * plans, struct rbd_plan in rbd_int.h), then runs one worker process
 * that reads the cluster file, connects with librados (cephx, the
 * secrets' user and key set in memory, no configuration file, no log, no
 * admin socket; connection and operations bounded by RBD_CONNECT_S and
 * RBD_OP_S, the worker by RBD_WORKER_MS) and does the operation with
 * librbd.  The worker's errno becomes the gRPC code (rbd_code).
 * NodeStageVolume's workers only check (rbd_stage, rbd_confirm_fn: the rule
 * is rbd_lock.c's); the node's record, the key file and the QSD
 * (rbd_export_opts) are made on the loop between them.  The restarts of a
 * staged volume's QSD check with the record's user and key file
 * (rbd_check_fn). */
#include "rbd.h"
#include "rbd_int.h"
#include "rbd_lock.h"
#include "capacity.h"
#include "params.h"
#include "service.h"
#include "qsd/base/log.h"
#include "qsd/base/names.h"
#include "qsd/base/util.h"
#include "qsd/qemu/rbdsrc.h"
#include "volqsd.h"
#include "ids.h"
#include "modify.h"
#include "op.h"

#include <fcntl.h>
#include <inttypes.h>
#include <unistd.h>
#include <rados/librados.h>
#include <time.h>
#include <rbd/librbd.h>

#define RBD_CONNECT_S "10"            /* client_mount_timeout, rados_mon_op_timeout */
#define RBD_OP_S "30"                 /* rados_osd_op_timeout */
#define RBD_CLUSTERS_MAX (64 * 1024)  /* the cluster file */

/* ------------------------------------------------------------ pure parts */

void rbd_loc_clear(struct rbd_loc *l)
{
    free(l->cluster);
    free(l->pool);
    free(l->ns);
    free(l->image);
    memset(l, 0, sizeof(*l));
}

bool rbd_is_id(const char *id)
{
    return id && startswith(id, RBD_ID_PREFIX);
}

void rbd_id_to_name(char *id)
{
    for (char *p = id; *p; p++)
        if (*p == ':')
            *p = '_';
}

bool rbd_is_name(const char *name)
{
    return name && startswith(name, RBD_NAME_PREFIX);
}

/* The location of a record's name (rbd_id_to_name reversed). */
static int loc_from_name(const char *name, struct rbd_loc *ret, char **ret_msg)
{
    _cleanup_free_ char *id = xstrdup(name);
    for (char *p = id; *p; p++)
        if (*p == '_')
            *p = ':';
    return rbd_id_parse(id, "volume_id", ret, ret_msg);
}

char *rbd_id_format(const struct rbd_loc *l)
{
    char *id = xasprintf(RBD_ID_PREFIX "%s:%s:%s:%s", l->cluster, l->pool, l->ns, l->image);
    if (strlen(id) > CSI_ID_MAX) {
        free(id);
        return NULL;
    }
    return id;
}

/* A part of an id or a parameter: a name per names.h without '_' (the
 * node's record name maps ':' to it), or "" when empty_ok. */
static int part_ok(const char *v, size_t len, bool empty_ok, const char *what, char **ret_msg)
{
    const char *why;
    if (len == 0 && empty_ok)
        return 0;
    if (memchr(v, '_', len)) {
        *ret_msg = xasprintf("%s must not contain '_' (RBD volumes)", what);
        return -EINVAL;
    }
    if (name_validate_n(v, len, &why) < 0) {
        *ret_msg = xasprintf("%s %s", what, why);
        return -EINVAL;
    }
    return 0;
}

int rbd_id_parse(const char *id, const char *field, struct rbd_loc *ret, char **ret_msg)
{
    static const char *what[] = {"cluster id", "pool", "namespace", "image"};
    char *parts[4] = {0};
    const char *p = id && startswith(id, RBD_ID_PREFIX) ? id + strlen(RBD_ID_PREFIX) : NULL;
    int r = 0;
    if (!p || strlen(id) > CSI_ID_MAX) {
        *ret_msg = xasprintf("%s is not an RBD volume id (rbd:CLUSTER:POOL:NAMESPACE:IMAGE, at "
                             "most %d bytes)", field, CSI_ID_MAX);
        return -EINVAL;
    }
    for (int i = 0; i < 4 && r == 0; i++) {
        const char *end = i < 3 ? strchr(p, ':') : p + strlen(p);
        _cleanup_free_ char *m = NULL;
        if (!end) {
            *ret_msg = xasprintf("%s: an RBD volume id has 4 parts after rbd: (no %s)", field,
                                 what[i]);
            r = -EINVAL;
        } else if (part_ok(p, (size_t)(end - p), i == 2, what[i], &m) < 0) {
            *ret_msg = xasprintf("%s: %s", field, m);
            r = -EINVAL;
        } else {
            parts[i] = xstrndup(p, (size_t)(end - p));
            p = *end ? end + 1 : end;
        }
    }
    if (r < 0) {
        for (int i = 0; i < 4; i++)
            free(parts[i]);
        return r;
    }
    *ret = (struct rbd_loc){parts[0], parts[1], parts[2], parts[3]};
    return 0;
}

bool rbd_selected(size_t n, Csi__V1__CreateVolumeRequest__ParametersEntry **p)
{
    for (size_t i = 0; i < n; i++)
        if (streq(p[i]->key, "backend"))
            return streq(p[i]->value, "rbd");
    return false;
}

int rbd_params_parse(size_t n, Csi__V1__CreateVolumeRequest__ParametersEntry **p,
                     const char *name, struct rbd_loc *ret, char **ret_msg)
{
    struct rbd_loc l = {0};
    int r = 0;
    for (size_t i = 0; i < n && r == 0; i++) {
        const char *k = p[i]->key, *v = p[i]->value;
        char **dst = streq(k, "clusterID") ? &l.cluster : streq(k, "pool") ? &l.pool
                   : streq(k, "radosNamespace") ? &l.ns : NULL;
        _cleanup_free_ char *m = NULL;
        if (startswith(k, K8S_PREFIX) || streq(k, "backend"))
            continue;
        if (!dst) {
            *ret_msg = xasprintf("unknown parameter '%s' for backend rbd (known: backend, "
                                 "clusterID, pool, radosNamespace)", k);
            r = -EINVAL;
        } else if (part_ok(v, strlen(v), dst == &l.ns, "is", &m) < 0) {
            *ret_msg = xasprintf("invalid parameter %s: the value %s", k, m);
            r = -EINVAL;
        } else {
            free(*dst);
            *dst = xstrdup(v);
        }
    }
    if (r == 0 && (!l.cluster || !l.pool)) {
        *ret_msg = xasprintf("parameter %s is missing (backend rbd needs clusterID and pool)",
                             l.cluster ? "pool" : "clusterID");
        r = -EINVAL;
    }
    if (r == 0 && strchr(name, '_')) {
        *ret_msg = xstrdup("name must not contain '_' for backend rbd");
        r = -EINVAL;
    }
    if (r == 0) {
        if (!l.ns)
            l.ns = xstrdup("");
        l.image = xstrdup(name);
        _cleanup_free_ char *id = rbd_id_format(&l);
        if (!id) {
            *ret_msg = xasprintf("name: the volume id rbd:%s:%s:%s:%s would pass %d bytes; use "
                                 "shorter names", l.cluster, l.pool, l.ns, name, CSI_ID_MAX);
            r = -EINVAL;
        }
    }
    if (r < 0) {
        rbd_loc_clear(&l);
        return r;
    }
    *ret = l;
    return 0;
}

int rbd_cluster_monitors(const char *file, const char *cluster, char **ret, char **ret_msg)
{
    if (!file) {
        *ret_msg = xasprintf("parameter clusterID: cluster %s is unknown (the plugin has no "
                             "cluster file, --rbd-clusters)", cluster);
        return -ENOENT;
    }
    _cleanup_free_ char *data = NULL;
    size_t len;
    /* Followed: a ConfigMap's files are symlinks into its ..data directory. */
    int r = read_file_follow(file, RBD_CLUSTERS_MAX, &data, &len);
    if (r < 0) {
        *ret_msg = xasprintf("cannot read the cluster file %s: %s", file, strerror(-r));
        return -EIO;
    }
    json_error_t je;
    json_t *j = json_loadb(data, len, 0, &je);
    if (!json_is_array(j)) {
        *ret_msg = xasprintf("the cluster file %s is not a JSON array of {clusterID, monitors}",
                             file);
        json_decref(j);
        return -EIO;
    }
    size_t i;
    json_t *e;
    r = -ENOENT;
    json_array_foreach(j, i, e)
    {
        json_t *mons = json_object_get(e, "monitors");
        if (!streq_ptr(json_string_value(json_object_get(e, "clusterID")), cluster))
            continue;
        size_t k;
        json_t *m;
        char *s = NULL;
        r = json_array_size(mons) ? 0 : -EIO;
        json_array_foreach(mons, k, m)
        {
            if (!json_is_string(m) || !qsd_rbd_monitor_ok(json_string_value(m))) {
                r = -EIO;
                break;
            }
            char *t = xasprintf("%s%s%s", s ? s : "", s ? "," : "", json_string_value(m));
            free(s);
            s = t;
        }
        if (r == 0)
            *ret = s;
        else {
            free(s);
            *ret_msg = xasprintf("the cluster file %s: cluster %s needs monitors, a list of "
                                 "\"host:port\"", file, cluster);
        }
        break;
    }
    json_decref(j);
    if (r == -ENOENT)
        *ret_msg = xasprintf("parameter clusterID: cluster %s is not in the cluster file %s",
                             cluster, file);
    return r;
}

void rbd_secret_pick(const char *name, const char *value, const char **user, const char **key)
{
    if (streq(name, RBD_USER_KEY))
        *user = value;
    else if (streq(name, RBD_KEY_KEY))
        *key = value;
}

int rbd_cred_parse(size_t n, Csi__V1__CreateVolumeRequest__SecretsEntry **s, const char *which,
                   struct rbd_cred *ret, char **ret_msg)
{
    const char *user = NULL, *key = NULL;
    for (size_t i = 0; i < n; i++)
        rbd_secret_pick(s[i]->key, s[i]->value, &user, &key);
    return rbd_cred_check(user, key, which, ret, ret_msg);
}

int rbd_cred_check(const char *user, const char *key, const char *which, struct rbd_cred *ret,
                   char **ret_msg)
{
    const char *why;
    if (!user || !key) {
        *ret_msg = xasprintf("secrets: %s is missing (the %s secret of the StorageClass, with "
                             "keys " RBD_USER_KEY " and " RBD_KEY_KEY ")",
                             user ? RBD_KEY_KEY : RBD_USER_KEY, which);
        return -EINVAL;
    }
    if (name_validate(user, &why) < 0) {
        *ret_msg = xasprintf("secrets: " RBD_USER_KEY " %s", why);
        return -EINVAL;
    }
    size_t kl = strlen(key);
    if (kl == 0 || kl > 128 ||
        strspn(key, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") != kl) {
        *ret_msg = xstrdup("secrets: " RBD_KEY_KEY " is not a cephx key (base64, at most 128 "
                           "bytes)");
        return -EINVAL;
    }
    *ret = (struct rbd_cred){xstrdup(user), xstrdup(key)};
    return 0;
}

void rbd_cred_clear(struct rbd_cred *c)
{
    if (c->key)
        explicit_bzero(c->key, strlen(c->key));
    free(c->key);
    free(c->user);
    memset(c, 0, sizeof(*c));
}

void rbd_req_free(struct rbd_req *q)
{
    if (!q)
        return;
    rbd_loc_clear(&q->loc);
    rbd_loc_clear(&q->src);
    rbd_cred_clear(&q->cred);
    free(q->name);
    free(q->path);
    json_decref(q->mparams);
    free(q->packed);
    free(q);
}

static void req_free(void *q)
{
    rbd_req_free(q);
}

const struct op_ctx_type rbd_req_ctx = {"rbd", req_free};

/* --------------------------------------------------------- worker side */

/* errno of the worker -> gRPC code.  EKEYREJECTED: cephx refused the user
 * or key; EACCES/EPERM: the user may not do this. */
enum grpc_code rbd_code(int status)
{
    switch (-status) {
    case EINVAL: return GRPC_INVALID_ARGUMENT;
    case EKEYREJECTED: return GRPC_UNAUTHENTICATED;
    case EACCES:
    case EPERM: return GRPC_PERMISSION_DENIED;
    case ETIMEDOUT:
    case ECONNREFUSED:
    case EHOSTUNREACH:
    case ENETUNREACH: return GRPC_UNAVAILABLE;
    case EEXIST: return GRPC_ALREADY_EXISTS;
    case EBUSY:
    case ENOTEMPTY: return GRPC_FAILED_PRECONDITION;
    case ERANGE: return GRPC_OUT_OF_RANGE;
    case ENOSPC: return GRPC_RESOURCE_EXHAUSTED;
    case ENODEV: return GRPC_NOT_FOUND; /* no such volume (ENOENT: other things) */
    case EUCLEAN: return GRPC_FAILED_PRECONDITION; /* image metadata not ours (rbd_qos.c) */
    default: return GRPC_INTERNAL;
    }
}

void conn_close(struct conn *k)
{
    if (k->io)
        rados_ioctx_destroy(k->io);
    if (k->cluster)
        rados_shutdown(k->cluster);
    if (k->saved_stderr >= 0) {
        dup2(k->saved_stderr, STDERR_FILENO);
        close(k->saved_stderr);
    }
    memset(k, 0, sizeof(*k));
    k->saved_stderr = -1;
}

static void quiet_stderr(struct conn *k)
{
    _cleanup_close_ int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    k->saved_stderr = null < 0 ? -1 : fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
    if (k->saved_stderr >= 0)
        dup2(null, STDERR_FILENO);
}

/* Connect as the request's user and open its pool and namespace.  A pool
 * that does not exist is -ENOENT (the caller words it). */
int conn_open(const struct rbd_req *q, struct conn *k, char **ret_msg)
{
    _cleanup_free_ char *mons = NULL, *host = NULL;
    k->saved_stderr = -1;
    int r = rbd_cluster_monitors(q->clusters, q->loc.cluster, &mons, ret_msg);
    if (r < 0)
        return r == -ENOENT ? -EINVAL : r;
    host = qsd_rbd_mon_host(mons);
    quiet_stderr(k);
    if ((r = rados_create(&k->cluster, q->cred.user)) < 0) {
        *ret_msg = xasprintf("librados: cannot create a cluster handle: %s", strerror(-r));
        k->cluster = NULL;
        return r;
    }
    const char *conf[][2] = {
        {"mon_host", host},
        {"key", q->cred.key},
        {"auth_client_required", "cephx"},
        {"client_mount_timeout", RBD_CONNECT_S},
        {"rados_mon_op_timeout", RBD_CONNECT_S},
        {"rados_osd_op_timeout", RBD_OP_S},
        {"log_to_stderr", "false"},
        {"err_to_stderr", "false"},
        {"log_file", ""},
        {"admin_socket", ""},
        {"keyring", ""},
        {"rbd_blocklist_on_break_lock", "true"}, /* rbd_lock.c: fence, then break */
    };
    for (size_t i = 0; i < ARRAY_SIZE(conf); i++)
        if ((r = rados_conf_set(k->cluster, conf[i][0], conf[i][1])) < 0) {
            *ret_msg = xasprintf("librados: cannot set %s: %s", conf[i][0], strerror(-r));
            conn_close(k);
            return -EIO;
        }
    if ((r = rados_connect(k->cluster)) < 0) {
        bool auth = r == -EACCES || r == -EPERM || r == -EKEYREJECTED;
        *ret_msg = auth ? xasprintf("cluster %s refused user %s: wrong " RBD_USER_KEY " or "
                                    RBD_KEY_KEY " in the secret", q->loc.cluster, q->cred.user)
                        : xasprintf("cannot reach cluster %s (monitors %s) within %s s: %s",
                                    q->loc.cluster, mons, RBD_CONNECT_S, strerror(-r));
        conn_close(k);
        return auth ? -EKEYREJECTED : r == -ETIMEDOUT ? r : -ECONNREFUSED;
    }
    if ((r = rados_ioctx_create(k->cluster, q->loc.pool, &k->io)) < 0) {
        k->io = NULL;
        *ret_msg = xasprintf("parameter pool: cannot open pool %s of cluster %s: %s", q->loc.pool,
                             q->loc.cluster, r == -ENOENT ? "no such pool" : strerror(-r));
        conn_close(k);
        return r;
    }
    rados_ioctx_set_namespace(k->io, q->loc.ns);
    return 0;
}

/* Whether image holds our mark; its size. */
int image_ours(rbd_image_t img, const char *name, uint64_t *ret_size)
{
    char val[NAME_MAX_LEN + 1];
    size_t vl = sizeof(val);
    int r = rbd_metadata_get(img, RBD_META_KEY, val, &vl);
    if (r < 0)
        return r == -ENOENT ? 0 : r;
    if (!streq(val, name))
        return 0;
    rbd_image_info_t info;
    if ((r = rbd_stat(img, &info, sizeof(info))) < 0)
        return r;
    *ret_size = info.size;
    return 1;
}

static int create_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    const struct rbd_req *q = rbd_req_of(op);
    const char *name = q->loc.image;
    struct conn k = {0};
    int r = conn_open(q, &k, ret_msg);
    if (r < 0)
        return r == -ENOENT ? -EINVAL : r;
    int order = 0;
    r = rbd_create2(k.io, name, q->size, RBD_FEATURES, &order);
    bool existed = r == -EEXIST;
    if (r == -EPERM || r == -EACCES) {
        *ret_msg = xasprintf("user %s may not create images in pool %s%s%s (parameters pool, "
                             "radosNamespace: the namespace does not exist or the user's caps do "
                             "not cover it)", q->cred.user, q->loc.pool,
                             *q->loc.ns ? " namespace " : "", q->loc.ns);
        conn_close(&k);
        return r;
    }
    if (r < 0 && !existed) {
        *ret_msg = xasprintf("cannot create image %s in pool %s%s%s: %s", name, q->loc.pool,
                             *q->loc.ns ? " namespace " : "", q->loc.ns,
                             r == -ENOENT ? "no such namespace (parameter radosNamespace)"
                                          : strerror(-r));
        conn_close(&k);
        return r == -ENOENT ? -EINVAL : r;
    }
    rbd_image_t img;
    if ((r = rbd_open(k.io, name, &img, NULL)) < 0) {
        *ret_msg = xasprintf("cannot open image %s: %s", name, strerror(-r));
        conn_close(&k);
        return r == -ENOENT ? -EIO : r;
    }
    uint64_t size = q->size;
    if (existed) {
        /* A retry: ours, and of a size in the range. */
        r = image_ours(img, name, &size);
        if (r == 0)
            *ret_msg = xasprintf("an image named %s exists in pool %s but is not a volume of "
                                 "this plugin", name, q->loc.pool);
        else if (r > 0 && (size < (uint64_t)q->required || (q->limit && size > (uint64_t)q->limit)))
            *ret_msg = xasprintf("volume %s exists with a different capacity (%" PRIu64 " bytes)",
                                 name, size);
        else if (r < 0)
            *ret_msg = xasprintf("cannot read image %s: %s", name, strerror(-r));
        r = r < 0 ? r : *ret_msg ? -EEXIST : 0;
    } else if ((r = rbd_metadata_set(img, RBD_META_KEY, name)) < 0) {
        *ret_msg = xasprintf("cannot mark image %s as a volume: %s", name, strerror(-r));
    }
    /* The limits of mutable_parameters (a retry records them again). */
    if (r == 0 && q->mparams)
        r = rbd_qos_write(img, q->mparams, ret_msg);
    rbd_close(img);
    if (r < 0 && !existed)
        rbd_remove(k.io, name);
    conn_close(&k);
    if (r == 0)
        *ret_result = json_pack("{s:I}", "size", (json_int_t)size);
    return r;
}

static int delete_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    const struct rbd_req *q = rbd_req_of(op);
    const char *name = q->loc.image;
    (void)ret_result;
    struct conn k = {0};
    int r = conn_open(q, &k, ret_msg);
    if (r == -ENOENT) { /* no such pool: no such volume */
        free(*ret_msg);
        *ret_msg = NULL;
        return 0;
    }
    if (r < 0)
        return r;
    rbd_image_t img;
    if ((r = rbd_open(k.io, name, &img, NULL)) == -ENOENT) {
        conn_close(&k);
        return 0;
    }
    if (r < 0) {
        *ret_msg = xasprintf("cannot open image %s: %s", name, strerror(-r));
        conn_close(&k);
        return r;
    }
    uint64_t size;
    rbd_image_watcher_t w[8];
    size_t nw = ARRAY_SIZE(w);
    if ((r = image_ours(img, name, &size)) == 0) {
        *ret_msg = xasprintf("image %s in pool %s is not a volume of this plugin: not deleted",
                             name, q->loc.pool);
        r = -EBUSY;
    } else if (r > 0) {
        /* Our own open registers a watch too. */
        r = rbd_watchers_list(img, w, &nw);
        if (r == 0) {
            if (nw > 1) {
                *ret_msg = xasprintf("volume %s is in use: image %s has %zu other client(s): "
                                     "unstage it first", name, name, nw - 1);
                r = -EBUSY;
            }
            rbd_watchers_list_cleanup(w, nw);
        } else if (r == -ERANGE) {
            *ret_msg = xasprintf("volume %s is in use by %zu clients: unstage it first", name,
                                 nw - 1);
            r = -EBUSY;
        }
    }
    rbd_close(img);
    if (r == 0) /* to the trash while snapshots or clones need it (rbd_snap.c) */
        r = rbd_image_remove(k.io, name, ret_msg);
    conn_close(&k);
    return r == -ENOENT ? 0 : r;
}

/* Connect and open the image of q, a volume of ours, and read its size;
 * read-only (ro) adds no watch.  -ENODEV (NOT_FOUND): no such pool or
 * image, or not ours.  On success k and *img are open. */
int open_volume(const struct rbd_req *q, bool ro, struct conn *k, rbd_image_t *img,
                uint64_t *ret_size, char **ret_msg)
{
    const char *name = q->loc.image;
    int r = conn_open(q, k, ret_msg);
    if (r < 0)
        return r == -ENOENT ? -ENODEV : r;
    if ((r = ro ? rbd_open_read_only(k->io, name, img, NULL) : rbd_open(k->io, name, img, NULL)) <
        0) {
        *ret_msg = xasprintf("cannot open image %s: %s", name,
                             r == -ENOENT ? "no such volume" : strerror(-r));
        conn_close(k);
        return r == -ENOENT ? -ENODEV : r;
    }
    if ((r = image_ours(*img, name, ret_size)) <= 0) {
        *ret_msg = r == 0 ? xasprintf("image %s is not a volume of this plugin", name)
                          : xasprintf("cannot read image %s: %s", name, strerror(-r));
        rbd_close(*img);
        conn_close(k);
        return r == 0 ? -ENODEV : r;
    }
    return 0;
}

/* Grow the image to the request's size (never shrink); its size after. */
static int expand_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    const struct rbd_req *q = rbd_req_of(op);
    const char *name = q->loc.image;
    struct conn k = {0};
    rbd_image_t img;
    uint64_t size = 0;
    int r = open_volume(q, false, &k, &img, &size, ret_msg);
    if (r < 0)
        return r;
    if (q->limit > 0 && size > (uint64_t)q->limit) {
        *ret_msg = xasprintf("volume %s is already %" PRIu64 " bytes, above limit_bytes (no "
                             "shrinking)", name, size);
        r = -ERANGE;
    } else if (q->size > size) {
        /* A QSD serving the image does not see this: NodeExpandVolume's
         * block_resize tells it (and its client). */
        if ((r = rbd_resize(img, q->size)) < 0)
            *ret_msg = xasprintf("cannot grow image %s: %s", name, strerror(-r));
        else
            size = q->size;
    }
    rbd_close(img);
    conn_close(&k);
    if (r == 0)
        *ret_result = json_pack("{s:I}", "size", (json_int_t)size);
    return r;
}

/* ------------------------------------------------------------ loop side */

void rbd_create_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    op->worker = NULL;
    json_int_t size = 0;
    if (status == 0 && json_unpack(result, "{s:I}", "size", &size) < 0)
        status = -EBADMSG, msg = "worker returned no size";
    if (status < 0) {
        grpc_call_fail(op->call, rbd_code(status), "%s", msg ? msg : strerror(-status));
        op_end(op);
        return;
    }
    _cleanup_free_ char *id = rbd_id_format(&rbd_req_of(op)->loc);
    log_info("rbd", "volume created", "volume=%s size=%" PRId64, id, (int64_t)size);
    Csi__V1__Volume vol = CSI__V1__VOLUME__INIT;
    vol.volume_id = id;
    vol.capacity_bytes = size;
    Csi__V1__CreateVolumeResponse out = CSI__V1__CREATE_VOLUME_RESPONSE__INIT;
    out.volume = &vol;
    grpc_call_reply_pb(op->call, &out.base);
    op_end(op);
}

void rbd_start(struct csi *c, struct grpc_call *call, struct rbd_req *q, uint64_t size,
               worker_fn fn, worker_done done)
{
    q->clusters = c->cfg->rbd_clusters;
    q->size = size;
    struct op *op = op_begin(c, call);
    op_set_ctx(op, &rbd_req_ctx, q);
    op_worker(op, fn, RBD_WORKER_MS, done);
}

void rbd_plan_run(struct csi *c, struct grpc_call *call, struct rbd_plan *pl, uint64_t size,
                  worker_fn fn, worker_done done)
{
    if (pl->kind == PLAN_REFUSE)
        verdict_send(&pl->refusal, call);
    else
        rbd_start(c, call, TAKE_PTR(pl->q), size, fn, done);
    rbd_plan_clear(pl);
}

void rbd_plan_clear(struct rbd_plan *pl)
{
    verdict_clear(&pl->refusal);
    rbd_req_free(pl->q);
    *pl = (struct rbd_plan){0};
}

/* A refusal from a parser: INVALID_ARGUMENT, OUT_OF_RANGE for a size. */
static void plan_refuse(struct rbd_plan *pl, int r, const char *msg)
{
    verdict_fail(&pl->refusal, r == -ERANGE ? GRPC_OUT_OF_RANGE : GRPC_INVALID_ARGUMENT, "%s",
                 msg);
}

void rbd_create_plan(Csi__V1__CreateVolumeRequest *in, struct rbd_plan *pl)
{
    *pl = (struct rbd_plan){.kind = PLAN_REFUSE};
    const char *why;
    if (!in->name || !*in->name || name_validate(in->name, &why) < 0) {
        verdict_fail(&pl->refusal, GRPC_INVALID_ARGUMENT,
                     "name %s (the name becomes the RBD image's: 1-128 bytes of [A-Za-z0-9._-])",
                     in->name && *in->name ? why : "is missing");
        return;
    }
    if (!caps_check(&pl->refusal, in->n_volume_capabilities, in->volume_capabilities))
        return;
    struct rbd_req *q = pl->q = xcalloc(1, sizeof(*q));
    _cleanup_free_ char *msg = NULL;
    q->required = in->capacity_range ? in->capacity_range->required_bytes : 0;
    q->limit = in->capacity_range ? in->capacity_range->limit_bytes : 0;
    int r = rbd_params_parse(in->n_parameters, in->parameters, in->name, &q->loc, &msg);
    if (r == 0)
        r = rbd_cred_parse(in->n_secrets, in->secrets, "provisioner", &q->cred, &msg);
    if (r < 0) {
        plan_refuse(pl, -EINVAL, msg);
        return;
    }
    if ((r = capacity_pick(q->required, q->limit, 0, 0, &pl->size, &msg)) < 0)
        plan_refuse(pl, r, msg);
    else if (modify_params_of(in->n_mutable_parameters, in->mutable_parameters, &q->mparams,
                              &msg) < 0)
        verdict_fail(&pl->refusal, GRPC_INVALID_ARGUMENT, "mutable_parameters: %s", msg);
    else if (!in->volume_content_source ||
             rbd_clone_check(in->volume_content_source, q, &pl->refusal))
        pl->kind = PLAN_ACT;
}

void rbd_create_volume(struct csi *c, struct grpc_call *call, Csi__V1__CreateVolumeRequest *in)
{
    struct rbd_plan pl;
    rbd_create_plan(in, &pl);
    if (pl.kind == PLAN_ACT && in->volume_content_source) {
        rbd_clone_volume(c, call, in, TAKE_PTR(pl.q)); /* rbd_snap.c */
        rbd_plan_clear(&pl);
        return;
    }
    rbd_plan_run(c, call, &pl, pl.size, create_fn, rbd_create_done);
}

static void delete_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    (void)result;
    op->worker = NULL;
    if (status < 0) {
        grpc_call_fail(op->call, rbd_code(status), "%s", msg ? msg : strerror(-status));
    } else {
        _cleanup_free_ char *id = rbd_id_format(&rbd_req_of(op)->loc);
        log_info("rbd", "volume deleted", "volume=%s", id);
        Csi__V1__DeleteVolumeResponse out = CSI__V1__DELETE_VOLUME_RESPONSE__INIT;
        grpc_call_reply_pb(op->call, &out.base);
    }
    op_end(op);
}

void rbd_delete_plan(Csi__V1__DeleteVolumeRequest *in, struct rbd_plan *pl)
{
    *pl = (struct rbd_plan){.kind = PLAN_REFUSE};
    struct rbd_req *q = pl->q = xcalloc(1, sizeof(*q));
    _cleanup_free_ char *msg = NULL;
    int r = rbd_id_parse(in->volume_id, "volume_id", &q->loc, &msg);
    if (r == 0)
        r = RBD_CRED_OF(in, "provisioner", &q->cred, &msg);
    if (r < 0)
        plan_refuse(pl, -EINVAL, msg);
    else
        pl->kind = PLAN_ACT;
}

void rbd_delete_volume(struct csi *c, struct grpc_call *call, Csi__V1__DeleteVolumeRequest *in)
{
    struct rbd_plan pl;
    rbd_delete_plan(in, &pl);
    rbd_plan_run(c, call, &pl, 0, delete_fn, delete_done);
}

static void expand_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    op->worker = NULL;
    json_int_t size = 0;
    if (status == 0 && json_unpack(result, "{s:I}", "size", &size) < 0)
        status = -EBADMSG, msg = "worker returned no size";
    if (status < 0) {
        grpc_call_fail(op->call, rbd_code(status), "%s", msg ? msg : strerror(-status));
    } else {
        _cleanup_free_ char *id = rbd_id_format(&rbd_req_of(op)->loc);
        log_info("rbd", "volume expanded", "volume=%s size=%" PRId64, id, (int64_t)size);
        Csi__V1__ControllerExpandVolumeResponse out =
            CSI__V1__CONTROLLER_EXPAND_VOLUME_RESPONSE__INIT;
        out.capacity_bytes = size;
        out.node_expansion_required = true; /* a staged volume's QSD must be told */
        grpc_call_reply_pb(op->call, &out.base);
    }
    op_end(op);
}

void rbd_expand_plan(Csi__V1__ControllerExpandVolumeRequest *in, struct rbd_plan *pl)
{
    *pl = (struct rbd_plan){.kind = PLAN_REFUSE};
    const char *why;
    if (!in->capacity_range) {
        verdict_fail(&pl->refusal, GRPC_INVALID_ARGUMENT, "capacity_range is missing");
        return;
    }
    if (in->volume_capability && (why = cap_problem(in->volume_capability))) {
        verdict_fail(&pl->refusal, GRPC_INVALID_ARGUMENT, "%s", why);
        return;
    }
    struct rbd_req *q = pl->q = xcalloc(1, sizeof(*q));
    _cleanup_free_ char *msg = NULL;
    q->required = in->capacity_range->required_bytes;
    q->limit = in->capacity_range->limit_bytes;
    int r = rbd_id_parse(in->volume_id, "volume_id", &q->loc, &msg);
    if (r == 0)
        r = RBD_CRED_OF(in, "controller-expand", &q->cred, &msg);
    if (r == 0)
        r = capacity_pick(q->required, q->limit, 0, 0, &pl->size, &msg);
    if (r < 0)
        plan_refuse(pl, r, msg);
    else
        pl->kind = PLAN_ACT;
}

void rbd_expand_volume(struct csi *c, struct grpc_call *call,
                       Csi__V1__ControllerExpandVolumeRequest *in)
{
    struct rbd_plan pl;
    rbd_expand_plan(in, &pl);
    rbd_plan_run(c, call, &pl, pl.size, expand_fn, expand_done);
}

/* GetCapacity carries no secrets: the plugin cannot ask the cluster.  It
 * checks the parameters and answers 0 available with no maximum: a
 * StorageClass of backend rbd is not for capacity tracking (Ceph's quotas
 * and full ratios apply at CreateVolume). */
void rbd_get_capacity(struct csi *c, struct grpc_call *call, Csi__V1__GetCapacityRequest *in)
{
    (void)c;
    struct rbd_loc l = {0};
    _cleanup_free_ char *msg = NULL;
    if (rbd_params_parse(in->n_parameters,
                         (Csi__V1__CreateVolumeRequest__ParametersEntry **)in->parameters,
                         "capacity", &l, &msg) < 0) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "%s", msg);
        return;
    }
    rbd_loc_clear(&l);
    Csi__V1__GetCapacityResponse out = CSI__V1__GET_CAPACITY_RESPONSE__INIT;
    grpc_call_reply_pb(call, &out.base);
}

/* ------------------------------------------------------------ node side */

bool rbd_record(const struct vol *v)
{
    return streq_ptr(json_string_value(json_object_get(v->parameters, "backend")), "rbd");
}

int rbd_export_opts(struct csi *c, const struct vol *v, struct qsd_opts *ret, char **ret_msg)
{
    struct rbd_loc l;
    int r = loc_from_name(v->id, &l, ret_msg);
    if (r < 0)
        return r;
    const char *user = json_string_value(json_object_get(v->parameters, "user"));
    const char *mons = json_string_value(json_object_get(v->parameters, "monitors"));
    struct qsd_paths p;
    qsd_paths_init(c->cfg->run_dir, v->id, &p);
    struct qsd_opts o;
    qsd_opts_init(&o);
    o.format = xstrdup("raw");
    o.rbd = xcalloc(1, sizeof(*o.rbd));
    *o.rbd = (struct qsd_rbd){l.pool, l.ns, l.image, xstrdup_or_null(user),
                              xstrdup_or_null(mons), xstrdup(p.rbd_key)};
    free(l.cluster);
    qsd_paths_clear(&p);
    o.iothread = false; /* as for local volumes (vol_export_opts) */
    o.read_only = v->stage_ro;
    o.socket_gid = v->stage_gid;
    o.socket_mode = 0660;
    if ((r = qsd_opts_validate(&o, ret_msg)) < 0) {
        qsd_opts_clear(&o);
        return r;
    }
    *ret = o;
    return 0;
}

/* The image of q exists, is ours, and this node may serve it (rbd_lock.h:
 * no other live client than its own `own`, the watch of our reaped QSD at
 * address dead not counted; a dead lock holder is fenced): the result
 * {size, fenced?, addr?, held, qos?} (addr: our QSD's, when own is 1;
 * held: a live client holds the lock; qos: with_qos, the image's limits). */
static int claim(const struct rbd_req *q, size_t own, bool fresh, const char *dead,
                 bool with_qos, json_t **ret_result, char **ret_msg)
{
    struct conn k = {0};
    rbd_image_t img;
    uint64_t size = 0;
    json_t *fenced = NULL;
    _cleanup_free_ char *addr = NULL;
    bool held = false;
    int r = open_volume(q, true, &k, &img, &size, ret_msg);
    if (r < 0)
        return r;
    r = rbd_lock_claim(img, q->loc.image, own, fresh, dead, &fenced, &addr, &held, ret_msg);
    /* A stage's first check: the limits its QSD starts with (rbd_qos.c;
     * invalid ones refuse the stage, naming the key). */
    json_t *qos = NULL;
    if (r == 0 && with_qos && (r = rbd_qos_read(img, &qos, ret_msg)) == -EUCLEAN)
        r = rbd_qos_refusal(q, ret_msg);
    rbd_close(img);
    conn_close(&k);
    *ret_result = json_pack("{s:I, s:o*, s:s*, s:b}", "size", (json_int_t)size, "fenced", fenced,
                            "addr", addr, "held", held);
    if (qos)
        json_object_set_new(*ret_result, "qos", qos);
    return r;
}

/* Before the QSD starts: claim, and the cluster's monitors. */
static int stage_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    const struct rbd_req *q = rbd_req_of(op);
    _cleanup_free_ char *mons = NULL;
    int r = claim(q, 0, false, NULL, true, ret_result, ret_msg);
    if (r == 0 && (r = rbd_cluster_monitors(q->clusters, q->loc.cluster, &mons, ret_msg)) == 0)
        json_object_set_new(*ret_result, "monitors", json_string(mons));
    return r;
}

int rbd_confirm_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct op *op = arg;
    const struct rbd_req *q = rbd_req_of(op);
    int r = claim(q, 1, true, NULL, false, ret_result, ret_msg);
    /* This node serves the image now: it records itself in it, then reads
     * the limits again (a modify may have come after the first check read
     * them, and seen no client: rbd_qos.c). */
    json_t *qos = NULL;
    _cleanup_free_ char *warn = NULL;
    if (r == 0 && rbd_stage_mark(q, &qos, &warn) == 0) /* null: none */
        json_object_set_new(*ret_result, "qos", qos ? qos : json_null());
    if (r == 0 && warn)
        json_object_set_new(*ret_result, "warn", json_string(warn));
    return r;
}

/* A check of a staged volume's record (rbd_guard.c's restarts): the
 * record's location, user and key file (read in the worker). */
struct rbd_check {
    struct rbd_req q;
    char *key_file, *dead;
    size_t own;
    bool fresh;
};

struct rbd_check *rbd_check_new(struct csi *c, const struct vol *v, size_t own, bool fresh,
                                const char *dead)
{
    struct rbd_check *k = xcalloc(1, sizeof(*k));
    _cleanup_free_ char *msg = NULL;
    if (loc_from_name(v->id, &k->q.loc, &msg) < 0) { /* records are made from valid ids */
        free(k);
        return NULL;
    }
    struct qsd_paths p;
    qsd_paths_init(c->cfg->run_dir, v->id, &p);
    k->key_file = xstrdup(p.rbd_key);
    qsd_paths_clear(&p);
    k->q.cred.user = xstrdup_or_null(json_string_value(json_object_get(v->parameters, "user")));
    k->q.clusters = c->cfg->rbd_clusters;
    k->dead = xstrdup_or_null(dead);
    k->own = own;
    k->fresh = fresh;
    return k;
}

void rbd_check_free(struct rbd_check *k)
{
    if (!k)
        return;
    rbd_loc_clear(&k->q.loc);
    rbd_cred_clear(&k->q.cred);
    free(k->key_file);
    free(k->dead);
    free(k);
}

int rbd_check_fn(void *arg, char **ret_msg, json_t **ret_result)
{
    struct rbd_check *k = arg;
    size_t len;
    int r = read_file(k->key_file, 256, &k->q.cred.key, &len);
    if (r < 0) {
        *ret_msg = xasprintf("cannot read the volume's key file %s: %s (stage the volume again)",
                             k->key_file, strerror(-r));
        return r;
    }
    k->q.cred.key[strcspn(k->q.cred.key, "\n")] = '\0';
    return claim(&k->q, k->own, k->fresh, k->dead, false, ret_result, ret_msg);
}

static void stage_done(int status, const char *msg, json_t *result, void *opaque)
{
    struct op *op = opaque;
    struct csi *c = op->csi;
    struct rbd_req *q = rbd_req_of(op);
    struct grpc_call *call = op->call;
    op->worker = NULL;
    json_int_t size = 0;
    const char *mons = NULL;
    if (status == 0 && json_unpack(result, "{s:I, s:s}", "size", &size, "monitors", &mons) < 0)
        status = -EBADMSG, msg = "worker returned no size";
    rbd_log_fenced(q->name, json_object_get(result, "fenced"));
    struct vol *v = store_find_vol(c->store, q->name);
    if (status == 0 && v && (v->staging_path || v->busy))
        status = -EAGAIN, msg = "an operation on the volume is in progress";
    if (status < 0) {
        grpc_call_fail(call, status == -EAGAIN ? GRPC_ABORTED : rbd_code(status), "%s",
                       msg ? msg : strerror(-status));
        op_end(op);
        return;
    }
    bool fresh = !v;
    if (fresh) {
        v = vol_new(q->name);
        v->phase = PHASE_READY;
        free(v->format);
        v->format = xstrdup("raw");
        v->created = (int64_t)time(NULL);
        store_add_vol(c->store, v);
    }
    json_decref(v->parameters);
    v->parameters = json_pack("{s:s, s:s, s:s}", "backend", "rbd", "user", q->cred.user,
                              "monitors", mons);
    /* The image's limits (rbd_qos.c): what its QSD starts with. */
    json_t *qos = json_object_get(result, "qos");
    json_decref(v->mutable_params);
    v->mutable_params = json_is_object(qos) ? json_incref(qos) : NULL;

    v->size = v->image_size = (uint64_t)size;
    int r = qsd_rbd_write_key(c->cfg->run_dir, v->id, q->cred.key);
    _cleanup_free_ char *path = xstrdup(q->path);
    int gid = q->gid;
    bool ro = q->ro;
    op_take_ctx(op, &rbd_req_ctx); /* kept for the check once the QSD runs (rbd_stage_confirm) */
    op_end(op);     /* the call goes on in q->then (node_stage_new) */
    if (r < 0) {
        grpc_call_fail(call, GRPC_INTERNAL, "cannot write the volume's key file: %s",
                       strerror(-r));
        rbd_req_free(q);
    } else {
        log_info("rbd", "staging", "volume=%s size=%" PRId64, v->id, (int64_t)size);
        q->then(c, call, v, path, gid, ro, q);
    }
    if (!v->staging_path) { /* refused before it was staged: no record, no key */
        csi_remove_runtime(c, v->id);
        store_remove_vol(c->store, v);
    }
}

void rbd_stage(struct csi *c, struct grpc_call *call, Csi__V1__NodeStageVolumeRequest *in,
               int gid, bool ro, stage_new_fn then)
{
    struct rbd_req *q = xcalloc(1, sizeof(*q));
    _cleanup_free_ char *msg = NULL;
    int r = loc_from_name(in->volume_id, &q->loc, &msg);
    if (r == 0)
        r = RBD_CRED_OF(in, "node-stage", &q->cred, &msg);
    if (r < 0) {
        grpc_call_fail(call, GRPC_INVALID_ARGUMENT, "%s", msg);
        rbd_req_free(q);
        return;
    }
    q->name = xstrdup(in->volume_id);
    q->path = xstrdup(in->staging_target_path);
    q->gid = gid;
    q->ro = ro;
    q->then = then;
    q->node = c->cfg->node_id; /* recorded in the image (rbd_confirm_fn) */
    rbd_start(c, call, q, 0, stage_fn, stage_done);
}
