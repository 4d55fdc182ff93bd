/* SPDX-License-Identifier: MIT */
/*
 * A block-FP8 release (DeepSeek-V3/R1's, Kimi-K2's: each linear weight
 * F8_E4M3 with weight_scale_inv F32 [ceil(rows/128), ceil(cols/128)])
 * served in a float dtype: element (r, c) is
 *
 *     out_dtype(f32(v[r][c]) * scale[r / 128][c / 128])
 *
 * the product in float32, then rounded to nearest even, as DeepSeek's
 * fp8_cast_bf16.py (its weight_dequant kernel) and transformers'
 * Fp8Dequantize compute it; blocks at the right and bottom edges are
 * partial. A read takes the values it needs as stored (the tensor's own
 * chunks, read as F8_E4M3) and the scale rows they fall in, a window of
 * at most DEQUANT_WINDOW elements at a time into the thread's scratch.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/model.h"

static float e4m3[256]; /* every F8_E4M3 byte's value */
static pthread_once_t e4m3_once = PTHREAD_ONCE_INIT;

static void e4m3_fill(void)
{
	for (int b = 0; b < 256; b++) {
		unsigned char v = (unsigned char)b;
		e4m3[b] = (float)ckfs_dtype_load_double(CKFS_DTYPE_F8_E4M3, &v);
	}
}

#define DEQUANT_WINDOW (256u << 10) /* elements: 1 MiB of floats */

/* Elements [first, first + n) of t as stored (F8_E4M3 bytes) into raw. */
static enum ckfs_code read_stored(const struct ckfs_model *m, const struct ckfs_tensor *t,
				  uint64_t first, uint64_t n, void *raw,
				  struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	struct ckfs_tensor as_stored = *t;

	as_stored.out_dtype = t->stored_dtype;
	as_stored.view = NULL;
	as_stored.view_state = NULL;
	return ckfs_tensor_read(m, &as_stored, first, n, raw, scratch, err);
}

static enum ckfs_code dequant_read(const struct ckfs_model *m, const struct ckfs_tensor *t,
				   uint64_t first, uint64_t count, void *dst_v,
				   struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	const struct ckfs_tensor *s = t->view_state;
	const uint64_t cols = (uint64_t)t->shape[1], scols = (uint64_t)s->shape[1];
	const size_t out = ckfs_dtype_size(t->out_dtype);
	unsigned char *dst = dst_v;

	pthread_once(&e4m3_once, e4m3_fill);
	while (count > 0) {
		uint64_t n = count < DEQUANT_WINDOW ? count : DEQUANT_WINDOW;
		uint64_t r0 = first / cols, r1 = (first + n - 1) / cols;
		uint64_t b0 = r0 / CKFS_FP8_BLOCK, b1 = r1 / CKFS_FP8_BLOCK;
		uint64_t nscales = (b1 - b0 + 1) * scols;
		/* one scratch allocation: the window's values as floats, the
		 * scale rows of its blocks, then its bytes as stored */
		float *vals = ckfs_view_scratch(scratch, (size_t)(n + nscales + n / 4 + 1) *
							 sizeof(float));
		if (!vals)
			return ckfs_nomem(err);
		float *scales = vals + n;
		unsigned char *raw = (unsigned char *)(scales + nscales);
		CKFS_TRY(read_stored(m, t, first, n, raw, scratch, err));
		struct ckfs_tensor sc = *s;
		sc.out_dtype = CKFS_DTYPE_F32;
		CKFS_TRY(ckfs_tensor_read(m, &sc, b0 * scols, nscales, scales, scratch, err));
		for (uint64_t k = 0, r = r0, c = first % cols; k < n; k++) {
			const float *row = scales + (r / CKFS_FP8_BLOCK - b0) * scols;
			vals[k] = e4m3[raw[k]] * row[c / CKFS_FP8_BLOCK];
			if (++c == cols) {
				c = 0;
				r++;
			}
		}
		ckfs_convert(t->out_dtype, dst, CKFS_DTYPE_F32, vals, (size_t)n, 0);
		dst += n * out;
		first += n;
		count -= n;
	}
	return CKFS_OK;
}

/* The weight reads its own chunks (the values), and its scale tensor. */
static size_t dequant_inputs(const struct ckfs_tensor *t, const struct ckfs_tensor *in[2])
{
	in[0] = t->view_state;
	return 1;
}

/* The release's quantization_config no longer describes what is served. */
static enum ckfs_code dequant_config(const struct ckfs_model *m, struct ckfs_view_config *c,
				     struct ckfs_error *err)
{
	(void)m;
	(void)err;
	c->drop_quantization = true;
	return CKFS_OK;
}

const struct ckfs_view ckfs_view_fp8_dequant = {
	.name = "fp8-dequant",
	.read = dequant_read,
	.inputs = dequant_inputs,
	.config = dequant_config,
};
