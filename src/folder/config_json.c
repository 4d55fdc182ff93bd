/* SPDX-License-Identifier: MIT */
/*
 * config.json as served (include/ckfs/folder.h): the checkpoint's text,
 * edited where verl's merger, which re-serialises it through transformers,
 * changes what a loader reads (docs/formats.md "config.json"):
 *
 *  - the dtype keys ("torch_dtype", "dtype") of the top level and of each
 *    sub-config (an object at the top level: text_config, vision_config)
 *    say the output dtype, whatever they held; with neither at the top
 *    level, "torch_dtype" is added first;
 *  - "attn_implementation" is dropped: a runtime choice verl's
 *    override_config saves into the checkpoint, not part of the model;
 *  - Qwen2-VL and Qwen2.5-VL lose their top-level bos_token_id,
 *    eos_token_id and pad_token_id when the merger's transformers does
 *    (5.10: its config class keeps those in text_config only; 5.23 keeps
 *    them at the top level too);
 *  - a block-FP8 release served dequantized loses "quantization_config";
 *  - with --dtype fp8, "quantization_config" says so (its value replaced
 *    in place, or the key added first), as transformers'
 *    FineGrainedFP8Config and vLLM read it; with --dtype w4a16 or nvfp4
 *    the same way, as compressed-tensors writes it (the view's config).
 *
 * Everything else is kept byte for byte. Keys are compared as JSON reads
 * them ("dt\u0079pe" is "dtype"), so no key escapes an edit by its spelling.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/folder.h"
#include "ckfs/strbuf.h"

/* ---- scanning ---- */

static size_t skip_ws(const char *s, size_t i, size_t n)
{
	while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
		i++;
	return i;
}

/* End of the JSON string starting at s[i] == '"'; n when unterminated. */
static size_t string_end(const char *s, size_t i, size_t n)
{
	for (i++; i < n; i++) {
		if (s[i] == '\\')
			i++;
		else if (s[i] == '"')
			return i + 1;
	}
	return n;
}

/* End of the JSON value starting at s[i]: strings and nested containers
 * are skipped whole, scalars end at a delimiter or white space. */
static size_t value_end(const char *s, size_t i, size_t n)
{
	int depth = 0;

	if (i < n && s[i] == '"')
		return string_end(s, i, n);
	for (; i < n; i++) {
		char c = s[i];
		if (c == '"') {
			i = string_end(s, i, n) - 1;
		} else if (c == '{' || c == '[') {
			depth++;
		} else if (c == '}' || c == ']') {
			if (depth == 0)
				return i;
			if (--depth == 0)
				return i + 1;
		} else if (depth == 0 && (c == ',' || c == ' ' || c == '\t' || c == '\n' ||
					  c == '\r')) {
			return i;
		}
	}
	return n;
}

struct member {
	size_t key, key_end;    /* the key's quotes included */
	size_t val, val_end;
};

struct object {
	size_t open, close;     /* the braces */
	struct member *v;
	size_t n;
};

/* The members of the object whose '{' is s[open] (scan_object). */
static enum ckfs_code scan_members(const char *s, size_t n, size_t open, struct object *o,
				   struct ckfs_error *err)
{
	size_t i = open + 1, cap = 0;

	o->open = open;
	o->v = NULL;
	o->n = 0;
	while (1) {
		i = skip_ws(s, i, n);
		if (i < n && s[i] == '}' && o->n == 0)
			break;
		if (i >= n || s[i] != '"')
			return ckfs_fail(err, CKFS_E_FORMAT, "config.json: malformed key");
		if (o->n == cap) {
			cap = cap ? 2 * cap : 16;
			struct member *v = realloc(o->v, cap * sizeof(*v));
			if (!v)
				return ckfs_nomem(err);
			o->v = v;
		}
		struct member *mb = &o->v[o->n++];
		mb->key = i;
		mb->key_end = string_end(s, i, n);
		i = skip_ws(s, mb->key_end, n);
		if (i >= n || s[i] != ':')
			return ckfs_fail(err, CKFS_E_FORMAT, "config.json: missing ':'");
		mb->val = skip_ws(s, i + 1, n);
		mb->val_end = value_end(s, mb->val, n);
		if (mb->val_end >= n)
			return ckfs_fail(err, CKFS_E_FORMAT, "config.json: truncated");
		i = skip_ws(s, mb->val_end, n);
		if (i < n && s[i] == ',') {
			i++;
			continue;
		}
		if (i < n && s[i] == '}')
			break;
		return ckfs_fail(err, CKFS_E_FORMAT, "config.json: malformed object");
	}
	o->close = i;
	return CKFS_OK;
}

/* The members of the object whose '{' is s[open]; o->v is the caller's to
 * free on success, and freed on failure. */
static enum ckfs_code scan_object(const char *s, size_t n, size_t open, struct object *o,
				  struct ckfs_error *err)
{
	enum ckfs_code rc = scan_members(s, n, open, o, err);

	if (rc != CKFS_OK) {
		free(o->v);
		o->v = NULL;
	}
	return rc;
}

/* Is the key of mb, decoded as JSON, want? Only the escapes a key of
 * interest could hide behind are decoded; others make it no match. */
static int key_is(const char *s, const struct member *mb, const char *want)
{
	size_t k = 0, w = strlen(want);

	for (size_t i = mb->key + 1; i + 1 < mb->key_end; i++, k++) {
		char c = s[i];
		if (c == '\\' && i + 5 < mb->key_end && s[i + 1] == 'u') {
			char hex[5] = { s[i + 2], s[i + 3], s[i + 4], s[i + 5], 0 };
			char *end;
			unsigned long cp = strtoul(hex, &end, 16);
			if (*end || cp == 0 || cp > 0x7f)
				return 0;
			c = (char)cp;
			i += 5;
		} else if (c == '\\') {
			if (++i + 1 >= mb->key_end)
				return 0;
			c = s[i]; /* \" \\ \/: the character itself */
			if (c != '"' && c != '\\' && c != '/')
				return 0;
		}
		if (k >= w || c != want[k])
			return 0;
	}
	return k == w;
}

static int is_dtype_key(const char *s, const struct member *mb)
{
	return key_is(s, mb, "torch_dtype") || key_is(s, mb, "dtype");
}

/* ---- rendering ---- */

static void put_dtype(struct ckfs_strbuf *o, const char *dtype)
{
	ckfs_strbuf_put(o, "\"", 1);
	ckfs_strbuf_str(o, dtype);
	ckfs_strbuf_put(o, "\"", 1);
}

/* s[from, to), a sub-config object, with the value of each dtype key
 * replaced. */
static enum ckfs_code put_sub_config(struct ckfs_strbuf *o, const char *s, size_t n, size_t from,
				     size_t to, const char *dtype, struct ckfs_error *err)
{
	struct object sub;

	CKFS_TRY(scan_object(s, n, from, &sub, err));
	for (size_t k = 0; k < sub.n; k++) {
		if (!is_dtype_key(s, &sub.v[k]))
			continue;
		ckfs_strbuf_put(o, s + from, sub.v[k].val - from);
		put_dtype(o, dtype);
		from = sub.v[k].val_end;
	}
	ckfs_strbuf_put(o, s + from, to - from);
	free(sub.v);
	return CKFS_OK;
}

/* Newest first: the default. */
static const struct ckfs_transformers_release transformers_releases[] = {
	{ "5.23", false },
	{ "5.10", true },
};

const struct ckfs_transformers_release *ckfs_transformers_release(const char *version)
{
	size_t n = sizeof(transformers_releases) / sizeof(transformers_releases[0]);

	if (!version)
		return &transformers_releases[0];
	for (size_t i = 0; i < n; i++) {
		size_t len = strlen(transformers_releases[i].release);
		if (strncmp(version, transformers_releases[i].release, len) == 0 &&
		    (version[len] == '\0' || version[len] == '.'))
			return &transformers_releases[i];
	}
	return NULL;
}

const char *ckfs_transformers_releases_known(void)
{
	return "5.10, 5.23";
}

/* Top-level keys the served file leaves out. */
static int dropped(const char *s, const struct member *mb, const struct ckfs_config_edits *e)
{
	static const char *const token_ids[] = { "bos_token_id", "eos_token_id", "pad_token_id" };
	const char *model_type = e->model_type;
	int qwen2_vl = model_type && (strcmp(model_type, "qwen2_vl") == 0 ||
				      strcmp(model_type, "qwen2_5_vl") == 0);

	if (key_is(s, mb, "attn_implementation") ||
	    (e->drop_quantization && key_is(s, mb, "quantization_config")))
		return 1;
	for (size_t i = 0; qwen2_vl && e->vl_drops_token_ids && i < 3; i++)
		if (key_is(s, mb, token_ids[i]))
			return 1;
	return 0;
}

static enum ckfs_code render(struct ckfs_strbuf *o, const char *s, size_t n,
			     const struct object *top, const struct ckfs_config_edits *e,
			     struct ckfs_error *err)
{
	const char *dtype = e->dtype;
	size_t kept = 0, done = 0;
	int has_dtype = 0, has_quant = 0;

	for (size_t k = 0; k < top->n; k++) {
		has_dtype |= is_dtype_key(s, &top->v[k]);
		has_quant |= key_is(s, &top->v[k], "quantization_config");
		kept += !dropped(s, &top->v[k], e);
	}
	ckfs_strbuf_put(o, s, top->open + 1);
	/* Added keys go first, in the file's own indentation style. */
	if (!has_dtype) {
		ckfs_strbuf_str(o, "\n  \"torch_dtype\": ");
		put_dtype(o, dtype);
		ckfs_strbuf_put(o, ",", kept || e->quantization ? 1 : 0);
	}
	if (e->quantization && !has_quant) {
		ckfs_strbuf_str(o, "\n  \"quantization_config\": ");
		ckfs_strbuf_str(o, e->quantization);
		ckfs_strbuf_put(o, ",", kept ? 1 : 0);
	}
	for (size_t k = 0; k < top->n; k++) {
		const struct member *mb = &top->v[k];
		if (dropped(s, mb, e))
			continue;
		/* What leads up to the key: the spacing before the object's
		 * first member, else the comma and spacing before this one. */
		size_t sep = done ? top->v[k - 1].val_end : top->open + 1;
		size_t sep_end = done ? mb->key : top->v[0].key;
		ckfs_strbuf_put(o, s + sep, sep_end - sep);
		ckfs_strbuf_put(o, s + mb->key, mb->val - mb->key);
		if (is_dtype_key(s, mb))
			put_dtype(o, dtype);
		else if (e->quantization && key_is(s, mb, "quantization_config"))
			ckfs_strbuf_str(o, e->quantization);
		else if (s[mb->val] == '{')
			CKFS_TRY(put_sub_config(o, s, n, mb->val, mb->val_end, dtype, err));
		else
			ckfs_strbuf_put(o, s + mb->val, mb->val_end - mb->val);
		done++;
	}
	/* After the last member (kept or not): its spacing, the brace, the
	 * rest of the file. */
	size_t tail = top->n ? top->v[top->n - 1].val_end : top->open + 1;
	ckfs_strbuf_put(o, s + tail, n - tail);
	return CKFS_OK;
}

enum ckfs_code ckfs_render_config(const char *s, size_t n, const struct ckfs_config_edits *e,
				  char **out, size_t *out_len, struct ckfs_error *err)
{
	struct object top;
	struct ckfs_strbuf o = { 0 };
	size_t i = skip_ws(s, 0, n);

	if (i >= n || s[i] != '{')
		return ckfs_fail(err, CKFS_E_FORMAT, "config.json is not a JSON object");
	CKFS_TRY(scan_object(s, n, i, &top, err));
	enum ckfs_code rc = render(&o, s, n, &top, e, err);
	free(top.v);
	if (rc == CKFS_OK && o.failed)
		rc = ckfs_nomem(err);
	if (rc == CKFS_OK && !o.p)
		ckfs_strbuf_put(&o, "", 0);
	if (rc != CKFS_OK || o.failed) {
		free(o.p);
		return rc != CKFS_OK ? rc : ckfs_nomem(err);
	}
	*out = o.p;
	*out_len = o.len;
	return CKFS_OK;
}
