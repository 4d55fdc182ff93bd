/* SPDX-License-Identifier: MIT */
/*
 * The slice cache: final output bytes of virtual files, in aligned slices
 * of a fixed size, under a byte budget.
 *
 * Protocol (after squashfuse's cache, made explicit):
 *   - ckfs_cache_get() returns a pinned slice holding valid bytes. On a
 *     miss the calling thread fills it through the fill callback; other
 *     threads asking for the same slice meanwhile wait for that fill
 *     instead of computing it again. A failed fill is not cached: every
 *     waiter gets the error, and the next get tries again.
 *   - ckfs_cache_put() unpins. Only unpinned slices are evicted, least
 *     recently used first, whenever the bytes held exceed the budget (the
 *     budget may be exceeded while everything is pinned; it is restored as
 *     soon as slices are unpinned).
 *   - ckfs_cache_put_served() unpins and counts the bytes just served from
 *     the slice. Once they add up to its length the slice is done (a
 *     FUSE front end has handed every byte to the kernel, whose page cache
 *     now holds them): it becomes the first to be evicted, and the next
 *     fill reuses its buffer instead of allocating one, so a streaming
 *     read cycles through a few warm buffers instead of faulting in fresh
 *     memory up to the budget. A get of a done slice before it is
 *     recycled makes it an ordinary slice again (its count restarts).
 *   - ckfs_cache_prefetch() queues slices for worker threads to fill in the
 *     background (read-ahead); already cached or queued slices are skipped,
 *     and the queue is bounded (extra requests are dropped, counted).
 *   - With opt->share, equal slices are held once: every fill gets a
 *     fingerprint (XXH3-128 of 16 pages spread over it), and a fill whose
 *     bytes equal (compared byte for byte: the fingerprint only finds
 *     candidates) those of a slice held already points at that slice's
 *     buffer instead of keeping its own. The fill still
 *     ran: what is saved is memory (and so what the budget keeps), not
 *     reading. A shared buffer counts once against the budget and lives
 *     until the last slice holding it goes. Nothing is evicted or
 *     recycled before a fill (it may be the slice the fill equals): room
 *     is made after it, so the budget may be exceeded by one slice per
 *     fill in flight; done slices give their buffers to the next fills
 *     only when no other slice holds them (a few spare buffers, outside
 *     the budget, carry them over).
 * Keys are (file id, slice index); the cache knows nothing of tensors. All
 * functions are thread-safe; the fill callback runs without cache locks
 * held and may run on several threads at once for different slices.
 */
#ifndef CKFS_CACHE_H
#define CKFS_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckfs/err.h"

struct ckfs_cache;
struct ckfs_slice;

/* Fill buf with len bytes of file_id at offset; len is the slice size, or
 * less for the last slice of a file. Runs on caller or worker threads. */
typedef enum ckfs_code (*ckfs_cache_fill_fn)(void *ctx, uint64_t file_id,
					     uint64_t offset, size_t len,
					     void *buf, struct ckfs_error *err);

struct ckfs_cache_options {
	size_t slice_size;          /* bytes, power of two, e.g. 4 MiB */
	uint64_t budget_bytes;      /* e.g. 1 GiB */
	int prefetch_threads;       /* 0 disables read-ahead */
	int prefetch_queue;         /* max queued slices */
	bool share;                 /* hold equal slices once (see above) */
};

struct ckfs_cache_stats {
	uint64_t hits;              /* gets served from a valid slice */
	uint64_t misses;            /* gets that had to fill or wait for a fill */
	uint64_t waits;             /* misses that waited for another thread */
	uint64_t evictions;
	uint64_t fills;             /* slices filled (foreground + prefetch) */
	uint64_t fill_errors;
	uint64_t bytes_filled;      /* bytes produced by the fill callback */
	uint64_t prefetch_queued;
	uint64_t prefetch_dropped;
	uint64_t prefetch_hits;     /* gets that found a prefetched slice */
	uint64_t recycled;          /* done slices whose buffer a fill reused */
	uint64_t shared_fills;      /* fills whose bytes a held buffer had */
	uint64_t shared_bytes;      /* their bytes: not held a second time */
	uint64_t bytes_saved;       /* now: bytes held once for several slices,
				     * beyond the first (what unshared would add) */
	uint64_t bytes_hashed;      /* bytes run through the fingerprint (share) */
	uint64_t bytes_cached;      /* now */
	uint64_t slices_cached;     /* now */
	uint64_t budget_bytes;
	uint64_t bytes_mapped;      /* now: slice buffers mapped (cached, being
				     * filled, kept for the next fills) */
};

enum ckfs_code ckfs_cache_new(const struct ckfs_cache_options *opt,
			      ckfs_cache_fill_fn fill, void *ctx,
			      struct ckfs_cache **out,
			      struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Stops the workers (queued prefetches are dropped) and frees everything;
 * no slice may be pinned. */
void ckfs_cache_free(struct ckfs_cache *c);

/* Pinned slice index of file_id; len is the slice's byte length (slice
 * size, or the file's tail). */
enum ckfs_code ckfs_cache_get(struct ckfs_cache *c, uint64_t file_id,
			      uint64_t index, size_t len,
			      struct ckfs_slice **out,
			      struct ckfs_error *err) CKFS_WARN_UNUSED;
const void *ckfs_slice_data(const struct ckfs_slice *s);
size_t ckfs_slice_len(const struct ckfs_slice *s);
void ckfs_cache_put(struct ckfs_cache *c, struct ckfs_slice *s);
void ckfs_cache_put_served(struct ckfs_cache *c, struct ckfs_slice *s,
			   size_t served);

/* Queue slice index of file_id (of byte length len) for read-ahead. */
void ckfs_cache_prefetch(struct ckfs_cache *c, uint64_t file_id,
			 uint64_t index, size_t len);

/* Work of another kind for the read-ahead workers: run(t) on one of
 * them, queued with the slices (a reader's pieces fetched in parallel,
 * src/fuse/read_stream.c). The cache knows nothing of what it does. */
struct ckfs_cache_task {
	void (*run)(struct ckfs_cache_task *t);
};
/* Queue t; false when it is not (no workers, the queue full, stopping):
 * the caller runs it itself. A task queued must be taken back or have run
 * before t goes and before ckfs_cache_free. */
bool ckfs_cache_run(struct ckfs_cache *c, struct ckfs_cache_task *t);
/* Take t back if no worker has taken it yet: true, and it will not run;
 * false: a worker has it (running or run). */
bool ckfs_cache_take_back(struct ckfs_cache *c, struct ckfs_cache_task *t);

/* Copy bytes [off, off + len) of a file of file_size bytes through the
 * cache (get + memcpy + put per slice). */
enum ckfs_code ckfs_cache_read(struct ckfs_cache *c, uint64_t file_id,
			       uint64_t file_size, uint64_t off, size_t len,
			       void *buf, struct ckfs_error *err) CKFS_WARN_UNUSED;

void ckfs_cache_get_stats(struct ckfs_cache *c, struct ckfs_cache_stats *out);
size_t ckfs_cache_slice_size(const struct ckfs_cache *c);

#endif
