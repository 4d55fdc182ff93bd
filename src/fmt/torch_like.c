/* SPDX-License-Identifier: MIT */
/*
 * A rank file read by rank 0's template (include/ckfs/torch.h, struct
 * ckfs_torch_like): the ranks of one FSDP2 save write the same data.pkl
 * but for a few ints and strings, whose offsets the template's decode
 * noted (torch.c, struct ckfs_torch_span). Another rank's data.pkl is
 * compared with the template's bytes, those values allowed to differ,
 * and when it matches its entries are the template's bound to its own
 * storage records: no pickle run, no tree, no entries array.
 */
#include "ckfs/torch.h"

#include <stdlib.h>
#include <string.h>

#include "ckfs/hash.h"
#include "fmt/pickle_ops.h"
#include "fmt/torch_int.h"

struct ckfs_torch_like {
	unsigned char *pkl; /* the template's data.pkl */
	size_t len;
	size_t n_spans;      /* the ints that may differ, by offset */
	int n_coord;         /* of them the coordinate's */
	struct ckfs_torch_span *spans;
	int64_t mesh_shape[CKFS_MAX_DIMS];
	bool has_format_version;
	int writer_lo, writer_hi;
	/* The template's entries, storages unbound; each DTensor's info is
	 * dis[di_of[i]] (equal ones share it). */
	struct ckfs_sd_entry *entries;
	uint32_t *di_of;
	struct ckfs_dtensor_info *dis;
	size_t n_entries, n_dis;
	struct ckfs_arena arena;
};

#define SPAN_MAX_STR 256

/* The bytes of a span's value written at p, after its opcode: an int
 * (BININT1, BININT2, BININT; LONG1 of at most 8 bytes, not for a
 * coordinate) or a string (BINUNICODE, SHORT_BINUNICODE; at most
 * SPAN_MAX_STR bytes) as the span's kind wants; 0 for anything else or
 * when p[0..avail) does not hold it all. */
static size_t span_width(const unsigned char *p, size_t avail, int dim)
{
	size_t w = 0;

	if (avail < 2)
		return 0;
	if (dim == SPAN_UNREAD_STR) {
		if (p[0] == OP_BINUNICODE && avail >= 5)
			w = 4 + ((size_t)p[1] | (size_t)p[2] << 8 | (size_t)p[3] << 16 |
				 (size_t)p[4] << 24);
		else if (p[0] == OP_SHORT_BINUNICODE)
			w = 1 + (size_t)p[1];
		if (w > 4 + SPAN_MAX_STR)
			return 0;
	} else if (p[0] == OP_LONG1 && dim == SPAN_UNREAD_INT) {
		w = p[1] <= 8 ? 1u + p[1] : 0;
	} else {
		w = p[0] == OP_BININT1 ? 1 : p[0] == OP_BININT2 ? 2 : p[0] == OP_BININT ? 4 : 0;
	}
	return w < avail ? w : 0;
}

/* How many bytes after a span's opcode must be read to know its width. */
static size_t span_head(unsigned char op)
{
	return op == OP_BININT || op == OP_BINUNICODE ? 4 : op == OP_BININT2 ? 2 : 1;
}

/* The value of a BININT1, BININT2 or BININT at p. */
static int64_t int_arg(const unsigned char *p)
{
	if (p[0] == OP_BININT1)
		return p[1];
	if (p[0] == OP_BININT2)
		return p[1] | (int64_t)p[2] << 8;
	return (int32_t)((uint32_t)p[1] | (uint32_t)p[2] << 8 | (uint32_t)p[3] << 16 |
			 (uint32_t)p[4] << 24);
}

/* A view's copy in the template's arena, its storage unbound. */
static bool unbind_view(struct ckfs_arena *a, struct ckfs_tensor_view *v)
{
	v->storage_pos = 0;
	v->storage_entry = NULL;
	return !v->storage_key || (v->storage_key = ckfs_arena_strdup(a, v->storage_key));
}

static bool like_copy_di(struct ckfs_torch_like *like, const struct ckfs_dtensor_info *di)
{
	struct ckfs_dtensor_info *d = &like->dis[like->n_dis++];

	*d = *di;
	for (int i = 0; i < CKFS_MAX_DIMS; i++)
		if (d->mesh_dim_names[i] &&
		    !(d->mesh_dim_names[i] = ckfs_arena_strdup(&like->arena, d->mesh_dim_names[i])))
			return false;
	return !d->have_mesh_tensor || unbind_view(&like->arena, &d->mesh_tensor);
}

static int cmp_span(const void *a, const void *b)
{
	uint32_t x = ((const struct ckfs_torch_span *)a)->at, y = ((const struct ckfs_torch_span *)b)->at;
	return x < y ? -1 : x > y;
}

/* What tells DTensor infos of one file apart (their meshes are one),
 * hashed; equal infos are then found by comparing all their bytes. */
static uint64_t di_hash(const struct ckfs_dtensor_info *di)
{
	int nd = di->ndim >= 0 && di->ndim <= CKFS_MAX_DIMS ? di->ndim : 0;
	int md = di->mesh_ndim >= 0 && di->mesh_ndim <= CKFS_MAX_DIMS ? di->mesh_ndim : 0;
	uint64_t h = ckfs_fnv1a(CKFS_FNV1A_START, di->global_shape, sizeof(int64_t) * (size_t)nd);

	return ckfs_fnv1a(h, di->placements, sizeof(di->placements[0]) * (size_t)md);
}

/* The distinct DTensor infos of tf's entries (equal bytes, equal info;
 * a frontier MoE rank file has 37,000 DTensors and a handful of distinct
 * shapes): like->di_of set, like->dis filled. */
static bool like_dedup_dis(struct ckfs_torch_like *like, const struct ckfs_torch_file *tf)
{
	size_t n = tf->n_entries, cap = 64, n_dis = 0;
	const struct ckfs_dtensor_info **uniq = NULL;
	uint32_t *slot = NULL; /* open addressing: index into uniq + 1 */
	bool ok = false;

	for (;;) {
		free(uniq);
		free(slot);
		uniq = malloc(cap / 2 * sizeof(*uniq));
		slot = calloc(cap, sizeof(*slot));
		if (!uniq || !slot)
			goto out;
		n_dis = 0;
		size_t i = 0;
		for (; i < n; i++) {
			const struct ckfs_dtensor_info *di = tf->entries[i].dtensor;
			if (tf->entries[i].kind != CKFS_ENTRY_DTENSOR)
				continue;
			size_t h = (size_t)di_hash(di) & (cap - 1);
			while (slot[h] && memcmp(uniq[slot[h] - 1], di, sizeof(*di)) != 0)
				h = (h + 1) & (cap - 1);
			if (!slot[h]) {
				if (n_dis == cap / 2)
					break; /* half full: again, twice the size */
				uniq[n_dis++] = di;
				slot[h] = (uint32_t)n_dis;
			}
			like->di_of[i] = slot[h] - 1;
		}
		if (i == n)
			break;
		cap *= 2;
	}
	like->dis = ckfs_arena_calloc(&like->arena, n_dis + 1, sizeof(*like->dis));
	if (!like->dis)
		goto out;
	for (size_t j = 0; j < n_dis; j++)
		if (!like_copy_di(like, uniq[j]))
			goto out;
	ok = true;
out:
	free(uniq);
	free(slot);
	return ok;
}

enum ckfs_code ckfs_torch_like_new(struct ckfs_torch_file *tf, struct ckfs_torch_like **out,
				   struct ckfs_error *err)
{
	struct ckfs_torch_like *like;
	size_t n = tf->n_entries;

	*out = NULL;
	if (!tf->is_template || !tf->pkl || tf->n_parts != 1)
		return CKFS_OK;
	for (size_t i = 0; i < n; i++)
		if (tf->entries[i].kind == CKFS_ENTRY_SHARDED)
			return CKFS_OK;
	if (!(like = calloc(1, sizeof(*like))))
		return ckfs_nomem(err);
	ckfs_arena_init(&like->arena);
	like->entries = ckfs_arena_calloc(&like->arena, n + 1, sizeof(*like->entries));
	like->di_of = ckfs_arena_calloc(&like->arena, n + 1, sizeof(*like->di_of));
	if (!like->entries || !like->di_of || !like_dedup_dis(like, tf))
		goto nomem;
	for (size_t i = 0; i < n; i++) {
		const struct ckfs_sd_entry *e = &tf->entries[i];
		struct ckfs_sd_entry *c = &like->entries[i];
		*c = *e;
		c->dtensor = NULL;
		if (!(c->key = ckfs_arena_strdup(&like->arena, e->key)) ||
		    !unbind_view(&like->arena, &c->local))
			goto nomem;
	}
	like->n_entries = n;
	/* The ints that may differ, where the one mesh's were each made by
	 * an int opcode (a coordinate by BININT*): else a rank file must equal
	 * the template byte for byte there. */
	like->n_spans = tf->n_meshes == 1 && !tf->spans_lost ? tf->n_spans : 0;
	like->spans = tf->spans;
	tf->spans = NULL;
	tf->n_spans = tf->spans_cap = 0;
	for (size_t k = 0; k < like->n_spans; k++) {
		const struct ckfs_torch_span *sp = &like->spans[k];
		const unsigned char *p = tf->pkl + sp->at;
		if (sp->at >= tf->pkl_len || span_width(p, tf->pkl_len - sp->at, sp->dim) == 0)
			like->n_spans = 0;
		else if (sp->dim >= 0)
			like->mesh_shape[sp->dim] = tf->mesh_di->mesh_shape[sp->dim];
		like->n_coord += sp->dim >= 0;
	}
	if (like->n_spans == 0)
		like->n_coord = 0;
	if (like->n_spans > 1)
		qsort(like->spans, like->n_spans, sizeof(like->spans[0]), cmp_span);
	/* an object decoded twice (a shared spec) noted its ints twice */
	size_t kept = 0;
	for (size_t k = 0; k < like->n_spans; k++)
		if (kept == 0 || like->spans[k].at != like->spans[kept - 1].at)
			like->spans[kept++] = like->spans[k];
	like->n_spans = kept;
	like->has_format_version = tf->has_format_version;
	like->writer_lo = tf->writer_lo;
	like->writer_hi = tf->writer_hi;
	like->pkl = tf->pkl;
	like->len = tf->pkl_len;
	tf->pkl = NULL;
	*out = like;
	return CKFS_OK;
nomem:
	ckfs_torch_like_free(like);
	return ckfs_nomem(err);
}

void ckfs_torch_like_free(struct ckfs_torch_like *like)
{
	if (!like)
		return;
	free(like->pkl);
	free(like->spans);
	ckfs_arena_release(&like->arena);
	free(like);
}

/* A stored record read in blocks, to be compared without holding it. */
#define LIKE_BLOCK (4u << 20)
struct record_reader {
	struct ckfs_file f;
	uint64_t pos, end;  /* the part not yet in buf, absolute */
	unsigned char *buf;
	size_t at, have;    /* buf[at..have) not yet taken */
};

static bool reader_fill(struct record_reader *r)
{
	if (r->at < r->have)
		return true;
	size_t n = r->end - r->pos < LIKE_BLOCK ? (size_t)(r->end - r->pos) : LIKE_BLOCK;
	if (n == 0 || ckfs_file_pread(r->f, r->buf, n, r->pos) != (ssize_t)n)
		return false;
	r->pos += n;
	r->at = 0;
	r->have = n;
	return true;
}

/* The next n bytes: equal to t (out NULL), or copied to out. */
static bool reader_take(struct record_reader *r, const unsigned char *t, unsigned char *out,
			size_t n)
{
	while (n > 0) {
		if (!reader_fill(r))
			return false;
		size_t k = r->have - r->at < n ? r->have - r->at : n;
		if (out)
			memcpy(out, r->buf + r->at, k), out += k;
		else if (memcmp(r->buf + r->at, t, k) != 0)
			return false;
		else
			t += k;
		r->at += k;
		n -= k;
	}
	return true;
}

/*
 * Whether data.pkl (the record pkl of tf) is the template's but for its
 * spans, the coordinate's holding coord. Each may be written as wide as
 * the template's or wider (rank 256 on needs BININT2, process group "10"
 * is longer than "9"; a narrower one, a hash of fewer bytes, runs the
 * pickle): the pickle only grows at each of them,
 * which no check of the pickle machine can turn into a failure. Compared
 * a block at a time; a read that fails says no (the pickle's read
 * reports it).
 */
bool torch_like_matches(const struct ckfs_torch_like *like, const struct ckfs_torch_file *tf,
			const struct ckfs_zip_entry *pkl, const int64_t *coord)
{
	struct record_reader r = { .f = tf->zip.file, .pos = pkl->data_offset };
	struct ckfs_error err;
	size_t t = 0; /* where the template is compared */
	bool same = false;

	if (tf->has_format_version != like->has_format_version || (like->n_coord && !coord) ||
	    pkl->method != 0 || pkl->size < like->len ||
	    pkl->size > like->len + (5 + SPAN_MAX_STR) * (uint64_t)like->n_spans ||
	    ckfs_zip_check_derived(&tf->zip, pkl, &err) != CKFS_OK ||
	    !(r.buf = malloc(LIKE_BLOCK)))
		return false;
	r.end = pkl->data_offset + pkl->size;
	for (size_t k = 0; k < like->n_spans; k++) {
		const struct ckfs_torch_span *sp = &like->spans[k];
		unsigned char v[1 + 4 + SPAN_MAX_STR + 1];
		if (!reader_take(&r, like->pkl + t, NULL, sp->at - t) || !reader_take(&r, NULL, v, 1) ||
		    !reader_take(&r, NULL, v + 1, span_head(v[0])))
			goto out;
		size_t head = span_head(v[0]);
		size_t wt = span_width(like->pkl + sp->at, like->len - sp->at, sp->dim);
		size_t wr = span_width(v, sizeof(v), sp->dim);
		if (wr < wt || wr < head || !reader_take(&r, NULL, v + 1 + head, wr - head))
			goto out;
		if (sp->dim >= 0) {
			int64_t c = int_arg(v);
			if (c != coord[sp->dim] || c < 0 || c >= like->mesh_shape[sp->dim])
				goto out;
		}
		t = sp->at + 1 + wt;
	}
	same = reader_take(&r, like->pkl + t, NULL, like->len - t) && r.at == r.have &&
	       r.pos == r.end;
out:
	free(r.buf);
	return same;
}

/* A view of the template bound to the record e of tf. */
static void bind_view(struct ckfs_tensor_view *v, const struct ckfs_zip_entry *e)
{
	v->storage_pos = e->data_offset;
	v->storage_entry = e;
}

/* The template's storages found in tf's records, in the order and with
 * the messages of the pickle's decode (each entry's own storage, then, at
 * the first DTensor of a mesh, the mesh's rank tensor); the DTensor infos
 * copied with coord. ckfs_torch_entry makes the entries from them. */
enum ckfs_code torch_like_bind(struct ckfs_torch_file *tf, const struct ckfs_torch_like *like,
			       const int64_t *coord, struct ckfs_error *err)
{
	size_t n = like->n_entries;
	struct ckfs_dtensor_info *dis;
	bool *bound;

	tf->recs = ckfs_arena_alloc(&tf->arena, (n + 1) * sizeof(*tf->recs));
	tf->part_end = ckfs_arena_calloc(&tf->arena, 1, sizeof(size_t));
	dis = ckfs_arena_alloc(&tf->arena, (like->n_dis + 1) * sizeof(*dis));
	bound = ckfs_arena_calloc(&tf->arena, like->n_dis + 1, sizeof(*bound));
	if (!tf->recs || !tf->part_end || !dis || !bound)
		return ckfs_nomem(err);
	memcpy(dis, like->dis, like->n_dis * sizeof(*dis));
	for (size_t j = 0; like->n_coord && j < like->n_dis; j++)
		memcpy(dis[j].coord, coord, (size_t)like->n_coord * sizeof(*coord));
	for (size_t i = 0; i < n; i++) {
		const struct ckfs_sd_entry *e = &like->entries[i];
		const struct ckfs_tensor_view *v = &e->local;
		CKFS_TRY(torch_storage_record(tf, v->storage_key, strlen(v->storage_key),
					      v->storage_bytes, e->key, &tf->recs[i], err));
		uint32_t j = like->di_of[i];
		struct ckfs_tensor_view *mt = &dis[j].mesh_tensor;
		if (e->kind != CKFS_ENTRY_DTENSOR || !dis[j].have_mesh_tensor || bound[j])
			continue;
		const struct ckfs_zip_entry *r;
		CKFS_TRY(torch_storage_record(tf, mt->storage_key, strlen(mt->storage_key),
					      mt->storage_bytes, e->key, &r, err));
		bind_view(mt, r);
		bound[j] = true;
	}
	tf->like = like;
	tf->like_dis = dis;
	tf->writer_lo = like->writer_lo;
	tf->writer_hi = like->writer_hi;
	tf->n_entries = n;
	tf->part_end[0] = n;
	tf->n_parts = 1;
	tf->from_like = true;
	return CKFS_OK;
}

const struct ckfs_sd_entry *ckfs_torch_entry(const struct ckfs_torch_file *tf, size_t i,
					     struct ckfs_sd_entry *scratch)
{
	const struct ckfs_torch_like *like = tf->like;

	if (!tf->from_like)
		return &tf->entries[i];
	*scratch = like->entries[i];
	bind_view(&scratch->local, tf->recs[i]);
	if (scratch->kind == CKFS_ENTRY_DTENSOR)
		scratch->dtensor = &tf->like_dis[like->di_of[i]];
	return scratch;
}
