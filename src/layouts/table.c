/* SPDX-License-Identifier: MIT */
/*
 * The layouts ckfs reads, one row each (include/ckfs/layouts.h), in the
 * order detection tries them (docs/formats.md, "Which layout a folder
 * has"); the first row whose detect claims a folder reads it. Each row's
 * detect, in its layout's file, looks at names (and stat) only.
 *
 * The order is the rule: a verl folder that also saved HF weights
 * (save_contents "hf_model") is read from its rank files or dist_ckpt,
 * Megatron's bare dist_ckpt (metadata.json beside .metadata) before plain
 * DCP, and the HF Trainer's ZeRO-1/2 checkpoint-N/ from its fp32 masters,
 * not from the bf16 model.safetensors beside them.
 *
 * ckfs_model_open (open.c), the run scanner (run.c: a global_step_<N>
 * folder a layout claims is that checkpoint, not a step) and the message
 * for a folder no row claims all read this table.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "layouts/layouts.h"

static const struct ckfs_layout *const layouts[] = {
	&ckfs_layout_fsdp, &ckfs_layout_megatron, &ckfs_layout_megatron_dist,
	&ckfs_layout_dcp,  &ckfs_layout_deepspeed, &ckfs_layout_hf,
};
#define N_LAYOUTS (sizeof(layouts) / sizeof(layouts[0]))

int ckfs_layout_find(const char *dir, const struct ckfs_file_policy *pol,
		     const struct ckfs_layout **out)
{
	*out = NULL;
	for (size_t i = 0; i < N_LAYOUTS; i++) {
		int found = layouts[i]->detect(dir, pol);
		if (found < 0)
			return -1;
		if (found) {
			*out = layouts[i];
			return 1;
		}
	}
	return 0;
}

enum ckfs_code ckfs_layout_not_found(const char *dir, const char *src, struct ckfs_error *err)
{
	char path[4096], msg[1024];
	size_t n = 0;

	snprintf(path, sizeof(path), "%s/actor", dir);
	if (ckfs_path_is_dir(path)) /* a verl step folder, one level too high */
		return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': no %s; did you mean '%s/actor'?",
				 src, layouts[0]->looks_for, src);
	/* One clause per kind of checkpoint: rows of one kind (Megatron's
	 * two) share it. */
	for (size_t i = 0; i < N_LAYOUTS && n < sizeof(msg); i++) {
		bool same = i && strcmp(layouts[i]->what, layouts[i - 1]->what) == 0;
		bool last = i + 1 == N_LAYOUTS ||
			    strcmp(layouts[i + 1]->what, layouts[i]->what) != 0;
		if (same)
			n += (size_t)snprintf(msg + n, sizeof(msg) - n, " or %s",
					      layouts[i]->looks_for);
		else
			n += (size_t)snprintf(msg + n, sizeof(msg) - n, "%s%s (no %s",
					      i ? ", nor " : "not ", layouts[i]->what,
					      layouts[i]->looks_for);
		if (last && n < sizeof(msg))
			n += (size_t)snprintf(msg + n, sizeof(msg) - n, ")");
	}
	return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': %s", src, msg);
}

int ckfs_dir_has(const char *dir, bool (*match)(const char *name))
{
	struct ckfs_dir *d = ckfs_opendir(dir);
	const char *de_name;
	bool de_dir;
	bool found = false;

	if (!d)
		return -1;
	while (!found && (de_name = ckfs_readdir(d, &de_dir)))
		found = match(de_name);
	int saved = errno;
	ckfs_closedir(d);
	errno = saved;
	return found;
}
