/* SPDX-License-Identifier: MIT */
/*
 * Megatron-Core dist_checkpointing (torch_dist) folders (src/model/
 * mcore_dist.c) written by megatron-core 0.12.2
 * (tests/gen/make_mcore_dist_fixtures.py):
 *  - every fixture served --dtype auto holds, tensor by tensor and bit for
 *    bit, the original Hugging Face weights (original/model.safetensors),
 *    same names, shapes and dtype: Qwen2 TP=2 (qkv bias, v1 layout), Llama
 *    PP=3 with stages of 1, 2, 1 layers (v1), tied Qwen3 TP=2 PP=2 (q/k
 *    norm, v1), Llama PP=2 VPP=2 in verl's HEAD layout (ckpt_contents.json,
 *    model/dist_ckpt, model/huggingface); MoE with expert parallelism 2:
 *    Qwen3-MoE, Qwen2-MoE TP=2 (shared expert and its gate), Mixtral PP=2
 *    (HEAD layout, block_sparse_moe names);
 *  - the layout is "megatron-dist"; SRC may also be the dist_ckpt folder
 *    itself with --config; ckpt_contents.json decides which folder is
 *    read, and a dist_ckpt wins over HF weights saved beside it;
 *  - broken folders fail with one line naming the file and the cause.
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

#define MD CKFS_FIXTURES "/mcore_dist"

static const struct {
	const char *name;
	const char *sub;    /* SRC below the case folder ("" for the case) */
	const char *config; /* --config, or NULL */
	int world, n_sources, tied;
} cases[] = {
	{ "qwen2_tp2", "", NULL, 2, 4, 0 },
	{ "llama_pp3_uneven", "", NULL, 3, 6, 0 },
	{ "qwen3_tp2_pp2_tied", "", NULL, 4, 8, 1 },
	{ "llama_pp2_vpp2_head", "", NULL, 2, 4, 0 },
	/* MoE, expert parallel 2: expert axis, router, Qwen2-MoE's shared
	 * expert and its gate, Mixtral's block_sparse_moe names */
	{ "qwen3_moe_ep2", "", NULL, 2, 4, 0 },
	{ "qwen2_moe_tp2_ep2", "", NULL, 4, 8, 0 },
	{ "mixtral_pp2_ep2", "", NULL, 4, 8, 0 },
	/* SRC = the dist_ckpt folder, config.json through --config */
	{ "qwen2_tp2", "/dist_ckpt", MD "/qwen2_tp2/huggingface", 2, 4, 0 },
};

static void check_case(size_t i)
{
	char src[1024], orig[1024];
	struct ckfs_model_options opt = { .as_stored = true, .config_path = cases[i].config };
	struct ckfs_model *m = NULL;
	struct ckfs_st_set ref;
	struct ckfs_error err;

	snprintf(src, sizeof(src), MD "/%s%s", cases[i].name, cases[i].sub);
	snprintf(orig, sizeof(orig), MD "/%s/original", cases[i].name);
	ckfs_error_clear(&err);
	CHECK(ckfs_model_open(src, &opt, &m, &err) == CKFS_OK);
	if (!m) {
		fprintf(stderr, "%s: %s\n", src, err.msg);
		return;
	}
	CHECK_EQ_STR(m->layout->name, "megatron-dist");
	CHECK_EQ_INT(m->world_size, cases[i].world);
	CHECK_EQ_INT(m->n_sources, cases[i].n_sources);
	CHECK_EQ_INT(m->tie_word_embeddings, cases[i].tied);
	ckfs_error_clear(&err);
	CHECK(ckfs_st_set_open(orig, NULL, &ref, &err) == CKFS_OK);
	CHECK_EQ_INT(m->n_tensors, ref.n_entries);
	test_model_equals(m, &ref, CKFS_DTYPE_BF16, src);
	int skipped = 0;
	for (size_t k = 0; k < m->n_warnings; k++)
		skipped |= strstr(m->warnings[k], "non-tensor entries (ShardedObjects") != NULL;
	CHECK(skipped); /* every layer's _extra_state; rng_state in v1 */
	for (size_t k = 0; cases[i].tied && k < m->n_tensors; k++)
		CHECK(strcmp(m->tensors[k].name, "lm_head.weight") != 0);
	/* The folder serves it with config.json. */
	struct ckfs_folder_options fopt = { 0 };
	struct ckfs_folder *f = NULL;
	ckfs_error_clear(&err);
	CHECK(ckfs_folder_build(m, &fopt, &f, &err) == CKFS_OK);
	int has_cfg = 0;
	for (size_t k = 0; f && k < f->n_nodes; k++)
		has_cfg |= strcmp(f->nodes[k].name, "config.json") == 0;
	CHECK(has_cfg);
	ckfs_folder_free(f);
	ckfs_st_set_release(&ref);
	ckfs_model_free(m);
}

static void test_equals_original(void)
{
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		check_case(i);
}

/* $D = a copy of case after setup (a shell command); opened as $D/sub. */
static void expect_broken_in(const char *cas, const char *sub, const char *setup,
			     enum ckfs_code code, const char *needle1, const char *needle2)
{
	const char *dir = test_tmp_dir("mcore-dist", "broken");
	char src[1024];
	struct ckfs_model_options opt = { .as_stored = true };
	struct ckfs_model *m = NULL;
	struct ckfs_error err;

	CHECK(test_sh("rm -rf '%s' && cp -r " MD "/%s '%s'", dir, cas, dir) == 0);
	CHECK(test_sh("D='%s'; %s", dir, setup) == 0);
	snprintf(src, sizeof(src), "%s%s", dir, sub);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_model_open(src, &opt, &m, &err), code);
	CHECK(m == NULL);
	ckfs_model_free(m);
	fprintf(stderr, "  (expected) %s\n", err.msg);
	CHECK(strstr(err.msg, needle1) != NULL);
	CHECK(!needle2 || strstr(err.msg, needle2) != NULL);
	CHECK(strchr(err.msg, '\n') == NULL);
}

#define CFG "\"$D/huggingface/config.json\""

static void test_broken(void)
{
	expect_broken_in("qwen2_tp2", "", "rm \"$D/dist_ckpt/__1_0.distcp\"", CKFS_E_NOTFOUND,
			 "/dist_ckpt/__1_0.distcp': not found (named by .metadata)", NULL);
	expect_broken_in("qwen2_tp2", "",
			 "sed -i 's/\"num_hidden_layers\": 4/\"num_hidden_layers\": 3/' " CFG,
			 CKFS_E_INVALID, "/dist_ckpt/.metadata': 'decoder.layers.self_attention."
			 "linear_qkv.layer_norm_weight' has shape [4, 64]: a layer axis of 4, "
			 "config.json '", "huggingface/config.json' says num_hidden_layers 3");
	expect_broken_in("qwen2_tp2", "",
			 "sed -i 's/\"num_key_value_heads\": 2/\"num_key_value_heads\": 3/' " CFG,
			 CKFS_E_INVALID, "huggingface/config.json': num_attention_heads 4 is not a "
			 "multiple of num_key_value_heads 3", NULL);
	/* Heads that divide but do not match the fused QKV rows. */
	expect_broken_in("qwen2_tp2", "",
			 "sed -i 's/\"num_key_value_heads\": 2/\"num_key_value_heads\": 4/' " CFG,
			 CKFS_E_INVALID, "/dist_ckpt/.metadata': 'decoder.layers.self_attention."
			 "linear_qkv.weight' has shape [4, 128, 64], expected [layers, ...] with "
			 "[192, hidden_size] (4 query groups of 1 q heads + k + v, head_dim 16)",
			 NULL);
	expect_broken_in("qwen2_tp2", "",
			 "sed -i 's/torch_dist/zarr/' \"$D/dist_ckpt/metadata.json\"",
			 CKFS_E_UNSUPPORTED, "/dist_ckpt/metadata.json': sharded_backend 'zarr' is "
			 "not supported (only torch_dist)", NULL);
	expect_broken_in("qwen2_tp2", "", "rm \"$D/dist_ckpt/metadata.json\"", CKFS_E_NOTFOUND,
			 "/dist_ckpt/metadata.json': not found (not a Megatron "
			 "dist_checkpointing folder, or an unfinished save)", NULL);
	/* Tied checkpoint (no output_layer) with an untied config. */
	expect_broken_in("qwen3_tp2_pp2_tied", "",
			 "sed -i 's/\"tie_word_embeddings\": true/\"tie_word_embeddings\": false/' "
			 CFG, CKFS_E_INVALID, "/dist_ckpt/.metadata': no output_layer.weight, but '",
			 "does not tie the embeddings");
	/* A vocabulary that is not config.json's (padded, or a value head). */
	expect_broken_in("llama_pp3_uneven", "",
			 "sed -i 's/\"vocab_size\": 98/\"vocab_size\": 100/' " CFG, CKFS_E_INVALID,
			 "'embedding.word_embeddings.weight' has shape [98, 64], expected "
			 "[vocab_size 100, hidden_size 64]", NULL);
	/* HEAD: the manifest decides. */
	expect_broken_in("llama_pp2_vpp2_head", "",
			 "sed -i 's#\"path\": \"model/dist_ckpt\"#\"path\": \"../x\"#' "
			 "\"$D/ckpt_contents.json\"", CKFS_E_INVALID,
			 "/ckpt_contents.json': contents.model.path '../x' is not a relative path "
			 "inside the checkpoint", NULL);
	expect_broken_in("llama_pp2_vpp2_head", "",
			 "sed -i 's#megatron_dist_checkpoint#huggingface#' \"$D/ckpt_contents.json\"",
			 CKFS_E_NOTFOUND, "not a verl FSDP checkpoint", NULL);
	/* MoE: experts that are not config.json's. */
	expect_broken_in("qwen3_moe_ep2", "",
			 "sed -i 's/\"num_local_experts\": 4/\"num_local_experts\": 8/' " CFG, CKFS_E_INVALID,
			 "/dist_ckpt/.metadata': 'decoder.layers.mlp.router.weight' has shape "
			 "[4, 4, 64], expected [layers, ...] with [num_experts 8, hidden_size 64]", NULL);
	/* Keys of an architecture not in the table: listed. */
	expect_broken_in("qwen2_moe_tp2_ep2", "",
			 "sed -i 's/Qwen2MoeForCausalLM/Qwen3MoeForCausalLM/' " CFG,
			 CKFS_E_UNSUPPORTED, "/dist_ckpt/.metadata': 3 Megatron keys not "
			 "understood: 'decoder.layers.mlp.shared_experts.linear_fc1.weight', "
			 "'decoder.layers.mlp.shared_experts.linear_fc2.weight', "
			 "'decoder.layers.mlp.shared_experts.gate_weight'", NULL);
	/* verl's manifest, unreadable or saying two things: refused, not
	 * guessed around by folder names. */
	expect_broken_in("llama_pp2_vpp2_head", "", "echo garbage > \"$D/ckpt_contents.json\"",
			 CKFS_E_FORMAT, "/ckpt_contents.json': invalid JSON at line 1, column 1",
			 NULL);
	expect_broken_in("llama_pp2_vpp2_head", "",
			 "printf '{\"contents\": {}, \"contents\": {}}' > \"$D/ckpt_contents.json\"",
			 CKFS_E_FORMAT, "/ckpt_contents.json': key 'contents' appears twice in one "
			 "object", NULL);
	/* Read whole, as Python's json reads them: a NUL and what follows it,
	 * or a second value, is refused with its offset. */
	expect_broken_in("llama_pp2_vpp2_head", "",
			 "printf '\\000{}' >> \"$D/ckpt_contents.json\"", CKFS_E_FORMAT,
			 "/ckpt_contents.json': NUL byte at offset ", NULL);
	expect_broken_in("qwen2_tp2", "",
			 "printf '{\"sharded_backend\": \"zarr\"}' >> \"$D/dist_ckpt/metadata.json\"",
			 CKFS_E_FORMAT, "/dist_ckpt/metadata.json': data after the JSON value at "
			 "offset ", NULL);
	/* Sizes that are not whole numbers, or out of range. */
	expect_broken_in("qwen2_tp2", "", "sed -i 's/\"hidden_size\": 64/\"hidden_size\": 64.5/' " CFG,
			 CKFS_E_FORMAT, "config.json': hidden_size is not a whole number from 0 "
			 "to 2^31", NULL);
	expect_broken_in("qwen2_tp2", "", "sed -i 's/\"num_hidden_layers\": 4/\"num_hidden_layers\": "
			 "-4/' " CFG, CKFS_E_FORMAT, "config.json': num_hidden_layers is not a "
			 "whole number from 0 to 2^31", NULL);
	/* SRC = dist_ckpt without --config. */
	expect_broken_in("qwen2_tp2", "/dist_ckpt", "true", CKFS_E_NOTFOUND,
			 "/dist_ckpt/huggingface/config.json': not found; pass --config", NULL);
}

/* $D = a copy of case after setup opens as layout with n tensors. */
static void expect_layout(const char *cas, const char *setup, const char *layout, size_t n)
{
	const char *dir = test_tmp_dir("mcore-dist", "variant");
	struct ckfs_model_options opt = { .as_stored = true };
	struct ckfs_model *m = NULL;
	struct ckfs_error err;

	CHECK(test_sh("rm -rf '%s' && cp -r " MD "/%s '%s'", dir, cas, dir) == 0);
	CHECK(test_sh("D='%s'; %s", dir, setup) == 0);
	ckfs_error_clear(&err);
	CHECK(ckfs_model_open(dir, &opt, &m, &err) == CKFS_OK);
	if (!m) {
		fprintf(stderr, "%s: %s\n", dir, err.msg);
		return;
	}
	CHECK_EQ_STR(m->layout->name, layout);
	CHECK_EQ_INT(m->n_tensors, n);
	ckfs_model_free(m);
}

static void test_which_folder(void)
{
	/* HEAD, mbridge: the manifest names HF weights; model/dist_ckpt (here
	 * standing for PEFT adapter shards) is not read. */
	expect_layout("llama_pp2_vpp2_head",
		      "sed -i 's#\"format\": \"megatron_dist_checkpoint\"#\"format\": "
		      "\"huggingface\"#' \"$D/ckpt_contents.json\" && cp \"$D/original/"
		      "model.safetensors\" \"$D/model/huggingface/\"", "hf", 39);
	/* No manifest, HF weights beside the dist_ckpt: the dist_ckpt wins. */
	expect_layout("llama_pp2_vpp2_head", "rm \"$D/ckpt_contents.json\" && cp \"$D/original/"
		      "model.safetensors\" \"$D/model/huggingface/\"", "megatron-dist", 39);
	/* v1 with hf_model saved too: the dist_ckpt wins. */
	expect_layout("qwen2_tp2", "cp \"$D/original/model.safetensors\" \"$D/huggingface/\"",
		      "megatron-dist", 51);
}

/* --raw-names: keys the table does not map are served as stored. Here the
 * Qwen2-MoE fixture is declared Qwen3-MoE, which has no shared expert: its
 * three shared-expert keys come out whole, a layer axis first, and each
 * layer's rows equal the original model's shared-expert weights. */
static void test_raw_names(void)
{
	static const struct {
		const char *key, *hf[2]; /* rows [0, n) then [n, 2n), or one tensor */
	} want[] = {
		{ "decoder.layers.mlp.shared_experts.linear_fc1.weight",
		  { "mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight" } },
		{ "decoder.layers.mlp.shared_experts.linear_fc2.weight",
		  { "mlp.shared_expert.down_proj.weight", NULL } },
		{ "decoder.layers.mlp.shared_experts.gate_weight",
		  { "mlp.shared_expert_gate.weight", NULL } },
	};
	const char *dir = test_tmp_dir("mcore-dist", "raw");
	struct ckfs_model_options opt = { .as_stored = true, .raw_names = true };
	struct ckfs_model *m = NULL;
	struct ckfs_st_set ref;
	struct ckfs_read_scratch s = { 0 };
	struct ckfs_error err;

	CHECK(test_sh("rm -rf '%s' && cp -r " MD "/qwen2_moe_tp2_ep2 '%s' && sed -i "
		      "'s/Qwen2MoeForCausalLM/Qwen3MoeForCausalLM/' '%s/huggingface/config.json'",
		      dir, dir, dir) == 0);
	ckfs_error_clear(&err);
	CHECK(ckfs_model_open(dir, &opt, &m, &err) == CKFS_OK);
	if (!m) {
		fprintf(stderr, "%s: %s\n", dir, err.msg);
		return;
	}
	int warned = 0;
	for (size_t k = 0; k < m->n_warnings; k++)
		warned |= strstr(m->warnings[k], "3 Megatron keys without a Hugging Face name "
				 "served as stored (--raw-names)") != NULL;
	CHECK(warned);
	ckfs_error_clear(&err);
	CHECK(ckfs_st_set_open(MD "/qwen2_moe_tp2_ep2/original", NULL, &ref, &err) == CKFS_OK);
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		const struct ckfs_tensor *t = NULL;
		for (size_t k = 0; k < m->n_tensors; k++)
			if (strcmp(m->tensors[k].name, want[i].key) == 0)
				t = &m->tensors[k];
		CHECK(t != NULL);
		if (!t)
			continue;
		CHECK_EQ_INT(t->ndim, 3);
		CHECK_EQ_INT(t->shape[0], 4); /* num_hidden_layers */
		size_t bytes = (size_t)ckfs_tensor_out_bytes(t), layer = bytes / 4;
		unsigned char *a = malloc(bytes), *b = malloc(layer);
		CHECK(ckfs_tensor_read(m, t, 0, t->numel, a, &s, &err) == CKFS_OK);
		for (int l = 0; l < 4; l++) {
			size_t at = 0;
			for (int h = 0; h < 2 && want[i].hf[h]; h++) {
				char name[128];
				snprintf(name, sizeof(name), "model.layers.%d.%s", l, want[i].hf[h]);
				const struct ckfs_st_entry *e = ckfs_st_set_find(&ref, name);
				CHECK(e != NULL);
				if (!e)
					continue;
				size_t n = (size_t)(e->end - e->begin);
				CHECK(at + n <= layer);
				CHECK(ckfs_file_pread(e->f, b, n, e->begin) == (ssize_t)n);
				if (memcmp(a + (size_t)l * layer + at, b, n) != 0) {
					fprintf(stderr, "%s: layer %d differs from %s\n", want[i].key, l,
						name);
					CHECK(0);
				}
				at += n;
			}
			CHECK_EQ_INT(at, layer);
		}
		free(a);
		free(b);
	}
	ckfs_st_set_release(&ref);
	ckfs_read_scratch_release(&s);
	ckfs_model_free(m);
}

int main(void)
{
	RUN(test_equals_original);
	RUN(test_which_folder);
	RUN(test_broken);
	RUN(test_raw_names);
	test_tmp_cleanup();
	return test_summary();
}
