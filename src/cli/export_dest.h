/* SPDX-License-Identifier: MIT */
/* The destination of `ckfs export`: what it may replace, its locks, and
 * the folders interrupted exports left (export_dest.c). */
#ifndef CKFS_CLI_EXPORT_DEST_H
#define CKFS_CLI_EXPORT_DEST_H

#include <stdbool.h>

#include "ckfs/folder.h"
#include "ckfs/model.h"

/* Refuse a DIR that is SRC or above it, a name ending in "." or "..", and
 * (replacing: DIR exists and --force was given) a DIR holding a file the
 * plan of m and f reads. */
enum ckfs_code ckfs_export_dest_check(const char *dst, bool replacing,
				      const struct ckfs_model *m,
				      const struct ckfs_folder *f,
				      struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Remove what killed exports to dst left beside it, saying so on stderr. */
void ckfs_export_dest_clean(const char *dst);
/* An exclusive flock on the folder dir (not following a symlink): the
 * descriptor holding it, or -1 when it is held elsewhere or cannot be
 * taken. Held by an export for each folder that is its own. */
int ckfs_export_dest_lock(const char *dir);
/* Remove the tree at dir (not following symlinks, not crossing mounts). */
int ckfs_export_dest_remove(const char *dir);

#endif
