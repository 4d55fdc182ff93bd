/* SPDX-License-Identifier: MIT */
/*
 * Which layer and which kind a served tensor name belongs to, for the
 * per-layer and per-kind summaries of ckfs diff and its picture. By name
 * only, as Hugging Face models name things; a name matching no rule is
 * "other", and a name without a numbered block is its own row, so nothing
 * is merged that the names do not say belongs together.
 */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "ckfs/history.h"

const char *ckfs_diff_status_name(enum ckfs_diff_status s)
{
	switch (s) {
	case CKFS_DIFF_IDENTICAL: return "identical";
	case CKFS_DIFF_CHANGED: return "changed";
	case CKFS_DIFF_SHAPE: return "shape differs";
	case CKFS_DIFF_ONLY_A: return "only in A";
	case CKFS_DIFF_ONLY_B: return "only in B";
	}
	return "?";
}

const char *ckfs_diff_kind_name(enum ckfs_diff_kind k)
{
	static const char *const names[CKFS_KIND_COUNT] = {
		"attention", "mlp", "experts", "norms", "embeddings", "other",
	};
	return k < CKFS_KIND_COUNT ? names[k] : "?";
}

/* Whether name has `part` as one whole dotted component. */
static bool has_part(const char *name, const char *part)
{
	size_t n = strlen(part);

	for (const char *p = strstr(name, part); p; p = strstr(p + 1, part))
		if ((p == name || p[-1] == '.' || p[-1] == '/') && (p[n] == '.' || p[n] == '\0'))
			return true;
	return false;
}

/* Whether some dotted component of name contains `word`. */
static bool has_word(const char *name, const char *word)
{
	return strstr(name, word) != NULL;
}

enum ckfs_diff_kind ckfs_diff_kind_of(const char *name)
{
	static const char *const attention[] = {
		"q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "query_key_value",
		"c_attn", "out_proj", NULL,
	};
	static const char *const mlp[] = {
		"gate_proj", "up_proj", "down_proj", "gate_up_proj", "fc1", "fc2", "c_fc",
		"w1", "w2", "w3", NULL,
	};

	/* before attention and mlp: experts hold gate/up/down projections and
	 * attention holds q/k norms */
	if (has_word(name, "expert") || has_part(name, "router") ||
	    (has_part(name, "mlp") && has_part(name, "gate")))
		return CKFS_KIND_EXPERTS;
	if (has_word(name, "norm") || has_word(name, "ln_"))
		return CKFS_KIND_NORM;
	if (has_word(name, "embed") || has_part(name, "lm_head") || has_part(name, "wte") ||
	    has_part(name, "wpe"))
		return CKFS_KIND_EMBEDDING;
	if (has_word(name, "attn") || has_word(name, "attention"))
		return CKFS_KIND_ATTENTION;
	for (size_t i = 0; attention[i]; i++)
		if (has_part(name, attention[i]))
			return CKFS_KIND_ATTENTION;
	if (has_part(name, "mlp") || has_part(name, "feed_forward") || has_part(name, "ffn"))
		return CKFS_KIND_MLP;
	for (size_t i = 0; mlp[i]; i++)
		if (has_part(name, mlp[i]))
			return CKFS_KIND_MLP;
	return CKFS_KIND_OTHER;
}

static const char *skip_prefix(const char *s, const char *prefix)
{
	size_t n = strlen(prefix);
	return strncmp(s, prefix, n) == 0 ? s + n : s;
}

void ckfs_diff_layer_of(const char *name, char *buf, size_t size)
{
	const char *s = skip_prefix(skip_prefix(name, "lora_adapter/"), "base_model.model.");
	const char *last = strrchr(s, '.');

	/* the first component that is a number closes the row's name */
	for (const char *p = s; *p; p++) {
		if (p != s && p[-1] != '.')
			continue;
		const char *q = p;
		while (isdigit((unsigned char)*q))
			q++;
		if (q > p && (*q == '.' || *q == '\0') && p > s) {
			snprintf(buf, size, "%.*s", (int)(q - s), s);
			return;
		}
	}
	snprintf(buf, size, "%.*s", last ? (int)(last - s) : (int)strlen(s), s);
}
