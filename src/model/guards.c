/* SPDX-License-Identifier: MIT */
/*
 * Guards: ranges of a source read only once their check passed (see
 * include/ckfs/model.h). A table is built by a layout (sorted once when
 * sealed), then only read, except for each guard's passed bit, set with
 * an atomic OR; two readers may both run a check the first time, which
 * is harmless (the check only reads). Knows no file format: the check is
 * the layout's function.
 */
#include <stdlib.h>
#include <string.h>

#include "ckfs/model.h"

#define GUARD_PASSED (1ull << 31)

struct ckfs_guard ckfs_guard_make(uint64_t start, uint64_t len, uint16_t x, uint32_t y)
{
	struct ckfs_guard g = { .at = start | (uint64_t)x << 48 };

	atomic_init(&g.word, len | (uint64_t)y << 32);
	return g;
}

uint64_t ckfs_guard_start(const struct ckfs_guard *g)
{
	return g->at & CKFS_GUARD_MAX_START;
}

uint64_t ckfs_guard_len(const struct ckfs_guard *g)
{
	return atomic_load_explicit(&g->word, memory_order_relaxed) & CKFS_GUARD_MAX_LEN;
}

struct ckfs_guards *ckfs_guards_new(ckfs_guard_fn check, const char *ctx, size_t cap)
{
	struct ckfs_guards *gs = calloc(1, sizeof(*gs));

	if (!gs)
		return NULL;
	gs->check = check;
	gs->ctx = strdup(ctx ? ctx : "");
	gs->v = malloc((cap ? cap : 1) * sizeof(*gs->v));
	if (!gs->ctx || !gs->v) {
		ckfs_guards_free(gs);
		return NULL;
	}
	return gs;
}

void ckfs_guards_add(struct ckfs_guards *gs, struct ckfs_guard g)
{
	gs->v[gs->n].at = g.at;
	atomic_init(&gs->v[gs->n].word, atomic_load(&g.word));
	gs->n++;
}

static int guard_cmp(const void *a, const void *b)
{
	uint64_t x = ckfs_guard_start(a), y = ckfs_guard_start(b);

	return x < y ? -1 : x > y;
}

enum ckfs_code ckfs_guards_seal(struct ckfs_guards *gs, struct ckfs_error *err)
{
	size_t i = 1;

	/* tables come sorted (a zip's records in file order, the plan
	 * cache's as stored): sorting them again would cost more than
	 * building them */
	while (i < gs->n && ckfs_guard_start(&gs->v[i - 1]) < ckfs_guard_start(&gs->v[i]))
		i++;
	if (i < gs->n)
		qsort(gs->v, gs->n, sizeof(*gs->v), guard_cmp);
	for (i = 1; i < gs->n; i++)
		if (ckfs_guard_start(&gs->v[i - 1]) + ckfs_guard_len(&gs->v[i - 1]) >
		    ckfs_guard_start(&gs->v[i]))
			return ckfs_fail(err, CKFS_E_INVALID, "guarded ranges at %llu and %llu "
					 "overlap (a bug)",
					 (unsigned long long)ckfs_guard_start(&gs->v[i - 1]),
					 (unsigned long long)ckfs_guard_start(&gs->v[i]));
	return CKFS_OK;
}

void ckfs_guards_free(struct ckfs_guards *gs)
{
	if (!gs)
		return;
	free(gs->ctx);
	free(gs->v);
	free(gs);
}

size_t ckfs_guards_passed(const struct ckfs_guards *gs)
{
	size_t n = 0;

	for (size_t i = 0; gs && i < gs->n; i++)
		n += (atomic_load(&gs->v[i].word) & GUARD_PASSED) != 0;
	return n;
}

enum ckfs_code ckfs_source_guard(const struct ckfs_source *s, uint64_t pos, uint64_t len,
				 struct ckfs_error *err)
{
	const struct ckfs_guards *gs = s->guards;
	size_t lo = 0, hi;

	if (!gs || gs->n == 0 || len == 0)
		return CKFS_OK;
	/* The first guard that may meet the range: the last starting at or
	 * before pos (guards are disjoint), else the first. */
	hi = gs->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (ckfs_guard_start(&gs->v[mid]) <= pos)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t i = lo ? lo - 1 : 0; i < gs->n; i++) {
		struct ckfs_guard *g = &gs->v[i];
		uint64_t start = ckfs_guard_start(g), w;

		if (start >= pos + len)
			break;
		w = atomic_load_explicit(&g->word, memory_order_acquire);
		if ((w & GUARD_PASSED) || start + (w & CKFS_GUARD_MAX_LEN) <= pos)
			continue;
		CKFS_TRY(gs->check(s, gs->ctx, start, (uint16_t)(g->at >> 48),
				   (uint32_t)(w >> 32), err));
		atomic_fetch_or_explicit(&g->word, GUARD_PASSED, memory_order_release);
	}
	return CKFS_OK;
}

/* ---- as plan cache words: n, the text's length, the text in words of
 * 8 bytes, then two words per guard (the passed bits left out) ---- */

size_t ckfs_guards_words(const struct ckfs_guards *gs, uint64_t *v)
{
	size_t tl = strlen(gs->ctx), tw = (tl + 7) / 8, n = 2 + tw + 2 * gs->n;

	if (!v)
		return n;
	v[0] = gs->n;
	v[1] = tl;
	memset(&v[2], 0, tw * 8);
	memcpy(&v[2], gs->ctx, tl);
	for (size_t i = 0; i < gs->n; i++) {
		v[2 + tw + 2 * i] = gs->v[i].at;
		v[3 + tw + 2 * i] = atomic_load(&gs->v[i].word) & ~GUARD_PASSED;
	}
	return n;
}

enum ckfs_code ckfs_guards_from_words(ckfs_guard_fn check, const uint64_t *v, size_t n,
				      size_t *used, struct ckfs_guards **out,
				      struct ckfs_error *err)
{
	size_t tl, tw, count;
	struct ckfs_guards *gs;
	char *text;

	*out = NULL;
	if (n < 2 || v[1] > 65536 || v[0] > n)
		return ckfs_fail(err, CKFS_E_FORMAT, "plan cache: bad guard table");
	count = (size_t)v[0];
	tl = (size_t)v[1];
	tw = (tl + 7) / 8;
	if (n - 2 < tw || (n - 2 - tw) / 2 < count)
		return ckfs_fail(err, CKFS_E_FORMAT, "plan cache: bad guard table");
	if (!(text = malloc(tl + 1)))
		return ckfs_nomem(err);
	memcpy(text, &v[2], tl);
	text[tl] = '\0';
	gs = ckfs_guards_new(check, text, count);
	free(text);
	if (!gs)
		return ckfs_nomem(err);
	for (size_t i = 0; i < count; i++) {
		struct ckfs_guard g = { .at = v[2 + tw + 2 * i] };
		atomic_init(&g.word, v[3 + tw + 2 * i] & ~GUARD_PASSED);
		ckfs_guards_add(gs, g);
	}
	enum ckfs_code rc = ckfs_guards_seal(gs, err);
	if (rc != CKFS_OK) {
		ckfs_guards_free(gs);
		return rc;
	}
	*used = 2 + tw + 2 * count;
	*out = gs;
	return CKFS_OK;
}
