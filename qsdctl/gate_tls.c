/* SPDX-License-Identifier: Apache-2.0 */
/* gate_tls.c: qsd-node-gate's TLS policy (see gate_tls.h). */
#include "gate_tls.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>

#include "qsd/base/util.h"

/* OpenSSL's reason for the last failure, with the option it concerns. */
static int ssl_fail(char *err, size_t errlen, const char *opt, const char *path, const char *what)
{
    unsigned long e = ERR_peek_last_error();
    const char *why = e ? ERR_reason_error_string(e) : NULL;
    snprintf(err, errlen, "%s %s: %s%s%s", opt, path, what, why ? ": " : "", why ? why : "");
    ERR_clear_error();
    return -EINVAL;
}

/* The CA file must hold at least one certificate: OpenSSL accepts an empty
 * or unrelated PEM file without complaint. */
static int load_ca(SSL_CTX *ctx, const char *opt, const char *ca, bool server, char *err,
                   size_t errlen)
{
    if (SSL_CTX_load_verify_file(ctx, ca) != 1)
        return ssl_fail(err, errlen, opt, ca, "cannot load");
    STACK_OF(X509_OBJECT) *objs = X509_STORE_get0_objects(SSL_CTX_get_cert_store(ctx));
    if (!objs || sk_X509_OBJECT_num(objs) == 0)
        return ssl_fail(err, errlen, opt, ca, "holds no certificate");
    if (!server)
        return 0;
    /* The CA names sent in the CertificateRequest (clients choose by them). */
    STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(ca);
    if (!names)
        return ssl_fail(err, errlen, "--ca", ca, "cannot read the CA's name");
    SSL_CTX_set_client_CA_list(ctx, names);
    return 0;
}

/* The system's reason when a file cannot be opened at all (OpenSSL's
 * would be "system lib"). */
static int readable(const char *opt, const char *path, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "%s %s: %s", opt, path, strerror(e));
        return -e;
    }
    close(fd);
    return 0;
}

static int verify_peer(SSL_CTX *ctx, const char *opt, const char *name, bool client_peer,
                       char *err, size_t errlen);
static void common(SSL_CTX *ctx);

static int setup(SSL_CTX *ctx, const struct gate_conf *c, char *err, size_t errlen)
{
    int r;
    if ((r = readable("--ca", c->ca, err, errlen)) < 0 ||
        (r = readable("--cert", c->cert, err, errlen)) < 0 ||
        (r = readable("--key", c->key, err, errlen)) < 0)
        return r;
    if (SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) != 1 ||
        SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) != 1)
        return ssl_fail(err, errlen, "TLS", "1.3", "not available");
    if (SSL_CTX_use_certificate_chain_file(ctx, c->cert) != 1)
        return ssl_fail(err, errlen, "--cert", c->cert, "cannot load");
    if (SSL_CTX_use_PrivateKey_file(ctx, c->key, SSL_FILETYPE_PEM) != 1)
        return ssl_fail(err, errlen, "--key", c->key, "cannot load");
    if (SSL_CTX_check_private_key(ctx) != 1)
        return ssl_fail(err, errlen, "--key", c->key, "does not match --cert");
    if ((r = load_ca(ctx, "--ca", c->ca, !c->dial, err, errlen)) < 0)
        return r;
    /* The peer's role: serve mode wants a client certificate, dial mode a
     * server's (extended key usage, when the certificate has one). */
    if ((r = verify_peer(ctx, "--peer-name", c->peer_name, !c->dial, err, errlen)) < 0)
        return r;
    common(ctx);
    return 0;
}

/* The peer's certificate required, checked by OpenSSL's host-name check
 * for name (DNS subjectAltName, or the CN when there is none; no
 * wildcards) and for the purpose of its role. */
static int verify_peer(SSL_CTX *ctx, const char *opt, const char *name, bool client_peer,
                       char *err, size_t errlen)
{
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    SSL_CTX_set_verify_depth(ctx, 4);
    X509_VERIFY_PARAM *vp = SSL_CTX_get0_param(ctx);
    X509_VERIFY_PARAM_set_hostflags(vp, X509_CHECK_FLAG_NO_WILDCARDS);
    if (X509_VERIFY_PARAM_set1_host(vp, name, 0) != 1)
        return ssl_fail(err, errlen, opt, name, "refused by OpenSSL");
    if (X509_VERIFY_PARAM_set_purpose(vp, client_peer ? X509_PURPOSE_SSL_CLIENT
                                                      : X509_PURPOSE_SSL_SERVER) != 1)
        return ssl_fail(err, errlen, "TLS", "purpose", "cannot be set");
    return 0;
}

static void common(SSL_CTX *ctx)
{
    /* Every connection verifies a certificate: no resumption. */
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    /* A peer that closes TCP without close_notify has ended, not failed:
     * what it sent before is still passed on. */
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION |
                                 SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_IGNORE_UNEXPECTED_EOF);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                              SSL_MODE_RELEASE_BUFFERS);
}

/* The API server route: TLS 1.2 or 1.3 (what the API server's Go TLS
 * offers), no certificate of ours (the caller sends its token in HTTP). */
static int setup_api(SSL_CTX *ctx, const struct gate_conf *c, char *err, size_t errlen)
{
    int r;
    if ((r = readable("--api-ca", c->api_ca, err, errlen)) < 0)
        return r;
    if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1)
        return ssl_fail(err, errlen, "TLS", "1.2", "not available");
    if ((r = load_ca(ctx, "--api-ca", c->api_ca, false, err, errlen)) < 0 ||
        (r = verify_peer(ctx, "--api-name", c->api_name, false, err, errlen)) < 0)
        return r;
    common(ctx);
    return 0;
}

int gate_tls_ctx_new(const struct gate_conf *c, bool api, SSL_CTX **ret, char *err,
                     size_t errlen)
{
    SSL_CTX *ctx = SSL_CTX_new(c->dial ? TLS_client_method() : TLS_server_method());
    if (!ctx)
        return ssl_fail(err, errlen, "TLS", "context", "cannot be created");
    int r = api ? setup_api(ctx, c, err, errlen) : setup(ctx, c, err, errlen);
    if (r < 0) {
        SSL_CTX_free(ctx);
        return r;
    }
    *ret = ctx;
    return 0;
}

const char *gate_tls_failure(SSL *ssl, int ssl_err, char *buf, size_t len)
{
    long v = SSL_get_verify_result(ssl);
    unsigned long e = ERR_peek_error();
    if (v != X509_V_OK)
        snprintf(buf, len, "certificate: %s", X509_verify_cert_error_string(v));
    else if (e)
        snprintf(buf, len, "%s", ERR_reason_error_string(e) ? ERR_reason_error_string(e)
                                                            : "TLS error");
    else if (ssl_err == SSL_ERROR_SYSCALL)
        snprintf(buf, len, "%s", errno ? strerror(errno) : "connection closed");
    else if (ssl_err == SSL_ERROR_ZERO_RETURN)
        snprintf(buf, len, "connection closed");
    else
        snprintf(buf, len, "TLS error %d", ssl_err);
    ERR_clear_error();
    return buf;
}
