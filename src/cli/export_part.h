/* SPDX-License-Identifier: MIT */
/* `ckfs export --part I/N` (export_part.c): one export split over N
 * processes, each writing its share of the weight files into a staging
 * folder beside DIR; part 0 then writes the rest and puts DIR in place
 * (docs/formats.md, "Export in parts"). */
#ifndef CKFS_CLI_EXPORT_PART_H
#define CKFS_CLI_EXPORT_PART_H

#include <stdbool.h>
#include <stdint.h>

#include "ckfs/folder.h"

struct export_part {
	unsigned index, count; /* count 0: not split */
};

/* "I/N", "auto" (I and N from a launcher's environment: RANK and
 * WORLD_SIZE, SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT) or
 * "auto/N" (I alone from it, JOB_COMPLETION_INDEX too) into *p; on a
 * bad value 0 with why (a phrase) set, else 1. */
int export_part_parse(const char *text, struct export_part *p, const char **why);

/* Whether node i of f is a weight file the parts share out (top-level
 * only: the folders and what is in them are part 0's). */
bool export_part_file(const struct ckfs_folder *f, size_t i);

/* The part writing each node of f (owner[i]; weight files spread over the
 * parts by the bytes their tensors read, largest first to the least
 * loaded; everything else part 0's), and each part's bytes to read. */
void export_part_assign(const struct ckfs_folder *f, unsigned count, unsigned *owner,
			uint64_t *bytes);

/* The staging folder's plan record: created by the first part to come,
 * compared by the others, so that parts run with other options, another
 * SRC or another N are refused rather than mixed. */
enum ckfs_code export_part_plan(const char *stage, const struct ckfs_folder *f, unsigned count,
				struct ckfs_error *err) CKFS_WARN_UNUSED;

/* The marker of part index done (created and synced; its name is the
 * folder's to sync), whether it exists. */
enum ckfs_code export_part_mark_done(const char *stage, const struct export_part *p,
				     struct ckfs_error *err) CKFS_WARN_UNUSED;
bool export_part_is_done(const char *stage, unsigned index, unsigned count);
/* The staging folder's own records (plan, markers, locks) removed. */
void export_part_forget(const char *stage, unsigned count);

#endif
