/* SPDX-License-Identifier: MIT */
/*
 * Where one rank's local tensor lands in the global tensor
 * (src/layouts/layouts.h). Each mesh dim's placement, in mesh order, cuts
 * the current extent of one tensor dim the way DTensor does: Shard(d) keeps
 * piece c of n with torch.chunk sizes (ceil(L/n), trailing pieces may be
 * empty); _StridedShard(d, k) cuts the extent into k pieces first and keeps
 * piece c of each; Replicate() keeps everything, and only coordinate 0
 * contributes. Tracking, per tensor dim, the (global start, local start,
 * length) intervals a rank keeps gives its chunks; any combination of
 * placements reduces to that. The local view's shape must equal the
 * interval totals, which catches files that disagree with their placement.
 */
#include <stdlib.h>
#include <string.h>

#include "layouts/layouts.h"

#define MAX_CHUNKS_PER_ENTRY 4096 /* _StridedShard products stay tiny */
#define MAX_PIECES 64             /* intervals per dim */

enum ckfs_code ckfs_chunk_list_push(struct ckfs_chunk_list *a, const struct ckfs_chunk_spec *c,
				    struct ckfs_error *err)
{
	if (a->n == a->cap) {
		size_t cap = a->cap ? a->cap * 2 : 4;
		struct ckfs_chunk_spec *p = realloc(a->v, cap * sizeof(*p));
		if (!p)
			return ckfs_nomem(err);
		a->v = p;
		a->cap = cap;
	}
	a->v[a->n++] = *c;
	return CKFS_OK;
}

struct ivl {
	int64_t global, local, len;
};

struct ivl_list {
	struct ivl *v;
	size_t n;
};

static int64_t ivl_total(const struct ivl_list *l)
{
	int64_t t = 0;
	for (size_t i = 0; i < l->n; i++)
		t += l->v[i].len;
	return t;
}

/* Append the part of `in` at local positions [a, b) to out, renumbering
 * local positions to follow out's current end. */
static int ivl_select(const struct ivl_list *in, int64_t a, int64_t b,
		      struct ivl_list *out, size_t cap)
{
	int64_t base = ivl_total(out);

	for (size_t i = 0; i < in->n && a < b; i++) {
		const struct ivl *v = &in->v[i];
		int64_t lo = v->local > a ? v->local : a;
		int64_t hi = v->local + v->len < b ? v->local + v->len : b;
		if (lo >= hi)
			continue;
		if (out->n == cap)
			return 0;
		out->v[out->n++] = (struct ivl){ v->global + (lo - v->local), base,
						 hi - lo };
		base += hi - lo;
	}
	return 1;
}

/* torch.chunk: piece c of n over length L as [start, end). */
static void chunk_range(int64_t L, int64_t n, int64_t c, int64_t *start,
			int64_t *end)
{
	int64_t q = (L + n - 1) / n;
	*start = q * c < L ? q * c : L;
	*end = *start + q < L ? *start + q : L;
}

static enum ckfs_code apply_placement(const struct ckfs_placement *p, int64_t n,
				      int64_t c, struct ivl_list *l, size_t cap,
				      const char *key, struct ckfs_error *err)
{
	struct ivl tmp_v[MAX_PIECES];
	struct ivl_list in = { tmp_v, l->n };
	int64_t L = ivl_total(l), a, b;

	if (l->n > MAX_PIECES)
		return ckfs_fail(err, CKFS_E_LIMIT, "tensor '%s': too many shard "
				 "pieces", key);
	memcpy(tmp_v, l->v, l->n * sizeof(*tmp_v));
	l->n = 0;
	if (p->kind == CKFS_PLACE_SHARD) {
		chunk_range(L, n, c, &a, &b);
		if (!ivl_select(&in, a, b, l, cap))
			goto limit;
		return CKFS_OK;
	}
	/* _StridedShard: split_factor pieces, each cut by torch.chunk. */
	for (int64_t j = 0; j < p->split_factor; j++) {
		int64_t ps, pe;
		chunk_range(L, p->split_factor, j, &ps, &pe);
		chunk_range(pe - ps, n, c, &a, &b);
		if (!ivl_select(&in, ps + a, ps + b, l, cap))
			goto limit;
	}
	return CKFS_OK;
limit:
	return ckfs_fail(err, CKFS_E_LIMIT, "tensor '%s': too many shard pieces",
			 key);
}

static enum ckfs_code chunks_from_view(const struct ckfs_sd_entry *e,
				       struct ivl_list *lists, uint32_t source,
				       int rank, struct ckfs_chunk_list *a,
				       struct ckfs_error *err)
{
	const struct ckfs_tensor_view *v = &e->local;
	int ndim = v->ndim;
	size_t idx[CKFS_MAX_DIMS] = { 0 }, total = 1;

	for (int k = 0; k < ndim; k++) {
		if (ivl_total(&lists[k]) != v->shape[k])
			return ckfs_fail(err, CKFS_E_INVALID,
					 "tensor '%s': rank %d holds %lld along dim %d, "
					 "its placement implies %lld", e->key, rank,
					 (long long)v->shape[k], k,
					 (long long)ivl_total(&lists[k]));
		if (lists[k].n == 0)
			return CKFS_OK; /* empty shard */
		total *= lists[k].n;
		if (total > MAX_CHUNKS_PER_ENTRY)
			return ckfs_fail(err, CKFS_E_LIMIT,
					 "tensor '%s': too many shard pieces", e->key);
	}
	for (size_t t = 0; t < total; t++) {
		struct ckfs_chunk_spec c = { .source = source, .rank = rank,
					.dtype = v->dtype, .neg = v->neg };
		uint64_t local = (uint64_t)v->storage_offset;
		int empty = 0;
		for (int k = 0; k < ndim; k++) {
			const struct ivl *iv = &lists[k].v[idx[k]];
			empty |= iv->len == 0;
			c.shape[k] = iv->len;
			c.offset[k] = iv->global;
			c.stride[k] = v->stride[k];
			local += (uint64_t)iv->local * (uint64_t)v->stride[k];
		}
		c.pos = v->storage_pos + local * ckfs_dtype_size(v->dtype);
		/* Size-1 dims get row-major strides so the reader can merge
		 * rows; the index along them is always 0. */
		for (int k = ndim - 1; k >= 0; k--)
			if (c.shape[k] == 1)
				c.stride[k] = k == ndim - 1 ? 1 : c.stride[k + 1] * c.shape[k + 1];
		if (ndim == 0) { /* a scalar reads as one element of a 1-d block */
			c.shape[0] = 1;
			c.stride[0] = 1;
		}
		if (!empty) /* zero-size blocks hold no element */
			CKFS_TRY(ckfs_chunk_list_push(a, &c, err));
		for (int k = ndim - 1; k >= 0; k--) {
			if (++idx[k] < lists[k].n)
				break;
			idx[k] = 0;
		}
	}
	return CKFS_OK;
}

/* The intervals the placements of DTensor e leave mesh coordinate
 * coord, per tensor dim; *copy when it is a copy along a Replicate()
 * dim. */
static enum ckfs_code dtensor_lists(const struct ckfs_sd_entry *e, const int64_t *coord,
				    struct ivl (*store)[MAX_PIECES], struct ivl_list *lists,
				    int *copy, struct ckfs_error *err)
{
	const struct ckfs_dtensor_info *di = e->dtensor;

	for (int k = 0; k < di->ndim; k++) {
		lists[k] = (struct ivl_list){ store[k], 1 };
		store[k][0] = (struct ivl){ 0, 0, di->global_shape[k] };
	}
	*copy = 0;
	for (int i = 0; i < di->mesh_ndim; i++) {
		const struct ckfs_placement *p = &di->placements[i];
		if (p->kind == CKFS_PLACE_PARTIAL)
			return ckfs_fail(err, CKFS_E_UNSUPPORTED,
					 "tensor '%s': Partial placement (unreduced "
					 "values) is not supported", e->key);
		if (p->kind == CKFS_PLACE_REPLICATE) {
			*copy |= coord[i] != 0; /* a copy of coordinate 0's data */
			continue;
		}
		CKFS_TRY(apply_placement(p, di->mesh_shape[i], coord[i], &lists[p->dim],
					 MAX_PIECES, e->key, err));
	}
	return CKFS_OK;
}

enum ckfs_code ckfs_entry_predict(const struct ckfs_sd_entry *e, const int64_t *coord,
				  uint32_t source, int rank, struct ckfs_chunk_list *out,
				  struct ckfs_error *err)
{
	struct ivl store[CKFS_MAX_DIMS][MAX_PIECES];
	struct ivl_list lists[CKFS_MAX_DIMS];
	struct ckfs_sd_entry x = *e;
	int copy = 0;

	if (e->kind == CKFS_ENTRY_TENSOR)
		return ckfs_entry_chunks(e, coord, source, rank, out, err);
	if (e->kind != CKFS_ENTRY_DTENSOR)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "tensor '%s': a ShardedTensor's "
				 "pieces cannot be foreseen", e->key);
	CKFS_TRY(dtensor_lists(e, coord, store, lists, &copy, err));
	if (copy)
		return CKFS_OK;
	/* A contiguous local view of the interval totals, at position 0. */
	int64_t stride = 1;
	for (int k = x.dtensor->ndim - 1; k >= 0; k--) {
		x.local.shape[k] = ivl_total(&lists[k]);
		x.local.stride[k] = stride;
		stride *= x.local.shape[k] ? x.local.shape[k] : 1;
	}
	x.local.ndim = x.dtensor->ndim;
	x.local.storage_offset = 0;
	x.local.storage_pos = 0;
	return chunks_from_view(&x, lists, source, rank, out, err);
}

enum ckfs_code ckfs_entry_chunks(const struct ckfs_sd_entry *e, const int64_t *coord,
				 uint32_t source, int rank, struct ckfs_chunk_list *out,
				 struct ckfs_error *err)
{
	struct ivl store[CKFS_MAX_DIMS][MAX_PIECES];
	struct ivl_list lists[CKFS_MAX_DIMS];

	if (e->kind == CKFS_ENTRY_TENSOR) {
		for (int k = 0; k < e->local.ndim; k++) {
			lists[k] = (struct ivl_list){ store[k], 1 };
			store[k][0] = (struct ivl){ 0, 0, e->local.shape[k] };
		}
		return chunks_from_view(e, lists, source, rank, out, err);
	}
	if (e->kind == CKFS_ENTRY_SHARDED) {
		const struct ckfs_sharded_info *si = e->sharded;
		if (!si->have_local)
			return CKFS_OK;
		for (int k = 0; k < si->ndim; k++) {
			lists[k] = (struct ivl_list){ store[k], 1 };
			store[k][0] = (struct ivl){ si->offsets[k], 0, si->sizes[k] };
		}
		return chunks_from_view(e, lists, source, rank, out, err);
	}
	int copy = 0;
	CKFS_TRY(dtensor_lists(e, coord, store, lists, &copy, err));
	if (!copy)
		return chunks_from_view(e, lists, source, rank, out, err);
	/* A copy contributes nothing, but its view must still fit its
	 * placement and its storage. */
	struct ckfs_chunk_list scratch = { 0 };
	enum ckfs_code rc = chunks_from_view(e, lists, source, rank, &scratch, err);
	free(scratch.v);
	return rc;
}

/* A chunk meeting the box keeps its strides; its file position moves by
 * the elements skipped. */
enum ckfs_code ckfs_chunks_box(struct ckfs_chunk_list *out, const struct ckfs_tensor *r,
			       const struct ckfs_box *box, const int64_t *dst,
			       struct ckfs_error *err)
{
	size_t esz = ckfs_dtype_size(r->stored_dtype);
	const int64_t *lo = box->lo, *n = box->n;

	for (uint32_t i = 0; i < r->n_chunks; i++) {
		const struct ckfs_chunk *c = &r->chunks[i];
		struct ckfs_chunk_spec x;
		int64_t a[CKFS_MAX_DIMS], b[CKFS_MAX_DIMS];
		int empty = 0;
		uint64_t skip = 0;

		for (int k = 0; k < r->ndim; k++) {
			a[k] = c->offset[k] > lo[k] ? c->offset[k] : lo[k];
			b[k] = c->offset[k] + c->shape[k] < lo[k] + n[k]
				       ? c->offset[k] + c->shape[k] : lo[k] + n[k];
			empty |= a[k] >= b[k];
		}
		if (empty)
			continue;
		for (int k = 0; k < r->ndim; k++)
			skip += (uint64_t)(a[k] - c->offset[k]) * (uint64_t)c->stride[k];
		ckfs_chunk_unpack(c, r->ndim, &x);
		x.pos = c->pos + skip * esz; /* inside the validated raw chunk */
		int s = box->ndrop;
		for (int k = s; k < r->ndim; k++) {
			x.shape[k - s] = b[k] - a[k];
			x.stride[k - s] = c->stride[k];
			x.offset[k - s] = a[k] - lo[k] + dst[k - s];
		}
		/* Size-1 dims get row-major strides, as placement.c gives them
		 * (the reader merges rows on that). */
		int nd = r->ndim - s;
		for (int k = nd - 1; k >= 0; k--)
			if (x.shape[k] == 1)
				x.stride[k] = k == nd - 1 ? 1 : x.stride[k + 1] * x.shape[k + 1];
		CKFS_TRY(ckfs_chunk_list_push(out, &x, err));
	}
	return CKFS_OK;
}
