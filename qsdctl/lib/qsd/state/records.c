/* SPDX-License-Identifier: Apache-2.0 */
/* records.c: see records.h.
 *
 * Two lists of the files changed and not known durable yet:
 *  - r->pending, owned by the loop thread: every such path with the sequence
 *    number of its last change (what a forked worker flushes: fork happens
 *    on the loop, so the child sees a consistent list);
 *  - r->queue, shared with the flusher under r->mu: the paths it has not
 *    taken yet.  The flusher takes the whole queue at once, fsyncs each file
 *    and then each distinct directory, and publishes the highest sequence
 *    number the batch covered.
 * Both hold a path at most once, so they are bounded by the number of
 * records. */
#include "qsd/state/records.h"
#include "qsd/base/fsat.h"
#include "qsd/base/log.h"
#include "qsd/base/loop.h"
#include "qsd/base/names.h"
#include "qsd/base/util.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <time.h>

#define RECORD_MAX (1u << 20)
#define RECORDS_EXIT_WAIT_S 10 /* records_free() waits this long for the flusher */

struct pending {
    char *path;            /* DIR/<id>.json */
    uint64_t seq;
};

struct records {
    struct loop *loop;
    int efd;
    struct loop_watch *watch;
    pthread_t thread;
    records_durable_fn cb;
    void *cb_opaque;
    /* loop thread only */
    uint64_t queued;
    struct pending *pending;
    size_t n_pending;
    /* shared, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char **queue;
    size_t n_queue;
    uint64_t queue_seq;    /* highest sequence number in the queue */
    uint64_t done_seq;     /* every change up to here is durable */
    int done_err;          /* first error since the loop last looked */
    bool stop;
};

/* ------------------------------------------------------------ flushing */

static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash && slash != path ? xstrndup(path, (size_t)(slash - path)) : xstrdup("/");
}

static int fsync_path(const char *path, bool dir)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW |
                                            (dir ? O_DIRECTORY : O_NONBLOCK));
    if (fd < 0)
        return errno == ENOENT && !dir ? 0 : -errno; /* removed: its directory tells */
    return fsync(fd) < 0 ? -errno : 0;
}

/* fsync each file, then each distinct directory.  Returns 0 or the first
 * error. */
static int flush_paths(char *const *paths, size_t n)
{
    int err = 0, r;
    for (size_t i = 0; i < n; i++)
        if ((r = fsync_path(paths[i], false)) < 0 && err == 0)
            err = r;
    for (size_t i = 0; i < n; i++) {
        _cleanup_free_ char *d = dir_of(paths[i]);
        bool seen = false;
        for (size_t k = 0; k < i && !seen; k++) {
            _cleanup_free_ char *dk = dir_of(paths[k]);
            seen = streq(d, dk);
        }
        if (!seen && (r = fsync_path(d, true)) < 0 && err == 0)
            err = r;
    }
    return err;
}

static void *flusher(void *arg)
{
    struct records *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (r->n_queue == 0 && !r->stop)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->n_queue == 0)
            break;
        char **batch = r->queue;
        size_t n = r->n_queue;
        uint64_t hi = r->queue_seq;
        r->queue = NULL;
        r->n_queue = 0;
        pthread_mutex_unlock(&r->mu);
        int err = flush_paths(batch, n);
        for (size_t i = 0; i < n; i++)
            free(batch[i]);
        free(batch);
        pthread_mutex_lock(&r->mu);
        r->done_seq = hi;
        if (err < 0 && r->done_err == 0)
            r->done_err = err;
        uint64_t one = 1;
        if (write(r->efd, &one, sizeof(one)) < 0) {
            /* an eventfd write fails only on overflow: the loop wakes anyway */
        }
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* On the loop: the flusher finished a batch. */
static void on_flushed(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    (void)l;
    (void)revents;
    struct records *r = opaque;
    uint64_t n;
    if (read(fd, &n, sizeof(n)) < 0)
        return;
    pthread_mutex_lock(&r->mu);
    uint64_t seq = r->done_seq;
    int err = r->done_err;
    r->done_err = 0;
    pthread_mutex_unlock(&r->mu);
    size_t k = 0;
    for (size_t i = 0; i < r->n_pending; i++) {
        if (r->pending[i].seq <= seq)
            free(r->pending[i].path);
        else
            r->pending[k++] = r->pending[i];
    }
    r->n_pending = k;
    if (err < 0)
        log_error("state", "records could not be made durable", "up_to=%llu error=\"%s\"",
                  (unsigned long long)seq, strerror(-err));
    if (r->cb)
        r->cb(seq, err, r->cb_opaque);
}

/* A change of path was made: give it the next sequence number and queue it. */
static void changed(struct records *r, const char *path)
{
    uint64_t seq = ++r->queued;
    bool known = false;
    for (size_t i = 0; i < r->n_pending && !known; i++)
        if (streq(r->pending[i].path, path)) {
            r->pending[i].seq = seq;
            known = true;
        }
    if (!known) {
        r->pending = xrealloc(r->pending, (r->n_pending + 1) * sizeof(*r->pending));
        r->pending[r->n_pending++] = (struct pending){.path = xstrdup(path), .seq = seq};
    }
    pthread_mutex_lock(&r->mu);
    bool queued = false;
    for (size_t i = 0; i < r->n_queue && !queued; i++)
        queued = streq(r->queue[i], path);
    if (!queued) {
        r->queue = xrealloc(r->queue, (r->n_queue + 1) * sizeof(*r->queue));
        r->queue[r->n_queue++] = xstrdup(path);
    }
    r->queue_seq = seq;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

int records_flush_pending(const struct records *r)
{
    if (!r || r->n_pending == 0)
        return 0;
    char **paths = xcalloc(r->n_pending, sizeof(*paths));
    for (size_t i = 0; i < r->n_pending; i++)
        paths[i] = r->pending[i].path;
    int err = flush_paths(paths, r->n_pending);
    free(paths);
    return err;
}

/* ------------------------------------------------------------ lifetime */

int records_new(struct loop *l, struct records **ret)
{
    struct records *r = xcalloc(1, sizeof(*r));
    r->loop = l;
    r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (r->efd < 0) {
        int e = -errno;
        free(r);
        return e;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    /* The flusher blocks no signal the loop handles through signalfd: block
     * them all in it, so they stay queued for the loop. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int e = pthread_create(&r->thread, NULL, flusher, r);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e != 0) {
        close(r->efd);
        pthread_cond_destroy(&r->cv);
        pthread_mutex_destroy(&r->mu);
        free(r);
        return -e;
    }
    r->watch = loop_watch_fd(l, r->efd, POLLIN, on_flushed, r);
    *ret = r;
    return 0;
}

void records_free(struct records *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    /* After the last batch, within a bound: on a hung disk the flusher's
     * fsync never returns, and the plugin must still exit (its QSDs run on;
     * the next plugin reads what reached the disk). */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += RECORDS_EXIT_WAIT_S;
    if (pthread_timedjoin_np(r->thread, NULL, &until) != 0) {
        log_error("state", "record flusher still busy at exit: not waiting",
                  "waited_s=%d pending=%zu", RECORDS_EXIT_WAIT_S, r->n_pending);
        loop_watch_remove(r->watch);
        return; /* the flusher still uses r: left to the exiting process */
    }
    loop_watch_remove(r->watch);
    close(r->efd);
    for (size_t i = 0; i < r->n_pending; i++)
        free(r->pending[i].path);
    free(r->pending);
    for (size_t i = 0; i < r->n_queue; i++)
        free(r->queue[i]);
    free(r->queue);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

uint64_t records_queued(const struct records *r) { return r ? r->queued : 0; }

void records_on_durable(struct records *r, records_durable_fn cb, void *opaque)
{
    r->cb = cb;
    r->cb_opaque = opaque;
}

/* ------------------------------------------------------------ changes */

int records_save(struct records *r, const char *dir, const char *id, json_t *j)
{
    _cleanup_free_ char *s = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(j);
    if (!s)
        return -ENOMEM;
    _cleanup_close_ int dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return -errno;
    _cleanup_free_ char *name = xasprintf("%s.json", id);
    if (!r)
        return fsat_write_atomic(dfd, name, s, strlen(s), 0600, -1);
    int e = fsat_write_replace(dfd, name, s, strlen(s), 0600, -1);
    if (e == 0) {
        _cleanup_free_ char *path = xasprintf("%s/%s", dir, name);
        changed(r, path);
    }
    return e;
}

int records_remove(struct records *r, const char *dir, const char *id)
{
    _cleanup_free_ char *path = xasprintf("%s/%s.json", dir, id);
    if (unlink(path) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (!r)
        return fsync_path(dir, true);
    changed(r, path);
    return 0;
}

/* ------------------------------------------------------------ loading */

int records_read(const char *dir, const char *id, const char *id_key, json_t **ret)
{
    if (name_validate(id, NULL) < 0)
        return -EINVAL;
    _cleanup_free_ char *path = xasprintf("%s/%s.json", dir, id), *data = NULL;
    size_t len;
    int r = read_file(path, RECORD_MAX, &data, &len);
    if (r < 0)
        return r;
    json_t *j = json_loadb(data, len, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(j) ||
        (id_key && !streq(json_string_value(json_object_get(j, id_key)) ?: "", id))) {
        json_decref(j);
        return -EBADMSG;
    }
    *ret = j;
    return 0;
}

void records_sweep(const char *dir)
{
    _cleanup_close_ int dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    int n = dfd < 0 ? 0 : fsat_remove_tmp(dfd);
    if (n > 0)
        log_info("state", "removed temporary files of writes a kill cut short", "dir=%s files=%d",
                 dir, n);
}

void records_load(const char *dir, const char *id_key, records_load_fn fn, void *opaque)
{
    records_sweep(dir);
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (de->d_name[0] == '.' || n <= 5 || !streq(de->d_name + n - 5, ".json"))
            continue;
        _cleanup_free_ char *id = xstrndup(de->d_name, n - 5), *msg = NULL;
        json_t *j = NULL;
        int r = records_read(dir, id, id_key, &j);
        if (r == 0)
            r = fn(j, opaque, &msg);
        json_decref(j);
        if (r < 0) {
            _cleanup_free_ char *q = log_quote(msg                ? msg
                                               : r == -EBADMSG ? "not a JSON object of its id"
                                               : r == -EINVAL  ? "bad name"
                                                               : strerror(-r));
            log_warn("state", "record skipped", "path=%s/%s reason=%s", dir, de->d_name, q);
        }
    }
    closedir(d);
}
