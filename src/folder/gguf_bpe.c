/* SPDX-License-Identifier: MIT */
/*
 * The byte-level BPE tokenizer of the GGUF view: what convert_hf_to_gguf.py's
 * _set_vocab_gpt2 (get_vocab_base, then gguf-py's SpecialVocab with merges)
 * writes from tokenizer.json (Qwen2's, Llama 3's, DeepSeek-V3's), made from the
 * checkpoint's own files. transformers' Qwen2Tokenizer, which the converter
 * loads, builds its pipeline itself from the vocab and merges; ckfs takes
 * only tokenizer.json files whose pipeline is that one (gguf_pre.c) and
 * refuses what would make transformers add or retype tokens.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/arena.h"
#include "ckfs/json.h"
#include "folder/gguf_int.h"

enum {
	TT_NORMAL = 1,
	TT_CONTROL = 3,
	TT_USER = 4,
	TT_UNUSED = 5
};

struct tok {
	const char *text;
	int type;
	bool set;
};

static const char *str(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The content of a special token entry of tokenizer_config.json (a string
 * or an object with a content string), as SpecialVocab reads it. */
static const char *entry_content(const cJSON *e)
{
	if (cJSON_IsString(e))
		return e->valuestring;
	return cJSON_IsObject(e) ? str(e, "content") : NULL;
}

static const cJSON *added_by_content(const cJSON *added, const char *content)
{
	for (const cJSON *a = added ? added->child : NULL; a; a = a->next)
		if (str(a, "content") && strcmp(str(a, "content"), content) == 0)
			return a;
	return NULL;
}

/* transformers' Qwen2Tokenizer adds its special tokens (unk, eos and pad
 * default to <|endoftext|>) and any extra ones as tokens when they are not
 * already added tokens; that changes the table, so it is refused. Its
 * added_tokens_decoder must say what tokenizer.json says. */
static const char *config_checks(const cJSON *tc, const cJSON *added,
				 const struct gguf_bpe_seen *seen)
{
	static const char *const types[] = { "bos", "eos", "unk", "sep", "pad", "cls", "mask" };
	const char *cls = str(tc, "tokenizer_class");
	bool qwen2 = cls &&
		     (strcmp(cls, "Qwen2Tokenizer") == 0 || strcmp(cls, "Qwen2TokenizerFast") == 0);
	bool llama = cls && strcmp(cls, "LlamaTokenizerFast") == 0;

	/* PreTrainedTokenizerFast runs tokenizer.json as it is; Qwen2Tokenizer
	 * builds Qwen2's pipeline, which the file must then be;
	 * LlamaTokenizerFast its own post-processor (gguf_pre.c runs it) */
	if (!qwen2 && !llama && !(cls && strcmp(cls, "PreTrainedTokenizerFast") == 0))
		return "tokenizer_config.json's tokenizer_class is not Qwen2Tokenizer, "
		       "LlamaTokenizerFast or PreTrainedTokenizerFast";
	if (qwen2 && (!seen->qwen2_regex || seen->bos || seen->ignore_merges))
		return "a pipeline other than the one Qwen2Tokenizer builds";
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		char k[32];
		snprintf(k, sizeof(k), "%s_token", types[i]);
		const cJSON *e = cJSON_GetObjectItemCaseSensitive(tc, k);
		const char *c = e ? entry_content(e) : NULL;
		if (!e && qwen2 &&
		    (strcmp(types[i], "eos") == 0 || strcmp(types[i], "unk") == 0 ||
		     strcmp(types[i], "pad") == 0))
			c = "<|endoftext|>";
		/* LlamaTokenizerFast's defaults */
		if (!e && llama && i < 3)
			c = (const char *const[]){ "<s>", "</s>", "<unk>" }[i];
		if (e && !cJSON_IsNull(e) && !c)
			return "a special token entry that is not a string";
		if (c && !added_by_content(added, c))
			return "a special token that is not one of tokenizer.json's added tokens";
	}
	static const char *const lists[] = { "additional_special_tokens", "extra_special_tokens" };
	for (size_t i = 0; i < 2; i++) {
		const cJSON *l = cJSON_GetObjectItemCaseSensitive(tc, lists[i]);
		if (!l || cJSON_IsNull(l))
			continue;
		if (!cJSON_IsArray(l))
			return "extra special tokens that are not a list";
		for (const cJSON *e = l->child; e; e = e->next)
			if (!entry_content(e) || !added_by_content(added, entry_content(e)))
				return "an extra special token that is not one of tokenizer.json's added "
				       "tokens";
	}
	const cJSON *dec = cJSON_GetObjectItemCaseSensitive(tc, "added_tokens_decoder");
	for (const cJSON *e = cJSON_IsObject(dec) ? dec->child : NULL; e; e = e->next) {
		const char *c = str(e, "content");
		const cJSON *a = c ? added_by_content(added, c) : NULL;
		const cJSON *id = a ? cJSON_GetObjectItemCaseSensitive(a, "id") : NULL;
		char num[32];
		if (id)
			snprintf(num, sizeof(num), "%.0f", id->valuedouble);
		if (!a || !cJSON_IsNumber(id) || strcmp(num, e->string) != 0 ||
		    cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special")) !=
			    cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "special")))
			return "an added_tokens_decoder that differs from tokenizer.json's added tokens";
	}
	if (dec && !cJSON_IsNull(dec) && !cJSON_IsObject(dec))
		return "an added_tokens_decoder that is not an object";
	return NULL;
}

/* get_vocab_base's table: vocab and added tokens by id, [PADn] between. */
static const char *table(const cJSON *tokjson, int64_t n_vocab, struct ckfs_arena *ar,
			 struct tok **out)
{
	const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(
		cJSON_GetObjectItemCaseSensitive(tokjson, "model"), "vocab");
	const cJSON *added = cJSON_GetObjectItemCaseSensitive(tokjson, "added_tokens");
	struct tok *t = ckfs_arena_calloc(ar, (size_t)n_vocab + 1, sizeof(*t));

	if (!t)
		return "out of memory";
	for (const cJSON *e = vocab->child; e; e = e->next) {
		int64_t id;
		if (!ckfs_json_whole(e, INT32_MAX, &id))
			return "a vocab id that is not a whole number";
		if (id >= n_vocab)
			return "a token id past config.json's vocab_size";
		if (t[id].set)
			return "two tokens with one id";
		t[id] = (struct tok){ e->string, TT_NORMAL, true };
	}
	for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
		int64_t id;
		const char *c = str(a, "content");
		const cJSON *special = cJSON_GetObjectItemCaseSensitive(a, "special");
		if (!ckfs_json_whole(cJSON_GetObjectItemCaseSensitive(a, "id"), INT32_MAX, &id) ||
		    !c || (special && !cJSON_IsBool(special)))
			return "an added token without a whole id, content or true/false special";
		if (id >= n_vocab)
			return "a token id past config.json's vocab_size";
		if (t[id].set && (t[id].type != TT_NORMAL || strcmp(t[id].text, c) != 0))
			return "two tokens with one id";
		if (cJSON_IsTrue(special) || gguf_looks_special(c)) {
			t[id] = (struct tok){ c, TT_CONTROL, true };
		} else {
			size_t len;
			const char *s = gguf_spaces(ar, c, &len);
			if (!s)
				return "out of memory";
			t[id] = (struct tok){ s, TT_USER, true };
		}
	}
	for (int64_t i = 0; i < n_vocab; i++) {
		if (t[i].set)
			continue;
		t[i].text = ckfs_arena_printf(ar, "[PAD%lld]", (long long)i);
		t[i].type = TT_UNUSED;
		if (!t[i].text)
			return "out of memory";
	}
	*out = t;
	return NULL;
}

static void put_table(struct gguf_kv *kv, const struct tok *t, int64_t n)
{
	gguf_kv_array(kv, "tokenizer.ggml.tokens", GGUF_STRING, (uint64_t)n);
	for (int64_t i = 0; i < n; i++)
		gguf_put_str(&kv->b, t[i].text, strlen(t[i].text));
	gguf_kv_array(kv, "tokenizer.ggml.token_type", GGUF_INT32, (uint64_t)n);
	for (int64_t i = 0; i < n; i++) {
		int32_t ty = t[i].type;
		ckfs_strbuf_put(&kv->b, (const char *)&ty, 4);
	}
}

/* SpecialVocab's merges: strings as they are, pairs joined by a space
 * (gguf_pre.c has refused parts holding one). */
static void put_merges(struct gguf_kv *kv, const cJSON *tokjson)
{
	const cJSON *merges = cJSON_GetObjectItemCaseSensitive(
		cJSON_GetObjectItemCaseSensitive(tokjson, "model"), "merges");
	int n = cJSON_GetArraySize(merges);

	if (n == 0)
		return;
	gguf_kv_array(kv, "tokenizer.ggml.merges", GGUF_STRING, (uint64_t)n);
	for (const cJSON *e = merges->child; e; e = e->next) {
		if (cJSON_IsString(e)) {
			gguf_put_str(&kv->b, e->valuestring, strlen(e->valuestring));
			continue;
		}
		const char *a = e->child->valuestring, *b = e->child->next->valuestring;
		gguf_put_u64(&kv->b, strlen(a) + 1 + strlen(b));
		ckfs_strbuf_put(&kv->b, a, strlen(a));
		ckfs_strbuf_put(&kv->b, " ", 1);
		ckfs_strbuf_put(&kv->b, b, strlen(b));
	}
}

/* SpecialVocab's types, in its order, with the keys gguf-py writes for
 * their ids and add_* flags (NULL: no handler, skipped). */
static const struct {
	const char *type, *id_key, *add_key;
} specials[] = {
	{ "bos", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.add_bos_token" },
	{ "eos", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_eos_token" },
	{ "unk", "tokenizer.ggml.unknown_token_id", NULL },
	{ "sep", "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.add_sep_token" },
	{ "pad", "tokenizer.ggml.padding_token_id", NULL },
	{ "cls", NULL, NULL },
	{ "mask", "tokenizer.ggml.mask_token_id", NULL },
};
#define N_SPECIAL (sizeof(specials) / sizeof(specials[0]))

struct special_state {
	int64_t id[N_SPECIAL];
	int id_order[N_SPECIAL], n_id;
	int add[N_SPECIAL]; /* -1 unset, 0, 1 */
	int add_order[N_SPECIAL], n_add;
};

static void set_id(struct special_state *s, size_t i, int64_t id)
{
	for (int k = 0; k < s->n_id; k++)
		if (s->id_order[k] == (int)i)
			return;
	s->id[i] = id;
	s->id_order[s->n_id++] = (int)i;
}

static void set_add(struct special_state *s, size_t i, bool v, bool force)
{
	if (s->add[i] >= 0) {
		if (force)
			s->add[i] = v; /* a dict's key keeps its place */
		return;
	}
	s->add[i] = v;
	s->add_order[s->n_add++] = (int)i;
}

static const char *template_id(const cJSON *t)
{
	const cJSON *single = cJSON_GetObjectItemCaseSensitive(t, "single");
	return str(cJSON_GetObjectItemCaseSensitive(single->child, "SpecialToken"), "id");
}

/* SpecialVocab from tokenizer.json, tokenizer_config.json and config.json
 * (n_vocab not given: no range check), then its add_to_gguf after the
 * merges: ids, add_* flags, chat template. */
static enum ckfs_code special_vocab(const struct ckfs_model *m, struct ckfs_gguf_file *g,
				    const cJSON *tokjson, const cJSON *tc, const cJSON *config,
				    struct gguf_kv *kv, struct ckfs_error *err)
{
	struct special_state s = { .n_id = 0 };
	const cJSON *added = cJSON_GetObjectItemCaseSensitive(tokjson, "added_tokens");
	const cJSON *post = cJSON_GetObjectItemCaseSensitive(tokjson, "post_processor");
	const char *content[N_SPECIAL] = { 0 };
	char *tmpl = NULL;
	const char *tmpl_s = NULL;

	for (size_t i = 0; i < N_SPECIAL; i++) {
		s.add[i] = -1;
		char k[32];
		snprintf(k, sizeof(k), "%s_token", specials[i].type);
		content[i] = tc ? entry_content(cJSON_GetObjectItemCaseSensitive(tc, k)) : NULL;
		if (content[i] && !*content[i])
			content[i] = NULL;
	}
	/* an empty bos takes cls's, an empty eos sep's */
	if (tc && tc->child && !content[0] && content[5])
		content[0] = content[5];
	if (tc && tc->child && !content[1] && content[3])
		content[1] = content[3];
	/* the post-processors, as gguf_pre.c accepted them: ByteLevel, and
	 * Llama 3's template, which SpecialVocab reads as adding BOS, not SEP */
	const cJSON *procs = cJSON_GetObjectItemCaseSensitive(post, "processors");
	for (const cJSON *p = procs ? procs->child : post; cJSON_IsObject(p);
	     p = procs ? p->next : NULL) {
		const char *type = str(p, "type");
		if (type && strcmp(type, "ByteLevel") == 0) {
			set_add(&s, 0, false, false);
			set_add(&s, 1, false, false);
		} else if (type && strcmp(type, "TemplateProcessing") == 0) {
			const char *first = template_id(p);
			if (tc && tc->child &&
			    (!content[0] || strcmp(first, content[0]) != 0 ||
			     (content[3] && strcmp(first, content[3]) == 0) ||
			     (content[1] && strcmp(first, content[1]) == 0)))
				return ckfs_fail(
					err, CKFS_E_UNSUPPORTED,
					"tokenizer_config.json: a "
					"bos_token other than the template's first token is "
					"not reproduced by the GGUF view");
			set_add(&s, 0, true, true);
			set_add(&s, 3, false, true);
		}
	}
	if (tc && tc->child) {
		const cJSON *t = cJSON_GetObjectItemCaseSensitive(tc, "chat_template");
		if (t && !cJSON_IsNull(t) && !cJSON_IsString(t))
			return ckfs_fail(
				err, CKFS_E_UNSUPPORTED,
				"tokenizer_config.json: a "
				"chat_template that is not one string is not reproduced by "
				"the GGUF view");
		if (cJSON_IsString(t)) {
			tmpl_s = t->valuestring;
		} else if (!t) {
			size_t len;
			CKFS_TRY(gguf_side_file(m, g, "chat_template.jinja", CKFS_MAX_JSON_BYTES,
						&tmpl, &len, err));
			if (tmpl && memchr(tmpl, 0, len)) {
				free(tmpl);
				return ckfs_fail(err, CKFS_E_UNSUPPORTED,
						 "chat_template.jinja: a NUL "
						 "byte");
			}
			tmpl_s = tmpl;
		}
		for (size_t i = 0; i < N_SPECIAL; i++) {
			char k[32];
			snprintf(k, sizeof(k), "add_%s_token", specials[i].type);
			const cJSON *v = cJSON_GetObjectItemCaseSensitive(tc, k);
			if (cJSON_IsBool(v))
				set_add(&s, i, cJSON_IsTrue(v), false);
			const cJSON *a = content[i] ? added_by_content(added, content[i]) : NULL;
			int64_t id;
			if (a && ckfs_json_whole(cJSON_GetObjectItemCaseSensitive(a, "id"),
						 INT64_MAX, &id))
				set_id(&s, i, id);
		}
	}
	for (size_t i = 0; config && i < N_SPECIAL; i++) {
		char k[32];
		snprintf(k, sizeof(k), "%s_token_id", specials[i].type);
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(config, k);
		int64_t id;
		if (!v || cJSON_IsNull(v) || cJSON_IsArray(v))
			continue;
		if (!ckfs_json_whole(v, UINT32_MAX, &id) || cJSON_IsBool(v)) {
			free(tmpl);
			return ckfs_fail(err, CKFS_E_UNSUPPORTED,
					 "'%s': %s is not a token id "
					 "(GGUF view)",
					 m->config_path, k);
		}
		set_id(&s, i, id);
	}
	for (int k = 0; k < s.n_id; k++) {
		int i = s.id_order[k];
		if (specials[i].id_key && s.id[i] <= UINT32_MAX)
			gguf_kv_u32(kv, specials[i].id_key, (uint32_t)s.id[i]);
	}
	for (int k = 0; k < s.n_add; k++) {
		int i = s.add_order[k];
		if (specials[i].add_key)
			gguf_kv_bool(kv, specials[i].add_key, s.add[i] == 1);
	}
	if (tmpl_s)
		gguf_kv_str(kv, "tokenizer.chat_template", tmpl_s);
	free(tmpl);
	return CKFS_OK;
}

enum ckfs_code gguf_bpe_vocab(const struct ckfs_model *m, struct ckfs_gguf_file *g,
			      const cJSON *config, const cJSON *tc, int64_t n_vocab,
			      const char *path, const char *text, size_t len, struct gguf_kv *kv,
			      struct ckfs_error *err)
{
	/* cJSON ends a string at \u0000, where Python keeps the rest */
	if (memmem(text, len, "\\u0000", 6))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': a NUL character (\\u0000), which "
				 "the GGUF view does not reproduce",
				 path);
	cJSON *tokjson = cJSON_ParseWithLength(text, len);
	const char *pre = NULL, *why = NULL;
	struct tok *t = NULL;
	struct ckfs_arena ar;
	enum ckfs_code rc;

	if (!cJSON_IsObject(tokjson)) {
		cJSON_Delete(tokjson);
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': not a JSON object", path);
	}
	ckfs_arena_init(&ar);
	struct gguf_bpe_seen seen;
	rc = gguf_bpe_pre(path, tokjson, tc, &pre, &seen, err);
	if (rc == CKFS_OK) {
		why = config_checks(tc, cJSON_GetObjectItemCaseSensitive(tokjson, "added_tokens"),
				    &seen);
		if (!why)
			why = table(tokjson, n_vocab, &ar, &t);
		if (why)
			rc = ckfs_fail(err, CKFS_E_UNSUPPORTED,
				       "'%s': a BPE tokenizer the GGUF view "
				       "does not reproduce: %s",
				       path, why);
	}
	if (rc == CKFS_OK) {
		gguf_kv_str(kv, "tokenizer.ggml.model", "gpt2");
		gguf_kv_str(kv, "tokenizer.ggml.pre", pre);
		put_table(kv, t, n_vocab);
		put_merges(kv, tokjson);
		rc = special_vocab(m, g, tokjson, tc, config, kv, err);
	}
	ckfs_arena_release(&ar);
	cJSON_Delete(tokjson);
	return rc;
}
