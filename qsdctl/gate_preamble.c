/* SPDX-License-Identifier: Apache-2.0 */
/* gate_preamble.c: the dial mode's preamble (see gate_preamble.h). */
#include "gate_preamble.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>

#define VERB "CONNECT "
#define API_LINE "API\n"

static int refuse(const char **why, const char *what)
{
    *why = what;
    return -EINVAL;
}

/* An address a connection can go to: not unspecified, not multicast, not
 * IPv4 broadcast. */
static int reachable(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET) {
        uint32_t a = ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr);
        return a != INADDR_ANY && a != INADDR_BROADCAST && !IN_MULTICAST(a);
    }
    const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
    return !IN6_IS_ADDR_UNSPECIFIED(a) && !IN6_IS_ADDR_MULTICAST(a);
}

int gate_preamble_parse(const char *buf, size_t len, uint16_t port,
                        struct sockaddr_storage *ret, socklen_t *ret_len, const char **why)
{
    const char *nl = memchr(buf, '\n', len);
    size_t vl = strlen(VERB), al = strlen(API_LINE);
    /* What is there must be a verb's start, whether or not all came. */
    if (memcmp(buf, API_LINE, len < al ? len : al) == 0) {
        if (len < al)
            return 0;
        return len == al ? GATE_PREAMBLE_API : refuse(why, "bytes before OK");
    }
    if (memcmp(buf, VERB, len < vl ? len : vl) != 0)
        return refuse(why, "expected CONNECT <ip> or API");
    if (!nl)
        return len >= GATE_PREAMBLE_MAX ? refuse(why, "preamble too long") : 0;
    if ((size_t)(nl - buf) + 1 != len)
        return refuse(why, "bytes before OK");
    if ((size_t)(nl - buf) < vl)
        return refuse(why, "expected CONNECT <ip> or API");
    char host[INET6_ADDRSTRLEN];
    size_t hl = (size_t)(nl - buf) - vl;
    if (hl == 0 || hl >= sizeof(host) || memchr(buf + vl, '\0', hl))
        return refuse(why, "host is not an IP address");
    memcpy(host, buf + vl, hl);
    host[hl] = '\0';
    struct sockaddr_storage ss = {0};
    if (inet_pton(AF_INET, host, &((struct sockaddr_in *)&ss)->sin_addr) == 1) {
        ss.ss_family = AF_INET;
        ((struct sockaddr_in *)&ss)->sin_port = htons(port);
        *ret_len = sizeof(struct sockaddr_in);
    } else if (inet_pton(AF_INET6, host, &((struct sockaddr_in6 *)&ss)->sin6_addr) == 1) {
        ss.ss_family = AF_INET6;
        ((struct sockaddr_in6 *)&ss)->sin6_port = htons(port);
        *ret_len = sizeof(struct sockaddr_in6);
    } else {
        return refuse(why, "host is not an IP address");
    }
    if (!reachable(&ss))
        return refuse(why, "host is not a unicast address");
    *ret = ss;
    return GATE_PREAMBLE_CONNECT;
}
