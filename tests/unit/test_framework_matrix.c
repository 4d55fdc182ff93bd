/* SPDX-License-Identifier: MIT */
/*
 * The framework version matrix (issue #21): the same checkpoints written
 * by other releases of the training frameworks than the pinned ones,
 * tests/fixtures/matrix/<framework>-<version>/<case>/ (the torch-* cells
 * are test_torch_matrix's):
 *  - deepspeed-<v>: tests/gen/make_deepspeed_fixtures.py --version-matrix
 *    run with DeepSpeed <v>; each case served --dtype fp32 equals, tensor
 *    by tensor and bit for bit, that release's own zero_to_fp32
 *    (oracle/zero_to_fp32.safetensors; absent for BF16_Optimizer, which
 *    it refuses) and the fp32 masters gathered in training
 *    (oracle/live_fp32.safetensors).
 *  - megatron-core-<v>: make_megatron_fixtures.py and
 *    make_mcore_dist_fixtures.py --version-matrix run with megatron-core
 *    <v>: legacy per-rank files (megatron/) and torch_dist folders
 *    (mcore_dist/), each served --dtype auto equal bit for bit to the
 *    original Hugging Face weights (original/model.safetensors).
 *  - verl-<v>: make_fixtures.py --version-matrix run with that verl
 *    release's FSDPCheckpointManager and merger: the fp32 output equals
 *    the weights before sharding (original/<case>.safetensors) and the
 *    default bf16 output that release's merger output (expected/<case>/),
 *    tensor by tensor, bit for bit, and the served model.safetensors is
 *    that file byte for byte.
 * Every cell and case listed here must exist, and every folder of those
 * frameworks under matrix/ must be listed here (a new cell is registered,
 * not silently skipped). The cell's records (oracle/case.json, MANIFEST.json)
 * must name the release.
 */
#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/folder.h"
#include "ckfs/layouts.h"
#include "ckfs/model.h"
#include "ckfs/safetensors.h"
#include "test.h"
#include "model_check.h"

#define MX CKFS_FIXTURES "/matrix"

/* ---- DeepSpeed ---- */

static const struct {
	const char *version, *name;
	int ws, stage; /* stage 0: BF16_Optimizer */
	int z2f;       /* oracle/zero_to_fp32.safetensors exists */
} ds_cases[] = {
	{ "0.16.9", "z1_w2_bf16", 2, 1, 1 },
	{ "0.16.9", "z2_w3_tied_fp32", 3, 2, 1 },
	{ "0.16.9", "z3_w3_tied_fp32", 3, 3, 1 },
	{ "0.16.9", "bf16opt_w3_tied", 3, 0, 0 },
};
#define N_DS (sizeof(ds_cases) / sizeof(ds_cases[0]))

/* ref = dir/<file>, opened through a folder of its own (a link to it). */
static int open_ref(const char *dir, const char *file, const char *tag, struct ckfs_st_set *ref)
{
	const char *tmp = test_tmp_dir("matrix", tag);
	struct ckfs_error err;

	if (test_sh("rm -rf '%s' && mkdir -p '%s' && ln -s '%s/%s' '%s/model.safetensors'", tmp,
		    tmp, dir, file, tmp) != 0)
		return -1;
	ckfs_error_clear(&err);
	if (ckfs_st_set_open(tmp, NULL, ref, &err) != CKFS_OK) {
		fprintf(stderr, "%s/%s: %s\n", dir, file, err.msg);
		return -1;
	}
	return 0;
}

/* oracle/case.json was written by that release: it holds `"key": "version"`. */
static void check_written_by(const char *case_json, const char *key, const char *version)
{
	size_t len = 0;
	unsigned char *txt = test_slurp(case_json, &len);
	char want[128];

	CHECK(txt != NULL);
	if (!txt)
		return;
	snprintf(want, sizeof(want), "\"%s\": \"%s\"", key, version);
	if (!strstr((const char *)txt, want)) {
		fprintf(stderr, "%s: no %s\n", case_json, want);
		CHECK(0);
	}
	free(txt);
}

static void check_ds_case(size_t i)
{
	char src[512], cfg[600], oracle[600], file[700], tag[128];
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_F32, .config_path = cfg };
	struct ckfs_model *m = NULL;
	struct ckfs_st_set ref;
	struct ckfs_error err;

	snprintf(src, sizeof(src), MX "/deepspeed-%s/%s", ds_cases[i].version, ds_cases[i].name);
	snprintf(cfg, sizeof(cfg), "%s/oracle/config.json", src);
	snprintf(oracle, sizeof(oracle), "%s/oracle", src);
	snprintf(tag, sizeof(tag), "ds-%s-%s", ds_cases[i].version, ds_cases[i].name);
	snprintf(file, sizeof(file), "%s/case.json", oracle);
	check_written_by(file, "deepspeed", ds_cases[i].version);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_model_open(src, &opt, &m, &err), CKFS_OK);
	if (!m) {
		fprintf(stderr, "%s: %s\n", src, err.msg);
		return;
	}
	CHECK_EQ_STR(m->layout->name, "deepspeed");
	CHECK_EQ_INT(m->world_size, ds_cases[i].ws);
	char step[64];
	CHECK_EQ_INT(test_fact(m, "deepspeed", "zero_stage", NULL, 0), ds_cases[i].stage);
	test_fact(m, "deepspeed", "tag", step, sizeof(step));
	CHECK_EQ_STR(step, "global_step2");
	CHECK_EQ_INT(m->n_ranks_read, ds_cases[i].ws);
	CHECK_EQ_INT(m->n_sources, ds_cases[i].ws + (ds_cases[i].stage == 3 ? ds_cases[i].ws : 1));
	struct stat st;
	snprintf(file, sizeof(file), "%s/zero_to_fp32.safetensors", oracle);
	CHECK_EQ_INT(stat(file, &st) == 0, ds_cases[i].z2f);
	if (ds_cases[i].z2f && open_ref(oracle, "zero_to_fp32.safetensors", tag, &ref) == 0) {
		CHECK_EQ_INT(m->n_tensors, ref.n_entries);
		test_model_equals(m, &ref, CKFS_DTYPE_F32, src);
		ckfs_st_set_release(&ref);
	}
	if (open_ref(oracle, "live_fp32.safetensors", tag, &ref) == 0) {
		CHECK_EQ_INT(m->n_tensors, ref.n_entries);
		test_model_equals(m, &ref, CKFS_DTYPE_F32, src);
		ckfs_st_set_release(&ref);
	} else {
		CHECK(0);
	}
	ckfs_model_free(m);
}

static void test_deepspeed(void)
{
	for (size_t i = 0; i < N_DS; i++)
		check_ds_case(i);
}

/* ---- megatron-core ---- */

static const struct {
	const char *version;
	const char *kind; /* megatron (per-rank files) or mcore_dist (torch_dist) */
	const char *name;
	int tp, pp, world;
} mg_cases[] = {
	{ "0.14.0", "megatron", "qwen2_tp2_pp2", 2, 2, 4 },
	{ "0.14.0", "mcore_dist", "qwen2_tp2", 2, 1, 2 },
	{ "0.14.0", "mcore_dist", "llama_pp3_uneven", 1, 3, 3 },
	{ "0.14.0", "mcore_dist", "qwen3_moe_ep2", 1, 1, 2 },
	{ "0.19.2", "megatron", "qwen2_tp2_pp2", 2, 2, 4 },
	{ "0.19.2", "mcore_dist", "qwen2_tp2", 2, 1, 2 },
	{ "0.19.2", "mcore_dist", "llama_pp3_uneven", 1, 3, 3 },
	{ "0.19.2", "mcore_dist", "qwen3_moe_ep2", 1, 1, 2 },
};
#define N_MG (sizeof(mg_cases) / sizeof(mg_cases[0]))

static void check_mg_case(size_t i)
{
	char src[512], orig[600], file[600];
	struct ckfs_model_options opt = { .as_stored = true };
	struct ckfs_model *m = NULL;
	struct ckfs_st_set ref;
	struct ckfs_error err;
	int legacy = strcmp(mg_cases[i].kind, "megatron") == 0;

	snprintf(src, sizeof(src), MX "/megatron-core-%s/%s/%s", mg_cases[i].version,
		 mg_cases[i].kind, mg_cases[i].name);
	snprintf(orig, sizeof(orig), "%s/original", src);
	snprintf(file, sizeof(file), MX "/megatron-core-%s/%s/MANIFEST.json", mg_cases[i].version,
		 mg_cases[i].kind);
	check_written_by(file, "megatron-core", mg_cases[i].version);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_model_open(src, &opt, &m, &err), CKFS_OK);
	if (!m) {
		fprintf(stderr, "%s: %s\n", src, err.msg);
		return;
	}
	CHECK_EQ_STR(m->layout->name, legacy ? "megatron" : "megatron-dist");
	CHECK_EQ_INT(m->world_size, mg_cases[i].world);
	if (legacy) {
		CHECK_EQ_INT(test_fact(m, "megatron", "tp", NULL, 0), mg_cases[i].tp);
		CHECK_EQ_INT(test_fact(m, "megatron", "pp", NULL, 0), mg_cases[i].pp);
	}
	ckfs_error_clear(&err);
	if (ckfs_st_set_open(orig, NULL, &ref, &err) == CKFS_OK) {
		CHECK_EQ_INT(m->n_tensors, ref.n_entries);
		test_model_equals(m, &ref, CKFS_DTYPE_BF16, src);
		ckfs_st_set_release(&ref);
	} else {
		fprintf(stderr, "%s: %s\n", orig, err.msg);
		CHECK(0);
	}
	ckfs_model_free(m);
}

static void test_megatron(void)
{
	for (size_t i = 0; i < N_MG; i++)
		check_mg_case(i);
}

/* ---- verl ---- */

static const struct {
	const char *version, *name;
	int world, fsdp_version;
} verl_cases[] = {
	{ "0.5.0", "llama_fsdp2_w3_noplacement", 3, 2 },
	{ "0.6.1", "llama_fsdp2_w3_noplacement", 3, 2 },
	{ "0.7.1", "llama_fsdp2_w3_noplacement", 3, 2 },
	{ "0.8.0", "llama_fsdp2_w3_noplacement", 3, 2 },
};
#define N_VERL (sizeof(verl_cases) / sizeof(verl_cases[0]))

/* ref = that file, opened through a folder of its own; -1 on failure. */
static int open_file_ref(const char *path, const char *tag, struct ckfs_st_set *ref)
{
	char dir[600];
	const char *slash = strrchr(path, '/');

	snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
	return open_ref(dir, slash + 1, tag, ref);
}

/* The model.safetensors m serves is byte for byte the file at want. */
static void check_served_file(const struct ckfs_model *m, const char *want_path)
{
	struct ckfs_folder_options fopt = { 0 };
	struct ckfs_read_scratch s = { 0 };
	struct ckfs_folder *f = NULL;
	struct ckfs_error err;
	size_t len = 0, got = 0;
	unsigned char *want = test_slurp(want_path, &len), *buf = NULL;

	CHECK(want != NULL);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_folder_build(m, &fopt, &f, &err), CKFS_OK);
	const struct ckfs_node *n = NULL;
	for (size_t k = 0; f && k < f->n_nodes; k++)
		if (strcmp(f->nodes[k].name, "model.safetensors") == 0)
			n = &f->nodes[k];
	CHECK(n != NULL);
	if (want && n) {
		CHECK_EQ_INT(n->size, len);
		buf = malloc(len ? len : 1);
		ckfs_error_clear(&err);
		CHECK_EQ_INT(ckfs_folder_read(f, n, 0, len, buf, &got, &s, &err), CKFS_OK);
		CHECK_EQ_INT(got, len);
		if (got != len || memcmp(buf, want, len) != 0) {
			fprintf(stderr, "%s: the served model.safetensors differs\n", want_path);
			CHECK(0);
		}
	}
	free(buf);
	free(want);
	ckfs_read_scratch_release(&s);
	ckfs_folder_free(f);
}

static void check_verl_case(size_t i)
{
	char cell[512], src[600], file[700], tag[128];
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_F32 };
	struct ckfs_model *m = NULL;
	struct ckfs_st_set ref;
	struct ckfs_error err;

	snprintf(cell, sizeof(cell), MX "/verl-%s", verl_cases[i].version);
	snprintf(src, sizeof(src), "%s/fsdp/%s", cell, verl_cases[i].name);
	snprintf(tag, sizeof(tag), "verl-%s-%s", verl_cases[i].version, verl_cases[i].name);
	snprintf(file, sizeof(file), "%s/MANIFEST.json", cell);
	check_written_by(file, "verl", verl_cases[i].version);
	for (int pass = 0; pass < 2; pass++) {
		/* fp32: the weights before sharding; bf16 (the default): that
		 * release's own merger output */
		opt.out_dtype = pass ? CKFS_DTYPE_BF16 : CKFS_DTYPE_F32;
		ckfs_error_clear(&err);
		CHECK_EQ_INT(ckfs_model_open(src, &opt, &m, &err), CKFS_OK);
		if (!m) {
			fprintf(stderr, "%s: %s\n", src, err.msg);
			return;
		}
		CHECK_EQ_STR(m->layout->name, "verl-fsdp");
		CHECK_EQ_INT(m->world_size, verl_cases[i].world);
		CHECK_EQ_INT(test_fact(m, "fsdp_version", NULL, NULL, 0),
			     verl_cases[i].fsdp_version ? verl_cases[i].fsdp_version : -1);
		CHECK_EQ_INT(m->n_warnings, 0);
		if (pass)
			snprintf(file, sizeof(file), "%s/expected/%s/model.safetensors", cell,
				 verl_cases[i].name);
		else
			snprintf(file, sizeof(file), "%s/original/%s.safetensors", cell,
				 verl_cases[i].name);
		if (open_file_ref(file, tag, &ref) == 0) {
			CHECK_EQ_INT(m->n_tensors, ref.n_entries);
			test_model_equals(m, &ref, CKFS_DTYPE_F32, src); /* stored fp32 */
			ckfs_st_set_release(&ref);
		} else {
			CHECK(0);
		}
		if (pass)
			check_served_file(m, file);
		ckfs_model_free(m);
		m = NULL;
	}
}

static void test_verl(void)
{
	for (size_t i = 0; i < N_VERL; i++)
		check_verl_case(i);
}

/* ---- every cell on disk is listed ---- */

static int ds_listed(const char *version, const char *name)
{
	for (size_t i = 0; i < N_DS; i++)
		if (strcmp(ds_cases[i].version, version) == 0 &&
		    (!name || strcmp(ds_cases[i].name, name) == 0))
			return 1;
	return 0;
}

/* Every entry of cell/kind is listed(version, "kind/entry"). */
static void check_kind(const char *cell, const char *version, const char *kind,
		       int (*listed)(const char *, const char *))
{
	char sub[1024], name[600];
	DIR *d;
	struct dirent *e;

	snprintf(sub, sizeof(sub), "%s/%s", cell, kind);
	d = opendir(sub);
	CHECK(d != NULL);
	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(name, sizeof(name), "%s/%s", kind, e->d_name);
		if (!listed(version, name)) {
			fprintf(stderr, "%s/%s: not listed in test_framework_matrix.c\n", sub,
				e->d_name);
			CHECK(0);
		}
	}
	if (d)
		closedir(d);
}

/* Calls listed(version, case) for every case folder of prefix-* cells;
 * kinds: the cells hold <kind>/<case> folders. */
static void check_listed(const char *prefix, int (*listed)(const char *, const char *), int kinds)
{
	DIR *d = opendir(MX);
	struct dirent *e;
	size_t plen = strlen(prefix), cells = 0;

	CHECK(d != NULL);
	while (d && (e = readdir(d))) {
		if (strncmp(e->d_name, prefix, plen) != 0)
			continue;
		const char *version = e->d_name + plen;
		char sub[512];
		cells++;
		if (!listed(version, NULL)) {
			fprintf(stderr, "matrix/%s: not listed in test_framework_matrix.c\n", e->d_name);
			CHECK(0);
			continue;
		}
		snprintf(sub, sizeof(sub), MX "/%s", e->d_name);
		DIR *c = opendir(sub);
		struct dirent *ce;
		CHECK(c != NULL);
		while (c && (ce = readdir(c))) {
			if (ce->d_name[0] == '.')
				continue;
			if (!listed(version, ce->d_name)) {
				fprintf(stderr, "matrix/%s/%s: not listed in "
					"test_framework_matrix.c\n", e->d_name, ce->d_name);
				CHECK(0);
				continue;
			}
			char path[1024];
			struct stat st;
			snprintf(path, sizeof(path), "%s/%s", sub, ce->d_name);
			if (kinds && stat(path, &st) == 0 && S_ISDIR(st.st_mode))
				check_kind(sub, version, ce->d_name, listed);
		}
		if (c)
			closedir(c);
	}
	if (d)
		closedir(d);
	CHECK(cells > 0);
}

/* name: "<kind>" or "<kind>/<case>" (MANIFEST.json of a kind is not a case) */
static int mg_listed(const char *version, const char *name)
{
	for (size_t i = 0; i < N_MG; i++) {
		if (strcmp(mg_cases[i].version, version) != 0)
			continue;
		size_t kl = strlen(mg_cases[i].kind);
		if (!name || strcmp(name, mg_cases[i].kind) == 0)
			return 1;
		if (strncmp(name, mg_cases[i].kind, kl) == 0 && name[kl] == '/' &&
		    (strcmp(name + kl + 1, mg_cases[i].name) == 0 ||
		     strcmp(name + kl + 1, "MANIFEST.json") == 0))
			return 1;
	}
	return 0;
}

/* name: "<kind>" or "<kind>/<entry>" of fsdp/, original/, expected/, or
 * MANIFEST.json */
static int verl_listed(const char *version, const char *name)
{
	char want[300];

	for (size_t i = 0; i < N_VERL; i++) {
		if (strcmp(verl_cases[i].version, version) != 0)
			continue;
		if (!name || strcmp(name, "fsdp") == 0 || strcmp(name, "original") == 0 ||
		    strcmp(name, "expected") == 0 || strcmp(name, "MANIFEST.json") == 0)
			return 1;
		const char *n = verl_cases[i].name;
		snprintf(want, sizeof(want), "fsdp/%s", n);
		if (strcmp(name, want) == 0)
			return 1;
		snprintf(want, sizeof(want), "expected/%s", n);
		if (strcmp(name, want) == 0)
			return 1;
		snprintf(want, sizeof(want), "original/%s.safetensors", n);
		if (strcmp(name, want) == 0)
			return 1;
	}
	return 0;
}

static void test_all_listed(void)
{
	check_listed("deepspeed-", ds_listed, 0);
	check_listed("megatron-core-", mg_listed, 1);
	check_listed("verl-", verl_listed, 1);
}

int main(void)
{
	RUN(test_deepspeed);
	RUN(test_megatron);
	RUN(test_verl);
	RUN(test_all_listed);
	test_tmp_cleanup();
	return test_summary();
}
