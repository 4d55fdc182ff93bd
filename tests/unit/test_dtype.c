/* SPDX-License-Identifier: MIT */
/*
 * dtype conversions against vectors written by torch 2.8 on x86
 * (tests/gen/make_dtype_vectors.py: whole-tensor `.to(dtype)`, edge cases
 * plus ~100k random bit patterns per conversion). Exact equality, except
 * where torch itself writes a NaN's encoding depending on the element's
 * position in the SIMD loop (f64->bf16, f16->f32): those NaNs are compared
 * by NaN-ness. Each conversion also runs in odd-sized, misaligned pieces to
 * exercise both the vector and the generic paths.
 */
#include <math.h>
#include <stdlib.h>

#include "ckfs/dtype.h"
#include "test.h"

static enum ckfs_dtype type_of(const char *name)
{
	static const struct { const char *n; enum ckfs_dtype t; } map[] = {
		{ "f64", CKFS_DTYPE_F64 }, { "f32", CKFS_DTYPE_F32 },
		{ "f16", CKFS_DTYPE_F16 }, { "bf16", CKFS_DTYPE_BF16 },
		{ "i64", CKFS_DTYPE_I64 }, { "i32", CKFS_DTYPE_I32 },
		{ "i16", CKFS_DTYPE_I16 }, { "i8", CKFS_DTYPE_I8 },
		{ "u8", CKFS_DTYPE_U8 },   { "bool", CKFS_DTYPE_BOOL },
		{ "f8_e4m3", CKFS_DTYPE_F8_E4M3 }, { "f8_e5m2", CKFS_DTYPE_F8_E5M2 },
	};
	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
		if (strcmp(name, map[i].n) == 0)
			return map[i].t;
	return CKFS_DTYPE_INVALID;
}

static int same_element(enum ckfs_dtype t, const unsigned char *a,
			const unsigned char *b, int nan_by_value)
{
	size_t es = ckfs_dtype_size(t);
	if (memcmp(a, b, es) == 0)
		return 1;
	return nan_by_value && isnan(ckfs_dtype_load_double(t, a)) &&
	       isnan(ckfs_dtype_load_double(t, b));
}

static int conversions;

static void test_vectors(void)
{
	FILE *m = fopen(CKFS_FIXTURES "/dtype/manifest.txt", "r");
	char line[512];

	CHECK(m != NULL);
	while (m && fgets(line, sizeof(line), m)) {
		char from_s[16], to_s[16], path[512];
		size_t count, slen, dlen;
		if (line[0] == '#' || sscanf(line, "%15s %15s %zu", from_s, to_s, &count) != 3)
			continue;
		enum ckfs_dtype from = type_of(from_s), to = type_of(to_s);
		CHECK(from != CKFS_DTYPE_INVALID && to != CKFS_DTYPE_INVALID);
		snprintf(path, sizeof(path), CKFS_FIXTURES "/dtype/%s_to_%s.src", from_s, to_s);
		unsigned char *src = test_slurp(path, &slen);
		snprintf(path, sizeof(path), CKFS_FIXTURES "/dtype/%s_to_%s.dst", from_s, to_s);
		unsigned char *want = test_slurp(path, &dlen);
		CHECK(src && want);
		if (!src || !want)
			continue;
		size_t in = ckfs_dtype_size(from), out = ckfs_dtype_size(to);
		CHECK_EQ_INT(slen, count * in);
		CHECK_EQ_INT(dlen, count * out);
		int nan_by_value = (from == CKFS_DTYPE_F64 && to == CKFS_DTYPE_BF16) ||
				   (from == CKFS_DTYPE_F16 && to == CKFS_DTYPE_F32);
		/* Whole array, aligned. */
		unsigned char *got = malloc(count * out + 16);
		ckfs_convert(to, got, from, src, count, 0);
		size_t bad = 0;
		for (size_t i = 0; i < count; i++)
			if (!same_element(to, got + i * out, want + i * out, nan_by_value)) {
				if (bad++ < 5)
					fprintf(stderr, "%s->%s element %zu differs\n", from_s, to_s, i);
			}
		/* Odd pieces into a misaligned destination. */
		unsigned char *src1 = malloc(count * in + 16);
		memcpy(src1 + 1, src, count * in);
		for (size_t i = 0, piece = 1; i < count; i += piece, piece = piece * 3 % 97 + 1) {
			size_t n = count - i < piece ? count - i : piece;
			ckfs_convert(to, got + 1 + i * out, from, src1 + 1 + i * in, n, 0);
		}
		for (size_t i = 0; i < count; i++)
			if (!same_element(to, got + 1 + i * out, want + i * out, nan_by_value))
				bad++;
		CHECK_EQ_INT(bad, 0);
		conversions++;
		free(got);
		free(src1);
		free(src);
		free(want);
	}
	if (m)
		fclose(m);
	CHECK(conversions >= 20);
}

/* The table of formats.md section 7.1, as scalars. */
static void test_known_values(void)
{
	static const struct { uint32_t f; uint16_t bf, h; } rows[] = {
		{ 0x7FC00000u, 0xFFFF, 0x7E00 }, { 0xFFC00000u, 0xFFFF, 0xFE00 },
		{ 0xFF800000u, 0xFF80, 0xFC00 }, { 0x7F800000u, 0x7F80, 0x7C00 },
		{ 0x3F808000u, 0x3F80, 0x3C04 }, { 0x3F818000u, 0x3F82, 0x3C0C },
		{ 0x3F80FFFFu, 0x3F81, 0x3C08 }, { 0x7F7FFFFFu, 0x7F80, 0x7C00 },
		{ 0x00000001u, 0x0000, 0x0000 }, { 0x477FF000u, 0x4780, 0x7C00 },
		{ 0x477FEFFFu, 0x4780, 0x7BFF }, { 0x33000000u, 0x3300, 0x0000 },
		{ 0x33000001u, 0x3300, 0x0001 }, { 0x80000000u, 0x8000, 0x8000 },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		CHECK_EQ_INT(ckfs_f32_to_bf16(rows[i].f), rows[i].bf);
		CHECK_EQ_INT(ckfs_f32_to_f16(rows[i].f), rows[i].h);
	}
}

/* The neg bit negates before converting (sign flip for floats). */
static void test_neg(void)
{
	float src[3] = { 1.5f, -2.0f, 0.0f };
	uint16_t out[3];
	ckfs_convert(CKFS_DTYPE_BF16, out, CKFS_DTYPE_F32, src, 3, 1);
	CHECK_EQ_INT(out[0], 0xBFC0);
	CHECK_EQ_INT(out[1], 0x4000);
	CHECK_EQ_INT(out[2], 0x8000);
	int32_t ints[2] = { 5, -7 }, iout[2];
	ckfs_convert(CKFS_DTYPE_I32, iout, CKFS_DTYPE_I32, ints, 2, 1);
	CHECK_EQ_INT(iout[0], -5);
	CHECK_EQ_INT(iout[1], 7);
}

static void test_names(void)
{
	CHECK_EQ_STR(ckfs_dtype_st_name(CKFS_DTYPE_BF16), "BF16");
	CHECK_EQ_INT(ckfs_dtype_from_st_name("F8_E4M3"), CKFS_DTYPE_F8_E4M3);
	CHECK_EQ_INT(ckfs_dtype_from_torch_name("half"), CKFS_DTYPE_F16);
	CHECK_EQ_INT(ckfs_dtype_from_storage_class("BFloat16Storage"), CKFS_DTYPE_BF16);
	CHECK_EQ_INT(ckfs_dtype_from_storage_class("QInt8Storage"), CKFS_DTYPE_INVALID);
	/* safetensors' writer order: I64 > F64 > F32 > I32 > BF16 > F16 > ... > BOOL */
	CHECK(ckfs_dtype_st_rank(CKFS_DTYPE_I64) > ckfs_dtype_st_rank(CKFS_DTYPE_F64));
	CHECK(ckfs_dtype_st_rank(CKFS_DTYPE_F32) > ckfs_dtype_st_rank(CKFS_DTYPE_I32));
	CHECK(ckfs_dtype_st_rank(CKFS_DTYPE_BF16) > ckfs_dtype_st_rank(CKFS_DTYPE_F16));
	CHECK(ckfs_dtype_st_rank(CKFS_DTYPE_I8) > ckfs_dtype_st_rank(CKFS_DTYPE_U8));
	CHECK(ckfs_dtype_st_rank(CKFS_DTYPE_U8) > ckfs_dtype_st_rank(CKFS_DTYPE_BOOL));
}

int main(void)
{
	RUN(test_vectors);
	RUN(test_known_values);
	RUN(test_neg);
	RUN(test_names);
	printf("(%d conversions checked against torch)\n", conversions);
	return test_summary();
}
