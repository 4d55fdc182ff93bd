/* SPDX-License-Identifier: MIT */
/*
 * Plan invariants (include/ckfs/model.h): each chunk lies inside its
 * tensor, chunks never overlap, and together they hold exactly numel
 * elements, so every element has exactly one source. Checked on metadata
 * only, before a model is served.
 */
#include "ckfs/model.h"

#include <stdio.h>

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
		for (uint32_t j = 0; j < i; j++)
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
