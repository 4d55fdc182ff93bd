/* SPDX-License-Identifier: MIT */
/*
 * Element types of stored and served tensors, their safetensors names, and
 * conversions that are bit-identical to torch's CPU `.to(dtype)` on x86
 * (round to nearest even, subnormals kept, NaN as the vectorised kernels
 * write it: bf16 0xFFFF, f16 sign|0x7E00). See docs/formats.md.
 */
#ifndef CKFS_DTYPE_H
#define CKFS_DTYPE_H

#include <stddef.h>
#include <stdint.h>

/*
 * A hot loop built for AVX2 and AVX-512 too, the best picked at load time,
 * and vectorised (gcc's -O2 cost model often declines to), without fused
 * multiply-adds the source does not write: results are the same bytes on
 * every machine. Not under TSan: the load-time resolver runs instrumented
 * before the TSan runtime is up and crashes every program at start.
 */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
	!defined(__SANITIZE_THREAD__)
#define CKFS_VECTOR_CLONES                                                            \
	__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) \
	__attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic",          \
				"fp-contract=off")))
#elif defined(__GNUC__) && !defined(__clang__)
#define CKFS_VECTOR_CLONES                                                            \
	__attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic",          \
				"fp-contract=off")))
#else
#define CKFS_VECTOR_CLONES
#endif

enum ckfs_dtype {
	CKFS_DTYPE_INVALID = 0,
	CKFS_DTYPE_F64,
	CKFS_DTYPE_F32,
	CKFS_DTYPE_F16,
	CKFS_DTYPE_BF16,
	CKFS_DTYPE_I64,
	CKFS_DTYPE_I32,
	CKFS_DTYPE_I16,
	CKFS_DTYPE_I8,
	CKFS_DTYPE_U8,
	CKFS_DTYPE_BOOL,
	CKFS_DTYPE_F8_E4M3,
	CKFS_DTYPE_F8_E5M2,
	CKFS_DTYPE_COUNT,
};

/* Bytes per element (0 for INVALID). */
size_t ckfs_dtype_size(enum ckfs_dtype t);
/* safetensors name ("F32", "BF16", ...). */
const char *ckfs_dtype_st_name(enum ckfs_dtype t);
/* torch name ("float32", "bfloat16", ...), as written in config.json. */
const char *ckfs_dtype_torch_name(enum ckfs_dtype t);
/* Position in the safetensors crate's Dtype enum; the writer sorts by it,
 * descending, then by name. */
int ckfs_dtype_st_rank(enum ckfs_dtype t);
enum ckfs_dtype ckfs_dtype_from_st_name(const char *name);
/* From a torch dtype attribute name ("float32", "bfloat16", "half", ...). */
enum ckfs_dtype ckfs_dtype_from_torch_name(const char *name);
/* From a legacy storage class name ("FloatStorage", ...). */
enum ckfs_dtype ckfs_dtype_from_storage_class(const char *name);
int ckfs_dtype_is_float(enum ckfs_dtype t);

/*
 * Convert n elements from src (type from, little-endian, packed) to dst (type
 * to, packed). When neg is set the source values are negated first (torch's
 * neg bit). Same type without neg is a memcpy.
 */
void ckfs_convert(enum ckfs_dtype to, void *dst, enum ckfs_dtype from,
		  const void *src, size_t n, int neg);

/* Scalar helpers, exposed for tests. */
uint16_t ckfs_f32_to_bf16(uint32_t bits);
uint16_t ckfs_f32_to_f16(uint32_t bits);
/* torch's float -> float8_e4m3fn: round to nearest even, subnormals kept,
 * 480 and above, Inf and NaN to NaN (0x7F) with the sign kept. */
uint8_t ckfs_f32_to_f8e4m3(uint32_t bits);
uint32_t ckfs_f16_to_f32(uint16_t h);
uint32_t ckfs_bf16_to_f32(uint16_t h);
double ckfs_dtype_load_double(enum ckfs_dtype t, const void *p);

#endif
