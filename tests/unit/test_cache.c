/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for src/cache/cache.c, one function per behaviour of the
 * protocol in include/ckfs/cache.h: miss, fill, hit, tail slices, LRU
 * eviction under the budget, pinned slices surviving it, failed fills
 * reaching every waiter and retried, one fill for many concurrent gets,
 * read-ahead and its bounded queue, read-ahead workers' signal masks,
 * ckfs_cache_read, buffers of served
 * slices recycled, and the counters.
 * The fill callback writes a pattern that depends on (file id, offset), so
 * every byte checked also checks that it came from the right place.
 * Threads in these tests wait on observable state (counters) with short
 * sleeps and a deadline, never on fixed delays alone.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckfs/cache.h"
#include "ckfs/err.h"
#include "ckfs/log.h"
#include "test.h"

/*
 * test_nomem asks for an impossible buffer; sanitizer allocators abort on
 * that by default where libc returns ENOMEM, so ask them to return NULL.
 */
const char *__asan_default_options(void);
const char *__tsan_default_options(void);
const char *__asan_default_options(void)
{
	return "allocator_may_return_null=1";
}
const char *__tsan_default_options(void)
{
	return "allocator_may_return_null=1";
}

#define SS 4096u /* slice size of most tests */

static uint8_t pattern(uint64_t file_id, uint64_t off)
{
	uint64_t x = (off + 1) * 0x9E3779B97F4A7C15ull ^
		     (file_id + 1) * 0xC2B2AE3D27D4EB4Full;

	return (uint8_t)(x >> 56 ^ x >> 29);
}

static bool pattern_ok(uint64_t file_id, uint64_t off, const void *buf,
		       size_t len)
{
	const uint8_t *p = buf;

	for (size_t i = 0; i < len; i++)
		if (p[i] != pattern(file_id, off + i))
			return false;
	return true;
}

struct fill_ctx {
	struct ckfs_cache *cache;    /* set before any get */
	atomic_int calls;
	atomic_int fail_next;        /* fail this many more calls */
	atomic_int hold_for_waits;   /* block until this many waits */
	atomic_uint_fast64_t last_off;
	atomic_size_t last_len;
	/* A gate that blocks fills while closed. */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool gate_closed;            /* under lock */
	uint64_t gate_file;          /* the gate holds only this file; 0: all */
	bool twins;                  /* file id N + 100 holds N's bytes */
	bool pokes;                  /* and N + 200 ... N + 600 too, but one byte */
	int in_gate;                 /* under lock: fills blocked */
};

static void ctx_init(struct fill_ctx *f)
{
	memset(f, 0, sizeof(*f));
	pthread_mutex_init(&f->lock, NULL);
	pthread_cond_init(&f->cond, NULL);
}

static void ctx_destroy(struct fill_ctx *f)
{
	pthread_cond_destroy(&f->cond);
	pthread_mutex_destroy(&f->lock);
}

static void gate_set(struct fill_ctx *f, bool closed)
{
	pthread_mutex_lock(&f->lock);
	f->gate_closed = closed;
	pthread_cond_broadcast(&f->cond);
	pthread_mutex_unlock(&f->lock);
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

static struct ckfs_cache_stats stats_of(struct ckfs_cache *c)
{
	struct ckfs_cache_stats st;

	ckfs_cache_get_stats(c, &st);
	return st;
}

/* Poll until pred holds, up to 10 s; returns whether it did. */
#define WAIT_UNTIL(pred)                                                   \
	({                                                                 \
		int ok_ = 0;                                               \
		for (int t_ = 0; t_ < 10000 && !(ok_ = (pred)); t_++)      \
			sleep_ms(1);                                       \
		ok_;                                                       \
	})

static int gate_blocked(struct fill_ctx *f)
{
	int n;

	pthread_mutex_lock(&f->lock);
	n = f->in_gate;
	pthread_mutex_unlock(&f->lock);
	return n;
}

/* Where file kNN (k 2 to 6) differs from file NN: in page 3 of a 1 MiB
 * slice, which the fingerprint (16 pages, 69632 bytes apart) does not read. */
static size_t poke_at(uint64_t file_id)
{
	return 12345 + (size_t)(file_id / 100) * 7;
}

static enum ckfs_code test_fill(void *ctx, uint64_t file_id, uint64_t offset,
				size_t len, void *buf, struct ckfs_error *err)
{
	struct fill_ctx *f = ctx;
	int hold = atomic_load(&f->hold_for_waits);

	atomic_fetch_add(&f->calls, 1);
	atomic_store(&f->last_off, offset);
	atomic_store(&f->last_len, len);
	pthread_mutex_lock(&f->lock);
	f->in_gate++;
	while (f->gate_closed && (f->gate_file == 0 || f->gate_file == file_id))
		pthread_cond_wait(&f->cond, &f->lock);
	f->in_gate--;
	pthread_mutex_unlock(&f->lock);
	if (hold > 0)
		WAIT_UNTIL(stats_of(f->cache).waits >= (uint64_t)hold);
	if (atomic_load(&f->fail_next) > 0) {
		atomic_fetch_sub(&f->fail_next, 1);
		errno = EIO;
		return ckfs_fail_errno(err, "cannot read source of file %"
				       PRIu64 " at %" PRIu64, file_id, offset);
	}
	uint64_t content = f->twins ? file_id % 100 : file_id;
	for (size_t i = 0; i < len; i++)
		((uint8_t *)buf)[i] = pattern(content, offset + i);
	/* in a page the fingerprint does not read (see poke_at) */
	if (f->pokes && file_id / 100 >= 2 && file_id / 100 <= 6 && offset == 0)
		((uint8_t *)buf)[poke_at(file_id)] ^= 0xFF;
	return CKFS_OK;
}

static struct ckfs_cache *make_cache_opt(struct fill_ctx *f, size_t slice_size,
					 uint64_t budget, int threads, int queue, bool share)
{
	struct ckfs_cache_options opt = {
		.slice_size = slice_size,
		.budget_bytes = budget,
		.prefetch_threads = threads,
		.prefetch_queue = queue,
		.share = share,
	};
	struct ckfs_error err;
	struct ckfs_cache *c = NULL;

	ckfs_error_clear(&err);
	ctx_init(f);
	if (ckfs_cache_new(&opt, test_fill, f, &c, &err) != CKFS_OK) {
		fprintf(stderr, "ckfs_cache_new: %s\n", err.msg);
		abort();
	}
	f->cache = c;
	return c;
}

static struct ckfs_cache *make_cache(struct fill_ctx *f, size_t slice_size,
				     uint64_t budget, int threads, int queue)
{
	return make_cache_opt(f, slice_size, budget, threads, queue, false);
}

static void done(struct ckfs_cache *c, struct fill_ctx *f)
{
	ckfs_cache_free(c);
	ctx_destroy(f);
}

/* get + check the pattern + put; returns the code. */
static enum ckfs_code touch(struct ckfs_cache *c, uint64_t file_id,
			    uint64_t index, size_t len)
{
	struct ckfs_error err;
	struct ckfs_slice *s;
	enum ckfs_code rc;

	ckfs_error_clear(&err);
	rc = ckfs_cache_get(c, file_id, index, len, &s, &err);
	if (rc != CKFS_OK)
		return rc;
	CHECK_EQ_INT(ckfs_slice_len(s), len);
	CHECK(pattern_ok(file_id, index * ckfs_cache_slice_size(c),
			 ckfs_slice_data(s), len));
	ckfs_cache_put(c, s);
	return CKFS_OK;
}

static void test_new_invalid(void)
{
	static const struct {
		size_t slice_size;
		int threads, queue;
		const char *msg;
	} cases[] = {
		{ 0, 0, 0, "cache: slice size 0 is not a power of two" },
		{ 3000, 0, 0, "cache: slice size 3000 is not a power of two" },
		{ SS, -1, 4, "cache: -1 read-ahead threads not in 0..256" },
		{ SS, 2, 0, "cache: read-ahead queue of 0 slices with 2 "
			    "threads" },
	};
	struct fill_ctx f;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct ckfs_cache_options opt = {
			.slice_size = cases[i].slice_size,
			.budget_bytes = 1 << 20,
			.prefetch_threads = cases[i].threads,
			.prefetch_queue = cases[i].queue,
		};
		struct ckfs_cache *c = (void *)&f;
		struct ckfs_error err;

		ckfs_error_clear(&err);
		CHECK_EQ_INT(ckfs_cache_new(&opt, test_fill, &f, &c, &err),
			     CKFS_E_INVALID);
		CHECK(c == NULL);
		CHECK_EQ_STR(err.msg, cases[i].msg);
	}
}

static void test_miss_then_hit(void)
{
	struct fill_ctx f;
	struct ckfs_cache *c = make_cache(&f, SS, 16 * SS, 0, 0);
	struct ckfs_cache_stats st;

	CHECK_EQ_INT(ckfs_cache_slice_size(c), SS);
	CHECK_EQ_INT(touch(c, 7, 3, SS), CKFS_OK);
	CHECK_EQ_INT(atomic_load(&f.calls), 1);
	CHECK_EQ_INT(atomic_load(&f.last_off), 3 * SS);
	CHECK_EQ_INT(touch(c, 7, 3, SS), CKFS_OK);
	CHECK_EQ_INT(touch(c, 7, 3, SS), CKFS_OK);
	CHECK_EQ_INT(atomic_load(&f.calls), 1);
	st = stats_of(c);
	CHECK_EQ_INT(st.misses, 1);
	CHECK_EQ_INT(st.hits, 2);
	CHECK_EQ_INT(st.waits, 0);
	CHECK_EQ_INT(st.fills, 1);
	CHECK_EQ_INT(st.bytes_filled, SS);
	CHECK_EQ_INT(st.bytes_cached, SS);
	CHECK_EQ_INT(st.slices_cached, 1);
	CHECK_EQ_INT(st.budget_bytes, 16 * SS);
	CHECK_EQ_INT(st.evictions, 0);
	done(c, &f);
}

/* Same index in different files, neighbouring indexes: all distinct
 * slices with their own bytes; two pins on one slice share it. */
static void test_content(void)
{
	struct fill_ctx f;
	struct ckfs_cache *c = make_cache(&f, SS, 64 * SS, 0, 0);
	struct ckfs_slice *a, *b;
	struct ckfs_error err;

	for (uint64_t file = 0; file < 4; file++)
		for (uint64_t i = 0; i < 8; i++)
			CHECK_EQ_INT(touch(c, file, i, SS), CKFS_OK);
	CHECK_EQ_INT(atomic_load(&f.calls), 32);
	for (uint64_t file = 0; file < 4; file++)
		for (uint64_t i = 0; i < 8; i++)
			CHECK_EQ_INT(touch(c, file, i, SS), CKFS_OK);
	CHECK_EQ_INT(atomic_load(&f.calls), 32);
	CHECK_EQ_INT(stats_of(c).slices_cached, 32);

	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_cache_get(c, 1, 1, SS, &a, &err), CKFS_OK);
	CHECK_EQ_INT(ckfs_cache_get(c, 1, 1, SS, &b, &err), CKFS_OK);
	CHECK(a == b);
	CHECK(ckfs_slice_data(a) == ckfs_slice_data(b));
	ckfs_cache_put(c, a);
	ckfs_cache_put(c, b);
	/* Large indexes (offsets past 4 GiB) keep their offsets. */
	CHECK_EQ_INT(touch(c, 9, (UINT64_C(5) << 32) / SS + 1, SS), CKFS_OK);
	CHECK_EQ_INT(atomic_load(&f.last_off), (UINT64_C(5) << 32) + SS);
	done(c, &f);
}

static void test_tail_slice(void)
{
	struct fill_ctx f;
	struct ckfs_cache *c = make_cache(&f, SS, 16 * SS, 0, 0);
	struct ckfs_slice *s = NULL;
	struct ckfs_error err;

	CHECK_EQ_INT(touch(c, 2, 3, 100), CKFS_OK);
	CHECK_EQ_INT(atomic_load(&f.last_len), 100);
	CHECK_EQ_INT(atomic_load(&f.last_off), 3 * SS);
	CHECK_EQ_INT(stats_of(c).bytes_cached, 100);
	CHECK_EQ_INT(touch(c, 2, 3, 100), CKFS_OK);
	CHECK_EQ_INT(atomic_load(&f.calls), 1);

	/* A different length for a cached slice is the caller's bug. */
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_cache_get(c, 2, 3, 200, &s, &err), CKFS_E_INVALID);
	CHECK(s == NULL);
	CHECK_EQ_STR(err.msg, "slice 3 of file 2 is 100 bytes, not 200");
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_cache_get(c, 2, 4, 0, &s, &err), CKFS_E_INVALID);
	CHECK_EQ_STR(err.msg, "slice 4 of file 2: length 0 not in 1..4096");
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_cache_get(c, 2, 4, SS + 1, &s, &err),
		     CKFS_E_INVALID);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_cache_get(c, 2, UINT64_MAX, SS, &s, &err),
		     CKFS_E_INVALID);
	CHECK_EQ_STR(err.msg, "slice 18446744073709551615 of file 2: "
			      "offset out of range");
	CHECK_EQ_INT(atomic_load(&f.calls), 1);
	done(c, &f);
}

/* Budget of 3 slices; use A B C, then A again; D must push out B, the
 * least recently used, and then E pushes out C. */
static void test_eviction_lru(void)
{
	struct fill_ctx f;
	struct ckfs_cache *c = make_cache(&f, SS, 3 * SS, 0, 0);
	struct ckfs_cache_stats st;
	enum { A, B, C, D, E };

	CHECK_EQ_INT(touch(c, 1, A, SS), CKFS_OK);
	CHECK_EQ_INT(touch(c, 1, B, SS), CKFS_OK);
	CHECK_EQ_INT(touch(c, 1, C, SS), CKFS_OK);
	CHECK_EQ_INT(touch(c, 1, A, SS), CKFS_OK); /* hit: A most recent */
	CHECK_EQ_INT(stats_of(c).evictions, 0);
	CHECK_EQ_INT(touch(c, 1, D, SS), CKFS_OK);
	st = stats_of(c);
	CHECK_EQ_INT(st.evictions, 1);
	CHECK_EQ_INT(st.bytes_cached, 3 * SS);
	CHECK_EQ_INT(st.slices_cached, 3);
	CHECK_EQ_INT(atomic_load(&f.calls), 4);
	/* Order now (most recent first): D A C. E evicts C. */
	CHECK_EQ_INT(touch(c, 1, E, SS), CKFS_OK);
	CHECK_EQ_INT(atomic_load(&f.calls), 5);
	CHECK_EQ_INT(touch(c, 1, A, SS), CKFS_OK);
	CHECK_EQ_INT(touch(c, 1, D, SS), CKFS_OK);
	CHECK_EQ_INT(touch(c, 1, E, SS), CKFS_OK);
	CHECK_EQ_INT(atomic_load(&f.calls), 5); /* three hits */
	CHECK_EQ_INT(touch(c, 1, B, SS), CKFS_OK); /* evicted: refilled */
	CHECK_EQ_INT(touch(c, 1, C, SS), CKFS_OK); /* evicted: refilled */
	CHECK_EQ_INT(atomic_load(&f.calls), 7);
	st = stats_of(c);
	CHECK_EQ_INT(st.evictions, 4);
	CHECK_EQ_INT(st.hits, 4);
	CHECK_EQ_INT(st.misses, 7);
	CHECK_EQ_INT(st.fills, st.evictions + st.slices_cached);
	/* Order now: C B E. A budget that holds nothing keeps nothing. */
	done(c, &f);

	c = make_cache(&f, SS, 0, 0, 0);
	CHECK_EQ_INT(touch(c, 1, A, SS), CKFS_OK);
	CHECK_EQ_INT(touch(c, 1, A, SS), CKFS_OK);
	st = stats_of(c);
	CHECK_EQ_INT(st.misses, 2);
	CHECK_EQ_INT(st.evictions, 2);
	CHECK_EQ_INT(st.bytes_cached, 0);
	CHECK_EQ_INT(st.slices_cached, 0);
	done(c, &f);
}

/* Pinned slices stay, even over the budget, and keep their bytes; the
 * budget comes back as they are released. */
static void test_pinned_survive(void)
{
	struct fill_ctx f;
	struct ckfs_cache *c = make_cache(&f, SS, 2 * SS, 0, 0);
	struct ckfs_slice *s[4];
	struct ckfs_cache_stats st;
	struct ckfs_error err;

	ckfs_error_clear(&err);
	for (int i = 0; i < 4; i++)
		CHECK_EQ_INT(ckfs_cache_get(c, 5, (uint64_t)i, SS, &s[i], &err),
			     CKFS_OK);
	st = stats_of(c);
	CHECK_EQ_INT(st.bytes_cached, 4 * SS);
	CHECK_EQ_INT(st.slices_cached, 4);
	CHECK_EQ_INT(st.evictions, 0);
	for (int i = 0; i < 4; i++)
		CHECK(pattern_ok(5, (uint64_t)i * SS, ckfs_slice_data(s[i]),
				 SS));
	/* Unpinned while over budget: goes at once. */
	ckfs_cache_put(c, s[0]);
	st = stats_of(c);
	CHECK_EQ_INT(st.evictions, 1);
	CHECK_EQ_INT(st.bytes_cached, 3 * SS);
	/* A new slice while the rest is pinned: over budget again. */
	CHECK_EQ_INT(touch(c, 5, 9, SS), CKFS_OK);
	CHECK_EQ_INT(stats_of(c).evictions, 2);
	ckfs_cache_put(c, s[1]);
	CHECK_EQ_INT(stats_of(c).bytes_cached, 2 * SS);
	ckfs_cache_put(c, s[2]);
	ckfs_cache_put(c, s[3]);
	st = stats_of(c);
	CHECK_EQ_INT(st.bytes_cached, 2 * SS);
	CHECK_EQ_INT(st.evictions, 3);
	CHECK_EQ_INT(touch(c, 5, 2, SS), CKFS_OK); /* kept: hits */
	CHECK_EQ_INT(touch(c, 5, 3, SS), CKFS_OK);
	CHECK_EQ_INT(atomic_load(&f.calls), 5);
	done(c, &f);
}

struct getter {
	pthread_t tid;
	struct ckfs_cache *cache;
	uint64_t file_id, index;
	size_t len;
	enum ckfs_code rc;
	struct ckfs_slice *slice;
	struct ckfs_error err;
	bool keep; /* leave the slice pinned for the test to inspect */
};

static void *getter_main(void *arg)
{
	struct getter *g = arg;

	ckfs_error_clear(&g->err);
	g->rc = ckfs_cache_get(g->cache, g->file_id, g->index, g->len,
			       &g->slice, &g->err);
	if (g->rc == CKFS_OK && !g->keep) {
		if (!pattern_ok(g->file_id, g->index * SS,
				ckfs_slice_data(g->slice), g->len))
			g->rc = CKFS_E_MISMATCH;
		ckfs_cache_put(g->cache, g->slice);
	}
	return NULL;
}

#define NGET 8

/* NGET threads ask for one slice; the fill holds until all the others
 * wait on it, so exactly one fill serves them all. */
static void test_concurrent_fill_once(void)
{
	struct fill_ctx f;
	struct ckfs_cache *c = make_cache(&f, SS, 16 * SS, 0, 0);
	struct getter g[NGET];
	struct ckfs_cache_stats st;

	atomic_store(&f.hold_for_waits, NGET - 1);
	for (int i = 0; i < NGET; i++) {
		g[i] = (struct getter){ .cache = c, .file_id = 3, .index = 1,
					.len = SS, .keep = true };
		CHECK_EQ_INT(pthread_create(&g[i].tid, NULL, getter_main,
					    &g[i]), 0);
	}
	for (int i = 0; i < NGET; i++)
		pthread_join(g[i].tid, NULL);
	CHECK_EQ_INT(atomic_load(&f.calls), 1);
	for (int i = 0; i < NGET; i++) {
		CHECK_EQ_INT(g[i].rc, CKFS_OK);
		CHECK(g[i].slice == g[0].slice);
	}
	CHECK(pattern_ok(3, SS, ckfs_slice_data(g[0].slice), SS));
	st = stats_of(c);
	CHECK_EQ_INT(st.misses, NGET);
	CHECK_EQ_INT(st.waits, NGET - 1);
	CHECK_EQ_INT(st.hits, 0);
	CHECK_EQ_INT(st.fills, 1);
	for (int i = 0; i < NGET; i++)
		ckfs_cache_put(c, g[i].slice);
	CHECK_EQ_INT(touch(c, 3, 1, SS), CKFS_OK);
	CHECK_EQ_INT(stats_of(c).hits, 1);
	done(c, &f);
}

/* A failed fill reaches the filler and every waiter with the same code,
 * errno and message; nothing is cached and the next get fills again. */
static void test_fill_error(void)
{
	struct fill_ctx f;
	struct ckfs_cache *c = make_cache(&f, SS, 16 * SS, 0, 0);
	struct getter g[NGET];
	struct ckfs_cache_stats st;
	struct ckfs_error err;
	struct ckfs_slice *s;

	/* One thread, error recorded and retried. */
	atomic_store(&f.fail_next, 1);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_cache_get(c, 4, 2, SS, &s, &err), CKFS_E_IO);
	CHECK(s == NULL);
	CHECK_EQ_INT(err.sys_errno, EIO);
	CHECK_EQ_STR(err.msg, "cannot read source of file 4 at 8192: "
			      "Input/output error");
	st = stats_of(c);
	CHECK_EQ_INT(st.fill_errors, 1);
	CHECK_EQ_INT(st.fills, 0);
	CHECK_EQ_INT(st.slices_cached, 0);
	CHECK_EQ_INT(st.bytes_cached, 0);
	CHECK_EQ_INT(touch(c, 4, 2, SS), CKFS_OK);
	CHECK_EQ_INT(atomic_load(&f.calls), 2);

	/* An error already recorded is kept (first failure wins). */
	atomic_store(&f.fail_next, 1);
	ckfs_error_clear(&err);
	ckfs_fail(&err, CKFS_E_FORMAT, "earlier");
	CHECK_EQ_INT(ckfs_cache_get(c, 4, 3, SS, &s, &err), CKFS_E_IO);
	CHECK_EQ_INT(err.code, CKFS_E_FORMAT);
	CHECK_EQ_STR(err.msg, "earlier");

	/* Many threads: one fill, one error, everyone gets it. */
	atomic_store(&f.calls, 0);
	atomic_store(&f.fail_next, 1);
	atomic_store(&f.hold_for_waits, NGET - 1);
	for (int i = 0; i < NGET; i++) {
		g[i] = (struct getter){ .cache = c, .file_id = 4, .index = 5,
					.len = SS };
		CHECK_EQ_INT(pthread_create(&g[i].tid, NULL, getter_main,
					    &g[i]), 0);
	}
	for (int i = 0; i < NGET; i++)
		pthread_join(g[i].tid, NULL);
	CHECK_EQ_INT(atomic_load(&f.calls), 1);
	for (int i = 0; i < NGET; i++) {
		CHECK_EQ_INT(g[i].rc, CKFS_E_IO);
		CHECK_EQ_INT(g[i].err.code, CKFS_E_IO);
		CHECK_EQ_INT(g[i].err.sys_errno, EIO);
		CHECK_EQ_STR(g[i].err.msg, "cannot read source of file 4 at "
					   "20480: Input/output error");
	}
	st = stats_of(c);
	CHECK_EQ_INT(st.fill_errors, 3);
	CHECK_EQ_INT(st.waits, NGET - 1);
	atomic_store(&f.hold_for_waits, 0);
	CHECK_EQ_INT(touch(c, 4, 5, SS), CKFS_OK);
	CHECK_EQ_INT(atomic_load(&f.calls), 2);
	st = stats_of(c);
	CHECK_EQ_INT(st.slices_cached, 2);
	CHECK_EQ_INT(st.bytes_cached, 2 * SS);
	done(c, &f);
}

/* A fill that fails without a message gets a generic one. */
static enum ckfs_code silent_fail(void *ctx, uint64_t file_id,
				  uint64_t offset, size_t len, void *buf,
				  struct ckfs_error *err)
{
	(void)ctx, (void)file_id, (void)offset, (void)len, (void)buf;
	(void)err;
	return CKFS_E_CHANGED;
}

static void test_fill_error_no_message(void)
{
	struct ckfs_cache_options opt = { .slice_size = SS,
					  .budget_bytes = SS };
	struct ckfs_cache *c;
	struct ckfs_slice *s;
	struct ckfs_error err;

	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_cache_new(&opt, silent_fail, NULL, &c, &err),
		     CKFS_OK);
	CHECK_EQ_INT(ckfs_cache_get(c, 1, 2, SS, &s, &err), CKFS_E_CHANGED);
	CHECK_EQ_STR(err.msg, "cannot fill slice 2 of file 1: source changed");
	ckfs_cache_free(c);
}

/* Impossible allocations come back as CKFS_E_NOMEM, uncached. */
static void test_nomem(void)
{
	struct fill_ctx f;
	size_t huge = (size_t)1 << 62;
	struct ckfs_cache *c = make_cache(&f, huge, UINT64_MAX, 0, 0);
	struct ckfs_cache_stats st;
	struct ckfs_slice *s;
	struct ckfs_error err;

	for (int i = 0; i < 2; i++) {
		ckfs_error_clear(&err);
		CHECK_EQ_INT(ckfs_cache_get(c, 1, 0, huge, &s, &err),
			     CKFS_E_NOMEM);
		CHECK_EQ_STR(err.msg, "cannot allocate 4611686018427387904 "
				      "bytes for slice 0 of file 1");
	}
	CHECK_EQ_INT(atomic_load(&f.calls), 0);
	st = stats_of(c);
	CHECK_EQ_INT(st.fill_errors, 2);
	CHECK_EQ_INT(st.bytes_cached, 0);
	CHECK_EQ_INT(st.slices_cached, 0);
	CHECK_EQ_INT(touch(c, 1, 1, 64), CKFS_OK); /* small ones still work */
	done(c, &f);
}

/* Read-ahead fills in the background; the later get is a hit and counts
 * a prefetch hit once. Cached or queued slices are not queued again. */
static void test_prefetch(void)
{
	struct fill_ctx f;
	struct ckfs_cache *c = make_cache(&f, SS, 16 * SS, 2, 8);
	struct ckfs_cache_stats st;

	for (uint64_t i = 0; i < 4; i++)
		ckfs_cache_prefetch(c, 6, i, SS);
	CHECK(WAIT_UNTIL(stats_of(c).fills == 4));
	st = stats_of(c);
	CHECK_EQ_INT(st.prefetch_queued, 4);
	CHECK_EQ_INT(st.slices_cached, 4);
	CHECK_EQ_INT(st.bytes_cached, 4 * SS);
	CHECK_EQ_INT(st.hits + st.misses, 0);
	for (uint64_t i = 0; i < 4; i++)
		CHECK_EQ_INT(touch(c, 6, i, SS), CKFS_OK);
	for (uint64_t i = 0; i < 4; i++)
		CHECK_EQ_INT(touch(c, 6, i, SS), CKFS_OK);
	st = stats_of(c);
	CHECK_EQ_INT(st.hits, 8);
	CHECK_EQ_INT(st.misses, 0);
	CHECK_EQ_INT(st.prefetch_hits, 4);
	CHECK_EQ_INT(atomic_load(&f.calls), 4);
	/* Already cached: skipped, neither queued nor dropped. */
	ckfs_cache_prefetch(c, 6, 2, SS);
	st = stats_of(c);
	CHECK_EQ_INT(st.prefetch_queued, 4);
	CHECK_EQ_INT(st.prefetch_dropped, 0);
	/* Bad arguments are ignored. */
	ckfs_cache_prefetch(c, 6, 9, 0);
	ckfs_cache_prefetch(c, 6, 9, SS + 1);
	CHECK_EQ_INT(stats_of(c).prefetch_queued, 4);
	/* A prefetched slice that was never used can be evicted as usual. */
	ckfs_cache_prefetch(c, 7, 0, 10);
	CHECK(WAIT_UNTIL(stats_of(c).fills == 5));
	CHECK(WAIT_UNTIL(stats_of(c).bytes_cached == 4 * SS + 10));
	done(c, &f);

	/* No threads: read-ahead is off and costs nothing. */
	c = make_cache(&f, SS, 16 * SS, 0, 0);
	ckfs_cache_prefetch(c, 6, 0, SS);
	st = stats_of(c);
	CHECK_EQ_INT(st.prefetch_queued + st.prefetch_dropped, 0);
	CHECK_EQ_INT(st.slices_cached, 0);
	done(c, &f);
}

/* One worker held in its fill, a queue of two: the next two requests
 * queue, repeats of queued ones are skipped, the rest are dropped. A get
 * for a slice being read ahead waits for it and counts a prefetch hit. */
static void test_prefetch_queue_full(void)
{
	struct fill_ctx f;
	struct ckfs_cache *c = make_cache(&f, SS, 16 * SS, 1, 2);
	struct ckfs_cache_stats st;
	struct getter g;

	gate_set(&f, true);
	ckfs_cache_prefetch(c, 8, 0, SS);
	CHECK(WAIT_UNTIL(gate_blocked(&f) == 1));
	ckfs_cache_prefetch(c, 8, 0, SS); /* filling: skipped */
	ckfs_cache_prefetch(c, 8, 1, SS);
	ckfs_cache_prefetch(c, 8, 2, SS);
	ckfs_cache_prefetch(c, 8, 1, SS); /* queued: skipped */
	ckfs_cache_prefetch(c, 8, 3, SS);
	ckfs_cache_prefetch(c, 8, 4, SS);
	st = stats_of(c);
	CHECK_EQ_INT(st.prefetch_queued, 3);
	CHECK_EQ_INT(st.prefetch_dropped, 2);
	CHECK_EQ_INT(st.slices_cached, 1); /* the one filling */

	g = (struct getter){ .cache = c, .file_id = 8, .index = 0, .len = SS };
	CHECK_EQ_INT(pthread_create(&g.tid, NULL, getter_main, &g), 0);
	CHECK(WAIT_UNTIL(stats_of(c).waits == 1));
	gate_set(&f, false);
	pthread_join(g.tid, NULL);
	CHECK_EQ_INT(g.rc, CKFS_OK);
	CHECK(WAIT_UNTIL(stats_of(c).fills == 3));
	st = stats_of(c);
	CHECK_EQ_INT(st.misses, 1);
	CHECK_EQ_INT(st.waits, 1);
	CHECK_EQ_INT(st.prefetch_hits, 1);
	CHECK_EQ_INT(atomic_load(&f.calls), 3);
	CHECK_EQ_INT(touch(c, 8, 1, SS), CKFS_OK);
	CHECK_EQ_INT(touch(c, 8, 2, SS), CKFS_OK);
	CHECK_EQ_INT(touch(c, 8, 3, SS), CKFS_OK); /* dropped: a miss */
	st = stats_of(c);
	CHECK_EQ_INT(st.hits, 2);
	CHECK_EQ_INT(st.prefetch_hits, 3);
	CHECK_EQ_INT(st.misses, 2);
	done(c, &f);
}

/* Tasks (ckfs_cache_run) run on the read-ahead workers, in turn with the
 * slices; one still queued is taken back whole and never runs; a worker's
 * is not taken back; without workers nothing is queued. */
struct counted_task {
	struct ckfs_cache_task task; /* first */
	atomic_int runs;
};

static void counted_run(struct ckfs_cache_task *t)
{
	atomic_fetch_add(&((struct counted_task *)t)->runs, 1);
}

static void test_tasks(void)
{
	struct fill_ctx f, f0;
	struct ckfs_cache *c = make_cache(&f, SS, 16 * SS, 1, 4);
	struct ckfs_cache *none = make_cache(&f0, SS, 16 * SS, 0, 4);
	struct counted_task a = { .task.run = counted_run }, b = { .task.run = counted_run };

	CHECK(ckfs_cache_run(c, &a.task));
	CHECK(WAIT_UNTIL(atomic_load(&a.runs) == 1));
	CHECK(!ckfs_cache_take_back(c, &a.task)); /* run: not in the queue */
	/* The one worker held by a slice's fill: b waits in the queue. */
	gate_set(&f, true);
	ckfs_cache_prefetch(c, 3, 0, SS);
	CHECK(WAIT_UNTIL(gate_blocked(&f) == 1));
	CHECK(ckfs_cache_run(c, &b.task));
	CHECK(ckfs_cache_run(c, &a.task));
	CHECK(ckfs_cache_take_back(c, &b.task));
	CHECK(!ckfs_cache_take_back(c, &b.task));
	gate_set(&f, false);
	CHECK(WAIT_UNTIL(atomic_load(&a.runs) == 2));
	CHECK(WAIT_UNTIL(stats_of(c).fills == 1));
	CHECK_EQ_INT(atomic_load(&b.runs), 0);
	CHECK(!ckfs_cache_run(none, &b.task));
	CHECK_EQ_INT(stats_of(c).prefetch_queued, 1); /* tasks are no slices */
	done(none, &f0);
	done(c, &f);
	CHECK_EQ_INT(atomic_load(&b.runs), 0);
}

/* A failed read-ahead caches nothing and is counted; the get retries. */
static void test_prefetch_error(void)
{
	struct fill_ctx f;
	struct ckfs_cache *c = make_cache(&f, SS, 16 * SS, 1, 4);
	struct ckfs_cache_stats st;

	atomic_store(&f.fail_next, 1);
	ckfs_cache_prefetch(c, 9, 0, SS);
	CHECK(WAIT_UNTIL(stats_of(c).fill_errors == 1));
	CHECK(WAIT_UNTIL(stats_of(c).slices_cached == 0));
	CHECK_EQ_INT(touch(c, 9, 0, SS), CKFS_OK);
	st = stats_of(c);
	CHECK_EQ_INT(st.misses, 1);
	CHECK_EQ_INT(st.prefetch_hits, 0);
	CHECK_EQ_INT(atomic_load(&f.calls), 2);
	done(c, &f);
}

/* Fills on read-ahead workers that record the worker's signal mask. */
struct mask_ctx {
	atomic_int right;  /* fault signals unblocked, SIGTERM blocked */
	atomic_int wrong;
};

static enum ckfs_code mask_fill(void *ctx, uint64_t file_id, uint64_t offset,
				size_t len, void *buf, struct ckfs_error *err)
{
	static const int faults[] = { SIGBUS, SIGSEGV, SIGFPE, SIGILL };
	struct mask_ctx *m = ctx;
	sigset_t mask;
	bool ok;

	(void)file_id;
	(void)offset;
	(void)err;
	memset(buf, 0, len);
	pthread_sigmask(SIG_SETMASK, NULL, &mask);
	ok = sigismember(&mask, SIGTERM) == 1;
	for (size_t i = 0; i < sizeof(faults) / sizeof(faults[0]); i++)
		ok = ok && sigismember(&mask, faults[i]) == 0;
	atomic_fetch_add(ok ? &m->right : &m->wrong, 1);
	return CKFS_OK;
}

/* Read-ahead workers block the asynchronous signals (the process handles
 * them elsewhere) but never the fault signals: a fault on a thread that
 * blocks it kills the process without running any handler. The cache is
 * made by a thread that blocks every signal, so workers that inherited
 * its mask fail. */
static void test_prefetch_signals(void)
{
	struct mask_ctx m = { 0 };
	struct ckfs_cache_options opt = { .slice_size = SS, .budget_bytes = 16 * SS,
					  .prefetch_threads = 2, .prefetch_queue = 8 };
	struct ckfs_cache *c = NULL;
	struct ckfs_error err;
	sigset_t all, old;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_cache_new(&opt, mask_fill, &m, &c, &err), CKFS_OK);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (!c)
		return;
	for (uint64_t i = 0; i < 4; i++)
		ckfs_cache_prefetch(c, 11, i, SS);
	CHECK(WAIT_UNTIL(atomic_load(&m.right) + atomic_load(&m.wrong) == 4));
	CHECK_EQ_INT(atomic_load(&m.wrong), 0);
	CHECK_EQ_INT(atomic_load(&m.right), 4);
	ckfs_cache_free(c);
}

/* Waits until the single worker of c has handled every request queued
 * so far: one more is queued behind them, and got once its fill started
 * (the get waits for that fill, it does not start another). */
static void drain_queue(struct ckfs_cache *c, struct fill_ctx *f, uint64_t file_id)
{
	struct ckfs_error err;
	struct ckfs_slice *s;

	ckfs_cache_prefetch(c, file_id, 999, SS);
	CHECK(WAIT_UNTIL(atomic_load(&f->last_off) == 999 * SS));
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_cache_get(c, file_id, 999, SS, &s, &err), CKFS_OK);
	if (err.code == CKFS_OK)
		ckfs_cache_put(c, s);
}

/* A read-ahead request for a slice a get has filled meanwhile is void:
 * once that slice has been served and its buffer recycled, a late worker
 * must not fill it again, reading its source a second time for bytes
 * nobody will ask for (a worker held up on a busy machine). */
static void test_prefetch_stale(void)
{
	struct fill_ctx f;
	struct ckfs_cache *c = make_cache(&f, SS, 16 * SS, 1, 8);
	struct ckfs_error err;
	struct ckfs_slice *s;

	f.gate_file = 13;
	gate_set(&f, true);
	ckfs_cache_prefetch(c, 13, 0, SS); /* the worker waits in this fill */
	CHECK(WAIT_UNTIL(gate_blocked(&f) == 1));
	ckfs_cache_prefetch(c, 12, 1, SS); /* queued behind it */
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_cache_get(c, 12, 1, SS, &s, &err), CKFS_OK);
	ckfs_cache_put_served(c, s, SS); /* done */
	CHECK_EQ_INT(ckfs_cache_get(c, 12, 2, SS, &s, &err), CKFS_OK);
	ckfs_cache_put(c, s);
	CHECK_EQ_INT(stats_of(c).recycled, 1); /* slice 1's buffer */
	gate_set(&f, false);
	drain_queue(c, &f, 12);
	CHECK_EQ_INT(atomic_load(&f.calls), 4); /* 13/0, 12/1, 12/2, 12/999 */
	CHECK_EQ_INT(stats_of(c).fills, 4);
	done(c, &f);
}

/* The same when the get's fill failed: the worker does not retry it. */
static void test_prefetch_stale_failed(void)
{
	struct fill_ctx f;
	struct ckfs_cache *c = make_cache(&f, SS, 16 * SS, 1, 8);
	struct ckfs_error err;
	struct ckfs_slice *s;

	f.gate_file = 13;
	gate_set(&f, true);
	ckfs_cache_prefetch(c, 13, 0, SS);
	CHECK(WAIT_UNTIL(gate_blocked(&f) == 1));
	ckfs_cache_prefetch(c, 12, 1, SS);
	atomic_store(&f.fail_next, 1);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_cache_get(c, 12, 1, SS, &s, &err), CKFS_E_IO);
	gate_set(&f, false);
	drain_queue(c, &f, 12);
	CHECK_EQ_INT(atomic_load(&f.calls), 3); /* 13/0, 12/1, 12/999 */
	CHECK_EQ_INT(stats_of(c).fill_errors, 1);
	done(c, &f);
}

static void *open_gate_later(void *arg)
{
	struct fill_ctx *f = arg;

	sleep_ms(200);
	gate_set(f, false);
	return NULL;
}

/* ckfs_cache_free drops queued read-ahead: only the fill already running
 * completes. */
static void test_free_drops_queue(void)
{
	struct fill_ctx f;
	struct ckfs_cache *c = make_cache(&f, SS, 16 * SS, 1, 8);
	pthread_t t;

	gate_set(&f, true);
	for (uint64_t i = 0; i < 6; i++)
		ckfs_cache_prefetch(c, 10, i, SS);
	CHECK(WAIT_UNTIL(gate_blocked(&f) == 1));
	CHECK_EQ_INT(stats_of(c).prefetch_queued, 6);
	CHECK_EQ_INT(pthread_create(&t, NULL, open_gate_later, &f), 0);
	ckfs_cache_free(c);
	pthread_join(t, NULL);
	CHECK_EQ_INT(atomic_load(&f.calls), 1);
	ctx_destroy(&f);
}

static void test_read(void)
{
	struct fill_ctx f;
	struct ckfs_cache *c = make_cache(&f, SS, 64 * SS, 0, 0);
	const uint64_t size = 3 * SS + 100;
	static uint8_t buf[4 * SS];
	struct ckfs_cache_stats st;
	struct ckfs_error err;

	ckfs_error_clear(&err);
	/* Across one boundary. */
	CHECK_EQ_INT(ckfs_cache_read(c, 11, size, SS - 10, 20, buf, &err),
		     CKFS_OK);
	CHECK(pattern_ok(11, SS - 10, buf, 20));
	CHECK_EQ_INT(atomic_load(&f.calls), 2);
	/* The whole file, tail slice included. */
	memset(buf, 0, sizeof(buf));
	CHECK_EQ_INT(ckfs_cache_read(c, 11, size, 0, size, buf, &err),
		     CKFS_OK);
	CHECK(pattern_ok(11, 0, buf, size));
	CHECK_EQ_INT(atomic_load(&f.calls), 4);
	CHECK_EQ_INT(atomic_load(&f.last_len), 100);
	/* Up to EOF exactly, the last byte, and nothing at EOF. */
	CHECK_EQ_INT(ckfs_cache_read(c, 11, size, 2 * SS + 1, SS + 99, buf,
				     &err), CKFS_OK);
	CHECK(pattern_ok(11, 2 * SS + 1, buf, SS + 99));
	CHECK_EQ_INT(ckfs_cache_read(c, 11, size, size - 1, 1, buf, &err),
		     CKFS_OK);
	CHECK(pattern_ok(11, size - 1, buf, 1));
	CHECK_EQ_INT(ckfs_cache_read(c, 11, size, size, 0, buf, &err),
		     CKFS_OK);
	CHECK_EQ_INT(atomic_load(&f.calls), 4);
	CHECK_EQ_INT(err.code, CKFS_OK);
	/* Past EOF is the caller's bug. */
	CHECK_EQ_INT(ckfs_cache_read(c, 11, size, size - 1, 2, buf, &err),
		     CKFS_E_INVALID);
	CHECK_EQ_STR(err.msg, "read of 2 bytes at 12387 is past the end of "
			      "file 11 (12388 bytes)");
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_cache_read(c, 11, size, size + 1, 0, buf, &err),
		     CKFS_E_INVALID);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_cache_read(c, 11, size, 1, SIZE_MAX, buf, &err),
		     CKFS_E_INVALID);
	/* A file of exactly two slices has no short tail. */
	CHECK_EQ_INT(ckfs_cache_read(c, 12, 2 * SS, SS / 2, SS + SS / 2, buf,
				     &err), CKFS_OK);
	CHECK_EQ_INT(atomic_load(&f.last_len), SS);
	CHECK(pattern_ok(12, SS / 2, buf, SS + SS / 2));
	/* A fill error stops the read with that error. */
	atomic_store(&f.fail_next, 1);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_cache_read(c, 13, size, 0, 2 * SS, buf, &err),
		     CKFS_E_IO);
	CHECK_EQ_STR(err.msg, "cannot read source of file 13 at 0: "
			      "Input/output error");
	st = stats_of(c);
	CHECK_EQ_INT(st.hits + st.misses, 2 + 4 + 2 + 1 + 2 + 1);
	CHECK_EQ_INT(st.fills, 6);
	done(c, &f);
}

/* Counters after a mixed sequence agree with each other and with what the
 * test did. */
/* get + check + put_served(served). */
static void serve(struct ckfs_cache *c, uint64_t index, size_t len, size_t served)
{
	struct ckfs_error err;
	struct ckfs_slice *s;

	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_cache_get(c, 1, index, len, &s, &err), CKFS_OK);
	if (!s)
		return;
	CHECK(pattern_ok(1, index * SS, ckfs_slice_data(s), len));
	ckfs_cache_put_served(c, s, served);
}

/* A slice whose every byte was served goes first, and the next fill of the
 * same length reuses its buffer (well under the budget); half-served,
 * re-read or shorter slices are not recycled. */
static void test_recycle(void)
{
	struct fill_ctx f;
	struct ckfs_cache *c = make_cache(&f, SS, 16 * SS, 0, 0);
	struct ckfs_cache_stats st;
	enum { A, B, C, D, E, F, T = 9 };

	serve(c, A, SS, SS / 2);
	serve(c, B, SS, SS);           /* done */
	serve(c, C, SS, 0);            /* fill: B's buffer */
	st = stats_of(c);
	CHECK_EQ_INT(st.recycled, 1);
	CHECK_EQ_INT(st.evictions, 0);
	CHECK_EQ_INT(st.slices_cached, 2);
	CHECK_EQ_INT(atomic_load(&f.calls), 3);
	serve(c, B, SS, 0);            /* gone: filled again */
	CHECK_EQ_INT(atomic_load(&f.calls), 4);
	CHECK_EQ_INT(stats_of(c).recycled, 1); /* nothing was done */

	serve(c, A, SS, SS / 2);       /* hit; A's count reaches SS: done */
	serve(c, A, SS, 0);            /* hit before recycling: ordinary */
	serve(c, D, SS, 0);
	CHECK_EQ_INT(stats_of(c).recycled, 1);
	CHECK_EQ_INT(atomic_load(&f.calls), 5);

	serve(c, T, SS / 4, SS / 4);   /* a done tail slice of another size */
	serve(c, E, SS, 0);
	CHECK_EQ_INT(stats_of(c).recycled, 1);
	serve(c, T, SS / 4, 0);        /* still cached */
	CHECK_EQ_INT(atomic_load(&f.calls), 7);

	serve(c, E, SS, 2 * SS);       /* over-counting is capped, still done */
	serve(c, F, SS, 0);            /* reuses E's buffer, bytes all F's */
	st = stats_of(c);
	CHECK_EQ_INT(st.recycled, 2);
	CHECK_EQ_INT(st.fills, st.evictions + st.recycled + st.slices_cached);
	done(c, &f);
}

/* The slice buffers mapped never pass the budget plus the 4 kept for the
 * next fills, whatever the access order, with or without sharing, and
 * tail slices (unmapped at once) included; every buffer goes with the
 * cache (ckfs_cache_free aborts otherwise). Before slice_mem.h the
 * buffers were glibc's, and the heap, not the cache, decided. */
static void test_memory_bound(void)
{
	for (int share = 0; share <= 1; share++) {
		struct fill_ctx f;
		struct ckfs_cache *c = make_cache_opt(&f, SS, 8 * SS, 0, 0, share);
		uint64_t peak = 0, x = 12345;

		for (int i = 0; i < 2000; i++) {
			x = x * 6364136223846793005ull + 1442695040888963407ull;
			uint64_t file = 1 + (x >> 60) % 3, idx = (x >> 33) % 40;
			size_t len = idx == 39 ? SS / 3 : SS; /* each file's tail */
			if (i % 2)
				serve(c, idx, len, len); /* file 1, done: recycled first */
			else
				CHECK_EQ_INT(touch(c, file, idx, len), CKFS_OK);
			uint64_t mapped = stats_of(c).bytes_mapped;
			peak = mapped > peak ? mapped : peak;
		}
		CHECK(peak <= 8 * SS + 4 * SS);
		CHECK(peak >= 8 * SS);
		CHECK(stats_of(c).evictions + stats_of(c).recycled > 1000);
		done(c, &f);
	}
}

/* get file_id's slice, check it holds content's bytes, and put it back
 * having served `served` bytes. Returns its data pointer. */
static const void *serve_as(struct ckfs_cache *c, uint64_t file_id, uint64_t content,
			    uint64_t index, size_t served)
{
	struct ckfs_error err;
	struct ckfs_slice *s;
	const void *p;

	ckfs_error_clear(&err);
	if (ckfs_cache_get(c, file_id, index, SS, &s, &err) != CKFS_OK) {
		CHECK(0);
		return NULL;
	}
	p = ckfs_slice_data(s);
	CHECK(pattern_ok(content, index * SS, p, SS));
	ckfs_cache_put_served(c, s, served);
	return p;
}

/* Equal slices are held once: twins share one buffer, each slice still
 * filled (its sources read) and counted; the budget counts the buffer
 * once; without share nothing is shared. */
static void test_share_twins(void)
{
	for (int share = 0; share <= 1; share++) {
		struct fill_ctx f;
		struct ckfs_cache *c = make_cache_opt(&f, SS, 16 * SS, 0, 0, share);
		struct ckfs_cache_stats st;

		f.twins = true;
		for (uint64_t i = 0; i < 4; i++) {
			const void *a = serve_as(c, 1, 1, i, 0);
			const void *b = serve_as(c, 101, 1, i, 0);
			CHECK((a == b) == (bool)share);
			serve_as(c, 2, 2, i, 0); /* no twin held */
		}
		st = stats_of(c);
		CHECK_EQ_INT(st.fills, 12);
		CHECK_EQ_INT(atomic_load(&f.calls), 12);
		CHECK_EQ_INT(st.slices_cached, 12);
		CHECK_EQ_INT(st.shared_fills, share ? 4 : 0);
		CHECK_EQ_INT(st.shared_bytes, share ? 4 * SS : 0);
		CHECK_EQ_INT(st.bytes_saved, share ? 4 * SS : 0);
		CHECK_EQ_INT(st.bytes_cached, share ? 8 * SS : 12 * SS);
		CHECK_EQ_INT(st.bytes_hashed, share ? 12 * SS : 0);
		CHECK_EQ_INT(touch(c, 2, 3, SS), CKFS_OK); /* a hit */
		CHECK_EQ_INT(stats_of(c).hits, 1);
		done(c, &f);
	}
}

/* Evicting one of two twins frees nothing; the other keeps the bytes
 * until it goes too, and then the buffer's bytes go. */
static void test_share_eviction(void)
{
	struct fill_ctx f;
	struct ckfs_cache *c = make_cache_opt(&f, SS, 4 * SS, 0, 0, true);
	struct ckfs_cache_stats st;

	f.twins = true;
	for (uint64_t i = 0; i < 4; i++)
		serve_as(c, 1, 1, i, 0);
	for (uint64_t i = 0; i < 4; i++)
		serve_as(c, 101, 1, i, 0);
	st = stats_of(c);
	CHECK_EQ_INT(st.bytes_cached, 4 * SS); /* 8 slices within a 4-slice budget */
	CHECK_EQ_INT(st.evictions, 0);
	serve_as(c, 3, 3, 0, 0); /* over the budget: file 1's slices go first */
	st = stats_of(c);
	CHECK(st.bytes_cached <= 4 * SS);
	CHECK_EQ_INT(st.evictions, 5); /* file 1's four (freeing nothing), then 101's first */
	CHECK_EQ_INT(st.bytes_saved, 0);
	for (uint64_t i = 1; i < 4; i++)
		serve_as(c, 101, 1, i, 0); /* still held: hits */
	CHECK_EQ_INT(stats_of(c).hits, 3);
	serve_as(c, 1, 1, 2, 0); /* filled again, and shared again */
	st = stats_of(c);
	CHECK_EQ_INT(st.shared_fills, 5);
	CHECK_EQ_INT(st.bytes_saved, SS);
	done(c, &f);
}

/* With sharing, a fill never takes a buffer before it has run (it may
 * equal that slice); after it, a done slice no other slice holds gives its
 * buffer to the next fill, and a done slice held with a twin keeps it. */
static void test_share_recycle(void)
{
	struct fill_ctx f;
	struct ckfs_cache *c = make_cache_opt(&f, SS, 3 * SS, 0, 0, true);
	const void *p, *q;

	f.twins = true;
	p = serve_as(c, 1, 1, 0, SS);  /* done */
	CHECK(serve_as(c, 101, 1, 0, 0) == p); /* still there to be shared */
	q = serve_as(c, 4, 4, 0, SS);  /* done, unshared; the shared done one stays */
	CHECK_EQ_INT(stats_of(c).recycled, 0);
	CHECK(serve_as(c, 101, 1, 0, 0) == p); /* a hit, bytes intact */
	CHECK(serve_as(c, 1, 1, 0, 0) == p);
	serve_as(c, 5, 5, 0, 0);       /* after it, file 4's done buffer is taken */
	CHECK_EQ_INT(stats_of(c).recycled, 1);
	CHECK(serve_as(c, 6, 6, 0, 0) == q); /* and filled next */
	CHECK_EQ_INT(stats_of(c).evictions, 0);
	CHECK_EQ_INT(stats_of(c).bytes_cached, 3 * SS);
	CHECK_EQ_INT(atomic_load(&f.calls), 5);
	done(c, &f);
}

/* Slices larger than the fingerprint's 16 pages: equal ones are found by
 * it; ones that agree on those pages and differ elsewhere are compared,
 * found different, and keep their own bytes; at most SHARE_CANDIDATES
 * buffers of one fingerprint are compared. */
static void test_share_fingerprint(void)
{
	enum { BIG = 1 << 20 };
	struct fill_ctx f;
	struct ckfs_cache *c = make_cache_opt(&f, BIG, 64 * (uint64_t)BIG, 0, 0, true);
	struct ckfs_error err;
	struct ckfs_slice *a, *b;
	struct ckfs_cache_stats st;

	f.twins = f.pokes = true;
	ckfs_error_clear(&err);
	CHECK(ckfs_cache_get(c, 1, 0, BIG, &a, &err) == CKFS_OK);
	CHECK(ckfs_cache_get(c, 101, 0, BIG, &b, &err) == CKFS_OK);
	CHECK(ckfs_slice_data(a) == ckfs_slice_data(b));
	ckfs_cache_put(c, b);
	for (uint64_t id = 201; id <= 601; id += 100) { /* all but one byte equal */
		CHECK(ckfs_cache_get(c, id, 0, BIG, &b, &err) == CKFS_OK);
		const uint8_t *p = ckfs_slice_data(b), *q = ckfs_slice_data(a);
		CHECK(p != q);
		CHECK((p[poke_at(id)] ^ q[poke_at(id)]) == 0xFF);
		CHECK(memcmp(p, q, poke_at(id)) == 0);
		ckfs_cache_put(c, b);
	}
	st = stats_of(c);
	CHECK_EQ_INT(st.shared_fills, 1);
	CHECK_EQ_INT(st.bytes_cached, 6 * (uint64_t)BIG);
	CHECK_EQ_INT(st.bytes_hashed, 7 * 16 * 4096);
	/* file 1's buffer is now behind five of its fingerprint: not reached */
	CHECK(ckfs_cache_get(c, 1001, 0, BIG, &b, &err) == CKFS_OK);
	CHECK(ckfs_slice_data(b) != ckfs_slice_data(a));
	CHECK(memcmp(ckfs_slice_data(b), ckfs_slice_data(a), BIG) == 0); /* held twice */
	CHECK_EQ_INT(stats_of(c).shared_fills, 1);
	ckfs_cache_put(c, b);
	ckfs_cache_put(c, a);
	done(c, &f);
}

static void test_stats_consistency(void)
{
	struct fill_ctx f;
	struct ckfs_cache *c = make_cache(&f, SS, 8 * SS, 0, 0);
	struct ckfs_cache_stats st;
	uint64_t gets = 0, bytes = 0;

	for (int round = 0; round < 3; round++)
		for (uint64_t i = 0; i < 12; i++, gets++)
			CHECK_EQ_INT(touch(c, 14, i, i == 11 ? 7 : SS),
				     CKFS_OK);
	st = stats_of(c);
	CHECK_EQ_INT(st.hits + st.misses, gets);
	CHECK_EQ_INT(st.waits, 0);
	CHECK_EQ_INT(st.fills, atomic_load(&f.calls));
	CHECK_EQ_INT(st.fills, st.misses);
	CHECK_EQ_INT(st.fills, st.evictions + st.slices_cached);
	CHECK(st.bytes_cached <= st.budget_bytes);
	/* The LRU keeps the last eight used: indexes 4..11. */
	for (uint64_t i = 4; i < 12; i++)
		bytes += i == 11 ? 7 : SS;
	CHECK_EQ_INT(st.bytes_cached, bytes);
	CHECK_EQ_INT(st.slices_cached, 8);
	CHECK_EQ_INT(st.bytes_filled, 36 * SS - 3 * (SS - 7));
	done(c, &f);
}

/* A put without a pin is a bug: the process aborts with a message. */
static void test_put_unpinned_aborts(void)
{
	pid_t pid = fork();
	int status = 0;

	if (pid == 0) {
		struct fill_ctx f;
		struct ckfs_cache *c = make_cache(&f, SS, SS, 0, 0);
		struct ckfs_slice *s;
		struct ckfs_error err;

		if (!freopen("/dev/null", "w", stderr))
			_exit(2);
		ckfs_error_clear(&err);
		if (ckfs_cache_get(c, 1, 0, SS, &s, &err) != CKFS_OK)
			_exit(3);
		ckfs_cache_put(c, s);
		ckfs_cache_put(c, s);
		_exit(0);
	}
	CHECK(pid > 0);
	CHECK_EQ_INT(waitpid(pid, &status, 0), pid);
	CHECK(WIFSIGNALED(status));
	CHECK_EQ_INT(WIFSIGNALED(status) ? WTERMSIG(status) : 0, SIGABRT);
}

int main(void)
{
	ckfs_log_set_level(CKFS_LOG_NOTICE);
	RUN(test_new_invalid);
	RUN(test_miss_then_hit);
	RUN(test_content);
	RUN(test_tail_slice);
	RUN(test_eviction_lru);
	RUN(test_pinned_survive);
	RUN(test_concurrent_fill_once);
	RUN(test_fill_error);
	RUN(test_fill_error_no_message);
	RUN(test_nomem);
	RUN(test_prefetch);
	RUN(test_prefetch_queue_full);
	RUN(test_tasks);
	RUN(test_prefetch_error);
	RUN(test_prefetch_signals);
	RUN(test_prefetch_stale);
	RUN(test_prefetch_stale_failed);
	RUN(test_free_drops_queue);
	RUN(test_read);
	RUN(test_recycle);
	RUN(test_memory_bound);
	RUN(test_share_twins);
	RUN(test_share_eviction);
	RUN(test_share_recycle);
	RUN(test_share_fingerprint);
	RUN(test_stats_consistency);
	RUN(test_put_unpinned_aborts);
	return test_summary();
}
