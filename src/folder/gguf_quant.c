/* SPDX-License-Identifier: MIT */
/*
 * Rows of float as ggml's types (include/ckfs/gguf.h), bit for bit what
 * gguf-py's numpy quantizers write: every step is one float32 operation
 * in the order numpy does it (x86-64 evaluates float in float: no excess
 * precision to round differently), f16 conversions round to nearest even.
 */
#include <math.h>
#include <string.h>

#include "ckfs/dtype.h"
#include "ckfs/gguf.h"

#define QK 32 /* values per block of Q8_0 and Q4_0 */

static uint32_t bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static void put16(unsigned char *p, uint16_t h)
{
	p[0] = (unsigned char)h;
	p[1] = (unsigned char)(h >> 8);
}

uint64_t ckfs_gguf_row_bytes(enum ckfs_gguf_type t, int64_t n)
{
	switch (t) {
	case CKFS_GGUF_F32: return (uint64_t)n * 4;
	case CKFS_GGUF_F16:
	case CKFS_GGUF_BF16: return (uint64_t)n * 2;
	case CKFS_GGUF_Q8_0: return (uint64_t)n / QK * (2 + QK);
	case CKFS_GGUF_Q4_0: return (uint64_t)n / QK * (2 + QK / 2);
	}
	return 0;
}

/* gguf-py's BF16: NaN made quiet keeping its sign and top payload bits,
 * else round to nearest even (ggml_compute_fp32_to_bf16). */
static uint16_t to_bf16(float f)
{
	uint32_t u = bits(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 64);
	return (uint16_t)(((uint64_t)u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* The index of the block's largest magnitude as numpy's argmax of abs()
 * finds it: the first NaN when there is one (numpy's max and argmax
 * propagate NaN), else the first of the largest. */
static int argmax_abs(const float *x)
{
	int k = 0;
	for (int i = 0; i < QK; i++) {
		if (isnan(x[i]))
			return i;
		if (fabsf(x[i]) > fabsf(x[k]))
			k = i;
	}
	return k;
}

/* numpy's float -> integer cast of what the quantizers make: NaN (a NaN
 * or infinite block) becomes 0 there (x86's conversion, then the low
 * bits); the rest is in range. Here without C's undefined behaviour. */
static int to_int(float v)
{
	return isnan(v) ? 0 : (int)v;
}

static void q8_0(const float *x, unsigned char *out)
{
	/* abs(blocks).max() / 127: a NaN anywhere makes the scale NaN */
	float amax = fabsf(x[argmax_abs(x)]);
	float d = amax / 127.0f;
	float id = d == 0 ? 0.0f : 1.0f / d;
	put16(out, ckfs_f32_to_f16(bits(d)));
	for (int i = 0; i < QK; i++) /* half away from 0 */
		out[2 + i] = (unsigned char)(signed char)to_int(roundf(x[i] * id));
}

static void q4_0(const float *x, unsigned char *out)
{
	float max = x[argmax_abs(x)]; /* the first value of largest magnitude */
	float d = max / -8.0f;
	float id = d == 0 ? 0.0f : 1.0f / d;
	unsigned char q[QK];
	put16(out, ckfs_f32_to_f16(bits(d)));
	for (int i = 0; i < QK; i++) {
		float v = truncf(x[i] * id + 8.5f);
		q[i] = v >= 15.0f ? 15 : (unsigned char)to_int(v);
	}
	for (int i = 0; i < QK / 2; i++)
		out[2 + i] = (unsigned char)(q[i] | (q[i + QK / 2] << 4));
}

void ckfs_gguf_encode_row(enum ckfs_gguf_type t, const float *x, int64_t n, unsigned char *out)
{
	switch (t) {
	case CKFS_GGUF_F32:
		memcpy(out, x, (size_t)n * 4);
		return;
	case CKFS_GGUF_F16:
		for (int64_t i = 0; i < n; i++)
			put16(out + 2 * i, ckfs_f32_to_f16(bits(x[i])));
		return;
	case CKFS_GGUF_BF16:
		for (int64_t i = 0; i < n; i++)
			put16(out + 2 * i, to_bf16(x[i]));
		return;
	case CKFS_GGUF_Q8_0:
		for (int64_t b = 0; b < n / QK; b++)
			q8_0(x + b * QK, out + b * (2 + QK));
		return;
	case CKFS_GGUF_Q4_0:
		for (int64_t b = 0; b < n / QK; b++)
			q4_0(x + b * QK, out + b * (2 + QK / 2));
		return;
	}
}
