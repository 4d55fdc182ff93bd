/* SPDX-License-Identifier: MIT */
/*
 * Block-wise FP8 on read (--dtype fp8; include/ckfs/model.h, struct
 * ckfs_fp8): a weight's values as float8_e4m3fn and its scales, one per
 * 128 x 128 block, computed from the weight's elements in fp32 (with its
 * LoRA pair added when fused):
 *
 *   s = max(amax(|block|), 1e-10) / 448 (the canonical NaN when the
 *       block holds a NaN, as torch's amax gives): the floor is vLLM's
 *       eps (per_token_group_quant_fp8, docs/formats.md), without which
 *       one fp32 subnormal among zeros gave s = 0 and every zero 0 / 0;
 *   q = float8_e4m3fn(clamp(w / s, -448, 448)), rounded to nearest even
 *       (ckfs_f32_to_f8e4m3).
 *
 * A block row's scales need all of its rows, so the first read that needs
 * them reads the whole block row, keeps its scales, and quantizes the
 * whole block row from the rows in hand. When the read wanted only part
 * of it (a slice edge cuts it, or it wanted the scales: read-ahead may
 * fill the slice of a weight's scales before those of its values), the
 * quantized block row is kept in a bounded LRU (struct ckfs_fp8_kept) for
 * the reads that want the rest, so a weight's source is read once. A read
 * of rows whose block row is not kept any more reads only those rows. One
 * thread computes a block row; others wanting it wait for it.
 * tests/gen/make_fp8_expected.py holds the reference quantizer (torch)
 * this must equal bit for bit.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/model.h"

/* A block row kept whole while quantizing is at most this many fp32
 * elements (16 MiB: a down_proj of 28672 columns); wider weights have
 * their block rows streamed for the scales and their rows read again. */
#define BLOCK_ROW_MAX (4u << 20)

/* Elements [first, first + count) of q's weight as fp32. */
static enum ckfs_code read_f32(const struct ckfs_model *m, const struct ckfs_fp8 *q,
			       uint64_t first, uint64_t count, float *dst,
			       struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	struct ckfs_tensor w = q->weight;

	w.out_dtype = CKFS_DTYPE_F32;
	return ckfs_tensor_read(m, &w, first, count, dst, scratch, err);
}

static float *buffer(struct ckfs_read_scratch *s, size_t n)
{
	return ckfs_view_scratch(s, n * sizeof(float));
}

/* Running amax of each column block over rows of w (nrows x cols). */
struct amax {
	float *max;
	unsigned char *has_nan;
};

/* max |w[j]| over n elements, and whether one is a NaN. */
CKFS_VECTOR_CLONES
static float amax_run(const float *restrict w, size_t n, unsigned char *has_nan)
{
	float m = 0.0f;
	int nan = 0;

	for (size_t j = 0; j < n; j++) {
		float v = fabsf(w[j]);
		nan |= v != v;
		m = v > m ? v : m;
	}
	*has_nan |= (unsigned char)nan;
	return m;
}

static void amax_rows(const struct ckfs_fp8 *q, const float *w, int64_t nrows, struct amax *a)
{
	for (int64_t r = 0; r < nrows; r++)
		for (int64_t b = 0; b < q->block_cols; b++) {
			int64_t c0 = b * CKFS_FP8_BLOCK;
			int64_t c1 = c0 + CKFS_FP8_BLOCK < q->cols ? c0 + CKFS_FP8_BLOCK : q->cols;
			float m = amax_run(w + r * q->cols + c0, (size_t)(c1 - c0), &a->has_nan[b]);
			if (m > a->max[b])
				a->max[b] = m;
		}
}

/* The floor on amax: an fp32 1e-10, as torch's clamp(min=1e-10) makes it. */
#define AMAX_FLOOR 1e-10f

static float scale_of(const struct amax *a, int64_t b)
{
	if (a->has_nan[b]) /* torch's amax: the canonical NaN, whatever the input's */
		return NAN;
	return (a->max[b] > AMAX_FLOOR ? a->max[b] : AMAX_FLOOR) / 448.0f;
}

/* Block row states (q->ready): its scales unknown, being computed by one
 * thread (the others wait: read-ahead fills neighbouring slices at once,
 * and each would read the block row again), known. */
enum { ROW_NONE, ROW_BUSY, ROW_READY };

/* Claim block row br: 1 when this thread is to compute it; 0 when it is
 * ready (after waiting for the thread computing it). */
static int claim(struct ckfs_fp8 *q, int64_t br)
{
	unsigned char st = atomic_load_explicit(&q->ready[br], memory_order_acquire);
	int mine = 0;

	if (st == ROW_READY)
		return 0;
	pthread_mutex_lock(&q->lock);
	while ((st = atomic_load_explicit(&q->ready[br], memory_order_acquire)) == ROW_BUSY)
		pthread_cond_wait(&q->done, &q->lock);
	if (st == ROW_NONE) {
		atomic_store_explicit(&q->ready[br], ROW_BUSY, memory_order_relaxed);
		mine = 1;
	}
	pthread_mutex_unlock(&q->lock);
	return mine;
}

/* The claimed block row br: its scales published (a NULL: it failed, and
 * is left for another read to try). */
static void publish(struct ckfs_fp8 *q, int64_t br, const struct amax *a)
{
	pthread_mutex_lock(&q->lock);
	for (int64_t b = 0; a && b < q->block_cols; b++)
		q->scales[br * q->block_cols + b] = scale_of(a, b);
	atomic_store_explicit(&q->ready[br], a ? ROW_READY : ROW_NONE, memory_order_release);
	pthread_cond_broadcast(&q->done);
	pthread_mutex_unlock(&q->lock);
}

/* The scales of block row br (claimed by this thread), from its rows:
 * kept whole in the scratch buffer when they fit (*whole then points at
 * them), else streamed. */
static enum ckfs_code compute_block_row(const struct ckfs_model *m, struct ckfs_fp8 *q,
					int64_t br, const float **whole,
					struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	int64_t r0 = br * CKFS_FP8_BLOCK;
	int64_t nrows = r0 + CKFS_FP8_BLOCK < q->rows ? CKFS_FP8_BLOCK : q->rows - r0;
	uint64_t n = (uint64_t)nrows * (uint64_t)q->cols;
	int64_t step = n <= BLOCK_ROW_MAX ? nrows : (int64_t)(BLOCK_ROW_MAX / (uint64_t)q->cols);
	struct amax a;
	enum ckfs_code rc = CKFS_OK;

	if (step < 1)
		step = 1;
	a.max = calloc((size_t)q->block_cols, sizeof(float));
	a.has_nan = calloc((size_t)q->block_cols, 1);
	float *w = buffer(scratch, (size_t)step * (size_t)q->cols);
	if (!a.max || !a.has_nan || !w)
		rc = ckfs_nomem(err);
	for (int64_t r = 0; r < nrows && rc == CKFS_OK; r += step) {
		int64_t k = r + step < nrows ? step : nrows - r;
		rc = read_f32(m, q, (uint64_t)(r0 + r) * (uint64_t)q->cols,
			      (uint64_t)k * (uint64_t)q->cols, w, scratch, err);
		if (rc == CKFS_OK)
			amax_rows(q, w, k, &a);
	}
	publish(q, br, rc == CKFS_OK ? &a : NULL);
	*whole = rc == CKFS_OK && step == nrows ? w : NULL;
	free(a.max);
	free(a.has_nan);
	return rc;
}

/* float8_e4m3fn of one fp32 value, as ckfs_f32_to_f8e4m3 (src/util/dtype.c)
 * but without branches, so the loop below vectorises. */
static inline uint8_t to_f8(float v)
{
	uint32_t bits, sign, u, normal, sub;
	float f;

	memcpy(&bits, &v, 4);
	sign = bits & 0x80000000u;
	u = bits ^ sign;
	normal = (u + ((uint32_t)(7 - 127) << 23) + 0x7FFFFu + ((u >> 20) & 1u)) >> 20;
	memcpy(&f, &u, 4);
	f += 16384.0f; /* rounds a value below 2^-6 to the subnormal grid */
	memcpy(&sub, &f, 4);
	sub -= 141u << 23;
	u = u >= 0x43F00000u ? 0x7Fu : u < (121u << 23) ? sub : normal;
	return (uint8_t)(u | (sign >> 24));
}

/* n values of one column block, all with scale s. */
CKFS_VECTOR_CLONES
static void quantize_run(const float *restrict w, size_t n, float s, unsigned char *restrict out)
{
	for (size_t i = 0; i < n; i++) {
		float v = w[i] / s;
		v = v > 448.0f ? 448.0f : v;
		v = v < -448.0f ? -448.0f : v;
		out[i] = to_f8(v);
	}
}

/* w[0..n) of block row br, starting at column c0 of its row, quantized
 * into out. */
static void quantize(const struct ckfs_fp8 *q, int64_t br, int64_t c0, const float *w,
		     uint64_t n, unsigned char *out)
{
	const float *s = q->scales + br * q->block_cols;

	for (uint64_t i = 0; i < n;) {
		int64_t b = c0 / CKFS_FP8_BLOCK;
		int64_t end = (b + 1) * CKFS_FP8_BLOCK < q->cols ? (b + 1) * CKFS_FP8_BLOCK : q->cols;
		uint64_t k = (uint64_t)(end - c0) < n - i ? (uint64_t)(end - c0) : n - i;
		quantize_run(w + i, (size_t)k, s[b], out + i);
		i += k;
		c0 = end == q->cols ? 0 : end;
	}
}

/* ---- block rows quantized whole, kept for the rest of their rows ---- */

/* Block row br of q quantized, or 0 when it is not kept; copies [from,
 * from + n) of it to out. */
static int kept_get(struct ckfs_fp8_kept *k, const struct ckfs_fp8 *q, int64_t br,
		    uint64_t from, uint64_t n, unsigned char *out)
{
	int found = 0;

	pthread_mutex_lock(&k->lock);
	for (int i = 0; i < CKFS_FP8_KEPT && !found; i++)
		if (k->slot[i].bytes && k->slot[i].q == q && k->slot[i].block_row == br) {
			memcpy(out, k->slot[i].bytes + from, n);
			k->slot[i].used = ++k->clock;
			found = 1;
		}
	pthread_mutex_unlock(&k->lock);
	return found;
}

/* The slot to use: a free one, else the least recently used; with
 * occupied_only, the least recently used occupied one (-1: none). */
static int lru_slot(const struct ckfs_fp8_kept *k, int occupied_only)
{
	int pick = -1;

	for (int i = 0; i < CKFS_FP8_KEPT; i++) {
		if (!k->slot[i].bytes) {
			if (!occupied_only)
				return i;
			continue;
		}
		if (pick < 0 || k->slot[i].used < k->slot[pick].used)
			pick = i;
	}
	return pick;
}

static void drop_slot(struct ckfs_fp8_kept *k, int i)
{
	k->bytes -= k->slot[i].size;
	free(k->slot[i].bytes);
	k->slot[i].bytes = NULL;
	k->slot[i].size = 0;
	k->slot[i].q = NULL;
}

/* Keep bytes (size bytes, malloc'd, taken over) as block row br of q,
 * dropping the least recently used block rows to stay within the budget. */
static void kept_put(struct ckfs_fp8_kept *k, const struct ckfs_fp8 *q, int64_t br,
		     unsigned char *bytes, uint64_t size)
{
	int i;

	pthread_mutex_lock(&k->lock);
	while (k->bytes + size > CKFS_FP8_KEPT_BYTES && (i = lru_slot(k, 1)) >= 0)
		drop_slot(k, i);
	i = lru_slot(k, 0);
	if (k->slot[i].bytes)
		drop_slot(k, i);
	k->slot[i].q = q;
	k->slot[i].block_row = br;
	k->slot[i].bytes = bytes;
	k->slot[i].size = size;
	k->slot[i].used = ++k->clock;
	k->bytes += size;
	pthread_mutex_unlock(&k->lock);
}

/* Block row br just computed from whole (its fp32 rows): quantized whole,
 * [i, e) of it copied to out (none: e == i), and kept when part of it was
 * not asked for (the rest belongs to other reads: a slice edge cut the
 * block row, or only its scales were asked for). 0 when out of memory
 * (the caller quantizes its part alone). */
static int quantize_whole(const struct ckfs_fp8 *q, int64_t br, const float *whole, uint64_t i,
			  uint64_t e, unsigned char *out)
{
	uint64_t row_start = (uint64_t)br * CKFS_FP8_BLOCK * (uint64_t)q->cols;
	uint64_t rows = (uint64_t)(q->rows - br * CKFS_FP8_BLOCK < CKFS_FP8_BLOCK
				   ? q->rows - br * CKFS_FP8_BLOCK : CKFS_FP8_BLOCK);
	uint64_t n = rows * (uint64_t)q->cols;
	unsigned char *all = malloc(n);

	if (!all)
		return 0;
	quantize(q, br, 0, whole, n, all);
	if (e > i)
		memcpy(out, all + (i - row_start), e - i);
	if (e - i < n)
		kept_put(q->kept, q, br, all, n);
	else
		free(all);
	return 1;
}

static enum ckfs_code read_values(const struct ckfs_model *m, struct ckfs_fp8 *q,
				  uint64_t first, uint64_t count, unsigned char *dst,
				  struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	const uint64_t cols = (uint64_t)q->cols, end = first + count;

	for (uint64_t i = first; i < end;) {
		int64_t br = (int64_t)(i / cols / CKFS_FP8_BLOCK);
		uint64_t row_start = (uint64_t)br * CKFS_FP8_BLOCK * cols;
		uint64_t row_end = row_start + CKFS_FP8_BLOCK * cols;
		uint64_t e = row_end < end ? row_end : end;
		unsigned char *out = dst + (i - first);
		const float *whole = NULL;
		if (claim(q, br))
			CKFS_TRY(compute_block_row(m, q, br, &whole, scratch, err));
		else if (kept_get(q->kept, q, br, i - row_start, e - i, out)) {
			i = e;
			continue;
		}
		if (whole && quantize_whole(q, br, whole, i, e, out)) {
			i = e;
			continue;
		}
		const float *w = whole ? whole + (i - row_start) : NULL;
		if (!w) {
			float *buf = buffer(scratch, (size_t)(e - i));
			if (!buf)
				return ckfs_nomem(err);
			CKFS_TRY(read_f32(m, q, i, e - i, buf, scratch, err));
			w = buf;
		}
		quantize(q, br, (int64_t)(i % cols), w, e - i, out);
		i = e;
	}
	return CKFS_OK;
}

static enum ckfs_code read_scales(const struct ckfs_model *m, struct ckfs_fp8 *q,
				  uint64_t first, uint64_t count, float *dst,
				  struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	const uint64_t bc = (uint64_t)q->block_cols;

	for (uint64_t br = first / bc; count && br <= (first + count - 1) / bc; br++) {
		const float *whole = NULL;
		if (!claim(q, (int64_t)br))
			continue;
		CKFS_TRY(compute_block_row(m, q, (int64_t)br, &whole, scratch, err));
		/* the values too, for the read of them that will follow */
		if (whole)
			quantize_whole(q, (int64_t)br, whole, 0, 0, NULL);
	}
	memcpy(dst, q->scales + first, count * sizeof(float));
	return CKFS_OK;
}

static enum ckfs_code fp8_read(const struct ckfs_model *m, const struct ckfs_tensor *t,
			       uint64_t first, uint64_t count, void *dst,
			       struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	if (t->view_part == CKFS_FP8_SCALES)
		return read_scales(m, t->view_state, first, count, dst, scratch, err);
	return read_values(m, t->view_state, first, count, dst, scratch, err);
}

/* The values and the scales are computed from the weight as planned. */
static size_t fp8_inputs(const struct ckfs_tensor *t, const struct ckfs_tensor *in[2])
{
	const struct ckfs_fp8 *q = t->view_state;

	in[0] = &q->weight;
	return 1;
}

/* quantization_config: block-wise e4m3 with dynamic activations, as
 * transformers' FineGrainedFP8Config and vLLM read it, the modules left
 * unquantized listed. */
static enum ckfs_code fp8_config(const struct ckfs_model *m, struct ckfs_view_config *c,
				 struct ckfs_error *err)
{
	static const char head[] = "{\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\", "
				   "\"modules_to_not_convert\": [";
	static const char tail[] =
		"], \"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]}";
	const struct ckfs_fp8_set *set = m->view_state;

	return ckfs_view_quantization(c, head, set->unconverted, set->n_unconverted, tail, err);
}

static void fp8_release(struct ckfs_model *m)
{
	struct ckfs_fp8_set *set = m->view_state;

	for (size_t i = 0; i < set->n; i++) {
		pthread_mutex_destroy(&set->weights[i].lock);
		pthread_cond_destroy(&set->weights[i].done);
	}
	if (set->kept) {
		for (size_t i = 0; i < CKFS_FP8_KEPT; i++)
			free(set->kept->slot[i].bytes);
		pthread_mutex_destroy(&set->kept->lock);
	}
}

const struct ckfs_view ckfs_view_fp8 = {
	.name = "fp8",
	.read = fp8_read,
	.inputs = fp8_inputs,
	.config = fp8_config,
	.release = fp8_release,
	.quantizes = true,
};
