/* SPDX-License-Identifier: MIT */
/*
 * The tokenizer of the GGUF view: what convert_hf_to_gguf.py's
 * SentencePiece path (and gguf-py's SpecialVocab) write, made from the
 * checkpoint's own files. tokenizer.model is read by a small protobuf
 * reader that knows exactly the fields the converter uses (each piece's
 * text, score and type) and refuses anything it does not expect; files
 * that would change the converter's output in ways ckfs does not follow
 * (tokenizer.json, added tokens, template files) are refused by name.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/json.h"
#include "folder/gguf_int.h"

#define SP_MAX_BYTES (64u << 20) /* a 256k-piece model is ~5 MB */
#define SP_MAX_PIECES (1u << 22)

/* SentencePiece's piece types; the converter keeps UNKNOWN, CONTROL,
 * UNUSED and BYTE and writes every other piece as NORMAL. */
enum { SP_NORMAL = 1, SP_UNKNOWN = 2, SP_CONTROL = 3, SP_USER = 4, SP_UNUSED = 5, SP_BYTE = 6 };

struct piece {
	const char *text;
	size_t len;
	float score;
	int type;
};

struct pb {
	const unsigned char *p, *end;
};

static bool varint(struct pb *r, uint64_t *v)
{
	*v = 0;
	for (int shift = 0; shift < 64; shift += 7) {
		if (r->p == r->end)
			return false;
		unsigned char c = *r->p++;
		*v |= (uint64_t)(c & 0x7f) << shift;
		if (!(c & 0x80))
			return true;
	}
	return false;
}

/* A length-delimited field's bytes. */
static bool bytes(struct pb *r, struct pb *out)
{
	uint64_t n;
	if (!varint(r, &n) || n > (uint64_t)(r->end - r->p))
		return false;
	out->p = r->p;
	out->end = r->p + n;
	r->p += n;
	return true;
}

static const char *read_piece(struct pb *r, struct piece *pc)
{
	bool have_text = false;

	*pc = (struct piece){ .type = SP_NORMAL };
	while (r->p < r->end) {
		uint64_t tag, v;
		struct pb s;
		if (!varint(r, &tag))
			return "a truncated field";
		switch (tag) {
		case 1 << 3 | 2: /* piece */
			if (!bytes(r, &s))
				return "a truncated piece";
			if (memchr(s.p, 0, (size_t)(s.end - s.p)))
				return "a piece holding a NUL byte";
			pc->text = (const char *)s.p;
			pc->len = (size_t)(s.end - s.p);
			have_text = true;
			break;
		case 2 << 3 | 5: /* score, a little-endian float */
			if (r->end - r->p < 4)
				return "a truncated score";
			memcpy(&pc->score, r->p, 4);
			r->p += 4;
			break;
		case 3 << 3 | 0: /* type */
			if (!varint(r, &v) || v < SP_NORMAL || v > SP_BYTE)
				return "a piece type other than 1-6";
			pc->type = (int)v;
			break;
		default:
			return "a piece field it does not know";
		}
	}
	return have_text ? NULL : "a piece without text";
}

/* The pieces of a ModelProto: field 1, repeated; fields 2-5 (trainer,
 * normalizer, self-test and denormalizer specs) are skipped, as the
 * converter never reads them; anything else is refused. */
static enum ckfs_code parse_model(const char *path, const unsigned char *data, size_t len,
				  struct piece **out, size_t *n, struct ckfs_error *err)
{
	struct pb r = { data, data + len };
	size_t cap = 0;
	const char *why = NULL;

	*out = NULL;
	*n = 0;
	while (r.p < r.end && !why) {
		uint64_t tag;
		struct pb s;
		if (!varint(&r, &tag) || (tag & 7) != 2 || (tag >> 3) < 1 || (tag >> 3) > 5) {
			why = "a field that is not one of SentencePiece's ModelProto";
			break;
		}
		if (!bytes(&r, &s)) {
			why = "a truncated field";
			break;
		}
		if (tag >> 3 != 1)
			continue;
		if (*n == SP_MAX_PIECES) {
			free(*out);
			return ckfs_fail(err, CKFS_E_LIMIT, "'%s': more than %u pieces", path,
					 SP_MAX_PIECES);
		}
		if (*n == cap) {
			size_t c = cap ? cap * 2 : 1024;
			struct piece *p = realloc(*out, c * sizeof(*p));
			if (!p) {
				free(*out);
				return ckfs_nomem(err);
			}
			*out = p;
			cap = c;
		}
		why = read_piece(&s, &(*out)[(*n)++]);
	}
	if (!why && *n == 0)
		why = "no pieces";
	if (why) {
		free(*out);
		*out = NULL;
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': not a SentencePiece model ckfs "
				 "reads: %s", path, why);
	}
	return CKFS_OK;
}

/* Files whose presence changes what the converter writes in ways this
 * view does not follow. */
static const char *const refused_files[] = {
	"added_tokens.json", "chat_template.json", "additional_chat_templates",
	"modules.json",      "tekken.json",
};

/* The special token types SpecialVocab reads from config.json, in its
 * order, with the keys it writes (cls has none: it is dropped). */
static const struct {
	const char *type, *key;
} specials[] = {
	{ "bos", "tokenizer.ggml.bos_token_id" },
	{ "eos", "tokenizer.ggml.eos_token_id" },
	{ "unk", "tokenizer.ggml.unknown_token_id" },
	{ "sep", "tokenizer.ggml.seperator_token_id" },
	{ "pad", "tokenizer.ggml.padding_token_id" },
	{ "cls", NULL },
	{ "mask", "tokenizer.ggml.mask_token_id" },
};

static enum ckfs_code special_ids(const struct ckfs_model *m, const cJSON *config,
				  int64_t n_vocab, struct gguf_kv *kv, struct ckfs_error *err)
{
	for (size_t i = 0; i < sizeof(specials) / sizeof(specials[0]); i++) {
		char name[32];
		snprintf(name, sizeof(name), "%s_token_id", specials[i].type);
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(config, name);
		if (!v || cJSON_IsNull(v))
			continue;
		if (cJSON_IsArray(v))
			continue; /* a list of ids: not an int, skipped as SpecialVocab does */
		int64_t id;
		if (!ckfs_json_whole(v, INT64_MAX, &id))
			return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': %s is not a token id "
					 "(GGUF view)", m->config_path, name);
		if (id >= n_vocab || !specials[i].key)
			continue; /* out of range: SpecialVocab skips it too */
		gguf_kv_u32(kv, specials[i].key, (uint32_t)id);
	}
	return CKFS_OK;
}

/* tokenizer_config.json's add_bos/eos/sep_token flags and chat template
 * (its own, else chat_template.jinja's, as SpecialVocab picks them; none
 * without a non-empty tokenizer_config.json); anything there that changes
 * the converter's vocabulary is refused. */
static enum ckfs_code tokenizer_config(const struct ckfs_model *m, struct ckfs_gguf_file *g,
				       const cJSON *tc, struct gguf_kv *kv,
				       struct ckfs_error *err)
{
	static const char *const adds[] = { "bos", "eos", "sep" };

	if (!tc || !tc->child)
		return CKFS_OK;
	const cJSON *hybrid = cJSON_GetObjectItemCaseSensitive(tc, "tokenizer_class");
	if (cJSON_IsString(hybrid) && strcmp(hybrid->valuestring, "HybridDNATokenizer") == 0)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "tokenizer_config.json: the "
				 "HybridDNATokenizer is not reproduced by the GGUF view");
	for (size_t i = 0; i < sizeof(adds) / sizeof(adds[0]); i++) {
		char name[32], k[48];
		snprintf(name, sizeof(name), "add_%s_token", adds[i]);
		snprintf(k, sizeof(k), "tokenizer.ggml.add_%s_token", adds[i]);
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(tc, name);
		if (cJSON_IsBool(v))
			gguf_kv_bool(kv, k, cJSON_IsTrue(v));
	}
	const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(tc, "chat_template");
	if (tmpl) {
		if (cJSON_IsNull(tmpl))
			return CKFS_OK;
		if (!cJSON_IsString(tmpl))
			return ckfs_fail(err, CKFS_E_UNSUPPORTED, "tokenizer_config.json: a "
					 "chat_template that is not one string is not reproduced by "
					 "the GGUF view");
		gguf_kv_str(kv, "tokenizer.chat_template", tmpl->valuestring);
		return CKFS_OK;
	}
	char *text;
	size_t len;
	CKFS_TRY(gguf_side_file(m, g, "chat_template.jinja", CKFS_MAX_JSON_BYTES, &text, &len,
				err));
	if (text && memchr(text, 0, len)) {
		free(text);
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "chat_template.jinja: a NUL byte");
	}
	if (text)
		gguf_kv_str(kv, "tokenizer.chat_template", text);
	free(text);
	return CKFS_OK;
}

/* Added tokens that the converter makes CONTROL although not marked
 * special (does_token_look_special). */
bool gguf_looks_special(const char *t)
{
	static const char *const exact[] = { "<pad>", "<mask>", "<2mass>", "[@BOS@]" };
	static const char *const around[][2] = {
		{ "<|", "|>" }, { "<\xef\xbd\x9c", "\xef\xbd\x9c>" }, { "<unused", ">" },
	};
	size_t n = strlen(t);

	for (size_t i = 0; i < sizeof(exact) / sizeof(exact[0]); i++)
		if (strcmp(t, exact[i]) == 0)
			return true;
	for (size_t i = 0; i < sizeof(around) / sizeof(around[0]); i++) {
		size_t a = strlen(around[i][0]), z = strlen(around[i][1]);
		if (n >= a && n >= z && memcmp(t, around[i][0], a) == 0 &&
		    memcmp(t + n - z, around[i][1], z) == 0)
			return true;
	}
	return false;
}

/* text with SentencePiece's U+2581 made spaces, in the arena. */
const char *gguf_spaces(struct ckfs_arena *ar, const char *text, size_t *len)
{
	size_t n = strlen(text), k = 0;
	char *out = ckfs_arena_alloc(ar, n + 1);

	for (size_t i = 0; out && i < n; i++) {
		if (i + 3 <= n && memcmp(text + i, "\xe2\x96\x81", 3) == 0) {
			out[k++] = ' ';
			i += 2;
		} else {
			out[k++] = text[i];
		}
	}
	if (out)
		out[k] = '\0';
	*len = k;
	return out;
}

/* tokenizer_config.json's added_tokens_decoder over the table, as the
 * converter applies it: score -1000, CONTROL when special or looking so,
 * else USER_DEFINED with U+2581 made spaces; ids past the model skipped. */
static enum ckfs_code added_tokens(const cJSON *tc, struct piece *tok, int64_t n_vocab,
				   struct ckfs_arena *ar, struct ckfs_error *err)
{
	const cJSON *dec = tc ? cJSON_GetObjectItemCaseSensitive(tc, "added_tokens_decoder") : NULL;

	if (!dec || cJSON_IsNull(dec))
		return CKFS_OK;
	if (!cJSON_IsObject(dec))
		goto bad;
	for (const cJSON *e = dec->child; e; e = e->next) {
		const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
		const cJSON *special = cJSON_GetObjectItemCaseSensitive(e, "special");
		char *end;
		errno = 0;
		long long id = strtoll(e->string, &end, 10);
		if (errno || end == e->string || *end || id < 0 || !cJSON_IsString(content) ||
		    (special && !cJSON_IsBool(special)))
			goto bad;
		if (id >= n_vocab)
			continue;
		struct piece *p = &tok[id];
		p->score = -1000.0f;
		if (cJSON_IsTrue(special) || gguf_looks_special(content->valuestring)) {
			p->type = SP_CONTROL;
			p->text = content->valuestring;
			p->len = strlen(p->text);
		} else {
			p->type = SP_USER;
			if (!(p->text = gguf_spaces(ar, content->valuestring, &p->len)))
				return ckfs_nomem(err);
		}
	}
	return CKFS_OK;
bad:
	return ckfs_fail(err, CKFS_E_UNSUPPORTED, "tokenizer_config.json: an "
			 "added_tokens_decoder the GGUF view does not read");
}

/* The converter's token table: the pieces (USER_DEFINED written NORMAL, as
 * SentencePieceProcessor reports them), [PADn] for ids past them. */
static enum ckfs_code token_table(const struct piece *pc, size_t n, int64_t n_vocab,
				  struct ckfs_arena *ar, struct piece **out,
				  struct ckfs_error *err)
{
	struct piece *tok = ckfs_arena_calloc(ar, (size_t)n_vocab + 1, sizeof(*tok));

	if (!tok)
		return ckfs_nomem(err);
	for (int64_t i = 0; i < n_vocab; i++) {
		if ((size_t)i < n) {
			tok[i] = pc[i];
			if (tok[i].type == SP_USER)
				tok[i].type = SP_NORMAL;
			continue;
		}
		char *t = ckfs_arena_printf(ar, "[PAD%lld]", (long long)i);
		if (!t)
			return ckfs_nomem(err);
		tok[i] = (struct piece){ t, strlen(t), -10000.0f, SP_UNUSED };
	}
	*out = tok;
	return CKFS_OK;
}

static void put_tokens(struct gguf_kv *kv, const struct piece *tok, int64_t n)
{
	gguf_kv_array(kv, "tokenizer.ggml.tokens", GGUF_STRING, (uint64_t)n);
	for (int64_t i = 0; i < n; i++)
		gguf_put_str(&kv->b, tok[i].text, tok[i].len);
	gguf_kv_array(kv, "tokenizer.ggml.scores", GGUF_FLOAT32, (uint64_t)n);
	for (int64_t i = 0; i < n; i++)
		ckfs_strbuf_put(&kv->b, (const char *)&tok[i].score, 4);
	gguf_kv_array(kv, "tokenizer.ggml.token_type", GGUF_INT32, (uint64_t)n);
	for (int64_t i = 0; i < n; i++) {
		int32_t t = tok[i].type;
		ckfs_strbuf_put(&kv->b, (const char *)&t, 4);
	}
}

static bool has_tokenizer_json(const struct ckfs_model *m)
{
	char path[4096];

	if (!m->hf_dir)
		return false;
	snprintf(path, sizeof(path), "%s/tokenizer.json", m->hf_dir);
	return ckfs_path_exists(path);
}

/* LlamaModel.set_vocab writes add_prefix_space before the vocabulary. */
static enum ckfs_code space_prefix(const cJSON *tc, struct gguf_kv *kv, struct ckfs_error *err)
{
	const cJSON *v = tc ? cJSON_GetObjectItemCaseSensitive(tc, "add_prefix_space") : NULL;

	if (cJSON_IsBool(v))
		gguf_kv_bool(kv, "tokenizer.ggml.add_space_prefix", cJSON_IsTrue(v));
	else if (v && !cJSON_IsNull(v))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "tokenizer_config.json: "
				 "add_prefix_space is not true or false");
	return CKFS_OK;
}

/* No tokenizer.model: the converter's GPT-2 path (gguf_bpe.c) from
 * tokenizer.json. Llama's tries LlamaHfVocab first, which takes only
 * BPE with byte fallback; gguf_pre.c refuses that. */
static enum ckfs_code bpe(const struct ckfs_model *m, struct ckfs_gguf_file *g, const cJSON *config,
			  int64_t n_vocab, bool llama, struct gguf_kv *kv, struct ckfs_error *err)
{
	char *text;
	size_t len;
	cJSON *tc = NULL;
	const char *where = m->hf_dir ? m->hf_dir : m->src_dir;

	CKFS_TRY(gguf_side_file(m, g, "tokenizer.json", CKFS_MAX_JSON_BYTES, &text, &len, err));
	if (!text)
		return ckfs_fail(
			err, CKFS_E_UNSUPPORTED,
			"'%s': no tokenizer.model or "
			"tokenizer.json: the GGUF view serves SentencePiece and byte-level "
			"BPE tokenizers only",
			where);
	char *path = ckfs_arena_printf(&g->arena, "%s/tokenizer.json", where);
	enum ckfs_code rc = path ? CKFS_OK : ckfs_nomem(err);
	if (rc == CKFS_OK)
		rc = gguf_side_json(m, g, "tokenizer_config.json", &tc, err);
	if (rc == CKFS_OK && llama)
		rc = space_prefix(tc, kv, err);
	if (rc == CKFS_OK)
		rc = gguf_bpe_vocab(m, g, config, tc, n_vocab, path, text, len, kv, err);
	cJSON_Delete(tc);
	free(text);
	return rc;
}

enum ckfs_code gguf_vocab(const struct ckfs_model *m, struct ckfs_gguf_file *g, const cJSON *config,
			  int64_t n_vocab, bool llama, bool bpe_only, struct gguf_kv *kv,
			  struct ckfs_error *err)
{
	char *data = NULL;
	size_t len;
	struct piece *pc = NULL;
	size_t n = 0;
	cJSON *tc = NULL;
	enum ckfs_code rc;

	for (size_t i = 0; i < sizeof(refused_files) / sizeof(refused_files[0]); i++) {
		char path[4096];
		snprintf(path, sizeof(path), "%s/%s", m->hf_dir ? m->hf_dir : "", refused_files[i]);
		if (m->hf_dir && ckfs_path_exists(path))
			return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': the GGUF view does not "
					 "reproduce what the converter makes of this file", path);
	}
	CKFS_TRY(gguf_side_file(m, g, "tokenizer.model", SP_MAX_BYTES, &data, &len, err));
	if (!data)
		return bpe(m, g, config, n_vocab, llama, kv, err);
	if (bpe_only) {
		free(data);
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': the converter reads this architecture's tokenizer "
				 "from tokenizer.json (byte-level BPE) only",
				 g->from[g->n_from - 1].path);
	}
	if (has_tokenizer_json(m))
		rc = ckfs_fail(err, CKFS_E_UNSUPPORTED,
			       "'%s/tokenizer.json': the GGUF view does "
			       "not reproduce what the converter makes of it beside a "
			       "tokenizer.model",
			       m->hf_dir);
	else
		rc = parse_model(g->from[g->n_from - 1].path, (const unsigned char *)data, len, &pc,
				 &n, err);
	if (rc == CKFS_OK)
		rc = gguf_side_json(m, g, "tokenizer_config.json", &tc, err);
	if (rc == CKFS_OK && llama) {
		/* LlamaModel.set_vocab writes this one before the vocabulary */
		const cJSON *v = tc ? cJSON_GetObjectItemCaseSensitive(tc, "add_prefix_space") : NULL;
		if (cJSON_IsBool(v))
			gguf_kv_bool(kv, "tokenizer.ggml.add_space_prefix", cJSON_IsTrue(v));
		else if (v && !cJSON_IsNull(v))
			rc = ckfs_fail(err, CKFS_E_UNSUPPORTED, "tokenizer_config.json: "
				       "add_prefix_space is not true or false");
	}
	struct piece *tok = NULL;
	struct ckfs_arena ar;
	ckfs_arena_init(&ar); /* the table's strings, until they are copied */
	if (rc == CKFS_OK)
		rc = token_table(pc, n, n_vocab, &ar, &tok, err);
	if (rc == CKFS_OK)
		rc = added_tokens(tc, tok, n_vocab, &ar, err);
	if (rc == CKFS_OK) {
		gguf_kv_str(kv, "tokenizer.ggml.model", "llama");
		gguf_kv_str(kv, "tokenizer.ggml.pre", "default");
		put_tokens(kv, tok, n_vocab);
		rc = special_ids(m, config, n_vocab, kv, err);
	}
	if (rc == CKFS_OK)
		rc = tokenizer_config(m, g, tc, kv, err);
	ckfs_arena_release(&ar);
	cJSON_Delete(tc);
	free(pc);
	free(data);
	return rc;
}
