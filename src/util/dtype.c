/* SPDX-License-Identifier: MIT */
/*
 * dtype tables and conversions. The conversions reproduce torch's CPU
 * `.to(dtype)` bit for bit on x86 (formats.md section 7, checked against
 * vectors written by torch in tests/fixtures/dtype/):
 *   - float32 -> bfloat16: round to nearest even on the dropped 16 bits;
 *     every NaN becomes 0xFFFF, as the AVX2/AVX-512 kernels write it
 *     (float16 and float8 NaNs become 0x7FC0, as torch writes them);
 *   - float32 -> float16: IEEE round to nearest even with subnormals; NaN
 *     keeps its sign and top payload bits with the quiet bit set (F16C);
 *   - wider or integer sources go through float32 first, as c10's
 *     BFloat16/Half constructors take a float (so float64 rounds twice);
 *   - narrower floats widen exactly.
 * Everything is little-endian; ckfs refuses big-endian checkpoints earlier.
 */
#include "ckfs/dtype.h"

#include <math.h>
#include <string.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
	       "ckfs reads and writes little-endian data in place");

struct dtype_info {
	const char *st_name, *torch_name;
	size_t size;
	int st_rank; /* order of the safetensors crate's Dtype enum */
	int is_float;
};

/* st_rank follows safetensors' Dtype enum: BOOL, F4, F6_E2M3, F6_E3M2, U8,
 * I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, I16, U16, F16,
 * BF16, I32, U32, F32, C64, F64, I64, U64. */
static const struct dtype_info dtype_table[CKFS_DTYPE_COUNT] = {
	[CKFS_DTYPE_INVALID] = { "?", "?", 0, -1, 0 },
	[CKFS_DTYPE_F64] = { "F64", "float64", 8, 19, 1 },
	[CKFS_DTYPE_F32] = { "F32", "float32", 4, 17, 1 },
	[CKFS_DTYPE_F16] = { "F16", "float16", 2, 13, 1 },
	[CKFS_DTYPE_BF16] = { "BF16", "bfloat16", 2, 14, 1 },
	[CKFS_DTYPE_I64] = { "I64", "int64", 8, 20, 0 },
	[CKFS_DTYPE_I32] = { "I32", "int32", 4, 15, 0 },
	[CKFS_DTYPE_I16] = { "I16", "int16", 2, 11, 0 },
	[CKFS_DTYPE_I8] = { "I8", "int8", 1, 5, 0 },
	[CKFS_DTYPE_U8] = { "U8", "uint8", 1, 4, 0 },
	[CKFS_DTYPE_BOOL] = { "BOOL", "bool", 1, 0, 0 },
	[CKFS_DTYPE_F8_E4M3] = { "F8_E4M3", "float8_e4m3fn", 1, 7, 1 },
	[CKFS_DTYPE_F8_E5M2] = { "F8_E5M2", "float8_e5m2", 1, 6, 1 },
};

static int valid(enum ckfs_dtype t)
{
	return t > CKFS_DTYPE_INVALID && t < CKFS_DTYPE_COUNT;
}

size_t ckfs_dtype_size(enum ckfs_dtype t)
{
	return valid(t) ? dtype_table[t].size : 0;
}

const char *ckfs_dtype_st_name(enum ckfs_dtype t)
{
	return dtype_table[valid(t) ? t : 0].st_name;
}

const char *ckfs_dtype_torch_name(enum ckfs_dtype t)
{
	return dtype_table[valid(t) ? t : 0].torch_name;
}

int ckfs_dtype_st_rank(enum ckfs_dtype t)
{
	return dtype_table[valid(t) ? t : 0].st_rank;
}

int ckfs_dtype_is_float(enum ckfs_dtype t)
{
	return valid(t) && dtype_table[t].is_float;
}

enum ckfs_dtype ckfs_dtype_from_st_name(const char *name)
{
	for (int t = 1; t < CKFS_DTYPE_COUNT; t++)
		if (strcmp(name, dtype_table[t].st_name) == 0)
			return (enum ckfs_dtype)t;
	return CKFS_DTYPE_INVALID;
}

enum ckfs_dtype ckfs_dtype_from_torch_name(const char *name)
{
	static const struct { const char *alias; enum ckfs_dtype t; } aliases[] = {
		{ "float", CKFS_DTYPE_F32 },  { "double", CKFS_DTYPE_F64 },
		{ "half", CKFS_DTYPE_F16 },   { "long", CKFS_DTYPE_I64 },
		{ "int", CKFS_DTYPE_I32 },    { "short", CKFS_DTYPE_I16 },
	};
	for (int t = 1; t < CKFS_DTYPE_COUNT; t++)
		if (strcmp(name, dtype_table[t].torch_name) == 0)
			return (enum ckfs_dtype)t;
	for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++)
		if (strcmp(name, aliases[i].alias) == 0)
			return aliases[i].t;
	return CKFS_DTYPE_INVALID;
}

enum ckfs_dtype ckfs_dtype_from_storage_class(const char *name)
{
	static const struct { const char *cls; enum ckfs_dtype t; } classes[] = {
		{ "DoubleStorage", CKFS_DTYPE_F64 }, { "FloatStorage", CKFS_DTYPE_F32 },
		{ "HalfStorage", CKFS_DTYPE_F16 },   { "BFloat16Storage", CKFS_DTYPE_BF16 },
		{ "LongStorage", CKFS_DTYPE_I64 },   { "IntStorage", CKFS_DTYPE_I32 },
		{ "ShortStorage", CKFS_DTYPE_I16 },  { "CharStorage", CKFS_DTYPE_I8 },
		{ "ByteStorage", CKFS_DTYPE_U8 },    { "BoolStorage", CKFS_DTYPE_BOOL },
	};
	for (size_t i = 0; i < sizeof(classes) / sizeof(classes[0]); i++)
		if (strcmp(name, classes[i].cls) == 0)
			return classes[i].t;
	return CKFS_DTYPE_INVALID;
}

/* ---- scalar bit conversions ---- */

static uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float bits_f32(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

uint16_t ckfs_f32_to_bf16(uint32_t u)
{
	if ((u & 0x7FFFFFFFu) > 0x7F800000u)
		return 0xFFFF;
	return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

uint32_t ckfs_bf16_to_f32(uint16_t h)
{
	return (uint32_t)h << 16;
}

uint16_t ckfs_f32_to_f16(uint32_t u)
{
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
	uint32_t abs = u & 0x7FFFFFFFu;

	if (abs > 0x7F800000u) /* NaN: quiet, top payload bits kept */
		return sign | 0x7E00u | (uint16_t)((abs >> 13) & 0x3FFu);
	if (abs >= 0x477FF000u) /* >= 65520 rounds to infinity */
		return sign | 0x7C00u;
	if (abs >= 0x38800000u) { /* normal half: rebias and round */
		uint32_t mant_odd = (abs >> 13) & 1u;
		abs += 0xC8000000u + 0xFFFu + mant_odd; /* -112 << 23 */
		return sign | (uint16_t)(abs >> 13);
	}
	if (abs < 0x33000001u) /* at most 2^-25: rounds to zero */
		return sign;
	/* Subnormal half: value = m * 2^-24, m = round(abs_value * 2^24). */
	uint32_t exp = abs >> 23;
	uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
	uint32_t shift = 126 - exp; /* 14..24 for exponents 112..102 */
	uint32_t q = mant >> shift;
	uint32_t rem = mant & ((1u << shift) - 1);
	uint32_t half = 1u << (shift - 1);
	if (rem > half || (rem == half && (q & 1u)))
		q++;
	return sign | (uint16_t)q;
}

uint32_t ckfs_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1Fu;
	uint32_t mant = h & 0x3FFu;

	if (exp == 0x1F)
		return sign | 0x7F800000u | (mant << 13);
	if (exp != 0)
		return sign | ((exp + 112) << 23) | (mant << 13);
	if (mant == 0)
		return sign;
	/* Subnormal: normalise. */
	exp = 113;
	while (!(mant & 0x400u)) {
		mant <<= 1;
		exp--;
	}
	return sign | (exp << 23) | ((mant & 0x3FFu) << 13);
}

static float f8_e4m3_to_float(uint8_t b)
{
	int sign = b >> 7, exp = (b >> 3) & 0xF, mant = b & 7;
	float v;

	if (exp == 0xF && mant == 7) /* NaN, with the payload c10 gives it */
		return bits_f32(sign ? 0xFFF00000u : 0x7FF00000u);
	if (exp == 0)
		v = ldexpf((float)mant, -9); /* subnormal: m/8 * 2^-6 */
	else
		v = ldexpf(1.0f + (float)mant / 8.0f, exp - 7);
	return sign ? -v : v;
}

static float f8_e5m2_to_float(uint8_t b)
{
	return bits_f32(ckfs_f16_to_f32((uint16_t)(b << 8)));
}

/* Value of one element as float, the way c10 feeds its float constructors. */
static float load_float(enum ckfs_dtype t, const unsigned char *p)
{
	switch (t) {
	case CKFS_DTYPE_F64: { double d; memcpy(&d, p, 8); return (float)d; }
	case CKFS_DTYPE_F32: { float f; memcpy(&f, p, 4); return f; }
	case CKFS_DTYPE_F16: { uint16_t h; memcpy(&h, p, 2); return bits_f32(ckfs_f16_to_f32(h)); }
	case CKFS_DTYPE_BF16: { uint16_t h; memcpy(&h, p, 2); return bits_f32(ckfs_bf16_to_f32(h)); }
	case CKFS_DTYPE_I64: { int64_t v; memcpy(&v, p, 8); return (float)v; }
	case CKFS_DTYPE_I32: { int32_t v; memcpy(&v, p, 4); return (float)v; }
	case CKFS_DTYPE_I16: { int16_t v; memcpy(&v, p, 2); return (float)v; }
	case CKFS_DTYPE_I8: return (float)(int8_t)p[0];
	case CKFS_DTYPE_U8: return (float)p[0];
	case CKFS_DTYPE_BOOL: return p[0] ? 1.0f : 0.0f;
	case CKFS_DTYPE_F8_E4M3: return f8_e4m3_to_float(p[0]);
	case CKFS_DTYPE_F8_E5M2: return f8_e5m2_to_float(p[0]);
	default: return 0.0f;
	}
}

double ckfs_dtype_load_double(enum ckfs_dtype t, const void *p)
{
	const unsigned char *b = p;

	switch (t) {
	case CKFS_DTYPE_F64: { double d; memcpy(&d, b, 8); return d; }
	case CKFS_DTYPE_I64: { int64_t v; memcpy(&v, b, 8); return (double)v; }
	case CKFS_DTYPE_I32: { int32_t v; memcpy(&v, b, 4); return (double)v; }
	default: return (double)load_float(t, b);
	}
}

uint8_t ckfs_f32_to_f8e4m3(uint32_t bits)
{
	const uint32_t sign = bits & 0x80000000u;
	uint32_t u = bits ^ sign;
	uint8_t r;

	if (u >= 0x43F00000u) { /* 480 and up, Inf, NaN: e4m3fn has no Inf */
		r = 0x7F;
	} else if (u < (121u << 23)) {
		/* Below the smallest normal (2^-6): the float addition rounds
		 * to the subnormal grid, to nearest even, as c10 does. */
		const float magic = 16384.0f; /* 2^14: bits 141 << 23 */
		float f;
		memcpy(&f, &u, 4);
		f += magic;
		memcpy(&u, &f, 4);
		r = (uint8_t)(u - (141u << 23));
	} else {
		uint32_t odd = (u >> 20) & 1u;
		u += ((uint32_t)(7 - 127) << 23) + 0x7FFFFu + odd;
		r = (uint8_t)(u >> 20);
	}
	return r | (uint8_t)(sign >> 24);
}

/* Store a value given as float; for wide or integer targets use the exact
 * source value instead (see convert_generic). */
static void store_from_float(enum ckfs_dtype t, unsigned char *p, float f)
{
	switch (t) {
	case CKFS_DTYPE_F32: memcpy(p, &f, 4); break;
	case CKFS_DTYPE_BF16: { uint16_t h = ckfs_f32_to_bf16(f32_bits(f)); memcpy(p, &h, 2); break; }
	case CKFS_DTYPE_F16: { uint16_t h = ckfs_f32_to_f16(f32_bits(f)); memcpy(p, &h, 2); break; }
	case CKFS_DTYPE_F8_E4M3: p[0] = ckfs_f32_to_f8e4m3(f32_bits(f)); break;
	default: break;
	}
}

static void negate_in_place(enum ckfs_dtype t, unsigned char *p)
{
	switch (t) {
	case CKFS_DTYPE_F64: p[7] ^= 0x80; break;
	case CKFS_DTYPE_F32: p[3] ^= 0x80; break;
	case CKFS_DTYPE_F16:
	case CKFS_DTYPE_BF16: p[1] ^= 0x80; break;
	case CKFS_DTYPE_F8_E4M3:
	case CKFS_DTYPE_F8_E5M2: p[0] ^= 0x80; break;
	case CKFS_DTYPE_I64: { uint64_t v; memcpy(&v, p, 8); v = 0 - v; memcpy(p, &v, 8); break; }
	case CKFS_DTYPE_I32: { uint32_t v; memcpy(&v, p, 4); v = 0 - v; memcpy(p, &v, 4); break; }
	case CKFS_DTYPE_I16: { uint16_t v; memcpy(&v, p, 2); v = (uint16_t)(0 - v); memcpy(p, &v, 2); break; }
	case CKFS_DTYPE_I8:
	case CKFS_DTYPE_U8: p[0] = (unsigned char)(0 - p[0]); break;
	default: break;
	}
}

/*
 * The hot path: fp32 shards served as bf16. A branch-free loop the
 * compiler vectorises; gcc's -O2 cost model declines to, so it is asked
 * explicitly, and on x86-64 also built for AVX2 and AVX-512 with the best
 * picked at load time (2.3x the SSE2 loop's speed on AVX-512 hardware).
 */
CKFS_VECTOR_CLONES
static void f32_to_bf16_block(uint16_t *restrict dst, const uint32_t *restrict src,
			      size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t u = src[i];
		uint16_t r = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
		dst[i] = (u & 0x7FFFFFFFu) > 0x7F800000u ? (uint16_t)0xFFFF : r;
	}
}

static void convert_generic(enum ckfs_dtype to, unsigned char *dst,
			    enum ckfs_dtype from, const unsigned char *src,
			    size_t n, int neg)
{
	size_t in = ckfs_dtype_size(from), out = ckfs_dtype_size(to);
	unsigned char tmp[8];

	for (size_t i = 0; i < n; i++) {
		const unsigned char *s = src + i * in;
		if (neg) {
			memcpy(tmp, s, in);
			negate_in_place(from, tmp);
			s = tmp;
		}
		unsigned char *d = dst + i * out;
		if (to == CKFS_DTYPE_BF16 && isnan(load_float(from, s)) &&
		    (from == CKFS_DTYPE_F16 || from == CKFS_DTYPE_F8_E4M3 ||
		     from == CKFS_DTYPE_F8_E5M2)) {
			/* torch converts these through c10's scalar path,
			 * whose NaN is 0x7FC0 (tests/fixtures/dtype). */
			d[0] = 0xC0;
			d[1] = 0x7F;
		} else if (to == CKFS_DTYPE_F32 || to == CKFS_DTYPE_BF16 ||
			   to == CKFS_DTYPE_F16 || to == CKFS_DTYPE_F8_E4M3) {
			store_from_float(to, d, load_float(from, s));
		} else if (to == CKFS_DTYPE_F64) {
			double v = ckfs_dtype_load_double(from, s);
			memcpy(d, &v, 8);
		} else {
			/* Integer targets are only reached with the same type. */
			memcpy(d, s, out);
		}
	}
}

void ckfs_convert(enum ckfs_dtype to, void *dst, enum ckfs_dtype from,
		  const void *src, size_t n, int neg)
{
	if (to == from && !neg) {
		memcpy(dst, src, n * ckfs_dtype_size(to));
		return;
	}
	if (to == CKFS_DTYPE_BF16 && from == CKFS_DTYPE_F32 && !neg) {
		/* Typed access needs natural alignment; the generic loop
		 * handles the rare unaligned buffer. */
		if (((uintptr_t)dst & 1) == 0 && ((uintptr_t)src & 3) == 0) {
			f32_to_bf16_block(dst, src, n);
			return;
		}
	}
	convert_generic(to, dst, from, src, n, neg);
}
