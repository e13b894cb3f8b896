/* SPDX-License-Identifier: Apache-2.0 */
/* cidata.c: see cidata.h. */
#include "cidata.h"
#include "qsd/base/proc.h"
#include "qsd/base/util.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#define TOOL_TIMEOUT_MS 30000

static const char *const NAMES[3] = {"user-data", "meta-data", "network-config"};

void cidata_free(struct cidata *c)
{
    if (!c)
        return;
    for (int i = 0; i < 3; i++)
        free(c->f[i].data);
    free(c);
}

/* Read dir/name: a regular file reached without leaving dir (Secrets and
 * ConfigMaps are symlinks into a ..data directory beside them). */
static int read_beneath(int dfd, const char *name, char **ret, size_t *ret_len)
{
    struct open_how how = {.flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY,
                           .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS};
    int fd = (int)syscall(SYS_openat2, dfd, name, &how, sizeof(how));
    if (fd < 0)
        return -errno;
    struct stat st;
    int r = 0;
    if (fstat(fd, &st) < 0)
        r = -errno;
    else if (!S_ISREG(st.st_mode))
        r = -EINVAL;
    else if (st.st_size > CIDATA_FILE_MAX)
        r = -EFBIG;
    if (r < 0) {
        close(fd);
        return r;
    }
    char *buf = xmalloc(CIDATA_FILE_MAX + 1);
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fd, buf + len, CIDATA_FILE_MAX + 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r = -errno;
            break;
        }
        if (n == 0)
            break;
        len += (size_t)n;
        if (len > CIDATA_FILE_MAX) {
            r = -EFBIG;
            break;
        }
    }
    close(fd);
    if (r < 0) {
        free(buf);
        return r;
    }
    *ret = buf;
    *ret_len = len;
    return 0;
}

int cidata_gather(const struct vm_spec *spec, const char *dir, struct cidata **ret,
                  char **ret_error)
{
    struct cidata *c = xcalloc(1, sizeof(*c));
    const char *inline_data[3] = {spec->cloud_init.user_data, spec->cloud_init.meta_data,
                                  spec->cloud_init.network_config};
    int dfd = -1;
    if (dir) {
        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0) {
            *ret_error = xasprintf("--cloud-init-dir %s: %s", dir, strerror(errno));
            cidata_free(c);
            return -errno;
        }
    }
    bool any = false;
    int r = 0;
    for (int i = 0; i < 3 && r >= 0; i++) {
        c->f[i].name = NAMES[i];
        char *data = NULL;
        size_t len = 0;
        if (dfd >= 0) {
            r = read_beneath(dfd, NAMES[i], &data, &len);
            if (r == -ENOENT) {
                r = 0;
            } else if (r < 0) {
                *ret_error = xasprintf("%s/%s: %s", dir, NAMES[i],
                                       r == -EFBIG    ? "larger than 1 MiB"
                                       : r == -EINVAL ? "not a regular file"
                                       : r == -EXDEV  ? "leads out of the directory"
                                                      : strerror(-r));
                break;
            }
        }
        if (data && inline_data[i]) {
            free(data);
            *ret_error = xasprintf("cloud-init %s is given both in the description and in %s: "
                                   "give it once", NAMES[i], dir);
            r = -EEXIST;
            break;
        }
        if (data) {
            c->f[i].data = data;
            c->f[i].len = len;
            c->f[i].from = dir;
            any = true;
        } else if (inline_data[i]) {
            c->f[i].data = xstrdup(inline_data[i]);
            c->f[i].len = strlen(inline_data[i]);
            c->f[i].from = "description";
            any = true;
        }
    }
    if (dfd >= 0)
        close(dfd);
    if (r < 0 || !any) {
        cidata_free(c);
        *ret = NULL;
        return r;
    }
    if (!c->f[1].data) {
        /* The VM name is [A-Za-z0-9._-]: plain YAML scalars. */
        c->f[1].data = xasprintf("instance-id: %s\nlocal-hostname: %s\n", spec->name, spec->name);
        c->f[1].len = strlen(c->f[1].data);
        c->f[1].from = "default";
    }
    *ret = c;
    return 0;
}

/* The tools' environment: ours, with mtools' drive check off and the C
 * locale (their messages are quoted in errors). */
static char **tool_env(void)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = xcalloc(n + 3, sizeof(char *));
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!startswith(environ[i], "MTOOLS_SKIP_CHECK=") && !startswith(environ[i], "LC_ALL="))
            env[k++] = environ[i];
    env[k++] = "MTOOLS_SKIP_CHECK=1";
    env[k++] = "LC_ALL=C";
    return env;
}

/* Run argv (no shell; proc.h), at most TOOL_TIMEOUT_MS. */
static int run_tool(char *const argv[], char **ret_error)
{
    char **env = tool_env();
    struct proc_result res = {0};
    int r = proc_run_env(argv, env, TOOL_TIMEOUT_MS, &res);
    free(env);
    if (r == -ETIMEDOUT) {
        *ret_error = xasprintf("%s did not finish within %d s", argv[0], TOOL_TIMEOUT_MS / 1000);
        return r;
    }
    if (r == -ENOENT) {
        *ret_error = xasprintf("%s not found (install dosfstools and mtools)", argv[0]);
        return -EIO;
    }
    if (r < 0) {
        *ret_error = xasprintf("cannot run %s: %s", argv[0], strerror(-r));
        return r;
    }
    if (res.exit_code != 0) {
        char last[512];
        proc_last_line(*res.err ? res.err : res.out, last, sizeof(last));
        *ret_error = xasprintf("%s failed: %s", argv[0], last);
        r = -EIO;
    }
    proc_result_clear(&res);
    return r;
}

int cidata_build(const struct cidata *c, const char *image_path, char **ret_error)
{
    _cleanup_free_ char *tmpl = xasprintf("%s.build.XXXXXX", image_path);
    if (!mkdtemp(tmpl)) {
        *ret_error = xasprintf("cannot create a directory beside %s: %s", image_path,
                               strerror(errno));
        return -errno;
    }
    int r = 0;
    size_t total = 0;
    char *paths[3] = {0};
    for (int i = 0; i < 3 && r >= 0; i++) {
        if (!c->f[i].data)
            continue;
        paths[i] = xasprintf("%s/%s", tmpl, c->f[i].name);
        r = write_file_atomic(paths[i], c->f[i].data, c->f[i].len, 0600);
        total += c->f[i].len;
    }
    _cleanup_free_ char *img = xasprintf("%s/cidata.img", tmpl);
    /* FAT12/16 with room to spare: 1 MiB + 1.25 x the files. */
    char kib[32];
    snprintf(kib, sizeof(kib), "%zu", (size_t)1024 + total / 1024 * 5 / 4 + 64);
    if (r < 0) {
        *ret_error = xasprintf("cannot write the cloud-init files: %s", strerror(-r));
    } else {
        char *mkfs[] = {"mkfs.vfat", "-n", "CIDATA", "-C", img, kib, NULL};
        r = run_tool(mkfs, ret_error);
    }
    if (r >= 0) {
        char *mcopy[8] = {"mcopy", "-i", img};
        int k = 3;
        for (int i = 0; i < 3; i++)
            if (paths[i])
                mcopy[k++] = paths[i];
        mcopy[k++] = "::";
        mcopy[k] = NULL;
        r = run_tool(mcopy, ret_error);
    }
    if (r >= 0 && (chmod(img, 0444) < 0 || rename(img, image_path) < 0)) {
        r = -errno;
        *ret_error = xasprintf("cannot move the image to %s: %s", image_path, strerror(errno));
    }
    for (int i = 0; i < 3; i++)
        free(paths[i]);
    rm_rf(tmpl);
    return r;
}
