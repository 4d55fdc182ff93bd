/* SPDX-License-Identifier: MIT */
/*
 * The statistics of a pair of windows (include/ckfs/history.h): elements
 * widened to double a block at a time, then summed in 8 interleaved lanes
 * so the compiler can keep them in vector registers without reordering a
 * single addition (no -ffast-math: the order is the one the header
 * states, so results do not depend on the machine). Knows dtypes, not
 * tensors.
 */
#include <math.h>
#include <string.h>

#include "ckfs/history.h"

#define LANES 8
#define BLOCK 2048 /* elements widened at a time: two blocks stay in L1 */

static void widen(enum ckfs_dtype t, const unsigned char *p, size_t n, double *out)
{
	if (t == CKFS_DTYPE_F32) {
		for (size_t i = 0; i < n; i++) {
			float f;
			memcpy(&f, p + 4 * i, 4);
			out[i] = f;
		}
	} else if (t == CKFS_DTYPE_BF16) {
		for (size_t i = 0; i < n; i++) {
			uint16_t h;
			memcpy(&h, p + 2 * i, 2);
			uint32_t u = (uint32_t)h << 16;
			float f;
			memcpy(&f, &u, 4);
			out[i] = f;
		}
	} else {
		size_t es = ckfs_dtype_size(t);
		for (size_t i = 0; i < n; i++)
			out[i] = ckfs_dtype_load_double(t, p + es * i);
	}
}

struct lanes {
	double a2[LANES], b2[LANES], d2[LANES], dot[LANES], max[LANES];
	uint64_t changed[LANES];
	int nan;
};

/* The pair (a, b) into lane j; 1 when their difference is NaN. */
static inline int sum_pair(struct lanes *restrict l, int j, double a, double b)
{
	double d = b - a, ad = fabs(d);

	l->a2[j] += a * a;
	l->b2[j] += b * b;
	l->d2[j] += d * d;
	l->dot[j] += a * b;
	l->max[j] = ad > l->max[j] ? ad : l->max[j];
	l->changed[j] += (a != b) & !((a != a) & (b != b));
	return ad != ad;
}

/* n a multiple of LANES, except the last block of a window. */
CKFS_VECTOR_CLONES
static void sum_block(const double *restrict x, const double *restrict y, size_t n,
		      struct lanes *restrict l)
{
	size_t i = 0;
	int nan = 0;

	for (; i + LANES <= n; i += LANES)
		for (int j = 0; j < LANES; j++)
			nan |= sum_pair(l, j, x[i + j], y[i + j]);
	for (int j = 0; i < n; i++, j++)
		nan |= sum_pair(l, j, x[i], y[i]);
	l->nan |= nan;
}

/* ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) */
static double fold(const double *v)
{
	return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

void ckfs_diff_window(enum ckfs_dtype da, const void *a, enum ckfs_dtype db, const void *b,
		      size_t n, struct ckfs_diff_sums *out)
{
	double x[BLOCK], y[BLOCK];
	struct lanes l;
	const unsigned char *pa = a, *pb = b;
	size_t ea = ckfs_dtype_size(da), eb = ckfs_dtype_size(db);

	memset(&l, 0, sizeof(l));
	memset(out, 0, sizeof(*out));
	out->numel = n;
	out->bytes_differ = da != db || memcmp(a, b, n * ea) != 0;
	for (size_t i = 0; i < n; i += BLOCK) {
		size_t k = n - i < BLOCK ? n - i : BLOCK;
		widen(da, pa + i * ea, k, x);
		widen(db, pb + i * eb, k, y);
		/* a lane is element index mod 8 within the window: blocks are
		 * multiples of 8, so the lanes carry over */
		sum_block(x, y, k, &l);
	}
	out->a2 = fold(l.a2);
	out->b2 = fold(l.b2);
	out->d2 = fold(l.d2);
	out->dot = fold(l.dot);
	for (int j = 0; j < LANES; j++) {
		out->changed += l.changed[j];
		out->max_abs = l.max[j] > out->max_abs ? l.max[j] : out->max_abs;
	}
	if (l.nan)
		out->max_abs = NAN;
}

void ckfs_diff_sums_add(struct ckfs_diff_sums *into, const struct ckfs_diff_sums *w)
{
	into->numel += w->numel;
	into->changed += w->changed;
	into->bytes_differ |= w->bytes_differ;
	if (isnan(w->max_abs) || w->max_abs > into->max_abs)
		into->max_abs = isnan(into->max_abs) ? into->max_abs : w->max_abs;
	into->a2 += w->a2;
	into->b2 += w->b2;
	into->d2 += w->d2;
	into->dot += w->dot;
}

double ckfs_diff_rel_l2(const struct ckfs_diff_sums *s)
{
	if (s->a2 == 0)
		return s->d2 == 0 ? 0.0 : INFINITY;
	return sqrt(s->d2) / sqrt(s->a2);
}

double ckfs_diff_cosine(const struct ckfs_diff_sums *s)
{
	if (s->a2 == 0 || s->b2 == 0)
		return NAN;
	return s->dot / (sqrt(s->a2) * sqrt(s->b2));
}
