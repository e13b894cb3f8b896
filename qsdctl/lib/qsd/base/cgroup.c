/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/cgroup.c: see cgroup.h. */
#include "qsd/base/cgroup.h"
#include "qsd/base/util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

static int write_str(const char *dir, const char *file, const char *val)
{
    _cleanup_free_ char *p = xasprintf("%s/%s", dir, file);
    _cleanup_close_ int fd = open(p, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    return write_all(fd, val, strlen(val));
}

static bool has_file(const char *dir, const char *file)
{
    _cleanup_free_ char *p = xasprintf("%s/%s", dir, file);
    return access(p, F_OK) == 0;
}

/* Create path under hierarchy h level by level; a new cpuset level
 * inherits its parent's cpus and mems (v1 refuses tasks otherwise). */
static int make_group(const char *h, const char *path, char **ret_dir)
{
    _cleanup_free_ char *dir = xstrdup(h), *p = xstrdup(path);
    char *save = NULL;
    for (char *c = strtok_r(p, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
        _cleanup_free_ char *parent = TAKE_PTR(dir);
        dir = xasprintf("%s/%s", parent, c);
        /* cgroup v2: the controllers a child's limits need, delegated by
         * its parent (refused while the parent holds processes itself: then
         * the limits below are simply absent). */
        if (has_file(parent, "cgroup.subtree_control"))
            for (const char *const *ctl = (const char *const[]){"+memory", "+pids", "+cpu", NULL};
                 *ctl; ctl++)
                (void)write_str(parent, "cgroup.subtree_control", *ctl);
        if (mkdir(dir, 0755) < 0 && errno != EEXIST)
            return -errno;
        for (const char *const *f = (const char *const[]){"cpuset.cpus", "cpuset.mems", NULL}; *f;
             f++) {
            _cleanup_free_ char *cur = NULL, *up = NULL, *fp = xasprintf("%s/%s", dir, *f),
                                *pp = xasprintf("%s/%s", parent, *f);
            if (read_file(fp, 4096, &cur, NULL) < 0 || cur[strspn(cur, " \n")] != '\0')
                continue; /* not cpuset, or already set */
            if (read_file(pp, 4096, &up, NULL) == 0)
                (void)write_str(dir, *f, up);
        }
    }
    *ret_dir = TAKE_PTR(dir);
    return 0;
}

/* Every hierarchy under root (one for v2 alone); to free with its strings. */
static int hierarchies(const char *root, char ***ret, size_t *ret_n, char **ret_msg)
{
    char **hier = NULL;
    size_t nh = 0;
    if (has_file(root, "cgroup.controllers")) { /* v2 alone */
        hier = xcalloc(1, sizeof(*hier));
        hier[nh++] = xstrdup(root);
    } else {
        DIR *d = opendir(root);
        if (!d) {
            *ret_msg = xasprintf("cannot list cgroup hierarchies in %s: %s", root, strerror(errno));
            return -errno;
        }
        struct dirent *de;
        while ((de = readdir(d))) {
            if (de->d_name[0] == '.')
                continue;
            _cleanup_free_ char *h = xasprintf("%s/%s", root, de->d_name);
            struct stat st;
            /* cpu -> cpu,cpuacct style links name a hierarchy twice */
            if (lstat(h, &st) < 0 || !S_ISDIR(st.st_mode) || !has_file(h, "cgroup.procs"))
                continue;
            hier = xrealloc(hier, (nh + 1) * sizeof(*hier));
            hier[nh++] = TAKE_PTR(h);
        }
        closedir(d);
    }
    *ret = hier;
    *ret_n = nh;
    return 0;
}

int qsd_cgroup_open(const char *root, const char *path, unsigned cpu_weight, uint64_t memory_max,
                    uint64_t pids_max, struct qsd_cgroup *ret, char **ret_msg)
{
    struct qsd_cgroup cg = {0};
    char **hier = NULL;
    size_t nh = 0;
    int r = hierarchies(root, &hier, &nh, ret_msg);
    if (r < 0)
        return r;
    for (size_t i = 0; i < nh && r == 0; i++) {
        _cleanup_free_ char *dir = NULL;
        if ((r = make_group(hier[i], path, &dir)) < 0) {
            *ret_msg = xasprintf("cannot create cgroup %s in %s: %s", path, hier[i], strerror(-r));
            break;
        }
        char val[32];
        if (cpu_weight && has_file(dir, "cpu.weight")) {
            snprintf(val, sizeof(val), "%u", cpu_weight);
            r = write_str(dir, "cpu.weight", val);
        } else if (cpu_weight && has_file(dir, "cpu.shares")) {
            snprintf(val, sizeof(val), "%llu",
                     (unsigned long long)MAX(2u, (uint64_t)cpu_weight * 1024 / 100));
            r = write_str(dir, "cpu.shares", val);
        }
        if (r == 0 && memory_max && has_file(dir, "memory.max")) {
            snprintf(val, sizeof(val), "%llu", (unsigned long long)memory_max);
            r = write_str(dir, "memory.max", val);
        } else if (r == 0 && memory_max && has_file(dir, "memory.limit_in_bytes")) {
            snprintf(val, sizeof(val), "%llu", (unsigned long long)memory_max);
            r = write_str(dir, "memory.limit_in_bytes", val);
        }
        if (r == 0 && pids_max && has_file(dir, "pids.max")) {
            snprintf(val, sizeof(val), "%llu", (unsigned long long)pids_max);
            r = write_str(dir, "pids.max", val);
        }
        if (r < 0) {
            *ret_msg = xasprintf("cannot configure cgroup %s: %s", dir, strerror(-r));
            break;
        }
        _cleanup_free_ char *procs = xasprintf("%s/cgroup.procs", dir);
        int fd = open(procs, O_WRONLY | O_CLOEXEC);
        if (fd < 0) {
            r = -errno;
            *ret_msg = xasprintf("cannot open %s: %s", procs, strerror(-r));
            break;
        }
        cg.fds = xrealloc(cg.fds, (cg.n + 1) * sizeof(int));
        cg.fds[cg.n++] = fd;
    }
    for (size_t i = 0; i < nh; i++)
        free(hier[i]);
    free(hier);
    if (r == 0 && cg.n == 0) {
        r = -ENOENT;
        *ret_msg = xasprintf("no cgroup hierarchy found under %s", root);
    }
    if (r < 0) {
        qsd_cgroup_close(&cg);
        return r;
    }
    *ret = cg;
    return 0;
}

int qsd_cgroup_remove(const char *root, const char *path)
{
    char **hier = NULL;
    size_t nh = 0;
    _cleanup_free_ char *msg = NULL;
    int r = hierarchies(root, &hier, &nh, &msg);
    if (r < 0)
        return r;
    for (size_t i = 0; i < nh; i++) {
        _cleanup_free_ char *dir = xasprintf("%s%s", hier[i], path);
        if (rmdir(dir) < 0 && errno != ENOENT && r == 0)
            r = -errno;
        free(hier[i]);
    }
    free(hier);
    return r;
}

void qsd_cgroup_close(struct qsd_cgroup *cg)
{
    for (size_t i = 0; i < cg->n; i++)
        close(cg->fds[i]);
    free(cg->fds);
    cg->fds = NULL;
    cg->n = 0;
}

char *qsd_cgroup_of(int pid)
{
    _cleanup_free_ char *p = xasprintf("/proc/%d/cgroup", pid), *data = NULL;
    if (read_file(p, 1 << 16, &data, NULL) < 0)
        return NULL;
    char *v2 = NULL;
    for (char *save = NULL, *line = strtok_r(data, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = '\0';
        if (strstr(c1 + 1, "memory"))
            return xstrdup(c2 + 1);
        if (!c1[1] && !v2)
            v2 = c2 + 1;
    }
    return v2 ? xstrdup(v2) : NULL;
}
