/* SPDX-License-Identifier: Apache-2.0 */
/* gate_conf.c: qsd-node-gate's command line (see gate_conf.h). */
#include "gate_conf.h"

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "qsd/base/log.h"
#include "qsd/base/util.h"

const char gate_usage[] =
    "usage: qsd-node-gate --listen HOST:PORT --ca FILE --cert FILE --key FILE\n"
    "                     --peer-name NAME --forward UNIX_SOCKET\n"
    "                     [--uid N --gid N] [--max-conns N]\n"
    "                     [--handshake-timeout-ms MS] [--idle-timeout-ms MS]\n"
    "                     [--log-level L]\n"
    "       qsd-node-gate --dial --listen-unix PATH --port PORT --ca FILE\n"
    "                     --cert FILE --key FILE --peer-name NAME\n"
    "                     [--api-host IP --api-port PORT --api-ca FILE\n"
    "                      [--api-name NAME]]\n"
    "                     [--uid N --gid N] [--max-conns N]\n"
    "                     [--handshake-timeout-ms MS] [--idle-timeout-ms MS]\n"
    "                     [--log-level L]\n"
    "       qsd-node-gate --version | --help\n"
    "\n"
    "Terminates mutual TLS 1.3 for the node endpoint (docs/node-operations.md)\n"
    "and hands each verified connection to the unix socket UNIX_SOCKET.\n"
    "With --dial, the controller's side: each client of the unix socket PATH\n"
    "sends \"CONNECT <IP>\\n\", the gate dials IP:PORT with mutual TLS 1.3,\n"
    "answers \"OK\\n\" (or \"ERR <reason>\\n\" and closes) and relays; with\n"
    "--api-host, \"API\\n\" does the same to the Kubernetes API server (TLS,\n"
    "no client certificate: the caller authenticates in HTTP).\n"
    "  --listen HOST:PORT   an IPv4 address, or [IPv6]:PORT ([IPv4]:PORT too);\n"
    "                       port 0 picks one\n"
    "  --listen-unix PATH   (--dial) the unix socket to create (mode 0660)\n"
    "  --port PORT          (--dial) the port of every destination, 1..65535\n"
    "  --ca FILE            the CA (PEM) the peer's certificate must chain to\n"
    "  --cert, --key FILE   this side's certificate (chain) and key (PEM)\n"
    "  --peer-name NAME     the peer's certificate must name it (DNS SAN, or\n"
    "                       CN without SAN)\n"
    "  --forward PATH       the unix socket that gets each verified connection\n"
    "  --api-host IP        (--dial) the API server's address (an IPv4 or IPv6\n"
    "                       literal, as in KUBERNETES_SERVICE_HOST)\n"
    "  --api-port PORT      (--dial) its port, 1..65535\n"
    "  --api-ca FILE        (--dial) the CA its certificate must chain to\n"
    "  --api-name NAME      (--dial) the name its certificate must have\n"
    "                       (default " GATE_DEFAULT_API_NAME ")\n"
    "  --uid, --gid N       the identity to confine to (both or neither)\n"
    "  --max-conns N        connections at once, 1..1024 (default 64); more are\n"
    "                       closed at once\n"
    "  --handshake-timeout-ms MS  bound on the TLS handshake (default 5000);\n"
    "                             with --dial, on the preamble, and on the\n"
    "                             connect and the handshake\n"
    "  --idle-timeout-ms MS       a connection that moves no byte for MS is\n"
    "                             closed (default 300000)\n";

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

int gate_parse_listen(const char *s, struct sockaddr_storage *ret, socklen_t *ret_len)
{
    char host[INET6_ADDRSTRLEN + 2];
    const char *colon, *port;
    bool v6 = s[0] == '[';
    if (v6) {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':')
            return -EINVAL;
        colon = close + 1;
        s++;
    } else {
        colon = strrchr(s, ':');
        if (!colon)
            return -EINVAL;
    }
    size_t hl = (size_t)((v6 ? colon - 1 : colon) - s);
    if (hl == 0 || hl >= sizeof(host))
        return -EINVAL;
    memcpy(host, s, hl);
    host[hl] = '\0';
    port = colon + 1;
    uint64_t p;
    if (parse_uint(port, 0, 65535, &p) < 0)
        return -EINVAL;
    struct sockaddr_storage ss = {0};
    struct in_addr v4;
    /* An IPv4 address in brackets too: a manifest writes
     * --listen=[$(HOST_IP)]:PORT whichever family the node has. */
    if (v6 && inet_pton(AF_INET, host, &v4) == 1)
        v6 = false;
    if (v6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)p);
        if (inet_pton(AF_INET6, host, &a->sin6_addr) != 1)
            return -EINVAL;
        *ret_len = sizeof(*a);
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)p);
        if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
            return -EINVAL;
        *ret_len = sizeof(*a);
    }
    *ret = ss;
    return 0;
}

const char *gate_format_addr(const struct sockaddr *sa, char *buf, size_t len)
{
    char h[INET6_ADDRSTRLEN];
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &a->sin_addr, h, sizeof(h));
        snprintf(buf, len, "%s:%u", h, ntohs(a->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &a->sin6_addr, h, sizeof(h));
        snprintf(buf, len, "[%s]:%u", h, ntohs(a->sin6_port));
    } else {
        snprintf(buf, len, "?");
    }
    return buf;
}

/* A unix socket's directory and name: the gate binds or connects by name
 * from inside that directory (its working directory after confinement). */
static int split_sock(struct gate_conf *c, const char *opt, const char *p, char *err,
                      size_t errlen)
{
    const char *slash = strrchr(p, '/');
    const char *name = slash ? slash + 1 : p;
    size_t dl = slash ? (size_t)(slash - p) : 0;
    if (!*name || streq(name, ".") || streq(name, ".."))
        return fail(err, errlen, "%s: %s does not name a socket", opt, p);
    if (strlen(name) >= sizeof(c->sock_name))
        return fail(err, errlen, "%s: the socket's name is longer than %zu bytes", opt,
                    sizeof(c->sock_name) - 1);
    if (dl >= sizeof(c->sock_dir))
        return fail(err, errlen, "%s: the directory is too long", opt);
    if (!slash)
        strcpy(c->sock_dir, ".");
    else if (dl == 0)
        strcpy(c->sock_dir, "/");
    else {
        memcpy(c->sock_dir, p, dl);
        c->sock_dir[dl] = '\0';
    }
    strcpy(c->sock_name, name);
    return 0;
}

static int parse_ms(const char *opt, const char *v, unsigned *ret, char *err, size_t errlen)
{
    uint64_t x;
    if (parse_uint(v, 1, GATE_MAX_TIMEOUT_MS, &x) < 0)
        return fail(err, errlen, "%s: %s is not 1..%u milliseconds", opt, v, GATE_MAX_TIMEOUT_MS);
    *ret = (unsigned)x;
    return 0;
}

/* The API server route: dial mode only, host, port and CA together, the
 * name only with them. */
static int check_api(struct gate_conf *c, char *err, size_t errlen)
{
    bool any = c->api_host || c->api_port || c->api_ca || c->api_name;
    if (!any) {
        c->api_name = GATE_DEFAULT_API_NAME;
        return 0;
    }
    if (!c->dial)
        return fail(err, errlen, "--api-%s is not for serve mode (it needs --dial)",
                    c->api_host ? "host" : c->api_port ? "port" : c->api_ca ? "ca" : "name");
    if (!c->api_host || !c->api_port || !c->api_ca)
        return fail(err, errlen, "--api-host, --api-port and --api-ca go together (missing %s)",
                    !c->api_host ? "--api-host" : !c->api_port ? "--api-port" : "--api-ca");
    if (!c->api_name)
        c->api_name = GATE_DEFAULT_API_NAME;
    if (!*c->api_name || strlen(c->api_name) > 253)
        return fail(err, errlen, "--api-name: a DNS name of 1..253 bytes");
    struct sockaddr_storage ss = {0};
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, c->api_host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons(c->api_port);
        c->api_len = sizeof(*a4);
    } else if (inet_pton(AF_INET6, c->api_host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons(c->api_port);
        c->api_len = sizeof(*a6);
    } else {
        return fail(err, errlen, "--api-host: %s is not an IPv4 or IPv6 address", c->api_host);
    }
    c->api = ss;
    return 0;
}

/* After getopt: what the mode needs, what it refuses, what goes together. */
static int check_required(struct gate_conf *c, char *err, size_t errlen)
{
    int r;
    static const char *const names[] = {"--listen", "--forward", "--listen-unix", "--port",
                                        "--ca", "--cert", "--key", "--peer-name"};
    const void *vals[] = {c->listen_len ? c : NULL, c->forward, c->listen_unix,
                          c->port ? c : NULL, c->ca, c->cert, c->key, c->peer_name};
    /* names[0..1] serve only, [2..3] dial only, the rest both */
    for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
        bool theirs = i < 4 && (i < 2) == c->dial;
        if (theirs && vals[i])
            return fail(err, errlen, "%s is not for %s", names[i],
                        c->dial ? "--dial" : "serve mode (it needs --dial)");
        if (!theirs && !vals[i])
            return fail(err, errlen, "%s is required%s", names[i], c->dial ? " with --dial" : "");
    }
    if ((r = check_api(c, err, errlen)) < 0)
        return r;
    if ((c->uid == (uid_t)-1) != (c->gid == (gid_t)-1))
        return fail(err, errlen, "--uid and --gid go together");
    if (!*c->peer_name || strlen(c->peer_name) > 253)
        return fail(err, errlen, "--peer-name: a DNS name of 1..253 bytes");
    return c->dial ? split_sock(c, "--listen-unix", c->listen_unix, err, errlen)
                   : split_sock(c, "--forward", c->forward, err, errlen);
}

int gate_conf_parse(int argc, char **argv, struct gate_conf *ret, char *err, size_t errlen)
{
    static const struct option opts[] = {
        {"dial", no_argument, NULL, 'D'},
        {"listen", required_argument, NULL, 'L'},
        {"listen-unix", required_argument, NULL, 'U'},
        {"port", required_argument, NULL, 'p'},
        {"ca", required_argument, NULL, 'A'},
        {"cert", required_argument, NULL, 'C'},
        {"key", required_argument, NULL, 'K'},
        {"peer-name", required_argument, NULL, 'P'},
        {"forward", required_argument, NULL, 'F'},
        {"api-host", required_argument, NULL, 'a'},
        {"api-port", required_argument, NULL, 'o'},
        {"api-ca", required_argument, NULL, 'c'},
        {"api-name", required_argument, NULL, 'n'},
        {"uid", required_argument, NULL, 'u'},
        {"gid", required_argument, NULL, 'g'},
        {"max-conns", required_argument, NULL, 'm'},
        {"handshake-timeout-ms", required_argument, NULL, 'H'},
        {"idle-timeout-ms", required_argument, NULL, 'I'},
        {"log-level", required_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {0},
    };
    struct gate_conf c = {.uid = (uid_t)-1, .gid = (gid_t)-1,
                          .max_conns = GATE_DEFAULT_MAX_CONNS,
                          .handshake_ms = GATE_DEFAULT_HANDSHAKE_MS,
                          .idle_ms = GATE_DEFAULT_IDLE_MS, .log_level = -1};
    uint64_t v;
    int o, r;
    optind = 0; /* a fresh scan (glibc), also for a second call */
    opterr = 0;
    while ((o = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
        switch (o) {
        case 'L':
            if (gate_parse_listen(optarg, &c.listen, &c.listen_len) < 0)
                return fail(err, errlen, "--listen: %s is not IPV4:PORT or [IPV6]:PORT", optarg);
            break;
        case 'D': c.dial = true; break;
        case 'U': c.listen_unix = optarg; break;
        case 'p':
            if (parse_uint(optarg, 1, 65535, &v) < 0)
                return fail(err, errlen, "--port: %s is not 1..65535", optarg);
            c.port = (uint16_t)v;
            break;
        case 'A': c.ca = optarg; break;
        case 'C': c.cert = optarg; break;
        case 'K': c.key = optarg; break;
        case 'P': c.peer_name = optarg; break;
        case 'F': c.forward = optarg; break;
        case 'a': c.api_host = optarg; break;
        case 'o':
            if (parse_uint(optarg, 1, 65535, &v) < 0)
                return fail(err, errlen, "--api-port: %s is not 1..65535", optarg);
            c.api_port = (uint16_t)v;
            break;
        case 'c': c.api_ca = optarg; break;
        case 'n': c.api_name = optarg; break;
        case 'u':
        case 'g':
            /* 0..2^32-2: (uid_t)-1 means "keep" */
            if (parse_uint(optarg, 0, UINT32_MAX - 1, &v) < 0)
                return fail(err, errlen, "--%s: %s is not a number", o == 'u' ? "uid" : "gid",
                            optarg);
            if (o == 'u')
                c.uid = (uid_t)v;
            else
                c.gid = (gid_t)v;
            break;
        case 'm':
            if (parse_uint(optarg, 1, GATE_MAX_CONNS_LIMIT, &v) < 0)
                return fail(err, errlen, "--max-conns: %s is not 1..%d", optarg,
                            GATE_MAX_CONNS_LIMIT);
            c.max_conns = (unsigned)v;
            break;
        case 'H':
            if ((r = parse_ms("--handshake-timeout-ms", optarg, &c.handshake_ms, err, errlen)))
                return r;
            break;
        case 'I':
            if ((r = parse_ms("--idle-timeout-ms", optarg, &c.idle_ms, err, errlen)))
                return r;
            break;
        case 'l': {
            enum log_level l;
            if (log_parse_level(optarg, &l) < 0)
                return fail(err, errlen, "--log-level: %s is not debug, info, warn or error",
                            optarg);
            c.log_level = (int)l;
            break;
        }
        case 'h': c.help = true; break;
        case 'V': c.version = true; break;
        case ':':
            return fail(err, errlen, "%s needs a value", argv[optind - 1]);
        default:
            return fail(err, errlen, "unknown option %s", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return fail(err, errlen, "unexpected argument %s", argv[optind]);
    if (!c.help && !c.version && (r = check_required(&c, err, errlen)) < 0)
        return r;
    *ret = c;
    return 0;
}
