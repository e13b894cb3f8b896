/* SPDX-License-Identifier: Apache-2.0 */
/* volumes.c: see volumes.h. */
#include "volumes.h"
#include "qsd/base/names.h"
#include "qsd/base/probe.h"
#include "qsd/base/util.h"

#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/un.h>

void volume_free(struct volume *v)
{
    if (!v)
        return;
    free(v->base);
    free(v->dir);
    free(v->id);
    free(v->socket);
    free(v);
}
void volume_freep(struct volume **v) { volume_free(*v); }

static int fail(char **ret_error, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char **ret_error, int err, const char *fmt, ...)
{
    if (ret_error) {
        va_list ap;
        va_start(ap, fmt);
        char *m = NULL;
        if (vasprintf(&m, fmt, ap) < 0)
            abort();
        va_end(ap);
        *ret_error = m;
    }
    return err;
}

static int get_u64(json_t *o, const char *key, uint64_t min, uint64_t max, bool required,
                   uint64_t def, uint64_t *ret, char **ret_error)
{
    json_t *v = json_object_get(o, key);
    if (!v) {
        if (required)
            return fail(ret_error, -EINVAL, "volume.json: missing \"%s\"", key);
        *ret = def;
        return 0;
    }
    if (!json_is_integer(v))
        return fail(ret_error, -EINVAL, "volume.json: \"%s\" must be an integer", key);
    json_int_t i = json_integer_value(v);
    if (i < 0 || (uint64_t)i < min || (uint64_t)i > max)
        return fail(ret_error, -EINVAL, "volume.json: \"%s\" = %lld is out of range", key,
                    (long long)i);
    *ret = (uint64_t)i;
    return 0;
}

static int get_ident(json_t *o, const char *key, const char *def, char **ret, char **ret_error)
{
    json_t *v = json_object_get(o, key);
    if (!v) {
        if (!def)
            return fail(ret_error, -EINVAL, "volume.json: missing \"%s\"", key);
        *ret = xstrdup(def);
        return 0;
    }
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
        return fail(ret_error, -EINVAL, "volume.json: \"%s\" must be a string", key);
    const char *reason;
    if (name_validate(json_string_value(v), &reason) < 0)
        return fail(ret_error, -EINVAL, "volume.json: \"%s\" is not a valid name: %s", key, reason);
    *ret = xstrdup(json_string_value(v));
    return 0;
}

int volume_meta_parse(const char *text, size_t len, const char *dir, struct volume **ret,
                      char **ret_error)
{
    json_error_t jerr;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!o)
        return fail(ret_error, -EINVAL, "volume.json: invalid JSON at line %d: %s", jerr.line,
                    jerr.text);
    _cleanup_(volume_freep) struct volume *v = xcalloc(1, sizeof(*v));
    v->dir = xstrdup(dir);
    uint64_t u;
    int r;
    /* Unknown keys are ignored (newer writers may add some); only the keys
     * below are ever used, and each is validated. */
    if (!json_is_object(o)) {
        r = fail(ret_error, -EINVAL, "volume.json: must be a JSON object");
        goto out;
    }
    r = get_u64(o, "version", 1, 1, true, 0, &u, ret_error);
    if (r < 0)
        goto out;
    r = get_ident(o, "volume", NULL, &v->id, ret_error);
    if (r < 0)
        goto out;
    r = get_u64(o, "size", 1, VOLUME_MAX_SIZE, true, 0, &v->size, ret_error);
    if (r < 0)
        goto out;
    json_t *ro = json_object_get(o, "read_only");
    if (ro && !json_is_boolean(ro)) {
        r = fail(ret_error, -EINVAL, "volume.json: \"read_only\" must be a boolean");
        goto out;
    }
    v->read_only = ro && json_is_true(ro);
    r = get_u64(o, "num_queues", 1, VOLUME_MAX_QUEUES, false, 1, &u, ret_error);
    if (r < 0)
        goto out;
    v->num_queues = (unsigned)u;
    r = get_u64(o, "logical_block_size", 512, 65536, false, 512, &u, ret_error);
    if (r < 0)
        goto out;
    if (u & (u - 1)) {
        r = fail(ret_error, -EINVAL, "volume.json: \"logical_block_size\" must be a power of two");
        goto out;
    }
    v->logical_block_size = (unsigned)u;
    r = get_ident(o, "socket", "vhost.sock", &v->socket, ret_error);
    if (r < 0)
        goto out;
    if (streq(v->socket, VOLUME_JSON)) {
        r = fail(ret_error, -EINVAL, "volume.json: \"socket\" cannot be volume.json");
        goto out;
    }
    *ret = TAKE_PTR(v);
    r = 0;
out:
    json_decref(o);
    return r;
}

int volume_load(int dirfd, const char *name, struct volume **ret, char **ret_error)
{
    const char *reason;
    if (name_validate(name, &reason) < 0)
        return fail(ret_error, -EINVAL, "invalid volume directory name: %s", reason);
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return fail(ret_error, -errno, "cannot stat: %m");
    if (S_ISLNK(st.st_mode))
        return fail(ret_error, -ELOOP, "is a symlink (symlinks are refused)");
    if (!S_ISDIR(st.st_mode))
        return fail(ret_error, -ENOTDIR, "not a directory");
    _cleanup_close_ int dfd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) {
        int e = errno;
        if (e == ELOOP || e == ENOTDIR)
            return fail(ret_error, -ELOOP, "not a plain directory (symlinks are refused)");
        return fail(ret_error, -e, "cannot open directory: %s", strerror(e));
    }
    _cleanup_close_ int jfd = openat(dfd, VOLUME_JSON, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (jfd < 0) {
        int e = errno;
        if (e == ENOENT)
            return fail(ret_error, -ENOENT, "volume.json not there yet");
        return fail(ret_error, e == ELOOP ? -ELOOP : -e, "cannot open volume.json: %s%s",
                    strerror(e), e == ELOOP ? " (symlinks are refused)" : "");
    }
    if (fstat(jfd, &st) < 0)
        return fail(ret_error, -errno, "cannot stat volume.json: %m");
    if (!S_ISREG(st.st_mode))
        return fail(ret_error, -EINVAL, "volume.json is not a regular file");
    if (st.st_size > VOLUME_JSON_MAX)
        return fail(ret_error, -EFBIG, "volume.json is larger than %d bytes", VOLUME_JSON_MAX);
    _cleanup_free_ char *buf = xmalloc((size_t)st.st_size + 1);
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t n = read(jfd, buf + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return fail(ret_error, -errno, "cannot read volume.json: %m");
        if (n == 0)
            break;
        got += (size_t)n;
    }
    buf[got] = 0;
    _cleanup_(volume_freep) struct volume *v = NULL;
    int r = volume_meta_parse(buf, got, name, &v, ret_error);
    if (r < 0)
        return r;
    if (fstatat(dfd, v->socket, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        int e = errno;
        return fail(ret_error, -e, "socket %s: %s", v->socket,
                    e == ENOENT ? "not there yet" : strerror(e));
    }
    if (!S_ISSOCK(st.st_mode))
        return fail(ret_error, S_ISLNK(st.st_mode) ? -ELOOP : -ENOTSOCK,
                    "socket %s is not a unix socket%s", v->socket,
                    S_ISLNK(st.st_mode) ? " (symlinks are refused)" : "");
    *ret = TAKE_PTR(v);
    return 0;
}

char *volume_socket_path(const struct volume *v)
{
    if (!v->base)
        abort(); /* a socket path only ever comes from a scanned directory */
    return xasprintf("%s/%s/%s", v->base, v->dir, v->socket);
}

int volume_socket_probe(const struct volume *v, char **ret_why)
{
    _cleanup_free_ char *path = volume_socket_path(v);
    if (strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
        *ret_why = xstrdup("socket path too long");
        return -ENAMETOOLONG;
    }
    _cleanup_close_ int dfd = open(v->base, O_PATH | O_DIRECTORY | O_CLOEXEC);
    int r = dfd < 0 ? -errno : 0;
    if (r == 0) {
        _cleanup_free_ char *rel = xasprintf("%s/%s", v->dir, v->socket);
        r = probe_socket_at(dfd, rel);
    }
    if (r < 0)
        *ret_why = xasprintf("socket does not accept connections: %s", strerror(-r));
    return r;
}

void volume_scan_clear(struct volume_scan *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->entries[i].base);
        free(s->entries[i].name);
        volume_free(s->entries[i].vol);
        free(s->entries[i].message);
    }
    free(s->entries);
    s->entries = NULL;
    s->n = 0;
}

static int entry_cmp(const void *a, const void *b)
{
    const struct volume_entry *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (c)
        return c;
    return x->dir_index < y->dir_index ? -1 : x->dir_index > y->dir_index;
}

/* Append the entries of one volumes directory to s (at most max in all). */
static int scan_one(const char *dir, unsigned dir_index, size_t max, struct volume_scan *s,
                    size_t *cap)
{
    _cleanup_close_ int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int fd2 = dup(fd);
    if (fd2 < 0)
        return -errno;
    DIR *d = fdopendir(fd2);
    if (!d) {
        int e = errno;
        close(fd2);
        return -e;
    }
    struct dirent *de;
    int r = 0;
    while ((errno = 0, de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue; /* ".", "..", and hidden staging entries */
        if (s->n == max) {
            r = -E2BIG;
            break;
        }
        if (s->n == *cap) {
            *cap = *cap ? *cap * 2 : 8;
            s->entries = xrealloc(s->entries, *cap * sizeof(*s->entries));
        }
        struct volume_entry *e = &s->entries[s->n++];
        *e = (struct volume_entry){.base = xstrdup(dir), .dir_index = dir_index,
                                   .name = xstrdup(de->d_name)};
        e->error = volume_load(fd, de->d_name, &e->vol, &e->message);
        if (e->error > 0)
            e->error = 0;
        if (e->vol)
            e->vol->base = xstrdup(dir);
    }
    if (!r && errno)
        r = -errno;
    closedir(d);
    return r;
}

/* A name in more than one directory: refuse it in each, naming the others. */
static void refuse_duplicates(struct volume_scan *s)
{
    for (size_t i = 0; i < s->n;) {
        size_t j = i + 1;
        while (j < s->n && streq(s->entries[j].name, s->entries[i].name))
            j++;
        for (size_t k = i; j - i > 1 && k < j; k++) {
            struct volume_entry *e = &s->entries[k];
            _cleanup_free_ char *others = NULL;
            for (size_t o = i; o < j; o++) {
                if (o == k)
                    continue;
                char *n = xasprintf("%s%s%s", others ? others : "", others ? ", " : "",
                                    s->entries[o].base);
                free(others);
                others = n;
            }
            volume_free(e->vol);
            e->vol = NULL;
            e->error = -EEXIST;
            free(e->message);
            e->message = xasprintf("also in %s: a disk name must be in one volumes directory "
                                   "only", others);
        }
        i = j;
    }
}

int volumes_scan(const char *const *dirs, size_t n_dirs, size_t max, struct volume_scan *ret,
                 const char **ret_failed)
{
    struct volume_scan s = {0};
    size_t cap = 0;
    for (size_t i = 0; i < n_dirs; i++) {
        int r = scan_one(dirs[i], (unsigned)i, max, &s, &cap);
        if (r < 0) {
            if (ret_failed)
                *ret_failed = dirs[i];
            volume_scan_clear(&s);
            return r;
        }
    }
    if (s.n)
        qsort(s.entries, s.n, sizeof(*s.entries), entry_cmp);
    refuse_duplicates(&s);
    *ret = s;
    return 0;
}

const struct volume_entry *volume_scan_find(const struct volume_scan *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (streq(s->entries[i].name, name))
            return &s->entries[i];
    return NULL;
}

const struct volume_entry *volume_scan_find_in(const struct volume_scan *s, const char *base,
                                               const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (streq(s->entries[i].name, name) && streq(s->entries[i].base, base))
            return &s->entries[i];
    return NULL;
}

struct volume *volume_dup(const struct volume *v)
{
    struct volume *c = xmalloc(sizeof(*c));
    *c = *v;
    c->base = v->base ? xstrdup(v->base) : NULL;
    c->dir = xstrdup(v->dir);
    c->id = xstrdup(v->id);
    c->socket = xstrdup(v->socket);
    return c;
}
