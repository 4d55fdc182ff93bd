/* SPDX-License-Identifier: MIT */
/*
 * The GGUF view's deepseek2 (DeepSeek-V3's multi-head latent attention
 * and its MoE), as the converter's DeepseekV2Model writes it: the MLA and
 * expert key-values in its order, and kv_b_proj split per head into
 * attn_k_b (each head's key part transposed, for llama.cpp's absorbed
 * attention) and attn_v_b. Nothing is copied: the parts' rows are read
 * from kv_b_proj itself (gguf.c).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "ckfs/json.h"
#include "folder/gguf_int.h"

#define ARCH        "deepseek2"
#define MAX_EXPERTS 4096

static const cJSON *get(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	return v && !cJSON_IsNull(v) ? v : NULL;
}

/* A whole number config.json must give in [min, max]: transformers'
 * default would be what the converter writes, not guessed here. */
static enum ckfs_code whole(const cJSON *c, const char *path, const char *k, int64_t min,
			    int64_t max, int64_t *out, struct ckfs_error *err)
{
	const cJSON *v = get(c, k);
	if (!v || !ckfs_json_whole(v, max, out) || *out < min)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': %s is %s (GGUF view)", path, k,
				 v ? "out of range or not a whole number" : "missing");
	return CKFS_OK;
}

static enum ckfs_code differs(const char *path, const char *what, struct ckfs_error *err)
{
	return ckfs_fail(err, CKFS_E_UNSUPPORTED,
			 "'%s': %s: llama.cpp's deepseek2 would run the model otherwise "
			 "than transformers' DeepseekV3 (GGUF view, docs/gguf.md)",
			 path, what);
}

/* rope_parameters: the default, or YaRN as the converter writes it (its
 * TextModel keys, then DeepseekV2Model's log multiplier). */
static enum ckfs_code rope(struct gguf_mla *x, const cJSON *c, const char *path,
			   struct ckfs_error *err)
{
	static const char *const known[] = { "rope_type",
					     "rope_theta",
					     "factor",
					     "original_max_position_embeddings",
					     "beta_fast",
					     "beta_slow",
					     "extrapolation_factor",
					     "attention_factor",
					     "attn_factor",
					     "mscale",
					     "mscale_all_dim" };
	const cJSON *r = get(c, "rope_parameters"), *t = r ? get(r, "rope_type") : NULL;
	const char *what = NULL;

	if (!r && get(c, "rope_scaling"))
		what = "rope_scaling (transformers 5 writes rope_parameters)";
	else if (!r || !t || (cJSON_IsString(t) && strcmp(t->valuestring, "default") == 0))
		return CKFS_OK; /* the plain rope: check_config's rules */
	else if (!cJSON_IsObject(r) || !cJSON_IsString(t) || strcmp(t->valuestring, "yarn"))
		what = "rope scaling other than the default and YaRN";
	for (const cJSON *k = r ? r->child : NULL; k && !what; k = k->next) {
		bool ok = false;
		for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
			ok |= strcmp(k->string, known[i]) == 0;
		if (!ok || !(cJSON_IsNumber(k) || cJSON_IsString(k) || cJSON_IsNull(k)))
			what = "a YaRN parameter the converter does not write";
	}
	if (what)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': %s: not reproduced by the GGUF view", path, what);
	const cJSON *factor = get(r, "factor"), *orig = get(r, "original_max_position_embeddings");
	int64_t ctx;
	if (!cJSON_IsNumber(factor) || !orig || !ckfs_json_whole(orig, UINT32_MAX, &ctx))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': YaRN without a factor and a whole "
				 "original_max_position_embeddings (GGUF view)",
				 path);
	x->yarn = true;
	x->factor = factor->valuedouble;
	x->orig_ctx = (double)ctx;
	x->ext = get(r, "extrapolation_factor");
	x->attn = get(r, "attention_factor") ? get(r, "attention_factor") : get(r, "attn_factor");
	x->beta_fast = get(r, "beta_fast");
	x->beta_slow = get(r, "beta_slow");
	x->mscale_all = get(r, "mscale_all_dim");
	const cJSON *ms = get(r, "mscale");
	const cJSON *num[] = { x->ext, x->attn, x->beta_fast, x->beta_slow, x->mscale_all, ms };
	for (size_t i = 0; i < sizeof(num) / sizeof(num[0]); i++)
		if (num[i] && !cJSON_IsNumber(num[i]))
			return ckfs_fail(err, CKFS_E_UNSUPPORTED,
					 "'%s': a YaRN parameter is not a number (GGUF view)",
					 path);
	/* transformers scales attention by mscale / mscale_all_dim (both
	 * given) and the softmax by mscale_all_dim; the file holds only
	 * mscale_all_dim (the log multiplier) */
	if (!ms != !x->mscale_all || (ms && ms->valuedouble != x->mscale_all->valuedouble))
		return differs(path, "YaRN mscale other than mscale_all_dim", err);
	return CKFS_OK;
}

enum ckfs_code gguf_mla_config(struct gguf_mla *x, struct gguf_moe *moe, const struct cJSON *c,
			       const char *path, int64_t n_layers, struct ckfs_arena *ar,
			       struct ckfs_error *err)
{
	int64_t first;

	memset(x, 0, sizeof(*x));
	/* DeepseekV3Config's default is 1536: the converter would write it */
	if (!cJSON_GetObjectItemCaseSensitive(c, "q_lora_rank"))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': q_lora_rank is missing (GGUF view)", path);
	x->q_lora = -1; /* null: q_proj, no q LoRA (DeepSeek-V2-Lite's shape) */
	if (get(c, "q_lora_rank"))
		CKFS_TRY(whole(c, path, "q_lora_rank", 1, UINT32_MAX, &x->q_lora, err));
	CKFS_TRY(whole(c, path, "kv_lora_rank", 1, UINT32_MAX / 2, &x->kv_lora, err));
	CKFS_TRY(whole(c, path, "qk_rope_head_dim", 1, UINT32_MAX / 2, &x->rope, err));
	CKFS_TRY(whole(c, path, "qk_nope_head_dim", 1, UINT32_MAX / 2, &x->nope, err));
	CKFS_TRY(whole(c, path, "v_head_dim", 1, UINT32_MAX / 2, &x->v_head, err));
	CKFS_TRY(whole(c, path, "n_routed_experts", 1, MAX_EXPERTS, &moe->n_expert, err));
	CKFS_TRY(whole(c, path, "num_experts_per_tok", 1, moe->n_expert, &moe->n_used, err));
	CKFS_TRY(whole(c, path, "moe_intermediate_size", 1, UINT32_MAX, &moe->ff, err));
	CKFS_TRY(whole(c, path, "n_shared_experts", 1, UINT32_MAX, &x->n_shared, err));
	CKFS_TRY(whole(c, path, "n_group", 1, moe->n_expert, &x->n_group, err));
	CKFS_TRY(whole(c, path, "topk_group", 1, x->n_group, &x->topk_group, err));
	CKFS_TRY(whole(c, path, "first_k_dense_replace", 0, n_layers, &first, err));
	const cJSON *scale = get(c, "routed_scaling_factor"), *norm = get(c, "norm_topk_prob");
	if (!cJSON_IsNumber(scale))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': routed_scaling_factor is %s (GGUF view)", path,
				 scale ? "not a number" : "missing");
	if (!cJSON_IsBool(norm))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': norm_topk_prob is %s (GGUF view)",
				 path, norm ? "not a boolean" : "missing");
	x->scale = scale->valuedouble;
	x->norm = cJSON_IsTrue(norm);
	/* transformers' DeepseekV3 always routes by sigmoid; llama.cpp by
	 * softmax unless the converter writes the gating key, which it does
	 * from scoring_func alone */
	const cJSON *score = get(c, "scoring_func");
	if (!(cJSON_IsString(score) && strcmp(score->valuestring, "sigmoid") == 0))
		return differs(path,
			       score ? "scoring_func other than sigmoid"
				     : "scoring_func missing (softmax routing in llama.cpp)",
			       err);
	x->sigmoid = true;
	/* llama.cpp's rope pairs adjacent values, as transformers does with
	 * rope_interleave (its default) */
	const cJSON *inter = get(c, "rope_interleave");
	if (inter && !cJSON_IsTrue(inter))
		return differs(path, "rope_interleave false", err);
	CKFS_TRY(rope(x, c, path, err));
	moe->first_moe = first;
	return gguf_moe_alloc(moe, n_layers, ar, err);
}

static void u32(struct gguf_kv *kv, const char *k, int64_t v)
{
	char key[96];
	snprintf(key, sizeof(key), ARCH ".%s", k);
	gguf_kv_u32(kv, key, (uint32_t)v);
}

static void f32(struct gguf_kv *kv, const char *k, const cJSON *v)
{
	if (v)
		gguf_kv_f32(kv, k, (float)v->valuedouble);
}

void gguf_mla_kv_rope(const struct gguf_mla *x, struct gguf_kv *kv)
{
	if (!x->yarn)
		return;
	gguf_kv_str(kv, ARCH ".rope.scaling.type", "yarn");
	gguf_kv_f32(kv, ARCH ".rope.scaling.factor", (float)x->factor);
	u32(kv, "rope.scaling.original_context_length", (int64_t)x->orig_ctx);
	f32(kv, ARCH ".rope.scaling.yarn_ext_factor", x->ext);
	f32(kv, ARCH ".rope.scaling.yarn_attn_factor", x->attn);
	f32(kv, ARCH ".rope.scaling.yarn_beta_fast", x->beta_fast);
	f32(kv, ARCH ".rope.scaling.yarn_beta_slow", x->beta_slow);
}

void gguf_mla_kv_experts(const struct gguf_mla *x, const struct gguf_moe *moe, struct gguf_kv *kv)
{
	u32(kv, "expert_count", moe->n_expert);
	u32(kv, "expert_used_count", moe->n_used);
	u32(kv, "expert_group_count", x->n_group);
	u32(kv, "expert_group_used_count", x->topk_group);
	if (x->sigmoid)
		u32(kv, "expert_gating_func", 2); /* ExpertGatingFuncType.SIGMOID */
	/* where TextModel writes head_dim (always in DeepseekV3Config), with
	 * the values DeepseekV2Model then overwrites it with: MLA as MQA */
	u32(kv, "attention.key_length", x->kv_lora + x->rope);
	u32(kv, "attention.value_length", x->kv_lora);
}

void gguf_mla_kv_rest(const struct gguf_mla *x, const struct gguf_moe *moe, int64_t n_vocab,
		      struct gguf_kv *kv)
{
	u32(kv, "leading_dense_block_count", moe->first_moe);
	u32(kv, "vocab_size", n_vocab);
	if (x->q_lora >= 0)
		u32(kv, "attention.q_lora_rank", x->q_lora);
	u32(kv, "attention.kv_lora_rank", x->kv_lora);
	u32(kv, "attention.key_length_mla", x->nope + x->rope);
	u32(kv, "attention.value_length_mla", x->v_head);
	u32(kv, "expert_feed_forward_length", moe->ff);
	u32(kv, "expert_shared_count", x->n_shared);
	gguf_kv_f32(kv, ARCH ".expert_weights_scale", (float)x->scale);
	if (x->norm)
		gguf_kv_bool(kv, ARCH ".expert_weights_norm", true);
	u32(kv, "rope.dimension_count", x->rope);
	if (x->yarn && x->mscale_all) /* DeepseekV2Model's own scale, as it writes it */
		gguf_kv_f32(kv, ARCH ".rope.scaling.yarn_log_multiplier",
			    (float)(0.1 * x->mscale_all->valuedouble));
}

enum ckfs_code gguf_mla_split(const struct gguf_mla *x, const struct ckfs_tensor *t, int64_t layer,
			      int64_t heads, struct ckfs_gguf_tensor o[2], struct ckfs_arena *ar,
			      struct ckfs_error *err)
{
	int64_t per = x->nope + x->v_head;

	/* the converter's own assertion, with the original head count */
	if (t->ndim != 2 || t->shape[0] != heads * per)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "tensor %s: not %lld heads of %lld rows "
				 "(num_key_value_heads, qk_nope_head_dim + v_head_dim)",
				 t->name, (long long)heads, (long long)per);
	o[0].name = ckfs_arena_printf(ar, "blk.%lld.attn_k_b.weight", (long long)layer);
	o[1].name = ckfs_arena_printf(ar, "blk.%lld.attn_v_b.weight", (long long)layer);
	if (!o[0].name || !o[1].name)
		return ckfs_nomem(err);
	for (int i = 0; i < 2; i++) {
		o[i].src = t;
		o[i].heads = heads;
		o[i].head_stride = per;
	}
	/* k_b: [heads, kv_lora, nope], row (h, c) column c of h's key rows */
	o[0].transposed = true;
	o[0].ne0 = x->nope;
	o[0].rows = heads * t->shape[1];
	/* v_b: [heads, v_head, kv_lora], h's rows after its key rows */
	o[1].head_skip = x->nope;
	o[1].ne0 = t->shape[1];
	o[1].rows = heads * x->v_head;
	return CKFS_OK;
}
