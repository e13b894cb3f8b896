/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/qemu/qemuimg.h: running qemu-img, the one way the library does.
 *
 * Every run is bounded by a timeout (proc.h); on failure the message is
 * qemu-img's last stderr line.  A confined run (confine.h: qemu-img on an
 * image nobody vouches for, imagebase.h) is killed at its limits: -EIO with a
 * message naming them.  Blocking: for workers and the CLI.  The callers
 * (image.c, thin.c, imagebase.c) build the argv and always name the format. */
#pragma once

#include <stdint.h>

#define QEMU_IMG_QUICK_MS 30000u /* bound of the quick qemu-img steps (info, create, resize) */

struct confine;
int qemu_img_run(char *const argv[], uint64_t timeout_ms, char **ret_out, char **ret_msg);
int qemu_img_run_confined(char *const argv[], uint64_t timeout_ms, const struct confine *c,
                          char **ret_out, char **ret_msg);
