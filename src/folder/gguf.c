/* SPDX-License-Identifier: MIT */
/*
 * The GGUF view's file (include/ckfs/gguf.h): which tensors, named and
 * typed as convert_hf_to_gguf.py does for the architectures ckfs knows,
 * the header with the key-values in the converter's order, and reads of
 * any byte range, converting whole rows (a row is a whole number of
 * blocks) and copying the part asked for.
 */
#include "ckfs/gguf.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/dtype.h"
#include "ckfs/json.h"
#include "folder/gguf_int.h"

#define ALIGN 32               /* general.alignment's default */
#define READ_CHUNK (1u << 20)  /* source values converted per step */
#define MAX_VOCAB (1 << 24)    /* tokens in the header (the largest real: 262k) */

/* When the converter writes attention.key_length and value_length: it
 * writes head_dim when transformers' config object has one. LlamaConfig
 * always does (hidden / heads when config.json has none); Qwen2Config
 * only when config.json gives it; Qwen3Config always, defaulting to 128,
 * which ckfs does not guess. */
enum head_dim_rule { HEAD_DIM_OR_QUOTIENT, HEAD_DIM_IF_GIVEN, HEAD_DIM_REQUIRED };

/* Dense, or experts (Qwen3-MoE: llama.cpp renormalizes the top-k
 * weights), or experts and a gated shared expert (Qwen2-MoE: it does not),
 * or DeepSeek's MLA with leading dense layers, then experts and shared
 * experts (gguf_mla.c). */
enum moe {
	DENSE,
	MOE,
	MOE_SHARED,
	MLA
};

/* The architectures served: the converter's model class and what it adds. */
struct arch {
	const char *hf;          /* config.json's architectures[0] */
	const char *name;        /* general.architecture */
	bool llama;              /* LlamaModel: Q/K permuted, vocab_size and rope
				  * dimension count written */
	bool qk_norm;            /* Qwen3's q_norm and k_norm */
	enum head_dim_rule head_dim;
	enum moe moe;
};
static const struct arch archs[] = {
	{ "LlamaForCausalLM", "llama", true, false, HEAD_DIM_OR_QUOTIENT, DENSE },
	{ "MistralForCausalLM", "llama", true, false, HEAD_DIM_OR_QUOTIENT, DENSE },
	{ "Qwen2ForCausalLM", "qwen2", false, false, HEAD_DIM_IF_GIVEN, DENSE },
	{ "Qwen3ForCausalLM", "qwen3", false, true, HEAD_DIM_REQUIRED, DENSE },
	{ "Qwen2MoeForCausalLM", "qwen2moe", false, false, HEAD_DIM_IF_GIVEN, MOE_SHARED },
	{ "Qwen3MoeForCausalLM", "qwen3moe", false, true, HEAD_DIM_REQUIRED, MOE },
	{ "DeepseekV3ForCausalLM", "deepseek2", false, false, HEAD_DIM_IF_GIVEN, MLA },
};

/* The keys of refused_keys the MoE architectures read (NULL ends). */
static const char *const moe_keys[] = { "num_local_experts", "num_experts", "num_experts_per_tok",
					NULL };
static const char *const mla_keys[] = { "n_routed_experts", "num_experts_per_tok", "n_group",
					"topk_group",       "scoring_func",        NULL };

/* config.json keys that make the converter write or do something this
 * view does not (experts, other norms, non-causal attention, nested
 * configs, quantized weights, draft models, partial rotary). */
static const char *const refused_keys[] = {
	"layer_norm_eps", "layer_norm_epsilon", "norm_epsilon", "num_local_experts",
	"num_experts", "n_routed_experts", "num_experts_per_tok", "num_experts_per_token",
	"top_k_experts", "n_group", "topk_group", "score_function", "scoring_func",
	"score_func", "moe_router_activation", "moe_router_activation_func",
	"expert_selection_fn", "text_config", "llm_config", "lm_config", "thinker_config",
	"language_config", "lfm", "quantization_config", "draft_vocab_size",
	"transformer_layer_config", "partial_rotary_factor", "rope_pct", "rope_percent",
	"global_rope_theta", "rope_global_theta", "rope_theta_global", "local_rope_theta",
	"rope_local_theta", "rope_theta_local", "swa_rope_theta", "rope_local_base_freq",
	"prefix_dense_intermediate_size", "dense_intermediate_size", "n_layers", "n_layer",
	"num_layers", "n_ctx", "n_positions", "n_embd", "n_head", "n_heads", "n_kv_heads",
	"norm_eps", "rotary_emb_base", "mrope_section",
};

/* Which architectures (and layers) have a layer tensor. */
enum only {
	ALL,
	NOT_MLA,
	QK_NORM,
	DENSE_MLP,
	ROUTER,
	SHARED_EXPERT,
	MLA_ATTN,
	MLA_Q, /* without q LoRA (q_lora_rank null) */
	MLA_Q_LORA,
	MLA_MOE
};

/* HF names inside model.layers.N. and what they become in blk.N (the
 * experts' own weights: gguf_moe.c). */
static const struct {
	const char *hf, *gguf;
	enum only only;
} layer_names[] = {
	{ "input_layernorm.weight", "attn_norm.weight", ALL },
	{ "post_attention_layernorm.weight", "ffn_norm.weight", ALL },
	{ "self_attn.q_proj.weight", "attn_q.weight", NOT_MLA },
	{ "self_attn.k_proj.weight", "attn_k.weight", NOT_MLA },
	{ "self_attn.v_proj.weight", "attn_v.weight", NOT_MLA },
	{ "self_attn.o_proj.weight", "attn_output.weight", ALL },
	{ "self_attn.q_proj.bias", "attn_q.bias", NOT_MLA },
	{ "self_attn.k_proj.bias", "attn_k.bias", NOT_MLA },
	{ "self_attn.v_proj.bias", "attn_v.bias", NOT_MLA },
	{ "mlp.gate_proj.weight", "ffn_gate.weight", DENSE_MLP },
	{ "mlp.up_proj.weight", "ffn_up.weight", DENSE_MLP },
	{ "mlp.down_proj.weight", "ffn_down.weight", DENSE_MLP },
	{ "self_attn.q_norm.weight", "attn_q_norm.weight", QK_NORM },
	{ "self_attn.k_norm.weight", "attn_k_norm.weight", QK_NORM },
	{ "mlp.gate.weight", "ffn_gate_inp.weight", ROUTER },
	{ "mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight", SHARED_EXPERT },
	{ "mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight", SHARED_EXPERT },
	{ "mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight", SHARED_EXPERT },
	{ "mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight", SHARED_EXPERT },
	/* kv_b_proj: split by gguf_mla.c */
	{ "self_attn.q_proj.weight", "attn_q.weight", MLA_Q },
	{ "self_attn.q_a_proj.weight", "attn_q_a.weight", MLA_Q_LORA },
	{ "self_attn.q_b_proj.weight", "attn_q_b.weight", MLA_Q_LORA },
	{ "self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight", MLA_Q_LORA },
	{ "self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight", MLA_ATTN },
	{ "self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight", MLA_ATTN },
	{ "mlp.gate.e_score_correction_bias", "exp_probs_b.bias", MLA_MOE },
	{ "mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight", MLA_MOE },
	{ "mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight", MLA_MOE },
	{ "mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight", MLA_MOE },
};

/* Tests only (tests/py/test_gguf.py, tests/cli/test_gguf.sh): the MoE
 * architectures' tokenizer read by the SentencePiece path, as the tests'
 * converter wrapper (tests/gguf/convert_spm.py) makes the converter do. */
#define SPM_TEST_ENV "CKFS_GGUF_TEST_MOE_SPM"

struct build {
	const struct ckfs_model *m;
	const struct ckfs_gguf_options *opt;
	const struct arch *arch;
	cJSON *config, *gen;
	int64_t n_head, n_kv_head, n_layers;
	struct gguf_moe moe;
	struct gguf_mla mla;
	struct ckfs_gguf_file *g;
	struct ckfs_error *err;
};

static const cJSON *get(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	return v && !cJSON_IsNull(v) ? v : NULL;
}

static enum ckfs_code refuse(struct build *b, const char *what)
{
	return ckfs_fail(b->err, CKFS_E_UNSUPPORTED, "'%s': %s: not reproduced by the GGUF "
			 "view (docs/gguf.md)", b->m->config_path, what);
}

/* A whole-number hyperparameter the converter writes as uint32. */
static enum ckfs_code whole(struct build *b, const char *k, bool need, int64_t *out)
{
	const cJSON *v = get(b->config, k);
	*out = -1;
	if (!v && !need)
		return CKFS_OK;
	if (!v || !ckfs_json_whole(v, UINT32_MAX, out))
		return ckfs_fail(b->err, CKFS_E_UNSUPPORTED, "'%s': %s is %s (GGUF view)",
				 b->m->config_path, k, v ? "not a whole number" : "missing");
	return CKFS_OK;
}

/* rope_parameters (transformers 5), else rope_scaling; NULL: neither. */
static const cJSON *rope_object(const struct build *b)
{
	const cJSON *rope = get(b->config, "rope_parameters");
	return rope ? rope : get(b->config, "rope_scaling");
}

static enum ckfs_code check_config(struct build *b)
{
	const cJSON *a = get(b->config, "architectures");
	const cJSON *a0 = cJSON_IsArray(a) && cJSON_GetArraySize(a) == 1 ? a->child : NULL;
	char what[256];

	for (size_t i = 0; cJSON_IsString(a0) && i < sizeof(archs) / sizeof(archs[0]); i++)
		if (strcmp(a0->valuestring, archs[i].hf) == 0)
			b->arch = &archs[i];
	if (!b->arch) {
		snprintf(what, sizeof(what),
			 "architecture %s (the GGUF view serves Llama, Mistral, "
			 "Qwen2, Qwen3 and, of MoE models, Qwen2-MoE, Qwen3-MoE and "
			 "DeepSeek-V3)",
			 cJSON_IsString(a0) ? a0->valuestring : "unknown");
		return refuse(b, what);
	}
	const char *const *reads = b->arch->moe == MLA ? mla_keys : b->arch->moe ? moe_keys : NULL;
	for (size_t i = 0; i < sizeof(refused_keys) / sizeof(refused_keys[0]); i++) {
		bool read = false;
		for (size_t j = 0; reads && reads[j]; j++)
			read |= strcmp(refused_keys[i], reads[j]) == 0;
		if (!read && get(b->config, refused_keys[i])) {
			snprintf(what, sizeof(what), "key %s", refused_keys[i]);
			return refuse(b, what);
		}
	}
	const cJSON *causal = get(b->config, "is_causal");
	if (causal && !cJSON_IsTrue(causal))
		return refuse(b, "is_causal false");
	if (b->arch->llama && cJSON_IsTrue(get(b->config, "attention_bias")))
		return refuse(b, "attention_bias (Llama's permuted biases)");
	/* rope: plain only, its theta the one parameter (DeepSeek's YaRN:
	 * gguf_mla.c) */
	const cJSON *rope = rope_object(b);
	const cJSON *t = rope ? get(rope, "rope_type") : NULL;
	if (rope && !t)
		t = get(rope, "type");
	if (b->arch->moe == MLA && cJSON_IsString(t) && strcmp(t->valuestring, "yarn") == 0)
		rope = NULL;
	if (rope) {
		if (!cJSON_IsObject(rope) || (t && !(cJSON_IsString(t) &&
						     strcmp(t->valuestring, "default") == 0)))
			return refuse(b, "rope scaling other than the default");
		for (const cJSON *c = rope->child; c; c = c->next)
			if (strcmp(c->string, "rope_theta") && strcmp(c->string, "rope_type") &&
			    strcmp(c->string, "type"))
				return refuse(b, "a rope parameter other than rope_theta");
	}
	CKFS_TRY(whole(b, "num_attention_heads", true, &b->n_head));
	CKFS_TRY(whole(b, "num_key_value_heads", true, &b->n_kv_head));
	CKFS_TRY(whole(b, "num_hidden_layers", true, &b->n_layers));
	if (b->n_head == 0 || b->n_kv_head == 0)
		return refuse(b, "no attention heads");
	if (!b->arch->moe)
		return CKFS_OK;
	b->moe.arch = b->arch->name;
	if (b->arch->moe == MLA)
		return gguf_mla_config(&b->mla, &b->moe, b->config, b->m->config_path, b->n_layers,
				       &b->g->arena, b->err);
	b->moe.norm_topk = b->arch->moe == MOE;
	b->moe.shared = b->arch->moe == MOE_SHARED;
	CKFS_TRY(gguf_moe_config(&b->moe, b->config, b->m->config_path, b->n_layers, &b->g->arena,
				 b->err));
	return CKFS_OK;
}

/* ---- tensors ---- */

static int cmp_tensor_name(const void *x, const void *y)
{
	return strcmp((*(const struct ckfs_tensor *const *)x)->name,
		      (*(const struct ckfs_tensor *const *)y)->name);
}

static bool has(const struct build *b, long long layer, enum only only)
{
	const struct arch *a = b->arch;
	bool sparse = layer >= b->moe.first_moe; /* DeepSeek's leading dense layers */

	switch (only) {
	case ALL:
		return true;
	case NOT_MLA:
		return a->moe != MLA;
	case QK_NORM:
		return a->qk_norm;
	case DENSE_MLP:
		return a->moe == DENSE || (a->moe == MLA && !sparse);
	case ROUTER:
		return a->moe != DENSE && sparse;
	case SHARED_EXPERT:
		return a->moe == MOE_SHARED;
	case MLA_ATTN:
		return a->moe == MLA;
	case MLA_Q:
		return a->moe == MLA && b->mla.q_lora < 0;
	case MLA_Q_LORA:
		return a->moe == MLA && b->mla.q_lora >= 0;
	case MLA_MOE:
		return a->moe == MLA && sparse;
	}
	return false;
}

/* The GGUF name of HF tensor name; NULL with err set when unknown. */
static const char *gguf_name(struct build *b, const char *name, bool *q, bool *k)
{
	struct ckfs_arena *ar = &b->g->arena;
	long long layer;
	int used = 0;

	*q = *k = false;
	if (strcmp(name, "model.embed_tokens.weight") == 0)
		return "token_embd.weight";
	if (strcmp(name, "lm_head.weight") == 0)
		return "output.weight";
	if (strcmp(name, "model.norm.weight") == 0)
		return "output_norm.weight";
	if (sscanf(name, "model.layers.%lld.%n", &layer, &used) == 1 && used > 0 &&
	    layer >= 0 && layer < b->n_layers) {
		char canon[64];
		snprintf(canon, sizeof(canon), "model.layers.%lld.", layer);
		if (strncmp(name, canon, strlen(canon)) != 0)
			goto unknown; /* "model.layers.01." */
		for (size_t i = 0; i < sizeof(layer_names) / sizeof(layer_names[0]); i++)
			if (strcmp(name + used, layer_names[i].hf) == 0 &&
			    has(b, layer, layer_names[i].only)) {
				*q = strcmp(layer_names[i].hf, "self_attn.q_proj.weight") == 0;
				*k = strcmp(layer_names[i].hf, "self_attn.k_proj.weight") == 0;
				const char *s = ckfs_arena_printf(ar, "blk.%lld.%s", layer,
								  layer_names[i].gguf);
				if (!s)
					ckfs_nomem(b->err);
				return s;
			}
	}
unknown:
	ckfs_fail(b->err, CKFS_E_UNSUPPORTED, "tensor %s: not a %s tensor the GGUF view "
		  "knows", name, b->arch->name);
	return NULL;
}

/* The view serves 1-D and 2-D bf16 tensors (an expert's weight: 2-D). */
static enum ckfs_code servable(struct build *b, const struct ckfs_tensor *t)
{
	if (t->out_dtype != CKFS_DTYPE_BF16 || t->ndim < 1 || t->ndim > 2 || t->numel == 0)
		return ckfs_fail(b->err, CKFS_E_UNSUPPORTED,
				 "tensor %s: a %d-D %s tensor (the "
				 "GGUF view serves 1-D and 2-D bf16 ones)",
				 t->name, t->ndim, ckfs_dtype_st_name(t->out_dtype));
	return CKFS_OK;
}

/* o's type and Llama row order, its name, sources and rows set: what the
 * converter makes of it. */
static enum ckfs_code place(struct build *b, struct ckfs_gguf_tensor *o, const char *output, bool q,
			    bool k)
{
	size_t nl = strlen(o->name);
	bool norm = nl >= 12 && strcmp(o->name + nl - 12, "_norm.weight") == 0;
	/* routers: F32 in the converter, kept so by llama-quantize */
	bool router = strstr(o->name, ".ffn_gate_inp") != NULL;

	if (o->src->ndim == 1 || norm || router)
		o->type = CKFS_GGUF_F32;
	else if (b->opt->type == CKFS_GGUF_Q4_0 && strcmp(o->name, output) == 0)
		o->type = CKFS_GGUF_Q8_0;
	else
		o->type = b->opt->type;
	if ((o->type == CKFS_GGUF_Q8_0 || o->type == CKFS_GGUF_Q4_0) && o->ne0 % 32)
		o->type = CKFS_GGUF_F16; /* the converter's fallback */
	if (b->arch->llama && (q || k)) {
		int64_t heads = q ? b->n_head : b->n_kv_head;
		if (o->rows % (2 * heads))
			return ckfs_fail(b->err, CKFS_E_UNSUPPORTED,
					 "tensor %s: %lld rows do not "
					 "split into %lld heads of pairs",
					 o->src->name, (long long)o->rows, (long long)heads);
		o->perm_heads = heads;
	}
	o->row_bytes = ckfs_gguf_row_bytes(o->type, o->ne0);
	b->g->n_tensors++;
	return CKFS_OK;
}

/* An expert's weight; its layer's three stacks once all are seen. The
 * size label counts one expert of each stack (gguf-py's size_label). */
static enum ckfs_code expert(struct build *b, const struct ckfs_tensor *t, int took, int64_t layer,
			     uint64_t *params)
{
	CKFS_TRY(servable(b, t));
	if (t->ndim != 2)
		return ckfs_fail(b->err, CKFS_E_UNSUPPORTED,
				 "tensor %s: an expert's weight that "
				 "is not 2-D (GGUF view)",
				 t->name);
	for (int w = 0; took == 2 && w < 3; w++) {
		struct ckfs_gguf_tensor *o = &b->g->tensors[b->g->n_tensors];
		CKFS_TRY(gguf_moe_stack(&b->moe, layer, w, o, &b->g->arena, b->err));
		CKFS_TRY(place(b, o, "", false, false));
		*params += (uint64_t)(o->rows / o->n_expert) * (uint64_t)o->ne0;
	}
	return CKFS_OK;
}

/* DeepSeek: 1 when the converter drops t (an MTP layer past
 * num_hidden_layers, a tied lm_head); 2 when t is a kv_b_proj, now split
 * into o[0..1]; 0 otherwise. */
static int mla_tensor(struct build *b, const struct ckfs_tensor *t, struct ckfs_gguf_tensor *o,
		      enum ckfs_code *rc)
{
	long long layer;
	int used = 0;
	char canon[96];

	*rc = CKFS_OK;
	if (b->arch->moe != MLA)
		return 0;
	if (strcmp(t->name, "lm_head.weight") == 0)
		return cJSON_IsTrue(get(b->config, "tie_word_embeddings"));
	if (sscanf(t->name, "model.layers.%lld.%n", &layer, &used) != 1 || used == 0)
		return 0;
	if (layer >= b->n_layers)
		return 1;
	snprintf(canon, sizeof(canon), "model.layers.%lld.self_attn.kv_b_proj.weight", layer);
	if (strcmp(t->name, canon) != 0)
		return 0;
	if ((*rc = servable(b, t)) == CKFS_OK)
		*rc = gguf_mla_split(&b->mla, t, layer, b->n_kv_head, o, &b->g->arena, b->err);
	return 2;
}

static enum ckfs_code map_tensors(struct build *b, uint64_t *params)
{
	const struct ckfs_model *m = b->m;
	struct ckfs_gguf_file *g = b->g;
	const struct ckfs_tensor **ts = calloc(m->n_tensors + 1, sizeof(*ts));
	bool tied = b->arch->moe == MLA && cJSON_IsTrue(get(b->config, "tie_word_embeddings"));

	/* The output matrix: llama-quantize gives it a wider type than q4_0,
	 * and a tied model's is token_embd (docs/gguf.md "q4_0"). */
	const char *output = "token_embd.weight";

	if (!ts)
		return ckfs_nomem(b->err);
	for (size_t i = 0; i < m->n_tensors; i++) {
		ts[i] = &m->tensors[i];
		if (strcmp(ts[i]->name, "lm_head.weight") == 0 && !tied)
			output = "output.weight";
	}
	/* the converter writes them in the exported folder's (name) order,
	 * a MoE layer's stacks where its last expert weight comes */
	qsort(ts, m->n_tensors, sizeof(*ts), cmp_tensor_name);
	/* at most two from each (DeepSeek's kv_b_proj) */
	g->tensors = ckfs_arena_calloc(&g->arena, 2 * m->n_tensors + 1, sizeof(*g->tensors));
	enum ckfs_code rc = g->tensors ? CKFS_OK : ckfs_nomem(b->err);
	*params = 0;
	for (size_t i = 0; i < m->n_tensors && rc == CKFS_OK; i++) {
		const struct ckfs_tensor *t = ts[i];
		struct ckfs_gguf_tensor *o = &g->tensors[g->n_tensors];
		int64_t layer;
		int took = mla_tensor(b, t, o, &rc);
		bool q, k;
		if (took == 2) {
			for (int j = 0; j < 2 && rc == CKFS_OK; j++)
				rc = place(b, &o[j], output, false, false);
			*params += t->numel;
		}
		if (took)
			continue;
		if ((took = gguf_moe_take(&b->moe, t, &layer))) {
			rc = expert(b, t, took, layer, params);
			continue;
		}
		if (!(o->name = gguf_name(b, t->name, &q, &k))) {
			rc = b->err->code;
			break;
		}
		if ((rc = servable(b, t)) != CKFS_OK)
			break;
		o->src = t;
		o->ne0 = t->shape[t->ndim - 1];
		o->rows = t->ndim == 2 ? t->shape[0] : 1;
		rc = place(b, o, output, q, k);
		*params += t->numel;
	}
	free(ts);
	if (rc == CKFS_OK && b->arch->moe)
		rc = gguf_moe_complete(&b->moe, b->err);
	return rc;
}

/* ---- key-values ---- */

/* gguf.size_label: K, M, B or T with at least two significant digits
 * ("115K", "1.5B", "72B"), rounded as Python formats; a MoE model's is
 * "<experts>x" and the parameters of all but the experts plus one of
 * each expert stack ("128x3.3B"). */
static void size_label(uint64_t params, int64_t n_expert, char *out, size_t size)
{
	double n = (double)params, s;
	char unit;

	if (n > 1e12) { s = n * 1e-12; unit = 'T'; }
	else if (n > 1e9) { s = n * 1e-9; unit = 'B'; }
	else if (n > 1e6) { s = n * 1e-6; unit = 'M'; }
	else { s = n * 1e-3; unit = 'K'; }
	char digits[32];
	snprintf(digits, sizeof(digits), "%.0f", nearbyint(s)); /* Python's round(): to even */
	size_t len = strlen(digits) - strspn(digits, "0");
	int fix = len >= 2 ? 0 : 2 - (int)len;
	int x = n_expert ? snprintf(out, size, "%lldx", (long long)n_expert) : 0;
	snprintf(out + x, size - (size_t)x, "%.*f%c", fix, s, unit);
}

/* generation_config.json's sampling values, as gguf.Metadata reads them. */
static enum ckfs_code sampling(struct build *b, struct gguf_kv *kv)
{
	static const char *const refused[] = { "sequence", "xtc_probability", "xtc_threshold",
					       "penalty_last_n", "mirostat", "mirostat_tau",
					       "mirostat_eta" };
	static const struct {
		const char *key, *gguf;
	} floats[] = {
		{ "top_p", "general.sampling.top_p" }, { "min_p", "general.sampling.min_p" },
		{ "temperature", "general.sampling.temp" },
	};
	const cJSON *g = b->gen, *v;

	if (!g)
		return CKFS_OK;
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
		if (get(g, refused[i]))
			return ckfs_fail(b->err, CKFS_E_UNSUPPORTED, "generation_config.json: "
					 "%s is not reproduced by the GGUF view", refused[i]);
	if ((v = get(g, "top_k"))) {
		int64_t k;
		if (!ckfs_json_whole(v, INT32_MAX, &k))
			return ckfs_fail(b->err, CKFS_E_UNSUPPORTED, "generation_config.json: "
					 "top_k is not a whole number");
		gguf_kv_i32(kv, "general.sampling.top_k", (int32_t)k);
	}
	for (size_t i = 0; i < sizeof(floats) / sizeof(floats[0]); i++) {
		if (!(v = get(g, floats[i].key)))
			continue;
		if (!cJSON_IsNumber(v))
			return ckfs_fail(b->err, CKFS_E_UNSUPPORTED, "generation_config.json: %s "
					 "is not a number", floats[i].key);
		gguf_kv_f32(kv, floats[i].gguf, (float)v->valuedouble);
	}
	if ((v = get(g, "penalty_repeat")) || (v = get(g, "repetition_penalty"))) {
		if (!cJSON_IsNumber(v))
			return ckfs_fail(b->err, CKFS_E_UNSUPPORTED, "generation_config.json: "
					 "repetition_penalty is not a number");
		gguf_kv_f32(kv, "general.sampling.penalty_repeat", (float)v->valuedouble);
	}
	return CKFS_OK;
}

static enum ckfs_code put_u32_param(struct build *b, struct gguf_kv *kv, const char *hf,
				    const char *what)
{
	int64_t v;
	char k[96];

	/* DeepseekV3Config has every one: its default would be written */
	CKFS_TRY(whole(b, hf, b->arch->moe == MLA, &v));
	if (v >= 0) {
		snprintf(k, sizeof(k), "%s.%s", b->arch->name, what);
		gguf_kv_u32(kv, k, (uint32_t)v);
	}
	return CKFS_OK;
}

static enum ckfs_code number(struct build *b, const cJSON *v, const char *what, float *out)
{
	if (!cJSON_IsNumber(v))
		return ckfs_fail(b->err, CKFS_E_UNSUPPORTED, "'%s': %s is not a number (GGUF "
				 "view)", b->m->config_path, what);
	*out = (float)v->valuedouble;
	return CKFS_OK;
}

/* TextModel.set_gguf_parameters and the architecture's additions. */
static enum ckfs_code hparams(struct build *b, struct gguf_kv *kv, uint32_t file_type,
			      int64_t n_vocab)
{
	const char *a = b->arch->name;
	char k[96];
	float f = 0;

	snprintf(k, sizeof(k), "%s.block_count", a);
	gguf_kv_u32(kv, k, (uint32_t)b->n_layers);
	CKFS_TRY(put_u32_param(b, kv, "max_position_embeddings", "context_length"));
	CKFS_TRY(put_u32_param(b, kv, "hidden_size", "embedding_length"));
	CKFS_TRY(put_u32_param(b, kv, "intermediate_size", "feed_forward_length"));
	CKFS_TRY(put_u32_param(b, kv, "num_attention_heads", "attention.head_count"));
	if (b->arch->moe == MLA) { /* MLA runs as MQA */
		snprintf(k, sizeof(k), "%s.attention.head_count_kv", a);
		gguf_kv_u32(kv, k, 1);
	} else {
		CKFS_TRY(put_u32_param(b, kv, "num_key_value_heads", "attention.head_count_kv"));
	}
	if (b->arch->moe == MLA)
		gguf_mla_kv_rope(&b->mla, kv);
	const cJSON *rope = rope_object(b);
	const cJSON *theta = rope ? get(rope, "rope_theta") : NULL;
	if (!theta)
		theta = get(b->config, "rope_theta");
	if (!theta && b->arch->moe == MLA)
		return ckfs_fail(b->err, CKFS_E_UNSUPPORTED,
				 "'%s': rope_theta is missing (GGUF view)", b->m->config_path);
	if (theta) {
		CKFS_TRY(number(b, theta, "rope_theta", &f));
		snprintf(k, sizeof(k), "%s.rope.freq_base", a);
		gguf_kv_f32(kv, k, f);
	}
	const cJSON *eps = get(b->config, "rms_norm_eps");
	if (eps || b->arch->moe == MLA) { /* DeepseekV2Model's default: 1e-6 */
		f = 1e-6f;
		if (eps)
			CKFS_TRY(number(b, eps, "rms_norm_eps", &f));
		snprintf(k, sizeof(k), "%s.attention.layer_norm_rms_epsilon", a);
		gguf_kv_f32(kv, k, f);
	}
	if (b->arch->moe == MLA) {
		gguf_mla_kv_experts(&b->mla, &b->moe, kv);
		gguf_kv_u32(kv, "general.file_type", file_type);
		gguf_mla_kv_rest(&b->mla, &b->moe, n_vocab, kv);
		return CKFS_OK;
	}
	if (b->arch->moe)
		gguf_moe_counts(&b->moe, kv);
	int64_t head_dim, hidden;
	CKFS_TRY(whole(b, "head_dim", b->arch->head_dim == HEAD_DIM_REQUIRED, &head_dim));
	CKFS_TRY(whole(b, "hidden_size", b->arch->llama, &hidden));
	if (head_dim < 0 && b->arch->head_dim == HEAD_DIM_OR_QUOTIENT)
		head_dim = hidden / b->n_head;
	if (head_dim >= 0) {
		snprintf(k, sizeof(k), "%s.attention.key_length", a);
		gguf_kv_u32(kv, k, (uint32_t)head_dim);
		snprintf(k, sizeof(k), "%s.attention.value_length", a);
		gguf_kv_u32(kv, k, (uint32_t)head_dim);
	}
	gguf_kv_u32(kv, "general.file_type", file_type);
	if (b->arch->moe)
		gguf_moe_lengths(&b->moe, kv);
	if (b->arch->llama) {
		snprintf(k, sizeof(k), "%s.vocab_size", a);
		gguf_kv_u32(kv, k, (uint32_t)n_vocab);
		snprintf(k, sizeof(k), "%s.rope.dimension_count", a);
		gguf_kv_u32(kv, k, (uint32_t)head_dim);
	}
	return CKFS_OK;
}

static uint32_t file_type(enum ckfs_gguf_type t)
{
	switch (t) {
	case CKFS_GGUF_F32: return 0;
	case CKFS_GGUF_F16: return 1;
	case CKFS_GGUF_Q4_0: return 2;
	case CKFS_GGUF_Q8_0: return 7;
	case CKFS_GGUF_BF16: return 32;
	}
	return 0;
}

static enum ckfs_code key_values(struct build *b, struct gguf_kv *kv, uint64_t params)
{
	char label[32];
	int64_t n_vocab;
	const char *name = b->opt->model_name;

	CKFS_TRY(whole(b, "vocab_size", true, &n_vocab));
	if (n_vocab > MAX_VOCAB)
		return ckfs_fail(b->err, CKFS_E_LIMIT, "'%s': vocab_size %lld is more than the "
				 "GGUF view's limit of %d", b->m->config_path, (long long)n_vocab,
				 MAX_VOCAB);
	if (b->arch->llama && (n_vocab == 32016 || n_vocab == 49152))
		return refuse(b, "a CodeLlama or Granite vocabulary size");
	if (!name) { /* the converter's default: the folder's name */
		name = strrchr(b->m->src_dir, '/');
		name = name && name[1] ? name + 1 : b->m->src_dir;
	}
	gguf_kv_str(kv, "general.architecture", b->arch->name);
	gguf_kv_str(kv, "general.type", "model");
	CKFS_TRY(sampling(b, kv));
	gguf_kv_str(kv, "general.name", name);
	/* gguf-py counts the experts of the stacks written: none when every
	 * layer is dense */
	size_label(params, b->moe.first_moe < b->n_layers ? b->moe.n_expert : 0, label,
		   sizeof(label));
	gguf_kv_str(kv, "general.size_label", label);
	CKFS_TRY(hparams(b, kv, file_type(b->opt->type), n_vocab));
	gguf_kv_u32(kv, "general.quantization_version", 2);
	/* The converter's Qwen MoE classes read the tokenizer as GPT-2 BPE
	 * (tokenizer.json, known by the hash of its output) only. */
	const char *spm = getenv(SPM_TEST_ENV);
	bool bpe_only = b->arch->moe == MLA || (b->arch->moe && !(spm && strcmp(spm, "1") == 0));
	return gguf_vocab(b->m, b->g, b->config, n_vocab, b->arch->llama, bpe_only, kv, b->err);
}

/* ---- the header ---- */

static enum ckfs_code render(struct build *b, struct gguf_kv *kv)
{
	struct ckfs_gguf_file *g = b->g;
	struct ckfs_strbuf h = { 0 };
	uint64_t off = 0;

	ckfs_strbuf_put(&h, "GGUF", 4);
	gguf_put_u32(&h, 3);
	gguf_put_u64(&h, g->n_tensors);
	gguf_put_u64(&h, kv->n);
	ckfs_strbuf_put(&h, kv->b.p, kv->b.len);
	for (size_t i = 0; i < g->n_tensors; i++) {
		struct ckfs_gguf_tensor *t = &g->tensors[i];
		gguf_put_str(&h, t->name, strlen(t->name));
		if (t->heads) { /* ggml's order: fastest first */
			gguf_put_u32(&h, 3);
			gguf_put_u64(&h, (uint64_t)t->ne0);
			gguf_put_u64(&h, (uint64_t)(t->rows / t->heads));
			gguf_put_u64(&h, (uint64_t)t->heads);
		} else {
			gguf_put_u32(&h, t->src->ndim + (t->n_expert ? 1 : 0));
			for (int d = t->src->ndim - 1; d >= 0; d--)
				gguf_put_u64(&h, (uint64_t)t->src->shape[d]);
			if (t->n_expert)
				gguf_put_u64(&h, (uint64_t)t->n_expert);
		}
		gguf_put_u32(&h, t->type);
		gguf_put_u64(&h, off);
		t->offset = off;
		uint64_t bytes = t->row_bytes * (uint64_t)t->rows;
		if (__builtin_add_overflow(off, (bytes + ALIGN - 1) / ALIGN * ALIGN, &off) ||
		    off > CKFS_MAX_SERVED_BYTES) {
			free(h.p);
			return ckfs_fail(b->err, CKFS_E_LIMIT, "the GGUF file is more than the "
					 "limit of %llu bytes",
					 (unsigned long long)CKFS_MAX_SERVED_BYTES);
		}
	}
	while (!h.failed && h.len % ALIGN)
		ckfs_strbuf_put(&h, "", 1);
	if (h.failed || kv->b.failed) {
		free(h.p);
		return ckfs_nomem(b->err);
	}
	g->header_len = h.len;
	g->header = ckfs_arena_alloc(&g->arena, h.len);
	if (g->header)
		memcpy(g->header, h.p, h.len);
	free(h.p);
	if (!g->header)
		return ckfs_nomem(b->err);
	for (size_t i = 0; i < g->n_tensors; i++)
		g->tensors[i].offset += g->header_len;
	g->size = g->header_len + off;
	return CKFS_OK;
}

enum ckfs_code ckfs_gguf_build(const struct ckfs_model *m, const struct ckfs_gguf_options *opt,
			       struct ckfs_gguf_file *g, struct ckfs_error *err)
{
	struct build b = { .m = m, .opt = opt, .g = g, .err = err };
	struct gguf_kv kv = { 0 };
	uint64_t params = 0;
	enum ckfs_code rc;

	memset(g, 0, sizeof(*g));
	ckfs_arena_init(&g->arena);
	g->name = "model.gguf";
	if (m->lora || (m->view && m->view->quantizes))
		rc = ckfs_fail(err, CKFS_E_UNSUPPORTED,
			       "'%s': the GGUF view serves plain "
			       "models (no LoRA adapter, no --dtype fp8, w4a16 or nvfp4)",
			       m->src_dir);
	else if (!m->config_json)
		rc = ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': the GGUF view needs config.json",
			       m->src_dir);
	else
		rc = ckfs_json_parse_object(m->config_path, m->config_json, m->config_len,
					    &b.config, err);
	if (rc == CKFS_OK)
		rc = check_config(&b);
	if (rc == CKFS_OK)
		rc = gguf_side_json(m, g, "generation_config.json", &b.gen, err);
	if (rc == CKFS_OK)
		rc = map_tensors(&b, &params);
	if (rc == CKFS_OK)
		rc = key_values(&b, &kv, params);
	if (rc == CKFS_OK)
		rc = render(&b, &kv);
	free(kv.b.p);
	cJSON_Delete(b.config);
	cJSON_Delete(b.gen);
	if (rc != CKFS_OK)
		ckfs_gguf_release(g);
	return rc;
}

void ckfs_gguf_release(struct ckfs_gguf_file *g)
{
	ckfs_arena_release(&g->arena);
	g->tensors = NULL;
	g->n_tensors = 0;
	g->header = NULL;
}

/* ---- reads ---- */

/* The source row of output row r: Llama's permute reorders each head's
 * rows from (pair, half) to (half, pair): out (h, 2i + j) <- in (h, j * half + i). */
static int64_t source_row(const struct ckfs_gguf_tensor *t, int64_t r)
{
	if (t->heads) { /* attn_v_b: head h's rows after its key rows */
		int64_t each = t->rows / t->heads;
		return r / each * t->head_stride + t->head_skip + r % each;
	}
	if (!t->perm_heads)
		return r;
	int64_t hd = t->rows / t->perm_heads, half = hd / 2;
	int64_t h = r / hd, w = r % hd;
	return h * hd + (w % 2) * half + w / 2;
}

/* n rows of attn_k_b from r0, one head's, as floats into f: row (h, c) is
 * column c of the head's ne0 key rows of kv_b_proj, read as n columns of
 * each of those rows (n * ne0 values in bf, no more than a chunk). */
static enum ckfs_code read_transposed(const struct ckfs_model *m, const struct ckfs_gguf_tensor *t,
				      int64_t r0, int64_t n, uint16_t *bf, float *f,
				      struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	int64_t cols = t->rows / t->heads, h = r0 / cols, c = r0 % cols;

	for (int64_t j = 0; j < t->ne0; j++) {
		uint64_t row = (uint64_t)(h * t->head_stride + t->head_skip + j);
		CKFS_TRY(ckfs_tensor_read(m, t->src, row * (uint64_t)cols + (uint64_t)c,
					  (uint64_t)n, bf + j * n, scratch, err));
	}
	for (int64_t k = 0; k < n; k++)
		for (int64_t j = 0; j < t->ne0; j++) {
			uint32_t u = ckfs_bf16_to_f32(bf[j * n + k]);
			memcpy(&f[k * t->ne0 + j], &u, 4);
		}
	return CKFS_OK;
}

/* Up to *n rows of t from r0 (fewer where an expert's tensor ends), as
 * floats into f through bf. */
static enum ckfs_code read_plain(const struct ckfs_model *m, const struct ckfs_gguf_tensor *t,
				 int64_t r0, int64_t *n, uint16_t *bf, float *f,
				 struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	const struct ckfs_tensor *src = t->src;
	int64_t sr = source_row(t, r0);

	if (t->n_expert) { /* within one expert's tensor */
		int64_t each = t->rows / t->n_expert;
		src = t->experts[r0 / each];
		sr = r0 % each;
		if (*n > each - sr)
			*n = each - sr;
	}
	uint64_t first = (uint64_t)sr * (uint64_t)t->ne0;
	uint64_t count = (uint64_t)*n * (uint64_t)t->ne0;
	CKFS_TRY(ckfs_tensor_read(m, src, first, count, bf, scratch, err));
	for (uint64_t i = 0; i < count; i++) {
		uint32_t u = ckfs_bf16_to_f32(bf[i]);
		memcpy(&f[i], &u, 4);
	}
	return CKFS_OK;
}

/* Rows [r0, r1) of t, encoded, into out. */
static enum ckfs_code read_rows(const struct ckfs_model *m, const struct ckfs_gguf_tensor *t,
				int64_t r0, int64_t r1, unsigned char *out, uint16_t *bf,
				float *f, size_t cap, struct ckfs_read_scratch *scratch,
				struct ckfs_error *err)
{
	int64_t per = (int64_t)(cap / (size_t)t->ne0);
	if (per < 1)
		per = 1;
	while (r0 < r1) {
		int64_t n = t->perm_heads ? 1 : (r1 - r0 < per ? r1 - r0 : per);
		if (t->heads) { /* within one head's part */
			int64_t each = t->rows / t->heads;
			if (n > each - r0 % each)
				n = each - r0 % each;
		}
		if (t->transposed)
			CKFS_TRY(read_transposed(m, t, r0, n, bf, f, scratch, err));
		else
			CKFS_TRY(read_plain(m, t, r0, &n, bf, f, scratch, err));
		for (int64_t k = 0; k < n; k++)
			ckfs_gguf_encode_row(t->type, f + k * t->ne0, t->ne0,
					     out + (uint64_t)k * t->row_bytes);
		out += (uint64_t)n * t->row_bytes;
		r0 += n;
	}
	return CKFS_OK;
}

/* The bytes [off, end) of tensor t's data (relative to its start): the
 * rows they touch, READ_CHUNK source values (or one row) at a time. */
static enum ckfs_code read_tensor(const struct ckfs_model *m, const struct ckfs_gguf_tensor *t,
				  uint64_t off, uint64_t end, unsigned char *buf,
				  struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	uint64_t rows = (end + t->row_bytes - 1) / t->row_bytes - off / t->row_bytes;
	uint64_t want = rows * (uint64_t)t->ne0;
	size_t cap = want < READ_CHUNK ? (size_t)want : READ_CHUNK;
	if (cap < (size_t)t->ne0)
		cap = (size_t)t->ne0;
	int64_t per = (int64_t)(cap / (size_t)t->ne0);
	uint16_t *bf = malloc(cap * 2);
	float *f = malloc(cap * 4);
	unsigned char *enc = malloc((size_t)per * t->row_bytes);
	enum ckfs_code rc = bf && f && enc ? CKFS_OK : ckfs_nomem(err);

	while (rc == CKFS_OK && off < end) {
		int64_t r0 = (int64_t)(off / t->row_bytes);
		int64_t r1 = (int64_t)((end + t->row_bytes - 1) / t->row_bytes);
		if (r1 - r0 > per)
			r1 = r0 + per;
		rc = read_rows(m, t, r0, r1, enc, bf, f, cap, scratch, err);
		uint64_t from = (uint64_t)r0 * t->row_bytes;
		uint64_t to = (uint64_t)r1 * t->row_bytes < end ? (uint64_t)r1 * t->row_bytes : end;
		if (rc == CKFS_OK)
			memcpy(buf, enc + (off - from), (size_t)(to - off));
		buf += to - off;
		off = to;
	}
	free(bf);
	free(f);
	free(enc);
	return rc;
}

enum ckfs_code ckfs_gguf_read(const struct ckfs_model *m, const struct ckfs_gguf_file *g,
			      uint64_t off, size_t len, void *buf_v,
			      struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	unsigned char *buf = buf_v;
	uint64_t end = off + len;

	if (off > g->size || len > g->size - off)
		return ckfs_fail(err, CKFS_E_INVALID, "read past the end of '%s'", g->name);
	if (off < g->header_len) {
		size_t n = (size_t)((end < g->header_len ? end : g->header_len) - off);
		memcpy(buf, g->header + off, n);
		buf += n;
		off += n;
	}
	if (off >= end)
		return CKFS_OK;
	CKFS_TRY(ckfs_model_checked(m, err));
	for (size_t i = 0; i < g->n_tensors && off < end; i++) {
		const struct ckfs_gguf_tensor *t = &g->tensors[i];
		uint64_t data_end = t->offset + t->row_bytes * (uint64_t)t->rows;
		uint64_t next = i + 1 < g->n_tensors ? g->tensors[i + 1].offset : g->size;
		if (off >= next)
			continue;
		if (off < data_end) {
			uint64_t stop = end < data_end ? end : data_end;
			CKFS_TRY(read_tensor(m, t, off - t->offset, stop - t->offset, buf, scratch,
					     err));
			buf += stop - off;
			off = stop;
		}
		if (off < end && off < next) { /* alignment padding: zeros */
			uint64_t stop = end < next ? end : next;
			memset(buf, 0, (size_t)(stop - off));
			buf += stop - off;
			off = stop;
		}
	}
	return CKFS_OK;
}
