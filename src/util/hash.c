/* SPDX-License-Identifier: MIT */
/* FNV-1a, 64 bits: include/ckfs/hash.h. */
#include "ckfs/hash.h"

uint64_t ckfs_fnv1a(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;

	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= UINT64_C(0x100000001b3);
	}
	return h;
}
