/* SPDX-License-Identifier: Apache-2.0 */
/* recover.h: start-up recovery, run once by csi_new (startup.h) before
 * the plugin answers: records half-created are undone and half-deleted
 * ones finished, temporary files of killed workers removed, the QSDs of
 * staged volumes adopted or restarted, those of unstaged volumes stopped. */
#pragma once

struct csi;

void csi_recover(struct csi *c);

