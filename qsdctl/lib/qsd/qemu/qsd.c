/* qsd/qemu/qsd.c: QSD options, command line, spawn, supervision, stop, adoption.  See qsd.h. */
#include "qsd/qemu/qsd.h"
#include "qsd/base/cgroup.h"
#include "qsd/base/fsat.h"
#include "qsd/base/log.h"
#include "qsd/base/names.h"
#include "qsd/base/probe.h"
#include "qsd/base/proc.h"
#include "qsd/qemu/qmpcmd.h"
#include "qsd/qemu/qsdconf.h"
#include "qsd/qemu/rbdsrc.h"
#include "qsd/base/util.h"

#include <fcntl.h>
#include <dirent.h>
#include <limits.h>
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* ------------------------------------------------------------ options */

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
    /* Linux AIO where it is valid (O_DIRECT) and the export does not flush
     * every write: there it measured faster than io_uring for small writes
     * and no slower for reads.  Exports that flush every write (qcow2,
     * directsync) measured 0.5-0.9x with it: QEMU 10.0 sends each flush as
     * its own io_submit (IO_CMD_FDSYNC), which the kernel completes from a
     * workqueue.  Figures: docs/bench/README.md. */
    if (o->aio)
        return o->aio;
    return qsd_opts_direct(o) && !qsd_export_writethrough(o) ? "native" : "io_uring";
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
static char *qemu_opt_escape(const char *s)
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
    char **argv = xcalloc(24, sizeof(char *));
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
    if (o->iothread) {
        argv[i++] = xstrdup("--object");
        argv[i++] = json_arg(json_pack("{s:s, s:s}", "qom-type", "iothread", "id", "iot0"));
    }
    /* The monitor before the exports: QSD sets its options up in order, so
     * once an export socket accepts (the readiness probe) the monitor listens
     * too.  After them, a client told "ready" could find no monitor yet
     * (ENOENT or ECONNREFUSED, seen in qsdctl export). */
    _cleanup_free_ char *qmp = qemu_opt_escape(p->qmp);
    argv[i++] = xstrdup("--chardev");
    argv[i++] = xasprintf("socket,id=qmp0,path=%s,server=on,wait=off", qmp);
    argv[i++] = xstrdup("--monitor");
    argv[i++] = xstrdup("chardev=qmp0");
    json_t *exp = json_pack("{s:s, s:s, s:s, s:{s:s, s:s}, s:b, s:b, s:I, s:I}", "type",
                            "vhost-user-blk", "id", QSD_EXPORT_ID, "node-name", QSD_NODE, "addr",
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

/* --------------------------------------------------------- state file */

static int write_state(const struct qsd_paths *p, const char *volume, const struct qsd_opts *o,
                       bool running, pid_t pid, uint64_t starttime)
{
    json_t *j = json_pack("{s:i, s:s, s:s, s:I, s:I, s:o}", "version", 1, "volume", volume,
                          "desired", running ? "running" : "stopped", "pid", (json_int_t)pid,
                          "starttime", (json_int_t)starttime, "opts", qsd_opts_to_json(o));
    _cleanup_free_ char *s = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(j);
    /* Runtime state, not synced: it describes processes, which a crash of the
     * machine ends too (and the run directory is a tmpfs).  Written on the
     * caller's event loop, which must not wait for a disk. */
    _cleanup_close_ int dfd = open(p->ctl_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return -errno;
    return fsat_write_replace(dfd, "qsd.json", s, strlen(s), 0600, -1);
}

int qsd_read_state(const char *state_path, struct qsd_opts *ret_opts, bool *ret_desired_running,
                   pid_t *ret_pid, uint64_t *ret_starttime)
{
    _cleanup_free_ char *data = NULL;
    int r = read_file(state_path, 1 << 20, &data, NULL);
    if (r < 0)
        return r;
    json_t *j = json_loads(data, 0, NULL);
    if (!j)
        return -EBADMSG;
    const char *desired = NULL;
    json_int_t pid = 0, st = 0;
    json_t *opts = NULL;
    if (json_unpack(j, "{s:s, s:I, s:I, s:o}", "desired", &desired, "pid", &pid, "starttime", &st,
                    "opts", &opts) < 0) {
        json_decref(j);
        return -EBADMSG;
    }
    if (ret_opts) {
        _cleanup_free_ char *msg = NULL;
        r = qsd_opts_from_json(opts, ret_opts, &msg);
        if (r < 0) {
            json_decref(j);
            return -EBADMSG;
        }
    }
    if (ret_desired_running)
        *ret_desired_running = streq(desired, "running");
    if (ret_pid)
        *ret_pid = (pid_t)pid;
    if (ret_starttime)
        *ret_starttime = (uint64_t)st;
    json_decref(j);
    return 0;
}

bool qsd_pid_is_ours(pid_t pid, uint64_t starttime, const char *qmp_path)
{
    if (pid <= 0)
        return false;
    uint64_t st;
    if (proc_starttime(pid, &st) < 0 || st != starttime)
        return false;
    _cleanup_free_ char *cmd = NULL;
    size_t len;
    if (proc_cmdline(pid, &cmd, &len) < 0)
        return false;
    _cleanup_free_ char *esc = qemu_opt_escape(qmp_path);
    _cleanup_free_ char *needle = xasprintf("path=%s,", esc);
    return memmem(cmd, len, needle, strlen(needle)) != NULL;
}

/* Whether pid's command line names needle (a QMP socket option). */
static bool cmdline_names(pid_t pid, const char *needle)
{
    _cleanup_free_ char *cmd = NULL;
    size_t len;
    return proc_cmdline(pid, &cmd, &len) == 0 && memmem(cmd, len, needle, strlen(needle));
}

/* The QSD a filter's head forked names the same monitor as its head: the
 * unit is the head (its pid is the one recorded, watched and stopped). */
static bool forked_by_head(pid_t pid, const char *needle)
{
    uint64_t ppid;
    return proc_stat_fields(pid, 4, 1, &ppid) == 0 && ppid > 1 &&
           cmdline_names((pid_t)ppid, needle);
}

/* Call fn for every running (not zombie) process unit whose command line
 * names a QMP socket under run_dir/ctl/: every QSD (or filter head of one)
 * started for run_dir, whether or not its pid was ever recorded.  volume is
 * parsed from the socket path. */
static void scan_qsds(const char *run_dir,
                      void (*fn)(pid_t pid, uint64_t starttime, const char *volume, void *arg),
                      void *arg)
{
    _cleanup_free_ char *esc = qemu_opt_escape(run_dir);
    _cleanup_free_ char *needle = xasprintf("path=%s/ctl/", esc);
    size_t nl = strlen(needle);
    DIR *d = opendir("/proc");
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[strspn(de->d_name, "0123456789")] != '\0')
            continue;
        pid_t pid = (pid_t)atoi(de->d_name);
        _cleanup_free_ char *cmd = NULL, *statp = NULL, *stat = NULL;
        size_t len;
        if (pid <= 0 || proc_cmdline(pid, &cmd, &len) < 0)
            continue;
        const char *m = memmem(cmd, len, needle, nl);
        if (!m)
            continue;
        const char *vol = m + nl, *end = memchr(vol, '/', len - (size_t)(vol - cmd));
        if (!end || !startswith(end, "/qmp.sock,"))
            continue;
        _cleanup_free_ char *v = xstrndup(vol, (size_t)(end - vol));
        _cleanup_free_ char *own = xstrndup(m, (size_t)(end - m) + strlen("/qmp.sock,"));
        if (forked_by_head(pid, own))
            continue;
        statp = xasprintf("/proc/%d/stat", (int)pid);
        uint64_t st;
        const char *paren;
        if (read_file(statp, 65536, &stat, NULL) < 0 || !(paren = strrchr(stat, ')')) ||
            paren[1] != ' ' || paren[2] == 'Z' || proc_starttime(pid, &st) < 0)
            continue;
        fn(pid, st, v, arg);
    }
    closedir(d);
}

struct find {
    const char *volume;
    pid_t pid, *extra;
    uint64_t starttime;
    size_t n_extra;
};

static void find_one(pid_t pid, uint64_t st, const char *volume, void *arg)
{
    struct find *f = arg;
    if (!streq(volume, f->volume))
        return;
    if (f->pid && f->starttime <= st) {
        f->extra = xrealloc(f->extra, (f->n_extra + 1) * sizeof(pid_t));
        f->extra[f->n_extra++] = pid;
        return;
    }
    if (f->pid) {
        f->extra = xrealloc(f->extra, (f->n_extra + 1) * sizeof(pid_t));
        f->extra[f->n_extra++] = f->pid;
    }
    f->pid = pid;
    f->starttime = st;
}

struct orphans {
    bool (*keep)(const char *volume, pid_t pid, void *arg);
    void *arg;
    char **vols;
    size_t n;
};

static void collect_orphan(pid_t pid, uint64_t st, const char *volume, void *arg)
{
    struct orphans *o = arg;
    if (o->keep(volume, pid, o->arg))
        return;
    for (size_t i = 0; i < o->n; i++)
        if (streq(o->vols[i], volume))
            return;
    o->vols = xrealloc(o->vols, (o->n + 1) * sizeof(char *));
    o->vols[o->n++] = xstrdup(volume);
}

int qsd_stop_orphans(const struct qsd_config *cfg,
                     bool (*keep)(const char *volume, pid_t pid, void *arg), void *arg)
{
    struct orphans o = {keep, arg, NULL, 0};
    scan_qsds(cfg->run_dir, collect_orphan, &o);
    for (size_t i = 0; i < o.n; i++) {
        _cleanup_free_ char *msg = NULL;
        int r = name_validate(o.vols[i], NULL) < 0 ? -EINVAL : qsd_stop_sync(cfg, o.vols[i], &msg);
        if (r < 0)
            log_warn("qsd", "cannot stop a QSD nobody wants", "volume=%s error=\"%s\"", o.vols[i],
                     msg ? msg : strerror(-r));
        else
            log_info("qsd", "stopped a QSD nobody wants (left by an interrupted operation)",
                     "volume=%s", o.vols[i]);
        free(o.vols[i]);
    }
    free(o.vols);
    qsd_uid_sweep(cfg->run_dir); /* uids and cgroups of volumes whose runtime is gone */
    qsd_cgroup_sweep(cfg);
    return (int)o.n;
}

int qsd_filter_resolve(const char *explicit, char **ret, char **ret_msg)
{
    /* ret_msg is required here. */
    const char *want = explicit ? explicit : getenv("QSD_VHOST_FILTER");
    _cleanup_free_ char *found = NULL;
    if (want && streq(want, "none")) {
        *ret = NULL;
        return 0;
    }
    if (want && want[0]) {
        found = xstrdup(want);
    } else {
        char self[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        if (n <= 0) {
            *ret_msg = xasprintf("cannot find qsd-vhost-filter: /proc/self/exe: %s",
                                 strerror(errno));
            return -ENOENT;
        }
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        *slash = '\0';
        found = xasprintf("%s/qsd-vhost-filter", self);
    }
    if (found[0] != '/' || access(found, X_OK) < 0) {
        *ret_msg = xasprintf("vhost-user filter %s: %s (install qsd-vhost-filter beside this "
                             "program, or name it with --vhost-filter PATH or $QSD_VHOST_FILTER)",
                             found, found[0] != '/' ? "not an absolute path" : strerror(errno));
        return -ENOENT;
    }
    *ret = TAKE_PTR(found);
    return 0;
}

/* ----------------------------------------------------------- live QSD */

enum qsd_state { QS_IDLE, QS_STARTING, QS_RUNNING, QS_BACKOFF, QS_STOPPING, QS_STOPPED };

/* A QSD that died this many times within CRASH_WINDOW_MS of its start, in a
 * row, is in a crash loop: retried every CRASH_LOOP_RETRY_MS only. */
#define CRASH_LOOP_AFTER 5
#define CRASH_WINDOW_MS 10000
#define CRASH_LOOP_RETRY_MS 30000
/* After SIGKILL, how long a process may take to go (D state) before the stop
 * is reported as failed. */
#define KILL_WAIT_MS 5000

struct qsd {
    struct loop *loop;
    struct qsd_config cfg;
    char *volume;
    struct qsd_opts opts;
    struct qsd_paths paths;
    enum qsd_state state;
    pid_t pid;
    pid_t qsd_pid;              /* the filter head's QSD child (qsd_get_qsd_pid) */
    uint64_t starttime;
    int pidfd;
    struct loop_watch *pid_watch;
    struct loop_timer *timer;   /* probe, backoff or stop deadline */
    uint64_t deadline_ms;
    uint64_t started_at_ms;
    bool supervised;
    bool restarting;
    bool adopted;               /* the process was adopted, not spawned by us */
    unsigned restarts, recent_failures;
    struct qmp *qmp;            /* only while stopping */
    int fail_status;            /* start failed: reported once the process is gone */
    char *fail_msg;
    qsd_done_cb done;
    void *done_opaque;
    qsd_event_cb event_cb;
    void *event_opaque;
    int exec_fd;                /* exec error of the last spawn (proc_spawn), until ready */
    bool hold_probe;            /* keep the readiness probe's connections open (start_sync) */
    int probe_fds[2];           /* those connections (rw, ro export) or -1 */
    int log_pipe;               /* read end of the QSD's stdout/stderr (see log_pump) */
    struct loop_watch *log_watch;
    char *last_death;           /* "pid=... last_log=..." of the last unexpected exit */
    bool killed;                /* SIGKILL sent by a stop */
    char *hung_kill;            /* why the running process was killed as hung (qsd_kill_hung) */
    unsigned hung_kills;
};

int qsd_new(struct loop *l, const struct qsd_config *cfg, const char *volume,
            const struct qsd_opts *opts, struct qsd **ret)
{
    struct qsd *q = xcalloc(1, sizeof(*q));
    q->loop = l;
    q->cfg = *cfg;
    q->cfg.run_dir = xstrdup(cfg->run_dir);
    q->cfg.binary = xstrdup(cfg->binary ? cfg->binary : "qemu-storage-daemon");
    q->cfg.filter = cfg->filter ? xstrdup(cfg->filter) : NULL;
    if (!q->cfg.start_timeout_ms)
        q->cfg.start_timeout_ms = 10000;
    if (!q->cfg.stop_timeout_ms)
        q->cfg.stop_timeout_ms = 5000;
    q->volume = xstrdup(volume);
    if (opts)
        qsd_opts_copy(&q->opts, opts);
    else
        qsd_opts_init(&q->opts);
    qsd_paths_init(cfg->run_dir, volume, &q->paths);
    q->pidfd = -1;
    q->exec_fd = -1;
    q->probe_fds[0] = q->probe_fds[1] = -1;
    q->log_pipe = -1;
    q->supervised = true;
    *ret = q;
    return 0;
}

static void release_process(struct qsd *q)
{
    loop_watch_remove(q->pid_watch);
    q->pid_watch = NULL;
    if (q->pidfd >= 0)
        close(q->pidfd);
    q->pidfd = -1;
    closep(&q->exec_fd);
    q->exec_fd = -1;
    loop_watch_remove(q->log_watch);
    q->log_watch = NULL;
    closep(&q->log_pipe);
    q->log_pipe = -1;
}

static void release_probe(struct qsd *q)
{
    for (int i = 0; i < 2; i++) {
        closep(&q->probe_fds[i]);
        q->probe_fds[i] = -1;
    }
}

void qsd_free(struct qsd *q)
{
    if (!q)
        return;
    release_process(q);
    release_probe(q);
    loop_timer_cancel(q->timer);
    qmp_close(q->qmp);
    free(q->fail_msg);
    free(q->last_death);
    free(q->hung_kill);
    free((char *)q->cfg.run_dir);
    free((char *)q->cfg.binary);
    free((char *)q->cfg.filter);
    free(q->volume);
    qsd_opts_clear(&q->opts);
    qsd_paths_clear(&q->paths);
    free(q);
}

const struct qsd_paths *qsd_get_paths(struct qsd *q) { return &q->paths; }
const struct qsd_opts *qsd_get_opts(struct qsd *q) { return &q->opts; }
const char *qsd_get_volume(struct qsd *q) { return q->volume; }
pid_t qsd_get_pid(struct qsd *q) { return q->pid; }
pid_t qsd_get_qsd_pid(struct qsd *q)
{
    if (!q->pid || !q->cfg.filter)
        return q->pid;
    /* The head's only child: remembered, checked again on every call. */
    uint64_t ppid;
    if (q->qsd_pid && proc_stat_fields(q->qsd_pid, 4, 1, &ppid) == 0 && ppid == (uint64_t)q->pid)
        return q->qsd_pid;
    q->qsd_pid = 0;
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        uint64_t pid;
        if (parse_uint(de->d_name, 2, INT32_MAX, &pid) == 0 &&
            proc_stat_fields((pid_t)pid, 4, 1, &ppid) == 0 && ppid == (uint64_t)q->pid) {
            q->qsd_pid = (pid_t)pid;
            break;
        }
    }
    closedir(d);
    return q->qsd_pid;
}
bool qsd_running(struct qsd *q) { return q->state == QS_RUNNING; }
bool qsd_crash_looping(struct qsd *q)
{
    return q->state == QS_BACKOFF && q->recent_failures >= CRASH_LOOP_AFTER;
}
const char *qsd_last_death(struct qsd *q) { return q->last_death; }
bool qsd_idle(struct qsd *q) { return q->state == QS_IDLE || q->state == QS_STOPPED; }
unsigned qsd_restart_count(struct qsd *q) { return q->restarts; }
unsigned qsd_hung_kill_count(struct qsd *q) { return q->hung_kills; }
void qsd_set_supervised(struct qsd *q, bool on) { q->supervised = on; }
void qsd_set_event_handler(struct qsd *q, qsd_event_cb cb, void *opaque)
{
    q->event_cb = cb;
    q->event_opaque = opaque;
}

static void emit(struct qsd *q, enum qsd_event ev, const char *detail)
{
    if (q->event_cb)
        q->event_cb(q, ev, detail, q->event_opaque);
}

static void finish(struct qsd *q, int status, const char *msg)
{
    qsd_done_cb done = q->done;
    void *opaque = q->done_opaque;
    q->done = NULL;
    q->done_opaque = NULL;
    if (done)
        done(q, status, msg, opaque);
}

#define LOG_MARK "=== qsd-csi: spawning qemu-storage-daemon ===\n"
#define LOG_MAX (1u << 20)

/* The last line the current QSD logged (after the last spawn marker): its own
 * error message when it fails to start. */
#define LOG_TAIL_READ 8192

static char *log_tail(const struct qsd_paths *p)
{
    /* Only the end of the file: one bounded read, whatever its size. */
    _cleanup_close_ int fd = open(p->log, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        return xstrdup("(no log)");
    off_t off = st.st_size > LOG_TAIL_READ ? st.st_size - LOG_TAIL_READ : 0;
    char data[LOG_TAIL_READ + 1];
    ssize_t n = pread(fd, data, LOG_TAIL_READ, off);
    if (n < 0)
        return xstrdup("(no log)");
    data[n] = '\0';
    const char *start = data, *m;
    while ((m = strstr(start, LOG_MARK)))
        start = m + strlen(LOG_MARK);
    /* The QSD's last words, not its filter head's own lines ("qsd exited"):
     * the last line that is not the filter's, else the last line. */
    const char *last = NULL;
    char *end = data + n;
    while (end > start) {
        char *eol = end;
        while (end > start && end[-1] != '\n')
            end--;
        *eol = '\0';
        if (strspn(end, " \t\r") != strlen(end)) {
            if (!strstr(end, "comp=vufilter"))
                return xstrndup(end, 511);
            if (!last)
                last = end;
        }
        if (end > start)
            end--; /* the newline before this line */
    }
    return xstrndup(last ? last : "(nothing logged)", 511);}

int qsd_log_trim(struct qsd *q)
{
    /* QSD appends (O_APPEND, inherited): after ftruncate its next line goes
     * to the new end.  A few lines written between the read and the
     * truncation may be lost; the bound holds. */
    _cleanup_close_ int fd =
        open(q->paths.log, O_RDWR | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        return -errno;
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size <= LOG_MAX)
        return 0;
    char tail[LOG_TAIL_READ];
    ssize_t n = pread(fd, tail, sizeof(tail), st.st_size - (off_t)sizeof(tail));
    if (n < 0)
        return -errno;
    const char *nl = memchr(tail, '\n', (size_t)n);
    size_t keep = nl ? (size_t)(tail + n - (nl + 1)) : 0;
    if (ftruncate(fd, 0) < 0)
        return -errno;
    static const char mark[] = "=== qsd-csi: log truncated (over its bound) ===\n";
    (void)!write(fd, mark, sizeof(mark) - 1);
    if (keep)
        (void)!write(fd, nl + 1, keep);
    return 1;
}

/* The QSD writes its log into a pipe, never into a file: a pipe holds at
 * most 64 KiB whoever reads it, its write end is non-blocking (a full pipe
 * drops the QSD's lines, it never stops the QSD) and, with no reader (the
 * plugin is down), the QSD's writes fail at once (EPIPE; QSD ignores
 * SIGPIPE).  So nothing the QSD logs grows without a reader.  The reader
 * (this process's loop, or the next one's: qsd_adopt reopens the pipe
 * through /proc/PID/fd/2) appends what it reads to ctl/<vol>/qsd.log and
 * keeps that file under LOG_MAX, whose last lines log_tail reads. */
#define LOG_PUMP_MAX (256u << 10) /* bytes moved per wake-up */

static void log_append(struct qsd *q, const char *buf, size_t n)
{
    _cleanup_close_ int fd =
        open(q->paths.log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
    if (fd < 0)
        return;
    (void)!write(fd, buf, n);
    struct stat st;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size > LOG_MAX)
        qsd_log_trim(q);
}

/* Move what the pipe holds into the log file; false at end of file. */
static bool log_drain(struct qsd *q)
{
    char buf[16384];
    size_t moved = 0;
    while (moved < LOG_PUMP_MAX) {
        ssize_t n = read(q->log_pipe, buf, sizeof(buf));
        if (n > 0) {
            log_append(q, buf, (size_t)n);
            moved += (size_t)n;
            continue;
        }
        return n < 0 && (errno == EAGAIN || errno == EINTR);
    }
    return true;
}

static void on_log(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    struct qsd *q = opaque;
    if (!log_drain(q)) {
        loop_watch_remove(q->log_watch);
        q->log_watch = NULL;
        closep(&q->log_pipe);
        q->log_pipe = -1;
    }
}

static void log_watch(struct qsd *q, int fd)
{
    q->log_pipe = fd;
    q->log_watch = loop_watch_fd(q->loop, fd, POLLIN, on_log, q);
}

/* The log pipe of an adopted QSD, if its stderr is one. */
static void log_reopen(struct qsd *q)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/2", (int)q->pid);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0)
        return;
    if (fstat(fd, &st) < 0 || !S_ISFIFO(st.st_mode)) {
        close(fd); /* a QSD started with a log file (before pipes) */
        return;
    }
    log_watch(q, fd);
}

/* ------------------------------------------------- export directories */

static int run_dir_open(const char *run_dir, int *ret_fd)
{
    int fd = open(run_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    *ret_fd = fd;
    return 0;
}

int qsd_export_dir_open(const char *run_dir, const char *volume, bool ro, int *ret_fd)
{
    _cleanup_close_ int run = -1;
    int r = run_dir_open(run_dir, &run);
    if (r < 0)
        return r;
    _cleanup_free_ char *rel = xasprintf("%s/%s", ro ? "exports-ro" : "exports", volume);
    return fsat_open(run, rel, O_PATH | O_DIRECTORY, ret_fd);
}

int qsd_remove_runtime(const char *run_dir, const char *volume)
{
    static const char *const names[] = QSD_EXPORT_FILES;
    _cleanup_close_ int run = -1;
    int r = run_dir_open(run_dir, &run);
    if (r < 0)
        return r == -ENOENT ? 0 : r;
    _cleanup_free_ char *e = xasprintf("exports/%s", volume);
    _cleanup_free_ char *ro = xasprintf("exports-ro/%s", volume);
    _cleanup_free_ char *ctl = xasprintf("%s/ctl/%s", run_dir, volume);
    r = fsat_remove_dir(run, e, names);
    int r2 = fsat_remove_dir(run, ro, names);
    int r3 = rm_rf(ctl); /* private to the plugin: nothing a tenant made */
    qsd_uid_release(run_dir, volume);
    return r < 0 ? r : r2 < 0 ? r2 : r3;
}

/* Call fn with each export directory of the volume, opened beneath the run
 * directory without following symlinks; the first error is returned. */
static int each_export_dir(const struct qsd_paths *p, const char *volume, bool read_only,
                           int (*fn)(int dfd, bool ro, void *arg), void *arg)
{
    int r = 0;
    for (int ro = 0; ro <= (read_only ? 0 : 1); ro++) {
        _cleanup_close_ int fd = -1;
        int q = qsd_export_dir_open(p->run_dir, volume, ro, &fd);
        if (q == 0)
            q = fn(fd, ro, arg);
        if (q < 0 && r == 0)
            r = q;
    }
    return r;
}

static int unlink_export_files(int dfd, bool ro, void *arg)
{
    const char *const *names = arg;
    for (; *names; names++) {
        int r = fsat_unlink(dfd, *names);
        if (r < 0)
            return r;
    }
    return 0;
}

/* The names the QSD and the plugin use in an export directory must be free
 * for them.  Whatever cannot be removed without recursing (a non-empty
 * directory: nothing of ours) moves aside with its whole directory, under a
 * name no volume can have, and a fresh directory takes its place. */
static int clear_export_dir(int parent, const char *volume)
{
    static const char *const names[] = QSD_EXPORT_FILES;
    _cleanup_close_ int fd = -1;
    int r = fsat_open(parent, volume, O_PATH | O_DIRECTORY, &fd);
    if (r < 0)
        return r;
    bool stuck = false;
    for (size_t i = 0; names[i]; i++)
        stuck |= fsat_unlink(fd, names[i]) < 0;
    if (!stuck)
        return 0;
    char aside[NAME_MAX + 1];
    snprintf(aside, sizeof(aside), ".quarantine-%llx-%.150s", (unsigned long long)now_us(),
             volume);
    if (renameat(parent, volume, parent, aside) < 0)
        return -errno;
    log_warn("qsd", "export directory held things that are not ours: moved aside",
             "volume=%s moved_to=%s", volume, aside);
    return fsat_mkdirs(parent, volume, 0750, NULL);
}

static int prepare_dirs(struct qsd *q)
{
    int r = mkdir_p(q->cfg.run_dir, 0711); /* configuration: trusted */
    if (r < 0)
        return r;
    _cleanup_close_ int run = -1, ctl = -1, vol = -1;
    if ((r = run_dir_open(q->cfg.run_dir, &run)) < 0 ||
        (r = fsat_mkdirs(run, "ctl", 0700, &ctl)) < 0 ||
        (r = fsat_mkdirs(ctl, q->volume, 0700, &vol)) < 0 ||
        (r = fsat_chown_mode(ctl, q->volume, -1, 0700)) < 0)
        return r;
    if (q->opts.rbd) {
        _cleanup_free_ char *conf = qsd_rbd_conf(q->opts.rbd);
        if ((r = fsat_write_replace(vol, "rbd.conf", conf, strlen(conf), 0600, -1)) < 0)
            return r;
    }
    for (int ro = 0; ro <= (q->opts.read_only ? 0 : 1); ro++) {
        _cleanup_close_ int parent = -1;
        if ((r = fsat_mkdirs(run, ro ? "exports-ro" : "exports", 0711, &parent)) < 0 ||
            (r = fsat_mkdirs(parent, q->volume, 0750, NULL)) < 0 ||
            (r = clear_export_dir(parent, q->volume)) < 0 ||
            (r = fsat_chown_mode(parent, q->volume, q->opts.socket_gid, 0750)) < 0)
            return r;
    }
    return 0;
}

static void on_process_exit(struct loop *l, int fd, uint32_t revents, void *opaque);
static void on_probe(struct loop *l, void *opaque);

static int spawn(struct qsd *q)
{
    static const char *const sock[] = {"vhost.sock", NULL};
    each_export_dir(&q->paths, q->volume, q->opts.read_only, unlink_export_files, (void *)sock);
    unlink(q->paths.qmp);
    unlink(q->paths.upstream);
    unlink(q->paths.ro_upstream);
    char **argv = qsd_unit_argv(q->cfg.filter, q->cfg.binary, &q->opts, &q->paths);
    log_append(q, LOG_MARK, strlen(LOG_MARK));
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) < 0) {
        int e = -errno;
        qsd_argv_free(argv);
        return e;
    }
    int logfd = pipefd[1];
    /* Confined (qsdconf.h): its own uid, no capabilities, no_new_privs, a
     * mount namespace of its own, the QSD seccomp profile. */
    struct qsd_confinement qc;
    _cleanup_free_ char *cmsg = NULL;
    int r = qsd_confine_for(&q->cfg, q->volume, &q->opts, &q->paths, &qc, &cmsg);
    if (r < 0) {
        log_warn("qsd", "cannot confine the QSD", "volume=%s error=\"%s\"", q->volume,
                 cmsg ? cmsg : strerror(-r));
        qsd_confinement_clear(&qc);
        close(logfd);
        close(pipefd[0]);
        qsd_argv_free(argv);
        return r;
    }
    /* Its own session, so the plugin's signals and death do not reach it;
     * sockets created rw for owner and group only; its own cgroup when one
     * is configured, joined before exec (never a moment in the plugin's). */
    struct proc_spawn sp = PROC_SPAWN_INIT;
    sp.argv = argv;
    sp.stdout_fd = logfd;
    sp.stderr_fd = logfd;
    sp.new_session = true;
    sp.umask = 0117;
    sp.join_fds = q->cfg.join_fds;
    sp.n_join = q->cfg.n_join;
    /* Behind the filter, the head is spawned with the volume's identity and
     * mount namespace; it installs the seccomp profiles itself after its
     * fork: QSD in the child, FILTER in itself (qsd-vhost-filter). */
    if (q->cfg.filter) {
        qc.c.profile = CONFINE_PROFILE_NONE;
        sp.program_fd3 = q->cfg.binary;
    }
    /* A cgroup of its own (its memory, tasks and CPU weight) when the QSDs'
     * parent group is configured; else (or if it cannot be made) the
     * parent's. */
    struct qsd_cgroup vcg = {0};
    _cleanup_free_ char *gmsg = NULL;
    int g = qsd_cgroup_for(&q->cfg, q->volume, &vcg, &gmsg);
    if (g == 0) {
        sp.join_fds = vcg.fds;
        sp.n_join = vcg.n;
    } else if (g != -ENOENT) {
        log_warn("qsd", "cannot make the QSD's own cgroup: it runs in the QSDs' group",
                 "volume=%s error=\"%s\"", q->volume, gmsg ? gmsg : strerror(-g));
    }
    sp.confine = q->cfg.uid_count ? &qc.c : NULL;
    pid_t pid;
    int pidfd, execfd;
    r = proc_spawn(&sp, &pid, &pidfd, &execfd);
    qsd_cgroup_close(&vcg);
    close(logfd);
    qsd_argv_free(argv);
    qsd_confinement_clear(&qc);
    if (r < 0) {
        close(pipefd[0]);
        return r;
    }
    loop_watch_remove(q->log_watch); /* a previous life's, if any */
    q->log_watch = NULL;
    closep(&q->log_pipe);
    log_watch(q, pipefd[0]);
    q->exec_fd = execfd;
    q->adopted = false;
    q->pid = pid;
    q->pidfd = pidfd;
    q->starttime = 0;
    proc_starttime(pid, &q->starttime);
    q->started_at_ms = now_ms();
    q->pid_watch = loop_watch_fd(q->loop, pidfd, POLLIN, on_process_exit, q);
    r = write_state(&q->paths, q->volume, &q->opts, true, pid, q->starttime);
    if (r < 0)
        log_warn("qsd", "cannot record state", "volume=%s err=%s", q->volume, strerror(-r));
    q->state = QS_STARTING;
    q->deadline_ms = now_ms() + q->cfg.start_timeout_ms;
    q->timer = loop_timer_add(q->loop, 2, on_probe, q);
    return 0;
}

struct access {
    int gid;
    unsigned mode;
};

static int set_socket_access_at(int dfd, bool ro, void *arg)
{
    const struct access *a = arg;
    return fsat_chown_mode(dfd, "vhost.sock", a->gid, a->mode);
}

static void set_socket_access(struct qsd *q)
{
    struct access a = {q->opts.socket_gid, q->opts.socket_mode};
    int r = each_export_dir(&q->paths, q->volume, q->opts.read_only, set_socket_access_at, &a);
    if (r < 0)
        log_warn("qsd", "cannot set the export socket's group and mode", "volume=%s error=\"%s\"",
                 q->volume, strerror(-r));
}

/* Every export of q is listening (no connection made: a client may be
 * reconnecting to it). */
static bool exports_listening(struct qsd *q)
{
    if (q->cfg.filter && (unix_socket_listening(q->paths.upstream) != 1 ||
                          (!q->opts.read_only && unix_socket_listening(q->paths.ro_upstream) != 1)))
        return false;
    return unix_socket_listening(q->paths.socket) == 1 &&
           (q->opts.read_only || unix_socket_listening(q->paths.ro_socket) == 1);
}

static int probe_export_at(int dfd, bool ro, void *arg)
{
    return probe_socket_at(dfd, "vhost.sock");
}

static int probe_hold_at(int dfd, bool ro, void *arg)
{
    struct qsd *q = arg;
    return probe_connect_at(dfd, "vhost.sock", &q->probe_fds[ro]);
}

/* Every export of q accepts a connection (probe.h; the export directories
 * are opened beneath the run directory and nothing in them is followed).
 * With hold_probe the connections stay open in probe_fds until
 * release_probe(): see qsd_start_sync() for why. */
static bool exports_accept(struct qsd *q)
{
    int (*probe)(int, bool, void *) = q->hold_probe ? probe_hold_at : probe_export_at;
    release_probe(q);
    /* Behind the filter, its sockets exist only once the QSD's listen
     * (qsd-vhost-filter's head waits for them), and the filter connects to
     * the QSD for each connection it accepts: this probe is the QSD's first
     * client too. */
    if (each_export_dir(&q->paths, q->volume, q->opts.read_only, probe, q) == 0)
        return true;
    release_probe(q);
    return false;
}

static void on_probe(struct loop *l, void *opaque)
{
    struct qsd *q = opaque;
    q->timer = NULL;
    /* Ready = the export socket accepts a connection.  This must be a real
     * connection, not just a look at /proc/net/unix: QSD 10.0.2 segfaults on
     * block_resize (its config-change notification) when no vhost-user client
     * has ever connected to the export; the probe connection initialises that
     * state (measured: SIGSEGV every time without it, never with it). */
    if (exports_accept(q)) {
        closep(&q->exec_fd);
        q->exec_fd = -1;
        set_socket_access(q);
        q->state = QS_RUNNING;
        q->recent_failures = 0;
        if (q->restarting && q->adopted) {
            /* Adopted before its exports were seen listening (its sockets
             * are in another network namespace's /proc/net/unix, e.g. a
             * new plugin pod's): the same process, not a restart. */
            q->restarting = false;
            emit(q, QSD_EV_READY, "adopted");
        } else if (q->restarting) {
            q->restarting = false;
            q->restarts++;
            char d[64];
            snprintf(d, sizeof(d), "pid=%d", (int)q->pid);
            emit(q, QSD_EV_RESTARTED, d);
        } else {
            emit(q, QSD_EV_READY, NULL);
        }
        finish(q, 0, NULL);
        return;
    }
    if (now_ms() >= q->deadline_ms) {
        /* Never became ready: kill it. */
        pidfd_signal(q->pidfd, SIGKILL);
        _cleanup_free_ char *tail = log_tail(&q->paths);
        char *msg =
            xasprintf("export socket %s did not accept connections within %llu ms (QSD log: %s)",
                      q->paths.socket, (unsigned long long)q->cfg.start_timeout_ms, tail);
        emit(q, QSD_EV_START_FAILED, msg);
        if (q->restarting) {
            /* A supervised restart: on_process_exit tries again, with backoff. */
            free(msg);
            return;
        }
        /* A first start: report once the process is really gone (on_process_exit). */
        q->state = QS_STOPPING;
        q->supervised = false;
        q->fail_status = -ETIMEDOUT;
        q->fail_msg = msg;
        return;
    }
    q->timer = loop_timer_add(q->loop, 5, on_probe, q);
}

static void restart_now(struct loop *l, void *opaque)
{
    struct qsd *q = opaque;
    q->timer = NULL;
    q->restarting = true;
    int r = spawn(q);
    if (r < 0) {
        char d[128];
        snprintf(d, sizeof(d), "cannot spawn %s: %s", q->cfg.binary, strerror(-r));
        emit(q, QSD_EV_START_FAILED, d);
        q->recent_failures++;
        q->state = QS_BACKOFF;
        q->timer = loop_timer_add(q->loop, 1000, restart_now, q);
    }
}

static void reap(struct qsd *q)
{
    /* Reap if it is our child; ECHILD for an adopted process is expected. */
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    waitid(P_PIDFD, (id_t)q->pidfd, &si, WEXITED | WNOHANG);
}

static void on_process_exit(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    struct qsd *q = opaque;
    _cleanup_free_ char *hung = TAKE_PTR(q->hung_kill); /* qsd_kill_hung's reason */
    reap(q);
    if (q->log_pipe >= 0)
        log_drain(q); /* its last words, for log_tail below */
    int exec_fd = TAKE_FD(q->exec_fd); /* read below, once the process is gone */
    release_process(q);
    q->exec_fd = exec_fd;
    loop_timer_cancel(q->timer);
    q->timer = NULL;
    pid_t dead = q->pid;
    q->pid = 0;

    if (q->state == QS_STOPPING) {
        qmp_close(q->qmp);
        q->qmp = NULL;
        q->state = QS_STOPPED;
        qsd_cgroup_release(&q->cfg, q->volume);
        if (q->fail_status) {
            _cleanup_free_ char *msg = TAKE_PTR(q->fail_msg);
            int st = q->fail_status;
            q->fail_status = 0;
            finish(q, st, msg);
            return;
        }
        emit(q, QSD_EV_STOPPED, NULL);
        finish(q, 0, NULL);
        return;
    }

    int exec_err = proc_exec_error(q->exec_fd);
    _cleanup_free_ char *tail =
        exec_err ? xasprintf("cannot start qemu-storage-daemon: %s (executing %s, or joining "
                             "its cgroup, or confining it)", strerror(exec_err), q->cfg.binary)
                 : log_tail(&q->paths);
    char d[900];
    if (hung)
        snprintf(d, sizeof(d), "pid=%d killed by the plugin, hung: %s; last_log=%s", (int)dead,
                 hung, tail);
    else
        snprintf(d, sizeof(d), "pid=%d last_log=%s", (int)dead, tail);
    free(q->last_death);
    q->last_death = xstrdup(d);
    bool was_starting = q->state == QS_STARTING;
    emit(q, QSD_EV_DIED, d);

    if (was_starting && q->done) {
        /* A first start failed: report, do not loop. */
        _cleanup_free_ char *msg =
            exec_err ? xstrdup(tail)
                     : xasprintf("qemu-storage-daemon exited during start-up: %s", tail);
        q->state = QS_STOPPED;
        qsd_cgroup_release(&q->cfg, q->volume);
        finish(q, exec_err ? -exec_err : -EIO, msg);
        return;
    }
    /* Respect the desired state: a stop by another process is not a crash. */
    bool desired = false;
    if (qsd_read_state(q->paths.state, NULL, &desired, NULL, NULL) < 0 || !desired ||
        !q->supervised) {
        q->state = QS_STOPPED;
        emit(q, QSD_EV_STOPPED, q->supervised ? "not restarted: desired state is stopped"
                                              : "not restarted: not supervised");
        return;
    }
    /* Back off only when it keeps dying quickly; past CRASH_LOOP_AFTER
     * quick deaths in a row it is a crash loop: reported, retried slowly. */
    uint64_t delay = 0;
    if (now_ms() - q->started_at_ms < CRASH_WINDOW_MS) {
        if (q->recent_failures > 0)
            delay = MIN(100u << MIN(q->recent_failures - 1, 6u), 5000u);
        q->recent_failures++;
    } else {
        q->recent_failures = 0;
    }
    if (q->recent_failures >= CRASH_LOOP_AFTER) {
        delay = CRASH_LOOP_RETRY_MS;
        if (q->recent_failures == CRASH_LOOP_AFTER)
            emit(q, QSD_EV_CRASH_LOOP, d);
    }
    q->state = QS_BACKOFF;
    q->timer = loop_timer_add(q->loop, delay, restart_now, q);
}

/* Health: a QSD that runs but no longer serves (its monitor does not
 * answer: a tenant's message can leave it so, e.g. SET_MEM_TABLE with 2^32-1
 * regions) is killed; its exit then takes the path of any death
 * (on_process_exit: restarted if supervised, reported QSD_EV_DIED with the
 * reason otherwise, which is how an RBD volume's QSD reaches the plugin's
 * checked restart).  The caller judges "hung" (csi/volstats.c: consecutive
 * probes); the kill is by pidfd, so never another process. */
int qsd_kill_hung(struct qsd *q, const char *reason)
{
    if (q->state != QS_RUNNING || q->pidfd < 0)
        return -ESRCH;
    if (q->hung_kill)
        return -EALREADY; /* killed, not yet gone (D state): its exit restarts it */
    int r = pidfd_signal(q->pidfd, SIGKILL);
    if (r < 0)
        return r;
    q->hung_kill = xstrdup(reason);
    q->hung_kills++;
    /* A hang is not a quick crash: it does not count towards a crash loop. */
    q->started_at_ms = 0;
    return 0;
}

int qsd_start(struct qsd *q, qsd_done_cb done, void *opaque)
{
    if (q->state == QS_STARTING || q->state == QS_RUNNING || q->state == QS_STOPPING)
        return -EBUSY;
    int r = prepare_dirs(q);
    if (r < 0)
        return r;
    r = write_state(&q->paths, q->volume, &q->opts, true, 0, 0);
    if (r < 0)
        return r;
    q->done = done;
    q->done_opaque = opaque;
    q->restarting = false;
    r = spawn(q);
    if (r < 0) {
        q->done = NULL;
        write_state(&q->paths, q->volume, &q->opts, false, 0, 0);
    }
    return r;
}

int qsd_adopt(struct qsd *q)
{
    pid_t pid = 0;
    uint64_t st = 0;
    struct qsd_opts opts;
    int r = qsd_read_state(q->paths.state, &opts, NULL, &pid, &st);
    if (r == 0) {
        qsd_opts_clear(&q->opts);
        q->opts = opts;
    } else if (r != -ENOENT) {
        return r;
    }
    /* The recorded pid, or whichever QSD serves this volume's monitor: a
     * plugin killed between spawn and record left it unrecorded.  A second
     * one (never wanted) is killed. */
    struct find f = {.volume = q->volume};
    scan_qsds(q->cfg.run_dir, find_one, &f);
    if (!qsd_pid_is_ours(pid, st, q->paths.qmp)) {
        pid = f.pid;
        st = f.starttime;
    }
    for (size_t i = 0; i < f.n_extra; i++) {
        if (f.extra[i] == pid)
            continue;
        int fd = pidfd_open_pid(f.extra[i]);
        if (fd >= 0) {
            log_warn("qsd", "killing a second QSD of a volume", "volume=%s pid=%d", q->volume,
                     (int)f.extra[i]);
            pidfd_signal(fd, SIGKILL);
            close(fd);
        }
    }
    free(f.extra);
    if (!pid)
        return -ESRCH;
    int pidfd = pidfd_open_pid(pid);
    if (pidfd < 0)
        return -ESRCH;
    /* The pid could have been recycled between the check and pidfd_open. */
    if (!qsd_pid_is_ours(pid, st, q->paths.qmp)) {
        close(pidfd);
        return -ESRCH;
    }
    q->pid = pid;
    q->starttime = st;
    q->pidfd = pidfd;
    q->started_at_ms = now_ms();
    q->pid_watch = loop_watch_fd(q->loop, pidfd, POLLIN, on_process_exit, q);
    log_reopen(q);
    r = write_state(&q->paths, q->volume, &q->opts, true, pid, st);
    if (r < 0)
        log_warn("qsd", "cannot record state", "volume=%s err=%s", q->volume, strerror(-r));
    if (exports_listening(q)) {
        q->state = QS_RUNNING;
        return 0;
    }
    /* Adopted half-started: ready once its exports accept, like a restart
     * (killed and restarted if they never do). */
    q->state = QS_STARTING;
    q->restarting = true;
    q->adopted = true;
    q->deadline_ms = now_ms() + q->cfg.start_timeout_ms;
    q->timer = loop_timer_add(q->loop, 2, on_probe, q);
    return 0;
}

static void on_stop_deadline(struct loop *l, void *opaque)
{
    struct qsd *q = opaque;
    q->timer = NULL;
    if (!q->killed) {
        log_warn("qsd", "did not quit in time, killing", "volume=%s pid=%d", q->volume,
                 (int)q->pid);
        pidfd_signal(q->pidfd, SIGKILL);
        q->killed = true;
        /* Bound the wait for the kill too: a process in D state lingers. */
        q->timer = loop_timer_add(q->loop, KILL_WAIT_MS, on_stop_deadline, q);
        return;
    }
    /* Still there: stuck in the kernel.  The stop fails (the caller may try
     * again); the pidfd stays watched, its exit still finishes the stop. */
    _cleanup_free_ char *msg =
        xasprintf("qemu-storage-daemon pid %d of volume %s did not exit %u ms after SIGKILL "
                  "(stuck in the kernel: a hung disk or network storage?)",
                  (int)q->pid, q->volume, KILL_WAIT_MS);
    log_error("qsd", "did not die after SIGKILL", "volume=%s pid=%d", q->volume, (int)q->pid);
    finish(q, -ETIMEDOUT, msg);
}

static void on_stop_qmp(struct qmp *qmp, int status, const struct qmp_error *err, void *opaque)
{
    struct qsd *q = opaque;
    if (status == 0) {
        qmpc_quit_async(qmp, q->cfg.stop_timeout_ms); /* the exit (pidfd) ends the stop */
    } else if (q->state == QS_STOPPING && q->pidfd >= 0) {
        /* Monitor unusable: fall back to SIGTERM, which QSD also honours. */
        pidfd_signal(q->pidfd, SIGTERM);
    }
}

int qsd_stop(struct qsd *q, qsd_done_cb done, void *opaque)
{
    int r = write_state(&q->paths, q->volume, &q->opts, false, q->pid, q->starttime);
    if (r < 0 && r != -ENOENT)
        return r;
    loop_timer_cancel(q->timer);
    q->timer = NULL;
    static const char *const meta[] = {"volume.json", NULL}, *const all[] = QSD_EXPORT_FILES;
    each_export_dir(&q->paths, q->volume, q->opts.read_only, unlink_export_files, (void *)meta);
    if (q->pidfd < 0) {
        q->state = QS_STOPPED;
        each_export_dir(&q->paths, q->volume, q->opts.read_only, unlink_export_files, (void *)all);
        if (done)
            done(q, 0, NULL, opaque);
        return 0;
    }
    q->done = done;
    q->done_opaque = opaque;
    if (q->state == QS_STOPPING && q->killed) {
        /* A stop that already failed once: kill again, wait again. */
        pidfd_signal(q->pidfd, SIGKILL);
        q->timer = loop_timer_add(q->loop, KILL_WAIT_MS, on_stop_deadline, q);
        return 0;
    }
    q->state = QS_STOPPING;
    q->killed = false;
    qmp_close(q->qmp);
    q->qmp = NULL;
    r = qmp_connect(q->loop, q->paths.qmp, q->cfg.stop_timeout_ms, on_stop_qmp, q, &q->qmp);
    if (r < 0)
        pidfd_signal(q->pidfd, SIGTERM);
    q->timer = loop_timer_add(q->loop, q->cfg.stop_timeout_ms, on_stop_deadline, q);
    return 0;
}

static int regroup_at(int dfd, bool ro, void *arg)
{
    const struct access *a = arg;
    /* The socket is missing while a restart is under way: the restart
     * applies the new group (set_socket_access). */
    int r = fsat_chown_mode(dfd, "vhost.sock", a->gid, a->mode);
    if (r < 0 && r != -ENOENT)
        return r;
    r = fsat_chown_mode(dfd, "volume.json", a->gid, a->gid >= 0 ? 0640 : 0600);
    if (r < 0 && r != -ENOENT)
        return r;
    /* The directory itself: through its own descriptor. */
    if (fchownat(dfd, "", 0, a->gid >= 0 ? (gid_t)a->gid : 0, AT_EMPTY_PATH) < 0)
        return -errno;
    return 0;
}

int qsd_set_socket_group(struct qsd *q, int gid)
{
    q->opts.socket_gid = gid;
    int r = write_state(&q->paths, q->volume, &q->opts, true, q->pid, q->starttime);
    if (r < 0)
        return r;
    struct access a = {gid, q->opts.socket_mode};
    return each_export_dir(&q->paths, q->volume, q->opts.read_only, regroup_at, &a);
}

struct meta {
    const char *volume;
    const struct qsd_opts *o;
    uint64_t size;
};

static int meta_write_at(int dfd, bool ro, void *arg)
{
    const struct meta *m = arg;
    json_t *j = json_pack("{s:i, s:s, s:I, s:b, s:I, s:I, s:s}", "version", 1, "volume",
                          m->volume, "size", (json_int_t)m->size, "read_only",
                          ro || m->o->read_only, "num_queues", (json_int_t)m->o->num_queues,
                          "logical_block_size", (json_int_t)m->o->logical_block_size, "socket",
                          "vhost.sock");
    _cleanup_free_ char *s = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(j);
    int gid = m->o->socket_gid;
    /* Runtime directory, not synced (write_state). */
    return fsat_write_replace(dfd, "volume.json", s, strlen(s), gid >= 0 ? 0640 : 0600, gid);
}

int qsd_meta_write(const struct qsd_paths *p, const char *volume, const struct qsd_opts *o,
                   uint64_t size)
{
    struct meta m = {volume, o, size};
    return each_export_dir(p, volume, o->read_only, meta_write_at, &m);
}

int qsd_write_meta(struct qsd *q, uint64_t size)
{
    return qsd_meta_write(&q->paths, q->volume, &q->opts, size);
}

/* ------------------------------------------------------------- sync */

struct sync_done {
    bool done;
    int status;
    char *msg;
};

static void sync_done_cb(struct qsd *q, int status, const char *msg, void *opaque)
{
    struct sync_done *d = opaque;
    d->done = true;
    d->status = status;
    d->msg = msg ? xstrdup(msg) : NULL;
}

static int run_until(struct loop *l, struct sync_done *d, uint64_t bound_ms)
{
    uint64_t deadline = now_ms() + bound_ms;
    while (!d->done) {
        if (now_ms() > deadline)
            return -ETIMEDOUT;
        int r = loop_run_once(l, 100);
        if (r < 0)
            return r;
    }
    return 0;
}

/* The caller's monitor connection, made while q's probe connections are
 * still open (qsd_start_sync). */
static int connect_monitor(struct qsd *q, struct qmp_sync **ret, char **ret_msg)
{
    _cleanup_free_ char *m = NULL;
    int r = qmpc_connect_volume(q->cfg.run_dir, q->volume, QMP_DEFAULT_TIMEOUT_MS, ret, &m);
    if (r < 0)
        *ret_msg = xasprintf("QSD serves its exports but its monitor does not answer: %s", m);
    return r;
}

int qsd_start_sync(const struct qsd_config *cfg, const char *volume, const struct qsd_opts *opts,
                   pid_t *ret_pid, struct qmp_sync **ret_qmp, char **ret_msg)
{
    struct loop *l;
    int r = loop_new(&l);
    if (r < 0) {
        *ret_msg = xasprintf("cannot create event loop: %s", strerror(-r));
        return r;
    }
    struct qsd *q;
    qsd_new(l, cfg, volume, opts, &q);
    qsd_set_supervised(q, false);
    q->hold_probe = ret_qmp != NULL;
    struct sync_done d = {0};
    r = qsd_start(q, sync_done_cb, &d);
    if (r < 0) {
        *ret_msg = xasprintf("cannot start qemu-storage-daemon: %s", strerror(-r));
    } else {
        /* The QSD bounds itself (start timeout); this outer bound is a backstop. */
        r = run_until(l, &d, q->cfg.start_timeout_ms + 5000);
        if (r == 0)
            r = d.status;
        if (r == 0 && ret_qmp)
            r = connect_monitor(q, ret_qmp, &d.msg);
        release_probe(q);
        if (r < 0) {
            *ret_msg = d.msg ? TAKE_PTR(d.msg) : xasprintf("start failed: %s", strerror(-r));
            /* Leave nothing behind (normally already reaped in on_process_exit). */
            if (q->pidfd >= 0) {
                pidfd_signal(q->pidfd, SIGKILL);
                struct pollfd pfd = {.fd = q->pidfd, .events = POLLIN};
                poll(&pfd, 1, 2000);
                reap(q);
            }
            write_state(&q->paths, q->volume, &q->opts, false, 0, 0);
        } else if (ret_pid) {
            *ret_pid = q->pid;
        }
    }
    free(d.msg);
    qsd_free(q);
    loop_free(l);
    return r;
}

int qsd_stop_sync(const struct qsd_config *cfg, const char *volume, char **ret_msg)
{
    struct loop *l;
    int r = loop_new(&l);
    if (r < 0) {
        *ret_msg = xasprintf("cannot create event loop: %s", strerror(-r));
        return r;
    }
    struct qsd *q;
    qsd_new(l, cfg, volume, NULL, &q);
    qsd_set_supervised(q, false);
    r = qsd_adopt(q);
    if (r < 0 && r != -ESRCH) {
        *ret_msg = xasprintf("cannot read the state of volume %s: %s", volume, strerror(-r));
        qsd_free(q);
        loop_free(l);
        return r;
    }
    struct sync_done d = {0};
    r = qsd_stop(q, sync_done_cb, &d);
    if (r == 0)
        r = run_until(l, &d, q->cfg.stop_timeout_ms + 5000);
    if (r == 0)
        r = d.status;
    if (r < 0)
        *ret_msg = d.msg ? TAKE_PTR(d.msg) : xasprintf("stop failed: %s", strerror(-r));
    free(d.msg);
    qsd_free(q);
    loop_free(l);
    return r;
}
