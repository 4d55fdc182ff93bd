/* SPDX-License-Identifier: MIT */
/*
 * The read path: elements of an output tensor, in global row-major order,
 * assembled from the chunks that hold them (include/ckfs/model.h).
 *
 * A request is cut into runs. A run starts at a global index, stays inside
 * one chunk and is contiguous both in the output and in the source file:
 * along the last dim up to the chunk's edge, and across rows while the
 * chunk spans the full width of the inner dims and its strides are
 * row-major. Contiguous runs become one pread straight into dst when no
 * conversion is needed. Runs that convert read their source through
 * windows of at most READ_WINDOW bytes, pread into a reused scratch buffer
 * (see convert_from), and ckfs_convert from there into dst. Runs whose source is
 * strided along the last dim (a transposed local view) read the spanned
 * bytes in bounded windows and gather.
 */
#include "ckfs/model.h"
#include "ckfs/strbuf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Source bytes per window when converting: small enough that a thread's
 * scratch window stays in L2, large enough to amortise the system calls
 * (256 KiB to 4 MiB: the same CPU time within noise). */
#define READ_WINDOW (1u << 20)

void ckfs_read_scratch_release(struct ckfs_read_scratch *s)
{
	free(s->buf);
	for (int i = 0; i < CKFS_VIEW_DEPTH; i++)
		free(s->view[i].p);
	memset(s, 0, sizeof(*s));
}

void *ckfs_view_scratch(struct ckfs_read_scratch *s, size_t bytes)
{
	int d = s->depth - 1;

	if (d < 0 || d >= CKFS_VIEW_DEPTH)
		return NULL;
	if (s->view[d].cap < bytes) {
		void *p = realloc(s->view[d].p, bytes);
		if (!p)
			return NULL;
		s->view[d].p = p;
		s->view[d].cap = bytes;
	}
	return s->view[d].p;
}

enum ckfs_code ckfs_view_quantization(struct ckfs_view_config *c, const char *head,
				      const char *const *names, size_t n, const char *tail,
				      struct ckfs_error *err)
{
	struct ckfs_strbuf o = { 0 };

	ckfs_strbuf_str(&o, head);
	for (size_t i = 0; i < n; i++) {
		if (i)
			ckfs_strbuf_put(&o, ", ", 2);
		ckfs_strbuf_json(&o, names[i]);
	}
	ckfs_strbuf_str(&o, tail);
	if (o.failed) {
		free(o.p);
		return ckfs_nomem(err);
	}
	c->quantization = o.p;
	return CKFS_OK;
}

static void *scratch_get(struct ckfs_read_scratch *s, size_t n)
{
	if (s->cap < n) {
		void *p = realloc(s->buf, n);
		if (!p)
			return NULL;
		s->buf = p;
		s->cap = n;
	}
	return s->buf;
}

uint64_t ckfs_tensor_out_bytes(const struct ckfs_tensor *t)
{
	return t->numel * ckfs_dtype_size(t->out_dtype);
}

static enum ckfs_code read_exact(const struct ckfs_model *m, uint32_t src,
				 void *buf, size_t len, uint64_t pos,
				 struct ckfs_error *err)
{
	const struct ckfs_source *s = &m->sources[src];

	CKFS_TRY(ckfs_source_guard(s, pos, len, err));
	ssize_t got = ckfs_file_pread(s->f, buf, len, pos);

	if (got < 0)
		return ckfs_fail_errno(err, "'%s': read failed", s->path);
	if ((size_t)got < len)
		return ckfs_fail(err, CKFS_E_CHANGED,
				 "'%s': file ends at %llu, expected data "
				 "up to %llu (was it truncated?)",
				 s->path, (unsigned long long)(pos + (uint64_t)got),
				 (unsigned long long)(pos + len));
	ckfs_source_note_read(len);
	return CKFS_OK;
}

static int chunk_contains(const struct ckfs_chunk *c, int ndim,
			  const int64_t *idx)
{
	for (int k = 0; k < ndim; k++)
		if (idx[k] < c->offset[k] || idx[k] >= c->offset[k] + c->shape[k])
			return 0;
	return 1;
}

/* Sources used by one read: each is checked before its first pread and
 * again after the last, so bytes read while a file changed are refused. */
struct touch_set {
	uint32_t ids[16];
	size_t n;
};

/* One ckfs_tensor_read: what each of its runs and windows works with. */
struct tensor_read {
	const struct ckfs_model *m;
	const struct ckfs_tensor *t;
	int64_t shape[CKFS_MAX_DIMS]; /* t's; [1] for a scalar */
	int ndim;                     /* 1 for a scalar */
	struct ckfs_read_scratch *scratch;
	struct touch_set ts;
	struct ckfs_error *err;
};

/* rows rows of width elements, rows src_step bytes apart in the window and
 * dst_step bytes apart in the output. */
struct convert_job {
	enum ckfs_dtype to, from;
	bool neg;
	unsigned char *dst;
	const unsigned char *src;
	uint64_t rows;
	size_t width, src_step, dst_step;
};

static void convert_rows(void *arg)
{
	const struct convert_job *j = arg;

	for (uint64_t r = 0; r < j->rows; r++)
		ckfs_convert(j->to, j->dst + r * j->dst_step, j->from,
			     j->src + r * j->src_step, j->width, j->neg);
}

/*
 * Windows of source bytes to convert from: each is pread into the
 * thread's reused scratch buffer (READ_WINDOW, so it stays in L2) and
 * converted from there. Mapping the window instead saves pread's copy but
 * costs more than it saves: filling and tearing down the page tables of
 * every 4 KiB page (MAP_POPULATE walks them twice) took 70% of the CPU of
 * a mapped fp32 -> bf16 stream from the page cache, and the stream ran at
 * 5.9 GB/s of input per core against 8.8 GB/s with pread
 * (tests/bench/convert_floor.c, docs/benchmarks.md). A source truncated
 * meanwhile gives a short pread: the read fails as changed, never with
 * stale or zero bytes.
 */
static enum ckfs_code convert_from(struct tensor_read *r, uint32_t src, uint64_t pos,
				   size_t len, struct convert_job *j)
{
	unsigned char *buf = scratch_get(r->scratch, len);

	if (!buf)
		return ckfs_nomem(r->err);
	CKFS_TRY(read_exact(r->m, src, buf, len, pos, r->err));
	j->src = buf;
	convert_rows(j);
	return CKFS_OK;
}

/* Read `count` contiguous source elements at pos and convert into dst. */
static enum ckfs_code read_contiguous(struct tensor_read *r, const struct ckfs_chunk *c,
				      uint64_t pos, uint64_t count, unsigned char *dst)
{
	const struct ckfs_tensor *t = r->t;
	size_t in = ckfs_dtype_size(c->dtype), out = ckfs_dtype_size(t->out_dtype);

	if (c->dtype == t->out_dtype && !c->neg)
		return read_exact(r->m, c->source, dst, count * in, pos, r->err);
	size_t per = READ_WINDOW / in;
	while (count) {
		size_t n = count < per ? (size_t)count : per;
		struct convert_job j = { .to = t->out_dtype, .from = c->dtype,
					 .neg = c->neg, .dst = dst, .rows = 1,
					 .width = n };
		CKFS_TRY(convert_from(r, c->source, pos, n * in, &j));
		pos += n * in;
		dst += n * out;
		count -= n;
	}
	return CKFS_OK;
}

/* count elements spaced `stride` apart in the source, starting at pos. */
static enum ckfs_code read_strided(struct tensor_read *r, const struct ckfs_chunk *c,
				   uint64_t pos, int64_t stride, uint64_t count,
				   unsigned char *dst)
{
	const struct ckfs_tensor *t = r->t;
	size_t in = ckfs_dtype_size(c->dtype), out = ckfs_dtype_size(t->out_dtype);
	uint64_t step = (uint64_t)stride * in;
	/* Elements that fit one window (at least one). */
	uint64_t per = step ? (READ_WINDOW - in) / step + 1 : count;
	if (per == 0)
		per = 1;
	unsigned char *buf = scratch_get(r->scratch, READ_WINDOW);
	unsigned char elem[8];

	if (!buf)
		return ckfs_nomem(r->err);
	while (count) {
		uint64_t n = count < per ? count : per;
		size_t span = (size_t)((n - 1) * step + in);
		CKFS_TRY(read_exact(r->m, c->source, buf, span, pos, r->err));
		for (uint64_t i = 0; i < n; i++) {
			memcpy(elem, buf + i * step, in);
			ckfs_convert(t->out_dtype, dst, c->dtype, elem, 1, c->neg);
			dst += out;
		}
		pos += n * step;
		count -= n;
	}
	return CKFS_OK;
}

/* Check src if this read has not yet; *now is set when the set is full
 * and the caller must check again right after its pread. */
static enum ckfs_code touch(struct tensor_read *r, uint32_t src, int *now)
{
	struct touch_set *ts = &r->ts;

	*now = 0;
	for (size_t i = 0; i < ts->n; i++)
		if (ts->ids[i] == src)
			return CKFS_OK;
	CKFS_TRY(ckfs_source_check(&r->m->sources[src], r->err));
	if (ts->n < sizeof(ts->ids) / sizeof(ts->ids[0]))
		ts->ids[ts->n++] = src;
	else
		*now = 1;
	return CKFS_OK;
}

static enum ckfs_code touch_finish(struct tensor_read *r)
{
	for (size_t i = 0; i < r->ts.n; i++)
		CKFS_TRY(ckfs_source_check(&r->m->sources[r->ts.ids[i]], r->err));
	return CKFS_OK;
}

/* Elements [e, end) by runs (see the top of this file). */
static enum ckfs_code read_runs(struct tensor_read *r, uint64_t e, uint64_t end,
				unsigned char *dst)
{
	const struct ckfs_tensor *t = r->t;
	const int64_t *shape = r->shape;
	int ndim = r->ndim;
	size_t out = ckfs_dtype_size(t->out_dtype);
	int64_t idx[CKFS_MAX_DIMS];
	uint32_t hint = 0;
	int L = ndim - 1, now;

	while (e < end) {
		uint64_t rest = e;
		for (int k = ndim - 1; k >= 0; k--) {
			idx[k] = (int64_t)(rest % (uint64_t)shape[k]);
			rest /= (uint64_t)shape[k];
		}
		/* Find the chunk holding idx; runs usually stay in one. */
		const struct ckfs_chunk *c = NULL;
		for (uint32_t i = 0; i < t->n_chunks; i++) {
			uint32_t j = (hint + i) % t->n_chunks;
			if (chunk_contains(&t->chunks[j], ndim, idx)) {
				c = &t->chunks[j];
				hint = j;
				break;
			}
		}
		if (!c) /* impossible after validation */
			return ckfs_fail(r->err, CKFS_E_INVALID,
					 "tensor '%s': element %llu has no source",
					 t->name, (unsigned long long)e);
		CKFS_TRY(touch(r, c->source, &now));

		uint64_t src_elem = 0;
		for (int k = 0; k < ndim; k++)
			src_elem += (uint64_t)(idx[k] - c->offset[k]) * (uint64_t)c->stride[k];
		uint64_t pos = c->pos + src_elem * ckfs_dtype_size(c->dtype);
		uint64_t run = (uint64_t)(c->offset[L] + c->shape[L] - idx[L]);

		if (c->stride[L] == 1) {
			/* Extend across rows while the chunk spans the full
			 * width of the inner dims and its strides are row-major
			 * (plans give size-1 dims row-major strides). */
			uint64_t inner = 1;
			for (int k = L; k > 0; k--) {
				if (c->offset[k] != 0 || c->shape[k] != shape[k] ||
				    c->stride[k - 1] != c->stride[k] * c->shape[k])
					break;
				inner *= (uint64_t)shape[k];
				run += (uint64_t)(c->offset[k - 1] + c->shape[k - 1] -
						  idx[k - 1] - 1) * inner;
			}
			if (run > end - e)
				run = end - e;
			CKFS_TRY(read_contiguous(r, c, pos, run, dst));
		} else {
			if (run > end - e)
				run = end - e;
			CKFS_TRY(read_strided(r, c, pos, c->stride[L], run, dst));
		}
		if (now)
			CKFS_TRY(ckfs_source_check(&r->m->sources[c->source], r->err));
		dst += run * out;
		e += run;
	}
	return CKFS_OK;
}

/*
 * Column-sharded tensors (FSDP2 Shard(1), TP row-parallel) give runs of one
 * partial row each; reading them one by one would cost a pread per row per
 * chunk. Viewed as 2-D (rows = all leading dims, columns = the last), each
 * chunk is a rectangle when it spans the full extent of dims 1..L-1 with
 * row-major strides there and stride 1 along the last dim. Then whole rows
 * of the request are served chunk by chunk: one pread per window of the
 * chunk's rows, converted row by row into place.
 */
static int rows_as_blocks(const struct ckfs_tensor *t, int ndim)
{
	int L = ndim - 1, partial = 0;

	if (ndim < 2)
		return 0;
	for (uint32_t i = 0; i < t->n_chunks; i++) {
		const struct ckfs_chunk *c = &t->chunks[i];
		if (c->stride[L] != 1 || c->stride[L - 1] < c->shape[L])
			return 0;
		for (int k = 1; k < L; k++)
			if (c->offset[k] != 0 || c->shape[k] != t->shape[k] ||
			    c->stride[k - 1] != c->stride[k] * c->shape[k])
				return 0;
		partial |= c->shape[L] != t->shape[L];
	}
	return partial;
}

static enum ckfs_code read_row_blocks(struct tensor_read *r, uint64_t ra, uint64_t rb,
				      unsigned char *dst)
{
	const struct ckfs_tensor *t = r->t;
	int L = r->ndim - 1, now;
	uint64_t cols = (uint64_t)t->shape[L], inner = 1;
	size_t out = ckfs_dtype_size(t->out_dtype);

	for (int k = 1; k < L; k++)
		inner *= (uint64_t)t->shape[k];
	for (uint32_t i = 0; i < t->n_chunks; i++) {
		const struct ckfs_chunk *c = &t->chunks[i];
		size_t in = ckfs_dtype_size(c->dtype);
		uint64_t r0 = (uint64_t)c->offset[0] * inner;
		uint64_t r1 = r0 + (uint64_t)c->shape[0] * inner;
		uint64_t x0 = r0 > ra ? r0 : ra, x1 = r1 < rb ? r1 : rb;
		uint64_t width = (uint64_t)c->shape[L], rstride = (uint64_t)c->stride[L - 1];
		if (x0 >= x1)
			continue;
		CKFS_TRY(touch(r, c->source, &now));
		/* Rows per window: the span of n rows is (n-1)*rstride + width. */
		uint64_t per = width * in > READ_WINDOW ? 1
			: (READ_WINDOW / in - width) / rstride + 1;
		for (uint64_t row = x0; row < x1; row += per) {
			uint64_t n = x1 - row < per ? x1 - row : per;
			uint64_t pos = c->pos + (row - r0) * rstride * in;
			unsigned char *row_dst = dst + ((row - ra) * cols + (uint64_t)c->offset[L]) * out;
			if (width * in > READ_WINDOW) { /* one huge row at a time */
				CKFS_TRY(read_contiguous(r, c, pos, width, row_dst));
				continue;
			}
			size_t span = (size_t)(((n - 1) * rstride + width) * in);
			struct convert_job j = { .to = t->out_dtype, .from = c->dtype,
						 .neg = c->neg, .dst = row_dst, .rows = n,
						 .width = (size_t)width,
						 .src_step = (size_t)(rstride * in),
						 .dst_step = (size_t)(cols * out) };
			CKFS_TRY(convert_from(r, c->source, pos, span, &j));
		}
		if (now)
			CKFS_TRY(ckfs_source_check(&r->m->sources[c->source], r->err));
	}
	return CKFS_OK;
}

/* c holds whole rows of t (every dim but the first complete), stored
 * row-major and contiguous. */
static bool row_block(const struct ckfs_tensor *t, const struct ckfs_chunk *c)
{
	int L = t->ndim - 1;

	if (c->stride[L] != 1)
		return false;
	for (int k = 1; k <= L; k++)
		if (c->offset[k] != 0 || c->shape[k] != t->shape[k] ||
		    c->stride[k - 1] != c->stride[k] * c->shape[k])
			return false;
	return true;
}

/*
 * The source bytes of chunk c that elements [first, end) of t take, as
 * one range. A block of whole rows stored in order (an FSDP Shard(0)
 * shard, a flat shard's rows) gives exactly those bytes. Any other chunk
 * gives its rows (dim 0) those elements fall in, from the first row's
 * start to the last one's end: a little more than partial rows need.
 * false when c holds none of them, or its layout spreads them too thin
 * for one range to be worth fetching (a transposed view).
 */
static bool chunk_range(const struct ckfs_model *m, const struct ckfs_tensor *t,
			const struct ckfs_chunk *c, uint64_t first, uint64_t end,
			struct ckfs_file_range *out)
{
	/* row: the source elements one chunk row spans; per_row: those it
	 * holds; inner: elements of one row of t. */
	uint64_t in = ckfs_dtype_size(c->dtype), row = 1, per_row = 1, inner = 1;

	if (t->ndim == 0) {
		*out = (struct ckfs_file_range){ m->sources[c->source].f, c->pos, in };
		return true;
	}
	if (t->shape[0] > 0 && row_block(t, c)) {
		/* Its elements are one run of t's, stored in order: exactly
		 * the part of [first, end) it holds. */
		uint64_t inner_all = t->numel / (uint64_t)t->shape[0];
		uint64_t n = (uint64_t)c->shape[0] * inner_all;
		uint64_t c0 = (uint64_t)c->offset[0] * inner_all;
		uint64_t lo = first > c0 ? first : c0, hi = end < c0 + n ? end : c0 + n;
		if (lo >= hi)
			return false;
		*out = (struct ckfs_file_range){ m->sources[c->source].f,
						 c->pos + (lo - c0) * in, (hi - lo) * in };
		return true;
	}
	for (int k = 1; k < t->ndim; k++) {
		if (c->stride[k] < 0)
			return false;
		row += (uint64_t)(c->shape[k] - 1) * (uint64_t)c->stride[k];
		per_row *= (uint64_t)c->shape[k];
		inner *= (uint64_t)t->shape[k];
	}
	if (c->stride[0] < 0 || !c->shape[0] || !inner)
		return false;
	/* Global rows [g0, g1] hold the elements; the chunk's local rows
	 * among them are [r0, r1]. */
	int64_t g0 = (int64_t)(first / inner), g1 = (int64_t)((end - 1) / inner);
	int64_t r0 = (g0 > c->offset[0] ? g0 : c->offset[0]) - c->offset[0];
	int64_t r1 = (g1 < c->offset[0] + c->shape[0] - 1 ? g1 : c->offset[0] + c->shape[0] - 1) -
		     c->offset[0];
	if (r0 > r1)
		return false;
	uint64_t rows = (uint64_t)(r1 - r0 + 1);
	uint64_t span = (rows - 1) * (uint64_t)c->stride[0] + row;
	if (span > 2 * rows * per_row + (64 << 10) / in)
		return false;
	*out = (struct ckfs_file_range){ m->sources[c->source].f,
					 c->pos + (uint64_t)r0 * (uint64_t)c->stride[0] * in,
					 span * in };
	return true;
}

size_t ckfs_tensor_ranges(const struct ckfs_model *m, const struct ckfs_tensor *t,
			  uint64_t first, uint64_t count, struct ckfs_file_range *v,
			  size_t cap)
{
	size_t n = 0;

	if (t->view || !count || first >= t->numel ||
	    count > t->numel - first)
		return 0;
	for (uint32_t i = 0; i < t->n_chunks && n < cap; i++)
		n += chunk_range(m, t, &t->chunks[i], first, first + count, &v[n]);
	return n;
}

/* A view's tensor, its scratch one level deeper. */
static enum ckfs_code view_read(const struct ckfs_model *m, const struct ckfs_tensor *t,
				uint64_t first, uint64_t count, void *dst,
				struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	if (scratch->depth >= CKFS_VIEW_DEPTH)
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': views stacked more than %d deep",
				 t->name, CKFS_VIEW_DEPTH);
	scratch->depth++;
	enum ckfs_code rc = t->view->read(m, t, first, count, dst, scratch, err);
	scratch->depth--;
	return rc;
}

enum ckfs_code ckfs_tensor_read(const struct ckfs_model *m,
				const struct ckfs_tensor *t, uint64_t first,
				uint64_t count, void *dst_v,
				struct ckfs_read_scratch *scratch,
				struct ckfs_error *err)
{
	unsigned char *dst = dst_v;
	size_t out = ckfs_dtype_size(t->out_dtype);
	struct tensor_read r = { .m = m, .t = t, .ndim = t->ndim ? t->ndim : 1,
				 .scratch = scratch, .err = err };
	uint64_t end = first + count;

	if (first > t->numel || count > t->numel - first)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "read past the end of tensor '%s'", t->name);
	if (t->view)
		return view_read(m, t, first, count, dst, scratch, err);
	if (t->ndim == 0)
		r.shape[0] = 1;
	else
		memcpy(r.shape, t->shape, sizeof(int64_t) * (size_t)r.ndim);

	uint64_t cols = (uint64_t)r.shape[r.ndim - 1];
	if (count && cols && rows_as_blocks(t, r.ndim)) {
		/* Partial first row, whole rows as blocks, partial last row. */
		uint64_t ra = (first + cols - 1) / cols, rb = end / cols;
		if (ra < rb) {
			uint64_t head = ra * cols;
			CKFS_TRY(read_runs(&r, first, head, dst));
			CKFS_TRY(read_row_blocks(&r, ra, rb, dst + (head - first) * out));
			CKFS_TRY(read_runs(&r, rb * cols, end, dst + (rb * cols - first) * out));
			return touch_finish(&r);
		}
	}
	CKFS_TRY(read_runs(&r, first, end, dst));
	return touch_finish(&r);
}
