/* SPDX-License-Identifier: MIT */
/*
 * config.json as served (ckfs_render_config): the dtype keys of the top
 * level and of its sub-configs say the output dtype whatever they held,
 * attn_implementation is dropped, Qwen2-VL and Qwen2.5-VL lose their
 * top-level token ids, and everything else stays byte for byte. Keys are
 * matched as JSON reads them, escapes included, and every output is JSON
 * that Python's json and cJSON read the same way.
 */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/folder.h"
#include "test.h"

static bool drops_vl_ids = true; /* transformers 5.10's merger */

static void expect_render_with(const char *model_type, const char *quant, const char *in,
			       const char *want)
{
	struct ckfs_error err;
	char *out = NULL;
	size_t n = 0;

	ckfs_error_clear(&err);
	struct ckfs_config_edits e = { "bfloat16", model_type, drops_vl_ids, quant, false };
	CHECK_EQ_INT(ckfs_render_config(in, strlen(in), &e, &out, &n, &err), CKFS_OK);
	CHECK_EQ_STR(out, want);
	CHECK_EQ_INT(n, strlen(want));
	cJSON *j = cJSON_Parse(out);
	CHECK(j != NULL); /* still JSON */
	cJSON_Delete(j);
	free(out);
}

static void expect_render_as(const char *model_type, const char *in, const char *want)
{
	expect_render_with(model_type, NULL, in, want);
}

static void expect_render(const char *in, const char *want)
{
	expect_render_as("qwen2", in, want);
}

static void test_dtype_values_replaced_in_place(void)
{
	expect_render("{\"torch_dtype\": \"float32\", \"a\": 1}",
		      "{\"torch_dtype\": \"bfloat16\", \"a\": 1}");
	/* Not a string: still replaced in place, no second key added. */
	expect_render("{\"torch_dtype\": null, \"a\": 1}", "{\"torch_dtype\": \"bfloat16\", \"a\": 1}");
	expect_render("{\"a\": 1, \"dtype\": 5}", "{\"a\": 1, \"dtype\": \"bfloat16\"}");
	expect_render("{\"dtype\": {\"text\": \"float32\"}, \"torch_dtype\": [\"x\"]}",
		      "{\"dtype\": \"bfloat16\", \"torch_dtype\": \"bfloat16\"}");
	/* Neither key: torch_dtype is added first. */
	expect_render("{\"a\": 1}", "{\n  \"torch_dtype\": \"bfloat16\",\"a\": 1}");
	expect_render("{}", "{\n  \"torch_dtype\": \"bfloat16\"}");
	/* A key spelled with escapes is the same key to every JSON reader. */
	expect_render("{\"dt\\u0079pe\": \"float32\"}", "{\"dt\\u0079pe\": \"bfloat16\"}");
}

static void test_sub_configs(void)
{
	/* Each sub-config's dtype, as transformers saves a vision-language
	 * model; deeper objects and arrays are left alone. */
	expect_render("{\"text_config\": {\"dtype\": \"float32\", \"x\": {\"dtype\": 1}}, "
		      "\"vision_config\": {\"torch_dtype\": null}, \"l\": [{\"dtype\": 2}], "
		      "\"dtype\": \"float32\"}",
		      "{\"text_config\": {\"dtype\": \"bfloat16\", \"x\": {\"dtype\": 1}}, "
		      "\"vision_config\": {\"torch_dtype\": \"bfloat16\"}, \"l\": [{\"dtype\": 2}], "
		      "\"dtype\": \"bfloat16\"}");
	/* A sub-config without one gets none. */
	expect_render("{\"dtype\": \"float32\", \"text_config\": {}}",
		      "{\"dtype\": \"bfloat16\", \"text_config\": {}}");
}

static void test_dropped_keys(void)
{
	const char *want = "{\n  \"dtype\": \"bfloat16\",\n  \"a\": 1\n}";
	/* attn_implementation first, in the middle, last, escaped, alone. */
	expect_render("{\n  \"attn_implementation\": \"sdpa\",\n  \"dtype\": \"float32\",\n"
		      "  \"a\": 1\n}", want);
	expect_render("{\n  \"dtype\": \"float32\",\n  \"attn_implementation\": \"sdpa\",\n"
		      "  \"a\": 1\n}", want);
	expect_render("{\n  \"dtype\": \"float32\",\n  \"a\": 1,\n"
		      "  \"attn_implementation\": \"flash_attention_2\"\n}", want);
	expect_render("{\n  \"dtype\": \"float32\",\n  \"a\": 1,\n"
		      "  \"attn_implement\\u0061tion\": null\n}", want);
	expect_render("{\"attn_implementation\": \"sdpa\"}",
		      "{\n  \"torch_dtype\": \"bfloat16\"}");
	/* Qwen2-VL and Qwen2.5-VL: the top-level token ids too, and only
	 * there; other models keep them. */
	const char *vl = "{\"bos_token_id\": 1, \"dtype\": \"float32\", \"eos_token_id\": 2, "
			 "\"text_config\": {\"bos_token_id\": 3}, \"pad_token_id\": 0}";
	expect_render_as("qwen2_5_vl", vl, "{\"dtype\": \"bfloat16\", \"text_config\": "
			 "{\"bos_token_id\": 3}}");
	expect_render_as("qwen2_vl", vl, "{\"dtype\": \"bfloat16\", \"text_config\": "
			 "{\"bos_token_id\": 3}}");
	expect_render_as("qwen3_vl", vl, "{\"bos_token_id\": 1, \"dtype\": \"bfloat16\", "
			 "\"eos_token_id\": 2, \"text_config\": {\"bos_token_id\": 3}, "
			 "\"pad_token_id\": 0}");
	expect_render_as(NULL, vl, "{\"bos_token_id\": 1, \"dtype\": \"bfloat16\", "
			 "\"eos_token_id\": 2, \"text_config\": {\"bos_token_id\": 3}, "
			 "\"pad_token_id\": 0}");
	/* transformers 5.23's merger keeps them. */
	drops_vl_ids = false;
	expect_render_as("qwen2_vl", vl, "{\"bos_token_id\": 1, \"dtype\": \"bfloat16\", "
			 "\"eos_token_id\": 2, \"text_config\": {\"bos_token_id\": 3}, "
			 "\"pad_token_id\": 0}");
	drops_vl_ids = true;
}

/* --transformers-version: the releases whose merger output is recorded
 * (tests/fixtures/matrix/transformers-*), by major.minor; the newest by
 * default; others refused. */
static void test_transformers_releases(void)
{
	CHECK_EQ_STR(ckfs_transformers_release(NULL)->release, "5.23");
	CHECK_EQ_STR(ckfs_transformers_release("5.23.0")->release, "5.23");
	CHECK_EQ_STR(ckfs_transformers_release("5.10.4")->release, "5.10");
	CHECK_EQ_STR(ckfs_transformers_release("5.10")->release, "5.10");
	CHECK(ckfs_transformers_release("5.10")->vl_drops_token_ids);
	CHECK(!ckfs_transformers_release("5.23")->vl_drops_token_ids);
	CHECK(ckfs_transformers_release("5.1") == NULL);
	CHECK(ckfs_transformers_release("5.100") == NULL);
	CHECK(ckfs_transformers_release("4.57.6") == NULL);
	CHECK(ckfs_transformers_release("") == NULL);
}

/* --dtype fp8: quantization_config added first, or its value replaced in
 * place (so rendering the output again changes nothing). */
static void test_quantization(void)
{
	const char *q = "{\"quant_method\": \"fp8\"}";

	expect_render_with("qwen2", q, "{\n  \"dtype\": \"float32\",\n  \"a\": 1\n}",
			   "{\n  \"quantization_config\": {\"quant_method\": \"fp8\"},\n  "
			   "\"dtype\": \"bfloat16\",\n  \"a\": 1\n}");
	expect_render_with("qwen2", q, "{\"a\": 1, \"quantization_config\": {\"bits\": 4}, "
			   "\"dtype\": null}",
			   "{\"a\": 1, \"quantization_config\": {\"quant_method\": \"fp8\"}, "
			   "\"dtype\": \"bfloat16\"}");
	expect_render_with("qwen2", q, "{}", "{\n  \"torch_dtype\": \"bfloat16\",\n  "
			   "\"quantization_config\": {\"quant_method\": \"fp8\"}}");
}

int main(void)
{
	RUN(test_transformers_releases);
	RUN(test_dtype_values_replaced_in_place);
	RUN(test_sub_configs);
	RUN(test_dropped_keys);
	RUN(test_quantization);
	return test_summary();
}
