/* SPDX-License-Identifier: MIT */
/* MD5 as RFC 1321 specifies it: include/ckfs/md5.h. */
#include "ckfs/md5.h"

#include <string.h>

/* Per round step: the shift, and the additive constant
 * floor(2^32 * |sin(i + 1)|). */
static const unsigned char shift[4][4] = {
	{ 7, 12, 17, 22 }, { 5, 9, 14, 20 }, { 4, 11, 16, 23 }, { 6, 10, 15, 21 }
};
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

static uint32_t rotl(uint32_t x, unsigned n)
{
	return (x << n) | (x >> (32 - n));
}

static void compress(uint32_t s[4], const unsigned char b[64])
{
	uint32_t w[16], a = s[0], bb = s[1], c = s[2], d = s[3];

	for (int i = 0; i < 16; i++) /* little-endian words */
		w[i] = (uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 |
		       (uint32_t)b[4 * i + 2] << 16 | (uint32_t)b[4 * i + 3] << 24;
	for (int i = 0; i < 64; i++) {
		uint32_t f;
		int g, r = i / 16;
		switch (r) {
		case 0:
			f = (bb & c) | (~bb & d);
			g = i;
			break;
		case 1:
			f = (d & bb) | (~d & c);
			g = (5 * i + 1) % 16;
			break;
		case 2:
			f = bb ^ c ^ d;
			g = (3 * i + 5) % 16;
			break;
		default:
			f = c ^ (bb | ~d);
			g = (7 * i) % 16;
			break;
		}
		uint32_t t = d;
		d = c;
		c = bb;
		bb += rotl(a + f + sine[i] + w[g], shift[r][i % 4]);
		a = t;
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
