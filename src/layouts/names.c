/* SPDX-License-Identifier: MIT */
/*
 * Hugging Face names from torch state-dict keys: the one name rule of every
 * layout whose keys come from a torch module (verl FSDP rank files, DCP
 * folders, Hugging Face safetensors folders; formats.md "Wrapper names").
 *
 * A module wrapped for training carries its wrappers in its keys:
 * FSDP1's "_fsdp_wrapped_module", activation checkpointing's
 * "_checkpoint_wrapped_module", torch.compile's "_orig_mod" (anywhere in
 * the key: blocks are wrapped and compiled one by one), and DDP's
 * "module" in front of every key. None of them is a name a Hugging Face
 * model registers (a leading underscore; "module" only when every key has
 * it, as DDP gives it to all), so they are removed, with one warning
 * counting the names changed. Two keys that become one name are refused
 * naming both (serving either would be a guess), and so is an FSDP1 flat
 * parameter ("flat_param", "_flat_param": many parameters flattened into
 * one vector, which no name rule can take apart).
 *
 * A Hugging Face safetensors folder holding PEFT (LoRA) names is refused:
 * such a folder is an adapter or a wrapped model, and neither is a model
 * to serve as stored. The names a module holds in memory (FSDP, DCP,
 * DeepSpeed) go on to peft.c and hf_save.c instead.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layouts/layouts.h"

/* Segments that only wrappers register, anywhere in a key. */
static const char *const wrapper_segments[] = {
	"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod",
};
enum { N_WRAPPERS = sizeof(wrapper_segments) / sizeof(wrapper_segments[0]) };

static const char ddp_prefix[] = "module.";

/* PEFT's segments around a LoRA layer, and its wrapper prefix. */
static const char *const peft_segments[] = {
	"base_layer", "lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B",
	"lora_magnitude_vector",
};

int ckfs_name_has_segment(const char *key, const char *seg)
{
	size_t l = strlen(seg);

	for (const char *p = key; (p = strstr(p, seg)); p++)
		if ((p == key || p[-1] == '.') && (p[l] == '.' || p[l] == '\0'))
			return 1;
	return 0;
}

static int is_wrapper(const char *seg, size_t len, unsigned *seen)
{
	for (int i = 0; i < N_WRAPPERS; i++)
		if (strlen(wrapper_segments[i]) == len &&
		    memcmp(seg, wrapper_segments[i], len) == 0) {
			*seen |= 1u << i;
			return 1;
		}
	return 0;
}

/* key without its wrapper segments, into out (at least strlen(key) + 1
 * bytes). */
static void strip_wrappers(const char *key, char *out, unsigned *seen)
{
	size_t n = 0;

	for (const char *p = key;;) {
		const char *dot = strchr(p, '.');
		size_t len = dot ? (size_t)(dot - p) : strlen(p);
		if (!is_wrapper(p, len, seen)) {
			if (n)
				out[n++] = '.';
			memcpy(out + n, p, len);
			n += len;
		}
		if (!dot)
			break;
		p = dot + 1;
	}
	out[n] = '\0';
}

static int cmp_by_name(const void *a, const void *b, void *ctx)
{
	const char *const *names = ctx;
	return strcmp(names[*(const size_t *)a], names[*(const size_t *)b]);
}

/* Two different keys that became one name: refused naming both. */
static enum ckfs_code check_collisions(const char *label, const char *const *keys,
				       const char **names, size_t n, struct ckfs_error *err)
{
	size_t *order = malloc((n ? n : 1) * sizeof(*order));
	enum ckfs_code rc = CKFS_OK;

	if (!order)
		return ckfs_nomem(err);
	for (size_t i = 0; i < n; i++)
		order[i] = i;
	qsort_r(order, n, sizeof(*order), cmp_by_name, names);
	for (size_t i = 1; i < n && rc == CKFS_OK; i++) {
		size_t a = order[i - 1], b = order[i];
		if (strcmp(names[a], names[b]) == 0 && strcmp(keys[a], keys[b]) != 0)
			rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': '%s' and '%s' both name '%s' "
				       "once torch wrapper names are removed", label,
				       a < b ? keys[a] : keys[b], a < b ? keys[b] : keys[a],
				       names[a]);
	}
	free(order);
	return rc;
}

/* A PEFT name in a safetensors folder (see the top of this file). */
static enum ckfs_code check_not_peft(const char *label, const char *name,
				     struct ckfs_error *err)
{
	int peft = strncmp(name, "base_model.model.", 17) == 0;
	for (size_t i = 0; !peft && i < sizeof(peft_segments) / sizeof(peft_segments[0]); i++)
		peft = ckfs_name_has_segment(name, peft_segments[i]);
	if (peft)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': '%s' is a PEFT (LoRA) name: "
				 "a LoRA adapter or a wrapped model, not a model to serve",
				 label, name);
	return CKFS_OK;
}

enum ckfs_code ckfs_hf_names(struct ckfs_model *m, const char *label, const char *const *keys,
			     const char **names, size_t n, bool in_memory,
			     struct ckfs_error *err)
{
	unsigned seen = 0;
	size_t changed = 0;
	int ddp = n > 0;

	for (size_t i = 0; i < n; i++)
		if (ckfs_name_has_segment(keys[i], "flat_param") || ckfs_name_has_segment(keys[i], "_flat_param"))
			return ckfs_fail(err, CKFS_E_UNSUPPORTED,
					 "'%s': '%s' is an FSDP1 flat parameter (the module's "
					 "parameters flattened into one vector, as LOCAL_STATE_DICT "
					 "or the wrapped module's own parameters hold them); save "
					 "the state dict with StateDictType.SHARDED_STATE_DICT",
					 label, keys[i]);
	for (size_t i = 0; i < n; i++) {
		char *out = ckfs_arena_alloc(&m->arena, strlen(keys[i]) + 1);
		if (!out)
			return ckfs_nomem(err);
		strip_wrappers(keys[i], out, &seen);
		names[i] = out;
		ddp &= strncmp(out, ddp_prefix, sizeof(ddp_prefix) - 1) == 0;
	}
	for (size_t i = 0; i < n; i++) {
		if (ddp)
			names[i] += sizeof(ddp_prefix) - 1;
		if (strcmp(names[i], keys[i]) == 0) {
			names[i] = keys[i];
			continue;
		}
		if (!names[i][0])
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': '%s' names nothing once "
					 "torch wrapper names are removed", label, keys[i]);
		changed++;
	}
	for (size_t i = 0; !in_memory && i < n; i++)
		CKFS_TRY(check_not_peft(label, names[i], err));
	CKFS_TRY(check_collisions(label, keys, names, n, err));
	if (!changed)
		return CKFS_OK;
	char which[160] = "";
	for (int i = 0; i < N_WRAPPERS; i++)
		if (seen & (1u << i))
			snprintf(which + strlen(which), sizeof(which) - strlen(which), "%s%s.",
				 which[0] ? ", " : "", wrapper_segments[i]);
	if (ddp)
		snprintf(which + strlen(which), sizeof(which) - strlen(which), "%s%s",
			 which[0] ? ", " : "", "leading module.");
	return ckfs_model_warn(m, err, "%zu of %zu tensor names carried torch wrapper names "
			       "(%s), served without them", changed, n, which);
}

/* The names a tied lm_head.weight shares its parameter with, first
 * registered: causal LMs, and vision-language models held in memory. */
static const char *const tied_embeddings[] = {
	"model.embed_tokens.weight", "model.language_model.embed_tokens.weight",
};

enum ckfs_code ckfs_model_drop_tied(struct ckfs_model *m, struct ckfs_error *err)
{
	size_t head = SIZE_MAX;
	const char *embed = NULL;

	if (!m->tie_word_embeddings)
		return CKFS_OK;
	for (size_t i = 0; i < m->n_tensors; i++) {
		const char *name = m->tensors[i].name;
		for (size_t k = 0; k < sizeof(tied_embeddings) / sizeof(tied_embeddings[0]); k++)
			if (strcmp(name, tied_embeddings[k]) == 0)
				embed = tied_embeddings[k];
		if (strcmp(name, "lm_head.weight") == 0)
			head = i;
	}
	if (!embed || head == SIZE_MAX)
		return CKFS_OK;
	memmove(&m->tensors[head], &m->tensors[head + 1],
		(m->n_tensors - head - 1) * sizeof(*m->tensors));
	m->n_tensors--;
	return ckfs_model_warn(m, err, "lm_head.weight dropped: tied to %s "
			       "(tie_word_embeddings)", embed);
}
