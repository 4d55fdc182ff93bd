/* SPDX-License-Identifier: MIT */
/*
 * compressed-tensors' pack-quantized W4A16 on read (--dtype w4a16;
 * include/ckfs/model.h, struct ckfs_ct_scheme). The arithmetic is the
 * library's (compressed-tensors 0.20: calculate_qparams, _quantize,
 * pack_to_int32) on a bf16 model, each step rounded to bf16 as torch's
 * bf16 operations round it:
 *
 *   s = bf16(max(|min|, |max|) / 7.5) over a group of 128 consecutive
 *       elements of a row (q_max - q_min = 15, halved: symmetric);
 *       s = 2^-7 (bf16's eps) where that is 0
 *   q = round_half_even(clamp(bf16(w / s), -8, 7))
 *   word j of a row = sum over k < 8 of (q[8j + k] + 8) << 4k
 *
 * A group never crosses a row (the input dim is a multiple of 128), so
 * packed element p is made from weight elements [8p, 8p + 8) and their
 * group p / 16, and scale e is group e: any range of either is a
 * contiguous run of the weight, read in windows of whole groups. The
 * scales a read of values computes are kept for the read of the scales
 * that follows it in the file (view_ct.c).
 * tests/py/test_ct_views.py checks every byte against the library.
 */
#include <stdlib.h>
#include <string.h>

#include "ckfs/dtype.h"
#include "ckfs/model.h"

#define GROUP CKFS_W4A16_GROUP
/* Groups per window: 512 KiB of bf16, within L2 with its output. */
#define WINDOW_GROUPS 2048u
#define BF16_EPS 0x3C00u /* 2^-7, torch.finfo(torch.bfloat16).eps */

/* view_part: the scheme's tensors, in name order */
enum {
	PACKED,
	SCALE,
	SHAPE
};

static inline float from_bf16(uint16_t b)
{
	uint32_t u = (uint32_t)b << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/* f rounded to bf16 (nearest even) and back, for a finite or infinite f:
 * the rounding torch applies to each bf16 operation's float result. */
static inline float round_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
	memcpy(&f, &u, 4);
	return f;
}

/* The scale of one group, as bf16 bits. */
static uint16_t group_scale(const uint16_t *w)
{
	float s = ckfs_ct_amax(w, GROUP) / 7.5f;
	uint32_t bits;

	memcpy(&bits, &s, 4);
	uint16_t b = ckfs_f32_to_bf16(bits);
	return (b & 0x7FFFu) == 0 ? BF16_EPS : b;
}

/* n values with scale s as q + 8 (0..15), one a byte: vectorised. A NaN
 * quotient (a group holding a NaN or an Inf) is written as 0 (q + 8 = 8):
 * torch's cast of NaN to int8 is undefined. */
CKFS_VECTOR_CLONES
static void quantize_run(const uint16_t *restrict w, size_t n, float s, uint8_t *restrict q)
{
	for (size_t i = 0; i < n; i++) {
		float v = round_bf16(from_bf16(w[i]) / s);
		v = v != v ? 0.0f : v;
		v = v < -8.0f ? -8.0f : v;
		v = v > 7.0f ? 7.0f : v;
		/* round half to even: exact for |v| <= 2^22 */
		v = (v + 12582912.0f) - 12582912.0f;
		q[i] = (uint8_t)((int)v + 8);
	}
}

/* words x 8 elements of one group, all with scale s, packed: element k of
 * a word in bits 4k..4k+3. */
static void pack_run(const uint16_t *w, size_t words, float s, unsigned char *out)
{
	uint8_t q[GROUP];

	quantize_run(w, words * 8, s, q);
	for (size_t j = 0; j < words; j++) {
		uint32_t word = 0;
		for (int k = 0; k < 8; k++)
			word |= (uint32_t)q[8 * j + (size_t)k] << (4 * k);
		memcpy(out + 4 * j, &word, 4); /* dst need not be aligned */
	}
}

/* Packed elements [first, first + count): 16 per group. */
static enum ckfs_code read_packed(const struct ckfs_model *m, struct ckfs_ct_weight *w,
				  uint64_t first, uint64_t count, unsigned char *dst,
				  struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	const uint64_t per = GROUP / 8, end = first + count;

	for (uint64_t g = first / per; g * per < end; g += WINDOW_GROUPS) {
		uint64_t n = (end + per - 1) / per - g;
		const uint16_t *buf = NULL;
		n = n < WINDOW_GROUPS ? n : WINDOW_GROUPS;
		CKFS_TRY(ckfs_ct_read_groups(m, w, g, n, &buf, scratch, err));
		uint16_t sc[WINDOW_GROUPS];
		for (uint64_t i = 0; i < n; i++) {
			uint64_t p0 = (g + i) * per, p1 = p0 + per;
			const uint16_t *grp = buf + i * GROUP;
			sc[i] = group_scale(grp);
			p0 = p0 > first ? p0 : first;
			p1 = p1 < end ? p1 : end;
			if (p0 < p1)
				pack_run(grp + (p0 - (g + i) * per) * 8, (size_t)(p1 - p0),
					 from_bf16(sc[i]), dst + 4 * (p0 - first));
		}
		ckfs_ct_keep(w, g, n, sc);
	}
	return CKFS_OK;
}

/* Scales [first, first + count): scale e is group e. */
static enum ckfs_code read_scales(const struct ckfs_model *m, struct ckfs_ct_weight *w,
				  uint64_t first, uint64_t count, unsigned char *dst,
				  struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	if (ckfs_ct_take(w, first, count, dst))
		return CKFS_OK;
	for (uint64_t i = 0; i < count; i += WINDOW_GROUPS) {
		uint64_t n = count - i < WINDOW_GROUPS ? count - i : WINDOW_GROUPS;
		const uint16_t *buf = NULL;
		CKFS_TRY(ckfs_ct_read_groups(m, w, first + i, n, &buf, scratch, err));
		for (uint64_t k = 0; k < n; k++) {
			uint16_t b = group_scale(buf + k * GROUP);
			memcpy(dst + 2 * (i + k), &b, 2);
		}
	}
	return CKFS_OK;
}

static enum ckfs_code w4a16_read(const struct ckfs_model *m, const struct ckfs_tensor *t,
				 uint64_t first, uint64_t count, void *dst,
				 struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	struct ckfs_ct_weight *w = t->view_state;

	if (t->view_part == PACKED)
		return read_packed(m, w, first, count, dst, scratch, err);
	if (t->view_part == SCALE)
		return read_scales(m, w, first, count, dst, scratch, err);
	int64_t shape[2] = { w->weight.shape[0], w->weight.shape[1] };
	memcpy(dst, shape + first, count * sizeof(int64_t));
	return CKFS_OK;
}

/* The scheme's fields, keys sorted, as compressed-tensors 0.20.1's
 * ModelCompressor.update_config writes them for llm-compressor's W4A16
 * preset (its QuantizationConfig.model_dump: null fields kept, the
 * weights' unset optional fields dropped). */
static enum ckfs_code w4a16_config(const struct ckfs_model *m, struct ckfs_view_config *c,
				   struct ckfs_error *err)
{
	static const char head[] =
		"{\"config_groups\": {\"group_0\": {\"format\": \"pack-quantized\", "
		"\"input_activations\": null, \"output_activations\": null, "
		"\"targets\": [\"Linear\"], \"weights\": {\"dynamic\": false, "
		"\"group_size\": 128, \"num_bits\": 4, \"strategy\": \"group\", "
		"\"symmetric\": true, \"type\": \"int\"}}}, \"format\": \"pack-quantized\", "
		"\"global_compression_ratio\": null, \"ignore\": [";

	return ckfs_ct_config(m, head, c, err);
}

static const struct ckfs_ct_scheme scheme = {
	.word = "w4a16",
	.group = GROUP,
	.scale_part = SCALE,
	.n_parts = 3,
	.parts = {
		[PACKED] = { "weight_packed", CKFS_DTYPE_I32, 8, 0 },
		[SCALE] = { "weight_scale", CKFS_DTYPE_BF16, GROUP, 0 },
		[SHAPE] = { "weight_shape", CKFS_DTYPE_I64, 0, 2 },
	},
};

const struct ckfs_view ckfs_view_w4a16 = {
	.name = "w4a16",
	.read = w4a16_read,
	.inputs = ckfs_ct_inputs,
	.config = w4a16_config,
	.release = ckfs_ct_release,
	.quantizes = true,
	.ct = &scheme,
};
