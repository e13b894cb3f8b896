/* vhost_tool_main.c: TEMPORARY entry point so the vhost commands can be run
 * as `qsdctl vhost-info|verify|bench ...` before the real qsdctl main.c is
 * merged.  Replace with main.c; nothing else depends on this file. */
#include <stdio.h>
#include <string.h>

#include "commands.h"

struct global_opts g_opts;

static const struct command commands[] = {
    {"vhost-info", cmd_vhost_info, "show a vhost-user-blk export's device"},
    {"verify", cmd_verify, "check the data path of a vhost-user-blk export"},
    {"bench", cmd_bench, "measure a vhost-user-blk export or a file"},
};

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "--json") == 0) {
        g_opts.json = true;
        argv++;
        argc--;
    }
    if (argc < 2) {
        fprintf(stderr, "usage: qsdctl [--json] vhost-info|verify|bench ARGS\n");
        return EXIT_USAGE;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "qsdctl: unknown command '%s'\n", argv[1]);
    return EXIT_USAGE;
}
