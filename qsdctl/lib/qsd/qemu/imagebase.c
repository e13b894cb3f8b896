/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/imagebase.c: image bases: download, verify, probe, convert and
 * publish a base; a volume made from it.  See imagebase.h. */
#include "qsd/qemu/imagebase.h"
#include "qsd/qemu/qsdconf.h"
#include "qsd/base/confine.h"
#include <sys/random.h>
#include "qsd/base/log.h"
#include "qsd/base/proc.h"
#include "qsd/base/util.h"
#include "qsd/qemu/qemuimg.h"
#include "qsd/qemu/thin.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>

#define CONNECT_TIMEOUT_S "15"
#define STALL_BYTES_S "1024"   /* a transfer slower than this... */
#define STALL_S "60"           /* ...for this long is a failure (retried) */
#define PROGRESS_FIRST_MS 2000u  /* first progress line, then... */
#define PROGRESS_EVERY_MS 10000u  /* ...one every 10 s */
#define MAX_HOPS 5             /* redirects followed (each checked) */
#define SHA_TIMEOUT_MS (10u * 60u * 1000u)
#define CONVERT_TIMEOUT_MS (30u * 60u * 1000u)

/* ------------------------------------------------------------- checks */

const char *imagebase_url_problem(const char *url)
{
    if (!url || !*url)
        return "is empty";
    if (strlen(url) > IMAGEBASE_URL_MAX)
        return "is longer than 2048 bytes";
    const char *rest = startswith(url, "https://") ? url + 8
                       : startswith(url, "http://") ? url + 7
                                                     : NULL;
    if (!rest)
        return "is not an http:// or https:// URL";
    if (!*rest || *rest == '/')
        return "has no host";
    for (const char *c = url; *c; c++)
        if ((unsigned char)*c <= ' ' || (unsigned char)*c >= 0x7f)
            return "contains a space, a control or a non-ASCII character (percent-encode it)";
    return NULL;
}

const char *imagebase_digest_algo(const char *digest)
{
    size_t n = digest ? strlen(digest) : 0;
    return n == POOL_IMAGE_NAME_LEN ? "sha256" : n == POOL_IMAGE_NAME_LEN_512 ? "sha512" : NULL;
}

const char *imagebase_digest_problem(const char *algo, const char *digest)
{
    bool is512 = streq(algo, "sha512");
    size_t want = is512 ? POOL_IMAGE_NAME_LEN_512 : POOL_IMAGE_NAME_LEN;
    if (!digest || strlen(digest) != want)
        return is512 ? "is not 128 hexadecimal digits (a SHA-512)"
                     : "is not 64 hexadecimal digits (a SHA-256)";
    if (!pool_image_name_valid(digest))
        return is512 ? "is not 128 lowercase hexadecimal digits"
                     : "is not 64 lowercase hexadecimal digits";
    return NULL;
}

/* ------------------------------------------------------------ helpers */

static int fsync_fd_path(int dfd, const char *name)
{
    _cleanup_close_ int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 || fsync(fd) < 0)
        return -errno;
    return 0;
}


/* ----------------------------------------------------------- download */

struct progress {
    int fd;               /* the .part file */
    const char *dir;      /* the pool's images/ (free space) */
    uint64_t max;         /* bytes the download may take: max_bytes, or... */
    bool space_bound;     /* ...what the pool has above keep_free (smaller) */
    uint64_t keep_free, next_log, start;
    const char *url;      /* redacted */
};

static uint64_t pool_free(const char *dir)
{
    struct statvfs sv;
    return statvfs(dir, &sv) == 0 ? (uint64_t)sv.f_bavail * sv.f_frsize : UINT64_MAX;
}

static int too_big(const struct progress *pg, char **ret_msg)
{
    char b1[32], b2[32];
    if (!pg->space_bound) {
        *ret_msg = xasprintf("%s is larger than %" PRIu64 " bytes", pg->url, pg->max);
        return -EFBIG;
    }
    *ret_msg = xasprintf("%s does not fit in the pool: %s may be downloaded without entering "
                         "the %s kept free (--capacity-reserve)", pg->url,
                         format_size(pg->max, b1, sizeof(b1)),
                         format_size(pg->keep_free, b2, sizeof(b2)));
    return -ENOSPC;
}

static int on_tick(void *arg)
{
    struct progress *pg = arg;
    struct stat st;
    if (fstat(pg->fd, &st) < 0)
        return 0;
    if ((uint64_t)st.st_size > pg->max)
        return pg->space_bound ? -ENOSPC : -EFBIG;
    /* Others write to the pool meanwhile: stop before the reserve. */
    if (pool_free(pg->dir) < pg->keep_free)
        return -ENOSPC;
    if (now_ms() >= pg->next_log) {
        pg->next_log = now_ms() + PROGRESS_EVERY_MS;
        char b[32];
        log_info("image", "download progress", "url=%s downloaded=%s seconds=%" PRIu64, pg->url,
                 format_size((uint64_t)st.st_size, b, sizeof(b)), (now_ms() - pg->start) / 1000);
    }
    return 0;
}

/* The outcome of a curl run (exit rc, HTTP code): see fetch_hop. */
static int curl_status(int rc, int code, const char *why, const char *shown,
                       const struct progress *pg, char **ret_msg)
{
    switch (rc) {
    case 0:
        return 0;
    case 22: /* --fail: HTTP >= 400 */
        if (code == 404 || code == 410) {
            *ret_msg = xasprintf("%s does not exist (HTTP %d)", shown, code);
            return -ENOENT;
        }
        if (code == 408 || code == 429 || code >= 500) {
            *ret_msg = xasprintf("the server of %s failed (HTTP %d)", shown, code);
            return 1;
        }
        *ret_msg = xasprintf("the server refuses %s (HTTP %d)", shown, code);
        return -EACCES;
    case 63:          /* --max-filesize */
    case 128 + SIGXFSZ: /* RLIMIT_FSIZE */
        return too_big(pg, ret_msg);
    case 33: /* no byte ranges: the partial file cannot be resumed */
    case 36:
        *ret_msg = xasprintf("cannot resume %s: %s", shown, why);
        return 2;
    case 1: /* unsupported protocol */
    case 3: /* malformed URL */
        *ret_msg = xasprintf("curl refuses %s: %s", shown, why);
        return -EINVAL;
    case 51: /* TLS: peer certificate */
    case 58:
    case 60:
    case 77:
    case 83:
        *ret_msg = xasprintf("cannot verify the server of %s: %s", shown, why);
        return -EACCES;
    default: /* resolving, connecting, timeouts, cut transfers... */
        *ret_msg = xasprintf("cannot download %s: %s (curl exit %d)", shown, why, rc);
        return 1;
    }
}

/* One curl request of url into the .part file (resuming what is there), to
 * the address fetchaddr_resolve pinned, following no redirect.  Returns 0, 3
 * (a redirect: *ret_next is where), a negative errno (final), or 1
 * (transient: retry) / 2 (restart from 0). */
static int fetch_hop(const struct imagebase_fetch *f, const char *url, const char *part,
                     struct progress *pg, uint64_t remaining_ms, char **ret_next, char **ret_msg)
{
    _cleanup_free_ char *shown = imagebase_url_redact(url), *resolve = NULL, *addr = NULL;
    int r = fetchaddr_resolve(f->allow, f->n_allow, url, shown, &resolve, &addr, ret_msg);
    if (r < 0)
        return r == -ECONNREFUSED ? 1 : r;
    struct stat st0;
    if (fstat(pg->fd, &st0) < 0)
        return -errno;
    char maxs[32], maxt[32], fsize[48];
    snprintf(maxs, sizeof(maxs), "%" PRIu64, pg->max);
    snprintf(maxt, sizeof(maxt), "%" PRIu64, remaining_ms / 1000 + 1);
    /* The kernel's bound on the file curl writes (SIGXFSZ past it). */
    snprintf(fsize, sizeof(fsize), "--fsize=%" PRIu64 ":%" PRIu64, pg->max + 1, pg->max + 1);
    char *argv[] = {"prlimit", fsize, "--", "curl", "--silent", "--show-error", "--fail",
                    "--noproxy", "*", "--max-redirs", "0", "--proto", "=http,https", "--proto-redir",
                    "=http,https", "--connect-timeout", CONNECT_TIMEOUT_S,
                    "--speed-limit", STALL_BYTES_S, "--speed-time", STALL_S, "--max-time", maxt,
                    "--max-filesize", maxs, "--write-out",
                    "%{http_code} %{remote_ip} %{redirect_url}", "--continue-at", "-",
                    "--output", (char *)part, "--resolve", resolve, "--", (char *)url, NULL};
    if (!resolve) { /* an address in the URL: nothing to pin */
        size_t n = ARRAY_SIZE(argv);
        argv[n - 5] = "--";
        argv[n - 4] = (char *)url;
        argv[n - 3] = NULL;
    }
    struct proc_result res = {0};
    r = proc_run_watch(argv, remaining_ms + 5000, on_tick, pg, &res);
    if (r == -EFBIG || r == -ENOSPC) {
        proc_result_clear(&res);
        return too_big(pg, ret_msg);
    }
    if (r == -ETIMEDOUT) {
        *ret_msg = xasprintf("downloading %s did not finish in time", shown);
        return -ECONNREFUSED;
    }
    if (r < 0) {
        *ret_msg = xasprintf("cannot run curl: %s", strerror(-r));
        return r;
    }
    int code = 0;
    char ip[INET6_ADDRSTRLEN + 1] = "", *next = NULL;
    {
        int off = 0;
        if (sscanf(res.out, "%d %46s %n", &code, ip, &off) >= 1 && off > 0 && res.out[off])
            next = xstrdup(res.out + off);
    }
    _cleanup_free_ char *next_url = next;
    char line[512];
    const char *why = proc_last_line(res.err, line, sizeof(line));
    int rc = res.exit_code;
    proc_result_clear(&res);
    if (*ip && !streq(ip, addr)) {
        /* curl went elsewhere than the address we checked (a proxy?). */
        *ret_msg = xasprintf("curl connected to another address than the one checked for %s",
                             shown);
        return -EADDRNOTAVAIL;
    }
    if (rc == 0 && code >= 300 && code < 400) {
        /* A redirect's own body is not the image. */
        if (ftruncate(pg->fd, st0.st_size) < 0)
            return -errno;
        if (!next_url || imagebase_url_problem(next_url)) {
            *ret_msg = xasprintf("%s redirects (HTTP %d) to no http(s) URL", shown, code);
            return -EINVAL;
        }
        *ret_next = TAKE_PTR(next_url);
        return 3;
    }
    return curl_status(rc, code, why, shown, pg, ret_msg);
}

/* One attempt: the URL and its redirects (each hop checked). */
static int download_once(const struct imagebase_fetch *f, const char *part, struct progress *pg,
                         uint64_t deadline, char **ret_msg)
{
    _cleanup_free_ char *url = xstrdup(f->url);
    for (unsigned hop = 0; hop <= MAX_HOPS; hop++) {
        free(*ret_msg);
        *ret_msg = NULL;
        uint64_t now = now_ms();
        if (now >= deadline)
            return 1;
        char *next = NULL;
        int r = fetch_hop(f, url, part, pg, deadline - now, &next, ret_msg);
        if (r < 0 && hop > 0 && *ret_msg) { /* say where the refused URL came from */
            char *m = *ret_msg;
            *ret_msg = xasprintf("%s redirects: %s", pg->url, m);
            free(m);
        }
        if (r != 3)
            return r;
        _cleanup_free_ char *to = imagebase_url_redact(next);
        log_info("image", "download redirected", "url=%s to=%s hop=%u", pg->url, to, hop + 1);
        free(url);
        url = next;
    }
    *ret_msg = xasprintf("%s redirects more than %d times", pg->url, MAX_HOPS);
    return -EINVAL;
}

static int download(const struct imagebase_fetch *f, const char *dir, int fd, const char *part,
                    const char *shown, char **ret_msg)
{
    uint64_t deadline = now_ms() + f->timeout_ms;
    struct progress pg = {.fd = fd, .dir = dir, .max = f->max_bytes ? f->max_bytes
                                                                    : IMAGEBASE_MAX_BYTES,
                          .keep_free = f->keep_free, .url = shown, .start = now_ms()};
    /* What the pool can give without entering its reserve, before the
     * transfer; on_tick checks again during it. */
    uint64_t avail = pool_free(dir);
    avail = avail > f->keep_free ? avail - f->keep_free : 0;
    if (avail < pg.max) {
        pg.max = avail;
        pg.space_bound = true;
    }
    if (pg.max == 0)
        return too_big(&pg, ret_msg);
    pg.next_log = pg.start + PROGRESS_FIRST_MS;
    unsigned attempts = f->attempts ? f->attempts : 1;
    int r = 1;
    for (unsigned i = 0; i < attempts && r > 0; i++) {
        if (i > 0) {
            unsigned wait = 1000u << (i - 1 < 4 ? i - 1 : 4);
            if (now_ms() + wait >= deadline)
                break;
            log_warn("image", "download failed, retrying", "url=%s attempt=%u error=\"%s\"",
                     shown, i + 1, *ret_msg);
            sleep_ms(wait);
        }
        if (now_ms() >= deadline)
            break;
        r = download_once(f, part, &pg, deadline, ret_msg);
        if (r == 2 && ftruncate(fd, 0) < 0)
            r = -errno;
    }
    if (r > 0) {
        if (!*ret_msg)
            *ret_msg = xasprintf("downloading %s did not finish in time", shown);
        return -ECONNREFUSED;
    }
    struct stat st;
    if (r == 0 && fstat(fd, &st) == 0 && (uint64_t)st.st_size > pg.max) {
        free(*ret_msg);
        return too_big(&pg, ret_msg); /* no Content-Length, done between two ticks */
    }
    return r;
}

static int check_sha(const struct imagebase_fetch *f, const char *part, const char *shown,
                     char **ret_msg)
{
    const char *algo = imagebase_digest_algo(f->digest);
    size_t len = strlen(f->digest);
    _cleanup_free_ char *tool = xasprintf("%ssum", algo);
    char *argv[] = {tool, "--", (char *)part, NULL};
    struct proc_result res = {0};
    int r = proc_run(argv, SHA_TIMEOUT_MS, &res);
    if (r < 0 || res.exit_code != 0 || strlen(res.out) < len) {
        *ret_msg = xasprintf("cannot compute the %s of the download: %s", algo,
                             r < 0 ? strerror(-r) : res.err);
        proc_result_clear(&res);
        return r < 0 ? r : -EIO;
    }
    res.out[len] = '\0';
    if (!streq(res.out, f->digest)) {
        /* The error goes to whoever made the request (an event of the
         * claim): nothing of the content, not even its hash (a hash of
         * what a refused address served was a leak: docs/security.md);
         * the operator's log has it, and the caller gets it in
         * f->ret_got for that log. */
        log_warn("image", "checksum mismatch", "url=%s algo=%s expected=%s got=%s", shown, algo,
                 f->digest, res.out);
        *ret_msg = xasprintf("the content at %s does not have %s %s (its own is in the node "
                             "plugin's log: msg=\"checksum mismatch\")", shown, algo, f->digest);
        if (f->ret_got)
            memcpy(f->ret_got, res.out, len + 1);
        r = -EBADMSG;
    }
    proc_result_clear(&res);
    return r;
}

/* ------------------------------------------------------------- fetch */

/* Open and lock images/.<sha>.part, the fetch's lock; -EBUSY if held. */
static int part_open(int dfd, const char *name, int *ret_fd)
{
    for (int tries = 0; tries < 8; tries++) {
        _cleanup_close_ int fd = openat(dfd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0)
            return -errno;
        if (flock(fd, LOCK_EX | LOCK_NB) < 0)
            return errno == EWOULDBLOCK ? -EBUSY : -errno;
        /* The garbage collection may have removed the name between open
         * and flock: the lock must be on the file the name is. */
        struct stat a, b;
        if (fstat(fd, &a) == 0 && fstatat(dfd, name, &b, AT_SYMLINK_NOFOLLOW) == 0 &&
            a.st_ino == b.st_ino && a.st_dev == b.st_dev) {
            *ret_fd = TAKE_FD(fd);
            return 0;
        }
    }
    return -EAGAIN;
}

/* Publish the converted file tmp (in images/) as the base of sha. */
static int publish(const struct pool *p, int dfd, const char *tmp, const char *sha, char **ret_msg)
{
    _cleanup_close_ int lock = -1;
    int r = pool_lock(p, POOL_LOCK_TIMEOUT_MS, &lock, ret_msg);
    if (r < 0)
        return r;
    _cleanup_free_ char *path = xasprintf("%s/%s", p->images, tmp);
    char layer[LAYER_NAME_LEN + 1];
    if ((r = pool_link_layer(p, path, layer, ret_msg)) < 0)
        return r;
    _cleanup_free_ char *lp = xasprintf("%s/%s.qcow2", p->layers, layer);
    qsd_freeze_layer(lp);
    _cleanup_free_ char *ref = layer_ref(layer);
    _cleanup_free_ char *link = xasprintf(".%s.link", sha);
    unlinkat(dfd, link, 0);
    if (symlinkat(ref, dfd, link) < 0 || renameat(dfd, link, dfd, sha) < 0) {
        r = -errno;
        unlinkat(dfd, link, 0);
        unlink(lp);
        *ret_msg = xasprintf("cannot name the base of %s in %s: %s", sha, p->images, strerror(-r));
        return r;
    }
    fsync(dfd);
    unlinkat(dfd, tmp, 0); /* the layer name stays */
    return 0;
}

/* qemu-img convert of the download, confined (confine.h) as OpenStack runs
 * qemu-img on untrusted images: uid IMAGEBASE_UID, no capabilities,
 * no_new_privs, the IMAGE seccomp profile, 1 GiB of address space, a CPU
 * bound, and a mount namespace in which the host is read-only, the pool
 * and homes hidden, and only a work directory of its own (images/.work-*)
 * writable, holding a second name of the download (src) and its output
 * (out). */
static int run_convert(const struct pool *p, const char *wpath, const char *format,
                       const char *src, const char *out, char **ret_msg)
{
    json_t *js = json_pack("{s:s, s:{s:s, s:s}}", "driver", format, "file", "driver", "file",
                           "filename", src);
    if (streq(format, "qcow2"))
        json_object_set_new(js, "backing", json_null());
    char *jstr = json_dumps(js, JSON_COMPACT);
    json_decref(js);
    _cleanup_free_ char *spec = xasprintf("json:%s", jstr);
    free(jstr);
    const char *const writable[] = {wpath, NULL};
    const char *const hidden[] = {p->root, "/root", "/home", "/tmp", "/var/tmp", "/dev/shm",
                                  "/run", "/var/lib/kubelet", NULL};
    struct confine c = CONFINE_INIT;
    c.uid = IMAGEBASE_UID;
    c.gid = IMAGEBASE_UID;
    c.mount_ns = true;
    c.writable = writable;
    c.hidden = hidden;
    c.rlimit_as = IMAGEBASE_QEMU_IMG_AS;
    c.rlimit_cpu = IMAGEBASE_QEMU_IMG_CPU_S;
    c.rlimit_nofile = 256;
    c.profile = CONFINE_PROFILE_IMAGE;
    char *argv[] = {"qemu-img", "convert", "-q", "-O", "qcow2", spec, (char *)out, NULL};
    return qemu_img_run_confined(argv, CONVERT_TIMEOUT_MS, &c, NULL, ret_msg);
}

/* The work directory around run_convert; the output is root's again before
 * it is moved to conv. */
static int convert_confined(const struct pool *p, int dfd, const char *part_path,
                            const char *format, const char *conv, char **ret_msg)
{
    uint64_t rnd = 0;
    (void)!getrandom(&rnd, sizeof(rnd), 0);
    char work[64];
    snprintf(work, sizeof(work), ".work-%016llx", (unsigned long long)rnd);
    _cleanup_free_ char *wpath = xasprintf("%s/%s", p->images, work);
    _cleanup_free_ char *src = xasprintf("%s/src", wpath), *out = xasprintf("%s/out", wpath);
    int r = 0;
    if (mkdirat(dfd, work, 0700) < 0 || chown(wpath, IMAGEBASE_UID, IMAGEBASE_UID) < 0 ||
        link(part_path, src) < 0 || chown(src, IMAGEBASE_UID, IMAGEBASE_UID) < 0 ||
        chmod(src, 0400) < 0) {
        r = -errno;
        *ret_msg = xasprintf("cannot prepare %s for qemu-img: %s", wpath, strerror(-r));
    } else if ((r = run_convert(p, wpath, format, src, out, ret_msg)) == 0 &&
               (chown(out, 0, 0) < 0 || chmod(out, 0600) < 0 ||
                renameat(AT_FDCWD, out, dfd, conv) < 0)) {
        r = -errno;
        *ret_msg = xasprintf("cannot take %s back from qemu-img: %s", out, strerror(-r));
    }
    unlink(src);
    unlink(out);
    rmdir(wpath);
    return r;
}

/* Verify, probe, convert and publish the download (fd, at part_path). */
static int fetch_finish(const struct pool *p, const struct imagebase_fetch *f, int dfd, int fd,
                        const char *part_path, const char *conv, const char *shown,
                        char **ret_msg)
{
    int r = check_sha(f, part_path, shown, ret_msg);
    if (r < 0)
        return r;
    struct stat st;
    uint8_t head[IMAGE_PROBE_LEN];
    ssize_t n = pread(fd, head, sizeof(head), 0);
    if (n < 0 || fstat(fd, &st) < 0) {
        *ret_msg = xasprintf("cannot read %s: %s", part_path, strerror(errno));
        return -EIO;
    }
    struct image_probe pr;
    const char *why = "empty";
    if (n == 0 || image_probe(head, (size_t)n, &pr, &why) < 0) {
        *ret_msg = xasprintf("the image at %s is %s", shown, why);
        return -EMEDIUMTYPE;
    }
    uint64_t vsize = streq(pr.format, "raw") ? (uint64_t)st.st_size : pr.size;
    struct statvfs sv;
    if (statvfs(p->images, &sv) == 0 &&
        (uint64_t)sv.f_bavail * sv.f_frsize < vsize + f->keep_free) {
        *ret_msg = xasprintf("the pool has %" PRIu64 " bytes free: not room for the image's "
                             "virtual size (%" PRIu64 " bytes) above the %" PRIu64
                             " bytes kept free", (uint64_t)sv.f_bavail * sv.f_frsize, vsize,
                             f->keep_free);
        return -ENOSPC;
    }
    /* The format is ours, and a qcow2's backing is null: QEMU opens no
     * other file whatever the header says (image_probe refused those that
     * name one anyway). */
    const char *spec = pr.format;
    _cleanup_free_ char *conv_path = xasprintf("%s/%s", p->images, conv);
    r = convert_confined(p, dfd, part_path, spec, conv, ret_msg);
    if (r == -EIO) {
        /* qemu-img refused the content (or the pool is full) */
        char *m = *ret_msg;
        bool full = strstr(m, "No space left") != NULL;
        *ret_msg = xasprintf("the image at %s cannot be converted: %s", shown, m);
        free(m);
        return full ? -ENOSPC : -EMEDIUMTYPE;
    }
    if (r < 0)
        return r;
    if ((r = fsync_fd_path(dfd, conv)) < 0) {
        *ret_msg = xasprintf("cannot write %s: %s", conv_path, strerror(-r));
        return r;
    }
    if ((r = publish(p, dfd, conv, f->digest, ret_msg)) < 0)
        return r;
    log_info("image", "image base ready", "url=%s digest=%s format=%s bytes=%" PRIu64
             " virtual_size=%" PRIu64, shown, f->digest, pr.format, (uint64_t)st.st_size, vsize);
    return 0;
}

int imagebase_fetch(const struct pool *p, const struct imagebase_fetch *f, char **ret_msg)
{
    _cleanup_close_ int dfd = open(p->images, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (dfd < 0) {
        *ret_msg = xasprintf("cannot open %s: %s", p->images, strerror(errno));
        return -errno;
    }
    _cleanup_free_ char *part = xasprintf(".%s.part", f->digest);
    _cleanup_free_ char *conv = xasprintf(".%s.part.qcow2", f->digest);
    _cleanup_free_ char *part_path = xasprintf("%s/%s", p->images, part);
    _cleanup_free_ char *shown = imagebase_url_redact(f->url);
    _cleanup_close_ int fd = -1;
    int r = part_open(dfd, part, &fd);
    if (r < 0) {
        *ret_msg = r == -EBUSY ? xasprintf("the image %s is being downloaded by another operation",
                                           shown)
                               : xasprintf("cannot create %s: %s", part_path, strerror(-r));
        return r;
    }
    unlinkat(dfd, conv, 0);
    uint64_t t0 = now_ms();
    log_info("image", "download started", "url=%s digest=%s", shown, f->digest);
    if (ftruncate(fd, 0) < 0) { /* a killed fetch's leftovers */
        r = -errno;
        *ret_msg = xasprintf("cannot truncate %s: %s", part_path, strerror(-r));
    } else if ((r = download(f, p->images, fd, part_path, shown, ret_msg)) == 0) {
        log_info("image", "download finished", "url=%s seconds=%.1f", shown,
                 (double)(now_ms() - t0) / 1000);
        r = fetch_finish(p, f, dfd, fd, part_path, conv, shown, ret_msg);
    }
    unlinkat(dfd, conv, 0);
    unlinkat(dfd, part, 0);
    return r;
}

/* ------------------------------------------------------------ volumes */

int imagebase_create_volume(const struct pool *p, const char *vol, const char *sha,
                            uint64_t size, char **ret_msg)
{
    if (pool_find_volume(p, vol, NULL, NULL) == 0) {
        *ret_msg = xasprintf("volume %s already exists", vol);
        return -EEXIST;
    }
    _cleanup_close_ int dfd = open(p->images, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (dfd < 0) {
        *ret_msg = xasprintf("cannot open %s: %s", p->images, strerror(errno));
        return -errno;
    }
    _cleanup_close_ int lock = -1;
    int r = pool_lock(p, POOL_LOCK_TIMEOUT_MS, &lock, ret_msg);
    if (r < 0)
        return r;
    char layer[LAYER_NAME_LEN + 1];
    if (pool_image_layer(dfd, sha, layer, NULL) < 0 || !pool_layer_exists(p, layer)) {
        *ret_msg = xasprintf("no base of image %s in the pool", sha);
        return -ENOLINK;
    }
    /* Used now: the garbage collection keeps it POOL_IMAGE_KEEP_S more. */
    utimensat(dfd, sha, NULL, AT_SYMLINK_NOFOLLOW);
    _cleanup_free_ char *lp = xasprintf("%s/%s.qcow2", p->layers, layer);
    uint64_t bsize;
    if ((r = image_header(lp, NULL, &bsize, ret_msg)) < 0)
        return r;
    if (size < bsize) {
        *ret_msg = xasprintf("the image is %" PRIu64 " bytes, larger than the requested %" PRIu64
                             " bytes", bsize, size);
        return -ERANGE;
    }
    return thin_create_locked(p, vol, layer, size, ret_msg);
}
