/* SPDX-License-Identifier: MIT */
/*
 * Plan invariants (include/ckfs/model.h): each chunk lies inside its
 * tensor, chunks never overlap, and together they hold exactly numel
 * elements, so every element has exactly one source. Checked on metadata
 * only, before a model is served. Also what the safetensors header needs
 * of a tensor: a name that is valid UTF-8 (JSON text), not empty, not the
 * header's reserved key "__metadata__" and unique in the model, and a byte
 * size within CKFS_MAX_SERVED_BYTES.
 */
#include "ckfs/model.h"

#include <stdlib.h>
#include <string.h>

#include "ckfs/text.h"

static enum ckfs_code check_name_and_size(const struct ckfs_tensor *t,
					  struct ckfs_error *err)
{
	const unsigned char *p = (const unsigned char *)t->name;
	uint64_t stored, out;

	for (size_t k; *p; p += k)
		if (!(k = ckfs_utf8_seq(p)))
			return ckfs_fail(err, CKFS_E_FORMAT, "tensor '%s': name is not "
					 "valid UTF-8 (byte %zu)", t->name,
					 (size_t)(p - (const unsigned char *)t->name));
	/* safetensors keeps its metadata under this key; a tensor of that
	 * name makes a header every reader refuses. */
	if (strcmp(t->name, "__metadata__") == 0)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "tensor '__metadata__': the "
				 "name is reserved by the safetensors format");
	if (!t->name[0])
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "a tensor has an empty name");
	if (__builtin_mul_overflow(t->numel, (uint64_t)ckfs_dtype_size(t->stored_dtype),
				   &stored) ||
	    __builtin_mul_overflow(t->numel, (uint64_t)ckfs_dtype_size(t->out_dtype), &out) ||
	    stored > CKFS_MAX_SERVED_BYTES || out > CKFS_MAX_SERVED_BYTES)
		return ckfs_fail(err, CKFS_E_LIMIT, "tensor '%s': too large to serve "
				 "(%llu elements of %zu bytes; the limit is %llu bytes)",
				 t->name, (unsigned long long)t->numel,
				 ckfs_dtype_size(t->stored_dtype) > ckfs_dtype_size(t->out_dtype)
					 ? ckfs_dtype_size(t->stored_dtype)
					 : ckfs_dtype_size(t->out_dtype),
				 (unsigned long long)CKFS_MAX_SERVED_BYTES);
	return CKFS_OK;
}

static int boxes_overlap(const struct ckfs_chunk *a, const struct ckfs_chunk *b,
			 int ndim)
{
	for (int k = 0; k < ndim; k++) {
		if (a->offset[k] + a->shape[k] <= b->offset[k] ||
		    b->offset[k] + b->shape[k] <= a->offset[k])
			return 0;
	}
	return 1;
}

enum ckfs_code ckfs_plan_validate_tensor(const struct ckfs_model *m,
					 const struct ckfs_tensor *t,
					 struct ckfs_error *err)
{
	uint64_t covered = 0;
	(void)m;

	CKFS_TRY(check_name_and_size(t, err));
	/* Chunks one after another along dim 0 (FSDP's Shard(0), in rank
	 * order) cannot overlap: skip the pairwise check, which costs
	 * world^2 per tensor. Otherwise (or when they might) compare every
	 * pair, which also names the ranks that overlap. */
	bool rows = t->ndim > 0;
	for (uint32_t i = 1; rows && i < t->n_chunks; i++)
		rows = t->chunks[i - 1].offset[0] + t->chunks[i - 1].shape[0] <=
		       t->chunks[i].offset[0];
	for (uint32_t i = 0; i < t->n_chunks; i++) {
		const struct ckfs_chunk *c = &t->chunks[i];
		uint64_t n = 1;
		for (int k = 0; k < t->ndim; k++) {
			if (c->offset[k] < 0 || c->shape[k] <= 0 ||
			    c->offset[k] > t->shape[k] - c->shape[k])
				return ckfs_fail(err, CKFS_E_INVALID,
						 "tensor '%s': the shard of rank %d lies "
						 "outside the global shape", t->name,
						 c->rank);
			n *= (uint64_t)c->shape[k];
		}
		covered += n;
		for (uint32_t j = 0; !rows && j < i; j++)
			if (boxes_overlap(c, &t->chunks[j], t->ndim))
				return ckfs_fail(err, CKFS_E_INVALID,
						 "tensor '%s': shards of ranks %d and "
						 "%d overlap", t->name,
						 t->chunks[j].rank, c->rank);
	}
	if (covered != t->numel)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "tensor '%s': shards hold %llu of %llu elements "
				 "(missing or extra ranks?)", t->name,
				 (unsigned long long)covered,
				 (unsigned long long)t->numel);
	return CKFS_OK;
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp((*(const struct ckfs_tensor *const *)a)->name,
		      (*(const struct ckfs_tensor *const *)b)->name);
}

/* Sizes again: the served dtypes were chosen after the tensors were
 * validated one by one (--dtype applies to the whole model). */
static enum ckfs_code check_sizes(const struct ckfs_tensor *v, size_t n, struct ckfs_error *err)
{
	for (size_t i = 0; i < n; i++)
		CKFS_TRY(check_name_and_size(&v[i], err));
	return CKFS_OK;
}

enum ckfs_code ckfs_plan_validate_model(const struct ckfs_model *m,
					struct ckfs_error *err)
{
	CKFS_TRY(check_sizes(m->tensors, m->n_tensors, err));
	if (m->lora)
		CKFS_TRY(check_sizes(m->lora->tensors, m->lora->n_tensors, err));

	const struct ckfs_tensor **by = calloc(m->n_tensors + 1, sizeof(*by));
	enum ckfs_code rc = CKFS_OK;

	if (!by)
		return ckfs_nomem(err);
	for (size_t i = 0; i < m->n_tensors; i++)
		by[i] = &m->tensors[i];
	qsort(by, m->n_tensors, sizeof(*by), cmp_name);
	for (size_t i = 1; i < m->n_tensors && rc == CKFS_OK; i++)
		if (strcmp(by[i]->name, by[i - 1]->name) == 0)
			rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': two tensors would be "
				       "served as '%s'", m->src_dir, by[i]->name);
	free(by);
	return rc;
}
