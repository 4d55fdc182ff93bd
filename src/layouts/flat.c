/* SPDX-License-Identifier: MIT */
/*
 * Tensors packed end to end in flat 1-D buffers, as DeepSpeed ZeRO's
 * optimizer partitions hold them (src/layouts/layouts.h): a stretch of a
 * flat buffer is a run of a tensor's elements in row-major order, cut
 * wherever a partition ends, so it starts and stops at arbitrary element
 * offsets. Such a run becomes N-d blocks of the tensor, each one chunk
 * with the global tensor's row-major strides: for a matrix a partial first
 * row, a block of whole rows and a partial last row; for more dims the
 * same cut made again at each dim (at most 2·ndim − 1 blocks).
 */
#include <string.h>

#include "layouts/layouts.h"

/* The block of dim k starting at element a: dims before k fixed at a's
 * index, n indices of dim k from a's, dims after k whole. */
static void block_at(int ndim, const int64_t *shape, const uint64_t *inner, uint64_t a, int k,
		     uint64_t n, struct ckfs_chunk_spec *c)
{
	for (int j = 0; j < ndim; j++) {
		c->stride[j] = (int64_t)inner[j];
		if (j < k) {
			c->offset[j] = (int64_t)((a / inner[j]) % (uint64_t)shape[j]);
			c->shape[j] = 1;
		} else if (j == k) {
			c->offset[j] = (int64_t)((a / inner[j]) % (uint64_t)shape[j]);
			c->shape[j] = (int64_t)n;
		} else {
			c->offset[j] = 0;
			c->shape[j] = shape[j];
		}
	}
}

enum ckfs_code ckfs_flat_blocks(const struct ckfs_elem_range *el,
				const struct ckfs_flat_seg *seg, uint64_t pos,
				struct ckfs_chunk_list *out, struct ckfs_error *err)
{
	int ndim = el->ndim;
	const int64_t *shape = el->shape;
	uint64_t inner[CKFS_MAX_DIMS];
	uint64_t a = el->first, b = el->first + el->count;
	size_t es = ckfs_dtype_size(seg->dtype);
	struct ckfs_chunk_spec c;

	if (el->count == 0)
		return CKFS_OK;
	memset(&c, 0, sizeof(c));
	c.source = seg->source;
	c.rank = seg->rank;
	c.dtype = seg->dtype;
	c.neg = seg->neg;
	if (ndim == 0) { /* a scalar: its one element */
		c.pos = pos;
		return ckfs_chunk_list_push(out, &c, err);
	}
	inner[ndim - 1] = 1;
	for (int k = ndim - 2; k >= 0; k--)
		inner[k] = inner[k + 1] * (uint64_t)shape[k + 1];
	while (a < b) {
		/* The outermost dim a starts a whole index of, then the most
		 * indices of it that fit before b and before the dim wraps. */
		int k = 0;
		uint64_t n = 0;
		while (k < ndim - 1 && a % inner[k])
			k++;
		for (;; k++) {
			uint64_t room = (uint64_t)shape[k] - (a / inner[k]) % (uint64_t)shape[k];
			n = (b - a) / inner[k];
			n = n < room ? n : room;
			if (n || k == ndim - 1)
				break;
		}
		block_at(ndim, shape, inner, a, k, n, &c);
		c.pos = pos + (a - el->first) * es;
		CKFS_TRY(ckfs_chunk_list_push(out, &c, err));
		a += n * inner[k];
	}
	return CKFS_OK;
}

enum ckfs_code ckfs_flat_cut(const struct ckfs_flat_seg *segs, size_t n_segs, uint64_t at,
			     const struct ckfs_elem_range *el, struct ckfs_chunk_list *out,
			     struct ckfs_error *err)
{
	struct ckfs_elem_range rest = *el;
	uint64_t start = 0;

	for (size_t i = 0; i < n_segs && rest.count; i++) {
		uint64_t end = start + segs[i].len;
		if (at < end) {
			struct ckfs_elem_range part = rest;
			part.count = end - at < rest.count ? end - at : rest.count;
			uint64_t pos = segs[i].pos + (at - start) * ckfs_dtype_size(segs[i].dtype);
			CKFS_TRY(ckfs_flat_blocks(&part, &segs[i], pos, out, err));
			at += part.count;
			rest.first += part.count;
			rest.count -= part.count;
		}
		start = end;
	}
	if (rest.count) /* the callers check the lengths first */
		return ckfs_fail(err, CKFS_E_FORMAT, "a flat buffer ends %llu elements "
				 "before the tensor does", (unsigned long long)rest.count);
	return CKFS_OK;
}
