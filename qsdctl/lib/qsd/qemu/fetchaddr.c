/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/fetchaddr.c: where a download may go and how its URL is shown.
 * See fetchaddr.h. */
#include "qsd/qemu/fetchaddr.h"
#include "qsd/base/util.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

int imagebase_parse_net(const char *s, struct imagebase_net *ret)
{
    struct imagebase_net n = {0};
    const char *slash = strchr(s, '/');
    _cleanup_free_ char *a = slash ? xstrndup(s, (size_t)(slash - s)) : xstrdup(s);
    if (inet_pton(AF_INET, a, n.addr) == 1)
        n.family = AF_INET;
    else if (inet_pton(AF_INET6, a, n.addr) == 1)
        n.family = AF_INET6;
    else
        return -EINVAL;
    unsigned bits = n.family == AF_INET ? 32 : 128;
    uint64_t pfx = bits;
    if (slash && parse_uint(slash + 1, 0, bits, &pfx) < 0)
        return -EINVAL;
    n.prefix = (unsigned)pfx;
    *ret = n;
    return 0;
}

static bool in_net(int family, const uint8_t *a, const uint8_t *net, unsigned prefix)
{
    (void)family;
    for (unsigned i = 0; i < prefix / 8; i++)
        if (a[i] != net[i])
            return false;
    unsigned rem = prefix % 8;
    return !rem || ((a[prefix / 8] ^ net[prefix / 8]) & (uint8_t)(0xff << (8 - rem))) == 0;
}

static const char *v4_refused(const uint8_t *a)
{
    static const struct {
        uint8_t net[4];
        unsigned prefix;
        const char *what;
    } r[] = {
        {{0, 0, 0, 0}, 8, "an unspecified address"},
        {{127, 0, 0, 0}, 8, "a loopback address"},
        {{169, 254, 0, 0}, 16, "a link-local address (where cloud metadata services are)"},
        {{100, 100, 100, 200}, 32, "a cloud metadata address"},
        {{224, 0, 0, 0}, 4, "a multicast or reserved address"},
    };
    for (size_t i = 0; i < ARRAY_SIZE(r); i++)
        if (in_net(AF_INET, a, r[i].net, r[i].prefix))
            return r[i].what;
    return NULL;
}

static const char *v6_refused(const uint8_t *a)
{
    static const uint8_t any[16] = {0}, lo[16] = {[15] = 1}, ll[16] = {0xfe, 0x80},
                         mc[16] = {0xff}, mapped[16] = {[10] = 0xff, [11] = 0xff},
                         nat64[16] = {0, 0x64, 0xff, 0x9b},
                         aws[16] = {0xfd, 0, 0x0e, 0xc2, [15] = 0x54};
    if (in_net(AF_INET6, a, lo, 128))
        return "a loopback address";
    if (in_net(AF_INET6, a, any, 128))
        return "an unspecified address";
    if (in_net(AF_INET6, a, mapped, 96) || in_net(AF_INET6, a, nat64, 96) ||
        in_net(AF_INET6, a, any, 96)) /* IPv4 inside (mapped, NAT64, compatible) */
        return v4_refused(a + 12);
    if (in_net(AF_INET6, a, ll, 10))
        return "a link-local address";
    if (in_net(AF_INET6, a, mc, 8))
        return "a multicast address";
    if (in_net(AF_INET6, a, aws, 128))
        return "a cloud metadata address";
    return NULL;
}

static bool addr_bytes(const struct sockaddr *sa, int *ret_family, const uint8_t **ret)
{
    if (sa->sa_family == AF_INET) {
        *ret = (const uint8_t *)&((const struct sockaddr_in *)sa)->sin_addr;
        *ret_family = AF_INET;
        return true;
    }
    if (sa->sa_family == AF_INET6) {
        *ret = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
        *ret_family = AF_INET6;
        return true;
    }
    return false;
}

static bool same_addr(const struct sockaddr *a, const struct sockaddr *b)
{
    int fa, fb;
    const uint8_t *x, *y;
    return addr_bytes(a, &fa, &x) && addr_bytes(b, &fb, &y) && fa == fb &&
           memcmp(x, y, fa == AF_INET ? 4 : 16) == 0;
}

/* Why a download may not connect to sa (NULL: it may). */
static const char *addr_refused(const struct sockaddr *sa, const struct imagebase_net *allow,
                                size_t n_allow)
{
    int fam;
    const uint8_t *a;
    if (!addr_bytes(sa, &fam, &a))
        return "not an IP address";
    for (size_t i = 0; i < n_allow; i++)
        if (allow[i].family == fam && in_net(fam, a, allow[i].addr, allow[i].prefix))
            return NULL;
    const char *why = fam == AF_INET ? v4_refused(a) : v6_refused(a);
    if (why)
        return why;
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *i = ifs; i && !why; i = i->ifa_next)
            if (i->ifa_addr && same_addr(i->ifa_addr, sa))
                why = "an address of this node";
        freeifaddrs(ifs);
    }
    return why;
}

/* ------------------------------------------------------------- URLs */

/* The authority of an http(s) URL: [userinfo@]host[:port]. */
static const char *authority(const char *url, size_t *ret_len)
{
    const char *a = strstr(url, "://");
    a = a ? a + 3 : url;
    *ret_len = strcspn(a, "/?#");
    return a;
}

char *imagebase_url_redact(const char *url)
{
    size_t al;
    const char *a = authority(url, &al);
    const char *at = NULL;
    for (const char *c = a; c < a + al; c++)
        if (*c == '@')
            at = c;
    const char *host = at ? at + 1 : a;
    const char *q = strpbrk(a + al, "?#");
    size_t path_len = q ? (size_t)(q - (a + al)) : strlen(a + al);
    return xasprintf("%.*s%s%.*s%.*s%s", (int)(a - url), url, at ? "***@" : "",
                     (int)(a + al - host), host, (int)path_len, a + al,
                     q && *q == '?' ? "?***" : "");
}

/* Host (without brackets) and port of an http(s) URL.  -EINVAL when we
 * cannot tell them exactly as curl would (percent signs, zone ids, an empty
 * host, a bad port): refused rather than guessed. */
static int url_host_port(const char *url, char **ret_host, unsigned *ret_port)
{
    size_t al;
    const char *a = authority(url, &al);
    _cleanup_free_ char *auth = xstrndup(a, al);
    char *h = strrchr(auth, '@');
    h = h ? h + 1 : auth;
    unsigned port = startswith(url, "https://") ? 443 : 80;
    char *p = NULL;
    if (*h == '[') {
        char *e = strchr(h, ']');
        if (!e || (e[1] && e[1] != ':'))
            return -EINVAL;
        *e = '\0';
        p = e[1] ? e + 2 : NULL;
        h++;
    } else if ((p = strchr(h, ':'))) {
        *p++ = '\0';
    }
    if (p) {
        uint64_t v;
        if (parse_uint(p, 1, 65535, &v) < 0)
            return -EINVAL;
        port = (unsigned)v;
    }
    if (!*h || strpbrk(h, "%@[]/\\"))
        return -EINVAL;
    *ret_host = xstrdup(h);
    *ret_port = port;
    return 0;
}

int fetchaddr_resolve(const struct imagebase_net *allow, size_t n_allow, const char *url,
                      const char *shown, char **ret_resolve, char **ret_addr, char **ret_msg)
{
    _cleanup_free_ char *host = NULL;
    unsigned port;
    if (url_host_port(url, &host, &port) < 0) {
        *ret_msg = xasprintf("cannot tell the host and port of %s", shown);
        return -EINVAL;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int e = getaddrinfo(host, NULL, &hints, &res);
    if (e != 0) {
        *ret_msg = xasprintf("cannot resolve the host of %s: %s", shown, gai_strerror(e));
        return e == EAI_NONAME ? -ENOENT : -ECONNREFUSED;
    }
    char first[INET6_ADDRSTRLEN] = "";
    int r = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        char txt[INET6_ADDRSTRLEN] = "?";
        int fam;
        const uint8_t *b;
        if (addr_bytes(ai->ai_addr, &fam, &b))
            inet_ntop(fam, b, txt, sizeof(txt));
        const char *why = addr_refused(ai->ai_addr, allow, n_allow);
        if (why) {
            *ret_msg = xasprintf("%s leads to %s, %s: refused (downloads reach neither this "
                                 "node nor link-local addresses)", shown, txt, why);
            r = -EADDRNOTAVAIL;
            break;
        }
        if (!*first)
            snprintf(first, sizeof(first), "%s", txt);
    }
    freeaddrinfo(res);
    if (r < 0)
        return r;
    if (!*first) {
        *ret_msg = xasprintf("the host of %s has no address", shown);
        return -ENOENT;
    }
    bool v6 = strchr(first, ':') != NULL;
    uint8_t lit[16];
    if (inet_pton(AF_INET, host, lit) == 1 || inet_pton(AF_INET6, host, lit) == 1)
        *ret_resolve = NULL; /* an address already: curl resolves nothing */
    else
        *ret_resolve = xasprintf("%s:%u:%s%s%s", host, port, v6 ? "[" : "", first,
                                 v6 ? "]" : "");
    *ret_addr = xstrdup(first);
    return 0;
}
