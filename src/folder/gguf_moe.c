/* SPDX-License-Identifier: MIT */
/*
 * The GGUF view's MoE layers (Qwen2-MoE, Qwen3-MoE; DeepSeek's experts
 * are stacked the same way, its keys in gguf_mla.c): config.json's expert
 * keys, checked and written as the converter writes them, and each
 * layer's per-expert weights gathered into the three stacked tensors
 * [n_expert, rows, cols] the converter makes of them (ffn_down_exps,
 * ffn_gate_exps, ffn_up_exps, in that order, where the layer's last
 * expert weight comes in name order). Nothing is copied: a stack's rows
 * are read from its experts' tensors (gguf.c).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "ckfs/json.h"
#include "folder/gguf_int.h"

#define MAX_EXPERTS 4096

static const char *const weights[3] = { "down_proj", "gate_proj", "up_proj" };

static const cJSON *get(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	return v && !cJSON_IsNull(v) ? v : NULL;
}

/* A count config.json must give: transformers' defaults (60 or 128
 * experts...) would be written by the converter, not guessed here. */
static enum ckfs_code count(const cJSON *c, const char *path, const char *k, int64_t max,
			    int64_t *out, struct ckfs_error *err)
{
	const cJSON *v = get(c, k);
	if (!v || !ckfs_json_whole(v, max, out) || *out < 1)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': %s is %s (GGUF view)", path, k,
				 v ? "not a whole number above 0" : "missing");
	return CKFS_OK;
}

enum ckfs_code gguf_moe_config(struct gguf_moe *x, const struct cJSON *c, const char *path,
			       int64_t n_layers, struct ckfs_arena *ar, struct ckfs_error *err)
{
	/* llama.cpp's qwen3moe renormalizes the chosen experts' weights and
	 * its qwen2moe does not, whatever config.json says: the converter
	 * writes no key for it, so a model that differs would run otherwise. */
	const cJSON *norm = get(c, "norm_topk_prob");
	const char *was = !norm                 ? "missing"
			  : cJSON_IsTrue(norm)  ? "true"
			  : cJSON_IsFalse(norm) ? "false"
						: "not a boolean";
	if (x->norm_topk ? !cJSON_IsTrue(norm) : (norm && !cJSON_IsFalse(norm)))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': norm_topk_prob %s, but llama.cpp's %s "
				 "runs every model as with %s (GGUF view)",
				 path, was, x->arch, x->norm_topk ? "true" : "false");
	/* every layer sparse: no dense MLP between the MoE layers */
	const cJSON *step = get(c, "decoder_sparse_step"), *dense = get(c, "mlp_only_layers");
	int64_t s;
	if (step && !(ckfs_json_whole(step, 1, &s) && s == 1))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': decoder_sparse_step other than 1 "
				 "(dense layers): not reproduced by the GGUF view",
				 path);
	if (dense && !(cJSON_IsArray(dense) && cJSON_GetArraySize(dense) == 0))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': mlp_only_layers not empty (dense "
				 "layers): not reproduced by the GGUF view",
				 path);
	const char *k = get(c, "num_local_experts") ? "num_local_experts" : "num_experts";
	CKFS_TRY(count(c, path, k, MAX_EXPERTS, &x->n_expert, err));
	CKFS_TRY(count(c, path, "num_experts_per_tok", x->n_expert, &x->n_used, err));
	CKFS_TRY(count(c, path, "moe_intermediate_size", UINT32_MAX, &x->ff, err));
	if (x->shared)
		CKFS_TRY(count(c, path, "shared_expert_intermediate_size", UINT32_MAX, &x->shexp_ff,
			       err));
	return gguf_moe_alloc(x, n_layers, ar, err);
}

enum ckfs_code gguf_moe_alloc(struct gguf_moe *x, int64_t n_layers, struct ckfs_arena *ar,
			      struct ckfs_error *err)
{
	x->n_layers = n_layers;
	x->slot = ckfs_arena_calloc(ar, (size_t)(n_layers * 3 * x->n_expert) + 1, sizeof(*x->slot));
	x->seen = ckfs_arena_calloc(ar, (size_t)n_layers + 1, sizeof(*x->seen));
	return x->slot && x->seen ? CKFS_OK : ckfs_nomem(err);
}

/* "model.layers.L.mlp.experts.E.W.weight": 1 and its slot; 0: another
 * name (a non-canonical number included: refused as unknown later). */
static int parse(const struct gguf_moe *x, const char *name, int64_t *layer, int64_t *slot)
{
	long long l, e;
	int n = 0;
	char canon[96];

	if (sscanf(name, "model.layers.%lld.mlp.experts.%lld.%n", &l, &e, &n) != 2 || n == 0 ||
	    l < x->first_moe || l >= x->n_layers || e < 0 || e >= x->n_expert)
		return 0;
	snprintf(canon, sizeof(canon), "model.layers.%lld.mlp.experts.%lld.", l, e);
	if (strncmp(name, canon, strlen(canon)) != 0)
		return 0;
	for (int w = 0; w < 3; w++) {
		size_t wl = strlen(weights[w]);
		if (strncmp(name + n, weights[w], wl) == 0 &&
		    strcmp(name + n + wl, ".weight") == 0) {
			*layer = l;
			*slot = (l * 3 + w) * x->n_expert + e;
			return 1;
		}
	}
	return 0;
}

int gguf_moe_take(struct gguf_moe *x, const struct ckfs_tensor *t, int64_t *layer)
{
	int64_t slot;

	if (!x->n_expert || !parse(x, t->name, layer, &slot))
		return 0;
	x->slot[slot] = t;
	return ++x->seen[*layer] == 3 * x->n_expert ? 2 : 1;
}

enum ckfs_code gguf_moe_stack(const struct gguf_moe *x, int64_t layer, int w,
			      struct ckfs_gguf_tensor *o, struct ckfs_arena *ar,
			      struct ckfs_error *err)
{
	const struct ckfs_tensor *const *ts = x->slot + (layer * 3 + w) * x->n_expert;

	for (int64_t e = 0; e < x->n_expert; e++)
		if (ts[e]->out_dtype != ts[0]->out_dtype || ts[e]->ndim != 2 || ts[0]->ndim != 2 ||
		    ts[e]->shape[0] != ts[0]->shape[0] || ts[e]->shape[1] != ts[0]->shape[1])
			return ckfs_fail(err, CKFS_E_UNSUPPORTED,
					 "tensor %s: not the 2-D shape of "
					 "its layer's expert 0 (GGUF view)",
					 ts[e]->name);
	o->name = ckfs_arena_printf(ar, "blk.%lld.ffn_%.*s_exps.weight", (long long)layer,
				    (int)(strlen(weights[w]) - 5), weights[w]);
	if (!o->name)
		return ckfs_nomem(err);
	o->src = ts[0];
	o->experts = ts;
	o->n_expert = x->n_expert;
	o->ne0 = ts[0]->shape[1];
	o->rows = x->n_expert * ts[0]->shape[0];
	return CKFS_OK;
}

enum ckfs_code gguf_moe_complete(const struct gguf_moe *x, struct ckfs_error *err)
{
	for (int64_t l = x->first_moe; l < x->n_layers && x->n_expert; l++)
		if (x->seen[l] != 3 * x->n_expert)
			return ckfs_fail(err, CKFS_E_UNSUPPORTED,
					 "layer %lld has %lld of its %lld "
					 "expert weights (the GGUF view stacks %lld experts' "
					 "gate, up and down projections)",
					 (long long)l, (long long)x->seen[l],
					 (long long)(3 * x->n_expert), (long long)x->n_expert);
	return CKFS_OK;
}

void gguf_moe_counts(const struct gguf_moe *x, struct gguf_kv *kv)
{
	char k[96];

	snprintf(k, sizeof(k), "%s.expert_count", x->arch);
	gguf_kv_u32(kv, k, (uint32_t)x->n_expert);
	snprintf(k, sizeof(k), "%s.expert_used_count", x->arch);
	gguf_kv_u32(kv, k, (uint32_t)x->n_used);
}

void gguf_moe_lengths(const struct gguf_moe *x, struct gguf_kv *kv)
{
	char k[96];

	snprintf(k, sizeof(k), "%s.expert_feed_forward_length", x->arch);
	gguf_kv_u32(kv, k, (uint32_t)x->ff);
	if (!x->shared)
		return;
	snprintf(k, sizeof(k), "%s.expert_shared_feed_forward_length", x->arch);
	gguf_kv_u32(kv, k, (uint32_t)x->shexp_ff);
}
