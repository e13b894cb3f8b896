/* SPDX-License-Identifier: Apache-2.0 */
/* plugin_cmds.c: qsdctl's view of the CSI plugin, read from its state
 * directory (--state-dir, default /var/lib/qsd-csi/state: STATE/volumes/,
 * snapshots/, bridges/, hotplug/ hold one JSON record each, docs/csi-plugin.md
 * "State") and the QSD state files under the run directory.
 *
 * Owns: the guard that refuses to change a volume or snapshot the plugin
 * manages without --force (plugin_guard), and `qsdctl plugin-status`.
 * Records are read with the plugin's own code (qsd/state: records_read,
 * and vol_from_json/snap_from_json for volumes and snapshots), never parsed
 * here.  Read-only: nothing here writes the plugin's state. */
#include <dirent.h>
#include <getopt.h>
#include <inttypes.h>
#include <sys/stat.h>

#include "commands.h"
#include "qsd/base/names.h"
#include "qsd/base/util.h"
#include "qsd/qemu/qsd.h"
#include "qsd/state/records.h"
#include "qsd/state/state.h"

/* A record as the plugin reads it (records_read); volumes and snapshots
 * also go through the plugin's own parser and come back in its form, so a
 * record the plugin would skip is skipped here too (NULL). */
static json_t *load_record(const char *dir, const char *id, const char *kind)
{
    json_t *j = NULL;
    if (records_read(dir, id, kind ? "id" : NULL, &j) < 0)
        return NULL;
    if (!kind)
        return j;
    _cleanup_free_ char *msg = NULL;
    json_t *out = NULL;
    if (streq(kind, "volume")) {
        struct vol *v;
        if (vol_from_json(j, &v, &msg) == 0) {
            out = vol_to_json(v);
            vol_free(v);
        }
    } else {
        struct snap *sn;
        if (snap_from_json(j, &sn, &msg) == 0) {
            out = snap_to_json(sn);
            snap_free(sn);
        }
    }
    if (!out)
        fprintf(stderr, "qsdctl: warning: record %s/%s.json skipped: %s\n", dir, id,
                msg ? msg : "invalid");
    json_decref(j);
    return out;
}

/* Why changing it behind the plugin's back breaks it, per command. */
static const char *damage(const char *action)
{
    static const struct {
        const char *action, *why;
    } t[] = {
        {"unexport", "the plugin does not restart a QSD stopped on purpose: the VM loses its "
                     "disk and the next NodeStageVolume fails"},
        {"export", "NodeStageVolume would find a QSD it did not start"},
        {"delete", "the plugin's record would name a missing image"},
        {"resize", "the plugin's record would keep the old size (expand the PVC instead)"},
        {"snapshot", "it changes the volume's chain of layers under the plugin, which knows only "
                     "its own snapshots (use a VolumeSnapshot)"},
        {"merge", "it changes the volume's chain of layers under the plugin"},
        {"snapshot-delete", "its VolumeSnapshot would point at nothing"},
    };
    for (size_t i = 0; i < ARRAY_SIZE(t); i++)
        if (streq(t[i].action, action))
            return t[i].why;
    return "the plugin's state would no longer match";
}

int plugin_guard(const char *kind, const char *name, const char *action)
{
    bool vol = streq(kind, "volume");
    _cleanup_free_ char *dir = xasprintf("%s/%s", g_opts.state_dir, vol ? "volumes" : "snapshots");
    _cleanup_free_ char *path = xasprintf("%s/%s.json", dir, name);
    struct stat st;
    if (lstat(path, &st) < 0)
        return 0;
    json_t *rec = load_record(dir, name, kind);
    const char *staged = json_string_value(json_object_get(json_object_get(rec, "staged"), "path"));
    size_t npub = json_array_size(json_object_get(rec, "published"));
    _cleanup_free_ char *use = staged ? xasprintf("; staged at %s, %zu publication(s)", staged, npub)
                                      : xstrdup("");
    json_decref(rec);
    if (g_opts.force) {
        fprintf(stderr, "qsdctl: warning: %s %s is managed by the CSI plugin (%s%s); going on "
                        "(--force)\n", kind, name, path, use);
        return 0;
    }
    fprintf(stderr,
            "qsdctl: error: %s %s is managed by the CSI plugin (record %s%s): refusing to %s "
            "it: %s.  Use Kubernetes (the PVC or VolumeSnapshot), or pass --force if the plugin "
            "no longer manages it.\n",
            kind, name, path, use, action, damage(action));
    return EXIT_EXISTS;
}

/* -------------------------------------------------------- plugin-status */

/* Record files of one kind (kind: "volume", "snapshot", or NULL for the
 * bridge and hot-plug records), sorted by name. */
static json_t *load_dir(const char *sub, const char *kind)
{
    _cleanup_free_ char *dir = xasprintf("%s/%s", g_opts.state_dir, sub);
    json_t *out = json_array();
    struct dirent **ents = NULL;
    int n = scandir(dir, &ents, NULL, alphasort);
    for (int i = 0; i < n; i++) {
        const char *f = ents[i]->d_name;
        size_t len = strlen(f);
        if (f[0] != '.' && len > 5 && streq(f + len - 5, ".json")) {
            _cleanup_free_ char *id = xstrndup(f, len - 5);
            json_t *j = load_record(dir, id, kind);
            if (j)
                json_array_append_new(out, j);
        }
        free(ents[i]);
    }
    free(ents);
    return out;
}

/* The QSD of a volume as the run directory tells it. */
static json_t *qsd_view(const char *id)
{
    if (name_validate(id, NULL) < 0)
        return json_null();
    struct qsd_paths p;
    qsd_paths_init(g_opts.run_dir, id, &p);
    bool desired = false;
    pid_t pid = 0;
    uint64_t start = 0;
    json_t *j;
    if (qsd_read_state(p.state, NULL, &desired, &pid, &start) < 0)
        j = json_pack("{s:s}", "state", "none");
    else
        j = json_pack("{s:s, s:i}", "state",
                      qsd_pid_is_ours(pid, start, p.qmp) ? "running"
                      : desired                          ? "dead"
                                                         : "stopped",
                      "pid", (int)pid);
    qsd_paths_clear(&p);
    return j;
}

static const char *str(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "-";
}

static void print_text(json_t *vols, json_t *snaps, json_t *bridges, json_t *reqs)
{
    size_t i, k;
    json_t *v, *x;
    char b[32];
    printf("state %s, run %s\n\nVOLUMES (%zu)\n", g_opts.state_dir, g_opts.run_dir,
           json_array_size(vols));
    printf("  %-40s %-8s %-6s %10s  %-8s %7s  %s\n", "ID", "PHASE", "FORMAT", "SIZE", "QSD", "PID",
           "STAGED / PUBLISHED");
    json_array_foreach(vols, i, v)
    {
        json_t *q = json_object_get(v, "qsd");
        json_t *stg = json_object_get(v, "staged");
        printf("  %-40s %-8s %-6s %10s  %-8s %7" JSON_INTEGER_FORMAT "  %s\n", str(v, "id"),
               str(v, "phase"), str(v, "format"),
               format_size((uint64_t)json_integer_value(json_object_get(v, "size")), b, sizeof(b)),
               str(q, "state"), json_integer_value(json_object_get(q, "pid")), str(stg, "path"));
        json_array_foreach(json_object_get(v, "published"), k, x)
            printf("  %-40s   -> %s%s\n", "", str(x, "target"),
                   json_is_true(json_object_get(x, "read_only")) ? " (read-only)" : "");
    }
    printf("\nSNAPSHOTS (%zu)\n  %-40s %-8s %10s  %s\n", json_array_size(snaps), "ID", "PHASE",
           "SIZE", "SOURCE");
    json_array_foreach(snaps, i, v)
        printf("  %-40s %-8s %10s  %s\n", str(v, "id"), str(v, "phase"),
               format_size((uint64_t)json_integer_value(json_object_get(v, "size")), b, sizeof(b)),
               str(v, "source_volume"));
    printf("\nBRIDGES (%zu)\n", json_array_size(bridges));
    json_array_foreach(bridges, i, v)
    {
        printf("  pod %s/%s (uid %s) at %s\n", str(v, "namespace"), str(v, "pod"),
               str(v, "pod_uid"), str(v, "target"));
        json_array_foreach(json_object_get(v, "placements"), k, x)
            printf("    disk %s: volume %s%s\n", str(x, "disk"), str(x, "volume"),
                   json_is_true(json_object_get(x, "read_only")) ? " (read-only)" : "");
    }
    printf("\nHOT-PLUG REQUESTS (%zu)\n", json_array_size(reqs));
    json_array_foreach(reqs, i, v)
        printf("  %s/%s: disk %s into %s (bridge uid %s)\n", str(v, "namespace"), str(v, "pod"),
               str(v, "disk"), str(v, "into"), str(v, "bridge_uid"));
}

static const char HELP_PLUGIN_STATUS[] =
    "Usage: qsdctl plugin-status [--json]\n"
    "Show the CSI plugin's view, read from its state directory (--state-dir) and the\n"
    "run directory: volumes (phase, size, QSD state and pid, staging, publications),\n"
    "snapshots, hot-plug bridges and requests.  Read-only; works while the plugin is\n"
    "down.  QSD state: running, dead (should run, the plugin restarts it), stopped,\n"
    "none (no state file: not staged).\n";

int cmd_plugin_status(int argc, char **argv)
{
    static const struct option lo[] = {{"help", no_argument, 0, 'h'}, {0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        if (c == 'h') {
            fputs(HELP_PLUGIN_STATUS, stdout);
            return EXIT_OK;
        }
        fprintf(stderr, "qsdctl: error: usage: qsdctl plugin-status [--json] (see --help)\n");
        return EXIT_USAGE;
    }
    if (optind != argc) {
        fprintf(stderr, "qsdctl: error: usage: qsdctl plugin-status [--json] (see --help)\n");
        return EXIT_USAGE;
    }
    _cleanup_free_ char *vd = xasprintf("%s/volumes", g_opts.state_dir);
    struct stat st;
    if (stat(vd, &st) < 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "qsdctl: error: %s is not a CSI plugin state directory (no volumes/): "
                        "see --state-dir\n", g_opts.state_dir);
        return EXIT_NOT_FOUND;
    }
    json_t *vols = load_dir("volumes", "volume"), *snaps = load_dir("snapshots", "snapshot");
    json_t *bridges = load_dir("bridges", NULL), *reqs = load_dir("hotplug", NULL);
    size_t i;
    json_t *v;
    json_array_foreach(vols, i, v)
        json_object_set_new(v, "qsd", qsd_view(str(v, "id")));
    if (g_opts.json) {
        json_t *j = json_pack("{s:s, s:s, s:o, s:o, s:o, s:o}", "state_dir", g_opts.state_dir,
                              "run_dir", g_opts.run_dir, "volumes", vols, "snapshots", snaps,
                              "bridges", bridges, "hotplug", reqs);
        char *s = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
        puts(s);
        free(s);
        json_decref(j);
        return EXIT_OK;
    }
    print_text(vols, snaps, bridges, reqs);
    json_decref(vols);
    json_decref(snaps);
    json_decref(bridges);
    json_decref(reqs);
    return EXIT_OK;
}
