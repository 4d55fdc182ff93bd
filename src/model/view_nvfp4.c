/* SPDX-License-Identifier: MIT */
/*
 * compressed-tensors' nvfp4-pack-quantized weights on read (--dtype nvfp4;
 * include/ckfs/model.h, struct ckfs_ct_scheme): llm-compressor's NVFP4A16
 * scheme, weight-only FP4 that vLLM serves natively on Blackwell and
 * through its FP4 Marlin kernels elsewhere. The arithmetic is the
 * library's (compressed-tensors 0.20.1: generate_gparam, calculate_qparams,
 * quantize_and_pack_fp4 on the CPU) on a bf16 weight, each step in the
 * dtype torch computes it in:
 *
 *   g = bf16(2688 * bf16(1 / max(max|W|, 2^-126))) over the whole weight,
 *       as float32 (448 * 6: FP8 E4M3's max times FP4's; torch divides a
 *       number by a tensor as a reciprocal times it; 1 where g is Inf or NaN)
 *   s = e4m3(clamp(g * bf16(max|w| / 6), +-448)) over a group of 16
 *       consecutive elements of a row, 0.125 (e4m3's eps) where that is 0
 *   v = clamp(w / (s / g), -6, 6) in float32, rounded to E2M1's grid
 *       {0, .5, 1, 1.5, 2, 3, 4, 6}: ties at .25, 1.25, 2.5 and 5 go down,
 *       at .75, 1.75 and 3.5 up (the library's cast_to_fp4)
 *   nibble = index on that grid, bit 3 set when v < 0 (-0.1 gives 8);
 *       element 2k of the weight in byte k's low nibble, 2k + 1 high
 *
 * Byte p of weight_packed is made from weight elements 2p, 2p + 1 and
 * their group p / 8. The global scale needs the whole weight, so it is
 * computed once per weight by the first read that needs it (a whole read
 * of the weight) and kept: a reader in file order (weight_global_scale,
 * weight_packed, weight_scale) reads each weight twice, the scales kept
 * from the packed values (view_ct.c). tests/py/test_ct_views.py checks every
 * byte against the library.
 */
#include <pthread.h>
#include <string.h>

#include "ckfs/dtype.h"
#include "ckfs/model.h"

#define GROUP         CKFS_NVFP4_GROUP
/* Groups per window: 64 KiB of bf16, within L2 with its output. */
#define WINDOW_GROUPS 2048u
#define F8_EPS        0x20u /* 0.125: compressed-tensors' eps for e4m3 scales */

/* view_part: the scheme's tensors, in name order */
enum {
	GLOBAL,
	PACKED,
	SCALE
};

static inline float from_bits(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

static inline float from_bf16(uint16_t b)
{
	return from_bits((uint32_t)b << 16);
}

/* An e4m3 scale's value (never negative here; 0x7F is NaN). */
static inline float from_e4m3(uint8_t b)
{
	uint32_t e = (b >> 3) & 15u, m = b & 7u;

	if ((b & 0x7Fu) == 0x7Fu)
		return __builtin_nanf("");
	return e ? from_bits((e + 120u) << 23 | m << 20) : (float)m * 0x1p-9f;
}

static inline float round_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return from_bf16(ckfs_f32_to_bf16(u));
}

/* The weight's global scale, from a whole read of it the first time. */
static enum ckfs_code global_scale(const struct ckfs_model *m, struct ckfs_ct_weight *w, float *out,
				   struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	pthread_mutex_lock(&w->lock);
	bool known = w->global_known;
	*out = w->global;
	pthread_mutex_unlock(&w->lock);
	if (known)
		return CKFS_OK;

	uint64_t groups = w->weight.numel / GROUP;
	float a = 0.0f;
	for (uint64_t g = 0; g < groups; g += WINDOW_GROUPS) {
		uint64_t n = groups - g < WINDOW_GROUPS ? groups - g : WINDOW_GROUPS;
		const uint16_t *buf = NULL;
		CKFS_TRY(ckfs_ct_read_groups(m, w, g, n, &buf, scratch, err));
		float b = ckfs_ct_amax(buf, (size_t)(n * GROUP));
		a = b != b || b > a ? b : a; /* NaN sticks */
	}
	float d = a != a ? a : a < 0x1p-126f ? 0x1p-126f : a;
	float s = round_bf16(2688.0f * round_bf16(1.0f / d));
	s = s != s || s == __builtin_inff() ? 1.0f : s;

	pthread_mutex_lock(&w->lock);
	w->global = s;
	w->global_known = true;
	pthread_mutex_unlock(&w->lock);
	*out = s;
	return CKFS_OK;
}

/* The e4m3 scale of one group under global scale g. */
static uint8_t group_scale(const uint16_t *w, float g)
{
	float s = g * round_bf16(ckfs_ct_amax(w, GROUP) / 6.0f);
	uint32_t bits;

	s = s < -448.0f ? -448.0f : s > 448.0f ? 448.0f : s;
	memcpy(&bits, &s, 4);
	uint8_t b = ckfs_f32_to_f8e4m3(bits);
	return (b & 0x7Fu) == 0 ? F8_EPS : b;
}

/* The nibbles of one group with scale sc: each value's index on E2M1's
 * grid and sign. A NaN fails every comparison: nibble 0 (torch's cast of
 * NaN to int8 is undefined). Vectorised: the divisions are most of the
 * view's cost. */
CKFS_VECTOR_CLONES
static void quantize_group(const uint16_t *restrict w, float t, uint32_t *restrict nib)
{
	for (int k = 0; k < GROUP; k++) {
		float v = from_bf16(w[k]) / t, a = __builtin_fabsf(v);
		uint32_t i = (uint32_t)(a > 0.25f) + (uint32_t)(a >= 0.75f) +
			     (uint32_t)(a > 1.25f) + (uint32_t)(a >= 1.75f) + (uint32_t)(a > 2.5f) +
			     (uint32_t)(a >= 3.5f) + (uint32_t)(a > 5.0f);
		nib[k] = i | (uint32_t)(v < 0.0f) << 3;
	}
}

/* Bytes [p0, p1) of one group (p0, p1 <= 8) with scale sc into out. */
static void pack_run(const uint16_t *w, unsigned p0, unsigned p1, uint8_t sc, float g,
		     unsigned char *out)
{
	float t = from_e4m3(sc) / g;
	uint32_t nib[GROUP];

	quantize_group(w, t, nib);
	for (unsigned p = p0; p < p1; p++)
		out[p - p0] = (uint8_t)(nib[2 * p] | nib[2 * p + 1] << 4);
}

/* Packed bytes [first, first + count): 8 per group. */
static enum ckfs_code read_packed(const struct ckfs_model *m, struct ckfs_ct_weight *w,
				  uint64_t first, uint64_t count, unsigned char *dst,
				  struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	const uint64_t per = GROUP / 2, end = first + count;
	float g;

	CKFS_TRY(global_scale(m, w, &g, scratch, err));
	for (uint64_t g0 = first / per; g0 * per < end; g0 += WINDOW_GROUPS) {
		uint64_t n = (end + per - 1) / per - g0;
		const uint16_t *buf = NULL;
		n = n < WINDOW_GROUPS ? n : WINDOW_GROUPS;
		CKFS_TRY(ckfs_ct_read_groups(m, w, g0, n, &buf, scratch, err));
		uint8_t sc[WINDOW_GROUPS];
		for (uint64_t i = 0; i < n; i++) {
			uint64_t b0 = (g0 + i) * per, p0 = b0 > first ? b0 : first;
			uint64_t p1 = b0 + per < end ? b0 + per : end;
			sc[i] = group_scale(buf + i * GROUP, g);
			pack_run(buf + i * GROUP, (unsigned)(p0 - b0), (unsigned)(p1 - b0), sc[i],
				 g, dst + (p0 - first));
		}
		ckfs_ct_keep(w, g0, n, sc);
	}
	return CKFS_OK;
}

/* Scales [first, first + count): scale e is group e. */
static enum ckfs_code read_scales(const struct ckfs_model *m, struct ckfs_ct_weight *w,
				  uint64_t first, uint64_t count, unsigned char *dst,
				  struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	float g;

	if (ckfs_ct_take(w, first, count, dst))
		return CKFS_OK;
	CKFS_TRY(global_scale(m, w, &g, scratch, err));
	for (uint64_t i = 0; i < count; i += WINDOW_GROUPS) {
		uint64_t n = count - i < WINDOW_GROUPS ? count - i : WINDOW_GROUPS;
		const uint16_t *buf = NULL;
		CKFS_TRY(ckfs_ct_read_groups(m, w, first + i, n, &buf, scratch, err));
		for (uint64_t k = 0; k < n; k++)
			dst[i + k] = group_scale(buf + k * GROUP, g);
	}
	return CKFS_OK;
}

static enum ckfs_code nvfp4_read(const struct ckfs_model *m, const struct ckfs_tensor *t,
				 uint64_t first, uint64_t count, void *dst,
				 struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	struct ckfs_ct_weight *w = t->view_state;
	float g;

	if (t->view_part == PACKED)
		return read_packed(m, w, first, count, dst, scratch, err);
	if (t->view_part == SCALE)
		return read_scales(m, w, first, count, dst, scratch, err);
	CKFS_TRY(global_scale(m, w, &g, scratch, err));
	memcpy(dst, &g, sizeof(g)); /* [1]: first 0, count 1 */
	return CKFS_OK;
}

/* The scheme's fields, keys sorted, as compressed-tensors 0.20.1's
 * ModelCompressor.update_config writes them for llm-compressor's NVFP4A16
 * preset (its QuantizationConfig.model_dump: null fields kept, the
 * weights' unset optional fields dropped). */
static enum ckfs_code nvfp4_config(const struct ckfs_model *m, struct ckfs_view_config *c,
				   struct ckfs_error *err)
{
	static const char head[] =
		"{\"config_groups\": {\"group_0\": {\"format\": \"nvfp4-pack-quantized\", "
		"\"input_activations\": null, \"output_activations\": null, "
		"\"targets\": [\"Linear\"], \"weights\": {\"dynamic\": false, "
		"\"group_size\": 16, \"num_bits\": 4, \"scale_dtype\": "
		"\"torch.float8_e4m3fn\", \"strategy\": \"tensor_group\", "
		"\"symmetric\": true, \"type\": \"float\"}}}, \"format\": "
		"\"nvfp4-pack-quantized\", \"global_compression_ratio\": null, \"ignore\": [";

	return ckfs_ct_config(m, head, c, err);
}

static const struct ckfs_ct_scheme scheme = {
	.word = "nvfp4",
	.group = GROUP,
	.scale_part = SCALE,
	.n_parts = 3,
	.parts = {
		[GLOBAL] = { "weight_global_scale", CKFS_DTYPE_F32, 0, 1 },
		[PACKED] = { "weight_packed", CKFS_DTYPE_U8, 2, 0 },
		[SCALE] = { "weight_scale", CKFS_DTYPE_F8_E4M3, GROUP, 0 },
	},
};

const struct ckfs_view ckfs_view_nvfp4 = {
	.name = "nvfp4",
	.read = nvfp4_read,
	.inputs = ckfs_ct_inputs,
	.config = nvfp4_config,
	.release = ckfs_ct_release,
	.quantizes = true,
	.ct = &scheme,
};
