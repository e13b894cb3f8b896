/* cidata.c: see cidata.h. */
#include "cidata.h"
#include "qsd/base/util.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

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

/* Run argv (no shell), output to out_path, at most TOOL_TIMEOUT_MS. */
static int run_tool(char *const argv[], const char *out_path, char **ret_error)
{
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (nul >= 0)
            dup2(nul, STDIN_FILENO);
        setenv("MTOOLS_SKIP_CHECK", "1", 1);
        setenv("LC_ALL", "C", 1);
        execvp(argv[0], argv);
        _exit(127);
    }
    uint64_t deadline = now_ms() + TOOL_TIMEOUT_MS;
    int status;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            break;
        if (w < 0 && errno != EINTR)
            return -errno;
        if (now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            *ret_error = xasprintf("%s did not finish within %d s", argv[0], TOOL_TIMEOUT_MS / 1000);
            return -ETIMEDOUT;
        }
        sleep_ms(10);
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    _cleanup_free_ char *out = NULL;
    size_t len = 0;
    read_file(out_path, 4096, &out, &len);
    char *nl;
    while (out && len && (out[len - 1] == '\n' || out[len - 1] == '\r'))
        out[--len] = 0;
    const char *last = out ? ((nl = strrchr(out, '\n')) ? nl + 1 : out) : "";
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
        *ret_error = xasprintf("%s not found (install dosfstools and mtools)", argv[0]);
    else
        *ret_error = xasprintf("%s failed: %s", argv[0], last);
    return -EIO;
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
    _cleanup_free_ char *out = xasprintf("%s/tool.out", tmpl);
    /* FAT12/16 with room to spare: 1 MiB + 1.25 x the files. */
    char kib[32];
    snprintf(kib, sizeof(kib), "%zu", (size_t)1024 + total / 1024 * 5 / 4 + 64);
    if (r < 0) {
        *ret_error = xasprintf("cannot write the cloud-init files: %s", strerror(-r));
    } else {
        char *mkfs[] = {"mkfs.vfat", "-n", "CIDATA", "-C", img, kib, NULL};
        r = run_tool(mkfs, out, ret_error);
    }
    if (r >= 0) {
        char *mcopy[8] = {"mcopy", "-i", img};
        int k = 3;
        for (int i = 0; i < 3; i++)
            if (paths[i])
                mcopy[k++] = paths[i];
        mcopy[k++] = "::";
        mcopy[k] = NULL;
        r = run_tool(mcopy, out, ret_error);
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
