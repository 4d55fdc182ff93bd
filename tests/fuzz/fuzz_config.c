/* SPDX-License-Identifier: MIT */
/* Fuzz target: config.json rendering (dtype keys set, keys dropped) on
 * arbitrary bytes; whatever it accepts must still be the input with only
 * string values replaced, so the output re-renders to itself. */
#include <stdlib.h>
#include <string.h>

#include "ckfs/folder.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ckfs_error err;
	char *out = NULL, *again = NULL;
	size_t n, m;

	ckfs_error_clear(&err);
	struct ckfs_config_edits e = { "bfloat16", "qwen2_vl", true, "{\"quant_method\": \"fp8\"}",
					false };

	if (ckfs_render_config((const char *)data, size, &e, &out, &n, &err) != CKFS_OK)
		return 0;
	ckfs_error_clear(&err);
	if (ckfs_render_config(out, n, &e, &again, &m, &err) != CKFS_OK ||
	    m != n || memcmp(out, again, n) != 0)
		abort(); /* rendering must be idempotent */
	free(out);
	free(again);
	return 0;
}
