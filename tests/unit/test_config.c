/* SPDX-License-Identifier: MIT */
/*
 * config.json as served (ckfs_render_config): only the values of the
 * top-level "torch_dtype" and "dtype" keys change, whatever they held, and
 * the file keeps one key of each name (a second one would make Python's
 * json and cJSON read two different files).
 */
#include <stdlib.h>
#include <string.h>

#include "ckfs/folder.h"
#include "test.h"

static void expect_render(const char *in, const char *want)
{
	struct ckfs_error err;
	char *out = NULL;
	size_t n = 0;

	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_render_config(in, strlen(in), "bfloat16", &out, &n, &err), CKFS_OK);
	CHECK_EQ_STR(out, want);
	CHECK_EQ_INT(n, strlen(want));
	free(out);
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
	/* Nested keys of that name are not the model's dtype. */
	expect_render("{\"text_config\": {\"dtype\": \"float32\"}, \"dtype\": \"float32\"}",
		      "{\"text_config\": {\"dtype\": \"float32\"}, \"dtype\": \"bfloat16\"}");
	/* Neither key: torch_dtype is added first. */
	expect_render("{\"a\": 1}", "{\n  \"torch_dtype\": \"bfloat16\",\"a\": 1}");
}

int main(void)
{
	RUN(test_dtype_values_replaced_in_place);
	return test_summary();
}
