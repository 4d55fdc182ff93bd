/* SPDX-License-Identifier: MIT */
/*
 * Which layout a checkpoint folder has, and the model's lifetime
 * (ckfs_model_open). Detection looks at names only, in
 * this order, and the first match decides:
 *
 *   1. verl FSDP rank files: SRC/model_world_size_<W>_rank_<R>.pt (fsdp.c);
 *   2. legacy Megatron per-rank files: SRC/model/mp_rank_TT[_PPP]/
 *      (megatron.c);
 *   3. Megatron dist_checkpointing (torch_dist): SRC/ckpt_contents.json
 *      naming a megatron_dist_checkpoint model, SRC/model/dist_ckpt/,
 *      SRC/dist_ckpt/, or SRC/metadata.json beside SRC/.metadata
 *      (megatron_dist.c);
 *   4. torch.distributed.checkpoint: SRC/.metadata (dcp.c);
 *   5. DeepSpeed ZeRO: a *_model_states.pt or *_optim_states.pt name in
 *      SRC or in a folder of SRC (global_stepN/, beside `latest`)
 *      (deepspeed.c);
 *   6. Hugging Face weights: model.safetensors or
 *      model.safetensors.index.json in SRC, SRC/huggingface or
 *      SRC/model/huggingface (hf.c).
 *
 * So a verl folder that also saved HF weights (save_contents "hf_model")
 * is still read from its rank files or dist_ckpt, and the HF Trainer's
 * ZeRO-1/2 checkpoint-N/ from its fp32 masters, not from the bf16
 * model.safetensors beside them; a ckpt_contents.json whose
 * contents.model is HF weights (mbridge) goes to hf.c. A folder with none
 * of these is an error listing what was looked for.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "layouts/layouts.h"

/* 1 when dir holds a name of an FSDP rank file (well spelt or not: the
 * FSDP reader refuses the badly spelt ones), 0 when not, -1 (errno set)
 * when it cannot be listed. */
static int has_rank_files(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int found = 0;
	struct ckfs_rank_file rf;

	if (!d)
		return -1;
	while (!found && (de = readdir(d)))
		found = ckfs_fsdp_rank_file_name(de->d_name, &rf) != CKFS_RANK_NAME_NONE;
	closedir(d);
	return found;
}

/* The first of SRC, SRC/huggingface, SRC/model/huggingface holding
 * safetensors weights, as an arena string; NULL when none does. */
static const char *find_hf_weights(struct ckfs_model *m, int *oom)
{
	static const char *const subdirs[] = { "", "/huggingface", "/model/huggingface" };

	*oom = 0;
	for (size_t i = 0; i < sizeof(subdirs) / sizeof(subdirs[0]); i++) {
		char path[4096];
		if ((size_t)snprintf(path, sizeof(path), "%s%s/model.safetensors",
				     m->src_dir, subdirs[i]) >= sizeof(path))
			continue;
		int single = ckfs_path_exists(path);
		snprintf(path, sizeof(path), "%s%s/model.safetensors.index.json",
			 m->src_dir, subdirs[i]);
		if (single || ckfs_path_exists(path)) {
			char *dir = ckfs_arena_printf(&m->arena, "%s%s", m->src_dir,
						      subdirs[i]);
			*oom = !dir;
			return dir;
		}
	}
	return NULL;
}

static enum ckfs_code explain_unknown(const struct ckfs_model *m, const char *src,
				      struct ckfs_error *err)
{
	char path[4096];

	snprintf(path, sizeof(path), "%s/actor", m->src_dir);
	if (ckfs_path_is_dir(path))
		return ckfs_fail(err, CKFS_E_NOTFOUND,
				 "'%s': no model_world_size_*_rank_*.pt files; "
				 "did you mean '%s/actor'?", src, src);
	return ckfs_fail(err, CKFS_E_NOTFOUND,
			 "'%s': not a verl FSDP checkpoint (no "
			 "model_world_size_*_rank_*.pt files), nor a Megatron "
			 "checkpoint (no model/mp_rank_* or dist_ckpt/), nor a "
			 "torch.distributed.checkpoint folder (no .metadata), nor a "
			 "DeepSpeed checkpoint (no *_optim_states.pt in it or a step "
			 "folder), nor Hugging Face weights (no model.safetensors or "
			 "model.safetensors.index.json in it, huggingface/ or "
			 "model/huggingface/)", src);
}

static enum ckfs_code dispatch(struct ckfs_model *m, const char *src,
			       const struct ckfs_model_options *opt,
			       struct ckfs_error *err)
{
	char path[4096];
	int oom;

	int rank_files = has_rank_files(m->src_dir);
	if (rank_files < 0)
		return ckfs_fail_errno(err, "'%s': cannot list", src);
	if (rank_files) {
		m->layout = "verl-fsdp";
		return ckfs_fsdp_build(m, opt, err);
	}
	if (ckfs_megatron_detect(m->src_dir)) {
		m->layout = "megatron";
		return ckfs_megatron_build(m, opt, err);
	}
	if (ckfs_megatron_dist_detect(m)) {
		m->layout = "megatron-dist";
		return ckfs_megatron_dist_build(m, opt, err);
	}
	snprintf(path, sizeof(path), "%s/.metadata", m->src_dir);
	if (ckfs_path_exists(path)) {
		m->layout = "dcp";
		return ckfs_dcp_build(m, opt, err);
	}
	int deepspeed = ckfs_deepspeed_detect(m->src_dir);
	if (deepspeed < 0)
		return ckfs_fail_errno(err, "'%s': cannot list", src);
	if (deepspeed) {
		m->layout = "deepspeed";
		return ckfs_deepspeed_build(m, opt, err);
	}
	const char *hf = find_hf_weights(m, &oom);
	if (oom)
		return ckfs_nomem(err);
	if (hf) {
		m->layout = "hf";
		return ckfs_hf_build(m, opt, hf, err);
	}
	return explain_unknown(m, src, err);
}

/* The one dtype rule: a layout serves each tensor as --dtype auto would
 * (as stored, unless its reference tool says otherwise: DeepSpeed's
 * buffers); any other --dtype applies to every tensor, the adapter's too,
 * and --dtype fp8 is bf16 for all but the weights fp8.c quantizes. */
static void apply_dtype(struct ckfs_model *m, const struct ckfs_model_options *opt)
{
	enum ckfs_dtype to = opt->out_dtype == CKFS_DTYPE_F8_E4M3 ? CKFS_DTYPE_BF16
								   : opt->out_dtype;

	if (opt->out_dtype == CKFS_DTYPE_AUTO)
		return;
	for (size_t i = 0; i < m->n_tensors; i++)
		m->tensors[i].out_dtype = to;
	for (size_t i = 0; m->lora && i < m->lora->n_tensors; i++)
		m->lora->tensors[i].out_dtype = to;
}

/* --base belongs to LoRA checkpoints without base weights (peft.c takes it
 * in); any other checkpoint given one is refused, not served without it. */
static enum ckfs_code check_base_option(const struct ckfs_model *m,
					const struct ckfs_model_options *opt,
					struct ckfs_error *err)
{
	if (opt->base_path && !(m->lora && m->lora->only))
		return ckfs_fail(err, CKFS_E_INVALID, "'%s' is not a LoRA adapter saved "
				 "alone: --base is for those", m->src_dir);
	return CKFS_OK;
}

enum ckfs_code ckfs_model_open(const char *src, const struct ckfs_model_options *opt,
			       struct ckfs_model **out, struct ckfs_error *err)
{
	struct ckfs_model *m;
	enum ckfs_code rc;

	if (opt->out_dtype == CKFS_DTYPE_INVALID ||
	    (opt->out_dtype >= CKFS_DTYPE_COUNT && opt->out_dtype != CKFS_DTYPE_AUTO))
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': no output dtype asked for", src);
	if (!(m = calloc(1, sizeof(*m))))
		return ckfs_nomem(err);
	ckfs_arena_init(&m->arena);
	m->layout = "unknown";
	m->policy.follow_symlinks = opt->follow_symlinks;
	if (!ckfs_path_is_dir(src)) {
		rc = ckfs_path_exists(src) ? ckfs_fail(err, CKFS_E_INVALID, "'%s': not a folder", src)
				 : ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': not found", src);
		goto fail;
	}
	/* Absolute paths: a daemon changes its working directory, and source
	 * checks stat the paths again later. */
	char *abs = realpath(src, NULL);
	m->src_dir = m->policy.root = abs ? ckfs_arena_strdup(&m->arena, abs) : NULL;
	free(abs);
	if (!m->src_dir) {
		rc = abs ? ckfs_nomem(err) : ckfs_fail_errno(err, "'%s': cannot resolve", src);
		goto fail;
	}
	if ((rc = dispatch(m, src, opt, err)) != CKFS_OK ||
	    (rc = check_base_option(m, opt, err)) != CKFS_OK)
		goto fail;
	apply_dtype(m, opt);
	if ((rc = ckfs_fp8_select(m, opt, err)) != CKFS_OK ||
	    (rc = ckfs_plan_validate_model(m, err)) != CKFS_OK)
		goto fail;
	*out = m;
	return CKFS_OK;
fail:
	ckfs_model_free(m);
	return rc;
}
