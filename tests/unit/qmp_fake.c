/* SPDX-License-Identifier: Apache-2.0 */
/* tests/unit/qmp_fake.c: see qmp_fake.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <sys/socket.h>
#include <sys/un.h>

#include "qmp_fake.h"
#include "qsd/base/util.h"

#include <jansson.h>

#ifndef QMP_TRANSCRIPT_DIR
#error "QMP_TRANSCRIPT_DIR must be defined"
#endif

int read_line(int fd, char *buf, size_t len)
{
    size_t n = 0;
    while (n + 1 < len) {
        char ch;
        ssize_t r = read(fd, &ch, 1);
        if (r <= 0)
            return -1;
        if (ch == '\n')
            break;
        buf[n++] = ch;
    }
    buf[n] = '\0';
    return (int)n;
}

static void *fake_main(void *opaque)
{
    struct fake *f = opaque;
    int fd = accept(f->listen_fd, NULL, NULL);
    if (fd < 0) {
        snprintf(f->error, sizeof(f->error), "accept failed");
        return NULL;
    }
    char *save = NULL, *script = xstrdup(f->script);
    char last_id[64] = "";
    for (char *line = strtok_r(script, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#' || !line[0])
            continue;
        if (line[0] == '<') {
            json_t *msg = json_loads(line + 2, 0, NULL);
            if ((json_object_get(msg, "return") || json_object_get(msg, "error")) && last_id[0])
                json_object_set_new(msg, "id", json_string(last_id));
            char *s = json_dumps(msg, JSON_COMPACT);
            json_decref(msg);
            dprintf(fd, "%s\r\n", s);
            free(s);
        } else if (line[0] == '>') {
            char buf[65536];
            if (read_line(fd, buf, sizeof(buf)) < 0) {
                snprintf(f->error, sizeof(f->error), "client hung up, expected %.200s", line + 2);
                break;
            }
            json_t *got = json_loads(buf, 0, NULL), *want = json_loads(line + 2, 0, NULL);
            const char *id = json_string_value(json_object_get(got, "id"));
            snprintf(last_id, sizeof(last_id), "%s", id ? id : "");
            json_object_del(got, "id");
            if (!json_equal(got, want))
                snprintf(f->error, sizeof(f->error), "unexpected command %.200s, expected %.200s", buf, line + 2);
            json_decref(got), json_decref(want);
            if (f->error[0])
                break;
        }
    }
    free(script);
    if (f->stay_silent) {
        char buf[4096];
        while (read(fd, buf, sizeof(buf)) > 0)
            ;
    }
    close(fd);
    return NULL;
}

void fake_start(struct fake *f, const char *transcript)
{
    strcpy(f->dir, "/tmp/qmp-test-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->path, sizeof(f->path), "%s/qmp.sock", f->dir);
    f->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    strcpy(sa.sun_path, f->path);
    assert_int_equal(bind(f->listen_fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(f->listen_fd, 1), 0);
    if (transcript[0] == '/' || strstr(transcript, ".replay")) {
        _cleanup_free_ char *path = xasprintf("%s/%s", QMP_TRANSCRIPT_DIR, transcript);
        assert_int_equal(read_file(path, 1 << 20, &f->script, NULL), 0);
    } else {
        f->script = xstrdup(transcript);
    }
    assert_int_equal(pthread_create(&f->thread, NULL, fake_main, f), 0);
}

void fake_finish(struct fake *f)
{
    pthread_join(f->thread, NULL);
    close(f->listen_fd);
    unlink(f->path);
    rmdir(f->dir);
    free(f->script);
    if (f->error[0])
        fail_msg("fake monitor: %s", f->error);
}
