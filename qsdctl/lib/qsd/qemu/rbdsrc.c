/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/rbdsrc.c: see rbdsrc.h. */
#include "qsd/qemu/rbdsrc.h"
#include "qsd/base/fsat.h"
#include "qsd/base/names.h"
#include "qsd/base/util.h"

#include <fcntl.h>

void qsd_rbd_free(struct qsd_rbd *r)
{
    if (!r)
        return;
    free(r->pool);
    free(r->ns);
    free(r->image);
    free(r->user);
    free(r->monitors);
    free(r->key_file);
    free(r);
}

struct qsd_rbd *qsd_rbd_copy(const struct qsd_rbd *r)
{
    if (!r)
        return NULL;
    struct qsd_rbd *c = xcalloc(1, sizeof(*c));
    c->pool = xstrdup_or_null(r->pool);
    c->ns = xstrdup_or_null(r->ns);
    c->image = xstrdup_or_null(r->image);
    c->user = xstrdup_or_null(r->user);
    c->monitors = xstrdup_or_null(r->monitors);
    c->key_file = xstrdup_or_null(r->key_file);
    return c;
}

bool qsd_rbd_monitor_ok(const char *m)
{
    if (startswith(m, "v1:") || startswith(m, "v2:"))
        m += 3;
    const char *colon = strrchr(m, ':');
    if (!colon || colon == m || !colon[1] || strlen(colon + 1) > 5 ||
        strspn(colon + 1, "0123456789") != strlen(colon + 1))
        return false;
    size_t hl = (size_t)(colon - m);
    if (m[0] == '[')
        return hl > 2 && m[hl - 1] == ']' && strspn(m + 1, "0123456789abcdefABCDEF:.") == hl - 2;
    return strspn(m, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") == hl;
}

static int set_str(char **field, const char *value)
{
    free(*field);
    *field = xstrdup(value);
    return 0;
}

int qsd_rbd_set(struct qsd_rbd **rp, const char *key, const char *value, char **ret_msg)
{
    if (!startswith(key, "rbd-"))
        return -ENOENT;
    if (!*rp)
        *rp = xcalloc(1, sizeof(**rp));
    struct qsd_rbd *r = *rp;
    if (streq(key, "rbd-image")) {
        /* POOL/IMAGE or POOL/NAMESPACE/IMAGE */
        const char *a = strchr(value, '/'), *b = a ? strchr(a + 1, '/') : NULL;
        if (!a || (b && strchr(b + 1, '/'))) {
            *ret_msg = xasprintf("invalid rbd-image '%s': expected POOL/IMAGE or "
                                 "POOL/NAMESPACE/IMAGE", value);
            return -EINVAL;
        }
        free(r->pool);
        free(r->ns);
        free(r->image);
        r->pool = xstrndup(value, (size_t)(a - value));
        r->ns = b ? xstrndup(a + 1, (size_t)(b - a - 1)) : xstrdup("");
        r->image = xstrdup(b ? b + 1 : a + 1);
        return 0;
    }
    if (streq(key, "rbd-monitors"))
        return set_str(&r->monitors, value);
    if (streq(key, "rbd-user"))
        return set_str(&r->user, value);
    if (streq(key, "rbd-key-file"))
        return set_str(&r->key_file, value);
    *ret_msg = xasprintf("unknown option '%s' (rbd-image, rbd-monitors, rbd-user, rbd-key-file)",
                         key);
    return -EINVAL;
}

int qsd_rbd_validate(const struct qsd_rbd *r, char **ret_msg)
{
    const char *why;
    const struct {
        const char *what, *v;
        bool empty_ok;
    } names[] = {{"rbd-image pool", r->pool, false}, {"rbd-image namespace", r->ns, true},
                 {"rbd-image image", r->image, false}, {"rbd-user", r->user, false}};
    for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
        if (!names[i].v) {
            *ret_msg = xasprintf("%s is missing", names[i].what);
            return -EINVAL;
        }
        if ((*names[i].v || !names[i].empty_ok) && name_validate(names[i].v, &why) < 0) {
            *ret_msg = xasprintf("%s %s", names[i].what, why);
            return -EINVAL;
        }
    }
    if (!r->key_file || r->key_file[0] != '/') {
        *ret_msg = xstrdup("rbd-key-file must be an absolute path");
        return -EINVAL;
    }
    if (!r->monitors || !*r->monitors) {
        *ret_msg = xstrdup("rbd-monitors is missing");
        return -EINVAL;
    }
    _cleanup_free_ char *copy = xstrdup(r->monitors);
    char *save = NULL;
    for (char *m = strtok_r(copy, ",", &save); m; m = strtok_r(NULL, ",", &save))
        if (!qsd_rbd_monitor_ok(m)) {
            *ret_msg = xasprintf("invalid monitor '%s' in rbd-monitors: expected "
                                 "[v1:|v2:]host:port", m);
            return -EINVAL;
        }
    return 0;
}

json_t *qsd_rbd_to_json(const struct qsd_rbd *r)
{
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "pool", r->pool, "namespace", r->ns,
                     "image", r->image, "user", r->user, "monitors", r->monitors, "key-file",
                     r->key_file);
}

int qsd_rbd_from_json(json_t *j, struct qsd_rbd **ret, char **ret_msg)
{
    const char *pool, *ns, *image, *user, *mons, *kf;
    json_error_t e;
    if (json_unpack_ex(j, &e, 0, "{s:s, s:s, s:s, s:s, s:s, s:s}", "pool", &pool, "namespace",
                       &ns, "image", &image, "user", &user, "monitors", &mons, "key-file",
                       &kf) < 0) {
        *ret_msg = xasprintf("bad rbd record: %s", e.text);
        return -EINVAL;
    }
    struct qsd_rbd *r = xcalloc(1, sizeof(*r));
    *r = (struct qsd_rbd){xstrdup(pool), xstrdup(ns), xstrdup(image), xstrdup(user),
                          xstrdup(mons), xstrdup(kf)};
    int rc = qsd_rbd_validate(r, ret_msg);
    if (rc < 0) {
        qsd_rbd_free(r);
        return rc;
    }
    *ret = r;
    return 0;
}

int qsd_rbd_write_key(const char *run_dir, const char *volume, const char *key)
{
    int r = mkdir_p(run_dir, 0711); /* configuration: trusted */
    if (r < 0)
        return r;
    _cleanup_close_ int run = open(run_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    _cleanup_close_ int ctl = -1, vol = -1;
    if (run < 0)
        return -errno;
    if ((r = fsat_mkdirs(run, "ctl", 0700, &ctl)) < 0 ||
        (r = fsat_mkdirs(ctl, volume, 0700, &vol)) < 0)
        return r;
    return fsat_write_replace(vol, "rbd.key", key, strlen(key), 0600, -1);
}

json_t *qsd_rbd_secret_json(const struct qsd_rbd *r)
{
    return json_pack("{s:s, s:s, s:s, s:s}", "qom-type", "secret", "id", QSD_RBD_SECRET_ID,
                     "file", r->key_file, "format", "base64");
}

char *qsd_rbd_mon_host(const char *monitors)
{
    char *out = NULL;
    _cleanup_free_ char *copy = xstrdup(monitors);
    char *save = NULL;
    for (char *m = strtok_r(copy, ",", &save); m; m = strtok_r(NULL, ",", &save)) {
        bool typed = startswith(m, "v1:") || startswith(m, "v2:");
        char *t = xasprintf("%s%s%s%s", out ? out : "", out ? "," : "", typed ? "" : "v2:", m);
        free(out);
        out = t;
    }
    return out;
}

char *qsd_rbd_conf(const struct qsd_rbd *r)
{
    _cleanup_free_ char *host = qsd_rbd_mon_host(r->monitors);
    return xasprintf("[global]\nmon_host = %s\nclient_mount_timeout = %d\n", host,
                     QSD_RBD_CONNECT_S);
}

json_t *qsd_rbd_node_json(const struct qsd_rbd *r, const char *node, const char *conf)
{
    json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:[s], s:s}", "driver", "rbd",
                          "node-name", node, "pool", r->pool, "image", r->image, "user", r->user,
                          "key-secret", QSD_RBD_SECRET_ID, "auth-client-required", "cephx",
                          "conf", conf);
    if (*r->ns)
        json_object_set_new(j, "namespace", json_string(r->ns));
    return j;
}
