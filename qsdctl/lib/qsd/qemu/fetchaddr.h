/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/fetchaddr.h: where an image download may go, and how its URL
 * may be shown.
 *
 * Owns the rule that a download reaches neither the node nor link-local
 * space: a URL's host is resolved here (getaddrinfo: it blocks, so workers
 * and the CLI only) and refused if any of its addresses is loopback,
 * link-local (the cloud metadata address 169.254.169.254 among them),
 * unspecified, multicast, another known metadata address, such an IPv4
 * address inside IPv6 (mapped, NAT64, compatible), or one of this node's
 * own (getifaddrs), unless an allowed range (tests) contains it.  And the
 * redaction of URLs for errors and logs. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* An address range (CIDR) a download may reach although it is refused by
 * default: for tests with a server on loopback. */
struct imagebase_net {
    int family;            /* AF_INET or AF_INET6 */
    uint8_t addr[16];
    unsigned prefix;
};
/* "A.B.C.D/N" or "IPV6/N" (N optional: the whole address).  -EINVAL. */
int imagebase_parse_net(const char *s, struct imagebase_net *ret);

/* The URL as it may be shown (errors, logs): user information and query
 * string replaced by "***", fragment dropped (malloc'd). */
char *imagebase_url_redact(const char *url);

/* Resolve the host of url (http or https) and check every address.  On
 * success *ret_resolve is curl's --resolve entry pinning the first address
 * ("host:port:addr"; NULL when the host is an address already) and
 * *ret_addr that address as curl prints it (%{remote_ip}).  Errors (message
 * naming shown, the redacted URL): -EADDRNOTAVAIL a refused address;
 * -EINVAL a host or port we cannot tell exactly as curl would; -ENOENT no
 * such host or no address; -ECONNREFUSED resolution failed otherwise. */
int fetchaddr_resolve(const struct imagebase_net *allow, size_t n_allow, const char *url,
                      const char *shown, char **ret_resolve, char **ret_addr, char **ret_msg);
