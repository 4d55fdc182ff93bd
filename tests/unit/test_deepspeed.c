/* SPDX-License-Identifier: MIT */
/*
 * DeepSpeed ZeRO checkpoints (src/layouts/deepspeed.c, flat.c) written by
 * real DeepSpeed 0.19.8 (tests/gen/make_deepspeed_fixtures.py):
 *  - flat stretches cut into blocks: every range of every element of
 *    tensors of 0 to 4 dims is covered once, at the right file position,
 *    by at most 2·ndim − 1 blocks, across segment boundaries too;
 *  - every fixture (ZeRO-1, 2, 3 at world sizes 2 to 4, fp32 and bf16
 *    training, tied embeddings, frozen parameters, round-robin gradients,
 *    ZeRO-3 sub-groups, BF16_Optimizer, the HF Trainer's checkpoint-N/)
 *    served --dtype fp32 equals, tensor by tensor and bit for bit,
 *    DeepSpeed's own zero_to_fp32 (oracle/zero_to_fp32.safetensors: same
 *    names, tied alias dropped as config.json ties) and the fp32 masters
 *    gathered in the training processes (oracle/live_fp32.safetensors),
 *    which is the oracle where zero_to_fp32 refuses (BF16_Optimizer); the
 *    ZeRO-1 frozen parameters zero_to_fp32 leaves out are left out, with a
 *    warning;
 *  - the default bf16 output equals the bf16 module weights DeepSpeed
 *    itself kept in the Trainer's ZeRO-2 checkpoint (its model.safetensors);
 *  - SRC may be the step folder, the folder holding `latest`, or the
 *    Trainer's checkpoint-N/ (config.json and tokenizer served from it);
 *    `latest` is read as zero_to_fp32 reads it, and refused when it names
 *    no step folder.
 * The broken checkpoints are in the corpus (tests/unit/test_corpus.c).
 */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/folder.h"
#include "ckfs/layouts.h"
#include "ckfs/model.h"
#include "ckfs/safetensors.h"
#include "layouts/layouts.h"
#include "test.h"
#include "model_check.h"

#define DS CKFS_FIXTURES "/deepspeed"

#define AS_STORED CKFS_DTYPE_INVALID /* the helper's --dtype auto */

static const struct {
	const char *name;
	int ws, stage;        /* stage 0: BF16_Optimizer */
	int trainer;          /* checkpoint-N/ with config.json */
	int z2f;              /* oracle/zero_to_fp32.safetensors exists */
	size_t left_out;      /* module entries zero_to_fp32 leaves out */
} cases[] = {
	{ "z1_w2_fp32", 2, 1, 0, 1, 0 },
	{ "z1_w3_frozen_fp32", 3, 1, 0, 1, 10 },
	{ "z2_w3_tied_fp32", 3, 2, 0, 1, 0 },
	{ "z2_w4_frozen_fp32", 4, 2, 0, 1, 0 },
	{ "z2_w3_rr_fp32", 3, 2, 0, 1, 0 },
	{ "z3_w2_fp32", 2, 3, 0, 1, 0 },
	{ "z3_w3_tied_fp32", 3, 3, 0, 1, 0 },
	{ "z3_w3_frozen_subgroups_fp32", 3, 3, 0, 1, 0 },
	{ "z1_w2_bf16", 2, 1, 0, 1, 0 },
	{ "z2_w3_tied_bf16", 3, 2, 0, 1, 0 },
	{ "z3_w4_bf16", 4, 3, 0, 1, 0 },
	{ "bf16opt_w2", 2, 0, 0, 0, 0 },
	{ "bf16opt_w3_tied", 3, 0, 0, 0, 0 },
	{ "trainer_z2_w2_bf16", 2, 2, 1, 1, 0 },
	{ "trainer_z3_w3_bf16_tied", 3, 3, 1, 1, 0 },
};
#define N_CASES (sizeof(cases) / sizeof(cases[0]))

/* ---- flat.c ---- */

/* The blocks of [first, first + count) of a tensor of shape (ndim, shape)
 * held from file position 1000 (fp32): each element of the range exactly
 * once, at 1000 + 4·(index − first), nothing outside it. */
static void check_range(int ndim, const int64_t *shape, uint64_t numel, uint64_t first,
			uint64_t count)
{
	struct ckfs_flat_seg seg = { .source = 3, .rank = 2, .dtype = CKFS_DTYPE_F32,
				     .pos = 1000, .len = count };
	struct ckfs_chunk_list out = { 0 };
	struct ckfs_error err;
	unsigned char *seen = calloc(numel + 1, 1);
	int ok = 1;

	ckfs_error_clear(&err);
	struct ckfs_elem_range el = { .ndim = ndim, .shape = shape, .first = first, .count = count };
	CHECK(ckfs_flat_blocks(&el, &seg, 1000, &out, &err) == CKFS_OK);
	ok &= out.n <= (size_t)(ndim ? 2 * ndim - 1 : 1);
	for (size_t i = 0; i < out.n; i++) {
		const struct ckfs_chunk_spec *c = &out.v[i];
		uint64_t n = 1;
		ok &= c->source == 3 && c->rank == 2 && c->dtype == CKFS_DTYPE_F32;
		for (int k = 0; k < ndim; k++)
			n *= (uint64_t)c->shape[k];
		for (uint64_t e = 0; e < n; e++) { /* every element of the block */
			uint64_t rest = e, global = 0, src = 0;
			for (int k = ndim - 1; k >= 0; k--) {
				uint64_t idx = rest % (uint64_t)c->shape[k];
				rest /= (uint64_t)c->shape[k];
				uint64_t g = (uint64_t)c->offset[k] + idx, inner = 1;
				for (int j = k + 1; j < ndim; j++)
					inner *= (uint64_t)shape[j];
				global += g * inner;
				src += idx * (uint64_t)c->stride[k];
			}
			ok &= global >= first && global < first + count && !seen[global];
			ok &= c->pos + 4 * src == 1000 + 4 * (global - first);
			if (global < numel)
				seen[global] = 1;
		}
	}
	for (uint64_t g = first; g < first + count; g++)
		ok &= seen[g];
	if (!ok)
		fprintf(stderr, "ndim %d, range [%llu, +%llu): wrong blocks\n", ndim,
			(unsigned long long)first, (unsigned long long)count);
	CHECK(ok);
	free(out.v);
	free(seen);
}

static void test_flat_blocks(void)
{
	static const int64_t shapes[][4] = { { 0 }, { 7 }, { 3, 4 }, { 3, 4, 5 }, { 2, 1, 3, 2 },
					     { 1, 6 } };
	static const int ndims[] = { 0, 1, 2, 3, 4, 2 };

	for (size_t s = 0; s < sizeof(ndims) / sizeof(ndims[0]); s++) {
		uint64_t numel = 1;
		for (int k = 0; k < ndims[s]; k++)
			numel *= (uint64_t)shapes[s][k];
		for (uint64_t a = 0; a < numel; a++)
			for (uint64_t b = a + 1; b <= numel; b++)
				check_range(ndims[s], shapes[s], numel, a, b - a);
	}
}

/* A stretch across segments of 5, 0, 7 and 3 elements: each segment's
 * part from that segment's own file position. */
static void test_flat_cut(void)
{
	const struct ckfs_flat_seg segs[] = {
		{ .source = 0, .dtype = CKFS_DTYPE_F32, .pos = 100, .len = 5 },
		{ .source = 1, .dtype = CKFS_DTYPE_F32, .pos = 200, .len = 0 },
		{ .source = 2, .dtype = CKFS_DTYPE_F32, .pos = 300, .len = 7 },
		{ .source = 3, .dtype = CKFS_DTYPE_F32, .pos = 400, .len = 3 },
	};
	const int64_t shape[2] = { 3, 4 };
	struct ckfs_chunk_list out = { 0 };
	struct ckfs_error err;

	/* buffer elements [3, 15) are tensor elements [0, 12) */
	ckfs_error_clear(&err);
	const struct ckfs_elem_range el = { .ndim = 2, .shape = shape, .first = 0, .count = 12 };
	CHECK(ckfs_flat_cut(segs, 4, 3, &el, &out, &err) == CKFS_OK);
	/* [0, 2) from source 0 at 112; [2, 9) from source 2 at 300: row 0's
	 * tail, row 1, row 2's first element; [9, 12) from source 3 */
	CHECK_EQ_INT(out.n, 5);
	if (out.n == 5) {
		CHECK(out.v[0].source == 0 && out.v[0].pos == 112 && out.v[0].shape[1] == 2);
		CHECK(out.v[1].source == 2 && out.v[1].pos == 300 && out.v[1].offset[1] == 2 &&
		      out.v[1].shape[1] == 2);
		CHECK(out.v[2].source == 2 && out.v[2].pos == 308 && out.v[2].offset[0] == 1 &&
		      out.v[2].shape[1] == 4);
		CHECK(out.v[3].source == 2 && out.v[3].pos == 324 && out.v[3].offset[0] == 2 &&
		      out.v[3].shape[1] == 1);
		CHECK(out.v[4].source == 3 && out.v[4].pos == 400 && out.v[4].offset[1] == 1 &&
		      out.v[4].shape[1] == 3);
	}
	free(out.v);
	/* past the buffer's end: refused, not read */
	out = (struct ckfs_chunk_list){ 0 };
	ckfs_error_clear(&err);
	const struct ckfs_elem_range past = { .ndim = 2, .shape = shape, .first = 0, .count = 6 };
	CHECK(ckfs_flat_cut(segs, 4, 10, &past, &out, &err) == CKFS_E_FORMAT);
	free(out.v);
}

/* ---- the fixtures against their oracles ---- */

/* ref = oracle/<file> of case, opened through a folder of its own. */
static int open_oracle(const char *cas, const char *file, struct ckfs_st_set *ref)
{
	char name[256];
	struct ckfs_error err;

	snprintf(name, sizeof(name), "%s-%s", cas, file);
	const char *dir = test_tmp_dir("deepspeed", name);
	if (test_sh("mkdir -p '%s' && ln -sf '" DS "/%s/oracle/%s' '%s/model.safetensors'", dir,
		    cas, file, dir) != 0)
		return -1;
	ckfs_error_clear(&err);
	if (ckfs_st_set_open(dir, NULL, ref, &err) != CKFS_OK) {
		fprintf(stderr, "%s: %s\n", dir, err.msg);
		return -1;
	}
	return 0;
}

static struct ckfs_model *open_case(const char *src, const char *config, enum ckfs_dtype dtype)
{
	/* dtype CKFS_DTYPE_INVALID: --dtype auto */
	struct ckfs_model_options opt = { .out_dtype = dtype,
					  .as_stored = dtype == CKFS_DTYPE_INVALID,
					  .config_path = config };
	struct ckfs_model *m = NULL;
	struct ckfs_error err;

	ckfs_error_clear(&err);
	if (ckfs_model_open(src, &opt, &m, &err) != CKFS_OK)
		fprintf(stderr, "%s: %s\n", src, err.msg);
	return m;
}

static void check_case(size_t i)
{
	char src[512], cfg[512];
	struct ckfs_st_set z2f, live;
	struct ckfs_model *m;

	snprintf(src, sizeof(src), DS "/%s", cases[i].name);
	snprintf(cfg, sizeof(cfg), DS "/%s/oracle/config.json", cases[i].name);
	m = open_case(src, cases[i].trainer ? NULL : cfg, CKFS_DTYPE_F32);
	CHECK(m != NULL);
	if (!m)
		return;
	CHECK_EQ_STR(m->layout->name, "deepspeed");
	CHECK_EQ_INT(m->world_size, cases[i].ws);
	char tag[64];
	CHECK_EQ_INT(test_fact(m, "deepspeed", "zero_stage", NULL, 0), cases[i].stage);
	test_fact(m, "deepspeed", "tag", tag, sizeof(tag));
	CHECK_EQ_STR(tag, "global_step2");
	CHECK_EQ_INT(m->n_ranks_read, cases[i].ws);
	/* every optimizer file, and the model states (ZeRO-3: one per rank) */
	CHECK_EQ_INT(m->n_sources, cases[i].ws + (cases[i].stage == 3 ? cases[i].ws : 1));
	if (cases[i].z2f && open_oracle(cases[i].name, "zero_to_fp32.safetensors", &z2f) == 0) {
		CHECK_EQ_INT(m->n_tensors, z2f.n_entries);
		test_model_equals(m, &z2f, CKFS_DTYPE_F32, cases[i].name);
		ckfs_st_set_release(&z2f);
	}
	if (open_oracle(cases[i].name, "live_fp32.safetensors", &live) == 0) {
		CHECK_EQ_INT(m->n_tensors + cases[i].left_out, live.n_entries);
		test_model_equals(m, &live, CKFS_DTYPE_F32, cases[i].name);
		ckfs_st_set_release(&live);
	}
	int warned = 0;
	for (size_t k = 0; k < m->n_warnings; k++)
		warned |= strstr(m->warnings[k], "left out, as zero_to_fp32 leaves them out") != NULL;
	CHECK_EQ_INT(warned, cases[i].left_out > 0);
	ckfs_model_free(m);
}

static void test_oracles(void)
{
	for (size_t i = 0; i < N_CASES; i++)
		check_case(i);
}

/* The HF Trainer's ZeRO-2 model.safetensors is DeepSpeed's bf16 module:
 * the fp32 masters rounded to nearest even, which is what ckfs serves by
 * default. Its config.json and tokenizer are served beside the weights. */
static void test_trainer_bf16(void)
{
	struct ckfs_model *m = open_case(DS "/trainer_z2_w2_bf16", NULL, CKFS_DTYPE_BF16);
	struct ckfs_folder_options fopt = { 0 };
	struct ckfs_folder *f = NULL;
	struct ckfs_st_set module;
	struct ckfs_error err;

	CHECK(m != NULL);
	if (!m)
		return;
	ckfs_error_clear(&err);
	CHECK(ckfs_st_set_open(DS "/trainer_z2_w2_bf16", NULL, &module, &err) == CKFS_OK);
	CHECK_EQ_INT(m->n_tensors, module.n_entries);
	test_model_equals(m, &module, CKFS_DTYPE_F32, "trainer_z2_w2_bf16");
	ckfs_st_set_release(&module);
	CHECK(ckfs_folder_build(m, &fopt, &f, &err) == CKFS_OK);
	int seen = 0;
	for (size_t k = 0; f && k < f->n_nodes; k++)
		seen += strcmp(f->nodes[k].name, "tokenizer.json") == 0 ||
			strcmp(f->nodes[k].name, "generation_config.json") == 0 ||
			strcmp(f->nodes[k].name, "config.json") == 0;
	CHECK_EQ_INT(seen, 3);
	ckfs_folder_free(f);
	ckfs_model_free(m);
}

/* --dtype auto: the masters as stored (fp32), like zero_to_fp32's dict. */
static void test_auto(void)
{
	struct ckfs_model *m = open_case(DS "/z2_w3_tied_bf16",
					 DS "/z2_w3_tied_bf16/oracle/"
					    "config.json",
					 AS_STORED);
	struct ckfs_st_set z2f;

	CHECK(m != NULL);
	if (!m || open_oracle("z2_w3_tied_bf16", "zero_to_fp32.safetensors", &z2f) != 0) {
		ckfs_model_free(m);
		return;
	}
	test_model_equals(m, &z2f, CKFS_DTYPE_F32, "z2_w3_tied_bf16 auto");
	ckfs_st_set_release(&z2f);
	ckfs_model_free(m);
}

/* ---- which folder is served ---- */

/* SRC the step folder itself: the same tensors, no tag. */
static void test_step_folder(void)
{
	struct ckfs_model *m = open_case(DS "/z3_w3_tied_fp32/global_step2", DS "/z3_w3_tied_fp32/"
					 "oracle/config.json", CKFS_DTYPE_F32);
	struct ckfs_st_set z2f;

	CHECK(m != NULL);
	if (!m)
		return;
	char tag[64];
	test_fact(m, "deepspeed", "tag", tag, sizeof(tag));
	CHECK_EQ_STR(tag, ""); /* null: SRC is the step folder */
	if (open_oracle("z3_w3_tied_fp32", "zero_to_fp32.safetensors", &z2f) == 0) {
		CHECK_EQ_INT(m->n_tensors, z2f.n_entries);
		test_model_equals(m, &z2f, CKFS_DTYPE_F32, "z3_w3_tied_fp32/global_step2");
		ckfs_st_set_release(&z2f);
	}
	ckfs_model_free(m);
}

/* $D = a copy of case after setup, opened as $D/sub with --config; code
 * and the message (with $D for the copy) expected. */
static void expect_in(const char *cas, const char *sub, const char *setup, enum ckfs_code code,
		      const char *msg)
{
	const char *dir = test_tmp_dir("deepspeed", "case");
	char src[1024], cfg[1024], want[2048], real[1024];
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_F32, .config_path = cfg };
	struct ckfs_model *m = NULL;
	struct ckfs_error err;

	CHECK(test_sh("rm -rf '%s' && cp -r " DS "/%s '%s'", dir, cas, dir) == 0);
	CHECK(test_sh("D='%s'; %s", dir, setup) == 0);
	snprintf(src, sizeof(src), "%s%s", dir, sub);
	snprintf(cfg, sizeof(cfg), "%s/oracle/config.json", dir);
	if (!realpath(dir, real))
		snprintf(real, sizeof(real), "%s", dir);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_model_open(src, &opt, &m, &err), code);
	if (code == CKFS_OK) {
		CHECK(m && m->n_tensors > 0);
		ckfs_model_free(m);
		return;
	}
	CHECK(m == NULL);
	size_t k = 0;
	for (const char *p = msg; *p && k + 1 < sizeof(want); p++) { /* $D: the copy */
		if (p[0] == '$' && p[1] == 'D') {
			k += (size_t)snprintf(want + k, sizeof(want) - k, "%s", real);
			p++;
		} else {
			want[k++] = *p;
		}
	}
	want[k < sizeof(want) ? k : sizeof(want) - 1] = '\0';
	CHECK_EQ_STR(err.msg, want);
}

static void test_latest(void)
{
	/* zero_to_fp32 strips the tag */
	expect_in("z3_w2_fp32", "", "printf ' global_step2\\n\\n' > \"$D/latest\"", CKFS_OK, NULL);
	expect_in("z3_w2_fp32", "", "printf 'global_step7' > \"$D/latest\"", CKFS_E_NOTFOUND,
		  "'$D/global_step7': not found (the step folder '$D/latest' names)");
	expect_in("z3_w2_fp32", "", "printf '../z3_w2_fp32' > \"$D/latest\"", CKFS_E_FORMAT,
		  "'$D/latest': does not hold a step folder's name");
	expect_in("z3_w2_fp32", "", "printf '\\n' > \"$D/latest\"", CKFS_E_FORMAT,
		  "'$D/latest': does not hold a step folder's name");
	expect_in("z3_w2_fp32", "", "rm \"$D/latest\"", CKFS_E_NOTFOUND,
		  "'$D': no 'latest' file naming the step folder to serve; serve a step folder "
		  "itself, e.g. '$D/global_step2'");
	/* a tag that is not global_stepN */
	expect_in("z3_w2_fp32", "", "mv \"$D/global_step2\" \"$D/best\" && printf best > "
		  "\"$D/latest\"", CKFS_OK, NULL);
}

static void test_config(void)
{
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_BF16 };
	struct ckfs_model *m = NULL;
	struct ckfs_error err;
	char want[4096];

	/* the Trainer's step folder: its config.json is one up */
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_model_open(DS "/trainer_z3_w3_bf16_tied/global_step2", &opt, &m, &err),
		     CKFS_E_NOTFOUND);
	char real[1024];
	CHECK(realpath(DS "/trainer_z3_w3_bf16_tied", real) != NULL);
	snprintf(want, sizeof(want), "'%s/global_step2': no config.json (only the Hugging Face "
		 "Trainer saves one beside a DeepSpeed checkpoint); pass --config PATH to a "
		 "Hugging Face config.json, e.g. '%s/config.json'", real, real);
	CHECK_EQ_STR(err.msg, want);
	/* engine.save_checkpoint's folder: none */
	CHECK(realpath(DS "/z1_w2_fp32", real) != NULL);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_model_open(DS "/z1_w2_fp32", &opt, &m, &err), CKFS_E_NOTFOUND);
	snprintf(want, sizeof(want), "'%s': no config.json (only the Hugging Face Trainer saves "
		 "one beside a DeepSpeed checkpoint); pass --config PATH to a Hugging Face "
		 "config.json", real);
	CHECK_EQ_STR(err.msg, want);
	CHECK(m == NULL);
}

/* Detection: the Trainer's ZeRO-2 folder holds model.safetensors too, but
 * is read from its masters. */
static void test_detect(void)
{
	struct ckfs_model *m = open_case(DS "/trainer_z2_w2_bf16", NULL, CKFS_DTYPE_BF16);

	CHECK(m && strcmp(m->layout->name, "deepspeed") == 0);
	ckfs_model_free(m);
	CHECK_EQ_INT(ckfs_layout_deepspeed.detect(DS "/z1_w2_fp32", NULL), 1);
	CHECK_EQ_INT(ckfs_layout_deepspeed.detect(DS "/z1_w2_fp32/global_step2", NULL), 1);
	CHECK_EQ_INT(ckfs_layout_deepspeed.detect(DS "/z1_w2_fp32/oracle", NULL), 0);
	CHECK_EQ_INT(ckfs_layout_deepspeed.detect(CKFS_FIXTURES "/dcp", NULL), 0);
}

int main(void)
{
	RUN(test_flat_blocks);
	RUN(test_flat_cut);
	RUN(test_oracles);
	RUN(test_trainer_bf16);
	RUN(test_auto);
	RUN(test_step_folder);
	RUN(test_latest);
	RUN(test_config);
	RUN(test_detect);
	test_tmp_cleanup();
	return test_summary();
}
