/* SPDX-License-Identifier: MIT */
/*
 * LoRA fused on read (--lora=fuse): the elements of a base weight W with
 * scale * (B @ A) added, computed as peft's merge_and_unload does: the
 * product in fp32, times the scale, added to W in fp32, then converted to
 * the output dtype. Only the rows a read covers are computed. A and B are
 * read once per model, on their first fused read, and kept as fp32.
 *
 * The sum over the rank runs in order k = 0 .. r-1 without fused
 * multiply-adds, so every machine gives the same bytes (torch's blocked
 * sgemm sums in another order: docs/formats.md gives the tolerance).
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/model.h"

/* Elements fused per step: an fp32 buffer of this many stays in L2. */
enum { FUSE_BATCH = 16384 };

/* Elements [first, first + count) of t as fp32, without its LoRA pair. */
static enum ckfs_code read_f32(const struct ckfs_model *m, const struct ckfs_tensor *t,
			       uint64_t first, uint64_t count, float *dst,
			       struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	struct ckfs_tensor plain = *t;

	plain.out_dtype = CKFS_DTYPE_F32;
	plain.view = NULL;
	plain.view_state = NULL;
	return ckfs_tensor_read(m, &plain, first, count, dst, scratch, err);
}

/* A then B as fp32, read on the first call (one thread reads, the others
 * wait for it). */
static enum ckfs_code pair_load(const struct ckfs_model *m, struct ckfs_lora_pair *p,
				const float **out, struct ckfs_error *err)
{
	float *ab = atomic_load_explicit(&p->ab, memory_order_acquire);
	enum ckfs_code rc = CKFS_OK;

	if (ab) {
		*out = ab;
		return CKFS_OK;
	}
	pthread_mutex_lock(&p->lock);
	ab = atomic_load_explicit(&p->ab, memory_order_relaxed);
	if (!ab) {
		struct ckfs_read_scratch scratch = { 0 };
		ab = malloc((p->a->numel + p->b->numel) * sizeof(float));
		if (!ab)
			rc = ckfs_nomem(err);
		if (rc == CKFS_OK)
			rc = read_f32(m, p->a, 0, p->a->numel, ab, &scratch, err);
		if (rc == CKFS_OK)
			rc = read_f32(m, p->b, 0, p->b->numel, ab + p->a->numel, &scratch, err);
		ckfs_read_scratch_release(&scratch);
		if (rc == CKFS_OK) {
			atomic_store_explicit(&p->ab, ab, memory_order_release);
		} else {
			free(ab);
			ab = NULL;
		}
	}
	pthread_mutex_unlock(&p->lock);
	*out = ab;
	return rc;
}

/* Columns summed at once: their sums stay in vector registers across the
 * rank loop instead of going to memory r times. */
enum { COL_BLOCK = 64 };

/* w[j] += scale * sum_k B[row][k] * A[k][c0 + j] for j < len, with a at
 * A[0][c0] (rows of A are in apart). */
CKFS_VECTOR_CLONES
static void add_row_delta(float *restrict w, const float *restrict a,
			  const float *restrict brow, int64_t r, int64_t in, size_t len,
			  float scale)
{
	size_t j0 = 0;

	for (; j0 + COL_BLOCK <= len; j0 += COL_BLOCK) {
		float acc[COL_BLOCK] = { 0 };
		for (int64_t k = 0; k < r; k++) {
			const float bk = brow[k];
			const float *arow = a + k * in + (int64_t)j0;
#pragma GCC unroll 64
			for (size_t j = 0; j < COL_BLOCK; j++)
				acc[j] = fmaf(bk, arow[j], acc[j]);
		}
		for (size_t j = 0; j < COL_BLOCK; j++)
			w[j0 + j] += acc[j] * scale;
	}
	for (size_t j = j0; j < len; j++) {
		float acc = 0;
		for (int64_t k = 0; k < r; k++)
			acc = fmaf(brow[k], a[k * in + (int64_t)j], acc);
		w[j] += acc * scale;
	}
}

static enum ckfs_code lora_read(const struct ckfs_model *m, const struct ckfs_tensor *t,
				uint64_t first, uint64_t count, void *dst,
				struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	struct ckfs_lora_pair *p = t->view_state;
	const int64_t r = p->a->shape[0], in = t->shape[1];
	const size_t osz = ckfs_dtype_size(t->out_dtype);
	const float *ab;

	CKFS_TRY(pair_load(m, p, &ab, err));
	float *w = ckfs_view_scratch(scratch, FUSE_BATCH * sizeof(float));
	if (!w)
		return ckfs_nomem(err);
	for (uint64_t done = 0; done < count;) {
		uint64_t n = count - done < FUSE_BATCH ? count - done : FUSE_BATCH;
		uint64_t i = first + done, end = i + n;
		CKFS_TRY(read_f32(m, t, i, n, w, scratch, err));
		while (i < end) {
			uint64_t row = i / (uint64_t)in, c0 = i % (uint64_t)in;
			size_t len = (size_t)((uint64_t)in - c0 < end - i ? (uint64_t)in - c0
									 : end - i);
			add_row_delta(w + (i - first - done), ab + c0,
				      ab + p->a->numel + row * (uint64_t)r, r, in, len, p->scale);
			i += len;
		}
		ckfs_convert(t->out_dtype, (unsigned char *)dst + done * osz, CKFS_DTYPE_F32, w,
			     (size_t)n, 0);
		done += n;
	}
	return CKFS_OK;
}

/* A fused weight reads its own chunks, and A and B. */
static size_t lora_inputs(const struct ckfs_tensor *t, const struct ckfs_tensor *in[2])
{
	const struct ckfs_lora_pair *p = t->view_state;

	in[0] = p->a;
	in[1] = p->b;
	return 2;
}

const struct ckfs_view ckfs_view_lora = { .name = "lora",
					  .read = lora_read,
					  .inputs = lora_inputs };
