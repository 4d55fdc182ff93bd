/* SPDX-License-Identifier: MIT */
/*
 * The slice cache: see include/ckfs/cache.h for the protocol. This file
 * keeps final output bytes of virtual files in slices keyed by (file id,
 * slice index), fills missing slices through the caller's callback exactly
 * once however many threads ask, evicts unpinned slices least recently used
 * first to stay under a byte budget, and fills queued slices on read-ahead
 * worker threads. It deliberately does not decide what to read ahead (the
 * FUSE front end sees the access pattern and calls ckfs_cache_prefetch),
 * does not know file sizes except in ckfs_cache_read, never resizes its
 * hash table, and never interrupts a running fill. Depends on
 * include/ckfs/cache.h, err.h, log.h and xxHash (XXH3_64bits).
 *
 * Table. The key (file id, index) is hashed once with XXH3; the top bits
 * pick one of CACHE_SHARDS shards, the low bits a bucket in that shard's
 * fixed array (sized for twice the slices the budget holds, chained). Each
 * shard has its own mutex, so threads reading different slices rarely
 * meet. A shard's mutex protects its buckets, the pin counts and states of
 * its slices, and its counters (so the counters cost no atomic traffic).
 *
 * LRU. One global list of the slices that are VALID and unpinned, most
 * recently released at the head (done slices, every byte of which has
 * been served, at the tail), under lru_lock. It is global rather than
 * per shard so that eviction really is least recently used across the
 * whole cache (per-shard lists would evict by shard, not by age); its
 * critical sections are a few pointer writes, taken only when a pin count
 * moves between 0 and 1 (at most twice per get/put pair, against a memcpy
 * of up to a slice per pair) and once per eviction. Invariant, true
 * whenever both the slice's shard lock and lru_lock are held: a slice is
 * on the list if and only if it is VALID with no pins. Every change to the
 * list is made holding both locks, so either lock alone is enough to read
 * a slice's links.
 *
 * Lock order: a shard lock, then lru_lock; never two shard locks at once.
 * q_lock (the read-ahead queue) is a leaf: it may be taken holding a shard
 * lock (never lru_lock), and no lock is taken while it is held.
 * No lock is held while the fill callback runs, while slice memory is
 * allocated or freed, or while bytes are copied out. The evictor, which
 * starts from the list's tail and so cannot take the victim's shard lock
 * first, reads the tail's shard under lru_lock, drops it, takes that
 * shard's lock and then lru_lock, and evicts the tail only if it still
 * belongs to that shard; otherwise it looks again.
 *
 * Filling and waiting. A miss inserts a FILLING slice pinned by the
 * filler, drops the shard lock, evicts to make room, allocates and runs
 * the callback, then publishes under the shard lock. Threads that find a
 * FILLING slice take a pin (so it outlives the fill) and sleep on the
 * shard's condition variable; the filler broadcasts when it has waiters.
 * On success the waiters return their pins. On failure the slice leaves
 * the table at once (the next get starts afresh), turns FAILED and carries
 * the filler's error for its waiters; the last pin frees it.
 *
 * Read-ahead. Workers take requests from a bounded queue and fill the
 * slice unless it is in the table. A request is void once a get has
 * filled that slice itself (the reader got there first): the get, under
 * the slice's shard lock, removes the queued requests for it and marks a
 * worker that has taken one but not yet looked the slice up. Without
 * that, a worker held up long enough on a busy machine would fill again
 * a slice that had been served and recycled meanwhile, reading its
 * source a second time for bytes nobody asks for. A request is queued
 * under the shard lock too, so none slips in between.
 *
 * Tasks (ckfs_cache_run) share the ring and the workers: a front end's
 * work of another shape (a reader's pieces fetched in parallel) runs on
 * the threads read-ahead already has. The one who queued a task takes it
 * back if no worker has (ckfs_cache_take_back, under q_lock: a task is
 * either in the ring or a worker's, never both), so it never waits for
 * a task stuck behind others, and knows when none will touch it again.
 *
 * Sharing (opt->share). A fill's bytes get a fingerprint (XXH3-128 of
 * SHARE_PAGES pages spread over the slice, of all of it when it is that
 * small; no lock held) and are looked up in a table of the buffers held
 * (share_lock); a buffer of the same fingerprint and length is pinned,
 * compared byte for byte without the lock, and, when equal and still in
 * the table, taken: the new slice points at it (refs + 1) and its own
 * buffer goes back (kept for the next fill). Otherwise the new buffer joins the table.
 * The fingerprint only finds candidates; the comparison decides. So it
 * need not read every byte: a slice that equals nothing held costs 16
 * pages of hashing (0.4 % of a 4 MiB slice) instead of all of it, and one
 * that equals a held one costs the comparison, which reading it for a
 * hash would have cost anyway. Slices that agree on the sampled pages
 * and differ elsewhere cost a comparison each (to the first difference),
 * for at most SHARE_CANDIDATES buffers, then keep their own. A buffer leaves the table, and is freed, when
 * its last slice goes (and no fill is comparing with it). A fill does not
 * know, before it has run, which held slice it will equal, so nothing is
 * evicted or recycled before it (that could be exactly the one): it fills
 * a kept buffer (or a fresh one), publishes, and only then makes room:
 * a done slice at the LRU tail whose buffer nobody else holds gives its
 * buffer back (a done slice held with others stays: it costs no
 * memory of its own), then eviction restores the budget. A fill that
 * found its bytes held gives its own buffer back. So a stream of
 * unequal slices cycles through warm buffers as without sharing, and
 * equal ones are still there to be found. share_lock is a leaf, held only for
 * pointer and counter updates.
 *
 * Accounting. bytes counts VALID and FILLING slices (charged when the
 * slice is inserted, before its buffer exists, so that eviction runs
 * before allocation) and is atomic because the budget check reads it
 * without locks. Eviction brings it back under the budget whenever enough
 * unpinned slices exist; otherwise the next unpin does. With sharing,
 * bytes counts buffers: a slice that takes a held buffer gives its own
 * charge back at once, and a shared buffer's charge goes when the buffer
 * does (not when one of its slices leaves the table). Buffers are
 * recycled from a done slice at the LRU tail (same length), which spares
 * the page faults and zeroing of fresh memory, or come from slice_mem.h:
 * mapped from the kernel, kept after use while the buffers mapped stay
 * within the budget plus CACHE_SPARES slices (the room fills before
 * eviction need with sharing), unmapped otherwise. So the memory the
 * slices take is bounded by the cache alone, not by what an allocator
 * keeps (issue 41); the budget counts slice bytes, not header overhead.
 */
#include "ckfs/cache.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack (fingerprint) */
#include <xxhash.h>
#ifdef CKFS_HAVE_XXH_DISPATCH
/* AVX2 or AVX-512, picked at run time (the header renames the calls) */
#include <xxh_x86dispatch.h>
#endif

#include "cache/slice_mem.h"
#include "ckfs/log.h"

#define CACHE_SHARDS 32           /* a power of two */
#define CACHE_SHARD_BITS 5
#define CACHE_MIN_BUCKETS 8       /* per shard, a power of two */
#define CACHE_MAX_BUCKETS (1u << 16)
#define CACHE_MAX_THREADS 256
#define CACHE_SPARES 4            /* buffers kept beyond the budget for the
				   * next fills (share fills before it evicts) */
#define SHARE_PAGE 4096           /* share: a fingerprint hashes this much */
#define SHARE_PAGES 16            /* at this many places of a slice */
#define SHARE_CANDIDATES 4        /* buffers of one fingerprint compared */

_Static_assert(CACHE_SHARDS == 1 << CACHE_SHARD_BITS, "shard bits");

/* A buffer held once for every slice of equal bytes (opt->share). */
struct shared_buf {
	/* Immutable while the buffer is in use. */
	XXH128_hash_t hash;
	size_t len;
	unsigned char *data;
	/* Protected by c->share_lock. */
	unsigned refs;                  /* slices pointing at data */
	unsigned pins;                  /* fills comparing their bytes with it */
	bool linked;                    /* in the table: fills may find it */
	struct shared_buf *next;        /* its bucket's chain */
};

enum slice_state {
	SLICE_FILLING, /* in the table, buffer owned by the filler */
	SLICE_VALID,   /* in the table, bytes immutable */
	SLICE_FAILED,  /* out of the table, kept alive by its waiters' pins */
};

struct ckfs_slice {
	/* Immutable from creation to free. */
	uint64_t file_id, index, hash;
	size_t len;
	struct cache_shard *shard;
	/* Set by the filler under shard->lock as the slice turns VALID, then
	 * immutable; readers reach it through a pin taken under that lock. */
	unsigned char *data;
	struct shared_buf *buf;         /* data's holder when shared, or NULL */
	/* Protected by shard->lock. */
	struct ckfs_slice *hnext;       /* bucket chain while in the table */
	enum slice_state state;
	unsigned refs;                  /* pins: filler + waiters, or holders */
	bool prefetched;                /* read ahead and not asked for yet */
	size_t served;                  /* bytes handed out by put_served */
	/* Protected by shard->lock and c->lru_lock together (either one is
	 * enough to read it): every byte has been served, so it sits at the
	 * LRU tail and its buffer may be recycled. */
	bool done;
	enum ckfs_code fail_code;       /* FAILED: the filler's code */
	struct ckfs_error *fail;        /* FAILED: its error for waiters, or
					 * NULL if it could not be copied */
	/* Protected by c->lru_lock; changed only with shard->lock held too. */
	struct ckfs_slice *lru_prev, *lru_next;
};

struct cache_shard {
	_Alignas(64) pthread_mutex_t lock; /* before lru_lock */
	pthread_cond_t filled;          /* a fill with waiters ended */
	/* Protected by lock. */
	struct ckfs_slice **buckets;    /* nbuckets chains */
	uint64_t hits, misses, waits, evictions, fills, fill_errors;
	uint64_t bytes_filled, prefetch_hits, slices, recycled;
};

struct prefetch_req {
	uint64_t file_id, index;
	size_t len;
	struct ckfs_cache_task *task; /* set: a task (ckfs_cache_run), not a slice */
};

/* A read-ahead worker and the request it is handling. */
struct prefetch_worker {
	struct ckfs_cache *cache;
	pthread_t thread;
	/* Protected by q_lock: between taking req from the queue and
	 * looking its slice up (or filling it), busy is set. */
	bool busy;
	struct prefetch_req req;
	/* Set under q_lock and req's shard lock, cleared under q_lock by the
	 * worker, read by it under req's shard lock: a get filled the slice
	 * itself, so the request is void. */
	bool withdrawn;
};

struct ckfs_cache {
	/* Immutable after ckfs_cache_new. */
	size_t slice_size;
	unsigned slice_shift;
	uint64_t budget;
	ckfs_cache_fill_fn fill;
	void *ctx;
	size_t nbuckets;                /* per shard, a power of two */
	int nthreads;                   /* started read-ahead workers (reset
					 * to 0 once ckfs_cache_free joins) */
	struct prefetch_worker *workers;
	bool share;

	_Atomic uint64_t bytes;         /* VALID + FILLING slice bytes */

	/* The buffers held, by content (share). */
	pthread_mutex_t share_lock;     /* a leaf: nothing taken under it */
	struct shared_buf **share_buckets; /* share_nbuckets chains, immutable
					    * pointer */
	size_t share_nbuckets;
	/* Protected by share_lock. */
	uint64_t shared_fills, shared_bytes, bytes_saved;
	_Atomic uint64_t bytes_hashed;

	struct slice_mem mem;           /* every slice buffer comes from here */

	/* The LRU list of unpinned VALID slices; head is most recent. */
	pthread_mutex_t lru_lock;       /* after any shard lock */
	struct ckfs_slice *lru_head, *lru_tail;

	/* The read-ahead queue, a ring of qcap requests. */
	pthread_mutex_t q_lock;         /* a leaf: nothing taken under it */
	pthread_cond_t q_cond;          /* work queued, or stopping */
	struct prefetch_req *q;         /* qcap entries, immutable pointer */
	int qcap;
	/* Protected by q_lock. */
	int qhead, qcount;              /* the ring's contents */
	bool stopping;
	uint64_t prefetch_queued, prefetch_dropped;

	struct cache_shard shards[CACHE_SHARDS];
};

/*
 * Broken invariants are bugs in the caller or here, never input errors:
 * report and abort whatever NDEBUG says (git's BUG()), since going on
 * would free memory that is in use.
 */
static _Noreturn void cache_bug(const char *func, const char *what)
{
	ckfs_log(CKFS_LOG_ERR, "BUG: %s: %s", func, what);
	abort();
}

#define CACHE_BUG_ON(cond, what)                                           \
	do {                                                               \
		if (cond)                                                  \
			cache_bug(__func__, what);                         \
	} while (0)

static uint64_t key_hash(uint64_t file_id, uint64_t index)
{
	const uint64_t key[2] = { file_id, index };

	return XXH3_64bits(key, sizeof(key));
}

static struct cache_shard *shard_of(struct ckfs_cache *c, uint64_t hash)
{
	return &c->shards[hash >> (64 - CACHE_SHARD_BITS)];
}

static struct ckfs_slice **bucket_of(struct ckfs_cache *c,
				     struct cache_shard *sh, uint64_t hash)
{
	return &sh->buckets[hash & (c->nbuckets - 1)];
}

/* Under sh->lock. */
static struct ckfs_slice *lookup(struct ckfs_cache *c, struct cache_shard *sh,
				 uint64_t hash, uint64_t file_id,
				 uint64_t index)
{
	struct ckfs_slice *s = *bucket_of(c, sh, hash);

	while (s && (s->hash != hash || s->file_id != file_id ||
		     s->index != index))
		s = s->hnext;
	return s;
}

/* Under sh->lock: a new FILLING slice pinned once, charged to the budget.
 * NULL when out of memory. */
static struct ckfs_slice *insert_filling(struct ckfs_cache *c,
					 struct cache_shard *sh, uint64_t hash,
					 uint64_t file_id, uint64_t index,
					 size_t len, bool prefetched)
{
	struct ckfs_slice *s = calloc(1, sizeof(*s));
	struct ckfs_slice **b = bucket_of(c, sh, hash);

	if (!s)
		return NULL;
	s->file_id = file_id;
	s->index = index;
	s->hash = hash;
	s->len = len;
	s->shard = sh;
	s->state = SLICE_FILLING;
	s->refs = 1;
	s->prefetched = prefetched;
	s->hnext = *b;
	*b = s;
	sh->slices++;
	atomic_fetch_add(&c->bytes, (uint64_t)len);
	return s;
}

/* Under sh->lock: take s out of its bucket and uncharge it (a shared
 * buffer's charge goes with the buffer: share_drop). */
static void remove_from_table(struct ckfs_cache *c, struct cache_shard *sh,
			      struct ckfs_slice *s)
{
	struct ckfs_slice **p = bucket_of(c, sh, s->hash);

	while (*p != s)
		p = &(*p)->hnext;
	*p = s->hnext;
	s->hnext = NULL;
	sh->slices--;
	if (!s->buf)
		atomic_fetch_sub(&c->bytes, (uint64_t)s->len);
}

/* ---- equal slices held once (opt->share) ---- */

static struct shared_buf **share_bucket(struct ckfs_cache *c, XXH128_hash_t h)
{
	return &c->share_buckets[h.low64 & (c->share_nbuckets - 1)];
}

/* Under share_lock. */
static void share_unlink(struct ckfs_cache *c, struct shared_buf *b)
{
	struct shared_buf **p = share_bucket(c, b->hash);

	while (*p != b)
		p = &(*p)->next;
	*p = b->next;
	b->next = NULL;
	b->linked = false;
}

/* Under share_lock: whether b is held by nothing any more (out of the
 * table then); the caller frees it, and its charge, after the lock. */
static bool share_unused(struct ckfs_cache *c, struct shared_buf *b)
{
	if (b->refs || b->pins)
		return false;
	if (b->linked)
		share_unlink(c, b);
	return true;
}

static void share_free(struct ckfs_cache *c, struct shared_buf *b)
{
	atomic_fetch_sub(&c->bytes, (uint64_t)b->len);
	slice_mem_put(&c->mem, b->data, b->len);
	free(b);
}

/* A slice holding b goes. Called with no lock held. */
static void share_drop(struct ckfs_cache *c, struct shared_buf *b)
{
	bool unused;

	pthread_mutex_lock(&c->share_lock);
	if (b->refs-- > 1)
		c->bytes_saved -= b->len;
	unused = share_unused(c, b);
	pthread_mutex_unlock(&c->share_lock);
	if (unused)
		share_free(c, b);
}

/* The fingerprint a slice's bytes are found by (see the top). */
static XXH128_hash_t fingerprint(const unsigned char *p, size_t len)
{
	XXH3_state_t st;
	size_t step;

	if (len <= (size_t)SHARE_PAGE * SHARE_PAGES)
		return XXH3_128bits(p, len);
	step = (len - SHARE_PAGE) / (SHARE_PAGES - 1); /* first and last pages too */
	XXH3_128bits_reset(&st);
	for (int i = 0; i < SHARE_PAGES; i++)
		XXH3_128bits_update(&st, p + (size_t)i * step, SHARE_PAGE);
	return XXH3_128bits_digest(&st);
}

static size_t fingerprint_bytes(size_t len)
{
	return len <= (size_t)SHARE_PAGE * SHARE_PAGES ? len : (size_t)SHARE_PAGE * SHARE_PAGES;
}

/*
 * s was just filled into data (len bytes, charged to s): hold the bytes
 * once. Either a held buffer has them (s points at it, data is freed, s's
 * charge given back) or data becomes a held buffer. Returns what s now
 * points at. Out of memory for the table entry: data stays s's own,
 * unshared. Called with no lock held.
 */
static unsigned char *share_publish(struct ckfs_cache *c, struct ckfs_slice *s,
				    unsigned char *data)
{
	XXH128_hash_t h = fingerprint(data, s->len);
	struct shared_buf *mine = calloc(1, sizeof(*mine)), *b, *last = NULL;
	bool equal = false;
	int compared = 0;

	atomic_fetch_add(&c->bytes_hashed, (uint64_t)fingerprint_bytes(s->len));
	pthread_mutex_lock(&c->share_lock);
	for (b = *share_bucket(c, h); b && !equal && compared < SHARE_CANDIDATES; b = b->next) {
		if (!XXH128_isEqual(b->hash, h) || b->len != s->len)
			continue;
		compared++;
		/* Compared without the lock: pinned, b stays alive and its
		 * bytes (never recycled while pinned) stay the same. */
		b->pins++;
		pthread_mutex_unlock(&c->share_lock);
		equal = memcmp(b->data, data, s->len) == 0;
		pthread_mutex_lock(&c->share_lock);
		b->pins--;
		if (equal && b->linked) {
			/* its last slice may have gone while it was pinned */
			if (b->refs++ > 0)
				c->bytes_saved += b->len;
			c->shared_fills++;
			c->shared_bytes += b->len;
			s->buf = b;
			break;
		}
		equal = false;
		if (share_unused(c, b)) {
			last = b; /* its last holder left while we compared */
			break;
		}
		if (!b->linked)
			break; /* the chain we walked may have changed */
	}
	if (!s->buf && mine) {
		mine->hash = h;
		mine->len = s->len;
		mine->data = data;
		mine->refs = 1;
		mine->linked = true;
		mine->next = *share_bucket(c, h);
		*share_bucket(c, h) = mine;
		s->buf = mine;
		mine = NULL;
	}
	pthread_mutex_unlock(&c->share_lock);
	free(mine);
	if (last)
		share_free(c, last);
	if (s->buf && s->buf->data != data) {
		slice_mem_put(&c->mem, data, s->len);
		atomic_fetch_sub(&c->bytes, (uint64_t)s->len); /* held once, by the buffer */
	}
	return s->buf ? s->buf->data : data;
}

/* Under the slice's shard lock and lru_lock: a done slice's buffer may be
 * recycled only when no other slice holds it and no fill is comparing
 * with it; it then leaves the share table at once, so no fill can find
 * it while it is overwritten. */
static bool share_take(struct ckfs_cache *c, struct shared_buf *b)
{
	bool mine;

	pthread_mutex_lock(&c->share_lock);
	mine = b->refs == 1 && b->pins == 0;
	if (mine && b->linked)
		share_unlink(c, b);
	pthread_mutex_unlock(&c->share_lock);
	return mine;
}

static void slice_free(struct ckfs_cache *c, struct ckfs_slice *s)
{
	if (s->buf)
		share_drop(c, s->buf);
	else
		slice_mem_put(&c->mem, s->data, s->len);
	free(s->fail);
	free(s);
}

/* Under the slice's shard lock and lru_lock. */
static void lru_unlink(struct ckfs_cache *c, struct ckfs_slice *s)
{
	if (s->lru_prev)
		s->lru_prev->lru_next = s->lru_next;
	else
		c->lru_head = s->lru_next;
	if (s->lru_next)
		s->lru_next->lru_prev = s->lru_prev;
	else
		c->lru_tail = s->lru_prev;
	s->lru_prev = s->lru_next = NULL;
}

/* Under sh->lock: one more pin on a VALID slice. */
static void pin(struct ckfs_cache *c, struct ckfs_slice *s)
{
	if (s->refs++ == 0) {
		pthread_mutex_lock(&c->lru_lock);
		lru_unlink(c, s);
		if (s->done) { /* wanted again: count afresh */
			s->done = false;
			s->served = 0;
		}
		pthread_mutex_unlock(&c->lru_lock);
	}
}

/* Under sh->lock: drop a pin on a VALID slice; true when it became
 * evictable. It then goes to the head of the LRU list (most recently
 * used), or to the tail when done: a reader finished with it, so it is the
 * first to go and its buffer the next to be recycled. */
static bool unpin(struct ckfs_cache *c, struct ckfs_slice *s, bool done)
{
	if (--s->refs != 0)
		return false;
	pthread_mutex_lock(&c->lru_lock);
	s->done = done;
	if (done) {
		s->lru_next = NULL;
		s->lru_prev = c->lru_tail;
		if (c->lru_tail)
			c->lru_tail->lru_next = s;
		else
			c->lru_head = s;
		c->lru_tail = s;
	} else {
		s->lru_prev = NULL;
		s->lru_next = c->lru_head;
		if (c->lru_head)
			c->lru_head->lru_prev = s;
		else
			c->lru_tail = s;
		c->lru_head = s;
	}
	pthread_mutex_unlock(&c->lru_lock);
	return true;
}

/*
 * Take the LRU tail out of the cache if it is evictable and, when want_len
 * is not 0, done and want_len bytes long. Called with no lock held. The
 * tail's shard cannot be locked first (the lock order is shard, then
 * lru_lock), so it is read under lru_lock, that shard is locked, and the
 * tail is taken only if it still belongs to it. 1: *victim is out of the
 * table, unpinned, the caller's to free; 0: nothing to take.
 */
static int take_tail(struct ckfs_cache *c, size_t want_len,
		     struct ckfs_slice **victim)
{
	for (;;) {
		struct ckfs_slice *v;
		struct cache_shard *sh;
		int again = 0;

		pthread_mutex_lock(&c->lru_lock);
		v = c->lru_tail;
		sh = v && (!want_len || (v->done && v->len == want_len)) ?
			     v->shard : NULL;
		pthread_mutex_unlock(&c->lru_lock);
		if (!sh)
			return 0;

		pthread_mutex_lock(&sh->lock);
		pthread_mutex_lock(&c->lru_lock);
		v = c->lru_tail;
		if (v && v->shard == sh && want_len && v->done && v->len == want_len &&
		    v->buf && !share_take(c, v->buf)) {
			/* held with other slices: no memory of its own to give */
			pthread_mutex_unlock(&c->lru_lock);
			pthread_mutex_unlock(&sh->lock);
			return 0;
		}
		if (v && v->shard == sh &&
		    (!want_len || (v->done && v->len == want_len)) &&
		    (want_len || atomic_load(&c->bytes) > c->budget)) {
			lru_unlink(c, v);
			remove_from_table(c, sh, v);
			if (want_len)
				sh->recycled++;
			else
				sh->evictions++;
		} else {
			/* The tail changed meanwhile: look again, unless a
			 * concurrent evictor already restored the budget. */
			again = want_len || atomic_load(&c->bytes) > c->budget;
			v = NULL;
		}
		pthread_mutex_unlock(&c->lru_lock);
		pthread_mutex_unlock(&sh->lock);
		if (v) {
			*victim = v;
			return 1;
		}
		if (!again)
			return 0;
	}
}

/* Free least recently used unpinned slices until the bytes held fit the
 * budget or nothing more can go. Called with no lock held. */
static void evict_to_budget(struct ckfs_cache *c)
{
	struct ckfs_slice *victim;

	while (atomic_load(&c->bytes) > c->budget && take_tail(c, 0, &victim))
		slice_free(c, victim);
}

/* A done slice's buffer of len bytes, taken from the LRU tail, or NULL.
 * Reusing it spares a fresh allocation's page faults and zeroing, which
 * cost as much as the fill itself on a streaming read. */
static unsigned char *recycle_buffer(struct ckfs_cache *c, size_t len)
{
	struct ckfs_slice *victim;
	unsigned char *data;

	if (!take_tail(c, len, &victim))
		return NULL;
	data = victim->data;
	victim->data = NULL;
	if (victim->buf) {
		/* out of the share table already (share_take): the buffer's
		 * charge goes with it */
		atomic_fetch_sub(&c->bytes, (uint64_t)victim->buf->len);
		free(victim->buf);
		victim->buf = NULL;
	}
	slice_free(c, victim);
	return data;
}

/*
 * Fill s, a FILLING slice pinned once by this thread, and publish the
 * result. On success s is VALID and still pinned. On failure s has left
 * the table, this thread's pin is gone, its waiters get the error, and the
 * error is recorded in err (may be NULL). Called with no lock held.
 */
static enum ckfs_code fill_slice(struct ckfs_cache *c, struct ckfs_slice *s,
				 struct ckfs_error *err)
{
	struct cache_shard *sh = s->shard;
	struct ckfs_error local;
	enum ckfs_code rc;
	unsigned char *data;
	size_t len;
	bool last;

	ckfs_error_clear(&local);
	if (c->share) {
		/* Equal bytes are known only after the fill, and the slice
		 * eviction or recycling would take first may be the very one
		 * this fill equals: nothing goes before it, room is made after
		 * the publish (so fills in flight may hold a slice each over
		 * the budget meanwhile). */
		data = slice_mem_get(&c->mem, s->len);
	} else {
		/* A done slice's buffer first (taking it also makes room),
		 * then make room before allocating. */
		data = recycle_buffer(c, s->len);
		evict_to_budget(c);
		if (!data)
			data = slice_mem_get(&c->mem, s->len);
	}
	if (!data) {
		rc = ckfs_fail(&local, CKFS_E_NOMEM,
			       "cannot allocate %zu bytes for slice %" PRIu64
			       " of file %" PRIu64, s->len, s->index,
			       s->file_id);
	} else {
		rc = c->fill(c->ctx, s->file_id, s->index << c->slice_shift,
			     s->len, data, &local);
		if (rc != CKFS_OK && local.code == CKFS_OK)
			ckfs_fail(&local, rc,
				  "cannot fill slice %" PRIu64 " of file %"
				  PRIu64 ": %s", s->index, s->file_id,
				  ckfs_strerror(rc));
	}

	if (rc == CKFS_OK && c->share)
		data = share_publish(c, s, data);
	pthread_mutex_lock(&sh->lock);
	if (rc == CKFS_OK) {
		s->data = data;
		s->state = SLICE_VALID;
		sh->fills++;
		sh->bytes_filled += s->len;
		if (s->refs > 1)
			pthread_cond_broadcast(&sh->filled);
		pthread_mutex_unlock(&sh->lock);
		if (c->share) {
			slice_mem_put(&c->mem, recycle_buffer(c, c->slice_size),
				      c->slice_size);
			evict_to_budget(c);
		}
		return CKFS_OK;
	}
	remove_from_table(c, sh, s);
	sh->fill_errors++;
	s->state = SLICE_FAILED;
	s->fail_code = rc;
	if (s->refs > 1) {
		/* No new waiter can come: the slice is out of the table. */
		s->fail = malloc(sizeof(*s->fail));
		if (s->fail)
			*s->fail = local;
		pthread_cond_broadcast(&sh->filled);
	}
	len = s->len; /* once unlocked, s may go with its waiters' last pin */
	last = --s->refs == 0;
	pthread_mutex_unlock(&sh->lock);
	slice_mem_put(&c->mem, data, len);
	if (last)
		slice_free(c, s);
	if (err && err->code == CKFS_OK)
		*err = local;
	return rc;
}

/* Under the shard lock: a get found s, which read-ahead produced. Counted
 * whether the fill is done or still running: either way read-ahead got
 * there first. */
static void take_prefetched(struct cache_shard *sh, struct ckfs_slice *s)
{
	if (s->prefetched) {
		s->prefetched = false;
		sh->prefetch_hits++;
	}
}

/* Under the slice's shard lock: a get fills (file_id, index) itself, so
 * read-ahead requests for it are void: the queued ones are removed, and a
 * worker that has taken one but not looked the slice up yet is told. */
static void withdraw_prefetch(struct ckfs_cache *c, uint64_t file_id,
			      uint64_t index)
{
	int kept = 0;

	if (c->nthreads == 0)
		return;
	pthread_mutex_lock(&c->q_lock);
	for (int i = 0; i < c->qcount; i++) {
		struct prefetch_req r = c->q[(c->qhead + i) % c->qcap];

		if (r.task || r.file_id != file_id || r.index != index)
			c->q[(c->qhead + kept++) % c->qcap] = r;
	}
	c->qcount = kept;
	for (int i = 0; i < c->nthreads; i++) {
		struct prefetch_worker *w = &c->workers[i];

		if (w->busy && !w->req.task && w->req.file_id == file_id && w->req.index == index)
			w->withdrawn = true;
	}
	pthread_mutex_unlock(&c->q_lock);
}

static enum ckfs_code check_slice(const struct ckfs_cache *c, uint64_t file_id,
				  uint64_t index, size_t len,
				  struct ckfs_error *err)
{
	if (len == 0 || len > c->slice_size)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "slice %" PRIu64 " of file %" PRIu64
				 ": length %zu not in 1..%zu", index, file_id,
				 len, c->slice_size);
	if (index > (UINT64_MAX >> c->slice_shift))
		return ckfs_fail(err, CKFS_E_INVALID,
				 "slice %" PRIu64 " of file %" PRIu64
				 ": offset out of range", index, file_id);
	return CKFS_OK;
}

enum ckfs_code ckfs_cache_get(struct ckfs_cache *c, uint64_t file_id,
			      uint64_t index, size_t len,
			      struct ckfs_slice **out, struct ckfs_error *err)
{
	struct cache_shard *sh;
	struct ckfs_slice *s;
	enum ckfs_code rc;
	uint64_t hash;
	bool last;

	*out = NULL;
	CKFS_TRY(check_slice(c, file_id, index, len, err));
	hash = key_hash(file_id, index);
	sh = shard_of(c, hash);

	pthread_mutex_lock(&sh->lock);
	s = lookup(c, sh, hash, file_id, index);
	if (s && s->len != len) {
		size_t have = s->len;

		pthread_mutex_unlock(&sh->lock);
		return ckfs_fail(err, CKFS_E_INVALID,
				 "slice %" PRIu64 " of file %" PRIu64
				 " is %zu bytes, not %zu", index, file_id,
				 have, len);
	}
	if (s && s->state == SLICE_VALID) {
		sh->hits++;
		take_prefetched(sh, s);
		pin(c, s);
		pthread_mutex_unlock(&sh->lock);
		*out = s;
		return CKFS_OK;
	}
	sh->misses++;
	if (s) {
		/* Another thread is filling it: wait, pinned. */
		sh->waits++;
		take_prefetched(sh, s);
		s->refs++;
		while (s->state == SLICE_FILLING)
			pthread_cond_wait(&sh->filled, &sh->lock);
		if (s->state == SLICE_VALID) {
			pthread_mutex_unlock(&sh->lock);
			*out = s;
			return CKFS_OK;
		}
		rc = s->fail_code;
		if (s->fail) {
			if (err && err->code == CKFS_OK)
				*err = *s->fail;
		} else {
			ckfs_fail(err, rc,
				  "cannot fill slice %" PRIu64 " of file %"
				  PRIu64 ": %s (details lost: out of memory)",
				  index, file_id, ckfs_strerror(rc));
		}
		last = --s->refs == 0;
		pthread_mutex_unlock(&sh->lock);
		if (last)
			slice_free(c, s);
		return rc;
	}
	s = insert_filling(c, sh, hash, file_id, index, len, false);
	withdraw_prefetch(c, file_id, index);
	pthread_mutex_unlock(&sh->lock);
	if (!s)
		return ckfs_fail(err, CKFS_E_NOMEM,
				 "cannot allocate slice %" PRIu64 " of file %"
				 PRIu64, index, file_id);
	rc = fill_slice(c, s, err);
	if (rc == CKFS_OK)
		*out = s;
	return rc;
}

const void *ckfs_slice_data(const struct ckfs_slice *s)
{
	return s->data;
}

size_t ckfs_slice_len(const struct ckfs_slice *s)
{
	return s->len;
}

void ckfs_cache_put_served(struct ckfs_cache *c, struct ckfs_slice *s,
			   size_t served)
{
	struct cache_shard *sh = s->shard;
	bool evictable;

	pthread_mutex_lock(&sh->lock);
	CACHE_BUG_ON(s->refs == 0, "put of a slice that is not pinned");
	CACHE_BUG_ON(s->state != SLICE_VALID, "put of a slice never got");
	s->served += served < s->len ? served : s->len;
	evictable = unpin(c, s, s->served >= s->len);
	pthread_mutex_unlock(&sh->lock);
	if (evictable)
		evict_to_budget(c);
}

void ckfs_cache_put(struct ckfs_cache *c, struct ckfs_slice *s)
{
	ckfs_cache_put_served(c, s, 0);
}

/* On a worker: fill the slice of w's request unless it is there already
 * or a get has filled it meanwhile (withdrawn). */
static void prefetch_one(struct ckfs_cache *c, struct prefetch_worker *w)
{
	const struct prefetch_req *r = &w->req;
	uint64_t hash = key_hash(r->file_id, r->index);
	struct cache_shard *sh = shard_of(c, hash);
	struct ckfs_error err;
	struct ckfs_slice *s;

	pthread_mutex_lock(&sh->lock);
	if (w->withdrawn || lookup(c, sh, hash, r->file_id, r->index)) {
		pthread_mutex_unlock(&sh->lock);
		return;
	}
	s = insert_filling(c, sh, hash, r->file_id, r->index, r->len, true);
	pthread_mutex_unlock(&sh->lock);
	if (!s) {
		ckfs_log(CKFS_LOG_DEBUG, "%s: no memory for slice %" PRIu64
			 " of file %" PRIu64, __func__, r->index, r->file_id);
		return;
	}
	ckfs_error_clear(&err);
	if (fill_slice(c, s, &err) == CKFS_OK)
		ckfs_cache_put(c, s); /* unpinned, most recently used */
	else
		ckfs_log(CKFS_LOG_DEBUG, "%s: %s", __func__, err.msg);
}

static void *prefetch_worker(void *arg)
{
	struct prefetch_worker *w = arg;
	struct ckfs_cache *c = w->cache;

	pthread_mutex_lock(&c->q_lock);
	for (;;) {
		while (!c->stopping && c->qcount == 0)
			pthread_cond_wait(&c->q_cond, &c->q_lock);
		if (c->stopping)
			break;
		w->req = c->q[c->qhead];
		w->busy = true;
		w->withdrawn = false;
		c->qhead = (c->qhead + 1) % c->qcap;
		c->qcount--;
		pthread_mutex_unlock(&c->q_lock);
		if (w->req.task)
			w->req.task->run(w->req.task);
		else
			prefetch_one(c, w);
		pthread_mutex_lock(&c->q_lock);
		w->busy = false;
	}
	pthread_mutex_unlock(&c->q_lock);
	return NULL;
}

void ckfs_cache_prefetch(struct ckfs_cache *c, uint64_t file_id,
			 uint64_t index, size_t len)
{
	uint64_t hash;
	struct cache_shard *sh;

	/* A hint: bad arguments are ignored like a full queue. */
	if (c->nthreads == 0 || check_slice(c, file_id, index, len, NULL))
		return;
	hash = key_hash(file_id, index);
	sh = shard_of(c, hash);
	/* Queued under the shard lock: a get filling the slice withdraws
	 * requests for it under that lock, so none can slip in between. */
	pthread_mutex_lock(&sh->lock);
	if (lookup(c, sh, hash, file_id, index)) {
		pthread_mutex_unlock(&sh->lock);
		return;
	}
	pthread_mutex_lock(&c->q_lock);
	if (c->stopping)
		goto out;
	/* The queue is short (a read-ahead window), so a scan is cheap. A
	 * request a worker has just taken is not seen here; the worker's
	 * own table lookup makes such a duplicate harmless. */
	for (int i = 0; i < c->qcount; i++) {
		const struct prefetch_req *r = &c->q[(c->qhead + i) % c->qcap];

		if (!r->task && r->file_id == file_id && r->index == index)
			goto out;
	}
	if (c->qcount == c->qcap) {
		c->prefetch_dropped++;
		goto out;
	}
	c->q[(c->qhead + c->qcount) % c->qcap] = (struct prefetch_req){ file_id, index, len, NULL };
	c->qcount++;
	c->prefetch_queued++;
	pthread_cond_signal(&c->q_cond);
out:
	pthread_mutex_unlock(&c->q_lock);
	pthread_mutex_unlock(&sh->lock);
}

bool ckfs_cache_run(struct ckfs_cache *c, struct ckfs_cache_task *t)
{
	bool queued = false;

	if (c->nthreads == 0)
		return false;
	pthread_mutex_lock(&c->q_lock);
	if (!c->stopping && c->qcount < c->qcap) {
		c->q[(c->qhead + c->qcount) % c->qcap] =
			(struct prefetch_req){ UINT64_MAX, 0, 0, t };
		c->qcount++;
		queued = true;
		pthread_cond_signal(&c->q_cond);
	}
	pthread_mutex_unlock(&c->q_lock);
	return queued;
}

bool ckfs_cache_take_back(struct ckfs_cache *c, struct ckfs_cache_task *t)
{
	bool found = false;
	int kept = 0;

	pthread_mutex_lock(&c->q_lock);
	for (int i = 0; i < c->qcount; i++) {
		struct prefetch_req r = c->q[(c->qhead + i) % c->qcap];

		if (r.task == t)
			found = true;
		else
			c->q[(c->qhead + kept++) % c->qcap] = r;
	}
	c->qcount = kept;
	pthread_mutex_unlock(&c->q_lock);
	return found;
}

enum ckfs_code ckfs_cache_read(struct ckfs_cache *c, uint64_t file_id,
			       uint64_t file_size, uint64_t off, size_t len,
			       void *buf, struct ckfs_error *err)
{
	unsigned char *dst = buf;

	if (off > file_size || len > file_size - off)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "read of %zu bytes at %" PRIu64
				 " is past the end of file %" PRIu64
				 " (%" PRIu64 " bytes)", len, off, file_id,
				 file_size);
	while (len > 0) {
		uint64_t index = off >> c->slice_shift;
		uint64_t start = index << c->slice_shift;
		size_t in = (size_t)(off - start);
		size_t slen = file_size - start < c->slice_size ?
				      (size_t)(file_size - start) :
				      c->slice_size;
		size_t n = slen - in < len ? slen - in : len;
		struct ckfs_slice *s;

		CKFS_TRY(ckfs_cache_get(c, file_id, index, slen, &s, err));
		memcpy(dst, s->data + in, n);
		ckfs_cache_put(c, s);
		dst += n;
		off += n;
		len -= n;
	}
	return CKFS_OK;
}

void ckfs_cache_get_stats(struct ckfs_cache *c, struct ckfs_cache_stats *out)
{
	memset(out, 0, sizeof(*out));
	for (int i = 0; i < CACHE_SHARDS; i++) {
		struct cache_shard *sh = &c->shards[i];

		pthread_mutex_lock(&sh->lock);
		out->hits += sh->hits;
		out->misses += sh->misses;
		out->waits += sh->waits;
		out->evictions += sh->evictions;
		out->fills += sh->fills;
		out->fill_errors += sh->fill_errors;
		out->bytes_filled += sh->bytes_filled;
		out->prefetch_hits += sh->prefetch_hits;
		out->recycled += sh->recycled;
		out->slices_cached += sh->slices;
		pthread_mutex_unlock(&sh->lock);
	}
	pthread_mutex_lock(&c->q_lock);
	out->prefetch_queued = c->prefetch_queued;
	out->prefetch_dropped = c->prefetch_dropped;
	pthread_mutex_unlock(&c->q_lock);
	pthread_mutex_lock(&c->share_lock);
	out->shared_fills = c->shared_fills;
	out->shared_bytes = c->shared_bytes;
	out->bytes_saved = c->bytes_saved;
	pthread_mutex_unlock(&c->share_lock);
	out->bytes_hashed = atomic_load(&c->bytes_hashed);
	out->bytes_cached = atomic_load(&c->bytes);
	out->bytes_mapped = slice_mem_mapped(&c->mem);
	out->budget_bytes = c->budget;
}

size_t ckfs_cache_slice_size(const struct ckfs_cache *c)
{
	return c->slice_size;
}

/* Ask the workers to stop and wait for them; a fill in progress ends
 * first. Queued requests are dropped. */
static void stop_workers(struct ckfs_cache *c)
{
	pthread_mutex_lock(&c->q_lock);
	c->stopping = true;
	c->qcount = 0;
	pthread_cond_broadcast(&c->q_cond);
	pthread_mutex_unlock(&c->q_lock);
	for (int i = 0; i < c->nthreads; i++)
		pthread_join(c->workers[i].thread, NULL);
	c->nthreads = 0;
}

/* Workers take no asynchronous signals: the process's handlers run on
 * its own threads (the FUSE session's). Faults stay unblocked: the kernel
 * delivers them to the faulting thread whatever its mask, and when they
 * are blocked it kills the process without running a handler installed
 * for them (a sanitizer's report, say). */
static enum ckfs_code start_workers(struct ckfs_cache *c, int n,
				    struct ckfs_error *err)
{
	static const int faults[] = { SIGBUS, SIGSEGV, SIGFPE, SIGILL, SIGTRAP, SIGSYS };
	sigset_t all, old;
	enum ckfs_code rc = CKFS_OK;

	sigfillset(&all);
	for (size_t i = 0; i < sizeof(faults) / sizeof(faults[0]); i++)
		sigdelset(&all, faults[i]);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (int i = 0; i < n; i++) {
		c->workers[i].cache = c;
		int e = pthread_create(&c->workers[i].thread, NULL,
				       prefetch_worker, &c->workers[i]);

		if (e != 0) {
			errno = e;
			rc = ckfs_fail_errno(err, "cannot start read-ahead "
					     "thread %d of %d", i + 1, n);
			break;
		}
		c->nthreads++;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return rc;
}

static size_t round_up_pow2(uint64_t n)
{
	size_t p = 1;

	while (p < n)
		p <<= 1;
	return p;
}

enum ckfs_code ckfs_cache_new(const struct ckfs_cache_options *opt,
			      ckfs_cache_fill_fn fill, void *ctx,
			      struct ckfs_cache **out,
			      struct ckfs_error *err)
{
	struct ckfs_cache *c;
	uint64_t want;
	void *mem;
	int i;

	*out = NULL;
	if (!fill)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "cache: no fill callback");
	if (opt->slice_size == 0 || (opt->slice_size & (opt->slice_size - 1)))
		return ckfs_fail(err, CKFS_E_INVALID,
				 "cache: slice size %zu is not a power of two",
				 opt->slice_size);
	if (opt->prefetch_threads < 0 ||
	    opt->prefetch_threads > CACHE_MAX_THREADS)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "cache: %d read-ahead threads not in 0..%d",
				 opt->prefetch_threads, CACHE_MAX_THREADS);
	if (opt->prefetch_threads > 0 && opt->prefetch_queue <= 0)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "cache: read-ahead queue of %d slices with "
				 "%d threads", opt->prefetch_queue,
				 opt->prefetch_threads);

	if (posix_memalign(&mem, _Alignof(struct ckfs_cache), sizeof(*c)))
		return ckfs_fail(err, CKFS_E_NOMEM, "cache: out of memory");
	c = mem;
	memset(c, 0, sizeof(*c));
	c->slice_size = opt->slice_size;
	while (((size_t)1 << c->slice_shift) < c->slice_size)
		c->slice_shift++;
	c->budget = opt->budget_bytes;
	slice_mem_init(&c->mem, c->slice_size,
		       opt->budget_bytes + (uint64_t)CACHE_SPARES * c->slice_size);
	c->fill = fill;
	c->ctx = ctx;
	/* Twice the slices the budget holds, spread over the shards. */
	want = opt->budget_bytes / opt->slice_size / CACHE_SHARDS * 2;
	if (want < CACHE_MIN_BUCKETS)
		want = CACHE_MIN_BUCKETS;
	if (want > CACHE_MAX_BUCKETS)
		want = CACHE_MAX_BUCKETS;
	c->nbuckets = round_up_pow2(want);
	atomic_init(&c->bytes, 0);
	atomic_init(&c->bytes_hashed, 0);
	pthread_mutex_init(&c->lru_lock, NULL);
	pthread_mutex_init(&c->share_lock, NULL);
	pthread_mutex_init(&c->q_lock, NULL);
	pthread_cond_init(&c->q_cond, NULL);
	for (i = 0; i < CACHE_SHARDS; i++) {
		pthread_mutex_init(&c->shards[i].lock, NULL);
		pthread_cond_init(&c->shards[i].filled, NULL);
	}
	for (i = 0; i < CACHE_SHARDS; i++) {
		c->shards[i].buckets = calloc(c->nbuckets, sizeof(void *));
		if (!c->shards[i].buckets)
			goto nomem;
	}
	if (opt->share) {
		c->share = true;
		c->share_nbuckets = c->nbuckets * CACHE_SHARDS;
		c->share_buckets = calloc(c->share_nbuckets, sizeof(void *));
		if (!c->share_buckets)
			goto nomem;
	}
	if (opt->prefetch_threads > 0) {
		c->qcap = opt->prefetch_queue;
		c->q = calloc((size_t)c->qcap, sizeof(*c->q));
		c->workers = calloc((size_t)opt->prefetch_threads,
				    sizeof(*c->workers));
		if (!c->q || !c->workers)
			goto nomem;
		if (start_workers(c, opt->prefetch_threads, err) != CKFS_OK) {
			ckfs_cache_free(c);
			return CKFS_E_IO;
		}
	}
	*out = c;
	return CKFS_OK;
nomem:
	ckfs_cache_free(c);
	return ckfs_fail(err, CKFS_E_NOMEM, "cache: out of memory");
}

void ckfs_cache_free(struct ckfs_cache *c)
{
	if (!c)
		return;
	stop_workers(c);
	for (int i = 0; i < CACHE_SHARDS; i++) {
		struct cache_shard *sh = &c->shards[i];

		for (size_t b = 0; sh->buckets && b < c->nbuckets; b++) {
			struct ckfs_slice *s = sh->buckets[b], *next;

			for (; s; s = next) {
				next = s->hnext;
				CACHE_BUG_ON(s->refs != 0,
					     "cache freed with a pinned slice");
				slice_free(c, s);
			}
		}
		free(sh->buckets);
		pthread_cond_destroy(&sh->filled);
		pthread_mutex_destroy(&sh->lock);
	}
	/* every shared buffer went with its last slice */
	for (size_t b = 0; c->share_buckets && b < c->share_nbuckets; b++)
		CACHE_BUG_ON(c->share_buckets[b] != NULL, "a shared buffer outlived its slices");
	free(c->share_buckets);
	slice_mem_destroy(&c->mem);
	CACHE_BUG_ON(slice_mem_mapped(&c->mem) != 0, "a slice buffer outlived the cache");
	pthread_mutex_destroy(&c->share_lock);
	free(c->q);
	free(c->workers);
	pthread_cond_destroy(&c->q_cond);
	pthread_mutex_destroy(&c->q_lock);
	pthread_mutex_destroy(&c->lru_lock);
	free(c);
}
