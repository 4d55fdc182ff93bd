/* SPDX-License-Identifier: MIT */
/*
 * DeepSpeed ZeRO checkpoints (docs/formats.md, "Input: DeepSpeed ZeRO
 * checkpoints"), served as DeepSpeed's zero_to_fp32 reconstructs them, and
 * lazily: the fp32 master weights live only in the optimizer files' flat
 * partitions, so each output tensor is the stretches of those partitions
 * that hold it, cut into blocks (flat.c). Opening reads metadata only (the
 * zip directories and pickles of every *_model_states.pt and
 * *_optim_states.pt); a read then reads the partition bytes it needs,
 * never padding, never the Adam moments.
 *
 * Which folder: SRC when it holds DeepSpeed files (a step folder,
 * global_stepN/), else the step folder named by SRC/latest
 * (engine.save_checkpoint's folder, or the HF Trainer's checkpoint-N/,
 * whose config.json and tokenizer are served beside the weights).
 *
 * The rules, those of zero_to_fp32 in DeepSpeed 0.19.8 (checked bit for
 * bit against it and against the fp32 masters of the training processes):
 *  - where each trained parameter's elements are: ZeRO-1/2 and
 *    BF16_Optimizer in deepspeed_zero12.c, ZeRO-3 in deepspeed_zero3.c;
 *  - frozen parameters from frozen_param_fragments (ZeRO-1/2: whole;
 *    ZeRO-3: one 1-D piece per rank), persistent buffers from rank 0's
 *    module, tied aliases (shared_params) as their owner's tensor;
 *  - zero_to_fp32's order: buffers, frozen, trained, aliases; then, as
 *    for the other layouts of names held in memory, the wrapper rule
 *    (names.c) and what save_pretrained writes (hf_save.c: the tie rule,
 *    vision-language prefixes, fused expert stacks; the row's flag, applied
 *    by open.c); PEFT names refused.
 *
 * This file is the build in that order and the layout's row; what the
 * pickles say is read in deepspeed_states.c, the files are found by
 * deepspeed_files.c.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/strbuf.h"

#include "layouts/deepspeed_int.h"

/* What only this layout knows of a model, for its describe. */
struct ds_info {
	int zero_stage;            /* 1, 2, 3; 0: BF16_Optimizer (none recorded) */
	const char *tag;           /* of the step folder served; NULL: SRC is it */
};

/* ---- the step folder's files ---- */

static enum ckfs_code open_source(struct ds_build *b, const char *name, uint32_t *index,
				  struct ckfs_error *err)
{
	struct ckfs_model *m = b->m;
	const char *path = ckfs_arena_printf(&m->arena, "%s/%s", b->files.step, name);
	const char *rel = ckfs_arena_printf(&m->arena, "%s%s", b->files.step_rel, name);

	if (!path || !rel)
		return ckfs_nomem(err);
	CKFS_TRY(ckfs_source_open(&m->sources[m->n_sources], &m->policy, path, rel, err));
	*index = (uint32_t)m->n_sources++;
	return CKFS_OK;
}

/* Rank 0's optimizer file: stage and world size, which decide the rest. */
static enum ckfs_code read_optim0(struct ds_build *b, struct ckfs_error *err)
{
	struct ckfs_model *m = b->m;
	uint32_t src;

	if (b->files.n_optim == 0 || !b->files.optim[0]) {
		char name[128];
		ckfs_ds_optim_name(&b->files, 0, name, sizeof(name));
		return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s/%s': not found (rank 0 is needed)",
				 b->files.step, name);
	}
	CKFS_TRY(open_source(b, b->files.optim[0], &src, err));
	CKFS_TRY(ds_open_tree(b, src, &b->optim0, err));
	CKFS_TRY(ds_optim_state(&b->optim0, &b->osd0, err));
	CKFS_TRY(ds_optim_kind(ds_src_path(b, src), b->osd0, &b->stage, &b->ws, err));
	m->world_size = b->ws;
	return CKFS_OK;
}

/* ---- output tensors ---- */

enum ckfs_code ds_add_out(struct ds_build *b, const struct ckfs_out_spec *s, size_t *index,
			  struct ckfs_error *err)
{
	*index = 0;
	if (!ckfs_outs_add(b->m, &b->outs, s, err))
		return err->code;
	*index = b->outs.n - 1;
	return CKFS_OK;
}

/* Persistent buffers: rank 0's module entries named in buffer_names, in
 * module order (zero_to_fp32 keeps them, floating ones as fp32). */
static enum ckfs_code add_buffers(struct ds_build *b, struct ckfs_error *err)
{
	const struct ckfs_pv *mod = b->mv0.module, *bn = b->mv0.buffer_names;
	const int64_t coord[CKFS_MAX_DIMS] = { 0 };

	for (size_t i = 0; i < mod->u.dict.n; i++) {
		const char *name = mod->u.dict.keys[i]->u.str.s;
		int listed = 0;
		for (size_t k = 0; k < ckfs_pv_seq_len(bn) && !listed; k++)
			listed = strcmp(bn->u.seq.items[k]->u.str.s, name) == 0;
		if (!listed)
			continue;
		struct ckfs_sd_entry e;
		size_t o;
		CKFS_TRY(ds_decode_tensor(&b->model0, mod->u.dict.vals[i], name, &e, err));
		struct ckfs_out_spec s = { .name = name, .placement = "buffer",
					   .dtype = e.local.dtype, .ndim = e.local.ndim,
					   .shape = e.local.shape };
		CKFS_TRY(ds_add_out(b, &s, &o, err));
		CKFS_TRY(ckfs_entry_chunks(&e, coord, b->model_src, 0, &ds_out_at(b, o)->chunks,
					   err));
	}
	b->n_buffers = b->outs.n;
	return CKFS_OK;
}

/* Frozen parameters in frozen_param_shapes order: whole fragments under
 * ZeRO-1/2, per-rank pieces under ZeRO-3 (filled rank by rank). */
static enum ckfs_code add_frozen(struct ds_build *b, struct ckfs_error *err)
{
	const struct ckfs_pv *fs = b->mv0.frozen_shapes;

	for (size_t i = 0; fs && i < fs->u.dict.n; i++) {
		const char *name = fs->u.dict.keys[i]->u.str.s;
		struct ds_shape shape;
		size_t o;
		CKFS_TRY(ds_get_shape(b->model0.label, "frozen_param_shapes", name,
				      fs->u.dict.vals[i], &shape, err));
		if (b->stage != 3) {
			CKFS_TRY(ds_frozen_zero12(b, name, &shape, err));
			continue;
		}
		/* The dtype comes with rank 0's piece (plan_frozen3). */
		struct ckfs_out_spec s = { .name = name, .placement = "frozen, partitioned",
					   .dtype = CKFS_DTYPE_INVALID, .ndim = shape.ndim,
					   .shape = shape.v };
		CKFS_TRY(ds_add_out(b, &s, &o, err));
	}
	return CKFS_OK;
}

/* param_alignment_paddings[g][i] (rank 0's, as zero_to_fp32 reads it): 0
 * when the file has none (BF16_Optimizer, DeepSpeed before 0.19). */
static enum ckfs_code align_pad(const struct ds_build *b, size_t g, size_t i, size_t n,
				uint64_t *pad, struct ckfs_error *err)
{
	const struct ckfs_pv *all = ckfs_pv_dict_get(b->osd0, "param_alignment_paddings");
	const struct ckfs_pv *grp;
	int64_t v;

	*pad = 0;
	if (ckfs_pv_is_none(all) || b->stage == 3)
		return CKFS_OK;
	grp = g < ckfs_pv_seq_len(all) ? all->u.seq.items[g] : NULL;
	if (!ckfs_pv_is_seq(grp) || ckfs_pv_seq_len(grp) != n)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': param_alignment_paddings has no %zu "
				 "entries for the %zu parameters of param group %zu",
				 b->optim0.label, n, n, g);
	if (!ckfs_pv_get_int(grp->u.seq.items[i], &v) || v < 0)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': param_alignment_paddings[%zu][%zu] is "
				 "not a count", b->optim0.label, g, i);
	*pad = (uint64_t)v;
	return CKFS_OK;
}

/* Trained parameters in param_shapes order, with their flat offsets. */
static enum ckfs_code add_trained(struct ds_build *b, struct ckfs_error *err)
{
	const struct ckfs_pv *ps = b->mv0.param_shapes;
	size_t total = 0;
	uint64_t off = 0;

	b->n_groups = ckfs_pv_seq_len(ps);
	for (size_t g = 0; g < b->n_groups; g++)
		total += ps->u.seq.items[g]->u.dict.n;
	if (total > CKFS_MAX_TENSORS)
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': too many parameters", b->model0.label);
	b->params = calloc(total + 1, sizeof(*b->params));
	b->need = calloc(b->n_groups + 1, sizeof(*b->need));
	if (!b->params || !b->need)
		return ckfs_nomem(err);
	for (size_t g = 0; g < b->n_groups; g++) {
		const struct ckfs_pv *d = ps->u.seq.items[g];
		char where[64], place[32];
		snprintf(where, sizeof(where), "param_shapes[%zu]", g);
		snprintf(place, sizeof(place), "flat group %zu", g);
		if (b->stage != 3)
			off = 0; /* each group is a flat buffer of its own */
		for (size_t i = 0; i < d->u.dict.n; i++) {
			const char *name = d->u.dict.keys[i]->u.str.s;
			struct ds_param *p = &b->params[b->n_params];
			struct ds_shape shape;
			uint64_t step, pad;
			CKFS_TRY(ds_get_shape(b->model0.label, where, name, d->u.dict.vals[i],
					      &shape, err));
			p->numel = shape.numel;
			CKFS_TRY(align_pad(b, g, i, d->u.dict.n, &pad, err));
			const char *placement = b->stage == 3 ? "partitioned"
						: ckfs_arena_strdup(&b->m->arena, place);
			if (!placement)
				return ckfs_nomem(err);
			/* The dtype is the fp32 partitions' (b->master). */
			struct ckfs_out_spec s = { .name = name, .placement = placement,
						   .dtype = CKFS_DTYPE_INVALID, .ndim = shape.ndim,
						   .shape = shape.v };
			CKFS_TRY(ds_add_out(b, &s, &p->out, err));
			p->group = (int)g;
			p->off = off;
			step = b->stage == 3 ? (p->numel + (uint64_t)b->ws - 1) / (uint64_t)b->ws
					     : p->numel + pad;
			if (__builtin_add_overflow(off, step, &off))
				return ckfs_fail(err, CKFS_E_LIMIT, "'%s': param_shapes overflow",
						 b->model0.label);
			b->n_params++;
		}
		b->need[b->stage == 3 ? 0 : g] = off;
	}
	return CKFS_OK;
}

/* ---- names ---- */

static const char *out_name(const struct ds_build *b, size_t i)
{
	return b->outs.v[i].name;
}

static int cmp_out_name(const void *x, const void *y, void *ctx)
{
	const struct ds_build *b = ctx;
	return strcmp(out_name(b, *(const size_t *)x), out_name(b, *(const size_t *)y));
}

/* The outputs' indices sorted by name (*by, malloc'd). */
static enum ckfs_code sort_outs(const struct ds_build *b, size_t **by, struct ckfs_error *err)
{
	*by = malloc((b->outs.n + 1) * sizeof(**by));
	if (!*by)
		return ckfs_nomem(err);
	for (size_t i = 0; i < b->outs.n; i++)
		(*by)[i] = i;
	qsort_r(*by, b->outs.n, sizeof(**by), cmp_out_name, (void *)b);
	return CKFS_OK;
}

static int find_out(const struct ds_build *b, const size_t *by, const char *name)
{
	size_t lo = 0, hi = b->outs.n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = strcmp(out_name(b, by[mid]), name);
		if (c == 0)
			return 1;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return 0;
}

/* Buffers, frozen and trained parameters name different tensors
 * (zero_to_fp32's dict would keep one of two). */
static enum ckfs_code check_unique(const struct ds_build *b, struct ckfs_error *err)
{
	size_t *by;
	enum ckfs_code rc = CKFS_OK;

	CKFS_TRY(sort_outs(b, &by, err));
	for (size_t i = 1; rc == CKFS_OK && i < b->outs.n; i++)
		if (strcmp(out_name(b, by[i]), out_name(b, by[i - 1])) == 0)
			rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': '%s' is listed twice among the "
				       "buffers, frozen and trained parameters", b->model0.label,
				       out_name(b, by[i]));
	free(by);
	return rc;
}

static size_t out_index(const struct ds_build *b, const char *name)
{
	for (size_t i = 0; i < b->outs.n; i++)
		if (strcmp(out_name(b, i), name) == 0)
			return i;
	return SIZE_MAX;
}

/* Tied parameters (shared_params alias -> owner): the owner's tensor
 * under the alias too, when zero_to_fp32 has the owner. */
static enum ckfs_code add_aliases(struct ds_build *b, struct ckfs_error *err)
{
	const struct ckfs_pv *sp = b->mv0.shared;

	for (size_t i = 0; i < sp->u.dict.n; i++) {
		const char *alias = sp->u.dict.keys[i]->u.str.s;
		const struct ckfs_pv *owner = sp->u.dict.vals[i];
		size_t o, a;
		if (!owner || owner->kind != CKFS_PV_STR)
			return ckfs_fail(err, CKFS_E_FORMAT, "'%s': shared_params['%s'] is not a "
					 "name", b->model0.label, alias);
		if (out_index(b, alias) != SIZE_MAX)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': shared_params ties '%s', "
					 "which is a tensor of its own, to '%s'", b->model0.label,
					 alias, owner->u.str.s);
		o = out_index(b, owner->u.str.s);
		if (o == SIZE_MAX)
			continue; /* zero_to_fp32 skips it too (warned as left out) */
		/* The owner's shape copied: adding the alias may move b->outs. */
		const struct ckfs_out *src = ds_out_at(b, o);
		int64_t shape[CKFS_MAX_DIMS];
		memcpy(shape, src->shape, sizeof(shape));
		struct ckfs_out_spec s = { .name = alias, .placement = "shared",
					   .dtype = src->dtype, .ndim = src->ndim, .shape = shape };
		CKFS_TRY(ds_add_out(b, &s, &a, err));
		for (size_t k = 0; k < ds_out_at(b, o)->chunks.n; k++)
			CKFS_TRY(ckfs_chunk_list_push(&ds_out_at(b, a)->chunks,
						      &ds_out_at(b, o)->chunks.v[k], err));
	}
	return CKFS_OK;
}

/* Module entries zero_to_fp32 leaves out (ZeRO-1 and BF16_Optimizer save
 * no frozen parameters): served without them too, with a warning. */
static enum ckfs_code warn_left_out(struct ds_build *b, struct ckfs_error *err)
{
	const struct ckfs_pv *mod = b->mv0.module;
	char list[512] = "";
	size_t n = 0, *by;

	CKFS_TRY(sort_outs(b, &by, err));
	for (size_t i = 0; i < mod->u.dict.n; i++) {
		const char *name = mod->u.dict.keys[i]->u.str.s;
		if (find_out(b, by, name))
			continue;
		if (n++ < 3)
			snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s",
				 n > 1 ? ", " : "", name);
	}
	free(by);
	if (!n)
		return CKFS_OK;
	return ckfs_model_warn(b->m, err, "%zu entr%s of the model's state dict %s not in the "
			       "ZeRO data and left out, as zero_to_fp32 leaves %s out (ZeRO-1 "
			       "saves no frozen parameters): %s%s", n, n == 1 ? "y" : "ies",
			       n == 1 ? "is" : "are", n == 1 ? "it" : "them", list,
			       n > 3 ? ", ..." : "");
}

/* Hugging Face names through the one name rule (names.c). */
static enum ckfs_code apply_names(struct ds_build *b, struct ckfs_error *err)
{
	size_t n = b->outs.n;
	const char **keys = calloc(n + 1, sizeof(*keys)), **names = calloc(n + 1, sizeof(*names));
	enum ckfs_code rc = CKFS_OK;

	if (!keys || !names)
		rc = ckfs_nomem(err);
	for (size_t i = 0; rc == CKFS_OK && i < n; i++)
		keys[i] = out_name(b, i);
	if (rc == CKFS_OK)
		rc = ckfs_hf_names(b->m, b->model0.label, keys, names, n, true, err);
	for (size_t i = 0; rc == CKFS_OK && i < n; i++)
		b->outs.v[i].name = names[i];
	free(keys);
	free(names);
	return rc;
}

/* ---- the whole ---- */

/* config.json: --config, else the one beside the step folder (the HF
 * Trainer's checkpoint-N/, whose files are then the side files), else
 * SRC/huggingface/. */
static enum ckfs_code load_config(struct ds_build *b, struct ckfs_error *err)
{
	struct ckfs_model *m = b->m;
	char *own = ckfs_arena_printf(&m->arena, "%s/config.json", m->src_dir);
	char *hf_cfg = ckfs_arena_printf(&m->arena, "%s/huggingface/config.json", m->src_dir);
	char *parent = ckfs_arena_printf(&m->arena, "%s/../config.json", m->src_dir);

	if (!own || !hf_cfg || !parent)
		return ckfs_nomem(err);
	int beside = ckfs_path_exists(own);
	const char *hf = beside ? m->src_dir : ckfs_arena_printf(&m->arena, "%s/huggingface",
								     m->src_dir);
	if (!hf)
		return ckfs_nomem(err);
	if (!b->opt->config_path && !beside && !ckfs_path_exists(hf_cfg)) {
		/* SRC is the Trainer's global_stepN/: its config is one up */
		char *up = !b->files.tag ? ckfs_realpath(parent) : NULL;
		enum ckfs_code rc = ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': no config.json (only "
					      "the Hugging Face Trainer saves one beside a DeepSpeed "
					      "checkpoint); pass --config PATH to a Hugging Face "
					      "config.json%s%s%s", m->src_dir, up ? ", e.g. '" : "",
					      up ? up : "", up ? "'" : "");
		free(up);
		return rc;
	}
	return ckfs_model_load_config_from(m, hf, b->opt->config_path, err);
}

/* Optimizer files 1 .. ws-1 as sources 1 .. ws-1 (rank 0's is source 0),
 * then the model states files, whose pickles describe the tensors. */
static enum ckfs_code open_files(struct ds_build *b, struct ckfs_error *err)
{
	struct ckfs_model *m = b->m;
	uint32_t src;

	for (long r = 1; r < b->ws; r++)
		CKFS_TRY(open_source(b, b->files.optim[r], &src, err));
	b->model_src = (uint32_t)m->n_sources;
	for (long r = 0; r < (b->stage == 3 ? b->ws : 1); r++) {
		CKFS_TRY(open_source(b, b->stage == 3 ? b->files.model_rank[r] : b->files.model_all, &src, err));
		CKFS_TRY(ckfs_model_note_meta_source(m, &m->sources[src], err));
	}
	m->ranks_read = ckfs_arena_calloc(&m->arena, (size_t)b->ws, sizeof(int));
	if (!m->ranks_read)
		return ckfs_nomem(err);
	for (int r = 0; r < b->ws; r++)
		m->ranks_read[r] = r;
	m->n_ranks_read = (size_t)b->ws;
	return CKFS_OK;
}

/* The output tensors in zero_to_fp32's order (buffers, frozen, trained,
 * aliases), each with its chunks. */
static enum ckfs_code plan(struct ds_build *b, struct ckfs_error *err)
{
	CKFS_TRY(ds_open_tree(b, b->model_src, &b->model0, err));
	CKFS_TRY(ds_model_states(&b->model0, &b->mv0, err));
	CKFS_TRY(add_buffers(b, err));
	CKFS_TRY(add_frozen(b, err));
	CKFS_TRY(add_trained(b, err));
	CKFS_TRY(check_unique(b, err));
	CKFS_TRY(b->stage == 3 ? ds_plan_zero3(b, err) : ds_plan_zero12(b, err));
	CKFS_TRY(add_aliases(b, err));
	if (b->outs.n == 0)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': no parameters or buffers",
				 b->model0.label);
	return warn_left_out(b, err);
}

/* m's tensors from the outputs; floating buffers served as fp32 unless
 * --dtype says otherwise (zero_to_fp32 calls .float() on them). The names
 * are those a module holds in memory, made what save_pretrained writes as
 * for FSDP and DCP (the row's flag: the tie rule, vision-language
 * prefixes, fused expert stacks; hf_save.c); PEFT (LoRA) names are
 * refused: how a DeepSpeed-trained adapter should be served has not been
 * checked against a reference. */
static enum ckfs_code finish(struct ds_build *b, struct ckfs_error *err)
{
	struct ckfs_model *m = b->m;

	CKFS_TRY(apply_names(b, err));
	CKFS_TRY(ckfs_outs_to_model(m, &b->outs, b->files.step, err));
	for (size_t i = 0; i < b->n_buffers; i++)
		if (ckfs_dtype_is_float(m->tensors[i].stored_dtype))
			m->tensors[i].out_dtype = CKFS_DTYPE_F32;
	if (ckfs_peft_names(m))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': it holds PEFT (LoRA) names "
				 "(base_model.model., lora_): LoRA checkpoints of DeepSpeed are "
				 "not supported yet", b->model0.label);
	return CKFS_OK;
}

static enum ckfs_code build(struct ds_build *b, struct ckfs_error *err)
{
	struct ckfs_model *m = b->m;
	size_t cap;

	CKFS_TRY(ckfs_ds_find_files(m, &b->files, err));
	cap = (size_t)b->files.n_optim + (size_t)b->files.n_model_rank + 1;
	if (!(m->sources = ckfs_arena_calloc(&m->arena, cap, sizeof(*m->sources))))
		return ckfs_nomem(err);
	CKFS_TRY(read_optim0(b, err));
	b->files.ws = b->ws;
	b->files.stage = b->stage;
	CKFS_TRY(ckfs_ds_check_files(&b->files, err));
	CKFS_TRY(load_config(b, err));
	CKFS_TRY(open_files(b, err));
	CKFS_TRY(plan(b, err));
	return finish(b, err);
}

static void release(struct ds_build *b)
{
	ckfs_ds_files_release(&b->files);
	ckfs_torch_close(&b->optim0);
	ckfs_torch_close(&b->model0);
	ckfs_outs_release(&b->outs);
	free(b->params);
	free(b->need);
	free(b->segs);
	free(b->group_pad);
}

static enum ckfs_code deepspeed_build(struct ckfs_model *m, const struct ckfs_model_options *opt,
				      struct ckfs_error *err)
{
	struct ds_build b = { .m = m, .opt = opt, .master = CKFS_DTYPE_INVALID };
	struct ds_info *info = ckfs_arena_calloc(&m->arena, 1, sizeof(*info));
	enum ckfs_code rc = info ? build(&b, err) : ckfs_nomem(err);

	if (rc == CKFS_OK) {
		info->zero_stage = b.stage;
		info->tag = b.files.tag;
		m->layout_info = info;
	}
	release(&b);
	return rc;
}

/* The ZeRO stage, the optimizer it implies, and the tag. */
static enum ckfs_code deepspeed_describe(const struct ckfs_model *m, struct ckfs_facts *f,
					 struct ckfs_error *err)
{
	const struct ds_info *info = m->layout_info;
	struct ckfs_strbuf line = { 0 };

	CKFS_TRY(ckfs_facts_layout_line(f, m, false, err));
	if (info->zero_stage)
		ckfs_strbuf_fmt(&line, "ZeRO-%d", info->zero_stage);
	else
		ckfs_strbuf_str(&line, "BF16_Optimizer (no ZeRO stage recorded)");
	ckfs_strbuf_fmt(&line, ", world size %d", m->world_size);
	if (info->tag)
		ckfs_strbuf_fmt(&line, ", tag %s", info->tag);
	cJSON *o = cJSON_CreateObject();
	bool ok = cJSON_AddNumberToObject(o, "zero_stage", info->zero_stage) &&
		  cJSON_AddStringToObject(o, "optimizer",
					  info->zero_stage == 3 ? "DeepSpeedZeroOptimizer_Stage3"
					  : info->zero_stage    ? "DeepSpeedZeroOptimizer"
								: "BF16_Optimizer") &&
		  (info->tag ? cJSON_AddStringToObject(o, "tag", info->tag)
			     : cJSON_AddNullToObject(o, "tag"));
	return ckfs_facts_add(f, "zero", &line, "deepspeed", ckfs_facts_json(o, ok), err);
}

const struct ckfs_layout ckfs_layout_deepspeed = {
	.name = "deepspeed",
	.what = "a DeepSpeed checkpoint",
	.looks_for = "*_optim_states.pt in it or a step folder",
	.detect = ckfs_ds_detect,
	.build = deepspeed_build,
	.describe = deepspeed_describe,
	.flags = CKFS_LAYOUT_HELD_NAMES,
};
