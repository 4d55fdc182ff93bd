/* SPDX-License-Identifier: MIT */
/* Fuzz target: a torch.distributed.checkpoint .metadata (pickle VM, the
 * Metadata tree, storage_data and planner_data indexes, chunk placement)
 * served against the real .distcp files of the DCP fixtures. Each input
 * is tried as the .metadata of every fixture folder, so a mutated seed of
 * one folder reaches that folder's items; whatever is accepted must also
 * lay out as safetensors. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/weights.h"
#include "fuzz_common.h"
#include "layouts/layouts.h"

static const char *const folders[] = { "qwen2_fsdp2_w2_optim", "qwen2_plain_nodist",
				       "qwen2_tied_fsdp2_w3" };

static void try_folder(size_t fi, const uint8_t *data, size_t size)
{
	static char real[sizeof(folders) / sizeof(folders[0])][PATH_MAX];
	struct ckfs_model_options opt = { .as_stored = true };
	struct ckfs_model *m = calloc(1, sizeof(*m));
	struct ckfs_error err;
	char path[PATH_MAX];

	if (!m)
		return;
	/* Resolved once per folder: the model keeps absolute paths. */
	if (!real[fi][0]) {
		snprintf(path, sizeof(path), "%s/dcp/%s", CKFS_FIXTURES, folders[fi]);
		if (!realpath(path, real[fi]))
			abort(); /* the fixtures must be there */
	}
	ckfs_arena_init(&m->arena);
	m->layout = &ckfs_layout_dcp;
	m->src_dir = real[fi];
	ckfs_error_clear(&err);
	if (ckfs_dcp_build_from(m, &opt, (const char *)data, size, &err) == CKFS_OK &&
	    ckfs_model_finish(m, &opt, &err) == CKFS_OK) {
		struct ckfs_st_layout l;
		if (ckfs_st_layout_build(m, 0, &l, &err) == CKFS_OK)
			ckfs_st_layout_release(&l);
	}
	if (getenv("CKFS_FUZZ_VERBOSE")) /* what a replayed input reached */
		fprintf(stderr, "%s: %s\n", folders[fi],
			err.code == CKFS_OK ? "served" : err.msg);
	ckfs_model_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	for (size_t i = 0; i < sizeof(folders) / sizeof(folders[0]); i++)
		try_folder(i, data, size);
	return 0;
}
