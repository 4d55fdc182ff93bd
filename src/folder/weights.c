/* SPDX-License-Identifier: MIT */
/*
 * safetensors layout and reads of the virtual weight files
 * (include/ckfs/weights.h). The header is rendered once at build; a read of any
 * byte range copies header bytes and asks the model for the elements of
 * the tensors it overlaps, with partial elements at the edges read through
 * a small bounce buffer.
 */
#include "ckfs/weights.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/strbuf.h"

/* A JSON string as Python's json.dumps writes it (ensure_ascii). */
static void sb_json_python(struct ckfs_strbuf *b, const char *s)
{
	const unsigned char *c = (const unsigned char *)s;

	ckfs_strbuf_put(b, "\"", 1);
	while (*c) {
		uint32_t cp = *c;
		int extra = 0;
		if (cp >= 0xF0) { cp &= 0x07; extra = 3; }
		else if (cp >= 0xE0) { cp &= 0x0F; extra = 2; }
		else if (cp >= 0xC0) { cp &= 0x1F; extra = 1; }
		c++;
		for (int i = 0; i < extra && (*c & 0xC0) == 0x80; i++, c++)
			cp = (cp << 6) | (*c & 0x3F);
		switch (cp) {
		case '"': ckfs_strbuf_put(b, "\\\"", 2); continue;
		case '\\': ckfs_strbuf_put(b, "\\\\", 2); continue;
		case '\n': ckfs_strbuf_put(b, "\\n", 2); continue;
		case '\r': ckfs_strbuf_put(b, "\\r", 2); continue;
		case '\t': ckfs_strbuf_put(b, "\\t", 2); continue;
		case '\b': ckfs_strbuf_put(b, "\\b", 2); continue;
		case '\f': ckfs_strbuf_put(b, "\\f", 2); continue;
		}
		if (cp < 0x20 || (cp >= 0x7F && cp < 0x10000)) {
			if (cp == 0x7F) {
				ckfs_strbuf_put(b, "\x7f", 1);
				continue;
			}
			ckfs_strbuf_fmt(b, "\\u%04x", cp);
		} else if (cp >= 0x10000) {
			cp -= 0x10000;
			ckfs_strbuf_fmt(b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
		} else {
			char ch = (char)cp;
			ckfs_strbuf_put(b, &ch, 1);
		}
	}
	ckfs_strbuf_put(b, "\"", 1);
}

/* ---- layout ---- */

static int cmp_st_order(const void *a, const void *b)
{
	const struct ckfs_tensor *x = *(const struct ckfs_tensor *const *)a;
	const struct ckfs_tensor *y = *(const struct ckfs_tensor *const *)b;
	int rx = ckfs_dtype_st_rank(x->out_dtype), ry = ckfs_dtype_st_rank(y->out_dtype);

	if (rx != ry)
		return ry - rx; /* descending dtype */
	return strcmp(x->name, y->name);
}

static int cmp_name_order(const void *a, const void *b)
{
	const struct ckfs_tensor *x = *(const struct ckfs_tensor *const *)a;
	const struct ckfs_tensor *y = *(const struct ckfs_tensor *const *)b;

	return strcmp(x->name, y->name);
}

enum build_file_flags {
	FILE_METADATA = 1u << 0, /* a __metadata__ of format pt, as save_file writes */
	FILE_BY_NAME = 1u << 1,  /* data in name order rather than save_file's dtype
				  * order (a quantizing view: each weight beside
				  * its parts) */
};

static enum ckfs_code build_file(struct ckfs_st_layout *l, struct ckfs_st_file *f,
				 const char *name, const struct ckfs_tensor **ts,
				 size_t n, unsigned flags, struct ckfs_error *err)
{
	bool metadata = flags & FILE_METADATA, by_name = flags & FILE_BY_NAME;
	struct ckfs_strbuf b = { 0 };
	uint64_t off = 0;

	f->name = ckfs_arena_strdup(&l->arena, name);
	f->tensors = ckfs_arena_calloc(&l->arena, n + 1, sizeof(*f->tensors));
	f->offsets = ckfs_arena_calloc(&l->arena, n + 1, sizeof(*f->offsets));
	if (!f->name || !f->tensors || !f->offsets)
		return ckfs_nomem(err);
	memcpy(f->tensors, ts, n * sizeof(*ts));
	qsort(f->tensors, n, sizeof(*f->tensors), by_name ? cmp_name_order : cmp_st_order);
	f->n_tensors = n;

	ckfs_strbuf_str(&b, metadata ? "{\"__metadata__\":{\"format\":\"pt\"}" : "{");
	for (size_t i = 0; i < n; i++) {
		const struct ckfs_tensor *t = f->tensors[i];
		uint64_t bytes = ckfs_tensor_out_bytes(t);
		if (metadata || i)
			ckfs_strbuf_put(&b, ",", 1);
		ckfs_strbuf_json(&b, t->name);
		ckfs_strbuf_fmt(&b, ":{\"dtype\":\"%s\",\"shape\":[", ckfs_dtype_st_name(t->out_dtype));
		for (int k = 0; k < t->ndim; k++)
			ckfs_strbuf_fmt(&b, "%s%lld", k ? "," : "", (long long)t->shape[k]);
		ckfs_strbuf_fmt(&b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
		       (unsigned long long)(off + bytes));
		f->offsets[i] = off;
		off += bytes;
	}
	ckfs_strbuf_put(&b, "}", 1);
	while (!b.failed && b.len % 8)
		ckfs_strbuf_put(&b, " ", 1);
	if (b.failed) {
		free(b.p);
		return ckfs_nomem(err);
	}
	if (b.len > CKFS_MAX_ST_HEADER) {
		free(b.p);
		return ckfs_fail(err, CKFS_E_LIMIT,
				 "'%s': header of %zu bytes exceeds the safetensors "
				 "limit; use --max-shard-size", name, b.len);
	}
	f->header_len = 8 + b.len;
	f->header = ckfs_arena_alloc(&l->arena, f->header_len);
	if (!f->header) {
		free(b.p);
		return ckfs_nomem(err);
	}
	uint64_t n_le = b.len; /* little-endian hosts only (checked at build) */
	memcpy(f->header, &n_le, 8);
	memcpy(f->header + 8, b.p, b.len);
	free(b.p);
	for (size_t i = 0; i < n; i++)
		f->offsets[i] += f->header_len;
	f->offsets[n] = f->header_len + off;
	f->size = f->header_len + off;
	return CKFS_OK;
}

/* A tensor's name and its index in the model, sorted by name. */
struct named {
	const char *name;
	size_t idx;
};

static int cmp_named(const void *a, const void *b)
{
	return strcmp(((const struct named *)a)->name, ((const struct named *)b)->name);
}

static enum ckfs_code render_index(struct ckfs_st_layout *l,
				   const struct ckfs_model *m, size_t *shard_of,
				   struct ckfs_error *err)
{
	struct ckfs_strbuf b = { 0 };
	uint64_t total = 0, params = 0;
	struct named *names = calloc(m->n_tensors + 1, sizeof(*names));

	if (!names)
		return ckfs_nomem(err);
	for (size_t i = 0; i < m->n_tensors; i++) {
		total += ckfs_tensor_out_bytes(&m->tensors[i]);
		params += m->tensors[i].numel;
		names[i] = (struct named){ m->tensors[i].name, i };
	}
	/* Names sorted, each with its tensor's index (names are unique:
	 * plan.c), as save_pretrained writes the weight map. */
	qsort(names, m->n_tensors, sizeof(*names), cmp_named);
	ckfs_strbuf_fmt(&b, "{\n  \"metadata\": {\n    \"total_parameters\": %llu,\n"
		   "    \"total_size\": %llu\n  },\n  \"weight_map\": {\n",
	       (unsigned long long)params, (unsigned long long)total);
	for (size_t i = 0; i < m->n_tensors; i++) {
		ckfs_strbuf_str(&b, "    ");
		sb_json_python(&b, names[i].name);
		ckfs_strbuf_str(&b, ": ");
		sb_json_python(&b, l->files[shard_of[names[i].idx]].name);
		ckfs_strbuf_str(&b, i + 1 < m->n_tensors ? ",\n" : "\n");
	}
	ckfs_strbuf_str(&b, "  }\n}\n");
	free(names);
	if (b.failed) {
		free(b.p);
		return ckfs_nomem(err);
	}
	l->index_json = ckfs_arena_strndup(&l->arena, b.p, b.len);
	l->index_len = b.len;
	free(b.p);
	return l->index_json ? CKFS_OK : ckfs_nomem(err);
}

enum ckfs_code ckfs_st_layout_build(const struct ckfs_model *m,
				    uint64_t max_shard_size,
				    struct ckfs_st_layout *l,
				    struct ckfs_error *err)
{
	size_t n = m->n_tensors;
	size_t *shard_of = calloc(n + 1, sizeof(*shard_of));
	const struct ckfs_tensor **buf = calloc(n + 1, sizeof(*buf));
	enum ckfs_code rc = CKFS_OK;

	memset(l, 0, sizeof(*l));
	ckfs_arena_init(&l->arena);
	if (!shard_of || !buf) {
		rc = ckfs_nomem(err);
		goto out;
	}
	/* huggingface_hub's greedy split in state-dict order: a tensor bigger
	 * than the limit gets a shard of its own, appended at once; otherwise
	 * the current shard closes when the tensor would overflow it. */
	size_t n_shards = 0, current = SIZE_MAX;
	uint64_t current_size = 0, total = 0;
	for (size_t i = 0; i < n; i++) {
		uint64_t size = ckfs_tensor_out_bytes(&m->tensors[i]);
		/* Each tensor is within the limit (plan.c); so must be the sum,
		 * which bounds every file size, offset and the index total. */
		if (__builtin_add_overflow(total, size, &total) ||
		    total > CKFS_MAX_SERVED_BYTES) {
			rc = ckfs_fail(err, CKFS_E_LIMIT, "the weights are more than "
				       "the limit of %llu bytes",
				       (unsigned long long)CKFS_MAX_SERVED_BYTES);
			goto out;
		}
		if (max_shard_size == 0) {
			shard_of[i] = 0;
			n_shards = 1;
			continue;
		}
		/* A view's later parts (fp8 scales, a compressed-tensors
		 * weight's other tensors) follow its first into its shard, even
		 * past the limit by their few bytes. */
		if (m->tensors[i].view_part > 0 && i > 0) {
			shard_of[i] = shard_of[i - 1];
			if (shard_of[i] == current)
				current_size += size;
			continue;
		}
		if (size > max_shard_size) {
			shard_of[i] = n_shards++;
			continue;
		}
		if (current != SIZE_MAX && current_size + size > max_shard_size)
			current = SIZE_MAX;
		if (current == SIZE_MAX) {
			current = n_shards++;
			current_size = 0;
		}
		shard_of[i] = current;
		current_size += size;
	}
	if (n_shards == 0)
		n_shards = 1;
	l->n_files = n_shards;
	l->files = ckfs_arena_calloc(&l->arena, n_shards, sizeof(*l->files));
	if (!l->files) {
		rc = ckfs_nomem(err);
		goto out;
	}
	for (size_t s = 0; s < n_shards && rc == CKFS_OK; s++) {
		size_t k = 0;
		char name[64];
		for (size_t i = 0; i < n; i++)
			if (shard_of[i] == s)
				buf[k++] = &m->tensors[i];
		if (n_shards == 1)
			snprintf(name, sizeof(name), "model.safetensors");
		else
			snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors",
				 s + 1, n_shards);
		rc = build_file(l, &l->files[s], name, buf, k,
				FILE_METADATA | (m->view && m->view->quantizes ? FILE_BY_NAME : 0),
				err);
	}
	if (rc == CKFS_OK && n_shards > 1)
		rc = render_index(l, m, shard_of, err);
out:
	free(shard_of);
	free(buf);
	if (rc != CKFS_OK)
		ckfs_st_layout_release(l);
	return rc;
}

enum ckfs_code ckfs_st_layout_single(const struct ckfs_tensor *ts, size_t n, const char *name,
				     struct ckfs_st_layout *l, struct ckfs_error *err)
{
	const struct ckfs_tensor **buf = calloc(n + 1, sizeof(*buf));
	uint64_t total = 0;
	enum ckfs_code rc = CKFS_OK;

	memset(l, 0, sizeof(*l));
	ckfs_arena_init(&l->arena);
	l->files = ckfs_arena_calloc(&l->arena, 1, sizeof(*l->files));
	if (!buf || !l->files)
		rc = ckfs_nomem(err);
	for (size_t i = 0; i < n && rc == CKFS_OK; i++) {
		buf[i] = &ts[i];
		if (__builtin_add_overflow(total, ckfs_tensor_out_bytes(&ts[i]), &total) ||
		    total > CKFS_MAX_SERVED_BYTES)
			rc = ckfs_fail(err, CKFS_E_LIMIT, "'%s': more than the limit of %llu "
				       "bytes", name, (unsigned long long)CKFS_MAX_SERVED_BYTES);
	}
	if (rc == CKFS_OK) {
		l->n_files = 1;
		rc = build_file(l, &l->files[0], name, buf, n, 0, err);
	}
	free(buf);
	if (rc != CKFS_OK)
		ckfs_st_layout_release(l);
	return rc;
}

void ckfs_st_layout_release(struct ckfs_st_layout *l)
{
	ckfs_arena_release(&l->arena);
	l->files = NULL;
	l->n_files = 0;
	l->index_json = NULL;
}

/* Bytes [off, end) of f's tensor data into buf, from tensor i on (the first
 * whose data ends after off). */
/* The bytes [*rel, *stop) of tensor i of f that the window [off, end) of
 * the file takes, counted from the tensor's start; false for an empty
 * tensor. off is at or after the tensor's start. */
static bool tensor_part(const struct ckfs_st_file *f, size_t i, uint64_t off, uint64_t end,
			uint64_t *rel, uint64_t *stop)
{
	uint64_t t_end = f->offsets[i + 1];

	if (t_end == f->offsets[i])
		return false;
	*rel = off - f->offsets[i];
	*stop = (end < t_end ? end : t_end) - f->offsets[i];
	return true;
}

static enum ckfs_code read_tensors(const struct ckfs_model *m, const struct ckfs_st_file *f,
				   size_t i, uint64_t off, uint64_t end, unsigned char *buf,
				   struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	for (; i < f->n_tensors && off < end; i++) {
		const struct ckfs_tensor *t = f->tensors[i];
		uint64_t rel, stop;
		if (!tensor_part(f, i, off, end, &rel, &stop))
			continue;
		size_t es = ckfs_dtype_size(t->out_dtype);
		uint64_t first = rel / es, last = (stop + es - 1) / es;
		/* A partial element at the start. */
		if (rel % es) {
			unsigned char tmp[8];
			CKFS_TRY(ckfs_tensor_read(m, t, first, 1, tmp, scratch, err));
			size_t skip = (size_t)(rel % es);
			size_t n = es - skip;
			if (n > stop - rel)
				n = (size_t)(stop - rel);
			memcpy(buf, tmp + skip, n);
			buf += n;
			rel += n;
			first++;
		}
		/* Whole elements, then a partial one at the end. */
		uint64_t whole = rel < stop ? (stop - rel) / es : 0;
		if (whole) {
			CKFS_TRY(ckfs_tensor_read(m, t, first, whole, buf, scratch, err));
			buf += whole * es;
			rel += whole * es;
			first += whole;
		}
		if (rel < stop && first < last) {
			unsigned char tmp[8];
			CKFS_TRY(ckfs_tensor_read(m, t, first, 1, tmp, scratch, err));
			memcpy(buf, tmp, (size_t)(stop - rel));
			buf += stop - rel;
			rel = stop;
		}
		off = f->offsets[i] + rel;
	}
	return CKFS_OK;
}

/* What reads [off, end) of f's tensor data will take from a store, fetched
 * ahead in few requests (ckfs_file_ahead): tensor i on, as in
 * read_tensors. Ranges beyond the first RANGES are left to the reads. */
static void fetch_ahead(const struct ckfs_model *m, const struct ckfs_st_file *f, size_t i,
			uint64_t off, uint64_t end)
{
	enum { RANGES = 512 };
	struct ckfs_file_range v[RANGES];
	size_t n = 0;

	for (; i < f->n_tensors && off < end && n < RANGES; i++) {
		const struct ckfs_tensor *t = f->tensors[i];
		size_t es = ckfs_dtype_size(t->out_dtype);
		uint64_t rel, stop;
		if (!tensor_part(f, i, off, end, &rel, &stop))
			continue;
		uint64_t first = rel / es, last = (stop + es - 1) / es;
		n += ckfs_tensor_ranges(m, t, first, last - first, v + n, RANGES - n);
		off = f->offsets[i + 1];
	}
	ckfs_file_ahead(v, n);
}

size_t ckfs_st_tensor_at(const struct ckfs_st_file *f, uint64_t off)
{
	size_t lo = 0, hi = f->n_tensors;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (f->offsets[mid + 1] <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

enum ckfs_code ckfs_st_file_read(const struct ckfs_model *m,
				 const struct ckfs_st_file *f, uint64_t off,
				 size_t len, void *buf_v,
				 struct ckfs_read_scratch *scratch,
				 struct ckfs_error *err)
{
	unsigned char *buf = buf_v;
	uint64_t end = off + len;

	if (off > f->size || len > f->size - off)
		return ckfs_fail(err, CKFS_E_INVALID, "read past the end of '%s'",
				 f->name);
	if (off < f->header_len) {
		size_t n = (size_t)((end < f->header_len ? end : f->header_len) - off);
		memcpy(buf, f->header + off, n);
		buf += n;
		off += n;
	}
	if (off >= end)
		return CKFS_OK;
	/* Tensor bytes only once every source has been checked. */
	CKFS_TRY(ckfs_model_checked(m, err));
	size_t lo = ckfs_st_tensor_at(f, off);
	if (!m->remote_sources)
		return read_tensors(m, f, lo, off, end, buf, scratch, err);
	fetch_ahead(m, f, lo, off, end);
	enum ckfs_code rc = read_tensors(m, f, lo, off, end, buf, scratch, err);
	ckfs_file_ahead_drop();
	return rc;
}
