/* SPDX-License-Identifier: MIT */
/*
 * lora_adapter/adapter_config.json as verl 0.9.1's merger writes it:
 * peft.LoraConfig(r, lora_alpha, target_modules[, task_type]).to_dict()
 * with the pinned peft (0.21.2), enums as their values, through Python's
 * json.dump(indent=4, ensure_ascii=False), no newline at the end. Every key
 * but those four (and use_rslora, which ckfs sets with --rslora) is peft's
 * default, in peft's order. target_modules is sorted (verl lists a Python
 * set, whose order changes from run to run).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/folder.h"

struct text {
	char *p;
	size_t len, cap;
	int failed;
};

static void put(struct text *t, const char *s)
{
	size_t n = strlen(s);

	if (t->failed)
		return;
	if (t->len + n + 1 > t->cap) {
		size_t cap = t->cap ? t->cap : 2048;
		while (cap < t->len + n + 1)
			cap *= 2;
		char *p = realloc(t->p, cap);
		if (!p) {
			t->failed = 1;
			return;
		}
		t->p = p;
		t->cap = cap;
	}
	memcpy(t->p + t->len, s, n + 1);
	t->len += n;
}

/* A JSON string as json.dump(ensure_ascii=False) writes it. */
static void put_string(struct text *t, const char *s)
{
	char esc[8];

	put(t, "\"");
	for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
		switch (*c) {
		case '"': put(t, "\\\""); break;
		case '\\': put(t, "\\\\"); break;
		case '\n': put(t, "\\n"); break;
		case '\r': put(t, "\\r"); break;
		case '\t': put(t, "\\t"); break;
		case '\b': put(t, "\\b"); break;
		case '\f': put(t, "\\f"); break;
		default:
			if (*c < 0x20)
				snprintf(esc, sizeof(esc), "\\u%04x", *c);
			else
				snprintf(esc, sizeof(esc), "%c", *c);
			put(t, esc);
		}
	}
	put(t, "\"");
}

static void put_key(struct text *t, const char *key, const char *raw_value)
{
	put(t, ",\n    \"");
	put(t, key);
	put(t, "\": ");
	if (raw_value)
		put(t, raw_value);
}

/* peft 0.21.2's defaults after target_modules, in its order. */
static const char *const defaults_after_alpha[][2] = {
	{ "lora_dropout", "0.0" }, { "fan_in_fan_out", "false" }, { "bias", "\"none\"" },
};
static const char *const defaults_after_rslora[][2] = {
	{ "modules_to_save", "null" }, { "init_lora_weights", "true" },
	{ "layers_to_transform", "null" }, { "layers_pattern", "null" },
	{ "rank_pattern", "{}" }, { "alpha_pattern", "{}" }, { "megatron_config", "null" },
	{ "megatron_core", "\"megatron.core\"" }, { "trainable_token_indices", "null" },
	{ "loftq_config", "{}" }, { "eva_config", "null" }, { "corda_config", "null" },
	{ "lora_ga_config", "null" }, { "use_dora", "false" }, { "velora_config", "null" },
	{ "alora_invocation_tokens", "null" }, { "use_qalora", "false" },
	{ "qalora_group_size", "16" }, { "monteclora_config", "null" },
	{ "layer_replication", "null" }, { "lora_bias", "false" },
	{ "target_parameters", "null" }, { "use_bdlora", "null" }, { "arrow_config", "null" },
	{ "kasa_config", "null" }, { "ensure_weight_tying", "false" },
};

enum ckfs_code ckfs_render_adapter_config(const struct ckfs_lora *l, char **out,
					  size_t *out_len, struct ckfs_error *err)
{
	struct text t = { 0 };
	char num[32];

	put(&t, "{\n    \"task_type\": ");
	if (l->task_type)
		put_string(&t, l->task_type);
	else
		put(&t, "null");
	put_key(&t, "peft_type", "\"LORA\"");
	put_key(&t, "auto_mapping", "null");
	put_key(&t, "peft_version", "\"0.21.2\"");
	put_key(&t, "base_model_name_or_path", "null");
	put_key(&t, "revision", "null");
	put_key(&t, "inference_mode", "false");
	snprintf(num, sizeof(num), "%lld", (long long)l->r);
	put_key(&t, "r", num);
	put_key(&t, "target_modules", "[");
	for (size_t i = 0; i < l->n_target_modules; i++) {
		put(&t, i ? ",\n        " : "\n        ");
		put_string(&t, l->target_modules[i]);
	}
	put(&t, "\n    ]");
	put_key(&t, "exclude_modules", "null");
	snprintf(num, sizeof(num), "%lld", (long long)l->alpha);
	put_key(&t, "lora_alpha", num);
	for (size_t i = 0; i < sizeof(defaults_after_alpha) / sizeof(defaults_after_alpha[0]); i++)
		put_key(&t, defaults_after_alpha[i][0], defaults_after_alpha[i][1]);
	put_key(&t, "use_rslora", l->rslora ? "true" : "false");
	for (size_t i = 0; i < sizeof(defaults_after_rslora) / sizeof(defaults_after_rslora[0]); i++)
		put_key(&t, defaults_after_rslora[i][0], defaults_after_rslora[i][1]);
	put(&t, "\n}");
	if (t.failed) {
		free(t.p);
		return ckfs_nomem(err);
	}
	*out = t.p;
	*out_len = t.len;
	return CKFS_OK;
}
