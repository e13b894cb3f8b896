/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/qsdopts.c: what a volume's QSD is given, built without I/O: the
 * export's options (parse, validate, record), the runtime paths, the command
 * line and the block nodes' JSON.  See qsdopts.h. */
#include "qsd/qemu/qsdopts.h"
#include "qsd/qemu/rbdsrc.h"
#include "qsd/base/util.h"

#include <grp.h>

/* ------------------------------------------------------------ options */

const char *const QSD_LIMIT_KEYS[QSD_LIM_N] = {
    "iops-read", "iops-write", "bps-read", "bps-write",
    "iops-read-max", "iops-write-max", "bps-read-max", "bps-write-max",
};

json_t *qsd_limits_json(const struct qsd_limits *l)
{
    json_t *j = json_object();
    for (int i = 0; i < QSD_LIM_N; i++)
        json_object_set_new(j, QSD_LIMIT_KEYS[i], json_integer((json_int_t)l->v[i]));
    return j;
}

void qsd_opts_init(struct qsd_opts *o)
{
    *o = (struct qsd_opts){
        .num_queues = 1,
        .logical_block_size = 512,
        .cache = xstrdup("none"),
        .discard = xstrdup("unmap"),
        .detect_zeroes = xstrdup("off"),
        .iothread = true,
        .socket_gid = -1,
        .socket_mode = 0660,
    };
}

void qsd_opts_clear(struct qsd_opts *o)
{
    free(o->image);
    free(o->format);
    free(o->cache);
    free(o->aio);
    free(o->discard);
    free(o->detect_zeroes);
    qsd_rbd_free(o->rbd);
    memset(o, 0, sizeof(*o));
}

void qsd_opts_copy(struct qsd_opts *dst, const struct qsd_opts *src)
{
    *dst = *src;
    dst->image = xstrdup_or_null(src->image);
    dst->format = xstrdup_or_null(src->format);
    dst->cache = xstrdup_or_null(src->cache);
    dst->aio = xstrdup_or_null(src->aio);
    dst->discard = xstrdup_or_null(src->discard);
    dst->detect_zeroes = xstrdup_or_null(src->detect_zeroes);
    dst->rbd = qsd_rbd_copy(src->rbd);
}

static bool one_of(const char *v, const char *const *allowed)
{
    for (; *allowed; allowed++)
        if (streq(v, *allowed))
            return true;
    return false;
}

static const char *const CACHE_MODES[] = {"none", "writeback", "writethrough", "directsync", "unsafe", NULL};
static const char *const AIO_MODES[] = {"io_uring", "native", "threads", NULL};
static const char *const DISCARD_MODES[] = {"unmap", "ignore", NULL};
static const char *const DZ_MODES[] = {"off", "on", "unmap", NULL};
static const char *const FORMATS[] = {"qcow2", "raw", NULL};

static int parse_bool(const char *v, bool *ret)
{
    if (streq(v, "true") || streq(v, "on") || streq(v, "yes") || streq(v, "1"))
        *ret = true;
    else if (streq(v, "false") || streq(v, "off") || streq(v, "no") || streq(v, "0"))
        *ret = false;
    else
        return -EINVAL;
    return 0;
}

static int set_enum(char **field, const char *key, const char *value, const char *const *allowed,
                    char **ret_msg)
{
    if (!one_of(value, allowed)) {
        _cleanup_free_ char *list = NULL;
        size_t n = 0;
        for (const char *const *a = allowed; *a; a++)
            n += strlen(*a) + 2;
        list = xcalloc(1, n + 1);
        for (const char *const *a = allowed; *a; a++) {
            if (a != allowed)
                strcat(list, ", ");
            strcat(list, *a);
        }
        *ret_msg = xasprintf("invalid %s '%s': expected one of %s", key, value, list);
        return -EINVAL;
    }
    free(*field);
    *field = xstrdup(value);
    return 0;
}

int qsd_opts_set(struct qsd_opts *o, const char *key, const char *value, char **ret_msg)
{
    uint64_t v;
    bool b;
    int r = qsd_rbd_set(&o->rbd, key, value, ret_msg);
    if (r != -ENOENT)
        return r;
    if (streq(key, "num-queues")) {
        if (parse_uint(value, 1, 16, &v) < 0) {
            *ret_msg = xasprintf("invalid num-queues '%s': expected an integer from 1 to 16", value);
            return -EINVAL;
        }
        o->num_queues = (unsigned)v;
    } else if (streq(key, "logical-block-size")) {
        if (parse_uint(value, 512, 4096, &v) < 0 || (v != 512 && v != 4096)) {
            *ret_msg = xasprintf("invalid logical-block-size '%s': expected 512 or 4096", value);
            return -EINVAL;
        }
        o->logical_block_size = (unsigned)v;
    } else if (streq(key, "read-only") || streq(key, "iothread")) {
        if (parse_bool(value, &b) < 0) {
            *ret_msg = xasprintf("invalid %s '%s': expected true or false", key, value);
            return -EINVAL;
        }
        if (streq(key, "read-only"))
            o->read_only = b;
        else
            o->iothread = b;
    } else if (streq(key, "cache")) {
        return set_enum(&o->cache, key, value, CACHE_MODES, ret_msg);
    } else if (streq(key, "aio")) {
        return set_enum(&o->aio, key, value, AIO_MODES, ret_msg);
    } else if (streq(key, "discard")) {
        return set_enum(&o->discard, key, value, DISCARD_MODES, ret_msg);
    } else if (streq(key, "detect-zeroes")) {
        return set_enum(&o->detect_zeroes, key, value, DZ_MODES, ret_msg);
    } else if (streq(key, "format")) {
        return set_enum(&o->format, key, value, FORMATS, ret_msg);
    } else if (streq(key, "socket-mode")) {
        char *end;
        errno = 0;
        unsigned long m = strtoul(value, &end, 8);
        if (!*value || *end || errno || (m & ~0660ul) || !(m & 0600)) {
            *ret_msg = xasprintf("invalid socket-mode '%s': expected octal within 0660 "
                                 "(owner rw required; no world or execute bits)", value);
            return -EINVAL;
        }
        o->socket_mode = (unsigned)m;
    } else if (streq(key, "socket-group")) {
        if (parse_uint(value, 0, INT32_MAX, &v) == 0) {
            o->socket_gid = (int)v;
        } else {
            struct group *g = getgrnam(value);
            if (!g) {
                *ret_msg = xasprintf("invalid socket-group '%s': no such group", value);
                return -EINVAL;
            }
            o->socket_gid = (int)g->gr_gid;
        }
    } else {
        *ret_msg = xasprintf("unknown option '%s'", key);
        return -EINVAL;
    }
    return 0;
}

int qsd_opts_validate(const struct qsd_opts *o, char **ret_msg)
{
    if (o->rbd) {
        int r = qsd_rbd_validate(o->rbd, ret_msg);
        if (r == 0 && (o->image || !streq_ptr(o->format, "raw"))) {
            *ret_msg = xstrdup("an RBD volume has no image path and format raw");
            r = -EINVAL;
        }
        if (r < 0)
            return r;
    } else if (!o->image || o->image[0] != '/') {
        *ret_msg = xstrdup("image path must be absolute");
        return -EINVAL;
    }
    if (!o->format || !one_of(o->format, FORMATS)) {
        *ret_msg = xstrdup("format must be qcow2 or raw");
        return -EINVAL;
    }
    if (streq_ptr(o->aio, "native") && !qsd_opts_direct(o)) {
        *ret_msg = xasprintf("aio=native needs O_DIRECT: use cache=none or cache=directsync, not cache=%s",
                             o->cache);
        return -EINVAL;
    }
    if (streq(o->detect_zeroes, "unmap") && !streq(o->discard, "unmap")) {
        *ret_msg = xstrdup("detect-zeroes=unmap needs discard=unmap");
        return -EINVAL;
    }
    return 0;
}

bool qsd_opts_direct(const struct qsd_opts *o)
{
    return streq(o->cache, "none") || streq(o->cache, "directsync");
}

const char *qsd_opts_aio(const struct qsd_opts *o)
{
    /* Linux AIO wherever it is valid (O_DIRECT), io_uring elsewhere.  On a
     * quiet machine, QEMU 11.1.3 and 10.0.2 side by side, Linux AIO was the
     * faster of the two for raw (small writes) and for write-through qcow2
     * too (rw4k QD32 0.46 against io_uring's 0.27 of the limit on 11.1.3,
     * 0.38 against 0.21 on 10.0.2; reads no slower).  An export that
     * flushes every write without qcow2 (raw with cache=directsync) was not
     * measured apart: it takes the same rule.  Figures: docs/bench/README.md,
     * docs/bench/qcow2-aio-both/. */
    if (o->aio)
        return o->aio;
    return qsd_opts_direct(o) ? "native" : "io_uring";
}

json_t *qsd_opts_to_json(const struct qsd_opts *o)
{
    json_t *j = json_pack("{s:s*, s:s?, s:I, s:I, s:b, s:s, s:s, s:s, s:s, s:b, s:I, s:I}",
                     "image", o->image, "format", o->format, "num-queues",
                     (json_int_t)o->num_queues, "logical-block-size",
                     (json_int_t)o->logical_block_size, "read-only", o->read_only, "cache",
                     o->cache, "aio", qsd_opts_aio(o), "discard", o->discard, "detect-zeroes",
                     o->detect_zeroes, "iothread", o->iothread, "socket-gid",
                     (json_int_t)o->socket_gid, "socket-mode", (json_int_t)o->socket_mode);
    if (o->rbd)
        json_object_set_new(j, "rbd", qsd_rbd_to_json(o->rbd));
    return j;
}

int qsd_opts_from_json(json_t *j, struct qsd_opts *ret, char **ret_msg)
{
    struct qsd_opts o;
    qsd_opts_init(&o);
    const char *image = NULL, *format = NULL, *cache = NULL, *aio = NULL, *discard = NULL,
               *dz = NULL;
    json_int_t nq = 1, lbs = 512, gid = -1, mode = 0660;
    int ro = 0, iot = 1;
    json_error_t jerr;
    if (json_unpack_ex(j, &jerr, 0, "{s?s, s:s, s:I, s:I, s:b, s:s, s:s, s:s, s:s, s:b, s:I, s:I}",
                       "image", &image, "format", &format, "num-queues", &nq,
                       "logical-block-size", &lbs, "read-only", &ro, "cache", &cache, "aio", &aio,
                       "discard", &discard, "detect-zeroes", &dz, "iothread", &iot, "socket-gid",
                       &gid, "socket-mode", &mode) < 0) {
        qsd_opts_clear(&o);
        *ret_msg = xasprintf("bad options record: %s", jerr.text);
        return -EINVAL;
    }
    o.image = xstrdup_or_null(image);
    o.format = xstrdup(format);
    json_t *rbd = json_object_get(j, "rbd");
    if (rbd && qsd_rbd_from_json(rbd, &o.rbd, ret_msg) < 0) {
        qsd_opts_clear(&o);
        return -EINVAL;
    }
    o.num_queues = (unsigned)nq;
    o.logical_block_size = (unsigned)lbs;
    o.read_only = ro;
    free(o.cache), o.cache = xstrdup(cache);
    free(o.aio), o.aio = xstrdup(aio);
    free(o.discard), o.discard = xstrdup(discard);
    free(o.detect_zeroes), o.detect_zeroes = xstrdup(dz);
    o.iothread = iot;
    o.socket_gid = (int)gid;
    o.socket_mode = (unsigned)mode;
    int r = qsd_opts_validate(&o, ret_msg);
    if (r < 0) {
        qsd_opts_clear(&o);
        return r;
    }
    *ret = o;
    return 0;
}

/* -------------------------------------------------------------- paths */

void qsd_paths_init(const char *run_dir, const char *volume, struct qsd_paths *ret)
{
    struct qsd_paths p;
    p.run_dir = xstrdup(run_dir);
    p.export_dir = xasprintf("%s/exports/%s", run_dir, volume);
    p.socket = xasprintf("%s/vhost.sock", p.export_dir);
    p.meta = xasprintf("%s/volume.json", p.export_dir);
    p.ro_dir = xasprintf("%s/exports-ro/%s", run_dir, volume);
    p.ro_socket = xasprintf("%s/vhost.sock", p.ro_dir);
    p.ctl_dir = xasprintf("%s/ctl/%s", run_dir, volume);
    p.qmp = xasprintf("%s/qmp.sock", p.ctl_dir);
    p.state = xasprintf("%s/qsd.json", p.ctl_dir);
    p.log = xasprintf("%s/qsd.log", p.ctl_dir);
    p.lock = xasprintf("%s/lock", p.ctl_dir);
    p.rbd_key = xasprintf("%s/rbd.key", p.ctl_dir);
    p.rbd_conf = xasprintf("%s/rbd.conf", p.ctl_dir);
    p.upstream = xasprintf("%s/vhost.sock", p.ctl_dir);
    p.ro_upstream = xasprintf("%s/vhost-ro.sock", p.ctl_dir);
    *ret = p;
}

void qsd_paths_clear(struct qsd_paths *p)
{
    free(p->rbd_key);
    free(p->rbd_conf);
    free(p->upstream);
    free(p->ro_upstream);
    free(p->run_dir);
    free(p->export_dir);
    free(p->socket);
    free(p->meta);
    free(p->ro_dir);
    free(p->ro_socket);
    free(p->ctl_dir);
    free(p->qmp);
    free(p->state);
    free(p->log);
    free(p->lock);
    memset(p, 0, sizeof(*p));
}

/* ------------------------------------------------------- command line */

/* QEMU's comma-separated option syntax escapes ',' by doubling it. */
char *qsd_opt_escape(const char *s)
{
    size_t n = strlen(s), commas = 0;
    for (size_t i = 0; i < n; i++)
        commas += s[i] == ',';
    char *out = xmalloc(n + commas + 1), *o = out;
    for (size_t i = 0; i < n; i++) {
        *o++ = s[i];
        if (s[i] == ',')
            *o++ = ',';
    }
    *o = '\0';
    return out;
}

static char *json_arg(json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    if (!s)
        abort();
    return s;
}

/* The file node and the format node of an image, with the volume's cache,
 * aio, discard and detect-zeroes options.  The file node is a node of its
 * own (not an inline child): reopening the format node read-only, as
 * blockdev-snapshot does with the old top, then leaves the file node and its
 * descriptor alone instead of opening the file again by name (thin.c renames
 * the names QSD opened). */
json_t *qsd_file_node_json(const struct qsd_opts *o, const char *node, const char *filename)
{
    bool direct = qsd_opts_direct(o);
    bool no_flush = streq(o->cache, "unsafe");
    return json_pack("{s:s, s:s, s:s, s:s, s:{s:b, s:b}, s:s, s:b}", "driver", "file",
                     "node-name", node, "filename", filename, "aio", qsd_opts_aio(o), "cache", "direct",
                     direct, "no-flush", no_flush, "discard", o->discard, "read-only",
                     o->read_only);
}

json_t *qsd_format_node_json(const struct qsd_opts *o, const char *node, const char *format,
                             const char *file_node)
{
    bool direct = qsd_opts_direct(o);
    bool no_flush = streq(o->cache, "unsafe");
    return json_pack("{s:s, s:s, s:s, s:{s:b, s:b}, s:s, s:s, s:b}", "driver", format,
                     "node-name", node, "file", file_node, "cache", "direct", direct, "no-flush",
                     no_flush, "discard", o->discard, "detect-zeroes", o->detect_zeroes,
                     "read-only", o->read_only);
}

bool qsd_export_writethrough(const struct qsd_opts *o)
{
    /* The guest sees a write cache and sends a flush for every fsync (the
     * launcher turns the front-end's config-wce off: launcher/domain_xml.c),
     * and the export honours flushes.  Whether the export may also hold
     * writes it has completed without flushing them depends on what a QSD
     * crash loses, because the guest outlives a QSD (it reconnects to the
     * restarted one and its next flush succeeds there):
     * - raw: nothing.  A completed write is in the host kernel (O_DIRECT:
     *   the device; otherwise the page cache), which a QSD crash does not
     *   touch; only a host crash can lose it, and that takes the guest
     *   down too, like a power cut.  So raw exports run write-back.
     * - qcow2: the metadata of newly allocated clusters (L2 and refcount
     *   tables) stays in QSD's memory until a flush.  After a kill -9 the
     *   guest's next flush succeeds on the new QSD while data it was told
     *   was written is gone (measured: blocks read back as zeroes).  So
     *   qcow2 exports flush every write (write-through).
     * cache=writethrough/directsync ask for write-through by name; unsafe
     * never flushes. */
    if (streq(o->cache, "unsafe"))
        return false;
    if (streq(o->cache, "writethrough") || streq(o->cache, "directsync"))
        return true;
    return !(o->format && streq(o->format, "raw"));
}

/* The QSD's argv with its exports listening on socket and ro_socket. */
static char **argv_at(const char *binary, const struct qsd_opts *o, const struct qsd_paths *p,
                      const char *socket, const char *ro_socket)
{
    bool writethrough = qsd_export_writethrough(o);
    char **argv = xcalloc(28, sizeof(char *));
    int i = 0;
    argv[i++] = xstrdup(binary);
    if (o->rbd) {
        /* The key from its private file, then the image through librbd with
         * the cache, discard and read-only options a file node has. */
        argv[i++] = xstrdup("--object");
        argv[i++] = json_arg(qsd_rbd_secret_json(o->rbd));
        json_t *f = qsd_file_node_json(o, "file0", "-");
        json_t *n = qsd_rbd_node_json(o->rbd, "file0", p->rbd_conf);
        json_object_set(n, "cache", json_object_get(f, "cache"));
        json_object_set(n, "discard", json_object_get(f, "discard"));
        json_object_set(n, "read-only", json_object_get(f, "read-only"));
        json_decref(f);
        argv[i++] = xstrdup("--blockdev");
        argv[i++] = json_arg(n);
    } else {
        argv[i++] = xstrdup("--blockdev");
        argv[i++] = json_arg(qsd_file_node_json(o, "file0", o->image));
    }
    argv[i++] = xstrdup("--blockdev");
    argv[i++] = json_arg(qsd_format_node_json(o, QSD_NODE, o->format, "file0"));
    /* The volume's I/O limits: a throttle group (unlimited when the volume
     * has none, so that ControllerModifyVolume can set them live) and the
     * filter the exports serve. */
    argv[i++] = xstrdup("--object");
    argv[i++] = json_arg(json_pack("{s:s, s:s, s:o}", "qom-type", "throttle-group", "id",
                                   QSD_THROTTLE_GROUP, "limits", qsd_limits_json(&o->limits)));
    argv[i++] = xstrdup("--blockdev");
    argv[i++] = json_arg(json_pack("{s:s, s:s, s:s, s:s}", "driver", "throttle", "node-name",
                                   QSD_THROTTLE_NODE, "throttle-group", QSD_THROTTLE_GROUP,
                                   "file", QSD_NODE));
    if (o->iothread) {
        argv[i++] = xstrdup("--object");
        argv[i++] = json_arg(json_pack("{s:s, s:s}", "qom-type", "iothread", "id", "iot0"));
    }
    /* The monitor before the exports: QSD sets its options up in order, so
     * once an export socket accepts (the readiness probe) the monitor listens
     * too.  After them, a client told "ready" could find no monitor yet
     * (ENOENT or ECONNREFUSED, seen in qsdctl export). */
    _cleanup_free_ char *qmp = qsd_opt_escape(p->qmp);
    argv[i++] = xstrdup("--chardev");
    argv[i++] = xasprintf("socket,id=qmp0,path=%s,server=on,wait=off", qmp);
    argv[i++] = xstrdup("--monitor");
    argv[i++] = xstrdup("chardev=qmp0");
    json_t *exp = json_pack("{s:s, s:s, s:s, s:{s:s, s:s}, s:b, s:b, s:I, s:I}", "type",
                            "vhost-user-blk", "id", QSD_EXPORT_ID, "node-name", QSD_THROTTLE_NODE, "addr",
                            "type", "unix", "path", socket, "writable", !o->read_only,
                            "writethrough", writethrough, "num-queues", (json_int_t)o->num_queues,
                            "logical-block-size", (json_int_t)o->logical_block_size);
    if (o->iothread)
        json_object_set_new(exp, "iothread", json_string("iot0"));
    json_t *ro = o->read_only ? NULL : json_deep_copy(exp);
    argv[i++] = xstrdup("--export");
    argv[i++] = json_arg(exp);
    if (ro) {
        /* The same node again, read-only, on a socket of its own. */
        json_object_set_new(ro, "id", json_string(QSD_RO_EXPORT_ID));
        json_object_set_new(ro, "writable", json_false());
        json_object_set_new(json_object_get(ro, "addr"), "path", json_string(ro_socket));
        argv[i++] = xstrdup("--export");
        argv[i++] = json_arg(ro);
    }
    if (o->fuse_fd > 0) {
        /* The descriptor's number as its mountpoint: in the QSD's mount
         * namespace /dev/fd/<n> is an empty regular file (QEMU wants one;
         * confine.h dev_fd_file), and libfuse then uses descriptor n as a
         * mounted /dev/fuse without mounting anything itself. */
        char mp[32];
        snprintf(mp, sizeof(mp), "/dev/fd/%u", o->fuse_fd);
        argv[i++] = xstrdup("--export");
        argv[i++] = json_arg(json_pack("{s:s, s:s, s:s, s:s, s:b, s:s}", "type", "fuse", "id",
                                       QSD_FUSE_EXPORT_ID, "node-name", QSD_THROTTLE_NODE, "mountpoint",
                                       mp, "writable", !o->read_only,
                                       "allow-other", "off"));
    }
    argv[i] = NULL;
    return argv;
}

char **qsd_argv(const char *binary, const struct qsd_opts *o, const struct qsd_paths *p)
{
    return argv_at(binary, o, p, p->socket, p->ro_socket);
}

char **qsd_unit_argv(const char *filter, const char *binary, const struct qsd_opts *o,
                     const struct qsd_paths *p)
{
    if (!filter)
        return qsd_argv(binary, o, p);
    char **qsd = argv_at(binary, o, p, p->upstream, p->ro_upstream);
    size_t n = 0;
    while (qsd[n])
        n++;
    char **argv = xcalloc(n + 16, sizeof(char *)); /* the head's options and a NULL */
    int i = 0;
    argv[i++] = xstrdup(filter);
    argv[i++] = xstrdup("--export");
    argv[i++] = xasprintf("%s=%s", p->socket, p->upstream);
    if (!o->read_only) {
        argv[i++] = xstrdup("--export");
        argv[i++] = xasprintf("%s=%s", p->ro_socket, p->ro_upstream);
    }
    argv[i++] = xstrdup("--queues");
    argv[i++] = xasprintf("%u", o->num_queues);
    argv[i++] = xstrdup("--qsd-fd"); /* spawn() opens the QSD there (proc.h) */
    argv[i++] = xstrdup("3");
    argv[i++] = xstrdup("--");
    memcpy(argv + i, qsd, n * sizeof(char *));
    free(qsd); /* its strings now belong to argv */
    return argv;
}

void qsd_argv_free(char **argv)
{
    if (!argv)
        return;
    for (char **a = argv; *a; a++)
        free(*a);
    free(argv);
}
