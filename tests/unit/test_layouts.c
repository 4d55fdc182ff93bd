/* SPDX-License-Identifier: MIT */
/*
 * Input layouts besides verl FSDP (src/layouts/table.c, dcp.c, hf.c), on
 * folders written by real torch and transformers
 * (tests/gen/make_dcp_fixtures.py):
 *  - every torch.distributed.checkpoint fixture served --dtype auto holds,
 *    tensor by tensor and bit for bit, what torch's own dcp_to_torch_save
 *    produced (and the whole file equals it byte for byte when nothing is
 *    dropped by the tie rule);
 *  - names: the "model" prefix is removed through planner_data, "optim"
 *    entries are ignored, state-dict order is kept;
 *  - Hugging Face folders are re-served byte for byte (single file), a
 *    sharded folder as one file equals the single one, and the weights are
 *    found in SRC, SRC/huggingface or SRC/model/huggingface;
 *  - detection order and the error for a folder holding none;
 *  - broken DCP folders (truncated .metadata, a chunk without a storage
 *    entry, a relative path with "..", transformed items, a dtype that
 *    disagrees with the item) fail with one line naming the file;
 *  - a .distcp file changed under an open model fails reads.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/folder.h"
#include "ckfs/layouts.h"
#include "ckfs/model.h"
#include "ckfs/safetensors.h"
#include "ckfs/weights.h"
#include "test.h"
#include "model_check.h"

#define DCP CKFS_FIXTURES "/dcp"
#define HF CKFS_FIXTURES "/hf"

#define AS_STORED CKFS_DTYPE_INVALID /* the helper's --dtype auto */

static const struct ckfs_node *find_node(const struct ckfs_folder *f, const char *name)
{
	for (size_t i = 0; i < f->n_nodes; i++)
		if (strcmp(f->nodes[i].name, name) == 0)
			return &f->nodes[i];
	return NULL;
}

/* The whole of one served file. */
static unsigned char *read_node(const struct ckfs_folder *f, const char *name, size_t *len)
{
	const struct ckfs_node *n = find_node(f, name);
	struct ckfs_read_scratch s = { 0 };
	struct ckfs_error err;
	size_t got = 0;

	*len = 0;
	if (!n)
		return NULL;
	unsigned char *buf = malloc(n->size + 1);
	ckfs_error_clear(&err);
	if (ckfs_folder_read(f, n, 0, n->size, buf, &got, &s, &err) != CKFS_OK ||
	    got != n->size) {
		fprintf(stderr, "read %s: %s\n", name, err.msg);
		free(buf);
		buf = NULL;
	}
	ckfs_read_scratch_release(&s);
	*len = n->size;
	return buf;
}

static struct ckfs_model *open_model(const char *src, enum ckfs_dtype dt)
{
	/* dt CKFS_DTYPE_INVALID: --dtype auto */
	struct ckfs_model_options opt = { .out_dtype = dt, .as_stored = dt == CKFS_DTYPE_INVALID };
	struct ckfs_model *m = NULL;
	struct ckfs_error err;

	ckfs_error_clear(&err);
	if (ckfs_model_open(src, &opt, &m, &err) != CKFS_OK) {
		fprintf(stderr, "%s: %s\n", src, err.msg);
		return NULL;
	}
	return m;
}

/* Open a single safetensors file through ckfs_st_set_open (which reads a
 * folder's model.safetensors): link it into a folder of its own. */
static int open_st_file(const char *file, const char *dirname, struct ckfs_st_set *set)
{
	char abs[2048], link[1100];
	const char *dir = test_tmp_dir("layouts", dirname);
	struct ckfs_error err;

	mkdir(dir, 0755);
	snprintf(link, sizeof(link), "%s/model.safetensors", dir);
	unlink(link);
	if (!realpath(file, abs) || symlink(abs, link) != 0)
		return -1;
	ckfs_error_clear(&err);
	if (ckfs_st_set_open(dir, NULL, set, &err) != CKFS_OK) {
		fprintf(stderr, "%s\n", err.msg);
		return -1;
	}
	return 0;
}

static int has_warning(const struct ckfs_model *m, const char *needle)
{
	for (size_t i = 0; i < m->n_warnings; i++)
		if (strstr(m->warnings[i], needle))
			return 1;
	return 0;
}

/* ---- DCP ---- */

static const char *const dcp_names[] = { "qwen2_fsdp2_w2_optim", "qwen2_tied_fsdp2_w3",
					 "qwen2_plain_nodist" };
#define N_DCP (sizeof(dcp_names) / sizeof(dcp_names[0]))

/* Every tensor, read through the plan, equals dcp_to_torch_save's. */
static void test_dcp_matches_dcp_to_torch_save(void)
{
	for (size_t i = 0; i < N_DCP; i++) {
		char src[1024], oracle[1024];
		struct ckfs_st_set ref;
		struct ckfs_error err;
		int tied = strstr(dcp_names[i], "tied") != NULL;

		snprintf(src, sizeof(src), DCP "/%s", dcp_names[i]);
		snprintf(oracle, sizeof(oracle), DCP "/%s.dcp_to_torch_save.safetensors",
			 dcp_names[i]);
		struct ckfs_model *m = open_model(src, AS_STORED);
		CHECK(m != NULL);
		if (!m)
			continue;
		CHECK_EQ_STR(m->layout->name, "dcp");
		CHECK(open_st_file(oracle, "oracle", &ref) == 0);
		CHECK_EQ_INT(m->n_tensors + (size_t)tied, ref.n_entries);
		test_model_equals(m, &ref, CKFS_DTYPE_INVALID, dcp_names[i]);
		if (tied) {
			CHECK(ckfs_st_set_find(&ref, "lm_head.weight") != NULL);
			for (size_t k = 0; k < m->n_tensors; k++)
				CHECK(strcmp(m->tensors[k].name, "lm_head.weight") != 0);
			CHECK(has_warning(m, "lm_head.weight dropped"));
		} else {
			/* Nothing dropped: the served file is save_file's. */
			struct ckfs_folder_options fopt = { 0 };
			struct ckfs_folder *f = NULL;
			size_t got_len, want_len;
			ckfs_error_clear(&err);
			CHECK(ckfs_folder_build(m, &fopt, &f, &err) == CKFS_OK);
			unsigned char *got = f ? read_node(f, "model.safetensors", &got_len) : NULL;
			unsigned char *want = test_slurp(oracle, &want_len);
			CHECK(got && want && got_len == want_len &&
			      memcmp(got, want, want_len) == 0);
			CHECK(f && find_node(f, "config.json") != NULL);
			free(got);
			free(want);
			ckfs_folder_free(f);
		}
		ckfs_st_set_release(&ref);
		ckfs_model_free(m);
	}
}

/* Names through planner_data, other top-level keys dropped, order kept. */
static void test_dcp_names(void)
{
	struct ckfs_model *m = open_model(DCP "/qwen2_fsdp2_w2_optim", CKFS_DTYPE_BF16);

	CHECK(m != NULL);
	if (!m)
		return;
	CHECK_EQ_INT(m->n_tensors, 27);
	CHECK_EQ_INT(m->world_size, 2);
	CHECK_EQ_INT(m->n_sources, 2);
	CHECK_EQ_STR(m->tensors[0].name, "model.embed_tokens.weight");
	CHECK_EQ_STR(m->tensors[1].name, "model.layers.0.self_attn.q_proj.weight");
	CHECK_EQ_STR(m->tensors[m->n_tensors - 1].name, "lm_head.weight");
	for (size_t i = 0; i < m->n_tensors; i++) {
		CHECK(strncmp(m->tensors[i].name, "optim", 5) != 0);
		CHECK(strncmp(m->tensors[i].name, "model.model.", 12) != 0);
		CHECK_EQ_INT(m->tensors[i].out_dtype, CKFS_DTYPE_BF16);
	}
	/* vocab 301 at world size 2: rows 151 + 150 */
	CHECK_EQ_INT(m->tensors[0].n_chunks, 2);
	CHECK_EQ_INT(m->tensors[0].chunks[1].offset[0], 151);
	CHECK(has_warning(m, "entries outside 'model' ('optim')"));
	ckfs_model_free(m);

	/* A plain save: FQNs are the keys. */
	m = open_model(DCP "/qwen2_plain_nodist", AS_STORED);
	CHECK(m != NULL);
	if (m) {
		CHECK_EQ_INT(m->n_tensors, 27);
		CHECK_EQ_STR(m->tensors[0].name, "model.embed_tokens.weight");
		CHECK_EQ_INT(m->tensors[0].stored_dtype, CKFS_DTYPE_BF16);
		CHECK_EQ_INT(m->n_warnings, 0);
		CHECK_EQ_STR(m->tensors[0].placement, "whole");
	}
	ckfs_model_free(m);

	/* Uneven pieces at world size 3: 101 + 101 + 99 rows. */
	m = open_model(DCP "/qwen2_tied_fsdp2_w3", AS_STORED);
	CHECK(m != NULL);
	if (m) {
		CHECK_EQ_INT(m->tensors[0].n_chunks, 3);
		CHECK_EQ_INT(m->tensors[0].chunks[2].offset[0], 202);
		CHECK_EQ_INT(m->tensors[0].chunks[2].shape[0], 99);
		CHECK_EQ_STR(m->tensors[0].placement, "chunks(dim 0)");
	}
	ckfs_model_free(m);
}

/* bf16 output of the fp32 DCP fixture equals bf16 output of the same
 * weights read from dcp_to_torch_save's file, served as an HF folder
 * (the conversion is shared, the plans differ). */
static void test_dcp_bf16_equals_converted_oracle(void)
{
	const char *dir = test_tmp_dir("layouts", "oracle_hf");
	struct ckfs_folder_options fopt = { 0 };
	struct ckfs_folder *fa = NULL, *fb = NULL;
	struct ckfs_error err;

	/* a copy: symlinks leading out of a checkpoint are refused */
	CHECK(test_sh("rm -rf '%s' && mkdir -p '%s' && cp " DCP "/qwen2_fsdp2_w2_optim."
		 "dcp_to_torch_save.safetensors '%s/model.safetensors' && cp " DCP
		 "/qwen2_fsdp2_w2_optim/huggingface/config.json '%s/'", dir, dir, dir,
		 dir) == 0);
	struct ckfs_model *a = open_model(DCP "/qwen2_fsdp2_w2_optim", CKFS_DTYPE_BF16);
	struct ckfs_model *b = open_model(dir, CKFS_DTYPE_BF16);
	CHECK(a && b);
	if (a && b) {
		size_t la, lb;
		ckfs_error_clear(&err);
		CHECK(ckfs_folder_build(a, &fopt, &fa, &err) == CKFS_OK);
		CHECK(ckfs_folder_build(b, &fopt, &fb, &err) == CKFS_OK);
		unsigned char *x = fa ? read_node(fa, "model.safetensors", &la) : NULL;
		unsigned char *y = fb ? read_node(fb, "model.safetensors", &lb) : NULL;
		CHECK(x && y && la == lb && memcmp(x, y, la) == 0);
		free(x);
		free(y);
	}
	ckfs_folder_free(fa);
	ckfs_folder_free(fb);
	ckfs_model_free(a);
	ckfs_model_free(b);
}

/* ---- Hugging Face folders ---- */

static void test_hf_single_identical(void)
{
	struct ckfs_model *m = open_model(HF "/qwen2_single", AS_STORED);
	struct ckfs_folder_options fopt = { 0 };
	struct ckfs_folder *f = NULL;
	struct ckfs_error err;
	size_t got_len, want_len;

	CHECK(m != NULL);
	if (!m)
		return;
	CHECK_EQ_STR(m->layout->name, "hf");
	CHECK_EQ_INT(m->n_sources, 1);
	CHECK_EQ_STR(m->sources[0].name, "model.safetensors");
	CHECK(strstr(m->config_path, "/hf/qwen2_single/config.json") != NULL);
	ckfs_error_clear(&err);
	CHECK(ckfs_folder_build(m, &fopt, &f, &err) == CKFS_OK);
	unsigned char *got = f ? read_node(f, "model.safetensors", &got_len) : NULL;
	unsigned char *want = test_slurp(HF "/qwen2_single/model.safetensors", &want_len);
	CHECK(got && want && got_len == want_len && memcmp(got, want, want_len) == 0);
	/* config.json (re-rendered) and generation_config.json; the weight
	 * file is not passed through a second time */
	CHECK(f && f->n_nodes == 3);
	CHECK(f && find_node(f, "generation_config.json") != NULL);
	free(got);
	free(want);
	ckfs_folder_free(f);
	ckfs_model_free(m);
}

static void test_hf_sharded(void)
{
	struct ckfs_model *m = open_model(HF "/qwen2_sharded", AS_STORED);
	struct ckfs_folder_options one = { 0 }, many = { .max_shard_size = 50000 };
	struct ckfs_folder *f = NULL, *fn = NULL;
	struct ckfs_read_scratch s = { 0 };
	struct ckfs_error err;
	size_t got_len, want_len;

	CHECK(m != NULL);
	if (!m)
		return;
	CHECK_EQ_STR(m->layout->name, "hf");
	CHECK_EQ_INT(m->n_sources, 4);
	CHECK_EQ_STR(m->sources[0].name, "model-00001-of-00004.safetensors");
	ckfs_error_clear(&err);
	CHECK(ckfs_folder_build(m, &one, &f, &err) == CKFS_OK);
	/* the same weights as qwen2_single, so the same file */
	unsigned char *got = f ? read_node(f, "model.safetensors", &got_len) : NULL;
	unsigned char *want = test_slurp(HF "/qwen2_single/model.safetensors", &want_len);
	CHECK(got && want && got_len == want_len && memcmp(got, want, want_len) == 0);
	CHECK(f && find_node(f, "model.safetensors.index.json") == NULL);
	CHECK(f && find_node(f, "model-00001-of-00004.safetensors") == NULL);
	/* re-sharded: every tensor once, same bytes as in the single file */
	CHECK(ckfs_folder_build(m, &many, &fn, &err) == CKFS_OK);
	if (fn && f) {
		size_t seen = 0;
		const struct ckfs_st_file *single = &f->layout.files[0];
		CHECK(fn->layout.n_files > 2);
		for (size_t i = 0; i < fn->layout.n_files; i++) {
			const struct ckfs_st_file *sf = &fn->layout.files[i];
			for (size_t k = 0; k < sf->n_tensors; k++, seen++) {
				size_t j = 0;
				while (single->tensors[j] != sf->tensors[k])
					j++;
				size_t len = (size_t)(sf->offsets[k + 1] - sf->offsets[k]);
				unsigned char *a = malloc(len + 1), *b = malloc(len + 1);
				CHECK(ckfs_st_file_read(m, sf, sf->offsets[k], len, a, &s, &err) == CKFS_OK);
				CHECK(ckfs_st_file_read(m, single, single->offsets[j], len, b, &s,
							&err) == CKFS_OK);
				CHECK(memcmp(a, b, len) == 0);
				free(a);
				free(b);
			}
		}
		CHECK_EQ_INT(seen, m->n_tensors);
	}
	free(got);
	free(want);
	ckfs_read_scratch_release(&s);
	ckfs_folder_free(f);
	ckfs_folder_free(fn);
	ckfs_model_free(m);
}

/* Weights in SRC/huggingface or SRC/model/huggingface (verl's layouts). */
static void test_hf_subfolders(void)
{
	const char *subs[] = { "huggingface", "model/huggingface" };

	for (size_t i = 0; i < 2; i++) {
		const char *root = test_tmp_dir("layouts", i ? "sub_model_hf" : "sub_hf");
		char dst[1024];
		snprintf(dst, sizeof(dst), "%s/%s", root, subs[i]);
		CHECK(test_sh("rm -rf '%s' && mkdir -p '%s'", root, dst) == 0);
		CHECK(test_sh("cp " HF "/qwen2_single/* '%s'%s", dst, "") == 0);
		struct ckfs_model *m = open_model(root, CKFS_DTYPE_BF16);
		CHECK(m != NULL);
		if (m) {
			CHECK_EQ_STR(m->layout->name, "hf");
			CHECK(m->hf_dir && strstr(m->hf_dir, subs[i]) != NULL);
			CHECK_EQ_INT(m->n_tensors, 27);
		}
		ckfs_model_free(m);
	}
}

/* ---- detection ---- */

static void test_detection(void)
{
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_BF16 };
	struct ckfs_model *m = NULL;
	struct ckfs_error err;
	const char *both = test_tmp_dir("layouts", "both");

	/* DCP before HF weights */
	CHECK(test_sh("rm -rf '%s' && cp -r " DCP "/qwen2_plain_nodist '%s'", both, both) == 0);
	CHECK(test_sh("cp " HF "/qwen2_single/model.safetensors '%s/huggingface/'", both) == 0);
	m = open_model(both, CKFS_DTYPE_BF16);
	CHECK(m && strcmp(m->layout->name, "dcp") == 0);
	ckfs_model_free(m);
	m = NULL;

	/* verl rank files before everything */
	m = open_model(CKFS_FIXTURES "/fsdp/qwen2_fsdp2_w2", CKFS_DTYPE_BF16);
	CHECK(m && strcmp(m->layout->name, "verl-fsdp") == 0);
	ckfs_model_free(m);
	m = NULL;

	/* nothing known: one line listing what was looked for */
	const char *empty = test_tmp_dir("layouts", "empty");
	CHECK(test_sh("rm -rf '%s' && mkdir -p '%s/huggingface'", empty, empty) == 0);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_model_open(empty, &opt, &m, &err), CKFS_E_NOTFOUND);
	CHECK(strstr(err.msg, "not a verl FSDP checkpoint") != NULL);
	CHECK(strstr(err.msg, "model_world_size_*_rank_*.pt") != NULL);
	CHECK(strstr(err.msg, ".metadata") != NULL);
	CHECK(strstr(err.msg, "model.safetensors.index.json") != NULL);
	CHECK(strchr(err.msg, '\n') == NULL);

	/* options left zero ask for no dtype: refused, not read as auto */
	struct ckfs_model_options zero = { 0 };
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_model_open(HF "/qwen2_single", &zero, &m, &err), CKFS_E_INVALID);
}

/* ---- broken DCP folders ---- */

static void expect_broken(const char *metadata, enum ckfs_code code, const char *needle1,
			  const char *needle2)
{
	const char *dir = test_tmp_dir("layouts", "broken");
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_BF16 };
	struct ckfs_model *m = NULL;
	struct ckfs_error err;

	CHECK(test_sh("rm -rf '%s' && cp -r " DCP "/qwen2_plain_nodist '%s'", dir, dir) == 0);
	if (metadata)
		CHECK(test_sh("cp '%s' '%s/.metadata'", metadata, dir) == 0);
	else /* truncated: the first 3000 of ~6500 bytes */
		CHECK(test_sh("truncate -s 3000 '%s/.metadata'", dir) == 0);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_model_open(dir, &opt, &m, &err), code);
	CHECK(m == NULL);
	fprintf(stderr, "  (expected) %s\n", err.msg);
	CHECK(strstr(err.msg, needle1) != NULL);
	CHECK(!needle2 || strstr(err.msg, needle2) != NULL);
	CHECK(strchr(err.msg, '\n') == NULL);
}

static void test_dcp_broken(void)
{
	expect_broken(NULL, CKFS_E_TRUNCATED, "/broken/.metadata': ", "unexpected end");
	expect_broken(DCP "/broken/missing_entry.metadata", CKFS_E_FORMAT, "/broken/.metadata': ",
		      "no storage_data entry for the chunk of "
		      "'model.layers.1.mlp.down_proj.weight' at [0, 0]");
	expect_broken(DCP "/broken/dotdot.metadata", CKFS_E_FORMAT, "/broken/.metadata': ",
		      "bad relative_path '../__0_0.distcp'");
	expect_broken(DCP "/broken/transform.metadata", CKFS_E_UNSUPPORTED,
		      "'model.layers.1.mlp.down_proj.weight' is stored with transforms "
		      "(stream.zstd/1)", NULL);
	expect_broken(DCP "/broken/dtype_mismatch.metadata", CKFS_E_INVALID,
		      "/broken/__0_0.distcp@", "holds bfloat16 [64, 96], .metadata declares "
		      "float16 [64, 96]");
}

/* A .distcp file missing or changed under an open model. */
static void test_dcp_source_changes(void)
{
	const char *dir = test_tmp_dir("layouts", "changes");
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_BF16 };
	struct ckfs_folder_options fopt = { 0 };
	struct ckfs_model *m = NULL;
	struct ckfs_folder *f = NULL;
	struct ckfs_error err;

	CHECK(test_sh("rm -rf '%s' && cp -r " DCP "/qwen2_tied_fsdp2_w3 '%s'", dir, dir) == 0);
	CHECK(test_sh("rm '%s/__2_0.distcp'", dir) == 0);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_model_open(dir, &opt, &m, &err), CKFS_E_NOTFOUND);
	CHECK(strstr(err.msg, "/changes/__2_0.distcp': not found") != NULL);

	CHECK(test_sh("rm -rf '%s' && cp -r " DCP "/qwen2_tied_fsdp2_w3 '%s'", dir, dir) == 0);
	ckfs_error_clear(&err);
	CHECK(ckfs_model_open(dir, &opt, &m, &err) == CKFS_OK);
	CHECK(m && ckfs_folder_build(m, &fopt, &f, &err) == CKFS_OK);
	if (f) {
		size_t len;
		unsigned char *x = read_node(f, "model.safetensors", &len);
		CHECK(x != NULL);
		free(x);
		CHECK(test_sh("truncate -s 1000 '%s/__1_0.distcp'", dir) == 0);
		const struct ckfs_node *n = find_node(f, "model.safetensors");
		struct ckfs_read_scratch s = { 0 };
		size_t got;
		x = malloc(n->size);
		ckfs_error_clear(&err);
		CHECK_EQ_INT(ckfs_folder_read(f, n, 0, n->size, x, &got, &s, &err),
			     CKFS_E_CHANGED);
		CHECK(strstr(err.msg, "__1_0.distcp") != NULL);
		free(x);
		ckfs_read_scratch_release(&s);
	}
	ckfs_folder_free(f);
	ckfs_model_free(m);
}

int main(void)
{
	RUN(test_dcp_matches_dcp_to_torch_save);
	RUN(test_dcp_names);
	RUN(test_dcp_bf16_equals_converted_oracle);
	RUN(test_hf_single_identical);
	RUN(test_hf_sharded);
	RUN(test_hf_subfolders);
	RUN(test_detection);
	RUN(test_dcp_broken);
	RUN(test_dcp_source_changes);
	test_tmp_cleanup();
	return test_summary();
}
