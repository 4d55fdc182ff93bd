/* SPDX-License-Identifier: MIT */
/*
 * A model's opening (include/ckfs/layouts.h): the layout the table finds
 * (table.c), its build, then what every layout's model goes through once,
 * here and nowhere else: the names by the layout's flags, --base, the dtype
 * rule, the quantizing views (--dtype fp8, w4a16, nvfp4), the model's
 * validation and the start of any deferred checks, in that order.
 */
#include <stdlib.h>

#include "layouts/layouts.h"

/* The one dtype rule: a layout serves each tensor as --dtype auto would
 * (as stored, unless its reference tool says otherwise: DeepSpeed's
 * buffers); any other --dtype applies to every tensor, the adapter's too
 * (with --dtype fp8 or w4a16, bf16: then the quantizing view takes the
 * weights it quantizes). */
static void apply_dtype(struct ckfs_model *m, const struct ckfs_model_options *opt)
{
	if (opt->as_stored)
		return;
	for (size_t i = 0; i < m->n_tensors; i++)
		m->tensors[i].out_dtype = opt->out_dtype;
	for (size_t i = 0; m->lora && i < m->lora->n_tensors; i++)
		m->lora->tensors[i].out_dtype = opt->out_dtype;
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

enum ckfs_code ckfs_model_finish(struct ckfs_model *m, const struct ckfs_model_options *opt,
				 struct ckfs_error *err)
{
	if (m->layout->flags & CKFS_LAYOUT_HELD_NAMES)
		CKFS_TRY(ckfs_hf_save_names(m, opt, err));
	CKFS_TRY(check_base_option(m, opt, err));
	apply_dtype(m, opt);
	CKFS_TRY(ckfs_prequantized_pass(m, opt, err));
	CKFS_TRY(ckfs_fp8_select(m, opt, err));
	CKFS_TRY(ckfs_ct_select(m, opt, err));
	CKFS_TRY(ckfs_plan_validate_model(m, err));
	for (size_t i = 0; i < m->n_sources; i++) {
		ckfs_file_metadata_done(m->sources[i].f);
		m->remote_sources |= m->sources[i].f.remote != NULL;
	}
	return ckfs_checks_start(m, err);
}

/* m->src_dir and the policy's root: SRC's real path (a daemon changes its
 * working directory, and source checks stat the paths again later). */
static enum ckfs_code resolve(struct ckfs_model *m, const char *src, struct ckfs_error *err)
{
	if (!ckfs_path_is_dir(src))
		return ckfs_path_exists(src)
			       ? ckfs_fail(err, CKFS_E_INVALID, "'%s': not a folder", src)
			       : ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': not found", src);
	char *abs = ckfs_realpath(src);
	if (!abs)
		return ckfs_fail_errno(err, "'%s': cannot resolve", src);
	m->src_dir = m->policy.root = ckfs_arena_strdup(&m->arena, abs);
	free(abs);
	return m->src_dir ? CKFS_OK : ckfs_nomem(err);
}

static enum ckfs_code open_model(struct ckfs_model *m, const char *src,
				 const struct ckfs_model_options *opt, struct ckfs_error *err)
{
	CKFS_TRY(resolve(m, src, err));
	int found = ckfs_layout_find(m->src_dir, &m->policy, &m->layout);
	if (found < 0)
		return ckfs_fail_errno(err, "'%s': cannot list", src);
	if (!found)
		return ckfs_layout_not_found(m->src_dir, src, err);
	CKFS_TRY(m->layout->build(m, opt, err));
	return ckfs_model_finish(m, opt, err);
}

enum ckfs_code ckfs_model_open(const char *src, const struct ckfs_model_options *opt,
			       struct ckfs_model **out, struct ckfs_error *err)
{
	struct ckfs_model *m;

	if (!opt->as_stored && ckfs_dtype_size(opt->out_dtype) == 0)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': no output dtype asked for", src);
	if (!(m = calloc(1, sizeof(*m))))
		return ckfs_nomem(err);
	ckfs_arena_init(&m->arena);
	m->policy.follow_symlinks = opt->follow_symlinks;
	enum ckfs_code rc = open_model(m, src, opt, err);
	if (rc != CKFS_OK) {
		ckfs_model_free(m);
		return rc;
	}
	*out = m;
	return CKFS_OK;
}
