/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/qsdrun.c: a volume's QSD runtime on disk and in /proc: the run
 * directories, the state file, the exports' metadata, the scan that finds
 * running QSDs (adoption, orphans).  See qsdrun.h. */
#include "qsd/qemu/qsdrun.h"
#include "qsd/base/fsat.h"
#include "qsd/base/log.h"
#include "qsd/base/proc.h"
#include "qsd/base/util.h"
#include "qsd/qemu/qsdconf.h"
#include "qsd/qemu/rbdsrc.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <unistd.h>

/* --------------------------------------------------------- state file */

int qsd_state_write(const struct qsd_paths *p, const char *volume, const struct qsd_opts *o,
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
    _cleanup_free_ char *esc = qsd_opt_escape(qmp_path);
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
    _cleanup_free_ char *esc = qsd_opt_escape(run_dir);
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
    struct qsd_found *f;
};

static void find_one(pid_t pid, uint64_t st, const char *volume, void *arg)
{
    struct find *fd = arg;
    struct qsd_found *f = fd->f;
    if (!streq(volume, fd->volume))
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

void qsd_find_units(const char *run_dir, const char *volume, struct qsd_found *ret)
{
    *ret = (struct qsd_found){0};
    struct find fd = {volume, ret};
    scan_qsds(run_dir, find_one, &fd);
}

void qsd_found_clear(struct qsd_found *f)
{
    free(f->extra);
    *f = (struct qsd_found){0};
}

size_t qsd_orphan_volumes(const char *run_dir,
                          bool (*keep)(const char *volume, pid_t pid, void *arg), void *arg,
                          char ***ret_vols)
{
    struct orphans o = {keep, arg, NULL, 0};
    scan_qsds(run_dir, collect_orphan, &o);
    *ret_vols = o.vols;
    return o.n;
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
int qsd_each_export_dir(const struct qsd_paths *p, const char *volume, bool read_only,
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

int qsd_export_unlink(const struct qsd_paths *p, const char *volume, bool read_only,
                      const char *const *names)
{
    return qsd_each_export_dir(p, volume, read_only, unlink_export_files, (void *)names);
}

int qsd_runtime_prepare(const char *run_dir, const char *volume, const struct qsd_opts *o)
{
    int r = mkdir_p(run_dir, 0711); /* configuration: trusted */
    if (r < 0)
        return r;
    _cleanup_close_ int run = -1, ctl = -1, vol = -1;
    if ((r = run_dir_open(run_dir, &run)) < 0 ||
        (r = fsat_mkdirs(run, "ctl", 0700, &ctl)) < 0 ||
        (r = fsat_mkdirs(ctl, volume, 0700, &vol)) < 0 ||
        (r = fsat_chown_mode(ctl, volume, -1, 0700)) < 0)
        return r;
    if (o->rbd) {
        _cleanup_free_ char *conf = qsd_rbd_conf(o->rbd);
        if ((r = fsat_write_replace(vol, "rbd.conf", conf, strlen(conf), 0600, -1)) < 0)
            return r;
    }
    for (int ro = 0; ro <= (o->read_only ? 0 : 1); ro++) {
        _cleanup_close_ int parent = -1;
        if ((r = fsat_mkdirs(run, ro ? "exports-ro" : "exports", 0711, &parent)) < 0 ||
            (r = fsat_mkdirs(parent, volume, 0750, NULL)) < 0 ||
            (r = clear_export_dir(parent, volume)) < 0 ||
            (r = fsat_chown_mode(parent, volume, o->socket_gid, 0750)) < 0)
            return r;
    }
    return 0;
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
    /* Runtime directory, not synced (qsd_state_write). */
    return fsat_write_replace(dfd, "volume.json", s, strlen(s), gid >= 0 ? 0640 : 0600, gid);
}

int qsd_meta_write(const struct qsd_paths *p, const char *volume, const struct qsd_opts *o,
                   uint64_t size)
{
    struct meta m = {volume, o, size};
    return qsd_each_export_dir(p, volume, o->read_only, meta_write_at, &m);
}
