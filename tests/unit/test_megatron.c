/* SPDX-License-Identifier: MIT */
/*
 * Legacy Megatron per-rank checkpoints (src/model/megatron.c) on folders
 * written by megatron-core 0.12.2 (tests/gen/make_megatron_fixtures.py):
 *  - every fixture served --dtype auto holds, tensor by tensor and bit for
 *    bit, the original Hugging Face weights (original/model.safetensors),
 *    with the same names, shapes and dtype (bf16 stays bf16): Llama TP=2,
 *    Qwen2 TP=2 PP=2 (qkv bias), Qwen3 PP=3 with stages of 1, 2, 1 layers
 *    (q/k norm), tied Llama PP=2 VPP=2, and Llama TP=2 with Transformer
 *    Engine names (fused layer_norm_weight, BytesIO/tensor _extra_state);
 *  - the layout is "megatron" with its TP/PP/VPP sizes and layers per chunk;
 *  - broken folders fail with one line: a missing TP rank, a rank file
 *    from a different TP size, an unknown key, a dict instead of a list.
 */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/folder.h"
#include "ckfs/model.h"
#include "ckfs/st.h"
#include "test.h"

#define MG CKFS_FIXTURES "/megatron"

static char tmp_root[256];

static const char *tmp_dir(const char *name)
{
	static char buf[512];

	if (!tmp_root[0]) {
		snprintf(tmp_root, sizeof(tmp_root), "/tmp/ckfs-test-megatron-%d", (int)getpid());
		mkdir(tmp_root, 0755);
	}
	snprintf(buf, sizeof(buf), "%s/%s", tmp_root, name);
	return buf;
}

static const struct {
	const char *name, *original; /* the case whose original/ holds its weights */
	int tp, pp, vpp;
	int stage_layers[4];
	int tied;
} cases[] = {
	{ "llama_tp2", "llama_tp2", 2, 1, 1, { 4 }, 0 },
	{ "llama_tp2_te", "llama_tp2", 2, 1, 1, { 4 }, 0 },
	{ "qwen2_tp2_pp2", "qwen2_tp2_pp2", 2, 2, 1, { 2, 2 }, 0 },
	{ "qwen3_pp3_uneven", "qwen3_pp3_uneven", 1, 3, 1, { 1, 2, 1 }, 0 },
	{ "llama_tied_pp2_vpp2", "llama_tied_pp2_vpp2", 1, 2, 2, { 1, 1, 1, 1 }, 1 },
};

static void test_equals_original(void)
{
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char src[1024], orig[1024];
		struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_INVALID };
		struct ckfs_model *m = NULL;
		struct ckfs_st_set ref;
		struct ckfs_read_scratch s = { 0 };
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
		CHECK_EQ_INT(m->world_size, cases[i].tp * cases[i].pp);
		for (int k = 0; k < cases[i].pp * cases[i].vpp; k++)
			CHECK_EQ_INT(m->stage_layers[k], cases[i].stage_layers[k]);
		CHECK_EQ_INT(m->tie_word_embeddings, cases[i].tied);
		ckfs_error_clear(&err);
		CHECK(ckfs_st_set_open(orig, &ref, &err) == CKFS_OK);
		CHECK_EQ_INT(m->n_tensors, ref.n_entries);
		for (size_t k = 0; k < m->n_tensors; k++) {
			const struct ckfs_tensor *t = &m->tensors[k];
			const struct ckfs_st_entry *e = ckfs_st_set_find(&ref, t->name);
			if (!e) {
				fprintf(stderr, "%s: %s not in the original\n", cases[i].name,
					t->name);
				CHECK(0);
				continue;
			}
			CHECK_EQ_INT(t->stored_dtype, CKFS_DTYPE_BF16);
			CHECK_EQ_INT(t->out_dtype, e->dtype);
			CHECK_EQ_INT(t->ndim, e->ndim);
			CHECK(memcmp(t->shape, e->shape, sizeof(int64_t) * (size_t)t->ndim) == 0);
			size_t bytes = (size_t)ckfs_tensor_out_bytes(t);
			CHECK_EQ_INT(bytes, e->end - e->begin);
			unsigned char *a = malloc(bytes + 1), *b = malloc(bytes + 1);
			ckfs_error_clear(&err);
			CHECK(ckfs_tensor_read(m, t, 0, t->numel, a, &s, &err) == CKFS_OK);
			CHECK(pread(e->fd, b, bytes, (off_t)e->begin) == (ssize_t)bytes);
			if (memcmp(a, b, bytes) != 0) {
				fprintf(stderr, "%s: %s differs from the original\n",
					cases[i].name, t->name);
				CHECK(0);
			}
			free(a);
			free(b);
		}
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
		for (size_t k = 0; f && k < f->n_nodes; k++)
			has_cfg |= strcmp(f->nodes[k].name, "config.json") == 0;
		CHECK(has_cfg);
		ckfs_folder_free(f);
		ckfs_st_set_release(&ref);
		ckfs_read_scratch_release(&s);
		ckfs_model_free(m);
	}
}

/* dir ($D) = a copy of case after setup (a shell command). */
static void expect_broken_in(const char *cas, const char *setup, enum ckfs_code code, const char *needle1,
			  const char *needle2)
{
	const char *dir = tmp_dir("broken");
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
		      CKFS_E_UNSUPPORTED, "1 Megatron keys not understood",
		      "'decoder.layers.0.mlp.router.weight'");
	expect_broken("cp " MG "/broken/dict_rank0.pt \"$D/model/mp_rank_00/model.pt\"",
		      CKFS_E_FORMAT, "mp_rank_00/model.pt': data.pkl holds a dict, not a "
		      "list of state dicts", NULL);
	expect_broken("mkdir \"$D/model/mp_rank_00_001_002\"", CKFS_E_UNSUPPORTED,
		      "expert-parallel", NULL);
	expect_broken("mkdir \"$D/model/mp_rank_00_001\"", CKFS_E_INVALID,
		      "both mp_rank_TT and mp_rank_TT_PPP", NULL);
}

int main(void)
{
	RUN(test_equals_original);
	RUN(test_broken);
	test_sh("rm -rf '%s'", tmp_root);
	return test_summary();
}
