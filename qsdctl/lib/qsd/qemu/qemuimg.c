/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/qemuimg.c: running qemu-img, bounded, optionally confined.  See
 * qemuimg.h. */
#include "qsd/qemu/qemuimg.h"
#include "qsd/base/confine.h"
#include "qsd/base/proc.h"
#include "qsd/base/util.h"

int qemu_img_run(char *const argv[], uint64_t timeout_ms, char **ret_out, char **ret_msg)
{
    return qemu_img_run_confined(argv, timeout_ms, NULL, ret_out, ret_msg);
}

int qemu_img_run_confined(char *const argv[], uint64_t timeout_ms, const struct confine *c,
                          char **ret_out, char **ret_msg)
{
    struct proc_result res = {0};
    int r = c ? proc_run_confined(argv, timeout_ms, c, &res) : proc_run(argv, timeout_ms, &res);
    if (r == -ETIMEDOUT) {
        *ret_msg = xasprintf("qemu-img %s did not finish within %llu s", argv[1],
                             (unsigned long long)(timeout_ms / 1000));
        return r;
    }
    if (r < 0) {
        *ret_msg = xasprintf("cannot run qemu-img: %s", strerror(-r));
        return r;
    }
    if (res.exit_code > 128 && c) {
        char line[512];
        *ret_msg = xasprintf("qemu-img %s was stopped by signal %d at its limits (%llu MiB of "
                             "address space, %llu s of CPU): %s", argv[1], res.exit_code - 128,
                             (unsigned long long)(c->rlimit_as >> 20),
                             (unsigned long long)c->rlimit_cpu,
                             proc_last_line(res.err, line, sizeof(line)));
        proc_result_clear(&res);
        return -EIO;
    }
    if (res.exit_code != 0) {
        char line[512];
        *ret_msg = xasprintf("qemu-img %s failed: %s", argv[1], proc_last_line(res.err, line, sizeof(line)));
        proc_result_clear(&res);
        return errno_from_text(-EIO, *ret_msg);
    }
    if (ret_out)
        *ret_out = TAKE_PTR(res.out);
    proc_result_clear(&res);
    return 0;
}
