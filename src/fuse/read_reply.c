/* SPDX-License-Identifier: MIT */
/*
 * Answering READ (src/fuse/tree.h), and the slice cache's fill.
 *
 * Weight files are read through the slice cache (file id = the served
 * folder's file_base + node): the slices a request covers are pinned, the
 * reply is one iovec pointing into them, then they are unpinned. Rendered
 * files are replied from memory and passthrough side files are read
 * directly (both small). Every reply carries exactly the bytes asked for,
 * short only at EOF.
 *
 * Read-ahead. Each open file handle watches its own reads. A read that
 * starts near where the previous one ended (within two slices, which
 * tolerates the kernel's own readahead requests arriving out of order) is
 * sequential: the window opens at 2 slices, doubles each time the reader
 * enters a new slice, up to opt->readahead, and the slices ahead of the
 * reader are queued with ckfs_cache_prefetch. Any other read closes the
 * window. Slices already queued for the handle are not queued again, nor
 * slices already replied to the kernel in full (served->replied).
 *
 * O_DIRECT. A handle opened with O_DIRECT gets replies the kernel does not
 * keep, and its reader may ask for the same bytes again (fastsafetensors
 * rounds each thread's range out to the direct-I/O block, so neighbouring
 * ranges overlap). Its replies are therefore neither counted as served to
 * the cache (a slice would look done, handed to the page cache in full,
 * after part of it was read twice: its buffer would go to the next fill and
 * the rest of it would read the sources again) nor as replied (read-ahead
 * would skip slices the page cache does not hold). Its slices stay ordinary
 * LRU slices under the budget.
 */
#define FUSE_USE_VERSION 312

#include <fuse_lowlevel.h>
#include <inttypes.h>
#include <stdlib.h>
#include <sys/uio.h>

#include "fuse/tree.h"

/* Read-ahead: first window, in slices. */
#define CKFS_RA_MIN 2u

static uint64_t slice_len(const struct ckfs_fs *fs, uint64_t size, uint64_t index)
{
	uint64_t start = index * fs->slice_size;
	uint64_t rest = size - start;
	return rest < fs->slice_size ? rest : fs->slice_size;
}

/* Update h's window for a read of [off, end) of a file of size bytes:
 * the slices [*from, *to) are to be queued. Returns whether the read is
 * sequential. */
static bool ra_window(struct ckfs_fs *fs, struct ckfs_handle *h, uint64_t size, uint64_t off,
		      uint64_t end, uint64_t *from, uint64_t *to)
{
	const uint64_t S = fs->slice_size, tol = 2 * S;
	const unsigned max = (unsigned)fs->opt->readahead;
	uint64_t n_slices = (size + S - 1) / S, cur = (end - 1) / S;
	bool seq;

	*from = *to = 0;
	pthread_mutex_lock(&h->lock);
	seq = h->seen && off + tol >= h->prev_end && off <= h->prev_end + tol;
	if (!seq) {
		h->window = 0;
		h->ra_next = 0;
		h->prev_end = end;
		h->slice = cur;
	} else {
		if (h->window == 0)
			h->window = CKFS_RA_MIN < max ? CKFS_RA_MIN : max;
		else if (cur > h->slice && h->window < max)
			h->window = h->window * 2 < max ? h->window * 2 : max;
		if (end > h->prev_end)
			h->prev_end = end;
		if (cur > h->slice)
			h->slice = cur;
		*from = h->ra_next > cur + 1 ? h->ra_next : cur + 1;
		*to = cur + 1 + h->window;
		if (*to > n_slices)
			*to = n_slices;
		if (*from < *to)
			h->ra_next = *to;
		else
			*from = *to;
	}
	h->seen = true;
	pthread_mutex_unlock(&h->lock);
	return seq;
}

/* Queue the slices ahead of a read of [off, end) of h's weight file. */
static void read_ahead(struct ckfs_fs *fs, struct ckfs_handle *h, _Atomic uint32_t *replied,
		       uint64_t size, uint64_t off, uint64_t end)
{
	uint64_t from, to;

	if (fs->opt->readahead <= 0 || fs->opt->prefetch_threads <= 0)
		return;
	if (ra_window(fs, h, size, off, end, &from, &to))
		atomic_fetch_add(&fs->stats.ra_sequential, 1);
	for (uint64_t s = from; s < to; s++) {
		uint64_t len = slice_len(fs, size, s);
		/* Replied in full: other readers of the file (tensor-parallel
		 * ranks) got it from the kernel's page cache; filling it again
		 * would read its sources twice. */
		if (atomic_load_explicit(&replied[s], memory_order_relaxed) >= len) {
			atomic_fetch_add(&fs->stats.ra_skipped, 1);
			continue;
		}
		ckfs_cache_prefetch(fs->cache, h->file_id, s, (size_t)len);
		atomic_fetch_add(&fs->stats.ra_slices, 1);
	}
}

/* Count the bytes of [off, end) replied, per slice. A request for bytes
 * of a slice already replied in full means the kernel dropped them: start
 * counting again, so read-ahead fills that slice again. */
void ckfs_fs_note_replied(struct ckfs_fs *fs, _Atomic uint32_t *replied, uint64_t size,
			  uint64_t off, uint64_t end)
{
	const uint64_t S = fs->slice_size;

	for (uint64_t idx = off / S; idx * S < end; idx++) {
		uint64_t a = off > idx * S ? off : idx * S;
		uint64_t b = end < (idx + 1) * S ? end : (idx + 1) * S;
		_Atomic uint32_t *r = &replied[idx];
		uint32_t was = atomic_fetch_add_explicit(r, (uint32_t)(b - a),
							 memory_order_relaxed);
		if (was >= slice_len(fs, size, idx))
			atomic_store_explicit(r, (uint32_t)(b - a), memory_order_relaxed);
	}
}

/* A weight file: pin the slices covering [off, off + len), reply with one
 * iovec into them, unpin. */
enum ckfs_code ckfs_fs_reply_slices(fuse_req_t req, struct ckfs_fs *fs, struct ckfs_handle *h,
				    uint64_t off, size_t len, bool ahead, struct ckfs_error *err)
{
	enum { STACK_SLICES = 8 };
	struct ckfs_slice *stack_sl[STACK_SLICES], **sl = stack_sl;
	struct iovec stack_iov[STACK_SLICES], *iov = stack_iov;
	struct ckfs_served *s = h->served;
	_Atomic uint32_t *replied = s->replied[h->node];
	const uint64_t S = fs->slice_size, end = off + len, size = s->f->nodes[h->node].size;
	uint64_t first = off / S, count = (end - 1) / S - first + 1, got = 0;
	const bool direct = h->direct; /* h may be gone once replied */

	if (ahead)
		read_ahead(fs, h, replied, size, off, end);
	if (count > STACK_SLICES) {
		sl = calloc(count, sizeof(*sl));
		iov = calloc(count, sizeof(*iov));
		if (!sl || !iov) {
			ckfs_nomem(err);
			goto out;
		}
	}
	for (; got < count; got++) {
		uint64_t idx = first + got, base = idx * S;
		if (ckfs_cache_get(fs->cache, h->file_id, idx, (size_t)slice_len(fs, size, idx),
				   &sl[got], err) != CKFS_OK)
			goto out;
		const char *data = ckfs_slice_data(sl[got]);
		uint64_t a = off > base ? off - base : 0;
		uint64_t b = end - base < ckfs_slice_len(sl[got]) ? end - base
								  : ckfs_slice_len(sl[got]);
		iov[got].iov_base = (void *)(data + a);
		iov[got].iov_len = (size_t)(b - a);
	}
	/* Counted first: once replied, the handle may be released (and h
	 * freed) by another thread at any moment. */
	ckfs_fs_count(fs, s, CKFS_IO_BYTES_READ, len);
	if (!direct)
		ckfs_fs_note_replied(fs, replied, size, off, end);
	fuse_reply_iov(req, iov, (int)count);
out:
	for (uint64_t i = 0; i < got; i++)
		ckfs_cache_put_served(fs->cache, sl[i],
				      err->code == CKFS_OK && !direct ? iov[i].iov_len : 0);
	if (sl != stack_sl)
		free(sl);
	if (iov != stack_iov)
		free(iov);
	return err->code;
}

/* A side file (tokenizer, generation config): small, read directly. */
static enum ckfs_code reply_passthrough(fuse_req_t req, struct ckfs_fs *fs,
					struct ckfs_handle *h, uint64_t off, size_t len,
					struct ckfs_error *err)
{
	const struct ckfs_folder *f = h->served->f;
	struct ckfs_read_scratch *scratch = ckfs_fs_scratch(fs);
	char *buf = malloc(len);
	size_t got = 0;

	if (!buf || !scratch) {
		free(buf);
		return ckfs_nomem(err);
	}
	if (ckfs_folder_read(f, &f->nodes[h->node], off, len, buf, &got, scratch, err) ==
	    CKFS_OK) {
		ckfs_fs_count(fs, h->served, CKFS_IO_BYTES_READ, got);
		fuse_reply_buf(req, buf, got);
	}
	free(buf);
	return err->code;
}

enum ckfs_code ckfs_fs_reply_read(fuse_req_t req, struct ckfs_fs *fs, struct ckfs_handle *h,
				  uint64_t off, size_t len, struct ckfs_error *err)
{
	const struct ckfs_node *n = &h->served->f->nodes[h->node];

	switch (n->kind) {
	case CKFS_NODE_WEIGHTS:
		if (fs->stream && !h->direct)
			return ckfs_fs_reply_stream(req, fs, h, off, len, err);
		return ckfs_fs_reply_slices(req, fs, h, off, len, true, err);
	case CKFS_NODE_RENDERED:
		ckfs_fs_count(fs, h->served, CKFS_IO_BYTES_READ, len);
		fuse_reply_buf(req, n->data + off, len);
		return CKFS_OK;
	case CKFS_NODE_PASSTHROUGH:
		return reply_passthrough(req, fs, h, off, len, err);
	case CKFS_NODE_DIR: /* never opened as a file */
		break;
	}
	return ckfs_fail(err, CKFS_E_INVALID, "'%s': a folder", n->name);
}

enum ckfs_code ckfs_fs_fill(void *ctx, uint64_t file_id, uint64_t offset, size_t len,
			    void *buf, struct ckfs_error *err)
{
	struct ckfs_fs *fs = ctx;
	struct ckfs_served *s = fs->ops->file(fs, file_id, err);
	struct ckfs_read_scratch *scratch;
	enum ckfs_code rc;
	size_t got = 0;

	if (!s)
		return err->code;
	uint64_t node = file_id - s->file_base;
	if (node >= s->f->n_nodes)
		rc = ckfs_fail(err, CKFS_E_INVALID, "no file with id %" PRIu64, file_id);
	else if (!(scratch = ckfs_fs_scratch(fs)))
		rc = ckfs_nomem(err);
	else
		rc = ckfs_folder_read(s->f, &s->f->nodes[node], offset, len, buf, &got, scratch,
				      err);
	if (rc == CKFS_OK && got != len)
		rc = ckfs_fail(err, CKFS_E_TRUNCATED, "'%s%s%s': %zu bytes at %" PRIu64
			       " read as %zu", s->label, ckfs_served_sep(s), s->f->nodes[node].name,
			       len, offset, got);
	ckfs_fs_put(fs, s);
	return rc;
}
