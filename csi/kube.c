/* SPDX-License-Identifier: Apache-2.0 */
/* kube.c: a node's address from the Kubernetes API server (kube.h). */
#include "kube.h"
#include "preamble.h"
#include "qsd/base/util.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

#define TOKEN_MAX (64u << 10)

int kube_name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > 253)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
        if (alnum)
            continue;
        if (ch != '-' && ch != '.')
            return 0;
        /* a label neither starts nor ends with '-' or '.' */
        if (i == 0 || i == n - 1 || name[i - 1] == '.' || (ch == '.' && name[i - 1] == '-'))
            return 0;
    }
    return 1;
}

/* The token: visible ASCII (a JWT), trailing whitespace dropped. */
static int read_token(const char *path, char **ret, char **ret_msg)
{
    char *t = NULL;
    size_t len = 0;
    int r = read_file_follow(path, TOKEN_MAX, &t, &len);
    if (r < 0) {
        *ret_msg = xasprintf("cannot read the ServiceAccount token %s: %s", path, strerror(-r));
        return -EACCES; /* not -ENOENT: the node is not known to be missing */
    }
    while (len && (t[len - 1] == '\n' || t[len - 1] == '\r' || t[len - 1] == ' '))
        len--;
    t[len] = '\0';
    for (size_t i = 0; i < len; i++)
        if (t[i] < 0x21 || t[i] > 0x7e)
            len = 0;
    if (!len) {
        free(t);
        *ret_msg = xasprintf("the ServiceAccount token %s is empty or not printable", path);
        return -EACCES;
    }
    *ret = t;
    return 0;
}

int kube_parse_answer(const char *buf, size_t len, int *ret_status, json_t **ret_body)
{
    /* "HTTP/1.x SSS ...\r\n" */
    if (len < 12 || memcmp(buf, "HTTP/1.", 7) != 0 || buf[8] != ' ')
        return -EPROTO;
    int status = 0;
    for (int i = 9; i < 12; i++) {
        if (buf[i] < '0' || buf[i] > '9')
            return -EPROTO;
        status = status * 10 + (buf[i] - '0');
    }
    const char *end = memmem(buf, len, "\r\n\r\n", 4);
    if (!end)
        return -EPROTO;
    const char *body = end + 4;
    *ret_status = status;
    *ret_body = json_loadb(body, len - (size_t)(body - buf), 0, NULL);
    return 0;
}

int kube_internal_ip(json_t *node, char ip[INET6_ADDRSTRLEN])
{
    json_t *addrs = json_object_get(json_object_get(node, "status"), "addresses");
    size_t i;
    json_t *a;
    json_array_foreach(addrs, i, a) {
        const char *type = json_string_value(json_object_get(a, "type"));
        const char *addr = json_string_value(json_object_get(a, "address"));
        if (!type || !addr || !streq(type, "InternalIP"))
            continue;
        unsigned char bin[sizeof(struct in6_addr)];
        if (strlen(addr) >= INET6_ADDRSTRLEN ||
            (inet_pton(AF_INET, addr, bin) != 1 && inet_pton(AF_INET6, addr, bin) != 1))
            continue;
        strcpy(ip, addr);
        return 0;
    }
    return -EADDRNOTAVAIL;
}

/* Send all of buf, by the deadline. */
static int send_all(int fd, const char *buf, size_t len, uint64_t deadline_us)
{
    size_t off = 0;
    while (off < len) {
        ssize_t w = send(fd, buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            off += (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EINTR)
            return -errno;
        int r = preamble_wait(fd, POLLOUT, deadline_us);
        if (r < 0)
            return r;
    }
    return 0;
}

/* Read to the end of the connection (HTTP/1.0: the answer's end), at most
 * KUBE_ANSWER_MAX bytes, by the deadline; buf starts with what the
 * preamble read past its line. */
static int read_all(int fd, char **buf, size_t *len, uint64_t deadline_us)
{
    size_t cap = *len + 65536;
    *buf = xrealloc(*buf, cap + 1);
    for (;;) {
        if (*len == cap) {
            if (cap >= KUBE_ANSWER_MAX)
                return -EFBIG;
            cap = MIN(cap * 2, (size_t)KUBE_ANSWER_MAX);
            *buf = xrealloc(*buf, cap + 1);
        }
        ssize_t n = recv(fd, *buf + *len, cap - *len, MSG_DONTWAIT);
        if (n == 0)
            break;
        if (n > 0) {
            *len += (size_t)n;
            continue;
        }
        if (errno != EAGAIN && errno != EINTR)
            return -errno;
        int r = preamble_wait(fd, POLLIN, deadline_us);
        if (r < 0)
            return r;
    }
    (*buf)[*len] = '\0';
    return 0;
}

/* GET the node: 0 and its answer, or a message. */
static int get_node(const char *dial_path, const char *token, const char *node,
                    uint64_t deadline_us, char **ret_buf, size_t *ret_len, char **ret_msg)
{
    _cleanup_close_ int fd = -1;
    int r = unix_connect(dial_path, true, &fd);
    if (r < 0) {
        *ret_msg = xasprintf("cannot connect to the dial gate %s: %s", dial_path, strerror(-r));
        return r;
    }
    uint8_t *rest = NULL;
    size_t rest_len = 0;
    char *why = NULL;
    if ((r = preamble_exchange(fd, "API\n", 4, "OK", deadline_us, &rest, &rest_len, &why)) < 0) {
        *ret_msg = xasprintf("the dial gate's API route: %s", why);
        free(why);
        return r;
    }
    _cleanup_free_ char *req = xasprintf("GET /api/v1/nodes/%s HTTP/1.0\r\n"
                                         "Host: kubernetes.default.svc\r\n"
                                         "Authorization: Bearer %s\r\n"
                                         "Accept: application/json\r\n"
                                         "User-Agent: qsd-csi-plugin\r\n\r\n", node, token);
    char *buf = (char *)rest;
    size_t len = rest_len;
    if ((r = send_all(fd, req, strlen(req), deadline_us)) < 0 ||
        (r = read_all(fd, &buf, &len, deadline_us)) < 0) {
        free(buf);
        *ret_msg = r == -ETIMEDOUT ? xstrdup("the API server did not answer in time")
                   : r == -EFBIG  ? xasprintf("the API server's answer is over %u bytes",
                                              KUBE_ANSWER_MAX)
                                  : xasprintf("talking to the API server: %s", strerror(-r));
        return r == -EFBIG ? -EPROTO : r;
    }
    *ret_buf = buf;
    *ret_len = len;
    return 0;
}

int kube_node_ip(const char *dial_path, const char *token_file, const char *node,
                 uint64_t deadline_us, char ip[INET6_ADDRSTRLEN], char **ret_msg)
{
    if (!kube_name_ok(node)) {
        *ret_msg = xasprintf("\"%s\" is not a node's name", node);
        return -EINVAL;
    }
    _cleanup_free_ char *token = NULL, *buf = NULL;
    size_t len = 0;
    int r = read_token(token_file, &token, ret_msg);
    if (r < 0 || (r = get_node(dial_path, token, node, deadline_us, &buf, &len, ret_msg)) < 0)
        return r;
    int status;
    json_t *body = NULL;
    if (kube_parse_answer(buf, len, &status, &body) < 0) {
        *ret_msg = xstrdup("the API server's answer is not HTTP");
        return -EPROTO;
    }
    if (status != 200) {
        const char *m = json_string_value(json_object_get(body, "message"));
        *ret_msg = xasprintf("the API server answered %d for node %s%s%s", status, node,
                             m ? ": " : "", m ? m : "");
        json_decref(body);
        return status == 404 ? -ENOENT : status == 401 || status == 403 ? -EACCES : -EPROTO;
    }
    if (!body) {
        *ret_msg = xasprintf("the API server's answer for node %s is not JSON", node);
        return -EPROTO;
    }
    r = kube_internal_ip(body, ip);
    json_decref(body);
    if (r < 0)
        *ret_msg = xasprintf("node %s has no InternalIP address in its status", node);
    return r;
}
