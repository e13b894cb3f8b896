/* SPDX-License-Identifier: Apache-2.0 */
/* gate_conf.h: qsd-node-gate's configuration, from its command line.
 *
 * Owns: parsing and checking the command line of both modes (serve: the
 * listen address and the forward socket; dial: the unix socket it listens
 * on, the port it dials and the optional API server route; in both the
 * file options, the identity, the
 * bounds; each mode requires its options and refuses the other's; a unix
 * socket's path split into directory and name) into struct gate_conf, and
 * formatting socket addresses for logs.  No I/O: whether the files can be
 * read is the TLS setup's question (gate_tls.c).  An error is a message
 * that names the option. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#define GATE_MAX_CONNS_LIMIT 1024
#define GATE_DEFAULT_MAX_CONNS 64
#define GATE_DEFAULT_HANDSHAKE_MS 5000
#define GATE_DEFAULT_IDLE_MS 300000
#define GATE_MAX_TIMEOUT_MS 3600000
#define GATE_DEFAULT_API_NAME "kubernetes.default.svc"

struct gate_conf {
    bool dial;                      /* --dial: the controller's side */
    struct sockaddr_storage listen; /* serve: AF_INET or AF_INET6 */
    socklen_t listen_len;
    const char *ca, *cert, *key;    /* file paths (argv's strings) */
    const char *peer_name;          /* the peer's certificate must name it */
    const char *forward;            /* serve: the unix socket as given */
    const char *listen_unix;        /* dial: the unix socket it listens on */
    char sock_dir[4096];            /* either socket's directory ("." for a
                                     * bare name) */
    char sock_name[108];            /* its last component (fits sun_path) */
    uint16_t port;                  /* dial: the port every destination has */
    struct sockaddr_storage api;    /* dial: the API server (--api-host,
                                     * --api-port), for the `API` preamble */
    socklen_t api_len;              /* 0: no API route */
    const char *api_host;           /* as given */
    uint16_t api_port;
    const char *api_ca;             /* the CA its certificate must chain to */
    const char *api_name;           /* ... and the name it must have */
    uid_t uid;                      /* (uid_t)-1: keep the caller's */
    gid_t gid;                      /* (gid_t)-1: keep the caller's */
    unsigned max_conns;
    unsigned handshake_ms, idle_ms;
    int log_level;                  /* enum log_level, -1: unchanged */
    bool help, version;
};

/* Parse argv (getopt_long, from argv[1]).  0 on success; on a bad command
 * line -EINVAL with a message naming the option in err.  Every option the
 * mode requires is checked, and every option of the other mode refused;
 * the strings point into argv. */
int gate_conf_parse(int argc, char **argv, struct gate_conf *ret, char *err, size_t errlen);

/* "HOST:PORT" with HOST an IPv4 address, or "[IPv6]:PORT" (or "[IPv4]:PORT");
 * port 0..65535
 * (0: the kernel picks one).  No name lookup. */
int gate_parse_listen(const char *s, struct sockaddr_storage *ret, socklen_t *ret_len);

/* "1.2.3.4:5" or "[::1]:5" into buf (at least 64 bytes); "?" for another
 * family. */
const char *gate_format_addr(const struct sockaddr *sa, char *buf, size_t len);

/* The usage text. */
extern const char gate_usage[];
