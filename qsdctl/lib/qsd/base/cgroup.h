/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/cgroup.h: the cgroup QSDs run in, outside the plugin's own.
 *
 * Owns: creating one group (e.g. "/qsd-csi") in every cgroup hierarchy the
 * node has (cgroup v1, the v1 + v2 hybrid, or v2 alone), its CPU weight and
 * memory limit, and the open cgroup.procs files that a spawned QSD writes
 * itself into before exec (proc_spawn's join_fds).  In a container the
 * runtime kills every process of the container's cgroup when it stops; a
 * QSD in a group of its own outlives the plugin's container, and its CPU
 * and memory are not charged to the plugin's requests. */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct qsd_cgroup {
    int *fds;       /* cgroup.procs of the group, one per hierarchy */
    size_t n;
};

/* root: where the hierarchies are mounted ("/sys/fs/cgroup").  path: the
 * group, absolute within each hierarchy ("/qsd-csi").  cpu_weight: 1-10000
 * (cgroup v2's scale; v1 cpu.shares = weight * 1024 / 100), 0 to leave it.
 * memory_max: bytes, 0 to leave it.  pids_max: tasks (pids.max), 0 to leave it. */
int qsd_cgroup_open(const char *root, const char *path, unsigned cpu_weight, uint64_t memory_max,
                    uint64_t pids_max, struct qsd_cgroup *ret, char **ret_msg);
/* Remove the group path (no process left in it) from every hierarchy;
 * missing is not an error, a group still in use is -EBUSY. */
int qsd_cgroup_remove(const char *root, const char *path);
void qsd_cgroup_close(struct qsd_cgroup *cg);

/* The cgroup (v1: of the memory hierarchy, v2: the unified one) pid is in,
 * as in /proc/PID/cgroup, e.g. "/qsd-csi"; to free. */
char *qsd_cgroup_of(int pid);
