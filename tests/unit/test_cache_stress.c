/* SPDX-License-Identifier: MIT */
/*
 * Stress test for src/cache/cache.c, meant to run under ThreadSanitizer
 * (and AddressSanitizer): 16 threads get, read, hold and read ahead random
 * slices of a few files whose working set is ten times the budget, while
 * the fill callback fails now and then. Every byte read is checked against
 * the (file id, offset) pattern, every failure against the message the
 * fill produced for that very slice, and at the end the counters must
 * agree with each other and with the operations the threads made. Runs
 * for CKFS_STRESS_SECONDS (default 2) or until each thread made
 * CKFS_STRESS_OPS operations (default 200000), whichever comes first, and
 * past that until the mix has shown what it is here for (a failed fill,
 * a wait, an eviction, a queued read-ahead): how much of it two seconds
 * show depends on how busy the machine is. A cap of HANG_SECONDS only
 * catches a hang. Run twice: then with equal slices held once (share),
 * the files' contents paired so that fills find equal buffers held.
 */
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckfs/cache.h"
#include "ckfs/err.h"
#include "test.h"

#define SS 4096u
#define NTHREADS 16
#define MAX_HELD 4
#define FAIL_EVERY 53 /* fill calls */
#define HANG_SECONDS 300

static const uint64_t file_sizes[] = {
	40 * SS + 123, 64 * SS, 17 * SS + 1, 33 * SS + 4000, SS - 5,
};
#define NFILES (sizeof(file_sizes) / sizeof(file_sizes[0]))
#define FILE_ID(i) (1000 + (uint64_t)(i)) /* not the array index */

static atomic_uint_fast64_t fill_calls, fills_failed, bytes_ok;
/* share run: files of the same parity hold the same bytes */
static bool twins;
static atomic_bool stop;
static atomic_int running;
static long max_ops = 200000;

static uint8_t pattern(uint64_t file_id, uint64_t off)
{
	if (twins)
		file_id %= 2;
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

static void fail_msg(char *buf, size_t size, uint64_t file_id,
		     uint64_t offset)
{
	snprintf(buf, size, "injected failure in file %" PRIu64 " at %" PRIu64,
		 file_id, offset);
}

static enum ckfs_code stress_fill(void *ctx, uint64_t file_id,
				  uint64_t offset, size_t len, void *buf,
				  struct ckfs_error *err)
{
	uint64_t n = atomic_fetch_add(&fill_calls, 1);
	uint8_t *p = buf;

	(void)ctx;
	if (n % 7 == 0)
		sched_yield(); /* let others pile up on this slice */
	if (n % FAIL_EVERY == FAIL_EVERY - 1) {
		char msg[128];

		atomic_fetch_add(&fills_failed, 1);
		fail_msg(msg, sizeof(msg), file_id, offset);
		return ckfs_fail(err, CKFS_E_IO, "%s", msg);
	}
	for (size_t i = 0; i < len; i++)
		p[i] = pattern(file_id, offset + i);
	atomic_fetch_add(&bytes_ok, len);
	return CKFS_OK;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct worker {
	pthread_t tid;
	struct ckfs_cache *cache;
	uint64_t rng;
	/* Results, read after join. */
	uint64_t gets;     /* ckfs_cache_get calls, direct or by a read */
	uint64_t errors;   /* expected injected failures seen */
	uint64_t bad;      /* wrong bytes or unexpected errors */
	uint64_t ops, prefetches;
	struct ckfs_slice *held[MAX_HELD];
	int nheld;
};

static uint64_t next_rand(struct worker *w)
{
	/* xorshift64* */
	w->rng ^= w->rng >> 12;
	w->rng ^= w->rng << 25;
	w->rng ^= w->rng >> 27;
	return w->rng * 0x2545F4914F6CDD1Dull;
}

static size_t slice_len(unsigned file, uint64_t index)
{
	uint64_t left = file_sizes[file] - index * SS;

	return left < SS ? (size_t)left : SS;
}

static uint64_t n_slices(unsigned file)
{
	return (file_sizes[file] + SS - 1) / SS;
}

static void note_bad(struct worker *w, const char *what,
		     const struct ckfs_error *err)
{
	if (w->bad++ < 5)
		fprintf(stderr, "stress: %s: %s\n", what, err ? err->msg : "");
}

static void release_all(struct worker *w)
{
	while (w->nheld > 0)
		ckfs_cache_put(w->cache, w->held[--w->nheld]);
}

static void op_get(struct worker *w, unsigned file, uint64_t index, bool hold)
{
	uint64_t id = FILE_ID(file);
	size_t len = slice_len(file, index);
	struct ckfs_slice *s;
	struct ckfs_error err;
	enum ckfs_code rc;
	char want[128];

	ckfs_error_clear(&err);
	w->gets++;
	rc = ckfs_cache_get(w->cache, id, index, len, &s, &err);
	if (rc != CKFS_OK) {
		fail_msg(want, sizeof(want), id, index * SS);
		if (rc == CKFS_E_IO && err.code == CKFS_E_IO &&
		    strcmp(err.msg, want) == 0)
			w->errors++;
		else
			note_bad(w, "get", &err);
		return;
	}
	if (ckfs_slice_len(s) != len ||
	    !pattern_ok(id, index * SS, ckfs_slice_data(s), len))
		note_bad(w, "get: wrong bytes", NULL);
	if (hold && w->nheld < MAX_HELD)
		w->held[w->nheld++] = s;
	else if (next_rand(w) & 1) /* served whole or in part: may recycle */
		ckfs_cache_put_served(w->cache, s, next_rand(w) & 1 ? len :
					       (size_t)(next_rand(w) % (len + 1)));
	else
		ckfs_cache_put(w->cache, s);
}

static void op_read(struct worker *w, unsigned file)
{
	static _Thread_local uint8_t buf[3 * SS + 1];
	uint64_t id = FILE_ID(file), size = file_sizes[file];
	uint64_t off = next_rand(w) % (size + 1);
	size_t len = (size_t)(next_rand(w) % (sizeof(buf) + 1));
	struct ckfs_error err;
	enum ckfs_code rc;

	if (len > size - off)
		len = (size_t)(size - off);
	ckfs_error_clear(&err);
	rc = ckfs_cache_read(w->cache, id, size, off, len, buf, &err);
	if (rc == CKFS_OK) {
		if (len > 0)
			w->gets += (off + len - 1) / SS - off / SS + 1;
		if (!pattern_ok(id, off, buf, len))
			note_bad(w, "read: wrong bytes", NULL);
		return;
	}
	/* The failing slice is named in the message: it must be one the
	 * read covers, and the read got every slice up to it. */
	uint64_t fid, at;
	char want[128];

	if (rc == CKFS_E_IO &&
	    sscanf(err.msg, "injected failure in file %" SCNu64 " at %" SCNu64,
		   &fid, &at) == 2 &&
	    fid == id && at % SS == 0 && at / SS >= off / SS && len > 0 &&
	    at / SS <= (off + len - 1) / SS) {
		fail_msg(want, sizeof(want), fid, at);
		if (strcmp(want, err.msg) == 0) {
			w->errors++;
			w->gets += at / SS - off / SS + 1;
			return;
		}
	}
	note_bad(w, "read", &err);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;

	while (w->ops < (uint64_t)max_ops && !atomic_load(&stop)) {
		uint64_t r = next_rand(w) % 100;
		unsigned file = (unsigned)(next_rand(w) % NFILES);
		uint64_t index = next_rand(w) % n_slices(file);

		w->ops++;
		if (r < 30) {
			op_get(w, file, index, false);
		} else if (r < 40) {
			op_get(w, file, index, true); /* pinned for a while */
		} else if (r < 75) {
			op_read(w, file);
		} else if (r < 95) {
			/* Read ahead a short window, as a FUSE read would. */
			for (uint64_t i = index; i < index + 4 &&
			     i < n_slices(file); i++) {
				ckfs_cache_prefetch(w->cache, FILE_ID(file), i,
						    slice_len(file, i));
				w->prefetches++;
			}
		} else {
			release_all(w);
		}
	}
	release_all(w);
	atomic_fetch_sub(&running, 1);
	return NULL;
}

/* Whether the counters show every behaviour the mix is here for. */
static bool mix_seen(struct ckfs_cache *c)
{
	struct ckfs_cache_stats st;

	ckfs_cache_get_stats(c, &st);
	return st.fill_errors > 0 && st.waits > 0 && st.evictions > 0 &&
	       st.prefetch_queued > 0 && (st.bytes_hashed == 0 || st.shared_fills > 0);
}

static void sleep_10ms(void)
{
	struct timespec ts = { 0, 10 * 1000 * 1000 };

	nanosleep(&ts, NULL);
}

/* At rest (no pins, no fill running, read-ahead idle) these hold exactly.
 * Read-ahead workers may still be busy after the test threads end, so the
 * caller polls. */
static bool at_rest_consistent(struct ckfs_cache *c,
			       struct ckfs_cache_stats *st)
{
	ckfs_cache_get_stats(c, st);
	return st->fills == st->evictions + st->recycled + st->slices_cached &&
	       st->bytes_cached <= st->budget_bytes &&
	       st->fills + st->fill_errors == atomic_load(&fill_calls) &&
	       st->bytes_filled == atomic_load(&bytes_ok);
}

static void stress(bool share)
{
	struct ckfs_cache_options opt = {
		.slice_size = SS,
		.budget_bytes = 24 * SS, /* the working set is ~160 slices */
		.prefetch_threads = 4,
		.prefetch_queue = 32,
		.share = share,
	};
	struct worker w[NTHREADS];
	struct ckfs_cache_stats st;
	struct ckfs_cache *c = NULL;
	struct ckfs_error err;
	uint64_t gets = 0, errors = 0, bad = 0, ops = 0, prefetches = 0;
	double seconds = 2, start = now(), ran;
	const char *env;

	if ((env = getenv("CKFS_STRESS_SECONDS")))
		seconds = atof(env);
	if ((env = getenv("CKFS_STRESS_OPS")))
		max_ops = atol(env);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_cache_new(&opt, stress_fill, NULL, &c, &err),
		     CKFS_OK);
	if (!c)
		return;
	for (int i = 0; i < NTHREADS; i++) {
		memset(&w[i], 0, sizeof(w[i]));
		w[i].cache = c;
		w[i].rng = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
		atomic_fetch_add(&running, 1);
		CHECK_EQ_INT(pthread_create(&w[i].tid, NULL, worker_main,
					    &w[i]), 0);
	}
	while (atomic_load(&running) > 0 && now() < start + HANG_SECONDS &&
	       (now() < start + seconds || !mix_seen(c)))
		sleep_10ms();
	ran = now() - start;
	atomic_store(&stop, true);
	for (int i = 0; i < NTHREADS; i++) {
		pthread_join(w[i].tid, NULL);
		gets += w[i].gets;
		errors += w[i].errors;
		bad += w[i].bad;
		ops += w[i].ops;
		prefetches += w[i].prefetches;
	}

	/* A hang, not slowness, is what the cap is for. */
	bool rest = false;
	for (int t = 0; t < 100 * HANG_SECONDS && !(rest = at_rest_consistent(c, &st)); t++)
		sleep_10ms();
	fprintf(stderr,
		"stress: %.1f s, %" PRIu64 " ops, %" PRIu64 " gets: %" PRIu64
		" hits, %" PRIu64 " misses (%" PRIu64 " waits), %" PRIu64
		" fills, %" PRIu64 " errors, %" PRIu64 " evictions, %" PRIu64
		" recycled, read-ahead %" PRIu64 " queued %" PRIu64 " dropped %" PRIu64
		" hits, %" PRIu64 " bytes in %" PRIu64 " slices\n",
		ran, ops, gets, st.hits, st.misses, st.waits,
		st.fills, st.fill_errors, st.evictions, st.recycled, st.prefetch_queued,
		st.prefetch_dropped, st.prefetch_hits, st.bytes_cached,
		st.slices_cached);
	CHECK(rest);
	CHECK_EQ_INT(bad, 0);
	CHECK_EQ_INT(st.hits + st.misses, gets);
	CHECK(st.waits <= st.misses);
	CHECK(st.prefetch_hits <= st.prefetch_queued);
	CHECK(st.prefetch_queued + st.prefetch_dropped <= prefetches);
	CHECK_EQ_INT(st.fills, st.evictions + st.recycled + st.slices_cached);
	CHECK(st.bytes_cached <= st.budget_bytes);
	CHECK(st.bytes_cached <= st.slices_cached * SS);
	/* slice memory: the budget and the 4 buffers kept beyond it, or the
	 * slices held when tails (a page each) outnumber the budget's */
	CHECK(st.bytes_mapped <= st.budget_bytes + 4 * SS ||
	      st.bytes_mapped <= (st.slices_cached + 4) * SS);
	CHECK_EQ_INT(st.fill_errors, atomic_load(&fills_failed));
	CHECK_EQ_INT(st.fills + st.fill_errors, atomic_load(&fill_calls));
	CHECK_EQ_INT(st.bytes_filled, atomic_load(&bytes_ok));
	/* The mix must have exercised what it is here for. */
	CHECK(errors > 0);
	CHECK(st.waits > 0 || ops < 10000);
	CHECK(st.evictions > 0);
	CHECK(st.prefetch_queued > 0);
	if (share) {
		CHECK(st.shared_fills > 0);
		CHECK(st.bytes_saved + st.bytes_cached <= st.slices_cached * SS);
		CHECK_EQ_INT(st.bytes_hashed, st.bytes_filled);
	} else {
		CHECK_EQ_INT(st.shared_fills, 0);
		CHECK_EQ_INT(st.bytes_saved, 0);
	}
	ckfs_cache_free(c); /* aborts if a shared buffer outlived its slices */
}

static void test_stress(void)
{
	stress(false);
}

static void test_stress_shared(void)
{
	twins = true;
	atomic_store(&fill_calls, 0);
	atomic_store(&fills_failed, 0);
	atomic_store(&bytes_ok, 0);
	atomic_store(&stop, false);
	stress(true);
	twins = false;
}

int main(void)
{
	RUN(test_stress);
	RUN(test_stress_shared);
	return test_summary();
}
