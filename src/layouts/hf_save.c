/* SPDX-License-Identifier: MIT */
/*
 * The names a module holds in memory (FSDP rank files, DCP folders,
 * DeepSpeed ZeRO files) as verl's merger writes them: it hands the state
 * dict to transformers' save_pretrained, which converts some in-memory
 * forms back to the names on disk (docs/formats.md "Names held in
 * memory"). Checked against verl 0.9.1 with transformers 5.10.4:
 *
 *  - vision-language models: the language model is held under
 *    model.language_model., the vision tower under model.visual. (Qwen) or
 *    model.vision_tower. (Gemma 3). Qwen2-VL and Qwen2.5-VL are written
 *    back as model. and visual., Gemma 3 as language_model.model.,
 *    vision_tower. and multi_modal_projector.; Qwen3-VL keeps them.
 *  - fused expert stacks, <block>.experts.gate_up_proj [E, 2F, H] and
 *    <block>.experts.down_proj [E, H, F]: per model_type, as transformers'
 *    own conversion mapping declares, read from each release by
 *    tests/gen/make_experts_table.py into experts_table.h: written per
 *    expert (experts.<e>.gate_proj, up_proj, down_proj for Qwen3-MoE,
 *    DeepSeek-V3, GLM-4.5, Qwen3-Next; w1, w3, w2 under block_sparse_moe for
 *    Mixtral, its router too), or as held (gpt-oss with its biases, Llama 4,
 *    Qwen3-VL-MoE).
 *
 * Vision-language forms under any other model_type, and fused stacks of a
 * model_type the table lacks, are refused: what save_pretrained writes for
 * them has not been checked.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layouts/layouts.h"

struct prefix_rule {
	const char *from, *to;
};

/* Vision-language models: every name held in memory starts with one of
 * the rule's prefixes (first match renamed). */
struct vlm {
	const char *model_type;
	struct prefix_rule rules[4];
};

static const struct vlm vlms[] = {
	{ "qwen2_vl", { { "model.language_model.", "model." }, { "model.visual.", "visual." },
			{ "lm_head.", "lm_head." } } },
	{ "qwen2_5_vl", { { "model.language_model.", "model." }, { "model.visual.", "visual." },
			  { "lm_head.", "lm_head." } } },
	{ "qwen3_vl", { { "model.language_model.", "model.language_model." },
			{ "model.visual.", "model.visual." }, { "lm_head.", "lm_head." } } },
	{ "qwen3_vl_moe", { { "model.language_model.", "model.language_model." },
			    { "model.visual.", "model.visual." }, { "lm_head.", "lm_head." } } },
	{ "gemma3", { { "model.language_model.", "language_model.model." },
		      { "model.vision_tower.", "vision_tower." },
		      { "model.multi_modal_projector.", "multi_modal_projector." },
		      { "lm_head.", "lm_head." } } },
};

/* The prefixes transformers 5 holds vision-language models under. */
static const char *const vlm_prefixes[] = {
	"model.language_model.", "model.visual.", "model.vision_tower.",
	"model.multi_modal_projector.", "model.vision_model.",
};

/* Fused expert stacks, and what save_pretrained writes them as. */
struct experts {
	const char *model_type;
	const char *block;              /* the MoE block held; NULL: stacks written as held */
	const char *disk_block;         /* its name on disk (every name under it) */
	const char *parts[3];           /* gate, up, down, per expert */
};

static const struct experts experts[] = {
#include "layouts/experts_table.h"
};

static const struct vlm *vlm_of(const struct ckfs_model *m)
{
	for (size_t i = 0; m->model_type && i < sizeof(vlms) / sizeof(vlms[0]); i++)
		if (strcmp(m->model_type, vlms[i].model_type) == 0)
			return &vlms[i];
	return NULL;
}

static const struct experts *experts_of(const struct ckfs_model *m)
{
	for (size_t i = 0; m->model_type && i < sizeof(experts) / sizeof(experts[0]); i++)
		if (strcmp(m->model_type, experts[i].model_type) == 0)
			return &experts[i];
	return NULL;
}

int ckfs_hf_held_as_vlm(const char *name)
{
	for (size_t i = 0; i < sizeof(vlm_prefixes) / sizeof(vlm_prefixes[0]); i++)
		if (ckfs_starts_with(name, vlm_prefixes[i]))
			return 1;
	return 0;
}

static int is_fused_stack(const char *name)
{
	return ckfs_name_has_segment(name, "experts") &&
	       (ckfs_ends_with(name, ".gate_up_proj") || ckfs_ends_with(name, ".down_proj") ||
		ckfs_ends_with(name, ".gate_up_proj_bias") || ckfs_ends_with(name, ".down_proj_bias"));
}

/* ".<block>." and ".<disk_block>." of a block written under another name
 * (Mixtral's block_sparse_moe), or 0 when it keeps its name. */
static int block_rename(const struct experts *e, char held[64], char disk[64])
{
	if (!e || !e->block || strcmp(e->block, e->disk_block) == 0)
		return 0;
	snprintf(held, 64, ".%s.", e->block);
	snprintf(disk, 64, ".%s.", e->disk_block);
	return 1;
}

/* name on disk, into out (cap bytes): the vision-language prefix rule,
 * then the block rename. 1 when it fits, 0 when name is not one the
 * model_type's rule knows, -1 when out is too small. */
static int disk_name(const struct ckfs_model *m, const struct vlm *v, const char *name,
		     char *out, size_t cap)
{
	const char *rest = name, *to = "";
	const struct experts *e = experts_of(m);
	char tmp[1024], held[64], disk[64];

	if (v) {
		size_t k = 0;
		while (k < 4 && v->rules[k].from && !ckfs_starts_with(name, v->rules[k].from))
			k++;
		if (k == 4 || !v->rules[k].from)
			return 0;
		rest = name + strlen(v->rules[k].from);
		to = v->rules[k].to;
	}
	if ((size_t)snprintf(tmp, sizeof(tmp), "%s%s", to, rest) >= sizeof(tmp))
		return -1;
	/* Mixtral: model.layers.<N>.mlp.* is written model.layers.<N>.block_sparse_moe.* */
	const char *blk = block_rename(e, held, disk) ? strstr(tmp, held) : NULL;
	int n = blk ? snprintf(out, cap, "%.*s%s%s", (int)(blk - tmp), tmp, disk, blk + strlen(held))
		    : snprintf(out, cap, "%s", tmp);
	return n >= 0 && (size_t)n < cap ? 1 : -1;
}

enum ckfs_code ckfs_hf_save_name(const struct ckfs_model *m, const char *name, bool held,
				 char *out, size_t cap, struct ckfs_error *err)
{
	const struct vlm *v = vlm_of(m);
	char in[1024];

	if (snprintf(in, sizeof(in), "%s", name) >= (int)sizeof(in))
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': name '%s' is too long", m->src_dir,
				 name);
	int rc = disk_name(m, held ? v : NULL, in, out, cap);
	if (rc < 0)
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': name '%s' is too long", m->src_dir,
				 name);
	if (rc == 0)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': '%s' is not a name %s holds "
				 "in memory", m->src_dir, name, m->model_type);
	return CKFS_OK;
}

enum ckfs_code ckfs_hf_memory_name(const struct ckfs_model *m, const char *disk, char *out,
				   size_t cap, struct ckfs_error *err)
{
	const struct vlm *v = vlm_of(m);
	const struct experts *e = experts_of(m);
	const char *from = "", *rest = disk;
	char tmp[1024], held[64], on_disk[64];

	/* the longest prefix of the model_type's written forms */
	for (size_t k = 0; v && k < 4 && v->rules[k].from; k++)
		if (ckfs_starts_with(disk, v->rules[k].to) &&
		    strlen(v->rules[k].to) > (size_t)(rest - disk)) {
			from = v->rules[k].from;
			rest = disk + strlen(v->rules[k].to);
		}
	int n = snprintf(tmp, sizeof(tmp), "%s%s", from, rest);
	const char *blk = block_rename(e, held, on_disk) ? strstr(tmp, on_disk) : NULL;
	if (n >= 0 && (size_t)n < sizeof(tmp))
		n = blk ? snprintf(out, cap, "%.*s%s%s", (int)(blk - tmp), tmp, held,
				   blk + strlen(on_disk))
			: snprintf(out, cap, "%s", tmp);
	if (n < 0 || (size_t)n >= cap)
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': name '%s' is too long", m->src_dir, disk);
	return CKFS_OK;
}

/* Every name under its name on disk (vision-language prefixes, Mixtral's
 * block); names of a model_type ckfs has no rule for are refused. */
static enum ckfs_code rename_all(struct ckfs_model *m, struct ckfs_error *err)
{
	const struct vlm *v = vlm_of(m);
	const char *first_held = NULL;
	char buf[1024];

	for (size_t i = 0; i < m->n_tensors && !first_held; i++)
		if (ckfs_hf_held_as_vlm(m->tensors[i].name))
			first_held = m->tensors[i].name;
	if (first_held && !v)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': '%s' is a vision-language "
				 "model's name held in memory, and ckfs does not know how "
				 "transformers saves model_type %s", m->src_dir, first_held,
				 m->model_type ? m->model_type : "(none)");
	for (size_t i = 0; i < m->n_tensors; i++) {
		struct ckfs_tensor *t = &m->tensors[i];
		CKFS_TRY(ckfs_hf_save_name(m, t->name, first_held != NULL, buf, sizeof(buf), err));
		if (strcmp(buf, t->name) != 0 && !(t->name = ckfs_arena_strdup(&m->arena, buf)))
			return ckfs_nomem(err);
	}
	return CKFS_OK;
}

/* ---- fused expert stacks ---- */

/* The stack named prefix + suffix, or NULL. */
static const struct ckfs_tensor *find_stack(const struct ckfs_model *m, const char *prefix,
					    size_t len, const char *suffix)
{
	for (size_t i = 0; i < m->n_tensors; i++) {
		const char *n = m->tensors[i].name;
		if (strncmp(n, prefix, len) == 0 && strcmp(n + len, suffix) == 0)
			return &m->tensors[i];
	}
	return NULL;
}

/* The gate_up and down stacks of one MoE block agree: [E, 2F, H] and
 * [E, H, F]. */
static enum ckfs_code check_stacks(const struct ckfs_model *m, const struct ckfs_tensor *gu,
				   const struct ckfs_tensor *down, struct ckfs_error *err)
{
	if (gu->ndim != 3 || down->ndim != 3 || gu->shape[1] % 2 ||
	    down->shape[0] != gu->shape[0] || down->shape[1] != gu->shape[2] ||
	    down->shape[2] != gu->shape[1] / 2)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': expert stacks '%s' [%lld, %lld, "
				 "%lld] and '%s' are not [E, 2F, H] and [E, H, F]", m->src_dir,
				 gu->name, (long long)gu->shape[0], (long long)gu->shape[1],
				 (long long)gu->shape[2], down->name);
	return CKFS_OK;
}

/* ".<block>.experts.gate_up_proj" and ".<block>.experts.down_proj" of x. */
struct stack_suffixes {
	char gate_up[96], down[96];
};

static void stack_suffixes(const struct experts *x, struct stack_suffixes *sfx)
{
	snprintf(sfx->gate_up, sizeof(sfx->gate_up), ".%s.experts.gate_up_proj", x->block);
	snprintf(sfx->down, sizeof(sfx->down), ".%s.experts.down_proj", x->block);
}

/* The tensors of one stack, per expert, appended to out at *n. */
static enum ckfs_code split_stack(struct ckfs_model *m, const struct experts *x,
				  const struct stack_suffixes *sfx, const struct ckfs_tensor *t,
				  struct ckfs_tensor *out, size_t *n, struct ckfs_error *err)
{
	int down = ckfs_ends_with(t->name, sfx->down);
	size_t plen = strlen(t->name) - strlen(down ? sfx->down : sfx->gate_up);
	const struct ckfs_tensor *gu = down ? find_stack(m, t->name, plen, sfx->gate_up) : t;
	const struct ckfs_tensor *dn = down ? t : find_stack(m, t->name, plen, sfx->down);
	char name[1024];

	if (!gu || !dn)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': expert stack '%s' has no %s",
				 m->src_dir, t->name, down ? "gate_up_proj" : "down_proj");
	CKFS_TRY(check_stacks(m, gu, dn, err));
	int64_t f = gu->shape[1] / 2;
	for (int64_t e = 0; e < t->shape[0]; e++)
		for (int part = down ? 2 : 0; part < (down ? 3 : 2); part++) {
			/* Expert e's rows of the part, all columns. */
			struct ckfs_box box = { .lo = { e, part == 1 ? f : 0, 0 },
						.n = { 1, down ? t->shape[1] : f, t->shape[2] },
						.ndrop = 1 };
			snprintf(name, sizeof(name), "%.*s.%s.experts.%lld.%s.weight", (int)plen,
				 t->name, x->block, (long long)e, x->parts[part]);
			CKFS_TRY(ckfs_tensor_cut(m, t, &box, name, &out[(*n)++], err));
		}
	return CKFS_OK;
}

/* Fused stacks, per expert where save_pretrained writes them so. Their
 * names are in memory form (before rename_all). */
static enum ckfs_code split_experts(struct ckfs_model *m, struct ckfs_error *err)
{
	const struct experts *x = experts_of(m);
	struct stack_suffixes sfx;
	size_t n_out = 0, n_new = 0;

	if (x && x->block)
		stack_suffixes(x, &sfx);
	for (size_t i = 0; i < m->n_tensors; i++) {
		const struct ckfs_tensor *t = &m->tensors[i];
		if (!is_fused_stack(t->name))
			continue;
		if (!x)
			return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': '%s' is a fused expert "
					 "stack of model_type %s, which ckfs's table from "
					 "transformers %s does not cover "
					 "(tests/gen/make_experts_table.py table --why)",
					 m->src_dir, t->name,
					 m->model_type ? m->model_type : "(none)",
					 CKFS_EXPERTS_RELEASES);
		if (!x->block)
			continue; /* written as held, biases too */
		if (ckfs_ends_with(t->name, "_bias"))
			return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': '%s' is a fused expert "
					 "bias, and transformers writes model_type %s's experts "
					 "one by one, with no bias", m->src_dir, t->name,
					 m->model_type);
		if (!ckfs_ends_with(t->name, sfx.gate_up) && !ckfs_ends_with(t->name, sfx.down))
			return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': '%s' is a fused expert "
					 "stack outside %s's block '%s'", m->src_dir, t->name,
					 m->model_type, x->block);
		if (t->ndim != 3)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': expert stack '%s' has %d "
					 "dims, not 3", m->src_dir, t->name, t->ndim);
		n_new += (size_t)t->shape[0] * 2;
	}
	if (!x || !x->block || n_new == 0)
		return CKFS_OK;
	struct ckfs_tensor *out = ckfs_arena_calloc(&m->arena, m->n_tensors + n_new + 1,
						    sizeof(*out));
	if (!out)
		return ckfs_nomem(err);
	for (size_t i = 0; i < m->n_tensors; i++) {
		const struct ckfs_tensor *t = &m->tensors[i];
		if (is_fused_stack(t->name))
			CKFS_TRY(split_stack(m, x, &sfx, t, out, &n_out, err));
		else
			out[n_out++] = *t;
	}
	m->tensors = out;
	m->n_tensors = n_out;
	return CKFS_OK;
}

enum ckfs_code ckfs_hf_save_names(struct ckfs_model *m, const struct ckfs_model_options *opt,
				  struct ckfs_error *err)
{
	CKFS_TRY(ckfs_peft_split(m, opt, err));
	CKFS_TRY(ckfs_model_drop_tied(m, err));
	CKFS_TRY(split_experts(m, err));
	CKFS_TRY(rename_all(m, err));
	return ckfs_peft_finish(m, opt, err);
}
