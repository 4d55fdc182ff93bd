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
 *    eos_token_id and pad_token_id (their config class keeps those in
 *    text_config only).
 *
 * Everything else is kept byte for byte. Keys are compared as JSON reads
 * them ("dt\u0079pe" is "dtype"), so no key escapes an edit by its spelling.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/folder.h"

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

/* The members of the object whose '{' is s[open]. */
static enum ckfs_code scan_object(const char *s, size_t n, size_t open, struct object *o,
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

struct out {
	char *p;
	size_t len, cap;
	int failed;
};

static void put(struct out *o, const char *s, size_t n)
{
	if (o->failed)
		return;
	if (o->len + n + 1 > o->cap) {
		size_t cap = o->cap ? o->cap : 4096;
		while (cap < o->len + n + 1)
			cap *= 2;
		char *p = realloc(o->p, cap);
		if (!p) {
			o->failed = 1;
			return;
		}
		o->p = p;
		o->cap = cap;
	}
	memcpy(o->p + o->len, s, n);
	o->len += n;
	o->p[o->len] = '\0';
}

static void put_dtype(struct out *o, const char *dtype)
{
	put(o, "\"", 1);
	put(o, dtype, strlen(dtype));
	put(o, "\"", 1);
}

/* s[from, to), a sub-config object, with the value of each dtype key
 * replaced. */
static enum ckfs_code put_sub_config(struct out *o, const char *s, size_t n, size_t from,
				     size_t to, const char *dtype, struct ckfs_error *err)
{
	struct object sub;

	CKFS_TRY(scan_object(s, n, from, &sub, err));
	for (size_t k = 0; k < sub.n; k++) {
		if (!is_dtype_key(s, &sub.v[k]))
			continue;
		put(o, s + from, sub.v[k].val - from);
		put_dtype(o, dtype);
		from = sub.v[k].val_end;
	}
	put(o, s + from, to - from);
	free(sub.v);
	return CKFS_OK;
}

/* Top-level keys the served file leaves out. */
static int dropped(const char *s, const struct member *mb, const char *model_type)
{
	static const char *const token_ids[] = { "bos_token_id", "eos_token_id", "pad_token_id" };
	int qwen2_vl = model_type && (strcmp(model_type, "qwen2_vl") == 0 ||
				      strcmp(model_type, "qwen2_5_vl") == 0);

	if (key_is(s, mb, "attn_implementation"))
		return 1;
	for (size_t i = 0; qwen2_vl && i < 3; i++)
		if (key_is(s, mb, token_ids[i]))
			return 1;
	return 0;
}

static enum ckfs_code render(struct out *o, const char *s, size_t n, const struct object *top,
			     const char *dtype, const char *model_type, struct ckfs_error *err)
{
	size_t kept = 0, done = 0;
	int has_dtype = 0;

	for (size_t k = 0; k < top->n; k++) {
		has_dtype |= is_dtype_key(s, &top->v[k]);
		kept += !dropped(s, &top->v[k], model_type);
	}
	put(o, s, top->open + 1);
	if (!has_dtype) { /* first, in the file's own indentation style */
		put(o, "\n  \"torch_dtype\": ", 18);
		put_dtype(o, dtype);
		put(o, ",", kept ? 1 : 0);
	}
	for (size_t k = 0; k < top->n; k++) {
		const struct member *mb = &top->v[k];
		if (dropped(s, mb, model_type))
			continue;
		/* What leads up to the key: the spacing before the object's
		 * first member, else the comma and spacing before this one. */
		size_t sep = done ? top->v[k - 1].val_end : top->open + 1;
		size_t sep_end = done ? mb->key : top->v[0].key;
		put(o, s + sep, sep_end - sep);
		put(o, s + mb->key, mb->val - mb->key);
		if (is_dtype_key(s, mb))
			put_dtype(o, dtype);
		else if (s[mb->val] == '{')
			CKFS_TRY(put_sub_config(o, s, n, mb->val, mb->val_end, dtype, err));
		else
			put(o, s + mb->val, mb->val_end - mb->val);
		done++;
	}
	/* After the last member (kept or not): its spacing, the brace, the
	 * rest of the file. */
	size_t tail = top->n ? top->v[top->n - 1].val_end : top->open + 1;
	put(o, s + tail, n - tail);
	return CKFS_OK;
}

enum ckfs_code ckfs_render_config(const char *s, size_t n, const char *dtype,
				  const char *model_type, char **out, size_t *out_len,
				  struct ckfs_error *err)
{
	struct object top;
	struct out o = { 0 };
	size_t i = skip_ws(s, 0, n);

	if (i >= n || s[i] != '{')
		return ckfs_fail(err, CKFS_E_FORMAT, "config.json is not a JSON object");
	CKFS_TRY(scan_object(s, n, i, &top, err));
	enum ckfs_code rc = render(&o, s, n, &top, dtype, model_type, err);
	free(top.v);
	if (rc == CKFS_OK && o.failed)
		rc = ckfs_nomem(err);
	if (rc == CKFS_OK && !o.p)
		put(&o, "", 0);
	if (rc != CKFS_OK || o.failed) {
		free(o.p);
		return rc != CKFS_OK ? rc : ckfs_nomem(err);
	}
	*out = o.p;
	*out_len = o.len;
	return CKFS_OK;
}
