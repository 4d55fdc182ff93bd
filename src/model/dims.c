/* SPDX-License-Identifier: MIT */
/*
 * Interned dim vectors (include/ckfs/model.h): a chunk holds pointers to
 * its shape, strides and offsets instead of three arrays of CKFS_MAX_DIMS.
 * A Qwen3-235B-shaped FSDP actor at world size 64 has 2.4 million chunks
 * but a few thousand distinct vectors (every expert's piece on rank r has
 * the same shape, strides and offset), so the plan shrinks from about
 * 960 MB to about 110 MB. The vectors live in the model's arena; the index
 * is an open-addressing table of pointers, grown at half full.
 */
#include "ckfs/model.h"

#include <stdlib.h>
#include <string.h>

struct ckfs_dims {
	const int64_t **slot; /* each points past its length word */
	size_t cap, n;
};

static const int64_t no_dims[1]; /* for n == 0 */

static uint64_t hash_dims(const int64_t *v, int n)
{
	uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;

	for (int i = 0; i < n; i++) {
		h ^= (uint64_t)v[i];
		h *= 0xff51afd7ed558ccdull;
		h ^= h >> 33;
	}
	return h;
}

static int same(const int64_t *stored, const int64_t *v, int n)
{
	return stored[-1] == n && memcmp(stored, v, sizeof(*v) * (size_t)n) == 0;
}

static int grow(struct ckfs_dims *d)
{
	size_t cap = d->cap ? d->cap * 2 : 256;
	const int64_t **slot = calloc(cap, sizeof(*slot));

	if (!slot)
		return 0;
	for (size_t i = 0; i < d->cap; i++) {
		const int64_t *x = d->slot[i];
		if (!x)
			continue;
		size_t j = hash_dims(x, (int)x[-1]) & (cap - 1);
		while (slot[j])
			j = (j + 1) & (cap - 1);
		slot[j] = x;
	}
	free(d->slot);
	d->slot = slot;
	d->cap = cap;
	return 1;
}

void ckfs_model_dims_release(struct ckfs_model *m)
{
	if (m->dims)
		free(m->dims->slot);
	m->dims = NULL;
}

const int64_t *ckfs_model_dims(struct ckfs_model *m, const int64_t *v, int n)
{
	struct ckfs_dims *d = m->dims;

	if (n <= 0)
		return no_dims;
	if (!d) {
		d = ckfs_arena_calloc(&m->arena, 1, sizeof(*d));
		if (!d)
			return NULL;
		m->dims = d;
	}
	if (2 * (d->n + 1) > d->cap && !grow(d))
		return NULL;
	size_t j = hash_dims(v, n) & (d->cap - 1);
	for (; d->slot[j]; j = (j + 1) & (d->cap - 1))
		if (same(d->slot[j], v, n))
			return d->slot[j];
	int64_t *x = ckfs_arena_alloc(&m->arena, sizeof(*x) * ((size_t)n + 1));
	if (!x)
		return NULL;
	x[0] = n;
	memcpy(x + 1, v, sizeof(*v) * (size_t)n);
	d->slot[j] = x + 1;
	d->n++;
	return x + 1;
}

enum ckfs_code ckfs_chunk_pack(struct ckfs_model *m, const struct ckfs_chunk_spec *s, int ndim,
			       struct ckfs_chunk *out, struct ckfs_error *err)
{
	int n = ndim > 0 ? ndim : 1; /* a scalar is a 1-d block of one */

	*out = (struct ckfs_chunk){ .source = s->source, .rank = s->rank, .dtype = s->dtype,
				    .neg = s->neg, .pos = s->pos };
	out->shape = ckfs_model_dims(m, s->shape, n);
	out->stride = ckfs_model_dims(m, s->stride, n);
	out->offset = ckfs_model_dims(m, s->offset, n);
	if (!out->shape || !out->stride || !out->offset)
		return ckfs_nomem(err);
	return CKFS_OK;
}

struct ckfs_chunk *ckfs_model_chunks(struct ckfs_model *m, const struct ckfs_chunk_spec *v,
				     size_t n, int ndim)
{
	struct ckfs_chunk *c = ckfs_arena_calloc(&m->arena, n + 1, sizeof(*c));
	struct ckfs_error err;

	for (size_t i = 0; c && i < n; i++)
		if (ckfs_chunk_pack(m, &v[i], ndim, &c[i], &err) != CKFS_OK)
			return NULL;
	return c;
}

void ckfs_chunk_unpack(const struct ckfs_chunk *c, int ndim, struct ckfs_chunk_spec *out)
{
	int n = ndim > 0 ? ndim : 1;

	*out = (struct ckfs_chunk_spec){ .source = c->source, .rank = c->rank, .dtype = c->dtype,
					 .neg = c->neg, .pos = c->pos };
	for (int k = 0; k < n && k < CKFS_MAX_DIMS; k++) {
		out->shape[k] = c->shape[k];
		out->stride[k] = c->stride[k];
		out->offset[k] = c->offset[k];
	}
}
