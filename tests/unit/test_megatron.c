/* SPDX-License-Identifier: MIT */
/*
 * Legacy Megatron per-rank checkpoints (src/model/megatron.c) on folders
 * written by megatron-core 0.12.2 (tests/gen/make_megatron_fixtures.py):
 *  - every fixture served --dtype auto holds, tensor by tensor and bit for
 *    bit, the original Hugging Face weights (original/model.safetensors),
 *    with the same names, shapes and dtype (bf16 stays bf16): Llama TP=2,
 *    Qwen2 TP=2 PP=2 (qkv bias), Qwen3 PP=3 with stages of 1, 2, 1 layers
 *    (q/k norm), tied Llama PP=2 VPP=2, and Llama TP=2 with Transformer
 *    Engine names (fused layer_norm_weight, BytesIO/tensor _extra_state),
 *    Qwen2-MoE TP=2 EP=2 with shared expert (SequentialMLP and TE
 *    GroupedMLP names), Qwen3-MoE PP=2 EP=2 and PP=2 (mp_rank_TT_PPP read
 *    as TP_PP although the model has experts), Mixtral TP=2 EP=2
 *    (block_sparse_moe.experts.E.w1/w2/w3), and a Qwen2 critic TP=2 whose
 *    [1, H] value head is served as score.weight with a
 *    Qwen2ForTokenClassification config.json;
 *  - the layout is "megatron" with its TP/PP/VPP/EP sizes and layers per
 *    chunk;
 *  - broken folders fail with one line: a missing TP or EP rank, a rank
 *    file from a different TP size or a dense run, an unknown key (served
 *    per rank with --raw-names), a dict instead of a list, KV heads that TP
 *    does not divide, experts that EP does not divide.
 */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/folder.h"
#include "ckfs/model.h"
#include "ckfs/st.h"
#include "test.h"
#include "model_check.h"

#define MG CKFS_FIXTURES "/megatron"

static const struct {
	const char *name, *original; /* the case whose original/ holds its weights */
	int tp, pp, vpp;
	int stage_layers[4];
	int tied, ep;
} cases[] = {
	{ "llama_tp2", "llama_tp2", 2, 1, 1, { 4 }, 0, 1 },
	{ "llama_tp2_te", "llama_tp2", 2, 1, 1, { 4 }, 0, 1 },
	{ "qwen2_tp2_pp2", "qwen2_tp2_pp2", 2, 2, 1, { 2, 2 }, 0, 1 },
	{ "qwen3_pp3_uneven", "qwen3_pp3_uneven", 1, 3, 1, { 1, 2, 1 }, 0, 1 },
	{ "llama_tied_pp2_vpp2", "llama_tied_pp2_vpp2", 1, 2, 2, { 1, 1, 1, 1 }, 1, 1 },
	{ "qwen2_moe_tp2_ep2", "qwen2_moe_tp2_ep2", 2, 1, 1, { 4 }, 0, 2 },
	{ "qwen2_moe_tp2_ep2_te", "qwen2_moe_tp2_ep2", 2, 1, 1, { 4 }, 0, 2 },
	{ "qwen3_moe_pp2_ep2", "qwen3_moe_pp2_ep2", 1, 2, 1, { 2, 2 }, 0, 2 },
	{ "mixtral_tp2_ep2", "mixtral_tp2_ep2", 2, 1, 1, { 4 }, 0, 2 },
	{ "qwen2_critic_tp2", "qwen2_critic_tp2", 2, 1, 1, { 4 }, 0, 1 },
	/* mp_rank_TT_PPP of a MoE model: stage 1 has no embedding, so PP */
	{ "qwen3_moe_pp2", "qwen3_moe_pp2", 1, 2, 1, { 2, 2 }, 0, 1 },
};

static void test_equals_original(void)
{
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char src[1024], orig[1024];
		struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_INVALID };
		struct ckfs_model *m = NULL;
		struct ckfs_st_set ref;
		struct ckfs_error err;

		snprintf(src, sizeof(src), MG "/%s", cases[i].name);
		snprintf(orig, sizeof(orig), MG "/%s/original", cases[i].original);
		ckfs_error_clear(&err);
		CHECK(ckfs_model_open(src, &opt, &m, &err) == CKFS_OK);
		if (!m) {
			fprintf(stderr, "%s: %s\n", src, err.msg);
			continue;
		}
		CHECK_EQ_STR(m->layout, "megatron");
		CHECK_EQ_INT(m->tp_size, cases[i].tp);
		CHECK_EQ_INT(m->pp_size, cases[i].pp);
		CHECK_EQ_INT(m->vpp_size, cases[i].vpp);
		CHECK_EQ_INT(m->ep_size, cases[i].ep);
		CHECK_EQ_INT(m->world_size, cases[i].tp * cases[i].pp * cases[i].ep);
		for (int k = 0; k < cases[i].pp * cases[i].vpp; k++)
			CHECK_EQ_INT(m->stage_layers[k], cases[i].stage_layers[k]);
		CHECK_EQ_INT(m->tie_word_embeddings, cases[i].tied);
		ckfs_error_clear(&err);
		CHECK(ckfs_st_set_open(orig, NULL, &ref, &err) == CKFS_OK);
		CHECK_EQ_INT(m->n_tensors, ref.n_entries);
		test_model_equals(m, &ref, CKFS_DTYPE_BF16, cases[i].name);
		if (strcmp(cases[i].name, "llama_tp2_te") == 0) {
			int skipped = 0;
			for (size_t k = 0; k < m->n_warnings; k++)
				skipped |= strstr(m->warnings[k], "21 _extra_state entries "
						  "skipped") != NULL;
			CHECK(skipped);
		}
		if (cases[i].tied) {
			for (size_t k = 0; k < m->n_tensors; k++)
				CHECK(strcmp(m->tensors[k].name, "lm_head.weight") != 0);
		}
		/* The folder serves it with config.json from hf_config_and_tokenizer/. */
		struct ckfs_folder_options fopt = { 0 };
		struct ckfs_folder *f = NULL;
		ckfs_error_clear(&err);
		CHECK(ckfs_folder_build(m, &fopt, &f, &err) == CKFS_OK);
		int has_cfg = 0;
		for (size_t k = 0; f && k < f->n_nodes; k++) {
			if (strcmp(f->nodes[k].name, "config.json") != 0)
				continue;
			has_cfg = 1;
			/* The critic's config names the token-classification class. */
			int critic = strstr(cases[i].name, "critic") != NULL;
			CHECK_EQ_INT(strstr(f->nodes[k].data, "\"Qwen2ForTokenClassification\"") != NULL,
				     critic);
			CHECK_EQ_INT(strstr(f->nodes[k].data, "\"LABEL_0\"") != NULL, critic);
		}
		CHECK(has_cfg);
		ckfs_folder_free(f);
		ckfs_st_set_release(&ref);
		ckfs_model_free(m);
	}
}

/* dir ($D) = a copy of case after setup (a shell command). */
static void expect_broken_in(const char *cas, const char *setup, enum ckfs_code code, const char *needle1,
			  const char *needle2)
{
	const char *dir = test_tmp_dir("megatron", "broken");
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_INVALID };
	struct ckfs_model *m = NULL;
	struct ckfs_error err;

	CHECK(test_sh("rm -rf '%s' && cp -r " MG "/%s '%s'", dir, cas, dir) == 0);
	CHECK(test_sh("D='%s'; %s", dir, setup) == 0);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_model_open(dir, &opt, &m, &err), code);
	CHECK(m == NULL);
	ckfs_model_free(m);
	fprintf(stderr, "  (expected) %s\n", err.msg);
	CHECK(strstr(err.msg, needle1) != NULL);
	CHECK(!needle2 || strstr(err.msg, needle2) != NULL);
	CHECK(strchr(err.msg, '\n') == NULL);
}

static void expect_broken(const char *setup, enum ckfs_code code, const char *needle1,
			  const char *needle2)
{
	expect_broken_in("llama_tp2", setup, code, needle1, needle2);
}

static void test_broken(void)
{
	/* The last pipeline stage gone: PP looks like 2. */
	expect_broken_in("qwen3_pp3_uneven", "rm -r \"$D/model/mp_rank_00_002\"",
			 CKFS_E_INVALID, "3 decoder layers over TP=1 PP=2 VPP=1, config.json "
			 "says num_hidden_layers 4", "a missing pipeline stage?");
	expect_broken("rm -r \"$D/model/mp_rank_00\"", CKFS_E_NOTFOUND,
		      "/model/mp_rank_00/model.pt': not found",
		      "TP rank 0 of PP stage 0 is needed: TP=2, PP=1");
	/* The last TP rank gone: TP looks like 1, and the shards are too small. */
	expect_broken("rm -r \"$D/model/mp_rank_01\"", CKFS_E_INVALID,
		      "'embedding.word_embeddings.weight' has 49 rows over 1 TP rank, "
		      "config.json says vocab_size 98", "a missing TP rank?");
	/* ... and with vocab_size not checked, the fused QKV rows tell. */
	expect_broken("rm -r \"$D/model/mp_rank_01\" && sed -i 's/\"vocab_size\"/\"vocab\"/' "
		      "\"$D/hf_config_and_tokenizer/config.json\"", CKFS_E_INVALID,
		      "'decoder.layers.0.self_attention.linear_qkv.weight' has 64 rows, "
		      "expected 128", "a missing TP rank");
	expect_broken("cp " MG "/broken/tp_mismatch_rank1.pt \"$D/model/mp_rank_01/model.pt\"",
		      CKFS_E_INVALID, "mp_rank_01/model.pt': ", "mismatched TP sizes");
	expect_broken("cp " MG "/broken/unknown_key_rank0.pt \"$D/model/mp_rank_00/model.pt\" && "
		      "cp " MG "/broken/unknown_key_rank0.pt \"$D/model/mp_rank_01/model.pt\"",
		      CKFS_E_UNSUPPORTED, "1 Megatron keys not understood (--raw-names serves "
		      "them under their own names): "
		      "'decoder.layers.0.self_attention.linear_kv_down_proj.weight'", NULL);
	expect_broken("cp " MG "/broken/dict_rank0.pt \"$D/model/mp_rank_00/model.pt\"",
		      CKFS_E_FORMAT, "mp_rank_00/model.pt': data.pkl holds a dict, not a "
		      "list of state dicts", NULL);
	expect_broken("mkdir \"$D/model/mp_rank_00_001_002\"", CKFS_E_INVALID,
		      "/model': rank folders with 1 and 3 numbers (mixed checkpoints", NULL);
	expect_broken("mkdir \"$D/model/mp_rank_00_001\"", CKFS_E_INVALID,
		      "/model': rank folders with 1 and 2 numbers (mixed checkpoints", NULL);
	/* KV heads TP does not divide (Megatron-Core refuses them too), and
	 * heads that are not a multiple of the KV heads. */
	expect_broken("sed -i 's/\"num_key_value_heads\": 2/\"num_key_value_heads\": 1/' "
		      "\"$D/hf_config_and_tokenizer/config.json\"", CKFS_E_UNSUPPORTED,
		      "num_key_value_heads 1 is not a multiple of TP 2 (Megatron-Core needs "
		      "num_query_groups % TP == 0", NULL);
	expect_broken_in("qwen2_moe_tp2_ep2",
			 "sed -i 's/\"num_key_value_heads\": 2/\"num_key_value_heads\": 1/' "
			 "\"$D/hf_config_and_tokenizer/config.json\"", CKFS_E_UNSUPPORTED,
			 "num_key_value_heads 1 is not a multiple of TP 2", NULL);
	expect_broken("sed -i 's/\"num_key_value_heads\": 2/\"num_key_value_heads\": 3/' "
		      "\"$D/hf_config_and_tokenizer/config.json\"", CKFS_E_FORMAT,
		      "config.json': needs hidden_size, num_attention_heads (a multiple of "
		      "num_key_value_heads)", NULL);
	/* Expert parallelism: one EP rank folder gone (mp_rank_TT_EEE names). */
	expect_broken_in("qwen2_moe_tp2_ep2", "rm -r \"$D/model/mp_rank_01_001\"",
			 CKFS_E_NOTFOUND, "/model/mp_rank_01_001/model.pt': not found (TP rank "
			 "1 of PP stage or EP rank 1 is needed: the folders present name 2 TP "
			 "ranks and 2 PP stages or EP ranks)", NULL);
	/* ... a whole EP rank gone: half the experts. */
	expect_broken_in("qwen2_moe_tp2_ep2", "rm -r \"$D/model/mp_rank_00_001\" "
			 "\"$D/model/mp_rank_01_001\"", CKFS_E_INVALID,
			 "layer 0 has 2 experts over EP=1, config.json says 4 (a missing EP "
			 "rank?)", NULL);
	expect_broken_in("qwen3_moe_pp2_ep2", "rm -r \"$D/model/mp_rank_00_001_001\"",
			 CKFS_E_NOTFOUND, "/model/mp_rank_00_001_001/model.pt': not found (TP "
			 "rank 0 of PP stage 1, EP rank 1 is needed: TP=1, PP=2, EP=2)", NULL);
	/* A dense run's rank file among the MoE ranks. */
	expect_broken_in("qwen2_moe_tp2_ep2", "cp " MG "/broken/qwen2_moe_dense_rank.pt "
			 "\"$D/model/mp_rank_00_001/model.pt\"", CKFS_E_INVALID,
			 "mp_rank_00_001/model.pt': chunk 0 has ", "(mismatched checkpoints?)");
	/* Expert shards of another width than TP gives (expert TP != TP). */
	expect_broken_in("qwen2_moe_tp2_ep2", "sed -i 's/\"moe_intermediate_size\": 32/"
			 "\"moe_intermediate_size\": 16/' \"$D/hf_config_and_tokenizer/config.json\"",
			 CKFS_E_UNSUPPORTED, "'decoder.layers.0.mlp.experts.local_experts.0."
			 "linear_fc1.weight' has 32 rows on TP rank 0, expected 2 x 16 / TP 2 "
			 "(expert tensor parallelism other than TP is not supported)", NULL);
	/* Experts EP does not divide. */
	expect_broken_in("qwen3_moe_pp2_ep2", "sed -i 's/\"num_local_experts\": 4/\"num_local_experts\": 3/' "
			 "\"$D/hf_config_and_tokenizer/config.json\"", CKFS_E_INVALID,
			 "3 experts in config.json cannot be split over EP=2 rank folders", NULL);
}

/* --raw-names: the unknown key served per TP rank under its own name, with
 * the bytes each rank holds (zeros, as the generator wrote them). */
static void test_raw_names(void)
{
	const char *dir = test_tmp_dir("megatron", "raw");
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_INVALID, .raw_names = true };
	struct ckfs_model *m = NULL;
	struct ckfs_read_scratch s = { 0 };
	struct ckfs_error err;

	CHECK(test_sh("rm -rf '%s' && cp -r " MG "/llama_tp2 '%s' && "
		      "cp " MG "/broken/unknown_key_rank0.pt '%s/model/mp_rank_00/model.pt' && "
		      "cp " MG "/broken/unknown_key_rank0.pt '%s/model/mp_rank_01/model.pt'",
		      dir, dir, dir, dir) == 0);
	ckfs_error_clear(&err);
	CHECK(ckfs_model_open(dir, &opt, &m, &err) == CKFS_OK);
	if (!m) {
		fprintf(stderr, "%s\n", err.msg);
		return;
	}
	int found = 0, warned = 0;
	for (size_t k = 0; k < m->n_tensors; k++) {
		const struct ckfs_tensor *t = &m->tensors[k];
		if (strncmp(t->name, "decoder.layers.0.self_attention.linear_kv_down_proj."
			    "weight.tp_rank_0", 67) != 0)
			continue;
		found++;
		CHECK_EQ_INT(t->ndim, 2);
		CHECK_EQ_INT(t->shape[0], 4);
		CHECK_EQ_INT(t->shape[1], 64);
		unsigned char buf[4 * 64 * 2], zero[sizeof(buf)] = { 0 };
		ckfs_error_clear(&err);
		CHECK(ckfs_tensor_read(m, t, 0, t->numel, buf, &s, &err) == CKFS_OK);
		CHECK(memcmp(buf, zero, sizeof(buf)) == 0);
	}
	CHECK_EQ_INT(found, 2);
	for (size_t k = 0; k < m->n_warnings; k++)
		warned |= strstr(m->warnings[k], "1 Megatron keys without a Hugging Face name "
				 "served raw, per rank (--raw-names)") != NULL;
	CHECK(warned);
	ckfs_read_scratch_release(&s);
	ckfs_model_free(m);
}

int main(void)
{
	RUN(test_equals_original);
	RUN(test_broken);
	RUN(test_raw_names);
	test_tmp_cleanup();
	return test_summary();
}
