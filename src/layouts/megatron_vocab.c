/* SPDX-License-Identifier: MIT */
/*
 * What the two Megatron readers share (megatron.c, per-rank files;
 * megatron_dist.c, dist_checkpointing): the model config.json describes,
 * Megatron-Core's GPT key names and the Hugging Face names they stand for,
 * and the keys not understood. Each reader keeps only its own geometry:
 * where a key's shards are and how they are cut.
 */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layouts/layouts.h"

/* ---- config.json ---- */

/* An integer config value: absent (*v = dflt), or a whole number from 0
 * up to 2^31 (sizes past that are not real configs, and products of them
 * stay inside int64). Anything else is refused: a config that says
 * hidden_size 64.5 is not one ckfs understands. */
static enum ckfs_code config_int(const struct ckfs_model *m, cJSON *j, const char *key,
				 int64_t dflt, int64_t *v, struct ckfs_error *err)
{
	const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);

	*v = dflt;
	if (!x || cJSON_IsNull(x))
		return CKFS_OK;
	if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= 2147483648.0 ||
	    x->valuedouble != (double)(int64_t)x->valuedouble)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': %s is not a whole number from 0 "
				 "to 2^31", m->config_path, key);
	*v = (int64_t)x->valuedouble;
	return CKFS_OK;
}

/* Architectures whose MoE layers Hugging Face names as DeepSeek does:
 * mlp.shared_experts.* (no gate), mlp.gate.e_score_correction_bias, and
 * MTP layers after the decoder's (Kimi-K2 and Moonlight name
 * DeepseekV3ForCausalLM). */
static bool deepseek_family(const char *arch)
{
	return strncmp(arch, "DeepseekV2", 10) == 0 || strncmp(arch, "DeepseekV3", 10) == 0 ||
	       strncmp(arch, "Glm4Moe", 7) == 0;
}

/* MLA's widths; q_lora_rank null (DeepSeek-V2-Lite, Moonlight) is
 * refused: megatron-core builds its linear_q_proj only as Transformer
 * Engine's fused norm + linear, whose norm Hugging Face's model lacks. */
static enum ckfs_code mla_arch(const struct ckfs_model *m, cJSON *j, const char *arch,
			       struct ckfs_megatron_arch *a, struct ckfs_error *err)
{
	enum ckfs_code rc;

	if (strncmp(arch, "Deepseek", 8) != 0)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': multi-head latent attention "
				 "(kv_lora_rank) of architecture '%s': ckfs knows DeepSeek's "
				 "Hugging Face names for it only", m->config_path, arch);
	if ((rc = config_int(m, j, "q_lora_rank", 0, &a->q_lora, err)) != CKFS_OK ||
	    (rc = config_int(m, j, "qk_nope_head_dim", 0, &a->qk_nope, err)) != CKFS_OK ||
	    (rc = config_int(m, j, "qk_rope_head_dim", 0, &a->qk_rope, err)) != CKFS_OK ||
	    (rc = config_int(m, j, "v_head_dim", 0, &a->v_dim, err)) != CKFS_OK)
		return rc;
	if (a->q_lora <= 0)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': multi-head latent attention "
				 "without q_lora_rank (a linear_q_proj) is not read from "
				 "Megatron checkpoints", m->config_path);
	if (a->qk_nope <= 0 || a->qk_rope <= 0 || a->v_dim <= 0)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': multi-head latent attention needs "
				 "qk_nope_head_dim, qk_rope_head_dim and v_head_dim",
				 m->config_path);
	return CKFS_OK;
}

enum ckfs_code ckfs_megatron_arch(const struct ckfs_model *m, struct ckfs_megatron_arch *a,
				  struct ckfs_error *err)
{
	enum ckfs_code rc;
	cJSON *j;

	memset(a, 0, sizeof(*a));
	CKFS_TRY(ckfs_json_parse(m->config_path, m->config_json, m->config_len, &j, err));
	const cJSON *archs = cJSON_GetObjectItemCaseSensitive(j, "architectures");
	const cJSON *arch0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
	const char *arch = cJSON_IsString(arch0) ? arch0->valuestring : "";
	a->mixtral = strncmp(arch, "Mixtral", 7) == 0;
	a->qwen2_moe = strncmp(arch, "Qwen2Moe", 8) == 0;
	a->deepseek_moe = deepseek_family(arch);
	int64_t local_experts = 0, routed_experts = 0, n_shared = 0;
	if ((rc = config_int(m, j, "hidden_size", 0, &a->hidden, err)) == CKFS_OK &&
	    (rc = config_int(m, j, "num_attention_heads", 0, &a->nh, err)) == CKFS_OK &&
	    (rc = config_int(m, j, "num_key_value_heads", a->nh, &a->nkv, err)) == CKFS_OK &&
	    (rc = config_int(m, j, "head_dim", a->nh > 0 ? a->hidden / a->nh : 0, &a->head_dim,
			     err)) == CKFS_OK &&
	    (rc = config_int(m, j, "intermediate_size", 0, &a->ffn, err)) == CKFS_OK &&
	    (rc = config_int(m, j, "vocab_size", 0, &a->vocab, err)) == CKFS_OK &&
	    (rc = config_int(m, j, "num_hidden_layers", 0, &a->n_layers, err)) == CKFS_OK &&
	    /* the expert count as each family names it: Qwen, Mixtral, and
	     * DeepSeek and GLM (n_routed_experts) */
	    (rc = config_int(m, j, "n_routed_experts", 0, &routed_experts, err)) == CKFS_OK &&
	    (rc = config_int(m, j, "num_local_experts", routed_experts, &local_experts, err)) ==
		    CKFS_OK &&
	    (rc = config_int(m, j, "num_experts", local_experts, &a->n_experts, err)) == CKFS_OK &&
	    (rc = config_int(m, j, "kv_lora_rank", 0, &a->kv_lora, err)) == CKFS_OK &&
	    (rc = config_int(m, j, "n_shared_experts", 0, &n_shared, err)) == CKFS_OK &&
	    (rc = config_int(m, j, "num_nextn_predict_layers", -1, &a->mtp_layers, err)) ==
		    CKFS_OK &&
	    /* Mixtral's experts are intermediate_size wide, the others'
	     * moe_intermediate_size (0 when absent: no width is guessed). */
	    (rc = config_int(m, j, ckfs_megatron_expert_width_key(a), 0, &a->expert_ffn, err)) ==
		    CKFS_OK &&
	    (rc = config_int(m, j, "shared_expert_intermediate_size", n_shared * a->expert_ffn,
			     &a->shared_ffn, err)) == CKFS_OK && a->kv_lora > 0) {
		a->mla = true;
		rc = mla_arch(m, j, arch, a, err);
	}
	cJSON_Delete(j);
	CKFS_TRY(rc);
	if (a->hidden <= 0 || a->nh <= 0 || a->nkv <= 0 || a->head_dim <= 0 || a->n_layers <= 0)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': needs hidden_size, "
				 "num_attention_heads, num_key_value_heads and "
				 "num_hidden_layers for a Megatron checkpoint", m->config_path);
	if (a->nh % a->nkv)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': num_attention_heads %lld is not a "
				 "multiple of num_key_value_heads %lld", m->config_path,
				 (long long)a->nh, (long long)a->nkv);
	return CKFS_OK;
}

const char *ckfs_megatron_expert_width_key(const struct ckfs_megatron_arch *a)
{
	return a->mixtral ? "intermediate_size" : "moe_intermediate_size";
}

/* ---- names ---- */

/* Layer-local suffixes, in Hugging Face's module order (the output order
 * inside a layer: qkv and the fc1 halves take consecutive slots). MLA
 * (DeepSeek's names): q_layernorm follows the q down projection, so it is
 * q_a_layernorm; Transformer Engine fuses it into the up projection. */
static const struct ckfs_megatron_key layer_keys[] = {
	{ "self_attention.linear_qkv.weight", "weight", MG_QKV, 0, MGF_GQA },
	{ "self_attention.linear_qkv.bias", "bias", MG_QKV, 1, MGF_GQA },
	{ "self_attention.linear_q_down_proj.weight", "self_attn.q_a_proj.weight", MG_COL_OR_DUP,
	  0, MGF_MLA },
	{ "self_attention.q_layernorm.weight", "self_attn.q_a_layernorm.weight", MG_REPLICATED,
	  1, MGF_MLA },
	{ "self_attention.linear_q_up_proj.layer_norm_weight", "self_attn.q_a_layernorm.weight",
	  MG_REPLICATED, 1, MGF_MLA },
	{ "self_attention.linear_q_up_proj.weight", "self_attn.q_b_proj.weight", MG_COL, 2,
	  MGF_MLA },
	{ "self_attention.linear_kv_down_proj.weight", "self_attn.kv_a_proj_with_mqa.weight",
	  MG_COL_OR_DUP, 3, MGF_MLA },
	{ "self_attention.kv_layernorm.weight", "self_attn.kv_a_layernorm.weight", MG_REPLICATED,
	  4, MGF_MLA },
	{ "self_attention.linear_kv_up_proj.layer_norm_weight", "self_attn.kv_a_layernorm.weight",
	  MG_REPLICATED, 4, MGF_MLA },
	{ "self_attention.linear_kv_up_proj.weight", "self_attn.kv_b_proj.weight", MG_COL, 5,
	  MGF_MLA },
	{ "self_attention.linear_proj.weight", "self_attn.o_proj.weight", MG_ROW, 6, MGF_ANY },
	{ "self_attention.linear_proj.bias", "self_attn.o_proj.bias", MG_REPLICATED, 7, MGF_ANY },
	{ "self_attention.q_layernorm.weight", "self_attn.q_norm.weight", MG_REPLICATED, 8,
	  MGF_GQA },
	{ "self_attention.k_layernorm.weight", "self_attn.k_norm.weight", MG_REPLICATED, 9,
	  MGF_GQA },
	{ "mlp.linear_fc1.weight", "mlp", MG_FC1, 10, MGF_ANY },
	{ "mlp.linear_fc2.weight", "mlp.down_proj.weight", MG_ROW, 12, MGF_ANY },
	{ "mlp.linear_fc2.bias", "mlp.down_proj.bias", MG_REPLICATED, 13, MGF_ANY },
	{ "input_layernorm.weight", "input_layernorm.weight", MG_REPLICATED, 14, MGF_ANY },
	{ "self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight",
	  MG_REPLICATED, 14, MGF_GQA },
	{ "input_layernorm.bias", "input_layernorm.bias", MG_REPLICATED, 15, MGF_ANY },
	{ "self_attention.linear_qkv.layer_norm_bias", "input_layernorm.bias", MG_REPLICATED,
	  15, MGF_GQA },
	{ "pre_mlp_layernorm.weight", "post_attention_layernorm.weight", MG_REPLICATED, 16,
	  MGF_ANY },
	{ "mlp.linear_fc1.layer_norm_weight", "post_attention_layernorm.weight", MG_REPLICATED,
	  16, MGF_ANY },
	{ "pre_mlp_layernorm.bias", "post_attention_layernorm.bias", MG_REPLICATED, 17,
	  MGF_ANY },
	{ "mlp.linear_fc1.layer_norm_bias", "post_attention_layernorm.bias", MG_REPLICATED,
	  17, MGF_ANY },
	{ "mlp.router.weight", "gate.weight", MG_ROUTER, MG_ORDER_ROUTER, MGF_ANY },
	{ "mlp.router.expert_bias", "gate.e_score_correction_bias", MG_ROUTER,
	  MG_ORDER_ROUTER + 1, MGF_ANY },
	{ "mlp.shared_experts.linear_fc1.weight", "mlp.shared_expert", MG_SHARED_FC1,
	  MG_ORDER_SHARED, MGF_QWEN2_SHARED },
	{ "mlp.shared_experts.linear_fc2.weight", "mlp.shared_expert.down_proj.weight",
	  MG_SHARED_ROW, MG_ORDER_SHARED + 2, MGF_QWEN2_SHARED },
	{ "mlp.shared_experts.gate_weight", "mlp.shared_expert_gate.weight",
	  MG_SHARED_REPLICATED, MG_ORDER_SHARED + 3, MGF_QWEN2_SHARED },
	{ "mlp.shared_experts.linear_fc1.weight", "mlp.shared_experts", MG_SHARED_FC1,
	  MG_ORDER_SHARED, MGF_DEEPSEEK_SHARED },
	{ "mlp.shared_experts.linear_fc2.weight", "mlp.shared_experts.down_proj.weight",
	  MG_SHARED_ROW, MG_ORDER_SHARED + 2, MGF_DEEPSEEK_SHARED },
};

static bool in_family(const struct ckfs_megatron_arch *a, int family)
{
	switch (family) {
	case MGF_GQA:
		return !a->mla;
	case MGF_MLA:
		return a->mla;
	case MGF_QWEN2_SHARED:
		return a->qwen2_moe;
	case MGF_DEEPSEEK_SHARED:
		return a->deepseek_moe;
	default:
		return true;
	}
}

static const struct ckfs_megatron_key *find_key(const struct ckfs_megatron_arch *a,
						const struct ckfs_megatron_key *keys, size_t n,
						const char *rest)
{
	for (size_t k = 0; k < n; k++)
		if (strcmp(rest, keys[k].mg) == 0 && in_family(a, keys[k].family))
			return &keys[k];
	return NULL;
}

const struct ckfs_megatron_key *ckfs_megatron_layer_entry(const struct ckfs_megatron_arch *a,
							  const char *rest)
{
	return find_key(a, layer_keys, sizeof(layer_keys) / sizeof(layer_keys[0]), rest);
}

int ckfs_megatron_global_shape(const struct ckfs_megatron_arch *a,
			       const struct ckfs_megatron_key *k, int64_t shape[2])
{
	if (k->part != MG_COL && k->part != MG_COL_OR_DUP)
		return 0;
	if (k->family != MGF_MLA) { /* MTP's eh_proj: [embedding; hidden] -> hidden */
		shape[0] = a->hidden;
		shape[1] = 2 * a->hidden;
		return 1;
	}
	switch (k->order) {
	case 0: /* q down */
		shape[0] = a->q_lora;
		shape[1] = a->hidden;
		break;
	case 2: /* q up: per head [nope; rope] */
		shape[0] = a->nh * (a->qk_nope + a->qk_rope);
		shape[1] = a->q_lora;
		break;
	case 3: /* kv down: [kv_lora_rank; rope] */
		shape[0] = a->kv_lora + a->qk_rope;
		shape[1] = a->hidden;
		break;
	default: /* kv up: per head [nope; v] */
		shape[0] = a->nh * (a->qk_nope + a->v_dim);
		shape[1] = a->kv_lora;
		break;
	}
	return 1;
}

/* ---- multi-token prediction ---- */

/* An MTP layer's own tensors as DeepSeek-V3's Hugging Face release names
 * them (model.layers.61.* of its 61 decoder layers; GLM-4.5 the same at
 * model.layers.92), the names vLLM's and SGLang's DeepSeek MTP loaders
 * read: embed_tokens, enorm, hnorm, eh_proj, shared_head.norm and
 * shared_head.head beside the layer's self_attn and mlp. */
static const struct ckfs_megatron_key mtp_keys[] = {
	{ "enorm.weight", "enorm.weight", MG_REPLICATED, MG_ORDER_MTP + 1, MGF_ANY },
	{ "hnorm.weight", "hnorm.weight", MG_REPLICATED, MG_ORDER_MTP + 2, MGF_ANY },
	{ "eh_proj.weight", "eh_proj.weight", MG_COL, MG_ORDER_MTP + 3, MGF_ANY },
	{ "final_layernorm.weight", "shared_head.norm.weight", MG_REPLICATED,
	  MG_ORDER_MTP + 4, MGF_ANY },
};
const struct ckfs_megatron_key ckfs_megatron_mtp_embed = {
	"embedding.word_embeddings.weight", "embed_tokens.weight", MG_COL, MG_ORDER_MTP, MGF_ANY
};
const struct ckfs_megatron_key ckfs_megatron_mtp_head = {
	"output_layer.weight", "shared_head.head.weight", MG_COL, MG_ORDER_MTP + 5, MGF_ANY
};

const struct ckfs_megatron_key *ckfs_megatron_mtp_entry(const struct ckfs_megatron_arch *a,
							const char *rest)
{
	return find_key(a, mtp_keys, sizeof(mtp_keys) / sizeof(mtp_keys[0]), rest);
}

int ckfs_megatron_mtp_key(const char *key, long *i, const char **rest, int *inner)
{
	static const char pfx[] = "mtp.layers.";
	static const char *const inners[] = { "mtp_model_layer.", "transformer_layer." };
	char *end;

	if (strncmp(key, pfx, sizeof(pfx) - 1) != 0 || !isdigit((unsigned char)key[sizeof(pfx) - 1]))
		return 0;
	*i = strtol(key + sizeof(pfx) - 1, &end, 10);
	if (*end != '.' || *i < 0 || *i > 1000000)
		return 0;
	*rest = end + 1;
	*inner = 0;
	for (size_t k = 0; k < sizeof(inners) / sizeof(inners[0]); k++)
		if (strncmp(*rest, inners[k], strlen(inners[k])) == 0) {
			*rest += strlen(inners[k]);
			*inner = 1;
		}
	return 1;
}

enum ckfs_code ckfs_megatron_check_mtp(struct ckfs_model *m, const struct ckfs_megatron_arch *a,
				       long n, const char *where, struct ckfs_error *err)
{
	if (n > 0 && a->mtp_layers >= 0 && n != a->mtp_layers)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': %ld MTP layers, config.json '%s' "
				 "says num_nextn_predict_layers %lld", where, n,
				 m->config_path, (long long)a->mtp_layers);
	if (n > 0 && a->mtp_layers < 0)
		return ckfs_model_warn(m, err, "%ld MTP layers served as model.layers.%lld.. "
				       "(config.json names no num_nextn_predict_layers)", n,
				       (long long)a->n_layers);
	if (n == 0 && a->mtp_layers > 0)
		return ckfs_model_warn(m, err, "config.json says num_nextn_predict_layers "
				       "%lld, the checkpoint has no MTP layers (trained "
				       "without them): served without", (long long)a->mtp_layers);
	return CKFS_OK;
}

int ckfs_megatron_layer_key(const char *key, long *layer, const char **rest)
{
	static const char pfx[] = "decoder.layers.";
	const char *p = key + sizeof(pfx) - 1;
	char *end;

	if (strncmp(key, pfx, sizeof(pfx) - 1) != 0)
		return 0;
	if (!isdigit((unsigned char)*p)) {
		*layer = -1;
		*rest = p;
		return 1;
	}
	*layer = strtol(p, &end, 10);
	if (*end != '.' || *layer < 0 || *layer > 1000000)
		return 0;
	*rest = end + 1;
	return 1;
}

const char *ckfs_megatron_top_name(const char *key)
{
	static const char *const names[][2] = {
		{ "embedding.word_embeddings.weight", "model.embed_tokens.weight" },
		{ "output_layer.weight", "lm_head.weight" },
		{ "decoder.final_layernorm.weight", "model.norm.weight" },
		{ "decoder.final_layernorm.bias", "model.norm.bias" },
	};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strcmp(key, names[i][0]) == 0)
			return names[i][1];
	return NULL;
}

void ckfs_megatron_name(const struct ckfs_megatron_arch *a, long layer,
			const struct ckfs_megatron_key *k, int part, char *out, size_t cap)
{
	static const char *const qkv[3] = { "q_proj", "k_proj", "v_proj" };
	static const char *const fc1[2] = { "gate_proj", "up_proj" };

	switch (k->part) {
	case MG_QKV:
		snprintf(out, cap, "model.layers.%ld.self_attn.%s.%s", layer, qkv[part], k->hf);
		break;
	case MG_FC1:
	case MG_SHARED_FC1:
		snprintf(out, cap, "model.layers.%ld.%s.%s.weight", layer, k->hf, fc1[part]);
		break;
	case MG_ROUTER:
		snprintf(out, cap, "model.layers.%ld.%s.%s", layer,
			 a->mixtral ? "block_sparse_moe" : "mlp", k->hf);
		break;
	default:
		snprintf(out, cap, "model.layers.%ld.%s", layer, k->hf);
		break;
	}
}

void ckfs_megatron_expert_name(const struct ckfs_megatron_arch *a, long layer, int64_t expert,
			       int which, char *out, size_t cap)
{
	static const char *const qwen[3] = { "gate_proj", "up_proj", "down_proj" };
	static const char *const mixtral[3] = { "w1", "w3", "w2" };

	if (a->mixtral)
		snprintf(out, cap, "model.layers.%ld.block_sparse_moe.experts.%lld.%s.weight",
			 layer, (long long)expert, mixtral[which]);
	else
		snprintf(out, cap, "model.layers.%ld.mlp.experts.%lld.%s.weight", layer,
			 (long long)expert, qwen[which]);
}

/* ---- keys not understood ---- */

void ckfs_megatron_unknown(struct ckfs_megatron_unknown *u, const char *key)
{
	size_t l = strlen(u->list);

	if (u->n++ < 8)
		snprintf(u->list + l, sizeof(u->list) - l, "%s'%s'", l ? ", " : "", key);
}

enum ckfs_code ckfs_megatron_unknown_fail(const struct ckfs_megatron_unknown *u,
					  const char *where, struct ckfs_error *err)
{
	if (!u->n)
		return CKFS_OK;
	return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': %zu Megatron keys not understood: "
			 "%s%s (--raw-names serves them under their own names)", where, u->n,
			 u->list, u->n > 8 ? ", ..." : "");
}

enum ckfs_code ckfs_megatron_warn_tied(struct ckfs_model *m, struct ckfs_error *err)
{
	return ckfs_model_warn(m, err, "output_layer.weight dropped: tied to "
			       "model.embed_tokens.weight (tie_word_embeddings)");
}
