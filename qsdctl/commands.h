/* SPDX-License-Identifier: Apache-2.0 */
/* commands.h: the qsdctl subcommands.  Each takes argc/argv with argv[0] the
 * subcommand name and returns the process exit status (see EXIT_* below). */
#pragma once

#include <stdbool.h>

/* Exit codes, documented in `qsdctl --help`. */
enum {
    EXIT_OK = 0,
    EXIT_FAILURE_GENERIC = 1, /* the operation failed */
    EXIT_USAGE = 2,           /* bad command line or invalid argument */
    EXIT_NOT_FOUND = 3,       /* volume, snapshot or socket does not exist */
    EXIT_EXISTS = 4,          /* already exists / conflicting state */
    EXIT_TIMEOUT = 5,         /* a bounded wait expired */
    EXIT_QEMU = 6,            /* QEMU (QSD or qemu-img) reported an error */
    EXIT_MISMATCH = 7,        /* verify: data did not match */
};

/* Global options shared by every subcommand (parsed before the subcommand). */
struct global_opts {
    const char *run_dir;
    const char *pool;
    const char *state_dir; /* the CSI plugin's (plugin_cmds.c) */
    bool json;
    bool force;            /* act on the plugin's volumes and snapshots anyway */
};
extern struct global_opts g_opts;

struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
};

/* The CSI plugin's view: qsdctl/plugin_cmds.c.  plugin_guard returns 0
 * when kind ("volume", "snapshot") name has no record in the plugin's state
 * directory (or with --force, warning), else explains on stderr why action
 * is refused and returns EXIT_EXISTS. */
int plugin_guard(const char *kind, const char *name, const char *action);
int cmd_plugin_status(int argc, char **argv);

/* Data-path commands (vhost-user-blk client): qsdctl/vhost_cmds.c */
int cmd_vhost_info(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_seqwrite(int argc, char **argv);
