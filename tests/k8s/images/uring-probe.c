/* SPDX-License-Identifier: Apache-2.0 */
/* tests/k8s/seccomp-probe.sh's probe: tries io_uring_setup once and says
 * whether the kernel (or the seccomp filter it runs under) allowed it.
 * Exit 0: allowed; 1: refused (the errno is printed).  Owns nothing else. */
#include <errno.h>
#include <linux/io_uring.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(void) {
        struct io_uring_params params;
        long fd;

        memset(&params, 0, sizeof(params));
        fd = syscall(__NR_io_uring_setup, 4, &params);
        if (fd < 0) {
                printf("io_uring_setup: refused: %s\n", strerror(errno));
                return 1;
        }
        printf("io_uring_setup: allowed\n");
        close((int) fd);
        return 0;
}
