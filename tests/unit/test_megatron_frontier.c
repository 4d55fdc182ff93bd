/* SPDX-License-Identifier: MIT */
/*
 * Megatron checkpoints of the frontier MoE layers, written by megatron-core
 * 0.19.2 (tests/gen/make_megatron_frontier_fixtures.py), in both readers
 * (src/layouts/megatron.c, megatron_dist.c):
 *  - every case served --dtype auto holds, tensor by tensor and bit for
 *    bit, the Hugging Face weights whose transformers forward reproduces
 *    Megatron's logits (the generator's --self-check), and its MTP layer
 *    under DeepSeek-V3's names equal to Megatron's mtp.* tensors
 *    (original/, two shards as DeepSeek ships them): DeepSeek-V3 (MLA,
 *    first layer dense, shared experts, expert_bias) TP=2 EP=2, PP=2 EP=2
 *    (MTP on the last stage with its own copy of the embedding), TP=2 EP=2
 *    with whole experts (ETP=1, saved on data-parallel rank 0), with
 *    Transformer Engine's MLA names (duplicated down projections, fused
 *    q_a/kv_a norms), and torch_dist TP=2 EP=2; GLM-4.5 (qkv bias, q/k norm,
 *    ungated shared experts) TP=2 EP=2 and torch_dist TP=2 PP=2;
 *  - MTP against config.json's num_nextn_predict_layers: another count is
 *    refused, an absent key or an MTP-less checkpoint warned about; MTP
 *    keys of an architecture without DeepSeek's names are refused;
 *  - MLA config faults fail with one line: widths the tensors do not
 *    have, q_lora_rank null (linear_q_proj), a stray MLA key.
 */
#include <stdlib.h>

#include "ckfs/layouts.h"
#include "ckfs/model.h"
#include "ckfs/safetensors.h"
#include "test.h"
#include "model_check.h"

#define FR CKFS_FIXTURES "/megatron_frontier"

static const struct {
	const char *name, *original, *layout;
	int n_tensors;
} cases[] = {
	{ "deepseek_v3_tp2_ep2", "deepseek_v3_tp2_ep2", "megatron", 99 },
	{ "deepseek_v3_pp2_ep2", "deepseek_v3_pp2_ep2", "megatron", 99 },
	{ "deepseek_v3_tp2_ep2_te", "deepseek_v3_tp2_ep2", "megatron", 99 },
	{ "deepseek_v3_tp2_ep2_etp1", "deepseek_v3_tp2_ep2_etp1", "megatron", 99 },
	{ "glm4_moe_tp2_ep2", "glm4_moe_tp2_ep2", "megatron", 107 },
	{ "deepseek_v3_tp2_ep2_dist", "deepseek_v3_tp2_ep2_dist", "megatron-dist", 99 },
	{ "glm4_moe_tp2_pp2_dist", "glm4_moe_tp2_pp2_dist", "megatron-dist", 107 },
};

static int has_tensor(const struct ckfs_model *m, const char *name)
{
	for (size_t k = 0; k < m->n_tensors; k++)
		if (strcmp(m->tensors[k].name, name) == 0)
			return 1;
	return 0;
}

static void test_equals_original(void)
{
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char src[512], orig[512];
		struct ckfs_model_options opt = { .as_stored = true };
		struct ckfs_model *m = NULL;
		struct ckfs_st_set ref;
		struct ckfs_error err;

		snprintf(src, sizeof(src), FR "/%s", cases[i].name);
		snprintf(orig, sizeof(orig), FR "/%s/original", cases[i].original);
		ckfs_error_clear(&err);
		CHECK(ckfs_model_open(src, &opt, &m, &err) == CKFS_OK);
		if (!m) {
			fprintf(stderr, "%s: %s\n", src, err.msg);
			continue;
		}
		CHECK_EQ_STR(m->layout->name, cases[i].layout);
		CHECK(ckfs_st_set_open(orig, NULL, &ref, &err) == CKFS_OK);
		CHECK_EQ_INT(ref.n_entries, cases[i].n_tensors);
		CHECK_EQ_INT(m->n_tensors, ref.n_entries);
		test_model_equals(m, &ref, CKFS_DTYPE_INVALID, src);
		/* DeepSeek's MTP names at layer num_hidden_layers (3) */
		CHECK(has_tensor(m, "model.layers.3.eh_proj.weight"));
		CHECK(has_tensor(m, "model.layers.3.shared_head.head.weight"));
		CHECK(has_tensor(m, "model.layers.3.mlp.experts.3.down_proj.weight"));
		for (size_t k = 0; k < m->n_warnings; k++)
			CHECK(strstr(m->warnings[k], "MTP") == NULL);
		ckfs_st_set_release(&ref);
		ckfs_model_free(m);
	}
}

/* A copy of case, after setup ($D: the copy), opened: the model or NULL. */
static struct ckfs_model *open_changed(const char *cas, const char *setup, struct ckfs_error *err)
{
	const char *dir = test_tmp_dir("megatron-frontier", "case");
	struct ckfs_model_options opt = { .as_stored = true };
	struct ckfs_model *m = NULL;

	CHECK(test_sh("rm -rf '%s' && cp -r " FR "/%s '%s'", dir, cas, dir) == 0);
	CHECK(test_sh("D='%s'; %s", dir, setup) == 0);
	ckfs_error_clear(err);
	if (ckfs_model_open(dir, &opt, &m, err) != CKFS_OK)
		return NULL;
	return m;
}

static void expect_broken(const char *cas, const char *setup, enum ckfs_code code,
			  const char *needle1, const char *needle2)
{
	struct ckfs_error err;
	struct ckfs_model *m = open_changed(cas, setup, &err);

	CHECK(m == NULL);
	ckfs_model_free(m);
	CHECK_EQ_INT(err.code, code);
	fprintf(stderr, "  (expected) %s\n", err.msg);
	CHECK(strstr(err.msg, needle1) != NULL);
	CHECK(!needle2 || strstr(err.msg, needle2) != NULL);
	CHECK(strchr(err.msg, '\n') == NULL);
}

/* The warning of a model that opened: 1 when one holds needle. */
static int opens_warning(const char *cas, const char *setup, const char *needle)
{
	struct ckfs_error err;
	struct ckfs_model *m = open_changed(cas, setup, &err);
	int found = 0;

	CHECK(m != NULL);
	for (size_t k = 0; m && k < m->n_warnings; k++)
		if (strstr(m->warnings[k], needle)) {
			fprintf(stderr, "  (expected warning) %s\n", m->warnings[k]);
			found = 1;
		}
	ckfs_model_free(m);
	return found;
}

#define LEGACY_CFG "\"$D/hf_config_and_tokenizer/config.json\""
#define DIST_CFG "\"$D/huggingface/config.json\""

static void test_mtp_config(void)
{
	const char *cases_cfg[][2] = { { "deepseek_v3_tp2_ep2", LEGACY_CFG },
				       { "glm4_moe_tp2_pp2_dist", DIST_CFG } };
	char setup[512];

	for (size_t i = 0; i < 2; i++) {
		const char *cas = cases_cfg[i][0], *cfg = cases_cfg[i][1];
		snprintf(setup, sizeof(setup), "sed -i 's/\"num_nextn_predict_layers\": 1/"
			 "\"num_nextn_predict_layers\": 2/' %s", cfg);
		expect_broken(cas, setup, CKFS_E_INVALID, "1 MTP layers, config.json '",
			      "says num_nextn_predict_layers 2");
		snprintf(setup, sizeof(setup), "sed -i 's/\"num_nextn_predict_layers\": 1,//' %s",
			 cfg);
		CHECK(opens_warning(cas, setup, "1 MTP layers served as model.layers.3.. "
				    "(config.json names no num_nextn_predict_layers)"));
	}
	/* Another architecture's MTP has other Hugging Face names. */
	expect_broken("glm4_moe_tp2_pp2_dist", "sed -i 's/\"Glm4MoeForCausalLM\"/"
		      "\"Qwen3NextForCausalLM\"/' " DIST_CFG, CKFS_E_UNSUPPORTED,
		      "Megatron keys not understood: 'decoder.layers.1.mlp.shared_experts.",
		      "'mtp.layers.0.enorm.weight'");
	/* A run with MTP off: a config that names MTP, a checkpoint without. */
	CHECK(opens_warning("../megatron/qwen3_moe_pp2", "sed -i 's/\"vocab_size\"/"
			    "\"num_nextn_predict_layers\": 1, \"vocab_size\"/' " LEGACY_CFG,
			    "config.json says num_nextn_predict_layers 1, the checkpoint has no "
			    "MTP layers"));
}

static void test_mla_config(void)
{
	expect_broken("deepseek_v3_tp2_ep2", "sed -i 's/\"kv_lora_rank\": 16/\"kv_lora_rank\": 8/' "
		      LEGACY_CFG, CKFS_E_INVALID, "'decoder.layers.0.self_attention."
		      "linear_kv_down_proj.weight' makes model.layers.0.self_attn.kv_a_proj_with_mqa."
		      "weight [24, 64] over TP=2, config.json '", "gives [16, 64]");
	expect_broken("deepseek_v3_tp2_ep2_dist", "sed -i 's/\"q_lora_rank\": 32/\"q_lora_rank\": 24/' "
		      DIST_CFG, CKFS_E_INVALID, "'decoder.layers.0.self_attention.linear_q_down_proj."
		      "weight' has shape [32, 64], expected [24, 64]", NULL);
	expect_broken("deepseek_v3_tp2_ep2", "sed -i 's/\"q_lora_rank\": 32/\"q_lora_rank\": null/' "
		      LEGACY_CFG, CKFS_E_UNSUPPORTED, "multi-head latent attention without "
		      "q_lora_rank (a linear_q_proj) is not read from Megatron checkpoints", NULL);
	expect_broken("deepseek_v3_tp2_ep2", "sed -i 's/\"qk_rope_head_dim\": 8,//' " LEGACY_CFG,
		      CKFS_E_FORMAT, "multi-head latent attention needs qk_nope_head_dim, "
		      "qk_rope_head_dim and v_head_dim", NULL);
	/* A dense model's keys in an MLA model are not guessed at. */
	expect_broken("deepseek_v3_tp2_ep2_dist", "sed -i 's/\"kv_lora_rank\": 16/"
		      "\"kv_lora_rank\": 0/' " DIST_CFG, CKFS_E_UNSUPPORTED,
		      "Megatron keys not understood: 'decoder.layers.0.self_attention."
		      "linear_q_down_proj.weight'", NULL);
}

int main(void)
{
	RUN(test_equals_original);
	RUN(test_mtp_config);
	RUN(test_mla_config);
	test_tmp_cleanup();
	return test_summary();
}
