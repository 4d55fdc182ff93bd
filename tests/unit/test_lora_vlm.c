/* SPDX-License-Identifier: MIT */
/*
 * LoRA actors, vision-language models and fused-expert LLMs saved by verl
 * 0.9.1's own engine (tests/gen/make_lora_vlm_fixtures.py), served as verl's
 * real merger wrote them (tests/fixtures/expected_{lora,vlm,moe}/):
 *  - every file the merger wrote that ckfs copies byte for byte is byte for
 *    byte the same through the folder: model.safetensors,
 *    lora_adapter/adapter_model.safetensors, tokenizer, processor and
 *    generation files (config.json and adapter_config.json are compared
 *    as their readers load them, in tests/py/test_lora_vlm.py);
 *  - --lora=fuse equals peft's merge_and_unload (fused_fp32.safetensors)
 *    bit for bit in fp32, with --lora-alpha where the checkpoint does not
 *    record it, --rslora where it was trained so, --base for an adapter
 *    saved alone; --lora=base serves the base weights alone;
 *  - an adapter saved alone is served as the adapter folder by itself;
 *  - four threads fusing at once read the same bytes (TSan in CI).
 * Python is not needed: the outputs are committed.
 */
#include <pthread.h>
#include <string.h>

#include "ckfs/folder.h"
#include "ckfs/layouts.h"
#include "test.h"
#include "model_check.h"

#define FIX CKFS_FIXTURES

struct fixture {
	const char *dir;        /* under tests/fixtures */
	const char *expected;   /* verl's output */
};

static const struct fixture cases[] = {
	{ "lora/lora_qwen2_fsdp2_w2", "expected_lora/lora_qwen2_fsdp2_w2" },
	{ "lora/lora_llama_fsdp1_w3", "expected_lora/lora_llama_fsdp1_w3" },
	{ "lora/lora_qwen2_fsdp2_w2_nometa", "expected_lora/lora_qwen2_fsdp2_w2_nometa" },
	{ "lora/lora_qwen2_fsdp2_w2_rslora", "expected_lora/lora_qwen2_fsdp2_w2_rslora" },
	{ "vlm/qwen2_vl_fsdp2_w2", "expected_vlm/qwen2_vl_fsdp2_w2" },
	{ "vlm/qwen2_5_vl_fsdp2_w2", "expected_vlm/qwen2_5_vl_fsdp2_w2" },
	{ "vlm/qwen3_vl_fsdp2_w2", "expected_vlm/qwen3_vl_fsdp2_w2" },
	{ "vlm/qwen3_vl_moe_fsdp2_w2", "expected_vlm/qwen3_vl_moe_fsdp2_w2" },
	{ "vlm/gemma3_fsdp2_w2", "expected_vlm/gemma3_fsdp2_w2" },
	{ "moe_fsdp/qwen3_moe_fsdp2_w2", "expected_moe/qwen3_moe_fsdp2_w2" },
	{ "moe_fsdp/mixtral_fsdp2_w2", "expected_moe/mixtral_fsdp2_w2" },
	/* issue 36: each saved as transformers' conversion mapping declares */
	{ "moe_fsdp/deepseek_v3_fsdp2_w2", "expected_moe/deepseek_v3_fsdp2_w2" },
	{ "moe_fsdp/deepseek_v3_qproj_fsdp2_w2", "expected_moe/deepseek_v3_qproj_fsdp2_w2" },
	{ "moe_fsdp/glm4_moe_fsdp2_w2", "expected_moe/glm4_moe_fsdp2_w2" },
	{ "moe_fsdp/gpt_oss_fsdp2_w2", "expected_moe/gpt_oss_fsdp2_w2" },
	{ "moe_fsdp/qwen3_next_fsdp2_w2", "expected_moe/qwen3_next_fsdp2_w2" },
	{ "moe_fsdp/llama4_text_fsdp2_w2", "expected_moe/llama4_text_fsdp2_w2" },
	{ "moe_fsdp/qwen2_moe_fsdp2_w2", "expected_moe/qwen2_moe_fsdp2_w2" },
	{ "moe_fsdp/olmoe_fsdp2_w2", "expected_moe/olmoe_fsdp2_w2" },
	{ "moe_fsdp/minimax_fsdp2_w2", "expected_moe/minimax_fsdp2_w2" },
	/* the same written and merged with transformers 5.23.0 */
	{ "transformers-5.23.0/moe_fsdp/deepseek_v3_fsdp2_w2",
	  "transformers-5.23.0/expected_moe/deepseek_v3_fsdp2_w2" },
	{ "transformers-5.23.0/moe_fsdp/glm4_moe_fsdp2_w2",
	  "transformers-5.23.0/expected_moe/glm4_moe_fsdp2_w2" },
	{ "transformers-5.23.0/moe_fsdp/gpt_oss_fsdp2_w2",
	  "transformers-5.23.0/expected_moe/gpt_oss_fsdp2_w2" },
	{ "transformers-5.23.0/moe_fsdp/qwen3_next_fsdp2_w2",
	  "transformers-5.23.0/expected_moe/qwen3_next_fsdp2_w2" },
	{ "transformers-5.23.0/moe_fsdp/llama4_text_fsdp2_w2",
	  "transformers-5.23.0/expected_moe/llama4_text_fsdp2_w2" },
	{ "transformers-5.23.0/moe_fsdp/qwen2_moe_fsdp2_w2",
	  "transformers-5.23.0/expected_moe/qwen2_moe_fsdp2_w2" },
	{ "transformers-5.23.0/moe_fsdp/olmoe_fsdp2_w2",
	  "transformers-5.23.0/expected_moe/olmoe_fsdp2_w2" },
	{ "transformers-5.23.0/moe_fsdp/minimax_fsdp2_w2",
	  "transformers-5.23.0/expected_moe/minimax_fsdp2_w2" },
	{ "transformers-5.23.0/moe_fsdp/qwen3_moe_fsdp2_w2",
	  "transformers-5.23.0/expected_moe/qwen3_moe_fsdp2_w2" },
	{ "transformers-5.23.0/moe_fsdp/mixtral_fsdp2_w2",
	  "transformers-5.23.0/expected_moe/mixtral_fsdp2_w2" },
};

/* The files of verl's output ckfs serves as they are (the others are
 * rendered, or the fixture's oracles and log). */
static int copied_by_ckfs(const char *name)
{
	return strcmp(name, "config.json") != 0 && strcmp(name, "merger.log") != 0 &&
	       strcmp(name, "lora_adapter/adapter_config.json") != 0 &&
	       !strstr(name, "_fp32.safetensors") && strcmp(name, "lora_adapter") != 0;
}

/* Every byte of node n. */
static unsigned char *read_node(const struct ckfs_folder *f, const struct ckfs_node *n)
{
	struct ckfs_read_scratch s = { 0 };
	struct ckfs_error err;
	unsigned char *buf = malloc(n->size + 1);
	size_t got = 0;

	ckfs_error_clear(&err);
	if (ckfs_folder_read(f, n, 0, n->size, buf, &got, &s, &err) != CKFS_OK ||
	    got != n->size) {
		fprintf(stderr, "%s: %s\n", n->name, err.msg);
		CHECK(0);
		free(buf);
		buf = NULL;
	}
	ckfs_read_scratch_release(&s);
	return buf;
}

static int open_folder(const char *dir, const struct ckfs_model_options *opt,
		       struct ckfs_model **m, struct ckfs_folder **f)
{
	struct ckfs_folder_options fo = { 0 };
	struct ckfs_error err;
	char src[512];

	snprintf(src, sizeof(src), FIX "/%s", dir);
	ckfs_error_clear(&err);
	*m = NULL;
	*f = NULL;
	if (ckfs_model_open(src, opt, m, &err) != CKFS_OK ||
	    ckfs_folder_build(*m, &fo, f, &err) != CKFS_OK) {
		fprintf(stderr, "%s: %s\n", dir, err.msg);
		ckfs_model_free(*m);
		*m = NULL;
		return 0;
	}
	return 1;
}

/* The node named name in f is byte for byte the file path. */
static void check_same_file(const struct ckfs_folder *f, const char *name, const char *path)
{
	const struct ckfs_node *n = NULL;
	size_t len;
	unsigned char *want = test_slurp(path, &len);

	for (size_t i = 0; i < f->n_nodes; i++)
		if (strcmp(f->nodes[i].name, name) == 0)
			n = &f->nodes[i];
	if (!n || !want) {
		fprintf(stderr, "%s: %s\n", path, n ? "cannot read" : "not served");
		CHECK(0);
		free(want);
		return;
	}
	unsigned char *got = read_node(f, n);
	CHECK_EQ_INT(n->size, len);
	if (got && n->size == len && memcmp(got, want, len) != 0) {
		fprintf(stderr, "%s: bytes differ from %s\n", name, path);
		CHECK(0);
	}
	free(got);
	free(want);
}

/* Each file of verl's output that ckfs copies is served, the same bytes;
 * each file served is one verl wrote. */
static void check_against_merger(const struct fixture *c)
{
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_BF16 };
	struct ckfs_model *m;
	struct ckfs_folder *f;
	char list[256], path[1024], line[512];

	if (!open_folder(c->dir, &opt, &m, &f)) {
		CHECK(0);
		return;
	}
	snprintf(list, sizeof(list), "%s", test_tmp_dir("lora", "list"));
	test_sh("cd '" FIX "/%s' && find . -type f | sed 's|^./||' | sort > '%s'", c->expected,
		list);
	FILE *fp = fopen(list, "r");
	size_t n_expected = 0;
	while (fp && fgets(line, sizeof(line), fp)) {
		line[strcspn(line, "\n")] = '\0';
		if (!copied_by_ckfs(line))
			continue;
		n_expected++;
		snprintf(path, sizeof(path), FIX "/%s/%s", c->expected, line);
		check_same_file(f, line, path);
	}
	if (fp)
		fclose(fp);
	/* The LoRA fixtures keep only the weights of verl's output (its side
	 * files are the checkpoint's, as in the other cases). */
	size_t n_copied = 0;
	for (size_t i = 0; i < f->n_nodes; i++)
		n_copied += copied_by_ckfs(f->nodes[i].name) &&
			    (!m->lora || strstr(f->nodes[i].name, ".safetensors"));
	if (n_copied != n_expected)
		fprintf(stderr, "%s: %zu files served, verl wrote %zu\n", c->dir, n_copied,
			n_expected);
	CHECK_EQ_INT(n_copied, n_expected);
	ckfs_folder_free(f);
	ckfs_model_free(m);
}

static void test_as_verl_merges(void)
{
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		check_against_merger(&cases[i]);
}

/* --lora=fuse in fp32 is peft's merge_and_unload, bit for bit. */
static void check_fused(const char *dir, const char *expected, struct ckfs_model_options opt)
{
	struct ckfs_model *m;
	struct ckfs_folder *f;
	struct ckfs_st_set ref;
	struct ckfs_error err;
	char path[512];

	opt.out_dtype = CKFS_DTYPE_F32;
	opt.lora = CKFS_LORA_FUSE;
	if (!open_folder(dir, &opt, &m, &f)) {
		CHECK(0);
		return;
	}
	/* the oracle as a folder's model.safetensors */
	snprintf(path, sizeof(path), "%s", test_tmp_dir("lora", "fused"));
	test_sh("rm -rf '%s' && mkdir -p '%s' && ln -s '" FIX "/%s/fused_fp32.safetensors' "
		"'%s/model.safetensors'", path, path, expected, path);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_st_set_open(path, NULL, &ref, &err), CKFS_OK);
	CHECK_EQ_INT(m->n_tensors, ref.n_entries);
	test_model_equals(m, &ref, CKFS_DTYPE_INVALID, dir);
	/* no lora_adapter/: the adapter is in the weights */
	CHECK(ckfs_folder_lookup(f, NULL, "lora_adapter") == NULL);
	ckfs_st_set_release(&ref);
	ckfs_folder_free(f);
	ckfs_model_free(m);
}

static void test_fused(void)
{
	struct ckfs_model_options opt = { 0 };

	check_fused("lora/lora_qwen2_fsdp2_w2", "expected_lora/lora_qwen2_fsdp2_w2", opt);
	check_fused("lora/lora_llama_fsdp1_w3", "expected_lora/lora_llama_fsdp1_w3", opt);
	opt.lora_alpha = 12; /* as trained; lora_train_meta.json was removed */
	check_fused("lora/lora_qwen2_fsdp2_w2_nometa", "expected_lora/lora_qwen2_fsdp2_w2_nometa",
		    opt);
	opt.lora_alpha = 0;
	opt.rslora = true;
	check_fused("lora/lora_qwen2_fsdp2_w2_rslora", "expected_lora/lora_qwen2_fsdp2_w2_rslora",
		    opt);
}

/* A folder to pass as --base: the source model's config and fp32 weights. */
static const char *make_base(void)
{
	const char *dir = test_tmp_dir("lora", "base");

	test_sh("rm -rf '%s' && mkdir -p '%s' && cp '" FIX "/lora/lora_qwen2_fsdp2_w2_loraonly/huggingface/"
		"config.json' '" FIX "/expected_lora/lora_qwen2_fsdp2_w2_loraonly/"
		"base_fp32.safetensors' '%s/' && mv '%s/base_fp32.safetensors' "
		"'%s/model.safetensors'", dir, dir, dir, dir, dir);
	return dir;
}

static void test_adapter_saved_alone(void)
{
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_BF16 };
	struct ckfs_model *m;
	struct ckfs_folder *f;

	/* Without --base: the adapter folder by itself. */
	if (open_folder("lora/lora_qwen2_fsdp2_w2_loraonly", &opt, &m, &f)) {
		CHECK_EQ_INT(f->n_nodes, 2);
		CHECK_EQ_STR(f->nodes[0].name, "adapter_config.json");
		check_same_file(f, "adapter_model.safetensors",
				FIX "/expected_lora/lora_qwen2_fsdp2_w2_loraonly/lora_adapter/"
				    "adapter_model.safetensors");
		CHECK(m->lora && m->lora->only);
		ckfs_folder_free(f);
		ckfs_model_free(m);
	} else {
		CHECK(0);
	}
	/* With it, all three modes. */
	opt.base_path = make_base();
	if (open_folder("lora/lora_qwen2_fsdp2_w2_loraonly", &opt, &m, &f)) {
		const struct ckfs_node *d = ckfs_folder_lookup(f, NULL, "lora_adapter");
		CHECK(d && d->kind == CKFS_NODE_DIR && d->n_children == 2);
		CHECK(ckfs_folder_lookup(f, d, "adapter_model.safetensors") != NULL);
		check_same_file(f, "lora_adapter/adapter_model.safetensors",
				FIX "/expected_lora/lora_qwen2_fsdp2_w2_loraonly/lora_adapter/"
				    "adapter_model.safetensors");
		CHECK(ckfs_folder_lookup(f, NULL, "model.safetensors") != NULL);
		ckfs_folder_free(f);
		ckfs_model_free(m);
	} else {
		CHECK(0);
	}
	check_fused("lora/lora_qwen2_fsdp2_w2_loraonly", "expected_lora/lora_qwen2_fsdp2_w2_loraonly",
		    opt);
	opt.lora = CKFS_LORA_BASE;
	if (open_folder("lora/lora_qwen2_fsdp2_w2_loraonly", &opt, &m, &f)) {
		CHECK(ckfs_folder_lookup(f, NULL, "lora_adapter") == NULL);
		CHECK_EQ_INT(m->n_tensors, 27);
		ckfs_folder_free(f);
		ckfs_model_free(m);
	} else {
		CHECK(0);
	}
	/* --dtype fp8 quantizes the base's weights once (the base is read as
	 * stored, the dtype rule applied to the whole model) */
	opt.out_dtype = CKFS_DTYPE_BF16;
	opt.quant = CKFS_QUANT_FP8;
	if (open_folder("lora/lora_qwen2_fsdp2_w2_loraonly", &opt, &m, &f)) {
		CHECK(m->view == &ckfs_view_fp8);
		CHECK_EQ_INT(m->view ? ((struct ckfs_fp8_set *)m->view_state)->n : 0, 14);
		CHECK_EQ_INT(m->n_tensors, 27 + 14);
		ckfs_folder_free(f);
		ckfs_model_free(m);
	} else {
		CHECK(0);
	}
}

/* --lora=base: verl's model.safetensors, no lora_adapter/. */
static void test_base_only(void)
{
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_BF16, .lora = CKFS_LORA_BASE };
	struct ckfs_model *m;
	struct ckfs_folder *f;

	if (!open_folder("lora/lora_llama_fsdp1_w3", &opt, &m, &f)) {
		CHECK(0);
		return;
	}
	CHECK(ckfs_folder_lookup(f, NULL, "lora_adapter") == NULL);
	check_same_file(f, "model.safetensors",
			FIX "/expected_lora/lora_llama_fsdp1_w3/model.safetensors");
	ckfs_folder_free(f);
	ckfs_model_free(m);
}

struct fused_reader {
	const struct ckfs_model *m;
	const struct ckfs_st_set *ref;
	int order, bad;
};

/* Every fused tensor of m against ref, in pieces, in this reader's order. */
static void *read_fused(void *arg)
{
	struct fused_reader *r = arg;
	struct ckfs_read_scratch s = { 0 };
	struct ckfs_error err;

	for (size_t k = 0; k < r->m->n_tensors; k++) {
		const struct ckfs_tensor *t = &r->m->tensors[r->order & 1 ? r->m->n_tensors - 1 - k : k];
		const struct ckfs_st_entry *e = ckfs_st_set_find(r->ref, t->name);
		size_t bytes = (size_t)ckfs_tensor_out_bytes(t);
		unsigned char *got = malloc(bytes + 1), *want = malloc(bytes + 1);
		uint64_t piece = 37 + 64 * (uint64_t)r->order;
		ckfs_error_clear(&err);
		for (uint64_t i = 0; e && i < t->numel; i += piece) {
			uint64_t n = t->numel - i < piece ? t->numel - i : piece;
			if (ckfs_tensor_read(r->m, t, i, n, got + i * 4, &s, &err) != CKFS_OK)
				r->bad++;
		}
		if (!e || ckfs_file_pread(e->f, want, bytes, e->begin) != (ssize_t)bytes ||
		    memcmp(got, want, bytes) != 0)
			r->bad++;
		free(got);
		free(want);
	}
	ckfs_read_scratch_release(&s);
	return NULL;
}

/* Four threads fusing at once: the first read of each pair's A and B is
 * made once, the others wait for it (TSan in CI). */
static void test_fused_threads(void)
{
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_F32, .lora = CKFS_LORA_FUSE };
	struct ckfs_model *m;
	struct ckfs_folder *f;
	struct ckfs_st_set ref;
	struct ckfs_error err;
	struct fused_reader r[4];
	pthread_t tid[4];
	char path[512];

	if (!open_folder("lora/lora_qwen2_fsdp2_w2", &opt, &m, &f)) {
		CHECK(0);
		return;
	}
	snprintf(path, sizeof(path), "%s", test_tmp_dir("lora", "fused_threads"));
	test_sh("rm -rf '%s' && mkdir -p '%s' && ln -s '" FIX "/expected_lora/lora_qwen2_fsdp2_w2/"
		"fused_fp32.safetensors' '%s/model.safetensors'", path, path, path);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_st_set_open(path, NULL, &ref, &err), CKFS_OK);
	for (int i = 0; i < 4; i++) {
		r[i] = (struct fused_reader){ .m = m, .ref = &ref, .order = i };
		CHECK(pthread_create(&tid[i], NULL, read_fused, &r[i]) == 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(tid[i], NULL);
		CHECK_EQ_INT(r[i].bad, 0);
	}
	ckfs_st_set_release(&ref);
	ckfs_folder_free(f);
	ckfs_model_free(m);
}

int main(void)
{
	RUN(test_as_verl_merges);
	RUN(test_fused);
	RUN(test_adapter_saved_alone);
	RUN(test_base_only);
	RUN(test_fused_threads);
	test_tmp_cleanup();
	return test_summary();
}
