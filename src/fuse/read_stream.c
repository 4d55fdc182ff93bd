/* SPDX-License-Identifier: MIT */
/*
 * Reads that follow the reader: a READ of a weight file of a mount whose
 * source is in an object store (fs->stream, src/fuse/tree.h).
 *
 * Why. From a store every byte assembled is a byte fetched. The slice
 * cache assembles whole slices (4 MiB) and the windowed read-ahead of
 * read_reply.c, with the kernel's readahead of 1 MiB, serves a reader of
 * the whole file well; a tensor-parallel node reading only its shard of
 * each tensor (a band of rows, or a piece of every row) makes them fetch
 * its neighbours' shards too: 8 such nodes fetched 6.6x one copy of the
 * rank files where 2.0x is the least a page-serving file system can
 * (docs/benchmarks-log.md, "Object stores"). So the kernel's readahead is
 * set to none (each READ is what the reader touched: one page for an mmap
 * fault) and the daemon decides how far to read past it from what each
 * handle's reads have been.
 *
 * Runs. A handle tracks up to CKFS_STREAMS runs of contiguous reads (one
 * per thread of a reader walking its own part). A READ that starts
 * inside a run, up to where it was replied or stored, continues it;
 * any other starts a new one in place of the least recently used. Past a
 * READ the daemon stores into the kernel's page cache part of the run so
 * far (fuse_lowlevel_notify_store, as -o preload does), up to the
 * read-ahead window (readahead slices): an eighth of it, a quarter once
 * it is past 8 slices, all of it for a run from the file's start (a
 * whole-file reader: cat, a loader of every tensor, an export). A
 * whole-file reader so streams a window at a time with a READ per
 * window, a band read to its end fetches at most an eighth of it beyond,
 * and a reader that skips (a piece of every row) gets exactly the pages
 * it asks for.
 *
 * Assembly. While the reach is under a slice the READ and what follows
 * it are assembled straight from the sources into a buffer of their own
 * (exactly their bytes, the slice cache left alone), stored, then the
 * READ replied: the reader's next fault then finds its pages. Once the
 * reach is a slice, from the next slice's start on (a slice filled
 * around bytes fetched straight would fetch them again), whole slices
 * through the cache as before: the reach rounded up to slices, queued
 * for the read-ahead workers with one slice beyond, the READ replied,
 * then the slices stored in order, but for a page halfway whose READ
 * asks for the next window while half of this one is still ahead.
 *
 * Bounds. Half the FUSE threads at most store at once (a store waits for
 * pages a READ of another thread may hold locked: that READ must find a
 * thread); the others reply only. A store that fails (the file is
 * unmounting, the kernel is out of memory) stops that READ's stores:
 * those pages are read as any others.
 */
#define FUSE_USE_VERSION 312

#include <fuse_lowlevel.h>
#include <stdint.h>
#include <stdlib.h>

#include "fuse/tree.h"

enum {
	PAGE = 4096
};

/* What a READ of [off, end) does past itself: store [from, to) (none
 * when from == to) but for the page at trip; big: through the slice
 * cache. */
struct plan {
	uint64_t from, to, trip;
	bool seq, big;
};

/* Where a READ of [off, end) of a file of size bytes leaves h's runs. */
static struct plan stream_plan(struct ckfs_fs *fs, struct ckfs_handle *h, uint64_t size,
			       uint64_t off, uint64_t end)
{
	const uint64_t S = fs->slice_size, cap = (uint64_t)fs->opt->readahead * S;
	struct ckfs_stream *r = NULL, *lru = &h->streams[0];
	struct plan p = { .trip = UINT64_MAX };

	pthread_mutex_lock(&h->lock);
	for (int i = 0; i < CKFS_STREAMS; i++) {
		struct ckfs_stream *s = &h->streams[i];
		if (s->used && off >= s->start && off <= s->next) {
			r = s;
			p.seq = true;
			break;
		}
		if (s->used < lru->used)
			lru = s;
	}
	if (!r) {
		r = lru;
		*r = (struct ckfs_stream){ .start = off, .next = off, .trip = UINT64_MAX };
	}
	r->used = ++h->tick;
	uint64_t run = (end > r->next ? end : r->next) - r->start;
	/* A run from the file's start is a whole-file reader (cat, a loader of
	 * every tensor, an export): doubled at each step. Elsewhere an eighth
	 * of a band (what a band's end overshoots), a quarter of a longer run. */
	uint64_t reach = r->start == 0 ? run : run < 8 * S ? run / 8 : run / 4;
	reach = (reach > cap ? cap : reach) & ~(uint64_t)(PAGE - 1);
	/* Whole slices once a READ starts a slice none of which came
	 * straight from the sources (a slice filled around such bytes would
	 * fetch them again); until then, straight up to a slice's start. */
	p.big = r->big || (reach >= S && off % S == 0 && r->next <= off);
	/* Inside what was stored or is being stored, short of the trip: the
	 * reader overtook a store, which waits for the same slice and stores
	 * it once assembled; no further. */
	if (end < r->next && off < r->trip) {
		pthread_mutex_unlock(&h->lock);
		return p;
	}
	uint64_t stop = size - end < reach ? size : end + reach;
	p.from = end > r->next ? end : r->next;
	r->big = p.big;
	if (!p.big && reach >= S)
		stop = (p.from / S + 1) * S < size ? (p.from / S + 1) * S : size;
	if (p.big)
		stop = (stop + S - 1) / S * S < size ? (stop + S - 1) / S * S : size;
	p.to = stop > p.from ? stop : p.from;
	r->next = p.to;
	/* A page left out halfway: the reader's READ of it asks for the next
	 * window while half of this one is still ahead of it. */
	if (p.big && p.to - p.from >= 2 * PAGE)
		p.trip = (p.from + (p.to - p.from) / 2) & ~(uint64_t)(PAGE - 1);
	r->trip = p.trip;
	pthread_mutex_unlock(&h->lock);
	return p;
}

/* Store [off, off + len) of buf as pages of inode ino. */
static bool store(struct ckfs_fs *fs, uint64_t ino, uint64_t off, const void *buf, size_t len)
{
	struct fuse_bufvec bv = FUSE_BUFVEC_INIT(len);
	int rc;

	bv.buf[0].mem = (void *)buf;
	rc = fuse_lowlevel_notify_store(fs->se, (fuse_ino_t)ino, (off_t)off, &bv, 0);
	if (rc != 0) {
		ckfs_log(CKFS_LOG_DEBUG,
			 "read-ahead: storing %zu bytes at %llu of inode %llu: "
			 "%d",
			 len, (unsigned long long)off, (unsigned long long)ino, rc);
		return false;
	}
	atomic_fetch_add_explicit(&fs->stats.ra_stored, len, memory_order_relaxed);
	return true;
}

/* Assemble [off, off + len) of h's file from its sources into a buffer of
 * its own (*out, freed by the caller). */
static enum ckfs_code assemble(struct ckfs_fs *fs, struct ckfs_handle *h, uint64_t off,
			       uint64_t len, char **out, struct ckfs_error *err)
{
	if (!(*out = malloc((size_t)len)))
		return ckfs_nomem(err);
	if (ckfs_fs_fill(fs, h->file_id, off, (size_t)len, *out, err) != CKFS_OK) {
		free(*out);
		*out = NULL;
	}
	return err->code;
}

/* Short of a slice: [from, to) assembled and stored (with the READ's own
 * bytes in one go when it follows them), then [off, off + len) replied,
 * so the reader's next fault finds its page. */
static enum ckfs_code reply_direct(fuse_req_t req, struct ckfs_fs *fs, struct ckfs_handle *h,
				   uint64_t off, size_t len, uint64_t from, uint64_t to,
				   struct ckfs_error *err)
{
	struct ckfs_served *s = h->served;
	_Atomic uint32_t *replied = s->replied[h->node];
	const uint64_t size = s->f->nodes[h->node].size, end = off + len;
	bool joined = from == end && from < to;
	char *buf, *ahead = NULL;

	if (joined && assemble(fs, h, off, to - off, &buf, err) != CKFS_OK) {
		ckfs_error_clear(err); /* the READ's own bytes may still be had */
		joined = false;
		from = to;
	}
	if (!joined)
		CKFS_TRY(assemble(fs, h, off, len, &buf, err));
	if (joined)
		ahead = buf + len;
	else if (from < to && assemble(fs, h, from, to - from, &ahead, err) != CKFS_OK) {
		ckfs_error_clear(err); /* left to the reader's own READs */
		from = to;
	}
	if (from < to && store(fs, h->ino, from, ahead, (size_t)(to - from)))
		ckfs_fs_note_replied(fs, replied, size, from, to);
	if (!joined)
		free(ahead);
	ckfs_fs_count(fs, s, CKFS_IO_BYTES_READ, len);
	ckfs_fs_note_replied(fs, replied, size, off, end);
	fuse_reply_buf(req, buf, len);
	free(buf);
	return CKFS_OK;
}

/* Slices of [from, to) queued for the workers, and the one after. */
static void queue_slices(struct ckfs_fs *fs, struct ckfs_served *s, size_t node, uint64_t file_id,
			 uint64_t from, uint64_t to)
{
	const uint64_t S = fs->slice_size, size = s->f->nodes[node].size;
	uint64_t first = from / S, stop = (to - 1) / S + 1;

	for (uint64_t i = first; i <= stop && i * S < size; i++) {
		size_t len = (size_t)(size - i * S < S ? size - i * S : S);
		if (atomic_load_explicit(&s->replied[node][i], memory_order_relaxed) >= len)
			continue;
		ckfs_cache_prefetch(fs->cache, file_id, i, len);
		atomic_fetch_add_explicit(&fs->stats.ra_slices, 1, memory_order_relaxed);
	}
}

/* [a, b) of slice sl (at base) stored, but for the page at trip. */
static bool store_part(struct ckfs_fs *fs, struct ckfs_served *s, size_t node, uint64_t ino,
		       const char *data, uint64_t base, uint64_t a, uint64_t b, uint64_t trip)
{
	const uint64_t size = s->f->nodes[node].size;

	if (trip >= a && trip < b) {
		uint64_t t_end = trip + PAGE < b ? trip + PAGE : b;
		return store_part(fs, s, node, ino, data, base, a, trip, UINT64_MAX) &&
		       store_part(fs, s, node, ino, data, base, t_end, b, UINT64_MAX);
	}
	if (a >= b)
		return true;
	if (!store(fs, ino, a, data + (a - base), (size_t)(b - a)))
		return false;
	ckfs_fs_note_replied(fs, s->replied[node], size, a, b);
	return true;
}

/* [from, to) from the slice cache into the page cache, in order, but for
 * the page at trip. */
static void store_slices(struct ckfs_fs *fs, struct ckfs_served *s, size_t node, uint64_t file_id,
			 uint64_t ino, uint64_t from, uint64_t to, uint64_t trip)
{
	const uint64_t S = fs->slice_size, size = s->f->nodes[node].size;

	for (uint64_t i = from / S; i * S < to; i++) {
		struct ckfs_slice *sl;
		struct ckfs_error err;
		uint64_t base = i * S, a = from > base ? from : base;
		size_t len = (size_t)(size - base < S ? size - base : S);
		uint64_t b = to < base + len ? to : base + len;

		/* stored or replied in full meanwhile (the reader overtook) */
		if (atomic_load_explicit(&s->replied[node][i], memory_order_relaxed) >= len)
			continue;
		ckfs_error_clear(&err);
		if (ckfs_cache_get(fs->cache, file_id, i, len, &sl, &err) != CKFS_OK)
			return; /* the reader's own READ meets it and reports */
		bool ok = store_part(fs, s, node, ino, ckfs_slice_data(sl), base, a, b, trip);
		bool held = trip >= a && trip < b; /* not done: its READ comes */
		ckfs_cache_put_served(fs->cache, sl, ok && !held ? (size_t)(b - a) : 0);
		if (!ok)
			return;
	}
}

enum ckfs_code ckfs_fs_reply_stream(fuse_req_t req, struct ckfs_fs *fs, struct ckfs_handle *h,
				    uint64_t off, size_t len, struct ckfs_error *err)
{
	const uint64_t size = h->served->f->nodes[h->node].size;
	struct plan p = stream_plan(fs, h, size, off, off + len);
	enum ckfs_code rc;

	if (p.seq)
		atomic_fetch_add_explicit(&fs->stats.ra_sequential, 1, memory_order_relaxed);
	bool counted = p.from < p.to && fs->se;
	if (counted && atomic_fetch_add(&fs->storing, 1) >= fs->opt->threads / 2)
		p.from = p.to; /* enough threads store already */
	if (!p.big) {
		rc = reply_direct(req, fs, h, off, len, p.from, p.to, err);
	} else if (p.from == p.to) {
		rc = ckfs_fs_reply_slices(req, fs, h, off, len, false, err);
	} else {
		/* h may be released once replied: what the stores need, with a
		 * reference of their own. */
		uint64_t file_id = h->file_id, ino = h->ino;
		size_t node = h->node;
		struct ckfs_served *s = fs->ops->file(fs, file_id, err);
		if (!s) {
			rc = err->code;
		} else {
			queue_slices(fs, s, node, file_id, p.from, p.to);
			rc = ckfs_fs_reply_slices(req, fs, h, off, len, false, err);
			if (rc == CKFS_OK)
				store_slices(fs, s, node, file_id, ino, p.from, p.to, p.trip);
			ckfs_fs_put(fs, s);
		}
	}
	if (counted)
		atomic_fetch_sub(&fs->storing, 1);
	return rc;
}
