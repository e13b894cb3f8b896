/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/rbdsrc.h: a Ceph RBD image as a QSD's storage (docs/rbd.md).
 *
 * Owns: where a volume's RBD image is (pool, namespace, image, monitors),
 * as whom QSD connects (a cephx user and the path of a private file with
 * its base64 key: the key itself is never on a command line nor in a state
 * file), the spelling of these as options ("rbd-image", "rbd-monitors",
 * "rbd-user", "rbd-key-file"), their validation and JSON form, and what QSD
 * is given: an --object secret read from the key file and an rbd protocol
 * node (QEMU's rbd driver, cephx required, no Ceph configuration file). */
#pragma once

#include <jansson.h>
#include <stdbool.h>

struct qsd_rbd {
    char *pool, *ns, *image; /* names (names.h); ns "" when none */
    char *user;              /* cephx user without "client." */
    char *monitors;          /* "[v1:|v2:]host:port,..." */
    char *key_file;          /* absolute path of a file only root reads */
};

void qsd_rbd_free(struct qsd_rbd *r);
struct qsd_rbd *qsd_rbd_copy(const struct qsd_rbd *r);
/* Set one option on *r (allocated on first use).  rbd-image is
 * POOL/IMAGE or POOL/NAMESPACE/IMAGE.  Not an rbd- key: -ENOENT. */
int qsd_rbd_set(struct qsd_rbd **r, const char *key, const char *value, char **ret_msg);
int qsd_rbd_validate(const struct qsd_rbd *r, char **ret_msg);
/* One monitor: [v1:|v2:]host:port, host a DNS name, IPv4 or [IPv6]. */
bool qsd_rbd_monitor_ok(const char *m);
json_t *qsd_rbd_to_json(const struct qsd_rbd *r);
int qsd_rbd_from_json(json_t *j, struct qsd_rbd **ret, char **ret_msg);

/* Write key to the volume's private key file (qsd_paths.rbd_key: the
 * control directory, 0700, created here; the file 0600, no fsync: it goes
 * with the run directory, qsd_remove_runtime removes it). */
int qsd_rbd_write_key(const char *run_dir, const char *volume, const char *key);

#define QSD_RBD_SECRET_ID "rbd-key0"
/* QSD's --object of the key and its --blockdev of the image (node). */
json_t *qsd_rbd_secret_json(const struct qsd_rbd *r);
/* QSD reads no host configuration: conf is the volume's own Ceph
 * configuration file (qsd_paths.rbd_conf, written by qsd_rbd_conf at each
 * start): monitors with their protocol, so that a refused key fails the
 * start at once (librados given bare host:port monitors keeps hunting
 * until its mount timeout), and a bounded connection. */
json_t *qsd_rbd_node_json(const struct qsd_rbd *r, const char *node, const char *conf);
#define QSD_RBD_CONNECT_S 10 /* client_mount_timeout of a QSD */
/* The text of that file (not secret: no key). */
char *qsd_rbd_conf(const struct qsd_rbd *r);
/* "[v1:|v2:]host:port,..." -> librados' mon_host, v2 (msgr2) unless said. */
char *qsd_rbd_mon_host(const char *monitors);
