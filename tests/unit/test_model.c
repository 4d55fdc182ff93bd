/* SPDX-License-Identifier: MIT */
/*
 * The core engine end to end, without FUSE and without Python: every FSDP
 * fixture written by real torch (tests/gen/make_fixtures.py) is opened,
 * its folder built, and model.safetensors read through several patterns
 * (whole, 1-byte steps across the header end, 4 KiB, odd sizes, random
 * ranges) must equal verl's merger output committed under
 * tests/fixtures/expected/. Also: fp32 output equals the original
 * weights, sharded layouts hold the same tensors, and sources that change
 * under an open model give CKFS_E_CHANGED.
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

static const struct ckfs_node *find_node(const struct ckfs_folder *f, const char *name)
{
	for (size_t i = 0; i < f->n_nodes; i++)
		if (strcmp(f->nodes[i].name, name) == 0)
			return &f->nodes[i];
	return NULL;
}

static int read_range(const struct ckfs_folder *f, const struct ckfs_node *n,
		      uint64_t off, size_t len, unsigned char *out,
		      struct ckfs_read_scratch *s)
{
	struct ckfs_error err;
	size_t got = 0;

	ckfs_error_clear(&err);
	if (ckfs_folder_read(f, n, off, len, out, &got, s, &err) != CKFS_OK) {
		fprintf(stderr, "read %llu+%zu: %s\n", (unsigned long long)off, len, err.msg);
		return -1;
	}
	return (int)(got == len || off + got == n->size);
}

/* Compare node bytes with expected through several access patterns. */
static void check_patterns(const struct ckfs_folder *f, const struct ckfs_node *n,
			   const unsigned char *want, size_t want_len, const char *what)
{
	struct ckfs_read_scratch s = { 0 };
	unsigned char *buf = malloc(want_len + 16);
	uint64_t hdr = n->st ? n->st->header_len : 0;
	int bad = 0;

	CHECK_EQ_INT(n->size, want_len);
	/* Whole file in one read. */
	CHECK(read_range(f, n, 0, want_len, buf, &s) == 1);
	bad |= memcmp(buf, want, want_len) != 0;
	/* 1-byte reads around the header end and at EOF. */
	for (uint64_t o = hdr > 40 ? hdr - 40 : 0; o < hdr + 40 && o < want_len; o++) {
		CHECK(read_range(f, n, o, 1, buf, &s) == 1);
		bad |= buf[0] != want[o];
	}
	for (uint64_t o = want_len > 17 ? want_len - 17 : 0; o < want_len; o++) {
		CHECK(read_range(f, n, o, 1, buf, &s) == 1);
		bad |= buf[0] != want[o];
	}
	/* 4 KiB and odd-size sequential passes. */
	size_t steps[] = { 4096, 4093, 1000003 };
	for (size_t k = 0; k < 3; k++)
		for (uint64_t o = 0; o < want_len; o += steps[k]) {
			size_t len = want_len - o < steps[k] ? want_len - o : steps[k];
			CHECK(read_range(f, n, o, len, buf, &s) == 1);
			bad |= memcmp(buf, want + o, len) != 0;
		}
	/* Random ranges, including ones cut mid-element. */
	srand(12345);
	for (int i = 0; i < 300; i++) {
		uint64_t o = (uint64_t)rand() % want_len;
		size_t len = 1 + (size_t)rand() % 9000;
		if (len > want_len - o)
			len = want_len - o;
		CHECK(read_range(f, n, o, len, buf, &s) == 1);
		bad |= memcmp(buf, want + o, len) != 0;
	}
	if (bad)
		fprintf(stderr, "bytes differ: %s\n", what);
	CHECK(!bad);
	free(buf);
	ckfs_read_scratch_release(&s);
}

static const char *expected_name(const char *name, char *buf, size_t size)
{
	snprintf(buf, size, "%s", name);
	char *p = strstr(buf, "_nocfg");
	if (p)
		*p = '\0'; /* same tensors as its twin */
	return buf;
}

static int n_fixtures;

static void test_fixtures_match_verl(void)
{
	DIR *d = opendir(CKFS_FIXTURES "/fsdp");
	struct dirent *de;

	CHECK(d != NULL);
	while (d && (de = readdir(d))) {
		char src[1024], exp[1024], twin[256];
		struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_BF16 };
		struct ckfs_folder_options fopt = { 0 };
		struct ckfs_model *m = NULL;
		struct ckfs_folder *f = NULL;
		struct ckfs_error err;
		size_t len;

		if (de->d_name[0] == '.')
			continue;
		snprintf(src, sizeof(src), CKFS_FIXTURES "/fsdp/%s", de->d_name);
		struct stat st;
		if (stat(src, &st) != 0 || !S_ISDIR(st.st_mode))
			continue;
		n_fixtures++;
		ckfs_error_clear(&err);
		snprintf(exp, sizeof(exp), CKFS_FIXTURES "/expected/%s/model.safetensors",
			 expected_name(de->d_name, twin, sizeof(twin)));
		unsigned char *want = test_slurp(exp, &len);
		CHECK(want != NULL);
		if (ckfs_model_open(src, &opt, &m, &err) != CKFS_OK ||
		    ckfs_folder_build(m, &fopt, &f, &err) != CKFS_OK) {
			fprintf(stderr, "%s: %s\n", de->d_name, err.msg);
			CHECK(0);
		} else if (want) {
			const struct ckfs_node *n = find_node(f, "model.safetensors");
			CHECK(n != NULL);
			if (n)
				check_patterns(f, n, want, len, de->d_name);
			CHECK(find_node(f, "config.json") != NULL);
		}
		free(want);
		ckfs_folder_free(f);
		ckfs_model_free(m);
	}
	if (d)
		closedir(d);
	CHECK(n_fixtures >= 10);
}

/* fp32 output of an fp32 checkpoint equals the original weights. */
static void test_fp32_equals_original(void)
{
	const char *names[] = { "qwen2_fsdp2_w3", "llama_tied_fsdp2_w4", "qwen2_hsdp_2x4",
				"llama_fsdp1_sharded_w2", "qwen2_fsdp1_w8" };
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		char src[1024], orig[1024];
		struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_F32 };
		struct ckfs_model *m = NULL;
		struct ckfs_st_set ref;
		struct ckfs_error err;
		struct ckfs_read_scratch s = { 0 };

		ckfs_error_clear(&err);
		snprintf(src, sizeof(src), CKFS_FIXTURES "/fsdp/%s", names[i]);
		snprintf(orig, sizeof(orig), CKFS_FIXTURES "/original/%s.safetensors", names[i]);
		CHECK(ckfs_model_open(src, &opt, &m, &err) == CKFS_OK);
		if (!m) {
			fprintf(stderr, "%s\n", err.msg);
			continue;
		}
		/* ckfs_st_set_open reads a folder's model.safetensors: link the
		 * original weights into a folder of their own. */
		char dir[1024];
		snprintf(dir, sizeof(dir), "/tmp/ckfs-test-orig-%d", (int)getpid());
		mkdir(dir, 0755);
		char link[1100];
		snprintf(link, sizeof(link), "%s/model.safetensors", dir);
		unlink(link);
		char abs[2048];
		CHECK(realpath(orig, abs) != NULL);
		CHECK(symlink(abs, link) == 0);
		ckfs_error_clear(&err);
		CHECK(ckfs_st_set_open(dir, NULL, &ref, &err) == CKFS_OK);
		for (size_t k = 0; k < m->n_tensors; k++) {
			const struct ckfs_tensor *t = &m->tensors[k];
			const struct ckfs_st_entry *e = ckfs_st_set_find(&ref, t->name);
			CHECK(e != NULL);
			if (!e)
				continue;
			size_t bytes = (size_t)ckfs_tensor_out_bytes(t);
			CHECK_EQ_INT(bytes, e->end - e->begin);
			unsigned char *a = malloc(bytes + 1), *b = malloc(bytes + 1);
			CHECK(ckfs_tensor_read(m, t, 0, t->numel, a, &s, &err) == CKFS_OK);
			CHECK(ckfs_file_pread(e->f, b, bytes, e->begin) == (ssize_t)bytes);
			if (memcmp(a, b, bytes) != 0) {
				fprintf(stderr, "%s: %s differs from the original\n", names[i], t->name);
				CHECK(0);
			}
			free(a);
			free(b);
		}
		ckfs_st_set_release(&ref);
		unlink(link);
		rmdir(dir);
		ckfs_read_scratch_release(&s);
		ckfs_model_free(m);
	}
}

/* Shards hold the same bytes per tensor as the single file. */
static void test_sharded_layout(void)
{
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_BF16 };
	struct ckfs_folder_options one = { 0 }, many = { .max_shard_size = 60000 };
	struct ckfs_model *m = NULL;
	struct ckfs_folder *f1 = NULL, *fn = NULL;
	struct ckfs_error err;
	struct ckfs_read_scratch s = { 0 };

	ckfs_error_clear(&err);
	CHECK(ckfs_model_open(CKFS_FIXTURES "/fsdp/qwen2_fsdp2_w3", &opt, &m, &err) == CKFS_OK);
	CHECK(ckfs_folder_build(m, &one, &f1, &err) == CKFS_OK);
	CHECK(ckfs_folder_build(m, &many, &fn, &err) == CKFS_OK);
	if (!fn || !f1) {
		fprintf(stderr, "%s\n", err.msg);
		return;
	}
	CHECK(fn->layout.n_files > 2);
	CHECK(find_node(fn, "model.safetensors") == NULL);
	CHECK(find_node(fn, "model.safetensors.index.json") != NULL);
	char name[64];
	snprintf(name, sizeof(name), "model-00001-of-%05zu.safetensors", fn->layout.n_files);
	CHECK(find_node(fn, name) != NULL);
	/* Every tensor appears in exactly one shard, with the same bytes. */
	size_t seen = 0;
	for (size_t i = 0; i < fn->layout.n_files; i++) {
		const struct ckfs_st_file *sf = &fn->layout.files[i];
		uint64_t data = 0;
		for (size_t k = 0; k < sf->n_tensors; k++)
			data += sf->offsets[k + 1] - sf->offsets[k];
		/* Greedy split: only a lone tensor may exceed the limit. */
		CHECK(data <= 60000 || sf->n_tensors == 1);
		seen += sf->n_tensors;
	}
	CHECK_EQ_INT(seen, m->n_tensors);
	const struct ckfs_st_file *single = &f1->layout.files[0];
	for (size_t i = 0; i < fn->layout.n_files; i++) {
		const struct ckfs_st_file *sf = &fn->layout.files[i];
		for (size_t k = 0; k < sf->n_tensors; k++) {
			size_t j = 0;
			while (single->tensors[j] != sf->tensors[k])
				j++;
			size_t len = (size_t)(sf->offsets[k + 1] - sf->offsets[k]);
			unsigned char *a = malloc(len + 1), *b = malloc(len + 1);
			CHECK(ckfs_st_file_read(m, sf, sf->offsets[k], len, a, &s, &err) == CKFS_OK);
			CHECK(ckfs_st_file_read(m, single, single->offsets[j], len, b, &s, &err) == CKFS_OK);
			CHECK(memcmp(a, b, len) == 0);
			free(a);
			free(b);
		}
	}
	const struct ckfs_node *idx = find_node(fn, "model.safetensors.index.json");
	CHECK(idx && strstr(idx->data, "\"weight_map\": {") != NULL);
	CHECK(idx && strstr(idx->data, "\"total_size\": ") != NULL);
	ckfs_read_scratch_release(&s);
	ckfs_folder_free(f1);
	ckfs_folder_free(fn);
	ckfs_model_free(m);
}

/* Corner cases written by real torch (tests/gen/make_edge_fixtures.py):
 * views, shared storages, neg bit, every dtype, 0-d and empty tensors,
 * _StridedShard on a 2-D mesh, plain tensors saved on two ranks (one copy
 * served). Served as stored, the file must equal
 * safetensors' own save_file of the logical tensors, byte for byte. */
static void test_edge_fixtures(void)
{
	const char *names[] = { "plain_views_w1", "strided_2x2", "plain_copies_w2" };
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		char src[1024], exp[1024];
		struct ckfs_model_options opt = { .as_stored = true };
		struct ckfs_folder_options fopt = { 0 };
		struct ckfs_model *m = NULL;
		struct ckfs_folder *f = NULL;
		struct ckfs_error err;
		size_t len;

		ckfs_error_clear(&err);
		snprintf(src, sizeof(src), CKFS_FIXTURES "/edge/%s", names[i]);
		snprintf(exp, sizeof(exp), CKFS_FIXTURES "/edge/%s.expected.safetensors", names[i]);
		unsigned char *want = test_slurp(exp, &len);
		CHECK(want != NULL);
		if (ckfs_model_open(src, &opt, &m, &err) != CKFS_OK ||
		    ckfs_folder_build(m, &fopt, &f, &err) != CKFS_OK) {
			fprintf(stderr, "%s: %s\n", names[i], err.msg);
			CHECK(0);
		} else if (want) {
			check_patterns(f, find_node(f, "model.safetensors"), want, len, names[i]);
		}
		free(want);
		ckfs_folder_free(f);
		ckfs_model_free(m);
	}
}

static int copy_dir(const char *from, const char *to)
{
	char cmd[4096];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -r '%s' '%s'", to, from, to);
	return system(cmd);
}

static enum ckfs_code read_all(struct ckfs_folder *f, const char *node)
{
	const struct ckfs_node *n = find_node(f, node);
	struct ckfs_read_scratch s = { 0 };
	struct ckfs_error err;
	size_t got;
	unsigned char *buf = malloc(n->size + 1);

	ckfs_error_clear(&err);
	enum ckfs_code rc = ckfs_folder_read(f, n, 0, n->size, buf, &got, &s, &err);
	if (rc != CKFS_OK)
		fprintf(stderr, "  (expected) %s\n", err.msg);
	free(buf);
	ckfs_read_scratch_release(&s);
	return rc;
}

/* A source that changes under an open model fails reads, never serves. */
static void test_source_changes(void)
{
	/* truncate, delete, replace, touch a rank file; append to a side file */
	for (size_t i = 0; i < 5; i++) {
		char dir[256], cmd[2048];
		struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_BF16 };
		struct ckfs_folder_options fopt = { 0 };
		struct ckfs_model *m = NULL;
		struct ckfs_folder *f = NULL;
		struct ckfs_error err;

		ckfs_error_clear(&err);
		snprintf(dir, sizeof(dir), "/tmp/ckfs-test-src-%d", (int)getpid());
		CHECK(copy_dir(CKFS_FIXTURES "/fsdp/qwen2_fsdp2_w2", dir) == 0);
		CHECK(ckfs_model_open(dir, &opt, &m, &err) == CKFS_OK);
		CHECK(m && ckfs_folder_build(m, &fopt, &f, &err) == CKFS_OK);
		if (!f)
			continue;
		CHECK(read_all(f, "model.safetensors") == CKFS_OK);
		const char *rank1 = "model_world_size_2_rank_1.pt";
		if (i == 0)
			snprintf(cmd, sizeof(cmd), "truncate -s 1000 %s/%s", dir, rank1);
		else if (i == 1)
			snprintf(cmd, sizeof(cmd), "rm %s/%s", dir, rank1);
		else if (i == 2)
			snprintf(cmd, sizeof(cmd), "cp %s/%s %s/x && mv %s/x %s/%s", dir, rank1,
				 dir, dir, dir, rank1);
		else if (i == 3)
			snprintf(cmd, sizeof(cmd), "touch -d '2001-01-01' %s/%s", dir, rank1);
		else
			snprintf(cmd, sizeof(cmd), "echo x >> %s/huggingface/tokenizer.json", dir);
		CHECK(system(cmd) == 0);
		if (i < 4) {
			CHECK_EQ_INT(read_all(f, "model.safetensors"), CKFS_E_CHANGED);
			CHECK(read_all(f, "config.json") == CKFS_OK);
		} else {
			CHECK_EQ_INT(read_all(f, "tokenizer.json"), CKFS_E_CHANGED);
			CHECK(read_all(f, "model.safetensors") == CKFS_OK);
		}
		ckfs_folder_free(f);
		ckfs_model_free(m);
		snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
		CHECK(system(cmd) == 0);
	}
}

int main(void)
{
	RUN(test_fixtures_match_verl);
	RUN(test_fp32_equals_original);
	RUN(test_sharded_layout);
	RUN(test_edge_fixtures);
	RUN(test_source_changes);
	printf("(%d fixtures checked against verl's merger)\n", n_fixtures);
	return test_summary();
}
