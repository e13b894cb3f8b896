/* SPDX-License-Identifier: Apache-2.0 */
/* main.c: the qsdctl command-line tool.  Global options, the subcommand
 * table, and the volume/snapshot/export subcommands.  The data-path commands
 * (vhost-info, verify, bench) live in vhost_cmds.c. */
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <dirent.h>

#include "commands.h"
#include "config.h"
#include "qsd/qemu/image.h"
#include "qsd/base/log.h"
#include "qsd/base/names.h"
#include "qsd/base/proc.h"
#include "qsd/qemu/qmpcmd.h"
#include "qsd/qemu/qsd.h"
#include "qsd/qemu/qsdconf.h"
#include "qsd/qemu/thin.h"
#include "qsd/base/util.h"

struct global_opts g_opts = {
    .run_dir = "/run/qsd-csi",
    .pool = "/var/lib/qsd-csi/pool",
    .state_dir = "/var/lib/qsd-csi/state",
};
static const char *g_qsd_binary = QSD_BINARY_DEFAULT;

#define LOCK_WAIT_MS 10000

/* ------------------------------------------------------------ helpers */

__attribute__((format(printf, 2, 3))) static int fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("qsdctl: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

static int exit_code_for(int r)
{
    switch (r) {
    case 0: return EXIT_OK;
    case -EINVAL: case -ERANGE: return EXIT_USAGE;
    case -ENOENT: case -ESRCH: return EXIT_NOT_FOUND;
    case -EEXIST: case -EBUSY: return EXIT_EXISTS;
    case -ETIMEDOUT: return EXIT_TIMEOUT;
    case -EIO: case -EREMOTEIO: case -EBADMSG: return EXIT_QEMU;
    default: return EXIT_FAILURE_GENERIC;
    }
}

/* Report an error with its message and return the matching exit code. */
static int fail_msg(int r, char *msg)
{
    int code = fail(exit_code_for(r), "%s", msg ? msg : strerror(-r));
    free(msg);
    return code;
}

static int check_name(const char *what, const char *name)
{
    const char *why;
    if (name_validate(name, &why) < 0)
        return fail(EXIT_USAGE, "invalid %s name '%s': %s", what, name, why);
    return 0;
}

static void print_json(json_t *j)
{
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
    puts(s);
    free(s);
    json_decref(j);
}

/* QSD confinement (qsdconf.h): QSDCTL_QSD_UID_BASE and QSDCTL_QSD_UID_COUNT
 * (0: unconfined) as the plugin's --qsd-uid-base and --qsd-uid-count. */
static uint32_t env_u32(const char *name, uint32_t dflt, uint32_t max)
{
    const char *v = getenv(name);
    uint64_t n;
    if (!v || parse_uint(v, 0, max, &n) < 0)
        return dflt;
    return (uint32_t)n;
}

static const char *g_filter_flag; /* --vhost-filter as given */

/* The configuration every QSD this command starts or adopts gets; the
 * vhost-user filter is resolved on first use (commands that start no QSD do
 * not need one), and a missing one ends the command. */
static struct qsd_config qsd_cfg(void)
{
    static char *filter;
    static bool resolved;
    if (!resolved) {
        _cleanup_free_ char *msg = NULL;
        if (qsd_filter_resolve(g_filter_flag, &filter, &msg) < 0)
            exit(fail(EXIT_FAILURE_GENERIC, "%s", msg));
        resolved = true;
    }
    return (struct qsd_config){
        .run_dir = g_opts.run_dir,
        .binary = g_qsd_binary,
        .filter = filter,
        .uid_base = env_u32("QSDCTL_QSD_UID_BASE", QSD_UID_BASE_DEFAULT, 0xfffe0000u),
        .uid_count = env_u32("QSDCTL_QSD_UID_COUNT", QSD_UID_COUNT_DEFAULT, 65536),
    };
}

/* Per-volume lock, shared with `qsdctl supervise`: held while a command
 * changes the volume.  Bounded wait. */
static int lock_volume(const char *vol, int *ret_fd)
{
    _cleanup_free_ char *dir = xasprintf("%s/locks", g_opts.run_dir);
    int r = mkdir_p(g_opts.run_dir, 0711);
    if (r == 0)
        r = mkdir_p(dir, 0700);
    if (r < 0)
        return fail(EXIT_FAILURE_GENERIC, "cannot create %s: %s", dir, strerror(-r));
    _cleanup_free_ char *path = xasprintf("%s/%s.lock", dir, vol);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return fail(EXIT_FAILURE_GENERIC, "cannot open lock %s: %s", path, strerror(errno));
    uint64_t deadline = now_ms() + LOCK_WAIT_MS;
    while (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        if (errno != EWOULDBLOCK || now_ms() > deadline) {
            close(fd);
            return fail(EXIT_EXISTS, "volume %s is busy (another qsdctl holds its lock)", vol);
        }
        sleep_ms(20);
    }
    *ret_fd = fd;
    return 0;
}

/* Is the volume's QSD running (recorded, alive, really ours)? */
static bool volume_exported(const char *vol, pid_t *ret_pid)
{
    struct qsd_paths p;
    qsd_paths_init(g_opts.run_dir, vol, &p);
    bool desired = false;
    pid_t pid = 0;
    uint64_t st = 0;
    bool ok = qsd_read_state(p.state, NULL, &desired, &pid, &st) == 0 && desired &&
              qsd_pid_is_ours(pid, st, p.qmp);
    qsd_paths_clear(&p);
    if (ok && ret_pid)
        *ret_pid = pid;
    return ok;
}

static int connect_qmp(const char *vol, struct qmp_sync **ret)
{
    _cleanup_free_ char *msg = NULL;
    int r = qmpc_connect_volume(g_opts.run_dir, vol, QMP_DEFAULT_TIMEOUT_MS, ret, &msg);
    return r < 0 ? -fail(exit_code_for(r), "%s", msg) : 0;
}

static int gc_report(struct pool *pool);

static int open_pool(struct pool *p, bool create)
{
    char *msg = NULL;
    int r = pool_open(g_opts.pool, create, p, &msg);
    if (r < 0)
        return fail_msg(r, msg);
    return 0;
}

/* Parse --size into *ret with a clear message. */
static int size_arg(const char *s, uint64_t *ret)
{
    int r = parse_size(s, ret);
    if (r == -ERANGE)
        return fail(EXIT_USAGE, "invalid size '%s': too large", s);
    if (r < 0)
        return fail(EXIT_USAGE, "invalid size '%s': expected a number of bytes with an optional "
                                "K, M, G, T or P suffix (powers of 1024)", s);
    return 0;
}

#define USAGE_ERR(usage) fail(EXIT_USAGE, "%s (see --help)", usage)

/* Parse a subcommand's options.  Returns -1 to continue, or an exit code. */
static int help_or_usage(int c, const char *help, const char *usage)
{
    if (c == 'h') {
        fputs(help, stdout);
        return EXIT_OK;
    }
    return USAGE_ERR(usage);
}

/* Commands that take exactly one validated name and no options.  Returns -1
 * with *ret_name set to go on, or the exit code to return. */
static int parse_one_name(int argc, char **argv, const char *help, const char *usage,
                          const char *what, const char **ret_name)
{
    static const struct option lo[] = {{"help", no_argument, 0, 'h'}, {0}};
    int c, r;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1)
        return help_or_usage(c, help, usage);
    if (optind + 1 != argc)
        return USAGE_ERR(usage);
    if ((r = check_name(what, argv[optind])))
        return r;
    *ret_name = argv[optind];
    return -1;
}

/* ------------------------------------------------------------- create */

static const char HELP_CREATE[] =
    "Usage: qsdctl create VOLUME --size SIZE [--format qcow2|raw] [--preallocation MODE]\n"
    "                     [--from-snapshot SNAPSHOT]\n"
    "Create a volume image in the pool (POOL/volumes/VOLUME.FORMAT).\n"
    "  --size SIZE            bytes, or with a K/M/G/T suffix; a multiple of 512.\n"
    "                         With --from-snapshot: defaults to the snapshot's size.\n"
    "  --format FMT           qcow2 (default) or raw\n"
    "  --preallocation MODE   off (default), metadata (qcow2), falloc, full\n"
    "  --from-snapshot SNAP   copy the snapshot's content into the new volume\n";

static int cmd_create(int argc, char **argv)
{
    static const struct option lo[] = {
        {"size", required_argument, 0, 's'}, {"format", required_argument, 0, 'f'},
        {"preallocation", required_argument, 0, 'p'}, {"from-snapshot", required_argument, 0, 'S'},
        {"help", no_argument, 0, 'h'}, {0}};
    const char *size_s = NULL, *format = "qcow2", *prealloc = "off", *snap = NULL;
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 's': size_s = optarg; break;
        case 'f': format = optarg; break;
        case 'p': prealloc = optarg; break;
        case 'S': snap = optarg; break;
        default: return help_or_usage(c, HELP_CREATE, "usage: qsdctl create VOLUME --size SIZE");
        }
    }
    if (optind + 1 != argc)
        return USAGE_ERR("usage: qsdctl create VOLUME --size SIZE");
    const char *vol = argv[optind];
    int r;
    if ((r = check_name("volume", vol)) || (snap && (r = check_name("snapshot", snap))))
        return r;
    if (!streq(format, "qcow2") && !streq(format, "raw"))
        return fail(EXIT_USAGE, "invalid format '%s': expected qcow2 or raw", format);
    char *msg = NULL;
    if (image_check_prealloc(format, prealloc, &msg) < 0)
        return fail_msg(-EINVAL, msg);
    uint64_t size = 0;
    if (!size_s && !snap)
        return fail(EXIT_USAGE, "missing --size");
    if (size_s) {
        if ((r = size_arg(size_s, &size)))
            return r;
        if ((r = image_check_size(size, IMAGE_SIZE_ALIGN, &msg)) < 0)
            return fail_msg(r, msg);
    }
    struct pool pool;
    if ((r = open_pool(&pool, true)))
        return r;
    _cleanup_close_ int lock = -1;
    if ((r = lock_volume(vol, &lock))) {
        pool_close(&pool);
        return r;
    }
    r = image_create(&pool, vol, format, size, prealloc, snap, &msg);
    if (r < 0) {
        pool_close(&pool);
        return fail_msg(r, msg);
    }
    _cleanup_free_ char *path = NULL;
    pool_find_volume(&pool, vol, &path, NULL);
    uint64_t vsize = 0, alloc = 0;
    image_info(path, format, &vsize, &alloc, &msg);
    free(msg);
    if (g_opts.json)
        print_json(json_pack("{s:s, s:s, s:s, s:I}", "volume", vol, "path", path, "format",
                             format, "size", (json_int_t)vsize));
    else {
        char b[32];
        printf("created volume %s: %s, %s (%s)\n", vol, format, format_size(vsize, b, sizeof(b)), path);
    }
    pool_close(&pool);
    return EXIT_OK;
}

/* ------------------------------------------------------------- delete */

static const char HELP_DELETE[] = "Usage: qsdctl delete VOLUME\n"
                                  "Delete a volume's image.  Refused while the volume is exported.\n"
                                  "Snapshots of the volume are kept.\n";

static int cmd_delete(int argc, char **argv)
{
    const char *vol;
    int r = parse_one_name(argc, argv, HELP_DELETE, "usage: qsdctl delete VOLUME", "volume", &vol);
    if (r >= 0)
        return r;
    if ((r = plugin_guard("volume", vol, "delete")))
        return r;
    _cleanup_close_ int lock = -1;
    if ((r = lock_volume(vol, &lock)))
        return r;
    if (volume_exported(vol, NULL))
        return fail(EXIT_EXISTS, "volume %s is exported: run 'qsdctl unexport %s' first", vol, vol);
    struct pool pool;
    if ((r = open_pool(&pool, false)))
        return r;
    char *msg = NULL;
    r = image_delete(&pool, vol, &msg);
    if (r < 0) {
        pool_close(&pool);
        return fail_msg(r, msg);
    }
    r = gc_report(&pool);
    pool_close(&pool);
    if (r)
        return r;
    _cleanup_free_ char *lockp = xasprintf("%s/locks/%s.lock", g_opts.run_dir, vol);
    unlink(lockp);
    if (!g_opts.json)
        printf("deleted volume %s\n", vol);
    else
        print_json(json_pack("{s:s, s:b}", "volume", vol, "deleted", 1));
    return EXIT_OK;
}

/* ------------------------------------------------------------- export */

static const char HELP_EXPORT[] =
    "Usage: qsdctl export VOLUME [options]\n"
    "Start a qemu-storage-daemon serving VOLUME over vhost-user-blk and wait (bounded)\n"
    "until its socket accepts connections.  The QSD keeps running after qsdctl exits;\n"
    "run 'qsdctl supervise' to have it restarted if it dies.\n"
    "  --num-queues N          virtqueues, 1-16 (default 1)\n"
    "  --logical-block-size N  512 (default) or 4096\n"
    "  --read-only             export read-only\n"
    "  --cache MODE            none (default), writeback, writethrough, directsync, unsafe\n"
    "                          none = O_DIRECT.  Flushes are honoured.  raw exports run\n"
    "                          write-back (a QSD crash loses nothing; the guest flushes),\n"
    "                          qcow2 ones, writethrough and directsync flush every write;\n"
    "                          unsafe ignores flushes and a QSD crash loses recent writes.\n"
    "  --aio MODE              io_uring, native, threads (default: native with an\n"
    "                          O_DIRECT cache, none or directsync; io_uring otherwise)\n"
    "  --discard MODE          unmap (default), ignore\n"
    "  --detect-zeroes MODE    off (default), on, unmap\n"
    "  --no-iothread           run the export in the main thread\n"
    "  --socket-group GROUP    group allowed to connect (name or gid; default: root only)\n"
    "  --socket-mode MODE      socket permissions, octal within 0660 (default 0660)\n"
    "  --timeout MS            how long to wait for the socket (default 10000)\n"
    "  --rbd-image POOL[/NAMESPACE]/IMAGE  serve this Ceph RBD image instead of the\n"
    "                          pool's VOLUME (VOLUME only names the export), with:\n"
    "  --rbd-monitors M[,M]    monitors, [v1:|v2:]host:port\n"
    "  --rbd-user USER         cephx user (without client.)\n"
    "  --rbd-key-file FILE     absolute path of a file only root reads, holding the\n"
    "                          user's base64 key (never on a command line)\n"
    "Prints the socket path.  Socket: RUN/exports/VOLUME/vhost.sock; QMP: RUN/ctl/VOLUME/qmp.sock\n";

static int cmd_export(int argc, char **argv)
{
    static const struct option lo[] = {
        {"num-queues", required_argument, 0, 1}, {"logical-block-size", required_argument, 0, 1},
        {"read-only", no_argument, 0, 'r'},      {"cache", required_argument, 0, 1},
        {"aio", required_argument, 0, 1},        {"discard", required_argument, 0, 1},
        {"detect-zeroes", required_argument, 0, 1}, {"no-iothread", no_argument, 0, 'n'},
        {"socket-group", required_argument, 0, 1}, {"socket-mode", required_argument, 0, 1},
        {"timeout", required_argument, 0, 't'},  {"help", no_argument, 0, 'h'},
        {"rbd-image", required_argument, 0, 1}, {"rbd-monitors", required_argument, 0, 1},
        {"rbd-user", required_argument, 0, 1},  {"rbd-key-file", required_argument, 0, 1}, {0}};
    struct qsd_opts opts;
    qsd_opts_init(&opts);
    uint64_t timeout = 10000;
    int c, idx, r;
    char *msg = NULL;
    while ((c = getopt_long(argc, argv, "h", lo, &idx)) != -1) {
        switch (c) {
        case 1:
            if (qsd_opts_set(&opts, lo[idx].name, optarg, &msg) < 0) {
                qsd_opts_clear(&opts);
                return fail_msg(-EINVAL, msg);
            }
            break;
        case 'r': opts.read_only = true; break;
        case 'n': opts.iothread = false; break;
        case 't':
            if (parse_uint(optarg, 1, 600000, &timeout) < 0) {
                qsd_opts_clear(&opts);
                return fail(EXIT_USAGE, "invalid --timeout '%s': milliseconds, 1-600000", optarg);
            }
            break;
        default:
            qsd_opts_clear(&opts);
            return help_or_usage(c, HELP_EXPORT, "usage: qsdctl export VOLUME [options]");
        }
    }
    if (optind + 1 != argc) {
        qsd_opts_clear(&opts);
        return USAGE_ERR("usage: qsdctl export VOLUME [options]");
    }
    const char *vol = argv[optind];
    if ((r = check_name("volume", vol)) || (r = plugin_guard("volume", vol, "export"))) {
        qsd_opts_clear(&opts);
        return r;
    }
    struct pool pool;
    if ((r = open_pool(&pool, false))) {
        qsd_opts_clear(&opts);
        return r;
    }
    _cleanup_close_ int lock = -1;
    int code = EXIT_OK;
    struct qsd_paths paths;
    qsd_paths_init(g_opts.run_dir, vol, &paths);
    if ((code = lock_volume(vol, &lock)))
        goto out;
    if (opts.rbd)
        opts.format = xstrdup("raw");
    else if (pool_find_volume(&pool, vol, &opts.image, &opts.format) < 0) {
        code = fail(EXIT_NOT_FOUND, "volume %s does not exist in pool %s", vol, g_opts.pool);
        goto out;
    }
    if ((r = qsd_opts_validate(&opts, &msg)) < 0) {
        code = fail_msg(r, msg);
        goto out;
    }
    pid_t pid;
    if (volume_exported(vol, &pid)) {
        if (g_opts.json)
            print_json(json_pack("{s:s, s:s, s:i, s:b}", "volume", vol, "socket", paths.socket,
                                 "pid", (int)pid, "already_exported", 1));
        else
            printf("volume %s is already exported (pid %d): %s\n", vol, (int)pid, paths.socket);
        goto out;
    }
    /* No QSD has it open: a snapshot interrupted by a crash is finished or
     * undone before one does (thin.h). */
    if (streq(opts.format, "qcow2") && (r = thin_recover(&pool, vol, NULL, NULL, &msg)) < 0) {
        code = fail_msg(r, msg);
        goto out;
    }
    uint64_t size = 0;
    if (!opts.rbd && (r = image_info(opts.image, opts.format, &size, NULL, &msg)) < 0) {
        code = fail_msg(r, msg);
        goto out;
    }
    if (size % opts.logical_block_size) {
        code = fail(EXIT_USAGE, "volume %s is %" PRIu64 " bytes, not a multiple of the logical "
                    "block size %u", vol, size, opts.logical_block_size);
        goto out;
    }
    struct qsd_config cfg = qsd_cfg();
    cfg.start_timeout_ms = timeout;
    uint64_t t0 = now_us();
    /* An RBD image's size is what QSD (librbd) sees, read over the monitor
     * connection the start hands over (qsd.h says why not a later one). */
    struct qmp_sync *qs = NULL;
    r = qsd_start_sync(&cfg, vol, &opts, &pid, opts.rbd ? &qs : NULL, &msg);
    uint64_t t1 = now_us();
    if (r < 0) {
        code = fail_msg(r, msg);
        qsd_remove_runtime(g_opts.run_dir, vol);
        goto out;
    }
    if (opts.rbd) {
        r = qmpc_export_size(qs, &size, &msg);
        qmp_sync_close(qs);
        if (r == 0 && (!size || size % opts.logical_block_size)) {
            msg = xasprintf("the RBD image is %" PRIu64 " bytes, not a positive multiple of the "
                            "logical block size %u", size, opts.logical_block_size);
            r = -EINVAL;
        }
        if (r < 0) {
            code = fail(exit_code_for(r), "volume %s: cannot use the RBD image's size: %s", vol,
                        msg);
            free(msg);
            msg = NULL;
            /* Change nothing: the QSD goes again. */
            char *m = NULL;
            if (qsd_stop_sync(&cfg, vol, &m) == 0)
                qsd_remove_runtime(g_opts.run_dir, vol);
            else
                log_warn("qsdctl", "cannot stop the QSD", "volume=%s error=\"%s\"", vol,
                         m ? m : "?");
            free(m);
            goto out;
        }
    }
    r = qsd_meta_write(&paths, vol, &opts, size);
    if (r < 0)
        log_warn("qsdctl", "cannot write volume.json", "volume=%s err=%s", vol, strerror(-r));
    if (g_opts.json)
        print_json(json_pack("{s:s, s:s, s:s, s:i, s:I, s:f}", "volume", vol, "socket",
                             paths.socket, "qmp", paths.qmp, "pid", (int)pid, "size",
                             (json_int_t)size, "ready_ms", (double)(t1 - t0) / 1000.0));
    else
        printf("exported volume %s (pid %d, ready in %.1f ms): %s\n", vol, (int)pid,
               (double)(t1 - t0) / 1000.0, paths.socket);
out:
    qsd_paths_clear(&paths);
    qsd_opts_clear(&opts);
    pool_close(&pool);
    return code;
}

/* ----------------------------------------------------------- unexport */

static const char HELP_UNEXPORT[] =
    "Usage: qsdctl unexport VOLUME [--timeout MS]\n"
    "Stop the volume's qemu-storage-daemon: QMP quit, then SIGKILL after the bound\n"
    "(default 5000 ms).  Removes the socket and runtime directories.  Idempotent.\n";

static int cmd_unexport(int argc, char **argv)
{
    static const struct option lo[] = {
        {"timeout", required_argument, 0, 't'}, {"help", no_argument, 0, 'h'}, {0}};
    uint64_t timeout = 5000;
    int c, r;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        if (c == 't' && parse_uint(optarg, 1, 600000, &timeout) == 0)
            continue;
        if (c == 't')
            return fail(EXIT_USAGE, "invalid --timeout '%s': milliseconds, 1-600000", optarg);
        return help_or_usage(c, HELP_UNEXPORT, "usage: qsdctl unexport VOLUME");
    }
    if (optind + 1 != argc)
        return USAGE_ERR("usage: qsdctl unexport VOLUME");
    const char *vol = argv[optind];
    if ((r = check_name("volume", vol)) || (r = plugin_guard("volume", vol, "unexport")))
        return r;
    _cleanup_close_ int lock = -1;
    if ((r = lock_volume(vol, &lock)))
        return r;
    struct qsd_paths paths;
    qsd_paths_init(g_opts.run_dir, vol, &paths);
    int code = EXIT_OK;
    if (access(paths.ctl_dir, F_OK) == 0) {
        struct qsd_config cfg = qsd_cfg();
        cfg.stop_timeout_ms = timeout;
        char *msg = NULL;
        r = qsd_stop_sync(&cfg, vol, &msg);
        if (r < 0)
            code = fail_msg(r, msg);
    }
    if (code == EXIT_OK) {
        qsd_remove_runtime(g_opts.run_dir, vol);
        if (g_opts.json)
            print_json(json_pack("{s:s, s:b}", "volume", vol, "exported", 0));
        else
            printf("volume %s is no longer exported\n", vol);
    }
    qsd_paths_clear(&paths);
    return code;
}

/* ------------------------------------------------------------- resize */

static const char HELP_RESIZE[] =
    "Usage: qsdctl resize VOLUME --size SIZE\n"
    "Grow a volume.  When it is exported the live QSD does it (block_resize) and the\n"
    "connected vhost-user client is told of the new capacity; otherwise the image is\n"
    "resized offline.  Shrinking is refused.\n";

static int cmd_resize(int argc, char **argv)
{
    static const struct option lo[] = {
        {"size", required_argument, 0, 's'}, {"help", no_argument, 0, 'h'}, {0}};
    const char *size_s = NULL;
    int c, r;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        if (c == 's') {
            size_s = optarg;
            continue;
        }
        return help_or_usage(c, HELP_RESIZE, "usage: qsdctl resize VOLUME --size SIZE");
    }
    if (optind + 1 != argc || !size_s)
        return USAGE_ERR("usage: qsdctl resize VOLUME --size SIZE");
    const char *vol = argv[optind];
    uint64_t size;
    if ((r = check_name("volume", vol)) || (r = size_arg(size_s, &size)) ||
        (r = plugin_guard("volume", vol, "resize")))
        return r;
    char *msg = NULL;
    struct pool pool;
    if ((r = open_pool(&pool, false)))
        return r;
    _cleanup_close_ int lock = -1;
    _cleanup_free_ char *path = NULL, *format = NULL;
    int code = EXIT_OK;
    if ((code = lock_volume(vol, &lock)))
        goto out;
    if (pool_find_volume(&pool, vol, &path, &format) < 0) {
        code = fail(EXIT_NOT_FOUND, "volume %s does not exist in pool %s", vol, g_opts.pool);
        goto out;
    }
    bool live = volume_exported(vol, NULL);
    struct qsd_paths paths;
    qsd_paths_init(g_opts.run_dir, vol, &paths);
    struct qsd_opts opts;
    unsigned align = IMAGE_SIZE_ALIGN;
    bool have_opts = live && qsd_read_state(paths.state, &opts, NULL, NULL, NULL) == 0;
    if (have_opts)
        align = opts.logical_block_size;
    if ((r = image_check_size(size, align, &msg)) < 0) {
        code = fail_msg(r, msg);
    } else if (live) {
        struct qmp_sync *s = NULL;
        r = connect_qmp(vol, &s);
        if (r < 0)
            code = -r;
        else if ((r = qmpc_grow_sync(s, size, true, NULL, &msg)) < 0)
            code = fail_msg(r, msg);
        else if (have_opts)
            qsd_meta_write(&paths, vol, &opts, size);
        qmp_sync_close(s);
    } else if ((r = image_resize_offline(path, format, size, &msg)) < 0) {
        code = fail_msg(r, msg);
    }
    if (have_opts)
        qsd_opts_clear(&opts);
    qsd_paths_clear(&paths);
    if (code == EXIT_OK) {
        if (g_opts.json)
            print_json(json_pack("{s:s, s:I, s:b}", "volume", vol, "size", (json_int_t)size,
                                 "online", live));
        else {
            char b[32];
            printf("resized volume %s to %s (%s)\n", vol, format_size(size, b, sizeof(b)),
                   live ? "online, through its QSD" : "offline");
        }
    }
out:
    pool_close(&pool);
    return code;
}

/* ----------------------------------------------------------- snapshot */

static const char HELP_SNAPSHOT[] =
    "Usage: qsdctl snapshot VOLUME SNAPSHOT [--timeout SECONDS]\n"
    "Take a point-in-time snapshot of VOLUME as POOL/snapshots/SNAPSHOT.qcow2; it outlives\n"
    "the volume.  qcow2: thin and instant whatever the size: the volume's top layer is\n"
    "frozen (the snapshot is a second name of it) and the volume goes on in a new\n"
    "overlay, switched inside its running QSD when exported (blockdev-snapshot; the\n"
    "client is not disturbed).  A chain deeper than 8 is then merged in the background.\n"
    "raw: a full copy (blockdev-backup while exported).  Bound: --timeout (600).\n"
    "Restore with: qsdctl create NEWVOLUME --from-snapshot SNAPSHOT\n";

/* The QMP monitor of a volume's QSD when it serves the volume read-write
 * (then a thin snapshot switches inside it), and its options. */
static int writable_qsd(const char *vol, struct qmp_sync **ret_s, struct qsd_opts *ret_o)
{
    struct qsd_paths p;
    qsd_paths_init(g_opts.run_dir, vol, &p);
    int r = qsd_read_state(p.state, ret_o, NULL, NULL, NULL);
    qsd_paths_clear(&p);
    if (r < 0)
        return fail(EXIT_FAILURE_GENERIC, "cannot read the state of volume %s's QSD", vol);
    *ret_s = NULL;
    if (ret_o->read_only)
        return 0;
    r = connect_qmp(vol, ret_s);
    if (r < 0)
        qsd_opts_clear(ret_o);
    return r < 0 ? -r : 0;
}

static int cmd_snapshot(int argc, char **argv)
{
    static const struct option lo[] = {
        {"timeout", required_argument, 0, 't'}, {"help", no_argument, 0, 'h'}, {0}};
    uint64_t timeout_s = 600;
    int c, r;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        if (c == 't' && parse_uint(optarg, 1, 86400, &timeout_s) == 0)
            continue;
        if (c == 't')
            return fail(EXIT_USAGE, "invalid --timeout '%s': seconds, 1-86400", optarg);
        return help_or_usage(c, HELP_SNAPSHOT, "usage: qsdctl snapshot VOLUME SNAPSHOT");
    }
    if (optind + 2 != argc)
        return USAGE_ERR("usage: qsdctl snapshot VOLUME SNAPSHOT");
    const char *vol = argv[optind], *snap = argv[optind + 1];
    if ((r = check_name("volume", vol)) || (r = check_name("snapshot", snap)) ||
        (r = plugin_guard("volume", vol, "snapshot")))
        return r;
    struct pool pool;
    if ((r = open_pool(&pool, true)))
        return r;
    _cleanup_close_ int lock = -1;
    _cleanup_free_ char *path = NULL, *format = NULL, *spath = NULL;
    char *msg = NULL;
    int code = EXIT_OK;
    bool live = false, merging = false;
    char layer[LAYER_NAME_LEN + 1] = "";
    struct qmp_sync *s = NULL;
    struct qsd_opts o = {0};
    if ((code = lock_volume(vol, &lock)))
        goto out;
    if (pool_find_volume(&pool, vol, &path, &format) < 0) {
        code = fail(EXIT_NOT_FOUND, "volume %s does not exist in pool %s", vol, g_opts.pool);
        goto out;
    }
    live = volume_exported(vol, NULL);
    uint64_t t0 = now_ms();
    if (streq(format, "qcow2")) {
        if (live && (code = writable_qsd(vol, &s, &o)))
            goto out;
        r = thin_snapshot(&pool, vol, s, &o, snap, timeout_s * 1000, layer, &msg);
        if (r == -EOPNOTSUPP && s) {
            /* exported in an iothread: a full copy (thin.h) */
            free(msg);
            msg = NULL;
            r = live_snapshot(s, &pool, snap, timeout_s * 1000, &msg);
        } else if (r == 0 && s) {
            /* Past the depth where merging starts: leave it to QSD. */
            struct chain ch;
            char *m = NULL;
            if (pool_chain(&pool, path, format, &ch, &m) == 0) {
                if (layers_merge_count((unsigned)ch.n, LAYER_MERGE_AT, LAYER_MERGE_TO) > 0)
                    merging = thin_merge(&pool, vol, s, LAYER_MERGE_TO, false, 0, &m) == 0;
                chain_clear(&ch);
            }
            free(m);
        }
    } else if (live) {
        if ((code = -connect_qmp(vol, &s)) > 0)
            goto out;
        r = live_snapshot(s, &pool, snap, timeout_s * 1000, &msg);
    } else {
        r = snapshot_create_offline(&pool, path, format, snap, &msg);
    }
    if (r < 0) {
        code = fail_msg(r, msg);
        goto out;
    }
    spath = pool_snapshot_path(&pool, snap);
    if (g_opts.json)
        print_json(json_pack("{s:s, s:s, s:s, s:b, s:s?, s:b, s:I}", "volume", vol, "snapshot",
                             snap, "path", spath, "live", live, "layer", *layer ? layer : NULL,
                             "merging", merging, "ms", (json_int_t)(now_ms() - t0)));
    else
        printf("snapshot %s of volume %s taken %s in %" PRIu64 " ms: %s%s%s%s\n", snap, vol,
               live ? "live through its QSD" : "offline", now_ms() - t0, spath,
               *layer ? " (layer " : "", layer, *layer ? (merging ? "; merging the chain)" : ")") : "");
out:
    qmp_sync_close(s);
    qsd_opts_clear(&o);
    pool_close(&pool);
    return code;
}

/* ---------------------------------------------------------- merge, gc */

static const char HELP_MERGE[] =
    "Usage: qsdctl merge VOLUME [--depth N] [--no-wait] [--timeout SECONDS]\n"
    "Shorten the volume's chain of layers to N files (default 1: flatten) by copying\n"
    "the newest layers' data into its top: block-stream inside its QSD when exported\n"
    "(the client keeps running), qemu-img rebase otherwise.  Snapshots keep their\n"
    "layers.  --no-wait: start the live merge and return.  Bound: --timeout (3600).\n";

static int cmd_merge(int argc, char **argv)
{
    static const struct option lo[] = {{"depth", required_argument, 0, 'd'},
                                       {"no-wait", no_argument, 0, 'n'},
                                       {"timeout", required_argument, 0, 't'},
                                       {"help", no_argument, 0, 'h'}, {0}};
    uint64_t depth = 1, timeout_s = 3600;
    bool wait = true;
    int c, r;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        if (c == 'd' && parse_uint(optarg, 1, LAYER_MAX_DEPTH, &depth) == 0)
            continue;
        if (c == 't' && parse_uint(optarg, 1, 86400, &timeout_s) == 0)
            continue;
        if (c == 'n') {
            wait = false;
            continue;
        }
        if (c == 'd' || c == 't')
            return fail(EXIT_USAGE, "invalid --%s '%s'", c == 'd' ? "depth" : "timeout", optarg);
        return help_or_usage(c, HELP_MERGE, "usage: qsdctl merge VOLUME");
    }
    if (optind + 1 != argc)
        return USAGE_ERR("usage: qsdctl merge VOLUME");
    const char *vol = argv[optind];
    if ((r = check_name("volume", vol)) || (r = plugin_guard("volume", vol, "merge")))
        return r;
    struct pool pool;
    if ((r = open_pool(&pool, false)))
        return r;
    _cleanup_close_ int lock = -1;
    _cleanup_free_ char *path = NULL, *format = NULL;
    char *msg = NULL;
    struct qmp_sync *s = NULL;
    struct qsd_opts o = {0};
    int code = EXIT_OK;
    uint64_t t0 = now_ms();
    if ((code = lock_volume(vol, &lock)))
        goto out;
    if (pool_find_volume(&pool, vol, &path, &format) < 0 || !streq(format, "qcow2")) {
        code = fail(EXIT_NOT_FOUND, "no qcow2 volume %s in pool %s", vol, g_opts.pool);
        goto out;
    }
    if (volume_exported(vol, NULL) && (code = writable_qsd(vol, &s, &o)))
        goto out;
    r = thin_merge(&pool, vol, s, (unsigned)depth, wait, timeout_s * 1000, &msg);
    if (r < 0) {
        code = fail_msg(r, msg);
        msg = NULL;
        goto out;
    }
    struct chain ch = {0};
    pool_chain(&pool, path, format, &ch, &msg);
    if (g_opts.json)
        print_json(json_pack("{s:s, s:b, s:I, s:I}", "volume", vol, "merged", r == 0, "depth",
                             (json_int_t)ch.n, "ms", (json_int_t)(now_ms() - t0)));
    else
        printf("volume %s: %s; chain depth now %zu (%" PRIu64 " ms)\n", vol,
               r == 1 ? "nothing to merge" : wait ? "merged" : "merge started", ch.n,
               now_ms() - t0);
    chain_clear(&ch);
out:
    free(msg);
    qmp_sync_close(s);
    qsd_opts_clear(&o);
    pool_close(&pool);
    return code;
}

static const char HELP_GC[] = "Usage: qsdctl gc\n"
                              "Remove the pool's layers that no volume, snapshot or other layer uses\n"
                              "any more (delete and snapshot-delete do it too).\n";

static int gc_report(struct pool *pool)
{
    unsigned n = 0;
    uint64_t freed = 0;
    char *msg = NULL;
    int r = pool_gc(pool, &n, &freed, &msg);
    if (r < 0)
        return fail_msg(r, msg);
    if (n && !g_opts.json) {
        char b[32];
        printf("removed %u unused layer(s), %s\n", n, format_size(freed, b, sizeof(b)));
    }
    return EXIT_OK;
}

static int cmd_gc(int argc, char **argv)
{
    static const struct option lo[] = {{"help", no_argument, 0, 'h'}, {0}};
    int c, r;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1)
        return help_or_usage(c, HELP_GC, "usage: qsdctl gc");
    if (optind != argc)
        return USAGE_ERR("usage: qsdctl gc");
    struct pool pool;
    if ((r = open_pool(&pool, false)))
        return r;
    r = gc_report(&pool);
    pool_close(&pool);
    return r;
}

static const char HELP_SNAPSHOT_DELETE[] = "Usage: qsdctl snapshot-delete SNAPSHOT\n"
                                           "Delete a snapshot.  Volumes restored from it are not affected: the\n"
                                           "layers they use stay until nothing uses them.\n";

static int cmd_snapshot_delete(int argc, char **argv)
{
    const char *snap;
    int r = parse_one_name(argc, argv, HELP_SNAPSHOT_DELETE, "usage: qsdctl snapshot-delete SNAPSHOT", "snapshot", &snap);
    if (r >= 0)
        return r;
    if ((r = plugin_guard("snapshot", snap, "snapshot-delete")))
        return r;
    struct pool pool;
    if ((r = open_pool(&pool, false)))
        return r;
    char *msg = NULL;
    r = snapshot_delete(&pool, snap, &msg);
    if (r < 0) {
        pool_close(&pool);
        return fail_msg(r, msg);
    }
    r = gc_report(&pool);
    pool_close(&pool);
    if (r)
        return r;
    if (g_opts.json)
        print_json(json_pack("{s:s, s:b}", "snapshot", snap, "deleted", 1));
    else
        printf("deleted snapshot %s\n", snap);
    return EXIT_OK;
}

/* ------------------------------------------------------ status / list */

static json_t *volume_status(const struct pool *pool, const char *vol, char **ret_msg)
{
    _cleanup_free_ char *path = NULL, *format = NULL;
    if (pool_find_volume(pool, vol, &path, &format) < 0) {
        *ret_msg = xasprintf("volume %s does not exist in pool %s", vol, pool->root);
        return NULL;
    }
    uint64_t size = 0, alloc = 0;
    int r = image_info(path, format, &size, &alloc, ret_msg);
    if (r < 0)
        return NULL;
    json_t *j = json_pack("{s:s, s:s, s:s, s:I, s:I}", "volume", vol, "path", path, "format",
                          format, "size", (json_int_t)size, "allocated", (json_int_t)alloc);
    struct chain ch;
    char *cm = NULL;
    if (pool_chain(pool, path, format, &ch, &cm) == 0) {
        json_object_set_new(j, "chain", chain_to_json(&ch));
        chain_clear(&ch);
    }
    free(cm);
    pid_t pid;
    bool exported = volume_exported(vol, &pid);
    json_object_set_new(j, "exported", json_boolean(exported));
    if (exported) {
        struct qsd_paths p;
        qsd_paths_init(g_opts.run_dir, vol, &p);
        json_object_set_new(j, "pid", json_integer(pid));
        json_object_set_new(j, "socket", json_string(p.socket));
        json_object_set_new(j, "socket_accepts", json_boolean(unix_socket_listening(p.socket) > 0));
        struct qmp_sync *s;
        char *m = NULL;
        if (qmpc_connect_volume(g_opts.run_dir, vol, 2000, &s, &m) == 0) {
            uint64_t lsize;
            if (qmpc_export_size(s, &lsize, &m) == 0)
                json_object_set_new(j, "size", json_integer((json_int_t)lsize));
            qmp_sync_close(s);
        }
        free(m);
        /* QEMU 10.0 keeps no I/O statistics for vhost-user-blk exports
         * (docs/observability.md): the kernel's accounting of the QSD. */
        struct proc_io io;
        if (proc_io(pid, &io) == 0)
            json_object_set_new(j, "stats",
                                json_pack("{s:I, s:I, s:f}", "read_bytes",
                                          (json_int_t)io.read_bytes, "write_bytes",
                                          (json_int_t)io.write_bytes, "cpu_seconds",
                                          io.cpu_seconds));
        struct qsd_opts o;
        if (qsd_read_state(p.state, &o, NULL, NULL, NULL) == 0) {
            json_object_set_new(j, "options", qsd_opts_to_json(&o));
            qsd_opts_clear(&o);
        }
        qsd_paths_clear(&p);
    }
    return j;
}

static const char HELP_STATUS[] = "Usage: qsdctl status VOLUME\n"
                                  "Show a volume's image (format, virtual size, allocation) and, when exported,\n"
                                  "its QSD (pid, socket, options, I/O statistics).\n";

static int cmd_status(int argc, char **argv)
{
    const char *vol;
    int r = parse_one_name(argc, argv, HELP_STATUS, "usage: qsdctl status VOLUME", "volume", &vol);
    if (r >= 0)
        return r;
    struct pool pool;
    if ((r = open_pool(&pool, false)))
        return r;
    char *msg = NULL;
    json_t *j = volume_status(&pool, vol, &msg);
    pool_close(&pool);
    if (!j)
        return fail_msg(strstr(msg, "does not exist") ? -ENOENT : -EIO, msg);
    if (g_opts.json) {
        print_json(j);
        return EXIT_OK;
    }
    char b1[32], b2[32];
    printf("volume:     %s\nimage:      %s (%s)\nsize:       %s\nallocated:  %s\n",
           vol, json_string_value(json_object_get(j, "path")),
           json_string_value(json_object_get(j, "format")),
           format_size((uint64_t)json_integer_value(json_object_get(j, "size")), b1, sizeof(b1)),
           format_size((uint64_t)json_integer_value(json_object_get(j, "allocated")), b2, sizeof(b2)));
    json_t *chain = json_object_get(j, "chain");
    printf("chain:      %zu file(s), top first\n", json_array_size(chain));
    size_t ci;
    json_t *cl;
    json_array_foreach(chain, ci, cl)
    {
        const char *layer = json_string_value(json_object_get(cl, "layer"));
        printf("  %-20s %12s allocated%s\n", layer ? layer : "(top)",
               format_size((uint64_t)json_integer_value(json_object_get(cl, "allocated")), b1,
                           sizeof(b1)),
               json_is_true(json_object_get(cl, "shared")) ? ", also a snapshot" : "");
    }
    if (json_is_true(json_object_get(j, "exported"))) {
        json_t *st = json_object_get(j, "stats");
        printf("exported:   yes, pid %d, socket %s (%s)\n",
               (int)json_integer_value(json_object_get(j, "pid")),
               json_string_value(json_object_get(j, "socket")),
               json_is_true(json_object_get(j, "socket_accepts")) ? "accepting" : "NOT accepting");
        if (st)
            printf("QSD I/O:    %s read, %s written from/to storage, %.2f s CPU\n",
                   format_size((uint64_t)json_integer_value(json_object_get(st, "read_bytes")),
                               b1, sizeof(b1)),
                   format_size((uint64_t)json_integer_value(json_object_get(st, "write_bytes")),
                               b2, sizeof(b2)),
                   json_real_value(json_object_get(st, "cpu_seconds")));
    } else {
        printf("exported:   no\n");
    }
    json_decref(j);
    return EXIT_OK;
}

/* Names of entries in dir with the given suffix, sorted. */
static json_t *list_names(const char *dir, const char *suffix1, const char *suffix2)
{
    json_t *names = json_array();
    DIR *d = opendir(dir);
    if (!d)
        return names;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        size_t n = strlen(de->d_name);
        const char *sfx[] = {suffix1, suffix2};
        for (unsigned i = 0; i < 2; i++) {
            if (!sfx[i])
                continue;
            size_t s = strlen(sfx[i]);
            if (n > s && streq(de->d_name + n - s, sfx[i])) {
                _cleanup_free_ char *name = xstrndup(de->d_name, n - s);
                if (name_validate(name, NULL) == 0)
                    json_array_append_new(names, json_string(name));
            }
        }
    }
    closedir(d);
    return names;
}

static const char HELP_LIST[] = "Usage: qsdctl list\n"
                                "List the pool's volumes (format, size, export state) and snapshots.\n";

static int cmd_list(int argc, char **argv)
{
    static const struct option lo[] = {{"help", no_argument, 0, 'h'}, {0}};
    int c, r;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1)
        return help_or_usage(c, HELP_LIST, "usage: qsdctl list");
    if (optind != argc)
        return USAGE_ERR("usage: qsdctl list");
    struct pool pool;
    if ((r = open_pool(&pool, false)))
        return r;
    json_t *vols = list_names(pool.volumes, ".qcow2", ".raw");
    json_t *snaps = list_names(pool.snapshots, ".qcow2", NULL);
    json_t *out_vols = json_array(), *out_snaps = json_array();
    size_t i;
    json_t *v;
    json_array_foreach(vols, i, v)
    {
        _cleanup_free_ char *path = NULL, *format = NULL;
        const char *name = json_string_value(v);
        pool_find_volume(&pool, name, &path, &format);
        uint64_t size = 0, alloc = 0;
        char *msg = NULL;
        image_info(path, format, &size, &alloc, &msg);
        free(msg);
        pid_t pid = 0;
        bool exp = volume_exported(name, &pid);
        struct chain ch = {0};
        pool_chain(&pool, path, format, &ch, &msg);
        free(msg);
        json_array_append_new(out_vols, json_pack("{s:s, s:s, s:I, s:I, s:b, s:I}", "volume", name,
                                                  "format", format, "size", (json_int_t)size,
                                                  "allocated", (json_int_t)alloc, "exported", exp,
                                                  "depth", (json_int_t)ch.n));
        chain_clear(&ch);
    }
    json_array_foreach(snaps, i, v)
    {
        _cleanup_free_ char *path = pool_snapshot_path(&pool, json_string_value(v));
        uint64_t size = 0, alloc = 0;
        char *msg = NULL;
        image_info(path, "qcow2", &size, &alloc, &msg);
        free(msg);
        struct chain ch = {0};
        msg = NULL;
        pool_chain(&pool, path, "qcow2", &ch, &msg);
        free(msg);
        json_array_append_new(out_snaps, json_pack("{s:s, s:I, s:I, s:I, s:s?}", "snapshot",
                                                   json_string_value(v), "size", (json_int_t)size,
                                                   "allocated", (json_int_t)alloc, "depth",
                                                   (json_int_t)ch.n, "backing",
                                                   ch.n > 1 ? ch.l[1].layer : NULL));
        chain_clear(&ch);
    }
    json_decref(vols);
    json_decref(snaps);
    pool_close(&pool);
    if (g_opts.json) {
        print_json(json_pack("{s:o, s:o}", "volumes", out_vols, "snapshots", out_snaps));
        return EXIT_OK;
    }
    printf("%-40s %-6s %12s %12s %5s %s\n", "VOLUME", "FORMAT", "SIZE", "ALLOCATED", "DEPTH",
           "EXPORTED");
    json_array_foreach(out_vols, i, v)
    {
        char b1[32], b2[32];
        printf("%-40s %-6s %12s %12s %5lld %s\n", json_string_value(json_object_get(v, "volume")),
               json_string_value(json_object_get(v, "format")),
               format_size((uint64_t)json_integer_value(json_object_get(v, "size")), b1, sizeof(b1)),
               format_size((uint64_t)json_integer_value(json_object_get(v, "allocated")), b2, sizeof(b2)),
               (long long)json_integer_value(json_object_get(v, "depth")),
               json_is_true(json_object_get(v, "exported")) ? "yes" : "no");
    }
    printf("\n%-40s %12s %12s %5s\n", "SNAPSHOT", "SIZE", "ALLOCATED", "DEPTH");
    json_array_foreach(out_snaps, i, v)
    {
        char b1[32], b2[32];
        printf("%-40s %12s %12s %5lld\n", json_string_value(json_object_get(v, "snapshot")),
               format_size((uint64_t)json_integer_value(json_object_get(v, "size")), b1, sizeof(b1)),
               format_size((uint64_t)json_integer_value(json_object_get(v, "allocated")), b2, sizeof(b2)),
               (long long)json_integer_value(json_object_get(v, "depth")));
    }
    json_decref(out_vols);
    json_decref(out_snaps);
    return EXIT_OK;
}

/* ---------------------------------------------------------------- qmp */

static const char HELP_QMP[] =
    "Usage: qsdctl qmp VOLUME COMMAND [ARGUMENTS-JSON]\n"
    "Send one raw QMP command to the volume's QSD and print the reply (debugging).\n"
    "Example: qsdctl qmp vol1 query-block-exports\n"
    "         qsdctl qmp vol1 block_resize '{\"node-name\": \"vol\", \"size\": 2147483648}'\n";

static int cmd_qmp(int argc, char **argv)
{
    static const struct option lo[] = {{"help", no_argument, 0, 'h'}, {0}};
    int c, r;
    while ((c = getopt_long(argc, argv, "+h", lo, NULL)) != -1)
        return help_or_usage(c, HELP_QMP, "usage: qsdctl qmp VOLUME COMMAND [ARGUMENTS-JSON]");
    if (argc - optind < 2 || argc - optind > 3)
        return USAGE_ERR("usage: qsdctl qmp VOLUME COMMAND [ARGUMENTS-JSON]");
    const char *vol = argv[optind], *cmd = argv[optind + 1];
    if ((r = check_name("volume", vol)))
        return r;
    json_t *args = NULL;
    if (argc - optind == 3) {
        json_error_t je;
        args = json_loads(argv[optind + 2], 0, &je);
        if (!json_is_object(args)) {
            json_decref(args);
            return fail(EXIT_USAGE, "ARGUMENTS must be a JSON object: %s", je.text);
        }
    }
    struct qmp_sync *s;
    if ((r = connect_qmp(vol, &s)) < 0) {
        json_decref(args);
        return -r;
    }
    json_t *ret = NULL;
    bool refused = false;
    _cleanup_free_ char *msg = NULL;
    r = qmpc_call(s, qmpc_raw(cmd, args), &ret, &refused, &msg);
    qmp_sync_close(s);
    if (r < 0)
        return fail(refused ? EXIT_QEMU : exit_code_for(r), "%s", msg);
    print_json(ret);
    return EXIT_OK;
}

/* ---------------------------------------------------------- supervise */

struct sup_entry {
    struct qsd *qsd;
    int lockfd;
    struct sup_entry *next;
};

struct supervisor {
    struct loop *loop;
    struct sup_entry *entries;
    struct loop_timer *scan_timer;
    uint64_t scan_ms;
};

static void sup_event(struct qsd *q, enum qsd_event ev, const char *detail, void *opaque)
{
    static const char *names[] = {"ready", "died", "restarted", "start failed", "stopped"};
    const char *vol = qsd_get_volume(q);
    _cleanup_free_ char *d = detail ? log_quote(detail) : NULL;
    if (ev == QSD_EV_DIED || ev == QSD_EV_START_FAILED)
        log_warn("supervise", names[ev], "volume=%s detail=%s", vol, d ? d : "-");
    else
        log_info("supervise", names[ev], "volume=%s pid=%d restarts=%u%s%s", vol,
                 (int)qsd_get_pid(q), qsd_restart_count(q), d ? " detail=" : "", d ? d : "");
}

static struct sup_entry *sup_find(struct supervisor *s, const char *vol)
{
    for (struct sup_entry *e = s->entries; e; e = e->next)
        if (streq(qsd_get_volume(e->qsd), vol))
            return e;
    return NULL;
}

static void sup_start_done(struct qsd *q, int status, const char *msg, void *opaque)
{
    if (status < 0)
        log_warn("supervise", "start failed", "volume=%s err=%s", qsd_get_volume(q), msg ? msg : strerror(-status));
}

static void sup_scan(struct loop *l, void *opaque)
{
    struct supervisor *s = opaque;
    s->scan_timer = loop_timer_add(l, s->scan_ms, sup_scan, s);
    _cleanup_free_ char *ctl = xasprintf("%s/ctl", g_opts.run_dir);
    DIR *d = opendir(ctl);
    /* Forget volumes whose runtime directory is gone (unexported). */
    for (struct sup_entry **pp = &s->entries; *pp;) {
        struct sup_entry *e = *pp;
        if (access(qsd_get_paths(e->qsd)->state, F_OK) < 0 && !qsd_running(e->qsd)) {
            log_info("supervise", "forgotten", "volume=%s", qsd_get_volume(e->qsd));
            *pp = e->next;
            qsd_free(e->qsd);
            free(e);
            continue;
        }
        pp = &e->next;
    }
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *vol = de->d_name;
        if (name_validate(vol, NULL) < 0 || sup_find(s, vol))
            continue;
        struct qsd_paths p;
        qsd_paths_init(g_opts.run_dir, vol, &p);
        bool desired = false;
        int r = qsd_read_state(p.state, NULL, &desired, NULL, NULL);
        qsd_paths_clear(&p);
        if (r < 0 || !desired)
            continue;
        /* Take the volume's lock so a concurrent `qsdctl export` is not doubled. */
        _cleanup_free_ char *lockdir = xasprintf("%s/locks", g_opts.run_dir);
        mkdir_p(lockdir, 0700);
        _cleanup_free_ char *lockp = xasprintf("%s/%s.lock", lockdir, vol);
        int fd = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
            continue;
        if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
            close(fd); /* busy: next scan */
            continue;
        }
        struct sup_entry *e = xcalloc(1, sizeof(*e));
        struct qsd_config cfg = qsd_cfg();
        qsd_new(l, &cfg, vol, NULL, &e->qsd);
        qsd_set_event_handler(e->qsd, sup_event, s);
        r = qsd_adopt(e->qsd);
        if (r == 0) {
            log_info("supervise", "adopted", "volume=%s pid=%d", vol, (int)qsd_get_pid(e->qsd));
        } else {
            log_info("supervise", "not running, starting", "volume=%s", vol);
            r = qsd_start(e->qsd, sup_start_done, s);
            if (r < 0)
                log_warn("supervise", "start failed", "volume=%s err=%s", vol, strerror(-r));
        }
        flock(fd, LOCK_UN);
        close(fd);
        e->next = s->entries;
        s->entries = e;
    }
    closedir(d);
}

static void on_signal(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    struct signalfd_siginfo si;
    if (read(fd, &si, sizeof(si)) == sizeof(si)) {
        log_info("supervise", "signal received, exiting (QSDs keep running)", "signal=%u", si.ssi_signo);
        loop_stop(l);
    }
}

static const char HELP_SUPERVISE[] =
    "Usage: qsdctl supervise [--scan-interval MS]\n"
    "Run in the foreground and keep every exported volume's QSD alive: adopt the QSDs\n"
    "already running (never starting a duplicate), restart one that dies on the same\n"
    "socket path (backing off when it keeps dying), and pick up new exports.\n"
    "SIGTERM or SIGINT stops the supervisor; the QSDs keep running.\n";

static int cmd_supervise(int argc, char **argv)
{
    static const struct option lo[] = {
        {"scan-interval", required_argument, 0, 'i'}, {"help", no_argument, 0, 'h'}, {0}};
    uint64_t scan_ms = 1000;
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        if (c == 'i' && parse_uint(optarg, 10, 60000, &scan_ms) == 0)
            continue;
        if (c == 'i')
            return fail(EXIT_USAGE, "invalid --scan-interval '%s': milliseconds, 10-60000", optarg);
        return help_or_usage(c, HELP_SUPERVISE, "usage: qsdctl supervise");
    }
    if (optind != argc)
        return USAGE_ERR("usage: qsdctl supervise");
    struct supervisor s = {.scan_ms = scan_ms};
    int r = loop_new(&s.loop);
    if (r < 0)
        return fail(EXIT_FAILURE_GENERIC, "cannot create event loop: %s", strerror(-r));
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    struct loop_watch *sw = loop_watch_fd(s.loop, sfd, POLLIN, on_signal, NULL);
    log_info("supervise", "started", "run_dir=%s pid=%d", g_opts.run_dir, (int)getpid());
    sup_scan(s.loop, &s);
    r = loop_run(s.loop);
    loop_timer_cancel(s.scan_timer);
    loop_watch_remove(sw);
    while (s.entries) {
        struct sup_entry *e = s.entries;
        s.entries = e->next;
        qsd_free(e->qsd);
        free(e);
    }
    loop_free(s.loop);
    close(sfd);
    return r < 0 ? EXIT_FAILURE_GENERIC : EXIT_OK;
}

/* ---------------------------------------------------------------- main */

static const struct command commands[] = {
    {"create", cmd_create, "create a volume image (optionally from a snapshot)"},
    {"delete", cmd_delete, "delete a volume image"},
    {"export", cmd_export, "start a QSD serving the volume over vhost-user-blk"},
    {"unexport", cmd_unexport, "stop the volume's QSD"},
    {"resize", cmd_resize, "grow a volume (online when exported)"},
    {"snapshot", cmd_snapshot, "snapshot a volume (live when exported)"},
    {"snapshot-delete", cmd_snapshot_delete, "delete a snapshot"},
    {"merge", cmd_merge, "shorten a volume's chain of layers (flatten)"},
    {"gc", cmd_gc, "remove layers nothing uses"},
    {"list", cmd_list, "list volumes and snapshots"},
    {"status", cmd_status, "show a volume: image, QSD, I/O statistics"},
    {"qmp", cmd_qmp, "send a raw QMP command to a volume's QSD"},
    {"supervise", cmd_supervise, "keep exported volumes' QSDs running (adopt, restart)"},
    {"plugin-status", cmd_plugin_status, "show the CSI plugin's volumes, QSDs, publications, bridges"},
    {"vhost-info", cmd_vhost_info, "connect to a vhost-user-blk socket and show the disk"},
    {"verify", cmd_verify, "write and check data through a vhost-user-blk socket"},
    {"bench", cmd_bench, "benchmark a vhost-user-blk socket or a file"},
    {"seqwrite", cmd_seqwrite, "write one ordered sequence across vhost-user-blk sockets"},
};

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: qsdctl [global options] COMMAND [options] [arguments]\n"
            "Control qemu-storage-daemon volumes: images, vhost-user-blk exports, snapshots.\n\n"
            "Global options:\n"
            "  --run-dir DIR      runtime directory (default /run/qsd-csi; env QSDCTL_RUN_DIR)\n"
            "  --pool DIR         image pool (default /var/lib/qsd-csi/pool; env QSDCTL_POOL)\n"
            "  --state-dir DIR    the CSI plugin's state (default /var/lib/qsd-csi/state;\n"
            "                     env QSDCTL_STATE_DIR): volumes and snapshots with a record\n"
            "                     there are the plugin's, and export, unexport, delete,\n"
            "                     resize, snapshot, merge and snapshot-delete refuse them\n"
            "  --force            act on the plugin's volumes and snapshots anyway\n"
            "  --qsd-binary PATH  qemu-storage-daemon to run (default: from PATH)\n"
            "  --vhost-filter PATH  the vhost-user filter in front of every export (default:\n"
            "                     $QSD_VHOST_FILTER, else qsd-vhost-filter beside qsdctl;\n"
            "                     \"none\": clients talk to the QSD directly)\n"
            "  --json             machine-readable output on stdout\n"
            "  --log-level LEVEL  debug, info (default), warn, error\n"
            "  --version, --help\n\nCommands:\n");
    for (size_t i = 0; i < ARRAY_SIZE(commands); i++)
        fprintf(f, "  %-16s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'qsdctl COMMAND --help' describes each command.\n"
               "Exit codes: 0 ok, 1 failed, 2 bad usage or invalid argument, 3 not found,\n"
               "4 exists or busy, 5 timed out, 6 QEMU reported an error, 7 data mismatch.\n");
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"run-dir", required_argument, 0, 'R'}, {"pool", required_argument, 0, 'P'},
        {"state-dir", required_argument, 0, 'S'}, {"force", no_argument, 0, 'f'},
        {"qsd-binary", required_argument, 0, 'B'}, {"json", no_argument, 0, 'j'},
        {"log-level", required_argument, 0, 'L'}, {"version", no_argument, 0, 'V'},
        {"help", no_argument, 0, 'h'}, {"vhost-filter", required_argument, 0, 'F'}, {0}};
    signal(SIGPIPE, SIG_IGN);
    if (getenv("QSDCTL_RUN_DIR"))
        g_opts.run_dir = getenv("QSDCTL_RUN_DIR");
    if (getenv("QSDCTL_POOL"))
        g_opts.pool = getenv("QSDCTL_POOL");
    if (getenv("QSDCTL_STATE_DIR"))
        g_opts.state_dir = getenv("QSDCTL_STATE_DIR");
    int c;
    enum log_level lvl;
    while ((c = getopt_long(argc, argv, "+h", lo, NULL)) != -1) {
        switch (c) {
        case 'R': g_opts.run_dir = optarg; break;
        case 'P': g_opts.pool = optarg; break;
        case 'S': g_opts.state_dir = optarg; break;
        case 'f': g_opts.force = true; break;
        case 'B': g_qsd_binary = optarg; break;
        case 'F': g_filter_flag = optarg; break;
        case 'j': g_opts.json = true; break;
        case 'L':
            if (log_parse_level(optarg, &lvl) < 0)
                return fail(EXIT_USAGE, "invalid --log-level '%s': debug, info, warn or error", optarg);
            log_set_level(lvl);
            break;
        case 'V': printf("qsdctl %s\n", QSD_CSI_VERSION); return EXIT_OK;
        case 'h': usage(stdout); return EXIT_OK;
        default: usage(stderr); return EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (g_opts.run_dir[0] != '/' || g_opts.pool[0] != '/' || g_opts.state_dir[0] != '/')
        return fail(EXIT_USAGE, "--run-dir, --pool and --state-dir must be absolute paths");
    const char *name = argv[optind];
    for (size_t i = 0; i < ARRAY_SIZE(commands); i++) {
        if (streq(commands[i].name, name)) {
            /* --json and --force are also accepted after the command name. */
            int sub_argc = 0;
            char **sub_argv = argv + optind;
            for (int k = optind; k < argc; k++) {
                if (streq(argv[k], "--json"))
                    g_opts.json = true;
                else if (streq(argv[k], "--force"))
                    g_opts.force = true;
                else
                    sub_argv[sub_argc++] = argv[k];
            }
            sub_argv[sub_argc] = NULL;
            optind = 0; /* fully re-initialise getopt for the subcommand */
            return commands[i].fn(sub_argc, sub_argv);
        }
    }
    return fail(EXIT_USAGE, "unknown command '%s' (see qsdctl --help)", name);
}
