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
 * and a reader that skips (a piece of every row) gets the pages it asks
 * for, and those it will ask for next (Rows, below).
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
 * Rows. A reader of a piece of every row (a row-parallel shard: rank k
 * of 8 takes the k-th eighth of each row) asks for a page or two a row,
 * each a READ the reader waits for, one request to the store each: over
 * a network, 10-50 ms a row. So a handle also watches for that reader in
 * the tensor its READs fall in (rows of 2 pages or more; narrower rows
 * are read whole, a run), up to CKFS_STREAMS of them (a loader's copy
 * may split the rows between threads: 0.5B's down_proj came as rows 0
 * and 448 on, interleaved). The first page of row i's piece lies at
 * origin + i row + a, its last by origin + i row + b, a and b the same
 * for every row: the pages each row had read, once the reader leaves it,
 * narrow where a and b can be (pages round both, in another phase each
 * row when the row is not a whole number of pages; a copy may fault a
 * piece's last page first). A READ in the next row's piece is a hit:
 * the next window of rows' pieces,
 * each [a, b) rounded out to pages, is assembled by the read-ahead
 * workers at once (ckfs_cache_run: each piece a request or so, all in
 * flight together; what no worker has taken the READ's thread does
 * itself), stored, and the READ replied, so the reader runs through the
 * window in the page cache and its next READ is the row after it. The
 * window is 4 rows, doubled at each hit up to 16 (about the workers);
 * any other READ starts it over at 4, and a READ that fits no row starts
 * a new reader at its page. Never past the tensor's last row, at most a
 * slice's bytes. What it costs: the pages the pieces' bounds span, which
 * close in on the pages touched within a few rows; what it saves: the
 * reader waits for a request about once a window instead of once a row.
 * Pieces whose pages touch are one range (one request); pieces a page or
 * more apart are not joined: that gap would be fetched for nothing, a
 * page a row.
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

#include "ckfs/dtype.h"
#include "ckfs/weights.h"
#include "fuse/tree.h"

enum {
	PAGE = 4096,
	ROWS_MIN = 4,  /* rows stored ahead at first, and after a miss */
	ROWS_MAX = 16, /* and at most: about the read-ahead workers */
};

/* Bytes [off, off + len) of the file. */
struct piece {
	uint64_t off, len;
};

/* What a READ of [off, end) does past itself: store [from, to) (none
 * when from == to) but for the page at trip; big: through the slice
 * cache. Or, for a reader of a piece of every row, the pieces rows[0..n)
 * fetched in parallel and stored. */
struct plan {
	uint64_t from, to, trip;
	bool seq, big;
	size_t n;
	struct piece rows[ROWS_MAX];
};

/* The tensor of st that holds byte off, when its rows are 2 pages or more:
 * its end and its row's bytes (*row 0: none). */
static uint64_t tensor_rows(const struct ckfs_st_file *st, uint64_t off, uint64_t *row)
{
	*row = 0;
	if (!st || !st->n_tensors || off < st->offsets[0] || off >= st->offsets[st->n_tensors])
		return 0;
	size_t lo = ckfs_st_tensor_at(st, off);
	const struct ckfs_tensor *t = st->tensors[lo];
	if (t->ndim >= 2 && t->shape[t->ndim - 1] > 0)
		*row = (uint64_t)t->shape[t->ndim - 1] * ckfs_dtype_size(t->out_dtype);
	if (*row < 2 * PAGE)
		*row = 0;
	return st->offsets[lo + 1];
}

/* Where row i's piece may end, at most, relative to its row: b_hi, or
 * while no row is done, a page past what the open row has read. */
static int64_t row_b(const struct ckfs_rows *r)
{
	if (r->b_hi != INT64_MAX)
		return r->b_hi;
	return (int64_t)r->cur_end - (int64_t)r->origin - (int64_t)(r->cur * r->row) + PAGE;
}

/* Whether pages [off, end) can hold part of row i's piece. */
static bool row_fits(const struct ckfs_rows *r, uint64_t off, uint64_t end, uint64_t i)
{
	int64_t base = (int64_t)r->origin + (int64_t)(i * r->row);

	return (int64_t)off < base + row_b(r) && (int64_t)end > base + r->a_lo;
}

/* Pages [lo, hi) appended to v[0..*n), joined to the last when they
 * touch it; false when the batch would pass max bytes. */
static bool add_pages(struct piece *v, size_t *n, uint64_t lo, uint64_t hi, uint64_t max)
{
	uint64_t total = 0;

	lo &= ~(uint64_t)(PAGE - 1);
	for (size_t i = 0; i < *n; i++)
		total += v[i].len;
	if (hi <= lo)
		return true;
	if (*n && lo <= v[*n - 1].off + v[*n - 1].len) {
		uint64_t end = v[*n - 1].off + v[*n - 1].len;
		if (hi <= end)
			return true;
		if (total + (hi - end) > max)
			return false;
		v[*n - 1].len = hi - v[*n - 1].off;
		return true;
	}
	if (*n == ROWS_MAX || total + (hi - lo) > max)
		return false;
	v[(*n)++] = (struct piece){ lo, hi - lo };
	return true;
}

/* Under h->lock: where a READ of [off, end) of a file of size bytes
 * (tensors st) leaves h's row reader; with want, the pieces to fetch
 * ahead into p->rows. */
static void rows_plan(struct ckfs_fs *fs, struct ckfs_handle *h, const struct ckfs_st_file *st,
		      uint64_t size, uint64_t off, uint64_t end, bool want, struct plan *p)
{
	struct ckfs_rows *r, *lru = &h->rows[0], *wrong = NULL;
	uint64_t j = 0;

	for (int k = 0; k < CKFS_STREAMS; k++) {
		r = &h->rows[k];
		/* The open row's other pages, either side (a copy may
		 * touch a piece's last page first). */
		if (r->row && (off == r->cur_end || end == r->cur_lo) && off < r->t_end) {
			r->used = ++h->tick;
			r->cur_lo = off < r->cur_lo ? off : r->cur_lo;
			r->cur_end = end > r->cur_end ? end : r->cur_end;
			if (r->cur_end - r->cur_lo >= r->row)
				r->row = 0; /* a row or more: a band, not pieces */
			return;
		}
		if (r->row && off > r->cur_end && off < r->t_end) {
			j = r->ahead + 1; /* where the reader should come next */
			if (!row_fits(r, off, end, j)) {
				int64_t x = (int64_t)end - 1 - (int64_t)r->origin - r->a_lo;
				j = x > 0 ? (uint64_t)x / r->row : 0;
			}
			/* Rows skipped: at most a window (rows further on
			 * may be another thread's). */
			if (j > r->cur && j <= r->ahead + ROWS_MAX && row_fits(r, off, end, j))
				goto row;
			/* A READ where this reader should be that fits none of
			 * its rows: it was no such reader (its row 0 a stray
			 * page), unless another fits. */
			if (off < r->origin + (r->ahead + ROWS_MAX + 1) * r->row)
				wrong = r;
		}
		if (r->used < lru->used)
			lru = r;
	}
	/* Anything else may be the first page of a new reader's row 0, in
	 * place of one proved wrong, else of the one least recently seen. */
	r = wrong ? wrong : lru;
	r->used = ++h->tick;
	r->t_end = tensor_rows(st, end - 1, &r->row);
	r->origin = r->cur_lo = off;
	r->cur_end = end;
	/* The piece may start on the page before, when that one was read
	 * already (with the tensor before it): -PAGE. */
	r->a_lo = -PAGE;
	r->b_hi = INT64_MAX;
	r->cur = r->ahead = 0;
	r->window = ROWS_MIN;
	return;

row:;
	/* Row cur is done: its piece starts in its first page read and ends
	 * by the end of its last. */
	r->used = ++h->tick;
	int64_t at = (int64_t)r->origin + (int64_t)(r->cur * r->row);
	int64_t x = (int64_t)r->cur_lo - at, b = (int64_t)r->cur_end - at;
	bool hit = j == r->ahead + 1;
	unsigned w = hit ? r->window : ROWS_MIN;

	r->b_hi = b < r->b_hi ? b : r->b_hi;
	r->a_lo = x > r->a_lo ? x : r->a_lo;
	r->cur = r->ahead = j;
	r->cur_lo = off;
	r->cur_end = end;
	r->window = hit && 2 * w <= ROWS_MAX ? 2 * w : hit ? ROWS_MAX : ROWS_MIN;
	if (!want || r->b_hi <= r->a_lo)
		return; /* bounds that contradict: not such a reader */
	/* The next rows' pieces, up to the tensor's end: each one's bounds
	 * rounded out to pages. Not the rest of this row: the pages the
	 * reader asks for of it are what bounds where pieces end. */
	uint64_t stop = r->t_end < size ? r->t_end : size;
	for (uint64_t i = j + 1; i <= j + w; i++) {
		uint64_t base = r->origin + i * r->row;
		uint64_t lo = (uint64_t)((int64_t)base + r->a_lo);
		uint64_t hi = (uint64_t)((int64_t)base + r->b_hi);
		if (lo >= stop)
			break;
		/* Never the READ's own pages: the kernel holds them locked
		 * until it is replied, and a store of them would wait for
		 * that. Stores reach only past their READ, so none waits
		 * for a READ that waits in turn for it. */
		lo = lo > end ? lo : end;
		hi = hi < stop ? hi : stop;
		hi = (hi + PAGE - 1) / PAGE * PAGE < size ? (hi + PAGE - 1) / PAGE * PAGE : size;
		if (!add_pages(p->rows, &p->n, lo, hi, fs->slice_size))
			break;
		r->ahead = i;
	}
}

/* Where a READ of [off, end) of a file of size bytes leaves h's runs. */
static struct plan stream_plan(struct ckfs_fs *fs, struct ckfs_handle *h, uint64_t size,
			       uint64_t off, uint64_t end)
{
	const uint64_t S = fs->slice_size, cap = (uint64_t)fs->opt->readahead * S;
	const struct ckfs_st_file *st = h->served->f->nodes[h->node].st;
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
		rows_plan(fs, h, st, size, off, end, false, &p);
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
	/* A reader that skips: perhaps a piece of every row. */
	rows_plan(fs, h, st, size, off, end, !p.big && p.from == p.to && fs->se, &p);
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

/* Assemble [off, off + len) of cache file file_id from its sources into
 * a buffer of its own (*out, freed by the caller). */
static enum ckfs_code assemble(struct ckfs_fs *fs, uint64_t file_id, uint64_t off, uint64_t len,
			       char **out, struct ckfs_error *err)
{
	if (!(*out = malloc((size_t)len)))
		return ckfs_nomem(err);
	if (ckfs_fs_fill(fs, file_id, off, (size_t)len, *out, err) != CKFS_OK) {
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

	if (joined && assemble(fs, h->file_id, off, to - off, &buf, err) != CKFS_OK) {
		ckfs_error_clear(err); /* the READ's own bytes may still be had */
		joined = false;
		from = to;
	}
	if (!joined)
		CKFS_TRY(assemble(fs, h->file_id, off, len, &buf, err));
	if (joined)
		ahead = buf + len;
	else if (from < to && assemble(fs, h->file_id, from, to - from, &ahead, err) != CKFS_OK) {
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

/* A piece of a row assembled on a read-ahead worker (or by the READ that
 * wants it, when none has taken it). */
struct row_task {
	struct ckfs_cache_task task; /* first: the cache hands this back */
	struct ckfs_fs *fs;
	uint64_t file_id;
	struct piece at;
	char *buf; /* NULL: not assembled (left to the reader's READ) */
	struct rows_batch *batch;
};
struct rows_batch {
	pthread_mutex_t lock;
	pthread_cond_t done;
	size_t left; /* tasks not yet run */
};

static void row_task_run(struct ckfs_cache_task *t)
{
	struct row_task *rt = (struct row_task *)t;
	struct rows_batch *b = rt->batch;
	struct ckfs_error err;

	ckfs_error_clear(&err);
	if (assemble(rt->fs, rt->file_id, rt->at.off, rt->at.len, &rt->buf, &err) != CKFS_OK)
		ckfs_log(CKFS_LOG_DEBUG, "read-ahead of a row: %s", err.msg);
	pthread_mutex_lock(&b->lock);
	if (--b->left == 0)
		pthread_cond_signal(&b->done);
	pthread_mutex_unlock(&b->lock);
}

/* A READ of a piece of a row, and the pieces v[0..n) of the rows that
 * follow assembled meanwhile on the read-ahead workers (each one request
 * or so, all at once), stored, then the READ replied: the reader's next
 * faults find their pages. */
static enum ckfs_code reply_rows(fuse_req_t req, struct ckfs_fs *fs, struct ckfs_handle *h,
				 uint64_t off, size_t len, const struct piece *v, size_t n,
				 struct ckfs_error *err)
{
	struct ckfs_served *s = h->served;
	const uint64_t size = s->f->nodes[h->node].size;
	struct rows_batch b = { .left = n };
	struct row_task t[ROWS_MAX];
	bool queued[ROWS_MAX];
	enum ckfs_code rc;
	char *buf;

	pthread_mutex_init(&b.lock, NULL);
	pthread_cond_init(&b.done, NULL);
	for (size_t i = 0; i < n; i++) {
		t[i] = (struct row_task){ .task.run = row_task_run,
					  .fs = fs,
					  .file_id = h->file_id,
					  .at = v[i],
					  .batch = &b };
		queued[i] = ckfs_cache_run(fs->cache, &t[i].task);
	}
	rc = assemble(fs, h->file_id, off, len, &buf, err);
	/* What no worker has taken yet is done here: never a wait on a
	 * queue busy with others' slices. */
	for (size_t i = 0; i < n; i++)
		if (!queued[i] || ckfs_cache_take_back(fs->cache, &t[i].task))
			row_task_run(&t[i].task);
	pthread_mutex_lock(&b.lock);
	while (b.left)
		pthread_cond_wait(&b.done, &b.lock);
	pthread_mutex_unlock(&b.lock);
	pthread_cond_destroy(&b.done);
	pthread_mutex_destroy(&b.lock);
	for (size_t i = 0; i < n; i++) {
		if (rc == CKFS_OK && t[i].buf &&
		    store(fs, h->ino, t[i].at.off, t[i].buf, (size_t)t[i].at.len)) {
			ckfs_fs_note_replied(fs, s->replied[h->node], size, t[i].at.off,
					     t[i].at.off + t[i].at.len);
			atomic_fetch_add_explicit(&fs->stats.ra_rows, 1, memory_order_relaxed);
		}
		free(t[i].buf);
	}
	if (rc != CKFS_OK)
		return rc;
	ckfs_fs_count(fs, s, CKFS_IO_BYTES_READ, len);
	ckfs_fs_note_replied(fs, s->replied[h->node], size, off, off + len);
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
	bool counted = (p.from < p.to || p.n) && fs->se;
	if (counted && atomic_fetch_add(&fs->storing, 1) >= fs->opt->threads / 2)
		p.from = p.to, p.n = 0; /* enough threads store already */
	if (p.n) {
		rc = reply_rows(req, fs, h, off, len, p.rows, p.n, err);
	} else if (!p.big) {
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
