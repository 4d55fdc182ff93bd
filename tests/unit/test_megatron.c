/* SPDX-License-Identifier: MIT */
/*
 * Legacy Megatron per-rank checkpoints (src/layouts/megatron.c) on folders
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
 *    (block_sparse_moe.experts.E.w1/w2/w3), a Qwen2 critic TP=2 whose
 *    [1, H] value head is served as score.weight with a
 *    Qwen2ForTokenClassification config.json, and expert tensor parallel
 *    size 1 (experts whole, folders no TP x EP grid, as verl saves them):
 *    Qwen2-MoE TP=2 EP=2 (mp_rank_00_000, mp_rank_01_001), Mixtral TP=2
 *    PP=2 EP=2, Qwen3-MoE TP=2 EP=1;
 *  - the layout is "megatron" with its TP/PP/VPP/EP/ETP sizes and layers
 *    per chunk;
 *  - broken folders fail with one line: a missing TP or EP rank (with
 *    whole experts too: a missing EP rank's experts or TP rank's dense
 *    shards, named; verl's TP=2 EP=4 ETP=1 save, which lacks EP ranks 2
 *    and 3), a rank file from a different TP size or a dense run, expert
 *    shards of two shapes, an expert width that is neither whole nor TP's
 *    shard, whole experts in a folder megatron-core never writes, no expert
 *    width in config.json, an unknown key (served per rank with
 *    --raw-names), a dict instead of a list, KV heads that TP does not
 *    divide, experts that EP does not divide.
 */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/folder.h"
#include "ckfs/layouts.h"
#include "ckfs/model.h"
#include "ckfs/safetensors.h"
#include "test.h"
#include "model_check.h"

#define MG CKFS_FIXTURES "/megatron"

static const struct {
	const char *name, *original; /* the case whose original/ holds its weights */
	int tp, pp, vpp;
	int stage_layers[4];
	int tied, ep;
	int etp;     /* 0: no expert weights */
	int folders; /* 0: every TP x PP x EP folder */
} cases[] = {
	{ "llama_tp2", "llama_tp2", 2, 1, 1, { 4 }, 0, 1, 0, 0 },
	{ "llama_tp2_te", "llama_tp2", 2, 1, 1, { 4 }, 0, 1, 0, 0 },
	{ "qwen2_tp2_pp2", "qwen2_tp2_pp2", 2, 2, 1, { 2, 2 }, 0, 1, 0, 0 },
	{ "qwen3_pp3_uneven", "qwen3_pp3_uneven", 1, 3, 1, { 1, 2, 1 }, 0, 1, 0, 0 },
	{ "llama_tied_pp2_vpp2", "llama_tied_pp2_vpp2", 1, 2, 2, { 1, 1, 1, 1 }, 1, 1, 0, 0 },
	{ "qwen2_moe_tp2_ep2", "qwen2_moe_tp2_ep2", 2, 1, 1, { 4 }, 0, 2, 2, 0 },
	{ "qwen2_moe_tp2_ep2_te", "qwen2_moe_tp2_ep2", 2, 1, 1, { 4 }, 0, 2, 2, 0 },
	{ "qwen3_moe_pp2_ep2", "qwen3_moe_pp2_ep2", 1, 2, 1, { 2, 2 }, 0, 2, 1, 0 },
	{ "mixtral_tp2_ep2", "mixtral_tp2_ep2", 2, 1, 1, { 4 }, 0, 2, 2, 0 },
	{ "qwen2_critic_tp2", "qwen2_critic_tp2", 2, 1, 1, { 4 }, 0, 1, 0, 0 },
	/* mp_rank_TT_PPP of a MoE model: stage 1 has no embedding, so PP */
	{ "qwen3_moe_pp2", "qwen3_moe_pp2", 1, 2, 1, { 2, 2 }, 0, 1, 1, 0 },
	/* Expert tensor parallel size 1: mp_rank_00_000 and mp_rank_01_001
	 * (TP rank t with EP rank t mod 2), each EP rank's experts whole. */
	{ "qwen2_moe_tp2_ep2_etp1", "qwen2_moe_tp2_ep2_etp1", 2, 1, 1, { 4 }, 0, 2, 1, 2 },
	{ "mixtral_tp2_pp2_ep2_etp1", "mixtral_tp2_pp2_ep2_etp1", 2, 2, 1, { 2, 2 }, 0, 2, 1, 4 },
	/* ... EP=1: both TP folders hold every expert whole */
	{ "qwen3_moe_tp2_etp1", "qwen3_moe_tp2_etp1", 2, 1, 1, { 4 }, 0, 1, 1, 0 },
};

static void test_equals_original(void)
{
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char src[1024], orig[1024];
		struct ckfs_model_options opt = { .as_stored = true };
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
		CHECK_EQ_STR(m->layout->name, "megatron");
		CHECK_EQ_INT(test_fact(m, "megatron", "tp", NULL, 0), cases[i].tp);
		CHECK_EQ_INT(test_fact(m, "megatron", "pp", NULL, 0), cases[i].pp);
		CHECK_EQ_INT(test_fact(m, "megatron", "vpp", NULL, 0), cases[i].vpp);
		CHECK_EQ_INT(test_fact(m, "megatron", "ep", NULL, 0), cases[i].ep);
		CHECK_EQ_INT(test_fact(m, "megatron", "etp", NULL, 0),
			     cases[i].etp ? cases[i].etp : -1);
		CHECK_EQ_INT(m->world_size, cases[i].folders ? cases[i].folders
							     : cases[i].tp * cases[i].pp * cases[i].ep);
		for (int k = 0; k < cases[i].pp * cases[i].vpp; k++)
			CHECK_EQ_INT(test_fact_at(m, "megatron", "stage_layers", k),
				     cases[i].stage_layers[k]);
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
	struct ckfs_model_options opt = { .as_stored = true };
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

/* Expert tensor parallel size 1 (experts whole, folders no TP x EP grid). */
static void test_broken_etp1(void)
{
	/* verl's own TP=2 EP=4 save: data-parallel rank 0 is TP ranks 0 and 1,
	 * i.e. EP ranks 0 and 1; EP ranks 2 and 3's experts were never saved. */
	expect_broken_in("qwen3_moe_tp2_ep4_etp1", "true", CKFS_E_NOTFOUND,
			 "/model': no rank folder holds the experts of EP ranks 2, 3: each "
			 "folder holds 1 of config.json's 4 experts per layer (EP=4), the "
			 "folder names give EP=2", NULL);
	/* An EP rank's only folder gone: the names now say TP=1, EP=1. */
	expect_broken_in("qwen2_moe_tp2_ep2_etp1", "rm -r \"$D/model/mp_rank_01_001\"",
			 CKFS_E_NOTFOUND, "/model': no rank folder holds the experts of EP "
			 "rank 1: each folder holds 2 of config.json's 4 experts per layer "
			 "(EP=2), the folder names give EP=1", NULL);
	/* ... the other one: TP rank 0's dense shards and EP rank 0's experts. */
	expect_broken_in("qwen2_moe_tp2_ep2_etp1", "rm -r \"$D/model/mp_rank_00_000\"",
			 CKFS_E_NOTFOUND, "/model': no rank folder holds the dense shards of "
			 "TP rank 0 or the experts of EP rank 0 (experts whole, expert tensor "
			 "parallel size 1: mp_rank_TT..._EEE holds TP rank TT's dense shards "
			 "and EP rank EEE's experts)", NULL);
	/* ... a folder of PP stage 1. */
	expect_broken_in("mixtral_tp2_pp2_ep2_etp1", "rm -r \"$D/model/mp_rank_01_001_001\"",
			 CKFS_E_NOTFOUND, "/model': no rank folder holds the dense shards of "
			 "TP rank 1 or the experts of EP rank 1 of PP stage 1 (experts whole",
			 NULL);
	/* Mixed expert shard shapes: a TP-sharded rank file among whole ones,
	 * and a whole one among TP-sharded ones (the dense shards agree). */
	expect_broken_in("qwen2_moe_tp2_ep2_etp1", "cp " MG "/qwen2_moe_tp2_ep2/model/"
			 "mp_rank_01_001/model.pt \"$D/model/mp_rank_01_001/model.pt\"",
			 CKFS_E_INVALID, "mp_rank_01_001/model.pt': 'decoder.layers.0.mlp.experts."
			 "local_experts.0.linear_fc1.weight' has 32 rows, '",
			 "mp_rank_00_000/model.pt' has 64 (expert shards of different expert "
			 "tensor parallel sizes: mixed checkpoints?)");
	expect_broken_in("qwen2_moe_tp2_ep2", "cp " MG "/qwen2_moe_tp2_ep2_etp1/model/"
			 "mp_rank_01_001/model.pt \"$D/model/mp_rank_01_001/model.pt\"",
			 CKFS_E_INVALID, "mp_rank_01_001/model.pt': 'decoder.layers.0.mlp.experts."
			 "local_experts.0.linear_fc1.weight' has 64 rows, '",
			 "mp_rank_00_000/model.pt' has 32 (expert shards of different");
	/* A folder pairing TP rank 0 with EP rank 1 (never written with whole
	 * experts at TP=2 EP=2): refused as ambiguous, not read. */
	expect_broken_in("qwen2_moe_tp2_ep2_etp1", "cp -r \"$D/model/mp_rank_01_001\" "
			 "\"$D/model/mp_rank_00_001\"", CKFS_E_INVALID,
			 "mp_rank_00_001/model.pt': whole experts (expert tensor parallel size 1 "
			 "by config.json's moe_intermediate_size 32) in the folder of TP rank 0 "
			 "and EP rank 1, which megatron-core never pairs at TP=2 EP=2", NULL);
	/* No expert width in config.json: whole or TP shard cannot be told. */
	expect_broken_in("qwen2_moe_tp2_ep2_etp1", "sed -i 's/\"moe_intermediate_size\"/"
			 "\"moe_width\"/' \"$D/hf_config_and_tokenizer/config.json\"",
			 CKFS_E_UNSUPPORTED, "mp_rank_00_000/model.pt': config.json has no "
			 "moe_intermediate_size, so whether 'decoder.layers.0.mlp.experts."
			 "local_experts.0.linear_fc1.weight' is a whole expert or its TP shard "
			 "cannot be told", NULL);
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
		      CKFS_E_UNSUPPORTED, "1 Megatron keys not understood: "
		      "'decoder.layers.0.self_attention.linear_kv_down_proj.weight' (--raw-names "
		      "serves them under their own names)", NULL);
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
		      "\"$D/hf_config_and_tokenizer/config.json\"", CKFS_E_INVALID,
		      "config.json': num_attention_heads 4 is not a multiple of "
		      "num_key_value_heads 3", NULL);
	/* A size that is not a whole number is not read as one (the shared
	 * config reading, megatron_vocab.c). */
	expect_broken("sed -i 's/\"num_key_value_heads\": 2/\"num_key_value_heads\": 2.5/' "
		      "\"$D/hf_config_and_tokenizer/config.json\"", CKFS_E_FORMAT,
		      "config.json': num_key_value_heads is not a whole number from 0 to 2^31",
		      NULL);
	/* Expert parallelism: one EP rank folder gone (mp_rank_TT_EEE names). */
	expect_broken_in("qwen2_moe_tp2_ep2", "rm -r \"$D/model/mp_rank_01_001\"",
			 CKFS_E_NOTFOUND, "/model/mp_rank_01_001/model.pt': not found (TP rank "
			 "1 of PP stage 0, EP rank 1 is needed: TP=2, PP=1, EP=2)", NULL);
	/* ... a whole EP rank gone: half the experts. */
	expect_broken_in("qwen2_moe_tp2_ep2", "rm -r \"$D/model/mp_rank_00_001\" "
			 "\"$D/model/mp_rank_01_001\"", CKFS_E_NOTFOUND,
			 "/model': no rank folder holds the experts of EP rank 1: each folder "
			 "holds 2 of config.json's 4 experts per layer (EP=2), the folder "
			 "names give EP=1", NULL);
	expect_broken_in("qwen3_moe_pp2_ep2", "rm -r \"$D/model/mp_rank_00_001_001\"",
			 CKFS_E_NOTFOUND, "/model/mp_rank_00_001_001/model.pt': not found (TP "
			 "rank 0 of PP stage 1, EP rank 1 is needed: TP=1, PP=2, EP=2)", NULL);
	/* A dense run's rank file among the MoE ranks. */
	expect_broken_in("qwen2_moe_tp2_ep2", "cp " MG "/broken/qwen2_moe_dense_rank.pt "
			 "\"$D/model/mp_rank_00_001/model.pt\"", CKFS_E_INVALID,
			 "mp_rank_00_001/model.pt': chunk 0 has ", "(mismatched checkpoints?)");
	/* Expert shards neither whole nor TP's shard of config.json's width
	 * (expert tensor parallel size other than 1 and TP). */
	expect_broken_in("qwen2_moe_tp2_ep2", "sed -i 's/\"moe_intermediate_size\": 32/"
			 "\"moe_intermediate_size\": 24/' \"$D/hf_config_and_tokenizer/config.json\"",
			 CKFS_E_UNSUPPORTED, "'decoder.layers.0.mlp.experts.local_experts.0."
			 "linear_fc1.weight' has 32 rows, expected 2 x moe_intermediate_size 24 "
			 "(whole experts, expert tensor parallel size 1) or 2 x 24 / TP 2 "
			 "(experts split over TP): other expert tensor parallel sizes are not "
			 "supported", NULL);
	/* TP shards whose width config.json's half width makes look whole:
	 * the full TP x EP grid is no folder set whole experts are saved in. */
	expect_broken_in("qwen2_moe_tp2_ep2", "sed -i 's/\"moe_intermediate_size\": 32/"
			 "\"moe_intermediate_size\": 16/' \"$D/hf_config_and_tokenizer/config.json\"",
			 CKFS_E_INVALID, "mp_rank_01_000/model.pt': whole experts (expert tensor "
			 "parallel size 1 by config.json's moe_intermediate_size 16) in the "
			 "folder of TP rank 1 and EP rank 0, which megatron-core never pairs at "
			 "TP=2 EP=2: ambiguous (experts split over TP, moe_intermediate_size 32?)",
			 NULL);
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
	struct ckfs_model_options opt = { .as_stored = true, .raw_names = true };
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

/* Config keys as DeepSeek and GLM write them: n_routed_experts counts the
 * experts (the issue-36 misdiagnosis said "names no experts"), and
 * multi-head latent attention (kv_lora_rank) outside DeepSeek's
 * architectures is refused: its Hugging Face names are DeepSeek's
 * (test_megatron_frontier.c reads those). */
static void test_config_keys(void)
{
	const char *dir = test_tmp_dir("megatron", "routed");
	struct ckfs_model_options opt = { .as_stored = true };
	struct ckfs_model *m = NULL;
	struct ckfs_st_set ref;
	struct ckfs_error err;

	CHECK(test_sh("rm -rf '%s' && cp -r " MG "/qwen2_moe_tp2_ep2 '%s' && sed -i "
		      "'s/\"num_experts\"/\"n_routed_experts\"/' '%s/hf_config_and_tokenizer/"
		      "config.json'", dir, dir, dir) == 0);
	ckfs_error_clear(&err);
	CHECK(ckfs_model_open(dir, &opt, &m, &err) == CKFS_OK);
	CHECK(ckfs_st_set_open(MG "/qwen2_moe_tp2_ep2/original", NULL, &ref, &err) == CKFS_OK);
	if (m) {
		CHECK_EQ_INT(m->n_tensors, ref.n_entries);
		test_model_equals(m, &ref, CKFS_DTYPE_BF16, "n_routed_experts");
	}
	ckfs_model_free(m);
	ckfs_st_set_release(&ref);
	expect_broken("sed -i 's/\"vocab_size\"/\"kv_lora_rank\": 512, \"vocab_size\"/' "
		      "\"$D/hf_config_and_tokenizer/config.json\"", CKFS_E_UNSUPPORTED,
		      "multi-head latent attention (kv_lora_rank) of architecture "
		      "'LlamaForCausalLM': ckfs knows DeepSeek's Hugging Face names for it only",
		      NULL);
}

int main(void)
{
	RUN(test_equals_original);
	RUN(test_config_keys);
	RUN(test_broken);
	RUN(test_broken_etp1);
	RUN(test_raw_names);
	test_tmp_cleanup();
	return test_summary();
}
