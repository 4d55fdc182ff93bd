/* SPDX-License-Identifier: MIT */
/*
 * The verl FSDP reader's state shared by its two files (private to them):
 * fsdp.c (rank files, the sequential path, the output tensors) and
 * fsdp_plan.c (the fast path: a plan from rank 0, the other ranks checked
 * after).
 */
#ifndef CKFS_LAYOUTS_FSDP_INT_H
#define CKFS_LAYOUTS_FSDP_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "layouts/layouts.h"

/* What every rank's entry of one key must agree with: the first rank's
 * (rank 0's on the fast path), kept small. */
struct expect {
	enum ckfs_entry_kind kind;
	enum ckfs_dtype dtype;              /* first rank holding data */
	int ndim;
	const int64_t *shape;               /* global (DTensor, ShardedTensor), else local */
	const struct ckfs_dtensor_info *di; /* mesh and placements (DTensor) */
	int rank;                           /* whose entry it is */
};

struct acc {
	const struct ckfs_sd_entry *first; /* from the first rank read */
	struct expect x;
	int n_ranks_seen;
	struct ckfs_chunk_list chunks;
	struct ckfs_chunk_list copies;     /* other ranks' copies of a plain tensor */
	/* The fast path (rank_plan): the key in m's arena, the chunks
	 * already packed. */
	const char *key;
	struct ckfs_chunk *packed, *packed_copies;
	uint32_t n_packed, n_packed_copies;
};

/* What the build holds while it reads the ranks. */
struct build {
	struct ckfs_model *m;
	const struct ckfs_model_options *opt;
	struct ckfs_torch_file first;   /* rank 0's file, open to the end */
	size_t n_keys;
	const char **keys, **names;     /* rank 0's keys, their HF names */
	size_t *order;                  /* key indices sorted by key */
	struct acc *accs;               /* one per key */
	long *ranks;                    /* global rank at each mesh position */
	int64_t (*coords)[CKFS_MAX_DIMS];
};

/* The fast path's plan (fsdp_plan.c). */
struct rank_plan;

/* ---- fsdp.c ---- */

/* The expectation set by entry f of rank `rank` (pointers into f). */
struct expect fsdp_expect_of(const struct ckfs_sd_entry *f, int rank);
/* Check one rank's entry against the expectation of its key: kind,
 * dtype, shapes, device mesh, placements and the mesh coordinate. */
enum ckfs_code fsdp_check_entry(const struct expect *f, const struct ckfs_sd_entry *e, int rank,
				const int64_t *coord, struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Index of rank 0's key equal to key, or SIZE_MAX: keys[order[...]] is
 * sorted (n keys). */
size_t fsdp_find_key(const char **keys, const size_t *order, size_t n, const char *key);

/* ---- fsdp_plan.c ---- */

/* The fast path when rank 0's state dict allows it (*out set: the plan,
 * the build's accs filled), else CKFS_OK with *out NULL and nothing done.
 * The other ranks are checked now, unless the plan cache holds these
 * very files or *defer is set: then fsdp_plan_defer_checks once the
 * tensors are made. */
enum ckfs_code fsdp_plan_open(struct build *b, struct rank_plan **out, bool *defer,
			      struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Hand rp's checks to m (src/model/checks.c), for a thread started at
 * the end of ckfs_model_open once the served tensors are confirmed to be
 * the plan's; rp is taken in every case. */
enum ckfs_code fsdp_plan_defer_checks(struct rank_plan *rp, struct ckfs_model *m,
				      struct ckfs_error *err) CKFS_WARN_UNUSED;
void fsdp_rank_plan_free(void *p);

#endif
